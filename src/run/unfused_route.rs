//! The unfused attention path: QKᵀ GEMM → softcap/mask/bias → softmax → PV GEMM,
//! recorded into one command buffer with no readback between the steps.
//!
//! The score matrix `[B·Hq·Nq, T]` is materialised in chunks of rows that fit
//! one storage binding (and the engine's score budget): either several whole
//! heads at a time, or, when one head is too big, a range of its query rows.
//! This path implements the whole contract and stays as the reference GPU path.

use crate::device::buffer;
use crate::device::chunks::Held;
use crate::device::context::GpuContext;
use crate::device::recorder::Recorder;
use crate::error::{Error, Result};
use crate::kernels::{gemm, mask, softmax};
use crate::options::{AttentionOptions, QkMatmulOutputMode};
use crate::plan::overrides::GemmKernel;
use crate::problem::AttentionDims;
use crate::run::present as kv;
use crate::run::present::{bytes, GpuInputs, GpuOutputs};

/// A block of score rows computed together: `heads` consecutive heads starting
/// at `head0`, rows `row0..row0 + rows_per_head` of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub head0: usize,
    pub heads: usize,
    pub row0: usize,
    pub rows_per_head: usize,
}

impl Chunk {
    fn rows(&self) -> usize {
        self.heads * self.rows_per_head
    }
}

/// Splits the `heads × q_len` score rows of width `cols` into chunks of at most `budget` bytes.
pub(crate) fn plan_chunks(
    heads: usize,
    q_len: usize,
    cols: usize,
    budget: u64,
) -> Result<Vec<Chunk>> {
    let row_bytes = cols as u64 * 4;
    let rows_fit = (budget / row_bytes) as usize;
    if rows_fit == 0 {
        return Err(Error::buffer_limit(
            format!("one row of {cols} attention scores"),
            row_bytes,
            budget,
            "score budget (max_storage_buffer_binding_size)",
        ));
    }
    let mut chunks = Vec::new();
    if rows_fit >= q_len {
        let per_chunk = (rows_fit / q_len).min(heads);
        let mut head0 = 0;
        while head0 < heads {
            let n = per_chunk.min(heads - head0);
            chunks.push(Chunk {
                head0,
                heads: n,
                row0: 0,
                rows_per_head: q_len,
            });
            head0 += n;
        }
    } else {
        for head in 0..heads {
            let mut row0 = 0;
            while row0 < q_len {
                let n = rows_fit.min(q_len - row0);
                chunks.push(Chunk {
                    head0: head,
                    heads: 1,
                    row0,
                    rows_per_head: n,
                });
                row0 += n;
            }
        }
    }
    Ok(chunks)
}

/// Runs the unfused path with the planned GEMM kernel (at the planned
/// precision); returns once the work is submitted.
pub(crate) async fn run(
    ctx: &GpuContext,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    options: &AttentionOptions,
    gemm_kernel: GemmKernel,
    score_budget: u64,
) -> Result<GpuOutputs> {
    let (b, hq, nq) = (dims.batch, dims.q_heads, dims.q_len);
    let (dk, dv, t) = (dims.head_dim, dims.v_head_dim, dims.total_len());
    let heads = b * hq;
    let budget = score_budget.min(ctx.caps.limits.max_bindable_bytes());
    // The mask and softmax kernels loop over a row in strides of 128.
    if let Some(loops) = ctx.caps.loop_budget() {
        let needed = 3 * t.div_ceil(128) as u64 + 64;
        if needed > loops {
            return Err(Error::Limit {
                what: format!("a score row of {t} keys on the unfused path"),
                needed,
                limit: loops,
                limit_name: "loop iterations per invocation (llvmpipe)",
                hint: "use the fused path, which splits long key ranges",
            });
        }
    }
    let chunks = plan_chunks(heads, nq, t, budget)?;
    let chunk_rows = chunks.iter().map(Chunk::rows).max().unwrap_or(1);

    // Check every allocation before recording anything.
    let y_len = heads * nq * dv;
    let qk_len = heads * nq * t;
    buffer::check_bindable(ctx, "Y", bytes(y_len))?;
    if options.qk_matmul_output_mode.is_some() {
        buffer::check_bindable(ctx, "qk_matmul_output", bytes(qk_len))?;
    }
    let present_bytes = kv::check_present(ctx, dims, options.return_present)?;
    let scale = options.effective_scale(dk);
    // S = scale · Q Kᵀ for the rows of one chunk, into the scores buffer.
    let scores_spec = |chunk: &Chunk| {
        let m = chunk.rows_per_head;
        gemm::GemmSpec {
            batch: chunk.heads,
            m,
            n: t,
            k: dk,
            trans_a: false,
            trans_b: true,
            lda: dk,
            ldb: dk,
            ldc: t,
            a_offset: (chunk.head0 * nq + chunk.row0) * dk,
            b_offset: 0,
            c_offset: 0,
            a_stride: nq * dk,
            b_stride: t * dk,
            c_stride: m * t,
            b_batch_base: chunk.head0,
            b_batch_div: dims.group(),
            alpha: scale,
            beta: 0.0,
        }
    };
    // The packed matrix-unit GEMM's f16 operands: each chunk's own, all
    // alive until the call's one submission has run.
    let packed_bytes: u64 = chunks
        .iter()
        .map(|chunk| gemm::packed_bytes(ctx, gemm_kernel, &scores_spec(chunk), gemm::AValues::Any))
        .sum();
    let allocated_bytes = bytes(y_len)
        + bytes(heads * nq)
        + bytes(chunk_rows * t)
        + packed_bytes
        + present_bytes
        + if options.qk_matmul_output_mode.is_some() {
            bytes(qk_len)
        } else {
            0
        };

    ctx.scoped("unfused attention", || {
        let y = buffer::storage(ctx, "Y", y_len)?;
        let lse = buffer::storage(ctx, "lse", heads * nq)?;
        let qk = match options.qk_matmul_output_mode {
            Some(_) => Some(buffer::storage(ctx, "qk_matmul_output", qk_len)?),
            None => None,
        };
        let scores = buffer::storage(ctx, "scores", chunk_rows * t)?;
        let mask_placeholder = buffer::storage(ctx, "no mask", 1)?;
        let qk_placeholder = buffer::storage(ctx, "no qk output", 1)?;
        let nonpad = kv::upload_rule_data(ctx, dims, inputs.nonpad, options.alibi)?;

        let mut rec = Recorder::new(ctx, "unfused attention");

        // Keys and values in the concatenated [B, Hkv, T, D] layout.
        let present = kv::record_present(&mut rec, dims, inputs, options.return_present)?;
        let (present_key, present_value) = match present {
            Some((k, v)) => (Some(k), Some(v)),
            None => (None, None),
        };
        let (q, k, v) = inputs.whole_qkv()?;
        let keys = present_key.as_ref().unwrap_or(k);
        let values = present_value.as_ref().unwrap_or(v);

        let mask_buffers = mask::MaskBuffers {
            mask: inputs.whole_mask()?.unwrap_or(&mask_placeholder),
            nonpad: &nonpad,
            qk_out: qk.as_ref().unwrap_or(&qk_placeholder),
        };
        for chunk in &chunks {
            let m = chunk.rows_per_head;
            let global_row0 = chunk.head0 * nq + chunk.row0;
            gemm::record_variant(
                &mut rec,
                gemm_kernel,
                &scores_spec(chunk),
                gemm::AValues::Any,
                [q, keys, &scores],
            )?;
            mask::record(
                &mut rec,
                dims,
                options,
                global_row0,
                chunk.rows(),
                &scores,
                &mask_buffers,
            )?;
            softmax::record(
                &mut rec,
                chunk.rows(),
                t,
                &scores,
                &lse,
                global_row0,
                softmax::NotAttended::Marked,
                1.0 / options.temperature,
            )?;
            let output_spec = gemm::GemmSpec {
                batch: chunk.heads,
                m,
                n: dv,
                k: t,
                trans_a: false,
                trans_b: false,
                lda: t,
                ldb: dv,
                ldc: dv,
                a_offset: 0,
                b_offset: 0,
                c_offset: global_row0 * dv,
                a_stride: m * t,
                b_stride: t * dv,
                c_stride: nq * dv,
                b_batch_base: chunk.head0,
                b_batch_div: dims.group(),
                alpha: 1.0,
                beta: 0.0,
            };
            // Keys not attended have probability -0 and take no part, whatever
            // V holds; an attended key's +0 still multiplies its V row.
            // P holds probabilities in [0, 1], -0 for a key not attended:
            // every term whose P is -0 is skipped, so NaN or inf in such a
            // key's V row adds nothing, while an attended key whose
            // probability is +0 still multiplies its row (0 · inf is NaN, as
            // in PyTorch).
            gemm::record_variant(
                &mut rec,
                gemm_kernel,
                &output_spec,
                gemm::AValues::Probabilities,
                [&scores, values, &y],
            )?;
            if let (Some(QkMatmulOutputMode::Probabilities), Some(qk)) =
                (options.qk_matmul_output_mode, qk.as_ref())
            {
                // The caller sees +0 where a key is not attended.
                softmax::record_clear_marks(&mut rec, chunk.rows(), t, &scores, &lse)?;
                rec.copy(&scores, 0, qk, global_row0 * t, chunk.rows() * t);
            }
        }
        rec.submit();

        let want_present = options.return_present;
        Ok(GpuOutputs {
            y: Held::single(y),
            lse: Held::single(lse),
            qk: qk.map(Held::single),
            present_key: present_key.filter(|_| want_present).map(Held::single),
            present_value: present_value.filter(|_| want_present).map(Held::single),
            allocated_bytes,
            pieces: 1,
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_row_once() {
        for (heads, q_len, cols, budget) in [
            (6, 7, 5, 1 << 20),
            (6, 7, 5, 4 * 5 * 7 * 2),
            (6, 7, 5, 4 * 5 * 3),
            (1, 1025, 1025, 4 * 1025 * 100),
        ] {
            let chunks = plan_chunks(heads, q_len, cols, budget).unwrap();
            let mut seen = vec![0u8; heads * q_len];
            for c in &chunks {
                assert!(c.rows() as u64 * cols as u64 * 4 <= budget);
                for h in c.head0..c.head0 + c.heads {
                    for r in c.row0..c.row0 + c.rows_per_head {
                        seen[h * q_len + r] += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&s| s == 1),
                "{heads} {q_len} {cols} {budget}"
            );
        }
        assert!(plan_chunks(1, 1, 100, 399).is_err());
    }
}
