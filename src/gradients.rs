//! The backward call's types: what it takes beside the forward's inputs (Y,
//! the row logsumexp, dY), what it returns (the gradients of every input),
//! and the checks that the three tensors belong to the forward's call.

use crate::error::{Error, Result};
use crate::problem::{AttentionDims, TensorRef};

/// What the backward pass needs of the forward beside its inputs: its Y and
/// row logsumexp (the forward's outputs, from any path) and the gradient of
/// the loss with respect to Y.
#[derive(Debug)]
pub struct BackwardInputs<'a, T> {
    /// The forward's Y `[B, Hq, Nq, Dv]`.
    pub y: &'a T,
    /// The forward's row logsumexp `[B, Hq, Nq]` (`return_lse`).
    pub lse: &'a T,
    /// dLoss/dY `[B, Hq, Nq, Dv]`.
    pub dy: &'a T,
}

// By hand: a derive would ask `T: Copy` of the tensors behind the references.
impl<T> Clone for BackwardInputs<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for BackwardInputs<'_, T> {}

/// What a backward call returns besides dQ, dK and dV.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GradientOptions {
    /// Also return the float mask's gradient, in the mask's own shape
    /// (summed over the dims it broadcasts along). A bool mask has none.
    pub mask_gradient: bool,
}

/// The gradients of one attention call's inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionGradients<T> {
    /// dQ `[B, Hq, Nq, Dk]`.
    pub dq: T,
    /// dK `[B, Hkv, Nk, Dk]`, summed over each KV head's query heads.
    pub dk: T,
    /// dV `[B, Hkv, Nk, Dv]`, summed over each KV head's query heads.
    pub dv: T,
    /// d`past_key` `[B, Hkv, P, Dk]` where the call had a past.
    pub d_past_key: Option<T>,
    /// d`past_value` `[B, Hkv, P, Dv]` where the call had a past.
    pub d_past_value: Option<T>,
    /// d`attn_mask` in the mask's shape, where asked ([`GradientOptions`]).
    pub d_mask: Option<T>,
}

/// Checks that Y, the logsumexp and dY have the shapes of the forward of
/// `dims`, naming the first tensor and dim that do not.
pub fn check_backward<T: TensorRef>(
    dims: &AttentionDims,
    forward: &BackwardInputs<'_, T>,
) -> Result<()> {
    const NAMES: [&str; 4] = ["batch", "heads", "sequence length", "head size"];
    let y_shape = dims.y_shape();
    for (tensor, got, expected, expected_from) in [
        (
            "Y",
            forward.y.shape(),
            &y_shape[..],
            "the forward's Y [B, Hq, Nq, Dv]",
        ),
        (
            "lse",
            forward.lse.shape(),
            &dims.lse_shape()[..],
            "the forward's logsumexp [B, Hq, Nq]",
        ),
        (
            "dY",
            forward.dy.shape(),
            &y_shape[..],
            "the forward's Y [B, Hq, Nq, Dv]",
        ),
    ] {
        if got.len() != expected.len() {
            return Err(Error::Rank {
                tensor,
                expected: if expected.len() == 3 {
                    "3 ([batch, heads, sequence])"
                } else {
                    "4 ([batch, heads, sequence, head size])"
                },
                got: got.to_vec(),
            });
        }
        if let Some(axis) = (0..got.len()).find(|&a| got[a] != expected[a]) {
            return Err(Error::ShapeMismatch {
                tensor,
                dim: NAMES[axis],
                got: got[axis],
                expected: expected[axis],
                expected_from,
                hint: "Y, lse and dY must come from the forward of these inputs and options",
            });
        }
    }
    Ok(())
}

/// Splits gradients of the present keys or values `[B, Hkv, T, width]` into
/// the past's `[B, Hkv, P, width]` (none without a past) and the new rows'
/// `[B, Hkv, Nk, width]`.
pub(crate) fn split_present<F: Copy>(
    dims: &AttentionDims,
    present: &[F],
    width: usize,
) -> (Option<Vec<F>>, Vec<F>) {
    let (past, t_len) = (dims.past_len, dims.total_len());
    if !dims.has_past {
        return (None, present.to_vec());
    }
    let heads = dims.batch * dims.kv_heads;
    let mut old = Vec::with_capacity(heads * past * width);
    let mut new = Vec::with_capacity(heads * dims.kv_len * width);
    for head in present.chunks(t_len * width) {
        old.extend_from_slice(&head[..past * width]);
        new.extend_from_slice(&head[past * width..]);
    }
    (Some(old), new)
}
