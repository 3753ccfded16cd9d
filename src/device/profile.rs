//! GPU time of a call, from timestamp queries.
//!
//! With profiling on, every compute pass the recorder (`device/recorder.rs`)
//! opens writes a timestamp at its beginning and end, in slots numbered across
//! submissions since the measurement began ([`GpuContext::restart_profile`]),
//! so a call of several submissions (pieces, f16 conversions) is timed whole:
//! its GPU time is the sum over its passes. This needs only `TIMESTAMP_QUERY`
//! (pass-level timestamps, which browsers offer too). Copies between passes
//! are not timed.

use std::sync::{Arc, Mutex, PoisonError};

use crate::device::buffer;
use crate::device::context::GpuContext;
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

impl GpuContext {
    /// Turns the clock guard of measurements on or off, or (`None`) back to
    /// its default: on where the adapter is not a CPU and has timestamp
    /// queries, natively (a browser's timestamps are too coarse). With it on, `bench`'s measurements time a short FMA probe
    /// before and after every timed run and retake a run beside a probe that
    /// read under 3/4 of the fastest probe (its clocks were down: a GPU's
    /// power state, another tenant), as NVIDIA's nvbench discards samples
    /// whose clock read low. Shared by the context's clones.
    pub fn set_clock_guard(&self, on: Option<bool>) {
        self.clock_guard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .setting = on;
    }

    /// The clock guard's setting as [`GpuContext::set_clock_guard`] left it
    /// (`None`: the default); a device that replaces a lost one keeps it.
    pub fn clock_guard_setting(&self) -> Option<bool> {
        self.clock_guard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .setting
    }

    /// Whether measurements on this device run the clock guard
    /// ([`GpuContext::set_clock_guard`]).
    pub fn clock_guard_on(&self) -> bool {
        let setting = self.clock_guard_setting();
        // Off by default in a browser: its timestamps are rounded (to 100 µs
        // in Chrome), too coarse for a probe of tens of microseconds.
        let default = self.caps.adapter.device_type != "Cpu" && !cfg!(target_arch = "wasm32");
        setting.unwrap_or(default) && self.caps.timestamp_query
    }

    /// GFLOP/s of the fastest clock probe on this device so far, if any ran.
    pub fn fastest_clock_probe_gflops(&self) -> Option<f64> {
        let fastest = self
            .clock_guard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .fastest_gflops;
        (fastest > 0.0).then_some(fastest)
    }

    /// Records a probe's rate; returns the fastest seen on this device.
    pub(crate) fn note_clock_probe(&self, gflops: f64) -> f64 {
        let mut state = self
            .clock_guard
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if gflops.is_finite() && gflops > state.fastest_gflops {
            state.fastest_gflops = gflops;
        }
        state.fastest_gflops
    }

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
