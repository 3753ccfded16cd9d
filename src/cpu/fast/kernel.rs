//! The register-tiled micro-kernel every product in the backend runs on:
//! `C[MR × NR] += A[MR × depth] · B[depth × NR]`: one value of `A` broadcast
//! per row and step, `B` read by rows of `NR` contiguous values. The
//! accumulators are a `[[f32; NR]; MR]` array that the compiler keeps in
//! registers and vectorises along `NR`.
//!
//! The attention kernel computes score tiles transposed, keys × queries:
//! `Sᵀ = K Qᵀ` reads `MR` keys packed as `[Dk][MR]` for `A` and `NR` queries
//! packed as `[Dk][NR]` for `B`; then `O += P V` reads `MR` queries of the
//! probability tile `Pᵀ` (`[keys][queries]`, so already `[depth][..MR]`) for
//! `A` and a value panel (`[keys][NR]`) for `B`. No tile is ever transposed.
//! A decoding step, whose keys and values are read once, skips the packing:
//! [`outer_a_rows`] reads key rows and [`outer_b_rows`] value rows in place.

#[cfg(target_arch = "x86_64")]
use super::avx512;
use super::math::madd;
#[cfg(all(target_arch = "wasm32", feature = "relaxed-simd"))]
use super::relaxed;

/// `acc += A · B` over `depth` steps: `A` step `k` is `a[k * lda ..][..MR]`,
/// `B` row `k` is `b[k * NR ..][..NR]`.
///
/// # Panics
/// If the slices are too short for `depth` (a bug in the caller).
#[inline(always)]
pub(crate) fn outer<const MR: usize, const NR: usize, const FMA: bool>(
    depth: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    acc: &mut [[f32; NR]; MR],
) {
    #[cfg(target_arch = "x86_64")]
    if NR == avx512::NR && avx512::available() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        return unsafe { avx512::outer::<MR, FMA>(depth, a, lda, b, acc.as_flattened_mut()) };
    }
    #[cfg(all(target_arch = "wasm32", feature = "relaxed-simd"))]
    if NR == relaxed::NR {
        return relaxed::outer::<MR, FMA>(depth, a, lda, b, acc.as_flattened_mut());
    }
    let b = &b[..depth * NR];
    let mut c = *acc;
    for (k, brow) in b.chunks_exact(NR).enumerate() {
        let arow = &a[k * lda..][..MR];
        for r in 0..MR {
            let x = arow[r];
            for j in 0..NR {
                c[r][j] = madd::<FMA>(x, brow[j], c[r][j]);
            }
        }
    }
    *acc = c;
}

/// [`outer`] with `A` given as `MR` rows of `depth` values (`A[r][k] =
/// a[r][k]`): the keys of a decoding step, read in place.
#[inline(always)]
pub(crate) fn outer_a_rows<const MR: usize, const NR: usize, const FMA: bool>(
    depth: usize,
    a: &[&[f32]; MR],
    b: &[f32],
    acc: &mut [[f32; NR]; MR],
) {
    #[cfg(target_arch = "x86_64")]
    if NR == avx512::NR && avx512::available() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        return unsafe { avx512::outer_a_rows::<MR, FMA>(depth, a, b, acc.as_flattened_mut()) };
    }
    #[cfg(all(target_arch = "wasm32", feature = "relaxed-simd"))]
    if NR == relaxed::NR {
        return relaxed::outer_a_rows::<MR, FMA>(depth, a, b, acc.as_flattened_mut());
    }
    let rows: [&[f32]; MR] = std::array::from_fn(|r| &a[r][..depth]);
    let b = &b[..depth * NR];
    let mut c = *acc;
    for (k, brow) in b.chunks_exact(NR).enumerate() {
        for r in 0..MR {
            let x = rows[r][k];
            for j in 0..NR {
                c[r][j] = madd::<FMA>(x, brow[j], c[r][j]);
            }
        }
    }
    *acc = c;
}

/// [`outer`] with `B` given as rows, `NR` values from column `col` of each
/// (`B[k][j] = b[k][col + j]`): the values of a decoding step, read in place.
#[inline(always)]
pub(crate) fn outer_b_rows<const MR: usize, const NR: usize, const FMA: bool>(
    a: &[f32],
    lda: usize,
    b: &[&[f32]],
    col: usize,
    acc: &mut [[f32; NR]; MR],
) {
    #[cfg(target_arch = "x86_64")]
    if NR == avx512::NR && avx512::available() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        return unsafe { avx512::outer_b_rows::<MR, FMA>(a, lda, b, col, acc.as_flattened_mut()) };
    }
    #[cfg(all(target_arch = "wasm32", feature = "relaxed-simd"))]
    if NR == relaxed::NR {
        return relaxed::outer_b_rows::<MR, FMA>(a, lda, b, col, acc.as_flattened_mut());
    }
    let mut c = *acc;
    for (k, brow) in b.iter().enumerate() {
        let arow = &a[k * lda..][..MR];
        let brow = &brow[col..col + NR];
        for r in 0..MR {
            let x = arow[r];
            for j in 0..NR {
                c[r][j] = madd::<FMA>(x, brow[j], c[r][j]);
            }
        }
    }
    *acc = c;
}

/// Packs `MR` rows of `depth` values (`src[r * ld ..]`, rows past `rows` as
/// zeros) into a `[depth][MR]` panel, the layout [`outer`] reads `A` and `B` in.
#[inline(always)]
pub(crate) fn pack_panel<const MR: usize>(
    src: &[f32],
    ld: usize,
    rows: usize,
    depth: usize,
    dst: &mut [f32],
) {
    let dst = &mut dst[..depth * MR];
    for r in 0..MR {
        if r < rows {
            let row = &src[r * ld..r * ld + depth];
            for (k, &x) in row.iter().enumerate() {
                dst[k * MR + r] = x;
            }
        } else {
            for k in 0..depth {
                dst[k * MR + r] = 0.0;
            }
        }
    }
}

/// Loads `MR` rows of `NR` values from `c[r * ldc ..]` (rows past `rows` as zeros).
#[inline(always)]
pub(crate) fn load<const MR: usize, const NR: usize>(
    c: &[f32],
    ldc: usize,
    rows: usize,
) -> [[f32; NR]; MR] {
    let mut out = [[0.0; NR]; MR];
    for (r, row) in out.iter_mut().enumerate().take(rows) {
        row.copy_from_slice(&c[r * ldc..r * ldc + NR]);
    }
    out
}

/// Stores the first `rows` rows and `cols` columns of `tile` into `c[r * ldc ..]`.
#[inline(always)]
pub(crate) fn store<const MR: usize, const NR: usize>(
    tile: &[[f32; NR]; MR],
    c: &mut [f32],
    ldc: usize,
    rows: usize,
    cols: usize,
) {
    for (r, row) in tile.iter().enumerate().take(rows) {
        c[r * ldc..r * ldc + cols].copy_from_slice(&row[..cols]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outer_product_accumulates() {
        // A 2 × 3 (rows of 4), B 3 × 2: C = A · B + 1.
        let a = [1.0, 2.0, 3.0, 9.0, 4.0, 5.0, 6.0, 9.0];
        let mut packed = [0.0; 6];
        pack_panel::<2>(&a, 4, 2, 3, &mut packed);
        assert_eq!(packed, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let b = [1.0, 0.5, 2.0, 1.0, -1.0, 3.0];
        let mut acc = [[1.0f32; 2]; 2];
        outer::<2, 2, false>(3, &packed, 2, &b, &mut acc);
        assert_eq!(acc, [[3.0, 12.5], [9.0, 26.0]]);
        let mut fused = [[1.0f32; 2]; 2];
        outer::<2, 2, true>(3, &packed, 2, &b, &mut fused);
        assert_eq!(fused, acc);
        // A steps three values apart: the first two of each are used.
        let spaced = [1.0, 4.0, 7.0, 2.0, 5.0, 7.0, 3.0, 6.0, 7.0];
        let mut strided = [[1.0f32; 2]; 2];
        outer::<2, 2, true>(3, &spaced, 3, &b, &mut strided);
        assert_eq!(strided, acc);
        // A and B as rows.
        let mut by_rows = [[1.0f32; 2]; 2];
        outer_a_rows::<2, 2, false>(3, &[&a[..3], &a[4..7]], &b, &mut by_rows);
        assert_eq!(by_rows, acc);
        let b_rows: Vec<&[f32]> = b.chunks(2).collect();
        let mut by_b_rows = [[1.0f32; 2]; 2];
        outer_b_rows::<2, 2, true>(&packed, 2, &b_rows, 0, &mut by_b_rows);
        assert_eq!(by_b_rows, acc);
        let mut out = [0.0f32; 6];
        store(&acc, &mut out, 3, 2, 1);
        assert_eq!(out, [3.0, 0.0, 0.0, 9.0, 0.0, 0.0]);
        assert_eq!(load::<2, 2>(&out, 3, 1), [[3.0, 0.0], [0.0, 0.0]]);
        pack_panel::<2>(&a, 4, 1, 3, &mut packed);
        assert_eq!(packed, [1.0, 0.0, 2.0, 0.0, 3.0, 0.0]);
    }
}
