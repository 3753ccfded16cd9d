//! The CPU backend's backward pass: FlashAttention-2's, in blocks of query
//! rows on the backend's GEMM micro-kernel. Per (batch, KV head) and per
//! block of a query head's rows, over the keys the block can see: S = Q Kᵀ
//! and dP = dY Vᵀ (products), then per score the contract's rules, P =
//! exp(biased / τ − lse) and dS = P (dP − D) / τ through softcap and the
//! scale (a scalar pass), then dV += Pᵀ dY, dK += dSᵀ Q, dQ = dS K
//! (products). Memory is one block's scores: linear in the sequence. GQA
//! groups and blocks are summed in a fixed order, so results repeat exactly.
//!
//! A product multiplies every key, attended or not; where an input holds a
//! NaN or an infinity, a key no row attends could then reach the sums, so
//! such calls take the plain f32 backward, which skips those keys as the
//! contract says.

use super::gemm::{matmul, Init, MatRef};
use super::math::all_finite;
use super::rules::{masks, HeadRules, MaskBias};
use super::{threads, CpuBackend};
use crate::cpu::{attention_backward_in, ExactGradients, RowSource, SumOrder};
use crate::error::Result;
use crate::gradients::{check_backward, BackwardInputs, GradientOptions};
use crate::options::{alibi_slopes, AttentionOptions};
use crate::problem::{validate, AttentionDims, AttentionInputs};
use crate::tensor::HostTensor;

/// Query rows per block: its scores (rows × keys) are the working set.
const BLOCK_ROWS: usize = 64;

impl CpuBackend {
    /// The gradients of a forward call from its Y, logsumexp and dY, in f32:
    /// dQ and the present keys' and values' dK, dV.
    pub fn attention_backward(
        &self,
        inputs: &AttentionInputs<'_, HostTensor>,
        options: &AttentionOptions,
        forward: &BackwardInputs<'_, HostTensor>,
        grads: GradientOptions,
    ) -> Result<ExactGradients<f32>> {
        let dims = validate(inputs, options)?;
        check_backward(&dims, forward)?;
        let finite = [
            Some(inputs.q),
            Some(inputs.k),
            Some(inputs.v),
            Some(forward.dy),
        ]
        .into_iter()
        .chain([inputs.past_key, inputs.past_value])
        .flatten()
        .all(|t| all_finite(t.data()));
        if grads.mask_gradient || !finite {
            return attention_backward_in::<f32>(
                inputs,
                options,
                forward,
                grads,
                SumOrder::Sequential,
                RowSource::FromForward,
            );
        }
        let (t_len, dk, dv) = (dims.total_len(), dims.head_dim, dims.v_head_dim);
        let groups = dims.batch * dims.kv_heads;
        let group_dq = dims.group() * dims.q_len * dk;
        // Groups in parallel where there are enough of them; else the
        // products take the threads.
        let (outer, inner) = if groups >= self.threads() {
            (self.threads(), 1)
        } else {
            (1, self.threads())
        };
        let parts = threads::map((0..groups).collect(), outer, |z| {
            group_backward(self, inputs, options, forward, &dims, z, inner)
        });
        let mut out = ExactGradients {
            dims,
            dq: Vec::with_capacity(groups * group_dq),
            dk: Vec::with_capacity(groups * t_len * dk),
            dv: Vec::with_capacity(groups * t_len * dv),
            d_mask: Vec::new(),
        };
        for part in parts {
            out.dq.extend_from_slice(&part.dq);
            out.dk.extend_from_slice(&part.dk);
            out.dv.extend_from_slice(&part.dv);
        }
        Ok(out)
    }
}

/// One (batch, KV head)'s gradients: its query heads' dQ, its present dK, dV.
struct GroupGrads {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// Rows `[start, start + n)` of a `[rows, width]` row-major slice.
fn rows_of(data: &[f32], start: usize, n: usize, width: usize) -> &[f32] {
    &data[start * width..(start + n) * width]
}

/// The present rows `[past; new]` of (b, KV head) `z` of a K or V pair.
fn present(
    past: Option<&HostTensor>,
    new: &HostTensor,
    dims: &AttentionDims,
    z: usize,
    width: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(dims.total_len() * width);
    if let Some(p) = past {
        out.extend_from_slice(rows_of(p.data(), z * dims.past_len, dims.past_len, width));
    }
    out.extend_from_slice(rows_of(new.data(), z * dims.kv_len, dims.kv_len, width));
    out
}

fn group_backward(
    backend: &CpuBackend,
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    forward: &BackwardInputs<'_, HostTensor>,
    dims: &AttentionDims,
    z: usize,
    threads: usize,
) -> GroupGrads {
    let _ = backend;
    let (b, kvh) = (z / dims.kv_heads, z % dims.kv_heads);
    let (nq, dk, dv, t_len) = (dims.q_len, dims.head_dim, dims.v_head_dim, dims.total_len());
    let keys = present(inputs.past_key, inputs.k, dims, z, dk);
    let values = present(inputs.past_value, inputs.v, dims, z, dv);
    let scale = options.effective_scale(dk);
    let inv_t = 1.0 / options.temperature;
    let cap = options.softcap;
    let slopes: Vec<f32> = if options.alibi {
        alibi_slopes(dims.q_heads)
            .into_iter()
            .map(|s| s as f32)
            .collect()
    } else {
        Vec::new()
    };
    let mask = inputs
        .attn_mask
        .zip(dims.mask)
        .map(|(m, layout)| MaskBias::new(m, layout));
    let mut out = GroupGrads {
        dq: vec![0.0; dims.group() * nq * dk],
        dk: vec![0.0; t_len * dk],
        dv: vec![0.0; t_len * dv],
    };
    let (mut s, mut dp, mut part_k, mut part_v) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for g in 0..dims.group() {
        let h = kvh * dims.group() + g;
        let head = b * dims.q_heads + h;
        let rules = HeadRules::new(dims, options, inputs.nonpad_kv_seqlen, &slopes, b, h);
        for i0 in (0..nq).step_by(BLOCK_ROWS) {
            let rows = BLOCK_ROWS.min(nq - i0);
            // The keys the block sees: row intervals grow with the row.
            let k0 = rules.interval(i0).0;
            let k1 = rules.interval(i0 + rows - 1).1.max(k0);
            let n = k1 - k0;
            if n == 0 {
                continue;
            }
            let q = rows_of(inputs.q.data(), head * nq + i0, rows, dk);
            let dy = rows_of(forward.dy.data(), head * nq + i0, rows, dv);
            let y = rows_of(forward.y.data(), head * nq + i0, rows, dv);
            let lse = &forward.lse.data()[head * nq + i0..head * nq + i0 + rows];
            let k_blk = rows_of(&keys, k0, n, dk);
            let v_blk = rows_of(&values, k0, n, dv);
            s.resize(rows * n, 0.0);
            dp.resize(rows * n, 0.0);
            matmul(
                MatRef::rows(q, rows, dk),
                MatRef::transposed(k_blk, n, dk),
                Init::Zero,
                &mut s,
                threads,
            );
            matmul(
                MatRef::rows(dy, rows, dv),
                MatRef::transposed(v_blk, n, dv),
                Init::Zero,
                &mut dp,
                threads,
            );
            for r in 0..rows {
                let i = i0 + r;
                let (lo, hi) = rules.interval(i);
                let d: f32 = dy[r * dv..(r + 1) * dv]
                    .iter()
                    .zip(&y[r * dv..(r + 1) * dv])
                    .fold(0.0, |acc, (a, b)| acc + a * b);
                let lse_t = lse[r] / inv_t;
                let mask_row = mask.as_ref().map(|m| m.row(b, h, i));
                for c in 0..n {
                    let j = k0 + c;
                    let (p, ds) = match mask_row.map(|m| m[j]) {
                        _ if j < lo || j >= hi => (0.0, 0.0),
                        Some(bias) if masks(bias) => (0.0, 0.0),
                        bias => {
                            let raw = s[r * n + c] * scale;
                            let (capped, slope) = if cap > 0.0 {
                                let t = (raw / cap).tanh();
                                (cap * t, crate::cpu::sech2(raw / cap))
                            } else {
                                (raw, 1.0)
                            };
                            let distance = (rules.position(i) - j as i64).unsigned_abs() as f32;
                            let biased = capped + bias.unwrap_or(0.0) - rules.slope * distance;
                            let p = ((biased - lse_t) * inv_t).exp();
                            (p, scale * (p * (dp[r * n + c] - d) * inv_t) * slope)
                        }
                    };
                    s[r * n + c] = p;
                    dp[r * n + c] = ds;
                }
            }
            // dV += Pᵀ dY, dK += dSᵀ Q (dS holds the scale), dQ = dS K.
            part_v.resize(n * dv, 0.0);
            part_k.resize(n * dk, 0.0);
            matmul(
                MatRef::transposed(&s, rows, n),
                MatRef::rows(dy, rows, dv),
                Init::Zero,
                &mut part_v,
                threads,
            );
            matmul(
                MatRef::transposed(&dp, rows, n),
                MatRef::rows(q, rows, dk),
                Init::Zero,
                &mut part_k,
                threads,
            );
            for (acc, x) in out.dv[k0 * dv..k1 * dv].iter_mut().zip(&part_v) {
                *acc += x;
            }
            for (acc, x) in out.dk[k0 * dk..k1 * dk].iter_mut().zip(&part_k) {
                *acc += x;
            }
            let dq = &mut out.dq[(g * nq + i0) * dk..(g * nq + i0 + rows) * dk];
            matmul(
                MatRef::rows(&dp, rows, n),
                MatRef::rows(k_blk, n, dk),
                Init::Zero,
                dq,
                threads,
            );
        }
    }
    out
}
