//! The inputs and outputs of one attention call, and the validation that turns
//! them into checked problem sizes.
//!
//! Both backends validate through [`validate`], so a bad input gives the same
//! error on the GPU and on the CPU.

use crate::error::{Error, Result};
use crate::options::AttentionOptions;
use crate::tensor::{DType, HostMask, HostTensor};

/// Anything with a shape that can stand for Q, K, V or a past tensor.
pub trait TensorRef {
    /// The mask type that goes with this tensor type.
    type Mask: MaskRef;
    /// The tensor's shape.
    fn shape(&self) -> &[usize];
    /// How its values are stored.
    fn dtype(&self) -> DType;
}

/// Anything with a shape that can stand for an attention mask.
pub trait MaskRef {
    /// The mask's shape.
    fn shape(&self) -> &[usize];
}

impl TensorRef for HostTensor {
    type Mask = HostMask;
    fn shape(&self) -> &[usize] {
        HostTensor::shape(self)
    }
    fn dtype(&self) -> DType {
        HostTensor::dtype(self)
    }
}

impl MaskRef for HostMask {
    fn shape(&self) -> &[usize] {
        HostMask::shape(self)
    }
}

/// The inputs of one attention call, named as in the ONNX operator.
///
/// `T` is [`HostTensor`] for host data or [`crate::Tensor`] for data already on the
/// engine's device.
#[derive(Debug)]
pub struct AttentionInputs<'a, T: TensorRef> {
    /// Queries `[B, Hq, Nq, Dk]`.
    pub q: &'a T,
    /// Keys `[B, Hkv, Nk, Dk]`.
    pub k: &'a T,
    /// Values `[B, Hkv, Nk, Dv]`.
    pub v: &'a T,
    /// Optional mask, broadcast to `[B, Hq, Nq, T]`.
    pub attn_mask: Option<&'a T::Mask>,
    /// Optional cached keys `[B, Hkv, P, Dk]`; requires `past_value`.
    pub past_key: Option<&'a T>,
    /// Optional cached values `[B, Hkv, P, Dv]`; requires `past_key`.
    pub past_value: Option<&'a T>,
    /// Optional per-batch count of valid keys `[B]` (an external cache).
    pub nonpad_kv_seqlen: Option<&'a [i64]>,
}

impl<T: TensorRef> Clone for AttentionInputs<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: TensorRef> Copy for AttentionInputs<'_, T> {}

impl<'a, T: TensorRef> AttentionInputs<'a, T> {
    /// Q, K and V with no optional inputs.
    pub fn new(q: &'a T, k: &'a T, v: &'a T) -> Self {
        Self {
            q,
            k,
            v,
            attn_mask: None,
            past_key: None,
            past_value: None,
            nonpad_kv_seqlen: None,
        }
    }

    /// Adds an attention mask.
    pub fn with_mask(mut self, mask: &'a T::Mask) -> Self {
        self.attn_mask = Some(mask);
        self
    }

    /// Adds a KV cache to prepend to K and V.
    pub fn with_past(mut self, past_key: &'a T, past_value: &'a T) -> Self {
        self.past_key = Some(past_key);
        self.past_value = Some(past_value);
        self
    }

    /// Adds per-batch valid key counts.
    pub fn with_nonpad_kv_seqlen(mut self, lengths: &'a [i64]) -> Self {
        self.nonpad_kv_seqlen = Some(lengths);
        self
    }
}

/// The outputs of one attention call. Optional outputs are `Some` when the
/// options asked for them.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionOutputs<T> {
    /// Y `[B, Hq, Nq, Dv]`.
    pub y: T,
    /// `present_key` `[B, Hkv, T, Dk]`.
    pub present_key: Option<T>,
    /// `present_value` `[B, Hkv, T, Dv]`.
    pub present_value: Option<T>,
    /// `qk_matmul_output` `[B, Hq, Nq, T]` in the requested mode.
    pub qk_matmul_output: Option<T>,
    /// Row logsumexp `[B, Hq, Nq]`.
    pub lse: Option<T>,
}

/// How the mask's elements map onto `[B, Hq, Nq, T]`: element strides per
/// target dimension (0 where the mask broadcasts) and its last-dimension length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskLayout {
    /// Stride for the batch index.
    pub batch_stride: usize,
    /// Stride for the query-head index.
    pub head_stride: usize,
    /// Stride for the query-row index.
    pub row_stride: usize,
    /// The mask's last dimension; keys at or beyond it are masked.
    pub cols: usize,
}

/// The checked sizes of one attention problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// B.
    pub batch: usize,
    /// Hq.
    pub q_heads: usize,
    /// Hkv.
    pub kv_heads: usize,
    /// Nq.
    pub q_len: usize,
    /// Nk: keys in K/V (without the past).
    pub kv_len: usize,
    /// P: keys in the past (0 without a past).
    pub past_len: usize,
    /// Dk.
    pub head_dim: usize,
    /// Dv.
    pub v_head_dim: usize,
    /// The mask's layout, when there is a mask.
    pub mask: Option<MaskLayout>,
    /// Whether a past was given.
    pub has_past: bool,
    /// Whether per-batch lengths were given.
    pub has_nonpad: bool,
    /// Which inputs hold f16 values (two to a 4-byte word): the plan reads
    /// f16 keys and values in place where a kernel can, and widens the rest.
    pub f16: F16Inputs,
    /// Where this problem sits in the call it came from: the whole call, or a
    /// piece of one split across storage bindings.
    pub(crate) placement: Placement,
}

/// Which of a call's inputs hold f16 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct F16Inputs {
    /// Q.
    pub q: bool,
    /// K.
    pub k: bool,
    /// V.
    pub v: bool,
    /// `past_key`.
    pub past_key: bool,
    /// `past_value`.
    pub past_value: bool,
}

impl F16Inputs {
    /// Whether K and V both hold f16 values.
    pub fn kv(&self) -> bool {
        self.k && self.v
    }
}

/// A piece's place in the call it was cut from (`run/split.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Placement {
    /// Added to every query's position (causal, windows, ALiBi): the piece's
    /// first query row, less its first key, plus what its own offset misses.
    pub position_shift: i64,
    /// The piece's first query head among the call's (ALiBi slopes).
    pub first_q_head: usize,
    /// The call's query heads (0: the piece's own).
    pub all_q_heads: usize,
}

impl AttentionDims {
    /// The dims of a call without a mask, a past or padding lengths:
    /// `batch` x (`q_heads`, `kv_heads`), `q_len` queries over `kv_len`
    /// keys, head dims `dk`, `dv` (for planning and reporting; calls get
    /// theirs from [`validate`]).
    pub fn plain(
        batch: usize,
        [q_heads, kv_heads]: [usize; 2],
        [q_len, kv_len]: [usize; 2],
        [head_dim, v_head_dim]: [usize; 2],
    ) -> AttentionDims {
        AttentionDims {
            batch,
            q_heads,
            kv_heads,
            q_len,
            kv_len,
            past_len: 0,
            head_dim,
            v_head_dim,
            mask: None,
            has_past: false,
            has_nonpad: false,
            f16: F16Inputs::default(),
            placement: Placement::default(),
        }
    }

    /// T = P + Nk, the number of keys each query sees before masking.
    pub fn total_len(&self) -> usize {
        self.past_len + self.kv_len
    }

    /// Hq / Hkv, the number of query heads sharing one KV head.
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    /// Y's shape `[B, Hq, Nq, Dv]`.
    pub fn y_shape(&self) -> Vec<usize> {
        vec![self.batch, self.q_heads, self.q_len, self.v_head_dim]
    }

    /// `present_key`'s shape `[B, Hkv, T, Dk]`.
    pub fn present_key_shape(&self) -> Vec<usize> {
        vec![self.batch, self.kv_heads, self.total_len(), self.head_dim]
    }

    /// `present_value`'s shape `[B, Hkv, T, Dv]`.
    pub fn present_value_shape(&self) -> Vec<usize> {
        vec![self.batch, self.kv_heads, self.total_len(), self.v_head_dim]
    }

    /// The score shape `[B, Hq, Nq, T]`, also `qk_matmul_output`'s.
    pub fn scores_shape(&self) -> Vec<usize> {
        vec![self.batch, self.q_heads, self.q_len, self.total_len()]
    }

    /// The logsumexp shape `[B, Hq, Nq]`.
    pub fn lse_shape(&self) -> Vec<usize> {
        vec![self.batch, self.q_heads, self.q_len]
    }

    /// The causal/window offset of batch `b`: the past length, else
    /// `nonpad[b] − Nq`, else 0.
    pub fn position_offset(&self, nonpad: Option<&[i64]>, b: usize) -> i64 {
        if self.has_past {
            self.past_len as i64
        } else if let Some(lengths) = nonpad {
            lengths[b] - self.q_len as i64
        } else {
            0
        }
    }
}

fn rank4(tensor: &'static str, shape: &[usize]) -> Result<[usize; 4]> {
    let dims: [usize; 4] = shape.try_into().map_err(|_| Error::Rank {
        tensor,
        expected: "4 ([batch, heads, sequence, head size])",
        got: shape.to_vec(),
    })?;
    Ok(dims)
}

fn non_empty(tensor: &'static str, shape: &[usize]) -> Result<()> {
    if shape.contains(&0) {
        return Err(Error::EmptyTensor {
            tensor,
            shape: shape.to_vec(),
        });
    }
    Ok(())
}

fn same(
    tensor: &'static str,
    dim: &'static str,
    got: usize,
    expected: usize,
    expected_from: &'static str,
    hint: &'static str,
) -> Result<()> {
    if got != expected {
        return Err(Error::ShapeMismatch {
            tensor,
            dim,
            got,
            expected,
            expected_from,
            hint,
        });
    }
    Ok(())
}

/// Positions are computed in 32-bit signed integers on the GPU.
const MAX_SEQUENCE: usize = i32::MAX as usize / 2;

/// Checks the inputs and options against the contract and returns the sizes.
pub fn validate<T: TensorRef>(
    inputs: &AttentionInputs<'_, T>,
    options: &AttentionOptions,
) -> Result<AttentionDims> {
    options.validate()?;
    let [b, hq, nq, dk] = rank4("Q", inputs.q.shape())?;
    let [kb, hkv, nk, kdk] = rank4("K", inputs.k.shape())?;
    let [vb, vh, vn, dv] = rank4("V", inputs.v.shape())?;
    non_empty("Q", inputs.q.shape())?;
    non_empty("K", inputs.k.shape())?;
    non_empty("V", inputs.v.shape())?;
    let batch_hint = "Q, K and V must share the batch size";
    same("K", "batch", kb, b, "Q", batch_hint)?;
    same("V", "batch", vb, b, "Q", batch_hint)?;
    same(
        "K",
        "head size",
        kdk,
        dk,
        "Q",
        "K's last dimension must equal Q's",
    )?;
    same(
        "V",
        "heads",
        vh,
        hkv,
        "K",
        "K and V must have the same number of heads",
    )?;
    same(
        "V",
        "sequence length",
        vn,
        nk,
        "K",
        "V needs one row per key",
    )?;
    if hq % hkv != 0 {
        return Err(Error::GqaHeads {
            q_heads: hq,
            kv_heads: hkv,
        });
    }

    let past_len = match (inputs.past_key, inputs.past_value) {
        (None, None) => 0,
        (Some(pk), Some(pv)) => {
            let [pb, ph, pn, pd] = rank4("past_key", pk.shape())?;
            let [pvb, pvh, pvn, pvd] = rank4("past_value", pv.shape())?;
            let hint = "the cache must match K/V in batch, heads and head size";
            same("past_key", "batch", pb, b, "Q", hint)?;
            same("past_key", "heads", ph, hkv, "K", hint)?;
            same("past_key", "head size", pd, dk, "K", hint)?;
            same("past_value", "batch", pvb, b, "Q", hint)?;
            same("past_value", "heads", pvh, hkv, "V", hint)?;
            same("past_value", "head size", pvd, dv, "V", hint)?;
            same(
                "past_value",
                "sequence length",
                pvn,
                pn,
                "past_key",
                "past_key and past_value must hold the same number of positions",
            )?;
            pn
        }
        _ => {
            return Err(Error::Conflict(
                "past_key and past_value must be given together (or neither)",
            ))
        }
    };
    let has_past = inputs.past_key.is_some();
    let total = past_len + nk;
    for (what, n) in [("Nq", nq), ("T = past + Nk", total), ("Dk", dk), ("Dv", dv)] {
        if n > MAX_SEQUENCE {
            return Err(Error::Limit {
                what: format!("{what} = {n}"),
                needed: n as u64,
                limit: MAX_SEQUENCE as u64,
                limit_name: "max sequence length",
                hint: "positions are 32-bit on the GPU; split the sequence",
            });
        }
    }

    if let Some(lengths) = inputs.nonpad_kv_seqlen {
        if has_past {
            return Err(Error::Conflict(
                "nonpad_kv_seqlen describes an external cache and cannot be combined with past_key/past_value",
            ));
        }
        same(
            "nonpad_kv_seqlen",
            "length",
            lengths.len(),
            b,
            "Q",
            "give one valid-key count per batch entry",
        )?;
        if let Some(&bad) = lengths.iter().find(|&&l| l < 0 || l > total as i64) {
            return Err(Error::InvalidOption {
                name: "nonpad_kv_seqlen",
                value: bad.to_string(),
                reason: "every length must lie between 0 and the number of keys",
            });
        }
    }

    let mask = match inputs.attn_mask {
        None => None,
        Some(m) => Some(mask_layout(m.shape(), [b, hq, nq, total])?),
    };

    Ok(AttentionDims {
        batch: b,
        q_heads: hq,
        kv_heads: hkv,
        q_len: nq,
        kv_len: nk,
        past_len,
        head_dim: dk,
        v_head_dim: dv,
        mask,
        has_past,
        has_nonpad: inputs.nonpad_kv_seqlen.is_some(),
        f16: F16Inputs {
            q: inputs.q.dtype() == DType::F16,
            k: inputs.k.dtype() == DType::F16,
            v: inputs.v.dtype() == DType::F16,
            past_key: inputs.past_key.is_some_and(|t| t.dtype() == DType::F16),
            past_value: inputs.past_value.is_some_and(|t| t.dtype() == DType::F16),
        },
        placement: Placement::default(),
    })
}

/// Right-aligned broadcasting of a mask of `shape` onto `target = [B, Hq, Nq, T]`.
fn mask_layout(shape: &[usize], target: [usize; 4]) -> Result<MaskLayout> {
    let fail = |reason: String| Error::Broadcast {
        mask: shape.to_vec(),
        target,
        reason,
    };
    if shape.is_empty() || shape.len() > 4 {
        return Err(Error::Rank {
            tensor: "attn_mask",
            expected: "1 to 4",
            got: shape.to_vec(),
        });
    }
    let cols = shape[shape.len() - 1];
    if cols == 0 {
        return Err(fail("the last dimension is empty".into()));
    }
    if cols > target[3] {
        return Err(fail(format!(
            "the last dimension ({cols}) is longer than the number of keys T = {}",
            target[3]
        )));
    }
    // Pad the leading dimensions with 1s on the left, then check each against the target.
    let mut full = [1usize; 4];
    full[4 - shape.len()..].copy_from_slice(shape);
    let names = ["batch", "heads", "query rows"];
    for axis in 0..3 {
        if full[axis] != 1 && full[axis] != target[axis] {
            return Err(fail(format!(
                "dimension {} (aligned to {}) is {} but must be 1 or {}",
                axis + shape.len() - 4,
                names[axis],
                full[axis],
                target[axis]
            )));
        }
    }
    let row_stride = cols;
    let head_stride = full[2] * row_stride;
    let batch_stride = full[1] * head_stride;
    let stride_or_zero = |axis: usize, stride: usize| if full[axis] == 1 { 0 } else { stride };
    Ok(MaskLayout {
        batch_stride: stride_or_zero(0, batch_stride),
        head_stride: stride_or_zero(1, head_stride),
        row_stride: stride_or_zero(2, row_stride),
        cols,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_layouts() {
        let t = [2, 3, 5, 7];
        let l = mask_layout(&[7], t).unwrap();
        assert_eq!(
            (l.batch_stride, l.head_stride, l.row_stride, l.cols),
            (0, 0, 0, 7)
        );
        let l = mask_layout(&[5, 4], t).unwrap();
        assert_eq!(
            (l.batch_stride, l.head_stride, l.row_stride, l.cols),
            (0, 0, 4, 4)
        );
        let l = mask_layout(&[3, 1, 7], t).unwrap();
        assert_eq!((l.batch_stride, l.head_stride, l.row_stride), (0, 7, 0));
        let l = mask_layout(&[2, 1, 5, 7], t).unwrap();
        assert_eq!((l.batch_stride, l.head_stride, l.row_stride), (35, 0, 7));
        assert!(matches!(
            mask_layout(&[2, 5, 7], t),
            Err(Error::Broadcast { .. })
        ));
        assert!(matches!(mask_layout(&[8], t), Err(Error::Broadcast { .. })));
        assert!(matches!(mask_layout(&[], t), Err(Error::Rank { .. })));
        assert!(matches!(
            mask_layout(&[1, 1, 1, 1, 7], t),
            Err(Error::Rank { .. })
        ));
    }
}
