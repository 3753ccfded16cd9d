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
use webattn::family::additive::AdditiveAttention;
use webattn::family::linear::{linear_attention_oracle, LinearAttention};
use webattn::family::luong::{LuongAttention, LuongScore};
use webattn::family::mha::{MhaWeights, MultiHeadAttention};
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

/// The two sentences' embeddings: queries `[7, DIM]` (scaled by `query_gain`)
/// and keys `[6, DIM]`.
fn embeddings(query_gain: f32) -> (Vec<f32>, Vec<f32>) {
    // Query i sits where its translation does in the shorter English sentence.
    let stretch = (KEYS.len() - 1) as f32 / (QUERIES.len() - 1) as f32;
    let q = QUERIES
        .iter()
        .enumerate()
        .flat_map(|(i, w)| embed(w, i as f32 * stretch, query_gain))
        .collect();
    let k = KEYS
        .iter()
        .enumerate()
        .flat_map(|(j, w)| embed(w, j as f32, 1.0))
        .collect();
    (q, k)
}

/// One-hot values per key, so each row of the output is the row's weights.
fn one_hot() -> Vec<f32> {
    (0..KEYS.len())
        .flat_map(|j| (0..KEYS.len()).map(move |c| f32::from(u8::from(c == j))))
        .collect()
}

/// The heatmap, the check against the oracle and a caption, as JSON.
fn result(
    probs: &[f32],
    report: &webattn::conformance::ErrorReport,
    path: &str,
    caption: &str,
) -> Value {
    json!({
        "queries": QUERIES,
        "keys": KEYS,
        "heatmap": probs,
        "path": path,
        "max_abs": report.max_abs,
        "allowed": report.allowed,
        "passed": report.passed(),
        "caption": caption,
    })
}

/// Runs the example scored by `variant` on `path` (fused by default; the
/// family's layers run on the engine's GPU, or on the CPU for `cpu`) and
/// checks it against the oracle.
pub async fn run(engine: &Engine, path: &str, variant: &str) -> Result<Value> {
    let path = match path {
        "unfused" => KernelPath::Unfused,
        "cpu" => KernelPath::Cpu,
        _ if engine.gpu().is_none() => KernelPath::Cpu,
        _ => KernelPath::Fused,
    };
    let cpu = Engine::cpu();
    let family_engine = if path == KernelPath::Cpu {
        &cpu
    } else {
        engine
    };
    let family_path = if family_engine.gpu().is_some() {
        "GPU"
    } else {
        "cpu"
    };
    match variant {
        "mha" => mha(family_engine, path).await,
        "linear" => linear(family_engine, family_path).await,
        "bahdanau" => bahdanau(family_engine, family_path).await,
        "luong-dot" | "luong-general" | "luong-concat" => {
            luong(family_engine, family_path, variant).await
        }
        _ => dot(engine, path).await,
    }
}

/// Scaled dot-product attention through the engine's own operator.
async fn dot(engine: &Engine, path: KernelPath) -> Result<Value> {
    let (q, k) = embeddings(10.0);
    let q = HostTensor::named("Q", [1, 1, QUERIES.len(), DIM], q)?;
    let k = HostTensor::named("K", [1, 1, KEYS.len(), DIM], k)?;
    let v = HostTensor::named("V", [1, 1, KEYS.len(), KEYS.len()], one_hot())?;
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
    Ok(result(
        probs,
        &report,
        taken.name(),
        "Scaled dot-product attention, softmax(QKᵀ/√d) V, on the engine's operator.",
    ))
}

/// A multi-head cross-attention layer whose projections pick each head's
/// half of the features (W_Q = 10·I, W_K = W_V = W_O = I), head 0 drawn.
async fn mha(engine: &Engine, path: KernelPath) -> Result<Value> {
    let identity = |gain: f32| {
        let data = (0..DIM * DIM)
            .map(|i| if i / DIM == i % DIM { gain } else { 0.0 })
            .collect();
        HostTensor::new([DIM, DIM], data)
    };
    let weights = MhaWeights {
        w_q: identity(10.0)?,
        b_q: None,
        w_k: identity(1.0)?,
        b_k: None,
        w_v: identity(1.0)?,
        b_v: None,
        w_o: identity(1.0)?,
        b_o: None,
    };
    let layer = MultiHeadAttention::new(weights, 2, 2)?;
    let (q, k) = embeddings(1.0);
    let target = HostTensor::named("queries", [1, QUERIES.len(), DIM], q)?;
    let source = HostTensor::named("keys", [1, KEYS.len(), DIM], k)?;
    let options = AttentionOptions {
        path,
        ..Default::default()
    };
    let out = layer
        .forward(engine, &target, Some(&source), &options, true)
        .await?;
    let weights = out.weights.as_ref().map_or(&[][..], |t| t.data());
    let (_, exact) = layer.oracle::<f64>(&target, Some(&source), &options)?;
    let (_, plain) = layer.oracle::<f32>(&target, Some(&source), &options)?;
    let report = compare(weights, &exact, &plain, DEFAULT_FLOOR);
    let head0 = &weights[..QUERIES.len() * KEYS.len()];
    let taken = engine.last_call().map_or(path, |c| c.path);
    Ok(result(
        head0,
        &report,
        taken.name(),
        "Multi-head cross-attention (2 heads; projections by the GEMM on a GPU engine): head 0's weights.",
    ))
}

/// Linear attention (elu+1 features): the weights φ(q)·φ(k) / Σ φ(q)·φ(k').
async fn linear(engine: &Engine, path: &str) -> Result<Value> {
    let (q, k) = embeddings(3.0);
    let q = HostTensor::named("Q", [1, 1, QUERIES.len(), DIM], q)?;
    let k = HostTensor::named(
        "K",
        [1, 1, KEYS.len(), DIM],
        k.iter().map(|x| 3.0 * x).collect(),
    )?;
    let v = HostTensor::named("V", [1, 1, KEYS.len(), KEYS.len()], one_hot())?;
    let out = LinearAttention::new(false)
        .forward(engine, &q, &k, &v, true)
        .await?;
    let weights = out.weights.as_ref().map_or(&[][..], |t| t.data());
    let exact = linear_attention_oracle::<f64>(&q, &k, &v, false, true)?;
    let plain = linear_attention_oracle::<f32>(&q, &k, &v, false, true)?;
    let report = compare(weights, &exact.weights, &plain.weights, DEFAULT_FLOOR);
    Ok(result(
        weights,
        &report,
        path,
        "Linear attention with the elu+1 feature map: an O(N) kernel; the weights are drawn on request.",
    ))
}

/// The embeddings with a constant feature 1 appended (`DIM + 1` wide), which
/// lets the additive scores below carry a bias.
fn with_constant(rows: &[f32]) -> Vec<f32> {
    rows.chunks(DIM)
        .flat_map(|r| r.iter().copied().chain(std::iter::once(1.0)))
        .collect()
}

/// Additive weights that make `vᵀ tanh(W1 s + W2 h)` a similarity: for each
/// feature a, `tanh(g(s_a − h_a) + c) − tanh(g(s_a − h_a) − c)`, a bump that
/// peaks where the two agree (c comes from the constant feature). Returns
/// W1 and W2 `[2·DIM, DIM + 1]` and v `[2·DIM]`.
fn bump_weights(g: f32, c: f32, weight: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let width = DIM + 1;
    let (mut w1, mut w2) = (vec![0.0; 2 * DIM * width], vec![0.0; 2 * DIM * width]);
    let mut v = vec![0.0; 2 * DIM];
    for a in 0..DIM {
        for (block, sign) in [(0, 1.0), (1, -1.0)] {
            let row = block * DIM + a;
            w1[row * width + a] = g;
            w1[row * width + DIM] = sign * c;
            w2[row * width + a] = -g;
            v[row] = sign * weight;
        }
    }
    (w1, w2, v)
}

fn states(query_gain: f32) -> Result<(HostTensor, HostTensor)> {
    let (q, k) = embeddings(query_gain);
    Ok((
        HostTensor::named(
            "decoder states",
            [1, QUERIES.len(), DIM + 1],
            with_constant(&q),
        )?,
        HostTensor::named(
            "encoder states",
            [1, KEYS.len(), DIM + 1],
            with_constant(&k),
        )?,
    ))
}

/// Bahdanau's additive scoring, with weights that make it an alignment model.
async fn bahdanau(engine: &Engine, path: &str) -> Result<Value> {
    let (w1, w2, v) = bump_weights(4.0, 1.0, 0.6);
    let width = DIM + 1;
    let layer = AdditiveAttention::new(
        HostTensor::new([2 * DIM, width], w1)?,
        HostTensor::new([2 * DIM, width], w2)?,
        HostTensor::new([2 * DIM], v)?,
    )?;
    let (s, h) = states(1.0)?;
    let out = layer.forward(engine, &s, &h, None, true).await?;
    let weights = out.weights.as_ref().map_or(&[][..], |t| t.data());
    let (_, exact) = layer.oracle::<f64>(&s, &h, None)?;
    let (_, plain) = layer.oracle::<f32>(&s, &h, None)?;
    let report = compare(weights, &exact, &plain, DEFAULT_FLOOR);
    Ok(result(
        weights,
        &report,
        path,
        "Bahdanau (additive) attention, vᵀ tanh(W1 s + W2 h): W1 S and W2 H by the GEMM, \
         the scores by their own kernel.",
    ))
}

/// Luong's multiplicative scorings: dot, general (W = 10·I) and concat.
async fn luong(engine: &Engine, path: &str, variant: &str) -> Result<Value> {
    let identity = (0..(DIM + 1) * (DIM + 1))
        .map(|i| {
            if i / (DIM + 1) == i % (DIM + 1) && i / (DIM + 1) < DIM {
                10.0
            } else {
                0.0
            }
        })
        .collect();
    let (score, gain, caption) = match variant {
        "luong-dot" => (LuongScore::Dot, 10.0, "Luong dot scoring, sᵀh."),
        "luong-general" => (
            LuongScore::General {
                w: HostTensor::new([DIM + 1, DIM + 1], identity)?,
            },
            1.0,
            "Luong general scoring, sᵀWh (W = 10·I).",
        ),
        _ => {
            let (w1, w2, v) = bump_weights(3.0, 1.0, 0.6);
            let width = DIM + 1;
            let w = (0..2 * DIM)
                .flat_map(|row| {
                    w1[row * width..(row + 1) * width]
                        .iter()
                        .chain(&w2[row * width..(row + 1) * width])
                        .copied()
                        .collect::<Vec<_>>()
                })
                .collect();
            (
                LuongScore::Concat {
                    w: HostTensor::new([2 * DIM, 2 * width], w)?,
                    v: HostTensor::new([2 * DIM], v)?,
                },
                1.0,
                "Luong concat scoring, vᵀ tanh(W [s; h]).",
            )
        }
    };
    let layer = LuongAttention::new(score)?;
    let (s, h) = states(gain)?;
    let out = layer.forward(engine, &s, &h, None, true).await?;
    let weights = out.weights.as_ref().map_or(&[][..], |t| t.data());
    let (_, exact) = layer.oracle::<f64>(&s, &h, None)?;
    let (_, plain) = layer.oracle::<f32>(&s, &h, None)?;
    let report = compare(weights, &exact, &plain, DEFAULT_FLOOR);
    Ok(result(weights, &report, path, caption))
}
