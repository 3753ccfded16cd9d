//! Measurement primitives for `webattn bench` and the browser demo: the FMA
//! ceiling, GEMM, and attention on a path, each timed after warm-up as the
//! median of several runs, with GPU timestamps where the adapter has them and
//! wall-clock time after a full sync otherwise.

use web_time::Instant;

use crate::device::buffer;
use crate::device::context::GpuContext;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::device::scope::Run;
use crate::error::Result;
use crate::kernels::ceilings::{CopyParams, FmaParams};
use crate::kernels::gemm;
use crate::kernels::gemm::GemmSpec;
use crate::rng::SplitMix64;

pub mod clock_guard;
pub mod paged;

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
    /// Runs discarded and taken again because the clock guard's probe
    /// beside them read slow ([`clock_guard`]).
    pub retaken: usize,
    /// Runs kept although a probe beside them read slow (the retakes ran
    /// out): the median may hold a GPU with its clocks down.
    pub throttled: usize,
}

impl Measurement {
    /// Runs timed by the wall clock, with no clock guard.
    pub fn wall(samples_ms: Vec<f64>) -> Measurement {
        Measurement {
            samples_ms,
            clock: Clock::Wall,
            retaken: 0,
            throttled: 0,
        }
    }

    /// The fastest run in milliseconds.
    pub fn min_ms(&self) -> f64 {
        self.samples_ms
            .iter()
            .copied()
            .min_by(f64::total_cmp)
            .unwrap_or(f64::NAN)
    }

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
/// A validation error anywhere fails the measurement rather than timing nothing.
pub async fn measure_gpu(
    ctx: &GpuContext,
    repeats: Repeats,
    mut submit: impl AsyncFnMut() -> Result<()>,
) -> Result<Measurement> {
    let mut measured = measure_gpu_interleaved(ctx, repeats, 1, async |_| submit().await).await?;
    Ok(measured.remove(0))
}

/// Times `count` pieces of work on `ctx`'s device as [`measure_gpu`] does
/// one, interleaved: each round runs `submit(0)`, ..., `submit(count - 1)`
/// once, warm-up rounds first, so a drift in the device's clocks over the
/// measurement falls on every piece alike. Where the clock guard is on
/// ([`GpuContext::set_clock_guard`]) a timed run beside a slow probe is
/// retaken at once, so `submit(i)` may run again before `submit(i + 1)`.
/// One measurement per piece, in order. Every piece must run on `ctx` or its
/// clones, whose profiler times it.
pub async fn measure_gpu_interleaved(
    ctx: &GpuContext,
    repeats: Repeats,
    count: usize,
    mut submit: impl AsyncFnMut(usize) -> Result<()>,
) -> Result<Vec<Measurement>> {
    let gpu_timed = ctx.set_profiling(true);
    let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let mut measured = vec![
        Measurement {
            samples_ms: Vec::with_capacity(repeats.timed),
            clock: if gpu_timed {
                Clock::GpuTimestamps
            } else {
                Clock::Wall
            },
            retaken: 0,
            throttled: 0,
        };
        count
    ];
    let outcome = timed_rounds(ctx, repeats, gpu_timed, &mut measured, &mut submit).await;
    ctx.set_profiling(false);
    if let Some(e) = scope.pop().await {
        return Err(crate::device::context::classify("benchmark", &e));
    }
    outcome?;
    Ok(measured)
}

/// The rounds of [`measure_gpu_interleaved`], into `measured`: each piece's
/// run timed, bracketed by the clock guard's probes where it is on.
async fn timed_rounds(
    ctx: &GpuContext,
    repeats: Repeats,
    gpu_timed: bool,
    measured: &mut [Measurement],
    submit: &mut impl AsyncFnMut(usize) -> Result<()>,
) -> Result<()> {
    use clock_guard::Verdict;
    let probe = match gpu_timed && ctx.clock_guard_on() {
        true => Some(FmaRun::new(ctx, clock_guard::PROBE_SHAPE)?),
        false => None,
    };
    // Whether the last probe read slow (none yet: not slow).
    let mut slow = match &probe {
        Some(probe) => probe_slow(ctx, probe).await?,
        None => false,
    };
    let mut retakes_left = vec![clock_guard::retake_budget(repeats.timed); measured.len()];
    for round in 0..repeats.warmup + repeats.timed {
        for (piece, measurement) in measured.iter_mut().enumerate() {
            loop {
                let start = Instant::now();
                ctx.restart_profile();
                submit(piece).await?;
                ctx.finish().await?;
                let wall = start.elapsed().as_secs_f64() * 1e3;
                let gpu = if gpu_timed {
                    ctx.last_gpu_ms().await?
                } else {
                    None
                };
                let slow_before = slow;
                if let Some(probe) = &probe {
                    slow = probe_slow(ctx, probe).await?;
                }
                if round < repeats.warmup {
                    break;
                }
                match clock_guard::verdict(slow_before, slow, retakes_left[piece]) {
                    Verdict::Retake => {
                        retakes_left[piece] -= 1;
                        measurement.retaken += 1;
                        // Let the clocks come back before the retake.
                        if let Some(probe) = &probe {
                            for _ in 0..clock_guard::RECOVERY_PROBES {
                                if !slow {
                                    break;
                                }
                                slow = probe_slow(ctx, probe).await?;
                            }
                        }
                        continue;
                    }
                    Verdict::KeepThrottled => measurement.throttled += 1,
                    Verdict::Keep => {}
                }
                measurement.samples_ms.push(gpu.unwrap_or_else(|| {
                    measurement.clock = Clock::Wall;
                    wall
                }));
                break;
            }
        }
    }
    Ok(())
}

/// Runs the clock guard's probe alone and says whether it read slow against
/// the fastest probe seen on the device (which it may become).
async fn probe_slow(ctx: &GpuContext, probe: &FmaRun) -> Result<bool> {
    ctx.restart_profile();
    probe.submit(ctx, "clock probe")?;
    ctx.finish().await?;
    let gflops = match ctx.last_gpu_ms().await? {
        Some(ms) if ms > 0.0 => probe.flops / (ms * 1e6),
        // No reading (timestamps too coarse to see the probe): nothing known.
        _ => return Ok(false),
    };
    let fastest = ctx.note_clock_probe(gflops);
    Ok(clock_guard::is_slow(gflops, fastest))
}

/// Flops per invocation and round of `shaders/fma_peak.wgsl`: 32 vec4 fmas.
const FMA_FLOPS_PER_ROUND: f64 = 32.0 * 4.0 * 2.0;

/// Flops of one run of the FMA-ceiling kernel.
pub fn fma_ceiling_flops() -> f64 {
    FmaRun::flops_of(FMA_SHAPE)
}

/// Workgroups, invocations per workgroup and rounds of the FMA-ceiling run.
const FMA_SHAPE: (u32, u32, u32) = (2048, 64, 256);

/// One dispatch of `shaders/fma_peak.wgsl` of a given shape (workgroups,
/// invocations, rounds): the FMA ceiling's kernel, and the clock guard's
/// probe at a quarter of its rounds.
struct FmaRun {
    pipeline: std::sync::Arc<crate::device::pipeline::Pipeline>,
    uniform: wgpu::Buffer,
    sink: wgpu::Buffer,
    workgroups: u32,
    flops: f64,
}

impl FmaRun {
    fn flops_of((workgroups, invocations, rounds): (u32, u32, u32)) -> f64 {
        f64::from(workgroups) * f64::from(invocations) * f64::from(rounds) * FMA_FLOPS_PER_ROUND
    }

    fn new(ctx: &GpuContext, shape: (u32, u32, u32)) -> Result<FmaRun> {
        let (workgroups, invocations, iterations) = shape;
        let params = FmaParams {
            iterations,
            mul: 0.999,
            add: 1e-3,
            _pad: 0,
        };
        let key = PipelineKey::new(crate::kernels::ceilings::FMA_PEAK)
            .with("WORKGROUP", i64::from(invocations));
        Ok(FmaRun {
            pipeline: ctx.pipelines.get(&key),
            uniform: buffer::uniform(&Run::new(ctx), "fma params", &params),
            sink: buffer::storage(
                &Run::new(ctx),
                "fma sink",
                (workgroups * invocations * 4) as usize,
            )?,
            workgroups,
            flops: Self::flops_of(shape),
        })
    }

    /// Records and submits one run.
    fn submit(&self, ctx: &GpuContext, label: &str) -> Result<()> {
        let run = Run::new(ctx);
        let mut rec = Recorder::new(&run, label);
        rec.dispatch(
            &self.pipeline,
            &[&self.uniform, &self.sink],
            u64::from(self.workgroups),
        )?;
        rec.submit();
        Ok(())
    }
}

/// The device's FMA throughput ceiling in GFLOP/s, with its measurement.
pub async fn fma_ceiling(ctx: &GpuContext, repeats: Repeats) -> Result<(f64, Measurement)> {
    let run = FmaRun::new(ctx, FMA_SHAPE)?;
    let m = measure_gpu(ctx, repeats, async || run.submit(ctx, "fma ceiling")).await?;
    Ok((m.gflops(run.flops), m))
}

/// The largest copy the bandwidth ceiling makes: 256 MiB, far beyond any
/// GPU's last-level cache (50 MiB on an H100), so the copy streams from memory.
pub const COPY_BYTES: u64 = 256 << 20;

/// The device's memory-bandwidth ceiling, measured by a vec4 copy.
#[derive(Debug, Clone, PartialEq)]
pub struct Bandwidth {
    /// GB/s (1e9 bytes per second) read and written, at the median.
    pub gbs: f64,
    /// Bytes one run reads plus writes.
    pub bytes_moved: u64,
    /// The timings.
    pub measurement: Measurement,
}

/// The bytes of one copy: [`COPY_BYTES`], or less where a binding or buffer
/// limit is smaller, in whole workgroups' worth of vec4s.
fn copy_bytes(ctx: &GpuContext) -> u64 {
    let l = &ctx.capabilities().limits;
    let cap = COPY_BYTES
        .min(l.max_storage_buffer_binding_size)
        .min(l.max_buffer_size);
    cap / (16 * 256) * (16 * 256)
}

/// A vec4 copy of a buffer much larger than the device's caches
/// (`shaders/copy_peak.wgsl`): the bandwidth ceiling's kernel, and what
/// evicts K and V from the last-level cache between decode runs.
struct BigCopy {
    pipeline: std::sync::Arc<crate::device::pipeline::Pipeline>,
    uniform: wgpu::Buffer,
    src: wgpu::Buffer,
    dst: wgpu::Buffer,
    workgroups: u32,
    bytes: u64,
}

impl BigCopy {
    fn new(ctx: &GpuContext) -> Result<BigCopy> {
        const WORKGROUP: u32 = 256;
        let bytes = copy_bytes(ctx);
        let count = (bytes / 16) as u32;
        // About four vec4s per invocation: enough invocations to fill any GPU,
        // few enough loop trips for llvmpipe's loop budget.
        let workgroups = count.div_ceil(WORKGROUP * 4).max(1);
        let params = CopyParams {
            count,
            stride: workgroups * WORKGROUP,
            _pad: [0; 2],
        };
        let key = PipelineKey::new(crate::kernels::ceilings::COPY_PEAK)
            .with("WORKGROUP", i64::from(WORKGROUP));
        let floats = (bytes / 4) as usize;
        Ok(BigCopy {
            pipeline: ctx.pipelines.get(&key),
            uniform: buffer::uniform(&Run::new(ctx), "copy params", &params),
            src: buffer::storage(&Run::new(ctx), "copy source", floats)?,
            dst: buffer::storage(&Run::new(ctx), "copy destination", floats)?,
            workgroups,
            bytes,
        })
    }

    /// Records and submits one copy (its pass timed where the context
    /// profiles: the bandwidth ceiling's measurement).
    fn submit(&self, ctx: &GpuContext) -> Result<()> {
        let run = Run::new(ctx);
        let mut rec = Recorder::new(&run, "big copy");
        rec.dispatch(
            &self.pipeline,
            &[&self.uniform, &self.src, &self.dst],
            u64::from(self.workgroups),
        )?;
        rec.submit();
        Ok(())
    }

    /// Submits one copy to evict the caches before a measurement, which then
    /// times what follows the copy, not the copy.
    fn flush(&self, ctx: &GpuContext) -> Result<()> {
        self.submit(ctx)?;
        ctx.restart_profile();
        Ok(())
    }
}

/// The device's memory bandwidth in GB/s: a copy of a buffer much larger than
/// its caches (`shaders/copy_peak.wgsl`), counting the bytes read and written.
/// The memory-bound kernels (decode) report their share of it.
pub async fn bandwidth_ceiling(ctx: &GpuContext, repeats: Repeats) -> Result<Bandwidth> {
    let copy = BigCopy::new(ctx)?;
    let m = measure_gpu(ctx, repeats, async || copy.submit(ctx)).await?;
    let bytes_moved = 2 * copy.bytes;
    Ok(Bandwidth {
        gbs: bytes_moved as f64 / (m.median_ms() * 1e6),
        bytes_moved,
        measurement: m,
    })
}

/// The host's memory bandwidth in GB/s: a copy of [`COPY_BYTES`] between two
/// host buffers (far larger than the caches), shared among `threads`
/// threads, counting the bytes read and written as [`bandwidth_ceiling`]
/// does: the ceiling the CPU engine's memory-bound rows (its token step)
/// report their share of.
#[cfg(not(target_arch = "wasm32"))]
pub fn host_bandwidth_ceiling(threads: usize, repeats: Repeats) -> Bandwidth {
    let len = (COPY_BYTES / 4) as usize;
    let src: Vec<f32> = (0..len).map(|i| i as f32).collect();
    let mut dst = vec![0.0f32; len];
    let threads = threads.max(1);
    let part = len.div_ceil(threads);
    let mut samples = Vec::with_capacity(repeats.timed);
    for run in 0..repeats.warmup + repeats.timed {
        let start = Instant::now();
        std::thread::scope(|scope| {
            for (to, from) in dst.chunks_mut(part).zip(src.chunks(part)) {
                scope.spawn(move || to.copy_from_slice(from));
            }
        });
        if run >= repeats.warmup {
            samples.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    std::hint::black_box(&dst);
    let measurement = Measurement::wall(samples);
    let bytes_moved = 2 * COPY_BYTES;
    Bandwidth {
        gbs: bytes_moved as f64 / (measurement.median_ms() * 1e6),
        bytes_moved,
        measurement,
    }
}

/// The host's f32 FMA ceiling in GFLOP/s: independent multiply-add chains on
/// registers in the CPU backend's instruction set, on `threads` threads at
/// once: what the CPU rows of the bench report their share of.
#[cfg(not(target_arch = "wasm32"))]
pub fn host_fma_ceiling(threads: usize, repeats: Repeats) -> (f64, Measurement) {
    const STEPS: usize = 1 << 20;
    let isa = crate::cpu::fast::Isa::detect();
    let threads = threads.max(1);
    let mut samples = Vec::with_capacity(repeats.timed);
    let mut flops = 0.0;
    for run in 0..repeats.warmup + repeats.timed {
        let start = Instant::now();
        flops = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..threads)
                .map(|_| scope.spawn(move || crate::cpu::fast::peak::fma_chains(isa, STEPS)))
                .collect();
            runs.into_iter()
                .map(|run| {
                    let (flops, sum) = run.join().unwrap_or((0.0, 0.0));
                    std::hint::black_box(sum);
                    flops
                })
                .sum::<f64>()
        });
        if run >= repeats.warmup {
            samples.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let measurement = Measurement::wall(samples);
    (flops / (measurement.median_ms() * 1e6), measurement)
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
    let kernel = gemm::gemm_kernel_for(ctx.capabilities());
    gemm_with(ctx, kernel, m, n, k, repeats).await
}

/// [`gemm()`] with a given kernel, to compare kernels in one run.
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
    let a = buffer::upload(&Run::new(ctx), "A", &rng.normal_vec(m * k, 1.0))?;
    let b = buffer::upload(&Run::new(ctx), "B", &rng.normal_vec(k * n, 1.0))?;
    let c = buffer::storage(&Run::new(ctx), "C", m * n)?;
    let meas = measure_gpu(ctx, repeats, async || {
        let run = Run::new(ctx);
        let mut rec = Recorder::new(&run, "gemm bench");
        gemm::record(&mut rec, kernel, &spec, &a, &b, &c)?;
        rec.submit();
        Ok(())
    })
    .await?;
    Ok((meas.gflops(2.0 * (m * n * k) as f64), meas))
}

/// One attention configuration of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// B.
    pub batch: usize,
    /// Hq.
    pub heads: usize,
    /// Hkv: `heads` for multi-head attention, a divisor of it for grouped
    /// queries (each KV head serves `heads / kv_heads` query heads).
    pub kv_heads: usize,
    /// Nq.
    pub seq_q: usize,
    /// Nk.
    pub seq_k: usize,
    /// Dk = Dv.
    pub head_dim: usize,
    /// Causal masking.
    pub causal: bool,
}

impl AttentionShape {
    /// Bytes of the f32 score matrix `[B, H, Nq, Nk]` that the unfused path
    /// materialises (the fused path never does).
    pub fn score_bytes(&self) -> u64 {
        // (In u64: on wasm32 a usize product passes 2^32 at ordinary sizes.)
        4 * [self.batch, self.heads, self.seq_q, self.seq_k]
            .iter()
            .map(|&d| d as u64)
            .product::<u64>()
    }

    /// Bytes of K and V (f32) that one call must read at least once: what
    /// bounds decoding, where a few query rows meet a long cache.
    pub fn kv_bytes(&self) -> u64 {
        self.kv_bytes_as(crate::DType::F32)
    }

    /// [`AttentionShape::kv_bytes`] with K and V stored as `dtype` (f16: half).
    pub fn kv_bytes_as(&self, dtype: crate::DType) -> u64 {
        let width = if dtype == crate::DType::F16 { 2 } else { 4 };
        2 * width
            * [self.batch, self.kv_heads, self.seq_k, self.head_dim]
                .iter()
                .map(|&d| d as u64)
                .product::<u64>()
    }

    /// Useful flops: 4·B·H·Nq·Nk·D (QKᵀ and PV), halved for causal square attention.
    pub fn flops(&self) -> f64 {
        let full = 4.0
            * [
                self.batch,
                self.heads,
                self.seq_q,
                self.seq_k,
                self.head_dim,
            ]
            .iter()
            .map(|&d| d as f64)
            .product::<f64>();
        if self.causal && self.seq_q == self.seq_k {
            full / 2.0
        } else {
            full
        }
    }
}

/// An attention measurement on one path.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionMeasurement {
    /// The timings.
    pub measurement: Measurement,
    /// GFLOP/s at the median ([`AttentionShape::flops`]).
    pub gflops: f64,
    /// Device memory the path allocated per call beyond its inputs (0 on the CPU).
    pub peak_bytes: u64,
    /// The plan the last timed call ran, as one line (its kernels and
    /// tiles; empty on the CPU), so that a row says which kernel it timed.
    pub plan: String,
}

/// Times attention of `shape` on `path`: the GPU paths with [`measure_gpu`];
/// `Cpu` (the fast CPU backend, on the engine's threads) and `Oracle` (the f64
/// oracle) by the wall clock around a host call. A GPU path on a CPU engine is
/// [`crate::Error::Conflict`].
pub async fn attention(
    engine: &crate::Engine,
    shape: AttentionShape,
    path: crate::KernelPath,
    repeats: Repeats,
) -> Result<AttentionMeasurement> {
    attention_with(engine, shape, path, repeats, false).await
}

/// Whether [`attention_with`] can time a run with cold caches on this
/// engine: a GPU that is not CPU-backed and has timestamp queries (so the
/// copy that evicts the cache is not in the timed passes).
pub fn can_flush_caches(engine: &crate::Engine) -> bool {
    engine.gpu().is_some_and(|ctx| {
        let caps = ctx.capabilities();
        caps.timestamp_query && caps.adapter.device_type != "Cpu"
    })
}

/// [`attention`], and with `cold_cache` (where [`can_flush_caches`]) a copy
/// of 256 MiB submitted before each run so K and V come from memory, not from
/// the last-level cache that held them after the previous run: what decode's
/// bandwidth share needs when K and V fit in that cache.
pub async fn attention_with(
    engine: &crate::Engine,
    shape: AttentionShape,
    path: crate::KernelPath,
    repeats: Repeats,
    cold_cache: bool,
) -> Result<AttentionMeasurement> {
    attention_as(engine, shape, path, repeats, cold_cache, crate::DType::F32).await
}

/// [`attention_with`] with K and V of `dtype` (f16: stored as f16 on the
/// device, so decode streams half the bytes). Q stays f32, as a decoder with
/// an f16 KV cache has it.
pub async fn attention_as(
    engine: &crate::Engine,
    shape: AttentionShape,
    path: crate::KernelPath,
    repeats: Repeats,
    cold_cache: bool,
    dtype: crate::DType,
) -> Result<AttentionMeasurement> {
    let run = AttentionRun {
        path,
        precision: crate::Precision::Highest,
        cold_cache,
        dtype,
    };
    attention_run(engine, shape, run, repeats).await
}

/// How [`attention_run`] times a shape: the path, the precision its products
/// may take, whether caches are flushed first ([`attention_with`]), and the
/// storage type of K and V ([`attention_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionRun {
    /// The path.
    pub path: crate::KernelPath,
    /// `Fast` lets the GPU paths multiply on the matrix units.
    pub precision: crate::Precision,
    /// Flush the last-level cache before each run (where [`can_flush_caches`]).
    pub cold_cache: bool,
    /// K and V's storage type.
    pub dtype: crate::DType,
}

/// Values of K (and of V) beyond which [`attention_run`] fills them on the
/// device from a repeated block of random rows (256 MiB of f32).
const REPEATED_KV_VALUES: usize = 1 << 26;

/// Times attention of `shape` as `run` says (the other functions of this
/// family are this one with fewer choices).
pub async fn attention_run(
    engine: &crate::Engine,
    shape: AttentionShape,
    run: AttentionRun,
    repeats: Repeats,
) -> Result<AttentionMeasurement> {
    let mut measured = attention_runs(&[engine], shape, run, repeats).await?;
    Ok(measured.remove(0))
}

/// [`attention_run`] on each of `engines` (engines of one kind: the contexts
/// of one device made for a measurement, say), on inputs drawn once and
/// uploaded to each: a measurement per engine, in order. Drawing the inputs
/// of FlashAttention's shapes takes the host longer than timing them. On a
/// GPU the engines' runs interleave ([`measure_gpu_interleaved`]), each
/// engine's inputs held on the device meanwhile; GPU engines must be made
/// from one context (its clones, as `Engine::from_context` takes them).
pub async fn attention_runs(
    engines: &[&crate::Engine],
    shape: AttentionShape,
    run: AttentionRun,
    repeats: Repeats,
) -> Result<Vec<AttentionMeasurement>> {
    use crate::conformance::CaseSpec;
    let Some(&first) = engines.first() else {
        return Ok(Vec::new());
    };
    if engines
        .iter()
        .any(|e| e.gpu().is_some() != first.gpu().is_some())
    {
        return Err(crate::Error::Conflict(
            "engines measured on one set of inputs must all run on a GPU or all on the CPU",
        ));
    }
    let AttentionRun {
        path,
        precision,
        cold_cache,
        dtype,
    } = run;
    use crate::{AttentionInputs, AttentionOptions, KernelPath};
    let kv_shape = [shape.batch, shape.kv_heads, shape.seq_k, shape.head_dim];
    let kv_len: usize = kv_shape.iter().product();
    // K and V beyond REPEATED_KV_VALUES each, on a GPU: a block of random
    // rows repeated on the device (decode at 128k keys holds 17 GB of K and
    // V, which the host would take minutes to draw); the timing does not
    // depend on the values.
    let repeated = (first.gpu().is_some()
        && matches!(path, KernelPath::Fused | KernelPath::Unfused)
        && kv_len > REPEATED_KV_VALUES)
        .then(|| {
            let rows = REPEATED_KV_VALUES / 8 / shape.head_dim;
            let mut rng = SplitMix64::new(0xb10c);
            let block = |rng: &mut SplitMix64| {
                crate::HostTensor::new(
                    [rows, shape.head_dim],
                    rng.normal_vec(rows * shape.head_dim, 1.0),
                )
                .map(|t| t.into_dtype(dtype))
            };
            Ok::<_, crate::Error>((block(&mut rng)?, block(&mut rng)?))
        })
        .transpose()?;
    let case = CaseSpec::new(
        "bench",
        [shape.batch, shape.heads, shape.kv_heads],
        // Only Q is drawn whole where K and V repeat a block.
        [
            shape.seq_q,
            if repeated.is_some() { 1 } else { shape.seq_k },
        ],
        [shape.head_dim, shape.head_dim],
    );
    let mut inputs = case.generate(1)?;
    if dtype == crate::DType::F16 {
        inputs.k = inputs.k.into_f16();
        inputs.v = inputs.v.into_f16();
    }
    let options = AttentionOptions {
        path,
        is_causal: shape.causal,
        precision,
        ..Default::default()
    };
    let measurements = match (path, first.gpu()) {
        (KernelPath::Cpu | KernelPath::Oracle, _) | (_, None) => {
            let host = inputs.as_inputs();
            let mut measurements = Vec::new();
            for &engine in engines {
                let mut samples = Vec::new();
                for run in 0..repeats.warmup + repeats.timed {
                    let start = Instant::now();
                    engine.attention_host(&host, &options).await?;
                    if run >= repeats.warmup {
                        samples.push(start.elapsed().as_secs_f64() * 1e3);
                    }
                }
                measurements.push(Measurement::wall(samples));
            }
            measurements
        }
        (_, Some(ctx)) => {
            // One context's clones share its device and its profiler, which
            // times every engine's runs.
            if engines.iter().any(|e| {
                e.gpu().is_some_and(|other| {
                    !std::sync::Arc::ptr_eq(&other.measurement, &ctx.measurement)
                })
            }) {
                return Err(crate::Error::Conflict(
                    "engines measured side by side must come from one GPU context (its clones)",
                ));
            }
            // Each engine's own copy of the inputs (a tensor belongs to the
            // engine that made it), all held while the runs interleave.
            let mut held = Vec::with_capacity(engines.len());
            for &engine in engines {
                let q = engine.upload(&inputs.q)?;
                let (k, v) = match &repeated {
                    Some((k_pattern, v_pattern)) => (
                        engine.upload_repeated(&kv_shape, k_pattern).await?,
                        engine.upload_repeated(&kv_shape, v_pattern).await?,
                    ),
                    None => (engine.upload(&inputs.k)?, engine.upload(&inputs.v)?),
                };
                held.push((q, k, v));
            }
            let flush = if cold_cache && can_flush_caches(first) {
                Some(BigCopy::new(ctx)?)
            } else {
                None
            };
            measure_gpu_interleaved(ctx, repeats, engines.len(), async |i| {
                if let Some(copy) = &flush {
                    // Its own submission: the timestamps cover the call only.
                    copy.flush(ctx)?;
                }
                let (q, k, v) = &held[i];
                engines[i]
                    .attention(&AttentionInputs::new(q, k, v), &options)
                    .await
                    .map(|_| ())
            })
            .await?
        }
    };
    let mut measured = Vec::with_capacity(engines.len());
    for (&engine, measurement) in engines.iter().zip(measurements) {
        let (peak_bytes, plan) = match (path, engine.last_call()) {
            (KernelPath::Cpu | KernelPath::Oracle, _) | (_, None) => (0, String::new()),
            (_, Some(call)) => (call.allocated_bytes, call.plan.to_string()),
        };
        measured.push(AttentionMeasurement {
            gflops: measurement.gflops(shape.flops()),
            measurement,
            peak_bytes,
            plan,
        });
    }
    Ok(measured)
}

/// One decoder layer, for [`token_step`]: `heads` query heads and `kv_heads`
/// KV heads of `head_dim`, `d_model = heads · head_dim`, RoPE on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderLayerShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (GQA).
    pub kv_heads: usize,
    /// Dk = Dv.
    pub head_dim: usize,
}

impl DecoderLayerShape {
    /// The model's width, `heads · head_dim`.
    pub fn d_model(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// One decoder layer's token step as [`token_step`] measured it.
#[derive(Debug, Clone)]
pub struct TokenStep {
    /// Milliseconds per token, by the wall clock.
    pub measurement: Measurement,
    /// The work of the last timed step: buffers created, dispatches,
    /// submissions (zero on a CPU engine).
    pub counts: crate::WorkCounts,
    /// Bytes of weights the step reads (each weight once), as stored.
    pub weight_bytes: u64,
    /// Bytes of cached keys and values the step's attention reads (f32).
    pub kv_bytes: u64,
}

impl TokenStep {
    /// GB/s of the step's bytes (weights and cached K/V) at the median time.
    pub fn gbs(&self) -> f64 {
        (self.weight_bytes + self.kv_bytes) as f64 / (self.measurement.median_ms() * 1e6)
    }
}

/// Milliseconds per generated token of one decoder layer with `cached` tokens
/// already in its KV cache: the whole step (Q/K/V projections, RoPE, the cache
/// append, attention over the cache, the output projection, the readback of
/// the token's output), by the wall clock, one token per run, the weights kept
/// as `storage`. The cache is filled by one prefill call first (untimed); each
/// run adds a token, so the cache grows by `repeats.warmup + repeats.timed`
/// over the measurement.
pub async fn token_step(
    engine: &crate::Engine,
    layer: DecoderLayerShape,
    cached: usize,
    storage: crate::WeightStorage,
    repeats: Repeats,
) -> Result<TokenStep> {
    use crate::family::mha::{KvCache, MhaWeights, MultiHeadAttention};
    use crate::family::position::Rope;
    use crate::{AttentionOptions, HostTensor};
    let d_model = layer.d_model();
    let weights = MhaWeights::random(
        d_model,
        d_model,
        layer.heads,
        layer.kv_heads,
        layer.head_dim,
        0x70c3,
    )?;
    let mha = MultiHeadAttention::new(weights, layer.heads, layer.kv_heads)?
        .with_rope(Rope::default())?
        .with_weight_storage(storage);
    let mut rng = SplitMix64::new(0x5eed ^ cached as u64);
    // Room for every run: the timed steps append in place.
    let mut cache = KvCache::with_capacity(cached + repeats.warmup + repeats.timed + 1);
    let options = AttentionOptions::default();
    if cached > 0 {
        let prompt = HostTensor::new([1, cached, d_model], rng.normal_vec(cached * d_model, 1.0))?;
        mha.forward_cached(engine, &prompt, &mut cache, &options, false)
            .await?;
    }
    let mut samples = Vec::with_capacity(repeats.timed);
    let mut counts = crate::WorkCounts::default();
    for run in 0..repeats.warmup + repeats.timed {
        let token = HostTensor::new([1, 1, d_model], rng.normal_vec(d_model, 1.0))?;
        let before = engine.gpu().map(|g| g.work_counts());
        let start = Instant::now();
        mha.forward_cached(engine, &token, &mut cache, &options, false)
            .await?;
        if run >= repeats.warmup {
            samples.push(start.elapsed().as_secs_f64() * 1e3);
        }
        if let (Some(before), Some(g)) = (before, engine.gpu()) {
            counts = g.work_counts() - before;
        }
    }
    let weight_count =
        (2 * d_model * d_model + 2 * d_model * layer.kv_heads * layer.head_dim) as u64;
    let weight_bytes = match mha.device_weight_bytes(engine)? {
        Some(bytes) => bytes,
        None => weight_count * 4,
    };
    let kv_bytes = (cache.len() * layer.kv_heads * layer.head_dim * 2 * 4) as u64;
    Ok(TokenStep {
        measurement: Measurement::wall(samples),
        counts,
        weight_bytes,
        kv_bytes,
    })
}

/// A stack of `layers` decoder layers of `layer`'s shape, each with its own
/// random weights kept as `storage` and RoPE: what [`token_stack`] times
/// (made once and timed at several cache lengths).
pub fn decoder_stack(
    layer: DecoderLayerShape,
    layers: usize,
    storage: crate::WeightStorage,
) -> Result<Vec<crate::family::mha::MultiHeadAttention>> {
    use crate::family::mha::{MhaWeights, MultiHeadAttention};
    use crate::family::position::Rope;
    let d_model = layer.d_model();
    (0..layers)
        .map(|i| {
            let weights = MhaWeights::random(
                d_model,
                d_model,
                layer.heads,
                layer.kv_heads,
                layer.head_dim,
                0x70c3 + i as u64,
            )?;
            Ok(
                MultiHeadAttention::new(weights, layer.heads, layer.kv_heads)?
                    .with_rope(Rope::default())?
                    .with_weight_storage(storage),
            )
        })
        .collect()
}

/// Milliseconds per generated token of `stack` (layers of `layer`'s shape,
/// [`decoder_stack`]), each layer with its own cache of `cached` tokens, the
/// hidden state kept on the device from layer to layer
/// ([`crate::family::mha::MultiHeadAttention::forward_cached_on_device`]):
/// the token written into the stack's input tensor, every layer's step
/// recorded into one encoder and submitted once (on a GPU), the last output
/// read back, by the wall clock. The caches hold zeros (a step's cost does not depend on the
/// values), not a prefill through the stack.
pub async fn token_stack(
    engine: &crate::Engine,
    stack: &[crate::family::mha::MultiHeadAttention],
    layer: DecoderLayerShape,
    cached: usize,
    repeats: Repeats,
) -> Result<TokenStep> {
    use crate::family::mha::KvCache;
    use crate::{AttentionOptions, HostTensor};
    let d_model = layer.d_model();
    let runs = repeats.warmup + repeats.timed;
    let mut rng = SplitMix64::new(0x57ac ^ cached as u64);
    let mut caches = Vec::with_capacity(stack.len());
    let filled = match cached {
        0 => None,
        _ => Some(engine.upload(&HostTensor::zeros([
            1,
            layer.kv_heads,
            cached,
            layer.head_dim,
        ])?)?),
    };
    for _ in stack {
        let mut cache = KvCache::with_capacity(cached + runs + 1);
        if let Some(kv) = &filled {
            cache.append(engine, kv, kv).await?;
        }
        caches.push(cache);
    }
    let options = AttentionOptions::default();
    let mut samples = Vec::with_capacity(repeats.timed);
    let mut counts = crate::WorkCounts::default();
    // The token goes in through one tensor, written in place each step.
    let mut input = engine.upload(&HostTensor::zeros([1, 1, d_model])?)?;
    for run in 0..runs {
        let token = HostTensor::new([1, 1, d_model], rng.normal_vec(d_model, 1.0))?;
        let before = engine.gpu().map(|g| g.work_counts());
        let start = Instant::now();
        engine.write(&mut input, &token)?;
        let mut x = input.clone();
        // On a GPU, every layer's step in one encoder, submitted once; an
        // empty cache's first step runs by itself.
        let recorded = engine
            .gpu()
            .filter(|_| caches.iter().all(|c| !c.is_empty()));
        match recorded {
            Some(ctx) => {
                let mut encoder = ctx.device().create_command_encoder(&Default::default());
                for (layer, cache) in stack.iter().zip(&mut caches) {
                    x = layer
                        .record_on_device(engine, &mut encoder, &x, cache, &options)
                        .await?;
                }
                ctx.queue().submit([encoder.finish()]);
            }
            None => {
                for (layer, cache) in stack.iter().zip(&mut caches) {
                    x = layer
                        .forward_cached_on_device(engine, &x, cache, &options)
                        .await?;
                }
            }
        }
        engine.download(&x).await?;
        if run >= repeats.warmup {
            samples.push(start.elapsed().as_secs_f64() * 1e3);
        }
        if let (Some(before), Some(g)) = (before, engine.gpu()) {
            counts = g.work_counts() - before;
            // The stack's own submission, which the engine does not count.
            counts.submissions += u64::from(recorded.is_some());
        }
    }
    let layers = stack.len() as u64;
    let per_layer = match stack
        .first()
        .map(|l| l.device_weight_bytes(engine))
        .transpose()?
    {
        Some(Some(bytes)) => bytes,
        _ => (2 * d_model * d_model + 2 * d_model * layer.kv_heads * layer.head_dim) as u64 * 4,
    };
    let kv_per_layer = caches.first().map_or(0, |c| {
        (c.len() * layer.kv_heads * layer.head_dim * 2 * 4) as u64
    });
    Ok(TokenStep {
        measurement: Measurement::wall(samples),
        counts,
        weight_bytes: per_layer * layers,
        kv_bytes: kv_per_layer * layers,
    })
}

/// Host times to issue one attention call at a tiny shape ([`call_overhead`]).
#[derive(Debug, Clone)]
pub struct CallOverhead {
    /// [`crate::Engine::attention`]: plan lookup, checks, record, submit.
    pub plain: Measurement,
    /// [`crate::PreparedAttention::run`]: its workspace and bind groups
    /// reused, one submission a call.
    pub prepared: Measurement,
    /// [`crate::PreparedAttention::record`] into one caller's encoder for all
    /// the calls of a batch, submitted once (its share of that submission
    /// included): a host that records its frame's work in one encoder.
    /// `None` on a CPU engine, as are the two below.
    pub recorded: Option<Measurement>,
    /// [`crate::PreparedAttention::record`] alone: the host's cost of the
    /// call itself, the submission left to the caller (outside the timing).
    pub record_only: Option<Measurement>,
    /// Submitting one empty command buffer: the floor any call that submits
    /// pays on this adapter, whatever the engine does.
    pub empty_submit: Option<Measurement>,
}

/// The host time to issue one attention call at a tiny shape (B1 H1 N16 d16),
/// where the arithmetic is nothing and the call's own costs are everything:
/// a plain [`crate::Engine::attention`], a [`crate::PreparedAttention`] run,
/// its recording into an encoder the caller submits once for a batch of
/// calls, the recording alone, and an empty submission for scale; inputs on
/// the device, no readback. Each sample is the mean of a batch of calls; the
/// five kinds take turns within each round (so a slow spell of a shared
/// machine falls on all of them), and the device is waited for after each
/// batch, outside the timing.
pub async fn call_overhead(engine: &crate::Engine, repeats: Repeats) -> Result<CallOverhead> {
    use crate::{AttentionInputs, AttentionOptions, HostTensor};
    const CALLS: usize = 20;
    let mut rng = SplitMix64::new(0x0c0c);
    let shape = [1, 1, 16, 16];
    let mut upload = || -> Result<crate::Tensor> {
        engine.upload(&HostTensor::new(shape, rng.normal_vec(256, 1.0))?)
    };
    let (q, k, v) = (upload()?, upload()?, upload()?);
    let inputs = AttentionInputs::new(&q, &k, &v);
    let options = AttentionOptions::default();
    let prepared = engine.prepare(&crate::validate(&inputs, &options)?, &options)?;
    let wait = || -> Result<()> {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(ctx) = engine.gpu() {
            ctx.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| crate::Error::Readback(e.to_string()))?;
        }
        Ok(())
    };
    let per_call = |start: Instant| start.elapsed().as_secs_f64() * 1e3 / CALLS as f64;
    // Each round is longer than a quick bench's: these are microseconds, and
    // a shared machine's noise is not.
    let rounds = 4 * (repeats.warmup + repeats.timed);
    let warmup = 4 * repeats.warmup;
    let mut samples: [Vec<f64>; 5] = Default::default();
    for round in 0..rounds {
        let mut times = [f64::NAN; 5];
        let start = Instant::now();
        for _ in 0..CALLS {
            engine.attention(&inputs, &options).await?;
        }
        times[0] = per_call(start);
        wait()?;
        let start = Instant::now();
        for _ in 0..CALLS {
            prepared.run(engine, &inputs).await?;
        }
        times[1] = per_call(start);
        wait()?;
        // A CPU engine has no encoder and no submission.
        if let Some(ctx) = engine.gpu() {
            let new_encoder = || {
                ctx.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
            };
            let start = Instant::now();
            let mut encoder = new_encoder();
            for _ in 0..CALLS {
                prepared.record(engine, &mut encoder, &inputs).await?;
            }
            ctx.queue.submit([encoder.finish()]);
            times[2] = per_call(start);
            wait()?;
            let mut encoder = new_encoder();
            let start = Instant::now();
            for _ in 0..CALLS {
                prepared.record(engine, &mut encoder, &inputs).await?;
            }
            times[3] = per_call(start);
            ctx.queue.submit([encoder.finish()]);
            wait()?;
            let start = Instant::now();
            for _ in 0..CALLS {
                ctx.queue.submit([new_encoder().finish()]);
            }
            times[4] = per_call(start);
            wait()?;
        }
        if round >= warmup {
            for (kind, ms) in samples.iter_mut().zip(times) {
                if ms.is_finite() {
                    kind.push(ms);
                }
            }
        }
    }
    let [plain, prepared, recorded, record_only, empty_submit] =
        samples.map(|s| (!s.is_empty()).then(|| Measurement::wall(s)));
    let measured = "the plain and prepared calls were timed";
    Ok(CallOverhead {
        plain: plain.ok_or(crate::Error::Conflict(measured))?,
        prepared: prepared.ok_or(crate::Error::Conflict(measured))?,
        recorded,
        record_only,
        empty_submit,
    })
}

/// Milliseconds to append one token's keys and values to a [`crate::KvCache`]
/// of `layer` (batch 1) that holds `cached` tokens, by the wall clock until
/// the device has finished the copies. The cache has room for every run, so
/// nothing grows: this is the in-place append, O(new tokens).
pub async fn kv_append(
    engine: &crate::Engine,
    layer: DecoderLayerShape,
    cached: usize,
    repeats: Repeats,
) -> Result<Measurement> {
    use crate::{HostTensor, KvCache};
    let runs = repeats.warmup + repeats.timed;
    let (heads, d) = (layer.kv_heads, layer.head_dim);
    let mut cache = KvCache::with_capacity(cached + runs);
    if cached > 0 {
        let prompt = engine.upload(&HostTensor::zeros([1, heads, cached, d])?)?;
        cache.append(engine, &prompt, &prompt).await?;
    }
    let mut rng = SplitMix64::new(0xcac4e ^ cached as u64);
    let token = engine.upload(&HostTensor::new(
        [1, heads, 1, d],
        rng.normal_vec(heads * d, 1.0),
    )?)?;
    let mut samples = Vec::with_capacity(repeats.timed);
    for run in 0..runs {
        let start = Instant::now();
        cache.append(engine, &token, &token).await?;
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(ctx) = engine.gpu() {
            ctx.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| crate::Error::Readback(e.to_string()))?;
        }
        if run >= repeats.warmup {
            samples.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(Measurement::wall(samples))
}

/// The forward and the backward of one attention shape, timed side by side.
#[derive(Debug, Clone, PartialEq)]
pub struct BackwardMeasurement {
    /// The forward call (Y and the logsumexp).
    pub forward: Measurement,
    /// The backward call (dQ, dK and dV from Y, the logsumexp and dY).
    pub backward: Measurement,
    /// Device memory the backward allocates ([`crate::plan::backward::BackwardPlan`]):
    /// linear in the sequence.
    pub workspace_bytes: u64,
}

impl AttentionShape {
    /// The backward's floating-point operations: its five products (S and
    /// dP recomputed, dV, dK, dQ), 2.5 times the forward's two.
    pub fn backward_flops(&self) -> f64 {
        2.5 * self.flops()
    }
}

/// Times the forward and the backward of `shape` on `path` (`Fused` on a
/// GPU engine, interleaved, timestamps where the adapter has them; `Cpu` by
/// the wall clock around host calls).
pub async fn backward(
    engine: &crate::Engine,
    shape: AttentionShape,
    path: crate::KernelPath,
    repeats: Repeats,
) -> Result<BackwardMeasurement> {
    use crate::conformance::CaseSpec;
    use crate::{AttentionInputs, AttentionOptions, BackwardInputs, GradientOptions, KernelPath};
    let case = CaseSpec::new(
        "bench-backward",
        [shape.batch, shape.heads, shape.kv_heads],
        [shape.seq_q, shape.seq_k],
        [shape.head_dim, shape.head_dim],
    );
    let inputs = case.generate(2)?;
    let options = AttentionOptions {
        path,
        is_causal: shape.causal,
        return_lse: true,
        ..Default::default()
    };
    let host = inputs.as_inputs();
    let dims = crate::validate(&host, &options)?;
    let plan = engine.plan_backward(&dims, &options, GradientOptions::default())?;
    let mut rng = SplitMix64::new(3);
    let dy = crate::HostTensor::new(
        dims.y_shape(),
        rng.normal_vec(dims.y_shape().iter().product(), 1.0),
    )?;
    let grads = GradientOptions::default();
    match (path, engine.gpu()) {
        (KernelPath::Fused, Some(ctx)) => {
            let (q, k, v) = (
                engine.upload(&inputs.q)?,
                engine.upload(&inputs.k)?,
                engine.upload(&inputs.v)?,
            );
            let device = AttentionInputs::new(&q, &k, &v);
            let out = engine.attention(&device, &options).await?;
            let dy = engine.upload(&dy)?;
            let lse = out
                .lse
                .clone()
                .ok_or(crate::Error::Conflict("no logsumexp"))?;
            let forward = BackwardInputs {
                y: &out.y,
                lse: &lse,
                dy: &dy,
            };
            let mut m = measure_gpu_interleaved(ctx, repeats, 2, async |i| {
                if i == 0 {
                    engine.attention(&device, &options).await.map(drop)
                } else {
                    engine
                        .attention_backward(&device, &options, &forward, grads)
                        .await
                        .map(drop)
                }
            })
            .await?;
            let backward = m.remove(1);
            Ok(BackwardMeasurement {
                forward: m.remove(0),
                backward,
                workspace_bytes: plan.workspace_bytes,
            })
        }
        (KernelPath::Cpu, _) => {
            let out = engine.attention_host(&host, &options).await?;
            let lse = out
                .lse
                .clone()
                .ok_or(crate::Error::Conflict("no logsumexp"))?;
            let forward = BackwardInputs {
                y: &out.y,
                lse: &lse,
                dy: &dy,
            };
            let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
            for run in 0..repeats.warmup + repeats.timed {
                let start = Instant::now();
                engine.attention_host(&host, &options).await?;
                let mid = Instant::now();
                engine
                    .attention_backward_host(&host, &options, &forward, grads)
                    .await?;
                if run >= repeats.warmup {
                    fwd.push((mid - start).as_secs_f64() * 1e3);
                    bwd.push(mid.elapsed().as_secs_f64() * 1e3);
                }
            }
            Ok(BackwardMeasurement {
                forward: Measurement::wall(fwd),
                backward: Measurement::wall(bwd),
                workspace_bytes: 0,
            })
        }
        _ => Err(crate::Error::Conflict(
            "the backward is timed on the fused GPU path of a GPU engine or on the CPU backend",
        )),
    }
}
