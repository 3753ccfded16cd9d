//! The backward pass on the CPU: the oracle's gradients against finite
//! differences of its own forward.

mod common;

use webattn::conformance::{sweep, CaseInputs, CaseSpec, MaskForm, SweepKind};
use webattn::cpu::{attention_backward_in, RowSource, SumOrder};
use webattn::rng::SplitMix64;
use webattn::{validate, AttentionOptions, BackwardInputs, GradientOptions, HostMask, HostTensor};

/// Inputs on a grid of 2^-10 so that x ± h (h = 2^-7, 2^-8) is exact in f32.
fn on_grid(inputs: &mut CaseInputs) {
    let grid = |x: &mut f32| {
        if x.is_finite() {
            *x = (*x * 1024.0).round() / 1024.0;
        }
    };
    let mut tensors = vec![&mut inputs.q, &mut inputs.k, &mut inputs.v];
    if let Some((pk, pv)) = &mut inputs.past {
        tensors.push(pk);
        tensors.push(pv);
    }
    for t in tensors {
        t.data_mut().iter_mut().for_each(grid);
    }
    if let Some(HostMask::Float(m)) = &mut inputs.mask {
        m.data_mut().iter_mut().for_each(grid);
    }
}

/// Σ dY ∘ Y of the f64 forward: its gradients are the backward's.
fn loss(inputs: &CaseInputs, options: &AttentionOptions, dy: &[f32]) -> f64 {
    let y = webattn::cpu::attention_exact(&inputs.as_inputs(), options)
        .unwrap()
        .y;
    y.iter().zip(dy).map(|(&y, &d)| y * f64::from(d)).sum()
}

/// The derivative of the loss along element `index` of the tensor `pick`
/// chooses: central differences at h and h/2, extrapolated (error O(h⁴)).
fn finite_difference(
    inputs: &CaseInputs,
    options: &AttentionOptions,
    dy: &[f32],
    pick: fn(&mut CaseInputs) -> &mut [f32],
    index: usize,
) -> f64 {
    let central = |h: f32| {
        let at = |delta: f32| {
            let mut moved = inputs.clone();
            pick(&mut moved)[index] += delta;
            loss(&moved, options, dy)
        };
        (at(h) - at(-h)) / (2.0 * f64::from(h))
    };
    let (coarse, fine) = (central(1.0 / 128.0), central(1.0 / 256.0));
    (4.0 * fine - coarse) / 3.0
}

fn check_case(case: &CaseSpec, seed: u64) -> f64 {
    let mut inputs = case.generate(seed).unwrap();
    on_grid(&mut inputs);
    let options = case.options.clone();
    let dims = validate(&inputs.as_inputs(), &options).unwrap();
    let mut rng = SplitMix64::new(seed ^ 0x9e37);
    let dy = rng.normal_vec(dims.y_shape().iter().product(), 1.0);
    let dy_tensor = HostTensor::new(dims.y_shape(), dy.clone()).unwrap();
    let lse = HostTensor::new(
        dims.lse_shape(),
        vec![0.0; dims.lse_shape().iter().product()],
    )
    .unwrap();
    let forward = BackwardInputs {
        y: &dy_tensor,
        lse: &lse,
        dy: &dy_tensor,
    };
    let float_mask = matches!(inputs.mask, Some(HostMask::Float(_)));
    let grads = GradientOptions {
        mask_gradient: float_mask,
    };
    let exact = attention_backward_in::<f64>(
        &inputs.as_inputs(),
        &options,
        &forward,
        grads,
        SumOrder::Sequential,
        RowSource::Recomputed,
    )
    .unwrap();
    let (d_past_k, dk) = exact.key_parts();
    let (d_past_v, dv) = exact.value_parts();
    type Pick = fn(&mut CaseInputs) -> &mut [f32];
    let mut checks: Vec<(&str, Pick, Vec<f64>)> = vec![
        ("dQ", |c| c.q.data_mut(), exact.dq.clone()),
        ("dK", |c| c.k.data_mut(), dk),
        ("dV", |c| c.v.data_mut(), dv),
    ];
    if let (Some(pk), Some(pv)) = (d_past_k, d_past_v) {
        checks.push(("dpast_key", |c| c.past.as_mut().unwrap().0.data_mut(), pk));
        checks.push(("dpast_value", |c| c.past.as_mut().unwrap().1.data_mut(), pv));
    }
    if float_mask {
        checks.push((
            "dmask",
            |c| match c.mask.as_mut() {
                Some(HostMask::Float(m)) => m.data_mut(),
                _ => unreachable!(),
            },
            exact.d_mask.clone(),
        ));
    }
    let mut worst = 0.0f64;
    for (name, pick, analytic) in checks {
        let largest = analytic.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        // A sample of elements, always including the largest gradient.
        let mut indices: Vec<usize> = (0..10).map(|_| rng.below(analytic.len())).collect();
        indices.push(
            (0..analytic.len())
                .max_by(|&a, &b| analytic[a].abs().total_cmp(&analytic[b].abs()))
                .unwrap(),
        );
        for index in indices {
            let fd = finite_difference(&inputs, &options, &dy, pick, index);
            let error = (fd - analytic[index]).abs() / largest.max(1e-12);
            assert!(
                error <= 1e-6,
                "{}: {name}[{index}] is {} by finite differences, {} by the backward \
                 (relative error {error:.2e})",
                case.name,
                fd,
                analytic[index]
            );
            worst = worst.max(error);
        }
    }
    worst
}

/// The sweep's small cases with ordinary logits, and the rules the sweep
/// checks at large logits (softcap, temperature, ALiBi, a float mask)
/// at logits finite differences can follow.
#[test]
fn the_oracles_gradients_match_finite_differences_of_its_forward() {
    let mut cases: Vec<CaseSpec> = sweep(SweepKind::Quick)
        .into_iter()
        .filter(|c| c.logit_scale <= 1.0 && !c.f16 && c.work() <= 200_000)
        .collect();
    cases.push(
        CaseSpec::new("fd-softcap-temperature-alibi", [2, 4, 2], [5, 9], [8, 4])
            .past(3)
            .mask(MaskForm::Float(4))
            .logits(3.0)
            .with(|o| {
                o.softcap = 2.0;
                o.temperature = 0.7;
                o.alibi = true;
                o.is_causal = true;
            }),
    );
    assert!(cases.len() >= 10, "only {} cases", cases.len());
    let mut worst = 0.0f64;
    for (n, case) in cases.iter().enumerate() {
        worst = worst.max(check_case(case, 17 + n as u64));
    }
    eprintln!("{} cases, worst relative error {worst:.2e}", cases.len());
}

/// The CPU backend's backward (blocked products, or the plain f32 backward
/// where an input is not finite) on the quick sweep, against the oracle.
#[test]
fn the_cpu_backends_backward_passes_the_quick_sweep() {
    let engine = webattn::Engine::cpu();
    let mut failed = Vec::new();
    let mut worst = 0.0f64;
    for case in sweep(SweepKind::Quick) {
        for r in pollster::block_on(webattn::conformance::run_backward_case(
            &engine,
            &case,
            &[webattn::KernelPath::Cpu],
            7,
        )) {
            if let Some(rep) = &r.report {
                worst = worst.max(rep.share_of_allowed());
            }
            if !r.passed() {
                failed.push((r.name.clone(), r.failure.clone(), r.report));
            }
        }
    }
    eprintln!("worst share of the allowed error: {worst:.2}");
    assert!(failed.is_empty(), "{failed:#?}");
}

/// The multi-head layer's backward on the CPU backend (its attention's
/// backward blocked, the projections' on the host) against the layer's f64
/// oracle, every gradient by the tolerance rule.
#[test]
fn the_layers_gradients_on_the_cpu_backend_are_within_the_rule() {
    let worst = common::check_layer_gradients(&webattn::Engine::cpu());
    eprintln!("worst share of the allowed error: {worst:.2}");
}

/// The layer oracle's gradients (weights, biases, inputs) against central
/// finite differences of the layer's f64 forward, Σ dOut ∘ Out.
#[test]
fn the_layers_oracle_gradients_match_finite_differences() {
    use webattn::family::mha::{MhaWeights, MultiHeadAttention};
    let mut worst = 0.0f64;
    for case in common::layer_cases() {
        let dims = case.layer.dims();
        let build = |w: MhaWeights| {
            let layer = MultiHeadAttention::new(w, dims.heads, dims.kv_heads).unwrap();
            match case.rope {
                Some(rope) => layer.with_rope(rope).unwrap(),
                None => layer,
            }
        };
        let loss = |layer: &MultiHeadAttention, q: &HostTensor, kv: Option<&HostTensor>| -> f64 {
            let (out, _) = layer.oracle::<f64>(q, kv, &case.options).unwrap();
            out.iter()
                .zip(case.d_output.data())
                .map(|(&o, &d)| o * f64::from(d))
                .sum()
        };
        let exact = case
            .layer
            .backward_exact::<f64>(
                &case.query,
                case.key_value.as_ref(),
                &case.options,
                &case.d_output,
                RowSource::Recomputed,
            )
            .unwrap();
        // Which tensor an entry is in: 0 the query, 1 the key/value input,
        // 2.. the weights in MhaWeights' order.
        let perturbed = |which: usize, index: usize, h: f32| -> (f64, f64) {
            let mut q = case.query.clone();
            let mut kv = case.key_value.clone();
            let mut w = case.layer.weights().clone();
            let slot: &mut f32 = match which {
                0 => &mut q.data_mut()[index],
                1 => &mut kv.as_mut().unwrap().data_mut()[index],
                _ => {
                    let tensors = [
                        Some(&mut w.w_q),
                        w.b_q.as_mut(),
                        Some(&mut w.w_k),
                        w.b_k.as_mut(),
                        Some(&mut w.w_v),
                        w.b_v.as_mut(),
                        Some(&mut w.w_o),
                        w.b_o.as_mut(),
                    ];
                    let t = tensors.into_iter().nth(which - 2).unwrap().unwrap();
                    &mut t.data_mut()[index]
                }
            };
            let old = *slot;
            *slot = old + h;
            let step = f64::from(*slot) - f64::from(old);
            (loss(&build(w), &q, kv.as_ref()), step)
        };
        let derivative = |which: usize, index: usize, h: f32| -> f64 {
            let (up, du) = perturbed(which, index, h);
            let (down, dd) = perturbed(which, index, -h);
            (up - down) / (du - dd)
        };
        let parts: Vec<&Vec<f64>> = [&exact.d_query, &exact.d_key_value]
            .into_iter()
            .chain(exact.weights.iter())
            .collect();
        for (which, grads) in parts.into_iter().enumerate() {
            if grads.is_empty() {
                continue;
            }
            let scale = grads.iter().fold(0.0f64, |m, g| m.max(g.abs()));
            for index in [0, grads.len() / 3, grads.len() / 2 + 1, grads.len() - 1] {
                let h = 1.0 / 256.0;
                // Richardson: central differences at h and h/2 (error O(h⁴)).
                let fd =
                    (4.0 * derivative(which, index, h / 2.0) - derivative(which, index, h)) / 3.0;
                let err = (fd - grads[index]).abs() / scale;
                worst = worst.max(err);
                assert!(
                    err <= 1e-6,
                    "{}: tensor {which} entry {index}: finite difference {fd:e}, oracle {:e}",
                    case.name,
                    grads[index]
                );
            }
        }
    }
    eprintln!("worst error against finite differences (of the largest gradient): {worst:.2e}");
}

/// A layer's backward refuses a dOutput of another shape by name, and the
/// layer refuses inputs that are not its own width.
#[test]
fn the_layers_backward_refuses_a_gradient_of_another_shape() {
    let engine = webattn::Engine::cpu();
    let case = common::layer_cases().remove(0);
    let (_, tape) = case
        .layer
        .forward_train_blocking(&engine, &case.query, None, &case.options)
        .unwrap();
    let wrong = HostTensor::zeros([2, 6, 16]).unwrap();
    let err = case
        .layer
        .backward_blocking(&engine, &tape, &wrong)
        .unwrap_err();
    assert!(err.to_string().contains("d_output"), "{err}");
    let narrow = HostTensor::zeros([2, 7, 8]).unwrap();
    let err = case
        .layer
        .forward_train_blocking(&engine, &narrow, None, &case.options)
        .unwrap_err();
    assert!(err.to_string().contains("query"), "{err}");
}

/// A small attention model learns associative recall from scratch on the
/// CPU backend (forward and backward through the engine): the held-out
/// loss falls from about chance (ln 16 = 2.77) below 0.1 within 150 steps.
#[test]
fn a_small_attention_model_learns_associative_recall() {
    use webattn::train::{Adam, RecallModel, RecallTask};
    let engine = webattn::Engine::cpu();
    let task = RecallTask::default();
    let mut model = RecallModel::new(task, 32, 2, 7).unwrap();
    let held_out = task.batch(&mut SplitMix64::new(99), 256).unwrap();
    let before = model.evaluate_blocking(&engine, &held_out).unwrap();
    let mut rng = SplitMix64::new(11);
    let adam = Adam::default();
    for step in 1..=150 {
        let batch = task.batch(&mut rng, 64).unwrap();
        let stats = model.train_step_blocking(&engine, &batch, &adam).unwrap();
        if step % 50 == 0 {
            eprintln!(
                "step {step}: loss {:.3} accuracy {:.2}",
                stats.loss, stats.accuracy
            );
        }
    }
    let after = model.evaluate_blocking(&engine, &held_out).unwrap();
    eprintln!(
        "held out: loss {:.3} -> {:.3}, accuracy {:.2} -> {:.2}",
        before.loss, after.loss, before.accuracy, after.accuracy
    );
    assert!(before.loss > 2.0, "{before:?}");
    assert!(after.loss < 0.1 && after.accuracy > 0.95, "{after:?}");
}

#[test]
fn the_recall_model_refuses_batches_of_another_task() {
    use webattn::train::{Adam, RecallModel, RecallTask};
    let engine = webattn::Engine::cpu();
    let task = RecallTask::default();
    let bad_task = RecallTask { keys: 4, ..task };
    assert!(bad_task.batch(&mut SplitMix64::new(1), 4).is_err());
    let mut model = RecallModel::new(task, 32, 2, 7).unwrap();
    let good = task.batch(&mut SplitMix64::new(1), 4).unwrap();
    let wider = RecallTask {
        keys: 64,
        values: 64,
        pairs: 12,
    };
    let others = [
        wider.batch(&mut SplitMix64::new(2), 4).unwrap(),
        webattn::train::RecallBatch {
            keys: vec![],
            values: vec![],
            asked: vec![],
        },
        webattn::train::RecallBatch {
            asked: vec![9; 4],
            ..good.clone()
        },
        webattn::train::RecallBatch {
            keys: good.keys[1..].to_vec(),
            ..good.clone()
        },
    ];
    let before = model.evaluate_blocking(&engine, &good).unwrap();
    for batch in &others {
        let refused = model.train_step_blocking(&engine, batch, &Adam::default());
        assert!(refused.is_err(), "{batch:?}");
        assert!(model.evaluate_blocking(&engine, batch).is_err());
        assert!(model.attention_map(batch, 0).is_err());
    }
    assert!(model.attention_map(&good, 4).is_err());
    assert_eq!(model.evaluate_blocking(&engine, &good).unwrap(), before);
}
