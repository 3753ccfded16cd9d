//! The main job: one attention call on the default engine, checked against
//! the f64 CPU oracle.
//!
//! Prints what the default engine runs on (the GPU adapter, or the CPU
//! backend and why: no adapter, or one that is a CPU implementation), the
//! shapes, the worst error with the error allowed, the path that ran, and the
//! times of both sides on the same problem: the GPU call (after a warm-up that
//! compiles the pipelines) and the CPU backend.
//!
//! ```sh
//! cargo run --release --example attention
//! ```

use webattn::conformance::{CaseSpec, MaskForm, Oracle};
use webattn::{BackendPreference, Engine, EngineOptions, KernelPath};

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let engine = Engine::new_blocking();
    println!("engine:  {}", engine.describe());

    // Grouped-query causal attention with a padding mask, logits of ordinary size.
    let case = CaseSpec::new("demo", [2, 8, 2], [1024, 1024], [64, 64])
        .mask(MaskForm::Bool(4))
        .with(|o| o.is_causal = true);
    println!(
        "shapes:  Q [2, 8, 1024, 64], K/V [2, 2, 1024, 64], bool mask [2, 1, 1024, 1024], causal (GQA 4:1)"
    );
    let oracle = Oracle::new(&case, 2024)?;
    let path = KernelPath::Auto;
    let warm_up = pollster::block_on(oracle.check(&engine, path));
    let result = pollster::block_on(oracle.check(&engine, path));
    let plan = engine.last_call().map(|call| call.plan);
    let taken = plan.as_ref().map_or(path, |p| p.path);
    // The other side: the CPU backend on a GPU engine; the adapter (when
    // there is one) on an engine that chose the CPU backend over it.
    let other = match engine.gpu() {
        Some(_) => Some((
            "CPU backend".to_string(),
            pollster::block_on(oracle.check(&engine, KernelPath::Cpu)).millis,
        )),
        None => Engine::with_options_blocking(EngineOptions {
            backend: BackendPreference::Gpu,
            ..Default::default()
        })
        .ok()
        .map(|gpu| {
            pollster::block_on(oracle.check(&gpu, path));
            let timed = pollster::block_on(oracle.check(&gpu, path));
            let ran = gpu.last_call().map_or(path, |call| call.plan.path);
            (format!("the adapter's {ran} path"), timed.millis)
        }),
    };

    match (&result.report, &result.failure) {
        (_, Some(failure)) => {
            eprintln!("error: {failure}");
            std::process::exit(1);
        }
        (Some(report), None) => {
            // The rule: twice the plain f32 error, plus a floor of 1e-6 times
            // the largest |exact| value (at least 1).
            let floor = report.allowed - 2.0 * report.baseline_abs;
            println!(
                "error:   worst |{taken} - f64 oracle| = {:.2e} in {} (allowed {:.2e} = 2 x plain f32 {:.2e} + floor {:.2e} = 1e-6 x max(1, max |{}|)): {}",
                report.max_abs,
                result.worst_output,
                report.allowed,
                report.baseline_abs,
                floor,
                result.worst_output,
                if report.passed() { "PASS" } else { "FAIL" }
            );
            if let Some(plan) = &plan {
                println!("plan:    {plan}");
            }
            let first = match engine.gpu() {
                Some(_) => format!(
                    " (first call {:.1} ms, compiling pipelines)",
                    warm_up.millis
                ),
                None => String::new(),
            };
            let other = other.map_or(String::new(), |(what, ms)| format!("; {what} {ms:.1} ms"));
            println!(
                "time:    {:.1} ms on the {taken} path{first}{other}",
                result.millis
            );
            if !report.passed() {
                std::process::exit(1);
            }
        }
        (None, None) => println!("no outputs were compared"),
    }
    Ok(())
}
