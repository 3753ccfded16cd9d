//! The multi-head layer's backward pass: the gradients of its weights,
//! biases and inputs, so that a model made of layers trains.
//!
//! ```text
//! dY_h  = dO W_O,h                 dW_O = dOᵀ [Y_1 … Y_H]      db_O = Σ_rows dO
//! dQ_h, dK_h, dV_h = the attention's backward (the engine's path)
//! dQ_h ← RoPEᵀ dQ_h, dK_h ← RoPEᵀ dK_h (the rotation by minus the angle)
//! dW_Q,h = dQ_hᵀ X_q   db_Q,h = Σ_rows dQ_h   dX_q += dQ_h W_Q,h   (K, V alike from X_kv)
//! ```
//!
//! [`MultiHeadAttention::forward_train`] keeps what the backward reads (the
//! rotated heads, Y and the attention's logsumexp) in an [`MhaTape`]; the
//! attention runs on the engine's path both ways (the fused kernels on a GPU
//! engine), the projections and their gradients on the host in f32.
//! [`MultiHeadAttention::backward_exact`] is the reference: the same steps in
//! `F` (f64 for the oracle), the attention's through the crate's oracle.

use super::mha::{attention_core, out_projection, projections, MhaWeights, MultiHeadAttention};
use super::position::rope_transpose_in_place;
use crate::cpu::{self, Real, RowSource, SumOrder};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::gradients::{BackwardInputs, GradientOptions};
use crate::options::AttentionOptions;
use crate::problem::AttentionInputs;
use crate::tensor::HostTensor;

/// What [`MultiHeadAttention::forward_train`] keeps for the backward.
#[derive(Debug, Clone)]
pub struct MhaTape {
    query: HostTensor,
    key_value: Option<HostTensor>,
    options: AttentionOptions,
    /// The heads as the attention read them (rotated): `[B, H, N, Dk]`,
    /// `[B, Hkv, M, Dk]`, `[B, Hkv, M, Dv]`.
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    /// The attention's Y `[B, H, N, Dv]` and logsumexp `[B, H, N]`.
    y: HostTensor,
    lse: HostTensor,
}

impl MhaTape {
    /// The attention's output per head, `[B, H, N, Dv]`.
    pub fn attention_output(&self) -> &HostTensor {
        &self.y
    }
}

/// The gradients of a loss with respect to a layer's inputs and weights.
#[derive(Debug, Clone, PartialEq)]
pub struct MhaGradients {
    /// dLoss/d`query` `[B, N, d_model]` (self-attention: through Q, K and V).
    pub d_query: HostTensor,
    /// dLoss/d`key_value` `[B, M, d_kv]` for cross-attention.
    pub d_key_value: Option<HostTensor>,
    /// dLoss/dW in the weights' own shapes; a bias's where the layer has it.
    pub weights: MhaWeights,
}

/// The gradients at the precision they were computed in, flat, in the
/// shapes of [`MhaGradients`] (the weights in `MhaWeights`' order: W_Q, b_Q,
/// W_K, b_K, W_V, b_V, W_O, b_O; a missing bias empty).
#[derive(Debug, Clone, PartialEq)]
pub struct ExactMhaGradients<F> {
    /// dLoss/d`query`.
    pub d_query: Vec<F>,
    /// dLoss/d`key_value` (empty for self-attention).
    pub d_key_value: Vec<F>,
    /// The weights' and biases' gradients, in `MhaWeights`' order.
    pub weights: [Vec<F>; 8],
}

impl MultiHeadAttention {
    /// The layer's forward as [`MultiHeadAttention::forward`] computes it, and
    /// the tape its backward reads: the projections on the host, the
    /// attention on the engine's path (with its logsumexp kept).
    pub async fn forward_train(
        &self,
        engine: &Engine,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        options: &AttentionOptions,
    ) -> Result<(HostTensor, MhaTape)> {
        let (batch, n, m) = self.check_train_inputs(query, key_value, options)?;
        let d = self.dims();
        let (q, k, v) = projections::<f32>(self.weights(), d, self.rope(), query, key_value, 0);
        let q = HostTensor::new([batch, d.heads, n, d.head_dim], q)?;
        let k = HostTensor::new([batch, d.kv_heads, m, d.head_dim], k)?;
        let v = HostTensor::new([batch, d.kv_heads, m, d.v_head_dim], v)?;
        let attention = training_options(options);
        let out = engine
            .attention_host(&AttentionInputs::new(&q, &k, &v), &attention)
            .await?;
        let lse = out.lse.expect("the logsumexp was asked for");
        let output = out_projection::<f32>(out.y.data(), self.weights(), d, batch, n);
        let tape = MhaTape {
            query: query.clone(),
            key_value: key_value.cloned(),
            options: attention,
            q,
            k,
            v,
            y: out.y,
            lse,
        };
        Ok((HostTensor::new([batch, n, d.d_model], output)?, tape))
    }

    /// The gradients of a loss given dLoss/d`output` (`d_output`, the shape
    /// of the forward's output) and the forward's `tape`: the attention's on
    /// the engine's path, the projections' on the host in f32.
    pub async fn backward(
        &self,
        engine: &Engine,
        tape: &MhaTape,
        d_output: &HostTensor,
    ) -> Result<MhaGradients> {
        let d = self.dims();
        let (batch, n) = (tape.query.shape()[0], tape.query.shape()[1]);
        check_output_gradient(d_output, [batch, n, d.d_model])?;
        let d_out: Vec<f32> = d_output.data().to_vec();
        let (dy, d_wo, d_bo) = out_backward(self.weights(), d, tape.y.data(), &d_out, batch, n);
        let dy = HostTensor::new(tape.y.shape().to_vec(), dy)?;
        let forward = BackwardInputs {
            y: &tape.y,
            lse: &tape.lse,
            dy: &dy,
        };
        let inputs = AttentionInputs::new(&tape.q, &tape.k, &tape.v);
        let grads = engine
            .attention_backward_host(&inputs, &tape.options, &forward, GradientOptions::default())
            .await?;
        let exact = self.input_backward::<f32>(
            &tape.query,
            tape.key_value.as_ref(),
            [grads.dq, grads.dk, grads.dv].map(HostTensor::into_data),
            (d_wo, d_bo),
        );
        self.gradients_of(exact, &tape.query, tape.key_value.as_ref())
    }

    /// [`MultiHeadAttention::forward_train`] then
    /// [`MultiHeadAttention::backward`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn backward_blocking(
        &self,
        engine: &Engine,
        tape: &MhaTape,
        d_output: &HostTensor,
    ) -> Result<MhaGradients> {
        pollster::block_on(self.backward(engine, tape, d_output))
    }

    /// [`MultiHeadAttention::forward_train`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_train_blocking(
        &self,
        engine: &Engine,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        options: &AttentionOptions,
    ) -> Result<(HostTensor, MhaTape)> {
        pollster::block_on(self.forward_train(engine, query, key_value, options))
    }

    /// The layer's gradients computed in `F` from the inputs alone: the
    /// reference the engine's are judged against (f64, `rows` recomputed),
    /// or a plain f32 computation of the same thing (f32, P and D from the
    /// given Y and logsumexp as a backward handed them computes them). The
    /// attention's inputs and dY enter its oracle as f32 tensors.
    pub fn backward_exact<F: Real>(
        &self,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        options: &AttentionOptions,
        d_output: &HostTensor,
        rows: RowSource,
    ) -> Result<ExactMhaGradients<F>> {
        let (batch, n, m) = self.check_train_inputs(query, key_value, options)?;
        let d = self.dims();
        check_output_gradient(d_output, [batch, n, d.d_model])?;
        let (q, k, v) = projections::<F>(self.weights(), d, self.rope(), query, key_value, 0);
        let (y, _) = attention_core(&q, &k, &v, d, batch, n, m, options);
        let d_out: Vec<F> = d_output.data().iter().map(|&x| F::from_f32(x)).collect();
        let (dy, d_wo, d_bo) = out_backward(self.weights(), d, &y, &d_out, batch, n);
        let narrow = |shape: [usize; 4], x: &[F]| {
            HostTensor::new(shape, x.iter().map(|v| v.to_f64() as f32).collect())
        };
        let qt = narrow([batch, d.heads, n, d.head_dim], &q)?;
        let kt = narrow([batch, d.kv_heads, m, d.head_dim], &k)?;
        let vt = narrow([batch, d.kv_heads, m, d.v_head_dim], &v)?;
        let yt = narrow([batch, d.heads, n, d.v_head_dim], &y)?;
        let dyt = narrow([batch, d.heads, n, d.v_head_dim], &dy)?;
        let inputs = AttentionInputs::new(&qt, &kt, &vt);
        let attention = training_options(options);
        let lse = cpu::attention(&inputs, &attention)?
            .lse
            .expect("the logsumexp was asked for");
        let forward = BackwardInputs {
            y: &yt,
            lse: &lse,
            dy: &dyt,
        };
        let grads = cpu::attention_backward_in::<F>(
            &inputs,
            &attention,
            &forward,
            GradientOptions::default(),
            SumOrder::Sequential,
            rows,
        )?;
        Ok(self.input_backward::<F>(
            query,
            key_value,
            [grads.dq, grads.dk, grads.dv],
            (d_wo, d_bo),
        ))
    }

    /// Checks a training call's inputs; returns (batch, N, M).
    fn check_train_inputs(
        &self,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        options: &AttentionOptions,
    ) -> Result<(usize, usize, usize)> {
        options.validate()?;
        let d = self.dims();
        if key_value.is_none() && d.d_kv != d.d_model {
            return Err(Error::Conflict(
                "self-attention needs W_K and W_V with d_model input features; \
                 pass key_value for cross-attention",
            ));
        }
        super::expect_rank("query", query, 3, "3 ([batch, length, features])")?;
        super::expect_dim(
            "query",
            query,
            2,
            "features",
            d.d_model,
            "the layer's weights",
        )?;
        let kv = key_value.unwrap_or(query);
        super::expect_rank("key_value", kv, 3, "3 ([batch, length, features])")?;
        super::expect_dim(
            "key_value",
            kv,
            2,
            "features",
            d.d_kv,
            "the layer's weights",
        )?;
        super::expect_dim("key_value", kv, 0, "batch", query.shape()[0], "the query")?;
        if query.is_empty() || kv.is_empty() {
            return Err(Error::EmptyTensor {
                tensor: if query.is_empty() {
                    "query"
                } else {
                    "key_value"
                },
                shape: if query.is_empty() {
                    query.shape()
                } else {
                    kv.shape()
                }
                .to_vec(),
            });
        }
        Ok((query.shape()[0], query.shape()[1], kv.shape()[1]))
    }

    /// The projections' backward from the attention's head-major dQ, dK,
    /// dV (RoPE's undone first), with the output projection's gradients.
    fn input_backward<F: Real>(
        &self,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        [mut dq, mut dk, dv]: [Vec<F>; 3],
        (d_wo, d_bo): (Vec<F>, Vec<F>),
    ) -> ExactMhaGradients<F> {
        let (d, w) = (self.dims(), self.weights());
        let kv = key_value.unwrap_or(query);
        if let Some(rope) = self.rope() {
            rope_transpose_in_place(&mut dq, query.shape()[1], d.head_dim, rope, 0);
            rope_transpose_in_place(&mut dk, kv.shape()[1], d.head_dim, rope, 0);
        }
        let (dxq, dwq, dbq) = project_back(query, &w.w_q, &dq, d.heads, d.head_dim);
        let (dxk, dwk, dbk) = project_back(kv, &w.w_k, &dk, d.kv_heads, d.head_dim);
        let (dxv, dwv, dbv) = project_back(kv, &w.w_v, &dv, d.kv_heads, d.v_head_dim);
        let sum =
            |a: Vec<F>, b: &[F]| -> Vec<F> { a.into_iter().zip(b).map(|(x, &y)| x + y).collect() };
        let dx_kv = sum(dxk, &dxv);
        let (d_query, d_key_value) = match key_value {
            None => (sum(dxq, &dx_kv), Vec::new()),
            Some(_) => (dxq, dx_kv),
        };
        let bias = |b: &Option<HostTensor>, g: Vec<F>| if b.is_some() { g } else { Vec::new() };
        ExactMhaGradients {
            d_query,
            d_key_value,
            weights: [
                dwq,
                bias(&w.b_q, dbq),
                dwk,
                bias(&w.b_k, dbk),
                dwv,
                bias(&w.b_v, dbv),
                d_wo,
                bias(&w.b_o, d_bo),
            ],
        }
    }

    /// f32 gradients shaped as the layer's inputs and weights.
    fn gradients_of(
        &self,
        exact: ExactMhaGradients<f32>,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
    ) -> Result<MhaGradients> {
        let w = self.weights();
        let [dwq, dbq, dwk, dbk, dwv, dbv, dwo, dbo] = exact.weights;
        let like = |t: &HostTensor, g: Vec<f32>| HostTensor::new(t.shape().to_vec(), g);
        let like_bias =
            |b: &Option<HostTensor>, g: Vec<f32>| b.as_ref().map(|b| like(b, g)).transpose();
        Ok(MhaGradients {
            d_query: like(query, exact.d_query)?,
            d_key_value: key_value
                .map(|kv| like(kv, exact.d_key_value))
                .transpose()?,
            weights: MhaWeights {
                w_q: like(&w.w_q, dwq)?,
                b_q: like_bias(&w.b_q, dbq)?,
                w_k: like(&w.w_k, dwk)?,
                b_k: like_bias(&w.b_k, dbk)?,
                w_v: like(&w.w_v, dwv)?,
                b_v: like_bias(&w.b_v, dbv)?,
                w_o: like(&w.w_o, dwo)?,
                b_o: like_bias(&w.b_o, dbo)?,
            },
        })
    }
}

/// Refuses a `d_output` whose shape is not the forward output's.
fn check_output_gradient(d_output: &HostTensor, shape: [usize; 3]) -> Result<()> {
    if d_output.shape() != shape {
        return Err(Error::ShapeMismatch {
            tensor: "d_output",
            dim: "shape",
            got: d_output.len(),
            expected: shape.iter().product(),
            expected_from: "the forward's output [batch, length, d_model]",
            hint: "pass dLoss/dOutput in the output's shape",
        });
    }
    Ok(())
}

/// The output projection's backward: dY per head `[B, H, N, Dv]` (`dO W_O`
/// split by heads), dW_O `[d_model, H·Dv]` and db_O `[d_model]`.
fn out_backward<F: Real>(
    w: &MhaWeights,
    d: super::mha::MhaDims,
    y: &[F],
    d_out: &[F],
    batch: usize,
    n: usize,
) -> (Vec<F>, Vec<F>, Vec<F>) {
    let (dv, width) = (d.v_head_dim, d.heads * d.v_head_dim);
    let w_o: Vec<F> = w.w_o.data().iter().map(|&x| F::from_f32(x)).collect();
    let mut dy = vec![F::ZERO; batch * d.heads * n * dv];
    let mut d_wo = vec![F::ZERO; d.d_model * width];
    let mut d_bo = vec![F::ZERO; d.d_model];
    for b in 0..batch {
        for t in 0..n {
            let g = &d_out[(b * n + t) * d.d_model..][..d.d_model];
            for h in 0..d.heads {
                let row = ((b * d.heads + h) * n + t) * dv;
                for c in 0..dv {
                    let col = h * dv + c;
                    let mut acc = F::ZERO;
                    for (o, &go) in g.iter().enumerate() {
                        acc = acc + go * w_o[o * width + col];
                        d_wo[o * width + col] = d_wo[o * width + col] + go * y[row + c];
                    }
                    dy[row + c] = acc;
                }
            }
            for (acc, &go) in d_bo.iter_mut().zip(g) {
                *acc = *acc + go;
            }
        }
    }
    (dy, d_wo, d_bo)
}

/// A projection's backward from head-major `d_heads` `[B, heads, len,
/// head_dim]` of `x W ᵀ + b` (`x` `[B, len, in]`, `w` `[heads·head_dim, in]`):
/// dx `[B, len, in]`, dW and db.
fn project_back<F: Real>(
    x: &HostTensor,
    w: &HostTensor,
    d_heads: &[F],
    heads: usize,
    head_dim: usize,
) -> (Vec<F>, Vec<F>, Vec<F>) {
    let (batch, len, in_dim) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let out_dim = heads * head_dim;
    let mut dx = vec![F::ZERO; batch * len * in_dim];
    let mut dw = vec![F::ZERO; out_dim * in_dim];
    let mut db = vec![F::ZERO; out_dim];
    for b in 0..batch {
        for t in 0..len {
            let r = b * len + t;
            let x_row = &x.data()[r * in_dim..][..in_dim];
            for f in 0..out_dim {
                let (h, c) = (f / head_dim, f % head_dim);
                let g = d_heads[((b * heads + h) * len + t) * head_dim + c];
                db[f] = db[f] + g;
                let w_row = &w.data()[f * in_dim..][..in_dim];
                let dw_row = &mut dw[f * in_dim..][..in_dim];
                for i in 0..in_dim {
                    dw_row[i] = dw_row[i] + g * F::from_f32(x_row[i]);
                }
                let dx_row = &mut dx[r * in_dim..][..in_dim];
                for i in 0..in_dim {
                    dx_row[i] = dx_row[i] + g * F::from_f32(w_row[i]);
                }
            }
        }
    }
    (dx, dw, db)
}

/// The layer's attention options for a pass whose backward follows: the
/// logsumexp kept (the backward's input), no present K/V or QK output.
fn training_options(options: &AttentionOptions) -> AttentionOptions {
    AttentionOptions {
        return_lse: true,
        return_present: false,
        qk_matmul_output_mode: None,
        ..options.clone()
    }
}
