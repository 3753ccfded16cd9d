//! The main job: one attention call on the default adapter, checked against
//! the f64 CPU oracle.
//!
//! Prints the adapter, the shapes, the worst error with the error allowed, and
//! the time of the GPU call (after a warm-up that compiles the pipelines) and
//! of the CPU backend on the same problem.
//!
//! ```sh
//! cargo run --release --example attention
//! ```

use webattn::conformance::{CaseSpec, MaskForm, Oracle};
use webattn::{Engine, KernelPath};

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let engine = Engine::new_blocking();
    println!("adapter: {}", engine.describe());

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
    let taken = engine.last_call().map_or(path, |call| call.plan.path);
    let cpu = pollster::block_on(oracle.check(&engine, KernelPath::Cpu));

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
                "error:   worst |GPU - f64 oracle| = {:.2e} in {} (allowed {:.2e} = 2 x plain f32 {:.2e} + floor {:.2e} = 1e-6 x max(1, max |{}|)): {}",
                report.max_abs,
                result.worst_output,
                report.allowed,
                report.baseline_abs,
                floor,
                result.worst_output,
                if report.passed() { "PASS" } else { "FAIL" }
            );
            println!(
                "time:    {:.1} ms on the {taken} path (first call {:.1} ms, compiling pipelines); CPU backend {:.1} ms",
                result.millis, warm_up.millis, cpu.millis
            );
            if !report.passed() {
                std::process::exit(1);
            }
        }
        (None, None) => println!("no outputs were compared"),
    }
    Ok(())
}
