//! A multi-head attention layer, as self-attention over a short sentence and
//! as cross-attention from a 3-token target onto a 5-token source, on the
//! default adapter (or the CPU). Prints head 0's weights, the output's shape
//! and the worst error against the f64 oracle.
//!
//! ```sh
//! cargo run --example multi_head_attention
//! ```

use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::family::format_matrix;
use webattn::family::mha::{MhaWeights, MultiHeadAttention};
use webattn::rng::SplitMix64;
use webattn::{AttentionOptions, Engine, HostTensor};

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let engine = Engine::new_blocking();
    println!("adapter: {}", engine.describe());
    let mut rng = SplitMix64::new(7);
    let (d_model, heads, kv_heads, head_dim) = (16, 4, 2, 4);
    // Self-attention: 6 tokens, causal (a decoder block); GQA with 2 KV heads.
    let mha = MultiHeadAttention::new(
        MhaWeights::random(d_model, d_model, heads, kv_heads, head_dim, 1)?,
        heads,
        kv_heads,
    )?;
    let x = HostTensor::new([1, 6, d_model], rng.normal_vec(6 * d_model, 1.0))?;
    let causal = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let out = mha.forward_blocking(&engine, &x, None, &causal, true)?;
    let weights = out.weights.as_ref().expect("asked for");
    println!("\ncausal self-attention, 6 tokens, {heads} heads ({kv_heads} KV heads)");
    println!(
        "head 0 weights [6 queries x 6 keys]:\n{}",
        format_matrix(&weights.data()[..36], 6, 3)
    );
    let (exact, _) = mha.oracle::<f64>(&x, None, &causal)?;
    let (plain, _) = mha.oracle::<f32>(&x, None, &causal)?;
    let report = compare(out.output.data(), &exact, &plain, DEFAULT_FLOOR);
    println!(
        "output {:?}, worst error vs the f64 oracle {:.2e} (allowed {:.2e})",
        out.output.shape(),
        report.max_abs,
        report.allowed
    );

    // Cross-attention: 3 target tokens attend to 5 source tokens of 12 features.
    let cross = MultiHeadAttention::new(MhaWeights::random(d_model, 12, 2, 2, 8, 2)?, 2, 2)?;
    let target = HostTensor::new([1, 3, d_model], rng.normal_vec(3 * d_model, 1.0))?;
    let source = HostTensor::new([1, 5, 12], rng.normal_vec(5 * 12, 1.0))?;
    let out = cross.forward_blocking(&engine, &target, Some(&source), &Default::default(), true)?;
    let weights = out.weights.as_ref().expect("asked for");
    println!("\ncross-attention, 3 target tokens onto 5 source tokens");
    println!(
        "head 0 weights [3 x 5]:\n{}",
        format_matrix(&weights.data()[..15], 5, 3)
    );
    let (exact, _) = cross.oracle::<f64>(&target, Some(&source), &Default::default())?;
    let (plain, _) = cross.oracle::<f32>(&target, Some(&source), &Default::default())?;
    let report = compare(out.output.data(), &exact, &plain, DEFAULT_FLOOR);
    println!(
        "output {:?}, worst error vs the f64 oracle {:.2e} (allowed {:.2e}): {}",
        out.output.shape(),
        report.max_abs,
        report.allowed,
        if report.passed() { "PASS" } else { "FAIL" }
    );
    Ok(())
}
