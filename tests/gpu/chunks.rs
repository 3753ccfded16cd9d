//! Tensors larger than one buffer (`max_buffer_size`) are held in several
//! (`device/chunks.rs`) and attention reads them in pieces. Forced here on an
//! adapter whose buffers hold at most 64 KiB, so uploads, downloads and every
//! path cross chunk boundaries against the f64 oracle.

use crate::common;

use webattn::conformance::{compare, run_case, CaseSpec, MaskForm};
use webattn::cpu;
use webattn::rng::SplitMix64;
use webattn::{
    AttentionInputs, AttentionOptions, BackendPreference, DType, DeviceLimits, Engine,
    EngineOptions, HostTensor, KernelPath, QkMatmulOutputMode,
};

const BUFFER: u64 = 64 << 10;

/// A GPU engine whose buffers (and so bindings) hold at most [`BUFFER`] bytes.
fn small_buffer_engine() -> Option<Engine> {
    common::gpu()?;
    let options = EngineOptions {
        backend: BackendPreference::Gpu,
        limits: DeviceLimits::default()
            .with("max_buffer_size", BUFFER)
            .and_then(|l| l.with("max_storage_buffer_binding_size", BUFFER))
            .expect("known limits"),
        ..Default::default()
    };
    Some(Engine::with_options_blocking(options).expect("an engine with small buffers"))
}

/// Runs each case on the fused and unfused paths against the oracle (and,
/// with `in_pieces`, checks that each call ran in more than one piece).
fn check_on_both_paths(engine: &Engine, cases: &[CaseSpec], in_pieces: bool) {
    let mut failed = Vec::new();
    for case in cases {
        for path in [KernelPath::Fused, KernelPath::Unfused] {
            let results = pollster::block_on(run_case(engine, case, &[path], common::seed()));
            for result in &results {
                common::print_result(result);
                if !result.passed() {
                    failed.push(format!(
                        "{} {} on {path:?}",
                        result.name, result.worst_output
                    ));
                }
            }
            let stats = engine.last_call().expect("a call was made");
            println!("  {} on {path:?}: {} pieces", case.name, stats.pieces);
            if in_pieces {
                assert!(stats.pieces > 1, "{} on {path:?} ran whole", case.name);
            }
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}

fn random(rng: &mut SplitMix64, shape: [usize; 4], dtype: DType) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::new(shape, rng.normal_vec(n, 1.0))
        .unwrap()
        .into_dtype(dtype)
}

#[test]
fn tensors_past_one_buffer_are_held_in_several_and_read_back_exactly() {
    let Some(engine) = small_buffer_engine() else {
        return;
    };
    let mut rng = SplitMix64::new(common::seed());
    // Heads of 97 x 33 values: chunks of whole heads, an odd count of values.
    for (shape, dtype) in [
        ([3, 5, 97, 33], DType::F32),
        ([3, 5, 97, 33], DType::F16),
        // One head larger than a buffer: chunks of whole rows.
        ([1, 1, 20_000, 3], DType::F32),
    ] {
        let host = random(&mut rng, shape, dtype);
        let device = engine.upload(&host).expect("an upload in chunks");
        println!(
            "{shape:?} {dtype}: {} buffers, {} bytes",
            device.device_buffers(),
            device.device_bytes()
        );
        assert!(device.device_buffers() > 1, "{shape:?} fit one buffer");
        let back = engine.download_blocking(&device).unwrap();
        assert_eq!(back.shape(), host.shape());
        assert_eq!(back.dtype(), dtype);
        assert_eq!(back.data(), host.data(), "{shape:?} {dtype}");
    }
    // A repeated pattern continues across chunk boundaries.
    for dtype in [DType::F32, DType::F16] {
        let pattern = HostTensor::new([14], rng.normal_vec(14, 1.0))
            .unwrap()
            .into_dtype(dtype);
        let shape = [2, 3, 700, 16];
        let t = pollster::block_on(engine.upload_repeated(&shape, &pattern)).unwrap();
        assert!(t.device_buffers() > 1);
        let back = engine.download_blocking(&t).unwrap();
        let expected: Vec<f32> = pattern
            .data()
            .iter()
            .copied()
            .cycle()
            .take(shape.iter().product())
            .collect();
        assert_eq!(back.data(), &expected[..], "{dtype}");
    }
}

#[test]
fn calls_on_tensors_in_several_buffers_agree_with_the_oracle() {
    let Some(engine) = small_buffer_engine() else {
        return;
    };
    let cases = [
        // Decode over 2 x 2 KV heads of 1000 keys (512 KiB of K): GQA, ALiBi.
        CaseSpec::new("chunked-decode-gqa", [2, 8, 2], [1, 1000], [64, 64]).with(|o| {
            o.alibi = true;
            o.return_lse = true;
        }),
        // Three KV heads: pieces of heads straddle chunks of two heads.
        CaseSpec::new("chunked-straddling-heads", [3, 3, 3], [2, 257], [40, 24])
            .mask(MaskForm::Bool(4))
            .with(|o| o.is_causal = true),
        // Q itself in chunks (its Y, with a small Dv, fits one buffer).
        CaseSpec::new("chunked-queries", [1, 4, 2], [1025, 97], [32, 2])
            .logits(30.0)
            .with(|o| {
                o.is_causal = true;
                o.temperature = 0.5;
            }),
        // One head's keys larger than a buffer, with per-batch lengths.
        CaseSpec::new("chunked-keys-nonpad", [2, 2, 1], [3, 7000], [8, 8])
            .nonpad()
            .with(|o| {
                o.left_window_size = 900;
                o.softcap = 20.0;
            }),
    ];
    check_on_both_paths(&engine, &cases, true);
}

/// f16 keys and values in several buffers are read in place by the decode
/// kernel: each piece's slices are views inside one chunk.
#[test]
fn f16_decode_over_chunks_reads_them_in_place() {
    let Some(engine) = small_buffer_engine() else {
        return;
    };
    let mut rng = SplitMix64::new(common::seed() ^ 7);
    // A head's K is 32 KiB as f32: pieces of two heads, chunks of two heads.
    let (b, hq, hkv, keys, d) = (2, 8, 4, 512, 16);
    let q = random(&mut rng, [b, hq, 1, d], DType::F32);
    let k = random(&mut rng, [b, hkv, keys, d], DType::F16);
    let v = random(&mut rng, [b, hkv, keys, d], DType::F16);
    let (qd, kd, vd) = (
        engine.upload(&q).unwrap(),
        engine.upload(&k).unwrap(),
        engine.upload(&v).unwrap(),
    );
    assert!(kd.device_buffers() > 1 && vd.device_buffers() > 1);
    let options = AttentionOptions {
        path: KernelPath::Fused,
        ..Default::default()
    };
    let out = engine
        .attention_blocking(&AttentionInputs::new(&qd, &kd, &vd), &options)
        .unwrap();
    let stats = engine.last_call().unwrap();
    assert!(stats.pieces > 1, "ran whole");
    assert_eq!(stats.widened_bytes, 0, "f16 K and V read in place");
    let y = engine.download_blocking(&out.y).unwrap();
    let host = AttentionInputs::new(&q, &k, &v);
    let exact = cpu::attention_exact(&host, &options).unwrap();
    let plain = cpu::attention_plain_f32(&host, &options).unwrap();
    let report = compare(y.data(), &exact.y, &plain.y, 1e-6);
    println!(
        "{} pieces, worst {:.3e} ({:.2} of allowed)",
        stats.pieces,
        report.max_abs,
        report.share_of_allowed()
    );
    assert!(report.passed(), "{report:?}");
    // The unfused path widens them, chunk by chunk, and agrees too.
    let unfused = AttentionOptions {
        path: KernelPath::Unfused,
        ..Default::default()
    };
    let out = engine
        .attention_blocking(&AttentionInputs::new(&qd, &kd, &vd), &unfused)
        .unwrap();
    assert!(engine.last_call().unwrap().widened_bytes > 0);
    let y = engine.download_blocking(&out.y).unwrap();
    let report = compare(y.data(), &exact.y, &plain.y, 1e-6);
    assert!(report.passed(), "unfused: {report:?}");
}

/// Outputs larger than one buffer are held in several too (Y, the scores,
/// the presents built from a past in chunks), and so are masks.
#[test]
fn outputs_pasts_and_masks_in_several_buffers_agree_with_the_oracle() {
    let Some(engine) = small_buffer_engine() else {
        return;
    };
    let cases = [
        // Q and Y of 1 x 4 x 600 x 32 (300 KiB each): both in chunks.
        CaseSpec::new("chunked-y", [1, 4, 2], [600, 33], [32, 32]).with(|o| {
            o.is_causal = true;
            o.return_lse = true;
        }),
        // A past of 2 x 2 x 300 keys: past, present and K in chunks.
        CaseSpec::new("chunked-past-present", [2, 4, 2], [3, 5], [64, 48])
            .past(300)
            .with(|o| {
                o.is_causal = true;
                o.return_present = true;
            }),
        // A float mask of 2 x 2 x 97 x 200 (152 KiB) in chunks, rows fully masked.
        CaseSpec::new("chunked-mask", [2, 2, 2], [97, 200], [16, 16])
            .mask(MaskForm::EmptyRows)
            .logits(30.0),
        // Scores of 2 x 2 x 70 x 300 (164 KiB) in chunks.
        CaseSpec::new("chunked-scores", [2, 2, 1], [70, 300], [16, 16]).with(|o| {
            o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased);
            o.softcap = 10.0;
        }),
    ];
    check_on_both_paths(&engine, &cases, false);
    // The outputs themselves are held in several buffers, and read back whole.
    let mut rng = SplitMix64::new(common::seed() ^ 5);
    let q = random(&mut rng, [1, 4, 600, 32], DType::F16);
    let k = random(&mut rng, [1, 2, 5, 32], DType::F32);
    let past = random(&mut rng, [1, 2, 300, 32], DType::F32);
    let (qd, kd, pd) = (
        engine.upload(&q).unwrap(),
        engine.upload(&k).unwrap(),
        engine.upload(&past).unwrap(),
    );
    let options = AttentionOptions {
        return_present: true,
        ..Default::default()
    };
    let out = engine
        .attention_blocking(
            &AttentionInputs::new(&qd, &kd, &kd).with_past(&pd, &pd),
            &options,
        )
        .unwrap();
    let present = out.present_key.as_ref().unwrap();
    println!(
        "Y (f16) in {} buffers, present_key in {}",
        out.y.device_buffers(),
        present.device_buffers()
    );
    assert!(out.y.device_buffers() > 1 && present.device_buffers() > 1);
    assert_eq!(out.y.dtype(), DType::F16);
    let y = engine.download_blocking(&out.y).unwrap();
    let host_q = q.clone().into_dtype(DType::F32);
    let host = AttentionInputs::new(&host_q, &k, &k).with_past(&past, &past);
    let exact = cpu::attention_exact(&host, &options).unwrap();
    let worst = y
        .data()
        .iter()
        .zip(&exact.y)
        .map(|(a, b)| (*a as f64 - b).abs())
        .fold(0.0, f64::max);
    println!("f16 Y in chunks: worst {worst:.3e}");
    assert!(worst < 4e-3, "{worst}");
    let present = engine.download_blocking(present).unwrap();
    assert_eq!(&present.data()[..300 * 32], &past.data()[..300 * 32]);
}

/// A KV cache larger than one buffer is held in several: it grows past the
/// limit by doubling, appends in place across chunks, and decode reads it
/// (f32 and f16) against the oracle on the concatenated keys and values.
#[test]
fn a_kv_cache_past_one_buffer_grows_in_chunks() {
    let Some(engine) = small_buffer_engine() else {
        return;
    };
    let mut rng = SplitMix64::new(common::seed() ^ 9);
    let (b, hq, hkv, d) = (2, 4, 2, 16);
    // 2 x 2 heads x 16 values x 4 bytes = 256 bytes a token: 64 KiB at 256.
    let steps = [200, 1, 60, 1, 300, 7];
    let total: usize = steps.iter().sum();
    for dtype in [DType::F32, DType::F16] {
        let keys = random(&mut rng, [b, hkv, total, d], dtype);
        let values = random(&mut rng, [b, hkv, total, d], dtype);
        let mut cache = webattn::KvCache::with_capacity(128);
        let mut start = 0;
        for &n in &steps {
            let slice = |t: &HostTensor| {
                let mut data = Vec::new();
                for batch in 0..b {
                    for head in 0..hkv {
                        let base = ((batch * hkv + head) * total + start) * d;
                        data.extend_from_slice(&t.data()[base..base + n * d]);
                    }
                }
                HostTensor::new([b, hkv, n, d], data)
                    .unwrap()
                    .into_dtype(dtype)
            };
            let (k, v) = (
                engine.upload(&slice(&keys)).unwrap(),
                engine.upload(&slice(&values)).unwrap(),
            );
            cache.append_blocking(&engine, &k, &v).unwrap();
            start += n;
        }
        let (ck, _) = cache.tensors().unwrap();
        println!(
            "{dtype}: {} tokens, capacity {}, keys in {} buffers",
            cache.len(),
            cache.capacity(),
            ck.device_buffers()
        );
        assert_eq!(cache.len(), total);
        assert!(ck.device_buffers() > 1, "the cache fit one buffer");
        // Decode one query row against the cache, through its lengths.
        let q = random(&mut rng, [b, hq, 1, d], DType::F32);
        let qd = engine.upload(&q).unwrap();
        let lengths = cache.nonpad_lengths();
        let inputs = cache.attention_inputs(&qd, &lengths).unwrap();
        let options = AttentionOptions {
            path: KernelPath::Fused,
            ..Default::default()
        };
        let y = engine
            .download_blocking(&engine.attention_blocking(&inputs, &options).unwrap().y)
            .unwrap();
        let host = AttentionInputs::new(&q, &keys, &values);
        let exact = cpu::attention_exact(&host, &options).unwrap();
        let plain = cpu::attention_plain_f32(&host, &options).unwrap();
        let report = compare(y.data(), &exact.y, &plain.y, 1e-6);
        println!("  decode over the cache: worst {:.3e}", report.max_abs);
        assert!(report.passed(), "{dtype}: {report:?}");
        // present: the cached tokens as a fresh tensor, exactly.
        let (pk, _) = cache.present_blocking(&engine).unwrap();
        let pk = engine.download_blocking(&pk).unwrap();
        assert_eq!(pk.data(), keys.data(), "{dtype}");
    }
}
