//! Shared test harness: one GPU engine per test binary, and the rule that GPU
//! tests fail (not skip) when `WEBATTN_REQUIRE_GPU=1` and no adapter exists.

#![allow(dead_code)]

use std::sync::OnceLock;

use webattn::conformance::{run_case, CaseResult, CaseSpec};
use webattn::kernels::gemm::GemmSpec;
use webattn::tuning::TuningCache;
use webattn::{BackendPreference, Engine, EngineOptions, KernelPath};

/// The seed every test draws from, unless `WEBATTN_SEED` says otherwise.
pub fn seed() -> u64 {
    std::env::var("WEBATTN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed)
}

fn require_gpu() -> bool {
    std::env::var("WEBATTN_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The shared GPU engine, or `None` (with a note) when there is no adapter and
/// the environment does not require one. Panics when one is required.
pub fn gpu() -> Option<&'static Engine> {
    static ENGINE: OnceLock<Option<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let _ = env_logger::builder().is_test(true).try_init();
            // A tuning table of its own: the tests do not depend on what
            // `webattn tune` left in this machine's cache file.
            let options = EngineOptions {
                backend: BackendPreference::Gpu,
                tuning_cache: TuningCache::Memory,
                ..Default::default()
            };
            match Engine::with_options_blocking(options) {
                Ok(engine) => {
                    eprintln!("GPU tests on {}", engine.describe());
                    Some(engine)
                }
                Err(e) if require_gpu() => {
                    panic!("WEBATTN_REQUIRE_GPU=1 but no GPU engine could be made: {e}")
                }
                Err(e) => {
                    eprintln!(
                        "SKIPPING GPU test: {e} (set WEBATTN_REQUIRE_GPU=1 to make this a failure)"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// A GPU engine of the test's own (or `None`, as [`gpu`] decides), for tests
/// that read `Engine::last_call`: the shared engine's is overwritten by the
/// calls of tests running beside them.
pub fn own_gpu() -> Option<Engine> {
    gpu()?;
    let options = EngineOptions {
        backend: BackendPreference::Gpu,
        tuning_cache: TuningCache::Memory,
        ..Default::default()
    };
    Some(Engine::with_options_blocking(options).expect("a second GPU engine"))
}

/// Runs each case on `path`, prints one line per case with its worst error,
/// and fails listing every case that did not pass.
pub fn run_cases(engine: &Engine, cases: &[CaseSpec], path: KernelPath) {
    run_cases_on(engine, cases, &[path]);
}

/// [`run_cases`] on several paths, computing each case's oracle once.
pub fn run_cases_on(engine: &Engine, cases: &[CaseSpec], paths: &[KernelPath]) {
    let mut failed = Vec::new();
    for case in cases {
        for result in pollster::block_on(run_case(engine, case, paths, seed())) {
            print_result(&result);
            if !result.passed() {
                failed.push(result.name.clone());
            }
        }
    }
    assert!(failed.is_empty(), "cases failed on {paths:?}: {failed:?}");
}

/// One line: case, shapes, worst output and its error against the allowance.
pub fn print_result(r: &CaseResult) {
    match (&r.report, &r.failure) {
        (_, Some(failure)) => println!("FAIL {:<34} {:<28} {failure}", r.name, r.shapes),
        (Some(rep), None) => println!(
            "{} {:<34} {:<28} {:<8} {:<16} max_abs {:.3e} rel {:.3e} allowed {:.3e} (plain f32 {:.3e}) {:.0} ms",
            if rep.passed() { "ok  " } else { "FAIL" },
            r.name,
            r.shapes,
            r.path,
            r.worst_output,
            rep.max_abs,
            rep.max_rel,
            rep.allowed,
            rep.baseline_abs,
            r.millis
        ),
        (None, None) => println!("ok   {:<34} {}", r.name, r.shapes),
    }
}

/// C = alpha·op(A)·op(B) + beta·C computed plainly in `F`, for the oracle
/// (f64) and the baseline (f32) of the GEMM tests; with `skip_marked_a` a
/// term whose A is `-0` (the mark of a key not attended) adds nothing,
/// whatever B holds, while `+0` multiplies as any other value.
pub fn gemm_reference<F>(
    spec: &GemmSpec,
    skip_marked_a: bool,
    a: &[f32],
    b: &[f32],
    c: &[f32],
) -> Vec<F>
where
    F: Copy + From<f32> + std::ops::Add<Output = F> + std::ops::Mul<Output = F>,
{
    let mut out: Vec<F> = c.iter().map(|&x| F::from(x)).collect();
    for z in 0..spec.batch {
        let a_base = spec.a_offset + z * spec.a_stride;
        let b_base = spec.b_offset + ((spec.b_batch_base + z) / spec.b_batch_div) * spec.b_stride;
        let c_base = spec.c_offset + z * spec.c_stride;
        for i in 0..spec.m {
            for j in 0..spec.n {
                let mut acc = F::from(0.0);
                for kk in 0..spec.k {
                    let av = if spec.trans_a {
                        a[a_base + kk * spec.lda + i]
                    } else {
                        a[a_base + i * spec.lda + kk]
                    };
                    let bv = if spec.trans_b {
                        b[b_base + j * spec.ldb + kk]
                    } else {
                        b[b_base + kk * spec.ldb + j]
                    };
                    if !(skip_marked_a && av.to_bits() == (-0.0f32).to_bits()) {
                        acc = acc + F::from(av) * F::from(bv);
                    }
                }
                let idx = c_base + i * spec.ldc + j;
                let old = if spec.beta == 0.0 {
                    F::from(0.0)
                } else {
                    F::from(spec.beta) * F::from(c[idx])
                };
                out[idx] = F::from(spec.alpha) * acc + old;
            }
        }
    }
    out
}

/// Whether the test adapter runs the tiled kernel's shuffle forms
/// (`attention_tiled_shuffle`: subgroups of 8 lanes or more).
#[allow(dead_code)]
pub fn runs_shuffle_forms() -> bool {
    gpu()
        .and_then(|engine| engine.capabilities())
        .is_some_and(|caps| {
            caps.subgroups
                && caps.subgroup_min_size >= webattn::kernels::attention::tiled::SHUFFLE_MIN_TK
        })
}

/// One of `n` variants for this run, on a rotation: `WEBATTN_ROTATION` when
/// set, else the day (UTC), so successive days cover every variant. Prints
/// the pick and how to repeat it, for `what`.
#[allow(dead_code)]
pub fn rotation(what: &str, n: usize) -> usize {
    rotation_within(what, n, 1)
}

/// One of `n` variants for this run inside a family an outer rotation of
/// `outer` picked (`rotation(.., outer)`): the turn divided by `outer`, so
/// that the family's successive turns cover its `n` variants.
#[allow(dead_code)]
pub fn rotation_within(what: &str, n: usize, outer: usize) -> usize {
    let turn = std::env::var("WEBATTN_ROTATION")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() / 86_400)
        });
    let pick = (turn / outer as u64 % n as u64) as usize;
    println!("rotation for {what}: {pick} of {n} (WEBATTN_ROTATION={turn} repeats it)");
    pick
}

/// An engine of its own on `engine`'s device, sharing its tuning table,
/// with `engine`'s overrides as `pin` sets them (a kernel pinned, phases
/// removed): one candidate of a test.
#[allow(dead_code)]
pub fn pinned(
    engine: &Engine,
    pin: impl FnOnce(&mut webattn::plan::overrides::Overrides),
) -> Engine {
    let mut overrides = *engine.overrides();
    pin(&mut overrides);
    engine
        .sharing_device()
        .expect("a GPU engine")
        .with_overrides(overrides)
}

/// A multi-head layer's training case: the layer, its inputs and options.
#[allow(dead_code)]
pub struct LayerCase {
    pub name: &'static str,
    pub layer: webattn::family::mha::MultiHeadAttention,
    /// The layer's rotary embedding (to rebuild it with other weights).
    pub rope: Option<webattn::family::position::Rope>,
    pub query: webattn::HostTensor,
    pub key_value: Option<webattn::HostTensor>,
    pub options: webattn::AttentionOptions,
    pub d_output: webattn::HostTensor,
}

/// The layer cases the backward is checked on: self-attention with GQA,
/// RoPE and a causal mask at sizes off every tile, and cross-attention
/// with softcap, its key/value input of its own width.
#[allow(dead_code)]
pub fn layer_cases() -> Vec<LayerCase> {
    use webattn::family::mha::{MhaWeights, MultiHeadAttention};
    use webattn::family::position::Rope;
    let mut rng = webattn::rng::SplitMix64::new(seed() ^ 0x1a7e);
    let mut tensor = |shape: [usize; 3]| {
        let len = shape.iter().product();
        webattn::HostTensor::new(shape, rng.normal_vec(len, 1.0)).unwrap()
    };
    let self_attention =
        MultiHeadAttention::new(MhaWeights::random(16, 16, 4, 2, 4, seed()).unwrap(), 4, 2)
            .unwrap()
            .with_rope(Rope::default())
            .unwrap();
    let cross = MultiHeadAttention::new(
        MhaWeights::random(12, 10, 3, 3, 8, seed() + 1).unwrap(),
        3,
        3,
    )
    .unwrap();
    vec![
        LayerCase {
            name: "self, GQA 4/2, RoPE, causal",
            layer: self_attention,
            rope: Some(Rope::default()),
            query: tensor([2, 7, 16]),
            key_value: None,
            options: webattn::AttentionOptions {
                is_causal: true,
                ..Default::default()
            },
            d_output: tensor([2, 7, 16]),
        },
        LayerCase {
            name: "cross, softcap",
            layer: cross,
            rope: None,
            query: tensor([1, 5, 12]),
            key_value: Some(tensor([1, 9, 10])),
            options: webattn::AttentionOptions {
                softcap: 2.0,
                ..Default::default()
            },
            d_output: tensor([1, 5, 12]),
        },
    ]
}

/// Runs each layer case's forward and backward on `engine` and checks
/// every gradient (inputs, weights, biases) against the f64 oracle's by the
/// tolerance rule; returns the worst share of the allowed error.
#[allow(dead_code)]
pub fn check_layer_gradients(engine: &Engine) -> f64 {
    use webattn::conformance::{compare, DEFAULT_FLOOR};
    use webattn::cpu::RowSource;
    let mut worst: f64 = 0.0;
    for case in layer_cases() {
        let kv = case.key_value.as_ref();
        let (out, tape) = case
            .layer
            .forward_train_blocking(engine, &case.query, kv, &case.options)
            .unwrap();
        let (exact_out, _) = case
            .layer
            .oracle::<f64>(&case.query, kv, &case.options)
            .unwrap();
        let (plain_out, _) = case
            .layer
            .oracle::<f32>(&case.query, kv, &case.options)
            .unwrap();
        let report = compare(out.data(), &exact_out, &plain_out, DEFAULT_FLOOR);
        assert!(
            report.passed(),
            "{}: the forward's output {report:?}",
            case.name
        );
        let got = case
            .layer
            .backward_blocking(engine, &tape, &case.d_output)
            .unwrap();
        let exact = case
            .layer
            .backward_exact::<f64>(
                &case.query,
                kv,
                &case.options,
                &case.d_output,
                RowSource::Recomputed,
            )
            .unwrap();
        let plain = case
            .layer
            .backward_exact::<f32>(
                &case.query,
                kv,
                &case.options,
                &case.d_output,
                RowSource::FromForward,
            )
            .unwrap();
        let w = &got.weights;
        let mut named: Vec<(&str, Option<&webattn::HostTensor>)> = vec![
            ("d_query", Some(&got.d_query)),
            ("d_key_value", got.d_key_value.as_ref()),
        ];
        for (name, t) in [
            ("W_Q", Some(&w.w_q)),
            ("b_Q", w.b_q.as_ref()),
            ("W_K", Some(&w.w_k)),
            ("b_K", w.b_k.as_ref()),
            ("W_V", Some(&w.w_v)),
            ("b_V", w.b_v.as_ref()),
            ("W_O", Some(&w.w_o)),
            ("b_O", w.b_o.as_ref()),
        ] {
            named.push((name, t));
        }
        let exact_parts: Vec<&Vec<f64>> = [&exact.d_query, &exact.d_key_value]
            .into_iter()
            .chain(exact.weights.iter())
            .collect();
        let plain_parts: Vec<&Vec<f32>> = [&plain.d_query, &plain.d_key_value]
            .into_iter()
            .chain(plain.weights.iter())
            .collect();
        for (((name, got), exact), plain) in named.into_iter().zip(exact_parts).zip(plain_parts) {
            let Some(got) = got else {
                assert!(exact.is_empty(), "{}: {name} missing", case.name);
                continue;
            };
            let report = compare(got.data(), exact, plain, DEFAULT_FLOOR);
            println!(
                "{:<28} {name:<12} max_abs {:.3e} allowed {:.3e} ({:.2} of it)",
                case.name,
                report.max_abs,
                report.allowed,
                report.share_of_allowed()
            );
            assert!(report.passed(), "{}: {name} {report:?}", case.name);
            worst = worst.max(report.share_of_allowed());
        }
    }
    worst
}
