//! Linear attention (Katharopoulos et al., 2020): softmax replaced by a
//! positive feature map, so attention costs O(N) instead of O(N²).
//!
//! With φ(x) = elu(x) + 1 (x + 1 for x > 0, eˣ otherwise), the output row i is
//!
//! ```text
//! o_i = φ(q_i)ᵀ S / φ(q_i)ᵀ z,    S = Σ_j φ(k_j) v_jᵀ,    z = Σ_j φ(k_j)
//! ```
//!
//! over all keys, or, causal, over the keys `j ≤ i` only. The weights the
//! output implies are `w_ij = φ(q_i)·φ(k_j) / Σ_j' φ(q_i)·φ(k_j')` over the
//! same keys (zero where the causal mask hides a key); they cost O(N·M) and
//! are computed only when asked for.
//!
//! On a GPU engine the feature maps, the state sweep (in key chunks on drivers
//! that cap loop iterations), the output rows and the weights are WGSL kernels
//! recorded into one submission; only the results are read back. On a CPU
//! engine the same O(N) algorithm runs in f32 on the fast CPU backend (its
//! products, vectorised scans), in the oracle's order of operations.

use super::{expect_dim, expect_rank, Attended};
use crate::cpu::Real;
use crate::device::buffer;
use crate::device::recorder::Recorder;
use crate::device::scope::Run;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::kernels::linear;
use crate::kernels::linear::{LinearBuffers, LinearSizes};
use crate::tensor::HostTensor;

/// Linear attention with the elu+1 feature map, causal or not.
///
/// Q is `[B, H, N, Dk]`, K `[B, H, M, Dk]`, V `[B, H, M, Dv]` (head-major, as
/// in the engine's 4D attention); the output is `[B, H, N, Dv]` and the
/// weights `[B, H, N, M]`. Causal attention needs `N == M`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinearAttention {
    /// Each query attends to the keys at or before its own position only.
    pub causal: bool,
}

/// The checked sizes of one linear attention problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearDims {
    /// Batch size B.
    pub batch: usize,
    /// Heads H.
    pub heads: usize,
    /// Query rows N.
    pub q_len: usize,
    /// Key/value rows M.
    pub kv_len: usize,
    /// Query/key width Dk.
    pub dk: usize,
    /// Value width Dv.
    pub dv: usize,
}

impl LinearDims {
    /// Checks the shapes of Q, K and V (and `N == M` when `causal`).
    pub fn check(
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        causal: bool,
    ) -> Result<LinearDims> {
        expect_rank("Q", q, 4, "4 ([batch, heads, queries, Dk])")?;
        expect_rank("K", k, 4, "4 ([batch, heads, keys, Dk])")?;
        expect_rank("V", v, 4, "4 ([batch, heads, keys, Dv])")?;
        let shape = q.shape();
        let (batch, heads, q_len, dk) = (shape[0], shape[1], shape[2], shape[3]);
        expect_dim("K", k, 0, "batch", batch, "Q")?;
        expect_dim("K", k, 1, "heads", heads, "Q")?;
        expect_dim("K", k, 3, "Dk", dk, "Q")?;
        let kv_len = k.shape()[2];
        expect_dim("V", v, 0, "batch", batch, "Q")?;
        expect_dim("V", v, 1, "heads", heads, "Q")?;
        expect_dim("V", v, 2, "keys", kv_len, "K")?;
        if causal && kv_len != q_len {
            return Err(Error::ShapeMismatch {
                tensor: "K",
                dim: "keys",
                got: kv_len,
                expected: q_len,
                expected_from: "Q (causal linear attention)",
                hint: "causal attention pairs query i with keys 0..=i, so K and V need as \
                       many rows as Q; use causal = false for cross attention",
            });
        }
        Ok(LinearDims {
            batch,
            heads,
            q_len,
            kv_len,
            dk,
            dv: v.shape()[3],
        })
    }

    /// The output's shape `[B, H, N, Dv]`.
    pub fn output_shape(&self) -> [usize; 4] {
        [self.batch, self.heads, self.q_len, self.dv]
    }

    /// The weights' shape `[B, H, N, M]`.
    pub fn weights_shape(&self) -> [usize; 4] {
        [self.batch, self.heads, self.q_len, self.kv_len]
    }

    /// The sizes the kernels take (batch and heads folded).
    pub fn sizes(&self) -> LinearSizes {
        LinearSizes {
            heads: self.batch * self.heads,
            q_len: self.q_len,
            kv_len: self.kv_len,
            dk: self.dk,
            dv: self.dv,
        }
    }

    /// Elements of the weights, or a limit error when they could not be addressed.
    fn weights_len(&self) -> Result<usize> {
        self.weights_shape()
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::Limit {
                what: format!("linear attention weights {:?}", self.weights_shape()),
                needed: u64::MAX,
                limit: usize::MAX as u64,
                limit_name: "addressable elements",
                hint: "ask for the weights of a smaller problem",
            })
    }
}

/// The oracle's results at the precision they were computed in.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearExact<F> {
    /// The checked sizes.
    pub dims: LinearDims,
    /// The output `[B, H, N, Dv]`.
    pub output: Vec<F>,
    /// The weights `[B, H, N, M]`, empty unless asked for.
    pub weights: Vec<F>,
}

/// The feature map φ(x) = elu(x) + 1: `x + 1` for `x > 0`, `eˣ` otherwise.
pub fn elu_plus_one<F: Real>(x: F) -> F {
    if x > F::ZERO {
        x + F::from_f32(1.0)
    } else {
        x.exp()
    }
}

/// Linear attention computed in `F`: in f64 the reference the GPU is checked
/// against, in f32 the plain baseline that sets the tolerance.
///
/// The output follows the O(N) form: S and z are summed key by key (causal:
/// row i is read off right after key i is added) and `o_i[c] = Σ_d φ(q_i)_d
/// S_dc / Σ_d φ(q_i)_d z_d`. The weights follow their definition, each score
/// `φ(q_i)·φ(k_j)` divided by the sum of the row's allowed scores.
pub fn linear_attention_oracle<F: Real>(
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    causal: bool,
    want_weights: bool,
) -> Result<LinearExact<F>> {
    let dims = LinearDims::check(q, k, v, causal)?;
    let LinearDims {
        q_len: n,
        kv_len: m,
        dk,
        dv,
        ..
    } = dims;
    let heads = dims.batch * dims.heads;
    let mut output = vec![F::ZERO; heads * n * dv];
    let mut weights = if want_weights {
        vec![F::ZERO; dims.weights_len()?]
    } else {
        Vec::new()
    };
    let features =
        |x: &[f32]| -> Vec<F> { x.iter().map(|&x| elu_plus_one(F::from_f32(x))).collect() };
    for bh in 0..heads {
        let phi_q = features(&q.data()[bh * n * dk..(bh + 1) * n * dk]);
        let phi_k = features(&k.data()[bh * m * dk..(bh + 1) * m * dk]);
        let v_head: Vec<F> = v.data()[bh * m * dv..(bh + 1) * m * dv]
            .iter()
            .map(|&x| F::from_f32(x))
            .collect();
        let out = &mut output[bh * n * dv..(bh + 1) * n * dv];
        let mut s = vec![F::ZERO; dk * dv];
        let mut z = vec![F::ZERO; dk];
        let absorb = |j: usize, s: &mut [F], z: &mut [F]| {
            for d in 0..dk {
                let f = phi_k[j * dk + d];
                z[d] = z[d] + f;
                for c in 0..dv {
                    s[d * dv + c] = s[d * dv + c] + f * v_head[j * dv + c];
                }
            }
        };
        let emit = |i: usize, s: &[F], z: &[F], row: &mut [F]| {
            let mut num = vec![F::ZERO; dv];
            let mut den = F::ZERO;
            for d in 0..dk {
                let fq = phi_q[i * dk + d];
                den = den + fq * z[d];
                for c in 0..dv {
                    num[c] = num[c] + fq * s[d * dv + c];
                }
            }
            for (o, &x) in row.iter_mut().zip(&num) {
                *o = x / den;
            }
        };
        if causal {
            for i in 0..n {
                absorb(i, &mut s, &mut z);
                emit(i, &s, &z, &mut out[i * dv..(i + 1) * dv]);
            }
        } else {
            for j in 0..m {
                absorb(j, &mut s, &mut z);
            }
            for i in 0..n {
                emit(i, &s, &z, &mut out[i * dv..(i + 1) * dv]);
            }
        }
        if want_weights {
            let w = &mut weights[bh * n * m..(bh + 1) * n * m];
            for i in 0..n {
                let row = &mut w[i * m..(i + 1) * m];
                let allowed = if causal { i + 1 } else { m };
                let mut sum = F::ZERO;
                for (j, score) in row.iter_mut().enumerate().take(allowed) {
                    let mut dot = F::ZERO;
                    for d in 0..dk {
                        dot = dot + phi_q[i * dk + d] * phi_k[j * dk + d];
                    }
                    *score = dot;
                    sum = sum + dot;
                }
                for score in &mut row[..allowed] {
                    *score = *score / sum;
                }
            }
        }
    }
    Ok(LinearExact {
        dims,
        output,
        weights,
    })
}

impl LinearAttention {
    /// Linear attention, causal or not.
    pub fn new(causal: bool) -> Self {
        Self { causal }
    }

    /// The output and, if `want_weights`, the weights `[B, H, N, M]`: on the
    /// GPU on a GPU engine, in f32 on the fast CPU backend on a CPU engine.
    pub async fn forward(
        &self,
        engine: &Engine,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        want_weights: bool,
    ) -> Result<Attended> {
        let dims = LinearDims::check(q, k, v, self.causal)?;
        // After a device loss, run on a fresh device.
        engine.recover().await?;
        match engine.gpu() {
            Some(ctx) => {
                let run = Run::new(ctx);
                let gemm = engine.gemm_choice();
                forward_gpu(&run, gemm, &dims, self.causal, q, k, v, want_weights).await
            }
            None => forward_cpu(
                &dims,
                self.causal,
                q,
                k,
                v,
                want_weights,
                engine.cpu_backend().threads(),
            ),
        }
    }

    /// [`LinearAttention::forward`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_blocking(
        &self,
        engine: &Engine,
        q: &HostTensor,
        k: &HostTensor,
        v: &HostTensor,
        want_weights: bool,
    ) -> Result<Attended> {
        pollster::block_on(self.forward(engine, q, k, v, want_weights))
    }
}

#[allow(clippy::too_many_arguments)]
async fn forward_gpu(
    ctx: &Run,
    gemm: crate::kernels::gemm::GemmChoice,
    dims: &LinearDims,
    causal: bool,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    want_weights: bool,
) -> Result<Attended> {
    let sizes = dims.sizes();
    let rows = sizes.heads * sizes.q_len;
    let weights_len = if want_weights { dims.weights_len()? } else { 0 };
    let (y, weights) = ctx
        .scoped("linear attention", || {
            let q_buf = buffer::upload(ctx, "Q", q.data())?;
            let k_buf = buffer::upload(ctx, "K", k.data())?;
            let v_buf = buffer::upload(ctx, "V", v.data())?;
            let phi_q = buffer::storage(ctx, "phi(Q)", q.len())?;
            let phi_k = buffer::storage(ctx, "phi(K)", k.len())?;
            let state = buffer::storage(ctx, "linear attention state", sizes.state_len())?;
            let norm = buffer::storage(ctx, "linear attention normalisers", rows)?;
            let y = buffer::storage(ctx, "linear attention output", rows * sizes.dv)?;
            let weights = want_weights
                .then(|| buffer::storage(ctx, "linear attention weights", weights_len))
                .transpose()?;
            let mut rec = Recorder::new(ctx, "linear attention");
            linear::record_forward(
                &mut rec,
                &sizes,
                causal,
                &LinearBuffers {
                    q: &q_buf,
                    k: &k_buf,
                    v: &v_buf,
                    phi_q: &phi_q,
                    phi_k: &phi_k,
                    state: &state,
                    norm: &norm,
                    y: &y,
                    weights: weights.as_ref(),
                },
                gemm,
            )?;
            rec.submit();
            Ok((y, weights))
        })
        .await?;
    let output = buffer::read_f32(ctx, &y, 0, rows * sizes.dv).await?;
    let weights = match weights {
        Some(buf) => Some(HostTensor::new(
            dims.weights_shape(),
            buffer::read_f32(ctx, &buf, 0, weights_len).await?,
        )?),
        None => None,
    };
    Ok(Attended {
        output: HostTensor::new(dims.output_shape(), output)?,
        weights,
    })
}

/// Linear attention in f32 on the fast CPU backend, in the order of
/// operations of [`linear_attention_oracle`]: non-causal, the state
/// `S = φ(K)ᵀ V` and the outputs `φ(Q) S` are products on the backend's
/// micro-kernel; causal, the scan adds key `i` to the state and reads row `i`
/// off it, vectorised across the value columns. The weights are `φ(Q) φ(K)ᵀ`
/// normalised over the allowed keys.
fn forward_cpu(
    dims: &LinearDims,
    causal: bool,
    q: &HostTensor,
    k: &HostTensor,
    v: &HostTensor,
    want_weights: bool,
    threads: usize,
) -> Result<Attended> {
    use crate::cpu::fast::gemm::{matmul, Init, MatRef};
    use crate::cpu::fast::isa::{dispatch, Isa};
    let LinearDims {
        q_len: n,
        kv_len: m,
        dk,
        dv,
        ..
    } = *dims;
    let heads = dims.batch * dims.heads;
    let isa = Isa::detect();
    let phi_q = dispatch(isa, FeatureMap(q.data()));
    let phi_k = dispatch(isa, FeatureMap(k.data()));
    let mut output = vec![0.0f32; heads * n * dv];
    let mut weights = if want_weights {
        vec![0.0f32; dims.weights_len()?]
    } else {
        Vec::new()
    };
    for bh in 0..heads {
        let fq = &phi_q[bh * n * dk..(bh + 1) * n * dk];
        let fk = &phi_k[bh * m * dk..(bh + 1) * m * dk];
        let vh = &v.data()[bh * m * dv..(bh + 1) * m * dv];
        let out = &mut output[bh * n * dv..(bh + 1) * n * dv];
        if causal {
            dispatch(
                isa,
                CausalScan {
                    fq,
                    fk,
                    v: vh,
                    dk,
                    dv,
                    out,
                },
            );
        } else {
            let mut state = vec![0.0f32; dk * dv];
            matmul(
                MatRef::transposed(fk, m, dk),
                MatRef::rows(vh, m, dv),
                Init::Zero,
                &mut state,
                threads,
            );
            let mut z = vec![0.0f32; dk];
            for row in fk.chunks_exact(dk) {
                for (zd, &f) in z.iter_mut().zip(row) {
                    *zd += f;
                }
            }
            matmul(
                MatRef::rows(fq, n, dk),
                MatRef::rows(&state, dk, dv),
                Init::Zero,
                out,
                threads,
            );
            for (row, fq_i) in out.chunks_exact_mut(dv).zip(fq.chunks_exact(dk)) {
                let mut den = 0.0f32;
                for (&f, &zd) in fq_i.iter().zip(&z) {
                    den += f * zd;
                }
                for o in row.iter_mut() {
                    *o /= den;
                }
            }
        }
        if want_weights {
            let w = &mut weights[bh * n * m..(bh + 1) * n * m];
            matmul(
                MatRef::rows(fq, n, dk),
                MatRef::transposed(fk, m, dk),
                Init::Zero,
                w,
                threads,
            );
            for (i, row) in w.chunks_exact_mut(m).enumerate() {
                let allowed = if causal { (i + 1).min(m) } else { m };
                row[allowed..].fill(0.0);
                let mut sum = 0.0f32;
                for &x in &row[..allowed] {
                    sum += x;
                }
                for x in &mut row[..allowed] {
                    *x /= sum;
                }
            }
        }
    }
    Ok(Attended {
        output: HostTensor::new(dims.output_shape(), output)?,
        weights: want_weights
            .then(|| HostTensor::new(dims.weights_shape(), weights))
            .transpose()?,
    })
}

/// φ(x) = elu(x) + 1 of every value, vectorised.
struct FeatureMap<'a>(&'a [f32]);

impl crate::cpu::fast::isa::Job for FeatureMap<'_> {
    type Output = Vec<f32>;

    #[inline(always)]
    fn run<const MR: usize, const NR: usize, const FMA: bool>(self) -> Vec<f32> {
        use crate::cpu::fast::math::exp;
        self.0
            .iter()
            .map(|&x| if x > 0.0 { x + 1.0 } else { exp::<FMA>(x) })
            .collect()
    }
}

/// One head's causal scan: key `i` joins the state `S` (`[Dk][Dv]`) and the
/// normaliser `z`, then row `i` is `φ(q_i) S / φ(q_i) · z`.
struct CausalScan<'a> {
    fq: &'a [f32],
    fk: &'a [f32],
    v: &'a [f32],
    dk: usize,
    dv: usize,
    out: &'a mut [f32],
}

impl crate::cpu::fast::isa::Job for CausalScan<'_> {
    type Output = ();

    #[inline(always)]
    fn run<const MR: usize, const NR: usize, const FMA: bool>(self) {
        let CausalScan {
            fq,
            fk,
            v,
            dk,
            dv,
            out,
        } = self;
        let mut state = vec![0.0f32; dk * dv];
        let mut z = vec![0.0f32; dk];
        let mut num = vec![0.0f32; dv];
        for (i, row) in out.chunks_exact_mut(dv).enumerate() {
            let (fk_i, v_i) = (&fk[i * dk..(i + 1) * dk], &v[i * dv..(i + 1) * dv]);
            for (d, &f) in fk_i.iter().enumerate() {
                z[d] += f;
                for (s, &x) in state[d * dv..(d + 1) * dv].iter_mut().zip(v_i) {
                    *s += f * x;
                }
            }
            num.fill(0.0);
            let mut den = 0.0f32;
            for (d, &f) in fq[i * dk..(i + 1) * dk].iter().enumerate() {
                den += f * z[d];
                for (acc, &s) in num.iter_mut().zip(&state[d * dv..(d + 1) * dv]) {
                    *acc += f * s;
                }
            }
            for (o, &x) in row.iter_mut().zip(&num) {
                *o = x / den;
            }
        }
    }
}
