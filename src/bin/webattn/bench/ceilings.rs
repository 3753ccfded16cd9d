//! The ceilings the bench's shares refer to: the FMA and copy ceilings at
//! both ends of the run, and the short FMA-ceiling run beside each row.

use webattn::measure as bench;
use webattn::measure::{Clock, Repeats};
use webattn::KernelPath;

use super::{GuardTally, Setting};

/// Warm-up and timed runs of the ceilings at the run's ends (and of the
/// host's copy ceiling).
pub(super) const CEILING_REPEATS: Repeats = Repeats {
    warmup: 2,
    timed: 5,
};

/// The FMA and copy ceilings measured at one end of the run (none on a CPU
/// engine).
pub(super) struct End {
    fma: Option<bench::Measurement>,
    copy: Option<bench::Bandwidth>,
}

impl End {
    /// Measures both ceilings on the GPU, the progress notes ending in
    /// `again` (empty at the start, ", again" at the end).
    pub(super) fn measure(setting: &Setting, again: &str) -> anyhow::Result<End> {
        setting.progress.note(format!("FMA ceiling{again}"));
        let fma = match setting.ctx {
            Some(ctx) => Some(pollster::block_on(bench::fma_ceiling(ctx, CEILING_REPEATS))?.1),
            None => None,
        };
        setting.progress.note(format!("bandwidth ceiling{again}"));
        let copy = match setting.ctx {
            Some(ctx) => Some(pollster::block_on(bench::bandwidth_ceiling(
                ctx,
                CEILING_REPEATS,
            ))?),
            None => None,
        };
        Ok(End { fma, copy })
    }

    /// Counts both ceilings' retakes in `guarded`.
    pub(super) fn tally(&self, guarded: &mut GuardTally) {
        if let (Some(fma), Some(copy)) = (&self.fma, &self.copy) {
            guarded.note(fma);
            guarded.note(&copy.measurement);
        }
    }
}

/// The ceilings at both ends of the run, and the medians every share refers
/// to (NaN on a CPU engine).
pub(super) struct Ceilings {
    pub(super) first: Option<bench::Measurement>,
    pub(super) last: Option<bench::Measurement>,
    pub(super) copy_first: Option<bench::Bandwidth>,
    pub(super) copy_last: Option<bench::Bandwidth>,
    /// GFLOP/s: the FMA ceiling's median over both ends' samples.
    pub(super) fma: f64,
    /// GB/s: the copy ceiling's median over both ends' samples.
    pub(super) bandwidth: f64,
}

impl Ceilings {
    /// The ceilings of the run's `start` and `end`.
    pub(super) fn over(start: End, end: End) -> Ceilings {
        let (first, last) = (start.fma, end.fma);
        let (copy_first, copy_last) = (start.copy, end.copy);
        // The ceiling is measured at both ends of the run; its median over all
        // samples is what every share refers to (none on a CPU engine).
        let fma = first
            .as_ref()
            .zip(last.as_ref())
            .map_or(f64::NAN, |(first, last)| {
                let mut samples = first.samples_ms.clone();
                samples.extend(&last.samples_ms);
                bench::Measurement {
                    samples_ms: samples,
                    ..first.clone()
                }
                .gflops(bench::fma_ceiling_flops())
            });
        // The bandwidth ceiling likewise: the median over both ends' samples.
        let bandwidth =
            copy_first
                .as_ref()
                .zip(copy_last.as_ref())
                .map_or(f64::NAN, |(first, last)| {
                    let mut samples = first.measurement.samples_ms.clone();
                    samples.extend(&last.measurement.samples_ms);
                    let median = bench::Measurement {
                        samples_ms: samples,
                        ..first.measurement.clone()
                    }
                    .median_ms();
                    first.bytes_moved as f64 / (median * 1e6)
                });
        Ceilings {
            first,
            last,
            copy_first,
            copy_last,
            fma,
            bandwidth,
        }
    }

    /// The FMA ceiling at the start and at the end (GPU engines).
    pub(super) fn ends(&self) -> Option<(&bench::Measurement, &bench::Measurement)> {
        self.first.as_ref().zip(self.last.as_ref())
    }

    /// The copy ceiling at the start and at the end (GPU engines).
    pub(super) fn copy_ends(&self) -> Option<(&bench::Bandwidth, &bench::Bandwidth)> {
        self.copy_first.as_ref().zip(self.copy_last.as_ref())
    }

    /// How the run was timed, as the table and the JSON name it.
    pub(super) fn clock(&self) -> &'static str {
        match self.first.as_ref().map(|m| m.clock) {
            Some(Clock::GpuTimestamps) => "gpu timestamps",
            _ => "wall clock",
        }
    }
}

/// The FMA ceiling just before a row on `path`, in GFLOP/s: the GPU's for the
/// GPU paths, the host's for the CPU rows (NaN where there is none).
///
/// This machine's speed may drift during a run (a shared VM's did by 30%), so
/// every GEMM and attention measurement is paired with a short FMA-ceiling
/// run just before it and its share is taken against that (decode shares
/// use the bandwidth ceiling's median over the run's two ends). The CPU
/// rows share the host's FMA ceiling, measured the same way just before.
pub(super) fn adjacent(
    setting: &Setting,
    path: KernelPath,
    guarded: &mut GuardTally,
) -> anyhow::Result<f64> {
    match (setting.ctx, path) {
        (_, KernelPath::Cpu | KernelPath::Oracle) => Ok(bench::host_fma_ceiling(
            setting.engine.cpu_backend().threads(),
            Repeats {
                warmup: 1,
                timed: 3,
            },
        )
        .0),
        (Some(ctx), KernelPath::Fused | KernelPath::Unfused) => {
            let (gflops, m) = pollster::block_on(bench::fma_ceiling(
                ctx,
                Repeats {
                    warmup: 1,
                    timed: 3,
                },
            ))?;
            guarded.note(&m);
            Ok(gflops)
        }
        _ => Ok(f64::NAN),
    }
}
