//! A small attention model trained from scratch on associative recall, a
//! task only attention solves: the model sees `P` (key, value) pairs and then
//! a key, and must answer that key's value. It is the engine's training
//! path end to end: embeddings, one [`MultiHeadAttention`] layer with a
//! residual, a linear read-out and a softmax cross-entropy, with every
//! gradient from the layer's backward (the attention's on the engine's
//! path, fused kernels on a GPU) and Adam's updates on the host.
//!
//! ```text
//! x_t = E_key[k_t] + E_val[v_t]  (t < P)      x_P = E_key[k_q] + e_ask
//! h   = x_P + MHA(x)_P           logits = h W_rᵀ + b_r      loss = CE(logits, v_q)
//! ```

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::family::mha::{MhaWeights, MultiHeadAttention};
use crate::options::AttentionOptions;
use crate::rng::SplitMix64;
use crate::tensor::HostTensor;

/// The task's sizes: `pairs` pairs a sequence, keys and values drawn from
/// `keys` and `values` symbols (the keys of one sequence distinct).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecallTask {
    /// Pairs a sequence shows before the question.
    pub pairs: usize,
    /// Distinct keys (at least `pairs`).
    pub keys: usize,
    /// Distinct values: the classes of the answer.
    pub values: usize,
}

impl Default for RecallTask {
    fn default() -> Self {
        Self {
            pairs: 8,
            keys: 16,
            values: 16,
        }
    }
}

/// One batch of sequences: each its pairs' keys and values and the asked
/// key's place among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecallBatch {
    /// `[batch, pairs]` keys.
    pub keys: Vec<usize>,
    /// `[batch, pairs]` values.
    pub values: Vec<usize>,
    /// `[batch]`: which pair is asked about.
    pub asked: Vec<usize>,
}

impl RecallBatch {
    /// The sequences in the batch.
    pub fn len(&self) -> usize {
        self.asked.len()
    }

    /// Whether the batch holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.asked.is_empty()
    }

    /// The right answer of sequence `b`.
    pub fn answer(&self, b: usize, pairs: usize) -> usize {
        self.values[b * pairs + self.asked[b]]
    }
}

impl RecallTask {
    /// Checks the sizes: at least one pair, enough keys to keep a
    /// sequence's keys distinct, at least two values.
    pub fn check(&self) -> Result<()> {
        if self.pairs == 0 || self.keys < self.pairs || self.values < 2 {
            return Err(Error::InvalidOption {
                name: "recall task",
                value: format!("{self:?}"),
                reason: "needs pairs >= 1, keys >= pairs and values >= 2",
            });
        }
        Ok(())
    }

    /// `batch` fresh sequences from `rng`; refuses sizes [`RecallTask::check`]
    /// refuses.
    pub fn batch(&self, rng: &mut SplitMix64, batch: usize) -> Result<RecallBatch> {
        self.check()?;
        let mut keys = Vec::with_capacity(batch * self.pairs);
        let mut values = Vec::with_capacity(batch * self.pairs);
        let mut asked = Vec::with_capacity(batch);
        for _ in 0..batch {
            // Distinct keys: a partial shuffle of 0..keys.
            let mut pool: Vec<usize> = (0..self.keys).collect();
            for i in 0..self.pairs {
                let j = i + rng.below(self.keys - i);
                pool.swap(i, j);
                keys.push(pool[i]);
                values.push(rng.below(self.values));
            }
            asked.push(rng.below(self.pairs));
        }
        Ok(RecallBatch {
            keys,
            values,
            asked,
        })
    }

    /// Checks that `batch` is one of this task's: non-empty, `[batch, pairs]`
    /// keys and values within their vocabularies, asked places within the
    /// pairs. The model indexes its embeddings with them.
    pub fn check_batch(&self, batch: &RecallBatch) -> Result<()> {
        let n = batch.len();
        let bad = |reason: &'static str| {
            Err(Error::InvalidOption {
                name: "recall batch",
                value: format!(
                    "{n} sequences, {} keys, {} values",
                    batch.keys.len(),
                    batch.values.len()
                ),
                reason,
            })
        };
        if n == 0 {
            return bad("holds no sequence");
        }
        if batch.keys.len() != n * self.pairs || batch.values.len() != n * self.pairs {
            return bad("needs [batch, pairs] keys and values");
        }
        if batch.keys.iter().any(|&k| k >= self.keys) {
            return bad("has a key outside the task's keys");
        }
        if batch.values.iter().any(|&v| v >= self.values) {
            return bad("has a value outside the task's values");
        }
        if batch.asked.iter().any(|&a| a >= self.pairs) {
            return bad("asks about a pair past the sequence's pairs");
        }
        Ok(())
    }
}

/// What one training step measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Mean cross-entropy over the batch (nats).
    pub loss: f32,
    /// Share of the batch answered right.
    pub accuracy: f32,
}

/// Adam's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adam {
    /// Step size.
    pub learning_rate: f32,
    /// First moment's decay.
    pub beta1: f32,
    /// Second moment's decay.
    pub beta2: f32,
    /// Added to the second moment's root.
    pub epsilon: f32,
}

impl Default for Adam {
    fn default() -> Self {
        Self {
            learning_rate: 1e-2,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        }
    }
}

/// The model: embeddings, one attention layer with a residual, a read-out.
#[derive(Debug)]
pub struct RecallModel {
    task: RecallTask,
    heads: usize,
    e_key: Vec<f32>,
    e_value: Vec<f32>,
    e_ask: Vec<f32>,
    layer: MultiHeadAttention,
    w_read: Vec<f32>,
    b_read: Vec<f32>,
    /// Adam's moments per parameter (in [`RecallModel::parameters`]' order)
    /// and its step count.
    moments: Vec<(Vec<f32>, Vec<f32>)>,
    steps: u32,
}

/// The model's parameters, flat, in one order: embeddings (keys, values,
/// the question's), the layer's weights and biases, the read-out's.
type Parameters = Vec<Vec<f32>>;

impl RecallModel {
    /// A model of width `d_model` with `heads` heads for `task`, its
    /// weights drawn from `seed`.
    pub fn new(task: RecallTask, d_model: usize, heads: usize, seed: u64) -> Result<Self> {
        task.check()?;
        if heads == 0 || !d_model.is_multiple_of(heads) {
            return Err(Error::InvalidOption {
                name: "heads",
                value: heads.to_string(),
                reason: "must divide d_model",
            });
        }
        let mut rng = SplitMix64::new(seed);
        let scale = 1.0 / (d_model as f32).sqrt();
        let weights =
            MhaWeights::random(d_model, d_model, heads, heads, d_model / heads, seed ^ 1)?;
        let mut model = Self {
            task,
            heads,
            e_key: rng.normal_vec(task.keys * d_model, 1.0),
            e_value: rng.normal_vec(task.values * d_model, 1.0),
            e_ask: rng.normal_vec(d_model, 1.0),
            layer: MultiHeadAttention::new(weights, heads, heads)?,
            w_read: rng.normal_vec(task.values * d_model, scale),
            b_read: vec![0.0; task.values],
            moments: Vec::new(),
            steps: 0,
        };
        model.moments = model
            .parameters()
            .iter()
            .map(|p| (vec![0.0; p.len()], vec![0.0; p.len()]))
            .collect();
        Ok(model)
    }

    /// The task the model learns.
    pub fn task(&self) -> RecallTask {
        self.task
    }

    /// The model's width.
    pub fn d_model(&self) -> usize {
        self.e_ask.len()
    }

    /// The attention layer (its weights as trained so far).
    pub fn layer(&self) -> &MultiHeadAttention {
        &self.layer
    }

    /// The batch's embedded sequences `[batch, pairs + 1, d_model]`; refuses
    /// a batch of another task ([`RecallTask::check_batch`]).
    pub fn embed(&self, batch: &RecallBatch) -> Result<HostTensor> {
        self.task.check_batch(batch)?;
        let (p, d) = (self.task.pairs, self.d_model());
        let mut x = vec![0.0f32; batch.len() * (p + 1) * d];
        for b in 0..batch.len() {
            for t in 0..p {
                let (k, v) = (batch.keys[b * p + t], batch.values[b * p + t]);
                let row = &mut x[(b * (p + 1) + t) * d..][..d];
                for (i, r) in row.iter_mut().enumerate() {
                    *r = self.e_key[k * d + i] + self.e_value[v * d + i];
                }
            }
            let k = batch.keys[b * p + batch.asked[b]];
            let row = &mut x[(b * (p + 1) + p) * d..][..d];
            for (i, r) in row.iter_mut().enumerate() {
                *r = self.e_key[k * d + i] + self.e_ask[i];
            }
        }
        HostTensor::new([batch.len(), p + 1, d], x)
    }

    /// One step of training on `batch`: forward, backward, Adam's update.
    pub async fn train_step(
        &mut self,
        engine: &Engine,
        batch: &RecallBatch,
        adam: &Adam,
    ) -> Result<StepStats> {
        let (p, d, n) = (self.task.pairs, self.d_model(), batch.len());
        let x = self.embed(batch)?;
        let options = AttentionOptions::default();
        let (out, tape) = self.layer.forward_train(engine, &x, None, &options).await?;
        let h = self.last_rows(&x, &out);
        let (stats, d_logits) = self.read_out(&h, batch);
        // The read-out's gradients, and dLoss/dh.
        let values = self.task.values;
        let mut d_w_read = vec![0.0f32; values * d];
        let mut d_b_read = vec![0.0f32; values];
        let mut d_h = vec![0.0f32; n * d];
        for b in 0..n {
            for c in 0..values {
                let g = d_logits[b * values + c];
                d_b_read[c] += g;
                for i in 0..d {
                    d_w_read[c * d + i] += g * h[b * d + i];
                    d_h[b * d + i] += g * self.w_read[c * d + i];
                }
            }
        }
        // dLoss/d(layer output): the question's row only.
        let mut d_out = vec![0.0f32; n * (p + 1) * d];
        for b in 0..n {
            d_out[(b * (p + 1) + p) * d..][..d].copy_from_slice(&d_h[b * d..][..d]);
        }
        let d_out = HostTensor::new([n, p + 1, d], d_out)?;
        let grads = self.layer.backward(engine, &tape, &d_out).await?;
        // dLoss/dx: through the layer, and the residual at the question.
        let mut d_x = grads.d_query.into_data();
        for b in 0..n {
            for i in 0..d {
                d_x[(b * (p + 1) + p) * d + i] += d_h[b * d + i];
            }
        }
        let (mut d_key, mut d_value, mut d_ask) = (
            vec![0.0f32; self.e_key.len()],
            vec![0.0f32; self.e_value.len()],
            vec![0.0f32; d],
        );
        for b in 0..n {
            for t in 0..=p {
                let row = &d_x[(b * (p + 1) + t) * d..][..d];
                let pair = if t < p { t } else { batch.asked[b] };
                let k = batch.keys[b * p + pair];
                for i in 0..d {
                    d_key[k * d + i] += row[i];
                    if t < p {
                        d_value[batch.values[b * p + t] * d + i] += row[i];
                    } else {
                        d_ask[i] += row[i];
                    }
                }
            }
        }
        let w = grads.weights;
        let mut gradients: Parameters = vec![d_key, d_value, d_ask];
        for t in [
            Some(w.w_q),
            w.b_q,
            Some(w.w_k),
            w.b_k,
            Some(w.w_v),
            w.b_v,
            Some(w.w_o),
            w.b_o,
        ]
        .into_iter()
        .flatten()
        {
            gradients.push(t.into_data());
        }
        gradients.push(d_w_read);
        gradients.push(d_b_read);
        self.update(gradients, adam)?;
        Ok(stats)
    }

    /// [`RecallModel::train_step`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn train_step_blocking(
        &mut self,
        engine: &Engine,
        batch: &RecallBatch,
        adam: &Adam,
    ) -> Result<StepStats> {
        pollster::block_on(self.train_step(engine, batch, adam))
    }

    /// The loss and accuracy on `batch` without training.
    pub async fn evaluate(&self, engine: &Engine, batch: &RecallBatch) -> Result<StepStats> {
        let x = self.embed(batch)?;
        let options = AttentionOptions::default();
        let out = self
            .layer
            .forward_train(engine, &x, None, &options)
            .await?
            .0;
        let h = self.last_rows(&x, &out);
        Ok(self.read_out(&h, batch).0)
    }

    /// [`RecallModel::evaluate`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn evaluate_blocking(&self, engine: &Engine, batch: &RecallBatch) -> Result<StepStats> {
        pollster::block_on(self.evaluate(engine, batch))
    }

    /// The attention weights of sequence `b` of `batch`: `[heads, pairs +
    /// 1, pairs + 1]`, row `t` the probabilities position `t` gives each
    /// position (the last row: the question's).
    pub fn attention_map(&self, batch: &RecallBatch, b: usize) -> Result<HostTensor> {
        let x = self.embed(batch)?;
        if b >= batch.len() {
            return Err(Error::InvalidOption {
                name: "sequence",
                value: b.to_string(),
                reason: "is past the batch's sequences",
            });
        }
        let (p, d) = (self.task.pairs, self.d_model());
        let one = HostTensor::new(
            [1, p + 1, d],
            x.data()[b * (p + 1) * d..][..(p + 1) * d].to_vec(),
        )?;
        let (_, probs) = self
            .layer
            .oracle::<f32>(&one, None, &AttentionOptions::default())?;
        HostTensor::new([self.heads, p + 1, p + 1], probs)
    }

    /// `h = x_P + out_P` per sequence, `[batch, d_model]`.
    fn last_rows(&self, x: &HostTensor, out: &HostTensor) -> Vec<f32> {
        let (p, d) = (self.task.pairs, self.d_model());
        let n = x.shape()[0];
        let mut h = vec![0.0f32; n * d];
        for b in 0..n {
            let at = (b * (p + 1) + p) * d;
            for i in 0..d {
                h[b * d + i] = x.data()[at + i] + out.data()[at + i];
            }
        }
        h
    }

    /// The read-out's loss and accuracy on `h`, and dLoss/dlogits (the
    /// mean over the batch).
    fn read_out(&self, h: &[f32], batch: &RecallBatch) -> (StepStats, Vec<f32>) {
        let (d, values, n) = (self.d_model(), self.task.values, batch.len());
        let mut d_logits = vec![0.0f32; n * values];
        let (mut loss, mut right) = (0.0f64, 0usize);
        for b in 0..n {
            let logits: Vec<f32> = (0..values)
                .map(|c| {
                    let w = &self.w_read[c * d..][..d];
                    self.b_read[c]
                        + w.iter()
                            .zip(&h[b * d..][..d])
                            .map(|(a, x)| a * x)
                            .sum::<f32>()
                })
                .collect();
            let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
            let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
            let answer = batch.answer(b, self.task.pairs);
            loss += f64::from(max + sum.ln() - logits[answer]);
            let best = (0..values)
                .max_by(|&i, &j| logits[i].total_cmp(&logits[j]))
                .unwrap_or(0);
            right += usize::from(best == answer);
            for c in 0..values {
                let p = (logits[c] - max).exp() / sum;
                let target = if c == answer { 1.0 } else { 0.0 };
                d_logits[b * values + c] = (p - target) / n as f32;
            }
        }
        let stats = StepStats {
            loss: (loss / n as f64) as f32,
            accuracy: right as f32 / n as f32,
        };
        (stats, d_logits)
    }

    /// Every parameter, flat, in the gradients' order.
    fn parameters(&self) -> Parameters {
        let w = self.layer.weights();
        let mut all = vec![self.e_key.clone(), self.e_value.clone(), self.e_ask.clone()];
        for t in [
            Some(&w.w_q),
            w.b_q.as_ref(),
            Some(&w.w_k),
            w.b_k.as_ref(),
            Some(&w.w_v),
            w.b_v.as_ref(),
            Some(&w.w_o),
            w.b_o.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            all.push(t.data().to_vec());
        }
        all.push(self.w_read.clone());
        all.push(self.b_read.clone());
        all
    }

    /// Adam's update of every parameter from its gradient.
    fn update(&mut self, gradients: Parameters, adam: &Adam) -> Result<()> {
        self.steps += 1;
        let t = self.steps as i32;
        let (c1, c2) = (1.0 - adam.beta1.powi(t), 1.0 - adam.beta2.powi(t));
        let mut params = self.parameters();
        for ((p, g), (m, v)) in params.iter_mut().zip(&gradients).zip(&mut self.moments) {
            for i in 0..p.len() {
                m[i] = adam.beta1 * m[i] + (1.0 - adam.beta1) * g[i];
                v[i] = adam.beta2 * v[i] + (1.0 - adam.beta2) * g[i] * g[i];
                p[i] -= adam.learning_rate * (m[i] / c1) / ((v[i] / c2).sqrt() + adam.epsilon);
            }
        }
        self.set_parameters(params)
    }

    /// Puts `params` (in [`RecallModel::parameters`]' order) in place.
    fn set_parameters(&mut self, params: Parameters) -> Result<()> {
        let mut it = params.into_iter();
        let mut next = || it.next().expect("one vector per parameter");
        self.e_key = next();
        self.e_value = next();
        self.e_ask = next();
        let old = self.layer.weights();
        let mut tensor = |like: &HostTensor| HostTensor::new(like.shape().to_vec(), next());
        let w_q = tensor(&old.w_q)?;
        let b_q = old.b_q.as_ref().map(&mut tensor).transpose()?;
        let w_k = tensor(&old.w_k)?;
        let b_k = old.b_k.as_ref().map(&mut tensor).transpose()?;
        let w_v = tensor(&old.w_v)?;
        let b_v = old.b_v.as_ref().map(&mut tensor).transpose()?;
        let w_o = tensor(&old.w_o)?;
        let b_o = old.b_o.as_ref().map(&mut tensor).transpose()?;
        let weights = MhaWeights {
            w_q,
            b_q,
            w_k,
            b_k,
            w_v,
            b_v,
            w_o,
            b_o,
        };
        self.layer = MultiHeadAttention::new(weights, self.heads, self.heads)?;
        self.w_read = next();
        self.b_read = next();
        Ok(())
    }
}
