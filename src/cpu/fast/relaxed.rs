//! The micro-kernels of `kernel.rs` for 8-wide tiles in wasm's relaxed SIMD
//! (`f32x4.relaxed_madd`: fused where the machine fuses, a multiply and an
//! add where it does not). LLVM never turns `mul_add` into it, so the
//! kernels are written with the intrinsics. They fuse only where the caller
//! allows it (`FMA`: the P·V products); the scores stay a rounded product and
//! a rounded sum per step, as the plain f32 computation whose error sets the
//! tolerance (`block.rs`, `scores_t`).
//!
//! Built only into the second wasm package (the `relaxed-simd` feature,
//! `web/build.sh`), which the JavaScript loader takes where it is the better
//! one (`web/lib/webattn.js`). Only these functions are compiled with the
//! `relaxed-simd` target feature: enabled for the whole crate, LLVM also
//! chose relaxed instructions elsewhere, whose NaN results are the machine's
//! (a float mask holding NaN then gave other log-sum-exps).

use core::arch::wasm32::{
    f32x4_add, f32x4_mul, f32x4_relaxed_madd, f32x4_splat, v128, v128_load, v128_store,
};

/// The tile width these kernels take: two `f32x4` per row.
pub(crate) const NR: usize = 8;

/// Eight values of `row` from `at` as two vectors.
#[inline(always)]
fn load8(row: &[f32], at: usize) -> (v128, v128) {
    let row = &row[at..at + NR];
    // SAFETY: `row` holds 8 f32s (sliced just above); wasm loads need no
    // alignment.
    unsafe {
        let p = row.as_ptr() as *const v128;
        (v128_load(p), v128_load(p.add(1)))
    }
}

/// The `MR × 8` accumulators of `acc` (row-major) as vector pairs.
#[inline(always)]
fn load_acc<const MR: usize>(acc: &[f32]) -> [(v128, v128); MR] {
    std::array::from_fn(|r| load8(acc, r * NR))
}

/// Stores the vector pairs back into `acc`.
#[inline(always)]
fn store_acc<const MR: usize>(c: [(v128, v128); MR], acc: &mut [f32]) {
    let acc = &mut acc[..MR * NR];
    for (r, (lo, hi)) in c.into_iter().enumerate() {
        let row = &mut acc[r * NR..(r + 1) * NR];
        // SAFETY: `row` holds 8 f32s (sliced just above); wasm stores need
        // no alignment.
        unsafe {
            let p = row.as_mut_ptr() as *mut v128;
            v128_store(p, lo);
            v128_store(p.add(1), hi);
        }
    }
}

/// `c[r] += x[r] · b` for the `MR` broadcasts `x`, fused when `FMA`.
#[target_feature(enable = "relaxed-simd")]
#[inline]
fn step<const MR: usize, const FMA: bool>(
    c: &mut [(v128, v128); MR],
    x: impl Fn(usize) -> f32,
    b: (v128, v128),
) {
    for (r, (lo, hi)) in c.iter_mut().enumerate() {
        let x = f32x4_splat(x(r));
        if FMA {
            *lo = f32x4_relaxed_madd(x, b.0, *lo);
            *hi = f32x4_relaxed_madd(x, b.1, *hi);
        } else {
            *lo = f32x4_add(f32x4_mul(x, b.0), *lo);
            *hi = f32x4_add(f32x4_mul(x, b.1), *hi);
        }
    }
}

/// `kernel::outer` at `NR = 8`: `acc` is the `MR × 8` tile, row-major.
#[target_feature(enable = "relaxed-simd")]
pub(crate) fn outer<const MR: usize, const FMA: bool>(
    depth: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    acc: &mut [f32],
) {
    let b = &b[..depth * NR];
    let mut c = load_acc::<MR>(acc);
    for k in 0..depth {
        let arow = &a[k * lda..][..MR];
        step::<MR, FMA>(&mut c, |r| arow[r], load8(b, k * NR));
    }
    store_acc(c, acc);
}

/// `kernel::outer_a_rows` at `NR = 8`.
#[target_feature(enable = "relaxed-simd")]
pub(crate) fn outer_a_rows<const MR: usize, const FMA: bool>(
    depth: usize,
    a: &[&[f32]; MR],
    b: &[f32],
    acc: &mut [f32],
) {
    let rows: [&[f32]; MR] = std::array::from_fn(|r| &a[r][..depth]);
    let b = &b[..depth * NR];
    let mut c = load_acc::<MR>(acc);
    for (k, brow) in b.chunks_exact(NR).enumerate() {
        step::<MR, FMA>(&mut c, |r| rows[r][k], load8(brow, 0));
    }
    store_acc(c, acc);
}

/// `kernel::outer_b_rows` at `NR = 8`.
#[target_feature(enable = "relaxed-simd")]
pub(crate) fn outer_b_rows<const MR: usize, const FMA: bool>(
    a: &[f32],
    lda: usize,
    b: &[&[f32]],
    col: usize,
    acc: &mut [f32],
) {
    let mut c = load_acc::<MR>(acc);
    for (k, brow) in b.iter().enumerate() {
        let arow = &a[k * lda..][..MR];
        step::<MR, FMA>(&mut c, |r| arow[r], load8(brow, col));
    }
    store_acc(c, acc);
}
