//! `webattn tune`: times every fused kernel and tile that fits the adapter,
//! and the unfused path, per head dims, and keeps the fastest in the tuning
//! cache that every later engine on this adapter reads.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use webattn::kernels::decode::GROUPED_ROWS;

/// Arguments of `webattn tune`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Head dims to tune, comma-separated, each `D` (Dk = Dv = D) or `DK/DV`.
    #[arg(long, value_delimiter = ',', default_values = ["64", "128"],
          value_parser = parse_head_dims)]
    head_dims: Vec<(usize, usize)>,
}

fn parse_head_dims(text: &str) -> Result<(usize, usize), String> {
    let number = |t: &str| {
        t.trim()
            .parse::<usize>()
            .ok()
            .filter(|&d| (1..=webattn::kernels::attention::MAX_HEAD_DIM).contains(&d))
            .ok_or_else(|| format!("{t:?} is not a head dim from 1 to 256"))
    };
    match text.split_once('/') {
        Some((dk, dv)) => Ok((number(dk)?, number(dv)?)),
        None => number(text).map(|d| (d, d)),
    }
}

pub fn run(engine_args: &super::EngineArgs, args: &Args) -> anyhow::Result<ExitCode> {
    let engine = super::adapter_engine(engine_args)?;
    let ctx = engine
        .gpu()
        .context("tuning needs a GPU adapter; this engine runs on the CPU backend")?;
    eprintln!("webattn tune on {}", engine.describe());
    let per_class: usize = args
        .head_dims
        .iter()
        .map(|&(dk, dv)| {
            let problem = webattn::tuning::TuningProblem::for_device_type(
                &ctx.capabilities().adapter.device_type,
            );
            let decode = webattn::AttentionDims::plain(
                1,
                {
                    let binding = ctx.capabilities().limits.max_storage_buffer_binding_size;
                    let heads = problem.decode_heads_within(binding, dk, dv);
                    [heads, heads]
                },
                [1, problem.decode_keys],
                [dk, dv],
            );
            webattn::tuning::fused_candidates(&engine, dk, dv).map_or(1, |c| c.len())
                + 1
                + webattn::tuning::coop_candidates(&engine, dk, dv).len()
                + webattn::tuning::fast_gemm_candidates(&engine).len()
                + webattn::tuning::decode_candidates(&engine, &decode).map_or(0, |c| c.len())
        })
        .sum();
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(per_class as u64);
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar
    });
    // One head-dim class at a time, the cache saved after each: a run cut
    // short (a lent GPU's time limit) keeps what it measured.
    let mut saved = None;
    for &head_dims in &args.head_dims {
        let reports =
            pollster::block_on(webattn::tuning::tune(
                &engine,
                &[head_dims],
                |msg| match &bar {
                    Some(bar) => {
                        bar.set_message(msg.to_string());
                        bar.inc(1);
                    }
                    None => eprintln!("timing {msg}"),
                },
            ))?;
        if let Some(bar) = &bar {
            bar.suspend(|| print_reports(&reports));
        } else {
            print_reports(&reports);
        }
        saved = engine.save_tuning()?;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    match saved {
        Some(path) => println!(
            "tuning cache: {} (adapter {})",
            path.display(),
            ctx.capabilities().adapter.name
        ),
        None => {
            println!("tuning cache: none (--tuning-cache none): the choices lasted this run only")
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints each head-dim class's timings, fastest first, and what was chosen.
fn print_reports(reports: &[webattn::tuning::TuneReport]) {
    for report in reports {
        let (dk, dv) = report.head_dims;
        println!(
            "head dims {dk}/{dv} (B 1, H {}, seq {}):",
            report.problem.heads, report.problem.seq
        );
        for (i, t) in report.timings.iter().enumerate() {
            let mark = if i == 0 { "  <- fastest" } else { "" };
            println!("  {:>10.3} ms  {}{mark}", t.median_ms, t.label);
        }
        let entry = &report.entry;
        let path = if entry.unfused_ms < entry.fused_ms {
            "unfused (measured faster than every fused kernel)"
        } else {
            "fused"
        };
        println!(
            "  chosen: {} for the fused path; auto takes the {path}",
            entry.kernel.name()
        );
        if let Some(coop) = entry.coop_ms {
            let verdict = if coop > entry.fused_ms {
                "measured slower than the f32 winner: calls at precision fast take the f32 kernel"
            } else {
                "calls at precision fast take it"
            };
            let tiles = entry.coop_tiles.map_or(String::new(), |t| {
                format!(", tiles {} (subgroups x keys)", t.name())
            });
            println!("  matrix units (precision fast){tiles}: {coop:.3} ms, {verdict}");
        }
        if let Some(coop) = entry.unfused_coop_ms {
            let verdict = if coop > entry.unfused_ms {
                "measured slower than its f32 GEMMs: unfused calls at precision fast keep them"
            } else {
                "unfused calls at precision fast take it"
            };
            let form = entry.fast_gemm.map_or(String::new(), |g| {
                format!(" with its GEMM {}", g.form.name())
            });
            println!(
                "  unfused on the matrix units (precision fast){form}: {coop:.3} ms, {verdict}"
            );
        }
        if entry.coop_ms.is_some() || entry.unfused_coop_ms.is_some() {
            let (fused_ms, unfused_ms) = entry.fast_path_ms();
            let path = if unfused_ms < fused_ms {
                "unfused"
            } else {
                "fused"
            };
            println!(
                "  auto at precision fast takes the {path} path ({fused_ms:.3} ms fused, \
                 {unfused_ms:.3} ms unfused, each at its faster precision)"
            );
        }
        if !report.decode_timings.is_empty() {
            println!(
                "  decode (B 1, H {}, one query row, {} keys):",
                report.problem.decode_heads, report.problem.decode_keys
            );
            for (i, t) in report.decode_timings.iter().enumerate() {
                let mark = if i == 0 { "  <- fastest, chosen" } else { "" };
                println!("  {:>10.3} ms  {}{mark}", t.median_ms, t.label);
            }
        }
        if !report.grouped_decode_timings.is_empty() {
            let heads = report.problem.decode_heads / GROUPED_ROWS * GROUPED_ROWS;
            println!(
                "  grouped decode (B 1, H {} over {} KV heads, one query row, {} keys; calls with several rows per workgroup):",
                heads.max(GROUPED_ROWS),
                (heads / GROUPED_ROWS).max(1),
                report.problem.decode_keys
            );
            for (i, t) in report.grouped_decode_timings.iter().enumerate() {
                let mark = if i == 0 { "  <- fastest, chosen" } else { "" };
                println!("  {:>10.3} ms  {}{mark}", t.median_ms, t.label);
            }
        }
    }
}
