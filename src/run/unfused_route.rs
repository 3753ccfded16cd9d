//! The unfused attention path: QKᵀ GEMM → softcap/mask/bias → softmax → PV GEMM,
//! recorded into one command buffer with no readback between the steps.
//!
//! The score matrix `[B·Hq·Nq, T]` is materialised in chunks of rows that fit
//! one storage binding (and the engine's score budget): either several whole
//! heads at a time, or, when one head is too big, a range of its query rows.
//! This path implements the whole contract and stays as the reference GPU path.

use crate::device::buffer;
use crate::device::chunks::Held;
use crate::device::recorder::Recorder;
use crate::device::scope::Run;
use crate::error::{Error, Result};
use crate::kernels::gemm::attention::{score_blocks, ScoreBlock};
use crate::kernels::gemm::{GemmKernel, GemmSpec};
use crate::kernels::{gemm, mask, softmax};
use crate::options::{AttentionOptions, QkMatmulOutputMode};
use crate::plan::workspace;
use crate::problem::AttentionDims;
use crate::run::present as kv;
use crate::run::present::{bytes, GpuInputs, GpuOutputs};

/// Runs the unfused path: each block of score rows by the planned kernel of
/// each product (`products`: `S = Q Kᵀ`, then `Y = P V`); returns once the
/// work is submitted.
pub(crate) async fn run(
    ctx: &Run,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    options: &AttentionOptions,
    products: [GemmKernel; 2],
    score_budget: u64,
) -> Result<GpuOutputs> {
    let (b, hq, nq) = (dims.batch, dims.q_heads, dims.q_len);
    let (dv, t) = (dims.v_head_dim, dims.total_len());
    let heads = b * hq;
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
    let blocks = score_blocks(heads, nq, t, score_budget)?;
    let block_rows = blocks.iter().map(ScoreBlock::rows).max().unwrap_or(1);

    let y_len = heads * nq * dv;
    let qk_len = heads * nq * t;
    buffer::check_bindable(ctx, "Y", bytes(y_len))?;
    if options.qk_matmul_output_mode.is_some() {
        buffer::check_bindable(ctx, "qk_matmul_output", bytes(qk_len))?;
    }
    kv::check_present(ctx, dims, options.return_present)?;
    let allocated_bytes =
        workspace::unfused_bytes(&ctx.caps, dims, options, products[0], score_budget)?;

    ctx.scoped("unfused attention", || {
        let y = buffer::storage(ctx, "Y", y_len)?;
        let lse = buffer::storage(ctx, "lse", heads * nq)?;
        let qk = match options.qk_matmul_output_mode {
            Some(_) => Some(buffer::storage(ctx, "qk_matmul_output", qk_len)?),
            None => None,
        };
        let scores = buffer::storage(ctx, "scores", block_rows * t)?;
        let mask_placeholder = buffer::storage(ctx, "no mask", 1)?;
        let qk_placeholder = buffer::storage(ctx, "no qk output", 1)?;
        let nonpad = kv::upload_rule_data(ctx, dims, inputs.nonpad, options.alibi)?;

        let mut rec = Recorder::new(ctx, "unfused attention");

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
        for block in &blocks {
            let global_row0 = block.head0 * nq + block.row0;
            gemm::record_variant(
                &mut rec,
                products[0],
                &GemmSpec::attention_scores(dims, options, block),
                gemm::AValues::Any,
                [q, keys, &scores],
            )?;
            mask::record(
                &mut rec,
                dims,
                options,
                global_row0,
                block.rows(),
                &scores,
                &mask_buffers,
            )?;
            softmax::record(
                &mut rec,
                block.rows(),
                t,
                &scores,
                &lse,
                global_row0,
                softmax::NotAttended::Marked,
                1.0 / options.temperature,
            )?;
            gemm::record_variant(
                &mut rec,
                products[1],
                &GemmSpec::attention_values(dims, block),
                gemm::AValues::Probabilities,
                [&scores, values, &y],
            )?;
            if let (Some(QkMatmulOutputMode::Probabilities), Some(qk)) =
                (options.qk_matmul_output_mode, qk.as_ref())
            {
                softmax::record_clear_marks(&mut rec, block.rows(), t, &scores, &lse)?;
                rec.copy(&scores, 0, qk, global_row0 * t, block.rows() * t);
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
