//! The register-tiled fused kernel's prefetching shapes (`PREFETCH`: each
//! invocation loads its share of the next K or V tile into registers while
//! the current one is multiplied): pinned on the test adapter, the quick
//! sweep's fused cases against the f64 oracle. (The shapes without prefetch
//! run the sweep through `--kernel attention_tiled` in tests/cli.rs.)

mod common;

use webattn::conformance::{sweep, SweepKind};
use webattn::gpu::ops::fused::{FusedKernel, TiledTiles};
use webattn::{Engine, KernelPath};

#[test]
fn prefetching_tiles_agree_with_the_oracle_on_the_quick_sweep() {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let limits = ctx.capabilities().limits;
    // The first two prefetching shapes that fit here (at head dims 64; each
    // call resolves the pinned shape at its own head dims, and runs the
    // limits' choice where the shape has no tile for them).
    let shapes: Vec<TiledTiles> = TiledTiles::candidates(64, 64)
        .into_iter()
        .filter(|t| t.prefetch && t.fits(&limits))
        .take(2)
        .collect();
    assert!(
        !shapes.is_empty(),
        "no prefetching shape fits the test adapter"
    );
    let cases = sweep(SweepKind::Quick);
    for shape in shapes {
        println!("{}", shape.key());
        let pinned = Engine::from_context(
            ctx.clone()
                .with_pinned_fused_kernel(FusedKernel::Tiled(shape)),
        );
        common::run_cases(&pinned, &cases, KernelPath::Fused);
        let compiled = pinned.gpu().unwrap().pipelines().compiled_keys();
        assert!(
            compiled
                .iter()
                .any(|k| k.to_string().starts_with("attention_tiled[")
                    && k.to_string().contains("PREFETCH=1")),
            "no prefetching pipeline compiled: {compiled:?}"
        );
    }
}
