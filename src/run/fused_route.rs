//! The fused attention path: KV concatenation when there is a past, one fused
//! dispatch for Y and the logsumexp (or, for a few query rows against many
//! keys, the split-K decode kernel and its merge), and (only when asked) the
//! recompute of `qk_matmul_output`. Memory is O(N): the score matrix is never allocated,
//! unless the caller asks for it as an output.

use crate::device::buffer;
use crate::device::chunks::Held;
use crate::device::recorder::{Recorder, Seg};
use crate::device::scope::Run;
use crate::error::{Error, Result};
use crate::kernels::ablation::Phases;
use crate::kernels::attention as fused;
use crate::kernels::attention::{AttentionBuffers, FusedKernel};
use crate::kernels::decode;
use crate::kernels::decode::DecodeLayout;
use crate::options::{AttentionOptions, QkMatmulOutputMode};
use crate::plan::workspace;
use crate::problem::AttentionDims;
use crate::run::present as kv;
use crate::run::present::{bytes, GpuInputs, GpuOutputs};

/// Runs the fused path with the planned `kernel` (and `decode`, where the
/// call decodes); returns once the work is submitted.
pub(crate) async fn run(
    ctx: &Run,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    options: &AttentionOptions,
    kernel: &FusedKernel,
    decode: Option<DecodeLayout>,
    phases: Phases,
) -> Result<GpuOutputs> {
    if inputs.kv_f16
        && (decode.is_none()
            || kv::needs_present(dims, options.return_present)
            || options.qk_matmul_output_mode.is_some())
    {
        return Err(Error::Conflict(
            "f16 keys and values are read in place only by the decode kernel, \
             without a past, presents or scores",
        ));
    }
    let rows = dims.batch * dims.q_heads * dims.q_len;
    let y_len = rows * dims.v_head_dim;
    let qk_len = rows * dims.total_len();
    buffer::check_bindable(ctx, "Y", bytes(y_len))?;
    if let Some(mode) = options.qk_matmul_output_mode {
        buffer::check_bindable(ctx, "qk_matmul_output", bytes(qk_len))?;
        // Probabilities are normalised by the row softmax, which loops over a row.
        if let (QkMatmulOutputMode::Probabilities, Some(loops)) = (mode, ctx.caps.loop_budget()) {
            let needed = 3 * dims.total_len().div_ceil(128) as u64 + 64;
            if needed > loops {
                return Err(Error::Limit {
                    what: format!("probabilities of rows of {} keys", dims.total_len()),
                    needed,
                    limit: loops,
                    limit_name: "loop iterations per invocation (llvmpipe)",
                    hint: "ask for qk_matmul_output in mode 2 and normalise on the host",
                });
            }
        }
    }
    kv::check_present(ctx, dims, options.return_present)?;
    let allocated_bytes = workspace::fused_bytes(&ctx.caps, dims, options, kernel, decode.as_ref());

    ctx.scoped("fused attention", || {
        let y = buffer::storage(ctx, "Y", y_len)?;
        // [lse | row max | row sum]: the caller sees the first `rows` values.
        let lse = buffer::storage(ctx, "lse", 3 * rows)?;
        let placeholder = buffer::storage(ctx, "no mask", 1)?;
        let nonpad = kv::upload_rule_data(ctx, dims, inputs.nonpad, options.alibi)?;
        let mut rec = Recorder::new(ctx, "fused attention");
        let present = kv::record_present(&mut rec, dims, inputs, options.return_present)?;
        let (keys, values) = match &present {
            Some((k, v)) => (Seg::whole(k), Seg::whole(v)),
            None => (inputs.k.seg()?, inputs.v.seg()?),
        };
        let buffers = AttentionBuffers {
            q: inputs.q.seg()?,
            k: keys,
            v: values,
            mask: inputs.whole_mask()?.unwrap_or(&placeholder),
            nonpad: &nonpad,
            kv_f16: inputs.kv_f16,
        };
        match &decode {
            Some(plan) => {
                decode::record(&mut rec, dims, options, plan, &buffers, &y, &lse, phases)?
            }
            None => fused::record_forward(
                &mut rec,
                dims,
                options,
                kernel,
                &buffers,
                &y,
                &lse,
                fused::KeyPart::WHOLE,
                phases,
            )?,
        }
        let qk = match options.qk_matmul_output_mode {
            Some(mode) => {
                let out = buffer::storage(ctx, "qk_matmul_output", qk_len)?;
                let scratch = buffer::storage(ctx, "probabilities lse", rows)?;
                fused::record_scores(&mut rec, dims, options, mode, &buffers, &out, &scratch)?;
                Some(out)
            }
            None => None,
        };
        rec.submit();
        let (present_key, present_value) = match present {
            Some((k, v)) if options.return_present => (Some(k), Some(v)),
            _ => (None, None),
        };
        Ok(GpuOutputs {
            y: Held::single(y),
            lse: Held::single(lse),
            qk: qk.map(Held::single),
            present_key: present_key.map(Held::single),
            present_value: present_value.map(Held::single),
            allocated_bytes,
            pieces: 1,
        })
    })
    .await
}
