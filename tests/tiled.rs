//! The register-tiled fused kernel's shapes that only `webattn tune` tries:
//! the prefetching forms (`PREFETCH`: each invocation loads its share of the
//! next K or V tile into registers while the current one is multiplied) and
//! the 8-rows-per-invocation shapes, and the shuffle forms
//! (`attention_tiled_shuffle`: row maxima and P by subgroup shuffles). Each
//! is pinned on the test adapter and
//! runs the quick sweep's fused cases whose head dims it has a tile for,
//! against the f64 oracle. (The measured shapes run the whole sweep through
//! `--kernel attention_tiled` in tests/cli.rs.)

mod common;

use webattn::conformance::{sweep, SweepKind};
use webattn::gpu::ops::fused::{FusedKernel, TiledTiles};
use webattn::gpu::ops::tiled::SHUFFLE_MIN_TK;
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
    ) == (
        b.query_rows,
        b.keys_per_tile,
        b.tq,
        b.tk,
        b.prefetch,
        b.shuffle,
    )
}

/// `shape`'s tile at head dims `dk`, `dv`, where it exists and fits.
fn tile_at(shape: &TiledTiles, dk: usize, dv: usize, limits: &KernelLimits) -> Option<TiledTiles> {
    TiledTiles::candidates(dk, dv)
        .into_iter()
        .find(|t| same_shape(t, shape) && t.fits(limits))
}

#[test]
fn tuner_only_tiles_agree_with_the_oracle_on_the_quick_sweep() {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let limits = ctx.capabilities().limits;
    // Every 8-row shape (at head dim 8, where each fits any adapter), and
    // the prefetching forms of the first two measured shapes that fit at
    // head dim 64 and of the first 8-row shape.
    let small = TiledTiles::candidates(8, 8);
    let mut shapes: Vec<TiledTiles> = small
        .iter()
        .filter(|t| !t.prefetch && !t.shuffle && !t.is_measured() && t.fits(&limits))
        .copied()
        .collect();
    assert_eq!(
        shapes.len(),
        3,
        "the 8-row shapes at head dim 8: {shapes:?}"
    );
    shapes.extend(
        TiledTiles::candidates(64, 64)
            .into_iter()
            .filter(|t| t.prefetch && !t.shuffle && t.fits(&limits))
            .take(2),
    );
    shapes.extend(
        small
            .iter()
            .find(|t| t.prefetch && !t.shuffle && t.rq() == 8 && t.fits(&limits))
            .copied(),
    );
    run_shapes(engine, &shapes, &limits);
}

#[test]
fn shuffle_forms_agree_with_the_oracle_on_the_quick_sweep() {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let caps = ctx.capabilities();
    // Every shuffle form that runs here (at head dim 8, where each shape
    // fits the most adapters), with and without prefetch.
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
    assert!(
        shapes.iter().any(|t| t.prefetch) && shapes.iter().any(|t| !t.prefetch),
        "shuffle forms at head dim 8: {shapes:?}"
    );
    run_shapes(engine, &shapes, &caps.limits);
}

/// Pins each of `shapes` in turn and runs the quick sweep's fused cases it
/// has a tile for; each must have compiled its own pipeline.
fn run_shapes(engine: &Engine, shapes: &[TiledTiles], limits: &KernelLimits) {
    let ctx = engine.gpu().expect("a GPU engine");
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
        let pinned = Engine::from_context(
            ctx.clone()
                .with_pinned_fused_kernel(FusedKernel::Tiled(shape)),
        );
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
