//! A multi-head layer's serving step over a paged KV cache: several
//! sequences, each with its own number of new tokens (a prompt or one token),
//! in one step. Each sequence's Q, K and V are projected (RoPE at its own
//! positions, continuing from its length), every sequence's keys and values
//! are appended to its pages in one append, all their queries attend in one
//! paged call (one submission on device pages), and each output is
//! projected back. The projections run per sequence (a step of many short
//! sequences projects them one after another: a packed projection is still
//! to come).

use super::mha::MultiHeadAttention;
use crate::device::scope::Run;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::options::AttentionOptions;
use crate::paged::{PagedKvCache, SequenceId};
use crate::problem::AttentionOutputs;
use crate::tensor::HostTensor;

impl MultiHeadAttention {
    /// One serving step of causal self-attention over `cache`: each
    /// `(seq, x)` holds a sequence's next tokens `x` `[1, n, d_model]`;
    /// their keys and values are appended to its pages and its queries
    /// attend to its own keys, causal positions (and RoPE's) continuing from
    /// its length. Returns each sequence's output `[1, n, d_model]`, in
    /// order. Everything the caller passed is checked before the cache
    /// changes: a sequence not in it or named twice, an input's shape, a
    /// cache whose layout is not this layer's heads.
    pub async fn forward_paged(
        &self,
        engine: &Engine,
        cache: &mut PagedKvCache,
        steps: &[(SequenceId, &HostTensor)],
        options: &AttentionOptions,
    ) -> Result<Vec<HostTensor>> {
        options.validate()?;
        engine.recover().await?;
        let d = self.dims();
        if d.d_kv != d.d_model {
            return Err(Error::Conflict(
                "a paged step is self-attention: W_K and W_V need d_model input features",
            ));
        }
        let l = cache.layout();
        let layout_fits =
            (l.kv_heads, l.head_dim, l.v_head_dim) == (d.kv_heads, d.head_dim, d.v_head_dim);
        if !layout_fits {
            return Err(Error::Conflict(
                "the paged cache's layout (KV heads, head sizes) is not this layer's",
            ));
        }
        for (i, &(seq, x)) in steps.iter().enumerate() {
            self.check_input("x", x, d.d_model, Some(1))?;
            cache.len(seq)?;
            if steps[..i].iter().any(|&(other, _)| other == seq) {
                return Err(Error::Conflict(
                    "a sequence is named twice in one step: concatenate its tokens",
                ));
            }
        }
        // Each sequence's Q, K and V, rotated at its own positions.
        let mut queries = Vec::with_capacity(steps.len());
        let mut appends = Vec::with_capacity(steps.len());
        for &(seq, x) in steps {
            let past = cache.len(seq)?;
            let (q, k, v) = match engine.gpu() {
                Some(device) => {
                    let run = Run::new(device);
                    let weights = self.device_weights(engine, &run)?;
                    self.project_gpu(engine, &run, &weights, x, None, past)
                        .await?
                }
                None => self.project_host(engine, x, None, past)?,
            };
            let (k, v) = (engine.download(&k).await?, engine.download(&v).await?);
            let n = x.shape()[1];
            appends.push((
                seq,
                HostTensor::new([d.kv_heads, n, d.head_dim], k.data().to_vec())?,
                HostTensor::new([d.kv_heads, n, d.v_head_dim], v.data().to_vec())?,
            ));
            queries.push((seq, engine.download(&q).await?));
        }
        let items: Vec<_> = appends.iter().map(|(s, k, v)| (*s, k, v)).collect();
        cache.append_many(&items)?;
        let options = AttentionOptions {
            is_causal: true,
            return_lse: false,
            return_present: false,
            qk_matmul_output_mode: None,
            ..options.clone()
        };
        let asked: Vec<_> = queries.iter().map(|(s, q)| (*s, q)).collect();
        let attended = cache.attention(engine, &asked, &options).await?;
        let mut outputs = Vec::with_capacity(steps.len());
        for (out, &(_, x)) in attended.into_iter().zip(steps) {
            let y = AttentionOutputs {
                y: engine.upload(&out.y)?,
                present_key: None,
                present_value: None,
                qk_matmul_output: None,
                lse: None,
            };
            let projected = self.finish(engine, &y, None, 1, x.shape()[1], None).await?;
            outputs.push(projected.output);
        }
        Ok(outputs)
    }

    /// [`MultiHeadAttention::forward_paged`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_paged_blocking(
        &self,
        engine: &Engine,
        cache: &mut PagedKvCache,
        steps: &[(SequenceId, &HostTensor)],
        options: &AttentionOptions,
    ) -> Result<Vec<HostTensor>> {
        pollster::block_on(self.forward_paged(engine, cache, steps, options))
    }
}
