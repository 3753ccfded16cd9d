//! An attention call on the GPU paths: the call's tensors as device storage
//! (f16 ones widened where the kernels read f32; one buffer or several, see
//! `device/chunks.rs`), the call whole or in pieces (`run/split.rs`), and its
//! outputs typed as ONNX types them.

use std::sync::Arc;

use super::{CallStats, Engine};
use crate::device::chunks;
use crate::device::chunks::Held;
use crate::device::scope::Run;
use crate::device_tensor::{Storage, Tensor};
use crate::error::{Error, Result};
use crate::options::AttentionOptions;
use crate::plan::CallPlan;
use crate::problem::{AttentionDims, AttentionInputs, AttentionOutputs};
use crate::run::half;
use crate::run::split;
use crate::tensor::DType;

impl Engine {
    /// Runs a validated call's `plan` (a GPU route) on `ctx` (the device of
    /// `generation`).
    pub(super) async fn attention_on_gpu(
        &self,
        ctx: &Run,
        generation: u64,
        inputs: &AttentionInputs<'_, Tensor>,
        options: &AttentionOptions,
        dims: &AttentionDims,
        plan: &CallPlan,
    ) -> Result<AttentionOutputs<Tensor>> {
        // Tensors wrapped at an offset are copied into the workspace first.
        let unviewed = [
            Some(inputs.q),
            Some(inputs.k),
            Some(inputs.v),
            inputs.past_key,
            inputs.past_value,
        ];
        let mut copies = Vec::with_capacity(unviewed.len());
        for t in unviewed {
            copies.push(match t {
                Some(t) => crate::device_tensor::unview(ctx, t).await?,
                None => None,
            });
        }
        fn pick<'t>(copy: &'t Option<Tensor>, t: &'t Tensor) -> &'t Tensor {
            copy.as_ref().unwrap_or(t)
        }
        let local = AttentionInputs {
            q: pick(&copies[0], inputs.q),
            k: pick(&copies[1], inputs.k),
            v: pick(&copies[2], inputs.v),
            past_key: inputs.past_key.map(|t| pick(&copies[3], t)),
            past_value: inputs.past_value.map(|t| pick(&copies[4], t)),
            attn_mask: inputs.attn_mask,
            nonpad_kv_seqlen: inputs.nonpad_kv_seqlen,
        };
        let inputs = &local;
        let held = |t: &Tensor| {
            t.storage
                .held()
                .ok_or(Error::ForeignTensor { tensor: "tensor" })
        };
        let mask = match inputs.attn_mask {
            Some(m) => Some(m.storage.held().ok_or(Error::ForeignTensor {
                tensor: "attn_mask",
            })?),
            None => None,
        };
        // f16 keys and values stay f16 where the plan reads them in place
        // (the decode kernel; see run/half.rs), held as the plan expects.
        let chunk_len = |t: &Tensor| match &t.storage {
            Storage::GpuChunks(c) => Some(c.chunk_len()),
            _ => None,
        };
        let kv_f16 = plan.kv_f16 == Some(crate::plan::KvRead::InPlace);
        if kv_f16
            && [chunk_len(inputs.k), chunk_len(inputs.v)]
                != crate::plan::workspace::kv_chunks(&ctx.caps, dims)
        {
            return Err(Error::Conflict(
                "f16 keys and values held in buffers other than an upload of their size makes \
                 cannot be read in place: upload them with this engine",
            ));
        }
        let f32_held = |t: &Tensor, keep_f16: bool| {
            let (h, widen) = (held(t), t.dtype == DType::F16 && !keep_f16);
            let (len, shape) = (t.len(), t.shape.clone());
            async move {
                let h = h?;
                if !widen {
                    return Ok::<_, Error>(h);
                }
                let max_buffer = ctx.caps.limits.max_buffer_size;
                // f16 values that fit one buffer but whose f32 values do
                // not are widened in chunks.
                let h = match (&h, chunks::chunk_len(&shape, DType::F32, max_buffer)?) {
                    (Held::One(b), Some(n)) => Held::Many(Arc::new(
                        ctx.scoped("f16 tensor into chunks", || {
                            chunks::split_f16(ctx, b, len, n)
                        })
                        .await?,
                    )),
                    _ => h,
                };
                Ok(match &h {
                    Held::One(b) => Held::One(Arc::new(half::widen(ctx, b, len).await?)),
                    Held::Many(c) => {
                        let mut widened = Vec::with_capacity(c.buffers().len());
                        for (i, b) in c.buffers().iter().enumerate() {
                            widened.push(half::widen(ctx, b, c.values_in(i)).await?);
                        }
                        Held::Many(Arc::new(chunks::with_buffers(c, widened, DType::F32)))
                    }
                })
            }
        };
        let widened_bytes = [Some(inputs.q), Some(inputs.k), Some(inputs.v)]
            .into_iter()
            .chain([inputs.past_key, inputs.past_value])
            .flatten()
            .filter(|t| t.dtype == DType::F16)
            .filter(|t| !kv_f16 || std::ptr::eq(*t, inputs.q))
            .map(|t| t.len() as u64 * 4)
            .sum::<u64>();
        let q = f32_held(inputs.q, false).await?;
        let k = f32_held(inputs.k, kv_f16).await?;
        let v = f32_held(inputs.v, kv_f16).await?;
        // A past is concatenated in front of K and V into one buffer:
        // it fits one only when the present does.
        let past_key = match inputs.past_key {
            Some(t) => Some(f32_held(t, false).await?),
            None => None,
        };
        let past_value = match inputs.past_value {
            Some(t) => Some(f32_held(t, false).await?),
            None => None,
        };
        let gpu_inputs = crate::run::present::GpuInputs {
            q: q.source(),
            k: k.source(),
            v: v.source(),
            mask: mask.as_ref().map(Held::source),
            past_key: past_key.as_ref().map(Held::source),
            past_value: past_value.as_ref().map(Held::source),
            nonpad: inputs.nonpad_kv_seqlen,
            kv_f16,
        };
        let out = split::run(ctx, dims, &gpu_inputs, options, plan).await?;
        self.record_call(CallStats {
            plan: plan.clone(),
            allocated_bytes: out.allocated_bytes + widened_bytes,
            pieces: out.pieces,
            widened_bytes,
        });
        // Outputs as ONNX types them: Y and the scores as Q, the
        // presents as K and V; f16 ones narrowed from the f32 results.
        let typed = |shape: Vec<usize>, h: Option<Held>, dtype: DType| async move {
            let Some(h) = h else { return Ok(None) };
            let len = shape.iter().product();
            let storage = match (h, dtype == DType::F16) {
                (Held::One(b), false) => Storage::Gpu(b),
                (Held::Many(c), false) => Storage::GpuChunks(c),
                (Held::One(b), true) => Storage::Gpu(Arc::new(half::narrow(ctx, &b, len).await?)),
                (Held::Many(c), true) => {
                    let mut narrowed = Vec::with_capacity(c.buffers().len());
                    for (i, b) in c.buffers().iter().enumerate() {
                        narrowed.push(half::narrow(ctx, b, c.values_in(i)).await?);
                    }
                    Storage::GpuChunks(Arc::new(chunks::with_buffers(&c, narrowed, DType::F16)))
                }
            };
            Ok::<_, Error>(Some(Tensor {
                shape,
                dtype,
                storage,
                engine_id: self.id,
                generation,
            }))
        };
        let q_type = inputs.q.dtype;
        let lse = options.return_lse.then_some(out.lse);
        let y = typed(dims.y_shape(), Some(out.y), q_type).await?;
        Ok(AttentionOutputs {
            y: y.expect("Y is always computed"),
            present_key: typed(dims.present_key_shape(), out.present_key, inputs.k.dtype).await?,
            present_value: typed(
                dims.present_value_shape(),
                out.present_value,
                inputs.v.dtype,
            )
            .await?,
            qk_matmul_output: typed(dims.scores_shape(), out.qk, q_type).await?,
            lse: typed(dims.lse_shape(), lse, DType::F32).await?,
        })
    }
}
