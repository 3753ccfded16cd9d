//! The teaching example as a heatmap: "Le chat était assis sur le tapis"
//! (queries) attending to "The cat sat on the mat" (keys).
//!
//! Embeddings are made from the tokens, so the picture is the same on every
//! load: each word maps to a concept ("chat" and "cat" to `cat`, "était" and
//! "assis" to `sit`), the concept to a unit vector drawn from a generator seeded
//! by its name, plus a small sinusoidal position term (queries at the position
//! their translation sits) that tells the two "the"s apart. Values are one-hot
//! per key, so each row of Y is the row's attention weights.

use serde_json::{json, Value};
use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::rng::SplitMix64;
use webattn::{
    AttentionInputs, AttentionOptions, Engine, HostTensor, KernelPath, QkMatmulOutputMode, Result,
};

const DIM: usize = 16;
const KEYS: [&str; 6] = ["The", "cat", "sat", "on", "the", "mat"];
const QUERIES: [&str; 7] = ["Le", "chat", "était", "assis", "sur", "le", "tapis"];

fn concept(word: &str) -> &'static str {
    match word.to_lowercase().as_str() {
        "the" | "le" => "the",
        "cat" | "chat" => "cat",
        "sat" | "était" | "assis" => "sit",
        "on" | "sur" => "on",
        _ => "mat",
    }
}

/// A unit vector drawn from a generator seeded by `name` (FNV-1a).
fn unit_vector(name: &str) -> Vec<f32> {
    let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let v = SplitMix64::new(seed).normal_vec(DIM, 1.0);
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

/// A sinusoidal position code of amplitude 0.35 at a fractional position.
fn position(pos: f32) -> Vec<f32> {
    (0..DIM)
        .map(|d| {
            let freq = 1.0 / 4f32.powf((d / 2) as f32 * 2.0 / DIM as f32);
            let angle = pos * freq;
            0.35 * if d % 2 == 0 { angle.sin() } else { angle.cos() }
        })
        .collect()
}

fn embed(word: &str, pos: f32, gain: f32) -> Vec<f32> {
    unit_vector(concept(word))
        .iter()
        .zip(position(pos))
        .map(|(c, p)| gain * (c + p))
        .collect()
}

/// Runs the example on `path` (fused by default) and checks it against the oracle.
pub async fn run(engine: &Engine, path: &str) -> Result<Value> {
    let path = match path {
        "unfused" => KernelPath::Unfused,
        "cpu" => KernelPath::Cpu,
        _ if engine.gpu().is_none() => KernelPath::Cpu,
        _ => KernelPath::Fused,
    };
    // Query i sits where its translation does in the shorter English sentence.
    let stretch = (KEYS.len() - 1) as f32 / (QUERIES.len() - 1) as f32;
    let q: Vec<f32> = QUERIES
        .iter()
        .enumerate()
        .flat_map(|(i, w)| embed(w, i as f32 * stretch, 10.0))
        .collect();
    let k: Vec<f32> = KEYS
        .iter()
        .enumerate()
        .flat_map(|(j, w)| embed(w, j as f32, 1.0))
        .collect();
    let v: Vec<f32> = (0..KEYS.len())
        .flat_map(|j| (0..KEYS.len()).map(move |c| f32::from(u8::from(c == j))))
        .collect();
    let q = HostTensor::named("Q", [1, 1, QUERIES.len(), DIM], q)?;
    let k = HostTensor::named("K", [1, 1, KEYS.len(), DIM], k)?;
    let v = HostTensor::named("V", [1, 1, KEYS.len(), KEYS.len()], v)?;
    let options = AttentionOptions {
        qk_matmul_output_mode: Some(QkMatmulOutputMode::Probabilities),
        path,
        ..Default::default()
    };
    let inputs = AttentionInputs::new(&q, &k, &v);
    let out = engine.attention_host(&inputs, &options).await?;
    let taken = engine.last_call().map_or(path, |c| c.path);
    let exact = webattn::cpu::attention_exact(&inputs, &options)?;
    let plain = webattn::cpu::attention_plain_f32(&inputs, &options)?;
    let probs = out.qk_matmul_output.as_ref().map_or(&[][..], |t| t.data());
    let report = compare(probs, &exact.qk, &plain.qk, DEFAULT_FLOOR);
    Ok(json!({
        "queries": QUERIES,
        "keys": KEYS,
        "heatmap": probs,
        "path": taken.name(),
        "max_abs": report.max_abs,
        "allowed": report.allowed,
        "passed": report.passed(),
    }))
}
