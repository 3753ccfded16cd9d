//! Multiplicative (Luong) attention: a score per (decoder state `s_i`,
//! encoder state `h_j`) pair, a softmax over `j` and the context
//! `c_i = Σ_j α_ij h_j`, with Luong's three scores:
//!
//! - dot: `s_iᵀ h_j` (d_s = d_h),
//! - general: `s_iᵀ W h_j`,
//! - concat: `vᵀ tanh(W [s_i; h_j])`.
//!
//! The scores are unscaled, as Luong defines them, unless a scale is set.
//! On the GPU, dot and general are GEMMs (general projects the encoder states
//! first: `h'_j = W h_j`, then `s_iᵀ h'_j`), masked by the mask kernel;
//! concat is additive attention with `W` split into its two column blocks.
//!
//! ```no_run
//! use webattn::family::luong::{LuongAttention, LuongScore};
//! use webattn::{Engine, HostTensor};
//!
//! # fn main() -> webattn::Result<()> {
//! let w = HostTensor::new([2, 2], vec![1.0, 0.5, 0.0, 1.0])?;
//! let attention = LuongAttention::new(LuongScore::General { w })?;
//! let s = HostTensor::new([1, 1, 2], vec![0.3, -0.4])?;
//! let h = HostTensor::new([1, 3, 2], vec![1.0, 0.0, 0.0, 1.0, 0.5, 0.5])?;
//! let out = attention.forward_blocking(&Engine::new_blocking(), &s, &h, Some(&[2]), true)?;
//! assert_eq!(out.weights.unwrap().data()[2], 0.0); // beyond the source length
//! # Ok(()) }
//! ```

use crate::cpu::Real;
use crate::device::buffer;
use crate::device::recorder::Recorder;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::kernels::gemm;
use crate::kernels::gemm::{GemmChoice, GemmSpec};
use crate::kernels::mask;
use crate::kernels::mask::MaskBuffers;
use crate::options::AttentionOptions;
use crate::problem::AttentionDims;
use crate::tensor::HostTensor;

use super::additive::{self, Projection};
use super::scored::{self, par_rows, Sizes, Staged, Want};
use super::{expect_dim, expect_rank, Attended};

/// Luong's score functions.
#[derive(Debug, Clone, PartialEq)]
pub enum LuongScore {
    /// `score(s, h) = sᵀ h`; the decoder and encoder states must be equally wide.
    Dot,
    /// `score(s, h) = sᵀ W h`.
    General {
        /// `W [d_s, d_h]`.
        w: HostTensor,
    },
    /// `score(s, h) = vᵀ tanh(W [s; h])`.
    Concat {
        /// `W [d_a, d_s + d_h]`: its first d_s columns act on `s`, the rest on `h`.
        w: HostTensor,
        /// `v [d_a]`.
        v: HostTensor,
    },
}

/// Luong attention with one of its score functions.
#[derive(Debug, Clone, PartialEq)]
pub struct LuongAttention {
    score: LuongScore,
    scale: f32,
}

impl LuongAttention {
    /// Checks the score's parameters: `General`'s `w` has rank 2; `Concat`'s
    /// `w` is `[d_a, at least 2]` and `v` is `[d_a]`.
    pub fn new(score: LuongScore) -> Result<Self> {
        match &score {
            LuongScore::Dot => {}
            LuongScore::General { w } => expect_rank("w", w, 2, "2 ([d_s, d_h])")?,
            LuongScore::Concat { w, v } => {
                expect_rank("w", w, 2, "2 ([d_a, d_s + d_h])")?;
                expect_rank("v", v, 1, "1 ([d_a])")?;
                expect_dim("v", v, 0, "attention dimension", w.shape()[0], "w")?;
                if w.shape()[1] < 2 {
                    return Err(Error::ShapeMismatch {
                        tensor: "w",
                        dim: "columns",
                        got: w.shape()[1],
                        expected: 2,
                        expected_from: "[s; h] (at least one value each)",
                        hint: "concat scoring needs W [d_a, d_s + d_h]",
                    });
                }
            }
        }
        Ok(Self { score, scale: 1.0 })
    }

    /// The score function.
    pub fn score(&self) -> &LuongScore {
        &self.score
    }

    /// The factor every score is multiplied by (1, Luong's definition, unless set).
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Multiplies every score by `scale` (e.g. `1/√d` for a scaled dot product).
    pub fn with_scale(mut self, scale: f32) -> Result<Self> {
        if !scale.is_finite() {
            return Err(Error::InvalidOption {
                name: "scale",
                value: scale.to_string(),
                reason: "the scale must be finite",
            });
        }
        self.scale = scale;
        Ok(self)
    }

    /// Checks the states against each other and the score's parameters.
    fn sizes(
        &self,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
    ) -> Result<Sizes> {
        let sizes = Sizes::of(s, h, source_lengths)?;
        match &self.score {
            LuongScore::Dot => expect_dim("h", h, 2, "d_h", sizes.d_s, "s (dot scoring)")?,
            LuongScore::General { w } => {
                expect_dim("s", s, 2, "d_s", w.shape()[0], "w")?;
                expect_dim("h", h, 2, "d_h", w.shape()[1], "w")?;
            }
            LuongScore::Concat { w, .. } => {
                if sizes.d_s + sizes.d_h != w.shape()[1] {
                    return Err(Error::ShapeMismatch {
                        tensor: "w",
                        dim: "columns",
                        got: w.shape()[1],
                        expected: sizes.d_s + sizes.d_h,
                        expected_from: "d_s + d_h of s and h",
                        hint: "concat scoring needs W [d_a, d_s + d_h]",
                    });
                }
            }
        }
        Ok(sizes)
    }

    /// The context `[B, Nq, d_h]` for decoder states `s [B, Nq, d_s]` over
    /// encoder states `h [B, Nk, d_h]`, and the weights `[B, Nq, Nk]` when
    /// `want_weights`. With `source_lengths`, batch entry `b` attends to its
    /// first `source_lengths[b]` encoder states only; a length of 0 gives zero
    /// context and zero weights.
    ///
    /// On a GPU engine everything runs in the engine's kernels with one
    /// readback at the end; on a CPU engine the fast CPU backend's f32 code.
    pub async fn forward(
        &self,
        engine: &Engine,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
        want_weights: bool,
    ) -> Result<Attended> {
        self.run(
            engine,
            s,
            h,
            source_lengths,
            Want::Attend {
                weights: want_weights,
            },
        )
        .await
    }

    /// The scores `[B, Nq, Nk]` before the softmax; masked keys are `-inf`.
    pub async fn scores(
        &self,
        engine: &Engine,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
    ) -> Result<HostTensor> {
        Ok(self
            .run(engine, s, h, source_lengths, Want::Scores)
            .await?
            .output)
    }

    async fn run(
        &self,
        engine: &Engine,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
        want: Want,
    ) -> Result<Attended> {
        let sizes = self.sizes(s, h, source_lengths)?;
        // After a device loss, run on a fresh device.
        engine.recover().await?;
        let Some(ctx) = engine.gpu() else {
            let threads = engine.cpu_backend().threads();
            let scores = self.scores_fast(&sizes, s, h, source_lengths, threads);
            return scored::finish_on_cpu(&sizes, scores, h, want, threads);
        };
        let gemm = engine.gemm_choice();
        scored::run_on_gpu(
            ctx,
            gemm,
            &sizes,
            s,
            h,
            source_lengths,
            want,
            |rec, staged, gemm| {
                self.record_scores(rec, gemm, &sizes, staged, source_lengths.is_some())
            },
        )
        .await
    }

    /// Records the scores into `staged.scores`, masked when `masked`.
    fn record_scores(
        &self,
        rec: &mut Recorder<'_>,
        gemm: GemmChoice,
        sizes: &Sizes,
        staged: &Staged,
        masked: bool,
    ) -> Result<Vec<wgpu::Buffer>> {
        let ctx = rec.ctx();
        // S Hᵀ (or S H'ᵀ), one product per batch entry.
        let dot = |width: usize| GemmSpec {
            alpha: self.scale,
            ..GemmSpec::contiguous(sizes.batch, sizes.q_len, sizes.k_len, width, false, true)
        };
        let mut keep = Vec::new();
        match &self.score {
            LuongScore::Dot => {
                gemm::record(
                    rec,
                    gemm.for_product(&ctx.caps, &dot(sizes.d_h)),
                    &dot(sizes.d_h),
                    &staged.s,
                    &staged.h,
                    &staged.scores,
                )?;
            }
            LuongScore::General { w } => {
                let w_buf = buffer::upload(ctx, "w", w.data())?;
                let keys = sizes.batch * sizes.k_len;
                let projected = buffer::storage(ctx, "W h", keys * sizes.d_s)?;
                let spec = GemmSpec::contiguous(1, keys, sizes.d_s, sizes.d_h, false, true);
                gemm::record(
                    rec,
                    gemm.for_product(&ctx.caps, &spec),
                    &spec,
                    &staged.h,
                    &w_buf,
                    &projected,
                )?;
                gemm::record(
                    rec,
                    gemm.for_product(&ctx.caps, &dot(sizes.d_s)),
                    &dot(sizes.d_s),
                    &staged.s,
                    &projected,
                    &staged.scores,
                )?;
                keep.extend([w_buf, projected]);
            }
            LuongScore::Concat { w, v } => {
                let w_buf = buffer::upload(ctx, "w", w.data())?;
                let v_buf = buffer::upload(ctx, "v", v.data())?;
                let (ws, wh) = concat_projections(w, sizes);
                keep = additive::record_scores(
                    rec,
                    gemm,
                    sizes,
                    staged,
                    (&w_buf, ws),
                    (&w_buf, wh),
                    &v_buf,
                    self.scale,
                )?;
                keep.extend([w_buf, v_buf]);
                // The additive kernel masks the padding itself.
                return Ok(keep);
            }
        }
        if masked {
            keep.extend(record_padding_mask(rec, sizes, staged)?);
        }
        Ok(keep)
    }

    /// The oracle in `F` (f64: the reference; f32: the plain baseline):
    /// (context `[B, Nq, d_h]`, weights `[B, Nq, Nk]`), row-major.
    pub fn oracle<F: Real>(
        &self,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
    ) -> Result<(Vec<F>, Vec<F>)> {
        let sizes = self.sizes(s, h, source_lengths)?;
        let scores = self.scores_in::<F>(&sizes, s, h, source_lengths);
        Ok(scored::softmax_context(&sizes, &scores, h))
    }

    /// The oracle's scores `[B, Nq, Nk]` in `F`; masked keys are `-inf`.
    pub fn scores_oracle<F: Real>(
        &self,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
    ) -> Result<Vec<F>> {
        let sizes = self.sizes(s, h, source_lengths)?;
        Ok(self.scores_in(&sizes, s, h, source_lengths))
    }

    /// The scores in f32 on a CPU engine, as [`LuongAttention::scores_in`]
    /// defines them and in its order of operations, by the backend's product.
    fn scores_fast(
        &self,
        sizes: &Sizes,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
        threads: usize,
    ) -> Vec<f32> {
        use crate::cpu::fast::gemm::{matmul, Init, MatRef};
        let projected;
        let (keys, width): (&[f32], usize) = match &self.score {
            LuongScore::Dot => (h.data(), sizes.d_h),
            LuongScore::General { w } => {
                projected = Projection { w, offset: 0 }.apply_fast(h.data(), sizes.d_h, threads);
                (&projected, sizes.d_s)
            }
            LuongScore::Concat { w, v } => {
                let (ws, wh) = concat_projections(w, sizes);
                return additive::scores_fast(
                    sizes,
                    s,
                    h,
                    ws,
                    wh,
                    v,
                    source_lengths,
                    self.scale,
                    threads,
                );
            }
        };
        let (nq, nk) = (sizes.q_len, sizes.k_len);
        let mut scores = vec![0.0f32; sizes.rows() * nk];
        for (b, out) in scores.chunks_mut(nq * nk).enumerate() {
            matmul(
                MatRef::rows(&s.data()[b * nq * width..(b + 1) * nq * width], nq, width),
                MatRef::transposed(&keys[b * nk * width..(b + 1) * nk * width], nk, width),
                Init::Zero,
                out,
                threads,
            );
            let limit = sizes.keys(source_lengths, b);
            for row in out.chunks_exact_mut(nk) {
                for (j, e) in row.iter_mut().enumerate() {
                    *e = if j < limit {
                        *e * self.scale
                    } else {
                        f32::NEG_INFINITY
                    };
                }
            }
        }
        scores
    }

    fn scores_in<F: Real>(
        &self,
        sizes: &Sizes,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
    ) -> Vec<F> {
        let scale = F::from_f32(self.scale);
        // Rows of the keys as `F`: h itself, or h projected by W.
        let (keys, width): (Vec<F>, usize) = match &self.score {
            LuongScore::Dot => (
                h.data().iter().map(|&x| F::from_f32(x)).collect(),
                sizes.d_h,
            ),
            LuongScore::General { w } => (
                Projection { w, offset: 0 }.apply(h.data(), sizes.d_h),
                sizes.d_s,
            ),
            LuongScore::Concat { w, v } => {
                let (ws, wh) = concat_projections(w, sizes);
                return additive::scores_oracle(sizes, s, h, ws, wh, v, source_lengths, self.scale);
            }
        };
        let mut scores = vec![F::ZERO; sizes.rows() * sizes.k_len];
        par_rows(&mut scores, sizes.k_len, |row, e| {
            let b = row / sizes.q_len;
            let limit = sizes.keys(source_lengths, b);
            let si = &s.data()[row * width..(row + 1) * width];
            for (j, e) in e.iter_mut().enumerate() {
                if j >= limit {
                    *e = F::NEG_INFINITY;
                    continue;
                }
                let kj = &keys[(b * sizes.k_len + j) * width..(b * sizes.k_len + j + 1) * width];
                let mut sum = F::ZERO;
                for (&x, &y) in si.iter().zip(kj) {
                    sum = sum + F::from_f32(x) * y;
                }
                *e = sum * scale;
            }
        });
        scores
    }

    /// [`LuongAttention::forward`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_blocking(
        &self,
        engine: &Engine,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
        want_weights: bool,
    ) -> Result<Attended> {
        pollster::block_on(self.forward(engine, s, h, source_lengths, want_weights))
    }

    /// [`LuongAttention::scores`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn scores_blocking(
        &self,
        engine: &Engine,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
    ) -> Result<HostTensor> {
        pollster::block_on(self.scores(engine, s, h, source_lengths))
    }
}

/// `W [d_a, d_s + d_h]` as its two column blocks.
fn concat_projections<'w>(w: &'w HostTensor, sizes: &Sizes) -> (Projection<'w>, Projection<'w>) {
    (
        Projection { w, offset: 0 },
        Projection {
            w,
            offset: sizes.d_s,
        },
    )
}

/// Masks keys `j >= lengths[b]` of the scores with the mask kernel, as ONNX's
/// `nonpad_kv_seqlen` (one head, no past). Returns its placeholder buffers.
fn record_padding_mask(
    rec: &mut Recorder<'_>,
    sizes: &Sizes,
    staged: &Staged,
) -> Result<Vec<wgpu::Buffer>> {
    let ctx = rec.ctx();
    let dims = AttentionDims {
        batch: sizes.batch,
        q_heads: 1,
        kv_heads: 1,
        q_len: sizes.q_len,
        kv_len: sizes.k_len,
        past_len: 0,
        head_dim: sizes.d_s,
        v_head_dim: sizes.d_h,
        mask: None,
        has_past: false,
        has_nonpad: true,
        f16: Default::default(),
        placement: Default::default(),
    };
    let no_mask = buffer::storage(ctx, "no mask", 1)?;
    let no_capture = buffer::storage(ctx, "no qk output", 1)?;
    mask::record(
        rec,
        &dims,
        &AttentionOptions::default(),
        0,
        sizes.rows(),
        &staged.scores,
        &MaskBuffers {
            mask: &no_mask,
            nonpad: &staged.lengths,
            qk_out: &no_capture,
        },
    )?;
    Ok(vec![no_mask, no_capture])
}
