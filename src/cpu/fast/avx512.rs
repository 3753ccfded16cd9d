//! The micro-kernels of [`super::kernel`] written for AVX-512 by hand: an
//! `MR × 32` tile is `MR` pairs of 16-wide registers, a value of `A` is
//! broadcast once per row and step, and a step of `B` is two loads.
//!
//! They are not left to the compiler: with AVX-512 enabled, LLVM vectorised
//! the generic loops across the accumulator rows with gathers and scatters
//! through the stack and ran 16x slower than the AVX2 build. The tile width
//! (`NR` = [`NR`]) is what selects these kernels: only
//! [`super::isa::dispatch_tiles`] instantiates it, for a CPU that has AVX-512F,
//! and each kernel checks the CPU again before it runs.
//!
//! The sums are the generic kernels': products and sums rounded in order of
//! the inner index, fused exactly where `FMA` says.

use std::arch::x86_64::{
    __m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mul_ps, _mm512_set1_ps,
    _mm512_storeu_ps,
};

/// The tile width these kernels take: two 16-wide registers.
pub(crate) const NR: usize = 32;

/// Whether this CPU runs the kernels (AVX-512F; the answer is cached by std).
#[inline(always)]
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// `c + a · b`, fused when `FMA`.
#[target_feature(enable = "avx512f")]
#[inline]
fn madd<const FMA: bool>(a: __m512, b: __m512, c: __m512) -> __m512 {
    if FMA {
        _mm512_fmadd_ps(a, b, c)
    } else {
        _mm512_add_ps(c, _mm512_mul_ps(a, b))
    }
}

/// Loads an `MR × 32` tile from `acc` (`MR · 32` values, row-major).
#[target_feature(enable = "avx512f")]
#[inline]
fn load_tile<const MR: usize>(acc: &[f32]) -> [[__m512; 2]; MR] {
    let acc = &acc[..MR * NR];
    std::array::from_fn(|r| {
        // SAFETY: row r's 32 values lie within `acc` (sliced above).
        unsafe {
            let p = acc.as_ptr().add(r * NR);
            [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
        }
    })
}

/// Stores an `MR × 32` tile into `acc`.
#[target_feature(enable = "avx512f")]
#[inline]
fn store_tile<const MR: usize>(c: &[[__m512; 2]; MR], acc: &mut [f32]) {
    let acc = &mut acc[..MR * NR];
    for (r, row) in c.iter().enumerate() {
        // SAFETY: row r's 32 values lie within `acc` (sliced above).
        unsafe {
            let p = acc.as_mut_ptr().add(r * NR);
            _mm512_storeu_ps(p, row[0]);
            _mm512_storeu_ps(p.add(16), row[1]);
        }
    }
}

/// Adds one step: `c[r] += x[r] · (b0, b1)`.
#[target_feature(enable = "avx512f")]
#[inline]
fn step<const MR: usize, const FMA: bool>(
    c: &mut [[__m512; 2]; MR],
    x: impl Fn(usize) -> f32,
    b0: __m512,
    b1: __m512,
) {
    for (r, row) in c.iter_mut().enumerate() {
        let x = _mm512_set1_ps(x(r));
        row[0] = madd::<FMA>(x, b0, row[0]);
        row[1] = madd::<FMA>(x, b1, row[1]);
    }
}

/// [`super::kernel::outer`] for `NR` = 32; `acc` is the `MR × 32` tile.
///
/// # Safety
/// The CPU must have AVX-512F ([`available`]).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn outer<const MR: usize, const FMA: bool>(
    depth: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    acc: &mut [f32],
) {
    if depth == 0 {
        return;
    }
    let b = &b[..depth * NR];
    let a = &a[..(depth - 1) * lda + MR];
    // SAFETY: every index below is within `a`, `b` (sliced above) and `acc`.
    unsafe {
        let mut c = load_tile::<MR>(acc);
        for k in 0..depth {
            let bp = b.as_ptr().add(k * NR);
            let ap = a.as_ptr().add(k * lda);
            step::<MR, FMA>(
                &mut c,
                |r| *ap.add(r),
                _mm512_loadu_ps(bp),
                _mm512_loadu_ps(bp.add(16)),
            );
        }
        store_tile(&c, acc);
    }
}

/// [`super::kernel::outer_a_rows`] for `NR` = 32.
///
/// # Safety
/// The CPU must have AVX-512F ([`available`]).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn outer_a_rows<const MR: usize, const FMA: bool>(
    depth: usize,
    a: &[&[f32]; MR],
    b: &[f32],
    acc: &mut [f32],
) {
    let b = &b[..depth * NR];
    let rows: [&[f32]; MR] = std::array::from_fn(|r| &a[r][..depth]);
    // SAFETY: every index below is within the rows, `b` (sliced above) and `acc`.
    unsafe {
        let mut c = load_tile::<MR>(acc);
        for k in 0..depth {
            let bp = b.as_ptr().add(k * NR);
            step::<MR, FMA>(
                &mut c,
                |r| *rows[r].get_unchecked(k),
                _mm512_loadu_ps(bp),
                _mm512_loadu_ps(bp.add(16)),
            );
        }
        store_tile(&c, acc);
    }
}

/// [`super::kernel::outer_b_rows`] for `NR` = 32.
///
/// # Safety
/// The CPU must have AVX-512F ([`available`]).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn outer_b_rows<const MR: usize, const FMA: bool>(
    a: &[f32],
    lda: usize,
    b: &[&[f32]],
    col: usize,
    acc: &mut [f32],
) {
    let depth = b.len();
    if depth == 0 {
        return;
    }
    let a = &a[..(depth - 1) * lda + MR];
    // SAFETY: every index below is within `a` (sliced above), the rows of `b`
    // (sliced per step) and `acc`.
    unsafe {
        let mut c = load_tile::<MR>(acc);
        for (k, row) in b.iter().enumerate() {
            let bp = row[col..col + NR].as_ptr();
            let ap = a.as_ptr().add(k * lda);
            step::<MR, FMA>(
                &mut c,
                |r| *ap.add(r),
                _mm512_loadu_ps(bp),
                _mm512_loadu_ps(bp.add(16)),
            );
        }
        store_tile(&c, acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain sums, in order of the inner index, rounded as `FMA` says.
    fn plain<const FMA: bool>(
        depth: usize,
        a: &dyn Fn(usize, usize) -> f32,
        b: &dyn Fn(usize, usize) -> f32,
        mr: usize,
        acc: &mut [f32],
    ) {
        for r in 0..mr {
            for j in 0..NR {
                let mut c = acc[r * NR + j];
                for k in 0..depth {
                    c = if FMA {
                        a(r, k).mul_add(b(k, j), c)
                    } else {
                        c + a(r, k) * b(k, j)
                    };
                }
                acc[r * NR + j] = c;
            }
        }
    }

    #[test]
    fn the_kernels_give_the_plain_sums_bit_for_bit() {
        if !available() {
            return;
        }
        const MR: usize = 3;
        let depth = 37;
        let value = |i: usize| ((i * 7919 % 1013) as f32 - 500.0) / 97.0;
        let lda = MR + 2;
        let a: Vec<f32> = (0..depth * lda).map(value).collect();
        let b: Vec<f32> = (0..depth * NR).map(|i| value(i + 11)).collect();
        let start: Vec<f32> = (0..MR * NR).map(|i| value(i + 5)).collect();
        let a_at = |r: usize, k: usize| a[k * lda + r];
        let b_at = |k: usize, j: usize| b[k * NR + j];
        let rows: Vec<Vec<f32>> = (0..MR)
            .map(|r| (0..depth).map(|k| a_at(r, k)).collect())
            .collect();
        let rows: [&[f32]; MR] = std::array::from_fn(|r| &rows[r][..]);
        let b_rows: Vec<Vec<f32>> = (0..depth)
            .map(|k| {
                (0..NR + 4)
                    .map(|j| if j < 4 { 0.0 } else { b_at(k, j - 4) })
                    .collect()
            })
            .collect();
        let b_rows: Vec<&[f32]> = b_rows.iter().map(|r| &r[..]).collect();

        let mut want = start.clone();
        plain::<false>(depth, &a_at, &b_at, MR, &mut want);
        let mut got = start.clone();
        // SAFETY: `available()` said the CPU has AVX-512F.
        unsafe { outer::<MR, false>(depth, &a, lda, &b, &mut got) };
        assert_eq!(got, want);
        let mut got = start.clone();
        unsafe { outer_a_rows::<MR, false>(depth, &rows, &b, &mut got) };
        assert_eq!(got, want);

        let mut want = start.clone();
        plain::<true>(depth, &a_at, &b_at, MR, &mut want);
        let mut got = start.clone();
        unsafe { outer::<MR, true>(depth, &a, lda, &b, &mut got) };
        assert_eq!(got, want);
        let mut got = start.clone();
        unsafe { outer_b_rows::<MR, true>(&a, lda, &b_rows, 4, &mut got) };
        assert_eq!(got, want);
    }
}
