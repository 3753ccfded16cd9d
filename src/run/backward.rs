//! Running a backward call's plan on the device: K and V with the past in
//! front (as the forward reads them), the rule data, the backward kernels
//! (`kernels/backward.rs`), and the gradients copied out per input: dQ, dK
//! and dV of the new rows, and the past's where the call has one.

use crate::device::buffer;
use crate::device::recorder::{Recorder, Seg};
use crate::device::scope::Run;
use crate::error::{Error, Result};
use crate::kernels::attention::AttentionBuffers;
use crate::kernels::backward::{self, BackwardBuffers, BackwardTiles};
use crate::options::AttentionOptions;
use crate::problem::AttentionDims;
use crate::run::present::{self as kv, GpuInputs};

/// The forward's Y and logsumexp and the caller's dY, on the device.
pub(crate) struct ForwardBuffers<'a> {
    pub y: &'a wgpu::Buffer,
    pub lse: &'a wgpu::Buffer,
    pub dy: &'a wgpu::Buffer,
}

/// The gradients on the device, one buffer per input.
pub(crate) struct GradientBuffers {
    pub dq: wgpu::Buffer,
    pub dk: wgpu::Buffer,
    pub dv: wgpu::Buffer,
    /// The past's, where the call has one.
    pub d_past: Option<(wgpu::Buffer, wgpu::Buffer)>,
}

/// Records and submits the backward of a call with the planned `tiles`.
pub(crate) async fn run(
    ctx: &Run,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    forward: &ForwardBuffers<'_>,
    options: &AttentionOptions,
    tiles: &BackwardTiles,
) -> Result<GradientBuffers> {
    if inputs.kv_f16 {
        return Err(Error::Conflict("the backward reads K and V as f32"));
    }
    let (heads, t_len) = (dims.batch * dims.kv_heads, dims.total_len());
    let (dk, dv) = (dims.head_dim, dims.v_head_dim);
    for (what, len) in [
        ("dQ", dims.batch * dims.q_heads * dims.q_len * dk),
        ("dK and dV", heads * t_len * (dk + dv)),
    ] {
        buffer::check_bindable(ctx, what, buffer::f32_bytes(len))?;
    }
    ctx.scoped("attention backward", || {
        let placeholder = buffer::storage(ctx, "no mask", 1)?;
        let nonpad = kv::upload_rule_data(ctx, dims, inputs.nonpad, options.alibi)?;
        let mut rec = Recorder::new(ctx, "attention backward");
        let present = kv::record_present(&mut rec, dims, inputs, false)?;
        let (keys, values) = match &present {
            Some((k, v)) => (Seg::whole(k), Seg::whole(v)),
            None => (inputs.k.seg()?, inputs.v.seg()?),
        };
        let buffers = BackwardBuffers {
            attention: AttentionBuffers {
                q: inputs.q.seg()?,
                k: keys,
                v: values,
                mask: inputs.whole_mask()?.unwrap_or(&placeholder),
                nonpad: &nonpad,
                kv_f16: false,
            },
            y: forward.y.into(),
            dy: forward.dy.into(),
            lse: forward.lse,
        };
        let out = backward::record(&mut rec, dims, options, tiles, &buffers)?;
        // [dK | dV] of the present rows, split per input.
        let new_k = buffer::storage(ctx, "dK", heads * dims.kv_len * dk)?;
        let new_v = buffer::storage(ctx, "dV", heads * dims.kv_len * dv)?;
        let v_start = heads * t_len * dk;
        let d_past = if dims.has_past {
            let past_k = buffer::storage(ctx, "dpast_key", heads * dims.past_len * dk)?;
            let past_v = buffer::storage(ctx, "dpast_value", heads * dims.past_len * dv)?;
            for head in 0..heads {
                let (p, n) = (dims.past_len, dims.kv_len);
                rec.copy(&out.dkdv, head * t_len * dk, &past_k, head * p * dk, p * dk);
                rec.copy(
                    &out.dkdv,
                    (head * t_len + p) * dk,
                    &new_k,
                    head * n * dk,
                    n * dk,
                );
                let src = v_start + head * t_len * dv;
                rec.copy(&out.dkdv, src, &past_v, head * p * dv, p * dv);
                rec.copy(&out.dkdv, src + p * dv, &new_v, head * n * dv, n * dv);
            }
            Some((past_k, past_v))
        } else {
            rec.copy(&out.dkdv, 0, &new_k, 0, heads * t_len * dk);
            rec.copy(&out.dkdv, v_start, &new_v, 0, heads * t_len * dv);
            None
        };
        rec.submit();
        Ok(GradientBuffers {
            dq: out.dq,
            dk: new_k,
            dv: new_v,
            d_past,
        })
    })
    .await
}
