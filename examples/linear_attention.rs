//! Linear attention (elu+1 feature map) on a tiny problem: 4 queries, 4 keys,
//! Dk = 3, Dv = 2, causal and not, on the default adapter (or the CPU when
//! there is none).
//!
//! Prints the output rows, the attention weights, and the worst error against
//! the f64 oracle with the error allowed (twice the plain f32 error + 1e-6).
//!
//! ```sh
//! cargo run --example linear_attention
//! ```

use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::family::linear::{linear_attention_oracle, LinearAttention};
use webattn::{Engine, HostTensor};

/// A `[1, 1, rows, cols]` tensor of fixed values in [-1, 1].
fn tensor(rows: usize, cols: usize, salt: usize) -> webattn::Result<HostTensor> {
    let data = (0..rows * cols)
        .map(|i| ((i * 7 + salt * 5) % 11) as f32 / 5.0 - 1.0)
        .collect();
    HostTensor::new([1, 1, rows, cols], data)
}

fn print_matrix(name: &str, t: &HostTensor) {
    let cols = t.shape()[3];
    println!("{name}:");
    for row in t.data().chunks(cols) {
        let cells: Vec<String> = row.iter().map(|x| format!("{x:7.4}")).collect();
        println!("  [{}]", cells.join(" "));
    }
}

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let engine = Engine::new_blocking();
    println!("adapter: {}", engine.describe());
    let (q, k, v) = (tensor(4, 3, 0)?, tensor(4, 3, 1)?, tensor(4, 2, 2)?);
    let mut all_passed = true;
    for causal in [false, true] {
        println!(
            "\n{} linear attention, Q [1, 1, 4, 3], K [1, 1, 4, 3], V [1, 1, 4, 2]",
            if causal { "causal" } else { "non-causal" }
        );
        let got = LinearAttention::new(causal).forward_blocking(&engine, &q, &k, &v, true)?;
        print_matrix("output [4, 2]", &got.output);
        let exact = linear_attention_oracle::<f64>(&q, &k, &v, causal, true)?;
        let plain = linear_attention_oracle::<f32>(&q, &k, &v, causal, true)?;
        let mut report = compare(
            got.output.data(),
            &exact.output,
            &plain.output,
            DEFAULT_FLOOR,
        );
        if let Some(weights) = &got.weights {
            print_matrix("weights [4, 4] (rows sum to 1)", weights);
            let w = compare(
                weights.data(),
                &exact.weights,
                &plain.weights,
                DEFAULT_FLOOR,
            );
            if w.share_of_allowed() > report.share_of_allowed() {
                report = w;
            }
        }
        println!(
            "worst |result - f64 oracle| = {:.2e} (allowed {:.2e}): {}",
            report.max_abs,
            report.allowed,
            if report.passed() { "PASS" } else { "FAIL" }
        );
        all_passed &= report.passed();
    }
    if !all_passed {
        std::process::exit(1);
    }
    Ok(())
}
