//! Prepared calls: planned once, their workspace made by the first run. Every
//! run gives the bits a plain call gives (and meets the f64 oracle's rule) on
//! fresh inputs, its reused zero-filled buffers cleared; runs after the first
//! create no buffer; inputs of other shapes and other engines are refused.

use crate::common;

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
                let data = (0..n * t).map(|i| i >= t && !(i * 7 + run as usize).is_multiple_of(3));
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
            prepared.plan().path,
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

/// A wgpu program's own device, buffers and encoder: the engine wraps the
/// buffers in place, records after the program's own command in the same
/// encoder, submits nothing itself, and the result meets the oracle.
#[test]
fn recording_into_the_hosts_own_encoder() {
    if common::gpu().is_none() {
        return;
    }
    let instance = wgpu::Instance::default();
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
        .expect("the adapter the tests run on");
    let (device, queue) = pollster::block_on(adapter.request_device(&Default::default())).unwrap();

    // Too few storage bindings for the kernels: refused, naming the limit.
    let (small, small_queue) =
        pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            required_limits: wgpu::Limits {
                max_storage_buffers_per_shader_stage: 4,
                ..Default::default()
            },
            ..Default::default()
        }))
        .unwrap();
    let err = Engine::from_wgpu(&adapter, small, small_queue).unwrap_err();
    assert!(
        err.to_string()
            .contains("max_storage_buffers_per_shader_stage"),
        "{err}"
    );

    let engine = Engine::from_wgpu(&adapter, device.clone(), queue.clone()).unwrap();
    let (qs, ks) = ([1, 4, 33, 16], [1, 2, 40, 16]);
    let hosts = [tensor(qs, 5), tensor(ks, 6), tensor(ks, 7)];
    let buffers: Vec<wgpu::Buffer> = hosts
        .iter()
        .map(|t| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("host tensor"),
                size: (t.len() * 4) as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })
        .collect();
    let wrap = |i: usize, shape: [usize; 4]| {
        engine
            .wrap_buffer(buffers[i].clone(), &shape, webattn::DType::F32)
            .unwrap()
    };
    let (q, k, v) = (wrap(0, qs), wrap(1, ks), wrap(2, ks));
    // Buffers that cannot be bound, or are too small, are refused.
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 64,
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
        mapped_at_creation: false,
    });
    assert!(matches!(
        engine.wrap_buffer(staging, &[4], webattn::DType::F32),
        Err(Error::Conflict(_))
    ));
    assert!(matches!(
        engine.wrap_buffer(buffers[0].clone(), &[1, 4, 34, 16], webattn::DType::F32),
        Err(Error::Limit { .. })
    ));
    // A buffer made on another device is the caller's mistake: refused when
    // wrapped, naming the buffer and the engine's device, so nothing is ever
    // recorded with it (it used to fail inside the recording as a webattn bug).
    let (other, _other_queue) =
        pollster::block_on(adapter.request_device(&Default::default())).unwrap();
    let foreign = other.create_buffer(&wgpu::BufferDescriptor {
        label: Some("another device's tensor"),
        size: buffers[0].size(),
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let err = engine
        .wrap_buffer(foreign, &qs, webattn::DType::F32)
        .unwrap_err();
    assert!(matches!(err, Error::ForeignBuffer { .. }), "{err}");
    let adapter_name = &engine.capabilities().unwrap().adapter.name;
    assert!(
        err.to_string().contains("another wgpu device")
            && err.to_string().contains(adapter_name.as_str())
            && err
                .to_string()
                .contains(&format!("{} bytes", buffers[0].size())),
        "{err}"
    );

    let options = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let inputs = AttentionInputs::new(&q, &k, &v);
    let prepared = engine
        .prepare(&webattn::validate(&inputs, &options).unwrap(), &options)
        .unwrap();
    let ctx = engine.gpu().unwrap();
    for run in 0..2 {
        // The program's own commands first: its uploads, then a copy that
        // the attention must see (V written by the encoder, not before it).
        let v_host = tensor(ks, 7 + run);
        queue.write_buffer(&buffers[0], 0, bytemuck::cast_slice(hosts[0].data()));
        queue.write_buffer(&buffers[1], 0, bytemuck::cast_slice(hosts[1].data()));
        let v_source = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("V source"),
            size: buffers[2].size(),
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&v_source, 0, bytemuck::cast_slice(v_host.data()));
        let mut encoder = device.create_command_encoder(&Default::default());
        encoder.copy_buffer_to_buffer(&v_source, 0, &buffers[2], 0, buffers[2].size());
        let before = ctx.work_counts();
        let out = prepared
            .record_blocking(&engine, &mut encoder, &inputs)
            .unwrap();
        let counts = ctx.work_counts() - before;
        assert_eq!(counts.submissions, 0, "a recorded call submits nothing");
        assert!(counts.dispatches >= 1);
        if run > 0 {
            // Its parameter blocks hold the same values: no queue write
            // (each would stage its bytes through a new buffer of wgpu's).
            assert_eq!(
                (counts.buffers, counts.writes),
                (0, 0),
                "a repeated recording creates or writes buffers"
            );
        }
        queue.submit([encoder.finish()]);
        let y = engine.download_blocking(&out.y).unwrap();
        let host = AttentionInputs::new(&hosts[0], &hosts[1], &v_host);
        let exact = webattn::cpu::attention_exact(&host, &options).unwrap();
        let plain = webattn::cpu::attention_plain_f32(&host, &options).unwrap();
        let report = compare(y.data(), &exact.y, &plain.y, 1e-6);
        println!(
            "recorded run {run}: worst |Y - f64 oracle| {:.3e}",
            report.max_abs
        );
        assert!(report.passed(), "run {run}: {report:?}");
    }

    // The outputs into the program's own buffer, read back by the program.
    let y_bytes = (qs.iter().product::<usize>() * 4) as u64;
    let y_buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("host Y"),
        size: y_bytes,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("host readback"),
        size: y_bytes,
        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
        mapped_at_creation: false,
    });
    let y_tensor = engine
        .wrap_buffer(y_buffer.clone(), &qs, webattn::DType::F32)
        .unwrap();
    let mut outputs = webattn::AttentionOutputs {
        y: y_tensor,
        present_key: None,
        present_value: None,
        qk_matmul_output: None,
        lse: None,
    };
    let v_host = tensor(ks, 70);
    queue.write_buffer(&buffers[2], 0, bytemuck::cast_slice(v_host.data()));
    let mut encoder = device.create_command_encoder(&Default::default());
    prepared
        .record_into_blocking(&engine, &mut encoder, &inputs, &outputs)
        .unwrap();
    encoder.copy_buffer_to_buffer(&y_buffer, 0, &readback, 0, y_bytes);
    queue.submit([encoder.finish()]);
    readback
        .slice(..)
        .map_async(wgpu::MapMode::Read, |r| r.unwrap());
    device.poll(wgpu::PollType::wait_indefinitely()).unwrap();
    let view = readback.slice(..).get_mapped_range().unwrap();
    let y: Vec<f32> = bytemuck::cast_slice(&view).to_vec();
    drop(view);
    let host = AttentionInputs::new(&hosts[0], &hosts[1], &v_host);
    let exact = webattn::cpu::attention_exact(&host, &options).unwrap();
    let plain = webattn::cpu::attention_plain_f32(&host, &options).unwrap();
    let report = compare(&y, &exact.y, &plain.y, 1e-6);
    println!(
        "recorded into the program's Y: worst |Y - f64 oracle| {:.3e}",
        report.max_abs
    );
    assert!(report.passed(), "{report:?}");

    // Outputs of another shape, or ones the options do not ask for, are refused.
    let mut encoder = device.create_command_encoder(&Default::default());
    outputs.lse = Some(
        engine
            .wrap_buffer(y_buffer.clone(), &[1, 4, 33], webattn::DType::F32)
            .unwrap(),
    );
    let err = prepared
        .record_into_blocking(&engine, &mut encoder, &inputs, &outputs)
        .unwrap_err();
    assert!(matches!(err, Error::Conflict(_)), "{err}");
    outputs.lse = None;
    outputs.y = engine
        .wrap_buffer(y_buffer, &[1, 4, 32, 16], webattn::DType::F32)
        .unwrap();
    let err = prepared
        .record_into_blocking(&engine, &mut encoder, &inputs, &outputs)
        .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
}

/// `Engine::attention` keeps the workspace of its recent calls by their
/// plan: a repeated call creates only its outputs, which stay the caller's
/// (a later call never writes into an earlier call's Y).
#[test]
fn plain_calls_reuse_their_workspace_and_keep_their_outputs() {
    let Some(engine) = common::own_gpu() else {
        return;
    };
    let options = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let (qs, ks) = ([1, 4, 1, 16], [1, 2, 300, 16]);
    let mut kept = Vec::new();
    for call in 0..3u64 {
        let seed = common::seed() ^ (call * 31 + 7);
        let host = [tensor(qs, seed), tensor(ks, seed + 1), tensor(ks, seed + 2)];
        let [q, k, v] = host.each_ref().map(|t| engine.upload(t).unwrap());
        let before = engine.gpu().unwrap().work_counts();
        let out = engine
            .attention_blocking(&AttentionInputs::new(&q, &k, &v), &options)
            .unwrap();
        let counts = engine.gpu().unwrap().work_counts() - before;
        if call > 0 {
            assert_eq!(counts.buffers, 1, "call {call}: only Y is new: {counts:?}");
        }
        kept.push((host, out.y));
    }
    let (calls, bytes) = engine.kept_workspaces();
    assert!(calls >= 1 && bytes > 0, "{calls} workspaces, {bytes} bytes");
    // Every call's Y still holds its own values.
    for (i, ([qh, kh, vh], y)) in kept.iter().enumerate() {
        let y = engine.download_blocking(y).unwrap();
        let host = AttentionInputs::new(qh, kh, vh);
        let exact = webattn::cpu::attention_exact(&host, &options).unwrap();
        let plain = webattn::cpu::attention_plain_f32(&host, &options).unwrap();
        let report = compare(y.data(), &exact.y, &plain.y, 1e-6);
        assert!(report.passed(), "call {i}: {report:?}");
    }
    engine.free_kept_workspaces();
    assert_eq!(engine.kept_workspaces(), (0, 0));
}

/// Q, K and V as views of one buffer of the program's (a fused projection's
/// output), and Y written into a view of another: runs after the first create
/// no buffer, and every result meets the oracle.
#[test]
fn views_of_the_hosts_buffers_in_and_out() {
    if common::gpu().is_none() {
        return;
    }
    let instance = wgpu::Instance::default();
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
        .expect("the adapter the tests run on");
    let (device, queue) = pollster::block_on(adapter.request_device(&Default::default())).unwrap();
    let engine = Engine::from_wgpu(&adapter, device.clone(), queue.clone()).unwrap();
    let (qs, ks) = ([1, 2, 5, 8], [1, 1, 97, 8]);
    let (q_len, k_len) = (qs.iter().product::<usize>(), ks.iter().product::<usize>());
    // Offsets in bytes: 12 (not a binding's alignment), then packed tightly.
    let offsets = [
        12u64,
        12 + 4 * q_len as u64,
        12 + 4 * (q_len + k_len) as u64,
    ];
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let qkv = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("host QKV"),
        size: offsets[2] + 4 * k_len as u64,
        usage,
        mapped_at_creation: false,
    });
    let out = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("host outputs"),
        size: 256 + 4 * q_len as u64,
        usage,
        mapped_at_creation: false,
    });
    let view = |buffer: &wgpu::Buffer, at: u64, shape: [usize; 4]| {
        engine
            .wrap_buffer_at(buffer.clone(), at, &shape, webattn::DType::F32)
            .unwrap()
    };
    let (q, k, v) = (
        view(&qkv, offsets[0], qs),
        view(&qkv, offsets[1], ks),
        view(&qkv, offsets[2], ks),
    );
    assert!(matches!(
        engine.wrap_buffer_at(qkv.clone(), 2, &qs, webattn::DType::F32),
        Err(Error::Conflict(_))
    ));
    assert!(matches!(
        engine.wrap_buffer_at(qkv.clone(), offsets[2] + 4, &ks, webattn::DType::F32),
        Err(Error::Limit { .. })
    ));
    let outputs = webattn::AttentionOutputs {
        y: view(&out, 256, qs),
        present_key: None,
        present_value: None,
        qk_matmul_output: None,
        lse: None,
    };
    let options = AttentionOptions::default();
    let inputs = AttentionInputs::new(&q, &k, &v);
    let prepared = engine
        .prepare(&webattn::validate(&inputs, &options).unwrap(), &options)
        .unwrap();
    let ctx = engine.gpu().unwrap();
    for run in 0..3u64 {
        let hosts = [
            tensor(qs, 40 + run),
            tensor(ks, 50 + run),
            tensor(ks, 60 + run),
        ];
        for (t, at) in hosts.iter().zip(offsets) {
            queue.write_buffer(&qkv, at, bytemuck::cast_slice(t.data()));
        }
        let before = ctx.work_counts();
        let mut encoder = device.create_command_encoder(&Default::default());
        prepared
            .record_into_blocking(&engine, &mut encoder, &inputs, &outputs)
            .unwrap();
        queue.submit([encoder.finish()]);
        let counts = ctx.work_counts() - before;
        if run > 0 {
            assert_eq!(counts.buffers, 0, "run {run}: {counts:?}");
        }
        let y = engine.download_blocking(&outputs.y).unwrap();
        let host = AttentionInputs::new(&hosts[0], &hosts[1], &hosts[2]);
        let exact = webattn::cpu::attention_exact(&host, &options).unwrap();
        let plain = webattn::cpu::attention_plain_f32(&host, &options).unwrap();
        let report = compare(y.data(), &exact.y, &plain.y, 1e-6);
        println!(
            "views, run {run}: worst |Y - f64 oracle| {:.3e}",
            report.max_abs
        );
        assert!(report.passed(), "run {run}: {report:?}");
        // A plain call reads the same views.
        let plain_call = engine.attention_blocking(&inputs, &options).unwrap();
        assert_eq!(engine.download_blocking(&plain_call.y).unwrap(), y);
    }
}
