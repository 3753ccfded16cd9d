//! Bad input gives a typed error that names the sizes, on both backends, and
//! never a panic or a GPU validation error. Together with the unit tests in
//! `src/` (scope-error classification, readback) and `tests/shaders.rs` and
//! `tests/no_adapter.rs`, every variant of `webattn::Error` is reached.

use crate::common;

use webattn::{
    AttentionInputs, AttentionOptions, BackendPreference, Engine, EngineOptions, Error, HostMask,
    HostTensor, KernelPath,
};

fn t(shape: &[usize]) -> HostTensor {
    HostTensor::zeros(shape.to_vec()).expect("small tensor")
}

/// Runs the host call on the CPU engine and, when there is one, the GPU engine,
/// and checks both give the same error.
fn both_fail(inputs: &AttentionInputs<'_, HostTensor>, options: &AttentionOptions) -> Error {
    let cpu = Engine::cpu()
        .attention_host_blocking(inputs, options)
        .unwrap_err();
    if let Some(gpu) = common::gpu() {
        let on_gpu = gpu.attention_host_blocking(inputs, options).unwrap_err();
        assert_eq!(cpu, on_gpu, "the backends disagree");
    }
    println!("{cpu}");
    cpu
}

#[test]
fn rank_and_empty_tensors() {
    let (q3, k, v) = (t(&[1, 2, 4]), t(&[1, 1, 3, 4]), t(&[1, 1, 3, 4]));
    let err = both_fail(
        &AttentionInputs::new(&q3, &k, &v),
        &AttentionOptions::default(),
    );
    assert!(matches!(&err, Error::Rank { tensor: "Q", got, .. } if got == &[1, 2, 4]));
    let empty = t(&[1, 1, 0, 4]);
    let err = both_fail(
        &AttentionInputs::new(&empty, &k, &v),
        &AttentionOptions::default(),
    );
    assert!(matches!(err, Error::EmptyTensor { tensor: "Q", .. }));
}

#[test]
fn shape_mismatches_name_the_dimension() {
    let (q, k, v) = (t(&[2, 2, 3, 8]), t(&[1, 2, 5, 8]), t(&[2, 2, 5, 4]));
    let err = both_fail(
        &AttentionInputs::new(&q, &k, &v),
        &AttentionOptions::default(),
    );
    assert!(matches!(
        err,
        Error::ShapeMismatch {
            tensor: "K",
            dim: "batch",
            got: 1,
            expected: 2,
            ..
        }
    ));
    let (k, v_short) = (t(&[2, 2, 5, 8]), t(&[2, 2, 4, 4]));
    let err = both_fail(
        &AttentionInputs::new(&q, &k, &v_short),
        &AttentionOptions::default(),
    );
    assert!(err.to_string().contains("sequence length = 4"), "{err}");
    let k_dim = t(&[2, 2, 5, 7]);
    let err = both_fail(
        &AttentionInputs::new(&q, &k_dim, &v),
        &AttentionOptions::default(),
    );
    assert!(matches!(
        err,
        Error::ShapeMismatch {
            dim: "head size",
            got: 7,
            expected: 8,
            ..
        }
    ));
}

#[test]
fn data_length_and_dtype() {
    let err = HostTensor::named("Q", vec![2, 3], vec![0.0; 5]).unwrap_err();
    assert!(matches!(
        err,
        Error::DataLength {
            tensor: "Q",
            expected: 6,
            got: 5,
            ..
        }
    ));
    let err = HostTensor::from_le_bytes("K", webattn::DType::Bool, [1], &[1]).unwrap_err();
    assert!(matches!(err, Error::DType { tensor: "K", .. }));
    assert!(err.to_string().contains("bool"), "{err}");
}

#[test]
fn gqa_heads_must_divide() {
    let (q, k, v) = (t(&[1, 3, 2, 4]), t(&[1, 2, 2, 4]), t(&[1, 2, 2, 4]));
    let err = both_fail(
        &AttentionInputs::new(&q, &k, &v),
        &AttentionOptions::default(),
    );
    assert_eq!(
        err,
        Error::GqaHeads {
            q_heads: 3,
            kv_heads: 2
        }
    );
}

#[test]
fn masks_that_do_not_broadcast() {
    let (q, k, v) = (t(&[2, 3, 5, 4]), t(&[2, 1, 7, 4]), t(&[2, 1, 7, 4]));
    // [B, Nq, T] is not a valid rank-3 mask: rank 3 means [Hq, Nq, T].
    let mask = HostMask::bool(vec![2, 5, 7], vec![true; 70]).unwrap();
    let err = both_fail(
        &AttentionInputs::new(&q, &k, &v).with_mask(&mask),
        &AttentionOptions::default(),
    );
    assert!(
        matches!(&err, Error::Broadcast { mask, target, .. } if mask == &[2, 5, 7] && target == &[2, 3, 5, 7])
    );
    let long = HostMask::float(vec![8], vec![0.0; 8]).unwrap();
    let err = both_fail(
        &AttentionInputs::new(&q, &k, &v).with_mask(&long),
        &AttentionOptions::default(),
    );
    assert!(
        err.to_string().contains("longer than the number of keys"),
        "{err}"
    );
    let rank5 = HostMask::bool(vec![1, 1, 1, 1, 7], vec![true; 7]).unwrap();
    let err = both_fail(
        &AttentionInputs::new(&q, &k, &v).with_mask(&rank5),
        &AttentionOptions::default(),
    );
    assert!(matches!(
        err,
        Error::Rank {
            tensor: "attn_mask",
            ..
        }
    ));
}

#[test]
fn invalid_options_and_conflicts() {
    let (q, k, v) = (t(&[1, 1, 2, 4]), t(&[1, 1, 3, 4]), t(&[1, 1, 3, 4]));
    let inputs = AttentionInputs::new(&q, &k, &v);
    for options in [
        AttentionOptions {
            scale: Some(-1.0),
            ..Default::default()
        },
        AttentionOptions {
            softcap: f32::INFINITY,
            ..Default::default()
        },
        AttentionOptions {
            left_window_size: -7,
            ..Default::default()
        },
    ] {
        assert!(matches!(
            both_fail(&inputs, &options),
            Error::InvalidOption { .. }
        ));
    }
    let lengths = [4i64];
    let err = both_fail(
        &inputs.with_nonpad_kv_seqlen(&lengths),
        &AttentionOptions::default(),
    );
    assert!(matches!(
        err,
        Error::InvalidOption {
            name: "nonpad_kv_seqlen",
            ..
        }
    ));
    let wrong_count = [1i64, 2];
    let err = both_fail(
        &inputs.with_nonpad_kv_seqlen(&wrong_count),
        &AttentionOptions::default(),
    );
    assert!(matches!(
        err,
        Error::ShapeMismatch {
            tensor: "nonpad_kv_seqlen",
            ..
        }
    ));

    let past = t(&[1, 1, 2, 4]);
    let mut only_key = inputs;
    only_key.past_key = Some(&past);
    assert!(matches!(
        both_fail(&only_key, &AttentionOptions::default()),
        Error::Conflict(_)
    ));
    let lengths = [3i64];
    let err = both_fail(
        &inputs
            .with_past(&past, &past)
            .with_nonpad_kv_seqlen(&lengths),
        &AttentionOptions::default(),
    );
    assert!(matches!(err, Error::Conflict(m) if m.contains("nonpad_kv_seqlen")));
}

#[test]
fn tensors_belong_to_their_engine() {
    let a = Engine::cpu();
    let b = Engine::cpu();
    let q = a.upload(&t(&[1, 1, 2, 4])).unwrap();
    let k = b.upload(&t(&[1, 1, 2, 4])).unwrap();
    let err = a
        .attention_blocking(
            &AttentionInputs::new(&q, &k, &k),
            &AttentionOptions::default(),
        )
        .unwrap_err();
    assert_eq!(err, Error::ForeignTensor { tensor: "K" });
    assert!(matches!(
        b.download_blocking(&q),
        Err(Error::ForeignTensor { .. })
    ));
}

#[test]
fn limits_beyond_the_adapter_are_refused() {
    if common::gpu().is_none() {
        return;
    }
    let limits = wgpu::Limits {
        max_compute_workgroup_storage_size: u32::MAX,
        ..Default::default()
    };
    let options = EngineOptions {
        backend: BackendPreference::Gpu,
        limits: limits.into(),
        ..Default::default()
    };
    let err = Engine::with_options_blocking(options).unwrap_err();
    assert!(matches!(err, Error::RequestDevice(_)), "{err}");
}

/// A GPU engine whose storage bindings and buffers are limited to 1 MiB.
fn small_engine() -> Option<Engine> {
    common::gpu()?;
    let limits = wgpu::Limits {
        max_storage_buffer_binding_size: 1 << 20,
        max_buffer_size: 1 << 20,
        ..wgpu::Limits::default()
    };
    let options = EngineOptions {
        backend: BackendPreference::Gpu,
        limits: limits.into(),
        ..Default::default()
    };
    Some(Engine::with_options_blocking(options).expect("a device with small limits"))
}

#[test]
fn tensors_beyond_one_buffer_run_and_what_cannot_be_cut_is_a_typed_error() {
    let Some(engine) = small_engine() else { return };
    // Q alone is 2 MiB: held in two buffers (tests/gpu/chunks.rs), a mask of that
    // size too.
    let big = t(&[1, 1, 1024, 512]);
    assert_eq!(engine.upload(&big).unwrap().device_buffers(), 2);
    let mask = webattn::HostMask::float(vec![1, 1, 1024, 512], vec![0.0; 1024 * 512]).unwrap();
    assert_eq!(
        engine.upload_mask(&mask).map(|m| m.is_on_gpu()).ok(),
        Some(true)
    );
    // Y of 2 MiB although every input fits one buffer: held in two.
    let (q, k, v) = (t(&[1, 1, 512, 1]), t(&[1, 1, 4, 1]), t(&[1, 1, 4, 1024]));
    let out = engine
        .attention_blocking(
            &AttentionInputs::new(
                &engine.upload(&q).unwrap(),
                &engine.upload(&k).unwrap(),
                &engine.upload(&v).unwrap(),
            ),
            &AttentionOptions::default(),
        )
        .unwrap();
    assert_eq!(out.y.device_buffers(), 2);
    // A row of probabilities is normalised whole, so one longer than a
    // binding (300k keys of 4 bytes) cannot be cut: refused before anything
    // is recorded, naming the limit.
    let (q, kv) = (t(&[1, 1, 1, 1]), t(&[1, 1, 300_000, 1]));
    let err = engine
        .attention_host_blocking(
            &AttentionInputs::new(&q, &kv, &kv),
            &AttentionOptions {
                qk_matmul_output_mode: Some(webattn::QkMatmulOutputMode::Probabilities),
                ..Default::default()
            },
        )
        .unwrap_err();
    println!("{err}");
    assert!(
        matches!(
            &err,
            Error::Limit {
                limit_name: "max_storage_buffer_binding_size",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn score_matrices_beyond_the_binding_limit_are_chunked() {
    let Some(engine) = small_engine() else { return };
    // 2 heads x 600 x 600 scores = 2.9 MB, three times the 1 MiB binding limit:
    // the unfused path splits them by rows and still matches the oracle.
    let case = webattn::conformance::CaseSpec::new("chunked", [1, 2, 1], [600, 600], [8, 8])
        .mask(webattn::conformance::MaskForm::Float(1))
        .with(|o| o.is_causal = true);
    common::run_cases(&engine, &[case], KernelPath::Unfused);
}
