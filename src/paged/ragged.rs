//! Ragged batches without padding: the queries, keys and values of several
//! sequences packed token after token (`[total tokens, heads, head size]`)
//! with their offsets (FlashAttention's `cu_seqlens`), each sequence
//! attending only its own keys. Work and memory follow the real tokens: a
//! prompt of 17 tokens beside one of 2,000 pays for 17.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::layout::{merge_heads, split_heads};
use crate::options::AttentionOptions;
use crate::problem::AttentionInputs;
use crate::tensor::HostTensor;

/// Packed sequences: `q` `[total_q, q_heads, head_dim]`, `k` `[total_k,
/// kv_heads, head_dim]`, `v` `[total_k, kv_heads, v_head_dim]`; sequence
/// `i`'s queries are rows `cu_seqlens_q[i]..cu_seqlens_q[i + 1]`, its keys
/// and values rows `cu_seqlens_k[i]..cu_seqlens_k[i + 1]`.
#[derive(Debug, Clone, Copy)]
pub struct RaggedInputs<'a> {
    /// Packed queries.
    pub q: &'a HostTensor,
    /// Packed keys.
    pub k: &'a HostTensor,
    /// Packed values.
    pub v: &'a HostTensor,
    /// Query offsets: `batch + 1` values rising from 0 to `total_q`.
    pub cu_seqlens_q: &'a [i64],
    /// Key offsets: `batch + 1` values rising from 0 to `total_k`.
    pub cu_seqlens_k: &'a [i64],
}

/// A ragged call's outputs, packed as its queries.
#[derive(Debug, Clone, PartialEq)]
pub struct RaggedOutputs {
    /// Y `[total_q, q_heads, v_head_dim]`, typed as Q.
    pub y: HostTensor,
    /// Row logsumexp `[total_q, q_heads]`, where asked (`return_lse`).
    pub lse: Option<HostTensor>,
}

/// Checks `offsets` (named `name`) against a packed length: at least two,
/// starting at 0, never falling, ending at `total`. Returns each sequence's
/// row range.
pub fn sequence_ranges(
    name: &'static str,
    offsets: &[i64],
    total: usize,
) -> Result<Vec<(usize, usize)>> {
    let bad = |value: String, reason: &'static str| {
        Err(Error::InvalidOption {
            name,
            value,
            reason,
        })
    };
    if offsets.len() < 2 {
        return bad(
            format!("{offsets:?}"),
            "needs batch + 1 offsets, at least two",
        );
    }
    if offsets[0] != 0 {
        return bad(format!("starts at {}", offsets[0]), "must start at 0");
    }
    if let Some(i) = (1..offsets.len()).find(|&i| offsets[i] < offsets[i - 1]) {
        return bad(
            format!("offset {i} is {} after {}", offsets[i], offsets[i - 1]),
            "must never fall",
        );
    }
    let last = *offsets.last().expect("two or more");
    if last != total as i64 {
        return bad(
            format!("ends at {last} for {total} packed rows"),
            "must end at the packed tensor's rows",
        );
    }
    Ok(offsets
        .windows(2)
        .map(|w| (w[0] as usize, w[1] as usize))
        .collect())
}

/// The packed tensor's rank-3 shape `[rows, heads, size]`.
fn packed_shape(tensor: &'static str, t: &HostTensor) -> Result<[usize; 3]> {
    match *t.shape() {
        [rows, heads, size] => Ok([rows, heads, size]),
        _ => Err(Error::Rank {
            tensor,
            expected: "3 ([total tokens, heads, head size])",
            got: t.shape().to_vec(),
        }),
    }
}

/// Rows `range` of a packed tensor as one sequence `[1, heads, n, size]`.
fn sequence_of(
    tensor: &'static str,
    t: &HostTensor,
    (start, end): (usize, usize),
) -> Result<HostTensor> {
    let [_, heads, size] = packed_shape(tensor, t)?;
    let rows = t.data()[start * heads * size..end * heads * size].to_vec();
    let flat = HostTensor::new([1, end - start, heads * size], rows)?.into_dtype(t.dtype());
    split_heads(tensor, &flat, heads)
}

impl Engine {
    /// Attention of every packed sequence against its own keys and values
    /// ([`RaggedInputs`]): each sequence is one call of the contract with
    /// `options` (causal, windows, softcap, scale, GQA, ...), run on this
    /// engine's host path one sequence after another. A sequence with
    /// queries needs at least one key.
    pub async fn attention_ragged(
        &self,
        inputs: &RaggedInputs<'_>,
        options: &AttentionOptions,
    ) -> Result<RaggedOutputs> {
        let [total_q, q_heads, _] = packed_shape("Q", inputs.q)?;
        let [total_k, _, _] = packed_shape("K", inputs.k)?;
        let [total_v, _, v_head_dim] = packed_shape("V", inputs.v)?;
        if total_v != total_k {
            return Err(Error::ShapeMismatch {
                tensor: "V",
                dim: "packed tokens",
                got: total_v,
                expected: total_k,
                expected_from: "K",
                hint: "pack keys and values of the same tokens",
            });
        }
        let q_ranges = sequence_ranges("cu_seqlens_q", inputs.cu_seqlens_q, total_q)?;
        let k_ranges = sequence_ranges("cu_seqlens_k", inputs.cu_seqlens_k, total_k)?;
        if q_ranges.len() != k_ranges.len() {
            return Err(Error::ShapeMismatch {
                tensor: "cu_seqlens_k",
                dim: "sequences",
                got: k_ranges.len(),
                expected: q_ranges.len(),
                expected_from: "cu_seqlens_q",
                hint: "give queries and keys the same sequences",
            });
        }
        if let Some(i) = (0..q_ranges.len())
            .find(|&i| q_ranges[i].1 > q_ranges[i].0 && k_ranges[i].1 == k_ranges[i].0)
        {
            return Err(Error::InvalidOption {
                name: "cu_seqlens_k",
                value: format!("sequence {i} has queries and no key"),
                reason: "every sequence with queries needs at least one key",
            });
        }
        if options.return_present || options.qk_matmul_output_mode.is_some() {
            return Err(Error::Conflict(
                "a ragged call returns Y and the logsumexp only",
            ));
        }
        let mut y = vec![0.0f32; total_q * q_heads * v_head_dim];
        let mut lse = vec![0.0f32; total_q * q_heads];
        for (&(q0, q1), &k_range) in q_ranges.iter().zip(&k_ranges) {
            if q1 == q0 {
                continue;
            }
            let q = sequence_of("Q", inputs.q, (q0, q1))?;
            let k = sequence_of("K", inputs.k, k_range)?;
            let v = sequence_of("V", inputs.v, k_range)?;
            let out = self
                .attention_host(&AttentionInputs::new(&q, &k, &v), options)
                .await?;
            // [1, Hq, n, Dv] back to packed rows [n, Hq, Dv].
            let rows = merge_heads(&out.y)?;
            y[q0 * q_heads * v_head_dim..q1 * q_heads * v_head_dim].copy_from_slice(rows.data());
            if let Some(l) = &out.lse {
                let n = q1 - q0;
                for h in 0..q_heads {
                    for t in 0..n {
                        lse[(q0 + t) * q_heads + h] = l.data()[h * n + t];
                    }
                }
            }
        }
        Ok(RaggedOutputs {
            y: HostTensor::new([total_q, q_heads, v_head_dim], y)?.into_dtype(inputs.q.dtype()),
            lse: options
                .return_lse
                .then(|| HostTensor::new([total_q, q_heads], lse))
                .transpose()?,
        })
    }

    /// [`Engine::attention_ragged`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn attention_ragged_blocking(
        &self,
        inputs: &RaggedInputs<'_>,
        options: &AttentionOptions,
    ) -> Result<RaggedOutputs> {
        pollster::block_on(self.attention_ragged(inputs, options))
    }
}
