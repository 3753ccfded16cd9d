//! `webattn phases`: where a kernel's time goes. The fused kernel a call
//! takes, and the decode kernel, are timed whole, then without each phase of
//! their key loop in turn (K/V loads, S = Q K^T, the softmax, O += P V), then
//! with all four removed (the loop's skeleton: barriers, staging stores, Q's
//! block, the writes), in one run beside the FMA and copy ceilings. The
//! variants compute garbage by design (`webattn::plan::ablation`); only their
//! times are kept.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use webattn::kernels::attention::FusedKernel;
use webattn::measure as bench;
use webattn::measure::{AttentionRun, AttentionShape, Repeats};
use webattn::plan::ablation::{has_phase_switches, Phases};
use webattn::plan::{plan_call, CallPlan, GpuRoute};
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
    base: webattn::GpuContext,
    /// The kernel with its tiles.
    kernel: String,
    /// The row's call as `attention` plans it, in one line.
    plan: String,
    /// The kernel whose pipelines without a phase the row must run.
    expected: webattn::kernels::registry::Kernel,
    variants: Vec<Variant>,
}

/// The variants timed per shape: the whole kernel, each phase removed, all.
fn variants() -> Vec<Phases> {
    let mut all = vec![Phases::NONE];
    all.extend(Phases::EACH);
    all.push(Phases::ALL);
    all
}

pub fn run(engine_args: &super::EngineArgs, args: &Args) -> anyhow::Result<ExitCode> {
    let engine = super::adapter_engine(engine_args)?;
    let ctx = engine
        .gpu()
        .context("webattn phases measures a GPU's kernels; this engine runs on the CPU")?;
    eprintln!("webattn phases on {}", engine.describe());
    let cpu_adapter = ctx.capabilities().adapter.device_type == "Cpu";
    let seq = args.seq.unwrap_or(if cpu_adapter { 256 } else { 4096 });
    anyhow::ensure!(seq > 0, "--seq must be at least 1");
    let tokens = args
        .tokens
        .unwrap_or(if cpu_adapter { 1024 } else { 16384 });
    let width = args.width.unwrap_or(if cpu_adapter { 256 } else { 2048 });
    let wanted = |kind: Kind| args.only.is_empty() || args.only.contains(&kind);
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
    let causal: &[bool] = if args.causal {
        &[false, true]
    } else {
        &[false]
    };
    // The context each precision's rows run on: at fast, the matrix-unit
    // kernel forced under auto (calls at fast take the f32 kernel where
    // `webattn tune` measured it slower, and its phases are the question).
    let forced_coop = matrix_units && engine_args.kernel == webattn::FusedKernelChoice::Auto;
    let base = |precision: Precision| -> webattn::Result<webattn::GpuContext> {
        if precision == Precision::Fast && forced_coop {
            ctx.clone()
                .with_fused_kernel(webattn::FusedKernelChoice::Coop)
        } else {
            Ok(ctx.clone())
        }
    };
    // Rows whose kernel has no phase switches (an f32 row on an adapter whose
    // fused kernel is attention_sg, a decode row the staged kernel takes) are
    // left out, and said so.
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let fused_precisions: &[Precision] = if wanted(Kind::Fused) {
        super::bench::precisions(matrix_units)
    } else {
        &[]
    };
    for &precision in fused_precisions {
        for &head_dim in &args.head_dims {
            anyhow::ensure!(head_dim > 0, "a head dim of 0 has no kernel");
            for &causal in causal {
                let shape = AttentionShape {
                    batch: (tokens / seq).max(1),
                    heads: (width / head_dim).max(1),
                    kv_heads: (width / head_dim).max(1),
                    seq_q: seq,
                    seq_k: seq,
                    head_dim,
                    causal,
                };
                let base = base(precision)?;
                let what = format!("{} d {head_dim}", precision_label(precision));
                // The row's call as `attention` plans it (the plan it prints).
                let dims = webattn::AttentionDims::plain(
                    shape.batch,
                    [shape.heads, shape.kv_heads],
                    [seq, seq],
                    [head_dim, head_dim],
                );
                let options = webattn::AttentionOptions {
                    path: KernelPath::Fused,
                    precision,
                    is_causal: causal,
                    ..Default::default()
                };
                let plan = plan_call(Some(&base.planner(head_dim, head_dim)), 0, &dims, &options);
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
                match expected {
                    Ok((expected, kernel)) => rows.push(Row {
                        kind: Kind::Fused,
                        precision,
                        dtype: DType::F32,
                        shape,
                        base,
                        kernel,
                        plan,
                        expected,
                        variants: Vec::new(),
                    }),
                    Err(why) => skipped.push(format!("{what}: {why}")),
                }
            }
        }
    }
    let decode_keys = match (wanted(Kind::Decode), args.decode_keys.is_empty()) {
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
            let call = plan_call(Some(&ctx.planner(128, 128)), 0, &dims, &options);
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
                    base: ctx.clone(),
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
    anyhow::ensure!(
        !rows.is_empty(),
        "no kernel here has phase switches ({}): only the register-tiled and matrix-unit \
         fused kernels and the streaming decode kernel do (pass --kernel attention_tiled, say)",
        skipped.join("; ")
    );
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(rows.len() as u64 + 2);
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
    let ceiling_repeats = Repeats {
        warmup: 2,
        timed: 5,
    };
    note("FMA ceiling".into());
    let ceiling = pollster::block_on(bench::fma_ceiling(ctx, ceiling_repeats))?.0;
    note("bandwidth ceiling".into());
    let bandwidth = if rows.iter().any(|r| r.kind == Kind::Decode) {
        Some(pollster::block_on(bench::bandwidth_ceiling(ctx, ceiling_repeats))?.gbs)
    } else {
        None
    };
    for row in &mut rows {
        let s = row.shape;
        note(match row.kind {
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
        });
        let engines: Vec<webattn::Engine> = variants()
            .into_iter()
            .map(|removed| webattn::Engine::from_context(row.base.clone().without_phases(removed)))
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
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }

    let a = &ctx.capabilities().adapter;
    println!("adapter: {} ({}, {})", a.name, a.backend, a.device_type);
    println!("FMA ceiling: {ceiling:.1} GFLOP/s (this run)");
    if let Some(gbs) = bandwidth {
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
    for why in &skipped {
        println!("skipped: {why}");
    }
    let kv_gbs = |row: &Row| row.shape.kv_bytes_as(row.dtype) as f64 / (row.variants[0].ms * 1e6);
    for row in &rows {
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
                    100.0 * gflops / ceiling
                );
            }
            Kind::Decode => {
                let gbs = kv_gbs(row);
                println!(
                    "\ndecode, K and V as {}, {} keys, d {}, B {} x H {}: {}",
                    row.dtype, s.seq_k, s.head_dim, s.batch, s.heads, row.plan
                );
                let share = bandwidth.map_or(String::new(), |b| {
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
    let json = json!({
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
    });
    if let Some(path) = &args.json {
        super::files::write_text(path, &serde_json::to_string_pretty(&json)?)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The precision as the table shows it.
fn precision_label(precision: Precision) -> &'static str {
    match precision {
        Precision::Highest => "f32",
        Precision::Fast => "f16 products (matrix units)",
    }
}
