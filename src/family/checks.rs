//! A compact certification set for the attention family: every member once,
//! at small awkward sizes, against its f64 oracle with the tolerance rule of
//! the conformance sweep. The browser demo runs it after the sweep, and
//! `webattn check --family` natively; the tests in `tests/gpu/family_*.rs` go wider.

use super::additive::AdditiveAttention;
use super::linear::{linear_attention_oracle, LinearAttention};
use super::luong::{LuongAttention, LuongScore};
use super::mha::{KvCache, MhaWeights, MultiHeadAttention};
use super::position::{rope_oracle, sinusoidal_oracle, Rope, RopeLayout, Sinusoidal};
use crate::conformance::{compare, ErrorReport, DEFAULT_FLOOR};
use crate::engine::Engine;
use crate::error::Result;
use crate::options::AttentionOptions;
use crate::rng::SplitMix64;
use crate::tensor::HostTensor;

/// One family check: its name, shapes in words, and the worst of its outputs'
/// error reports (by share of the error allowed).
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyCheck {
    /// A short name (`mha-cross`, `rope-half-split`, ...).
    pub name: &'static str,
    /// The sizes, in words.
    pub shapes: String,
    /// The worst report of the check's outputs.
    pub report: ErrorReport,
}

impl FamilyCheck {
    /// Whether every output was within tolerance.
    pub fn passed(&self) -> bool {
        self.report.passed()
    }
}

/// The names of the checks [`run_family_checks`] runs, in order.
pub const FAMILY_CHECKS: [&str; 14] = [
    "sinusoidal",
    "rope-interleaved",
    "rope-half-split",
    "mha-self-causal-gqa",
    "mha-cross-mqa",
    "mha-rope-alibi-temperature",
    "mha-kv-cache",
    "bahdanau-padding",
    "luong-dot",
    "luong-general",
    "luong-concat",
    "linear-causal",
    "linear",
    "temperature-alibi",
];

fn tensor(shape: &[usize], seed: u64, scale: f32) -> Result<HostTensor> {
    let len = shape.iter().product();
    HostTensor::new(shape.to_vec(), SplitMix64::new(seed).normal_vec(len, scale))
}

/// The worse of two reports, by share of the error allowed.
fn worse(a: ErrorReport, b: ErrorReport) -> ErrorReport {
    if b.share_of_allowed() > a.share_of_allowed() || !b.passed() {
        b
    } else {
        a
    }
}

fn check(name: &'static str, shapes: String, report: ErrorReport) -> FamilyCheck {
    FamilyCheck {
        name,
        shapes,
        report,
    }
}

async fn mha_check(
    engine: &Engine,
    mha: &MultiHeadAttention,
    query: &HostTensor,
    key_value: Option<&HostTensor>,
    options: &AttentionOptions,
) -> Result<ErrorReport> {
    let got = mha.forward(engine, query, key_value, options, true).await?;
    let (out, weights) = mha.oracle::<f64>(query, key_value, options)?;
    let (plain_out, plain_weights) = mha.oracle::<f32>(query, key_value, options)?;
    let output = compare(got.output.data(), &out, &plain_out, DEFAULT_FLOOR);
    let w = got.weights.as_ref().map_or(&[][..], |t| t.data());
    Ok(worse(
        output,
        compare(w, &weights, &plain_weights, DEFAULT_FLOOR),
    ))
}

/// Rows `start .. start + len` of both batch entries of a `[2, 8, 24]` sequence.
fn step_rows<T: Copy>(data: &[T], start: usize, len: usize) -> Vec<T> {
    (0..2)
        .flat_map(|b| data[(b * 8 + start) * 24..(b * 8 + start + len) * 24].to_vec())
        .collect()
}

/// The checks' results so far, each reported to `progress` as it is added.
struct Results<F> {
    list: Vec<FamilyCheck>,
    progress: F,
}

impl<F: FnMut(&FamilyCheck)> Results<F> {
    /// Reports the check to `progress`, then keeps it.
    fn push(&mut self, c: FamilyCheck) {
        (self.progress)(&c);
        self.list.push(c);
    }
}

/// Runs every check of [`FAMILY_CHECKS`] on `engine`, calling `progress` after each.
pub async fn run_family_checks(
    engine: &Engine,
    seed: u64,
    progress: impl FnMut(&FamilyCheck),
) -> Result<Vec<FamilyCheck>> {
    let mut results = Results {
        list: Vec::new(),
        progress,
    };
    position_checks(engine, seed, &mut results).await?;
    mha_checks(engine, seed, &mut results).await?;
    kv_cache_check(engine, seed, &mut results).await?;
    additive_check(engine, seed, &mut results).await?;
    luong_checks(engine, seed, &mut results).await?;
    linear_checks(engine, seed, &mut results).await?;
    engine_attention_check(engine, seed, &mut results).await?;
    Ok(results.list)
}

/// The position encodings: `sinusoidal`, `rope-interleaved`, `rope-half-split`.
async fn position_checks<F: FnMut(&FamilyCheck)>(
    engine: &Engine,
    seed: u64,
    results: &mut Results<F>,
) -> Result<()> {
    let x = tensor(&[2, 97, 33], seed, 1.0)?;
    let encoding = Sinusoidal {
        offset: 7,
        ..Default::default()
    };
    let got = encoding.add_to(engine, &x).await?;
    let report = compare(
        got.data(),
        &sinusoidal_oracle::<f64>(&x, encoding.base, 7)?,
        &sinusoidal_oracle::<f32>(&x, encoding.base, 7)?,
        DEFAULT_FLOOR,
    );
    results.push(check(
        "sinusoidal",
        "[2, 97, 33] from position 7".into(),
        report,
    ));

    for (name, layout, shape, offset) in [
        (
            "rope-interleaved",
            RopeLayout::Interleaved,
            [1, 2, 97, 64],
            1000,
        ),
        ("rope-half-split", RopeLayout::HalfSplit, [1, 3, 33, 18], 0),
    ] {
        let x = tensor(&shape, seed ^ 1, 1.0)?;
        let rope = Rope {
            layout,
            offset,
            ..Default::default()
        };
        let got = rope.apply(engine, &x).await?;
        let report = compare(
            got.data(),
            &rope_oracle::<f64>(&x, &rope)?,
            &rope_oracle::<f32>(&x, &rope)?,
            DEFAULT_FLOOR,
        );
        results.push(check(
            name,
            format!("{shape:?} from position {offset}"),
            report,
        ));
    }
    Ok(())
}

/// Multi-head attention: `mha-self-causal-gqa`, `mha-cross-mqa`,
/// `mha-rope-alibi-temperature`.
async fn mha_checks<F: FnMut(&FamilyCheck)>(
    engine: &Engine,
    seed: u64,
    results: &mut Results<F>,
) -> Result<()> {
    let causal = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let mha = MultiHeadAttention::new(MhaWeights::random(24, 24, 4, 2, 6, seed)?, 4, 2)?;
    let x = tensor(&[2, 33, 24], seed ^ 2, 1.0)?;
    let report = mha_check(engine, &mha, &x, None, &causal).await?;
    results.push(check(
        "mha-self-causal-gqa",
        "B2 N33 d_model 24, 4 heads / 2 KV heads of 6".into(),
        report,
    ));

    let cross = MultiHeadAttention::new(MhaWeights::random(24, 20, 3, 1, 8, seed ^ 3)?, 3, 1)?;
    let (q, memory) = (
        tensor(&[2, 7, 24], seed ^ 4, 1.0)?,
        tensor(&[2, 97, 20], seed ^ 5, 1.0)?,
    );
    let report = mha_check(engine, &cross, &q, Some(&memory), &Default::default()).await?;
    results.push(check(
        "mha-cross-mqa",
        "B2 N7 onto M97 (20 features), 3 heads / 1 KV head".into(),
        report,
    ));

    let rotary = MultiHeadAttention::new(MhaWeights::random(32, 32, 8, 2, 4, seed ^ 6)?, 8, 2)?
        .with_rope(Rope {
            layout: RopeLayout::HalfSplit,
            ..Default::default()
        })?;
    let options = AttentionOptions {
        is_causal: true,
        alibi: true,
        temperature: 0.7,
        ..Default::default()
    };
    let x = tensor(&[1, 40, 32], seed ^ 7, 1.0)?;
    let report = mha_check(engine, &rotary, &x, None, &options).await?;
    results.push(check(
        "mha-rope-alibi-temperature",
        "B1 N40 d_model 32, 8 heads / 2 KV heads".into(),
        report,
    ));
    Ok(())
}

/// `mha-kv-cache`: the KV-cache decoder, a prompt of 5, then 3 single steps,
/// each step's rows against the oracle's full causal run.
async fn kv_cache_check<F: FnMut(&FamilyCheck)>(
    engine: &Engine,
    seed: u64,
    results: &mut Results<F>,
) -> Result<()> {
    let causal = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let decoder = MultiHeadAttention::new(MhaWeights::random(24, 24, 4, 2, 6, seed ^ 8)?, 4, 2)?
        .with_rope(Rope::default())?;
    let x = tensor(&[2, 8, 24], seed ^ 9, 1.0)?;
    let (exact, _) = decoder.oracle::<f64>(&x, None, &causal)?;
    let (plain, _) = decoder.oracle::<f32>(&x, None, &causal)?;
    let mut cache = KvCache::new();
    let mut reports = Vec::new();
    let mut start = 0;
    for len in [5, 1, 1, 1] {
        let step = HostTensor::new([2, len, 24], step_rows(x.data(), start, len))?;
        let got = decoder
            .forward_cached(engine, &step, &mut cache, &Default::default(), false)
            .await?;
        reports.push(compare(
            got.output.data(),
            &step_rows(&exact, start, len),
            &step_rows(&plain, start, len),
            DEFAULT_FLOOR,
        ));
        start += len;
    }
    let report = reports
        .into_iter()
        .reduce(worse)
        .ok_or(crate::Error::Conflict("the KV-cache check ran no step"))?;
    results.push(check(
        "mha-kv-cache",
        "prompt 5 then 3 steps, B2, RoPE".into(),
        report,
    ));
    Ok(())
}

/// `bahdanau-padding`: additive scoring with source padding (one batch entry
/// keeps 40 of 97).
async fn additive_check<F: FnMut(&FamilyCheck)>(
    engine: &Engine,
    seed: u64,
    results: &mut Results<F>,
) -> Result<()> {
    let (d_s, d_h, d_a) = (12, 20, 9);
    let bahdanau = AdditiveAttention::new(
        tensor(&[d_a, d_s], seed ^ 16, 0.4)?,
        tensor(&[d_a, d_h], seed ^ 17, 0.4)?,
        tensor(&[d_a], seed ^ 18, 1.0)?,
    )?;
    let (s, h) = (
        tensor(&[2, 7, d_s], seed ^ 19, 1.0)?,
        tensor(&[2, 97, d_h], seed ^ 20, 1.0)?,
    );
    let lengths = [97, 40];
    let got = bahdanau
        .forward(engine, &s, &h, Some(&lengths), true)
        .await?;
    let (context, weights) = bahdanau.oracle::<f64>(&s, &h, Some(&lengths))?;
    let (plain_context, plain_weights) = bahdanau.oracle::<f32>(&s, &h, Some(&lengths))?;
    let w = got.weights.as_ref().map_or(&[][..], |t| t.data());
    let report = worse(
        compare(got.output.data(), &context, &plain_context, DEFAULT_FLOOR),
        compare(w, &weights, &plain_weights, DEFAULT_FLOOR),
    );
    results.push(check(
        "bahdanau-padding",
        "B2 Nq7 Nk97 (lengths 97, 40), d_s 12 d_h 20 d_a 9".into(),
        report,
    ));
    Ok(())
}

/// Luong's scores: `luong-dot`, `luong-general`, `luong-concat`.
async fn luong_checks<F: FnMut(&FamilyCheck)>(
    engine: &Engine,
    seed: u64,
    results: &mut Results<F>,
) -> Result<()> {
    let (s, h) = (
        tensor(&[2, 33, 12], seed ^ 21, 1.0)?,
        tensor(&[2, 7, 12], seed ^ 22, 1.0)?,
    );
    for (name, score) in [
        ("luong-dot", LuongScore::Dot),
        (
            "luong-general",
            LuongScore::General {
                w: tensor(&[12, 12], seed ^ 23, 0.5)?,
            },
        ),
        (
            "luong-concat",
            LuongScore::Concat {
                w: tensor(&[10, 24], seed ^ 24, 0.4)?,
                v: tensor(&[10], seed ^ 25, 1.0)?,
            },
        ),
    ] {
        let layer = LuongAttention::new(score)?;
        let got = layer.forward(engine, &s, &h, Some(&[7, 3]), true).await?;
        let (context, weights) = layer.oracle::<f64>(&s, &h, Some(&[7, 3]))?;
        let (plain_context, plain_weights) = layer.oracle::<f32>(&s, &h, Some(&[7, 3]))?;
        let w = got.weights.as_ref().map_or(&[][..], |t| t.data());
        let report = worse(
            compare(got.output.data(), &context, &plain_context, DEFAULT_FLOOR),
            compare(w, &weights, &plain_weights, DEFAULT_FLOOR),
        );
        results.push(check(
            name,
            "B2 Nq33 Nk7 (lengths 7, 3), d 12".into(),
            report,
        ));
    }
    Ok(())
}

/// Linear attention: `linear-causal`, `linear`.
async fn linear_checks<F: FnMut(&FamilyCheck)>(
    engine: &Engine,
    seed: u64,
    results: &mut Results<F>,
) -> Result<()> {
    for (name, causal, (n, m, dk, dv)) in [
        ("linear-causal", true, (97, 97, 16, 8)),
        ("linear", false, (33, 97, 12, 20)),
    ] {
        let q = tensor(&[1, 2, n, dk], seed ^ 10, 1.0)?;
        let k = tensor(&[1, 2, m, dk], seed ^ 11, 1.0)?;
        let v = tensor(&[1, 2, m, dv], seed ^ 12, 1.0)?;
        let got = LinearAttention::new(causal)
            .forward(engine, &q, &k, &v, true)
            .await?;
        let exact = linear_attention_oracle::<f64>(&q, &k, &v, causal, true)?;
        let plain = linear_attention_oracle::<f32>(&q, &k, &v, causal, true)?;
        let output = compare(
            got.output.data(),
            &exact.output,
            &plain.output,
            DEFAULT_FLOOR,
        );
        let w = got.weights.as_ref().map_or(&[][..], |t| t.data());
        let report = worse(
            output,
            compare(w, &exact.weights, &plain.weights, DEFAULT_FLOOR),
        );
        results.push(check(name, format!("H2 N{n} M{m} Dk{dk} Dv{dv}"), report));
    }
    Ok(())
}

/// `temperature-alibi`: temperature and ALiBi on the engine's own attention
/// (the sweep covers them on every path; this runs them on the default one).
async fn engine_attention_check<F: FnMut(&FamilyCheck)>(
    engine: &Engine,
    seed: u64,
    results: &mut Results<F>,
) -> Result<()> {
    let (q, k, v) = (
        tensor(&[1, 6, 33, 16], seed ^ 13, 1.0)?,
        tensor(&[1, 3, 97, 16], seed ^ 14, 1.0)?,
        tensor(&[1, 3, 97, 8], seed ^ 15, 1.0)?,
    );
    let options = AttentionOptions {
        alibi: true,
        temperature: 0.5,
        qk_matmul_output_mode: Some(crate::QkMatmulOutputMode::Probabilities),
        ..Default::default()
    };
    let inputs = crate::AttentionInputs::new(&q, &k, &v);
    let got = engine.attention_host(&inputs, &options).await?;
    let exact = crate::cpu::attention_exact(&inputs, &options)?;
    let plain = crate::cpu::attention_plain_f32(&inputs, &options)?;
    let y = compare(got.y.data(), &exact.y, &plain.y, DEFAULT_FLOOR);
    let probs = got.qk_matmul_output.as_ref().map_or(&[][..], |t| t.data());
    let report = worse(y, compare(probs, &exact.qk, &plain.qk, DEFAULT_FLOOR));
    results.push(check(
        "temperature-alibi",
        "6/3 heads, N33 M97, temperature 0.5".into(),
        report,
    ));
    Ok(())
}

/// The results as a table, ending with the `N passed, N failed` line.
pub fn family_table(results: &[FamilyCheck]) -> String {
    let mut out = format!(
        "{:<28} {:<52} {:>10} {:>10}  result\n",
        "check", "shapes", "max abs", "allowed"
    );
    for r in results {
        out += &format!(
            "{:<28} {:<52} {:>10.2e} {:>10.2e}  {}\n",
            r.name,
            r.shapes,
            r.report.max_abs,
            r.report.allowed,
            if r.passed() { "pass" } else { "FAIL" }
        );
    }
    let passed = results.iter().filter(|r| r.passed()).count();
    out += &format!("{passed} passed, {} failed", results.len() - passed);
    out
}
