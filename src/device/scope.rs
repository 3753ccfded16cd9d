//! One call's run on the device: the device itself ([`GpuContext`]) and what
//! the run adds to it ([`RunScope`]): the workspace its buffers come from
//! (a prepared call's arena), the caller's encoder it records into instead of
//! submitting, and the timestamps a measurement in progress takes. The run
//! code and the recorder take a [`Run`]; nothing per call sits on the device.

use std::sync::{Arc, Mutex, PoisonError};

use crate::device::arena::Arena;
use crate::device::context::GpuContext;
use crate::device::profile::Profiler;

/// The caller's encoder a recorded call records into: taken by the recorder
/// at work, given back when it is done.
pub(crate) type CaptureSlot = Arc<Mutex<Option<wgpu::CommandEncoder>>>;

/// What one call's run adds to the device.
#[derive(Clone, Default)]
pub(crate) struct RunScope {
    /// The workspace buffers are taken from instead of created (`device/arena.rs`).
    pub(crate) arena: Option<Arc<Arena>>,
    /// The caller's encoder the run records into; `None`: the run submits.
    pub(crate) capture: Option<CaptureSlot>,
    /// The timestamps of the measurement in progress on the device, if any.
    pub(crate) profiler: Option<Arc<Profiler>>,
}

/// The device as one call's run sees it: the device and the run's scope.
/// It derefs to the device, so the run reads capabilities and pipelines
/// through it.
#[derive(Clone)]
pub(crate) struct Run {
    device: GpuContext,
    pub(crate) scope: RunScope,
}

impl std::ops::Deref for Run {
    type Target = GpuContext;

    fn deref(&self) -> &GpuContext {
        &self.device
    }
}

impl Run {
    /// A plain run on `device`: buffers created, work submitted, timed where
    /// a measurement is in progress.
    pub(crate) fn new(device: &GpuContext) -> Run {
        Run {
            device: device.clone(),
            scope: RunScope {
                profiler: device.measurement_profiler(),
                ..RunScope::default()
            },
        }
    }

    /// This run with buffers taken from `arena` (a prepared call's runs).
    pub(crate) fn with_arena(mut self, arena: Arc<Arena>) -> Run {
        self.scope.arena = Some(arena);
        self
    }

    /// This run recording into the encoder in `slot` instead of submitting.
    pub(crate) fn with_capture(mut self, slot: CaptureSlot) -> Run {
        self.scope.capture = Some(slot);
        self
    }

    /// The captured encoder, for the recorder that works next.
    pub(crate) fn take_captured(&self) -> Option<wgpu::CommandEncoder> {
        self.scope
            .capture
            .as_ref()
            .and_then(|slot| slot.lock().unwrap_or_else(PoisonError::into_inner).take())
    }

    /// Returns the captured encoder to its slot.
    pub(crate) fn give_back_captured(&self, encoder: wgpu::CommandEncoder) {
        if let Some(slot) = &self.scope.capture {
            *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(encoder);
        }
    }

    /// Whether the run records into the caller's encoder.
    pub(crate) fn captures(&self) -> bool {
        self.scope.capture.is_some()
    }

    /// The arena buffers are taken from, if any.
    pub(crate) fn arena(&self) -> Option<&Arc<Arena>> {
        self.scope.arena.as_ref()
    }

    /// Runs `record` on the captured encoder, or on a new one submitted after.
    pub(crate) fn encode(&self, label: &str, record: impl FnOnce(&mut wgpu::CommandEncoder)) {
        match self.take_captured() {
            Some(mut encoder) => {
                self.clear_pending(&mut encoder);
                record(&mut encoder);
                self.give_back_captured(encoder);
            }
            None => {
                let mut encoder = self
                    .device
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) });
                self.clear_pending(&mut encoder);
                record(&mut encoder);
                self.device.counters.submitted();
                self.device.queue.submit([encoder.finish()]);
            }
        }
    }

    /// Records the clearing of the arena's reused zero-filled buffers (if
    /// any) ahead of whatever `encoder` records next.
    pub(crate) fn clear_pending(&self, encoder: &mut wgpu::CommandEncoder) {
        if let Some(arena) = &self.scope.arena {
            arena.clear_pending(encoder);
        }
    }

    /// Whether reused buffers wait to be cleared.
    pub(crate) fn has_pending_clears(&self) -> bool {
        self.scope.arena.as_ref().is_some_and(|a| a.has_pending())
    }
}
