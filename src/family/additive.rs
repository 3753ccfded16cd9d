//! Additive (Bahdanau) attention: `e_ij = vᵀ tanh(W1 s_i + W2 h_j)`, a softmax
//! over the encoder states `j`, and the context `c_i = Σ_j α_ij h_j`, for many
//! decoder states at once.
//!
//! On the GPU, `A = S W1ᵀ` and `Bm = H W2ᵀ` come from the GEMM, the
//! `additive_scores` kernel sums `v[a] · tanh(A[i, a] + Bm[j, a])` over `a`
//! without storing the `[Nq, Nk, d_a]` tensor (and masks the source padding),
//! then the softmax and a second GEMM give the weights and the context, all
//! in one submission.
//!
//! ```no_run
//! use webattn::family::additive::AdditiveAttention;
//! use webattn::{Engine, HostTensor};
//!
//! # fn main() -> webattn::Result<()> {
//! let (d_a, d_s, d_h) = (2, 3, 3);
//! let attention = AdditiveAttention::new(
//!     HostTensor::new([d_a, d_s], vec![0.5, -0.3, 0.2, 0.4, 0.6, -0.1])?,
//!     HostTensor::new([d_a, d_h], vec![0.3, 0.5, 0.2, -0.2, 0.4, 0.6])?,
//!     HostTensor::new([d_a], vec![1.0, 0.8])?,
//! )?;
//! let s = HostTensor::new([1, 1, d_s], vec![0.5, 0.5, 0.5])?; // one decoder state
//! let h = HostTensor::new([1, 4, d_h], vec![1., 0., 1., 0., 1., 1., 1., 1., 0., 0., 0., 1.])?;
//! let engine = Engine::new_blocking();
//! let out = attention.forward_blocking(&engine, &s, &h, None, true)?;
//! assert_eq!(out.output.shape(), &[1, 1, 3]); // the context
//! assert_eq!(out.weights.unwrap().shape(), &[1, 1, 4]);
//! # Ok(()) }
//! ```

use crate::cpu::Real;
use crate::device::buffer;
use crate::device::recorder::Recorder;
use crate::engine::Engine;
use crate::error::Result;
use crate::kernels::additive;
use crate::kernels::additive::AdditiveSpec;
use crate::kernels::gemm;
use crate::kernels::gemm::{GemmChoice, GemmSpec};
use crate::tensor::HostTensor;

use super::scored::{self, par_rows, Sizes, Staged, Want};
use super::{expect_dim, expect_rank, Attended};

/// Bahdanau attention with its parameters: `W1 [d_a, d_s]` applied to the
/// decoder states, `W2 [d_a, d_h]` to the encoder states, and `v [d_a]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdditiveAttention {
    w1: HostTensor,
    w2: HostTensor,
    v: HostTensor,
}

impl AdditiveAttention {
    /// Checks the parameters' shapes: `w1 [d_a, d_s]`, `w2 [d_a, d_h]`, `v [d_a]`.
    pub fn new(w1: HostTensor, w2: HostTensor, v: HostTensor) -> Result<Self> {
        expect_rank("w1", &w1, 2, "2 ([d_a, d_s])")?;
        expect_rank("w2", &w2, 2, "2 ([d_a, d_h])")?;
        expect_rank("v", &v, 1, "1 ([d_a])")?;
        expect_dim("w2", &w2, 0, "attention dimension", w1.shape()[0], "w1")?;
        expect_dim("v", &v, 0, "attention dimension", w1.shape()[0], "w1")?;
        Ok(Self { w1, w2, v })
    }

    /// `W1 [d_a, d_s]`.
    pub fn w1(&self) -> &HostTensor {
        &self.w1
    }

    /// `W2 [d_a, d_h]`.
    pub fn w2(&self) -> &HostTensor {
        &self.w2
    }

    /// `v [d_a]`.
    pub fn v(&self) -> &HostTensor {
        &self.v
    }

    /// The attention dimension d_a.
    pub fn attention_dim(&self) -> usize {
        self.v.len()
    }

    /// Checks the states against each other and the parameters.
    fn sizes(
        &self,
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
    ) -> Result<Sizes> {
        let sizes = Sizes::of(s, h, source_lengths)?;
        expect_dim("s", s, 2, "d_s", self.w1.shape()[1], "w1")?;
        expect_dim("h", h, 2, "d_h", self.w2.shape()[1], "w2")?;
        Ok(sizes)
    }

    fn projections(&self) -> (Projection<'_>, Projection<'_>) {
        (
            Projection {
                w: &self.w1,
                offset: 0,
            },
            Projection {
                w: &self.w2,
                offset: 0,
            },
        )
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

    /// The scores `e [B, Nq, Nk]` before the softmax; masked keys are `-inf`.
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
        let (ws, wh) = self.projections();
        // After a device loss, run on a fresh device.
        engine.recover().await?;
        let Some(ctx) = engine.gpu() else {
            let threads = engine.cpu_backend().threads();
            let scores = scores_fast(&sizes, s, h, ws, wh, &self.v, source_lengths, 1.0, threads);
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
                let run = rec.ctx();
                let w1 = buffer::upload(run, "w1", self.w1.data())?;
                let w2 = buffer::upload(run, "w2", self.w2.data())?;
                let v = buffer::upload(run, "v", self.v.data())?;
                let mut keep =
                    record_scores(rec, gemm, &sizes, staged, (&w1, ws), (&w2, wh), &v, 1.0)?;
                keep.extend([w1, w2, v]);
                Ok(keep)
            },
        )
        .await
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
        let (ws, wh) = self.projections();
        let scores = scores_oracle::<F>(&sizes, s, h, ws, wh, &self.v, source_lengths, 1.0);
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
        let (ws, wh) = self.projections();
        Ok(scores_oracle(
            &sizes,
            s,
            h,
            ws,
            wh,
            &self.v,
            source_lengths,
            1.0,
        ))
    }

    /// [`AdditiveAttention::forward`], blocking.
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

    /// [`AdditiveAttention::scores`], blocking.
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

/// One projection onto the attention dimension: the columns from `offset` of
/// the row-major `[d_a, ld]` matrix `w` (as many as the states are wide).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Projection<'a> {
    pub w: &'a HostTensor,
    pub offset: usize,
}

impl Projection<'_> {
    pub(crate) fn ld(&self) -> usize {
        self.w.shape()[1]
    }

    /// `rows` states of `width` values projected in f32 by the fast CPU
    /// backend's product: `[rows, d_a]`, each sum in the oracle's order.
    pub(crate) fn apply_fast(&self, states: &[f32], width: usize, threads: usize) -> Vec<f32> {
        use crate::cpu::fast::gemm::{matmul, Init, MatRef};
        let (d_a, ld) = (self.w.shape()[0], self.ld());
        let rows = states.len() / width;
        let mut out = vec![0.0f32; rows * d_a];
        matmul(
            MatRef::rows(states, rows, width),
            MatRef::strided(&self.w.data()[self.offset..], width, d_a, 1, ld),
            Init::Zero,
            &mut out,
            threads,
        );
        out
    }

    /// `rows` states of `width` values projected: `[rows, d_a]` in `F`.
    pub(crate) fn apply<F: Real>(&self, states: &[f32], width: usize) -> Vec<F> {
        let (d_a, ld) = (self.w.shape()[0], self.ld());
        let w = self.w.data();
        let mut out = vec![F::ZERO; states.len() / width * d_a];
        par_rows(&mut out, d_a, |r, row| {
            let x = &states[r * width..(r + 1) * width];
            for (a, out) in row.iter_mut().enumerate() {
                let wa = &w[a * ld + self.offset..a * ld + self.offset + width];
                let mut sum = F::ZERO;
                for (&wk, &xk) in wa.iter().zip(x) {
                    sum = sum + F::from_f32(wk) * F::from_f32(xk);
                }
                *out = sum;
            }
        });
        out
    }
}

/// The additive scores in `F`:
/// `e[b, i, j] = scale · Σ_a v[a] · tanh((Ws s_bi)[a] + (Wh h_bj)[a])`, `-inf`
/// for keys beyond the source length.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_oracle<F: Real>(
    sizes: &Sizes,
    s: &HostTensor,
    h: &HostTensor,
    ws: Projection<'_>,
    wh: Projection<'_>,
    v: &HostTensor,
    source_lengths: Option<&[usize]>,
    scale: f32,
) -> Vec<F> {
    let d_a = v.len();
    let a_proj: Vec<F> = ws.apply(s.data(), sizes.d_s);
    let b_proj: Vec<F> = wh.apply(h.data(), sizes.d_h);
    let v: Vec<F> = v.data().iter().map(|&x| F::from_f32(x)).collect();
    let scale = F::from_f32(scale);
    let mut scores = vec![F::ZERO; sizes.rows() * sizes.k_len];
    par_rows(&mut scores, sizes.k_len, |row, e| {
        let b = row / sizes.q_len;
        let keys = sizes.keys(source_lengths, b);
        let ai = &a_proj[row * d_a..(row + 1) * d_a];
        for (j, e) in e.iter_mut().enumerate() {
            if j >= keys {
                *e = F::NEG_INFINITY;
                continue;
            }
            let bj = &b_proj[(b * sizes.k_len + j) * d_a..(b * sizes.k_len + j + 1) * d_a];
            let mut sum = F::ZERO;
            for ((&va, &x), &y) in v.iter().zip(ai).zip(bj) {
                sum = sum + va * (x + y).tanh();
            }
            *e = sum * scale;
        }
    });
    scores
}

/// The additive scores in f32 on a CPU engine, as [`scores_oracle`] defines
/// them and in its order of operations: the projections by the backend's
/// product, then for each decoder state the sum over `a` of
/// `v[a] · tanh(A[i, a] + Bm[j, a])`, vectorised across the encoder states `j`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_fast(
    sizes: &Sizes,
    s: &HostTensor,
    h: &HostTensor,
    ws: Projection<'_>,
    wh: Projection<'_>,
    v: &HostTensor,
    source_lengths: Option<&[usize]>,
    scale: f32,
    threads: usize,
) -> Vec<f32> {
    use crate::cpu::fast::isa::{dispatch, Isa};
    let d_a = v.len();
    let nk = sizes.k_len;
    let a_proj = ws.apply_fast(s.data(), sizes.d_s, threads);
    let b_proj = wh.apply_fast(h.data(), sizes.d_h, threads);
    // Bm transposed per batch entry, [B][d_a][Nk], so j runs along memory.
    let mut b_t = vec![0.0f32; b_proj.len()];
    for b in 0..sizes.batch {
        for j in 0..nk {
            for a in 0..d_a {
                b_t[(b * d_a + a) * nk + j] = b_proj[(b * nk + j) * d_a + a];
            }
        }
    }
    let mut scores = vec![0.0f32; sizes.rows() * nk];
    let rows_per_item = sizes.rows().div_ceil(4 * threads.max(1)).max(1);
    let items: Vec<(usize, &mut [f32])> = scores
        .chunks_mut(rows_per_item * nk)
        .enumerate()
        .map(|(i, chunk)| (i * rows_per_item, chunk))
        .collect();
    let isa = Isa::detect();
    crate::cpu::fast::threads::for_each(
        items,
        threads,
        || (),
        |(first, out), _| {
            dispatch(
                isa,
                AdditiveRows {
                    sizes,
                    a_proj: &a_proj,
                    b_t: &b_t,
                    v: v.data(),
                    source_lengths,
                    scale,
                    first,
                    out,
                },
            )
        },
    );
    scores
}

/// Rows `first..` of the additive scores, in the instruction set dispatched.
struct AdditiveRows<'x> {
    sizes: &'x Sizes,
    a_proj: &'x [f32],
    b_t: &'x [f32],
    v: &'x [f32],
    source_lengths: Option<&'x [usize]>,
    scale: f32,
    first: usize,
    out: &'x mut [f32],
}

impl crate::cpu::fast::isa::Job for AdditiveRows<'_> {
    type Output = ();

    #[inline(always)]
    fn run<const MR: usize, const NR: usize, const FMA: bool>(self) {
        use crate::cpu::fast::math::tanh;
        let (nk, d_a) = (self.sizes.k_len, self.v.len());
        for (r, e) in self.out.chunks_exact_mut(nk).enumerate() {
            let row = self.first + r;
            let b = row / self.sizes.q_len;
            let keys = self.sizes.keys(self.source_lengths, b);
            let ai = &self.a_proj[row * d_a..(row + 1) * d_a];
            e.fill(0.0);
            for (a, (&va, &x)) in self.v.iter().zip(ai).enumerate() {
                let bj = &self.b_t[(b * d_a + a) * nk..(b * d_a + a + 1) * nk];
                for (s, &y) in e.iter_mut().zip(bj) {
                    *s += va * tanh::<FMA>(x + y);
                }
            }
            for (j, s) in e.iter_mut().enumerate() {
                *s = if j < keys {
                    *s * self.scale
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
    }
}

/// Records `A = S Wsᵀ`, `Bm = H Whᵀ` and the additive scores into
/// `staged.scores`; returns the projections, to be kept until the submit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_scores(
    rec: &mut Recorder<'_>,
    gemm: GemmChoice,
    sizes: &Sizes,
    staged: &Staged,
    (ws_buf, ws): (&wgpu::Buffer, Projection<'_>),
    (wh_buf, wh): (&wgpu::Buffer, Projection<'_>),
    v: &wgpu::Buffer,
    scale: f32,
) -> Result<Vec<wgpu::Buffer>> {
    let ctx = rec.ctx();
    let d_a = ws.w.shape()[0];
    let spec = AdditiveSpec {
        batch: sizes.batch,
        q_len: sizes.q_len,
        k_len: sizes.k_len,
        d_a,
        scale,
    };
    spec.check(&ctx.caps)?;
    let a_proj = buffer::storage(ctx, "W1 s", sizes.rows() * d_a)?;
    let b_proj = buffer::storage(ctx, "W2 h", sizes.batch * sizes.k_len * d_a)?;
    let project = |rows: usize, width: usize, p: Projection<'_>| GemmSpec {
        ldb: p.ld(),
        b_offset: p.offset,
        ..GemmSpec::contiguous(1, rows, d_a, width, false, true)
    };
    let product = project(sizes.rows(), sizes.d_s, ws);
    gemm::record(
        rec,
        gemm.for_product(&ctx.caps, &product),
        &product,
        &staged.s,
        ws_buf,
        &a_proj,
    )?;
    let product = project(sizes.batch * sizes.k_len, sizes.d_h, wh);
    gemm::record(
        rec,
        gemm.for_product(&ctx.caps, &product),
        &product,
        &staged.h,
        wh_buf,
        &b_proj,
    )?;
    additive::record(
        rec,
        &spec,
        &a_proj,
        &b_proj,
        v,
        &staged.lengths,
        &staged.scores,
    )?;
    Ok(vec![a_proj, b_proj])
}
