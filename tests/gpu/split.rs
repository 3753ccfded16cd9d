//! Calls whose tensors exceed one storage binding run in pieces that fit
//! (`run/split.rs`): by batches and heads, by query rows, and by keys (the
//! fused kernel resumed across key ranges). Forced here on a small adapter,
//! one whose `max_storage_buffer_binding_size` is 64 KiB or 8 KiB, so every
//! kind of cut runs against the f64 oracle on every path.

use crate::common;

use webattn::conformance::{run_case, CaseSpec, MaskForm};
use webattn::{
    AttentionInputs, AttentionOptions, BackendPreference, DeviceLimits, Engine, EngineOptions,
    Error, KernelPath, QkMatmulOutputMode,
};

/// A GPU engine whose storage bindings hold at most `limit` bytes.
fn small_binding_engine(limit: u64) -> Option<Engine> {
    common::gpu()?;
    let options = EngineOptions {
        backend: BackendPreference::Gpu,
        limits: DeviceLimits::default()
            .with("max_storage_buffer_binding_size", limit)
            .expect("a known limit"),
        ..Default::default()
    };
    Some(Engine::with_options_blocking(options).expect("an engine with a smaller binding limit"))
}

/// Runs each case on the fused and unfused paths, checks it against the
/// oracle and that it ran in more than one piece.
fn check_in_pieces(engine: &Engine, cases: &[CaseSpec]) {
    let mut failed = Vec::new();
    for case in cases {
        for path in [KernelPath::Fused, KernelPath::Unfused] {
            let results = pollster::block_on(run_case(engine, case, &[path], common::seed()));
            for result in &results {
                common::print_result(result);
                if !result.passed() {
                    failed.push(format!("{} on {path:?}", result.name));
                }
            }
            let stats = engine.last_call().expect("a call was made");
            println!("  {} on {path:?}: {} pieces", case.name, stats.pieces);
            assert!(
                stats.pieces > 1,
                "{} on {path:?} ran whole; the case no longer exceeds the binding",
                case.name
            );
        }
    }
    assert!(failed.is_empty(), "failed in pieces: {failed:?}");
}

#[test]
fn calls_past_one_binding_run_in_pieces_and_agree_with_the_oracle() {
    let Some(engine) = small_binding_engine(64 << 10) else {
        return;
    };
    let cases = [
        // Batches and heads: every (batch, KV head) fits, the whole does not.
        CaseSpec::new("pieces-of-batches-and-heads", [4, 8, 4], [33, 65], [32, 32])
            .mask(MaskForm::Float(4))
            .with(|o| {
                o.is_causal = true;
                o.alibi = true;
                o.return_lse = true;
            }),
        // Query rows, behind a past whose present is returned.
        CaseSpec::new(
            "pieces-of-query-rows-with-past",
            [1, 2, 1],
            [300, 40],
            [64, 64],
        )
        .past(25)
        .mask(MaskForm::Bool(2))
        .with(|o| {
            o.is_causal = true;
            o.left_window_size = 50;
            o.return_present = true;
            o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
        }),
        // Keys: one head's K is 750 KiB; per-batch lengths and ALiBi.
        CaseSpec::new(
            "pieces-of-keys-decode-nonpad",
            [2, 8, 2],
            [3, 3000],
            [64, 64],
        )
        .nonpad()
        .with(|o| {
            o.left_window_size = 900;
            o.alibi = true;
            o.softcap = 20.0;
            o.return_lse = true;
        }),
        // Keys and rows, with a short mask and the biased scores returned.
        CaseSpec::new(
            "pieces-of-keys-short-mask-scores",
            [1, 2, 1],
            [70, 700],
            [48, 32],
        )
        .mask(MaskForm::ShortBool)
        .with(|o| {
            o.is_causal = true;
            o.temperature = 0.7;
            o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased);
        }),
        // Keys behind a past, with a mask per query head ([Hq, 1, T]) and GQA.
        CaseSpec::new(
            "pieces-of-keys-with-past-head-mask",
            [1, 4, 2],
            [5, 900],
            [64, 64],
        )
        .past(30)
        .mask(MaskForm::Float(3))
        .with(|o| {
            o.is_causal = true;
            o.return_present = true;
        }),
        // Batches and heads, with a mask per query head.
        CaseSpec::new("pieces-of-heads-head-mask", [4, 8, 4], [33, 65], [32, 32])
            .mask(MaskForm::Bool(3)),
        // Every third row fully masked, rows split in pieces.
        CaseSpec::new("pieces-with-empty-rows", [2, 4, 4], [97, 257], [64, 64])
            .mask(MaskForm::EmptyRows)
            .logits(30.0),
    ];
    check_in_pieces(&engine, &cases);
}

#[test]
fn probabilities_whose_rows_exceed_a_binding_are_refused_with_a_hint() {
    let Some(engine) = small_binding_engine(8 << 10) else {
        return;
    };
    let case = CaseSpec::new("long-probability-rows", [1, 1, 1], [4, 97], [40, 40]).with(|o| {
        o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
    });
    let inputs = case.generate(common::seed()).expect("inputs");
    let options = AttentionOptions {
        path: KernelPath::Fused,
        qk_matmul_output_mode: Some(QkMatmulOutputMode::Probabilities),
        ..Default::default()
    };
    let host = AttentionInputs::new(&inputs.q, &inputs.k, &inputs.v);
    let err = engine
        .attention_host_blocking(&host, &options)
        .expect_err("a row of probabilities cannot be split across bindings");
    assert!(matches!(err, Error::Limit { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("max_storage_buffer_binding_size") && text.contains("mode 2"),
        "{text}"
    );
    // The same call without the probabilities runs, in pieces of keys.
    let plain = AttentionOptions {
        path: KernelPath::Fused,
        ..Default::default()
    };
    engine
        .attention_host_blocking(&host, &plain)
        .expect("without probabilities the keys can be split");
    assert!(engine.last_call().expect("a call").pieces > 1);
}

/// Keys past one binding run in ranges, which only the fused kernel resumes:
/// at head dims it does not take (above 256) the call is refused with a
/// typed error that says so, not with the fused kernel's advice to go
/// unfused (the call already was).
#[test]
fn keys_past_a_binding_at_head_dims_the_fused_kernel_refuses_say_why() {
    let Some(engine) = small_binding_engine(64 << 10) else {
        return;
    };
    // K: 100 keys of 260 values, 104,000 bytes, over 64 KiB for one head.
    let case = CaseSpec::new("wide-heads-many-keys", [1, 1, 1], [2, 100], [260, 260]);
    let inputs = case.generate(common::seed()).expect("inputs");
    let host = AttentionInputs::new(&inputs.q, &inputs.k, &inputs.v);
    for path in [KernelPath::Auto, KernelPath::Unfused] {
        let options = AttentionOptions {
            path,
            ..Default::default()
        };
        let err = engine
            .attention_host_blocking(&host, &options)
            .expect_err("keys in ranges need the fused kernel");
        assert!(matches!(err, Error::Limit { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("keys in ranges") && !text.contains("use KernelPath::Unfused"),
            "{path:?}: {text}"
        );
    }
    // The same heads with keys that fit one binding run, unfused.
    let short = CaseSpec::new("wide-heads-few-keys", [1, 1, 1], [2, 40], [260, 260]);
    let results = pollster::block_on(run_case(
        &engine,
        &short,
        &[KernelPath::Auto],
        common::seed(),
    ));
    assert!(results.iter().all(|r| r.passed()), "{results:?}");
}

/// On the fused route a piece whose slice of Q, K or V is one run of the
/// call's tensor at an aligned offset binds it in place: a decode cut by
/// batches allocates no copies of its keys and values.
#[test]
fn fused_pieces_read_aligned_slices_in_place() {
    let Some(engine) = small_binding_engine(2 << 20) else {
        return;
    };
    // Per batch: 2 heads x 4096 keys x 64 x 4 bytes = 2 MiB of K (and of V).
    let case = CaseSpec::new("decode-in-place-pieces", [4, 8, 2], [1, 4096], [64, 64]);
    // K and V of one batch, what a piece of one batch would copy.
    let kv_per_batch: u64 = 2 * 2 * 4096 * 64 * 4;
    for path in [KernelPath::Fused, KernelPath::Unfused] {
        let results = pollster::block_on(run_case(&engine, &case, &[path], common::seed()));
        common::print_result(&results[0]);
        assert!(results[0].passed(), "{path:?}");
        let stats = engine.last_call().unwrap();
        assert!(stats.pieces > 1, "{path:?} ran whole");
        println!(
            "  {path:?}: {} pieces, {} bytes allocated",
            stats.pieces, stats.allocated_bytes
        );
        match path {
            // Outputs and decode partials only: far less than a batch's K and V.
            KernelPath::Fused => assert!(
                stats.allocated_bytes < kv_per_batch / 4,
                "fused pieces copied their inputs: {} bytes",
                stats.allocated_bytes
            ),
            // The unfused path's pieces are copies.
            _ => assert!(stats.allocated_bytes >= kv_per_batch),
        }
    }
}
