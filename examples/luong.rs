//! Luong (multiplicative) attention with its three scores on a tiny problem:
//! two decoder states attending over three encoder states in R².
//!
//! Prints each score's weights and context, and the worst error against the
//! f64 oracle.
//!
//! ```sh
//! cargo run --example luong
//! ```

use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::family::luong::{LuongAttention, LuongScore};
use webattn::{Engine, HostTensor};

fn print_rows(label: &str, tensor: &HostTensor) {
    let width = tensor.shape()[2];
    let rows: Vec<String> = tensor
        .data()
        .chunks(width)
        .map(|row| {
            let cells: Vec<String> = row.iter().map(|x| format!("{x:7.4}")).collect();
            format!("[{}]", cells.join(" "))
        })
        .collect();
    println!("  {label:<8} {}", rows.join("  "));
}

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let engine = Engine::new_blocking();
    println!("engine: {}", engine.describe());

    // Encoder states h1..h3 and decoder states s1, s2 (batch 1).
    let h = HostTensor::new([1, 3, 2], vec![1.0, 0.0, 0.0, 1.0, 0.6, 0.8])?;
    let s = HostTensor::new([1, 2, 2], vec![0.9, 0.1, -0.5, 1.2])?;
    let variants = [
        ("dot", LuongScore::Dot),
        (
            "general",
            LuongScore::General {
                w: HostTensor::new([2, 2], vec![1.0, 0.5, -0.5, 2.0])?,
            },
        ),
        (
            "concat",
            LuongScore::Concat {
                w: HostTensor::new(
                    [3, 4],
                    vec![
                        0.5, -0.2, 0.3, 0.8, -0.6, 0.4, 0.9, 0.1, 0.2, 0.7, -0.4, 0.5,
                    ],
                )?,
                v: HostTensor::new([3], vec![1.0, -0.5, 0.8])?,
            },
        ),
    ];

    let mut worst = 0.0f64;
    let mut passed = true;
    for (name, score) in variants {
        let attention = LuongAttention::new(score)?;
        let out = attention.forward_blocking(&engine, &s, &h, None, true)?;
        let weights = out.weights.expect("weights were asked for");
        println!("\n{name} score (rows: s1, s2; weights over h1..h3):");
        print_rows("weights", &weights);
        print_rows("context", &out.output);

        let (context64, weights64) = attention.oracle::<f64>(&s, &h, None)?;
        let (context32, weights32) = attention.oracle::<f32>(&s, &h, None)?;
        for report in [
            compare(out.output.data(), &context64, &context32, DEFAULT_FLOOR),
            compare(weights.data(), &weights64, &weights32, DEFAULT_FLOOR),
        ] {
            worst = worst.max(report.max_abs);
            passed &= report.passed();
        }
    }
    println!(
        "\nworst |engine - f64 oracle| = {worst:.2e}: {}",
        if passed { "PASS" } else { "FAIL" }
    );
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}
