//! Prepared attention calls: planned once, their workspace made by the first
//! run and reused by every run after it (`gpu/arena.rs`), so a call repeated
//! at one shape (a decoder's token steps) allocates nothing on the device.

use std::sync::{Arc, Mutex, PoisonError};

use super::{Backend, Engine};
use crate::call_plan::CallPlan;
use crate::device_tensor::Tensor;
use crate::error::{Error, Result};
use crate::gpu::arena::Arena;
use crate::options::AttentionOptions;
use crate::problem::{validate, AttentionDims, AttentionInputs, AttentionOutputs};

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
                // A lost device's buffers are gone with it.
                self.arena.reset();
                *prepared_on = Some(generation);
            }
        }
        self.arena.begin_run();
        let ctx = ctx.with_arena(self.arena.clone());
        // Recording: the caller's encoder goes into the context's slot for
        // the call's recorders, and comes back whatever happens.
        let slot = encoder.as_deref_mut().map(|encoder| {
            let placeholder = ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            Arc::new(Mutex::new(Some(std::mem::replace(encoder, placeholder))))
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
            *encoder = back.ok_or(Error::Conflict(
                "the encoder was not given back by the recorded call",
            ))?;
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
