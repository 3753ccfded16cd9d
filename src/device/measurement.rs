//! A measurement on the device: the clock guard's state and the pass
//! timestamps every run started while profiling is on writes
//! (`device/profile.rs`), read back as the GPU time of what ran.

use std::sync::{Arc, PoisonError};

use crate::device::buffer;
use crate::device::context::GpuContext;
use crate::device::profile::Profiler;
use crate::device::scope::Run;
use crate::error::Result;

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
        let mut slot = self
            .measurement
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
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
        if let Some(profiler) = self.measurement_profiler() {
            *profiler
                .opened
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = 0;
        }
    }

    /// The profiler, when profiling is on.
    pub(crate) fn measurement_profiler(&self) -> Option<Arc<Profiler>> {
        self.measurement
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The GPU time of the passes recorded since the measurement began (profiling
    /// turned on, or [`GpuContext::restart_profile`]), in milliseconds, or `None`
    /// when profiling is off or there were more passes than could be timed.
    /// Waits for the submissions to finish.
    pub async fn last_gpu_ms(&self) -> Result<Option<f64>> {
        let Some(profiler) = self.measurement_profiler() else {
            return Ok(None);
        };
        let (passes, overflow) = profiler.timed();
        if passes == 0 || overflow {
            return Ok(None);
        }
        let words =
            buffer::read_f32(&Run::new(self), &profiler.resolve, 0, 4 * passes as usize).await?;
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
