//! One (batch, query head) of attention, written as plainly as the contract reads.
//!
//! Nothing here is shared with the GPU path: the mask is broadcast by its own
//! index arithmetic, the causal/window/padding rules are evaluated per key, and
//! the softmax is the textbook one with the maximum subtracted.

use super::real::Real;
use crate::options::{AttentionOptions, QkMatmulOutputMode};
use crate::problem::{AttentionDims, AttentionInputs};
use crate::tensor::{HostMask, HostTensor};

/// The order in which a dot product of Q and K sums its terms. In f64 the
/// order hardly matters; in f32 it decides the rounding, and no order is the
/// right one, so the plain f32 baseline is computed in more than one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SumOrder {
    /// One term after another.
    Sequential,
    /// Quads of terms summed in pairs, `(a + b) + (c + d)`, then the quads in
    /// turn: how the GPU kernels read head dims as vec4s.
    Quads,
    /// One term after another, from the last.
    Reverse,
}

impl SumOrder {
    /// The dot product of `q` and `k` summed in this order.
    pub(super) fn dot<F: Real>(self, q: &[f32], k: &[f32]) -> F {
        let term = |i: usize| F::from_f32(q[i]) * F::from_f32(k[i]);
        let mut dot = F::ZERO;
        match self {
            SumOrder::Sequential => {
                for i in 0..q.len() {
                    dot = dot + term(i);
                }
            }
            SumOrder::Reverse => {
                for i in (0..q.len()).rev() {
                    dot = dot + term(i);
                }
            }
            SumOrder::Quads => {
                for start in (0..q.len()).step_by(4) {
                    let t = |c: usize| {
                        if start + c < q.len() {
                            term(start + c)
                        } else {
                            F::ZERO
                        }
                    };
                    dot = dot + ((t(0) + t(1)) + (t(2) + t(3)));
                }
            }
        }
        dot
    }
}

/// The outputs of one head, as slices of the whole output tensors.
pub(super) struct HeadOutputs<'o, F> {
    /// `[Nq, Dv]`.
    pub y: &'o mut [F],
    /// `[Nq]`, or empty when not requested.
    pub lse: &'o mut [F],
    /// `[Nq, T]`, or empty when not requested.
    pub qk: &'o mut [F],
}

/// Reads row `t` of the concatenated cache `[past; new]` for (b, kv head).
pub(super) fn kv_row<'a>(
    past: Option<&'a HostTensor>,
    new: &'a HostTensor,
    dims: &AttentionDims,
    b: usize,
    kvh: usize,
    t: usize,
    width: usize,
) -> &'a [f32] {
    let (tensor, len, row) = match past {
        Some(p) if t < dims.past_len => (p, dims.past_len, t),
        _ => (new, dims.kv_len, t - dims.past_len),
    };
    let start = ((b * dims.kv_heads + kvh) * len + row) * width;
    &tensor.data()[start..start + width]
}

/// The element of a mask of `shape` that broadcasts onto (b, h, i, j), or
/// `None` past its last dim (a short mask masks those keys).
pub(super) fn mask_index(shape: &[usize], b: usize, h: usize, i: usize, j: usize) -> Option<usize> {
    if j >= shape[shape.len() - 1] {
        return None;
    }
    // Right-align the coordinates [b, h, i, j] with the mask's shape.
    let coords = [b, h, i, j];
    let mut index = 0usize;
    for (axis, &dim) in shape.iter().enumerate() {
        let coord = coords[4 - shape.len() + axis];
        index = index * dim + if dim == 1 { 0 } else { coord };
    }
    Some(index)
}

/// The mask's additive value at (b, h, i, j) by numpy broadcasting, or `None` when
/// the key is masked (bool `false`, `-inf`/`-f32::MAX`, or beyond the mask's last
/// dim). Any other float, NaN and +inf included, is added to the score.
fn mask_value(mask: &HostMask, b: usize, h: usize, i: usize, j: usize) -> Option<f32> {
    let index = mask_index(mask.shape(), b, h, i, j)?;
    match mask {
        HostMask::Bool { data, .. } => data[index].then_some(0.0),
        HostMask::Float(t) => {
            // -inf and -f32::MAX mask the key; a NaN is added like any value.
            let v = t.data()[index];
            if v <= -f32::MAX {
                None
            } else {
                Some(v)
            }
        }
    }
}

/// Whether key `j` survives the causal, window and padding rules for query `i`.
fn position_allowed(
    options: &AttentionOptions,
    offset: i64,
    nonpad: Option<i64>,
    i: usize,
    j: usize,
) -> bool {
    let p = offset + i as i64;
    let j = j as i64;
    if options.is_causal && j > p {
        return false;
    }
    if options.left_window_size >= 0 && j < p - options.left_window_size {
        return false;
    }
    if options.right_window_size >= 0 && j > p + options.right_window_size {
        return false;
    }
    if let Some(len) = nonpad {
        if j >= len {
            return false;
        }
    }
    true
}

/// Per-row scratch: the scores at each stage, one entry per key, and which
/// keys the row attends (the mask, causality, windows and padding allow them).
pub(super) struct RowScratch<F> {
    pub raw: Vec<F>,
    pub capped: Vec<F>,
    pub biased: Vec<F>,
    pub probs: Vec<F>,
    pub attended: Vec<bool>,
}

impl<F: Real> RowScratch<F> {
    pub(super) fn new(keys: usize) -> Self {
        Self {
            raw: vec![F::ZERO; keys],
            capped: vec![F::ZERO; keys],
            biased: vec![F::NEG_INFINITY; keys],
            probs: vec![F::ZERO; keys],
            attended: vec![false; keys],
        }
    }
}

/// How a row's softmax turns out, from its attended biased scores.
#[derive(Clone, Copy, PartialEq)]
enum RowKind<F> {
    /// No key is attended: probabilities 0, Y 0, logsumexp -inf.
    FullyMasked,
    /// An attended score is NaN or +inf, or every attended score is -inf: the
    /// softmax is undefined, as in PyTorch, and the row is NaN.
    Poisoned,
    /// The usual case, with the largest attended score.
    Finite(F),
}

/// Classifies a row: `biased` holds the scores plus bias, `attended` which keys count.
fn row_kind<F: Real>(biased: &[F], attended: &[bool]) -> RowKind<F> {
    let mut any = false;
    let mut max = F::NEG_INFINITY;
    for (&s, &a) in biased.iter().zip(attended) {
        if !a {
            continue;
        }
        any = true;
        if s.is_nan() || s == F::INFINITY {
            return RowKind::Poisoned;
        }
        if s > max {
            max = s;
        }
    }
    match (any, max == F::NEG_INFINITY) {
        (false, _) => RowKind::FullyMasked,
        (true, true) => RowKind::Poisoned,
        (true, false) => RowKind::Finite(max),
    }
}

/// Attention for query row `i` of batch `b`, head `h`: writes the row of Y into
/// `y` and returns its logsumexp; the scratch keeps the row's scores.
///
/// Non-finite values follow PyTorch's `scaled_dot_product_attention` wherever
/// the row attends them, and are ignored where it does not (see [`RowKind`]):
/// an attended key with a score of -inf has probability 0 but still multiplies
/// its value row, so a NaN in V reaches every row that attends that key.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_row<F: Real>(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    dims: &AttentionDims,
    b: usize,
    h: usize,
    i: usize,
    scratch: &mut RowScratch<F>,
    y: &mut [F],
    order: SumOrder,
) -> F {
    let (nq, dk, dv, t_len) = (dims.q_len, dims.head_dim, dims.v_head_dim, dims.total_len());
    let kvh = h / dims.group();
    let scale = F::from_f32(options.effective_scale(dk));
    let softcap = F::from_f32(options.softcap);
    let offset = dims.position_offset(inputs.nonpad_kv_seqlen, b);
    // The slope is what the GPU receives (rounded to f32) in the f32 baseline.
    let slope = if options.alibi {
        F::from_f64(crate::options::alibi_slopes(dims.q_heads)[h])
    } else {
        F::ZERO
    };
    let temperature = F::from_f32(options.temperature);
    let nonpad = inputs.nonpad_kv_seqlen.map(|l| l[b]);
    let RowScratch {
        raw,
        capped,
        biased,
        probs,
        attended,
    } = scratch;

    let q_start = ((b * dims.q_heads + h) * nq + i) * dk;
    let q = &inputs.q.data()[q_start..q_start + dk];
    for j in 0..t_len {
        let k = kv_row(inputs.past_key, inputs.k, dims, b, kvh, j, dk);
        raw[j] = order.dot::<F>(q, k) * scale;
        capped[j] = if options.softcap > 0.0 {
            softcap * (raw[j] / softcap).tanh()
        } else {
            raw[j]
        };
        let mask = match inputs.attn_mask {
            Some(m) => mask_value(m, b, h, i, j),
            None => Some(0.0),
        };
        attended[j] = false;
        biased[j] = match mask {
            Some(add) if position_allowed(options, offset, nonpad, i, j) => {
                attended[j] = true;
                let distance = (offset + i as i64 - j as i64).unsigned_abs();
                capped[j] + F::from_f32(add) - slope * F::from_f64(distance as f64)
            }
            _ => F::NEG_INFINITY,
        };
    }

    // Softmax of (score + bias) / temperature over the attended keys, with the
    // maximum subtracted (the temperature is positive, so the maximum is the same key).
    let kind = row_kind(biased, attended);
    let mut sum = F::ZERO;
    for j in 0..t_len {
        probs[j] = match kind {
            RowKind::FullyMasked => F::ZERO,
            RowKind::Poisoned => F::NAN,
            RowKind::Finite(_) if !attended[j] => F::ZERO,
            RowKind::Finite(max) => ((biased[j] - max) / temperature).exp(),
        };
        sum = sum + probs[j];
    }
    if let RowKind::Finite(_) = kind {
        for p in probs.iter_mut() {
            *p = *p / sum;
        }
    }

    y.fill(match kind {
        RowKind::Poisoned => F::NAN,
        _ => F::ZERO,
    });
    if let RowKind::Finite(_) = kind {
        for (j, &p) in probs.iter().enumerate() {
            if !attended[j] {
                continue; // masked keys take no part, whatever V holds there
            }
            let v = kv_row(inputs.past_value, inputs.v, dims, b, kvh, j, dv);
            for (acc, &va) in y.iter_mut().zip(v) {
                *acc = *acc + p * F::from_f32(va);
            }
        }
    }
    match kind {
        RowKind::FullyMasked => F::NEG_INFINITY,
        RowKind::Poisoned => F::NAN,
        RowKind::Finite(max) => max / temperature + sum.ln(),
    }
}

/// Computes attention for batch `b`, query head `h` into `out`.
pub(super) fn attend_head<F: Real>(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    dims: &AttentionDims,
    b: usize,
    h: usize,
    out: HeadOutputs<'_, F>,
    order: SumOrder,
) {
    let (dv, t_len) = (dims.v_head_dim, dims.total_len());
    let mut scratch = RowScratch::new(t_len);
    for i in 0..dims.q_len {
        let lse = attend_row(
            inputs,
            options,
            dims,
            b,
            h,
            i,
            &mut scratch,
            &mut out.y[i * dv..(i + 1) * dv],
            order,
        );
        if !out.lse.is_empty() {
            out.lse[i] = lse;
        }
        if !out.qk.is_empty() {
            let row = match options.qk_matmul_output_mode {
                Some(QkMatmulOutputMode::Scaled) | None => &scratch.raw,
                Some(QkMatmulOutputMode::Softcapped) => &scratch.capped,
                Some(QkMatmulOutputMode::Biased) => &scratch.biased,
                Some(QkMatmulOutputMode::Probabilities) => &scratch.probs,
            };
            out.qk[i * t_len..(i + 1) * t_len].copy_from_slice(row);
        }
    }
}

/// Y and the logsumexp of single rows `(b, h, i)`, for checking a sample of a
/// problem too large for the whole oracle.
pub(super) fn attend_rows<F: Real>(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    dims: &AttentionDims,
    rows: &[(usize, usize, usize)],
) -> Vec<(Vec<F>, F)> {
    let mut scratch = RowScratch::new(dims.total_len());
    rows.iter()
        .map(|&(b, h, i)| {
            let mut y = vec![F::ZERO; dims.v_head_dim];
            let lse = attend_row(
                inputs,
                options,
                dims,
                b,
                h,
                i,
                &mut scratch,
                &mut y,
                SumOrder::Sequential,
            );
            (y, lse)
        })
        .collect()
}
