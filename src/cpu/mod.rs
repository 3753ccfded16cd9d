//! The CPU implementation of the contract: the correctness oracle for every GPU
//! result, and the backend when no adapter exists.
//!
//! [`attention`] accumulates in f64 and rounds the outputs to f32.
//! [`attention_exact`] returns the f64 values themselves, which is what the
//! conformance checks compare against. [`attention_plain_f32`] runs the same
//! code in f32: its error against the f64 oracle sets the tolerance for the GPU.
//!
//! Work is spread over batch × heads with scoped std threads (one thread on wasm).
//!
//! [`fast`] is the backend the engine runs on the CPU: the same contract in
//! f32, blocked and vectorised, checked against this oracle.

mod backward;
pub mod fast;
mod head;
mod real;

pub(crate) use backward::sech2;
pub use backward::{attention_backward_in, ExactGradients, RowSource};
pub use head::SumOrder;
pub use real::Real;

use crate::error::Result;
use crate::gradients::{split_present, AttentionGradients, BackwardInputs, GradientOptions};
use crate::options::AttentionOptions;
use crate::problem::{validate, AttentionDims, AttentionInputs, AttentionOutputs};
use crate::tensor::{checked_numel, try_filled, HostTensor};
use head::{attend_head, attend_rows, HeadOutputs};

/// The oracle's outputs at the precision they were computed in.
#[derive(Debug, Clone, PartialEq)]
pub struct ExactOutputs<F> {
    /// The checked sizes.
    pub dims: AttentionDims,
    /// Y `[B, Hq, Nq, Dv]`.
    pub y: Vec<F>,
    /// Logsumexp `[B, Hq, Nq]` (always computed).
    pub lse: Vec<F>,
    /// `qk_matmul_output` `[B, Hq, Nq, T]`, empty unless requested.
    pub qk: Vec<F>,
}

/// Attention on the CPU in f64, outputs rounded to f32.
pub fn attention(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
) -> Result<AttentionOutputs<HostTensor>> {
    let exact = attention_exact(inputs, options)?;
    let dims = exact.dims;
    let narrow = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let y = HostTensor::new(dims.y_shape(), narrow(&exact.y))?;
    let lse = options
        .return_lse
        .then(|| HostTensor::new(dims.lse_shape(), narrow(&exact.lse)))
        .transpose()?;
    let qk_matmul_output = options
        .qk_matmul_output_mode
        .map(|_| HostTensor::new(dims.scores_shape(), narrow(&exact.qk)))
        .transpose()?;
    let (present_key, present_value) = if options.return_present {
        let (k, v) = present(inputs, &dims)?;
        (Some(k), Some(v))
    } else {
        (None, None)
    };
    Ok(AttentionOutputs {
        y,
        present_key,
        present_value,
        qk_matmul_output,
        lse,
    })
}

/// The gradients of attention's inputs on the CPU in f64 (the reference for
/// every backward path), rounded to f32 and shaped as the inputs: dQ, dK and
/// dV, the past's where the call had one, the float mask's where asked.
pub fn attention_backward(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    forward: &BackwardInputs<'_, HostTensor>,
    grads: GradientOptions,
) -> Result<AttentionGradients<HostTensor>> {
    let exact = attention_backward_in::<f64>(
        inputs,
        options,
        forward,
        grads,
        SumOrder::Sequential,
        RowSource::Recomputed,
    )?;
    gradients_as_tensors(inputs, &exact)
}

/// [`ExactGradients`] rounded to f32 and shaped as the call's inputs.
pub fn gradients_as_tensors<F: Real>(
    inputs: &AttentionInputs<'_, HostTensor>,
    exact: &ExactGradients<F>,
) -> Result<AttentionGradients<HostTensor>> {
    let dims = &exact.dims;
    let narrow = |v: &[F]| v.iter().map(|x| x.to_f64() as f32).collect::<Vec<f32>>();
    let (d_past_key, dk) = split_present(dims, &narrow(&exact.dk), dims.head_dim);
    let (d_past_value, dv) = split_present(dims, &narrow(&exact.dv), dims.v_head_dim);
    let shaped = |t: Option<&HostTensor>, data: Option<Vec<f32>>| match (t, data) {
        (Some(t), Some(data)) => HostTensor::new(t.shape().to_vec(), data).map(Some),
        _ => Ok(None),
    };
    Ok(AttentionGradients {
        dq: HostTensor::new(inputs.q.shape().to_vec(), narrow(&exact.dq))?,
        dk: HostTensor::new(inputs.k.shape().to_vec(), dk)?,
        dv: HostTensor::new(inputs.v.shape().to_vec(), dv)?,
        d_past_key: shaped(inputs.past_key, d_past_key)?,
        d_past_value: shaped(inputs.past_value, d_past_value)?,
        d_mask: match inputs.attn_mask {
            Some(m) if !exact.d_mask.is_empty() => {
                Some(HostTensor::new(m.shape().to_vec(), narrow(&exact.d_mask))?)
            }
            _ => None,
        },
    })
}

/// Attention on the CPU in f64, returning the f64 values.
pub fn attention_exact(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
) -> Result<ExactOutputs<f64>> {
    attention_in::<f64>(inputs, options, SumOrder::Sequential)
}

/// The same computation in plain f32: the baseline whose error sets the GPU's tolerance.
pub fn attention_plain_f32(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
) -> Result<ExactOutputs<f32>> {
    attention_in::<f32>(inputs, options, SumOrder::Sequential)
}

/// The plain f32 computation with its Q·K dot products summed in `order`.
/// With large logits the f32 error depends on the order as much as on
/// anything else, so the conformance checks take the worst of the orders as
/// the baseline.
pub fn attention_plain_f32_in(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    order: SumOrder,
) -> Result<ExactOutputs<f32>> {
    attention_in::<f32>(inputs, options, order)
}

/// Y and the logsumexp of the rows `(b, h, i)` only, in `F` (f64 for the
/// oracle, f32 for the plain baseline): a sample check of problems too large
/// for the whole oracle.
pub fn attention_rows<F: Real>(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    rows: &[(usize, usize, usize)],
) -> Result<Vec<(Vec<F>, F)>> {
    let dims = validate(inputs, options)?;
    if let Some(&(b, h, i)) = rows
        .iter()
        .find(|&&(b, h, i)| b >= dims.batch || h >= dims.q_heads || i >= dims.q_len)
    {
        return Err(crate::error::Error::InvalidOption {
            name: "rows",
            value: format!("({b}, {h}, {i})"),
            reason: "every row must be (batch, query head, query row) inside the problem",
        });
    }
    Ok(attend_rows(inputs, options, &dims, rows))
}

/// `concat(past, new)` along the sequence axis for K and V.
pub fn present(
    inputs: &AttentionInputs<'_, HostTensor>,
    dims: &AttentionDims,
) -> Result<(HostTensor, HostTensor)> {
    let concat = |past: Option<&HostTensor>, new: &HostTensor, width: usize| {
        let heads = dims.batch * dims.kv_heads;
        let mut out = Vec::with_capacity(heads * dims.total_len() * width);
        for bh in 0..heads {
            if let Some(p) = past {
                let n = dims.past_len * width;
                out.extend_from_slice(&p.data()[bh * n..(bh + 1) * n]);
            }
            let n = dims.kv_len * width;
            out.extend_from_slice(&new.data()[bh * n..(bh + 1) * n]);
        }
        out
    };
    Ok((
        HostTensor::new(
            dims.present_key_shape(),
            concat(inputs.past_key, inputs.k, dims.head_dim),
        )?,
        HostTensor::new(
            dims.present_value_shape(),
            concat(inputs.past_value, inputs.v, dims.v_head_dim),
        )?,
    ))
}

fn worker_count(heads: usize) -> usize {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    available.min(heads).max(1)
}

fn attention_in<F: Real>(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    order: SumOrder,
) -> Result<ExactOutputs<F>> {
    let dims = validate(inputs, options)?;
    let heads = dims.batch * dims.q_heads;
    let y_per_head = dims.q_len * dims.v_head_dim;
    let lse_per_head = dims.q_len;
    let qk_per_head = if options.qk_matmul_output_mode.is_some() {
        checked_numel("qk_matmul_output", &[dims.q_len, dims.total_len()])?
    } else {
        0
    };
    let mut y = try_filled("Y", checked_numel("Y", &dims.y_shape())?, F::ZERO)?;
    let mut lse = try_filled("the logsumexp", heads * lse_per_head, F::ZERO)?;
    let mut qk = try_filled(
        "qk_matmul_output",
        checked_numel("qk_matmul_output", &[heads, qk_per_head])?,
        F::ZERO,
    )?;

    let workers = worker_count(heads);
    let heads_per_worker = heads.div_ceil(workers);
    let run = |first_head: usize, y: &mut [F], lse: &mut [F], qk: &mut [F]| {
        let count = y.len() / y_per_head;
        for local in 0..count {
            let z = first_head + local;
            let qk_slice: &mut [F] = if qk_per_head == 0 {
                &mut []
            } else {
                &mut qk[local * qk_per_head..(local + 1) * qk_per_head]
            };
            attend_head(
                inputs,
                options,
                &dims,
                z / dims.q_heads,
                z % dims.q_heads,
                HeadOutputs {
                    y: &mut y[local * y_per_head..(local + 1) * y_per_head],
                    lse: &mut lse[local * lse_per_head..(local + 1) * lse_per_head],
                    qk: qk_slice,
                },
                order,
            );
        }
    };

    if workers == 1 {
        run(0, &mut y, &mut lse, &mut qk);
    } else {
        std::thread::scope(|scope| {
            let y_chunks = y.chunks_mut(heads_per_worker * y_per_head);
            let lse_chunks = lse.chunks_mut(heads_per_worker * lse_per_head);
            let mut qk_chunks = qk.chunks_mut((heads_per_worker * qk_per_head).max(1));
            for (w, (y_c, lse_c)) in y_chunks.zip(lse_chunks).enumerate() {
                let qk_c: &mut [F] = if qk_per_head == 0 {
                    &mut []
                } else {
                    qk_chunks.next().unwrap_or_default()
                };
                let run = &run;
                scope.spawn(move || run(w * heads_per_worker, y_c, lse_c, qk_c));
            }
        });
    }
    Ok(ExactOutputs { dims, y, lse, qk })
}
