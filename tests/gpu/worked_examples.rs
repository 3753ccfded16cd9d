//! The worked examples of `../shared/WORKED-EXAMPLES.md`, computed by the
//! engine (on the GPU when there is one, and on the CPU engine).
//!
//! Where the teaching material prints a wrong figure, the test asserts the
//! correct value and a comment says what was printed and why it differs.

use crate::common;

use webattn::family::additive::AdditiveAttention;
use webattn::measure::AttentionShape;
use webattn::{AttentionInputs, AttentionOptions, Engine, HostTensor, QkMatmulOutputMode};

/// Printed figures have three decimals: agree to half a unit in the last place.
const PRINTED: f32 = 5e-4;

fn engines() -> Vec<Engine> {
    let mut engines = vec![Engine::cpu()];
    if let Some(gpu) = common::gpu() {
        if let Some(ctx) = gpu.gpu() {
            engines.push(Engine::from_context(ctx.clone()));
        }
    }
    engines
}

fn tensor(shape: [usize; 4], data: &[f32]) -> HostTensor {
    HostTensor::new(shape, data.to_vec()).unwrap()
}

/// Y and the probabilities of one head.
fn attend(
    engine: &Engine,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    options: &AttentionOptions,
) -> (Vec<f32>, Vec<f32>) {
    let options = AttentionOptions {
        qk_matmul_output_mode: Some(QkMatmulOutputMode::Probabilities),
        ..options.clone()
    };
    let out = engine
        .attention_host_blocking(&AttentionInputs::new(q, k, v), &options)
        .unwrap();
    (out.y.into_data(), out.qk_matmul_output.unwrap().into_data())
}

fn scores(
    engine: &Engine,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    scale: Option<f32>,
) -> Vec<f32> {
    let options = AttentionOptions {
        scale,
        qk_matmul_output_mode: Some(QkMatmulOutputMode::Scaled),
        ..Default::default()
    };
    let out = engine
        .attention_host_blocking(&AttentionInputs::new(q, k, v), &options)
        .unwrap();
    out.qk_matmul_output.unwrap().into_data()
}

#[track_caller]
fn assert_close(name: &str, got: &[f32], expected: &[f32], tolerance: f32) {
    assert_eq!(got.len(), expected.len(), "{name}");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() <= tolerance,
            "{name}[{i}]: got {g}, expected {e} (got {got:?})"
        );
    }
}

#[test]
fn example_1_scaled_dot_product_one_query_three_keys() {
    let q = tensor([1, 1, 1, 4], &[1.0, 0.5, -0.3, 0.8]);
    let k = tensor(
        [1, 1, 3, 4],
        &[
            0.8, 0.2, -0.1, 0.5, 0.3, 0.7, 0.4, -0.2, -0.5, 0.1, 0.9, 0.6,
        ],
    );
    let v = tensor(
        [1, 1, 3, 5],
        &[
            0.5, 0.8, -0.2, 0.6, 0.3, 0.2, -0.4, 0.7, 0.1, 0.9, -0.3, 0.5, 0.4, -0.6, 0.2,
        ],
    );
    for engine in engines() {
        // Printed and correct: dot products [1.33, 0.37, -0.24], scaled by 2.
        assert_close(
            "dots",
            &scores(&engine, &q, &k, &v, Some(1.0)),
            &[1.33, 0.37, -0.24],
            1e-6,
        );
        assert_close(
            "scaled",
            &scores(&engine, &q, &k, &v, None),
            &[0.665, 0.185, -0.120],
            1e-6,
        );
        let (y, w) = attend(&engine, &q, &k, &v, &Default::default());
        // Printed and correct: weights [0.482, 0.298, 0.220].
        assert_close("weights", &w, &[0.482, 0.298, 0.220], PRINTED);
        // Printed [0.235, 0.377, 0.201, 0.187, 0.457]: the second and third
        // entries are off by one in the last place. The exact output is
        // [0.23467, 0.37618, 0.20030, 0.18710, 0.45695], so 0.376 and 0.200.
        assert_close("output", &y, &[0.235, 0.376, 0.200, 0.187, 0.457], PRINTED);
    }
}

#[test]
fn example_2_a_tiny_attention_head() {
    let q = tensor([1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let k = tensor([1, 1, 3, 2], &[1.0, 0.0, 1.0, 1.0, 0.0, 1.0]);
    let v = tensor([1, 1, 3, 2], &[1.0, 0.0, 0.0, 2.0, 1.0, 1.0]);
    for engine in engines() {
        let s = scores(&engine, &q, &k, &v, None);
        // Printed and correct: row 0 of the scores is [0.707, 0.707, 0].
        assert_close("scores row 0", &s[..3], &[0.707, 0.707, 0.0], PRINTED);
        let (y, w) = attend(&engine, &q, &k, &v, &Default::default());
        // Printed A row 0 ≈ [0.382, 0.382, 0.236] is wrong: softmax of
        // [0.707, 0.707, 0] is e^0.707 / (2 e^0.707 + 1) = 0.401 for the first
        // two keys and 1 / (2 e^0.707 + 1) = 0.198 for the third. (The printed
        // values are [φ, φ, 1] / (2φ + 1) with φ = 1.618: the exponential was
        // taken as 1.618 instead of e^0.707 = 2.028.)
        assert_close("weights row 0", &w[..3], &[0.401, 0.401, 0.198], PRINTED);
        // Printed O row 0 ≈ [0.618, 1.000]: the first entry follows from the
        // wrong weights (0.382 + 0.236). The correct row is 0.401 + 0.198 = 0.599.
        assert_close("output row 0", &y[..2], &[0.599, 1.000], PRINTED);
        // Printed and correct: each row of A sums to 1.
        for row in w.chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
    }
}

#[test]
fn example_3_additive_attention_given_the_scores() {
    // The scores are given, so the engine only normalises them and forms the
    // context: one query whose dot product with each one-dimensional key is
    // the score (scale 1), and the encoder states as values.
    let q = tensor([1, 1, 1, 1], &[1.0]);
    let k = tensor([1, 1, 3, 1], &[0.8, 2.1, 0.5]);
    let h = tensor(
        [1, 1, 3, 4],
        &[
            1.0, 0.5, -0.3, 0.8, 0.3, 0.9, 0.6, -0.2, -0.4, 0.2, 0.7, 0.5,
        ],
    );
    let options = AttentionOptions {
        scale: Some(1.0),
        ..Default::default()
    };
    for engine in engines() {
        let (c, alpha) = attend(&engine, &q, &k, &h, &options);
        // Printed and correct: α ≈ [0.185, 0.678, 0.137] and c ≈ [0.333, 0.730,
        // 0.447, 0.081] (exactly [0.33353, 0.73021, 0.44734, 0.08069]).
        assert_close("weights", &alpha, &[0.185, 0.678, 0.137], PRINTED);
        assert_close("context", &c, &[0.333, 0.730, 0.447, 0.081], PRINTED + 1e-4);
    }
}

#[test]
fn example_4_additive_attention_exercise() {
    let w1 = HostTensor::new([2, 3], vec![0.5, -0.3, 0.2, 0.4, 0.6, -0.1]).unwrap();
    let w2 = HostTensor::new([2, 3], vec![0.3, 0.5, 0.2, -0.2, 0.4, 0.6]).unwrap();
    let v = HostTensor::new([2], vec![1.0, 0.8]).unwrap();
    let encoder = HostTensor::new(
        [1, 4, 3],
        vec![1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0],
    )
    .unwrap();
    let decoder = HostTensor::new([1, 1, 3], vec![0.5, 0.5, 0.5]).unwrap();
    // The chapter's definition: e_i = vᵀ tanh(W1 s + W2 h_i), which is our
    // AdditiveAttention (W1 on decoder states, W2 on encoder states).
    let chapter = AdditiveAttention::new(w1.clone(), w2.clone(), v.clone()).unwrap();
    // The printed solution's definition swaps the matrices: vᵀ tanh(W1 h_i + W2 s).
    let printed = AdditiveAttention::new(w2, w1, v).unwrap();
    for engine in engines() {
        let solution = printed
            .forward_blocking(&engine, &decoder, &encoder, None, true)
            .unwrap();
        // Printed W1 h1 + W2 s = [0.8, 0.7]: W1 h1 = [0.7, 0.3] and
        // W2 s = [0.5, 0.4], so the sum is [1.2, 0.7]; the first entry was
        // added wrongly. Printed e ≈ [1.147, 1.089, 1.118, 0.856] and
        // α ≈ [0.268, 0.252, 0.260, 0.220] follow neither definition: with the
        // solution's own definition e = [1.317, 0.953, 1.313, 0.837] and
        // α = [0.302, 0.210, 0.301, 0.187].
        assert_close(
            "solution's definition",
            solution.weights.as_ref().unwrap().data(),
            &[0.302, 0.210, 0.301, 0.187],
            PRINTED,
        );
        // The chapter's definition gives e = [1.157, 1.433, 1.219, 1.005] and
        // α = [0.236, 0.311, 0.251, 0.203].
        let correct = chapter
            .forward_blocking(&engine, &decoder, &encoder, None, true)
            .unwrap();
        assert_close(
            "chapter's definition",
            correct.weights.as_ref().unwrap().data(),
            &[0.236, 0.311, 0.251, 0.203],
            PRINTED,
        );
        assert_eq!(correct.output.shape(), &[1, 1, 3]);
    }
}

#[test]
fn example_5_why_scale_by_sqrt_dk() {
    // Scores of one query against four keys: q = [1], keys = the scores.
    let q = tensor([1, 1, 1, 1], &[1.0]);
    let k = tensor([1, 1, 4, 1], &[20.0, 18.0, -15.0, -18.0]);
    let v = tensor([1, 1, 4, 1], &[0.0; 4]);
    for engine in engines() {
        let unscaled = AttentionOptions {
            scale: Some(1.0),
            ..Default::default()
        };
        // Printed and correct: softmax([20, 18, -15, -18]) ≈ [0.881, 0.119, 0, 0].
        let (_, w) = attend(&engine, &q, &k, &v, &unscaled);
        assert_close("unscaled", &w, &[0.881, 0.119, 0.0, 0.0], PRINTED);
        // Printed softmax([2.5, 2.25, -1.875, -2.25]) ≈ [0.476, 0.378, 0.061,
        // 0.085] is wrong: it is not even ordered like its inputs (-2.25 gets
        // more weight than -1.875) and puts 0.146 on keys 4.1 and 4.5 below the
        // top score, where e^-4.1 / (1 + e^-0.25) = 0.0093 is the most either
        // can get. The correct values are [0.556, 0.433, 0.007, 0.005].
        let scaled = AttentionOptions {
            scale: Some(1.0 / 8.0),
            ..Default::default()
        };
        let (_, w) = attend(&engine, &q, &k, &v, &scaled);
        assert_close("scaled", &w, &[0.556, 0.433, 0.007, 0.005], PRINTED);
        // The same flattening by a softmax temperature of 8 instead of the scale.
        let tempered = AttentionOptions {
            scale: Some(1.0),
            temperature: 8.0,
            ..Default::default()
        };
        let (_, t) = attend(&engine, &q, &k, &v, &tempered);
        assert_close("temperature 8", &t, &w, 1e-6);
    }
}

#[test]
fn example_6_causal_masking() {
    let q = tensor([1, 1, 3, 2], &[0.3, -1.0, 2.0, 0.5, -0.7, 1.1]);
    let k = tensor([1, 1, 3, 2], &[1.0, 0.2, -0.4, 0.9, 0.6, -1.3]);
    let v = tensor([1, 1, 3, 1], &[1.0, 2.0, 3.0]);
    let causal = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    for engine in engines() {
        let (y, w) = attend(&engine, &q, &k, &v, &causal);
        // Token 1 sees only itself, token 2 tokens 1-2, token 3 all three;
        // masked weights are exactly 0 and every row sums to 1.
        assert_eq!(&w[..3], &[1.0, 0.0, 0.0]);
        assert_eq!(w[5], 0.0);
        assert!(w[3] > 0.0 && w[4] > 0.0 && w[6..].iter().all(|&x| x > 0.0));
        for row in w.chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        assert_eq!(y[0], 1.0, "token 1 can only copy its own value");
    }
}

#[test]
fn example_7_complexity_figures() {
    // BERT-base's attention matrix: b = 32, h = 12, n = 512 in f32.
    let bert = AttentionShape {
        batch: 32,
        heads: 12,
        kv_heads: 12,
        seq_q: 512,
        seq_k: 512,
        head_dim: 64,
        causal: false,
    };
    assert_eq!(bert.score_bytes(), 402_653_184); // printed ≈ 402 MB: correct
                                                 // n = 512, d_k = d_v = 64: 2·512·512·(64 + 64) ≈ 67 MFLOPs.
    let shape = AttentionShape {
        batch: 1,
        heads: 1,
        kv_heads: 1,
        seq_q: 512,
        seq_k: 512,
        head_dim: 64,
        causal: false,
    };
    assert_eq!(shape.flops(), 67_108_864.0); // printed ≈ 67 MFLOPs: correct
                                             // QKᵀ for Q 10×64, K 20×64: 2·10·64·20 = 25,600 FLOPs, half of the
                                             // QKᵀ-plus-PV count at D = 64.
    let small = AttentionShape {
        seq_q: 10,
        seq_k: 20,
        ..shape
    };
    assert_eq!(small.flops() / 2.0, 25_600.0); // printed: correct
                                               // With V 20×128 the output is 10×128 (printed: correct).
    let engine = Engine::cpu();
    let q = HostTensor::zeros([1, 1, 10, 64]).unwrap();
    let k = HostTensor::zeros([1, 1, 20, 64]).unwrap();
    let v = HostTensor::zeros([1, 1, 20, 128]).unwrap();
    let out = engine
        .attention_host_blocking(&AttentionInputs::new(&q, &k, &v), &Default::default())
        .unwrap();
    assert_eq!(out.y.shape(), &[1, 1, 10, 128]);
}
