//! The streaming decode kernel (`kernels/decode/stream.rs`:
//! `attention_decode_stream`):
//! forced on the test adapter, every decode form of the contract against the
//! f64 oracle, with each of its team shapes that fits; and the choice between
//! it and the staged kernel.

use crate::common;

use webattn::conformance::{run_case, CaseSpec, MaskForm};
use webattn::kernels::decode::{DecodeKernel, DecodeLayout, StreamShape};
use webattn::{BackendPreference, DecodeKernelChoice, Engine, EngineOptions, Error, KernelPath};

/// A GPU engine whose decode calls run the streaming kernel, or `None` when
/// the test adapter has no subgroups of 4 lanes or more (then forcing it must
/// be refused).
fn stream_engine() -> Option<Engine> {
    let caps = common::gpu()?.capabilities()?.clone();
    let made = Engine::with_options_blocking(EngineOptions {
        backend: BackendPreference::Gpu,
        decode_kernel: DecodeKernelChoice::Stream,
        ..Default::default()
    });
    if !caps.stream_decode_subgroups() {
        assert!(
            matches!(made, Err(Error::InvalidOption { .. })),
            "forcing the streaming kernel without subgroups must be refused"
        );
        eprintln!("the test adapter has no subgroups of 4 lanes or more: nothing to run");
        return None;
    }
    Some(made.expect("an engine forcing the streaming decode kernel"))
}

/// Decode cases: one to 16 query rows over 512 keys or more, GQA groups that
/// share a workgroup, every masking form, key ranges that start and end
/// inside a split, non-finite values, f16 keys and values.
fn decode_cases() -> Vec<CaseSpec> {
    vec![
        CaseSpec::new("stream-one-row", [2, 4, 4], [1, 1025], [64, 64]),
        CaseSpec::new("stream-gqa4", [1, 8, 2], [1, 777], [128, 128]),
        CaseSpec::new("stream-gqa4-rows4", [1, 8, 2], [4, 700], [32, 32]).with(|o| {
            o.is_causal = true;
        }),
        CaseSpec::new("stream-rows16", [2, 2, 2], [16, 700], [16, 16]).with(|o| {
            o.is_causal = true;
        }),
        CaseSpec::new("stream-dk-dv-differ", [1, 3, 1], [2, 900], [24, 40]),
        CaseSpec::new("stream-d256", [1, 2, 2], [1, 600], [256, 256]),
        CaseSpec::new("stream-past-causal", [1, 4, 2], [3, 600], [64, 64])
            .past(300)
            .with(|o| o.is_causal = true),
        CaseSpec::new("stream-float-mask-alibi", [2, 4, 2], [2, 1000], [32, 32])
            .mask(MaskForm::Float(4))
            .with(|o| {
                o.alibi = true;
                o.softcap = 5.0;
            }),
        CaseSpec::new("stream-bool-mask-window", [1, 2, 1], [1, 1500], [64, 64])
            .mask(MaskForm::Bool(2))
            .with(|o| {
                o.left_window_size = 700;
                o.temperature = 0.7;
            }),
        CaseSpec::new("stream-nonpad", [3, 4, 2], [1, 1024], [64, 64]).nonpad(),
        CaseSpec::new("stream-large-logits", [1, 2, 2], [1, 2048], [64, 64]).logits(1e3),
        CaseSpec::new("stream-f16-kv", [2, 8, 2], [1, 1030], [128, 128]).f16(),
        CaseSpec::new("stream-f16-rows8", [1, 8, 1], [1, 800], [64, 64]).f16(),
    ]
}

#[test]
fn the_streaming_kernel_agrees_with_the_oracle_on_every_decode_form() {
    let Some(engine) = stream_engine() else {
        return;
    };
    common::run_cases(&engine, &decode_cases(), KernelPath::Fused);
    // The behaviour checks with decode's shapes (non-finite Q, K, V; every
    // key masked) ran through it too.
    let compiled: Vec<String> = engine
        .gpu()
        .expect("a GPU engine")
        .pipelines()
        .compiled_keys()
        .iter()
        .map(|key| key.to_string())
        .collect();
    for kernel in ["attention_decode_stream[", "attention_decode_stream_f16["] {
        assert!(
            compiled.iter().any(|k| k.starts_with(kernel)),
            "{kernel} was not compiled: {compiled:?}"
        );
    }
}

#[test]
fn every_team_shape_that_fits_agrees_with_the_oracle() {
    let Some(engine) = stream_engine() else {
        return;
    };
    let ctx = engine.gpu().expect("a GPU engine");
    let caps = ctx.capabilities().clone();
    let cases = [
        CaseSpec::new("shape-gqa2-causal", [1, 4, 2], [2, 1111], [64, 64])
            .with(|o| o.is_causal = true),
        CaseSpec::new("shape-f16", [1, 2, 2], [1, 700], [32, 32]).f16(),
        // Long splits: many steps per team, so a prefetching shape's next
        // step is loaded while one is computed, again and again.
        CaseSpec::new("shape-long-window", [1, 2, 2], [1, 5000], [64, 64])
            .with(|o| o.left_window_size = 4000),
    ];
    // Each case through every other shape that fits it, on a rotation.
    let turn = common::rotation("the team shapes", 2);
    let mut shapes_fit = 0;
    let mut prefetching_fit = 0;
    let mut failed = Vec::new();
    for case in &cases {
        let inputs = case.generate(1).expect("inputs");
        let dims = webattn::validate(&inputs.as_inputs(), &case.options).expect("a valid case");
        let rows = DecodeLayout::heads_per_workgroup(&dims) * dims.q_len;
        let fitting = StreamShape::all()
            .into_iter()
            .filter(|shape| shape.fits(&dims, rows, &caps));
        for (i, shape) in fitting.enumerate() {
            shapes_fit += 1;
            prefetching_fit += usize::from(shape.prefetch);
            if i % 2 != turn {
                continue;
            }
            let pinned = common::pinned(&engine, |o| {
                o.pinned_decode = Some(DecodeKernel::Stream(shape))
            });
            let results = run_case(&pinned, case, &[KernelPath::Fused], common::seed());
            for result in pollster::block_on(results) {
                common::print_result(&result);
                if !result.passed() {
                    failed.push(format!("{} at {}", result.name, shape.label()));
                }
            }
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
    assert!(
        shapes_fit >= 2,
        "only {shapes_fit} shapes fit the test adapter"
    );
    assert!(
        prefetching_fit >= 1,
        "no prefetching shape fits the test adapter"
    );
}

/// `webattn phases` times the streaming kernel without a phase of its key
/// loop (`Engine::without_phases`); each switch must remove what it
/// names. Without the dot products every score is 0, so each row is the mean
/// of its KV head's V rows; without O += P V, or without K and V's loads,
/// every row is 0. Two query rows per head (a GQA group of 2) over 1000 keys.
#[test]
fn each_phase_switch_of_the_streaming_kernel_removes_its_phase() {
    use webattn::kernels::ablation::Phases;
    let Some(engine) = stream_engine() else {
        return;
    };
    let (heads, kv_heads, rows, keys, d) = (4, 2, 2, 1000, 64);
    let mut rng = webattn::rng::SplitMix64::new(common::seed());
    let tensor = |shape: [usize; 4], rng: &mut webattn::rng::SplitMix64| {
        webattn::HostTensor::new(shape, rng.normal_vec(shape.iter().product(), 1.0)).unwrap()
    };
    let q = tensor([1, heads, rows, d], &mut rng);
    let k = tensor([1, kv_heads, keys, d], &mut rng);
    let v = tensor([1, kv_heads, keys, d], &mut rng);
    let options = webattn::AttentionOptions {
        path: KernelPath::Fused,
        ..Default::default()
    };
    let inputs = webattn::AttentionInputs::new(&q, &k, &v);
    let run = |phases: Phases| {
        let variant = common::pinned(&engine, |o| o.removed_phases = phases);
        let y = variant
            .attention_host_blocking(&inputs, &options)
            .unwrap()
            .y;
        let compiled = variant.gpu().unwrap().pipelines().compiled_keys();
        let bits = i64::from(phases.bits());
        assert!(
            compiled.iter().any(|key| {
                key.kernel.name().starts_with("attention_decode_stream")
                    && (phases.is_empty() || key.constants.contains(&("ABLATE", bits)))
            }),
            "without {}: {compiled:?}",
            phases.name()
        );
        y
    };
    assert!(run(Phases::NONE).data().iter().all(|x| x.is_finite()));
    for (i, &value) in run(Phases::SCORES).data().iter().enumerate() {
        let (head, col) = (i / (rows * d), i % d);
        let kv = head / (heads / kv_heads);
        let mean = (0..keys)
            .map(|j| f64::from(v.data()[(kv * keys + j) * d + col]))
            .sum::<f64>()
            / keys as f64;
        assert!(
            (f64::from(value) - mean).abs() < 1e-5,
            "without S: element {i} is {value}, the mean of V is {mean}"
        );
    }
    for phases in [Phases::PRODUCT, Phases::KV_LOADS] {
        let y = run(phases);
        assert!(
            y.data().iter().all(|&x| x == 0.0),
            "without {}: {:?}",
            phases.name(),
            &y.data()[..8]
        );
    }
}
