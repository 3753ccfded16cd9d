//! `webattn bench`: the FMA and bandwidth ceilings, GEMM, attention on every
//! path, decode, and a decoder layer's token step, measured side by side in one
//! run; a table, JSON, and an optional SVG plot.
//! The `cpu` rows are the fast CPU backend; the f64 oracle is timed once at
//! seq 2048 (causal and not) for reference. On a CPU engine only the CPU rows run.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use indicatif::ProgressBar;
use serde_json::Value;
use webattn::kernels::gemm::packed as gemm_packed;
use webattn::kernels::gemm::{GemmKernel, PackedTile};
use webattn::measure as bench;
use webattn::measure::{AttentionShape, Repeats};
use webattn::{DType, KernelPath, Precision};

use self::ceilings::{Ceilings, End};
use self::report::Report;
use super::plot;

mod ceilings;
mod report;
mod rows;
mod table;

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
    /// Attention, backward and oracle rows at these sequence lengths, decode
    /// rows at these key counts (comma-separated; default: the run's range,
    /// `--quick`'s included).
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
    /// The backward pass beside its forward, 1k to 16k tokens (GPU) or up
    /// to 1k (a CPU adapter, a CPU engine): time, share of the FMA ceiling,
    /// workspace bytes.
    Backward,
    /// Decoding steps from a paged KV cache with f32, f16 and int8 pages
    /// (the engine's pages, and the CPU backend's host pages beside a GPU's):
    /// ms, bytes per token, share of the copy ceiling.
    Paged,
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
    /// The forward and the backward of a shape on a path, side by side.
    Backward(AttentionShape, KernelPath),
    /// Decoding steps from paged caches storing f32, f16 and int8 pages,
    /// interleaved, on the run's engine (`Fused`: its device pages) or a CPU
    /// engine (`Cpu`: host pages).
    Paged(bench::paged::PagedDecodeShape, KernelPath),
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
    // `--seqs` names the attention rows' lengths and the decode rows' key
    // counts, in a quick run too (a functional check at a small size).
    let given = |default: &[usize]| -> Vec<usize> {
        if args.seqs.is_empty() {
            default.to_vec()
        } else {
            args.seqs.clone()
        }
    };
    if args.quick {
        for causal in [false, true] {
            for seq in given(&[2048]) {
                for &path in paths {
                    attention(&mut jobs, shape(seq, 64, causal), path);
                }
            }
        }
        for keys in given(&[4096, 8192]) {
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
        for keys in given(&[4096, 8192, 16384, 32768]) {
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
    // The backward beside its forward (the attention rows' shapes, d 64);
    // its workspace grows linearly with the sequence.
    let backward_seqs = given(match (args.quick, gpu_scale) {
        (true, false) => &[512],
        (true, true) => &[1024, 4096],
        (false, false) => &[256, 512, 1024],
        (false, true) => &[1024, 2048, 4096, 8192, 16384],
    });
    for seq in backward_seqs {
        for causal in [false, true] {
            if gpu {
                jobs.push(Job::Backward(shape(seq, 64, causal), KernelPath::Fused));
            }
            if !gpu_scale || seq <= CPU_ROWS_MAX_SEQ {
                jobs.push(Job::Backward(shape(seq, 64, causal), KernelPath::Cpu));
            }
        }
    }
    // Decoding steps from a paged cache, its pages in each storage: the
    // engine's pages, and the CPU backend's host pages beside a GPU's.
    let paged_cached = given(if args.quick { &[4096] } else { &[4096, 32768] });
    for cached in paged_cached {
        let shape = bench::paged::PagedDecodeShape {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            cached,
            page_size: 16,
        };
        if gpu {
            jobs.push(Job::Paged(shape, KernelPath::Fused));
        }
        jobs.push(Job::Paged(shape, KernelPath::Cpu));
    }
    // The f64 oracle once, for reference: it is what the CPU backend replaced.
    let oracle_seq = given(&[2048]).into_iter().min().unwrap_or(2048);
    for causal in [false, true] {
        jobs.push(Job::Attention(
            shape(oracle_seq, 64, causal),
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
        Job::Backward(..) => RowKind::Backward,
        Job::Paged(..) => RowKind::Paged,
    };
    let path = match *job {
        Job::Attention(_, path, _)
        | Job::Decode(_, path, _)
        | Job::Backward(_, path)
        | Job::Paged(_, path) => Some(path),
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
        Job::Paged(shape, ..) => args.seqs.is_empty() || args.seqs.contains(&shape.cached),
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

/// A run's engine, arguments and progress: what measuring and reporting its
/// rows need.
struct Setting<'a> {
    engine: &'a webattn::Engine,
    /// The engine's GPU (none on a CPU engine).
    ctx: Option<&'a webattn::GpuContext>,
    args: &'a Args,
    /// The decoder layer of the token rows.
    layer: bench::DecoderLayerShape,
    /// Whether the adapter has matrix units (the rows at `Precision::Fast`).
    matrix_units: bool,
    progress: Progress,
}

/// Progress on stderr: a bar on a terminal, lines otherwise.
struct Progress(Option<ProgressBar>);

impl Progress {
    /// One step begun: the bar's message and count, or a line.
    fn note(&self, msg: String) {
        match &self.0 {
            Some(bar) => {
                bar.set_message(msg);
                bar.inc(1);
            }
            None => eprintln!("{msg}"),
        }
    }

    /// A row's figures as soon as it is measured, so that a run cut short
    /// (a time slot on a lent GPU) still leaves them in its log.
    fn said(&self, line: String) {
        match &self.0 {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Clears the bar, if any.
    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// Runs `webattn bench`: the ceilings at both ends, the planned rows between
/// them, then the table, the JSON and the plot (or only `--replot`'s plot).
pub fn run(engine_args: &super::EngineArgs, args: &Args) -> anyhow::Result<ExitCode> {
    if let (Some(json), Some(out)) = (&args.replot, &args.plot) {
        return replot(json, out);
    }
    let engine = super::adapter_engine(engine_args)?;
    let ctx = engine.gpu();
    eprintln!("webattn bench on {}", engine.describe());
    // A CPU adapter (lavapipe) or a CPU engine gets the small decoder layer.
    let small_layer =
        args.quick || ctx.is_none_or(|c| c.capabilities().adapter.device_type == "Cpu");
    let gpu_scale = ctx.is_some_and(|c| c.capabilities().adapter.device_type != "Cpu");
    let matrix_units =
        ctx.is_some_and(|c| webattn::kernels::matrix_units::coop_shape(c.capabilities()).is_some());
    let jobs = plan(args, ctx.is_some(), gpu_scale, small_layer, matrix_units);
    let setting = Setting {
        engine: &engine,
        ctx,
        args,
        layer: token_layer(small_layer),
        matrix_units,
        progress: Progress(super::progress::progress_bar(jobs.len() + 4)),
    };

    let start = End::measure(&setting, "")?;
    // Every measurement's retakes are counted, the ceilings' too.
    let mut guarded = GuardTally::default();
    start.tally(&mut guarded);
    let mut rows = rows::measure(&setting, &jobs, guarded)?;
    let end = End::measure(&setting, ", again")?;
    end.tally(&mut rows.guarded);
    setting.progress.finish();
    let ceilings = Ceilings::over(start, end);

    let report = Report {
        setting: &setting,
        rows: &rows,
        ceilings: &ceilings,
        cpu: engine.cpu_backend().describe(),
    };
    report.print_table();
    let json = report.json();
    if let Some(path) = &args.json {
        super::files::write_text(path, &serde_json::to_string_pretty(&json)?)?;
    }
    if let Some(path) = &args.plot {
        super::files::write_text(
            path,
            &plot::attention_svg(&json, report::finite(ceilings.fma).unwrap_or(0.0)),
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--replot`: draws the plot of an earlier run's JSON report, measuring
/// nothing.
fn replot(json: &Path, out: &Path) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(json).with_context(|| format!("cannot read {}", json.display()))?;
    let report: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a bench report", json.display()))?;
    // A CPU engine's report has no ceiling (null): the plot draws none.
    let ceiling = report["fma_ceiling_gflops"].as_f64().unwrap_or(0.0);
    super::files::write_text(out, &plot::attention_svg(&report, ceiling))?;
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

/// The GEMM kernel calls at `precision` take on `engine` (the tiled kernel on
/// a CPU engine, which has none).
fn gemm_at(engine: &webattn::Engine, precision: Precision) -> webattn::kernels::gemm::GemmKernel {
    engine
        .planner(0, 0)
        .map_or(webattn::kernels::gemm::GemmKernel::Tiled, |p| {
            p.gemm_kernel_at(precision)
        })
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

    #[test]
    fn paged_rows_step_every_storage_on_the_engine_and_the_cpu_backend() {
        let mut a = args();
        a.only = vec![RowKind::Paged];
        let jobs = plan(&a, true, true, false, false);
        let cached: Vec<(usize, KernelPath)> = jobs
            .iter()
            .map(|j| match j {
                Job::Paged(s, path) => (s.cached, *path),
                _ => panic!("only paged rows"),
            })
            .collect();
        assert_eq!(
            cached,
            [
                (4096, KernelPath::Fused),
                (4096, KernelPath::Cpu),
                (32768, KernelPath::Fused),
                (32768, KernelPath::Cpu)
            ]
        );
        // A CPU engine steps its host pages alone.
        let jobs = plan(&a, false, false, false, false);
        assert!(jobs
            .iter()
            .all(|j| matches!(j, Job::Paged(_, KernelPath::Cpu))));
    }

    #[test]
    fn a_quick_run_takes_its_lengths_from_seqs() {
        let mut a = args();
        a.quick = true;
        a.seqs = vec![256];
        let jobs = plan(&a, true, false, true, false);
        for path in [KernelPath::Fused, KernelPath::Cpu, KernelPath::Oracle] {
            assert_eq!(attention_seqs(&jobs, path), [256], "{path:?}");
        }
        assert!(jobs.iter().any(|j| matches!(j, Job::Decode(..))));
        assert!(jobs.iter().all(|j| match j {
            Job::Decode(s, ..) => s.seq_k == 256,
            Job::Backward(s, _) => s.seq_q == 256,
            _ => true,
        }));
        assert!(jobs.iter().any(|j| matches!(j, Job::Backward(..))));
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
