//! The register-tiled fused kernel's shapes that only `webattn tune` tries:
//! the prefetching forms (`PREFETCH`: each invocation loads its share of the
//! next K or V tile into registers while the current one is multiplied) and
//! the 8-rows-per-invocation shapes, the shuffle forms
//! (`attention_tiled_shuffle`: row maxima and P by subgroup shuffles) and the
//! chunked forms (`attention_tiled_chunked`: Q, K, V and P tiles in chunks of
//! columns). Each is pinned on the test adapter and
//! runs the quick sweep's fused cases whose head dims it has a tile for,
//! against the f64 oracle. (The measured shapes run the whole sweep through
//! `--kernel attention_tiled` in tests/cli.rs.)

use crate::common;

use webattn::conformance::{sweep, SweepKind};
use webattn::kernels::ablation::Phases;
use webattn::kernels::attention::tiled::SHUFFLE_MIN_TK;
use webattn::kernels::attention::{FusedKernel, TiledTiles};
use webattn::{Engine, KernelLimits, KernelPath};

/// The same shape (rows, keys, grid, prefetch, shuffles) at other head dims.
fn same_shape(a: &TiledTiles, b: &TiledTiles) -> bool {
    (
        a.query_rows,
        a.keys_per_tile,
        a.tq,
        a.tk,
        a.prefetch,
        a.shuffle,
        a.chunked,
    ) == (
        b.query_rows,
        b.keys_per_tile,
        b.tq,
        b.tk,
        b.prefetch,
        b.shuffle,
        b.chunked,
    )
}

/// `shape`'s tile at head dims `dk`, `dv`, where it exists and fits.
fn tile_at(shape: &TiledTiles, dk: usize, dv: usize, limits: &KernelLimits) -> Option<TiledTiles> {
    TiledTiles::candidates(dk, dv)
        .into_iter()
        .find(|t| same_shape(t, shape) && t.fits(limits))
}

/// The tuner-only tiles, the shuffle forms and the chunked forms: one of
/// the three families a run, on a rotation (each family compiles a pipeline
/// per quick case and head dim: on a cold shader cache, 60-90 s of
/// lavapipe's compiler apiece).
#[test]
fn tuner_only_shuffle_and_chunked_forms_agree_with_the_oracle_on_the_quick_sweep() {
    let Some(engine) = common::gpu() else { return };
    match common::rotation("the tiled forms (tuner-only tiles, shuffle, chunked)", 3) {
        0 => tuner_only_tiles(engine),
        1 => shuffle_forms(engine),
        _ => chunked_forms(engine),
    }
}

fn tuner_only_tiles(engine: &Engine) {
    let ctx = engine.gpu().expect("a GPU engine");
    let limits = ctx.capabilities().limits;
    // Every 8-row shape (at head dim 8, where each fits any adapter), and
    // the prefetching forms of the first two measured shapes that fit at
    // head dim 64 and of the first 8-row shape: two of them a run, on a
    // rotation (one 8-row shape, one prefetching form).
    let small = TiledTiles::candidates(8, 8);
    let shapes: Vec<TiledTiles> = small
        .iter()
        .filter(|t| t.is_wide() && !t.prefetch && t.fits(&limits))
        .copied()
        .collect();
    assert_eq!(
        shapes.len(),
        3,
        "the 8-row shapes at head dim 8: {shapes:?}"
    );
    let mut prefetching: Vec<TiledTiles> = TiledTiles::candidates(64, 64)
        .into_iter()
        .filter(|t| t.prefetch && !t.shuffle && !t.chunked && t.fits(&limits))
        .take(2)
        .collect();
    prefetching.extend(
        small
            .iter()
            .find(|t| t.prefetch && !t.shuffle && t.rq() == 8 && t.fits(&limits))
            .copied(),
    );
    assert_eq!(prefetching.len(), 3, "prefetching forms: {prefetching:?}");
    let turn = common::rotation_within("the tuner's tile shapes", 3, 3);
    run_shapes(engine, &[shapes[turn], prefetching[turn]], &limits);
}

fn shuffle_forms(engine: &Engine) {
    let ctx = engine.gpu().expect("a GPU engine");
    let caps = ctx.capabilities();
    // The shuffle forms that run here (at head dim 8, where each shape fits
    // the most adapters): one with and one without prefetch a run, on a
    // rotation through them all.
    let shapes: Vec<TiledTiles> = TiledTiles::candidates(8, 8)
        .into_iter()
        .filter(|t| t.shuffle && t.runs_on(caps))
        .collect();
    if !(caps.subgroups && caps.subgroup_min_size >= SHUFFLE_MIN_TK) {
        println!(
            "no subgroups of 8 lanes on {}: no shuffle form runs",
            caps.adapter.name
        );
        return;
    }
    let (with, without): (Vec<TiledTiles>, Vec<TiledTiles>) =
        shapes.iter().partition(|t| t.prefetch);
    assert!(
        !with.is_empty() && !without.is_empty(),
        "shuffle forms at head dim 8: {shapes:?}"
    );
    let turn = common::rotation_within("the shuffle forms", with.len().max(without.len()), 3);
    let picked = [with[turn % with.len()], without[turn % without.len()]];
    run_shapes(engine, &picked, &caps.limits);
}

fn chunked_forms(engine: &Engine) {
    let ctx = engine.gpu().expect("a GPU engine");
    let limits = ctx.capabilities().limits;
    // The first chunked shapes that fit at head dim 64 (two chunks of
    // columns; the quick sweep's other head dims take the tail of a chunk),
    // without or with prefetch, on a rotation.
    let all = TiledTiles::candidates(64, 64);
    let shapes: Vec<TiledTiles> = [false, true]
        .into_iter()
        .filter_map(|prefetch| {
            all.iter()
                .find(|t| t.chunked && t.prefetch == prefetch && t.fits(&limits))
                .copied()
        })
        .collect();
    assert_eq!(shapes.len(), 2, "chunked forms at head dim 64: {all:?}");
    let turn = common::rotation_within("the chunked forms", 2, 3);
    run_shapes(engine, &shapes[turn..=turn], &limits);
}

/// Pins each of `shapes` in turn and runs the quick sweep's fused cases it
/// has a tile for; each must have compiled its own pipeline.
fn run_shapes(engine: &Engine, shapes: &[TiledTiles], limits: &KernelLimits) {
    let cases = sweep(SweepKind::Quick);
    for &shape in shapes {
        // The cases this shape has a tile for (the others would run the
        // limits' own choice).
        let mine: Vec<_> = cases
            .iter()
            .filter(|c| tile_at(&shape, c.head_dim, c.v_head_dim, limits).is_some())
            .cloned()
            .collect();
        println!(
            "{} ({}): {} cases",
            shape.key(),
            shape.describe(),
            mine.len()
        );
        assert!(!mine.is_empty(), "no quick case fits {shape:?}");
        let pinned = pin_tiled(engine, shape, Phases::NONE);
        common::run_cases(&pinned, &mine, KernelPath::Fused);
        let ran = pinned.gpu().unwrap().pipelines().compiled_keys();
        let (kernel, rq, prefetch) = (
            shape.key().kernel.name(),
            format!("RQ={}", shape.rq()),
            format!("PREFETCH={}", u8::from(shape.prefetch)),
        );
        assert!(
            ran.iter().any(|k| {
                let k = k.to_string();
                k.starts_with(&format!("{kernel}[")) && k.contains(&prefetch) && k.contains(&rq)
            }),
            "{shape:?} did not run: {ran:?}"
        );
    }
}

/// A key whose score is -inf for every row (a -inf in K against positive
/// queries) and whose V holds +inf: its probability is 0, yet each row that
/// attends it still multiplies its V row, so that column is NaN there (0 x
/// inf, as in PyTorch and the f64 oracle), and rows the causal mask keeps
/// from it stay finite. The tiled kernels take their careful product here (a
/// non-finite V in the tile), which re-applies the rows' rules to each key;
/// pinned: the first measured shape, shuffle form and chunked form that run.
#[test]
fn an_attended_key_whose_score_is_neg_inf_still_multiplies_its_v_row() {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let caps = ctx.capabilities();
    let candidates = TiledTiles::candidates(8, 8);
    let shapes: Vec<TiledTiles> = [
        candidates
            .iter()
            .find(|t| t.is_measured() && t.runs_on(caps)),
        candidates
            .iter()
            .find(|t| t.shuffle && !t.prefetch && t.runs_on(caps)),
        candidates
            .iter()
            .find(|t| t.chunked && !t.prefetch && t.runs_on(caps)),
    ]
    .into_iter()
    .flatten()
    .copied()
    .collect();
    assert!(!shapes.is_empty(), "no tiled shape runs here");
    let (rows, keys, d) = (9, 9, 8);
    let mut rng = webattn::rng::SplitMix64::new(common::seed());
    let mut q = rng.normal_vec(2 * rows * d, 1.0);
    for row in 0..2 * rows {
        q[row * d] = 0.5 + q[row * d].abs();
    }
    let mut k = rng.normal_vec(keys * d, 1.0);
    let mut v = rng.normal_vec(keys * d, 1.0);
    k[3 * d] = f32::NEG_INFINITY;
    v[3 * d + 1] = f32::INFINITY;
    let q = webattn::HostTensor::new([1, 2, rows, d], q).unwrap();
    let k = webattn::HostTensor::new([1, 1, keys, d], k).unwrap();
    let v = webattn::HostTensor::new([1, 1, keys, d], v).unwrap();
    let options = webattn::AttentionOptions {
        is_causal: true,
        path: KernelPath::Fused,
        ..Default::default()
    };
    for shape in shapes {
        let pinned = pin_tiled(engine, shape, Phases::NONE);
        let y = pinned
            .attention_host_blocking(&webattn::AttentionInputs::new(&q, &k, &v), &options)
            .unwrap()
            .y;
        for head in 0..2 {
            for row in 0..rows {
                for col in 0..d {
                    let value = y.data()[(head * rows + row) * d + col];
                    let nan_expected = row >= 3 && col == 1;
                    assert_eq!(
                        value.is_nan(),
                        nan_expected,
                        "{}: head {head} row {row} column {col} is {value}",
                        shape.key()
                    );
                    assert!(value.is_nan() || value.is_finite());
                }
            }
        }
    }
}

/// `webattn phases` times the kernels without a phase of their key loop
/// (`Engine::without_phases`); each switch must remove what it names.
/// Without S = Q K^T every score is 0, so each row is the mean of V's rows;
/// without O += P V, or without K and V's loads (V read as zeros), every row
/// is 0; each variant ran a pipeline with its own `ABLATE` bits.
/// The first measured shape, shuffle form and chunked form that run here.
#[test]
fn each_phase_switch_removes_its_phase() {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let caps = ctx.capabilities();
    let candidates = TiledTiles::candidates(8, 8);
    let shapes: Vec<TiledTiles> = [
        candidates
            .iter()
            .find(|t| t.is_measured() && t.runs_on(caps)),
        candidates
            .iter()
            .find(|t| t.shuffle && !t.prefetch && t.runs_on(caps)),
        candidates
            .iter()
            .find(|t| t.chunked && !t.prefetch && t.runs_on(caps)),
    ]
    .into_iter()
    .flatten()
    .copied()
    .collect();
    assert!(!shapes.is_empty(), "no tiled shape runs here");
    let (rows, keys, d) = (37, 45, 8);
    let mut rng = webattn::rng::SplitMix64::new(common::seed());
    let q = webattn::HostTensor::new([1, 2, rows, d], rng.normal_vec(2 * rows * d, 1.0)).unwrap();
    let k = webattn::HostTensor::new([1, 2, keys, d], rng.normal_vec(2 * keys * d, 1.0)).unwrap();
    let v = webattn::HostTensor::new([1, 2, keys, d], rng.normal_vec(2 * keys * d, 1.0)).unwrap();
    let options = webattn::AttentionOptions {
        path: KernelPath::Fused,
        ..Default::default()
    };
    let inputs = webattn::AttentionInputs::new(&q, &k, &v);
    // Each head's mean V row, in f64.
    let mean: Vec<f64> = (0..2 * d)
        .map(|i| {
            let (head, col) = (i / d, i % d);
            (0..keys)
                .map(|j| f64::from(v.data()[(head * keys + j) * d + col]))
                .sum::<f64>()
                / keys as f64
        })
        .collect();
    for shape in shapes {
        let run = |phases: Phases| {
            let variant = pin_tiled(engine, shape, phases);
            let y = variant
                .attention_host_blocking(&inputs, &options)
                .unwrap()
                .y;
            // (The pipeline cache is shared: keys of other shapes are there too.)
            let keys = variant.gpu().unwrap().pipelines().compiled_keys();
            let bits = i64::from(phases.bits());
            assert!(
                phases.is_empty()
                    || keys.iter().any(|k| {
                        k.kernel == shape.key().kernel && k.constants.contains(&("ABLATE", bits))
                    }),
                "{} without {}: {keys:?}",
                shape.key(),
                phases.name()
            );
            y
        };
        let whole = run(Phases::NONE);
        assert!(whole.data().iter().all(|x| x.is_finite()));
        let flat = run(Phases::SCORES);
        for (i, &value) in flat.data().iter().enumerate() {
            let (head, col) = (i / (rows * d), i % d);
            let want = mean[head * d + col];
            assert!(
                (f64::from(value) - want).abs() < 1e-5,
                "{} without S: element {i} is {value}, the mean of V is {want}",
                shape.key()
            );
        }
        for phases in [Phases::PRODUCT, Phases::KV_LOADS] {
            let y = run(phases);
            assert!(
                y.data().iter().all(|&x| x == 0.0),
                "{} without {}: {:?}",
                shape.key(),
                phases.name(),
                &y.data()[..8]
            );
        }
    }
}

/// An engine on `engine`'s device whose fused calls run the tiled kernel at
/// `shape`, without `phases`.
fn pin_tiled(
    engine: &Engine,
    shape: webattn::kernels::attention::TiledTiles,
    phases: Phases,
) -> Engine {
    let form = webattn::plan::planner::tuned_form(&FusedKernel::Tiled(shape));
    common::pinned(engine, |o| {
        o.pinned_fused = form;
        o.removed_phases = phases;
    })
}
