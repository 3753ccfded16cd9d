//! Property tests: the validator and the whole call over random shapes,
//! broadcasts, masks, windows, softcap, GQA ratios and options, valid and not,
//! and the `.npy` reader over random and corrupted bytes. A call must end in a
//! typed error or in results within tolerance of the f64 oracle (NaN where the
//! oracle has NaN); nothing may panic.
//!
//! `WEBATTN_FUZZ_CASES` sets the number of cases of each property (default
//! 256; the validator alone runs eight times as many). The cases come from a
//! fixed seed, so a run is reproducible and CI sees the same cases as a
//! developer; `WEBATTN_FUZZ_SEED` picks another seed, or `random` a fresh one
//! per run (what to use when hunting). A failure prints the shrunk problem:
//! keep it below as a regression case.

use crate::common;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError};
use webattn::conformance::{compare_baselines, ErrorReport, DEFAULT_FLOOR};
use webattn::cpu::SumOrder;
use webattn::rng::SplitMix64;
use webattn::{
    cpu, npy, validate, AttentionInputs, AttentionOptions, Engine, Error, HostMask, HostTensor,
    KernelPath, QkMatmulOutputMode,
};

fn cases(scale: u32) -> Config {
    let base = std::env::var("WEBATTN_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256u32);
    Config {
        cases: base * scale,
        failure_persistence: None,
        rng_seed: fuzz_seed(),
        ..Config::default()
    }
}

/// The seed of the case generator: `WEBATTN_FUZZ_SEED` (a number, or
/// `random`), else a fixed one.
fn fuzz_seed() -> RngSeed {
    match std::env::var("WEBATTN_FUZZ_SEED").ok().as_deref() {
        Some("random") => RngSeed::Random,
        Some(text) => RngSeed::Fixed(
            text.parse()
                .expect("WEBATTN_FUZZ_SEED is a number or `random`"),
        ),
        None => RngSeed::Fixed(0x5eed_a77e),
    }
}

/// One attention problem, perhaps invalid, small enough for the oracle.
#[derive(Debug, Clone)]
struct Problem {
    q: Vec<usize>,
    k: Vec<usize>,
    v: Vec<usize>,
    past: Option<(Vec<usize>, Vec<usize>)>,
    mask: Option<(bool, Vec<usize>)>,
    nonpad: Option<Vec<i64>>,
    options: AttentionOptions,
    seed: u64,
}

impl Problem {
    fn inputs(&self) -> Option<Inputs> {
        let mut rng = SplitMix64::new(self.seed);
        let tensor = |shape: &[usize], rng: &mut SplitMix64| {
            let len = shape.iter().product();
            HostTensor::new(shape.to_vec(), rng.normal_vec(len, 1.0)).ok()
        };
        let mask = match &self.mask {
            None => None,
            Some((is_bool, shape)) => {
                let len: usize = shape.iter().product();
                Some(if *is_bool {
                    HostMask::bool(shape.clone(), (0..len).map(|_| rng.chance(0.8)).collect())
                        .ok()?
                } else {
                    let data = (0..len)
                        .map(|_| {
                            if rng.chance(0.1) {
                                f32::NEG_INFINITY
                            } else {
                                rng.normal()
                            }
                        })
                        .collect();
                    HostMask::float(shape.clone(), data).ok()?
                })
            }
        };
        let past = match &self.past {
            Some((pk, pv)) => Some((tensor(pk, &mut rng)?, tensor(pv, &mut rng)?)),
            None => None,
        };
        Some(Inputs {
            q: tensor(&self.q, &mut rng)?,
            k: tensor(&self.k, &mut rng)?,
            v: tensor(&self.v, &mut rng)?,
            past,
            mask,
        })
    }
}

struct Inputs {
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    past: Option<(HostTensor, HostTensor)>,
    mask: Option<HostMask>,
}

impl Inputs {
    fn as_inputs<'a>(&'a self, nonpad: Option<&'a [i64]>) -> AttentionInputs<'a, HostTensor> {
        let mut inputs = AttentionInputs::new(&self.q, &self.k, &self.v);
        if let Some((pk, pv)) = &self.past {
            inputs = inputs.with_past(pk, pv);
        }
        if let Some(m) = &self.mask {
            inputs = inputs.with_mask(m);
        }
        inputs.nonpad_kv_seqlen = nonpad;
        inputs
    }
}

/// A dimension: usually `good`, sometimes another small size (0 included).
fn dim(good: usize, wild: bool) -> impl Strategy<Value = usize> {
    if wild {
        prop_oneof![20 => Just(good), 1 => 0..6usize].boxed()
    } else {
        Just(good).boxed()
    }
}

/// A window size: unbounded (-1), a few keys, or now and then out of the domain (-2).
fn window() -> impl Strategy<Value = i64> {
    prop_oneof![3 => Just(-1i64), 4 => 0..6i64, 1 => Just(-2i64)]
}

/// Problems that are mostly valid; `wild` also bends shapes and options out
/// of the contract.
fn problem(wild: bool) -> impl Strategy<Value = Problem> {
    (
        (
            1..=2usize,
            1..=3usize,
            1..=3usize,
            1..=20usize,
            1..=24usize,
            1..=20usize,
            1..=12usize,
        ),
        (
            any::<bool>(),
            0..4usize,
            0..6usize,
            any::<bool>(),
            any::<bool>(),
        ),
        (
            any::<bool>(),
            window(),
            window(),
            prop_oneof![Just(0.0f32), 0.5..30.0f32],
        ),
        (
            prop::option::of(0..4u8),
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
        ),
        (
            prop_oneof![3 => Just(1.0f32), 1 => 0.25..4.0f32],
            prop::option::of(0.05..2.0f32),
        ),
    )
        .prop_flat_map(move |(sizes, masks, rules, outputs, scales)| {
            let (b, kv_heads, group, nq, nk, dk, dv) = sizes;
            let hq = kv_heads * group;
            let (past_len, short_mask) = (masks.2.min(4) * usize::from(masks.4), masks.3);
            let total = past_len + nk;
            (
                (dim(b, wild), dim(hq, wild), dim(nq, wild), dim(dk, wild)),
                (
                    dim(b, wild),
                    dim(kv_heads, wild),
                    dim(nk, wild),
                    dim(dk, wild),
                    dim(dv, wild),
                ),
                prop::option::of(prop::collection::vec(
                    if wild {
                        (-1i64..=(total as i64 + 1)).boxed()
                    } else {
                        (0i64..=nk as i64).boxed()
                    },
                    b..=b + usize::from(wild),
                )),
                Just((b, hq, kv_heads, nq, nk, dk, dv, past_len, total, short_mask)),
                Just((masks, rules, outputs, scales)),
                any::<bool>(),
            )
        })
        .prop_map(|(qd, kd, nonpad, sizes, flags, use_nonpad)| {
            let (b, hq, kv_heads, nq, _nk, _dk, dv, past_len, total, short_mask) = sizes;
            let ((mask_on, mask_rank, _, _, _), rules, outputs, scales) = flags;
            let mask = (mask_on && mask_rank > 0).then(|| {
                let last = if short_mask {
                    total.div_ceil(2).max(1)
                } else {
                    total
                };
                let shape = match mask_rank {
                    1 => vec![last],
                    2 => vec![nq, last],
                    3 => vec![hq, 1, last],
                    _ => vec![b, 1, nq, last],
                };
                (rules.0, shape)
            });
            let past = (past_len > 0).then(|| {
                (
                    vec![b, kv_heads, past_len, qd.3],
                    vec![b, kv_heads, past_len, dv],
                )
            });
            let (qk_mode, return_lse, return_present, seed) = outputs;
            let options = AttentionOptions {
                scale: scales.1,
                softcap: rules.3,
                is_causal: rules.0,
                left_window_size: rules.1,
                right_window_size: rules.2,
                qk_matmul_output_mode: qk_mode
                    .map(|m| QkMatmulOutputMode::from_onnx(m.into()).unwrap()),
                return_lse,
                return_present: return_present && past.is_some(),
                temperature: scales.0,
                alibi: seed % 5 == 0,
                path: KernelPath::Auto,
                precision: webattn::Precision::Highest,
            };
            Problem {
                q: vec![qd.0, qd.1, qd.2, qd.3],
                k: vec![kd.0, kd.1, kd.2, kd.3],
                v: vec![kd.0, kd.1, kd.2, kd.4],
                past,
                mask,
                nonpad: if use_nonpad && past_len == 0 {
                    nonpad
                } else {
                    None
                },
                options,
                seed,
            }
        })
}

/// Options anywhere in their domain and beyond it.
fn wild_options() -> impl Strategy<Value = AttentionOptions> {
    let float = prop_oneof![
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(-1.0f32),
        Just(0.0f32),
        Just(1e-40f32),
        0.01..10.0f32
    ];
    (
        prop::option::of(float.clone()),
        float.clone(),
        any::<bool>(),
        -3..5i64,
        -3..5i64,
        float,
        prop::option::of(0..4u8),
    )
        .prop_map(|(scale, softcap, causal, left, right, temperature, mode)| {
            AttentionOptions {
                scale,
                softcap,
                is_causal: causal,
                left_window_size: left,
                right_window_size: right,
                temperature,
                qk_matmul_output_mode: mode
                    .map(|m| QkMatmulOutputMode::from_onnx(m.into()).unwrap()),
                ..Default::default()
            }
        })
}

/// Checks `got` against the oracle under the 2x rule, the baseline being the
/// worst of the plain f32 computations in three summation orders (as
/// `webattn check` does): one order alone can be lucky by an ulp.
fn report(name: &str, got: &[f32], exact: &[f64], plains: &[&[f32]]) -> Result<(), TestCaseError> {
    let r: ErrorReport = compare_baselines(got, exact, plains, DEFAULT_FLOOR);
    prop_assert!(
        r.passed(),
        "{name}: max abs {:.3e} allowed {:.3e}, {} non-finite mismatches",
        r.max_abs,
        r.allowed,
        r.mismatched_non_finite
    );
    Ok(())
}

/// Runs a problem on `engine` through `path` and checks it against the oracle.
fn check_call(engine: &Engine, problem: &Problem, path: KernelPath) -> Result<(), TestCaseError> {
    let Some(inputs) = problem.inputs() else {
        return Ok(()); // a shape whose product overflows: HostTensor refused it
    };
    let host = inputs.as_inputs(problem.nonpad.as_deref());
    let options = AttentionOptions {
        path,
        ..problem.options.clone()
    };
    let checked = validate(&host, &options);
    let got = engine.attention_host_blocking(&host, &options);
    match (checked, got) {
        (Err(expected), Err(e)) => prop_assert_eq!(expected, e, "the engine and validate disagree"),
        (Err(expected), Ok(_)) => prop_assert!(false, "bad input accepted: {expected}"),
        (Ok(_), Err(e)) => {
            // Valid input may still exceed a device limit: that must be typed.
            prop_assert!(
                matches!(e, Error::Limit { .. }),
                "a valid problem failed: {e}"
            )
        }
        (Ok(_), Ok(out)) => {
            let exact = cpu::attention_exact(&host, &options).unwrap();
            let plains: Vec<_> = [SumOrder::Sequential, SumOrder::Quads, SumOrder::Reverse]
                .into_iter()
                .map(|order| cpu::attention_plain_f32_in(&host, &options, order).unwrap())
                .collect();
            let of = |pick: fn(&cpu::ExactOutputs<f32>) -> &[f32]| -> Vec<&[f32]> {
                plains.iter().map(pick).collect()
            };
            report("Y", out.y.data(), &exact.y, &of(|p| &p.y))?;
            if let Some(lse) = &out.lse {
                report("lse", lse.data(), &exact.lse, &of(|p| &p.lse))?;
            }
            if let Some(qk) = &out.qk_matmul_output {
                report("qk_matmul_output", qk.data(), &exact.qk, &of(|p| &p.qk))?;
            }
            prop_assert_eq!(out.present_key.is_some(), options.return_present);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(8))]

    /// The validator and the CPU oracle never panic, whatever the shapes and options.
    #[test]
    fn validation_never_panics(problem in problem(true), options in wild_options()) {
        let Some(inputs) = problem.inputs() else { return Ok(()) };
        let host = inputs.as_inputs(problem.nonpad.as_deref());
        for options in [&options, &problem.options] {
            if validate(&host, options).is_ok() {
                // Valid: the oracle computes it (and agrees with itself in f32).
                let exact = cpu::attention_exact(&host, options).unwrap();
                prop_assert_eq!(exact.y.len(), exact.dims.y_shape().iter().product::<usize>());
                prop_assert!(cpu::attention(&host, options).is_ok());
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(1))]

    /// The whole call on the GPU, fused and unfused: a typed error (the same as
    /// the validator's) or results within tolerance of the oracle.
    #[test]
    fn the_whole_call_is_an_error_or_right(problem in problem(true), fused in any::<bool>()) {
        let Some(engine) = common::gpu() else { return Ok(()) };
        let path = if fused { KernelPath::Fused } else { KernelPath::Unfused };
        check_call(engine, &problem, path)?;
    }

    /// The same on the CPU backend.
    #[test]
    fn the_cpu_backend_is_an_error_or_right(problem in problem(true)) {
        check_call(&Engine::cpu(), &problem, KernelPath::Cpu)?;
    }

    /// Random bytes and corrupted `.npy` files: an error, never a panic; an
    /// intact file reads back as written.
    #[test]
    fn the_npy_reader_never_panics(
        shape in prop::collection::vec(0..5usize, 0..4),
        kind in 0..4u8,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in prop::option::of(any::<prop::sample::Index>()),
        noise in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let _ = npy::parse_tensor(&noise, "Q");
        let _ = npy::parse_mask(&noise);
        let bytes = npy_bytes(&shape, kind);
        let clean = npy::parse_tensor(&bytes, "Q");
        if kind < 2 {
            let t = clean.unwrap();
            prop_assert_eq!(t.shape(), &shape[..]);
        }
        let mut bytes = bytes;
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        let _ = npy::parse_tensor(&bytes, "Q");
        let _ = npy::parse_mask(&bytes);
    }
}

/// Problems the fuzzer once failed on, kept so that they run every time.
fn regressions() -> Vec<(Problem, KernelPath)> {
    vec![
        // A softcapped logsumexp one f32 ulp (at |lse| ~ 16) from the oracle,
        // where the sequential plain f32 baseline happened to round exactly.
        (
            Problem {
                q: vec![1, 3, 1, 18],
                k: vec![1, 1, 7, 18],
                v: vec![1, 1, 7, 4],
                past: None,
                mask: Some((false, vec![4])),
                nonpad: None,
                options: AttentionOptions {
                    scale: Some(1.5058411),
                    softcap: 23.260965,
                    return_lse: true,
                    ..Default::default()
                },
                seed: 4000960284212773544,
            },
            KernelPath::Fused,
        ),
    ]
}

#[test]
fn past_fuzz_failures_stay_fixed() {
    let Some(engine) = common::gpu() else { return };
    for (problem, path) in regressions() {
        if let Err(e) = check_call(engine, &problem, path) {
            panic!("{problem:?} through {path:?}: {e}");
        }
    }
}

/// The bytes of a `.npy` file of `shape`: f32, f16, bool or int64 by `kind`.
fn npy_bytes(shape: &[usize], kind: u8) -> Vec<u8> {
    let len: usize = shape.iter().product();
    let descr = ["<f4", "<f2", "|b1", "<i8"][kind as usize];
    let width = [4, 2, 1, 8][kind as usize];
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_text}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(0u8, len * width));
    bytes
}

/// A header whose shape's element count overflows is a typed error in every
/// build (npyz would multiply it unchecked: a panic where overflow checks
/// are on, as in `cargo test`), for a file of a hundred bytes.
#[test]
fn an_npy_header_whose_count_overflows_is_a_file_error() {
    for shape in [
        "'shape': (4294967296, 4294967296)",
        "'shape': (0, 4294967296, 4294967296)",
        // Forms npyz's parser also takes: the key in double quotes, a list.
        "\"shape\": (4294967296, 4294967296)",
        "'shape': [4294967296, 4294967296]",
    ] {
        let mut header = format!("{{'descr': '<f4', 'fortran_order': False, {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        let err = npy::parse_tensor(&bytes, "Q").expect_err("no such tensor");
        assert!(matches!(err, Error::File { .. }), "{shape}: {err}");
        assert!(npy::parse_mask(&bytes).is_err(), "{shape}");
    }
}
