//! `webattn phases`: where a kernel's time goes. The fused kernel a call
//! takes, and the decode kernel, are timed whole, then without each phase of
//! their key loop in turn (K/V loads, S = Q K^T, the softmax, O += P V), then
//! with all four removed (the loop's skeleton: barriers, staging stores, Q's
//! block, the writes), in one run beside the FMA and copy ceilings. The
//! variants compute garbage by design (`webattn::kernels::ablation`); only their
//! times are kept.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use indicatif::ProgressBar;
use serde_json::json;
use webattn::kernels::ablation::{has_phase_switches, Phases};
use webattn::kernels::attention::FusedKernel;
use webattn::measure as bench;
use webattn::measure::{AttentionRun, AttentionShape, Repeats};
use webattn::plan::{CallPlan, GpuRoute};
use webattn::{DType, KernelPath, Precision};

/// Arguments of `webattn phases`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Sequence length (queries = keys). Default: 4096 on a GPU, 256 on a
    /// CPU adapter.
    #[arg(long, value_name = "N")]
    seq: Option<usize>,
    /// Head dims, comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "D,...", default_values = ["64", "128"])]
    head_dims: Vec<usize>,
    /// Tokens (batch x seq), as FlashAttention's benchmark fixes them.
    /// Default: 16384 on a GPU, 1024 on a CPU adapter.
    #[arg(long, value_name = "N")]
    tokens: Option<usize>,
    /// Model width; heads = width / head dim. Default: 2048 on a GPU, 256 on
    /// a CPU adapter.
    #[arg(long, value_name = "N")]
    width: Option<usize>,
    /// Causal rows too (non-causal only by default).
    #[arg(long)]
    causal: bool,
    /// Decode rows at these key counts (one query row per head, d 128, K and
    /// V as f32 and as f16). Default: 16384 keys for B 8 x H 32 on a GPU,
    /// 2048 for B 1 x H 8 on a CPU adapter.
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    decode_keys: Vec<usize>,
    /// Only these kinds of rows (comma-separated; default both).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "KIND,...")]
    only: Vec<Kind>,
    /// One warm-up and three timed runs per variant (two and five otherwise).
    #[arg(long)]
    quick: bool,
    /// Write the results as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

/// The kinds of rows.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The fused kernel on prefill shapes (Nq = Nk).
    Fused,
    /// The decode kernel: one query row per head against many keys.
    Decode,
}

/// One variant's time.
struct Variant {
    removed: Phases,
    ms: f64,
    /// Runs the clock guard retook, and kept with the clocks down.
    retaken: usize,
    throttled: usize,
}

/// One shape at one precision and K/V type, the context its calls run on
/// and the kernel they take; once measured, its variants (the first is the
/// whole kernel).
struct Row {
    kind: Kind,
    precision: Precision,
    dtype: DType,
    shape: AttentionShape,
    base: webattn::Engine,
    /// The kernel with its tiles.
    kernel: String,
    /// The row's call as `attention` plans it, in one line.
    plan: String,
    /// The kernel whose pipelines without a phase the row must run.
    expected: webattn::shader::kernel::Kernel,
    variants: Vec<Variant>,
}

/// The variants timed per shape: the whole kernel, each phase removed, all.
fn variants() -> Vec<Phases> {
    let mut all = vec![Phases::NONE];
    all.extend(Phases::EACH);
    all.push(Phases::ALL);
    all
}

/// What the run's rows depend on beside the arguments: the adapter's kind,
/// the shapes' defaults, and how often each variant runs.
struct Setting {
    cpu_adapter: bool,
    seq: usize,
    tokens: usize,
    width: usize,
    matrix_units: bool,
    repeats: Repeats,
    /// The f16 rows run the matrix-unit kernel forced (see [`base_engine`]).
    forced_coop: bool,
}

/// The FMA ceiling (GFLOP/s) and, where a decode row needs it, the copy
/// ceiling (GB/s), both measured in this run.
struct Ceilings {
    fma: f64,
    bandwidth: Option<f64>,
}

/// Runs `webattn phases`: plans the rows, measures the ceilings and each
/// row's variants, then prints the table and writes the JSON.
pub fn run(engine_args: &super::EngineArgs, args: &Args) -> anyhow::Result<ExitCode> {
    let engine = super::adapter_engine(engine_args)?;
    let ctx = engine
        .gpu()
        .context("webattn phases measures a GPU's kernels; this engine runs on the CPU")?;
    eprintln!("webattn phases on {}", engine.describe());
    let setting = setting(engine_args, args, ctx)?;
    // Rows whose kernel has no phase switches (an f32 row on an adapter whose
    // fused kernel is attention_sg, a decode row the staged kernel takes) are
    // left out, and said so.
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    fused_rows(&engine, args, &setting, &mut rows, &mut skipped)?;
    decode_rows(&engine, args, setting.cpu_adapter, &mut rows, &mut skipped)?;
    anyhow::ensure!(
        !rows.is_empty(),
        "no kernel here has phase switches ({}): only the register-tiled and matrix-unit \
         fused kernels and the streaming decode kernel do (pass --kernel attention_tiled, say)",
        skipped.join("; ")
    );
    let bar = super::progress::progress_bar(rows.len() + 2);
    let ceiling_repeats = Repeats {
        warmup: 2,
        timed: 5,
    };
    note(&bar, "FMA ceiling".into());
    let fma = pollster::block_on(bench::fma_ceiling(ctx, ceiling_repeats))?.0;
    note(&bar, "bandwidth ceiling".into());
    let bandwidth = if rows.iter().any(|r| r.kind == Kind::Decode) {
        Some(pollster::block_on(bench::bandwidth_ceiling(ctx, ceiling_repeats))?.gbs)
    } else {
        None
    };
    let ceilings = Ceilings { fma, bandwidth };
    for row in &mut rows {
        measure_row(ctx, row, setting.repeats, &bar)?;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }

    print_summary(ctx, &rows, &skipped, &ceilings, setting.forced_coop);
    for row in &rows {
        print_row(row, &ceilings);
    }
    let json = report_json(ctx, &rows, &skipped, &ceilings);
    if let Some(path) = &args.json {
        super::files::write_text(path, &serde_json::to_string_pretty(&json)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The run's [`Setting`]: the arguments' values, or the defaults for a GPU
/// or a CPU adapter.
fn setting(
    engine_args: &super::EngineArgs,
    args: &Args,
    ctx: &webattn::GpuContext,
) -> anyhow::Result<Setting> {
    let cpu_adapter = ctx.capabilities().adapter.device_type == "Cpu";
    let seq = args.seq.unwrap_or(if cpu_adapter { 256 } else { 4096 });
    anyhow::ensure!(seq > 0, "--seq must be at least 1");
    let tokens = args
        .tokens
        .unwrap_or(if cpu_adapter { 1024 } else { 16384 });
    let width = args.width.unwrap_or(if cpu_adapter { 256 } else { 2048 });
    let matrix_units = webattn::kernels::matrix_units::coop_shape(ctx.capabilities()).is_some();
    let repeats = if args.quick {
        Repeats {
            warmup: 1,
            timed: 3,
        }
    } else {
        Repeats {
            warmup: 2,
            timed: 5,
        }
    };
    Ok(Setting {
        cpu_adapter,
        seq,
        tokens,
        width,
        matrix_units,
        repeats,
        forced_coop: matrix_units && engine_args.kernel == webattn::FusedKernelChoice::Auto,
    })
}

/// Whether `--only` keeps the rows of `kind`.
fn wanted(args: &Args, kind: Kind) -> bool {
    args.only.is_empty() || args.only.contains(&kind)
}

/// The context a precision's rows run on: at fast, the matrix-unit kernel
/// forced under auto (calls at fast take the f32 kernel where `webattn tune`
/// measured it slower, and its phases are the question).
fn base_engine(
    engine: &webattn::Engine,
    precision: Precision,
    forced_coop: bool,
) -> webattn::Result<webattn::Engine> {
    let shared = engine.sharing_device().ok_or(webattn::Error::Conflict(
        "webattn phases needs a GPU engine",
    ))?;
    if precision == Precision::Fast && forced_coop {
        shared.with_fused_kernel(webattn::FusedKernelChoice::Coop)
    } else {
        Ok(shared)
    }
}

/// The fused kernel's rows (prefill shapes, Nq = Nk) at each precision, head
/// dim and causality: into `rows` where the kernel has phase switches, into
/// `skipped` (with the reason) where not.
fn fused_rows(
    engine: &webattn::Engine,
    args: &Args,
    setting: &Setting,
    rows: &mut Vec<Row>,
    skipped: &mut Vec<String>,
) -> anyhow::Result<()> {
    let causal: &[bool] = if args.causal {
        &[false, true]
    } else {
        &[false]
    };
    let fused_precisions: &[Precision] = if wanted(args, Kind::Fused) {
        super::bench::precisions(setting.matrix_units)
    } else {
        &[]
    };
    let seq = setting.seq;
    for &precision in fused_precisions {
        for &head_dim in &args.head_dims {
            anyhow::ensure!(head_dim > 0, "a head dim of 0 has no kernel");
            for &causal in causal {
                let shape = AttentionShape {
                    batch: (setting.tokens / seq).max(1),
                    heads: (setting.width / head_dim).max(1),
                    kv_heads: (setting.width / head_dim).max(1),
                    seq_q: seq,
                    seq_k: seq,
                    head_dim,
                    causal,
                };
                let base = base_engine(engine, precision, setting.forced_coop)?;
                let what = format!("{} d {head_dim}", precision_label(precision));
                match fused_row(base, shape, precision) {
                    Ok(row) => rows.push(row),
                    Err(why) => skipped.push(format!("{what}: {why}")),
                }
            }
        }
    }
    Ok(())
}

/// The fused row of `shape` at `precision` on `base`, planned as `attention`
/// plans it; why not where its kernel has no phase switches.
fn fused_row(
    base: webattn::Engine,
    shape: AttentionShape,
    precision: Precision,
) -> Result<Row, String> {
    // The row's call as `attention` plans it (the plan it prints).
    let dims = webattn::AttentionDims::plain(
        shape.batch,
        [shape.heads, shape.kv_heads],
        [shape.seq_q, shape.seq_k],
        [shape.head_dim, shape.head_dim],
    );
    let options = webattn::AttentionOptions {
        path: KernelPath::Fused,
        precision,
        is_causal: shape.causal,
        ..Default::default()
    };
    let plan = base.plan(&dims, &options);
    let expected = match &plan {
        Ok(CallPlan {
            gpu: Some(GpuRoute::Fused { kernel, .. }),
            ..
        }) => match kernel {
            // At fast, the matrix-unit kernel only (an f32 kernel
            // forced by --kernel would repeat the f32 row).
            FusedKernel::Coop(tiles) => Ok((tiles.key().kernel, kernel.label())),
            kernel if precision == Precision::Fast => {
                Err(format!("{} is not the matrix-unit kernel", kernel.label()))
            }
            FusedKernel::Tiled(tiles) => Ok((tiles.key().kernel, kernel.label())),
            kernel => Err(format!("{} has no phase switches", kernel.label())),
        },
        Ok(other) => Err(format!("planned {other}")),
        Err(e) => Err(e.to_string()),
    };
    let plan = plan.as_ref().map(ToString::to_string).unwrap_or_default();
    let (expected, kernel) = expected?;
    Ok(Row {
        kind: Kind::Fused,
        precision,
        dtype: DType::F32,
        shape,
        base,
        kernel,
        plan,
        expected,
        variants: Vec::new(),
    })
}

/// The decode kernel's rows (one query row per head, d 128) at each key
/// count, K and V as f32 and as f16: into `rows` where the kernel has phase
/// switches, into `skipped` (with the reason) where not.
fn decode_rows(
    engine: &webattn::Engine,
    args: &Args,
    cpu_adapter: bool,
    rows: &mut Vec<Row>,
    skipped: &mut Vec<String>,
) -> anyhow::Result<()> {
    let decode_keys = match (wanted(args, Kind::Decode), args.decode_keys.is_empty()) {
        (false, _) => Vec::new(),
        (true, false) => args.decode_keys.clone(),
        (true, true) => vec![if cpu_adapter { 2048 } else { 16384 }],
    };
    let (batch, heads) = if cpu_adapter { (1, 8) } else { (8, 32) };
    for &keys in &decode_keys {
        anyhow::ensure!(keys > 0, "a decode row needs keys");
        for dtype in [DType::F32, DType::F16] {
            let shape = AttentionShape {
                batch,
                heads,
                kv_heads: heads,
                seq_q: 1,
                seq_k: keys,
                head_dim: 128,
                causal: false,
            };
            let dims = webattn::AttentionDims::plain(batch, [heads, heads], [1, keys], [128, 128]);
            let f16 = dtype == DType::F16;
            let what = format!("decode {keys} keys {dtype}");
            let options = webattn::AttentionOptions {
                path: KernelPath::Fused,
                ..Default::default()
            };
            let call = engine.plan(&dims, &options);
            let decode = match &call {
                Ok(CallPlan {
                    gpu: Some(GpuRoute::Fused { decode, .. }),
                    ..
                }) => *decode,
                _ => None,
            };
            match decode {
                Some(plan) if has_phase_switches(plan.key(&dims, f16).kernel) => rows.push(Row {
                    kind: Kind::Decode,
                    precision: Precision::Highest,
                    dtype,
                    shape,
                    base: engine.sharing_device().ok_or(webattn::Error::Conflict(
                        "webattn phases needs a GPU engine",
                    ))?,
                    kernel: plan.kernel.label(),
                    plan: call.as_ref().map(ToString::to_string).unwrap_or_default(),
                    expected: plan.key(&dims, f16).kernel,
                    variants: Vec::new(),
                }),
                Some(plan) => skipped.push(format!(
                    "{what}: {} has no phase switches",
                    plan.kernel.label()
                )),
                None => skipped.push(format!("{what}: no decode kernel takes it")),
            }
        }
    }
    Ok(())
}

/// One step of progress: the bar's message and count on a terminal, a line
/// on stderr otherwise.
fn note(bar: &Option<ProgressBar>, msg: String) {
    match bar {
        Some(bar) => {
            bar.set_message(msg);
            bar.inc(1);
        }
        None => eprintln!("{msg}"),
    }
}

/// Times `row`'s kernel whole and without each phase (all variants taking
/// turns), checking that each variant's calls ran the kernel without them.
fn measure_row(
    ctx: &webattn::GpuContext,
    row: &mut Row,
    repeats: Repeats,
    bar: &Option<ProgressBar>,
) -> anyhow::Result<()> {
    let s = row.shape;
    note(
        bar,
        match row.kind {
            Kind::Fused => format!(
                "{} d{}{}: the kernel whole and without each phase",
                row.precision.name(),
                s.head_dim,
                if s.causal { " causal" } else { "" },
            ),
            Kind::Decode => format!(
                "decode {} keys {}: whole and without each phase",
                s.seq_k, row.dtype
            ),
        },
    );
    let engines: Vec<webattn::Engine> = variants()
        .into_iter()
        .filter_map(|removed| Some(row.base.sharing_device()?.without_phases(removed)))
        .collect();
    let run = AttentionRun {
        path: KernelPath::Fused,
        precision: row.precision,
        // Decode reads K and V from memory, not from the cache the last
        // run left them in (where the adapter allows).
        cold_cache: row.kind == Kind::Decode,
        dtype: row.dtype,
    };
    let uses_before = ctx.pipelines().use_counts();
    let measured = pollster::block_on(bench::attention_runs(
        &engines.iter().collect::<Vec<_>>(),
        s,
        run,
        repeats,
    ))
    .with_context(|| format!("{} without its phases", row.kernel))?;
    for (removed, m) in variants().into_iter().zip(measured) {
        // This row's calls ran the kernel without these phases: the
        // (shared) cache handed out the key that says so during them.
        let bits = i64::from(removed.bits());
        let uses_after = ctx.pipelines().use_counts();
        let ran = removed.is_empty()
            || uses_after.iter().any(|(key, &uses)| {
                key.kernel == row.expected
                    && key.constants.contains(&("ABLATE", bits))
                    && uses > uses_before.get(key).copied().unwrap_or(0)
            });
        anyhow::ensure!(
            ran,
            "the call did not run a kernel without {}",
            removed.name()
        );
        row.variants.push(Variant {
            removed,
            ms: m.measurement.median_ms(),
            retaken: m.measurement.retaken,
            throttled: m.measurement.throttled,
        });
    }
    Ok(())
}

/// The lines above the rows: the adapter, the ceilings, what the variants
/// are, the clock guard's tally, and the rows left out.
fn print_summary(
    ctx: &webattn::GpuContext,
    rows: &[Row],
    skipped: &[String],
    ceilings: &Ceilings,
    forced_coop: bool,
) {
    let a = &ctx.capabilities().adapter;
    println!("adapter: {} ({}, {})", a.name, a.backend, a.device_type);
    println!("FMA ceiling: {:.1} GFLOP/s (this run)", ceilings.fma);
    if let Some(gbs) = ceilings.bandwidth {
        println!("bandwidth ceiling: {gbs:.1} GB/s, a vec4 copy (this run)");
    }
    println!(
        "each phase of the kernel's key loop removed in turn (the results are discarded): what is \
         left is timed; the phase's cost is what removing it saved"
    );
    let (retaken, throttled) = rows
        .iter()
        .flat_map(|row| &row.variants)
        .fold((0, 0), |(r, t), v| (r + v.retaken, t + v.throttled));
    println!(
        "clock guard: {}",
        match (ctx.clock_guard_on(), throttled) {
            (false, _) => "off".to_string(),
            (true, 0) => format!("on; {retaken} run(s) retaken beside a slow clock probe"),
            (true, t) => format!(
                "on; {retaken} run(s) retaken beside a slow clock probe, {t} kept with the clocks down"
            ),
        }
    );
    if forced_coop {
        println!(
            "the f16 rows run attention_coop whatever the tuning cache says (calls at precision \
             fast take it only where it measured faster)"
        );
    }
    for why in skipped {
        println!("skipped: {why}");
    }
}

/// GB/s of K and V the row's whole kernel read.
fn kv_gbs(row: &Row) -> f64 {
    row.shape.kv_bytes_as(row.dtype) as f64 / (row.variants[0].ms * 1e6)
}

/// One row's table: the shape and plan, the whole kernel's time and share of
/// its ceiling, then each variant's time and what removing its phases saved.
fn print_row(row: &Row, ceilings: &Ceilings) {
    let whole = row.variants[0].ms;
    let s = row.shape;
    match row.kind {
        Kind::Fused => {
            let gflops = s.flops() / (whole * 1e6);
            println!(
                "\n{} seq {} d {}{}, B {} x H {}: {}",
                precision_label(row.precision),
                s.seq_q,
                s.head_dim,
                if s.causal { " causal" } else { "" },
                s.batch,
                s.heads,
                row.plan
            );
            println!(
                "  whole: {whole:.3} ms, {gflops:.0} GFLOP/s, {:.1}% of the FMA ceiling",
                100.0 * gflops / ceilings.fma
            );
        }
        Kind::Decode => {
            let gbs = kv_gbs(row);
            println!(
                "\ndecode, K and V as {}, {} keys, d {}, B {} x H {}: {}",
                row.dtype, s.seq_k, s.head_dim, s.batch, s.heads, row.plan
            );
            let share = ceilings.bandwidth.map_or(String::new(), |b| {
                format!(", {:.0}% of the copy ceiling", 100.0 * gbs / b)
            });
            println!("  whole: {whole:.3} ms, K and V at {gbs:.0} GB/s{share}");
        }
    }
    println!(
        "  {:<34} {:>10} {:>9} {:>13}",
        "without", "ms", "of whole", "phase's cost"
    );
    for v in &row.variants[1..] {
        let what = if v.removed == Phases::ALL {
            "all four (the loop's skeleton)".to_string()
        } else {
            v.removed.name()
        };
        let cost = if v.removed == Phases::ALL {
            "-".to_string()
        } else {
            format!("{:.0}%", 100.0 * (whole - v.ms) / whole)
        };
        println!(
            "  {what:<34} {:>10.3} {:>8.0}% {cost:>13}",
            v.ms,
            100.0 * v.ms / whole
        );
    }
}

/// The run as the JSON `--json` writes.
fn report_json(
    ctx: &webattn::GpuContext,
    rows: &[Row],
    skipped: &[String],
    ceilings: &Ceilings,
) -> serde_json::Value {
    let a = &ctx.capabilities().adapter;
    let (ceiling, bandwidth) = (ceilings.fma, ceilings.bandwidth);
    json!({
        "adapter": {"name": a.name, "backend": a.backend, "device_type": a.device_type, "driver": a.driver, "driver_info": a.driver_info},
        "fma_ceiling_gflops": ceiling,
        "bandwidth_ceiling_gbs": bandwidth,
        "runtime_checks": ctx.runtime_checks().name(),
        "clock_guard": ctx.clock_guard_on(),
        "whole_retaken": rows.iter().map(|row| row.variants[0].retaken).sum::<usize>(),
        "skipped": skipped,
        "rows": rows.iter().map(|row| {
            let whole = row.variants[0].ms;
            let gflops = row.shape.flops() / (whole * 1e6);
            json!({
                "kind": match row.kind { Kind::Fused => "fused", Kind::Decode => "decode" },
                "precision": row.precision.name(), "dtype": row.dtype.to_string(), "kernel": row.kernel, "plan": row.plan,
                "batch": row.shape.batch, "heads": row.shape.heads, "seq_q": row.shape.seq_q,
                "seq_k": row.shape.seq_k, "head_dim": row.shape.head_dim, "causal": row.shape.causal,
                "whole_ms": whole, "gflops": gflops, "share_of_ceiling": gflops / ceiling,
                "kv_gbs": kv_gbs(row),
                "share_of_bandwidth": bandwidth.map(|b| kv_gbs(row) / b),
                "without": row.variants[1..].iter().map(|v| json!({
                    "phases": v.removed.name(), "bits": v.removed.bits(), "ms": v.ms,
                    "of_whole": v.ms / whole, "retaken": v.retaken, "throttled": v.throttled,
                })).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
    })
}

/// The precision as the table shows it.
fn precision_label(precision: Precision) -> &'static str {
    match precision {
        Precision::Highest => "f32",
        Precision::Fast => "f16 products (matrix units)",
    }
}
