//! The backward pass on the GPU: the quick sweep's cases through the fused
//! backward kernels against the f64 oracle's gradients (the tolerance rule,
//! output by output), bit-for-bit repeatability, and refusals.

use crate::common;

use webattn::conformance::{
    run_backward_case, sweep, BackwardOracle, CaseSpec, MaskForm, SweepKind, LARGE_LOGITS,
};
use webattn::{AttentionOptions, BackwardInputs, Error, GradientOptions, HostTensor, KernelPath};

fn run_backward_cases(cases: &[CaseSpec], paths: &[KernelPath]) {
    let Some(engine) = common::gpu() else { return };
    let mut failed = Vec::new();
    for case in cases {
        for result in pollster::block_on(run_backward_case(engine, case, paths, common::seed())) {
            common::print_result(&result);
            if !result.passed() {
                failed.push(format!("{} on {}", result.name, result.path));
            }
        }
    }
    assert!(failed.is_empty(), "backward cases failed: {failed:?}");
}

#[test]
fn quick_sweep_backward_on_the_fused_kernels() {
    run_backward_cases(&sweep(SweepKind::Quick), &[KernelPath::Fused]);
}

#[test]
fn backward_at_awkward_sizes_large_logits_and_empty_rows() {
    let cases = [
        CaseSpec::new("bwd-1025x257-causal", [1, 2, 1], [1025, 257], [64, 40])
            .with(|o| o.is_causal = true),
        CaseSpec::new("bwd-n1-past97", [2, 4, 2], [1, 1], [8, 8]).past(97),
        CaseSpec::new("bwd-logits-1e4", [1, 2, 2], [97, 33], [64, 64]).logits(LARGE_LOGITS),
        CaseSpec::new("bwd-empty-rows", [2, 2, 1], [33, 7], [8, 8]).mask(MaskForm::EmptyRows),
        CaseSpec::new(
            "bwd-everything-alibi-temperature",
            [2, 6, 2],
            [7, 33],
            [40, 8],
        )
        .past(7)
        .mask(MaskForm::Float(4))
        .logits(8.0)
        .with(|o| {
            o.is_causal = true;
            o.left_window_size = 9;
            o.right_window_size = 2;
            o.softcap = 4.0;
            o.alibi = true;
            o.temperature = 0.7;
        }),
    ];
    run_backward_cases(&cases, &[KernelPath::Fused, KernelPath::Cpu]);
}

#[test]
fn the_fused_backward_repeats_bit_for_bit() {
    let Some(engine) = common::gpu() else { return };
    let case = CaseSpec::new("bwd-repeat", [1, 4, 2], [97, 97], [64, 64]).with(|o| {
        o.is_causal = true;
        o.softcap = 5.0;
    });
    let oracle = BackwardOracle::new(&case, common::seed()).unwrap();
    let options = AttentionOptions {
        path: KernelPath::Fused,
        ..oracle.options.clone()
    };
    let forward = BackwardInputs {
        y: &oracle.y,
        lse: &oracle.lse,
        dy: &oracle.dy,
    };
    let run = || {
        pollster::block_on(engine.attention_backward_host(
            &oracle.inputs.as_inputs(),
            &options,
            &forward,
            GradientOptions::default(),
        ))
        .unwrap()
    };
    let (first, second) = (run(), run());
    for (name, a, b) in [
        ("dQ", &first.dq, &second.dq),
        ("dK", &first.dk, &second.dk),
        ("dV", &first.dv, &second.dv),
    ] {
        let bits = |t: &HostTensor| t.data().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(a), bits(b), "{name} differs between two runs");
    }
}

#[test]
fn backward_refuses_tensors_of_another_forward_and_what_it_cannot_do() {
    let Some(engine) = common::gpu() else { return };
    let case = CaseSpec::new("bwd-refusals", [1, 2, 1], [7, 9], [8, 4]);
    let oracle = BackwardOracle::new(&case, common::seed()).unwrap();
    let inputs = oracle.inputs.as_inputs();
    let short_dy = HostTensor::new([1, 2, 6, 4], vec![0.0; 48]).unwrap();
    let flat_lse = HostTensor::new([14], vec![0.0; 14]).unwrap();
    let run = |forward: BackwardInputs<'_, HostTensor>, options: &AttentionOptions, grads| {
        pollster::block_on(engine.attention_backward_host(&inputs, options, &forward, grads))
    };
    let fused = AttentionOptions {
        path: KernelPath::Fused,
        ..Default::default()
    };
    let good = BackwardInputs {
        y: &oracle.y,
        lse: &oracle.lse,
        dy: &oracle.dy,
    };
    match run(
        BackwardInputs {
            dy: &short_dy,
            ..good
        },
        &fused,
        GradientOptions::default(),
    ) {
        Err(Error::ShapeMismatch {
            tensor: "dY",
            dim: "sequence length",
            got: 6,
            expected: 7,
            ..
        }) => {}
        other => panic!("a short dY gave {other:?}"),
    }
    match run(
        BackwardInputs {
            lse: &flat_lse,
            ..good
        },
        &fused,
        GradientOptions::default(),
    ) {
        Err(Error::Rank { tensor: "lse", .. }) => {}
        other => panic!("a flat lse gave {other:?}"),
    }
    let unfused = AttentionOptions {
        path: KernelPath::Unfused,
        ..Default::default()
    };
    assert!(matches!(
        run(good, &unfused, GradientOptions::default()),
        Err(Error::Conflict(_))
    ));
    let mask_grad = GradientOptions {
        mask_gradient: true,
    };
    assert!(matches!(
        run(good, &fused, mask_grad),
        Err(Error::Conflict(_))
    ));
    // And the engine still works after the refusals.
    run(good, &fused, GradientOptions::default()).unwrap();
}

/// Non-finite values follow the forward's rule: a NaN in V at a key rows
/// attend makes NaN what it touches, a NaN in K at a key no row attends
/// (past the causal edge) changes nothing, a NaN in dY spoils its row; the
/// fused backward and the oracle agree on every NaN's place.
#[test]
fn non_finite_values_propagate_where_the_forward_propagates_them() {
    let Some(engine) = common::gpu() else { return };
    let case = CaseSpec::new("bwd-nan", [1, 2, 1], [6, 6], [8, 4]).with(|o| o.is_causal = true);
    let mut oracle = BackwardOracle::new(&case, common::seed()).unwrap();
    oracle.inputs.v.data_mut()[2 * 4 + 1] = f32::NAN; // key 2: rows 2.. attend it
    oracle.inputs.k.data_mut()[5 * 8] = f32::NAN; // key 5: only row 5 attends it
    let mut dy = oracle.dy.clone();
    dy.data_mut()[4] = f32::NAN; // head 0, row 1
    let nan_places = |t: &HostTensor| {
        t.data()
            .iter()
            .enumerate()
            .filter(|(_, x)| x.is_nan())
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    };
    let mut results = Vec::new();
    for path in [KernelPath::Oracle, KernelPath::Fused] {
        let options = AttentionOptions {
            path,
            return_lse: true,
            ..oracle.options.clone()
        };
        let inputs = oracle.inputs.as_inputs();
        let out = engine
            .attention_host_blocking(
                &inputs,
                &AttentionOptions {
                    path: KernelPath::Oracle,
                    ..options.clone()
                },
            )
            .unwrap();
        let forward = BackwardInputs {
            y: &out.y,
            lse: out.lse.as_ref().unwrap(),
            dy: &dy,
        };
        let grads = pollster::block_on(engine.attention_backward_host(
            &inputs,
            &options,
            &forward,
            GradientOptions::default(),
        ))
        .unwrap();
        results.push([
            nan_places(&grads.dq),
            nan_places(&grads.dk),
            nan_places(&grads.dv),
        ]);
    }
    assert_eq!(results[0], results[1], "NaN places: oracle against fused");
    let [dq, dk, dv] = &results[0];
    // Row 1 of head 0 (dY NaN) and rows 2.. of both heads (V's NaN) are NaN.
    assert!(dq.contains(&8) && !dq.contains(&0), "dQ NaN rows: {dq:?}");
    // Key 5's K NaN poisons only row 5's scores, which attend keys 0..=5.
    assert!(!dk.is_empty() && !dv.is_empty());
}

/// The multi-head layer's backward on the GPU engine (its attention's
/// backward on the fused kernels, the projections' on the host) against
/// the layer's f64 oracle, every gradient by the tolerance rule.
#[test]
fn the_layers_gradients_on_the_fused_backward_are_within_the_rule() {
    let Some(engine) = common::gpu() else { return };
    let worst = common::check_layer_gradients(engine);
    eprintln!("worst share of the allowed error: {worst:.2}");
}

/// The small attention model of tests/backward.rs learns associative recall
/// on the GPU engine too (its attention forward and backward on the fused
/// kernels): the held-out loss below 0.1 within 100 steps.
#[test]
fn a_small_attention_model_learns_on_the_fused_kernels() {
    use webattn::rng::SplitMix64;
    use webattn::train::{Adam, RecallModel, RecallTask};
    let Some(engine) = common::gpu() else { return };
    let task = RecallTask::default();
    let mut model = RecallModel::new(task, 32, 2, 7).unwrap();
    let held_out = task.batch(&mut SplitMix64::new(99), 256).unwrap();
    let mut rng = SplitMix64::new(11);
    for _ in 0..100 {
        let batch = task.batch(&mut rng, 64).unwrap();
        model
            .train_step_blocking(engine, &batch, &Adam::default())
            .unwrap();
    }
    let after = model.evaluate_blocking(engine, &held_out).unwrap();
    eprintln!("held out after 100 steps: {after:?}");
    assert!(after.loss < 0.1 && after.accuracy > 0.95, "{after:?}");
}
