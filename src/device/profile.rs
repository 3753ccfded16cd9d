//! GPU time of a call, from timestamp queries.
//!
//! With profiling on, every compute pass the recorder (`device/recorder.rs`)
//! opens writes a timestamp at its beginning and end, in slots numbered across
//! submissions since the measurement began ([`GpuContext::restart_profile`]),
//! so a call of several submissions (pieces, f16 conversions) is timed whole:
//! its GPU time is the sum over its passes. This needs only `TIMESTAMP_QUERY`
//! (pass-level timestamps, which browsers offer too). Copies between passes
//! are not timed.

use std::sync::{Mutex, PoisonError};

/// Passes timed per measurement; later passes make it incomplete.
pub const MAX_TIMED_PASSES: u32 = 64;

/// Timestamp query state shared by a context's recorders.
#[derive(Debug)]
pub(crate) struct Profiler {
    pub(crate) query_set: wgpu::QuerySet,
    pub(crate) resolve: wgpu::Buffer,
    /// Passes opened since the measurement began (slot pairs handed out).
    pub(crate) opened: Mutex<u32>,
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
    pub(crate) fn timed(&self) -> (u32, bool) {
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

/// The clock guard of one device's measurements (`bench`): whether each
/// timed run is bracketed by a short FMA probe, and the fastest probe seen,
/// against which a slow probe marks the device's clocks as down.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ClockGuardState {
    /// `None`: the default ([`GpuContext::clock_guard_on`]).
    pub(crate) setting: Option<bool>,
    /// GFLOP/s of the fastest probe on this device so far (0: none yet).
    pub(crate) fastest_gflops: f64,
}
