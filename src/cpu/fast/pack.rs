//! Keys and values of one (batch, KV head) laid out for the kernels, once per
//! call and shared by every query head of the group and every query block.
//!
//! Keys become groups of `MR` keys, each `[Dk][MR]`, the `A` operand of the
//! `Sᵀ = K Qᵀ` kernel (the last group is padded with zero keys). Values become column panels of `NR` columns, each
//! `[T][NR]` (the last padded with zero columns), so the P·V kernel reads a
//! tile's values for one column chunk as one contiguous run: rows of `Dv`
//! read in place would be `4·Dv` bytes apart, a power-of-two stride that
//! keeps the same few L1 sets busy. For every key tile the packing also
//! records whether all its values are finite, which decides how the kernel
//! may skip masked keys.

use crate::problem::AttentionDims;
use crate::tensor::HostTensor;

/// The K and V of one (batch, KV head), ready for the kernels.
#[derive(Debug)]
pub(crate) struct PackedKv {
    /// `ceil(T / mr)` groups of `[Dk][mr]`.
    pub keys: Vec<f32>,
    /// `ldv / nr` panels of `[T][nr]` values (padding columns zero).
    pub values: Vec<f32>,
    /// `Dv` rounded up to a multiple of `nr`.
    pub ldv: usize,
    /// Per key tile of `tile` keys: whether every value in it is finite.
    pub finite: Vec<bool>,
}

/// Row `t` of the concatenation `[past; new]` for (b, KV head), `width` wide.
fn row<'a>(
    past: Option<&'a HostTensor>,
    new: &'a HostTensor,
    dims: &AttentionDims,
    bk: usize,
    t: usize,
    width: usize,
) -> &'a [f32] {
    let (tensor, len, r) = match past {
        Some(p) if t < dims.past_len => (p, dims.past_len, t),
        _ => (new, dims.kv_len, t - dims.past_len),
    };
    let start = (bk * len + r) * width;
    &tensor.data()[start..start + width]
}

/// Packs K and V of batch-and-KV-head index `bkv` (`b · Hkv + kv head`) for
/// groups of `mr` keys, value panels of `nr` columns and key tiles of `tile` keys.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack(
    dims: &AttentionDims,
    k: &HostTensor,
    v: &HostTensor,
    past_key: Option<&HostTensor>,
    past_value: Option<&HostTensor>,
    bkv: usize,
    mr: usize,
    nr: usize,
    tile: usize,
) -> PackedKv {
    let (t_len, dk, dv) = (dims.total_len(), dims.head_dim, dims.v_head_dim);
    let groups = t_len.div_ceil(mr);
    let mut keys = vec![0.0f32; groups * dk * mr];
    for t in 0..t_len {
        let key = row(past_key, k, dims, bkv, t, dk);
        let group = &mut keys[(t / mr) * dk * mr..(t / mr + 1) * dk * mr];
        let lane = t % mr;
        for (d, &x) in key.iter().enumerate() {
            group[d * mr + lane] = x;
        }
    }
    let ldv = dv.div_ceil(nr) * nr;
    let mut values = vec![0.0f32; t_len * ldv];
    let mut finite = vec![true; t_len.div_ceil(tile)];
    for t in 0..t_len {
        let value = row(past_value, v, dims, bkv, t, dv);
        for (c, chunk) in value.chunks(nr).enumerate() {
            let start = (c * t_len + t) * nr;
            values[start..start + chunk.len()].copy_from_slice(chunk);
        }
        finite[t / tile] &= value.iter().all(|x| x.is_finite());
    }
    PackedKv {
        keys,
        values,
        ldv,
        finite,
    }
}

impl PackedKv {
    /// Key group `g` (keys `g·mr .. (g+1)·mr`), `[Dk][mr]`.
    pub(crate) fn key_group(&self, g: usize, dk: usize, mr: usize) -> &[f32] {
        &self.keys[g * dk * mr..(g + 1) * dk * mr]
    }

    /// The values of keys `j0..` in column panel `c` (columns `c·nr ..`), `[..][nr]`.
    pub(crate) fn value_panel(&self, c: usize, j0: usize, t_len: usize, nr: usize) -> &[f32] {
        &self.values[(c * t_len + j0) * nr..(c + 1) * t_len * nr]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::AttentionOptions;
    use crate::problem::{validate, AttentionInputs};

    #[test]
    fn panels_and_padded_values() {
        // B 1, Hkv 1, past 2 + new 3 keys, Dk 2, Dv 3.
        let q = HostTensor::new([1, 1, 1, 2], vec![0.0; 2]).unwrap();
        let k = HostTensor::new([1, 1, 3, 2], vec![3., 30., 4., 40., 5., 50.]).unwrap();
        let v = HostTensor::new([1, 1, 3, 3], (0..9).map(|x| x as f32).collect()).unwrap();
        let pk = HostTensor::new([1, 1, 2, 2], vec![1., 10., 2., 20.]).unwrap();
        let mut pv = HostTensor::new([1, 1, 2, 3], vec![-1.0; 6]).unwrap();
        pv.data_mut()[4] = f32::NAN;
        let inputs = AttentionInputs::new(&q, &k, &v).with_past(&pk, &pv);
        let dims = validate(&inputs, &AttentionOptions::default()).unwrap();
        let p = pack(&dims, &k, &v, Some(&pk), Some(&pv), 0, 4, 4, 4);
        // Group 0: keys 0..4, [d][lane]; group 1: key 4 then zero padding.
        assert_eq!(p.key_group(0, 2, 4), &[1., 2., 3., 4., 10., 20., 30., 40.]);
        assert_eq!(p.key_group(1, 2, 4), &[5., 0., 0., 0., 50., 0., 0., 0.]);
        assert_eq!(p.ldv, 4);
        // Key 2 is the first new one: values 0, 1, 2 and a zero column.
        assert_eq!(&p.value_panel(0, 2, 5, 4)[..4], &[0., 1., 2., 0.]);
        assert_eq!(p.finite, vec![false, true]);
    }
}
