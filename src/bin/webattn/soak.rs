//! `webattn check --soak N`: random valid cases across the paths, checked
//! against the oracle, with the device memory watched for growth.

use std::path::Path;
use std::process::ExitCode;

use serde_json::json;
use webattn::conformance::{run_soak, MemoryReading, SoakReport};
use webattn::{Engine, Precision};

fn memory_text(m: Option<MemoryReading>) -> String {
    match m {
        Some(m) => format!(
            "{:.1} MiB in {} buffers",
            m.buffer_bytes as f64 / 1048576.0,
            m.buffers
        ),
        None => "not measurable here".to_string(),
    }
}

/// The summary lines.
fn summary(report: &SoakReport) -> String {
    let per_path: Vec<String> = report
        .per_path
        .iter()
        .map(|(path, n)| format!("{path} {n}"))
        .collect();
    let mut out = format!(
        "soak: {} cases ({}) in {:.1} s: {} failed\n",
        report.cases,
        per_path.join(", "),
        report.millis / 1e3,
        report.failures.len()
    );
    for f in &report.failures {
        out += &format!(
            "  FAIL {} {} ({}): {}\n",
            f.name,
            f.shapes,
            f.path,
            f.failure
                .clone()
                .or_else(|| f.report.map(|r| format!(
                    "max abs {:.3e} of {:.3e} in {}",
                    r.max_abs, r.allowed, f.worst_output
                )))
                .unwrap_or_default()
        );
    }
    if let Some(w) = &report.worst {
        if let Some(r) = w.report {
            out += &format!(
                "worst error: {:.3e} of {:.3e} allowed ({:.0}% of the allowance) in {} of {} {} ({})\n",
                r.max_abs,
                r.allowed,
                100.0 * r.share_of_allowed(),
                w.worst_output,
                w.name,
                w.shapes,
                w.path
            );
        }
    }
    out += &format!(
        "device memory: {} at the start, {} after the warm-up, {} at the end: {}",
        memory_text(report.memory_start),
        memory_text(report.memory_warm),
        memory_text(report.memory_end),
        if report.memory_flat() { "flat" } else { "GREW" }
    );
    out
}

/// Runs the soak and prints its summary; exit 1 on any failure or growth.
pub fn run(
    engine: &Engine,
    cases: usize,
    seed: u64,
    precision: Precision,
    json_path: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    eprintln!(
        "webattn check: soak of {cases} random cases on {}{}",
        engine.describe(),
        match precision {
            Precision::Highest => "",
            Precision::Fast => ", precision fast (f16-rounded operands, the f16 rule)",
        }
    );
    let bar = super::progress::progress_bar(cases);
    let report = pollster::block_on(run_soak(
        engine,
        cases,
        seed,
        precision,
        |done, total, r| match &bar {
            Some(bar) => {
                bar.set_position(done as u64);
                if !r.passed() {
                    bar.println(super::progress::progress_line(done, total, r));
                }
            }
            None if !r.passed() || done % 100 == 0 || done == total => {
                eprintln!("{}", super::progress::progress_line(done, total, r))
            }
            None => {}
        },
    ));
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if let Some(path) = json_path {
        let reading = |m: Option<MemoryReading>| {
            m.map(|m| json!({"buffer_bytes": m.buffer_bytes, "buffers": m.buffers}))
        };
        let value = json!({
            "adapter": engine.describe(),
            "seed": seed,
            "precision": precision.name(),
            "cases": report.cases,
            "per_path": report.per_path.iter().map(|(p, n)| json!({"path": p.name(), "cases": n})).collect::<Vec<_>>(),
            "failed": report.failures.len(),
            "failures": report.failures.iter().map(|f| json!({"name": f.name, "shapes": f.shapes, "path": f.path.name(), "failure": f.failure})).collect::<Vec<_>>(),
            "worst": report.worst.as_ref().and_then(|w| w.report.map(|r| json!({"name": w.name, "shapes": w.shapes, "path": w.path.name(), "output": w.worst_output, "max_abs": r.max_abs, "allowed": r.allowed}))),
            "memory": {"start": reading(report.memory_start), "warm": reading(report.memory_warm), "end": reading(report.memory_end), "flat": report.memory_flat()},
            "seconds": report.millis / 1e3,
        });
        super::files::write_text(path, &serde_json::to_string_pretty(&value)?)?;
    }
    println!("{}", summary(&report));
    if precision == Precision::Fast {
        println!("{}", super::progress::matrix_unit_line(engine));
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
