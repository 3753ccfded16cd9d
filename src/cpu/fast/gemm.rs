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
    matmul_packed(a, &PackedMatrix::pack(b), init, c, threads);
}

/// `B` packed once for the products that read it: panels of the widest
/// register tile's `NR` columns of this machine's instruction set,
/// `[panels][k][NR]`, zero past the last column. A weight packed at load
/// ([`PackedMatrix::pack`] of its `Wᵀ`) is read once per product, in order,
/// by vector loads: a decoder step's products then run at memory speed.
#[derive(Debug, Clone)]
pub(crate) struct PackedMatrix {
    data: Vec<f32>,
    k: usize,
    n: usize,
    nr: usize,
}

impl PackedMatrix {
    /// `b` (`k × n`) as panels for this machine's widest tile.
    pub(crate) fn pack(b: MatRef<'_>) -> PackedMatrix {
        let (k, n, nr) = (b.rows, b.cols, Isa::detect().nr());
        let panels = n.div_ceil(nr);
        let mut data = vec![0.0f32; panels * k * nr];
        for (p, panel) in data.chunks_exact_mut(k * nr).enumerate() {
            let cols = nr.min(n - p * nr);
            if b.col_stride == 1 {
                // Row-major B: each row of the panel is a contiguous run.
                for kk in 0..k {
                    let at = kk * b.row_stride + p * nr;
                    panel[kk * nr..kk * nr + cols].copy_from_slice(&b.data[at..at + cols]);
                }
            } else {
                // Each column of the panel (a row of a transposed B) is read in order.
                for j in 0..cols {
                    for kk in 0..k {
                        panel[kk * nr + j] = b.at(kk, p * nr + j);
                    }
                }
            }
        }
        PackedMatrix { data, k, n, nr }
    }

    /// Rows of `B` (the inner dimension).
    pub(crate) fn rows(&self) -> usize {
        self.k
    }

    /// Columns of `B`.
    pub(crate) fn cols(&self) -> usize {
        self.n
    }
}

/// [`matmul`] with `B` packed beforehand. Many rows are shared out among the
/// threads by blocks of rows; a few rows (a decoder step's one token) by
/// blocks of columns, so that every thread streams its share of `B`.
///
/// # Panics
/// As [`matmul`]; also where `b` was packed for another register tile.
pub(crate) fn matmul_packed(
    a: MatRef<'_>,
    b: &PackedMatrix,
    init: Init<'_>,
    c: &mut [f32],
    threads: usize,
) {
    let (m, k, n) = (a.rows, a.cols, b.n);
    assert_eq!(b.k, k, "inner dimensions");
    assert_eq!(c.len(), m * n, "output size");
    if let Init::Bias(bias) = init {
        assert_eq!(bias.len(), n, "bias length");
    }
    if m == 0 || n == 0 {
        return;
    }
    let isa = Isa::detect();
    let (mr, nr) = (isa.mr(), isa.nr());
    assert_eq!(b.nr, nr, "packed for another tile");
    let panel_len = k * nr;
    let groups = m.div_ceil(mr);
    let threads = threads.max(1);
    if groups >= threads || n <= nr {
        // Blocks of whole row groups, about four work items per thread.
        let block_rows = mr * groups.div_ceil(4 * threads);
        let items: Vec<(usize, &mut [f32])> = c
            .chunks_mut(block_rows * n)
            .enumerate()
            .map(|(i, rows)| (i * block_rows, rows))
            .collect();
        threads::for_each(items, threads, Vec::new, |(r0, out), packed_a| {
            let block = Block {
                a,
                panels: &b.data,
                col0: 0,
                ldc: n,
                init,
                r0,
                out,
                packed_a,
                k,
                n,
            };
            dispatch(isa, block)
        });
        return;
    }
    // Few rows: blocks of panels, each thread's columns into a block of its
    // own (rows × its columns), then into C.
    let panels = n.div_ceil(nr);
    let per_item = panels.div_ceil(4 * threads).max(1);
    let mut blocks = vec![0.0f32; m * panels * nr];
    let items: Vec<(usize, &mut [f32])> = blocks
        .chunks_mut(m * per_item * nr)
        .enumerate()
        .map(|(i, out)| (i * per_item, out))
        .collect();
    threads::for_each(items, threads, Vec::new, |(p0, out), packed_a| {
        let count = out.len() / (m * nr);
        let block = Block {
            a,
            panels: &b.data[p0 * panel_len..(p0 + count) * panel_len],
            col0: p0 * nr,
            ldc: count * nr,
            init,
            r0: 0,
            out,
            packed_a,
            k,
            n,
        };
        dispatch(isa, block)
    });
    for (i, block) in blocks.chunks(m * per_item * nr).enumerate() {
        let (c0, width) = (i * per_item * nr, block.len() / m);
        let cols = width.min(n - c0);
        for r in 0..m {
            c[r * n + c0..r * n + c0 + cols].copy_from_slice(&block[r * width..r * width + cols]);
        }
    }
}

/// One block of output rows over a run of panels of `B`.
struct Block<'x, 'a> {
    a: MatRef<'a>,
    /// The panels this block computes.
    panels: &'x [f32],
    /// The column of `B` its first panel starts at.
    col0: usize,
    /// The row stride of `out`.
    ldc: usize,
    init: Init<'x>,
    r0: usize,
    /// Rows from `r0`, `ldc` apart; column 0 is `col0`.
    out: &'x mut [f32],
    packed_a: &'x mut Vec<f32>,
    k: usize,
    /// Columns of `B` in all.
    n: usize,
}

impl Job for Block<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<const MR: usize, const NR: usize, const FMA: bool>(self) {
        // A few rows (a decoder step's tokens) take groups of their own size:
        // groups of MR would multiply mostly padding, and a step's products
        // would be bound by that arithmetic rather than by reading B.
        match self.out.len() / self.ldc {
            1 => self.groups_of::<1, NR>(),
            2 => self.groups_of::<2, NR>(),
            3 | 4 if MR > 4 => self.groups_of::<4, NR>(),
            _ => self.groups_of::<MR, NR>(),
        }
    }
}

impl Block<'_, '_> {
    /// The block's rows in groups of `MR`, each against every panel.
    #[inline(always)]
    fn groups_of<const MR: usize, const NR: usize>(self) {
        let Block {
            a,
            panels,
            col0,
            ldc,
            init,
            r0,
            out,
            packed_a,
            k,
            n,
        } = self;
        let rows = out.len() / ldc;
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
            for (p, panel) in panels.chunks_exact(k * NR).enumerate() {
                let c0 = col0 + p * NR;
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
                store(&acc, &mut out[g0 * ldc + (c0 - col0)..], ldc, group, cols);
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
        // Few rows over many columns: shared out by blocks of panels.
        for (m, k, n) in [
            (1, 1, 1),
            (7, 33, 5),
            (50, 64, 100),
            (13, 1, 40),
            (1, 97, 1025),
            (3, 64, 257),
            (2, 40, 70),
            (4, 17, 100),
        ] {
            let a = rng.normal_vec(m * k, 1.0);
            let bt = rng.normal_vec(n * k, 1.0);
            let bias = rng.normal_vec(n, 1.0);
            for threads in [1, 3, 8] {
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
