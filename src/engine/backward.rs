//! Attention's backward pass on an engine: the plan (`plan/backward.rs`),
//! then the fused kernels on the device, the CPU backend or the oracle, with
//! the gradients typed as their inputs (f16 ones rounded from f32 sums).

use std::sync::Arc;

use super::{Backend, Engine};
use crate::cpu;
use crate::device::chunks::{Held, Source};
use crate::device::scope::Run;
use crate::device_tensor::{Storage, Tensor};
use crate::error::{Error, Result};
use crate::gradients::{check_backward, AttentionGradients, BackwardInputs, GradientOptions};
use crate::options::{AttentionOptions, KernelPath};
use crate::plan::backward::{plan_backward, BackwardPlan};
use crate::problem::{validate, AttentionDims, AttentionInputs};
use crate::run::backward::{self as backward_run, ForwardBuffers};
use crate::run::half;
use crate::run::present::GpuInputs;
use crate::tensor::{DType, HostMask, HostTensor};

impl Engine {
    /// How a backward call of these sizes and options would run on this
    /// engine, and why: the only decision the call follows.
    pub fn plan_backward(
        &self,
        dims: &AttentionDims,
        options: &AttentionOptions,
        grads: GradientOptions,
    ) -> Result<BackwardPlan> {
        let gpu_engine = matches!(self.backend, Backend::Gpu(_));
        let caps = match &self.backend {
            Backend::Gpu(gpu) => Some(&*gpu.current().caps),
            Backend::Cpu => self.adapter.as_ref().and_then(|a| a.capabilities()),
        };
        let mut plan = plan_backward(caps, gpu_engine, dims, options, grads)?;
        if let (false, Some(adapter), KernelPath::Fused) = (gpu_engine, &self.adapter, plan.path) {
            let why = format!(
                "asked for by name: runs on {}, which this engine leaves to the CPU backend \
                 otherwise",
                adapter.describe()
            );
            plan.reason = Some(match plan.reason {
                Some(reason) => format!("{why}; {reason}"),
                None => why,
            });
        }
        Ok(plan)
    }

    /// The gradients of attention's inputs on host data: dQ, dK and dV (and
    /// the past's, and the float mask's where asked) of the forward of
    /// `inputs` and `options`, given its Y and logsumexp (from any path) and
    /// dY. Nothing is written into the caller's tensors; a refusal is a
    /// typed error naming the tensor.
    pub async fn attention_backward_host(
        &self,
        inputs: &AttentionInputs<'_, HostTensor>,
        options: &AttentionOptions,
        forward: &BackwardInputs<'_, HostTensor>,
        grads: GradientOptions,
    ) -> Result<AttentionGradients<HostTensor>> {
        let dims = validate(inputs, options)?;
        check_backward(&dims, forward)?;
        check_mask_gradient(inputs.attn_mask, grads)?;
        let plan = self.plan_backward(&dims, options, grads)?;
        let out = match (plan.path, &self.backend, &self.adapter) {
            (KernelPath::Oracle, ..) => cpu::attention_backward(inputs, options, forward, grads)?,
            (KernelPath::Fused, Backend::Cpu, Some(adapter)) => {
                Box::pin(adapter.attention_backward_host(inputs, options, forward, grads)).await?
            }
            (KernelPath::Fused, Backend::Gpu(_), _) => {
                self.recover().await?;
                let upload = |name, t| self.upload_named(name, t);
                let (q, k, v) = (
                    upload("Q", inputs.q).await?,
                    upload("K", inputs.k).await?,
                    upload("V", inputs.v).await?,
                );
                let mask = match inputs.attn_mask {
                    Some(m) => Some(self.upload_mask_async(m).await?),
                    None => None,
                };
                let mut past = Vec::new();
                for (name, t) in [
                    ("past_key", inputs.past_key),
                    ("past_value", inputs.past_value),
                ] {
                    if let Some(t) = t {
                        past.push(upload(name, t).await?);
                    }
                }
                let (y, lse, dy) = (
                    upload("Y", forward.y).await?,
                    upload("lse", forward.lse).await?,
                    upload("dY", forward.dy).await?,
                );
                let mut device = AttentionInputs::new(&q, &k, &v);
                if let Some(m) = &mask {
                    device = device.with_mask(m);
                }
                if let [pk, pv] = &past[..] {
                    device = device.with_past(pk, pv);
                }
                device.nonpad_kv_seqlen = inputs.nonpad_kv_seqlen;
                let forward = BackwardInputs {
                    y: &y,
                    lse: &lse,
                    dy: &dy,
                };
                let out =
                    Box::pin(self.attention_backward(&device, options, &forward, grads)).await?;
                return self.download_gradients(&out).await;
            }
            _ => {
                let exact = self
                    .cpu
                    .attention_backward(inputs, options, forward, grads)?;
                cpu::gradients_as_tensors(inputs, &exact)?
            }
        };
        *self.last_backward.lock().unwrap_or_else(|e| e.into_inner()) = Some(plan);
        Ok(typed_gradients(out, inputs))
    }

    /// [`Engine::attention_backward_host`] on tensors this engine holds; the
    /// gradients stay on the engine (read them with
    /// [`Engine::download_gradients`]).
    pub async fn attention_backward(
        &self,
        inputs: &AttentionInputs<'_, Tensor>,
        options: &AttentionOptions,
        forward: &BackwardInputs<'_, Tensor>,
        grads: GradientOptions,
    ) -> Result<AttentionGradients<Tensor>> {
        self.recover().await?;
        self.check_input_owners(inputs)?;
        for (name, t) in [("Y", forward.y), ("lse", forward.lse), ("dY", forward.dy)] {
            self.own(name, t)?;
        }
        let dims = validate(inputs, options)?;
        check_backward(&dims, forward)?;
        let plan = self.plan_backward(&dims, options, grads)?;
        if let (KernelPath::Fused, Backend::Gpu(gpu), Some(tiles)) =
            (plan.path, &self.backend, plan.tiles)
        {
            let (device, generation) = gpu.latest();
            let ctx = Run::new(device);
            let out = self
                .backward_on_gpu(&ctx, generation, inputs, options, forward, &dims, &tiles)
                .await?;
            *self.last_backward.lock().unwrap_or_else(|e| e.into_inner()) = Some(plan);
            return Ok(out);
        }
        // Elsewhere: through the host.
        let host = |t| self.to_host(t);
        let copies = self.host_inputs(inputs).await?;
        let host_inputs = copies.view(inputs.nonpad_kv_seqlen);
        let (y, lse, dy) = (
            host(forward.y).await?,
            host(forward.lse).await?,
            host(forward.dy).await?,
        );
        let host_forward = BackwardInputs {
            y: &*y,
            lse: &*lse,
            dy: &*dy,
        };
        let out = self
            .attention_backward_host(&host_inputs, options, &host_forward, grads)
            .await?;
        let adopt = |t: Option<HostTensor>| async move {
            match t {
                Some(t) => self.upload_named("gradient", &t).await.map(Some),
                None => Ok(None),
            }
        };
        Ok(AttentionGradients {
            dq: self.upload_named("dQ", &out.dq).await?,
            dk: self.upload_named("dK", &out.dk).await?,
            dv: self.upload_named("dV", &out.dv).await?,
            d_past_key: adopt(out.d_past_key).await?,
            d_past_value: adopt(out.d_past_value).await?,
            d_mask: adopt(out.d_mask).await?,
        })
    }

    /// Reads every gradient back to the host.
    pub async fn download_gradients(
        &self,
        grads: &AttentionGradients<Tensor>,
    ) -> Result<AttentionGradients<HostTensor>> {
        let optional = |t: &Option<Tensor>| {
            let t = t.clone();
            async move {
                match t {
                    Some(t) => self.download(&t).await.map(Some),
                    None => Ok(None),
                }
            }
        };
        Ok(AttentionGradients {
            dq: self.download(&grads.dq).await?,
            dk: self.download(&grads.dk).await?,
            dv: self.download(&grads.dv).await?,
            d_past_key: optional(&grads.d_past_key).await?,
            d_past_value: optional(&grads.d_past_value).await?,
            d_mask: optional(&grads.d_mask).await?,
        })
    }

    /// The plan of this engine's last backward call.
    pub fn last_backward(&self) -> Option<BackwardPlan> {
        self.last_backward
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    #[allow(clippy::too_many_arguments)]
    async fn backward_on_gpu(
        &self,
        ctx: &Run,
        generation: u64,
        inputs: &AttentionInputs<'_, Tensor>,
        options: &AttentionOptions,
        forward: &BackwardInputs<'_, Tensor>,
        dims: &AttentionDims,
        tiles: &crate::kernels::backward::BackwardTiles,
    ) -> Result<AttentionGradients<Tensor>> {
        // f32 buffers, one per tensor: f16 ones widened.
        let f32_buffer = |name: &'static str, t: &Tensor| {
            let held = t.storage.held();
            let (len, f16) = (t.len(), t.dtype == DType::F16);
            async move {
                match held {
                    Some(Held::One(b)) if f16 => Ok(Arc::new(half::widen(ctx, &b, len).await?)),
                    Some(Held::One(b)) => Ok(b),
                    Some(Held::Many(_)) => Err(Error::Limit {
                        what: format!("{name} held in several buffers"),
                        needed: len as u64 * 4,
                        limit: ctx.caps.limits.max_storage_buffer_binding_size,
                        limit_name: "max_storage_buffer_binding_size",
                        hint: "the fused backward takes tensors within one binding; use \
                               KernelPath::Cpu",
                    }),
                    None => Err(Error::ForeignTensor { tensor: name }),
                }
            }
        };
        let q = f32_buffer("Q", inputs.q).await?;
        let k = f32_buffer("K", inputs.k).await?;
        let v = f32_buffer("V", inputs.v).await?;
        let past_key = match inputs.past_key {
            Some(t) => Some(f32_buffer("past_key", t).await?),
            None => None,
        };
        let past_value = match inputs.past_value {
            Some(t) => Some(f32_buffer("past_value", t).await?),
            None => None,
        };
        let mask = match inputs.attn_mask {
            Some(m) => Some(m.storage.held().ok_or(Error::ForeignTensor {
                tensor: "attn_mask",
            })?),
            None => None,
        };
        let y = f32_buffer("Y", forward.y).await?;
        let lse = f32_buffer("lse", forward.lse).await?;
        let dy = f32_buffer("dY", forward.dy).await?;
        let gpu_inputs = GpuInputs {
            q: Source::whole(&q),
            k: Source::whole(&k),
            v: Source::whole(&v),
            mask: mask.as_ref().map(Held::source),
            past_key: past_key.as_deref().map(Source::whole),
            past_value: past_value.as_deref().map(Source::whole),
            nonpad: inputs.nonpad_kv_seqlen,
            kv_f16: false,
        };
        let buffers = ForwardBuffers {
            y: &y,
            lse: &lse,
            dy: &dy,
        };
        let out = backward_run::run(ctx, dims, &gpu_inputs, &buffers, options, tiles).await?;
        // Typed as the inputs: f16 ones narrowed from the f32 sums.
        let typed = |shape: &[usize], b: wgpu::Buffer, dtype: DType| {
            let shape = shape.to_vec();
            async move {
                let len = shape.iter().product();
                let b = if dtype == DType::F16 {
                    half::narrow(ctx, &b, len).await?
                } else {
                    b
                };
                Ok::<_, Error>(Tensor {
                    shape,
                    dtype,
                    storage: Storage::Gpu(Arc::new(b)),
                    engine_id: self.id,
                    generation,
                })
            }
        };
        let (d_past_key, d_past_value) = match (out.d_past, inputs.past_key, inputs.past_value) {
            (Some((pk, pv)), Some(tk), Some(tv)) => (
                Some(typed(tk.shape(), pk, tk.dtype).await?),
                Some(typed(tv.shape(), pv, tv.dtype).await?),
            ),
            _ => (None, None),
        };
        Ok(AttentionGradients {
            dq: typed(inputs.q.shape(), out.dq, inputs.q.dtype).await?,
            dk: typed(inputs.k.shape(), out.dk, inputs.k.dtype).await?,
            dv: typed(inputs.v.shape(), out.dv, inputs.v.dtype).await?,
            d_past_key,
            d_past_value,
            d_mask: None,
        })
    }
}

/// A mask gradient needs a float mask.
fn check_mask_gradient(mask: Option<&HostMask>, grads: GradientOptions) -> Result<()> {
    match (grads.mask_gradient, mask) {
        (true, None) => Err(Error::Conflict(
            "a mask gradient was asked for without a mask",
        )),
        (true, Some(HostMask::Bool { .. })) => Err(Error::Conflict(
            "a bool mask has no gradient: pass a float mask",
        )),
        _ => Ok(()),
    }
}

/// Host gradients in their inputs' dtypes (f16 ones rounded).
fn typed_gradients(
    out: AttentionGradients<HostTensor>,
    inputs: &AttentionInputs<'_, HostTensor>,
) -> AttentionGradients<HostTensor> {
    let dtype_of = |t: Option<&HostTensor>| t.map_or(DType::F32, HostTensor::dtype);
    AttentionGradients {
        dq: out.dq.into_dtype(inputs.q.dtype()),
        dk: out.dk.into_dtype(inputs.k.dtype()),
        dv: out.dv.into_dtype(inputs.v.dtype()),
        d_past_key: out
            .d_past_key
            .map(|t| t.into_dtype(dtype_of(inputs.past_key))),
        d_past_value: out
            .d_past_value
            .map(|t| t.into_dtype(dtype_of(inputs.past_value))),
        d_mask: out.d_mask,
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Engine {
    /// [`Engine::attention_backward_host`], blocking.
    pub fn attention_backward_host_blocking(
        &self,
        inputs: &AttentionInputs<'_, HostTensor>,
        options: &AttentionOptions,
        forward: &BackwardInputs<'_, HostTensor>,
        grads: GradientOptions,
    ) -> Result<AttentionGradients<HostTensor>> {
        pollster::block_on(self.attention_backward_host(inputs, options, forward, grads))
    }
}
