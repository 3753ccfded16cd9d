//! Linear attention (elu+1 feature map, causal and not) against its f64
//! oracle on seeded random inputs: the GPU within twice the plain f32 oracle's
//! error (plus 1e-6), the CPU engine likewise, and typed errors for bad shapes.
//!
//! Sizes include 1, 7, 97, 257 and 1025 rows; 1025 rows at Dk = 64 take
//! several key chunks on drivers that cap loop iterations (lavapipe).

use crate::common;

use webattn::conformance::{compare, ErrorReport, DEFAULT_FLOOR};
use webattn::family::linear::{linear_attention_oracle, LinearAttention};
use webattn::rng::SplitMix64;
use webattn::{Engine, Error, HostTensor};

/// One problem: `[batch, heads, queries, keys]`, `[Dk, Dv]`, causal, the
/// inputs' scale, and whether the weights are checked too.
struct Case {
    name: &'static str,
    sizes: [usize; 4],
    dims: [usize; 2],
    causal: bool,
    scale: f32,
    weights: bool,
}

const fn case(
    name: &'static str,
    sizes: [usize; 4],
    dims: [usize; 2],
    causal: bool,
    scale: f32,
    weights: bool,
) -> Case {
    Case {
        name,
        sizes,
        dims,
        causal,
        scale,
        weights,
    }
}

const CASES: &[Case] = &[
    case("one query, one key", [1, 1, 1, 1], [4, 4], false, 1.0, true),
    case("causal, one row", [1, 1, 1, 1], [3, 5], true, 1.0, true),
    case("cross 7x97, B2 H3", [2, 3, 7, 97], [5, 3], false, 1.0, true),
    case("causal 97, H2", [1, 2, 97, 97], [16, 8], true, 1.0, true),
    case("cross 257x7", [1, 1, 257, 7], [8, 12], false, 1.0, true),
    case(
        "causal 257, B2, odd dims",
        [2, 1, 257, 257],
        [33, 17],
        true,
        1.0,
        true,
    ),
    case(
        "causal 1025, Dk 64",
        [1, 1, 1025, 1025],
        [64, 64],
        true,
        1.0,
        true,
    ),
    case(
        "cross 7x1025, Dk 64",
        [1, 2, 7, 1025],
        [64, 40],
        false,
        1.0,
        true,
    ),
    case(
        "self 1025, B2, Dk 64",
        [2, 1, 1025, 1025],
        [64, 24],
        false,
        1.0,
        false,
    ),
    case(
        "causal 97, large inputs",
        [1, 2, 97, 97],
        [32, 32],
        true,
        8.0,
        true,
    ),
    case(
        "cross 257x1025, large inputs",
        [1, 1, 257, 1025],
        [64, 16],
        false,
        8.0,
        true,
    ),
];

fn inputs(c: &Case, seed: u64) -> (HostTensor, HostTensor, HostTensor) {
    let [b, h, n, m] = c.sizes;
    let [dk, dv] = c.dims;
    let mut rng = SplitMix64::new(seed);
    let mut tensor = |shape: [usize; 4]| {
        let len = shape.iter().product();
        HostTensor::new(shape, rng.normal_vec(len, c.scale)).expect("consistent shape")
    };
    let q = tensor([b, h, n, dk]);
    let k = tensor([b, h, m, dk]);
    let v = tensor([b, h, m, dv]);
    (q, k, v)
}

fn line(what: &str, r: &ErrorReport) -> String {
    format!(
        "{what} max_abs {:.3e} rel {:.3e} allowed {:.3e} (plain f32 {:.3e})",
        r.max_abs, r.max_rel, r.allowed, r.baseline_abs
    )
}

/// Runs `c` on `engine`, prints its worst errors, and returns whether it passed.
fn check(engine: &Engine, index: usize, c: &Case) -> bool {
    let seed = common::seed().wrapping_add(index as u64);
    let (q, k, v) = inputs(c, seed);
    let exact = linear_attention_oracle::<f64>(&q, &k, &v, c.causal, c.weights).expect("oracle");
    let plain = linear_attention_oracle::<f32>(&q, &k, &v, c.causal, c.weights).expect("f32");
    let start = std::time::Instant::now();
    let got = LinearAttention::new(c.causal)
        .forward_blocking(engine, &q, &k, &v, c.weights)
        .expect("linear attention runs");
    let millis = start.elapsed().as_secs_f64() * 1e3;
    assert_eq!(got.output.shape(), exact.dims.output_shape().as_slice());
    let output = compare(
        got.output.data(),
        &exact.output,
        &plain.output,
        DEFAULT_FLOOR,
    );
    let mut passed = output.passed();
    let mut text = line("output", &output);
    match (&got.weights, c.weights) {
        (Some(w), true) => {
            assert_eq!(w.shape(), exact.dims.weights_shape().as_slice());
            let weights = compare(w.data(), &exact.weights, &plain.weights, DEFAULT_FLOOR);
            passed &= weights.passed();
            text += &format!("; {}", line("weights", &weights));
            // Masked weights are exactly zero.
            let [_, _, n, m] = c.sizes;
            if c.causal {
                let leaks = w
                    .data()
                    .iter()
                    .enumerate()
                    .filter(|&(idx, &x)| (idx % m) > (idx / m) % n && x != 0.0)
                    .count();
                passed &= leaks == 0;
                if leaks > 0 {
                    text += &format!("; {leaks} masked weights not zero");
                }
            }
        }
        (None, false) => {}
        (got, wanted) => panic!(
            "{}: weights wanted {wanted}, returned {}",
            c.name,
            got.is_some()
        ),
    }
    let [b, h, n, m] = c.sizes;
    let [dk, dv] = c.dims;
    println!(
        "{} {:<30} B{b} H{h} N{n} M{m} Dk{dk} Dv{dv}{} {text} {millis:.0} ms",
        if passed { "ok  " } else { "FAIL" },
        c.name,
        if c.causal { " causal" } else { "" },
    );
    passed
}

fn run_all(engine: &Engine) {
    let failed: Vec<&str> = CASES
        .iter()
        .enumerate()
        .filter(|(i, c)| !check(engine, *i, c))
        .map(|(_, c)| c.name)
        .collect();
    assert!(failed.is_empty(), "cases failed: {failed:?}");
}

#[test]
fn gpu_matches_the_oracle() {
    let Some(engine) = common::gpu() else { return };
    run_all(engine);
}

#[test]
fn cpu_engine_matches_the_oracle() {
    // The CPU engine runs the fast CPU backend: every case, as on the GPU.
    run_all(&Engine::cpu());
}

/// Every input error comes back typed, on both backends and from the oracle.
#[test]
fn bad_shapes_are_typed_errors() {
    let t = |shape: &[usize]| {
        HostTensor::new(shape.to_vec(), vec![0.5; shape.iter().product()]).expect("shape")
    };
    let q = t(&[2, 3, 5, 8]);
    let k = t(&[2, 3, 6, 8]);
    let v = t(&[2, 3, 6, 4]);
    let cases: Vec<(&str, bool, HostTensor, HostTensor, HostTensor)> = vec![
        ("Q rank 3", false, t(&[3, 5, 8]), k.clone(), v.clone()),
        ("K rank 5", false, q.clone(), t(&[1, 2, 3, 6, 8]), v.clone()),
        ("empty Q", false, t(&[2, 3, 0, 8]), k.clone(), v.clone()),
        ("K batch", false, q.clone(), t(&[1, 3, 6, 8]), v.clone()),
        ("K heads", false, q.clone(), t(&[2, 2, 6, 8]), v.clone()),
        ("K Dk", false, q.clone(), t(&[2, 3, 6, 7]), v.clone()),
        ("V keys", false, q.clone(), k.clone(), t(&[2, 3, 5, 4])),
        ("V heads", false, q.clone(), k.clone(), t(&[2, 1, 6, 4])),
        ("causal N != M", true, q.clone(), k.clone(), v.clone()),
    ];
    let cpu = Engine::cpu();
    let mut engines = vec![&cpu];
    engines.extend(common::gpu());
    for (name, causal, q, k, v) in &cases {
        let oracle = linear_attention_oracle::<f64>(q, k, v, *causal, true).unwrap_err();
        for &engine in &engines {
            let err = LinearAttention::new(*causal)
                .forward_blocking(engine, q, k, v, true)
                .unwrap_err();
            assert_eq!(err, oracle, "{name}");
            println!("{name}: {err}");
            let expected = match *name {
                "Q rank 3" | "K rank 5" => matches!(err, Error::Rank { .. }),
                "empty Q" => matches!(err, Error::EmptyTensor { tensor: "Q", .. }),
                "causal N != M" => matches!(
                    err,
                    Error::ShapeMismatch {
                        tensor: "K",
                        dim: "keys",
                        got: 6,
                        expected: 5,
                        ..
                    }
                ),
                _ => matches!(err, Error::ShapeMismatch { .. }),
            };
            assert!(expected, "{name}: unexpected error {err:?}");
        }
    }
    // The same shapes without the causal flag are fine.
    let ok = LinearAttention::default().forward_blocking(&cpu, &q, &k, &v, true);
    assert!(ok.is_ok(), "{ok:?}");
}
