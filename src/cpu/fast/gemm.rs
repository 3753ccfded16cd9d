//! General f32 matrix products on the backend's micro-kernel, for the
//! attention family's projections and score products on a CPU engine.
//!
//! Each output element starts from its initial value (zero, a bias, or what
//! `C` holds) and adds its products in order of the inner index with a
//! rounded product and a rounded sum per step: the numbers the plain f32
//! oracles compute, so a layer's error against its f64 oracle is at most the
//! baseline's. Both operands are packed (`A` in groups of `MR` rows, `B` in
//! panels of `NR` columns), so any strides work, transposed ones included.

use super::isa::{dispatch, Isa, Job};
use super::kernel::{outer, store};
use super::threads;

/// A read-only matrix view: element `(r, c)` is `data[r * row_stride + c * col_stride]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major `rows × cols` matrix.
    ///
    /// # Panics
    /// If `data` holds fewer than `rows · cols` values.
    pub(crate) fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert!(data.len() >= rows * cols, "matrix data too short");
        MatRef {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose of a row-major `rows × cols` matrix: a `cols × rows` view
    /// (the `Wᵀ` of `x Wᵀ` for a `[out, in]` weight).
    ///
    /// # Panics
    /// If `data` holds fewer than `rows · cols` values.
    pub(crate) fn transposed(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert!(data.len() >= rows * cols, "matrix data too short");
        MatRef {
            data,
            rows: cols,
            cols: rows,
            row_stride: 1,
            col_stride: cols,
        }
    }

    /// A `rows × cols` view with explicit strides (element `(r, c)` at
    /// `data[r · row_stride + c · col_stride]`), e.g. a block of columns.
    ///
    /// # Panics
    /// If the last element lies beyond `data`.
    pub(crate) fn strided(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        if rows > 0 && cols > 0 {
            assert!(
                data.len() > (rows - 1) * row_stride + (cols - 1) * col_stride,
                "matrix data too short"
            );
        }
        MatRef {
            data,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.row_stride + c * self.col_stride]
    }
}

/// What the output holds before the products are added.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Init<'a> {
    /// Zeros.
    Zero,
    /// `bias[c]` in every row.
    Bias(&'a [f32]),
}

/// `C = init + A · B` into the row-major `m × n` slice `c` (`m = a.rows`,
/// `n = b.cols`), on up to `threads` threads.
///
/// # Panics
/// If the inner dimensions, the output's length or the bias length disagree
/// (the callers check shapes and return typed errors first).
pub(crate) fn matmul(a: MatRef<'_>, b: MatRef<'_>, init: Init<'_>, c: &mut [f32], threads: usize) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions");
    assert_eq!(c.len(), m * n, "output size");
    if let Init::Bias(bias) = init {
        assert_eq!(bias.len(), n, "bias length");
    }
    if m == 0 || n == 0 {
        return;
    }
    let isa = Isa::detect();
    let (mr, nr) = (isa.mr(), isa.nr());
    let panels = n.div_ceil(nr);
    // B once, as panels of nr columns: [panels][k][nr], zero columns past n.
    let mut packed_b = vec![0.0f32; panels * k * nr];
    for (p, panel) in packed_b.chunks_exact_mut(k * nr).enumerate() {
        for kk in 0..k {
            for j in 0..nr.min(n - p * nr) {
                panel[kk * nr + j] = b.at(kk, p * nr + j);
            }
        }
    }
    // Blocks of whole row groups, about four work items per thread.
    let groups = m.div_ceil(mr);
    let block_rows = mr * groups.div_ceil(4 * threads.max(1));
    let items: Vec<(usize, &mut [f32])> = c
        .chunks_mut(block_rows * n)
        .enumerate()
        .map(|(i, rows)| (i * block_rows, rows))
        .collect();
    threads::for_each(items, threads, Vec::new, |(r0, out), packed_a| {
        dispatch(
            isa,
            Block {
                a,
                packed_b: &packed_b,
                init,
                r0,
                out,
                packed_a,
                k,
                n,
            },
        )
    });
}

/// One block of output rows.
struct Block<'x, 'a> {
    a: MatRef<'a>,
    packed_b: &'x [f32],
    init: Init<'x>,
    r0: usize,
    out: &'x mut [f32],
    packed_a: &'x mut Vec<f32>,
    k: usize,
    n: usize,
}

impl Job for Block<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<const MR: usize, const NR: usize, const FMA: bool>(self) {
        let Block {
            a,
            packed_b,
            init,
            r0,
            out,
            packed_a,
            k,
            n,
        } = self;
        let rows = out.len() / n;
        packed_a.clear();
        packed_a.resize(k * MR, 0.0);
        for g0 in (0..rows).step_by(MR) {
            let group = MR.min(rows - g0);
            for kk in 0..k {
                for r in 0..MR {
                    packed_a[kk * MR + r] = if r < group {
                        a.at(r0 + g0 + r, kk)
                    } else {
                        0.0
                    };
                }
            }
            for (p, panel) in packed_b.chunks_exact(k * NR).enumerate() {
                let c0 = p * NR;
                let cols = NR.min(n - c0);
                let mut acc = [[0.0f32; NR]; MR];
                for row in acc.iter_mut().take(group) {
                    for (j, x) in row.iter_mut().enumerate().take(cols) {
                        *x = match init {
                            Init::Zero => 0.0,
                            Init::Bias(bias) => bias[c0 + j],
                        };
                    }
                }
                outer::<MR, NR, false>(k, packed_a, MR, panel, &mut acc);
                store(&acc, &mut out[g0 * n + c0..], n, group, cols);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// The plain product, element by element in order of the inner index.
    fn naive(a: MatRef<'_>, b: MatRef<'_>, init: &[f32]) -> Vec<f32> {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let mut c = init.to_vec();
        for i in 0..m {
            for j in 0..n {
                let mut acc = c[i * n + j];
                for kk in 0..k {
                    acc += a.at(i, kk) * b.at(kk, j);
                }
                c[i * n + j] = acc;
            }
        }
        c
    }

    #[test]
    fn products_match_the_plain_sums_bit_for_bit() {
        let mut rng = SplitMix64::new(5);
        for (m, k, n) in [(1, 1, 1), (7, 33, 5), (50, 64, 100), (13, 1, 40)] {
            let a = rng.normal_vec(m * k, 1.0);
            let bt = rng.normal_vec(n * k, 1.0);
            let bias = rng.normal_vec(n, 1.0);
            for threads in [1, 3] {
                let (am, bm) = (MatRef::rows(&a, m, k), MatRef::transposed(&bt, n, k));
                let mut c = vec![0.0; m * n];
                matmul(am, bm, Init::Bias(&bias), &mut c, threads);
                let start: Vec<f32> = (0..m * n).map(|i| bias[i % n]).collect();
                assert_eq!(c, naive(am, bm, &start), "{m}x{k}x{n}");
                // Row-major B (k × n): reuse bt's values.
                let b2 = MatRef::rows(&bt, k, n);
                let mut c2 = vec![0.0; m * n];
                matmul(am, b2, Init::Zero, &mut c2, threads);
                assert_eq!(c2, naive(am, b2, &vec![0.0; m * n]));
            }
        }
    }
}
