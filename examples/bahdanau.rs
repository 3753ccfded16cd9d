//! Bahdanau (additive) attention on a tiny problem: two decoder states
//! attending over four encoder states, with the parameters of the textbook
//! exercise (attention dimension 2, states in R³).
//!
//! Prints the weights and the context of each decoder state, the same with the
//! last encoder state masked as padding, and the worst error against the f64
//! oracle.
//!
//! ```sh
//! cargo run --example bahdanau
//! ```

use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::family::additive::AdditiveAttention;
use webattn::family::Attended;
use webattn::{Engine, HostTensor};

fn print_rows(label: &str, tensor: &HostTensor) {
    let width = tensor.shape()[2];
    println!("{label}:");
    for (i, row) in tensor.data().chunks(width).enumerate() {
        let cells: Vec<String> = row.iter().map(|x| format!("{x:7.4}")).collect();
        println!("  s{} [{}]", i + 1, cells.join(" "));
    }
}

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let engine = Engine::new_blocking();
    println!("engine: {}", engine.describe());

    // e_ij = vᵀ tanh(W1 s_i + W2 h_j), W1 and W2 [d_a = 2, 3], v [2].
    let attention = AdditiveAttention::new(
        HostTensor::new([2, 3], vec![0.5, -0.3, 0.2, 0.4, 0.6, -0.1])?,
        HostTensor::new([2, 3], vec![0.3, 0.5, 0.2, -0.2, 0.4, 0.6])?,
        HostTensor::new([2], vec![1.0, 0.8])?,
    )?;
    // Encoder states h1..h4 and two decoder states, batch 1.
    let h = HostTensor::new(
        [1, 4, 3],
        vec![1., 0., 1., 0., 1., 1., 1., 1., 0., 0., 0., 1.],
    )?;
    let s = HostTensor::new([1, 2, 3], vec![0.5, 0.5, 0.5, -1.0, 0.2, 0.7])?;

    let mut worst = 0.0f64;
    let mut passed = true;
    for lengths in [None, Some(&[3usize][..])] {
        let Attended { output, weights } =
            attention.forward_blocking(&engine, &s, &h, lengths, true)?;
        let weights = weights.expect("weights were asked for");
        match lengths {
            None => println!("\nall four encoder states:"),
            Some(l) => println!("\nsource length {} (h4 is padding):", l[0]),
        }
        print_rows("weights over h1..h4", &weights);
        print_rows("context", &output);

        let (context64, weights64) = attention.oracle::<f64>(&s, &h, lengths)?;
        let (context32, weights32) = attention.oracle::<f32>(&s, &h, lengths)?;
        for report in [
            compare(output.data(), &context64, &context32, DEFAULT_FLOOR),
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
