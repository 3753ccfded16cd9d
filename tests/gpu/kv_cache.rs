//! The preallocated KV cache (`webattn::KvCache`): appended in place, grown
//! by doubling, sequences of different lengths in one batch, read by
//! attention through `nonpad_kv_seqlen`, and `present` as ONNX's fresh
//! tensors. On the GPU engine and the CPU engine, against the f64 oracle of
//! attention on the concatenated keys and values.

use crate::common;

use webattn::conformance::compare;
use webattn::rng::SplitMix64;
use webattn::{cpu, AttentionInputs, AttentionOptions, Engine, Error, HostTensor, KvCache, Tensor};

const HEADS: usize = 2;
const DK: usize = 16;
const DV: usize = 8;

fn engines() -> Vec<Engine> {
    let mut engines = vec![Engine::cpu()];
    // A GPU engine of its own (on lavapipe too: an engine left to choose
    // would take the CPU backend there).
    engines.extend(common::own_gpu());
    engines
}

fn random(rng: &mut SplitMix64, shape: [usize; 4]) -> HostTensor {
    HostTensor::new(shape, rng.normal_vec(shape.iter().product(), 1.0)).unwrap()
}

/// Rows `[start, start + n)` of every (batch, head) of a `[B, H, T, D]` host tensor.
fn rows(t: &HostTensor, b: usize, start: usize, n: usize) -> Vec<f32> {
    let [_, h, len, d] = <[usize; 4]>::try_from(t.shape()).unwrap();
    let mut out = Vec::new();
    for head in 0..h {
        let base = (b * h + head) * len * d;
        out.extend_from_slice(&t.data()[base + start * d..base + (start + n) * d]);
    }
    out
}

fn upload(engine: &Engine, t: &HostTensor) -> Tensor {
    engine.upload(t).unwrap()
}

#[test]
fn decoding_through_the_cache_matches_attention_on_the_whole_sequence() {
    let mut rng = SplitMix64::new(common::seed());
    let batch = 2;
    // A prompt of 5, then single tokens past the first capacity (8): two doublings.
    let steps = [5, 1, 1, 1, 4, 1, 9, 1];
    let total: usize = steps.iter().sum();
    let keys = random(&mut rng, [batch, HEADS, total, DK]);
    let values = random(&mut rng, [batch, HEADS, total, DV]);
    let queries = random(&mut rng, [batch, 2 * HEADS, total, DK]);
    let causal = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    for engine in engines() {
        let mut cache = KvCache::with_capacity(8);
        let mut start = 0;
        let mut worst = 0.0f64;
        for &n in &steps {
            let slice = |t: &HostTensor, d: usize, heads: usize| {
                let data = (0..batch).flat_map(|b| rows(t, b, start, n)).collect();
                HostTensor::new([batch, heads, n, d], data).unwrap()
            };
            let (k, v) = (slice(&keys, DK, HEADS), slice(&values, DV, HEADS));
            let q = slice(&queries, DK, 2 * HEADS);
            cache
                .append_blocking(&engine, &upload(&engine, &k), &upload(&engine, &v))
                .unwrap();
            assert_eq!(cache.lengths(), &[start + n, start + n]);
            assert!(cache.capacity() >= start + n);
            let lengths = cache.nonpad_lengths();
            let q_dev = upload(&engine, &q);
            let inputs = cache.attention_inputs(&q_dev, &lengths).unwrap();
            let out = engine.attention_blocking(&inputs, &causal).unwrap();
            let y = engine.download_blocking(&out.y).unwrap();

            // The oracle: the step's queries against every key so far, as a past.
            let seen = |t: &HostTensor, d: usize| {
                let data = (0..batch).flat_map(|b| rows(t, b, 0, start)).collect();
                HostTensor::new([batch, HEADS, start, d], data).unwrap()
            };
            let (pk, pv) = (seen(&keys, DK), seen(&values, DV));
            let mut host = AttentionInputs::new(&q, &k, &v);
            if start > 0 {
                host = host.with_past(&pk, &pv);
            }
            let exact = cpu::attention_exact(&host, &causal).unwrap();
            let plain = cpu::attention_plain_f32(&host, &causal).unwrap();
            let report = compare(y.data(), &exact.y, &plain.y, 1e-6);
            assert!(
                report.passed(),
                "{} at {start}: {report:?}",
                engine.describe()
            );
            worst = worst.max(report.max_abs);
            start += n;
        }
        assert_eq!(cache.capacity(), 32, "8 -> 16 -> 32 by doubling");
        // present: ONNX's fresh tensors, the concatenation of every step.
        let (pk, pv) = cache.present_blocking(&engine).unwrap();
        assert_eq!(pk.shape(), &[batch, HEADS, total, DK]);
        assert_eq!(engine.download_blocking(&pk).unwrap().data(), keys.data());
        assert_eq!(engine.download_blocking(&pv).unwrap().data(), values.data());
        println!("{}: worst |y - oracle| {worst:.3e}", engine.describe());
    }
}

#[test]
fn sequences_of_different_lengths_share_a_cache() {
    let mut rng = SplitMix64::new(common::seed() ^ 1);
    for engine in engines() {
        let mut cache = KvCache::with_capacity(4);
        // Sequence 0 takes 3 then 2 tokens, sequence 1 takes 1 then 4 (the
        // last rows of each step: its padding comes first).
        let first = (
            random(&mut rng, [2, HEADS, 3, DK]),
            random(&mut rng, [2, HEADS, 3, DV]),
        );
        let second = (
            random(&mut rng, [2, HEADS, 4, DK]),
            random(&mut rng, [2, HEADS, 4, DV]),
        );
        cache
            .append_ragged_blocking(
                &engine,
                &upload(&engine, &first.0),
                &upload(&engine, &first.1),
                &[3, 1],
            )
            .unwrap();
        cache
            .append_ragged_blocking(
                &engine,
                &upload(&engine, &second.0),
                &upload(&engine, &second.1),
                &[2, 4],
            )
            .unwrap();
        assert_eq!(cache.lengths(), &[5, 5]);
        let (k, _) = cache.tensors().unwrap();
        let k = engine.download_blocking(k).unwrap();
        for (b, (a, c)) in [(3, 2), (1, 4)].into_iter().enumerate() {
            let cached = rows(&k, b, 0, 5);
            // Each step's real rows are its last ones (padding first).
            let (firsts, seconds) = (rows(&first.0, b, 3 - a, a), rows(&second.0, b, 4 - c, c));
            for head in 0..HEADS {
                let mut expected = firsts[head * a * DK..(head + 1) * a * DK].to_vec();
                expected.extend_from_slice(&seconds[head * c * DK..(head + 1) * c * DK]);
                assert_eq!(
                    &cached[head * 5 * DK..(head + 1) * 5 * DK],
                    &expected[..],
                    "sequence {b}, head {head}"
                );
            }
        }
        // Ragged lengths read by attention: sequence 1 one token shorter.
        let third = (
            random(&mut rng, [2, HEADS, 1, DK]),
            random(&mut rng, [2, HEADS, 1, DV]),
        );
        cache
            .append_ragged_blocking(
                &engine,
                &upload(&engine, &third.0),
                &upload(&engine, &third.1),
                &[1, 0],
            )
            .unwrap();
        assert_eq!(cache.lengths(), &[6, 5]);
        assert_eq!(cache.len(), 6);
        let q = upload(&engine, &random(&mut rng, [2, HEADS, 1, DK]));
        let lengths = cache.nonpad_lengths();
        let out = engine
            .attention_blocking(
                &cache.attention_inputs(&q, &lengths).unwrap(),
                &AttentionOptions::default(),
            )
            .unwrap();
        assert!(engine
            .download_blocking(&out.y)
            .unwrap()
            .data()
            .iter()
            .all(|x| x.is_finite()));
        // ONNX's present needs one length.
        assert!(matches!(
            cache.present_blocking(&engine),
            Err(Error::Conflict(_))
        ));
    }
}

#[test]
fn bad_appends_are_typed_errors_and_leave_the_cache_alone() {
    let mut rng = SplitMix64::new(3);
    let engine = Engine::cpu();
    let mut cache = KvCache::new();
    let k = upload(&engine, &random(&mut rng, [1, HEADS, 2, DK]));
    let v = upload(&engine, &random(&mut rng, [1, HEADS, 2, DV]));
    cache.append_blocking(&engine, &k, &v).unwrap();
    let wrong_heads = upload(&engine, &random(&mut rng, [1, 3, 2, DK]));
    let err = cache
        .append_blocking(&engine, &wrong_heads, &v)
        .unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    let wrong_dim = upload(&engine, &random(&mut rng, [1, HEADS, 2, DK + 4]));
    let err = cache.append_blocking(&engine, &wrong_dim, &v).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    let err = cache
        .append_ragged_blocking(&engine, &k, &v, &[3])
        .unwrap_err();
    assert!(matches!(err, Error::InvalidOption { .. }), "{err}");
    let flat = upload(
        &engine,
        &HostTensor::new([2, DK], vec![0.0; 2 * DK]).unwrap(),
    );
    assert!(matches!(
        cache.append_blocking(&engine, &flat, &v),
        Err(Error::Rank { .. })
    ));
    assert_eq!(cache.lengths(), &[2]);
    // Another engine's tensors are refused.
    let other = Engine::cpu();
    let foreign = upload(&other, &random(&mut rng, [1, HEADS, 1, DK]));
    let foreign_v = upload(&other, &random(&mut rng, [1, HEADS, 1, DV]));
    assert!(matches!(
        cache.append_blocking(&engine, &foreign, &foreign_v),
        Err(Error::ForeignTensor { .. })
    ));
    assert_eq!(cache.lengths(), &[2]);
    // An error names the tensor that was foreign.
    let foreign_v = upload(&other, &random(&mut rng, [1, HEADS, 2, DV]));
    let err = cache.append_blocking(&engine, &k, &foreign_v).unwrap_err();
    assert!(
        matches!(err, Error::ForeignTensor { tensor: "value" }),
        "{err}"
    );
    assert_eq!(cache.lengths(), &[2]);
    // Reading an empty cache is a conflict, not a panic.
    let q = upload(&engine, &random(&mut rng, [1, HEADS, 1, DK]));
    assert!(matches!(
        KvCache::new().attention_inputs(&q, &[]),
        Err(Error::Conflict(_))
    ));
}

#[test]
fn a_cloned_cache_keeps_its_rows_when_the_original_appends() {
    let mut rng = SplitMix64::new(common::seed() ^ 2);
    for engine in engines() {
        let mut cache = KvCache::with_capacity(16);
        let (k, v) = (
            random(&mut rng, [1, HEADS, 3, DK]),
            random(&mut rng, [1, HEADS, 3, DV]),
        );
        cache
            .append_blocking(&engine, &upload(&engine, &k), &upload(&engine, &v))
            .unwrap();
        // A fork (beam search, speculative decoding): both append at row 3.
        let mut fork = cache.clone();
        let one = |rng: &mut SplitMix64| {
            (
                random(rng, [1, HEADS, 1, DK]),
                random(rng, [1, HEADS, 1, DV]),
            )
        };
        let (a, b) = (one(&mut rng), one(&mut rng));
        cache
            .append_blocking(&engine, &upload(&engine, &a.0), &upload(&engine, &a.1))
            .unwrap();
        fork.append_blocking(&engine, &upload(&engine, &b.0), &upload(&engine, &b.1))
            .unwrap();
        let row3 = |c: &KvCache| {
            let (key, _) = c.present_blocking(&engine).unwrap();
            rows(&engine.download_blocking(&key).unwrap(), 0, 3, 1)
        };
        assert_eq!(
            row3(&cache),
            a.0.data(),
            "{}: the original",
            engine.describe()
        );
        assert_eq!(row3(&fork), b.0.data(), "{}: the fork", engine.describe());
    }
}

#[test]
fn a_first_capacity_the_host_cannot_hold_falls_back_on_the_cpu_engine() {
    // The CPU engine has no buffer limit to cap a doubling: a first capacity
    // whose values the host cannot allocate (2^40 tokens: 128 TiB of keys here,
    // more than an x86-64 process can address), or
    // whose element count overflows, falls back to twice the present
    // capacity or what the append needs, instead of aborting or panicking.
    let mut rng = SplitMix64::new(5);
    let engine = Engine::cpu();
    // (2^40 only where the address space is known to be smaller than it:
    // elsewhere a permissive overcommit might grant it.)
    let capacities: &[usize] = if cfg!(target_arch = "x86_64") {
        &[1 << 40, 1 << 60, usize::MAX]
    } else {
        &[1 << 60, usize::MAX]
    };
    for &capacity in capacities {
        let mut cache = KvCache::with_capacity(capacity);
        let k = upload(&engine, &random(&mut rng, [1, HEADS, 3, DK]));
        let v = upload(&engine, &random(&mut rng, [1, HEADS, 3, DV]));
        cache.append_blocking(&engine, &k, &v).unwrap();
        assert_eq!(cache.lengths(), &[3]);
        assert_eq!(cache.capacity(), 3, "capacity {capacity}");
        // The next append doubles from there.
        let k = upload(&engine, &random(&mut rng, [1, HEADS, 1, DK]));
        let v = upload(&engine, &random(&mut rng, [1, HEADS, 1, DV]));
        cache.append_blocking(&engine, &k, &v).unwrap();
        assert_eq!((cache.lengths(), cache.capacity()), (&[4][..], 6));
    }
}
