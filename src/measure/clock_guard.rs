//! The clock guard: throttle detection for GPU measurements.
//!
//! A GPU's clocks are not the program's to hold. On a lent H100 the same
//! kernel ran 16 ms in one timed run and 61 ms in the next, and the FMA
//! ceiling read 9.5 TFLOP/s instead of 53.6 at the end of a run: whole runs
//! of a row fell into a state with the clocks down. A median over such runs
//! reports the state, not the kernel. NVIDIA's nvbench reads the SM clock
//! through NVML around each sample and discards samples taken below 3/4 of
//! the maximum clock; WebGPU has no clock to read, so the guard measures one:
//! a short FMA probe (the ceiling's kernel at a quarter of its rounds, about
//! 40 µs on an H100) before and after every timed run. A run beside a probe
//! under [`SLOW_SHARE`] of the fastest probe seen on the device is retaken,
//! after probes until one reads fast again; where the retakes run out the run
//! is kept and counted as throttled, so a report can say so.

/// A probe under this share of the fastest probe seen marks the clocks as
/// down (nvbench's default threshold, 75% of the maximum clock).
pub const SLOW_SHARE: f64 = 0.75;

/// Workgroups, invocations and rounds of the probe: one wave on a large GPU
/// (2048 × 64 invocations), a quarter of the ceiling's rounds.
pub(super) const PROBE_SHAPE: (u32, u32, u32) = (2048, 64, 64);

/// Probes run, at most, to wait for the clocks to come back before a retake.
pub(super) const RECOVERY_PROBES: usize = 8;

/// Whether a probe at `gflops` reads slow against the fastest seen.
pub fn is_slow(gflops: f64, fastest: f64) -> bool {
    // A failed probe (NaN) reads slow too.
    gflops.is_nan() || gflops < SLOW_SHARE * fastest
}

/// What the guard makes of one timed run, from the probes on either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Both probes read fast: the run counts.
    Keep,
    /// A probe read slow and retakes are left: discard the run, take it again.
    Retake,
    /// A probe read slow and no retakes are left: the run counts, flagged.
    KeepThrottled,
}

/// The verdict on a run whose probes before and after read slow or not,
/// with `retakes_left` retakes left for its piece of work.
pub fn verdict(slow_before: bool, slow_after: bool, retakes_left: usize) -> Verdict {
    match (slow_before || slow_after, retakes_left > 0) {
        (false, _) => Verdict::Keep,
        (true, true) => Verdict::Retake,
        (true, false) => Verdict::KeepThrottled,
    }
}

/// Retakes allowed per piece of work: as many as its timed runs, twice over.
pub fn retake_budget(timed: usize) -> usize {
    2 * timed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_under_three_quarters_of_the_fastest_is_slow() {
        assert!(!is_slow(53.0, 53.6));
        assert!(!is_slow(40.2, 53.6));
        assert!(is_slow(40.1, 53.6));
        assert!(is_slow(9.5, 53.6));
        // No probe yet (fastest 0): nothing is slow; a failed probe (NaN) is.
        assert!(!is_slow(1.0, 0.0));
        assert!(is_slow(f64::NAN, 1.0));
    }

    #[test]
    fn a_run_beside_a_slow_probe_is_retaken_while_retakes_last() {
        assert_eq!(verdict(false, false, 0), Verdict::Keep);
        assert_eq!(verdict(true, false, 3), Verdict::Retake);
        assert_eq!(verdict(false, true, 1), Verdict::Retake);
        assert_eq!(verdict(true, true, 0), Verdict::KeepThrottled);
        assert_eq!(retake_budget(5), 10);
    }
}
