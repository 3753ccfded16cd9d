//! `webattn check`: the conformance sweep on this adapter against the f64 oracle.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use serde_json::json;
use webattn::conformance::{
    backward_paths, filtered, paged_sweep_len, run_backward_sweep, run_paged_sweep, run_sweep,
    sweep_len, SweepKind, SweepReport,
};

use super::progress::{matrix_unit_line, progress_bar, progress_line};
use webattn::Precision;

/// Arguments of `webattn check`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Every contract feature once at small, awkward sizes (under a minute on lavapipe; the default).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Every mask form x GQA ratio x head dims x awkward sizes, on every path.
    #[arg(long)]
    full: bool,
    /// The seed the inputs are drawn from.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Run only the cases whose name contains TEXT.
    #[arg(long, value_name = "TEXT", default_value = "")]
    filter: String,
    /// Run the attention family's checks instead (multi-head layers, KV cache,
    /// positional encodings, additive and multiplicative scoring, linear attention).
    #[arg(long, conflicts_with_all = ["full", "filter"])]
    family: bool,
    /// Run N random valid cases across the paths instead (a soak): failures,
    /// the worst error, and the device memory the engine holds at the start,
    /// after a warm-up and at the end, which must stay flat.
    #[arg(long, value_name = "N", conflicts_with_all = ["full", "filter", "family"])]
    pub soak: Option<usize>,
    /// Check the backward pass instead: the sweep's gradients (dQ, dK, dV
    /// and the past's) on the fused backward and the CPU backend.
    #[arg(long, conflicts_with_all = ["family", "soak"])]
    backward: bool,
    /// Check the paged KV cache instead: the sweep's cases a cache can be
    /// asked (no mask, no past, f32), each batch entry a sequence of a cache
    /// on this engine (device pages on a GPU, read in place by the paged
    /// decode kernel), all asked in one call.
    #[arg(long, conflicts_with_all = ["family", "soak", "backward"])]
    paged: bool,
    /// With --paged: how the pages store keys and values (f16 and int8 are
    /// judged against the oracle on the stored values, and their distance
    /// from the oracle on f32 keys and values is reported).
    #[arg(long, value_name = "f32|f16|int8", default_value = "f32", requires = "paged", value_parser = parse_storage)]
    storage: webattn::PageStorage,
    /// Also write the results as JSON to PATH.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
}

pub fn run(engine_args: &super::EngineArgs, args: &Args) -> anyhow::Result<ExitCode> {
    let kind = if args.full {
        SweepKind::Full
    } else {
        SweepKind::Quick
    };
    let engine = super::adapter_engine(engine_args)?;
    if args.family {
        return run_family(&engine, args);
    }
    if let Some(cases) = args.soak {
        return super::soak::run(
            &engine,
            cases,
            args.seed,
            engine_args.precision,
            args.json.as_deref(),
        );
    }
    eprintln!(
        "webattn check: {}{} on {}{}",
        if args.full { "full" } else { "quick" },
        if args.backward {
            " backward".to_string()
        } else if args.paged {
            format!(" paged ({} pages)", args.storage.name())
        } else {
            String::new()
        },
        engine.describe(),
        match engine_args.precision {
            Precision::Highest => "",
            Precision::Fast => ", precision fast (f16-rounded operands, the f16 rule)",
        }
    );
    let total = if args.backward {
        filtered(kind, &args.filter).len() * backward_paths(&engine).len()
    } else if args.paged {
        paged_sweep_len(kind, &args.filter)
    } else {
        sweep_len(&engine, kind, &args.filter)
    };
    let bar = progress_bar(total);
    let start = Instant::now();
    let mut done = 0;
    let precision = engine_args.precision;
    let progress = |r: &webattn::conformance::CaseResult| {
        done += 1;
        match &bar {
            Some(bar) => {
                bar.set_position(done as u64);
                bar.set_message(r.name.clone());
                if !r.passed() {
                    bar.println(progress_line(done, total, r));
                }
            }
            None => eprintln!("{}", progress_line(done, total, r)),
        }
    };
    let mut storage_line = None;
    let report = if args.backward {
        pollster::block_on(run_backward_sweep(
            &engine,
            kind,
            &args.filter,
            args.seed,
            progress,
        ))
    } else if args.paged {
        let sweep = pollster::block_on(run_paged_sweep(
            &engine,
            kind,
            &args.filter,
            args.seed,
            args.storage,
            progress,
        ));
        storage_line = sweep.against_f32.map(|(worst, case)| {
            format!(
                "{} pages: worst normwise error against the oracle on f32 keys and values \
                 {worst:.2e} ({case}); the cases are judged on the stored values",
                sweep.storage.name()
            )
        });
        sweep.report
    } else {
        pollster::block_on(run_sweep(
            &engine,
            kind,
            &args.filter,
            args.seed,
            precision,
            progress,
        ))
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if let Some(path) = &args.json {
        write_json(path, &report, start.elapsed().as_secs_f64())?;
    }
    println!("{}", report.table());
    if let Some(line) = storage_line {
        println!("{line}");
    }
    if precision == Precision::Fast {
        println!("{}", matrix_unit_line(&engine));
    }
    Ok(if report.failed() == 0 && !report.results.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn run_family(engine: &webattn::Engine, args: &Args) -> anyhow::Result<ExitCode> {
    use webattn::family::checks::{family_table, run_family_checks, FAMILY_CHECKS};
    eprintln!(
        "webattn check: the attention family on {}",
        engine.describe()
    );
    let total = FAMILY_CHECKS.len();
    let mut done = 0;
    let results = pollster::block_on(run_family_checks(engine, args.seed, |c| {
        done += 1;
        eprintln!(
            "[{done}/{total}] {} {} max abs {:.2e} of {:.2e}",
            if c.passed() { "pass" } else { "FAIL" },
            c.name,
            c.report.max_abs,
            c.report.allowed
        );
    }))?;
    if let Some(path) = &args.json {
        let checks: Vec<_> = results
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "shapes": c.shapes,
                    "passed": c.passed(),
                    "max_abs": c.report.max_abs,
                    "allowed": c.report.allowed,
                    "plain_f32_abs": c.report.baseline_abs,
                })
            })
            .collect();
        let value = json!({ "adapter": engine.describe(), "seed": args.seed, "family": checks });
        super::files::write_text(path, &serde_json::to_string_pretty(&value)?)?;
    }
    println!("{}", family_table(&results));
    Ok(if results.iter().all(|c| c.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn write_json(path: &std::path::Path, report: &SweepReport, seconds: f64) -> anyhow::Result<()> {
    let cases: Vec<_> = report
        .results
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "shapes": r.shapes,
                "path": r.path.name(),
                "passed": r.passed(),
                "worst_output": r.worst_output,
                "max_abs": r.report.map(|x| x.max_abs),
                "max_rel": r.report.map(|x| x.max_rel),
                "allowed": r.report.map(|x| x.allowed),
                "plain_f32_abs": r.report.map(|x| x.baseline_abs),
                "failure": r.failure,
                "ms": r.millis,
            })
        })
        .collect();
    let value = json!({
        "adapter": report.adapter,
        "sweep": format!("{:?}", report.kind).to_lowercase(),
        "seed": report.seed,
        "precision": report.precision.name(),
        "seconds": seconds,
        "passed": report.passed(),
        "failed": report.failed(),
        "worst_share_of_allowed": report.worst_share_of_allowed(),
        "cases": cases,
    });
    super::files::write_text(path, &serde_json::to_string_pretty(&value)?)
}

/// A `--storage` name.
fn parse_storage(name: &str) -> Result<webattn::PageStorage, String> {
    webattn::PageStorage::parse(name).map_err(|e| e.to_string())
}
