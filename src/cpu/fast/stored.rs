//! Keys and values read where a store keeps them (a paged cache's pages) in
//! the form it keeps them: f32 rows are read in place like a tensor's; f16
//! and int8 rows are widened to f32 a tile at a time, in the caches, so a
//! decoding step streams the stored bytes once and no f32 copy of the
//! sequence is ever made.

/// One stored row of keys or values.
#[derive(Debug, Clone, Copy)]
pub enum StoredRow<'a> {
    /// f32 values, read in place.
    F32(&'a [f32]),
    /// f16 values.
    F16(&'a [half::f16]),
    /// int8 values and the row's scale (`crate::int8`).
    I8(&'a [i8], f32),
}

impl<'a> StoredRow<'a> {
    /// The row as f32: itself where stored as f32, else widened into `buf`.
    #[inline(always)]
    pub(crate) fn widened<'s>(self, buf: &'s mut Vec<f32>) -> &'s [f32]
    where
        'a: 's,
    {
        match self {
            StoredRow::F32(row) => row,
            StoredRow::F16(row) => {
                buf.resize(row.len(), 0.0);
                widen_f16(row, buf);
                buf
            }
            StoredRow::I8(row, scale) => {
                buf.resize(row.len(), 0.0);
                crate::int8::dequantize(row, scale, buf);
                buf
            }
        }
    }

    /// Widens the row into `out` (its length).
    #[inline(always)]
    pub(crate) fn widen_into(self, out: &mut [f32]) {
        match self {
            StoredRow::F32(row) => out.copy_from_slice(row),
            StoredRow::F16(row) => widen_f16(row, out),
            StoredRow::I8(row, scale) => crate::int8::dequantize(row, scale, out),
        }
    }
}

/// f16 to f32 (exact), through the CPU's conversion instructions where it
/// has them (`half`'s slice conversion checks once per row).
#[inline(always)]
fn widen_f16(row: &[half::f16], out: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    row.convert_to_f32_slice(out);
}

/// Consecutive stored rows of keys or values, one after another in memory
/// (`len` rows of `dim` values; int8 rows with a scale each).
#[derive(Debug, Clone, Copy)]
pub enum StoredRows<'a> {
    /// f32 rows, read in place.
    F32(&'a [f32]),
    /// f16 rows.
    F16(&'a [half::f16]),
    /// int8 rows and their scales.
    I8(&'a [i8], &'a [f32]),
}

impl<'a> StoredRows<'a> {
    /// Rows held, at `dim` values a row.
    #[inline(always)]
    pub(crate) fn len(self, dim: usize) -> usize {
        match self {
            StoredRows::F32(r) => r.len() / dim,
            StoredRows::F16(r) => r.len() / dim,
            StoredRows::I8(_, scales) => scales.len(),
        }
    }

    /// Row `i` (of `dim` values).
    #[inline(always)]
    pub(crate) fn row(self, i: usize, dim: usize) -> StoredRow<'a> {
        match self {
            StoredRows::F32(r) => StoredRow::F32(&r[i * dim..(i + 1) * dim]),
            StoredRows::F16(r) => StoredRow::F16(&r[i * dim..(i + 1) * dim]),
            StoredRows::I8(r, scales) => StoredRow::I8(&r[i * dim..(i + 1) * dim], scales[i]),
        }
    }

    /// The first `n` rows, as f32 slices of `dim`: in place where stored as
    /// f32, else widened into `out` (at least `n · dim` long) first.
    #[inline(always)]
    pub(crate) fn widen_rows(self, n: usize, dim: usize, out: &mut [f32]) {
        match self {
            StoredRows::F32(r) => out[..n * dim].copy_from_slice(&r[..n * dim]),
            StoredRows::F16(r) => widen_f16(&r[..n * dim], &mut out[..n * dim]),
            StoredRows::I8(r, scales) => {
                for (i, o) in out[..n * dim].chunks_exact_mut(dim).enumerate() {
                    crate::int8::dequantize(&r[i * dim..(i + 1) * dim], scales[i], o);
                }
            }
        }
    }

    /// Asks the CPU to bring the first `n` rows into its caches.
    #[inline(always)]
    pub(crate) fn prefetch(self, n: usize, dim: usize) {
        match self {
            StoredRows::F32(r) => super::dots::prefetch(&r[..n * dim]),
            StoredRows::F16(r) => super::dots::prefetch(&r[..n * dim]),
            StoredRows::I8(r, scales) => {
                super::dots::prefetch(&r[..n * dim]);
                super::dots::prefetch(&scales[..n]);
            }
        }
    }
}

/// Where the keys and values of a call live when they are not tensors: the
/// keys (or values, where `value`) of `bkv` (`b · Hkv + kv head`) from row
/// `t` to the end of the run of rows stored after it (at least row `t`).
pub trait RowStore: Sync + std::fmt::Debug {
    /// The rows from `t` on, as stored.
    fn rows(&self, value: bool, bkv: usize, t: usize) -> StoredRows<'_>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_widen_to_their_values() {
        let mut buf = Vec::new();
        let f = [1.5f32, -2.0];
        assert_eq!(StoredRow::F32(&f).widened(&mut buf), &f);
        let h = [half::f16::from_f32(0.5), half::f16::from_f32(-3.0)];
        assert_eq!(StoredRow::F16(&h).widened(&mut buf), &[0.5, -3.0]);
        let mut out = [0.0f32; 3];
        StoredRow::I8(&[2, -127, 0], 0.25).widen_into(&mut out);
        assert_eq!(out, [0.5, -31.75, 0.0]);
    }
}
