//! The GEMM kernel against an f64 oracle: awkward sizes, every transpose
//! combination, alpha/beta, strided batches, shared B matrices (GQA), and more
//! workgroups than one dispatch dimension holds.

use crate::common;

use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::kernels::gemm::{AValues, GemmKernel, GemmSpec, SKINNY_MAX_ROWS};
use webattn::rng::SplitMix64;
use webattn::run::single::{gemm_host_variant, gemm_host_with};

/// Every GEMM kernel this adapter can run on `spec`: the tiled one always,
/// the subgroup one on CPU adapters with fixed subgroups of 4 or 8, the
/// skinny one where op(A) has at most 16 rows.
fn kernels(ctx: &webattn::GpuContext, spec: &GemmSpec) -> Vec<GemmKernel> {
    let mut kernels = vec![GemmKernel::Tiled];
    if let Some(width) = ctx.capabilities().fixed_cpu_subgroup() {
        kernels.push(GemmKernel::Subgroup { width });
    }
    if spec.m <= SKINNY_MAX_ROWS {
        kernels.push(GemmKernel::Skinny);
    }
    kernels
}

fn check(name: &str, spec: &GemmSpec, seed: u64) {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let (a_len, b_len, c_len) = spec.extents();
    let mut rng = SplitMix64::new(seed);
    let a = rng.normal_vec(a_len, 1.0);
    let b = rng.normal_vec(b_len, 1.0);
    let c = rng.normal_vec(c_len, 1.0);
    let exact = common::gemm_reference::<f64>(spec, false, &a, &b, &c);
    let plain = common::gemm_reference::<f32>(spec, false, &a, &b, &c);
    for kernel in kernels(ctx, spec) {
        let got =
            pollster::block_on(gemm_host_with(ctx, kernel, spec, &a, &b, &c)).expect("gemm runs");
        let report = compare(&got, &exact, &plain, DEFAULT_FLOOR);
        println!(
            "{name:<40} {kernel:?}: max_abs {:.3e} allowed {:.3e} (plain f32 {:.3e})",
            report.max_abs, report.allowed, report.baseline_abs
        );
        assert!(report.passed(), "{name} on {kernel:?}: {report:?}");
    }
}

#[test]
fn awkward_sizes_and_transposes() {
    let sizes = [1usize, 7, 33, 97, 257];
    let mut n = 0;
    for (i, &m) in sizes.iter().enumerate() {
        for (j, &nn) in sizes.iter().enumerate() {
            let k = sizes[(i + 2 * j) % sizes.len()];
            let (ta, tb) = ((i + j) % 2 == 1, (i * j) % 2 == 1);
            let spec = GemmSpec::contiguous(1, m, nn, k, ta, tb);
            check(
                &format!("m{m} n{nn} k{k} ta{} tb{}", ta as u8, tb as u8),
                &spec,
                n,
            );
            n += 1;
        }
    }
}

#[test]
fn all_transpose_flags_at_1025() {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let spec = GemmSpec::contiguous(1, 1025, 65, 97, ta, tb);
        check(
            &format!("1025x65x97 ta{} tb{}", ta as u8, tb as u8),
            &spec,
            7,
        );
    }
    check(
        "k1025",
        &GemmSpec::contiguous(1, 9, 9, 1025, false, true),
        8,
    );
}

#[test]
fn alpha_beta_offsets_and_strides() {
    let mut spec = GemmSpec::contiguous(3, 33, 40, 17, false, true);
    spec.alpha = -0.75;
    spec.beta = 0.5;
    check("alpha -0.75 beta 0.5", &spec, 1);

    // Padded leading dimensions, offsets, and gaps between batch entries.
    let spec = GemmSpec {
        batch: 4,
        m: 7,
        n: 13,
        k: 9,
        trans_a: false,
        trans_b: false,
        lda: 11,
        ldb: 16,
        ldc: 20,
        a_offset: 5,
        b_offset: 3,
        c_offset: 2,
        a_stride: 7 * 11 + 4,
        b_stride: 9 * 16 + 1,
        c_stride: 7 * 20 + 6,
        b_batch_base: 0,
        b_batch_div: 1,
        alpha: 1.0,
        beta: 1.0,
    };
    check("strided with offsets", &spec, 2);
}

#[test]
fn shared_b_matrices_for_grouped_heads() {
    // Six query heads read three KV heads (b_batch_div = 2), starting at head 2.
    let mut spec = GemmSpec::contiguous(6, 33, 7, 40, false, true);
    spec.b_batch_base = 2;
    spec.b_batch_div = 2;
    check("gqa b_batch_div 2 base 2", &spec, 3);
}

#[test]
fn more_workgroups_than_one_dimension_holds() {
    // 70,000 one-tile matrices: the dispatch is folded into a 2D grid.
    check(
        "70000 batches",
        &GemmSpec::contiguous(70_000, 2, 3, 2, false, false),
        4,
    );
}

#[test]
fn k_longer_than_a_loop_capped_driver_allows() {
    // llvmpipe stops an invocation's loops after ~65k iterations; a long K is
    // split into accumulating passes there, and must still be exact elsewhere.
    check(
        "k 100000",
        &GemmSpec::contiguous(1, 2, 3, 100_000, false, true),
        9,
    );
    check(
        "k 70001 beta 1",
        &GemmSpec {
            beta: 1.0,
            ..GemmSpec::contiguous(2, 5, 7, 70_001, false, false)
        },
        10,
    );
}

/// Products of at most 16 rows (a decoder step's), where the skinny kernel
/// runs: every height its pipelines hold and some between, each transpose,
/// columns and K that fill no workgroup evenly, alpha and beta, and B shared
/// by grouped heads from an offset head, as the unfused path decodes.
#[test]
fn skinny_products_of_every_height() {
    let flags = [(false, true), (false, false), (true, false), (true, true)];
    for (i, m) in [1usize, 2, 3, 5, 8, 13, 16].into_iter().enumerate() {
        let all = m == 1 || m == 16;
        for (j, &(ta, tb)) in flags.iter().enumerate() {
            if !all && j != i % flags.len() {
                continue;
            }
            let spec = GemmSpec {
                alpha: 0.75,
                beta: if j == 1 { 0.5 } else { 0.0 },
                ..GemmSpec::contiguous(3, m, 97, 257, ta, tb)
            };
            let name = format!("skinny m{m} ta{} tb{}", ta as u8, tb as u8);
            check(&name, &spec, 100 + (i * 4 + j) as u64);
        }
    }
    let mut gqa = GemmSpec::contiguous(6, 1, 1025, 7, false, true);
    gqa.b_batch_base = 2;
    gqa.b_batch_div = 3;
    check("skinny gqa m1 n1025 k7", &gqa, 130);
    let mut long = GemmSpec::contiguous(2, 4, 33, 1025, false, false);
    long.b_batch_div = 2;
    check("skinny m4 k1025 shared B", &long, 131);
}

/// Attention's `P · V` on every GEMM kernel here: a term whose A is the mark
/// `-0` (a key not attended) adds nothing whatever B holds, while `+0` (an
/// attended key whose probability underflowed) and tiny values still
/// multiply their rows of B, so NaN and infinities there reach the result.
#[test]
fn marked_terms_of_a_are_skipped_and_zeros_are_not() {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    // Tall products, and a decoder step's few rows (the skinny kernel's).
    for m in [37, 5] {
        marks_case(ctx, m);
    }
}

fn marks_case(ctx: &webattn::GpuContext, m: usize) {
    let spec = GemmSpec::contiguous(2, m, 21, 70, false, false);
    let (a_len, b_len, c_len) = spec.extents();
    let mut rng = SplitMix64::new(common::seed());
    let mut a: Vec<f32> = rng
        .normal_vec(a_len, 1.0)
        .into_iter()
        .enumerate()
        .map(|(i, x)| match i % 7 {
            0 | 3 => -0.0,
            5 => 0.0,
            1 => x.abs() * 1e-30,
            _ => (x.abs() / 4.0).min(1.0),
        })
        .collect();
    let mut b = rng.normal_vec(b_len, 1.0);
    let c = vec![0.0; c_len];
    let (k, n) = (spec.k, spec.n);
    // In both batches' B, key 6 holds NaN in column 3, keys 9 and 40
    // infinities in columns 0 and 5, key 12 a huge finite value in column 7.
    for b in b.chunks_mut(k * n) {
        b[6 * n + 3] = f32::NAN;
        b[9 * n] = f32::INFINITY;
        b[40 * n + 5] = f32::NEG_INFINITY;
        b[12 * n + 7] = 3.0e38;
    }
    // Batch 1: no row attends keys 9 and 40; row 3 attends key 6 with +0.
    for row in 0..spec.m {
        a[spec.m * k + row * k + 9] = -0.0;
        a[spec.m * k + row * k + 40] = -0.0;
    }
    a[spec.m * k + 3 * k + 6] = 0.0;
    // Row 4 does not attend key 6: its column 3 stays finite.
    a[spec.m * k + 4 * k + 6] = -0.0;
    let exact = common::gemm_reference::<f64>(&spec, true, &a, &b, &c);
    let plain = common::gemm_reference::<f32>(&spec, true, &a, &b, &c);
    assert!(
        exact[spec.m * n + 3 * n + 3].is_nan(),
        "the test's own premise"
    );
    assert!(
        exact[spec.m * n + 4 * n + 3].is_finite(),
        "the test's own premise"
    );
    for kernel in kernels(ctx, &spec) {
        for a_values in [AValues::MarksSkipped, AValues::Probabilities] {
            let got =
                pollster::block_on(gemm_host_variant(ctx, kernel, &spec, a_values, &a, &b, &c))
                    .expect("gemm runs");
            let report = compare(&got, &exact, &plain, DEFAULT_FLOOR);
            println!(
                "marks {kernel:?} {a_values:?}: max_abs {:.3e} allowed {:.3e} (plain f32 {:.3e})",
                report.max_abs, report.allowed, report.baseline_abs
            );
            for (i, (g, e)) in got.iter().zip(&exact).enumerate() {
                assert_eq!(
                    g.is_nan(),
                    e.is_nan(),
                    "{kernel:?} {a_values:?}: C[{i}] is {g}, the oracle's {e}"
                );
            }
            assert!(report.passed(), "{kernel:?} {a_values:?}: {report:?}");
        }
    }
}

/// A matrix-unit kernel at a configuration the adapter does not offer (16x16
/// at subgroups of 32 on lavapipe, which lists none or 8x8) is a typed error
/// naming it, staged or packed, and never reaches the device.
#[test]
fn matrix_unit_kernels_the_adapter_does_not_offer_are_refused() {
    use webattn::kernels::gemm::{CoopShape, PackedTile};
    use webattn::kernels::matrix_units::CoopSize;
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let shape = CoopShape {
        size: CoopSize::Sixteen,
        subgroup: 32,
    };
    if ctx.capabilities().f16_matrix_units() == Some((16, 32)) {
        println!(
            "{} offers 16x16 at 32 lanes: nothing to refuse",
            engine.describe()
        );
        return;
    }
    let spec = GemmSpec::contiguous(1, 32, 32, 32, false, false);
    let (a_len, b_len, c_len) = spec.extents();
    let (a, b, c) = (vec![1.0; a_len], vec![1.0; b_len], vec![0.0; c_len]);
    for kernel in [
        GemmKernel::Coop(shape),
        GemmKernel::CoopPacked {
            shape,
            tile: PackedTile::DEFAULT,
        },
    ] {
        let got = pollster::block_on(gemm_host_variant(
            ctx,
            kernel,
            &spec,
            AValues::Any,
            &a,
            &b,
            &c,
        ));
        match got {
            Err(webattn::Error::InvalidOption { name, reason, .. }) => {
                assert_eq!(name, "gemm kernel");
                assert!(reason.contains("matrix-unit"), "{reason}");
            }
            other => panic!("{kernel:?}: {other:?}"),
        }
    }
}
