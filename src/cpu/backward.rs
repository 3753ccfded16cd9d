//! The oracle's backward pass: the gradients of the forward in `head.rs`,
//! row by row from the recomputed probabilities, written as plainly as the
//! chain rule reads. In f64 it is the reference every backward path is judged
//! against (itself checked against finite differences of the forward); in f32
//! it is the plain baseline whose error sets the tolerance.
//!
//! For query row i and an attended key j (scores after each rule as the
//! forward names them: raw = scale·q·k, capped, biased, P = softmax(biased / τ)):
//! dP = dY_i·v_j, D_i = Σ_j P dP, d(biased) = P (dP − D_i) / τ, d(raw) =
//! d(biased)·sech²(raw / cap) with softcap, dQ_i += scale·d(raw)·k_j,
//! dK_j += scale·d(raw)·q_i, dV_j += P·dY_i, and a float mask's element gets
//! d(biased). Keys a row does not attend get nothing; a fully masked row
//! gives zeros; a row the forward makes NaN makes NaN what it attends.

use super::head::{attend_row, kv_row, mask_index, RowScratch, SumOrder};
use super::real::Real;
use crate::error::{Error, Result};
use crate::gradients::{check_backward, BackwardInputs, GradientOptions};
use crate::options::AttentionOptions;
use crate::problem::{validate, AttentionDims, AttentionInputs};
use crate::tensor::{HostMask, HostTensor};

/// The backward's gradients at the precision they were computed in.
#[derive(Debug, Clone, PartialEq)]
pub struct ExactGradients<F> {
    /// The checked sizes.
    pub dims: AttentionDims,
    /// dQ `[B, Hq, Nq, Dk]`.
    pub dq: Vec<F>,
    /// dK of the present keys `[B, Hkv, T, Dk]` (the past's rows first).
    pub dk: Vec<F>,
    /// dV of the present values `[B, Hkv, T, Dv]`.
    pub dv: Vec<F>,
    /// The float mask's gradient in its own shape; empty unless asked.
    pub d_mask: Vec<F>,
}

impl<F: Copy> ExactGradients<F> {
    /// dK split into the past's rows (none without a past) and K's own.
    pub fn key_parts(&self) -> (Option<Vec<F>>, Vec<F>) {
        crate::gradients::split_present(&self.dims, &self.dk, self.dims.head_dim)
    }

    /// dV split into the past's rows (none without a past) and V's own.
    pub fn value_parts(&self) -> (Option<Vec<F>>, Vec<F>) {
        crate::gradients::split_present(&self.dims, &self.dv, self.dims.v_head_dim)
    }
}

/// Where the backward takes each row's probabilities and D from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowSource {
    /// Recomputed from the inputs: P by the forward's softmax, D = Σ P·dP
    /// (the oracle, which trusts no caller's numbers).
    Recomputed,
    /// From the forward's outputs: P = exp(biased / τ − lse) from the given
    /// logsumexp, and D the textbook Σ P·dP (in `SumOrder::Sequential`) or,
    /// as the fused kernels take it, dY·Y from the given Y summed as dP is
    /// (the other orders): the plain f32 baselines of a backward handed the
    /// forward's f32 outputs. At large logits an f32 logsumexp holds P only
    /// to |lse|·2⁻²⁴, and dP − D cancels.
    FromForward,
}

/// sech²(x) = 1 − tanh²(x), written so it keeps its precision where tanh
/// nears ±1: 4e^(−2|x|) / (1 + e^(−2|x|))².
pub(crate) fn sech2<F: Real>(x: F) -> F {
    let ax = if x < F::ZERO { F::ZERO - x } else { x };
    let e = (F::ZERO - (ax + ax)).exp();
    let one = F::from_f32(1.0);
    F::from_f32(4.0) * e / ((one + e) * (one + e))
}

/// The gradients of the forward of `inputs` and `options` given dY, in `F`,
/// with each row's probabilities and D from `rows`; the shapes of Y and the
/// logsumexp in `forward` are checked either way.
pub fn attention_backward_in<F: Real>(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    forward: &BackwardInputs<'_, HostTensor>,
    grads: GradientOptions,
    order: SumOrder,
    rows: RowSource,
) -> Result<ExactGradients<F>> {
    let dims = validate(inputs, options)?;
    check_backward(&dims, forward)?;
    let mask_len = match (grads.mask_gradient, inputs.attn_mask) {
        (false, _) => 0,
        (true, Some(HostMask::Float(m))) => m.len(),
        (true, Some(HostMask::Bool { .. })) => {
            return Err(Error::Conflict(
                "a bool mask has no gradient: pass a float mask",
            ))
        }
        (true, None) => {
            return Err(Error::Conflict(
                "a mask gradient was asked for without a mask",
            ))
        }
    };
    let kv_heads = dims.batch * dims.kv_heads;
    let (t_len, dk, dv) = (dims.total_len(), dims.head_dim, dims.v_head_dim);
    let group_dq = dims.group() * dims.q_len * dk;
    let mut dq = vec![F::ZERO; kv_heads * group_dq];
    let mut dk_all = vec![F::ZERO; kv_heads * t_len * dk];
    let mut dv_all = vec![F::ZERO; kv_heads * t_len * dv];
    let mut d_mask = vec![F::ZERO; mask_len];

    // One worker per run of KV heads: each owns its heads' dK and dV and its
    // query heads' dQ; mask gradients are summed afterwards in a fixed order.
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(kv_heads)
        .max(1);
    let per = kv_heads.div_ceil(workers);
    let (k_per_head, v_per_head) = (t_len * dk, t_len * dv);
    let run = |first: usize, dq_part: &mut [F], dk_part: &mut [F], dv_part: &mut [F]| {
        let mut mask_part = vec![F::ZERO; mask_len];
        for local in 0..dk_part.len() / k_per_head {
            let head = HeadGrads {
                dq: &mut dq_part[local * group_dq..(local + 1) * group_dq],
                dk: &mut dk_part[local * k_per_head..(local + 1) * k_per_head],
                dv: &mut dv_part[local * v_per_head..(local + 1) * v_per_head],
                d_mask: &mut mask_part,
            };
            let from = (rows == RowSource::FromForward).then_some(forward);
            kv_head_backward(
                inputs,
                options,
                &dims,
                forward.dy,
                from,
                first + local,
                head,
                order,
            );
        }
        mask_part
    };
    let parts: Vec<Vec<F>> = if workers == 1 {
        vec![run(0, &mut dq, &mut dk_all, &mut dv_all)]
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = dq
                .chunks_mut(per * group_dq)
                .zip(dk_all.chunks_mut(per * k_per_head))
                .zip(dv_all.chunks_mut(per * v_per_head))
                .enumerate()
                .map(|(w, ((dq, dk), dv))| {
                    let run = &run;
                    scope.spawn(move || run(w * per, dq, dk, dv))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a backward worker panicked"))
                .collect()
        })
    };
    for part in parts {
        for (acc, x) in d_mask.iter_mut().zip(part) {
            *acc = *acc + x;
        }
    }
    Ok(ExactGradients {
        dims,
        dq,
        dk: dk_all,
        dv: dv_all,
        d_mask,
    })
}

/// One KV head's share of the gradients.
struct HeadGrads<'g, F> {
    /// dQ of the head's query heads `[group, Nq, Dk]`.
    dq: &'g mut [F],
    /// `[T, Dk]`.
    dk: &'g mut [F],
    /// `[T, Dv]`.
    dv: &'g mut [F],
    /// The whole mask's gradient (this worker's part), or empty.
    d_mask: &'g mut [F],
}

/// The gradients from every query row of KV head `z` = (b, KV head)'s group.
#[allow(clippy::too_many_arguments)]
fn kv_head_backward<F: Real>(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    dims: &AttentionDims,
    dy: &HostTensor,
    given: Option<&BackwardInputs<'_, HostTensor>>,
    z: usize,
    out: HeadGrads<'_, F>,
    order: SumOrder,
) {
    let (b, kvh) = (z / dims.kv_heads, z % dims.kv_heads);
    let (nq, dk, dv, t_len) = (dims.q_len, dims.head_dim, dims.v_head_dim, dims.total_len());
    let scale = F::from_f32(options.effective_scale(dk));
    let cap = F::from_f32(options.softcap);
    let inv_t = F::from_f32(1.0) / F::from_f32(options.temperature);
    let mut scratch = RowScratch::<F>::new(t_len);
    let mut y = vec![F::ZERO; dv];
    let mut dp = vec![F::ZERO; t_len];
    for g in 0..dims.group() {
        let h = kvh * dims.group() + g;
        for i in 0..nq {
            attend_row(inputs, options, dims, b, h, i, &mut scratch, &mut y, order);
            let row = (b * dims.q_heads + h) * nq + i;
            let dy_i = &dy.data()[row * dv..(row + 1) * dv];
            let q_i = &inputs.q.data()[row * dk..(row + 1) * dk];
            if let Some(given) = given {
                // P = exp((biased − lse·τ) / τ) from the given logsumexp.
                let lse_t = F::from_f32(given.lse.data()[row]) / inv_t;
                for j in (0..t_len).filter(|&j| scratch.attended[j]) {
                    scratch.probs[j] = ((scratch.biased[j] - lse_t) * inv_t).exp();
                }
            }
            let mut d = F::ZERO;
            for j in (0..t_len).filter(|&j| scratch.attended[j]) {
                let v = kv_row(inputs.past_value, inputs.v, dims, b, kvh, j, dv);
                dp[j] = order.dot::<F>(dy_i, v);
                d = d + scratch.probs[j] * dp[j];
            }
            if let (Some(given), false) = (given, order == SumOrder::Sequential) {
                // FlashAttention-2's D = dY·Y from the given Y, summed as dP
                // is (the textbook Σ P·dP above in sequential order).
                d = order.dot::<F>(dy_i, &given.y.data()[row * dv..(row + 1) * dv]);
            }
            let dq_i = &mut out.dq[(g * nq + i) * dk..(g * nq + i + 1) * dk];
            for j in (0..t_len).filter(|&j| scratch.attended[j]) {
                let p = scratch.probs[j];
                for (acc, &g) in out.dv[j * dv..(j + 1) * dv].iter_mut().zip(dy_i) {
                    *acc = *acc + p * F::from_f32(g);
                }
                let d_biased = p * (dp[j] - d) * inv_t;
                let d_raw = if options.softcap > 0.0 {
                    d_biased * sech2(scratch.raw[j] / cap)
                } else {
                    d_biased
                };
                let k = kv_row(inputs.past_key, inputs.k, dims, b, kvh, j, dk);
                for (acc, &kc) in dq_i.iter_mut().zip(k) {
                    *acc = *acc + scale * d_raw * F::from_f32(kc);
                }
                for (acc, &qc) in out.dk[j * dk..(j + 1) * dk].iter_mut().zip(q_i) {
                    *acc = *acc + scale * d_raw * F::from_f32(qc);
                }
                if !out.d_mask.is_empty() {
                    let mask = inputs.attn_mask.expect("a mask gradient needs a mask");
                    if let Some(index) = mask_index(mask.shape(), b, h, i, j) {
                        out.d_mask[index] = out.d_mask[index] + d_biased;
                    }
                }
            }
        }
    }
}
