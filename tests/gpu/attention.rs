//! Whole-attention tests: the conformance cases on both GPU paths (fused and
//! unfused) against the f64 oracle, with the tolerance rule (twice the plain
//! f32 error plus 1e-6). Each test prints the worst error of every case.

use crate::common;

use webattn::conformance::{filtered, sweep, CaseSpec, MaskForm, SweepKind, LARGE_LOGITS};
use webattn::KernelPath;

const GPU_PATHS: [KernelPath; 2] = [KernelPath::Fused, KernelPath::Unfused];

#[test]
fn quick_sweep_on_both_gpu_paths() {
    let Some(engine) = common::gpu() else { return };
    common::run_cases_on(engine, &sweep(SweepKind::Quick), &GPU_PATHS);
}

#[test]
fn every_mask_form_with_every_gqa_ratio() {
    let Some(engine) = common::gpu() else { return };
    common::run_cases(
        engine,
        &filtered(SweepKind::Full, "grid-"),
        KernelPath::Unfused,
    );
}

#[test]
fn awkward_lengths_and_head_dims() {
    let Some(engine) = common::gpu() else { return };
    let mut cases = Vec::new();
    for (i, &n) in [1usize, 7, 33, 97, 257, 1025].iter().enumerate() {
        for (j, &d) in [8usize, 40, 64, 80, 128, 256].iter().enumerate() {
            // A diagonal walk over (length, head dim) with Nq != Nk and Dk != Dv.
            if (i + j) % 3 != 0 {
                continue;
            }
            let nk = [97, 1025, 7, 257, 1, 33][j];
            let dv = [256, 8, 128, 40, 80, 64][i];
            let gqa = [(1, 1), (3, 1), (4, 1)][(i + j) % 3];
            let causal = (i + j) % 2 == 0;
            cases.push(
                CaseSpec::new(
                    format!("n{n}-k{nk}-dk{d}-dv{dv}"),
                    [1, gqa.0, gqa.1],
                    [n, nk],
                    [d, dv],
                )
                .with(|o| o.is_causal = causal),
            );
        }
    }
    common::run_cases_on(engine, &cases, &GPU_PATHS);
}

#[test]
fn large_logits_and_fully_masked_rows() {
    let Some(engine) = common::gpu() else { return };
    let cases = [
        CaseSpec::new("logits-1e4-1025", [1, 1, 1], [1025, 257], [64, 64]).logits(LARGE_LOGITS),
        CaseSpec::new("logits-1e4-empty-rows", [2, 3, 1], [97, 33], [40, 40])
            .logits(LARGE_LOGITS)
            .mask(MaskForm::EmptyRows),
        // Causal with Nq > Nk and a negative nonpad offset leaves whole rows empty.
        CaseSpec::new("negative-offset-rows", [3, 2, 2], [33, 9], [8, 8])
            .nonpad()
            .with(|o| o.is_causal = true),
    ];
    common::run_cases_on(engine, &cases, &GPU_PATHS);
}

#[test]
fn long_sequences_at_small_batch() {
    let Some(engine) = common::gpu() else { return };
    let cases = [
        CaseSpec::new("long-2048", [1, 2, 1], [2048, 2048], [64, 64]),
        CaseSpec::new("long-2048-causal-window", [1, 1, 1], [2048, 2048], [64, 64]).with(|o| {
            o.is_causal = true;
            o.left_window_size = 300;
        }),
        CaseSpec::new("long-4096-causal", [1, 1, 1], [4096, 4096], [64, 64])
            .with(|o| o.is_causal = true),
        // Past the loop cap of llvmpipe: the fused kernel splits the keys.
        CaseSpec::new("decode-20000-keys", [1, 4, 2], [1, 20000], [128, 128])
            .mask(MaskForm::Bool(1)),
    ];
    common::run_cases_on(engine, &cases, &GPU_PATHS);
}

#[test]
fn quick_sweep_and_long_keys_with_portable_kernels() {
    // The tiled GEMM and the portable fused kernel are what adapters without
    // fixed CPU subgroups (real GPUs, GL, browsers) run; on lavapipe the
    // subgroup kernels are the default, so force the portable ones here.
    if common::gpu().is_none() {
        return;
    }
    let options = webattn::EngineOptions {
        backend: webattn::BackendPreference::Gpu,
        portable_kernels: true,
        ..Default::default()
    };
    let engine = webattn::Engine::with_options_blocking(options).expect("a GPU engine");
    // Calls of a few query rows take the skinny GEMM, which needs no subgroups.
    let unfused = webattn::AttentionOptions {
        path: KernelPath::Unfused,
        ..Default::default()
    };
    let few_rows = webattn::AttentionDims::plain(1, [4, 2], [7, 3000], [64, 256]);
    let plan = engine.plan(&few_rows, &unfused).expect("a plan");
    assert!(
        plan.to_string().starts_with("unfused: gemm_skinny"),
        "{plan}"
    );
    let mut cases = sweep(SweepKind::Quick);
    // Long enough to cross llvmpipe's loop cap: the kernel must split the keys.
    cases.push(
        CaseSpec::new("portable-3000-keys", [1, 2, 1], [5, 3000], [64, 256])
            .mask(MaskForm::Float(1)),
    );
    common::run_cases_on(&engine, &cases, &GPU_PATHS);
}

#[test]
fn portable_kernels_within_the_webgpu_default_limits() {
    // What every browser guarantees: 16 KiB of workgroup memory, 256
    // invocations, 128 MiB storage bindings. The fused kernel's tiles must fit.
    if common::gpu().is_none() {
        return;
    }
    let options = webattn::EngineOptions {
        backend: webattn::BackendPreference::Gpu,
        limits: webattn::DeviceLimits::webgpu_default(),
        portable_kernels: true,
        ..Default::default()
    };
    let engine =
        webattn::Engine::with_options_blocking(options).expect("a device with the WebGPU defaults");
    let limits = &engine.capabilities().unwrap().limits;
    assert_eq!(limits.max_compute_workgroup_storage_size, 16 << 10);
    let cases = [
        CaseSpec::new("defaults-d64", [1, 2, 1], [97, 257], [64, 64]).with(|o| o.is_causal = true),
        CaseSpec::new("defaults-d256", [1, 2, 2], [33, 97], [256, 256]).mask(MaskForm::Float(2)),
        CaseSpec::new("defaults-d8-d200", [2, 3, 1], [7, 1025], [8, 200]),
    ];
    common::run_cases_on(&engine, &cases, &GPU_PATHS);
}

#[test]
fn subgroup_kernels_at_width_4() {
    // Browsers' CPU adapter (SwiftShader) has subgroups of 4; lavapipe's are 8.
    // A workgroup of 4 on lavapipe is a partly filled subgroup, so the width-4
    // variants of the subgroup kernels can be checked here too.
    let Some(engine) = common::gpu() else { return };
    if engine
        .capabilities()
        .and_then(|c| c.fixed_cpu_subgroup())
        .is_none()
    {
        println!("no fixed CPU subgroups on this adapter: nothing to check at width 4");
        return;
    }
    let narrow = engine
        .sharing_device()
        .unwrap()
        .with_subgroup_width(4)
        .expect("width 4");
    let mut cases = sweep(SweepKind::Quick);
    cases.push(
        CaseSpec::new("sg4-long", [1, 2, 1], [130, 3000], [64, 32]).with(|o| o.is_causal = true),
    );
    common::run_cases_on(&narrow, &cases, &GPU_PATHS);
}

#[test]
fn cpu_backend_matches_the_oracle() {
    // The fast CPU backend must pass the same rule (tests/cpu_backend.rs runs the whole sweep).
    let engine = webattn::Engine::cpu();
    common::run_cases(&engine, &sweep(SweepKind::Quick)[..6], KernelPath::Auto);
}

/// An attended key whose score is -inf has probability exactly 0 and still
/// multiplies its V row (0 · inf is NaN, as in PyTorch, and 0 times a huge
/// finite value adds nothing), while a key the row does not attend never
/// does, on every path; the probabilities (mode 3) are +0 at both.
#[test]
fn an_attended_neg_inf_score_multiplies_its_v_row_on_every_path() {
    use webattn::{AttentionInputs, AttentionOptions, HostTensor, QkMatmulOutputMode};
    let Some(engine) = common::gpu() else { return };
    let (rows, keys, d) = (9, 9, 8);
    let mut rng = webattn::rng::SplitMix64::new(common::seed());
    let mut q = rng.normal_vec(2 * rows * d, 1.0);
    for row in 0..2 * rows {
        q[row * d] = 0.5 + q[row * d].abs();
    }
    let mut k = rng.normal_vec(keys * d, 1.0);
    let mut v = rng.normal_vec(keys * d, 1.0);
    // Key 3's score is -inf for every row; its V row holds +inf and a huge
    // finite value. Key 8, which only row 8 attends, holds NaN.
    k[3 * d] = f32::NEG_INFINITY;
    v[3 * d + 1] = f32::INFINITY;
    v[3 * d + 2] = 3.0e38;
    v[8 * d + 4] = f32::NAN;
    let q = HostTensor::new([1, 2, rows, d], q).unwrap();
    let k = HostTensor::new([1, 1, keys, d], k).unwrap();
    let v = HostTensor::new([1, 1, keys, d], v).unwrap();
    let inputs = AttentionInputs::new(&q, &k, &v);
    let run = |path| {
        let options = AttentionOptions {
            is_causal: true,
            qk_matmul_output_mode: Some(QkMatmulOutputMode::Probabilities),
            path,
            ..Default::default()
        };
        engine.attention_host_blocking(&inputs, &options).unwrap()
    };
    let oracle = run(KernelPath::Oracle);
    for path in [
        KernelPath::Unfused,
        KernelPath::Fused,
        KernelPath::Cpu,
        KernelPath::Oracle,
    ] {
        let out = run(path);
        let mut worst = 0.0f32;
        for (i, (&got, &want)) in out.y.data().iter().zip(oracle.y.data()).enumerate() {
            let (row, col) = ((i / d) % rows, i % d);
            let nan_expected = (row >= 3 && col == 1) || (row == 8 && col == 4);
            assert_eq!(got.is_nan(), nan_expected, "{path:?}: y[{i}] is {got}");
            if !nan_expected {
                assert!(got.is_finite(), "{path:?}: y[{i}] is {got}");
                worst = worst.max((got - want).abs());
            }
        }
        assert!(
            worst < 1e-5,
            "{path:?}: worst error {worst:e} against the oracle"
        );
        let probabilities = out.qk_matmul_output.expect("mode 3 requested");
        for (i, &p) in probabilities.data().iter().enumerate() {
            let (row, key) = ((i / keys) % rows, i % keys);
            if key > row || key == 3 {
                assert_eq!(
                    p.to_bits(),
                    0,
                    "{path:?}: probability of row {row}, key {key} is {p:e}, not +0"
                );
            }
        }
        println!("{path:?}: NaN where the oracle has it, worst finite error {worst:.2e}");
    }
}
