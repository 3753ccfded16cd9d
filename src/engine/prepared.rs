//! Prepared attention calls: planned once, their workspace made by the first
//! run and reused by every run after it (`device/arena.rs`), so a call repeated
//! at one shape (a decoder's token steps) allocates nothing on the device.

use std::sync::{Arc, Mutex, PoisonError};

use super::{Backend, Engine};
use crate::device::arena::Arena;
use crate::device::scope::Run;
use crate::device_tensor::{Storage, Tensor};
use crate::error::{Error, Result};
use crate::options::AttentionOptions;
use crate::plan::CallPlan;
use crate::problem::{validate, AttentionDims, AttentionInputs, AttentionOutputs};
use crate::tensor::DType;

/// An attention call of one shape and set of options, planned once
/// ([`Engine::prepare`]). Its runs reuse one workspace on the device: after
/// the first, a run creates no buffer.
///
/// The outputs of a run live in that workspace: they hold the run's values
/// until the next run of the same prepared call (download or copy them
/// before it). Runs of one prepared call take turns; prepare one per
/// concurrent caller.
#[derive(Debug)]
pub struct PreparedAttention {
    engine_id: u64,
    dims: AttentionDims,
    options: AttentionOptions,
    plan: CallPlan,
    arena: Arc<Arena>,
    /// The device generation the workspace belongs to.
    generation: Mutex<Option<u64>>,
    /// Held by the run in progress.
    turn: futures_intrusive::sync::Mutex<()>,
    /// An empty encoder that stands in for the caller's while a recording
    /// holds it, kept for the next one: wgpu's cost of a new encoder grows
    /// with the resources the device has made (about 10 µs after a decoder's
    /// steps on lavapipe, more than the rest of a recording).
    stand_in: Mutex<Option<wgpu::CommandEncoder>>,
}

impl Engine {
    /// Plans a call of `dims` with `options` once ([`Engine::plan`]): its
    /// path, kernels and pieces are fixed here, the workspace is made by the
    /// first run. Inputs of other
    /// shapes are refused by [`PreparedAttention::run`].
    pub fn prepare(
        &self,
        dims: &AttentionDims,
        options: &AttentionOptions,
    ) -> Result<PreparedAttention> {
        options.validate()?;
        self.refuse_gpu_path_on_cpu(options)?;
        Ok(PreparedAttention {
            engine_id: self.id,
            dims: *dims,
            options: options.clone(),
            plan: self.plan(dims, options)?,
            arena: Arc::default(),
            generation: Mutex::new(None),
            turn: futures_intrusive::sync::Mutex::new((), true),
            stand_in: Mutex::new(None),
        })
    }
}

impl PreparedAttention {
    /// The shapes this call was prepared for.
    pub fn dims(&self) -> &AttentionDims {
        &self.dims
    }

    /// The options it runs with.
    pub fn options(&self) -> &AttentionOptions {
        &self.options
    }

    /// Its plan: the path, kernels and pieces every run takes, and why.
    pub fn plan(&self) -> &CallPlan {
        &self.plan
    }

    /// Buffers its workspace holds on the device, and their bytes.
    pub fn workspace(&self) -> (usize, u64) {
        self.arena.held()
    }

    /// Runs the call on `inputs` (of the prepared shapes) on `engine` (the
    /// one that prepared it). See the type's docs for how long the outputs last.
    pub async fn run(
        &self,
        engine: &Engine,
        inputs: &AttentionInputs<'_, Tensor>,
    ) -> Result<AttentionOutputs<Tensor>> {
        self.run_into(engine, inputs, None).await
    }

    /// Records the call into `encoder` (the engine's device's, e.g. one
    /// holding the caller's own passes before it): nothing is submitted and
    /// nothing read back. The outputs hold their values once the caller has
    /// submitted `encoder` (read them with [`Engine::download`] after that).
    /// Only a GPU path records; a call planned for the CPU is a conflict.
    /// Submit `encoder` before the next run or recording of this prepared
    /// call: both use the one workspace.
    pub async fn record(
        &self,
        engine: &Engine,
        encoder: &mut wgpu::CommandEncoder,
        inputs: &AttentionInputs<'_, Tensor>,
    ) -> Result<AttentionOutputs<Tensor>> {
        self.run_into(engine, inputs, Some(encoder)).await
    }

    /// [`PreparedAttention::record`], with the outputs written into the
    /// caller's tensors (e.g. [`Engine::wrap_buffer`]s of its own buffers,
    /// made with `COPY_DST`): each output the options ask for, of the shape and
    /// dtype the call gives, recorded as one copy from the workspace after
    /// the kernels. The caller's tensors hold the values once it has
    /// submitted `encoder`.
    pub async fn record_into(
        &self,
        engine: &Engine,
        encoder: &mut wgpu::CommandEncoder,
        inputs: &AttentionInputs<'_, Tensor>,
        outputs: &AttentionOutputs<Tensor>,
    ) -> Result<()> {
        let given = named_outputs(outputs);
        let dims = &self.dims;
        let options = &self.options;
        let q_type = inputs.q.dtype;
        let wanted = [
            Some((dims.y_shape(), q_type)),
            options
                .return_present
                .then(|| (dims.present_key_shape(), inputs.k.dtype)),
            options
                .return_present
                .then(|| (dims.present_value_shape(), inputs.v.dtype)),
            options
                .qk_matmul_output_mode
                .map(|_| (dims.scores_shape(), q_type)),
            options.return_lse.then(|| (dims.lse_shape(), DType::F32)),
        ];
        for ((name, tensor), wanted) in given.iter().zip(wanted) {
            match (tensor, wanted) {
                (None, None) => {}
                (None, Some(_)) => {
                    return Err(Error::Conflict(
                        "the options ask for an output that was given no tensor to record into",
                    ))
                }
                (Some(_), None) => {
                    return Err(Error::Conflict(
                        "a tensor was given for an output the options do not ask for",
                    ))
                }
                (Some(t), Some((shape, dtype))) => check_output(engine, name, t, &shape, dtype)?,
            }
        }
        let made = self.record(engine, encoder, inputs).await?;
        for ((_, mine), (_, theirs)) in named_outputs(&made).into_iter().zip(given) {
            if let (Some(mine), Some(theirs)) = (mine, theirs) {
                copy_output(encoder, mine, theirs)?;
            }
        }
        Ok(())
    }

    async fn run_into(
        &self,
        engine: &Engine,
        inputs: &AttentionInputs<'_, Tensor>,
        mut encoder: Option<&mut wgpu::CommandEncoder>,
    ) -> Result<AttentionOutputs<Tensor>> {
        if engine.id != self.engine_id {
            return Err(Error::Conflict(
                "a prepared call runs on the engine that prepared it",
            ));
        }
        let _turn = self.turn.lock().await;
        engine.recover().await?;
        engine.check_input_owners(inputs)?;
        let dims = validate(inputs, &self.options)?;
        if dims != self.dims {
            return Err(Error::Conflict(
                "the inputs' shapes are not those the call was prepared for; \
                 prepare a call for them",
            ));
        }
        let (ctx, generation) = match (&engine.backend, self.plan.gpu) {
            (Backend::Gpu(gpu), Some(_)) => gpu.latest(),
            // The CPU paths keep nothing on a device.
            _ if encoder.is_none() => return engine.attention(inputs, &self.options).await,
            _ => {
                return Err(Error::Conflict(
                    "only a call planned for a GPU path records into an encoder",
                ))
            }
        };
        {
            let mut prepared_on = self
                .generation
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *prepared_on != Some(generation) {
                // A lost device's buffers (and encoder) are gone with it.
                self.arena.reset();
                *self.stand_in.lock().unwrap_or_else(PoisonError::into_inner) = None;
                *prepared_on = Some(generation);
            }
        }
        self.arena.begin_run();
        let ctx = Run::new(ctx).with_arena(self.arena.clone());
        // Recording: the caller's encoder goes into the context's slot for
        // the call's recorders, and comes back whatever happens.
        let slot = encoder.as_deref_mut().map(|encoder| {
            let kept = self
                .stand_in
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            let stand_in = kept.unwrap_or_else(|| {
                ctx.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
            });
            Arc::new(Mutex::new(Some(std::mem::replace(encoder, stand_in))))
        });
        let ctx = match &slot {
            Some(slot) => ctx.with_capture(slot.clone()),
            None => ctx,
        };
        let result = engine
            .attention_on_gpu(&ctx, generation, inputs, &self.options, &dims, &self.plan)
            .await;
        if let (Some(slot), Some(encoder)) = (slot, encoder) {
            let back = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            let back = back.ok_or(Error::Conflict(
                "the encoder was not given back by the recorded call",
            ))?;
            let stand_in = std::mem::replace(encoder, back);
            *self.stand_in.lock().unwrap_or_else(PoisonError::into_inner) = Some(stand_in);
        }
        result
    }

    /// [`PreparedAttention::record`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn record_blocking(
        &self,
        engine: &Engine,
        encoder: &mut wgpu::CommandEncoder,
        inputs: &AttentionInputs<'_, Tensor>,
    ) -> Result<AttentionOutputs<Tensor>> {
        pollster::block_on(self.record(engine, encoder, inputs))
    }

    /// [`PreparedAttention::record_into`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn record_into_blocking(
        &self,
        engine: &Engine,
        encoder: &mut wgpu::CommandEncoder,
        inputs: &AttentionInputs<'_, Tensor>,
        outputs: &AttentionOutputs<Tensor>,
    ) -> Result<()> {
        pollster::block_on(self.record_into(engine, encoder, inputs, outputs))
    }

    /// [`PreparedAttention::run`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run_blocking(
        &self,
        engine: &Engine,
        inputs: &AttentionInputs<'_, Tensor>,
    ) -> Result<AttentionOutputs<Tensor>> {
        pollster::block_on(self.run(engine, inputs))
    }
}

/// The outputs by their ONNX names.
fn named_outputs(out: &AttentionOutputs<Tensor>) -> [(&'static str, Option<&Tensor>); 5] {
    [
        ("Y", Some(&out.y)),
        ("present_key", out.present_key.as_ref()),
        ("present_value", out.present_value.as_ref()),
        ("qk_matmul_output", out.qk_matmul_output.as_ref()),
        ("lse", out.lse.as_ref()),
    ]
}

/// Checks the caller's tensor `t` for output `name` before anything is recorded.
fn check_output(
    engine: &Engine,
    name: &'static str,
    t: &Tensor,
    shape: &[usize],
    dtype: DType,
) -> Result<()> {
    engine.own(name, t)?;
    if t.dtype != dtype {
        return Err(Error::DType {
            tensor: name,
            expected: if dtype == DType::F16 { "f16" } else { "f32" },
            got: t.dtype.to_string(),
        });
    }
    if t.shape.len() != shape.len() {
        return Err(Error::Rank {
            tensor: name,
            expected: "4 (3 for lse)",
            got: t.shape.clone(),
        });
    }
    if let Some((&got, &expected)) = t.shape.iter().zip(shape).find(|(got, want)| got != want) {
        return Err(Error::ShapeMismatch {
            tensor: name,
            dim: "a dimension",
            got,
            expected,
            expected_from: "the prepared call's dims",
            hint: "give an output tensor of the shape the call returns",
        });
    }
    let (Storage::Gpu(buffer) | Storage::GpuAt(buffer, _)) = &t.storage else {
        return Err(Error::Conflict(
            "an output to record into is one device buffer (Engine::wrap_buffer)",
        ));
    };
    if !buffer.usage().contains(wgpu::BufferUsages::COPY_DST) {
        return Err(Error::Conflict(
            "an output to record into needs BufferUsages::COPY_DST",
        ));
    }
    Ok(())
}

/// Records the copy of the workspace's output `mine` into the caller's `theirs`.
fn copy_output(encoder: &mut wgpu::CommandEncoder, mine: &Tensor, theirs: &Tensor) -> Result<()> {
    let (dst, start) = match &theirs.storage {
        Storage::Gpu(dst) => (dst, 0),
        Storage::GpuAt(dst, offset) => (dst, *offset),
        _ => {
            return Err(Error::Conflict(
                "an output to record into is one device buffer",
            ))
        }
    };
    // Whole 4-byte words: f16 values are packed two to one.
    let bytes_of = |values: usize| match mine.dtype {
        DType::F16 => values.div_ceil(2) as u64 * 4,
        _ => values as u64 * 4,
    };
    match &mine.storage {
        Storage::Gpu(src) => {
            encoder.copy_buffer_to_buffer(src, 0, dst, start, bytes_of(mine.len()))
        }
        Storage::GpuChunks(chunks) => {
            let mut at = start;
            for (i, src) in chunks.buffers().iter().enumerate() {
                let bytes = bytes_of(chunks.values_in(i));
                encoder.copy_buffer_to_buffer(src, 0, dst, at, bytes);
                at += bytes;
            }
        }
        Storage::GpuAt(..) | Storage::Host(_) => {
            return Err(Error::Conflict(
                "a recorded call's outputs are in its workspace",
            ))
        }
    }
    Ok(())
}
