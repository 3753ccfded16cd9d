//! Measurement primitives for `webattn bench` and the browser demo: the FMA
//! ceiling, GEMM, and attention on a path, each timed after warm-up as the
//! median of several runs, with GPU timestamps where the adapter has them and
//! wall-clock time after a full sync otherwise.

use web_time::Instant;

use crate::error::Result;
use crate::gpu::buffer;
use crate::gpu::context::GpuContext;
use crate::gpu::ops::gemm::{self, GemmSpec};
use crate::gpu::pipeline::PipelineKey;
use crate::gpu::recorder::Recorder;
use crate::gpu::registry::Kernel;
use crate::rng::SplitMix64;

/// How a measurement was timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// GPU timestamp queries: the sum of the passes' GPU time.
    GpuTimestamps,
    /// Wall-clock time from submission to completion.
    Wall,
}

/// Repeated timings of one piece of work.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Each timed run, in milliseconds, in the order they ran.
    pub samples_ms: Vec<f64>,
    /// How the runs were timed.
    pub clock: Clock,
}

impl Measurement {
    /// The median run time in milliseconds.
    pub fn median_ms(&self) -> f64 {
        let mut s = self.samples_ms.clone();
        s.sort_by(f64::total_cmp);
        match s.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => s[n / 2],
            n => 0.5 * (s[n / 2 - 1] + s[n / 2]),
        }
    }

    /// GFLOP/s for `flops` floating-point operations per run, at the median.
    pub fn gflops(&self, flops: f64) -> f64 {
        flops / (self.median_ms() * 1e6)
    }
}

/// How many runs to discard and to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repeats {
    /// Untimed runs first (pipeline compilation, caches, clocks).
    pub warmup: usize,
    /// Timed runs; the median is reported.
    pub timed: usize,
}

impl Default for Repeats {
    fn default() -> Self {
        Repeats {
            warmup: 2,
            timed: 5,
        }
    }
}

/// Times `submit` (which records and submits one piece of work): GPU timestamps
/// when `ctx` can take them, else wall clock around submission and completion.
pub async fn measure_gpu(
    ctx: &GpuContext,
    repeats: Repeats,
    mut submit: impl FnMut() -> Result<()>,
) -> Result<Measurement> {
    let gpu_timed = ctx.set_profiling(true);
    // A pipeline or dispatch error must fail the measurement, not time nothing.
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut samples = Vec::with_capacity(repeats.timed);
    let mut clock = if gpu_timed {
        Clock::GpuTimestamps
    } else {
        Clock::Wall
    };
    for run in 0..repeats.warmup + repeats.timed {
        let start = Instant::now();
        let outcome = submit();
        ctx.finish().await?;
        let wall = start.elapsed().as_secs_f64() * 1e3;
        if let Err(e) = outcome {
            ctx.set_profiling(false);
            return Err(e);
        }
        let gpu = if gpu_timed {
            ctx.last_gpu_ms().await?
        } else {
            None
        };
        if run >= repeats.warmup {
            samples.push(gpu.unwrap_or_else(|| {
                clock = Clock::Wall;
                wall
            }));
        }
    }
    ctx.set_profiling(false);
    if let Some(e) = scope.pop().await {
        return Err(crate::gpu::context::classify("benchmark", &e));
    }
    Ok(Measurement {
        samples_ms: samples,
        clock,
    })
}

/// Flops per invocation and round of `shaders/fma_peak.wgsl`: 32 vec4 fmas.
const FMA_FLOPS_PER_ROUND: f64 = 32.0 * 4.0 * 2.0;

/// The device's FMA throughput ceiling in GFLOP/s, with its measurement.
pub async fn fma_ceiling(ctx: &GpuContext, repeats: Repeats) -> Result<(f64, Measurement)> {
    #[repr(C)]
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    struct Params {
        iterations: u32,
        mul: f32,
        add: f32,
        _pad: u32,
    }
    let (workgroups, invocations, iterations) = (2048u32, 64u32, 256u32);
    let params = Params {
        iterations,
        mul: 0.999,
        add: 1e-3,
        _pad: 0,
    };
    let key = PipelineKey::new(Kernel::FmaPeak).with("WORKGROUP", i64::from(invocations));
    let pipeline = ctx.pipelines.get(&key);
    let uniform = buffer::uniform(ctx, "fma params", &params);
    let sink = buffer::storage(ctx, "fma sink", (workgroups * invocations * 4) as usize)?;
    let m = measure_gpu(ctx, repeats, || {
        let mut rec = Recorder::new(ctx, "fma ceiling");
        rec.dispatch(&pipeline, &[&uniform, &sink], u64::from(workgroups))?;
        rec.submit();
        Ok(())
    })
    .await?;
    let flops = f64::from(workgroups * invocations * iterations) * FMA_FLOPS_PER_ROUND;
    Ok((m.gflops(flops), m))
}

/// One `m × k` by `k × n` GEMM on device buffers of random values: GFLOP/s
/// (2·m·n·k flops) and the measurement.
pub async fn gemm(
    ctx: &GpuContext,
    m: usize,
    n: usize,
    k: usize,
    repeats: Repeats,
) -> Result<(f64, Measurement)> {
    gemm_with(ctx, ctx.gemm_kernel(), m, n, k, repeats).await
}

/// [`gemm`] with a given kernel, to compare kernels in one run.
pub async fn gemm_with(
    ctx: &GpuContext,
    kernel: gemm::GemmKernel,
    m: usize,
    n: usize,
    k: usize,
    repeats: Repeats,
) -> Result<(f64, Measurement)> {
    let spec = GemmSpec::contiguous(1, m, n, k, false, false);
    spec.check()?;
    let mut rng = SplitMix64::new(7);
    let a = buffer::upload(ctx, "A", &rng.normal_vec(m * k, 1.0))?;
    let b = buffer::upload(ctx, "B", &rng.normal_vec(k * n, 1.0))?;
    let c = buffer::storage(ctx, "C", m * n)?;
    let meas = measure_gpu(ctx, repeats, || {
        let mut rec = Recorder::new(ctx, "gemm bench");
        gemm::record_with(&mut rec, kernel, &spec, &a, &b, &c)?;
        rec.submit();
        Ok(())
    })
    .await?;
    Ok((meas.gflops(2.0 * (m * n * k) as f64), meas))
}
