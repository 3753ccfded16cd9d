//! `webattn bench`: the FMA and bandwidth ceilings, GEMM, attention on every
//! path, decode, and a decoder layer's token step, measured side by side in one
//! run; a table, JSON, and an optional SVG plot.
//! The `cpu` rows are the fast CPU backend; the f64 oracle is timed once at
//! seq 2048 (causal and not) for reference. On a CPU engine only the CPU rows run.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use webattn::kernels::decode::DecodeKernel;
use webattn::kernels::gemm::packed as gemm_packed;
use webattn::kernels::gemm::{GemmKernel, PackedTile};
use webattn::measure as bench;
use webattn::measure::{AttentionShape, Clock, Repeats};
use webattn::{DType, KernelPath, Precision};

use super::plot;

/// Arguments of `webattn bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A short run (under two minutes on lavapipe): seq 2048 at head dim 64 on
    /// every path, GEMM up to 1024, decode at 4096 and 8192 keys, a small
    /// decoder layer's token step at 256 and 1024 cached tokens.
    #[arg(long)]
    quick: bool,
    /// Write the results as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Draw attention GFLOP/s against sequence length per path as SVG to PATH.
    #[arg(long, value_name = "PATH.svg")]
    plot: Option<PathBuf>,
    /// Tokens per attention configuration (batch x sequence), as FlashAttention's
    /// benchmark fixes 16k; smaller suits CPU-backed adapters.
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Model width; heads = width / head dim (FlashAttention uses 2048).
    #[arg(long, default_value_t = 512)]
    width: usize,
    /// Run only these kinds of rows (comma-separated; default: all), e.g.
    /// `--only attention,decode` to fit a run into a time slot.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "KIND,...")]
    only: Vec<RowKind>,
    /// Attention rows only at these sequence lengths, decode rows only at
    /// these key counts (comma-separated; default: the run's range).
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    seqs: Vec<usize>,
    /// Attention rows only at these head dims (comma-separated; default: 64,128).
    #[arg(long, value_delimiter = ',', value_name = "D,...")]
    head_dims: Vec<usize>,
    /// Attention rows only on these paths (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "PATH,...")]
    paths: Vec<BenchPath>,
    /// Measure nothing: draw --plot from the JSON of an earlier run.
    #[arg(long, value_name = "FILE.json", requires = "plot")]
    replot: Option<PathBuf>,
}

/// The kinds of rows `--only` selects.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowKind {
    /// GEMM rows.
    Gemm,
    /// Attention rows (prefill shapes).
    Attention,
    /// Decode rows (one query per head).
    Decode,
    /// The decoder layer's token steps and KV-cache appends.
    Tokens,
    /// The per-call host overhead of a plain, a prepared and a recorded call.
    Overhead,
}

/// The attention paths `--paths` selects.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchPath {
    /// The fused GPU kernel.
    Fused,
    /// The unfused GPU path (scores, softmax, GEMM).
    Unfused,
    /// The fast CPU backend.
    Cpu,
}

impl BenchPath {
    fn kernel_path(self) -> KernelPath {
        match self {
            BenchPath::Fused => KernelPath::Fused,
            BenchPath::Unfused => KernelPath::Unfused,
            BenchPath::Cpu => KernelPath::Cpu,
        }
    }
}

/// One planned measurement.
enum Job {
    /// An n³ GEMM: f32, or (`Fast`) on the matrix units.
    Gemm(usize, Precision),
    /// Attention of a shape on a path, at a precision (`Fast` rows only where
    /// the adapter has matrix units).
    Attention(AttentionShape, KernelPath, Precision),
    /// Decode rows: the shape (Nq = 1), the path, K and V's storage type.
    Decode(AttentionShape, KernelPath, DType),
    /// One decoder layer's token step with this many tokens cached, its
    /// weights kept as the storage says.
    TokenStep(usize, webattn::WeightStorage),
    /// The same step on a CPU engine beside a GPU engine's rows.
    CpuTokenStep(usize),
    /// A stack of [`STACK_LAYERS`] such layers, the hidden state on the device.
    TokenStack(usize, webattn::WeightStorage),
    /// The host cost of a plain call against a prepared one at a tiny shape.
    Overhead,
}

/// Layers of the stack rows: a Llama-2-7B-like model's.
const STACK_LAYERS: usize = 32;

/// The decoder layer of the token-step rows: a Llama-like layer (32 heads of
/// 128, 8 KV heads) on a GPU; a small one with `--quick`, on a CPU adapter or
/// on a CPU engine, where the big layer's prefill would take hours.
fn token_layer(small: bool) -> bench::DecoderLayerShape {
    if small {
        bench::DecoderLayerShape {
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
        }
    } else {
        bench::DecoderLayerShape {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
        }
    }
}

/// The sequence lengths of a full run: FlashAttention's benchmark range
/// (512 to 16384) on a GPU, 256 to 4096 on a CPU adapter or CPU engine.
/// A decode row's shape: one query row per head, d = 128.
fn decode_shape(batch: usize, [heads, kv_heads]: [usize; 2], keys: usize) -> AttentionShape {
    AttentionShape {
        batch,
        heads,
        kv_heads,
        seq_q: 1,
        seq_k: keys,
        head_dim: 128,
        causal: false,
    }
}

/// A shape's heads as the decode table shows them: `H` where every query
/// head has its own KV head, `H/Hkv` where they are grouped.
fn heads_label(shape: &AttentionShape) -> String {
    if shape.kv_heads == shape.heads {
        shape.heads.to_string()
    } else {
        format!("{}/{}", shape.heads, shape.kv_heads)
    }
}

/// Decode rows of `shape` on each of `paths` in f32, and on the fused path
/// with f16 keys and values too (on a GPU, where they stay f16).
fn decode_jobs(jobs: &mut Vec<Job>, shape: AttentionShape, paths: &[KernelPath], gpu: bool) {
    for &path in paths {
        jobs.push(Job::Decode(shape, path, DType::F32));
        if gpu && path == KernelPath::Fused {
            jobs.push(Job::Decode(shape, path, DType::F16));
        }
    }
}

fn full_seqs(gpu_scale: bool) -> &'static [usize] {
    if gpu_scale {
        &[512, 1024, 2048, 4096, 8192, 16384]
    } else {
        &[256, 512, 1024, 2048, 4096]
    }
}

/// The longest sequence the CPU backend's rows run in a full run at GPU
/// scale: beyond it a row would take minutes on the host.
const CPU_ROWS_MAX_SEQ: usize = 2048;

/// The precisions the GPU rows run at: f32, and f16 products where the
/// adapter has matrix units.
pub fn precisions(matrix_units: bool) -> &'static [Precision] {
    if matrix_units {
        &[Precision::Highest, Precision::Fast]
    } else {
        &[Precision::Highest]
    }
}

/// The other forms of the matrix-unit GEMM than `kernel`, the one calls at
/// `Precision::Fast` take: the packed kernel's other tiles that fit, and the
/// staged kernel. None for the f32 kernels.
fn gemm_alternatives(ctx: &webattn::GpuContext, kernel: GemmKernel) -> Vec<GemmKernel> {
    let GemmKernel::CoopPacked { shape, tile } = kernel else {
        return Vec::new();
    };
    let limits = &ctx.capabilities().limits;
    let mut others: Vec<GemmKernel> = PackedTile::CANDIDATES
        .into_iter()
        .filter(|&other| other != tile && gemm_packed::fits(shape, other, limits))
        .map(|tile| GemmKernel::CoopPacked { shape, tile })
        .collect();
    others.push(GemmKernel::Coop(shape));
    others
}

/// The jobs of a run; `gpu_scale`: a GPU that is not CPU-backed (GEMM to
/// 8192³, sequences to 16384); `matrix_units`: GEMM and the fused and
/// unfused rows again at `Precision::Fast`.
fn plan(
    args: &Args,
    gpu: bool,
    gpu_scale: bool,
    small_layer: bool,
    matrix_units: bool,
) -> Vec<Job> {
    let mut jobs = Vec::new();
    let gemm_sizes: &[usize] = match (gpu, args.quick, gpu_scale) {
        (false, _, _) => &[],
        (true, true, _) => &[256, 512, 1024],
        (true, false, false) => &[256, 512, 1024, 2048],
        (true, false, true) => &[256, 512, 1024, 2048, 4096, 8192],
    };
    for &precision in precisions(matrix_units) {
        jobs.extend(gemm_sizes.iter().map(|&n| Job::Gemm(n, precision)));
    }
    // A shape on a path: at both precisions on the GPU paths.
    let attention = |jobs: &mut Vec<Job>, shape: AttentionShape, path: KernelPath| {
        for &precision in precisions(matrix_units) {
            let gpu_path = matches!(path, KernelPath::Fused | KernelPath::Unfused);
            if precision == Precision::Highest || gpu_path {
                jobs.push(Job::Attention(shape, path, precision));
            }
        }
    };
    let paths: &[KernelPath] = if gpu {
        &[KernelPath::Fused, KernelPath::Unfused, KernelPath::Cpu]
    } else {
        &[KernelPath::Cpu]
    };
    let shape = |seq: usize, head_dim: usize, causal: bool| AttentionShape {
        batch: (args.tokens / seq).max(1),
        heads: (args.width / head_dim).max(1),
        kv_heads: (args.width / head_dim).max(1),
        seq_q: seq,
        seq_k: seq,
        head_dim,
        causal,
    };
    if args.quick {
        for causal in [false, true] {
            for &path in paths {
                attention(&mut jobs, shape(2048, 64, causal), path);
            }
        }
        for keys in [4096, 8192] {
            decode_jobs(&mut jobs, decode_shape(1, [8, 8], keys), paths, gpu);
        }
    } else {
        let head_dims = if args.head_dims.is_empty() {
            vec![64, 128]
        } else {
            args.head_dims.clone()
        };
        let seqs = if args.seqs.is_empty() {
            full_seqs(gpu_scale).to_vec()
        } else {
            args.seqs.clone()
        };
        for &head_dim in &head_dims {
            for causal in [false, true] {
                for &seq in &seqs {
                    for &path in paths {
                        if path == KernelPath::Cpu && gpu && gpu_scale && seq > CPU_ROWS_MAX_SEQ {
                            continue;
                        }
                        attention(&mut jobs, shape(seq, head_dim, causal), path);
                    }
                }
            }
        }
        for keys in [4096, 8192, 16384, 32768] {
            decode_jobs(&mut jobs, decode_shape(1, [8, 8], keys), paths, gpu);
        }
        if gpu_scale {
            // Long contexts past one binding (issue 14's targets): the fused
            // path, f32 and f16.
            for keys in [16384, 65536, 131072] {
                decode_jobs(
                    &mut jobs,
                    decode_shape(8, [32, 32], keys),
                    &[KernelPath::Fused],
                    gpu,
                );
            }
            // Grouped queries as the token-step layer has them (32 query
            // heads, 8 KV heads): each workgroup serves the 4 query heads of
            // a KV head from one read of K and V.
            for keys in [16384, 65536] {
                decode_jobs(
                    &mut jobs,
                    decode_shape(8, [32, 8], keys),
                    &[KernelPath::Fused],
                    gpu,
                );
            }
        }
    }
    let cached: &[usize] = if small_layer {
        &[256, 1024]
    } else {
        &[1024, 4096, 16384, 32768]
    };
    // f16 weights halve the bytes a step streams on a device; a CPU engine
    // computes from f32 weights either way.
    let storages: &[webattn::WeightStorage] = if gpu {
        &[webattn::WeightStorage::F32, webattn::WeightStorage::F16]
    } else {
        &[webattn::WeightStorage::F32]
    };
    for &n in cached {
        jobs.extend(storages.iter().map(|&s| Job::TokenStep(n, s)));
    }
    // The stack of layers whose hidden state stays on the device.
    if gpu {
        for &n in cached {
            jobs.extend(storages.iter().map(|&s| Job::TokenStack(n, s)));
        }
    }
    // The CPU engine's step beside a GPU's (its prefill of the large layer
    // limits it to 1024 cached tokens there).
    if gpu {
        for &n in cached.iter().filter(|&&n| small_layer || n <= 1024) {
            jobs.push(Job::CpuTokenStep(n));
        }
    }
    jobs.push(Job::Overhead);
    // The f64 oracle once, for reference: it is what the CPU backend replaced.
    for causal in [false, true] {
        jobs.push(Job::Attention(
            shape(2048, 64, causal),
            KernelPath::Oracle,
            Precision::Highest,
        ));
    }
    jobs.retain(|job| selected(args, job));
    jobs
}

/// Whether `--only` and `--paths` keep a job (the oracle rows go with the CPU path).
fn selected(args: &Args, job: &Job) -> bool {
    let kind = match job {
        Job::Gemm(..) => RowKind::Gemm,
        Job::Attention(..) => RowKind::Attention,
        Job::Decode(..) => RowKind::Decode,
        Job::TokenStep(..) | Job::CpuTokenStep(..) | Job::TokenStack(..) => RowKind::Tokens,
        Job::Overhead => RowKind::Overhead,
    };
    let path = match *job {
        Job::Attention(_, path, _) | Job::Decode(_, path, _) => Some(path),
        _ => None,
    };
    let path_kept = |path: KernelPath| {
        let path = if path == KernelPath::Oracle {
            KernelPath::Cpu
        } else {
            path
        };
        args.paths.is_empty() || args.paths.iter().any(|p| p.kernel_path() == path)
    };
    // Decode rows go by their key count.
    let keys_kept = match job {
        Job::Decode(shape, ..) => args.seqs.is_empty() || args.seqs.contains(&shape.seq_k),
        _ => true,
    };
    (args.only.is_empty() || args.only.contains(&kind)) && path.is_none_or(path_kept) && keys_kept
}

fn repeats(path: KernelPath, quick: bool) -> Repeats {
    match (path, quick) {
        (KernelPath::Oracle, _) => Repeats {
            warmup: 0,
            timed: 1,
        },
        (KernelPath::Cpu, true) => Repeats {
            warmup: 1,
            timed: 3,
        },
        (_, true) => Repeats {
            warmup: 1,
            timed: 3,
        },
        _ => Repeats {
            warmup: 2,
            timed: 5,
        },
    }
}

pub fn run(engine_args: &super::EngineArgs, args: &Args) -> anyhow::Result<ExitCode> {
    if let (Some(json), Some(out)) = (&args.replot, &args.plot) {
        let text = std::fs::read_to_string(json)
            .with_context(|| format!("cannot read {}", json.display()))?;
        let report: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a bench report", json.display()))?;
        // A CPU engine's report has no ceiling (null): the plot draws none.
        let ceiling = report["fma_ceiling_gflops"].as_f64().unwrap_or(0.0);
        super::files::write_text(out, &plot::attention_svg(&report, ceiling))?;
        return Ok(ExitCode::SUCCESS);
    }
    let engine = super::adapter_engine(engine_args)?;
    let ctx = engine.gpu();
    eprintln!("webattn bench on {}", engine.describe());
    // A CPU adapter (lavapipe) or a CPU engine gets the small decoder layer.
    let small_layer =
        args.quick || ctx.is_none_or(|c| c.capabilities().adapter.device_type == "Cpu");
    let layer = token_layer(small_layer);
    let gpu_scale = ctx.is_some_and(|c| c.capabilities().adapter.device_type != "Cpu");
    let matrix_units =
        ctx.is_some_and(|c| webattn::kernels::matrix_units::coop_shape(c.capabilities()).is_some());
    let jobs = plan(args, ctx.is_some(), gpu_scale, small_layer, matrix_units);
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(jobs.len() as u64 + 4);
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar
    });
    let note = |msg: String| match &bar {
        Some(bar) => {
            bar.set_message(msg);
            bar.inc(1);
        }
        None => eprintln!("{msg}"),
    };
    // Each row's figures as soon as it is measured, so that a run cut short
    // (a time slot on a lent GPU) still leaves them in its log.
    let said = |line: String| match &bar {
        Some(bar) => bar.println(line),
        None => eprintln!("{line}"),
    };

    let ceiling_repeats = Repeats {
        warmup: 2,
        timed: 5,
    };
    note("FMA ceiling".into());
    let first = match ctx {
        Some(ctx) => Some(pollster::block_on(bench::fma_ceiling(ctx, ceiling_repeats))?.1),
        None => None,
    };
    note("bandwidth ceiling".into());
    let copy_first = match ctx {
        Some(ctx) => Some(pollster::block_on(bench::bandwidth_ceiling(
            ctx,
            ceiling_repeats,
        ))?),
        None => None,
    };
    // This machine's speed may drift during a run (a shared VM's did by 30%), so
    // every GEMM and attention measurement is paired with a short FMA-ceiling
    // run just before it and its share is taken against that (decode shares
    // use the bandwidth ceiling's median over the run's two ends). The CPU
    // rows share the host's FMA ceiling, measured the same way just before.
    let adjacent = |path: KernelPath, guarded: &mut GuardTally| -> anyhow::Result<f64> {
        match (ctx, path) {
            (_, KernelPath::Cpu | KernelPath::Oracle) => Ok(bench::host_fma_ceiling(
                engine.cpu_backend().threads(),
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
    };
    // Every measurement's retakes are counted, the ceilings' too.
    let mut guarded = GuardTally::default();
    if let (Some(first), Some(copy)) = (&first, &copy_first) {
        guarded.note(first);
        guarded.note(&copy.measurement);
    }
    let mut gemm = Vec::new();
    let mut attention = Vec::new();
    let mut decode = Vec::new();
    let mut token_steps = Vec::new();
    let mut token_skipped = Vec::new();
    // The CPU engine of the CPU token rows, and the host's copy ceiling they
    // are shared against (measured before the first of them).
    let mut cpu_engine: Option<webattn::Engine> = None;
    let mut stacks: Vec<(
        webattn::WeightStorage,
        Vec<webattn::family::mha::MultiHeadAttention>,
    )> = Vec::new();
    let mut host_copy: Option<bench::Bandwidth> = None;
    let mut overhead: Option<bench::CallOverhead> = None;
    let mut decode_skipped = Vec::new();
    for job in &jobs {
        match *job {
            Job::Gemm(n, precision) => {
                let Some(ctx) = ctx else { continue };
                note(format!("GEMM {n}^3 {}", precision_name(precision)));
                let r = repeats(KernelPath::Fused, args.quick);
                let near = adjacent(KernelPath::Fused, &mut guarded)?;
                let kernel = ctx.gemm_kernel_at(precision);
                // From 1024³ on, the matrix-unit GEMM's other forms beside
                // the one calls take: the packed kernel's other tiles and
                // the staged kernel.
                let mut kernels = vec![kernel];
                if n >= 1024 {
                    kernels.extend(gemm_alternatives(ctx, kernel));
                }
                for kernel in kernels {
                    let (gflops, m) =
                        pollster::block_on(bench::gemm_with(ctx, kernel, n, n, n, r))?;
                    said(format!(
                        "  {}: {:.3} ms, {gflops:.0} GFLOP/s, {:.1}% of the FMA ceiling ({near:.0}){}",
                        kernel.label(),
                        m.median_ms(),
                        100.0 * gflops / near,
                        guard_note(&m)
                    ));
                    guarded.note(&m);
                    gemm.push((n, precision, kernel, gflops, m, near));
                }
            }
            Job::Attention(shape, path, precision) => {
                note(format!(
                    "attention {path} seq {} d{}{} {}",
                    shape.seq_q,
                    shape.head_dim,
                    if shape.causal { " causal" } else { "" },
                    precision_name(precision)
                ));
                let near = adjacent(path, &mut guarded)?;
                let run = bench::AttentionRun {
                    path,
                    precision,
                    cold_cache: false,
                    dtype: DType::F32,
                };
                let m = pollster::block_on(bench::attention_run(
                    &engine,
                    shape,
                    run,
                    repeats(path, args.quick),
                ))
                .with_context(|| format!("attention on the {path} path ({precision})"))?;
                said(format!(
                    "  {:.3} ms, {:.0} GFLOP/s, {:.1}% of the FMA ceiling ({near:.0}){}",
                    m.measurement.median_ms(),
                    m.gflops,
                    100.0 * m.gflops / near,
                    guard_note(&m.measurement)
                ));
                guarded.note(&m.measurement);
                attention.push((shape, path, precision, m, near));
            }
            Job::Decode(shape, path, dtype) => {
                // CPU rows are shared against the host's copy ceiling.
                if path == KernelPath::Cpu && host_copy.is_none() {
                    note("host copy ceiling".into());
                    host_copy = Some(bench::host_bandwidth_ceiling(
                        engine.cpu_backend().threads(),
                        ceiling_repeats,
                    ));
                }
                // The decode kernel the engine runs for this shape, and on a
                // GPU whose choice is the streaming kernel the staged one
                // beside it (pinned), measured the same way.
                let dims = webattn::AttentionDims::plain(
                    shape.batch,
                    [shape.heads, shape.kv_heads],
                    [1, shape.seq_k],
                    [shape.head_dim, shape.head_dim],
                );
                let chosen = match (path, ctx) {
                    (KernelPath::Fused, Some(ctx)) => {
                        ctx.decode_plan(&dims).map(|plan| plan.kernel)
                    }
                    _ => None,
                };
                let mut runs = vec![(chosen, None)];
                if let (Some(DecodeKernel::Stream(_)), Some(ctx)) = (chosen, ctx) {
                    let staged = webattn::Engine::from_context(
                        ctx.clone().with_pinned_decode(DecodeKernel::Staged),
                    );
                    runs.push((Some(DecodeKernel::Staged), Some(staged)));
                }
                for (kernel, pinned) in runs {
                    let label = kernel.map_or_else(|| path.name().to_string(), |k| k.label());
                    note(format!(
                        "decode {path} B{} H{} {} keys {dtype} ({label})",
                        shape.batch,
                        heads_label(&shape),
                        shape.seq_k
                    ));
                    // K and V come from memory, not from the cache the previous
                    // run left them in (GPUs with timestamps; see BENCHMARKS.md).
                    let m = match pollster::block_on(bench::attention_as(
                        pinned.as_ref().unwrap_or(&engine),
                        shape,
                        path,
                        repeats(path, args.quick),
                        true,
                        dtype,
                    )) {
                        Ok(m) => m,
                        // K and V beyond this device's limits (a buffer past
                        // max_buffer_size at 64k keys of 8 x 32 heads) are a
                        // skipped row, not a lost run.
                        Err(
                            e @ (webattn::Error::Limit { .. } | webattn::Error::OutOfMemory(_)),
                        ) => {
                            said(format!("  skipped: {e}"));
                            decode_skipped.push((shape, path, dtype, label, e.to_string()));
                            continue;
                        }
                        Err(e) => {
                            return Err(anyhow::Error::from(e)
                                .context(format!("decode on the {path} path ({dtype}, {label})")))
                        }
                    };
                    let ms = m.measurement.median_ms();
                    said(format!(
                        "  {ms:.3} ms, K and V at {:.0} GB/s{}",
                        shape.kv_bytes_as(dtype) as f64 / (ms * 1e6),
                        guard_note(&m.measurement)
                    ));
                    guarded.note(&m.measurement);
                    decode.push((shape, path, dtype, kernel, m));
                }
            }
            Job::TokenStep(cached, _) | Job::CpuTokenStep(cached) => {
                let (on, storage) = match *job {
                    Job::TokenStep(_, storage) => (&engine, storage),
                    _ => (
                        &*cpu_engine.get_or_insert_with(webattn::Engine::cpu),
                        webattn::WeightStorage::F32,
                    ),
                };
                let label = match on.backend() {
                    webattn::BackendKind::Gpu => "gpu",
                    webattn::BackendKind::Cpu => "cpu",
                };
                if label == "cpu" && host_copy.is_none() {
                    note("host copy ceiling".into());
                    host_copy = Some(bench::host_bandwidth_ceiling(
                        on.cpu_backend().threads(),
                        ceiling_repeats,
                    ));
                }
                note(format!(
                    "token step, {cached} tokens cached, {storage:?} weights, {label} engine"
                ));
                let step = pollster::block_on(bench::token_step(
                    on,
                    layer,
                    cached,
                    storage,
                    repeats(KernelPath::Fused, args.quick),
                ))
                .and_then(|m| {
                    let append = pollster::block_on(bench::kv_append(
                        on,
                        layer,
                        cached,
                        repeats(KernelPath::Fused, args.quick),
                    ))?;
                    Ok((m, append))
                });
                match step {
                    Ok((m, append)) => {
                        said(format!(
                            "  token step {:.3} ms ({} dispatches, {} buffers), append {:.3} ms",
                            m.measurement.median_ms(),
                            m.counts.dispatches,
                            m.counts.buffers,
                            append.median_ms()
                        ));
                        token_steps.push((label, 1, cached, storage, m, Some(append)))
                    }
                    // A cache beyond this device's limits (e.g. under
                    // --limits webgpu-default) is a skipped row, not a lost run.
                    Err(e @ (webattn::Error::Limit { .. } | webattn::Error::OutOfMemory(_))) => {
                        token_skipped.push((cached, e.to_string()))
                    }
                    Err(e) => {
                        return Err(anyhow::Error::from(e)
                            .context(format!("a token step with {cached} tokens cached")))
                    }
                }
            }
            Job::TokenStack(cached, storage) => {
                note(format!(
                    "stack of {STACK_LAYERS} layers, {cached} tokens cached, {storage:?} weights"
                ));
                // One stack per weight storage, kept for every cache length.
                let stack = match stacks.iter().position(|(s, _)| *s == storage) {
                    Some(i) => &stacks[i].1,
                    None => {
                        stacks.push((storage, bench::decoder_stack(layer, STACK_LAYERS, storage)?));
                        &stacks.last().expect("just pushed").1
                    }
                };
                match pollster::block_on(bench::token_stack(
                    &engine,
                    stack,
                    layer,
                    cached,
                    repeats(KernelPath::Fused, args.quick),
                )) {
                    Ok(m) => {
                        said(format!(
                            "  {:.3} ms a token ({} dispatches, {} buffers, {} submissions)",
                            m.measurement.median_ms(),
                            m.counts.dispatches,
                            m.counts.buffers,
                            m.counts.submissions
                        ));
                        token_steps.push(("gpu", STACK_LAYERS, cached, storage, m, None));
                    }
                    Err(e @ (webattn::Error::Limit { .. } | webattn::Error::OutOfMemory(_))) => {
                        token_skipped.push((cached, format!("stack of {STACK_LAYERS}: {e}")))
                    }
                    Err(e) => {
                        return Err(anyhow::Error::from(e).context(format!(
                            "a stack of {STACK_LAYERS} layers with {cached} tokens cached"
                        )))
                    }
                }
            }
            Job::Overhead => {
                note("per-call overhead, B1 H1 N16 d16".into());
                let measured = pollster::block_on(bench::call_overhead(
                    &engine,
                    repeats(KernelPath::Fused, args.quick),
                ))?;
                let of_plain = |m: &Option<bench::Measurement>| {
                    m.as_ref().map_or("-".to_string(), |m| {
                        format!("{:.0}%", 100.0 * m.median_ms() / measured.plain.median_ms())
                    })
                };
                said(format!(
                    "  Engine::attention {:.3} ms, prepared run {:.3} ms, recorded {} and \
                     record alone {} of Engine::attention",
                    measured.plain.median_ms(),
                    measured.prepared.median_ms(),
                    of_plain(&measured.recorded),
                    of_plain(&measured.record_only),
                ));
                overhead = Some(measured);
            }
        }
    }
    note("FMA ceiling, again".into());
    let last = match ctx {
        Some(ctx) => Some(pollster::block_on(bench::fma_ceiling(ctx, ceiling_repeats))?.1),
        None => None,
    };
    note("bandwidth ceiling, again".into());
    let copy_last = match ctx {
        Some(ctx) => Some(pollster::block_on(bench::bandwidth_ceiling(
            ctx,
            ceiling_repeats,
        ))?),
        None => None,
    };
    if let (Some(last), Some(copy)) = (&last, &copy_last) {
        guarded.note(last);
        guarded.note(&copy.measurement);
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // The ceiling is measured at both ends of the run; its median over all
    // samples is what every share refers to (none on a CPU engine).
    let ends = first.as_ref().zip(last.as_ref());
    let ceiling = ends.map_or(f64::NAN, |(first, last)| {
        let mut samples = first.samples_ms.clone();
        samples.extend(&last.samples_ms);
        bench::Measurement {
            samples_ms: samples,
            ..first.clone()
        }
        .gflops(bench::fma_ceiling_flops())
    });
    // The bandwidth ceiling likewise: the median over both ends' samples.
    let copy_ends = copy_first.as_ref().zip(copy_last.as_ref());
    let bandwidth = copy_ends.map_or(f64::NAN, |(first, last)| {
        let mut samples = first.measurement.samples_ms.clone();
        samples.extend(&last.measurement.samples_ms);
        let median = bench::Measurement {
            samples_ms: samples,
            ..first.measurement.clone()
        }
        .median_ms();
        first.bytes_moved as f64 / (median * 1e6)
    });
    let clock = match first.as_ref().map(|m| m.clock) {
        Some(Clock::GpuTimestamps) => "gpu timestamps",
        _ => "wall clock",
    };
    let caps = ctx.map(|c| c.capabilities());
    let cpu = engine.cpu_backend().describe();

    // The table.
    match caps.map(|c| &c.adapter) {
        Some(a) => println!(
            "adapter: {} ({}, {})   timing: {clock}, median of runs after warm-up{}",
            a.name,
            a.backend,
            a.device_type,
            match ctx.map(|c| c.runtime_checks()) {
                Some(webattn::RuntimeChecks::Off) => "   kernels without runtime checks",
                Some(webattn::RuntimeChecks::Bounds) => "   kernels without loop counters",
                _ => "",
            }
        ),
        None => println!(
            "adapter: none (CPU engine)   timing: wall clock, median of runs after warm-up"
        ),
    }
    println!("CPU backend: {cpu}; the f64 oracle timed once (one run) for reference");
    if let Some(ctx) = ctx {
        let (fused, forced) = super::info::fused_kernel(ctx);
        // The f16 rows' kernel where the adapter has matrix units.
        let fast = match ctx.fused_kernel_at(64, 64, Precision::Fast) {
            Ok(kernel) if kernel.name() != fused => {
                format!(", at precision fast {}", kernel.name())
            }
            _ => String::new(),
        };
        println!(
            "fused kernel: {fused}{}{fast}; GEMM: {:?}",
            if forced { " (forced by --kernel)" } else { "" },
            ctx.gemm_kernel()
        );
    }
    if let Some((first, last)) = ends {
        println!(
            "FMA ceiling: {ceiling:.1} GFLOP/s, median of the run's start and end (start {:.1}, end {:.1})",
            first.gflops(bench::fma_ceiling_flops()),
            last.gflops(bench::fma_ceiling_flops())
        );
    }
    if let Some(ctx) = ctx {
        println!(
            "clock guard: {}",
            match (ctx.clock_guard_on(), guarded.retaken, guarded.throttled) {
                (false, ..) if !ctx.capabilities().timestamp_query => {
                    "off (the adapter has no timestamp queries to time a probe)".to_string()
                }
                (false, ..) => "off (--clock-guard on to probe the clocks around each run)".to_string(),
                (true, 0, 0) => "on; every timed run had a fast clock probe on either side".to_string(),
                (true, r, 0) => format!("on; {r} run(s) retaken beside a slow clock probe"),
                (true, r, t) => format!(
                    "on; {r} run(s) retaken beside a slow clock probe, {t} kept with the clocks down (rows marked in the log)"
                ),
            }
        );
    }
    if let Some((first, last)) = copy_ends {
        if first.bytes_moved / 2 < 64 << 20 {
            println!(
                "note: the copy is only {} MiB (the binding limit): caches may hold it, so the \
                 bandwidth ceiling may be a cache's",
                (first.bytes_moved / 2) >> 20
            );
        }
        println!(
            "bandwidth ceiling: {bandwidth:.1} GB/s, a {} MiB vec4 copy (read + write), median of the run's start and end (start {:.1}, end {:.1})",
            (first.bytes_moved / 2) >> 20,
            first.gbs,
            last.gbs
        );
    }
    if let Some(ctx) = ctx {
        for &precision in precisions(matrix_units) {
            if !gemm.iter().any(|row| row.1 == precision) {
                continue;
            }
            println!(
                "\nGEMM ({}; calls take {})",
                match precision {
                    Precision::Highest => "f32",
                    Precision::Fast => "f16 products, f32 sums, on the matrix units",
                },
                ctx.gemm_kernel_at(precision).label()
            );
            println!(
                "{:>6} {:<24} {:>10} {:>10} {:>9} {:>8}",
                "n", "kernel", "ms", "GFLOP/s", "ceiling*", "share"
            );
            for (n, p, kernel, g, m, near) in &gemm {
                if *p == precision {
                    println!(
                        "{n:>6} {:<24} {:>10.2} {g:>10.1} {near:>9.1} {:>7.0}%",
                        kernel.label(),
                        m.median_ms(),
                        100.0 * g / near
                    );
                }
            }
        }
        if matrix_units && !gemm.is_empty() {
            println!("(the share of the matrix-unit rows is of the f32 FMA ceiling: above 100% is what matrix units are for)");
        }
    }
    // GPU ceilings and shares are "-" on the CPU rows.
    let or_dash = |x: f64, text: String| if x.is_finite() { text } else { "-".to_string() };
    if !attention.is_empty() {
        println!("\nattention (B x H = tokens / seq x width / head dim)");
        println!(
            "{:<8} {:>4} {:>5} {:>4} {:>5} {:>4} {:>6} {:>10} {:>9} {:>9} {:>7} {:>10} {:>10}",
            "path",
            "prec",
            "batch",
            "head",
            "seq",
            "d",
            "causal",
            "ms",
            "GFLOP/s",
            "ceiling*",
            "share",
            "peak MiB",
            "vs unfused"
        );
        for (shape, path, precision, m, near) in &attention {
            let unfused = attention
                .iter()
                .find(|(s, p, q, _, _)| s == shape && *p == KernelPath::Unfused && q == precision)
                .map(|(_, _, _, u, _)| u.measurement.median_ms());
            let speedup = unfused
                .map(|u| format!("{:.2}x", u / m.measurement.median_ms()))
                .unwrap_or_default();
            println!(
            "{:<8} {:>4} {:>5} {:>4} {:>5} {:>4} {:>6} {:>10.1} {:>9.1} {:>9} {:>7} {:>10.1} {:>10}",
            path.name(),
            precision_name(*precision),
            shape.batch,
            shape.heads,
            shape.seq_q,
            shape.head_dim,
            if shape.causal { "yes" } else { "no" },
            m.measurement.median_ms(),
            m.gflops,
            or_dash(*near, format!("{near:.1}")),
            or_dash(*near, format!("{:.0}%", 100.0 * m.gflops / near)),
            m.peak_bytes as f64 / f64::from(1 << 20),
            speedup
        );
        }
        println!(
        "* ceiling: the f32 FMA ceiling measured just before the row, the GPU's (the host's for cpu and oracle rows, in the CPU backend's instruction set on its threads; the machine's speed may drift)"
    );
        if matrix_units {
            println!("  prec f16: Precision::Fast, f16 products on the matrix units, f32 sums; vs unfused compares within a precision");
        }
    }
    // Decode is bound by reading K and V: GB/s of K + V, and the share of the
    // copy's bandwidth (GPU rows only).
    let kv_gbs = |shape: &AttentionShape, dtype: DType, m: &bench::AttentionMeasurement| {
        shape.kv_bytes_as(dtype) as f64 / (m.measurement.median_ms() * 1e6)
    };
    let bandwidth_share = |path: KernelPath, gbs: f64| match path {
        KernelPath::Fused | KernelPath::Unfused if bandwidth.is_finite() => gbs / bandwidth,
        KernelPath::Cpu => host_copy.as_ref().map_or(f64::NAN, |c| gbs / c.gbs),
        _ => f64::NAN,
    };
    if !decode.is_empty() || !decode_skipped.is_empty() {
        println!(
        "\ndecode (Nq = 1, d = 128; K and V stored as the dtype; H: query heads, /KV heads where grouped)"
    );
        println!(
            "{:<8} {:<35} {:>9} {:>7} {:>8} {:>10} {:>9} {:>10} {:>9} {:>11}",
            "path",
            "kernel",
            "B x H",
            "dtype",
            "keys",
            "ms",
            "GFLOP/s",
            "K+V GB/s",
            "share**",
            "peak MiB"
        );
        for (shape, path, dtype, kernel, m) in &decode {
            let gbs = kv_gbs(shape, *dtype, m);
            let share = bandwidth_share(*path, gbs);
            println!(
                "{:<8} {:<35} {:>9} {:>7} {:>8} {:>10.2} {:>9.2} {:>10.1} {:>9} {:>11.2}",
                path.name(),
                kernel.map_or_else(|| "-".to_string(), |k| k.label()),
                format!("{}x{}", shape.batch, heads_label(shape)),
                dtype.to_string(),
                shape.seq_k,
                m.measurement.median_ms(),
                m.gflops,
                gbs,
                or_dash(share, format!("{:.0}%", 100.0 * share)),
                m.peak_bytes as f64 / f64::from(1 << 20)
            );
        }
        for (shape, path, dtype, label, why) in &decode_skipped {
            println!(
                "{:<8} {:<35} {:>9} {:>7} {:>8} skipped: {why}",
                path.name(),
                label,
                format!("{}x{}", shape.batch, heads_label(shape)),
                dtype.to_string(),
                shape.seq_k,
            );
        }
    }
    if !decode.is_empty() {
        println!("** share: K + V bytes read per second, over the copy ceiling measured in this run (the GPU's for GPU rows, the host's for cpu rows)");
        if bench::can_flush_caches(&engine) {
            let copied = copy_first
                .as_ref()
                .map_or(bench::COPY_BYTES, |b| b.bytes_moved / 2);
            println!("   each GPU run follows a {} MiB copy, so K and V are read from memory, not from the cache", copied >> 20);
        }
    }

    // A token row's share is of its own engine's memory: the GPU's copy
    // ceiling, or the host's.
    let token_ceiling = |label: &str| match label {
        "cpu" => host_copy.as_ref().map_or(f64::NAN, |c| c.gbs),
        _ => bandwidth,
    };
    if !token_steps.is_empty() || !token_skipped.is_empty() {
        println!(
            "\ntoken step: one decoder layer (d_model {}, {} heads / {} KV heads of {}, RoPE), \
             projections + cache append + attention + output projection, per token (wall clock)",
            layer.d_model(),
            layer.heads,
            layer.kv_heads,
            layer.head_dim
        );
        println!(
            "{:>6} {:>6} {:>8} {:>7} {:>10} {:>9} {:>6} {:>6} {:>6} {:>6} {:>9} {:>8} {:>8} {:>10}",
            "engine",
            "layers",
            "cached",
            "weights",
            "ms/token",
            "tokens/s",
            "disp",
            "copies",
            "bufs",
            "subm",
            "MB/token",
            "GB/s",
            "of copy",
            "append ms"
        );
        for (label, layers, cached, storage, m, append) in &token_steps {
            let ms = m.measurement.median_ms();
            let share = m.gbs() / token_ceiling(label);
            println!(
                "{label:>6} {layers:>6} {cached:>8} {:>7} {ms:>10.3} {:>9.1} {:>6} {:>6} {:>6} {:>6} {:>9.2} {:>8.1} {:>8} {:>10}",
                format!("{storage:?}").to_lowercase(),
                1e3 / ms,
                m.counts.dispatches,
                m.counts.copies,
                m.counts.buffers,
                m.counts.submissions,
                (m.weight_bytes + m.kv_bytes) as f64 / 1e6,
                m.gbs(),
                if share.is_finite() { format!("{:.1}%", 100.0 * share) } else { "-".into() },
                append.as_ref().map_or("-".into(), |a| format!("{:.3}", a.median_ms()))
            );
        }
        println!("layers: one layer, or a stack of {STACK_LAYERS} whose hidden state stays on the device (the token written into its input tensor, every layer's step in one submission, one readback; its counts, MB and share are the whole stack's)");
        println!("disp/copies/bufs/subm: dispatches, buffer-to-buffer copies, buffers created and submissions of the last timed token; MB/token: weights (as stored) + the cached K and V the step reads; of copy: share of the copy ceiling measured in this run (the GPU's for gpu rows, the host's for cpu rows)");
        if let Some(copy) = &host_copy {
            println!(
                "host copy ceiling: {:.1} GB/s, a {} MiB copy (read + write) on {} threads",
                copy.gbs,
                copy.bytes_moved >> 21,
                cpu_engine
                    .as_ref()
                    .unwrap_or(&engine)
                    .cpu_backend()
                    .threads()
            );
        }
        println!("cache append: one token's keys and values copied into the preallocated cache, until the device is done (wall clock)");
        for (cached, why) in &token_skipped {
            println!("{cached:>8} skipped: {why}");
        }
    }
    if let Some(o) = &overhead {
        println!(
            "\nper-call host overhead at B1 H1 N16 d16 (host time to issue a call, inputs on \
             the device, no readback; median of {} samples of 20 calls, the kinds taking turns)",
            o.plain.samples_ms.len()
        );
        println!("{:<50} {:>9} {:>21}", "call", "ms", "of Engine::attention");
        let rows = [
            ("Engine::attention", Some(&o.plain)),
            (
                "PreparedAttention::run (one submission a call)",
                Some(&o.prepared),
            ),
            (
                "record, 20 calls into one encoder, submitted once",
                o.recorded.as_ref(),
            ),
            ("record alone (the caller submits)", o.record_only.as_ref()),
            (
                "an empty submission (the adapter's floor)",
                o.empty_submit.as_ref(),
            ),
        ];
        for (name, m) in rows {
            if let Some(m) = m {
                let ms = m.median_ms();
                let share = 100.0 * ms / o.plain.median_ms();
                println!("{name:<50} {ms:>9.4} {share:>20.0}%");
            }
        }
    }

    let finite = |x: f64| x.is_finite().then_some(x);
    let json = json!({
        "adapter": caps.map(|c| &c.adapter).map(|a| json!({"name": a.name, "backend": a.backend, "device_type": a.device_type, "driver": a.driver, "driver_info": a.driver_info})),
        "cpu_backend": cpu,
        "clock": clock,
        "quick": args.quick,
        "tokens": args.tokens,
        "width": args.width,
        "fma_ceiling_gflops": finite(ceiling),
        "fma_ceiling_start_gflops": first.as_ref().map(|m| m.gflops(bench::fma_ceiling_flops())),
        "fma_ceiling_end_gflops": last.as_ref().map(|m| m.gflops(bench::fma_ceiling_flops())),
        "bandwidth_ceiling_gbs": finite(bandwidth),
        "bandwidth_ceiling_start_gbs": copy_first.as_ref().map(|b| b.gbs),
        "bandwidth_ceiling_end_gbs": copy_last.as_ref().map(|b| b.gbs),
        "bandwidth_copy_bytes": copy_first.as_ref().map(|b| b.bytes_moved / 2),
        "gemm_kernel": ctx.map(|c| format!("{:?}", c.gemm_kernel())),
        "fused_kernel": ctx.map(|c| super::info::fused_kernel(c).0),
        "fused_kernel_forced": ctx.map(|c| super::info::fused_kernel(c).1),
        "runtime_checks": ctx.map(|c| c.runtime_checks().name()),
        "clock_guard": ctx.map(|c| c.clock_guard_on()),
        "retaken_runs": guarded.retaken,
        "throttled_runs": guarded.throttled,
        "matrix_units": ctx.and_then(|c| webattn::kernels::matrix_units::coop_shape(c.capabilities())).map(|s| format!("{n}x{n}x{n} f16 -> f32, subgroups of {}", s.subgroup, n = s.size.dim())),
        "gemm": gemm.iter().map(|(n, p, kernel, g, m, near)| json!({"m": n, "n": n, "k": n, "precision": p.name(), "kernel": format!("{kernel:?}"), "kernel_name": kernel.label(), "default_kernel": ctx.is_some_and(|c| c.gemm_kernel_at(*p) == *kernel), "ms": m.median_ms(), "min_ms": m.min_ms(), "samples_ms": m.samples_ms, "retaken": m.retaken, "throttled": m.throttled, "gflops": g, "share_of_ceiling": g / near, "adjacent_ceiling_gflops": near})).collect::<Vec<_>>(),
        "attention": attention.iter().map(|(s, p, q, m, near)| json!({
            "path": p.name(), "precision": q.name(), "batch": s.batch, "heads": s.heads, "seq_q": s.seq_q, "seq_k": s.seq_k,
            "head_dim": s.head_dim, "causal": s.causal, "ms": m.measurement.median_ms(),
            "samples_ms": m.measurement.samples_ms, "min_ms": m.measurement.min_ms(),
            "retaken": m.measurement.retaken, "throttled": m.measurement.throttled, "gflops": m.gflops,
            "share_of_ceiling": finite(m.gflops / near), "adjacent_ceiling_gflops": finite(*near), "peak_bytes": m.peak_bytes,
            "plan": (!m.plan.is_empty()).then_some(&m.plan),
        })).collect::<Vec<_>>(),
        "decode": decode.iter().map(|(s, p, d, k, m)| json!({
            "path": p.name(), "kernel": k.map(|k| k.label()), "batch": s.batch, "seq_k": s.seq_k, "head_dim": s.head_dim,
            "heads": s.heads, "kv_heads": s.kv_heads, "dtype": d.to_string(),
            "ms": m.measurement.median_ms(), "min_ms": m.measurement.min_ms(),
            "samples_ms": m.measurement.samples_ms, "retaken": m.measurement.retaken,
            "throttled": m.measurement.throttled, "gflops": m.gflops, "peak_bytes": m.peak_bytes,
            "kv_bytes": s.kv_bytes_as(*d), "kv_gbs": kv_gbs(s, *d, m),
            "share_of_bandwidth": finite(bandwidth_share(*p, kv_gbs(s, *d, m))),
            "cold_cache": bench::can_flush_caches(&engine) && *p != KernelPath::Cpu,
        })).collect::<Vec<_>>(),
        "host_copy_gbs": host_copy.as_ref().map(|c| c.gbs),
        "token_step": token_steps.iter().map(|(label, layers, cached, storage, m, append)| json!({
            "engine": label, "layers": layers, "d_model": layer.d_model(), "heads": layer.heads, "kv_heads": layer.kv_heads,
            "head_dim": layer.head_dim, "cached": cached, "weights": format!("{storage:?}").to_lowercase(),
            "ms": m.measurement.median_ms(), "samples_ms": m.measurement.samples_ms,
            "dispatches": m.counts.dispatches, "copies": m.counts.copies, "buffers_created": m.counts.buffers,
            "submissions": m.counts.submissions, "queue_writes": m.counts.writes, "weight_bytes": m.weight_bytes, "kv_bytes": m.kv_bytes,
            "gbs": m.gbs(), "share_of_bandwidth": finite(m.gbs() / token_ceiling(label)),
            "append_ms": append.as_ref().map(|a| a.median_ms()),
            "append_samples_ms": append.as_ref().map(|a| &a.samples_ms),
        })).collect::<Vec<_>>(),
        "call_overhead": overhead.as_ref().map(|o| json!({
            "shape": [1, 1, 16, 16], "attention_ms": o.plain.median_ms(), "prepared_ms": o.prepared.median_ms(),
            "recorded_ms": o.recorded.as_ref().map(|m| m.median_ms()),
            "record_only_ms": o.record_only.as_ref().map(|m| m.median_ms()),
            "empty_submit_ms": o.empty_submit.as_ref().map(|m| m.median_ms()),
            "attention_samples_ms": o.plain.samples_ms, "prepared_samples_ms": o.prepared.samples_ms,
            "recorded_samples_ms": o.recorded.as_ref().map(|m| &m.samples_ms),
            "record_only_samples_ms": o.record_only.as_ref().map(|m| &m.samples_ms),
            "empty_submit_samples_ms": o.empty_submit.as_ref().map(|m| &m.samples_ms),
        })),
        "decode_skipped": decode_skipped.iter().map(|(s, p, d, label, why)| json!({
            "path": p.name(), "kernel": label, "batch": s.batch, "heads": s.heads, "kv_heads": s.kv_heads, "seq_k": s.seq_k,
            "head_dim": s.head_dim, "dtype": d.to_string(), "reason": why,
        })).collect::<Vec<_>>(),
        "token_step_skipped": token_skipped.iter().map(|(cached, why)| json!({
            "cached": cached, "reason": why,
        })).collect::<Vec<_>>(),
    });
    if let Some(path) = &args.json {
        super::files::write_text(path, &serde_json::to_string_pretty(&json)?)?;
    }
    if let Some(path) = &args.plot {
        super::files::write_text(
            path,
            &plot::attention_svg(&json, finite(ceiling).unwrap_or(0.0)),
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the clock guard retook or kept throttled, over a whole bench run.
#[derive(Debug, Default)]
struct GuardTally {
    retaken: usize,
    throttled: usize,
}

impl GuardTally {
    fn note(&mut self, m: &bench::Measurement) {
        self.retaken += m.retaken;
        self.throttled += m.throttled;
    }
}

/// What a row's line adds where the clock guard retook runs or kept
/// throttled ones ([`bench::clock_guard`]); empty otherwise.
fn guard_note(m: &bench::Measurement) -> String {
    match (m.retaken, m.throttled) {
        (0, 0) => String::new(),
        (r, 0) => format!(" (retook {r} run(s): the clock probe beside them read slow)"),
        (r, t) => format!(
            " (retook {r} run(s); {t} of the timed runs had the clocks down: the median may be slow)"
        ),
    }
}

/// The precision column's text: `f32`, or `f16` for f16 products.
fn precision_name(precision: Precision) -> &'static str {
    match precision {
        Precision::Highest => "f32",
        Precision::Fast => "f16",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Args {
        Args {
            quick: false,
            json: None,
            plot: None,
            tokens: 16384,
            width: 2048,
            only: Vec::new(),
            seqs: Vec::new(),
            head_dims: Vec::new(),
            paths: Vec::new(),
            replot: None,
        }
    }

    #[test]
    fn only_paths_seqs_and_head_dims_narrow_the_plan() {
        let mut a = args();
        a.only = vec![RowKind::Attention];
        a.paths = vec![BenchPath::Fused];
        a.seqs = vec![2048];
        a.head_dims = vec![64];
        let jobs = plan(&a, true, true, false, false);
        assert_eq!(jobs.len(), 2, "causal and not");
        assert!(jobs.iter().all(|j| matches!(
            j,
            Job::Attention(s, KernelPath::Fused, _) if s.seq_q == 2048 && s.head_dim == 64
        )));
        a.only = vec![RowKind::Decode];
        a.seqs = vec![16384];
        let jobs = plan(&a, true, true, false, false);
        assert!(!jobs.is_empty());
        assert!(jobs
            .iter()
            .all(|j| matches!(j, Job::Decode(s, ..) if s.seq_k == 16384)));
        assert!(jobs
            .iter()
            .all(|j| matches!(j, Job::Decode(_, KernelPath::Fused, _))));
        // At GPU scale, grouped queries beside the MHA rows: K and V count
        // the KV heads only.
        let grouped: Vec<&AttentionShape> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Decode(s, ..) if s.kv_heads < s.heads => Some(s),
                _ => None,
            })
            .collect();
        assert!(!grouped.is_empty());
        for s in grouped {
            assert_eq!((s.heads, s.kv_heads), (32, 8));
            assert_eq!(heads_label(s), "32/8");
            assert_eq!(s.kv_bytes(), 2 * 4 * (s.batch * 8 * s.seq_k * 128) as u64);
        }
    }

    fn attention_seqs(jobs: &[Job], path: KernelPath) -> Vec<usize> {
        let mut seqs: Vec<usize> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Attention(shape, p, Precision::Highest) if *p == path => Some(shape.seq_q),
                _ => None,
            })
            .collect();
        seqs.dedup();
        seqs.sort();
        seqs.dedup();
        seqs
    }

    #[test]
    fn a_gpu_runs_flash_attention_shapes_and_gemm_to_8192() {
        let jobs = plan(&args(), true, true, false, false);
        assert_eq!(
            attention_seqs(&jobs, KernelPath::Fused),
            [512, 1024, 2048, 4096, 8192, 16384]
        );
        assert_eq!(
            attention_seqs(&jobs, KernelPath::Unfused).last(),
            Some(&16384)
        );
        assert_eq!(
            attention_seqs(&jobs, KernelPath::Cpu).last(),
            Some(&CPU_ROWS_MAX_SEQ)
        );
        assert!(jobs.iter().any(|j| matches!(j, Job::Gemm(8192, _))));
        assert!(!jobs.iter().any(|j| matches!(
            j,
            Job::Gemm(_, Precision::Fast) | Job::Attention(_, _, Precision::Fast)
        )));
    }

    #[test]
    fn matrix_units_add_f16_gemm_and_gpu_attention_rows() {
        let jobs = plan(&args(), true, true, false, true);
        assert!(jobs
            .iter()
            .any(|j| matches!(j, Job::Gemm(8192, Precision::Fast))));
        let fast_paths: Vec<KernelPath> = jobs
            .iter()
            .filter_map(|j| match j {
                Job::Attention(_, p, Precision::Fast) => Some(*p),
                _ => None,
            })
            .collect();
        assert!(
            fast_paths.contains(&KernelPath::Fused) && fast_paths.contains(&KernelPath::Unfused)
        );
        assert!(!fast_paths
            .iter()
            .any(|p| matches!(p, KernelPath::Cpu | KernelPath::Oracle)));
    }

    #[test]
    fn a_cpu_adapter_keeps_the_short_range() {
        let jobs = plan(&args(), true, false, true, false);
        assert_eq!(attention_seqs(&jobs, KernelPath::Fused).last(), Some(&4096));
        assert!(!jobs
            .iter()
            .any(|j| matches!(j, Job::Gemm(n, _) if *n > 2048)));
    }
}
