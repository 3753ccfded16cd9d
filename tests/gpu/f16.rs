//! f16 storage, f32 arithmetic: f16 tensors stay f16 on the device (half the
//! bytes), the decode kernel reads f16 keys and values in place, every other
//! kernel reads them widened, and outputs typed by an f16 input come back f16.
//! Checked against the f64 oracle on the same f16-rounded inputs, allowing
//! the output's f16 rounding on top of the usual rule.

use crate::common;

use webattn::conformance::{compare, filtered, SweepKind, F16_UNIT_ROUNDOFF};
use webattn::rng::SplitMix64;
use webattn::{
    cpu, AttentionInputs, AttentionOptions, DType, Engine, Error, HostTensor, KernelPath, KvCache,
};

fn engines() -> Vec<Engine> {
    let mut engines = vec![Engine::cpu()];
    // A GPU engine of its own (on lavapipe too: an engine left to choose
    // would take the CPU backend there).
    engines.extend(common::own_gpu());
    engines
}

fn random_f16(rng: &mut SplitMix64, shape: [usize; 4]) -> HostTensor {
    HostTensor::new(shape, rng.normal_vec(shape.iter().product(), 1.0))
        .unwrap()
        .into_f16()
}

#[test]
fn every_f16_case_of_the_sweep_passes_on_every_path() {
    let cases = filtered(SweepKind::Full, "f16");
    assert!(cases.len() >= 8, "{} f16 cases", cases.len());
    if let Some(engine) = common::gpu() {
        common::run_cases_on(
            engine,
            &cases,
            &[KernelPath::Fused, KernelPath::Unfused, KernelPath::Cpu],
        );
    }
    common::run_cases_on(&Engine::cpu(), &cases, &[KernelPath::Cpu]);
}

#[test]
fn f16_tensors_take_half_the_device_memory_and_round_trip_exactly() {
    let Some(engine) = common::gpu() else { return };
    let mut rng = SplitMix64::new(common::seed());
    let values = random_f16(&mut rng, [2, 3, 33, 8]);
    let f32_twin = HostTensor::new(values.shape().to_vec(), values.data().to_vec()).unwrap();
    let half = engine.upload(&values).unwrap();
    let full = engine.upload(&f32_twin).unwrap();
    assert_eq!(half.dtype(), DType::F16);
    assert_eq!(full.dtype(), DType::F32);
    assert!(
        half.device_bytes() * 2 <= full.device_bytes() + 16,
        "{} vs {}",
        half.device_bytes(),
        full.device_bytes()
    );
    assert_eq!(engine.download_blocking(&half).unwrap(), values);
}

#[test]
fn the_conversion_kernels_round_like_ieee() {
    let Some(engine) = common::own_gpu() else {
        return;
    };
    // Every f16 bit pattern widens exactly on the device: V of 256 batches of
    // one key, 256 values each, is f16; Q and K are f32, so Y (V itself) is f32.
    let all: Vec<f32> = (0..=u16::MAX)
        .map(|bits| half::f16::from_bits(bits).to_f32())
        .collect();
    let v = HostTensor::new([256, 1, 1, 256], all.clone())
        .unwrap()
        .into_f16();
    let zeros = HostTensor::new([256, 1, 1, 1], vec![0.0; 256]).unwrap();
    let fused = AttentionOptions {
        path: KernelPath::Fused,
        ..Default::default()
    };
    let y = engine
        .attention_host_blocking(&AttentionInputs::new(&zeros, &zeros, &v), &fused)
        .unwrap()
        .y;
    assert_eq!(y.dtype(), DType::F32);
    assert!(engine.last_call().unwrap().widened_bytes > 0);
    for (i, (a, b)) in all.iter().zip(y.data()).enumerate() {
        // (-0 comes out +0: the sum 0 + 1 * -0.)
        assert!(
            a.to_bits() == b.to_bits() || a == b || (a.is_nan() && b.is_nan()),
            "bits {i:#x}"
        );
    }
    // Narrowing on the device: Y of one key is V itself, rounded to f16.
    // (Not -0: attention's sum 0 + 1 * -0 is +0 before any narrowing.)
    let specials = [
        0.0f32,
        1.0,
        1.0 + 2.0f32.powi(-11),       // a tie: to even (1.0)
        1.0 + 3.0 * 2.0f32.powi(-11), // a tie: to even (up)
        65504.0,                      // the largest f16
        65519.0,                      // rounds down to 65504
        65520.0,                      // rounds to infinity
        -1.0e6,                       // overflows to -infinity
        2.0f32.powi(-24),             // the smallest subnormal
        2.0f32.powi(-25),             // a tie: to zero
        3.0 * 2.0f32.powi(-25),       // a tie: up to 2^-23
        1.0e-9,                       // underflows to zero
        f32::INFINITY,
        f32::NEG_INFINITY,
        6.1e-5, // near the smallest normal
        std::f32::consts::PI,
        -1234.5678,
    ];
    let n = specials.len();
    let v = HostTensor::new([1, 1, 1, n], specials.to_vec()).unwrap();
    let k = HostTensor::new([1, 1, 1, n], vec![0.0; n]).unwrap();
    // Q is f16 so Y is narrowed to f16 from the f32 result (V exactly).
    let q = HostTensor::new([1, 1, 1, n], vec![0.0; n])
        .unwrap()
        .into_f16();
    let y = engine
        .attention_host_blocking(&AttentionInputs::new(&q, &k, &v), &fused)
        .unwrap()
        .y;
    assert_eq!(y.dtype(), DType::F16);
    for (x, got) in specials.iter().zip(y.data()) {
        let want = half::f16::from_f32(*x).to_f32();
        assert_eq!(
            want.to_bits(),
            got.to_bits(),
            "{x:e}: {got:e}, want {want:e}"
        );
    }
}

#[test]
fn decode_reads_f16_in_place_and_prefill_widens() {
    let Some(engine) = common::own_gpu() else {
        return;
    };
    let mut rng = SplitMix64::new(common::seed() ^ 7);
    let (b, hq, hkv, d) = (2, 8, 2, 64);
    for (q_len, keys, widened_kv) in [(1, 1025, false), (33, 33, true)] {
        let q = random_f16(&mut rng, [b, hq, q_len, d]);
        let k = random_f16(&mut rng, [b, hkv, keys, d]);
        let v = random_f16(&mut rng, [b, hkv, keys, d]);
        let options = AttentionOptions {
            path: KernelPath::Fused,
            ..Default::default()
        };
        let (qd, kd, vd) = (
            engine.upload(&q).unwrap(),
            engine.upload(&k).unwrap(),
            engine.upload(&v).unwrap(),
        );
        let out = engine
            .attention_blocking(&AttentionInputs::new(&qd, &kd, &vd), &options)
            .unwrap();
        let stats = engine.last_call().unwrap();
        let q_bytes = (q.len() * 4) as u64;
        let kv_bytes = ((k.len() + v.len()) * 4) as u64;
        let expected = if widened_kv {
            q_bytes + kv_bytes
        } else {
            q_bytes
        };
        assert_eq!(stats.widened_bytes, expected, "q{q_len} k{keys}");
        assert_eq!(out.y.dtype(), DType::F16);
        let y = engine.download_blocking(&out.y).unwrap();
        let host = AttentionInputs::new(&q, &k, &v);
        let exact = cpu::attention_exact(&host, &options).unwrap();
        let plain = cpu::attention_plain_f32(&host, &options).unwrap();
        let report = compare(y.data(), &exact.y, &plain.y, 1e-6)
            .allow_output_rounding(&exact.y, F16_UNIT_ROUNDOFF);
        assert!(report.passed(), "q{q_len} k{keys}: {report:?}");
        println!(
            "q{q_len} k{keys}: worst {:.3e} ({:.2} of allowed), widened {} bytes",
            report.max_abs,
            report.share_of_allowed(),
            stats.widened_bytes
        );
    }
}

#[test]
fn an_f16_kv_cache_holds_f16_and_decodes_in_place() {
    let mut rng = SplitMix64::new(common::seed() ^ 9);
    let (b, h, d) = (1, 2, 16);
    for engine in engines() {
        let mut cache = KvCache::with_capacity(4);
        let mut all_k = Vec::new();
        let mut all_v = Vec::new();
        for n in [3, 1, 600] {
            let k = random_f16(&mut rng, [b, h, n, d]);
            let v = random_f16(&mut rng, [b, h, n, d]);
            cache
                .append_blocking(
                    &engine,
                    &engine.upload(&k).unwrap(),
                    &engine.upload(&v).unwrap(),
                )
                .unwrap();
            all_k.push(k);
            all_v.push(v);
        }
        let (ck, cv) = cache.tensors().unwrap();
        assert_eq!((ck.dtype(), cv.dtype()), (DType::F16, DType::F16));
        // A step of another dtype is a typed error, and the cache is kept.
        let f32_step = HostTensor::new([b, h, 1, d], vec![0.0; h * d]).unwrap();
        let f32_step = engine.upload(&f32_step).unwrap();
        let err = cache
            .append_blocking(&engine, &f32_step, &f32_step)
            .unwrap_err();
        assert!(matches!(err, Error::DType { .. }), "{err}");
        assert_eq!(cache.len(), 604);
        // present: the concatenation, f16.
        let (pk, _) = cache.present_blocking(&engine).unwrap();
        assert_eq!(pk.dtype(), DType::F16);
        let pk = engine.download_blocking(&pk).unwrap();
        let joined = |parts: &[HostTensor]| -> Vec<f32> {
            (0..h)
                .flat_map(|head| {
                    parts.iter().flat_map(move |p| {
                        let n = p.shape()[2];
                        p.data()[head * n * d..(head + 1) * n * d].to_vec()
                    })
                })
                .collect()
        };
        assert_eq!(pk.data(), joined(&all_k).as_slice());
        // A decode step through the cache: in place on a GPU.
        let q = random_f16(&mut rng, [b, 2 * h, 1, d]);
        let qd = engine.upload(&q).unwrap();
        let lengths = cache.nonpad_lengths();
        let inputs = cache.attention_inputs(&qd, &lengths).unwrap();
        let out = engine
            .attention_blocking(&inputs, &AttentionOptions::default())
            .unwrap();
        if engine.gpu().is_some() {
            assert_eq!(
                engine.last_call().unwrap().widened_bytes,
                (q.len() * 4) as u64
            );
        }
        let y = engine.download_blocking(&out.y).unwrap();
        assert_eq!(y.dtype(), DType::F16);
        let keys = HostTensor::new([b, h, 604, d], joined(&all_k)).unwrap();
        let values = HostTensor::new([b, h, 604, d], joined(&all_v)).unwrap();
        let host = AttentionInputs::new(&q, &keys, &values);
        let options = AttentionOptions::default();
        let exact = cpu::attention_exact(&host, &options).unwrap();
        let plain = cpu::attention_plain_f32(&host, &options).unwrap();
        let report = compare(y.data(), &exact.y, &plain.y, 1e-6)
            .allow_output_rounding(&exact.y, F16_UNIT_ROUNDOFF);
        assert!(report.passed(), "{}: {report:?}", engine.describe());
    }
}

#[test]
fn an_odd_head_dim_f16_cache_is_refused_on_a_gpu() {
    let Some(engine) = common::gpu() else { return };
    let t = HostTensor::new([1, 1, 2, 3], vec![0.5; 6])
        .unwrap()
        .into_f16();
    let t = engine.upload(&t).unwrap();
    let mut cache = KvCache::new();
    let err = cache.append_blocking(engine, &t, &t).unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert!(cache.is_empty());
}

/// f16 keys and values past one binding are still read in place: the call
/// runs in pieces whose K and V slices are views of the f16 tensors.
#[test]
fn f16_decode_in_pieces_reads_its_views_in_place() {
    let Some(engine) = common::gpu().map(|_| {
        Engine::with_options_blocking(webattn::EngineOptions {
            backend: webattn::BackendPreference::Gpu,
            limits: webattn::DeviceLimits::default()
                .with("max_storage_buffer_binding_size", 2 << 20)
                .unwrap(),
            ..Default::default()
        })
        .unwrap()
    }) else {
        return;
    };
    let mut rng = SplitMix64::new(common::seed() ^ 11);
    let (b, hq, hkv, keys, d) = (4, 8, 2, 4096, 64);
    let q = HostTensor::new([b, hq, 1, d], rng.normal_vec(b * hq * d, 1.0)).unwrap();
    let k = random_f16(&mut rng, [b, hkv, keys, d]);
    let v = random_f16(&mut rng, [b, hkv, keys, d]);
    let (qd, kd, vd) = (
        engine.upload(&q).unwrap(),
        engine.upload(&k).unwrap(),
        engine.upload(&v).unwrap(),
    );
    let options = AttentionOptions {
        path: KernelPath::Fused,
        ..Default::default()
    };
    let out = engine
        .attention_blocking(&AttentionInputs::new(&qd, &kd, &vd), &options)
        .unwrap();
    let stats = engine.last_call().unwrap();
    assert!(stats.pieces > 1, "ran whole");
    assert_eq!(stats.widened_bytes, 0, "f32 queries, f16 K and V in place");
    let y = engine.download_blocking(&out.y).unwrap();
    let host = AttentionInputs::new(&q, &k, &v);
    let exact = cpu::attention_exact(&host, &options).unwrap();
    let plain = cpu::attention_plain_f32(&host, &options).unwrap();
    let report = compare(y.data(), &exact.y, &plain.y, 1e-6);
    assert!(report.passed(), "{report:?}");
    println!(
        "{} pieces, worst {:.3e} ({:.2} of allowed)",
        stats.pieces,
        report.max_abs,
        report.share_of_allowed()
    );
}
