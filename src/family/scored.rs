//! What additive and multiplicative attention share once a variant has its
//! scores: the shape and length checks, the oracle's softmax and context, and
//! on the GPU the softmax, the context GEMM and the readback.
//!
//! A variant records its scores `[B, Nq, Nk]` (masked keys holding
//! [`MASKED`]) into the buffer [`run_on_gpu`] hands it; everything after that
//! is the same for every variant.

use crate::cpu::Real;
use crate::device::buffer;
use crate::device::recorder::Recorder;
use crate::device::scope::Run;
use crate::error::{Error, Result};
use crate::kernels::gemm;
use crate::kernels::gemm::GemmChoice;
use crate::kernels::gemm::GemmSpec;
use crate::kernels::softmax;
use crate::kernels::softmax::MASKED;
use crate::tensor::HostTensor;

use super::{expect_dim, expect_rank, Attended};

/// The sizes of one call: decoder states `[B, Nq, d_s]`, encoder states `[B, Nk, d_h]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub batch: usize,
    pub q_len: usize,
    pub k_len: usize,
    pub d_s: usize,
    pub d_h: usize,
}

impl Sizes {
    /// Checks the states' ranks and batch, and the source lengths (one per
    /// batch entry, each at most Nk).
    pub(crate) fn of(
        s: &HostTensor,
        h: &HostTensor,
        source_lengths: Option<&[usize]>,
    ) -> Result<Sizes> {
        expect_rank("s", s, 3, "3 ([batch, decoder steps, d_s])")?;
        expect_rank("h", h, 3, "3 ([batch, source length, d_h])")?;
        expect_dim("h", h, 0, "batch", s.shape()[0], "s")?;
        let sizes = Sizes {
            batch: s.shape()[0],
            q_len: s.shape()[1],
            k_len: h.shape()[1],
            d_s: s.shape()[2],
            d_h: h.shape()[2],
        };
        if let Some(lengths) = source_lengths {
            if lengths.len() != sizes.batch {
                return Err(Error::ShapeMismatch {
                    tensor: "source_lengths",
                    dim: "length",
                    got: lengths.len(),
                    expected: sizes.batch,
                    expected_from: "s",
                    hint: "give one source length per batch entry",
                });
            }
            if let Some(&bad) = lengths.iter().find(|&&l| l > sizes.k_len) {
                return Err(Error::InvalidOption {
                    name: "source_lengths",
                    value: bad.to_string(),
                    reason:
                        "every source length must lie between 0 and the number of encoder states",
                });
            }
        }
        Ok(sizes)
    }

    /// Rows of scores, `B · Nq`.
    pub(crate) fn rows(&self) -> usize {
        self.batch * self.q_len
    }

    /// The context's shape `[B, Nq, d_h]`.
    pub(crate) fn context_shape(&self) -> [usize; 3] {
        [self.batch, self.q_len, self.d_h]
    }

    /// The weights' (and scores') shape `[B, Nq, Nk]`.
    pub(crate) fn weights_shape(&self) -> [usize; 3] {
        [self.batch, self.q_len, self.k_len]
    }

    /// The keys batch entry `b` attends to.
    pub(crate) fn keys(&self, source_lengths: Option<&[usize]>, b: usize) -> usize {
        source_lengths.map_or(self.k_len, |l| l[b])
    }
}

/// Fills `out` (whole rows of `row_len` values) by `fill(row, row_values)`,
/// spread over the available cores (one thread on wasm).
pub(crate) fn par_rows<F: Send>(
    out: &mut [F],
    row_len: usize,
    fill: impl Fn(usize, &mut [F]) + Sync,
) {
    let rows = out.len() / row_len.max(1);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(rows)
        .max(1);
    let run = |first: usize, chunk: &mut [F]| {
        for (r, row) in chunk.chunks_mut(row_len).enumerate() {
            fill(first + r, row);
        }
    };
    if workers == 1 {
        run(0, out);
        return;
    }
    let per_worker = rows.div_ceil(workers);
    std::thread::scope(|scope| {
        for (w, chunk) in out.chunks_mut(per_worker * row_len).enumerate() {
            let run = &run;
            scope.spawn(move || run(w * per_worker, chunk));
        }
    });
}

/// The oracle's tail: the softmax of each score row (masked scores are
/// `-inf`; a row with none left gets zero weights) and the context
/// `c_i = Σ_j α_ij h_j`. Returns (context `[B, Nq, d_h]`, weights `[B, Nq, Nk]`).
pub(crate) fn softmax_context<F: Real>(
    sizes: &Sizes,
    scores: &[F],
    h: &HostTensor,
) -> (Vec<F>, Vec<F>) {
    let (nq, nk, dh) = (sizes.q_len, sizes.k_len, sizes.d_h);
    let mut weights = vec![F::ZERO; sizes.rows() * nk];
    let mut context = vec![F::ZERO; sizes.rows() * dh];
    for row in 0..sizes.rows() {
        let e = &scores[row * nk..(row + 1) * nk];
        let max = e
            .iter()
            .fold(F::NEG_INFINITY, |m, &x| if x > m { x } else { m });
        if max == F::NEG_INFINITY {
            continue;
        }
        let w = &mut weights[row * nk..(row + 1) * nk];
        let mut sum = F::ZERO;
        for (wj, &x) in w.iter_mut().zip(e) {
            if x > F::NEG_INFINITY {
                *wj = (x - max).exp();
                sum = sum + *wj;
            }
        }
        for wj in w.iter_mut() {
            *wj = *wj / sum;
        }
        let b = row / nq;
        let c = &mut context[row * dh..(row + 1) * dh];
        for (j, &wj) in w.iter().enumerate() {
            let hj = &h.data()[(b * nk + j) * dh..(b * nk + j + 1) * dh];
            for (ca, &ha) in c.iter_mut().zip(hj) {
                *ca = *ca + wj * F::from_f32(ha);
            }
        }
    }
    (context, weights)
}

/// The buffers a variant records its scores with.
pub(crate) struct Staged {
    /// The decoder states `[B·Nq, d_s]`.
    pub s: wgpu::Buffer,
    /// The encoder states `[B·Nk, d_h]`.
    pub h: wgpu::Buffer,
    /// B key counts as u32 (Nk each without source lengths); the mask kernel
    /// reads them as i32, which is the same bits for counts below 2³¹.
    pub lengths: wgpu::Buffer,
    /// Where the scores go: `[B, Nq, Nk]`, masked keys holding [`MASKED`].
    pub scores: wgpu::Buffer,
}

/// What a GPU run hands back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// The scores only (masked keys as `-inf`).
    Scores,
    /// The context, and the weights when `weights` is set.
    Attend {
        /// Read the weights back too.
        weights: bool,
    },
}

/// Uploads the states, lets `record_scores` record the scores (it returns the
/// buffers it made, kept alive until the submit), then records the softmax
/// and the context GEMM, submits once and reads back what `want` asks.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_on_gpu(
    device: &crate::device::context::GpuContext,
    gemm: GemmChoice,
    sizes: &Sizes,
    s: &HostTensor,
    h: &HostTensor,
    source_lengths: Option<&[usize]>,
    want: Want,
    record_scores: impl FnOnce(&mut Recorder<'_>, &Staged, GemmChoice) -> Result<Vec<wgpu::Buffer>>,
) -> Result<Attended> {
    let run = Run::new(device);
    let ctx = &run;
    // The softmax loops over a row in strides of its workgroup.
    if let Some(budget) = ctx.caps.loop_budget() {
        let needed = 3 * sizes.k_len.div_ceil(softmax::WORKGROUP as usize) as u64 + 64;
        if needed > budget {
            return Err(Error::Limit {
                what: format!("a softmax row of {} encoder states", sizes.k_len),
                needed,
                limit: budget,
                limit_name: "loop iterations per invocation (llvmpipe)",
                hint: "split the source sequence",
            });
        }
    }
    let lengths: Vec<u32> = (0..sizes.batch)
        .map(|b| sizes.keys(source_lengths, b) as u32)
        .collect();
    let (scores, context) = ctx
        .scoped("additive/multiplicative attention", || {
            let staged = Staged {
                s: buffer::upload(ctx, "s", s.data())?,
                h: buffer::upload(ctx, "h", h.data())?,
                lengths: buffer::upload(ctx, "source lengths", &lengths)?,
                scores: buffer::storage(ctx, "scores", sizes.rows() * sizes.k_len)?,
            };
            let mut rec = Recorder::new(ctx, "additive/multiplicative attention");
            let mut keep_alive = record_scores(&mut rec, &staged, gemm)?;
            let context = match want {
                Want::Scores => None,
                Want::Attend { .. } => {
                    let lse = buffer::storage(ctx, "lse", sizes.rows())?;
                    softmax::record(
                        &mut rec,
                        sizes.rows(),
                        sizes.k_len,
                        &staged.scores,
                        &lse,
                        0,
                        softmax::NotAttended::Zero,
                        1.0,
                    )?;
                    keep_alive.push(lse);
                    let context = buffer::storage(ctx, "context", sizes.rows() * sizes.d_h)?;
                    let spec = GemmSpec::contiguous(
                        sizes.batch,
                        sizes.q_len,
                        sizes.d_h,
                        sizes.k_len,
                        false,
                        false,
                    );
                    let kernel = gemm.for_product(&ctx.caps, &spec);
                    gemm::record(&mut rec, kernel, &spec, &staged.scores, &staged.h, &context)?;
                    Some(context)
                }
            };
            rec.submit();
            drop(keep_alive);
            Ok((staged.scores, context))
        })
        .await?;
    let read_scores = match want {
        Want::Scores | Want::Attend { weights: true } => {
            Some(buffer::read_f32(ctx, &scores, 0, sizes.rows() * sizes.k_len).await?)
        }
        Want::Attend { weights: false } => None,
    };
    match context {
        None => {
            let scores: Vec<f32> = read_scores
                .unwrap_or_default()
                .into_iter()
                .map(|x| if x <= MASKED { f32::NEG_INFINITY } else { x })
                .collect();
            Ok(Attended {
                output: HostTensor::new(sizes.weights_shape(), scores)?,
                weights: None,
            })
        }
        Some(context) => {
            let context = buffer::read_f32(ctx, &context, 0, sizes.rows() * sizes.d_h).await?;
            Ok(Attended {
                output: HostTensor::new(sizes.context_shape(), context)?,
                weights: read_scores
                    .map(|w| HostTensor::new(sizes.weights_shape(), w))
                    .transpose()?,
            })
        }
    }
}

/// The CPU engine's tail, in f32: the softmax of each score row (`scores`,
/// `[B, Nq, Nk]`, replaced by the weights) with the oracle's rules (the
/// largest score subtracted, `-inf` and NaN scores weigh 0, a row with no
/// finite maximum gets zero weights and a zero context), then the context
/// `W_b H_b` by the backend's product. Returns (context, weights).
pub(crate) fn softmax_context_fast(
    sizes: &Sizes,
    mut scores: Vec<f32>,
    h: &HostTensor,
    threads: usize,
) -> (Vec<f32>, Vec<f32>) {
    use crate::cpu::fast::gemm::{matmul, Init, MatRef};
    let (nq, nk, dh) = (sizes.q_len, sizes.k_len, sizes.d_h);
    let empty = crate::cpu::fast::softmax_rows(&mut scores, nk);
    let mut context = vec![0.0f32; sizes.rows() * dh];
    for (b, out) in context.chunks_mut(nq * dh).enumerate() {
        matmul(
            MatRef::rows(&scores[b * nq * nk..(b + 1) * nq * nk], nq, nk),
            MatRef::rows(&h.data()[b * nk * dh..(b + 1) * nk * dh], nk, dh),
            Init::Zero,
            out,
            threads,
        );
    }
    for (row, _) in empty.iter().enumerate().filter(|(_, &e)| e) {
        context[row * dh..(row + 1) * dh].fill(0.0);
    }
    (context, scores)
}

/// The f32 results as an [`Attended`].
pub(crate) fn attended_from_fast(
    sizes: &Sizes,
    (context, weights): (Vec<f32>, Vec<f32>),
    want_weights: bool,
) -> Result<Attended> {
    Ok(Attended {
        output: HostTensor::new(sizes.context_shape(), context)?,
        weights: want_weights
            .then(|| HostTensor::new(sizes.weights_shape(), weights))
            .transpose()?,
    })
}

/// A CPU engine's results from f32 scores (masked keys `-inf`): the scores
/// themselves, or the context and weights by [`softmax_context_fast`].
pub(crate) fn finish_on_cpu(
    sizes: &Sizes,
    scores: Vec<f32>,
    h: &HostTensor,
    want: Want,
    threads: usize,
) -> Result<Attended> {
    match want {
        Want::Scores => Ok(Attended {
            output: HostTensor::new(sizes.weights_shape(), scores)?,
            weights: None,
        }),
        Want::Attend { weights } => attended_from_fast(
            sizes,
            softmax_context_fast(sizes, scores, h, threads),
            weights,
        ),
    }
}
