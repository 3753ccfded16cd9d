//! Additive (Bahdanau) and multiplicative (Luong: dot, general, concat)
//! attention on the GPU and on the CPU engine (the fast CPU backend) against
//! their f64 oracles, with the plain f32 oracle setting the tolerance: awkward
//! sizes, batches with source padding (one fully masked), saturated tanh,
//! weights and raw scores checked. Also typed errors for bad shapes.

use crate::common;

use webattn::conformance::{compare, ErrorReport, DEFAULT_FLOOR};
use webattn::cpu::Real;
use webattn::family::additive::AdditiveAttention;
use webattn::family::luong::{LuongAttention, LuongScore};
use webattn::family::Attended;
use webattn::rng::SplitMix64;
use webattn::{Engine, Error, HostTensor, Result};

/// The engines each case runs on: the CPU engine always, the GPU when there is one.
fn engines() -> Vec<&'static Engine> {
    static CPU: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    let mut engines = vec![CPU.get_or_init(Engine::cpu)];
    engines.extend(common::gpu());
    engines
}

/// Either family member, so one harness checks both.
trait Variant {
    fn forward(
        &self,
        engine: &Engine,
        s: &HostTensor,
        h: &HostTensor,
        lengths: Option<&[usize]>,
    ) -> Result<Attended>;
    fn scores(
        &self,
        engine: &Engine,
        s: &HostTensor,
        h: &HostTensor,
        lengths: Option<&[usize]>,
    ) -> Result<HostTensor>;
    fn oracle<F: Real>(
        &self,
        s: &HostTensor,
        h: &HostTensor,
        lengths: Option<&[usize]>,
    ) -> (Vec<F>, Vec<F>);
    fn scores_oracle<F: Real>(
        &self,
        s: &HostTensor,
        h: &HostTensor,
        lengths: Option<&[usize]>,
    ) -> Vec<F>;
}

macro_rules! impl_variant {
    ($t:ty) => {
        impl Variant for $t {
            fn forward(
                &self,
                engine: &Engine,
                s: &HostTensor,
                h: &HostTensor,
                lengths: Option<&[usize]>,
            ) -> Result<Attended> {
                self.forward_blocking(engine, s, h, lengths, true)
            }
            fn scores(
                &self,
                engine: &Engine,
                s: &HostTensor,
                h: &HostTensor,
                lengths: Option<&[usize]>,
            ) -> Result<HostTensor> {
                self.scores_blocking(engine, s, h, lengths)
            }
            fn oracle<F: Real>(
                &self,
                s: &HostTensor,
                h: &HostTensor,
                lengths: Option<&[usize]>,
            ) -> (Vec<F>, Vec<F>) {
                <$t>::oracle(self, s, h, lengths).expect("the oracle accepts the case")
            }
            fn scores_oracle<F: Real>(
                &self,
                s: &HostTensor,
                h: &HostTensor,
                lengths: Option<&[usize]>,
            ) -> Vec<F> {
                <$t>::scores_oracle(self, s, h, lengths).expect("the oracle accepts the case")
            }
        }
    };
}

impl_variant!(AdditiveAttention);
impl_variant!(LuongAttention);

/// One problem: sizes, source lengths, and the spread of the inputs.
struct Case {
    name: &'static str,
    batch: usize,
    q_len: usize,
    k_len: usize,
    d_s: usize,
    d_h: usize,
    lengths: Option<Vec<usize>>,
    /// Standard deviation of the states.
    spread: f32,
}

impl Case {
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: &'static str,
        batch: usize,
        q_len: usize,
        k_len: usize,
        d_s: usize,
        d_h: usize,
        lengths: Option<&[usize]>,
        spread: f32,
    ) -> Case {
        Case {
            name,
            batch,
            q_len,
            k_len,
            d_s,
            d_h,
            lengths: lengths.map(<[usize]>::to_vec),
            spread,
        }
    }

    fn states(&self, rng: &mut SplitMix64) -> (HostTensor, HostTensor) {
        let (b, nq, nk) = (self.batch, self.q_len, self.k_len);
        let s = HostTensor::new(
            [b, nq, self.d_s],
            rng.normal_vec(b * nq * self.d_s, self.spread),
        );
        let h = HostTensor::new(
            [b, nk, self.d_h],
            rng.normal_vec(b * nk * self.d_h, self.spread),
        );
        (s.expect("s"), h.expect("h"))
    }
}

fn tensor(shape: &[usize], rng: &mut SplitMix64, scale: f32) -> HostTensor {
    let len = shape.iter().product();
    HostTensor::new(shape.to_vec(), rng.normal_vec(len, scale)).expect("tensor")
}

fn report(what: &str, got: &[f32], exact: &[f64], plain: &[f32]) -> ErrorReport {
    let r = compare(got, exact, plain, DEFAULT_FLOOR);
    println!(
        "  {what:<8} max_abs {:.3e} allowed {:.3e} (plain f32 {:.3e}){}",
        r.max_abs,
        r.allowed,
        r.baseline_abs,
        if r.passed() { "" } else { "  FAIL" }
    );
    r
}

/// Runs `variant` on `engine` and checks context, weights and scores against
/// the f64 oracle; returns whether all three passed.
fn check(engine: &Engine, label: &str, variant: &impl Variant, case: &Case, seed: u64) -> bool {
    let mut rng = SplitMix64::new(seed);
    let (s, h) = case.states(&mut rng);
    let lengths = case.lengths.as_deref();
    println!(
        "{label} {} on {}: B {} Nq {} Nk {} d_s {} d_h {} lengths {:?} spread {}",
        case.name,
        if engine.gpu().is_some() {
            "the GPU"
        } else {
            "the CPU"
        },
        case.batch,
        case.q_len,
        case.k_len,
        case.d_s,
        case.d_h,
        lengths,
        case.spread
    );
    let got = variant
        .forward(engine, &s, &h, lengths)
        .unwrap_or_else(|e| panic!("{label} {}: {e}", case.name));
    let weights = got.weights.expect("weights were asked for");
    assert_eq!(got.output.shape(), [case.batch, case.q_len, case.d_h]);
    assert_eq!(weights.shape(), [case.batch, case.q_len, case.k_len]);
    let (context64, weights64) = variant.oracle::<f64>(&s, &h, lengths);
    let (context32, weights32) = variant.oracle::<f32>(&s, &h, lengths);
    let mut ok = report("context", got.output.data(), &context64, &context32).passed();
    ok &= report("weights", weights.data(), &weights64, &weights32).passed();

    let scores = variant
        .scores(engine, &s, &h, lengths)
        .unwrap_or_else(|e| panic!("{label} {} scores: {e}", case.name));
    let scores64 = variant.scores_oracle::<f64>(&s, &h, lengths);
    let scores32 = variant.scores_oracle::<f32>(&s, &h, lengths);
    ok &= report("scores", scores.data(), &scores64, &scores32).passed();

    // A batch entry with no source states: zero context and weights, no NaN.
    for (b, _) in lengths
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter(|(_, &l)| l == 0)
    {
        let rows = case.q_len;
        let c = &got.output.data()[b * rows * case.d_h..(b + 1) * rows * case.d_h];
        let w = &weights.data()[b * rows * case.k_len..(b + 1) * rows * case.k_len];
        assert!(c.iter().chain(w).all(|&x| x == 0.0), "batch {b} not zero");
    }
    ok
}

fn bahdanau(rng: &mut SplitMix64, d_s: usize, d_h: usize, d_a: usize) -> AdditiveAttention {
    // Weights scaled so W s has unit spread for unit-spread states.
    let w1 = tensor(&[d_a, d_s], rng, 1.0 / (d_s as f32).sqrt());
    let w2 = tensor(&[d_a, d_h], rng, 1.0 / (d_h as f32).sqrt());
    let v = tensor(&[d_a], rng, 1.0);
    AdditiveAttention::new(w1, w2, v).expect("valid parameters")
}

#[test]
fn bahdanau_matches_the_oracle() {
    let seed = common::seed();
    // (case, d_a): d_a 70 and 130 end in a partial slice of 32.
    let cases = [
        (Case::new("one state", 1, 1, 1, 3, 5, None, 1.0), 7),
        (
            Case::new("decode, padded", 3, 1, 97, 13, 11, Some(&[97, 40, 0]), 1.0),
            19,
        ),
        (
            Case::new("7 x 257", 2, 7, 257, 10, 6, Some(&[257, 100]), 1.0),
            33,
        ),
        (Case::new("97 x 1025", 2, 97, 1025, 5, 9, None, 1.0), 37),
        (
            Case::new("257 x 1025", 2, 257, 1025, 17, 23, Some(&[1000, 1025]), 1.0),
            130,
        ),
        (
            Case::new("1025 x 7", 2, 1025, 7, 6, 7, Some(&[7, 3]), 1.0),
            70,
        ),
        (
            Case::new("saturated", 2, 257, 257, 7, 5, Some(&[0, 200]), 8.0),
            21,
        ),
    ];
    let mut failed = Vec::new();
    for engine in engines() {
        for (i, (case, d_a)) in cases.iter().enumerate() {
            let mut rng = SplitMix64::new(seed ^ (0xadd0 + i as u64));
            let model = bahdanau(&mut rng, case.d_s, case.d_h, *d_a);
            if !check(
                engine,
                &format!("bahdanau d_a {d_a}"),
                &model,
                case,
                seed + i as u64,
            ) {
                failed.push(case.name);
            }
        }
    }
    assert!(failed.is_empty(), "bahdanau cases failed: {failed:?}");
}

#[test]
fn luong_matches_the_oracle() {
    let seed = common::seed();
    let mut rng = SplitMix64::new(seed ^ 0x1c0e);
    let dot = LuongAttention::new(LuongScore::Dot).expect("dot");
    let scaled = LuongAttention::new(LuongScore::Dot)
        .and_then(|l| l.with_scale(1.0 / 13f32.sqrt()))
        .expect("scaled dot");
    let general = |d_s: usize, d_h: usize, rng: &mut SplitMix64| {
        let w = tensor(&[d_s, d_h], rng, 1.0 / (d_h as f32).sqrt());
        LuongAttention::new(LuongScore::General { w }).expect("general")
    };
    let concat = |d_a: usize, d_s: usize, d_h: usize, rng: &mut SplitMix64| {
        let w = tensor(&[d_a, d_s + d_h], rng, 1.0 / ((d_s + d_h) as f32).sqrt());
        let v = tensor(&[d_a], rng, 1.0);
        LuongAttention::new(LuongScore::Concat { w, v }).expect("concat")
    };
    let checks: Vec<(&str, LuongAttention, Case)> = vec![
        (
            "dot",
            dot.clone(),
            Case::new("7 x 97, padded", 2, 7, 97, 13, 13, Some(&[97, 0]), 1.0),
        ),
        (
            "dot",
            dot,
            Case::new("large logits", 3, 1025, 97, 13, 13, Some(&[1, 50, 97]), 3.0),
        ),
        (
            "dot scaled",
            scaled,
            Case::new("1 x 1025", 2, 1, 1025, 13, 13, None, 1.0),
        ),
        (
            "general",
            general(6, 10, &mut rng),
            Case::new("97 x 257, padded", 2, 97, 257, 6, 10, Some(&[250, 1]), 1.0),
        ),
        (
            "general",
            general(9, 3, &mut rng),
            Case::new("1025 x 7", 2, 1025, 7, 9, 3, None, 1.0),
        ),
        (
            "concat",
            concat(11, 5, 3, &mut rng),
            Case::new(
                "7 x 1025, padded",
                2,
                7,
                1025,
                5,
                3,
                Some(&[1025, 513]),
                1.0,
            ),
        ),
        (
            "concat",
            concat(3, 1, 2, &mut rng),
            Case::new("one state", 1, 1, 1, 1, 2, None, 1.0),
        ),
        (
            "concat",
            concat(45, 7, 6, &mut rng),
            Case::new("saturated", 2, 257, 97, 7, 6, Some(&[0, 96]), 8.0),
        ),
    ];
    let mut failed = Vec::new();
    for engine in engines() {
        for (i, (label, model, case)) in checks.iter().enumerate() {
            if !check(
                engine,
                &format!("luong {label}"),
                model,
                case,
                seed + i as u64,
            ) {
                failed.push(format!("{label} {}", case.name));
            }
        }
    }
    assert!(failed.is_empty(), "luong cases failed: {failed:?}");
}

/// The CPU engine computes in f32 on the fast CPU backend: within the
/// tolerance of the f64 oracle, masked keys -inf, a fully padded batch entry
/// zero, the weights only when asked for.
#[test]
fn cpu_engine_matches_the_oracle_and_masks() {
    let engine = Engine::cpu();
    let mut rng = SplitMix64::new(common::seed());
    let case = Case::new("cpu", 2, 5, 9, 3, 4, Some(&[9, 0]), 1.0);
    let (s, h) = case.states(&mut rng);
    let lengths = case.lengths.as_deref();
    let bahdanau = bahdanau(&mut rng, 3, 4, 6);
    let luong = LuongAttention::new(LuongScore::General {
        w: tensor(&[3, 4], &mut rng, 0.5),
    })
    .expect("general");
    let expect = |got: Attended,
                  (context, weights): (Vec<f64>, Vec<f64>),
                  (plain_context, plain_weights): (Vec<f32>, Vec<f32>)| {
        assert!(report("context", got.output.data(), &context, &plain_context).passed());
        let got_weights = got.weights.expect("weights");
        assert!(report("weights", got_weights.data(), &weights, &plain_weights).passed());
        // The fully masked batch entry: zeros.
        assert!(got.output.data()[20..].iter().all(|&x| x == 0.0));
        assert!(got_weights.data()[45..].iter().all(|&x| x == 0.0));
    };
    expect(
        bahdanau
            .forward_blocking(&engine, &s, &h, lengths, true)
            .expect("bahdanau on the CPU"),
        bahdanau.oracle(&s, &h, lengths).expect("oracle"),
        bahdanau.oracle(&s, &h, lengths).expect("plain"),
    );
    expect(
        luong
            .forward_blocking(&engine, &s, &h, lengths, true)
            .expect("luong on the CPU"),
        luong.oracle(&s, &h, lengths).expect("oracle"),
        luong.oracle(&s, &h, lengths).expect("plain"),
    );
    let without = bahdanau
        .forward_blocking(&engine, &s, &h, None, false)
        .expect("bahdanau without weights");
    assert!(without.weights.is_none());
    let scores = bahdanau
        .scores_blocking(&engine, &s, &h, lengths)
        .expect("scores");
    assert_eq!(scores.shape(), [2, 5, 9]);
    assert!(scores.data()[45..].iter().all(|&x| x == f32::NEG_INFINITY));
}

/// Bad shapes and lengths are typed errors on both backends.
#[test]
fn bad_shapes_are_typed_errors() {
    let z = |shape: &[usize]| HostTensor::zeros(shape.to_vec()).expect("zeros");
    assert!(matches!(
        AdditiveAttention::new(z(&[4, 3]), z(&[5, 2]), z(&[4])),
        Err(Error::ShapeMismatch { tensor: "w2", .. })
    ));
    assert!(matches!(
        AdditiveAttention::new(z(&[4, 3]), z(&[4, 2]), z(&[4, 1])),
        Err(Error::Rank { tensor: "v", .. })
    ));
    assert!(matches!(
        LuongAttention::new(LuongScore::Concat {
            w: z(&[4, 3]),
            v: z(&[3])
        }),
        Err(Error::ShapeMismatch { tensor: "v", .. })
    ));
    assert!(matches!(
        LuongAttention::new(LuongScore::Dot).and_then(|l| l.with_scale(f32::NAN)),
        Err(Error::InvalidOption { name: "scale", .. })
    ));

    let additive = AdditiveAttention::new(z(&[4, 3]), z(&[4, 2]), z(&[4])).expect("valid");
    let dot = LuongAttention::new(LuongScore::Dot).expect("dot");
    let concat = LuongAttention::new(LuongScore::Concat {
        w: z(&[4, 5]),
        v: z(&[4]),
    })
    .expect("concat");
    let cpu = Engine::cpu();
    let mut engines = vec![&cpu];
    engines.extend(common::gpu());
    for engine in engines {
        let run = |s: &[usize], h: &[usize], lengths: Option<&[usize]>| {
            additive
                .forward_blocking(engine, &z(s), &z(h), lengths, true)
                .unwrap_err()
        };
        let err = run(&[1, 2, 4], &[1, 3, 2], None);
        assert!(
            matches!(
                err,
                Error::ShapeMismatch {
                    tensor: "s",
                    dim: "d_s",
                    got: 4,
                    expected: 3,
                    ..
                }
            ),
            "{err}"
        );
        let err = run(&[1, 2, 3], &[2, 3, 2], None);
        assert!(
            matches!(
                err,
                Error::ShapeMismatch {
                    tensor: "h",
                    dim: "batch",
                    ..
                }
            ),
            "{err}"
        );
        let err = run(&[2, 3], &[1, 3, 2], None);
        assert!(matches!(err, Error::Rank { tensor: "s", .. }), "{err}");
        let err = run(&[1, 0, 3], &[1, 3, 2], None);
        assert!(
            matches!(err, Error::EmptyTensor { tensor: "s", .. }),
            "{err}"
        );
        let err = run(&[2, 2, 3], &[2, 3, 2], Some(&[3]));
        assert!(
            matches!(
                err,
                Error::ShapeMismatch {
                    tensor: "source_lengths",
                    ..
                }
            ),
            "{err}"
        );
        let err = run(&[2, 2, 3], &[2, 3, 2], Some(&[3, 4]));
        assert!(
            matches!(
                err,
                Error::InvalidOption {
                    name: "source_lengths",
                    ..
                }
            ),
            "{err}"
        );
        let err = dot
            .forward_blocking(engine, &z(&[1, 2, 3]), &z(&[1, 2, 4]), None, false)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::ShapeMismatch {
                    tensor: "h",
                    dim: "d_h",
                    ..
                }
            ),
            "{err}"
        );
        let err = concat
            .forward_blocking(engine, &z(&[1, 2, 3]), &z(&[1, 2, 3]), None, false)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::ShapeMismatch {
                    tensor: "w",
                    expected: 6,
                    ..
                }
            ),
            "{err}"
        );
        println!("{}: {err}", engine.describe());
    }
}

/// On a driver with a loop budget, an attention dimension beyond it is a
/// typed limit error rather than silently truncated scores.
#[test]
fn an_attention_dimension_beyond_the_loop_budget_is_a_limit() {
    let Some(engine) = common::gpu() else { return };
    let Some(budget) = engine.capabilities().and_then(|c| c.loop_budget()) else {
        return println!("no loop budget on {}", engine.describe());
    };
    let d_a = (budget as usize / 37 + 1) * 32;
    let additive = AdditiveAttention::new(
        HostTensor::zeros([d_a, 1]).expect("w1"),
        HostTensor::zeros([d_a, 1]).expect("w2"),
        HostTensor::zeros([d_a]).expect("v"),
    )
    .expect("valid");
    let one = HostTensor::zeros([1, 1, 1]).expect("state");
    let err = additive
        .forward_blocking(engine, &one, &one, None, true)
        .unwrap_err();
    println!("{err}");
    assert!(matches!(err, Error::Limit { .. }), "{err}");
}

/// Without `want_weights` the GPU returns no weights and the same context.
#[test]
fn weights_only_on_request() {
    let Some(engine) = common::gpu() else { return };
    let mut rng = SplitMix64::new(common::seed());
    let case = Case::new("no weights", 2, 7, 97, 5, 6, Some(&[97, 30]), 1.0);
    let (s, h) = case.states(&mut rng);
    let lengths = case.lengths.as_deref();
    let model = bahdanau(&mut rng, 5, 6, 9);
    let with = model
        .forward_blocking(engine, &s, &h, lengths, true)
        .expect("with weights");
    let without = model
        .forward_blocking(engine, &s, &h, lengths, false)
        .expect("without weights");
    assert!(with.weights.is_some() && without.weights.is_none());
    assert_eq!(with.output, without.output);
}
