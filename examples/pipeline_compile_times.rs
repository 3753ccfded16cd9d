//! How long the default adapter takes to compile each pipeline variant the
//! engine can make (`kernels::variants`): WGSL through naga
//! and the driver's compiler, by the wall clock, one fresh pipeline cache.
//! The first key of a kernel also pays for parsing its module. Prints a table
//! (slowest first, with each kernel's WGSL lines) and writes JSON: what
//! the generated kernels' unrolled loops cost a CPU adapter (lavapipe's LLVM)
//! in compile time, beside the kernels written with loops.
//!
//! `cargo run --release --example pipeline_compile_times -- [OUT.json]`

use std::collections::BTreeMap;
use std::time::Instant;

use webattn::{BackendPreference, Engine, EngineOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args()
        .nth(1)
        .unwrap_or("target/pipeline-compile-times.json".into());
    let engine = Engine::with_options_blocking(EngineOptions {
        backend: BackendPreference::Gpu,
        ..Default::default()
    })?;
    let ctx = engine.gpu().ok_or("no GPU adapter")?;
    let caps = engine.capabilities().ok_or("no GPU adapter")?;
    let keys = webattn::kernels::variants();
    let mut rows = Vec::new();
    let started = Instant::now();
    for (i, key) in keys.iter().enumerate() {
        let kernel = key.kernel;
        let missing = (kernel.uses_subgroups() && !caps.subgroups)
            || (kernel.uses_coop() && caps.cooperative_matrix.is_empty());
        if missing {
            continue;
        }
        eprint!("\r{}/{} {:<60}", i + 1, keys.len(), kernel.name());
        let scope = ctx.device().push_error_scope(wgpu::ErrorFilter::Validation);
        let start = Instant::now();
        ctx.pipelines().get(key);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let error = pollster::block_on(scope.pop());
        rows.push((
            ms,
            key.to_string(),
            kernel.name(),
            kernel.source().lines().count(),
            error.map(|e| e.to_string()),
        ));
    }
    eprintln!();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    println!(
        "adapter: {}; {} pipelines in {:.1} s",
        engine.describe(),
        rows.len(),
        started.elapsed().as_secs_f64()
    );
    println!("{:>10} {:>7}  pipeline", "ms", "lines");
    for (ms, key, _, lines, error) in &rows {
        let note = error.as_ref().map_or(String::new(), |e| {
            format!("  (failed: {})", e.lines().next().unwrap_or(""))
        });
        println!("{ms:>10.1} {lines:>7}  {key}{note}");
    }
    let mut per_kernel: BTreeMap<&str, (usize, usize, f64)> = BTreeMap::new();
    for (ms, _, name, lines, _) in &rows {
        let entry = per_kernel.entry(name).or_insert((*lines, 0, 0.0));
        entry.1 += 1;
        entry.2 += ms;
    }
    println!("\nper kernel: lines, pipelines, total ms, ms per pipeline");
    let mut kernels: Vec<_> = per_kernel.iter().collect();
    kernels.sort_by(|a, b| (b.1).2.total_cmp(&(a.1).2));
    for (name, (lines, count, total)) in &kernels {
        println!(
            "{name:<32} {lines:>6} {count:>4} {total:>10.1} {:>10.1}",
            total / *count as f64
        );
    }
    let json = format!(
        "{{\"adapter\": {:?}, \"pipelines\": [{}]}}\n",
        engine.describe(),
        rows.iter()
            .map(|(ms, key, name, lines, error)| format!(
                "{{\"key\": {key:?}, \"kernel\": {name:?}, \"wgsl_lines\": {lines}, \"ms\": {ms:.3}, \"error\": {}}}",
                error.as_ref().map_or("null".into(), |e| format!("{e:?}"))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    std::fs::write(&out, json)?;
    println!("wrote {out}");
    Ok(())
}
