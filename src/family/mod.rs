//! The attention family beyond the ONNX operator, as textbooks present it:
//! multi-head layers with self, cross and cached decoder attention, positional
//! encodings, additive (Bahdanau) and multiplicative (Luong) scoring, and
//! linear attention.
//!
//! Every member runs on the GPU on a GPU engine (our kernels, no readback
//! between steps) and in f64 on a CPU engine. Each has an oracle twin written
//! generically over [`crate::cpu::Real`]: in f64 it is the reference the tests
//! compare with, in f32 the plain baseline that sets their tolerance.

pub mod additive;
pub mod checks;
pub mod linear;
pub mod luong;
pub mod mha;
pub mod mha_backward;
mod mha_paged;
pub mod position;
mod scored;

use crate::error::{Error, Result};
use crate::tensor::HostTensor;

/// What a family member returns: its output and, when asked for, the weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Attended {
    /// The output (context vectors, or the layer's output).
    pub output: HostTensor,
    /// The attention weights, `[batch, (heads,) queries, keys]`, when asked for.
    pub weights: Option<HostTensor>,
}

/// Checks that `tensor` has `rank` dimensions (`expected` says it in words,
/// e.g. "3 ([batch, length, features])"), none of them zero.
pub(crate) fn expect_rank(
    name: &'static str,
    tensor: &HostTensor,
    rank: usize,
    expected: &'static str,
) -> Result<()> {
    if tensor.shape().len() != rank {
        return Err(Error::Rank {
            tensor: name,
            expected,
            got: tensor.shape().to_vec(),
        });
    }
    if tensor.shape().contains(&0) {
        return Err(Error::EmptyTensor {
            tensor: name,
            shape: tensor.shape().to_vec(),
        });
    }
    Ok(())
}

/// Checks that dimension `axis` of `tensor` (named `dim`) equals `expected`,
/// which comes from `expected_from`.
pub(crate) fn expect_dim(
    name: &'static str,
    tensor: &HostTensor,
    axis: usize,
    dim: &'static str,
    expected: usize,
    expected_from: &'static str,
) -> Result<()> {
    let got = tensor.shape()[axis];
    if got != expected {
        return Err(Error::ShapeMismatch {
            tensor: name,
            dim,
            got,
            expected,
            expected_from,
            hint: "the shapes must agree",
        });
    }
    Ok(())
}

/// A matrix of `cols` columns as text, one bracketed row per line, for
/// examples and reports (`decimals` places).
pub fn format_matrix(data: &[f32], cols: usize, decimals: usize) -> String {
    data.chunks(cols.max(1))
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .map(|x| format!("{x:>w$.decimals$}", w = decimals + 4))
                .collect();
            format!("  [{}]", cells.join(" "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
