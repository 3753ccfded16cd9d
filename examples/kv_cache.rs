//! A causal decoder with RoPE, fed a 4-token prompt and then one token at a
//! time through a KV cache on the device; each step's output is compared with
//! the same rows of a full recompute of the sequence so far.
//!
//! ```sh
//! cargo run --example kv_cache
//! ```

use webattn::family::mha::{KvCache, MhaWeights, MultiHeadAttention};
use webattn::family::position::{Rope, RopeLayout};
use webattn::rng::SplitMix64;
use webattn::{AttentionOptions, Engine, HostTensor};

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let engine = Engine::new_blocking();
    println!("adapter: {}", engine.describe());
    let d_model = 32;
    let rope = Rope {
        layout: RopeLayout::HalfSplit,
        ..Default::default()
    };
    let mha = MultiHeadAttention::new(MhaWeights::random(d_model, d_model, 4, 1, 8, 3)?, 4, 1)?
        .with_rope(rope)?;
    let total = 10;
    let tokens = SplitMix64::new(5).normal_vec(total * d_model, 1.0);
    let causal = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let full = mha.forward_blocking(
        &engine,
        &HostTensor::new([1, total, d_model], tokens.clone())?,
        None,
        &causal,
        false,
    )?;
    let mut cache = KvCache::new();
    let mut start = 0;
    for len in [4, 1, 1, 1, 1, 1, 1] {
        let step = HostTensor::new(
            [1, len, d_model],
            tokens[start * d_model..(start + len) * d_model].to_vec(),
        )?;
        let out =
            mha.forward_cached_blocking(&engine, &step, &mut cache, &Default::default(), false)?;
        let expected = &full.output.data()[start * d_model..(start + len) * d_model];
        let diff = out
            .output
            .data()
            .iter()
            .zip(expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        println!(
            "step: {len} token(s) at position {start:<2} cache now {:<2} max |cached - full| = {diff:.2e}",
            cache.len()
        );
        start += len;
    }
    Ok(())
}
