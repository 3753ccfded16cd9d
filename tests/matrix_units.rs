//! The matrix-unit (cooperative-matrix) kernels against the f64 oracle, by
//! the f16 rule: operands rounded to f16 first, then at most twice a plain f32
//! computation's error on them (plus, in attention, the rounding of the
//! probabilities, `Precision::Fast`'s own).
//!
//! They need an adapter with cooperative matrices. Where this process's
//! adapter has none (lavapipe from Debian 12, every machine without a recent
//! GPU driver), each test runs itself again under the lavapipe of
//! `.ci/lavapipe-coop` (Mesa 26, 8x8x8 f16 -> f32 at subgroups of 8), which
//! `bash .ci/setup --coop` installs. With `WEBATTN_REQUIRE_GPU=1` (CI) a
//! missing install fails the tests rather than skipping them.
//!
//! The 16x16 kernels, which GPUs get (NVIDIA lists 16x16x16 f16 -> f32), run
//! there too: that lavapipe executes 16x16 matrices though it lists only 8x8,
//! and `MatrixUnits::Emulated16` lists them for it. An adapter that lists
//! 16x16 itself runs them as it is.

mod common;

use std::process::Command;

use webattn::conformance::{compare, run_case, run_sweep, CaseSpec, SweepKind, DEFAULT_FLOOR};
use webattn::kernels::gemm::{
    kernel_for as gemm_kernel_for, AValues, GemmKernel, GemmSpec, PackedTile,
};
use webattn::kernels::matrix_units::coop_shape;
use webattn::kernels::matrix_units::CoopSize;
use webattn::plan::overrides::Overrides;
use webattn::rng::SplitMix64;
use webattn::run::single::gemm_host_variant;
use webattn::{
    AttentionOptions, Engine, EngineOptions, Error, FusedKernelChoice, HostTensor, KernelPath,
    MatrixUnits, Precision,
};

/// Set in the process a test starts under `.ci/lavapipe-coop`.
const CHILD: &str = "WEBATTN_MATRIX_UNITS_CHILD";

/// The matrix-unit size a test runs on.
#[derive(Clone, Copy)]
enum Size {
    /// The configuration the planner picks on the adapter (8 on lavapipe).
    Native,
    /// 16x16x16 f16 -> f32: listed by the adapter, or emulated on lavapipe.
    Sixteen,
}

/// An engine on `engine`'s adapter whose matrix units are `size`: `engine`
/// itself (`Ok(None)`), or a new one with `MatrixUnits::Emulated16` on a CPU
/// adapter that lists only 8x8; `Err` (the test is skipped) on a GPU that
/// lists no 16x16.
fn engine_at(engine: &Engine, size: Size) -> Result<Option<Engine>, String> {
    let caps = engine.gpu().expect("a GPU engine").capabilities();
    let listed = coop_shape(caps).map(|s| s.size);
    match size {
        Size::Sixteen if listed != Some(CoopSize::Sixteen) => {
            if caps.adapter.device_type != "Cpu" {
                return Err(format!("{} lists no 16x16 matrix units", engine.describe()));
            }
            let emulated = Engine::with_options_blocking(EngineOptions {
                matrix_units: MatrixUnits::Emulated16,
                tuning_cache: webattn::tuning::TuningCache::Memory,
                ..Default::default()
            })
            .expect("lavapipe runs 16x16 matrices as MatrixUnits::Emulated16");
            Ok(Some(emulated))
        }
        _ => Ok(None),
    }
}

/// Runs `checks` on an engine whose adapter has matrix units of `size`: this
/// process's, or a child's under `.ci/lavapipe-coop` running the test named
/// `test`.
fn on_matrix_units(test: &str, size: Size, checks: impl FnOnce(&Engine)) {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    if coop_shape(ctx.capabilities()).is_some() {
        let own = match engine_at(engine, size) {
            Ok(own) => own,
            Err(why) => {
                eprintln!("SKIPPING {test}: {why}");
                return;
            }
        };
        let engine = own.as_ref().unwrap_or(engine);
        let shape = coop_shape(engine.gpu().expect("a GPU engine").capabilities());
        println!("matrix units {shape:?} on {}", engine.describe());
        checks(engine);
        return;
    }
    assert!(
        std::env::var_os(CHILD).is_none(),
        "the adapter under .ci/lavapipe-coop offers no matrix units: {}",
        engine.describe()
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/lavapipe-coop");
    let installed = Command::new("bash")
        .args([script, "prefix"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !installed {
        let why = format!(
            "{} has no matrix units and .ci/lavapipe-coop is not installed \
             (bash .ci/setup --coop installs it)",
            engine.describe()
        );
        if std::env::var("WEBATTN_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            panic!("WEBATTN_REQUIRE_GPU=1: {why}");
        }
        eprintln!("SKIPPING {test}: {why}");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new("bash")
        .arg(script)
        .arg("run")
        .arg(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .output()
        .expect("the test runs under .ci/lavapipe-coop");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{test} failed under .ci/lavapipe-coop"
    );
    // The child ran the test (a filter that matched nothing would pass too).
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("test result: ok. 1 passed"),
        "{test} did not run under .ci/lavapipe-coop"
    );
}

/// `x` rounded to the nearest f16, as f32.
fn f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// A value of A as the matrix units multiply it: rounded to f16, except a
/// value f16 flushes to zero, which counts as itself (the kernel multiplies
/// it as stored where it matters: against a NaN or an infinity).
fn a_operand(x: f32) -> f32 {
    if f16(x) == 0.0 {
        x
    } else {
        f16(x)
    }
}

/// The matrix-unit GEMM against the oracle on the f16 operands it
/// multiplies. `a` and `b` are rounded to f16 here (so the kernel's own
/// rounding, whose mode WGSL leaves open, is exact), except values of A that
/// f16 flushes to zero: those stay, as the marks of terms that must not be
/// skipped.
fn check_gemm(
    engine: &Engine,
    kernel: GemmKernel,
    name: &str,
    spec: &GemmSpec,
    a_values: AValues,
    [a, b, c]: [&[f32]; 3],
) {
    let ctx = engine.gpu().expect("a GPU engine");
    let a: Vec<f32> = a.iter().map(|&x| a_operand(x)).collect();
    let b: Vec<f32> = b.iter().map(|&x| f16(x)).collect();
    let skip = a_values.skips_marks();
    let exact = common::gemm_reference::<f64>(spec, skip, &a, &b, c);
    let plain = common::gemm_reference::<f32>(spec, skip, &a, &b, c);
    let got = pollster::block_on(gemm_host_variant(ctx, kernel, spec, a_values, &a, &b, c))
        .expect("the matrix-unit GEMM runs");
    let report = compare(&got, &exact, &plain, DEFAULT_FLOOR);
    println!(
        "{name:<36} max_abs {:.3e} allowed {:.3e} (plain f32 {:.3e})",
        report.max_abs, report.allowed, report.baseline_abs
    );
    if !report.passed() {
        for (i, (g, e)) in got.iter().zip(&exact).enumerate() {
            if g.is_finite() != e.is_finite() || (g.is_nan() != e.is_nan()) {
                println!("  C[{i}]: got {g}, the oracle {e}");
            }
        }
    }
    assert!(report.passed(), "{name}: {report:?}");
}

fn random(spec: &GemmSpec, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (a_len, b_len, c_len) = spec.extents();
    let mut rng = SplitMix64::new(seed);
    (
        rng.normal_vec(a_len, 1.0),
        rng.normal_vec(b_len, 1.0),
        rng.normal_vec(c_len, 1.0),
    )
}

#[test]
fn gemm_on_the_matrix_units() {
    on_matrix_units("gemm_on_the_matrix_units", Size::Native, gemm_cases);
}

#[test]
fn gemm_on_16x16_matrix_units() {
    on_matrix_units("gemm_on_16x16_matrix_units", Size::Sixteen, gemm_cases);
}

/// The staged matrix-unit GEMM (`gemm_coop`) on `engine`'s matrix units.
fn staged(engine: &Engine) -> GemmKernel {
    GemmKernel::Coop(
        coop_shape(engine.gpu().expect("a GPU engine").capabilities()).expect("matrix units"),
    )
}

/// The GEMM at sizes that are not tile multiples, every transpose, alpha
/// and beta, strides and offsets, B shared by grouped heads, a long K.
fn gemm_cases(engine: &Engine) {
    gemm_cases_only(engine, staged(engine));
    // On Vulkan the matrix-unit kernels reach the driver as the engine's own
    // SPIR-V (device::spirv: naga's leaves workgroup memory private under the
    // Vulkan memory model, and NVIDIA computed garbage from it).
    let ctx = engine.gpu().expect("a GPU engine");
    if ctx.capabilities().adapter.backend == "Vulkan" {
        let own = ctx.pipelines().own_spirv_keys();
        assert!(
            own.iter().any(|k| k.kernel.uses_coop()),
            "no matrix-unit pipeline was built from the engine's SPIR-V: {own:?}"
        );
        assert!(own.iter().all(|k| k.kernel.uses_coop()), "{own:?}");
    }
}

/// The packed matrix-unit GEMM (`gemm_coop_packed`) at `tile`.
fn packed(engine: &Engine, tile: PackedTile) -> GemmKernel {
    let GemmKernel::Coop(shape) = staged(engine) else {
        unreachable!()
    };
    GemmKernel::CoopPacked { shape, tile }
}

#[test]
fn packed_gemm_on_the_matrix_units() {
    on_matrix_units(
        "packed_gemm_on_the_matrix_units",
        Size::Native,
        packed_gemm_cases,
    );
}

#[test]
fn packed_gemm_on_16x16_matrix_units() {
    on_matrix_units(
        "packed_gemm_on_16x16_matrix_units",
        Size::Sixteen,
        packed_gemm_cases,
    );
}

/// The staged kernel's cases through the packed one (its shape cases only
/// at the larger tiles `webattn bench` measures), each run by the packed
/// kernel itself (not handed to the staged one); products with marks to
/// skip go to the staged kernel.
fn packed_gemm_cases(engine: &Engine) {
    let ctx = engine.gpu().expect("a GPU engine");
    for tile in PackedTile::CANDIDATES {
        println!("tile {tile:?}");
        if tile == PackedTile::DEFAULT {
            gemm_cases_only(engine, packed(engine, tile));
        } else {
            gemm_shape_cases(engine, packed(engine, tile));
        }
        let key = format!("RM={},RN={}", tile.rows, tile.cols);
        let compiled = ctx.pipelines().compiled_keys();
        assert!(
            compiled
                .iter()
                .any(|k| k.kernel.name().starts_with("gemm_coop_packed")
                    && k.to_string().contains(&key)),
            "the packed kernel at {tile:?} never ran: {compiled:?}"
        );
    }
    let spec = GemmSpec::contiguous(1, 8, 8, 8, false, false);
    assert_eq!(
        gemm_kernel_for(
            ctx.capabilities(),
            packed(engine, PackedTile::DEFAULT),
            &spec,
            AValues::Probabilities
        ),
        staged(engine),
        "P V's marks go to the staged kernel"
    );
}

/// Sizes that are not tile multiples (1, 7, 33, 97, 257, 130 x 65 x 97) at
/// every transpose.
fn gemm_shape_cases(engine: &Engine, kernel: GemmKernel) {
    let sizes = [1usize, 7, 33, 97, 257];
    let mut seed = 0;
    for (i, &m) in sizes.iter().enumerate() {
        for (j, &n) in sizes.iter().enumerate() {
            let k = sizes[(i + 2 * j) % sizes.len()];
            let (ta, tb) = ((i + j) % 2 == 1, (i * j) % 2 == 1);
            let spec = GemmSpec::contiguous(1, m, n, k, ta, tb);
            let (a, b, c) = random(&spec, seed);
            let name = format!("m{m} n{n} k{k} ta{} tb{}", ta as u8, tb as u8);
            check_gemm(engine, kernel, &name, &spec, AValues::Any, [&a, &b, &c]);
            seed += 1;
        }
    }
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let spec = GemmSpec::contiguous(1, 130, 65, 97, ta, tb);
        let (a, b, c) = random(&spec, seed);
        let name = format!("130x65x97 ta{} tb{}", ta as u8, tb as u8);
        check_gemm(engine, kernel, &name, &spec, AValues::Any, [&a, &b, &c]);
    }
}

/// [`gemm_shape_cases`], then leading dimensions, offsets and strides,
/// alpha and beta, B shared by grouped heads and a long K.
fn gemm_cases_only(engine: &Engine, kernel: GemmKernel) {
    gemm_shape_cases(engine, kernel);
    let seed = 100;
    // Leading dimensions that are multiples of 4: the kernel reads vec4s,
    // element by element only at the matrices' edges (in the padded case
    // after these, K = 101 leaves a vec4 straddling the end of each row of A).
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let spec = GemmSpec::contiguous(1, 68, 132, 100, ta, tb);
        let (a, b, c) = random(&spec, seed);
        let name = format!("68x132x100 (vec4 reads) ta{} tb{}", ta as u8, tb as u8);
        check_gemm(engine, kernel, &name, &spec, AValues::Any, [&a, &b, &c]);
    }
    let spec = GemmSpec {
        batch: 2,
        m: 37,
        n: 70,
        k: 101,
        trans_a: false,
        trans_b: false,
        lda: 104,
        ldb: 72,
        ldc: 70,
        a_offset: 8,
        b_offset: 4,
        c_offset: 0,
        a_stride: 37 * 104 + 4,
        b_stride: 101 * 72,
        c_stride: 37 * 70,
        b_batch_base: 0,
        b_batch_div: 1,
        alpha: 1.0,
        beta: 0.0,
    };
    let (a, b, c) = random(&spec, 3);
    check_gemm(
        engine,
        kernel,
        "vec4 reads with padded rows",
        &spec,
        AValues::Any,
        [&a, &b, &c],
    );
    // alpha and beta, then padded leading dimensions, offsets and gaps
    // between batch entries, then B shared by grouped heads.
    let spec = GemmSpec {
        alpha: -0.75,
        beta: 0.5,
        ..GemmSpec::contiguous(3, 33, 40, 17, false, true)
    };
    let (a, b, c) = random(&spec, 1);
    check_gemm(
        engine,
        kernel,
        "alpha -0.75 beta 0.5",
        &spec,
        AValues::Any,
        [&a, &b, &c],
    );
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
    let (a, b, c) = random(&spec, 2);
    check_gemm(
        engine,
        kernel,
        "strided with offsets",
        &spec,
        AValues::Any,
        [&a, &b, &c],
    );
    let spec = GemmSpec {
        b_batch_base: 2,
        b_batch_div: 2,
        ..GemmSpec::contiguous(6, 33, 7, 40, false, true)
    };
    let (a, b, c) = random(&spec, 3);
    check_gemm(
        engine,
        kernel,
        "gqa b_batch_div 2 base 2",
        &spec,
        AValues::Any,
        [&a, &b, &c],
    );
    // A K long enough to need several passes on a loop-capped driver.
    let spec = GemmSpec::contiguous(2, 5, 7, 100_000, false, false);
    let (a, b, c) = random(&spec, 4);
    check_gemm(
        engine,
        kernel,
        "k 100000",
        &spec,
        AValues::Any,
        [&a, &b, &c],
    );
}

#[test]
fn gemm_on_the_matrix_units_skips_marks_of_a_against_non_finite_b() {
    on_matrix_units(
        "gemm_on_the_matrix_units_skips_marks_of_a_against_non_finite_b",
        Size::Native,
        mark_skipping_cases,
    );
}

#[test]
fn gemm_on_16x16_matrix_units_skips_marks_of_a_against_non_finite_b() {
    on_matrix_units(
        "gemm_on_16x16_matrix_units_skips_marks_of_a_against_non_finite_b",
        Size::Sixteen,
        mark_skipping_cases,
    );
}

/// Marks (-0) and zeros of A against NaN and infinities of B, probabilities f16 flushes.
fn mark_skipping_cases(engine: &Engine) {
    let kernel = staged(engine);
    // P V: rows of A are probabilities, some -0 (keys not attended),
    // some +0 (attended keys whose probability underflowed: they still
    // multiply their rows of B), some tiny (f16 subnormals; staged times
    // 2^14 they keep their bits), two 1.5e-38 (attended keys whose
    // probabilities underflow f16: they still multiply their rows of B);
    // B holds NaN and infinities.
    let spec = GemmSpec::contiguous(2, 37, 21, 70, false, false);
    let (mut a, mut b, c) = random(&spec, 5);
    for (i, x) in a.iter_mut().enumerate() {
        *x = match i % 7 {
            0 | 3 => -0.0,
            5 => 0.0,
            1 => x.abs() * 1e-6,
            _ => (x.abs() / 4.0).min(1.0),
        };
    }
    let (k, n) = (spec.k, spec.n);
    // Column 3 of key 6 is NaN: every row whose A at key 6 is not 0
    // gets NaN there. Keys 9 and 40 are infinite in columns 0 and 5.
    b[6 * n + 3] = f32::NAN;
    b[9 * n] = f32::INFINITY;
    b[40 * n + 5] = f32::NEG_INFINITY;
    // Rows 1 and 2 of batch 0 attend keys 6 (NaN) and 9 (+inf) with
    // probabilities f16 flushes to 0: NaN and +inf there.
    a[k + 6] = 1.5e-38;
    a[2 * k + 9] = 1.5e-38;
    // Keys 9 and 40 are not attended (-0) in every row of batch 1; row 3
    // of batch 1 attends key 6 (NaN) with probability +0: NaN there.
    for row in 0..spec.m {
        a[spec.m * k + row * k + 9] = -0.0;
        a[spec.m * k + row * k + 40] = -0.0;
    }
    a[spec.m * k + 3 * k + 6] = 0.0;
    check_gemm(
        engine,
        kernel,
        "probabilities, NaN and inf in B",
        &spec,
        AValues::Probabilities,
        [&a, &b, &c],
    );
    // Marks skipped for any A (not probabilities: no scaling); +0 is not
    // a mark.
    let (mut a, _, _) = random(&spec, 6);
    for (i, x) in a.iter_mut().enumerate().step_by(3) {
        *x = if i % 2 == 0 { -0.0 } else { 0.0 };
    }
    a[k + 6] = 1.5e-38;
    check_gemm(
        engine,
        kernel,
        "marks of A skipped, NaN and inf in B",
        &spec,
        AValues::MarksSkipped,
        [&a, &b, &c],
    );
}

#[test]
fn attention_with_fast_precision_on_the_matrix_units() {
    on_matrix_units(
        "attention_with_fast_precision_on_the_matrix_units",
        Size::Native,
        |engine| sweep_through_the_matrix_units(engine, SweepKind::Full, CoopSize::Eight),
    );
}

/// A third of the quick sweep through the 16x16 kernels, on a rotation (the
/// full one runs at the native size; `webattn --matrix-units emulated16 --precision fast check
/// --full` runs it at 16 under `.ci/lavapipe-coop`).
#[test]
fn attention_with_fast_precision_on_16x16_matrix_units() {
    on_matrix_units(
        "attention_with_fast_precision_on_16x16_matrix_units",
        Size::Sixteen,
        |engine| sweep_through_the_matrix_units(engine, SweepKind::Quick, CoopSize::Sixteen),
    );
}

/// The matrix-unit kernel with each row's scalar steps (the rules, the
/// maxima, P, the sums) shared among 2 and 4 invocations, as on GPUs whose
/// subgroups are wider than the matrices (an NVIDIA GPU's 32 lanes over 16
/// rows: 2): lavapipe's 8 lanes over 8 rows share none by default, so here
/// each invocation takes several (row, part) pairs. The quick sweep at `Fast`
/// through the 8x8 kernels (the share is the same code at 16x16, whose
/// emulation on lavapipe compiles 5 times slower) in one form a run, on a rotation: packed (the
/// default) at 2 lanes per row, shared (`attention_coop_shared`: packed K
/// and V copied into workgroup memory tile by tile) at 4, staged
/// (`attention_coop_staged`: K and V through workgroup memory) at 2. (The
/// forms share the scalar steps; `webattn --precision fast --kernel
/// attention_coop_shared check --full` under `.ci/lavapipe-coop` runs the
/// shared form at one lane per row.)
#[test]
fn attention_on_the_matrix_units_with_rows_shared_among_invocations() {
    on_matrix_units(
        "attention_on_the_matrix_units_with_rows_shared_among_invocations",
        Size::Native,
        |engine| {
            let forms = [
                (2, FusedKernelChoice::Coop),
                (4, FusedKernelChoice::CoopShared),
                (2, FusedKernelChoice::CoopStaged),
            ];
            // One form a run (each compiles its own pipelines: a minute of
            // lavapipe's compiler on a cold shader cache).
            let turn = common::rotation("the forms sharing rows", forms.len());
            for (lanes, form) in forms.into_iter().skip(turn).take(1) {
                let shared = engine
                    .sharing_device()
                    .expect("a GPU engine")
                    .with_overrides(Overrides {
                        coop_lanes_per_row: Some(lanes),
                        ..*engine.overrides()
                    })
                    .with_fused_kernel(form)
                    .expect("the matrix-unit kernel");
                let report = pollster::block_on(run_sweep(
                    &shared,
                    SweepKind::Quick,
                    "",
                    common::seed(),
                    Precision::Fast,
                    common::print_result,
                ));
                println!(
                    "{lanes} lanes per row, {}: {}",
                    form.name(),
                    report.summary_line()
                );
                assert_eq!(report.failed(), 0, "{}", report.table());
                let keys: Vec<String> = shared
                    .gpu()
                    .unwrap()
                    .pipelines()
                    .compiled_keys()
                    .into_iter()
                    .map(|k| k.to_string())
                    .filter(|k| k.starts_with("attention_coop"))
                    .collect();
                // (The packed kernel's name is attention_coop_packed8, the
                // staged one's attention_coop8.)
                let kernel = match form {
                    FusedKernelChoice::Coop => "attention_coop_packed8[",
                    FusedKernelChoice::CoopShared => "attention_coop_shared8[",
                    _ => "attention_coop8[",
                };
                assert!(
                    keys.iter()
                        .any(|k| k.contains(&format!("LPR={lanes},")) && k.starts_with(kernel)),
                    "no {} pipeline with {lanes} lanes per row: {keys:?}",
                    form.name()
                );
            }
        },
    );
}

/// The sweep at `Fast` on `engine`, which must pass and must have multiplied
/// on `size` matrices on both paths (any size where the adapter lists
/// another natively than lavapipe's 8).
/// The sweep of `kind` at `Fast` through the matrix units: the full one as
/// the quick cases and a third of the others, on a rotation (all of it:
/// `webattn --precision fast check --full` under `.ci/lavapipe-coop`).
fn sweep_through_the_matrix_units(engine: &Engine, kind: SweepKind, size: CoopSize) {
    let quick = webattn::conformance::sweep(SweepKind::Quick);
    let mut cases = webattn::conformance::sweep(kind);
    if kind == SweepKind::Full {
        let turn = common::rotation("a third of the full sweep's extra cases", 3);
        let extra: Vec<_> = cases.split_off(quick.len());
        cases.extend(extra.into_iter().skip(turn).step_by(3));
    } else if size == CoopSize::Sixteen {
        // The 16x16 emulation compiles five times slower than the 8x8 one
        // (six minutes of lavapipe's compiler for the quick sweep on a cold
        // shader cache): a third of the quick cases a run, on a rotation.
        let turn = common::rotation("a third of the quick cases at 16x16", 3);
        cases = cases.into_iter().skip(turn).step_by(3).collect();
    }
    let report = pollster::block_on(webattn::conformance::run_sweep_of(
        engine,
        (kind, cases),
        "",
        common::seed(),
        Precision::Fast,
        common::print_result,
    ));
    println!("{}", report.summary_line());
    println!(
        "worst share of the allowance: {:.3}",
        report.worst_share_of_allowed()
    );
    assert_eq!(report.failed(), 0, "{}", report.table());
    let used: Vec<String> = engine
        .gpu()
        .expect("a GPU engine")
        .pipelines()
        .compiled_keys()
        .into_iter()
        .filter(|key| key.kernel.uses_coop())
        .map(|key| key.to_string())
        .collect();
    println!("matrix-unit pipelines: {used:?}");
    assert!(
        used.iter().any(|k| k.starts_with("gemm_coop")),
        "the unfused path did not multiply on the matrix units: {used:?}"
    );
    assert!(
        used.iter().any(|k| k.starts_with("attention_coop")),
        "the fused path did not multiply on the matrix units: {used:?}"
    );
    let shape = coop_shape(engine.gpu().expect("a GPU engine").capabilities());
    if shape.is_some_and(|s| s.size == size) {
        let n = size.dim();
        for kernel in ["gemm_coop", "attention_coop_packed"] {
            assert!(
                used.iter().any(|k| k.starts_with(&format!("{kernel}{n}["))),
                "no {kernel}{n} pipeline: {used:?}"
            );
        }
    }
}

#[test]
fn the_matrix_units_run_only_where_the_caller_allows_f16_products() {
    on_matrix_units(
        "the_matrix_units_run_only_where_the_caller_allows_f16_products",
        Size::Native,
        |_| {
            let engine = Engine::with_options_blocking(EngineOptions {
                backend: webattn::BackendPreference::Gpu,
                ..Default::default()
            })
            .expect("an engine");
            let coop_pipelines = |engine: &Engine| {
                engine
                    .gpu()
                    .expect("a GPU engine")
                    .pipelines()
                    .compiled_keys()
                    .into_iter()
                    .filter(|key| key.kernel.uses_coop())
                    .count()
            };
            let mut rng = SplitMix64::new(6);
            let q = HostTensor::new([1, 2, 40, 64], rng.normal_vec(2 * 40 * 64, 1.0)).unwrap();
            let k = HostTensor::new([1, 2, 50, 64], rng.normal_vec(2 * 50 * 64, 1.0)).unwrap();
            let v = HostTensor::new([1, 2, 50, 64], rng.normal_vec(2 * 50 * 64, 1.0)).unwrap();
            let inputs = webattn::AttentionInputs::new(&q, &k, &v);
            for path in [KernelPath::Fused, KernelPath::Unfused] {
                let options = AttentionOptions {
                    path,
                    ..Default::default()
                };
                pollster::block_on(engine.attention_host(&inputs, &options)).expect("runs");
            }
            assert_eq!(coop_pipelines(&engine), 0, "Highest used the matrix units");
            // The unfused path's two products (Q K^T, P V), then the fused kernel.
            for (path, compiled) in [(KernelPath::Unfused, 2), (KernelPath::Fused, 3)] {
                let options = AttentionOptions {
                    path,
                    precision: Precision::Fast,
                    ..Default::default()
                };
                pollster::block_on(engine.attention_host(&inputs, &options)).expect("runs");
                assert_eq!(
                    coop_pipelines(&engine),
                    compiled,
                    "Fast did not use the matrix units on the {path} path"
                );
            }
            // A forced f32 kernel stays f32 under Fast; forcing the
            // matrix-unit kernel leaves f32 calls alone.
            let forced = |choice: FusedKernelChoice| {
                Engine::with_options_blocking(EngineOptions {
                    fused_kernel: choice,
                    ..Default::default()
                })
                .expect("an engine")
            };
            let fast = AttentionOptions {
                path: KernelPath::Fused,
                precision: Precision::Fast,
                ..Default::default()
            };
            let highest = AttentionOptions {
                path: KernelPath::Fused,
                ..Default::default()
            };
            let tiled = forced(FusedKernelChoice::Tiled);
            pollster::block_on(tiled.attention_host(&inputs, &fast)).expect("runs");
            assert_eq!(coop_pipelines(&tiled), 0);
            let coop = forced(FusedKernelChoice::Coop);
            pollster::block_on(coop.attention_host(&inputs, &highest)).expect("runs");
            assert_eq!(coop_pipelines(&coop), 0);
            pollster::block_on(coop.attention_host(&inputs, &fast)).expect("runs");
            assert_eq!(coop_pipelines(&coop), 1);
        },
    );
}

/// `MatrixUnits::Off` creates the device without wgpu's experimental
/// feature: it lists no configurations, and `Fast` calls run the f32 kernels.
#[test]
fn matrix_units_off_leaves_the_experimental_feature_unrequested() {
    on_matrix_units(
        "matrix_units_off_leaves_the_experimental_feature_unrequested",
        Size::Native,
        |_| {
            let engine = Engine::with_options_blocking(EngineOptions {
                matrix_units: MatrixUnits::Off,
                ..Default::default()
            })
            .expect("an engine");
            let ctx = engine.gpu().expect("a GPU engine");
            assert!(ctx.capabilities().cooperative_matrix.is_empty());
            assert!(!ctx
                .device()
                .features()
                .contains(webattn::wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX));
            let mut rng = SplitMix64::new(7);
            let q = HostTensor::new([1, 2, 9, 16], rng.normal_vec(2 * 9 * 16, 1.0)).unwrap();
            let k = HostTensor::new([1, 2, 11, 16], rng.normal_vec(2 * 11 * 16, 1.0)).unwrap();
            let inputs = webattn::AttentionInputs::new(&q, &k, &k);
            for path in [KernelPath::Fused, KernelPath::Unfused] {
                let options = AttentionOptions {
                    path,
                    precision: Precision::Fast,
                    ..Default::default()
                };
                pollster::block_on(engine.attention_host(&inputs, &options)).expect("runs");
            }
            let coop = ctx
                .pipelines()
                .compiled_keys()
                .into_iter()
                .filter(|key| key.kernel.uses_coop())
                .count();
            assert_eq!(coop, 0, "Off still multiplied on the matrix units");
        },
    );
}

/// `MatrixUnits::Emulated16` is a testing aid for a CPU adapter that lists
/// 8x8 matrices; any other adapter refuses it with a typed error.
#[test]
fn emulated_matrix_units_are_refused_where_they_do_not_apply() {
    let Some(engine) = common::gpu() else { return };
    let caps = engine.gpu().expect("a GPU engine").capabilities();
    let applies = caps.adapter.device_type == "Cpu"
        && caps
            .cooperative_matrix
            .iter()
            .any(|c| (c.m, c.n, c.k, c.ab, c.cr) == (8, 8, 8, "f16", "f32"));
    let made = Engine::with_options_blocking(EngineOptions {
        matrix_units: MatrixUnits::Emulated16,
        backend: webattn::BackendPreference::Auto,
        ..Default::default()
    });
    match made {
        Ok(emulated) => {
            assert!(applies, "accepted on {}", engine.describe());
            let caps = emulated.gpu().expect("a GPU engine").capabilities().clone();
            assert!(caps
                .cooperative_matrix
                .iter()
                .any(|c| c.emulated && c.m == 16));
            assert_eq!(coop_shape(&caps).map(|s| s.size), Some(CoopSize::Sixteen));
        }
        Err(Error::InvalidOption { name, .. }) => {
            assert!(!applies, "refused on {}", engine.describe());
            assert_eq!(name, "matrix_units");
        }
        Err(e) => panic!("expected a typed InvalidOption, got {e}"),
    }
}

/// A tuning entry that measures the matrix-unit kernel slower than the f32
/// winner keeps calls at `Fast` on the f32 kernel (an H200 measured
/// `attention_coop16` 1.9 to 2.6 times slower than `attention_tiled`); one that
/// measures it faster, or none, leaves them on it; forcing it by name wins.
#[test]
fn fast_calls_leave_a_matrix_unit_kernel_measured_slower() {
    on_matrix_units(
        "fast_calls_leave_a_matrix_unit_kernel_measured_slower",
        Size::Native,
        |_| {
            use webattn::kernels::attention::FusedKernel;
            use webattn::tuning::{TunedEntry, TunedKernel, TuningCache, TuningKey};
            let engine = Engine::with_options_blocking(EngineOptions {
                backend: webattn::BackendPreference::Gpu,
                tuning_cache: TuningCache::Memory,
                ..Default::default()
            })
            .expect("an engine of its own");
            let ctx = engine.gpu().expect("a GPU engine");
            let is_coop = |e: &Engine| {
                matches!(
                    e.planner(8, 8).unwrap().fused_kernel_at(Precision::Fast),
                    Ok(FusedKernel::Coop(_))
                )
            };
            assert!(is_coop(&engine), "untuned, Fast takes the matrix units");
            let entry = |coop_ms| TunedEntry {
                kernel: TunedKernel::Portable,
                grouped_decode: None,
                fused_ms: 1.0,
                unfused_ms: 2.0,
                decode: None,
                coop_ms: Some(coop_ms),
                unfused_coop_ms: None,
                fast_gemm: None,
                coop_tiles: None,
            };
            let key = TuningKey::new(ctx.capabilities(), 8, 8);
            engine.record_tuning(key.clone(), entry(2.5));
            assert!(
                !is_coop(&engine),
                "measured slower, Fast takes the f32 winner"
            );
            assert!(matches!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .fused_kernel_at(Precision::Fast),
                Ok(FusedKernel::Portable(_))
            ));
            let forced = engine
                .sharing_device()
                .unwrap()
                .with_fused_kernel(FusedKernelChoice::Coop)
                .expect("the matrix-unit kernel can be forced");
            assert!(is_coop(&forced), "forced by name, it runs");
            engine.record_tuning(key.clone(), entry(0.5));
            assert!(is_coop(&engine), "measured faster, Fast takes it");

            // The unfused path's GEMMs likewise: measured slower on the
            // matrix units (the H200's gemm_coop16 ran at an eighth of the
            // f32 GEMM), calls at Fast keep them in f32.
            assert_eq!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .unfused_precision(Precision::Fast),
                Precision::Fast
            );
            let unfused = |ms| TunedEntry {
                unfused_coop_ms: Some(ms),
                fast_gemm: None,
                coop_tiles: None,
                ..entry(0.5)
            };
            engine.record_tuning(key.clone(), unfused(16.0));
            assert_eq!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .unfused_precision(Precision::Fast),
                Precision::Highest
            );
            assert_eq!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .unfused_precision(Precision::Highest),
                Precision::Highest
            );
            assert_eq!(
                forced
                    .planner(8, 8)
                    .unwrap()
                    .unfused_precision(Precision::Fast),
                Precision::Fast,
                "forced, the matrix units stay"
            );
            // The unfused path still runs right in f32 there.
            let case = CaseSpec::new("unfused-kept-f32", [1, 2, 2], [33, 40], [8, 8])
                .with(|o| o.precision = Precision::Fast);
            let results = pollster::block_on(run_case(&engine, &case, &[KernelPath::Unfused], 7));
            assert!(results.iter().all(|r| r.passed()), "{results:?}");
            engine.record_tuning(key, unfused(1.0));
            assert_eq!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .unfused_precision(Precision::Fast),
                Precision::Fast
            );
        },
    );
}

/// `MatrixUnits::NagaSpirv` runs the matrix-unit kernels as wgpu translates
/// their WGSL (no pipeline from the engine's SPIR-V), still right: the
/// measuring aid that lets a GPU session compare the two forms.
#[test]
fn naga_spirv_runs_the_matrix_unit_kernels_as_wgpus_translation() {
    on_matrix_units(
        "naga_spirv_runs_the_matrix_unit_kernels_as_wgpus_translation",
        Size::Native,
        |_| {
            let engine = Engine::with_options_blocking(EngineOptions {
                matrix_units: MatrixUnits::NagaSpirv,
                tuning_cache: webattn::tuning::TuningCache::Memory,
                ..Default::default()
            })
            .expect("an engine with naga's SPIR-V");
            gemm_cases_only(&engine, staged(&engine));
            gemm_cases_only(&engine, packed(&engine, PackedTile::DEFAULT));
            let pipelines = engine.gpu().expect("a GPU engine").pipelines();
            assert!(pipelines
                .compiled_keys()
                .iter()
                .any(|k| k.kernel.uses_coop()));
            assert_eq!(pipelines.own_spirv_keys(), Vec::new());
        },
    );
}

/// The unfused path at `Fast` takes the form of the matrix-unit GEMM that
/// `webattn tune` measured fastest (or one pinned on the context), and the
/// default (the packed kernel at 2x2) where nothing was measured; the tuner
/// times every form and records the fastest.
#[test]
fn fast_calls_take_the_matrix_unit_gemm_form_tuned_fastest() {
    on_matrix_units(
        "fast_calls_take_the_matrix_unit_gemm_form_tuned_fastest",
        Size::Native,
        |_| {
            use webattn::kernels::gemm::FastGemm;
            use webattn::tuning::{TunedEntry, TunedGemm, TunedKernel, TuningCache, TuningKey};
            let engine = Engine::with_options_blocking(EngineOptions {
                backend: webattn::BackendPreference::Gpu,
                tuning_cache: TuningCache::Memory,
                ..Default::default()
            })
            .expect("an engine of its own");
            let ctx = engine.gpu().expect("a GPU engine");
            let default = packed(&engine, PackedTile::DEFAULT);
            assert_eq!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .gemm_kernel_for_call(Precision::Fast),
                default
            );
            let tall = PackedTile { rows: 4, cols: 2 };
            let entry = |form| TunedEntry {
                kernel: TunedKernel::Portable,
                grouped_decode: None,
                fused_ms: 1.0,
                unfused_ms: 2.0,
                decode: None,
                coop_ms: None,
                unfused_coop_ms: Some(1.0),
                fast_gemm: Some(TunedGemm {
                    form,
                    unfused_ms: 1.0,
                }),
                coop_tiles: None,
            };
            let key = TuningKey::new(ctx.capabilities(), 8, 8);
            engine.record_tuning(key.clone(), entry(FastGemm::Staged));
            assert_eq!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .gemm_kernel_for_call(Precision::Fast),
                staged(&engine)
            );
            assert_eq!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .gemm_kernel_for_call(Precision::Highest),
                engine
                    .planner(0, 0)
                    .unwrap()
                    .gemm_kernel_at(Precision::Highest),
                "f32 calls keep the f32 GEMM"
            );
            assert_eq!(
                engine
                    .planner(16, 16)
                    .unwrap()
                    .gemm_kernel_for_call(Precision::Fast),
                default,
                "other head dims keep the default"
            );
            engine.record_tuning(key, entry(FastGemm::Packed(tall)));
            assert_eq!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .gemm_kernel_for_call(Precision::Fast),
                packed(&engine, tall)
            );
            // An unfused call at Fast runs that form, right.
            let case = CaseSpec::new("unfused-tuned-form", [1, 2, 2], [33, 40], [8, 8])
                .with(|o| o.precision = Precision::Fast);
            let results = pollster::block_on(run_case(&engine, &case, &[KernelPath::Unfused], 7));
            assert!(results.iter().all(|r| r.passed()), "{results:?}");
            assert!(ctx.pipelines().compiled_keys().iter().any(|k| k
                .kernel
                .name()
                .starts_with("gemm_coop_packed")
                && k.to_string().contains("RM=4,RN=2")));
            // Pinned on a context, a form wins over the table.
            let pinned = engine.sharing_device().unwrap().with_overrides(Overrides {
                pinned_fast_gemm: Some(FastGemm::Staged),
                ..*engine.overrides()
            });
            assert_eq!(
                pinned
                    .planner(8, 8)
                    .unwrap()
                    .gemm_kernel_for_call(Precision::Fast),
                staged(&engine)
            );
            // The tuner times every form on the unfused path at Fast and
            // records the fastest.
            let reports = pollster::block_on(webattn::tuning::tune(&engine, &[(8, 8)], |_| {}))
                .expect("the tuner runs");
            let timed: Vec<&str> = reports[0]
                .timings
                .iter()
                .map(|t| t.label.as_str())
                .filter(|label| label.starts_with("unfused (precision fast"))
                .collect();
            assert_eq!(timed.len(), FastGemm::ALL.len(), "{timed:?}");
            let tuned = reports[0].entry.fast_gemm.expect("a form was recorded");
            assert_eq!(reports[0].entry.unfused_coop_ms, Some(tuned.unfused_ms));
            assert_eq!(
                engine
                    .planner(8, 8)
                    .unwrap()
                    .gemm_kernel_for_call(Precision::Fast),
                tuned.form.kernel(match staged(&engine) {
                    GemmKernel::Coop(shape) => shape,
                    _ => unreachable!(),
                })
            );
        },
    );
}

/// `webattn phases` on the matrix-unit kernel: each phase switch removes
/// what it names (as tests/gpu/tiled.rs checks for the register-tiled kernels).
/// Without S = Q K^T every score is 0, so each row is the mean of V's rows
/// (rounded to f16); without O += P V, or without K and V's loads, every row
/// is 0. In the packed form and the shared one, at 8x8: the switches are the
/// same code at 16x16.
#[test]
fn each_phase_switch_of_the_matrix_unit_kernel_removes_its_phase() {
    use webattn::kernels::ablation::Phases;
    on_matrix_units(
        "each_phase_switch_of_the_matrix_unit_kernel_removes_its_phase",
        Size::Native,
        |engine| {
            let (rows, keys, d) = (21, 37, 16);
            let mut rng = SplitMix64::new(common::seed());
            let q = HostTensor::new([1, 2, rows, d], rng.normal_vec(2 * rows * d, 1.0)).unwrap();
            let k = HostTensor::new([1, 2, keys, d], rng.normal_vec(2 * keys * d, 1.0)).unwrap();
            let v = HostTensor::new([1, 2, keys, d], rng.normal_vec(2 * keys * d, 1.0)).unwrap();
            let options = AttentionOptions {
                path: KernelPath::Fused,
                precision: Precision::Fast,
                ..Default::default()
            };
            let inputs = webattn::AttentionInputs::new(&q, &k, &v);
            let mean: Vec<f64> = (0..2 * d)
                .map(|i| {
                    let (head, col) = (i / d, i % d);
                    (0..keys)
                        .map(|j| f64::from(f16(v.data()[(head * keys + j) * d + col])))
                        .sum::<f64>()
                        / keys as f64
                })
                .collect();
            // The packed form (the default) and the shared one.
            for (choice, kernel) in [
                (FusedKernelChoice::Coop, "attention_coop_packed"),
                (FusedKernelChoice::CoopShared, "attention_coop_shared"),
            ] {
                let forced = engine
                    .sharing_device()
                    .expect("a GPU engine")
                    .with_fused_kernel(choice)
                    .expect("a form of the matrix-unit kernel");
                let run = |phases: Phases| {
                    let variant = forced.sharing_device().unwrap().without_phases(phases);
                    let y = variant
                        .attention_host_blocking(&inputs, &options)
                        .unwrap()
                        .y;
                    let bits = i64::from(phases.bits());
                    let keys = variant.gpu().unwrap().pipelines().compiled_keys();
                    assert!(
                        keys.iter().any(|k| {
                            k.kernel.name().starts_with(kernel)
                                && (phases.is_empty() || k.constants.contains(&("ABLATE", bits)))
                        }),
                        "{kernel} without {}: {keys:?}",
                        phases.name()
                    );
                    y
                };
                assert!(run(Phases::NONE).data().iter().all(|x| x.is_finite()));
                for (i, &value) in run(Phases::SCORES).data().iter().enumerate() {
                    let (head, col) = (i / (rows * d), i % d);
                    let want = mean[head * d + col];
                    assert!(
                        (f64::from(value) - want).abs() < 1e-5,
                        "without S: element {i} is {value}, the mean of V is {want}"
                    );
                }
                for phases in [Phases::PRODUCT, Phases::KV_LOADS] {
                    let y = run(phases);
                    assert!(
                        y.data().iter().all(|&x| x == 0.0),
                        "{kernel} without {}: {:?}",
                        phases.name(),
                        &y.data()[..8]
                    );
                }
            }
        },
    );
}

/// Where packed K or V would pass one binding (a head dim padded to the
/// matrix size grows them: Dk = 1 takes 8 f16 values per key against one
/// f32), the matrix-unit kernel runs its staged form, right, and packs
/// nothing; a call that fits runs packed.
#[test]
fn calls_whose_packed_keys_would_pass_a_binding_run_staged() {
    on_matrix_units(
        "calls_whose_packed_keys_would_pass_a_binding_run_staged",
        Size::Native,
        |_| {
            let engine = Engine::with_options_blocking(EngineOptions {
                limits: webattn::DeviceLimits::default()
                    .with("max_storage_buffer_binding_size", 64 << 10)
                    .expect("a known limit"),
                tuning_cache: webattn::tuning::TuningCache::Memory,
                ..Default::default()
            })
            .expect("an engine with 64 KiB bindings");
            let coop_keys = || -> Vec<String> {
                engine
                    .gpu()
                    .expect("a GPU engine")
                    .pipelines()
                    .compiled_keys()
                    .into_iter()
                    .map(|k| k.to_string())
                    .filter(|k| k.starts_with("attention_coop"))
                    .collect()
            };
            // K and V: 6000 keys of 1 value, 24 KB as f32; packed, 6016 x 8
            // f16 values, 96 KiB each.
            let case = CaseSpec::new("packed-past-a-binding", [1, 1, 1], [5, 6000], [1, 1])
                .with(|o| o.precision = Precision::Fast);
            let results = pollster::block_on(run_case(&engine, &case, &[KernelPath::Fused], 11));
            assert!(results.iter().all(|r| r.passed()), "{results:?}");
            let keys = coop_keys();
            assert!(
                keys.iter().all(|k| !k.starts_with("attention_coop_packed")) && !keys.is_empty(),
                "{keys:?}"
            );
            // 600 keys pack into 12 KiB each: packed.
            let case = CaseSpec::new("packed-within-a-binding", [1, 1, 1], [5, 600], [1, 1])
                .with(|o| o.precision = Precision::Fast);
            let results = pollster::block_on(run_case(&engine, &case, &[KernelPath::Fused], 12));
            assert!(results.iter().all(|r| r.passed()), "{results:?}");
            assert!(
                coop_keys()
                    .iter()
                    .any(|k| k.starts_with("attention_coop_packed")),
                "{:?}",
                coop_keys()
            );
        },
    );
}

/// A call whose packed K and V would pass a binding falls back to staged
/// tiles or the f32 kernel ([`CoopTiles::packs`]); where those hold fewer
/// query rows per workgroup than the packed tiles, the dispatch counts its
/// blocks by the kernel that runs, so every row is computed. Forced with a
/// small binding (keys of one value pack into 8) and workgroup memory that
/// holds the packed tiles but not their staged form.
#[test]
fn a_packed_call_that_falls_back_computes_every_query_row() {
    on_matrix_units(
        "a_packed_call_that_falls_back_computes_every_query_row",
        Size::Native,
        |_| {
            let mut fewer_rows = 0;
            for workgroup_kib in [4u64, 8, 12, 32] {
                let engine = Engine::with_options_blocking(EngineOptions {
                    limits: webattn::DeviceLimits::default()
                        .with("max_storage_buffer_binding_size", 64 << 10)
                        .and_then(|l| {
                            l.with("max_compute_workgroup_storage_size", workgroup_kib << 10)
                        })
                        .expect("known limits"),
                    tuning_cache: webattn::tuning::TuningCache::Memory,
                    ..Default::default()
                })
                .expect("an engine with small limits");
                let case = CaseSpec::new("packed-fallback-rows", [1, 2, 1], [100, 6000], [1, 1])
                    .with(|o| o.precision = Precision::Fast);
                let results =
                    pollster::block_on(run_case(&engine, &case, &[KernelPath::Fused], 13));
                let keys: Vec<String> = engine
                    .gpu()
                    .expect("a GPU engine")
                    .pipelines()
                    .compiled_keys()
                    .into_iter()
                    .map(|k| k.to_string())
                    .collect();
                println!("{workgroup_kib} KiB: {keys:?}");
                assert!(
                    results.iter().all(|r| r.passed()),
                    "{workgroup_kib} KiB of workgroup memory, {keys:?}: {results:?}"
                );
                if keys
                    .iter()
                    .any(|k| k.contains("NSG=1") || k.contains("NSG=2"))
                {
                    fewer_rows += 1;
                }
            }
            // (At 8 KiB on Mesa 26's lavapipe: 16 rows staged where 32 were
            // packed; before the fix, the rows past 50 of each head were 0.)
            assert!(
                fewer_rows > 0,
                "no limit made the call fall back to tiles of fewer rows: the test no longer \
                 reaches the case"
            );
        },
    );
}

/// `Auto` at `Fast` compares each path as it runs: on the matrix units where
/// they measured faster. Unfused is faster in f32 (1.5 against 2.0 ms), but
/// the matrix-unit fused kernel (0.6) beats the unfused path on the matrix
/// units (1.0): fused at fast, unfused at highest.
#[test]
fn auto_at_fast_compares_the_paths_on_the_matrix_units() {
    on_matrix_units(
        "auto_at_fast_compares_the_paths_on_the_matrix_units",
        Size::Native,
        |_| {
            use webattn::tuning::{TunedEntry, TunedKernel, TuningCache, TuningKey};
            let engine = Engine::with_options_blocking(EngineOptions {
                backend: webattn::BackendPreference::Gpu,
                tuning_cache: TuningCache::Memory,
                ..Default::default()
            })
            .expect("an engine of its own");
            let ctx = engine.gpu().expect("a GPU engine");
            engine.record_tuning(
                TuningKey::new(ctx.capabilities(), 8, 8),
                TunedEntry {
                    kernel: TunedKernel::Portable,
                    grouped_decode: None,
                    fused_ms: 2.0,
                    unfused_ms: 1.5,
                    decode: None,
                    coop_ms: Some(0.6),
                    unfused_coop_ms: Some(1.0),
                    fast_gemm: None,
                    coop_tiles: None,
                },
            );
            for (precision, want) in [
                (Precision::Highest, KernelPath::Unfused),
                (Precision::Fast, KernelPath::Fused),
            ] {
                let case = CaseSpec::new("auto-at-fast", [1, 2, 2], [33, 40], [8, 8])
                    .with(|o| o.precision = precision);
                let results = pollster::block_on(run_case(&engine, &case, &[KernelPath::Auto], 7));
                assert!(results.iter().all(|r| r.passed()), "{results:?}");
                let call = engine.last_call().expect("a call");
                assert_eq!(
                    call.plan.path, want,
                    "{precision:?}: {:?}",
                    call.plan.reason
                );
            }
        },
    );
}

/// The matrix-unit kernel's tiles: calls at `Fast` take those `webattn
/// tune` measured fastest where they are a candidate that fits, tiles pinned
/// on a context before them, the largest that fit otherwise (a stale entry's
/// tiles and time are dropped); a call through
/// tuned tiles agrees with the oracle; and the tuner records the tiles it
/// timed (on a CPU adapter, the one candidate it tries).
#[test]
fn fast_calls_take_the_matrix_unit_tiles_measured_fastest() {
    on_matrix_units(
        "fast_calls_take_the_matrix_unit_tiles_measured_fastest",
        Size::Native,
        |_| {
            use webattn::kernels::attention::{CoopForm, CoopTiles, FusedKernel};
            use webattn::tuning::{TunedCoop, TunedEntry, TunedKernel, TuningCache, TuningKey};
            let engine = Engine::with_options_blocking(EngineOptions {
                backend: webattn::BackendPreference::Gpu,
                tuning_cache: TuningCache::Memory,
                ..Default::default()
            })
            .expect("an engine of its own");
            let ctx = engine.gpu().expect("a GPU engine");
            let shape = coop_shape(ctx.capabilities()).expect("matrix units");
            let tiles_at =
                |e: &Engine| match e.planner(8, 8).unwrap().fused_kernel_at(Precision::Fast) {
                    Ok(FusedKernel::Coop(t)) => (t.subgroups, t.keys_per_tile),
                    other => panic!("not the matrix-unit kernel: {other:?}"),
                };
            let largest = CoopTiles::for_dims(shape, 8, 8, &ctx.capabilities().limits).unwrap();
            assert_eq!(
                tiles_at(&engine),
                (largest.subgroups, largest.keys_per_tile)
            );
            // Another candidate that fits, as the tuner would record it.
            let other = CoopTiles::candidates(shape, 8, 8)
                .into_iter()
                .find(|t| t.fits(&ctx.capabilities().limits) && *t != largest)
                .expect("a second candidate");
            let tuned = |tiles: Option<TunedCoop>| TunedEntry {
                kernel: TunedKernel::Portable,
                grouped_decode: None,
                fused_ms: 1.0,
                unfused_ms: 2.0,
                decode: None,
                coop_ms: Some(0.5),
                unfused_coop_ms: None,
                fast_gemm: None,
                coop_tiles: tiles,
            };
            let key = TuningKey::new(ctx.capabilities(), 8, 8);
            let other_tiles = TunedCoop {
                subgroups: other.subgroups,
                keys_per_tile: other.keys_per_tile,
                form: CoopForm::Packed,
            };
            engine.record_tuning(key.clone(), tuned(Some(other_tiles)));
            assert_eq!(tiles_at(&engine), (other.subgroups, other.keys_per_tile));
            // Pinned tiles come first; tiles that are no candidate are passed over.
            let pin = |tiles: TunedCoop| {
                engine.sharing_device().unwrap().with_overrides(Overrides {
                    pinned_coop: Some(tiles),
                    ..*engine.overrides()
                })
            };
            let pinned = pin(TunedCoop {
                subgroups: largest.subgroups,
                keys_per_tile: largest.keys_per_tile,
                form: CoopForm::Packed,
            });
            assert_eq!(
                tiles_at(&pinned),
                (largest.subgroups, largest.keys_per_tile)
            );
            let unknown = TunedCoop {
                subgroups: 3,
                keys_per_tile: 24,
                form: CoopForm::Packed,
            };
            assert_eq!(
                tiles_at(&pin(unknown)),
                (other.subgroups, other.keys_per_tile)
            );
            // Tuned tiles that are no candidate (a stale entry) are dropped
            // with their time: the largest tiles run.
            engine.record_tuning(key.clone(), tuned(Some(unknown)));
            assert_eq!(
                tiles_at(&engine),
                (largest.subgroups, largest.keys_per_tile)
            );
            let kept = engine.tuned(8, 8).expect("the entry stays");
            assert_eq!((kept.coop_tiles, kept.coop_ms), (None, None));
            engine.record_tuning(key.clone(), tuned(Some(other_tiles)));
            // A call through the tuned tiles runs them, right.
            let case = CaseSpec::new("tuned-coop-tiles", [1, 2, 2], [70, 90], [8, 8])
                .with(|o| o.precision = Precision::Fast);
            let results = pollster::block_on(run_case(&engine, &case, &[KernelPath::Fused], 7));
            assert!(results.iter().all(|r| r.passed()), "{results:?}");
            let keys: Vec<String> = ctx
                .pipelines()
                .compiled_keys()
                .into_iter()
                .map(|k| k.to_string())
                .filter(|k| k.starts_with("attention_coop"))
                .collect();
            let want = (
                format!("NSG={},", other.subgroups),
                format!("BK={},", other.keys_per_tile),
            );
            assert!(
                keys.iter()
                    .any(|k| k.contains(&want.0) && k.contains(&want.1)),
                "{want:?} not among {keys:?}"
            );
            // The form is tuned too: packed by default, staged or shared
            // where that form was measured faster or is forced.
            let form_at =
                |e: &Engine| match e.planner(8, 8).unwrap().fused_kernel_at(Precision::Fast) {
                    Ok(FusedKernel::Coop(t)) => t.form,
                    other => panic!("not the matrix-unit kernel: {other:?}"),
                };
            assert_eq!(form_at(&engine), CoopForm::Packed);
            for (form, choice) in [
                (CoopForm::Staged, FusedKernelChoice::CoopStaged),
                (CoopForm::Shared, FusedKernelChoice::CoopShared),
            ] {
                let form_tiles = TunedCoop {
                    form,
                    ..other_tiles
                };
                engine.record_tuning(key.clone(), tuned(Some(form_tiles)));
                assert_eq!(form_at(&engine), form);
                assert_eq!(tiles_at(&engine), (other.subgroups, other.keys_per_tile));
                engine.record_tuning(key.clone(), tuned(Some(other_tiles)));
                let forced = engine
                    .sharing_device()
                    .unwrap()
                    .with_fused_kernel(choice)
                    .expect("a form of the matrix-unit kernel");
                assert_eq!(form_at(&forced), form);
                assert_eq!(tiles_at(&forced), (other.subgroups, other.keys_per_tile));
            }
            // The tuner records the tiles it timed.
            let reports = pollster::block_on(webattn::tuning::tune(&engine, &[(8, 8)], |_| {}))
                .expect("tuning runs");
            let recorded = reports[0].entry.coop_tiles.expect("tiles recorded");
            let timed = webattn::tuning::coop_candidates(&engine, 8, 8);
            assert!(
                timed.iter().any(|t| (t.subgroups, t.keys_per_tile)
                    == (recorded.subgroups, recorded.keys_per_tile)),
                "{recorded:?} not among {timed:?}"
            );
        },
    );
}
