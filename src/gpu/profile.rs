//! GPU time of a submission, from timestamp queries.
//!
//! With profiling on, every compute pass the recorder (`gpu/recorder.rs`)
//! opens writes a timestamp at its beginning and end; the submission's GPU time
//! is the sum over its passes. This needs only `TIMESTAMP_QUERY` (pass-level
//! timestamps, which browsers offer too). Copies between passes are not timed.

use std::sync::{Arc, Mutex, PoisonError};

use super::buffer;
use super::context::GpuContext;
use crate::error::Result;

/// Passes timed per submission; later passes make the measurement incomplete.
pub const MAX_TIMED_PASSES: u32 = 64;

/// Timestamp query state shared by a context's recorders.
#[derive(Debug)]
pub(crate) struct Profiler {
    pub(crate) query_set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    /// Passes the last submission timed, and whether it had more than we could time.
    pub(crate) last: Mutex<(u32, bool)>,
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
            last: Mutex::new((0, false)),
        }
    }

    /// The timestamp writes for pass number `pass`, or `None` beyond the limit.
    pub(crate) fn pass_writes(&self, pass: u32) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        (pass < MAX_TIMED_PASSES).then(|| wgpu::ComputePassTimestampWrites {
            query_set: &self.query_set,
            beginning_of_pass_write_index: Some(2 * pass),
            end_of_pass_write_index: Some(2 * pass + 1),
        })
    }

    /// Records the resolve of `passes` passes into the resolve buffer.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder, passes: u32) {
        let timed = passes.min(MAX_TIMED_PASSES);
        if timed > 0 {
            encoder.resolve_query_set(&self.query_set, 0..2 * timed, &self.resolve, 0);
        }
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) =
            (timed, passes > MAX_TIMED_PASSES);
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

    /// The profiler, when profiling is on.
    pub(crate) fn profiler(&self) -> Option<Arc<Profiler>> {
        self.profiler
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The GPU time of the last profiled submission in milliseconds (the sum of
    /// its passes), or `None` when profiling is off or it had more passes than
    /// could be timed. Waits for the submission to finish.
    pub async fn last_gpu_ms(&self) -> Result<Option<f64>> {
        let Some(profiler) = self.profiler() else {
            return Ok(None);
        };
        let (passes, overflow) = *profiler.last.lock().unwrap_or_else(PoisonError::into_inner);
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
