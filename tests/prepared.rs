//! Prepared calls: planned once, their workspace made by the first run. Every
//! run gives the bits a plain call gives (and meets the f64 oracle's rule) on
//! fresh inputs, its reused zero-filled buffers cleared; runs after the first
//! create no buffer; inputs of other shapes and other engines are refused.

mod common;

use webattn::conformance::compare;
use webattn::{
    AttentionInputs, AttentionOptions, Engine, Error, HostMask, HostTensor, KernelPath,
    QkMatmulOutputMode,
};

fn tensor(shape: [usize; 4], seed: u64) -> HostTensor {
    let mut rng = webattn::rng::SplitMix64::new(seed);
    HostTensor::new(shape, rng.normal_vec(shape.iter().product(), 1.0)).unwrap()
}

struct Case {
    name: &'static str,
    q: [usize; 4],
    kv: [usize; 4],
    options: AttentionOptions,
    mask: bool,
    nonpad: bool,
}

fn cases() -> Vec<Case> {
    let plain = AttentionOptions::default();
    vec![
        Case {
            name: "decode GQA 4:1, lengths",
            q: [2, 8, 1, 16],
            kv: [2, 2, 600, 16],
            options: plain.clone(),
            mask: false,
            nonpad: true,
        },
        Case {
            name: "prefill 97 causal, lse",
            q: [1, 2, 97, 7],
            kv: [1, 2, 97, 7],
            options: AttentionOptions {
                is_causal: true,
                return_lse: true,
                ..plain.clone()
            },
            mask: false,
            nonpad: false,
        },
        Case {
            name: "bool mask with fully masked rows",
            q: [1, 3, 7, 8],
            kv: [1, 3, 33, 8],
            options: plain.clone(),
            mask: true,
            nonpad: false,
        },
        Case {
            name: "unfused, probabilities out",
            q: [1, 2, 9, 8],
            kv: [1, 1, 1025, 8],
            options: AttentionOptions {
                path: KernelPath::Unfused,
                qk_matmul_output_mode: Some(QkMatmulOutputMode::Probabilities),
                ..plain.clone()
            },
            mask: false,
            nonpad: false,
        },
    ]
}

/// Runs each case's prepared call three times on fresh inputs and checks
/// every run against a plain call (bit for bit) and the oracle; returns the
/// buffers created by the runs after the first.
fn run_cases(engine: &Engine) -> u64 {
    let mut created_after_first = 0;
    for (c, case) in cases().into_iter().enumerate() {
        if engine.gpu().is_none() && case.options.path != KernelPath::Auto {
            continue; // a GPU path
        }
        let mut prepared = None;
        let mut worst = 0.0f64;
        for run in 0..3u64 {
            let seed = common::seed() ^ (c as u64 * 97 + run);
            let (qh, kh, vh) = (
                tensor(case.q, seed),
                tensor(case.kv, seed + 1),
                tensor(case.kv, seed + 2),
            );
            // Row 0 of every head sees no key.
            let mask = case.mask.then(|| {
                let (n, t) = (case.q[2], case.kv[2]);
                let data = (0..n * t).map(|i| i >= t && (i * 7 + run as usize) % 3 != 0);
                HostMask::bool([n, t], data.collect()).unwrap()
            });
            let lengths: Vec<i64> = (0..case.q[0] as i64)
                .map(|b| case.kv[2] as i64 - 3 * b - run as i64)
                .collect();
            let mut host = AttentionInputs::new(&qh, &kh, &vh);
            if let Some(m) = &mask {
                host = host.with_mask(m);
            }
            if case.nonpad {
                host.nonpad_kv_seqlen = Some(&lengths);
            }
            let (q, k, v) = (
                engine.upload(&qh).unwrap(),
                engine.upload(&kh).unwrap(),
                engine.upload(&vh).unwrap(),
            );
            let m = mask.as_ref().map(|m| engine.upload_mask(m).unwrap());
            let mut inputs = AttentionInputs::new(&q, &k, &v);
            if let Some(m) = &m {
                inputs = inputs.with_mask(m);
            }
            if case.nonpad {
                inputs.nonpad_kv_seqlen = Some(&lengths);
            }
            let prepared = prepared.get_or_insert_with(|| {
                let dims = webattn::validate(&inputs, &case.options).unwrap();
                engine.prepare(&dims, &case.options).unwrap()
            });
            let before = engine.gpu().map(|g| g.work_counts());
            let out = prepared.run_blocking(engine, &inputs).unwrap();
            if let (Some(before), true) = (before, run > 0) {
                created_after_first += engine.gpu().unwrap().work_counts().buffers - before.buffers;
            }
            let y = engine.download_blocking(&out.y).unwrap();
            let lse = out
                .lse
                .as_ref()
                .map(|t| engine.download_blocking(t).unwrap());
            let qk = out
                .qk_matmul_output
                .as_ref()
                .map(|t| engine.download_blocking(t).unwrap());
            let plain = engine
                .attention_host_blocking(&host, &case.options)
                .unwrap();
            assert_eq!(
                y, plain.y,
                "{}: run {run} differs from a plain call",
                case.name
            );
            assert_eq!(lse, plain.lse, "{}: lse, run {run}", case.name);
            assert_eq!(
                qk, plain.qk_matmul_output,
                "{}: scores, run {run}",
                case.name
            );
            let exact = webattn::cpu::attention_exact(&host, &case.options).unwrap();
            let f32s = webattn::cpu::attention_plain_f32(&host, &case.options).unwrap();
            let report = compare(y.data(), &exact.y, &f32s.y, 1e-6);
            assert!(report.passed(), "{}: run {run}: {report:?}", case.name);
            worst = worst.max(report.max_abs);
        }
        let prepared = prepared.unwrap();
        println!(
            "{:<34} on {}: path {}, workspace {:?}, worst |Y - f64 oracle| {worst:.3e}",
            case.name,
            engine.describe(),
            prepared.path().path,
            prepared.workspace()
        );
    }
    created_after_first
}

#[test]
fn prepared_runs_match_plain_calls_and_allocate_once() {
    if let Some(engine) = common::own_gpu() {
        assert_eq!(
            run_cases(&engine),
            0,
            "runs after the first created buffers"
        );
    }
    run_cases(&Engine::cpu());
}

#[test]
fn other_shapes_and_engines_are_refused() {
    let engine = Engine::cpu();
    let other = Engine::cpu();
    let (q, k, v) = (
        engine.upload(&tensor([1, 2, 4, 8], 1)).unwrap(),
        engine.upload(&tensor([1, 2, 5, 8], 2)).unwrap(),
        engine.upload(&tensor([1, 2, 5, 8], 3)).unwrap(),
    );
    let options = AttentionOptions::default();
    let inputs = AttentionInputs::new(&q, &k, &v);
    let dims = webattn::validate(&inputs, &options).unwrap();
    let prepared = engine.prepare(&dims, &options).unwrap();
    prepared.run_blocking(&engine, &inputs).unwrap();
    let longer = engine.upload(&tensor([1, 2, 6, 8], 4)).unwrap();
    let err = prepared
        .run_blocking(&engine, &AttentionInputs::new(&q, &longer, &longer))
        .unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err}");
    let err = prepared.run_blocking(&other, &inputs).unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err}");
    let gpu_only = AttentionOptions {
        path: KernelPath::Fused,
        ..Default::default()
    };
    assert!(matches!(
        engine.prepare(&dims, &gpu_only),
        Err(Error::Conflict(_))
    ));
}
