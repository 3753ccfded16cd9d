//! The library API: tensors stay on the device across calls, outputs can feed
//! the next call without a readback, pipelines compile once, and the host
//! convenience call gives the same numbers.

use crate::common;

use webattn::{AttentionInputs, AttentionOptions, BackendKind, HostTensor, KernelPath};

fn tensor(shape: [usize; 4], seed: u64) -> HostTensor {
    let mut rng = webattn::rng::SplitMix64::new(seed);
    HostTensor::new(shape, rng.normal_vec(shape.iter().product(), 1.0)).unwrap()
}

#[test]
fn upload_once_run_many_read_back_when_asked() {
    let Some(engine) = common::gpu() else { return };
    assert_eq!(engine.backend(), BackendKind::Gpu);
    let caps = engine
        .capabilities()
        .expect("a GPU engine has a capability profile");
    assert!(caps.limits.max_compute_workgroups_per_dimension >= 65535);

    let (qh, kh, vh) = (
        tensor([1, 4, 16, 8], 1),
        tensor([1, 2, 24, 8], 2),
        tensor([1, 2, 24, 8], 3),
    );
    let (q, k, v) = (
        engine.upload(&qh).unwrap(),
        engine.upload(&kh).unwrap(),
        engine.upload(&vh).unwrap(),
    );
    assert!(q.is_on_gpu() && q.device_bytes() >= 4 * 16 * 8 * 4);

    let mut y_first = None;
    for causal in [false, true, false] {
        let options = AttentionOptions {
            is_causal: causal,
            return_lse: true,
            ..Default::default()
        };
        let out = engine
            .attention_blocking(&AttentionInputs::new(&q, &k, &v), &options)
            .unwrap();
        assert!(out.y.is_on_gpu() && out.lse.as_ref().unwrap().is_on_gpu());
        let y = engine.download_blocking(&out.y).unwrap();
        let host = engine
            .attention_host_blocking(&AttentionInputs::new(&qh, &kh, &vh), &options)
            .unwrap();
        assert_eq!(y, host.y, "device and host calls must agree exactly");
        if !causal {
            match &y_first {
                None => y_first = Some(y),
                Some(first) => assert_eq!(first, &y, "the same call twice gives the same bits"),
            }
        }
    }
    // The inputs are untouched by the calls.
    assert_eq!(engine.download_blocking(&q).unwrap(), qh);
}

#[test]
fn outputs_feed_the_next_call_without_readback() {
    let Some(engine) = common::gpu() else { return };
    let (qh, kh, vh) = (
        tensor([1, 2, 9, 8], 4),
        tensor([1, 2, 9, 8], 5),
        tensor([1, 2, 9, 8], 6),
    );
    let (q, k, v) = (
        engine.upload(&qh).unwrap(),
        engine.upload(&kh).unwrap(),
        engine.upload(&vh).unwrap(),
    );
    let options = AttentionOptions::default();
    let first = engine
        .attention_blocking(&AttentionInputs::new(&q, &k, &v), &options)
        .unwrap();
    // Y [1, 2, 9, 8] becomes the queries of a second layer.
    let second = engine
        .attention_blocking(&AttentionInputs::new(&first.y, &k, &v), &options)
        .unwrap();
    let got = engine.download_blocking(&second.y).unwrap();

    let cpu = webattn::Engine::cpu();
    let y1 = cpu
        .attention_host_blocking(&AttentionInputs::new(&qh, &kh, &vh), &options)
        .unwrap()
        .y;
    let y2 = cpu
        .attention_host_blocking(&AttentionInputs::new(&y1, &kh, &vh), &options)
        .unwrap()
        .y;
    let err = got
        .data()
        .iter()
        .zip(y2.data())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("two chained layers: max error {err:.2e}");
    assert!(err < 1e-5, "{err}");
}

/// A tensor's values written in place: no buffer created, clones see the
/// new values, f16 tensors round as an upload does, and a write of another
/// shape or dtype, or into another engine's tensor, is a typed error that
/// leaves the tensor as it was. Downloads of a size read before reuse their
/// staging buffer.
#[test]
fn tensors_are_written_in_place_and_read_back_without_new_buffers() {
    let Some(engine) = common::own_gpu() else {
        return;
    };
    let ctx = engine.gpu().expect("a GPU engine");
    let first = tensor([1, 2, 3, 5], 11);
    let second = tensor([1, 2, 3, 5], 12);
    let mut t = engine.upload(&first).unwrap();
    let alias = t.clone();
    assert_eq!(engine.download_blocking(&t).unwrap().data(), first.data());
    let before = ctx.work_counts();
    engine.write(&mut t, &second).unwrap();
    assert_eq!(
        engine.download_blocking(&alias).unwrap().data(),
        second.data()
    );
    assert_eq!(engine.download_blocking(&t).unwrap().data(), second.data());
    let counts = ctx.work_counts() - before;
    assert_eq!(counts.buffers, 0, "{counts:?}");

    // f16: rounded as an upload rounds, an odd count padded within its word.
    let odd = tensor([1, 1, 1, 7], 13).into_dtype(webattn::DType::F16);
    let mut h = engine.upload(&odd).unwrap();
    let next = tensor([1, 1, 1, 7], 14).into_dtype(webattn::DType::F16);
    engine.write(&mut h, &next).unwrap();
    let uploaded = engine
        .download_blocking(&engine.upload(&next).unwrap())
        .unwrap();
    assert_eq!(
        engine.download_blocking(&h).unwrap().data(),
        uploaded.data()
    );

    // Refused, and the tensor keeps its values.
    let wrong_shape = tensor([1, 2, 5, 3], 15);
    let err = engine.write(&mut t, &wrong_shape).unwrap_err();
    assert!(matches!(err, webattn::Error::Rank { .. }), "{err}");
    let err = engine.write(&mut t, &odd).unwrap_err();
    assert!(matches!(err, webattn::Error::DType { .. }), "{err}");
    let cpu = webattn::Engine::cpu();
    let err = cpu.write(&mut t, &first).unwrap_err();
    assert!(matches!(err, webattn::Error::ForeignTensor { .. }), "{err}");
    assert_eq!(engine.download_blocking(&t).unwrap().data(), second.data());

    // A CPU engine's tensor takes the new values too.
    let mut on_host = cpu.upload(&first).unwrap();
    cpu.write(&mut on_host, &second).unwrap();
    assert_eq!(
        cpu.download_blocking(&on_host).unwrap().data(),
        second.data()
    );
}

/// bfloat16 bits uploaded and widened on the device give exactly the f32
/// values of the bits shifted up (zeros, subnormals, infinities, NaN payloads,
/// an odd count), on a device whose bindings are smaller than the tensor too
/// (widened a slice at a time) and on a CPU engine; a count that is not the
/// shape's is a typed error.
#[test]
fn bfloat16_uploads_are_widened_on_the_device_exactly() {
    let Some(engine) = common::gpu() else { return };
    let mut rng = webattn::rng::SplitMix64::new(common::seed());
    let mut bits: Vec<u16> = rng
        .normal_vec(3 * 5 * 1025, 1.0)
        .into_iter()
        .map(|x| (x.to_bits() >> 16) as u16)
        .collect();
    let specials = [
        0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc1, 0xffff, 0x7f7f,
    ];
    bits[..specials.len()].copy_from_slice(&specials);
    let small = webattn::EngineOptions {
        backend: webattn::BackendPreference::Gpu,
        limits: webattn::DeviceLimits::default()
            .with("max_storage_buffer_binding_size", 8 << 10)
            .expect("a known limit"),
        ..Default::default()
    };
    let small = webattn::Engine::with_options_blocking(small).expect("a small-binding engine");
    let cpu = webattn::Engine::cpu();
    for (shape, name) in [(vec![3, 5, 1025], "whole"), (vec![7], "odd")] {
        let n: usize = shape.iter().product();
        let want: Vec<u32> = bits[..n].iter().map(|&b| u32::from(b) << 16).collect();
        for (engine, on) in [(engine, "gpu"), (&small, "8 KiB bindings"), (&cpu, "cpu")] {
            let t = engine.upload_bf16_blocking(&bits[..n], &shape).unwrap();
            assert_eq!(t.dtype(), webattn::DType::F32);
            let got: Vec<u32> = engine
                .download_blocking(&t)
                .unwrap()
                .data()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            assert_eq!(got, want, "{name} on {on}");
        }
    }
    let err = engine.upload_bf16_blocking(&bits[..6], &[7]).unwrap_err();
    assert!(matches!(err, webattn::Error::DataLength { .. }), "{err}");
}

#[test]
fn pipelines_compile_once() {
    let Some(engine) = common::gpu() else { return };
    let (q, k, v) = (
        tensor([1, 1, 5, 4], 7),
        tensor([1, 1, 5, 4], 8),
        tensor([1, 1, 5, 4], 9),
    );
    let run = || {
        engine
            .attention_host_blocking(
                &AttentionInputs::new(&q, &k, &v),
                &AttentionOptions::default(),
            )
            .unwrap()
    };
    run();
    let keys = engine.gpu().unwrap().pipelines().compiled_keys();
    run();
    assert_eq!(keys, engine.gpu().unwrap().pipelines().compiled_keys());
    let labels: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    println!("compiled: {labels:?}");
    // Auto takes the fused path: one fused pipeline (portable or subgroup),
    // keyed by its override constants.
    assert!(
        labels
            .iter()
            .any(|l| l.starts_with("attention_fused[") || l.starts_with("attention_sg[")),
        "{labels:?}"
    );
}

#[test]
fn the_cpu_paths_can_be_forced_on_a_gpu_engine() {
    let Some(engine) = common::own_gpu() else {
        return;
    };
    let (q, k, v) = (
        tensor([2, 3, 7, 5], 10),
        tensor([2, 1, 4, 5], 11),
        tensor([2, 1, 4, 6], 12),
    );
    let inputs = AttentionInputs::new(&q, &k, &v);
    let forced = |path| {
        let out = engine
            .attention_host_blocking(
                &inputs,
                &AttentionOptions {
                    path,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(engine.last_call().unwrap().plan.path, path);
        out
    };
    // Cpu is the fast backend, Oracle the f64 oracle, each exactly as it runs alone.
    let fast = webattn::cpu::fast::CpuBackend::default()
        .attention(&inputs, &AttentionOptions::default())
        .unwrap();
    assert_eq!(forced(KernelPath::Cpu).y, fast.y);
    let oracle = webattn::cpu::attention(&inputs, &AttentionOptions::default()).unwrap();
    assert_eq!(forced(KernelPath::Oracle).y, oracle.y);
    assert!(engine.paths().contains(&KernelPath::Cpu));
}

#[test]
fn a_repeated_pattern_fills_a_tensor_on_the_device_and_on_the_cpu() {
    let pattern = HostTensor::new([10], (0..10).map(|i| i as f32 * 0.5 - 2.0).collect()).unwrap();
    let shape = [3, 5, 7];
    let expected: Vec<f32> = pattern.data().iter().copied().cycle().take(105).collect();
    let cpu = webattn::Engine::cpu();
    let mut engines = vec![&cpu];
    if let Some(gpu) = common::gpu() {
        engines.push(gpu);
    }
    for engine in engines {
        for dtype in [webattn::DType::F32, webattn::DType::F16] {
            let pattern = pattern.clone().into_dtype(dtype);
            let tensor =
                pollster::block_on(engine.upload_repeated(&shape, &pattern)).expect("a tensor");
            assert_eq!(tensor.shape(), shape);
            assert_eq!(tensor.dtype(), dtype);
            let back = engine.download_blocking(&tensor).unwrap();
            // Every value is exact in f16 too (multiples of 0.5 up to 2.5).
            assert_eq!(back.data(), expected.as_slice(), "{dtype:?}");
        }
        // An odd or empty pattern is refused, not a GPU validation error.
        let odd = HostTensor::new([3], vec![1.0; 3]).unwrap();
        assert!(matches!(
            pollster::block_on(engine.upload_repeated(&shape, &odd)),
            Err(webattn::Error::InvalidOption { .. })
        ));
        // A tensor no memory holds is a typed error, not an abort, a panic or
        // an empty buffer: 2^62 values (bytes past a u64) everywhere, and on
        // the CPU 2^45 (128 TiB, an x86-64 process's whole address space;
        // lavapipe hands out buffers of device memory it never touches, so
        // only a device's own allocation can refuse that there).
        let lens: &[usize] = match engine.gpu() {
            None if cfg!(target_arch = "x86_64") => &[1 << 45, 1 << 62],
            _ => &[1 << 62],
        };
        for &len in lens {
            let err = pollster::block_on(engine.upload_repeated(&[len], &pattern))
                .expect_err("no memory holds it");
            assert!(
                matches!(
                    err,
                    webattn::Error::OutOfMemory(_) | webattn::Error::Limit { .. }
                ),
                "{len}: {err}"
            );
        }
    }
}

/// Outputs the host cannot allocate (Y of 2^45 values, from 48 MiB of
/// inputs) are a typed error on the CPU backend and the oracle, not an
/// aborted process. (On x86-64, whose processes address 128 TiB: elsewhere a
/// permissive overcommit might grant the allocation.)
#[cfg(target_arch = "x86_64")]
#[test]
fn outputs_the_host_cannot_hold_are_out_of_memory_on_the_cpu() {
    let q = HostTensor::new([1, 1, 1 << 22, 1], vec![0.0; 1 << 22]).unwrap();
    let k = HostTensor::new([1, 1, 1, 1], vec![0.0]).unwrap();
    let v = HostTensor::new([1, 1, 1, 1 << 23], vec![0.0; 1 << 23]).unwrap();
    let inputs = AttentionInputs::new(&q, &k, &v);
    let options = AttentionOptions::default();
    let engine = webattn::Engine::cpu();
    let err = engine
        .attention_host_blocking(&inputs, &options)
        .expect_err("128 TiB of Y");
    assert!(matches!(err, webattn::Error::OutOfMemory(_)), "{err}");
    assert!(err.to_string().contains("Y"), "{err}");
    let err = webattn::cpu::attention_exact(&inputs, &options).expect_err("256 TiB of f64 Y");
    assert!(matches!(err, webattn::Error::OutOfMemory(_)), "{err}");
}

/// Random inputs the host cannot hold (the bench's and the JS library's
/// `benchmark()` draw them from a shape) are a typed error, not an aborted
/// process: 2^45 values of Q (x86-64 only, as above), and a count past
/// `usize` anywhere.
#[test]
fn inputs_drawn_past_the_host_memory_are_out_of_memory() {
    let mut rng = webattn::rng::SplitMix64::new(1);
    let huge: &[usize] = if cfg!(target_arch = "x86_64") {
        &[1 << 15, 1 << 15, 1 << 15]
    } else {
        &[]
    };
    for dims in [huge, &[usize::MAX, 2][..]] {
        if dims.is_empty() {
            continue;
        }
        let err = rng
            .try_normal_vec("Q", dims, 1.0)
            .expect_err("no host holds it");
        assert!(matches!(err, webattn::Error::OutOfMemory(_)), "{err}");
        assert!(err.to_string().contains("drawing Q"), "{err}");
    }
    let case =
        webattn::conformance::CaseSpec::new("huge", [1, 1 << 15, 1], [1 << 15, 1], [1 << 15, 8]);
    if cfg!(target_arch = "x86_64") {
        let err = case.generate(1).expect_err("2^45 values of Q");
        assert!(matches!(err, webattn::Error::OutOfMemory(_)), "{err}");
    }
    assert_eq!(rng.try_normal_vec("Q", &[2, 3], 1.0).unwrap().len(), 6);
}

/// Measurements side by side interleave: each round runs every piece once,
/// warm-ups first, and each piece gets its own timed samples.
#[test]
fn side_by_side_measurements_interleave_their_runs() {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let repeats = webattn::measure::Repeats {
        warmup: 1,
        timed: 2,
    };
    let mut order = Vec::new();
    let measured = pollster::block_on(webattn::measure::measure_gpu_interleaved(
        ctx,
        repeats,
        3,
        async |piece| {
            order.push(piece);
            Ok(())
        },
    ))
    .unwrap();
    // (A GPU's clock guard may retake a run: the same piece again at once.)
    order.dedup();
    assert_eq!(order, [0, 1, 2, 0, 1, 2, 0, 1, 2]);
    assert_eq!(measured.len(), 3);
    assert!(measured.iter().all(|m| m.samples_ms.len() == 2));

    // Engines of two contexts are not measured side by side.
    let other = webattn::Engine::with_options_blocking(webattn::EngineOptions {
        backend: webattn::BackendPreference::Gpu,
        tuning_cache: webattn::tuning::TuningCache::Memory,
        ..Default::default()
    })
    .unwrap();
    let shape = webattn::measure::AttentionShape {
        batch: 1,
        heads: 1,
        kv_heads: 1,
        seq_q: 4,
        seq_k: 4,
        head_dim: 8,
        causal: false,
    };
    let run = webattn::measure::AttentionRun {
        path: KernelPath::Fused,
        precision: webattn::Precision::Highest,
        cold_cache: false,
        dtype: webattn::DType::F32,
    };
    let err = pollster::block_on(webattn::measure::attention_runs(
        &[engine, &other],
        shape,
        run,
        repeats,
    ))
    .unwrap_err();
    assert!(err.to_string().contains("one GPU context"), "{err}");
}

/// The benchmark measures grouped-query decode (the token-step layer's
/// heads): Q has the query heads, K and V the KV heads, and the bytes a row
/// reads count K and V once per KV head.
#[test]
fn a_grouped_query_decode_row_is_measured_with_its_kv_heads() {
    // An engine of its own: the pipelines it compiles must not land in the
    // shared engine while another test counts that engine's pipelines.
    let Some(engine) = common::own_gpu() else {
        return;
    };
    let engine = &engine;
    let shape = webattn::measure::AttentionShape {
        batch: 1,
        heads: 4,
        kv_heads: 2,
        seq_q: 1,
        seq_k: 600,
        head_dim: 8,
        causal: false,
    };
    assert_eq!(shape.kv_bytes(), 2 * 4 * (2 * 600 * 8));
    let repeats = webattn::measure::Repeats {
        warmup: 1,
        timed: 2,
    };
    for dtype in [webattn::DType::F32, webattn::DType::F16] {
        let m = pollster::block_on(webattn::measure::attention_as(
            engine,
            shape,
            KernelPath::Fused,
            repeats,
            false,
            dtype,
        ))
        .unwrap_or_else(|e| panic!("{dtype:?}: {e}"));
        assert!(m.measurement.median_ms() > 0.0, "{dtype:?}");
    }
}

/// The bandwidth ceiling is timed as the FMA ceiling is: by the copy's GPU
/// timestamps where the adapter has them, not by the wall clock around its
/// submission (which counted the submit and the wait in, and put decode's
/// share of the ceiling too high).
#[test]
fn the_bandwidth_ceiling_is_timed_like_the_fma_ceiling() {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let repeats = webattn::measure::Repeats {
        warmup: 1,
        timed: 2,
    };
    let (_, fma) = pollster::block_on(webattn::measure::fma_ceiling(ctx, repeats)).unwrap();
    let copy = pollster::block_on(webattn::measure::bandwidth_ceiling(ctx, repeats)).unwrap();
    println!(
        "fma ceiling {:?}, copy ceiling {:?}",
        fma.clock, copy.measurement.clock
    );
    assert_eq!(copy.measurement.clock, fma.clock);
}

/// The clock guard (`bench::clock_guard`): off by default on a CPU adapter
/// (lavapipe), and when turned on every timed run still counts once, with
/// probes run around the runs (their fastest recorded on the context) and
/// retakes within the budget.
#[test]
fn the_clock_guard_probes_around_each_run_where_it_is_on() {
    if common::gpu().is_none() {
        return;
    }
    // An engine of its own: the guard's setting is shared by a context's
    // clones, and the other tests measure on the shared engine meanwhile.
    let engine = webattn::Engine::with_options_blocking(webattn::EngineOptions {
        backend: webattn::BackendPreference::Gpu,
        tuning_cache: webattn::tuning::TuningCache::Memory,
        ..Default::default()
    })
    .unwrap();
    let ctx = engine.gpu().expect("a GPU engine");
    let repeats = webattn::measure::Repeats {
        warmup: 1,
        timed: 3,
    };
    let cpu_adapter = ctx.capabilities().adapter.device_type == "Cpu";
    if cpu_adapter {
        assert!(
            !ctx.clock_guard_on(),
            "the guard is off by default on a CPU adapter"
        );
        let (_, m) = pollster::block_on(webattn::measure::fma_ceiling(ctx, repeats)).unwrap();
        assert_eq!((m.retaken, m.throttled), (0, 0));
        assert_eq!(ctx.fastest_clock_probe_gflops(), None, "no probe ran");
    }
    ctx.set_clock_guard(Some(true));
    if !ctx.capabilities().timestamp_query {
        assert!(!ctx.clock_guard_on(), "the guard needs timestamps");
        return;
    }
    assert!(ctx.clock_guard_on());
    let (_, m) = pollster::block_on(webattn::measure::fma_ceiling(ctx, repeats)).unwrap();
    println!(
        "samples {:?}, retaken {}, throttled {}, fastest probe {:?} GFLOP/s",
        m.samples_ms,
        m.retaken,
        m.throttled,
        ctx.fastest_clock_probe_gflops()
    );
    assert_eq!(m.samples_ms.len(), repeats.timed);
    assert!(m.retaken <= webattn::measure::clock_guard::retake_budget(repeats.timed));
    assert!(
        m.throttled == 0
            || m.retaken == webattn::measure::clock_guard::retake_budget(repeats.timed)
    );
    assert!(ctx.fastest_clock_probe_gflops().is_some_and(|g| g > 0.0));
}
