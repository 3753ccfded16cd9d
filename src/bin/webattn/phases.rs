//! `webattn phases`: where a fused kernel's time goes. The kernel a call
//! takes is timed whole, then without each phase of its key loop in turn
//! (K/V loads, S = Q K^T, the softmax, O += P V), then with all four removed
//! (the loop's skeleton: barriers, staging stores, Q's block, the writes),
//! in one run beside the FMA ceiling. The variants compute garbage by design
//! (`webattn::gpu::phases`); only their times are kept.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use webattn::bench::{self, AttentionRun, AttentionShape, Repeats};
use webattn::gpu::ops::fused::FusedKernel;
use webattn::gpu::phases::{has_phase_switches, Phases};
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
    /// One warm-up and three timed runs per variant (two and five otherwise).
    #[arg(long)]
    quick: bool,
    /// Write the results as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

/// One variant's time.
struct Variant {
    removed: Phases,
    ms: f64,
}

/// One shape at one precision: the kernel and its variants (the first is the
/// whole kernel).
struct Row {
    precision: Precision,
    shape: AttentionShape,
    kernel: String,
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
    let engine = super::engine(engine_args)?;
    let ctx = engine
        .gpu()
        .context("webattn phases measures a GPU's fused kernels; this engine runs on the CPU")?;
    eprintln!("webattn phases on {}", engine.describe());
    let cpu_adapter = ctx.capabilities().adapter.device_type == "Cpu";
    let seq = args.seq.unwrap_or(if cpu_adapter { 256 } else { 4096 });
    let tokens = args
        .tokens
        .unwrap_or(if cpu_adapter { 1024 } else { 16384 });
    let width = args.width.unwrap_or(if cpu_adapter { 256 } else { 2048 });
    let matrix_units = webattn::gpu::planner::coop_shape(ctx.capabilities()).is_some();
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
    let mut plan = Vec::new();
    for &precision in super::bench::precisions(matrix_units) {
        for &head_dim in &args.head_dims {
            anyhow::ensure!(head_dim > 0, "a head dim of 0 has no kernel");
            for &causal in causal {
                plan.push((
                    precision,
                    AttentionShape {
                        batch: (tokens / seq).max(1),
                        heads: (width / head_dim).max(1),
                        seq_q: seq,
                        seq_k: seq,
                        head_dim,
                        causal,
                    },
                ));
            }
        }
    }
    // Shapes whose kernel has no phase switches (an f32 row on an adapter
    // whose fused kernel is attention_sg, say) are left out, and said so.
    let mut skipped = Vec::new();
    plan.retain(|&(precision, shape)| {
        let kernel = base(precision)
            .and_then(|c| c.fused_kernel_at(shape.head_dim, shape.head_dim, precision));
        match kernel {
            Ok(FusedKernel::Tiled(_) | FusedKernel::Coop(_)) => true,
            Ok(kernel) => {
                skipped.push(format!(
                    "{} d {}: {} has no phase switches",
                    precision_label(precision),
                    shape.head_dim,
                    kernel.label()
                ));
                false
            }
            Err(e) => {
                skipped.push(format!(
                    "{} d {}: {e}",
                    precision_label(precision),
                    shape.head_dim
                ));
                false
            }
        }
    });
    anyhow::ensure!(
        !plan.is_empty(),
        "no fused kernel here has phase switches ({}): only the register-tiled and matrix-unit \
         kernels do (pass --kernel attention_tiled, say)",
        skipped.join("; ")
    );
    let steps = plan.len() + 1;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(steps as u64);
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
    note("FMA ceiling".into());
    let ceiling = pollster::block_on(bench::fma_ceiling(
        ctx,
        Repeats {
            warmup: 2,
            timed: 5,
        },
    ))?
    .0;
    let mut rows = Vec::new();
    for &(precision, shape) in &plan {
        let base = base(precision)?;
        let kernel = base.fused_kernel_at(shape.head_dim, shape.head_dim, precision)?;
        let mut row = Row {
            precision,
            shape,
            kernel: kernel.label(),
            variants: Vec::new(),
        };
        note(format!(
            "{} d{}{}: the kernel whole and without each phase",
            precision.name(),
            shape.head_dim,
            if shape.causal { " causal" } else { "" },
        ));
        let engines: Vec<webattn::Engine> = variants()
            .into_iter()
            .map(|removed| webattn::Engine::from_context(base.clone().without_phases(removed)))
            .collect();
        let run = AttentionRun {
            path: KernelPath::Fused,
            precision,
            cold_cache: false,
            dtype: DType::F32,
        };
        let measured = pollster::block_on(bench::attention_runs(
            &engines.iter().collect::<Vec<_>>(),
            shape,
            run,
            repeats,
        ))
        .with_context(|| format!("{} without its phases", row.kernel))?;
        for (removed, m) in variants().into_iter().zip(measured) {
            // The call ran the kernel without these phases: its pipeline is
            // in the (shared) cache under the key that says so.
            let bits = i64::from(removed.bits());
            let ran = removed.is_empty()
                || ctx.pipelines().compiled_keys().iter().any(|key| {
                    has_phase_switches(key.kernel) && key.constants.contains(&("ABLATE", bits))
                });
            anyhow::ensure!(
                ran,
                "the call did not run a kernel without {}",
                removed.name()
            );
            row.variants.push(Variant {
                removed,
                ms: m.measurement.median_ms(),
            });
        }
        rows.push(row);
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }

    let a = &ctx.capabilities().adapter;
    println!("adapter: {} ({}, {})", a.name, a.backend, a.device_type);
    println!(
        "FMA ceiling: {ceiling:.1} GFLOP/s (this run); B x H = {tokens} tokens / seq x {width} / head dim"
    );
    println!(
        "each phase of the kernel's key loop removed in turn (the results are discarded): what is \
         left is timed; the phase's cost is what removing it saved"
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
    for row in &rows {
        let whole = row.variants[0].ms;
        let s = row.shape;
        let gflops = s.flops() / (whole * 1e6);
        println!(
            "\n{} seq {} d {}{}, B {} x H {}: {}",
            precision_label(row.precision),
            s.seq_q,
            s.head_dim,
            if s.causal { " causal" } else { "" },
            s.batch,
            s.heads,
            row.kernel
        );
        println!(
            "  whole: {whole:.3} ms, {gflops:.0} GFLOP/s, {:.1}% of the FMA ceiling",
            100.0 * gflops / ceiling
        );
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
        "runtime_checks": ctx.runtime_checks().name(),
        "skipped": skipped,
        "rows": rows.iter().map(|row| {
            let whole = row.variants[0].ms;
            json!({
                "precision": row.precision.name(), "kernel": row.kernel,
                "batch": row.shape.batch, "heads": row.shape.heads, "seq": row.shape.seq_q,
                "head_dim": row.shape.head_dim, "causal": row.shape.causal,
                "whole_ms": whole, "gflops": row.shape.flops() / (whole * 1e6),
                "share_of_ceiling": row.shape.flops() / (whole * 1e6) / ceiling,
                "without": row.variants[1..].iter().map(|v| json!({
                    "phases": v.removed.name(), "bits": v.removed.bits(), "ms": v.ms,
                    "of_whole": v.ms / whole,
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
