//! The multi-head attention layer on the GPU and on the CPU engine (the fast
//! CPU backend) against its f64 oracle: self and cross attention, GQA and MQA,
//! biases, RoPE, ALiBi, and the KV-cache decoder matching a full recompute.

use crate::common;

use webattn::conformance::{compare, ErrorReport};
use webattn::family::mha::{KvCache, MhaWeights, MultiHeadAttention};
use webattn::family::position::{Rope, RopeLayout};
use webattn::rng::SplitMix64;
use webattn::{AttentionOptions, Engine, Error, HostTensor};

/// The engines each case runs on: the CPU engine always, the GPU when there is one.
fn engines() -> Vec<&'static Engine> {
    static CPU: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    let mut engines = vec![CPU.get_or_init(Engine::cpu)];
    engines.extend(common::gpu());
    engines
}

fn input(shape: [usize; 3], seed: u64) -> HostTensor {
    let mut rng = SplitMix64::new(seed);
    HostTensor::new(shape, rng.normal_vec(shape.iter().product(), 1.0)).unwrap()
}

fn layer(
    d_model: usize,
    d_kv: usize,
    heads: usize,
    kv_heads: usize,
    hd: usize,
) -> MultiHeadAttention {
    let weights = MhaWeights::random(d_model, d_kv, heads, kv_heads, hd, common::seed()).unwrap();
    MultiHeadAttention::new(weights, heads, kv_heads).unwrap()
}

/// Runs the layer on `engine` and checks output and weights against the oracle.
fn check(
    name: &str,
    engine: &Engine,
    mha: &MultiHeadAttention,
    query: &HostTensor,
    key_value: Option<&HostTensor>,
    options: &AttentionOptions,
) -> (ErrorReport, ErrorReport) {
    let got = mha
        .forward_blocking(engine, query, key_value, options, true)
        .unwrap();
    let (exact_out, exact_w) = mha.oracle::<f64>(query, key_value, options).unwrap();
    let (plain_out, plain_w) = mha.oracle::<f32>(query, key_value, options).unwrap();
    let out = compare(got.output.data(), &exact_out, &plain_out, 1e-6);
    let weights = compare(
        got.weights.as_ref().unwrap().data(),
        &exact_w,
        &plain_w,
        1e-6,
    );
    println!(
        "{name:<34} output max_abs {:.3e} (allowed {:.3e})  weights max_abs {:.3e} (allowed {:.3e})",
        out.max_abs, out.allowed, weights.max_abs, weights.allowed
    );
    assert!(out.passed(), "{name}: output {out:?}");
    assert!(weights.passed(), "{name}: weights {weights:?}");
    (out, weights)
}

#[test]
fn self_attention_matches_the_oracle() {
    for engine in engines() {
        let mha = layer(24, 24, 4, 2, 8);
        for (batch, n, causal) in [(1, 1, false), (2, 7, true), (2, 97, false), (1, 257, true)] {
            let x = input([batch, n, 24], common::seed() ^ n as u64);
            let options = AttentionOptions {
                is_causal: causal,
                ..Default::default()
            };
            check(
                &format!("self b{batch} n{n} causal={causal}"),
                engine,
                &mha,
                &x,
                None,
                &options,
            );
        }
    }
}

#[test]
fn cross_attention_with_other_lengths_and_features() {
    for engine in engines() {
        // MQA: three query heads share one KV head; keys/values have 20 features.
        let mha = layer(24, 20, 3, 1, 12);
        for (n, m) in [(7, 97), (33, 1), (1, 257)] {
            let queries = input([2, n, 24], 11 + n as u64);
            let memory = input([2, m, 20], 13 + m as u64);
            check(
                &format!("cross n{n} m{m}"),
                engine,
                &mha,
                &queries,
                Some(&memory),
                &Default::default(),
            );
        }
        // Without biases.
        let mut weights = MhaWeights::random(16, 16, 2, 2, 8, 5).unwrap();
        weights.b_q = None;
        weights.b_k = None;
        weights.b_v = None;
        weights.b_o = None;
        let plain = MultiHeadAttention::new(weights, 2, 2).unwrap();
        check(
            "no biases",
            engine,
            &plain,
            &input([1, 9, 16], 3),
            Some(&input([1, 4, 16], 4)),
            &Default::default(),
        );
    }
}

#[test]
fn rope_alibi_and_temperature_inside_the_layer() {
    for engine in engines() {
        for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
            let mha = layer(32, 32, 4, 4, 8)
                .with_rope(Rope {
                    layout,
                    ..Default::default()
                })
                .unwrap();
            let x = input([1, 33, 32], 21);
            let options = AttentionOptions {
                is_causal: true,
                ..Default::default()
            };
            check(
                &format!("rope {layout:?} causal"),
                engine,
                &mha,
                &x,
                None,
                &options,
            );
        }
        let mha = layer(32, 32, 8, 2, 4);
        let options = AttentionOptions {
            is_causal: true,
            alibi: true,
            temperature: 0.7,
            ..Default::default()
        };
        check(
            "alibi temperature gqa",
            engine,
            &mha,
            &input([2, 40, 32], 8),
            None,
            &options,
        );
    }
}

/// A causal decoder fed a prompt and then one token at a time gives the rows
/// a full recompute of the whole sequence gives.
#[test]
fn kv_cache_decoding_equals_full_recompute() {
    let cpu = Engine::cpu();
    let engines: Vec<&Engine> = match common::gpu() {
        Some(gpu) => vec![gpu, &cpu],
        None => vec![&cpu],
    };
    let mha = layer(24, 24, 4, 2, 6)
        .with_rope(Rope {
            layout: RopeLayout::HalfSplit,
            ..Default::default()
        })
        .unwrap();
    let (batch, prompt, steps) = (2, 5, 6);
    let total = prompt + steps;
    let x = input([batch, total, 24], 99);
    let options = AttentionOptions::default();
    let causal = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let (exact, _) = mha.oracle::<f64>(&x, None, &causal).unwrap();
    let (plain, _) = mha.oracle::<f32>(&x, None, &causal).unwrap();
    for engine in engines {
        let full = mha
            .forward_blocking(engine, &x, None, &causal, false)
            .unwrap();
        let mut cache = KvCache::new();
        let mut worst_vs_full = 0.0f32;
        let mut start = 0;
        for len in std::iter::once(prompt).chain(std::iter::repeat_n(1, steps)) {
            let chunk = slice_rows(&x, start, len);
            let step = mha
                .forward_cached_blocking(engine, &chunk, &mut cache, &options, start > 0)
                .unwrap();
            assert_eq!(cache.len(), start + len);
            let rows =
                |data: &[f32]| -> Vec<f32> { slice_rows_data(data, batch, total, 24, start, len) };
            let exact_rows: Vec<f64> = slice_rows_data(&exact, batch, total, 24, start, len);
            let report = compare(step.output.data(), &exact_rows, &rows(&plain), 1e-6);
            assert!(
                report.passed(),
                "{} step at {start}: {report:?}",
                engine.describe()
            );
            for (a, b) in step.output.data().iter().zip(rows(full.output.data())) {
                worst_vs_full = worst_vs_full.max((a - b).abs());
            }
            if let Some(w) = &step.weights {
                // One new query row attends to every cached key.
                assert_eq!(w.shape(), &[batch, 4, len, start + len]);
            }
            start += len;
        }
        println!(
            "kv cache on {}: {steps} steps after a prompt of {prompt}; worst |cached - full| {worst_vs_full:.3e}",
            engine.describe()
        );
    }
}

fn slice_rows(x: &HostTensor, start: usize, len: usize) -> HostTensor {
    let (batch, total, d) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    HostTensor::new(
        [batch, len, d],
        slice_rows_data(x.data(), batch, total, d, start, len),
    )
    .unwrap()
}

fn slice_rows_data<T: Copy>(
    data: &[T],
    batch: usize,
    total: usize,
    d: usize,
    start: usize,
    len: usize,
) -> Vec<T> {
    (0..batch)
        .flat_map(|b| data[(b * total + start) * d..(b * total + start + len) * d].to_vec())
        .collect()
}

#[test]
fn the_cpu_engine_runs_the_same_layer() {
    let engine = Engine::cpu();
    let mha = layer(16, 12, 2, 1, 4);
    let (q, kv) = (input([1, 5, 16], 1), input([1, 3, 12], 2));
    check(
        "cpu engine cross",
        &engine,
        &mha,
        &q,
        Some(&kv),
        &Default::default(),
    );
}

#[test]
fn bad_shapes_are_typed_errors() {
    let engine = Engine::cpu();
    let weights = MhaWeights::random(16, 16, 4, 2, 4, 1).unwrap();
    assert!(matches!(
        MultiHeadAttention::new(weights.clone(), 4, 3),
        Err(Error::GqaHeads { .. })
    ));
    let mut wrong = weights.clone();
    wrong.w_o = HostTensor::zeros([16, 12]).unwrap();
    assert!(matches!(
        MultiHeadAttention::new(wrong, 4, 2),
        Err(Error::ShapeMismatch { .. })
    ));
    let mha = MultiHeadAttention::new(weights, 4, 2).unwrap();
    let bad_features = input([1, 5, 15], 1);
    assert!(matches!(
        mha.forward_blocking(&engine, &bad_features, None, &Default::default(), false),
        Err(Error::ShapeMismatch { .. })
    ));
    let other_batch = input([2, 5, 16], 1);
    assert!(matches!(
        mha.forward_blocking(
            &engine,
            &input([1, 5, 16], 1),
            Some(&other_batch),
            &Default::default(),
            false
        ),
        Err(Error::ShapeMismatch { .. })
    ));
    let rank2 = HostTensor::zeros([5, 16]).unwrap();
    assert!(matches!(
        mha.forward_blocking(&engine, &rank2, None, &Default::default(), false),
        Err(Error::Rank { .. })
    ));
    let cross_only =
        MultiHeadAttention::new(MhaWeights::random(16, 8, 2, 2, 4, 1).unwrap(), 2, 2).unwrap();
    assert!(matches!(
        cross_only.forward_blocking(
            &engine,
            &input([1, 5, 16], 1),
            None,
            &Default::default(),
            false
        ),
        Err(Error::Conflict(_))
    ));
    let odd =
        MultiHeadAttention::new(MhaWeights::random(16, 16, 2, 2, 5, 1).unwrap(), 2, 2).unwrap();
    assert!(odd.with_rope(Rope::default()).is_err());
}

/// Feature sizes that are no multiple of a weight word (4 values in f32, 8 in
/// f16), odd head dims, and row counts on both sides of one product's 16.
#[test]
fn odd_feature_sizes_through_the_skinny_products() {
    use webattn::WeightStorage;
    for engine in engines() {
        for storage in [WeightStorage::F32, WeightStorage::F16] {
            let mha = layer(97, 97, 3, 1, 5).with_weight_storage(storage);
            for (batch, n) in [(1, 1), (3, 5), (1, 16), (1, 17)] {
                let x = input(
                    [batch, n, 97],
                    common::seed() ^ (n as u64 * 3 + batch as u64),
                );
                check(
                    &format!("d_model 97 {storage:?} b{batch} n{n}"),
                    engine,
                    &mha,
                    &x,
                    None,
                    &Default::default(),
                );
            }
        }
    }
}

/// An input with no tokens is a typed error on every engine and weight
/// storage, never a panic in the products.
#[test]
fn empty_inputs_give_empty_outputs() {
    use webattn::WeightStorage;
    for engine in engines() {
        for storage in [WeightStorage::F32, WeightStorage::F16] {
            let mha = layer(24, 24, 4, 2, 8).with_weight_storage(storage);
            let empty = HostTensor::new([1, 0, 24], Vec::new()).unwrap();
            let err = mha
                .forward_blocking(engine, &empty, None, &Default::default(), false)
                .unwrap_err();
            assert!(err.to_string().contains("empty dimension"), "{err}");
        }
    }
}

/// Weights kept as f16 on the device: every path computes with the rounded
/// weights, so the layer still meets the oracle's f32 rule (of those weights),
/// through the prepared products (few rows), their row blocks (many rows),
/// the split matrices of a cross attention and a cached decoder with RoPE.
#[test]
fn f16_weight_storage_matches_the_oracle_of_its_weights() {
    use webattn::WeightStorage;
    for engine in engines() {
        let mha = layer(24, 24, 4, 2, 8).with_weight_storage(WeightStorage::F16);
        assert_eq!(mha.weight_storage(), WeightStorage::F16);
        for (batch, n, causal) in [(1, 1, false), (2, 7, true), (2, 41, false)] {
            let x = input([batch, n, 24], common::seed() ^ (n as u64 + 5));
            let options = AttentionOptions {
                is_causal: causal,
                ..Default::default()
            };
            check(
                &format!("f16 weights b{batch} n{n}"),
                engine,
                &mha,
                &x,
                None,
                &options,
            );
        }
        let cross = layer(24, 20, 3, 1, 12).with_weight_storage(WeightStorage::F16);
        check(
            "f16 weights cross n3 m5",
            engine,
            &cross,
            &input([2, 3, 24], 31),
            Some(&input([2, 5, 20], 37)),
            &Default::default(),
        );
    }
}

/// A decoder step after the first reuses everything the layer prepared: it
/// creates no buffer, submits once (projections, RoPE, the cache append,
/// attention, the output projection and the copy of its output), and makes a
/// handful of dispatches whatever the head count (per-head products made
/// ~130 a token at 32 heads), over a short cache (fused attention) and a long
/// one (split-K decode and its merge); every step meets the oracle.
#[test]
fn a_decoder_step_reuses_what_it_prepared() {
    // An engine of its own: the counts are the device's, and other tests
    // share the common engine's device.
    let Some(engine) = common::own_gpu() else {
        return;
    };
    let engine = &engine;
    let ctx = engine.gpu().expect("a GPU engine");
    let mha = layer(64, 64, 8, 2, 8).with_rope(Rope::default()).unwrap();
    for (prompt, steps) in [(0, 12), (600, 3)] {
        let total = prompt + steps;
        let x = input([1, total, 64], 77 + prompt as u64);
        let causal = AttentionOptions {
            is_causal: true,
            ..Default::default()
        };
        let (exact, _) = mha.oracle::<f64>(&x, None, &causal).unwrap();
        let (plain, _) = mha.oracle::<f32>(&x, None, &causal).unwrap();
        // 64 keys: the fused kernel; 1024: split-K decode and its merge.
        let mut cache = KvCache::with_capacity(if prompt == 0 { 64 } else { 1024 });
        if prompt > 0 {
            mha.forward_cached_blocking(
                engine,
                &slice_rows(&x, 0, prompt),
                &mut cache,
                &causal,
                false,
            )
            .unwrap();
        }
        let mut worst = 0.0f64;
        let mut per_step = Vec::new();
        for t in prompt..total {
            let before = ctx.work_counts();
            let step = mha
                .forward_cached_blocking(engine, &slice_rows(&x, t, 1), &mut cache, &causal, false)
                .unwrap();
            per_step.push(ctx.work_counts() - before);
            let exact_rows: Vec<f64> = slice_rows_data(&exact, 1, total, 64, t, 1);
            let plain_rows: Vec<f32> = slice_rows_data(&plain, 1, total, 64, t, 1);
            let report = compare(step.output.data(), &exact_rows, &plain_rows, 1e-6);
            assert!(report.passed(), "step {t}: {report:?}");
            worst = worst.max(report.max_abs);
        }
        let last = per_step.last().unwrap();
        println!(
            "{prompt} cached: first step {:?}; after it {} buffers, {} bind groups, {} dispatches, \
             {} copies, {} queue writes, {} submissions a step; worst |step - f64 oracle| {worst:.3e}",
            per_step[0],
            last.buffers,
            last.bind_groups,
            last.dispatches,
            last.copies,
            last.writes,
            last.submissions
        );
        for (i, counts) in per_step.iter().enumerate().skip(1) {
            assert_eq!(counts.buffers, 0, "{counts:?}");
            // From an empty cache the first step has nothing to append into
            // and runs apart: the step's own bind groups are made by the
            // second, the first recorded in one submission.
            if prompt > 0 || i > 1 {
                assert_eq!(counts.bind_groups, 0, "step {i}: {counts:?}");
            }
            assert_eq!(counts.submissions, 1, "{counts:?}");
            assert!(counts.dispatches <= 8, "{counts:?}");
            // What changes from token to token: the token itself, the
            // positions of the rotation and the append, the cache's length
            // in the attention's parameters; the rest is written once.
            assert!(counts.writes <= 4, "step {i}: {counts:?}");
            // The keys' rotation and the append are one dispatch: no copies
            // into the cache, only the output's to its readback.
            if prompt > 0 || i > 1 {
                assert!(counts.copies <= 1, "step {i}: {counts:?}");
            }
        }
    }
}

/// A stack of layers whose hidden state stays on the device: each step's
/// output feeds the next layer as a device tensor, one submission per layer
/// and no readback until the last; the same numbers as the stack fed from
/// the host, and nothing allocated after the first token.
#[test]
fn a_stack_of_layers_keeps_its_hidden_state_on_the_device() {
    let Some(engine) = common::own_gpu() else {
        return;
    };
    let engine = &engine;
    let ctx = engine.gpu().expect("a GPU engine");
    let causal = AttentionOptions::default();
    let stack: Vec<MultiHeadAttention> = (0..3)
        .map(|i| {
            let w = MhaWeights::random(64, 64, 8, 2, 8, 0x57ac + i).unwrap();
            MultiHeadAttention::new(w, 8, 2)
                .unwrap()
                .with_rope(Rope::default())
                .unwrap()
        })
        .collect();
    let mut on_device: Vec<KvCache> = (0..3).map(|_| KvCache::with_capacity(32)).collect();
    let mut from_host: Vec<KvCache> = (0..3).map(|_| KvCache::with_capacity(32)).collect();
    let tokens = input([1, 6, 64], 0x70c);
    let mut worst_gap = 0.0f32;
    // The input tensor the stack is fed through, its values written in place.
    let mut x0 = engine.upload(&slice_rows(&tokens, 0, 1)).unwrap();
    for t in 0..6 {
        let token = slice_rows(&tokens, t, 1);
        // From the host: each layer's output read back and fed to the next.
        let mut host = token.clone();
        for (layer, cache) in stack.iter().zip(&mut from_host) {
            host = layer
                .forward_cached_blocking(engine, &host, cache, &causal, false)
                .unwrap()
                .output;
        }
        // On the device: the token written in place, one readback.
        let before = ctx.work_counts();
        engine.write(&mut x0, &token).unwrap();
        let mut x = x0.clone();
        for (layer, cache) in stack.iter().zip(&mut on_device) {
            x = layer
                .forward_cached_on_device_blocking(engine, &x, cache, &causal)
                .unwrap();
        }
        let out = engine.download_blocking(&x).unwrap();
        let counts = ctx.work_counts() - before;
        for (a, b) in out.data().iter().zip(host.data()) {
            worst_gap = worst_gap.max((a - b).abs());
        }
        assert_eq!(out.data(), host.data(), "token {t}");
        // The first token fills the empty caches the plain way; the second
        // makes the steps' workspaces; after them a token allocates nothing:
        // the input is written in place, the readback's staging kept.
        if t >= 2 {
            assert_eq!(counts.buffers, 0, "token {t}: {counts:?}");
            assert_eq!(
                counts.submissions, 4,
                "token {t}: one per layer and the readback's copy: {counts:?}"
            );
            assert!(counts.dispatches <= 3 * 8, "{counts:?}");
        }
    }
    println!("device-resident stack of 3 layers: worst |device - host| {worst_gap:e}");

    // The same stack recorded into one encoder a token: one submission and
    // one readback a token, the same numbers, nothing allocated.
    let mut recorded: Vec<KvCache> = (0..3).map(|_| KvCache::with_capacity(32)).collect();
    let mut again: Vec<KvCache> = (0..3).map(|_| KvCache::with_capacity(32)).collect();
    for t in 0..6 {
        let token = slice_rows(&tokens, t, 1);
        let mut x = engine.upload(&token).unwrap();
        for (layer, cache) in stack.iter().zip(&mut again) {
            x = layer
                .forward_cached_on_device_blocking(engine, &x, cache, &causal)
                .unwrap();
        }
        let expected = engine.download_blocking(&x).unwrap();
        let before = ctx.work_counts();
        engine.write(&mut x0, &token).unwrap();
        let mut x = x0.clone();
        if t == 0 {
            // An empty cache has nothing to append into in place: refused,
            // nothing recorded; the first token runs by itself.
            let mut encoder = ctx.device().create_command_encoder(&Default::default());
            let err = stack[0]
                .record_on_device_blocking(engine, &mut encoder, &x, &mut recorded[0], &causal)
                .unwrap_err();
            assert!(matches!(err, Error::Conflict(_)), "{err}");
            assert_eq!(recorded[0].len(), 0);
            for (layer, cache) in stack.iter().zip(&mut recorded) {
                x = layer
                    .forward_cached_on_device_blocking(engine, &x, cache, &causal)
                    .unwrap();
            }
        } else {
            let mut encoder = ctx.device().create_command_encoder(&Default::default());
            for (layer, cache) in stack.iter().zip(&mut recorded) {
                x = layer
                    .record_on_device_blocking(engine, &mut encoder, &x, cache, &causal)
                    .unwrap();
            }
            ctx.queue().submit([encoder.finish()]);
        }
        let out = engine.download_blocking(&x).unwrap();
        let counts = ctx.work_counts() - before;
        assert_eq!(out.data(), expected.data(), "token {t}");
        if t >= 2 {
            assert_eq!(counts.buffers, 0, "token {t}: {counts:?}");
            // Ours, uncounted, and the readback's copy.
            assert_eq!(counts.submissions, 1, "token {t}: {counts:?}");
            assert!(counts.dispatches <= 3 * 8, "{counts:?}");
        }
    }
    // A tensor of another engine is refused by name.
    let other = Engine::cpu();
    let foreign = other.upload(&slice_rows(&tokens, 0, 1)).unwrap();
    let err = stack[0]
        .forward_cached_on_device_blocking(engine, &foreign, &mut on_device[0], &causal)
        .unwrap_err();
    assert!(matches!(err, Error::ForeignTensor { .. }), "{err}");
}
