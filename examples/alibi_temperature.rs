//! In-kernel ALiBi and the softmax temperature: the weights of a causal head
//! with its ALiBi slope, and how the temperature sharpens or flattens them
//! (the entropy of each row).
//!
//! ```sh
//! cargo run --example alibi_temperature
//! ```

use webattn::family::format_matrix;
use webattn::{
    alibi_slopes, AttentionInputs, AttentionOptions, Engine, HostTensor, QkMatmulOutputMode,
};

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let engine = Engine::new_blocking();
    println!("adapter: {}", engine.describe());
    let (heads, n, d) = (4, 6, 8);
    // Identical keys: without a bias every allowed key gets the same weight, so
    // what the picture shows is the ALiBi bias alone.
    let q = HostTensor::new([1, heads, n, d], vec![0.5; heads * n * d])?;
    let k = HostTensor::new([1, heads, n, d], vec![0.5; heads * n * d])?;
    let v = HostTensor::new(
        [1, heads, n, d],
        (0..heads * n * d).map(|i| (i % 7) as f32).collect(),
    )?;
    println!("ALiBi slopes for {heads} heads: {:?}", alibi_slopes(heads));
    for (alibi, temperature) in [(false, 1.0), (true, 1.0), (true, 0.5), (true, 4.0)] {
        let options = AttentionOptions {
            is_causal: true,
            alibi,
            temperature,
            qk_matmul_output_mode: Some(QkMatmulOutputMode::Probabilities),
            ..Default::default()
        };
        let out = engine.attention_host_blocking(&AttentionInputs::new(&q, &k, &v), &options)?;
        let probs = out.qk_matmul_output.expect("asked for");
        let head0 = &probs.data()[..n * n];
        let last_row = &head0[(n - 1) * n..];
        let entropy: f32 = last_row
            .iter()
            .filter(|&&p| p > 0.0)
            .map(|&p| -p * p.ln())
            .sum();
        println!(
            "\nalibi={alibi} temperature={temperature}: head 0 weights (last row's entropy {entropy:.3} nats)\n{}",
            format_matrix(head0, n, 3)
        );
    }
    Ok(())
}
