//! GPU time of a call, from timestamp queries.
//!
//! With profiling on, every compute pass the recorder (`gpu/recorder.rs`)
//! opens writes a timestamp at its beginning and end, in slots numbered across
//! submissions since the measurement began ([`GpuContext::restart_profile`]),
//! so a call of several submissions (pieces, f16 conversions) is timed whole:
//! its GPU time is the sum over its passes. This needs only `TIMESTAMP_QUERY`
//! (pass-level timestamps, which browsers offer too). Copies between passes
//! are not timed.

use std::sync::{Arc, Mutex, PoisonError};

use super::buffer;
use super::context::GpuContext;
use crate::error::Result;

/// Passes timed per measurement; later passes make it incomplete.
pub const MAX_TIMED_PASSES: u32 = 64;

/// Timestamp query state shared by a context's recorders.
#[derive(Debug)]
pub(crate) struct Profiler {
    pub(crate) query_set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    /// Passes opened since the measurement began (slot pairs handed out).
    opened: Mutex<u32>,
}

impl Profiler {
    pub(crate) fn new(device: &wgpu::Device) -> Self {
        let query_set = device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("webattn pass timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * MAX_TIMED_PASSES,
        });
        let resolve = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamp resolve"),
            size: u64::from(2 * MAX_TIMED_PASSES) * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Self {
            query_set,
            resolve,
            opened: Mutex::new(0),
        }
    }

    /// The timestamp writes for the next pass, or `None` beyond the limit.
    pub(crate) fn pass_writes(&self) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let pass = {
            let mut opened = self.opened.lock().unwrap_or_else(PoisonError::into_inner);
            *opened += 1;
            *opened - 1
        };
        (pass < MAX_TIMED_PASSES).then(|| wgpu::ComputePassTimestampWrites {
            query_set: &self.query_set,
            beginning_of_pass_write_index: Some(2 * pass),
            end_of_pass_write_index: Some(2 * pass + 1),
        })
    }

    /// Passes timed since the measurement began, and whether there were more
    /// than could be timed.
    fn timed(&self) -> (u32, bool) {
        let opened = *self.opened.lock().unwrap_or_else(PoisonError::into_inner);
        (opened.min(MAX_TIMED_PASSES), opened > MAX_TIMED_PASSES)
    }

    /// Records the resolve of every pass timed so far (earlier submissions'
    /// too: their slots keep their values) into the resolve buffer.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) {
        let (timed, _) = self.timed();
        if timed > 0 {
            encoder.resolve_query_set(&self.query_set, 0..2 * timed, &self.resolve, 0);
        }
    }
}

impl GpuContext {
    /// Turns pass timestamps on or off. Returns whether GPU timing is available
    /// (the adapter has `TIMESTAMP_QUERY`); without it callers fall back to
    /// wall-clock time.
    pub fn set_profiling(&self, on: bool) -> bool {
        let mut slot = self.profiler.lock().unwrap_or_else(PoisonError::into_inner);
        if !on || !self.caps.timestamp_query {
            *slot = None;
            return on && self.caps.timestamp_query;
        }
        if slot.is_none() {
            *slot = Some(Arc::new(Profiler::new(&self.device)));
        }
        true
    }

    /// Begins a new measurement: [`GpuContext::last_gpu_ms`] then sums the
    /// passes recorded from here on.
    pub fn restart_profile(&self) {
        if let Some(profiler) = self.profiler() {
            *profiler
                .opened
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = 0;
        }
    }

    /// The profiler, when profiling is on.
    pub(crate) fn profiler(&self) -> Option<Arc<Profiler>> {
        self.profiler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The GPU time of the passes recorded since the measurement began (profiling
    /// turned on, or [`GpuContext::restart_profile`]), in milliseconds, or `None`
    /// when profiling is off or there were more passes than could be timed.
    /// Waits for the submissions to finish.
    pub async fn last_gpu_ms(&self) -> Result<Option<f64>> {
        let Some(profiler) = self.profiler() else {
            return Ok(None);
        };
        let (passes, overflow) = profiler.timed();
        if passes == 0 || overflow {
            return Ok(None);
        }
        let words = buffer::read_f32(self, &profiler.resolve, 0, 4 * passes as usize).await?;
        // Timestamps are little-endian u64s: two 32-bit words each.
        let ticks: Vec<u64> = words
            .chunks_exact(2)
            .map(|w| u64::from(w[0].to_bits()) | (u64::from(w[1].to_bits()) << 32))
            .collect();
        let period_ns = f64::from(self.queue.get_timestamp_period());
        let total: u64 = ticks
            .chunks_exact(2)
            .map(|pair| pair[1].saturating_sub(pair[0]))
            .sum();
        Ok(Some(total as f64 * period_ns * 1e-6))
    }
}
