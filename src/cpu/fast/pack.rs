//! Keys and values laid out for the kernels, one key tile at a time.
//!
//! A tile of `bk` keys holds its keys as groups of `MR` keys, each `[Dk][MR]`
//! (the `A` operand of the `Sᵀ = K Qᵀ` kernel), and its values as column
//! panels of `NR` columns, each `[bk][NR]` (the `B` operand of `O += P V`),
//! zero-padded past the last key and the last column. Values read in place
//! would be rows `4·Dv` bytes apart, a power-of-two stride that keeps the same
//! few L1 sets busy. Packing also records whether all of a tile's values are
//! finite, which decides how the kernel may skip masked keys.
//!
//! When several work items read the same (batch, KV head) — several query
//! blocks, or the query heads of a GQA group — [`PackedKv`] packs every tile
//! once up front and they share it; when only one does (decoding), the block
//! packs each tile into its own scratch as it goes ([`pack_tile`]).

use super::stored::{RowStore, StoredRow, StoredRows};
use crate::problem::AttentionDims;
use crate::tensor::HostTensor;

/// Where the keys and values of one call come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvSource<'a> {
    pub dims: AttentionDims,
    pub rows: KvRows<'a>,
}

/// The keys and values themselves: tensors (with the past before them), or a
/// store that keeps rows its own way.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KvRows<'a> {
    Tensors {
        k: &'a HostTensor,
        v: &'a HostTensor,
        past_key: Option<&'a HostTensor>,
        past_value: Option<&'a HostTensor>,
    },
    Stored(&'a dyn RowStore),
}

/// The tile geometry: groups of `mr` keys, panels of `nr` columns, `bk` keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TileShape {
    pub mr: usize,
    pub nr: usize,
    pub bk: usize,
    /// `Dv` rounded up to a multiple of `nr`.
    pub ldv: usize,
}

impl TileShape {
    /// Floats of one tile's keys.
    pub(crate) fn key_len(&self, dk: usize) -> usize {
        self.bk * dk
    }

    /// Floats of one tile's values.
    pub(crate) fn value_len(&self) -> usize {
        self.bk * self.ldv
    }
}

impl<'a> KvSource<'a> {
    /// Values in a row of the keys (or of the values, where `value`).
    #[inline(always)]
    pub(crate) fn width(&self, value: bool) -> usize {
        if value {
            self.dims.v_head_dim
        } else {
            self.dims.head_dim
        }
    }

    /// The rows of the concatenation `[past; new]` of the values (or, when
    /// `value` is false, the keys) for `bkv` (`b · Hkv + kv head`) from row
    /// `t` to the end of the run stored after it, as stored.
    #[inline(always)]
    pub(crate) fn rows(&self, value: bool, bkv: usize, t: usize) -> StoredRows<'a> {
        let (k, v, past_key, past_value) = match self.rows {
            KvRows::Tensors {
                k,
                v,
                past_key,
                past_value,
            } => (k, v, past_key, past_value),
            KvRows::Stored(store) => return store.rows(value, bkv, t),
        };
        let d = &self.dims;
        let (past, new, width) = if value {
            (past_value, v, d.v_head_dim)
        } else {
            (past_key, k, d.head_dim)
        };
        let (tensor, len, r) = match past {
            Some(p) if t < d.past_len => (p, d.past_len, t),
            _ => (new, d.kv_len, t - d.past_len),
        };
        let start = (bkv * len + r) * width;
        let end = (bkv + 1) * len * width;
        StoredRows::F32(&tensor.data()[start..end])
    }

    /// Row `t` of [`KvSource::rows`], as stored.
    #[inline(always)]
    pub(crate) fn row(&self, value: bool, bkv: usize, t: usize) -> StoredRow<'a> {
        self.rows(value, bkv, t).row(0, self.width(value))
    }
}

/// Packs keys `j0 .. j0 + nk` of `bkv` into `keys` (`[bk / mr][Dk][mr]`) and
/// their values into `values` (`[ldv / nr][bk][nr]`); returns whether every
/// value is finite.
pub(crate) fn pack_tile(
    src: &KvSource<'_>,
    shape: &TileShape,
    bkv: usize,
    j0: usize,
    nk: usize,
    keys: &mut [f32],
    values: &mut [f32],
) -> bool {
    let dk = src.dims.head_dim;
    let TileShape { mr, nr, bk, .. } = *shape;
    let keys = &mut keys[..shape.key_len(dk)];
    let values = &mut values[..shape.value_len()];
    if nk < bk {
        keys.fill(0.0);
        values.fill(0.0);
    }
    let mut finite = true;
    let mut widened = Vec::new();
    for k in 0..nk {
        let key = src.row(false, bkv, j0 + k).widened(&mut widened);
        let group = &mut keys[(k / mr) * dk * mr..(k / mr + 1) * dk * mr];
        for (d, &x) in key.iter().enumerate() {
            group[d * mr + k % mr] = x;
        }
        let value = src.row(true, bkv, j0 + k).widened(&mut widened);
        for (c, chunk) in value.chunks(nr).enumerate() {
            let start = (c * bk + k) * nr;
            values[start..start + chunk.len()].copy_from_slice(chunk);
        }
        finite &= super::math::all_finite(value);
    }
    finite
}

/// Every tile of one (batch, KV head), packed once and shared.
#[derive(Debug)]
pub(crate) struct PackedKv {
    keys: Vec<f32>,
    values: Vec<f32>,
    finite: Vec<bool>,
}

impl PackedKv {
    /// Packs every tile of `bkv`.
    pub(crate) fn new(src: &KvSource<'_>, shape: &TileShape, bkv: usize) -> PackedKv {
        let (t_len, dk) = (src.dims.total_len(), src.dims.head_dim);
        let tiles = t_len.div_ceil(shape.bk);
        let (kl, vl) = (shape.key_len(dk), shape.value_len());
        let mut keys = vec![0.0f32; tiles * kl];
        let mut values = vec![0.0f32; tiles * vl];
        let finite = (0..tiles)
            .map(|t| {
                let j0 = t * shape.bk;
                pack_tile(
                    src,
                    shape,
                    bkv,
                    j0,
                    shape.bk.min(t_len - j0),
                    &mut keys[t * kl..(t + 1) * kl],
                    &mut values[t * vl..(t + 1) * vl],
                )
            })
            .collect();
        PackedKv {
            keys,
            values,
            finite,
        }
    }

    /// Tile `t`: its keys, its values and whether the values are all finite.
    pub(crate) fn tile(&self, t: usize, shape: &TileShape, dk: usize) -> (&[f32], &[f32], bool) {
        let (kl, vl) = (shape.key_len(dk), shape.value_len());
        (
            &self.keys[t * kl..(t + 1) * kl],
            &self.values[t * vl..(t + 1) * vl],
            self.finite[t],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::AttentionOptions;
    use crate::problem::{validate, AttentionInputs};

    #[test]
    fn tiles_of_groups_and_panels() {
        // B 1, Hkv 1, past 2 + new 3 keys, Dk 2, Dv 3; tiles of 4 keys.
        let q = HostTensor::new([1, 1, 1, 2], vec![0.0; 2]).unwrap();
        let k = HostTensor::new([1, 1, 3, 2], vec![3., 30., 4., 40., 5., 50.]).unwrap();
        let v = HostTensor::new([1, 1, 3, 3], (0..9).map(|x| x as f32).collect()).unwrap();
        let pk = HostTensor::new([1, 1, 2, 2], vec![1., 10., 2., 20.]).unwrap();
        let mut pv = HostTensor::new([1, 1, 2, 3], vec![-1.0; 6]).unwrap();
        pv.data_mut()[5] = f32::NAN; // past row 1, column 2
        let inputs = AttentionInputs::new(&q, &k, &v).with_past(&pk, &pv);
        let dims = validate(&inputs, &AttentionOptions::default()).unwrap();
        let src = KvSource {
            dims,
            rows: KvRows::Tensors {
                k: &k,
                v: &v,
                past_key: Some(&pk),
                past_value: Some(&pv),
            },
        };
        let shape = TileShape {
            mr: 2,
            nr: 2,
            bk: 4,
            ldv: 4,
        };
        let p = PackedKv::new(&src, &shape, 0);
        let (keys, values, finite) = p.tile(0, &shape, 2);
        // Groups of 2 keys, [d][lane]: keys 0, 1 then 2, 3.
        assert_eq!(keys, &[1., 2., 10., 20., 3., 4., 30., 40.]);
        // Panel 0 (columns 0, 1) then panel 1 (column 2 and a zero column).
        assert_eq!(&values[..8], &[-1., -1., -1., -1., 0., 1., 3., 4.]);
        assert_eq!(&values[8..10], &[-1., 0.]);
        assert!(values[10].is_nan());
        assert_eq!(&values[11..], &[0., 2., 0., 5., 0.]);
        assert!(!finite);
        let (keys, values, finite) = p.tile(1, &shape, 2);
        assert_eq!(keys, &[5., 0., 50., 0., 0., 0., 0., 0.]);
        assert_eq!(
            values,
            &[6., 7., 0., 0., 0., 0., 0., 0., 8., 0., 0., 0., 0., 0., 0., 0.]
        );
        assert!(finite);
    }
}
