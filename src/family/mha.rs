//! The multi-head attention layer: Q, K and V projections (with optional
//! biases), optional RoPE, attention, and the output projection.
//!
//! ```text
//! Q_h = X_q W_Qhᵀ + b_Qh      K_h = X_kv W_Khᵀ + b_Kh      V_h = X_kv W_Vhᵀ + b_Vh
//! O   = Σ_h Attention(Q_h, K_{h/g}, V_{h/g}) W_Ohᵀ + b_O
//! ```
//!
//! Weights follow the `Linear` convention: `[out_features, in_features]`,
//! `y = x Wᵀ + b`. Head `h` owns rows `h·Dk .. (h+1)·Dk` of W_Q, and columns
//! `h·Dv .. (h+1)·Dv` of W_O. With fewer KV heads than query heads (GQA, or MQA
//! with one), query head `h` reads KV head `h / (heads / kv_heads)`.
//!
//! On a GPU engine every step runs on the device with no readback in between:
//! each projection is one GEMM per head writing straight into the head-major
//! `[B, H, N, D]` layout the attention kernels read (a bias is a rank-1 GEMM
//! update with a column of ones), the attention is the engine's fused path, and
//! the output projection accumulates one GEMM per head into `[B, N, d_model]`.
//! Weights are uploaded once per engine and kept.
//!
//! Self-attention passes one input; cross-attention passes the keys' and
//! values' sequence too (any length, its own feature size). A causal decoder
//! can run one step at a time with a [`KvCache`]: each step projects only the
//! new tokens, rotates them at their true positions, appends their keys and
//! values to the cache on the device, and gives the same result as running the
//! whole sequence again.

use crate::device::scope::Run;
use crate::kernels::gemm::GemmChoice;
use std::sync::{Arc, Mutex, PoisonError};

use super::position::{rope_fast, rope_in_place, Rope};
use super::{expect_dim, expect_rank, Attended};
use crate::cpu::fast::gemm::{matmul_packed, Init, MatRef, PackedMatrix};
use crate::cpu::Real;
use crate::device::buffer;
use crate::device::recorder::Recorder;
use crate::device_tensor::Tensor;
use crate::engine::{Engine, PreparedAttention};
use crate::error::{Error, Result};
use crate::kernels::cache_append::{CacheSlot, PreparedCacheAppend};
use crate::kernels::gemm;
use crate::kernels::gemm::GemmSpec;
use crate::kernels::position::PreparedPosition;
use crate::kernels::projection;
use crate::kernels::projection::{InputLayout, PackedWeights, Projection, Segment, WeightStorage};
use crate::options::{alibi_slopes, AttentionOptions, QkMatmulOutputMode};
use crate::problem::AttentionInputs;
use crate::rng::SplitMix64;
use crate::tensor::HostTensor;

/// The weights of a [`MultiHeadAttention`] layer, `[out, in]` each.
#[derive(Debug, Clone, PartialEq)]
pub struct MhaWeights {
    /// `[heads · Dk, d_model]`.
    pub w_q: HostTensor,
    /// `[heads · Dk]`, optional.
    pub b_q: Option<HostTensor>,
    /// `[kv_heads · Dk, d_kv]` (`d_kv` is the key/value input's feature size).
    pub w_k: HostTensor,
    /// `[kv_heads · Dk]`, optional.
    pub b_k: Option<HostTensor>,
    /// `[kv_heads · Dv, d_kv]`.
    pub w_v: HostTensor,
    /// `[kv_heads · Dv]`, optional.
    pub b_v: Option<HostTensor>,
    /// `[d_model, heads · Dv]`.
    pub w_o: HostTensor,
    /// `[d_model]`, optional.
    pub b_o: Option<HostTensor>,
}

impl MhaWeights {
    /// Random weights (uniform in ±1/√fan_in, as `Linear` initialises them) for
    /// `d_model` features, `heads` query heads of `head_dim`, `kv_heads` KV
    /// heads, keys/values of `d_kv` features, with biases.
    pub fn random(
        d_model: usize,
        d_kv: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        seed: u64,
    ) -> Result<MhaWeights> {
        let mut rng = SplitMix64::new(seed);
        let mut matrix = |rows: usize, cols: usize| {
            let bound = 1.0 / (cols as f32).sqrt();
            let data = (0..rows * cols)
                .map(|_| rng.uniform(-bound, bound))
                .collect();
            HostTensor::new([rows, cols], data)
        };
        let w_q = matrix(heads * head_dim, d_model)?;
        let b_q = matrix(1, heads * head_dim)?;
        let w_k = matrix(kv_heads * head_dim, d_kv)?;
        let b_k = matrix(1, kv_heads * head_dim)?;
        let w_v = matrix(kv_heads * head_dim, d_kv)?;
        let b_v = matrix(1, kv_heads * head_dim)?;
        let w_o = matrix(d_model, heads * head_dim)?;
        let b_o = matrix(1, d_model)?;
        let flat = |t: HostTensor| HostTensor::new([t.len()], t.into_data());
        Ok(MhaWeights {
            w_q,
            b_q: Some(flat(b_q)?),
            w_k,
            b_k: Some(flat(b_k)?),
            w_v,
            b_v: Some(flat(b_v)?),
            w_o,
            b_o: Some(flat(b_o)?),
        })
    }
}

/// The sizes of a layer, derived from its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MhaDims {
    /// The model's feature size (queries' input and the output).
    pub d_model: usize,
    /// The key/value input's feature size (`d_model` for self-attention).
    pub d_kv: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Dk.
    pub head_dim: usize,
    /// Dv.
    pub v_head_dim: usize,
}

/// Weights laid out on one engine's device at load: W_Q, W_K and W_V stacked
/// into one matrix where the inputs share a feature size (one product gives a
/// decoder step's Q, K and V), biases folded in beside it.
#[derive(Debug)]
pub(super) struct DeviceWeights {
    inputs: InputWeights,
    /// W_O and b_O.
    out: PackedWeights,
}

#[derive(Debug)]
enum InputWeights {
    /// `[W_Q; W_K; W_V]` (`d_kv == d_model`).
    Fused(PackedWeights),
    /// W_Q, and `[W_K; W_V]` over the key/value input's own features.
    Split { q: PackedWeights, kv: PackedWeights },
}

impl DeviceWeights {
    /// The matrix holding W_Q and W_Q's first row in it.
    fn q(&self) -> (&PackedWeights, usize) {
        match &self.inputs {
            InputWeights::Fused(w) | InputWeights::Split { q: w, .. } => (w, 0),
        }
    }

    /// The matrix holding `[W_K; W_V]` and W_K's first row in it.
    fn kv(&self, d: MhaDims) -> (&PackedWeights, usize) {
        match &self.inputs {
            InputWeights::Fused(w) => (w, d.heads * d.head_dim),
            InputWeights::Split { kv, .. } => (kv, 0),
        }
    }

    /// Bytes of weights one token step reads (each weight once).
    fn bytes(&self) -> u64 {
        let inputs = match &self.inputs {
            InputWeights::Fused(w) => w.bytes(),
            InputWeights::Split { q, kv } => q.bytes() + kv.bytes(),
        };
        inputs + self.out.bytes()
    }
}

/// What a layer prepares once for one shape of step on one device: its
/// buffers, products and rotations. A step with the same shape reuses it and
/// allocates nothing. Taken out of the layer for a step, so concurrent
/// steps never share one.
#[derive(Debug)]
pub(super) struct Workspace {
    key: WorkspaceKey,
    x_q: wgpu::Buffer,
    x_kv: Option<wgpu::Buffer>,
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    /// Q, K and V in one product (self-attention over a fused matrix), or
    /// Q's and K|V's.
    products: Vec<(Projection, Source)>,
    rope_q: Option<PreparedPosition>,
    rope_k: Option<PreparedPosition>,
    /// A self-attention step's keys (rotated) and values into the cache in
    /// one dispatch, where the cache has room and equal lengths.
    append: Option<PreparedCacheAppend>,
    output: wgpu::Buffer,
    out_product: Projection,
    staging: wgpu::Buffer,
    /// The attention of the step's shape (re-prepared when the cache grows).
    attention: Option<PreparedAttention>,
    /// The step's own recordings reuse their bind groups from here (the
    /// buffers above are the same every step).
    arena: Arc<crate::device::arena::Arena>,
    /// An empty encoder that stands in for the caller's while a recorded step
    /// holds it, kept for the next step (a new encoder costs more the more
    /// resources the device has made: about 10 µs a layer on lavapipe).
    stand_in: Option<wgpu::CommandEncoder>,
}

/// Which input a product reads and where its outputs go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Q, K and V from the query input.
    All,
    /// Q from the query input.
    Query,
    /// K and V from the key/value input.
    KeyValue,
}

/// Where a step's input rows come from.
#[derive(Debug, Clone, Copy)]
enum StepInput<'a> {
    /// Host values, written into the workspace.
    Host(&'a HostTensor),
    /// A device buffer of the engine's, copied into the workspace in the step's encoder.
    Device(&'a wgpu::Buffer),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WorkspaceKey {
    device: crate::engine::DeviceKey,
    batch: usize,
    n: usize,
    m: usize,
    cross: bool,
}

/// A multi-head attention layer. See the module docs for the computation.
#[derive(Debug)]
pub struct MultiHeadAttention {
    weights: MhaWeights,
    dims: MhaDims,
    rope: Option<Rope>,
    storage: WeightStorage,
    device: Mutex<Option<(crate::engine::DeviceKey, Arc<DeviceWeights>)>>,
    workspace: Mutex<Option<Workspace>>,
    /// The weights packed for the CPU backend's products, at their first use.
    host: HostWeights,
}

/// A weight `W` (`[out, in]`) packed as the `Wᵀ` of `x Wᵀ + b` for the CPU
/// backend's products, with its bias (zeros where the layer has none:
/// starting a sum from 0.0 is starting it from nothing).
#[derive(Debug)]
struct HostProduct {
    packed: PackedMatrix,
    bias: Vec<f32>,
}

impl HostProduct {
    /// `weights` stacked by rows (each `[out_i, in]`, the same `in`), with their biases.
    fn stack(weights: &[(&HostTensor, Option<&HostTensor>)]) -> HostProduct {
        let inputs = weights[0].0.shape()[1];
        let mut data = Vec::new();
        let mut bias = Vec::new();
        for (w, b) in weights {
            data.extend_from_slice(w.data());
            match b {
                Some(b) => bias.extend_from_slice(b.data()),
                None => bias.resize(bias.len() + w.shape()[0], 0.0),
            }
        }
        let rows = bias.len();
        HostProduct {
            packed: PackedMatrix::pack(MatRef::transposed(&data, rows, inputs)),
            bias,
        }
    }

    /// `x Wᵀ + b` for the `rows` rows of `x`, row-major `[rows, out]`.
    fn apply(&self, x: &[f32], rows: usize, threads: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; rows * self.packed.cols()];
        matmul_packed(
            MatRef::rows(x, rows, self.packed.rows()),
            &self.packed,
            Init::Bias(&self.bias),
            &mut out,
            threads,
        );
        out
    }
}

/// The CPU engine's packed weights: Q|K|V stacked for self-attention (one
/// product reads each weight once), Q and K|V apart for cross-attention, and
/// the output projection; each packed at its first use and kept.
#[derive(Debug, Default)]
struct HostWeights {
    qkv: std::sync::OnceLock<HostProduct>,
    q: std::sync::OnceLock<HostProduct>,
    kv: std::sync::OnceLock<HostProduct>,
    out: std::sync::OnceLock<HostProduct>,
}

/// The keys and values a causal decoder has seen: the engine's preallocated
/// [`crate::KvCache`] (keys already rotated when the layer uses RoPE), appended
/// in place at each step and read in place through `nonpad_kv_seqlen`.
pub use crate::kv_cache::KvCache;

/// The first `cols` columns of a `[.., cols']` tensor.
fn first_columns(t: &HostTensor, cols: usize) -> Result<HostTensor> {
    let width = t.shape()[t.shape().len() - 1];
    let data = t
        .data()
        .chunks(width)
        .flat_map(|row| &row[..cols])
        .copied()
        .collect();
    let mut shape = t.shape().to_vec();
    *shape.last_mut().expect("a rank-4 tensor") = cols;
    HostTensor::new(shape, data)
}

fn bias_len(name: &'static str, bias: &Option<HostTensor>, len: usize) -> Result<()> {
    if let Some(b) = bias {
        expect_rank(name, b, 1, "1 ([out_features])")?;
        expect_dim(name, b, 0, "out_features", len, "its weight")?;
    }
    Ok(())
}

impl MultiHeadAttention {
    /// A layer with `heads` query heads and `kv_heads` key/value heads; the
    /// head dims and feature sizes come from the weights' shapes, which must agree.
    pub fn new(weights: MhaWeights, heads: usize, kv_heads: usize) -> Result<Self> {
        for (name, w) in [
            ("W_Q", &weights.w_q),
            ("W_K", &weights.w_k),
            ("W_V", &weights.w_v),
            ("W_O", &weights.w_o),
        ] {
            expect_rank(name, w, 2, "2 ([out_features, in_features])")?;
        }
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::GqaHeads {
                q_heads: heads,
                kv_heads,
            });
        }
        let d_model = weights.w_q.shape()[1];
        let d_kv = weights.w_k.shape()[1];
        let head_rows = |name: &'static str, w: &HostTensor, count: usize| -> Result<usize> {
            if !w.shape()[0].is_multiple_of(count) {
                return Err(Error::ShapeMismatch {
                    tensor: name,
                    dim: "out_features",
                    got: w.shape()[0],
                    expected: w.shape()[0].div_ceil(count) * count,
                    expected_from: "the head count",
                    hint: "out_features must be a multiple of the heads",
                });
            }
            Ok(w.shape()[0] / count)
        };
        let head_dim = head_rows("W_Q", &weights.w_q, heads)?;
        let v_head_dim = head_rows("W_V", &weights.w_v, kv_heads)?;
        expect_dim(
            "W_K",
            &weights.w_k,
            0,
            "out_features",
            kv_heads * head_dim,
            "W_Q",
        )?;
        expect_dim("W_V", &weights.w_v, 1, "in_features", d_kv, "W_K")?;
        expect_dim("W_O", &weights.w_o, 0, "out_features", d_model, "W_Q")?;
        expect_dim(
            "W_O",
            &weights.w_o,
            1,
            "in_features",
            heads * v_head_dim,
            "W_V",
        )?;
        bias_len("b_Q", &weights.b_q, heads * head_dim)?;
        bias_len("b_K", &weights.b_k, kv_heads * head_dim)?;
        bias_len("b_V", &weights.b_v, kv_heads * v_head_dim)?;
        bias_len("b_O", &weights.b_o, d_model)?;
        Ok(MultiHeadAttention {
            weights,
            dims: MhaDims {
                d_model,
                d_kv,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
            },
            rope: None,
            storage: WeightStorage::F32,
            device: Mutex::new(None),
            workspace: Mutex::new(None),
            host: HostWeights::default(),
        })
    }

    /// Applies `rope` to the projected queries and keys (head dim must be even).
    pub fn with_rope(mut self, rope: Rope) -> Result<Self> {
        rope.check(self.dims.head_dim)?;
        self.rope = Some(rope);
        Ok(self)
    }

    /// Keeps the weights on the device as `storage`. With
    /// [`WeightStorage::F16`] the weights are rounded to f16 here, once, and
    /// every path (GPU, CPU, [`MultiHeadAttention::oracle`]) computes with the
    /// rounded values in f32: a decoder step streams half the bytes.
    pub fn with_weight_storage(mut self, storage: WeightStorage) -> Self {
        if storage == WeightStorage::F16 {
            let w = &mut self.weights;
            // Biases stay f32 on the device.
            for t in [&mut w.w_q, &mut w.w_k, &mut w.w_v, &mut w.w_o] {
                for v in t.data_mut() {
                    *v = half::f16::from_f32(*v).to_f32();
                }
            }
        }
        self.storage = storage;
        *self
            .device
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = None;
        *self
            .workspace
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self
    }

    /// How the weights are kept on the device.
    pub fn weight_storage(&self) -> WeightStorage {
        self.storage
    }

    /// Bytes of weights one token step reads on this engine's device
    /// (uploading them first if needed); `None` on a CPU engine.
    pub fn device_weight_bytes(&self, engine: &Engine) -> Result<Option<u64>> {
        match engine.gpu() {
            Some(ctx) => Ok(Some(self.device_weights(engine, &Run::new(ctx))?.bytes())),
            None => Ok(None),
        }
    }

    /// The rotary embedding the layer applies to Q and K, if any.
    pub(crate) fn rope(&self) -> Option<&Rope> {
        self.rope.as_ref()
    }

    /// The layer's sizes.
    pub fn dims(&self) -> MhaDims {
        self.dims
    }

    /// The weights.
    pub fn weights(&self) -> &MhaWeights {
        &self.weights
    }

    /// Self- or cross-attention over whole sequences: `query` `[B, N, d_model]`,
    /// `key_value` `[B, M, d_kv]` (`None`: self-attention on `query`). The
    /// options apply to the attention step (causal, scale, softcap, windows,
    /// temperature, ALiBi, path); with `want_weights` the output carries the
    /// probabilities `[B, heads, N, M]`.
    pub async fn forward(
        &self,
        engine: &Engine,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        options: &AttentionOptions,
        want_weights: bool,
    ) -> Result<Attended> {
        self.run(engine, query, key_value, None, options, want_weights)
            .await
    }

    /// One decoder step of causal self-attention: `x` `[B, n, d_model]` holds
    /// the next `n` tokens; their keys and values are appended to `cache`. The
    /// options' `is_causal` is forced on (positions continue from the cache).
    pub async fn forward_cached(
        &self,
        engine: &Engine,
        x: &HostTensor,
        cache: &mut KvCache,
        options: &AttentionOptions,
        want_weights: bool,
    ) -> Result<Attended> {
        let options = AttentionOptions {
            is_causal: true,
            ..options.clone()
        };
        self.run(engine, x, None, Some(cache), &options, want_weights)
            .await
    }

    /// [`MultiHeadAttention::forward`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_blocking(
        &self,
        engine: &Engine,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        options: &AttentionOptions,
        want_weights: bool,
    ) -> Result<Attended> {
        pollster::block_on(self.forward(engine, query, key_value, options, want_weights))
    }

    /// [`MultiHeadAttention::forward_cached`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_cached_blocking(
        &self,
        engine: &Engine,
        x: &HostTensor,
        cache: &mut KvCache,
        options: &AttentionOptions,
        want_weights: bool,
    ) -> Result<Attended> {
        pollster::block_on(self.forward_cached(engine, x, cache, options, want_weights))
    }

    /// One decoder step whose input and output stay on the device, for a
    /// stack of layers that reads back only its last: `x` `[B, n, d_model]`
    /// is a tensor of `engine`'s, as the previous layer's step returned it
    /// (or uploaded). On a GPU engine with room in `cache`, for steps the
    /// skinny products take (up to 16 rows, or f16 weights), the step is one
    /// submission with no readback: `x` is copied into the layer's workspace
    /// in the step's own encoder, and the output is the workspace's output
    /// buffer, **valid until this layer's next step** (feed it to the next
    /// layer or copy it first). Elsewhere the step runs as
    /// [`MultiHeadAttention::forward_cached`] does and its output is uploaded.
    pub async fn forward_cached_on_device(
        &self,
        engine: &Engine,
        x: &Tensor,
        cache: &mut KvCache,
        options: &AttentionOptions,
    ) -> Result<Tensor> {
        self.step_on_device(engine, x, cache, options, None).await
    }

    /// [`MultiHeadAttention::forward_cached_on_device`] recorded into the
    /// caller's `encoder`, with nothing submitted: a stack records every
    /// layer's step into one encoder and submits once a token. The output
    /// holds its values once `encoder` has run. Record one step of a layer
    /// per submission (a step's positions are written by the queue, ahead
    /// of the submission, where a second step would overwrite them). Steps
    /// the device path does not take (see there) are a `Conflict` error,
    /// with nothing recorded and the cache as it was.
    pub async fn record_on_device(
        &self,
        engine: &Engine,
        encoder: &mut wgpu::CommandEncoder,
        x: &Tensor,
        cache: &mut KvCache,
        options: &AttentionOptions,
    ) -> Result<Tensor> {
        self.step_on_device(engine, x, cache, options, Some(encoder))
            .await
    }

    /// The device step of [`MultiHeadAttention::forward_cached_on_device`],
    /// submitted by itself or recorded into `encoder`.
    async fn step_on_device(
        &self,
        engine: &Engine,
        x: &Tensor,
        cache: &mut KvCache,
        options: &AttentionOptions,
        encoder: Option<&mut wgpu::CommandEncoder>,
    ) -> Result<Tensor> {
        options.validate()?;
        engine.recover().await?;
        let d = self.dims;
        let shape = x.shape().to_vec();
        engine.own("x", x)?;
        let [batch, n, features] = shape[..] else {
            return Err(Error::Rank {
                tensor: "x",
                expected: "3 ([batch, length, features])",
                got: shape,
            });
        };
        if features != d.d_model {
            return Err(Error::ShapeMismatch {
                tensor: "x",
                dim: "features",
                got: features,
                expected: d.d_model,
                expected_from: "the layer's weights",
                hint: "pass the previous layer's output [batch, length, d_model]",
            });
        }
        let options = AttentionOptions {
            is_causal: true,
            ..options.clone()
        };
        let on_device = engine.gpu().zip(x.gpu_buffer()).filter(|_| {
            x.dtype() == crate::DType::F32
                && d.d_kv == d.d_model
                && batch * n > 0
                && (self.storage == WeightStorage::F16 || batch * n <= projection::MAX_ROWS)
                && cache.has_room_in_place(n)
                && cache.lengths().iter().all(|&l| l == cache.len())
                && cache.tensors().is_none_or(|(k, _)| k.shape()[0] == batch)
        });
        let Some((device, buffer)) = on_device else {
            if encoder.is_some() {
                return Err(Error::Conflict(
                    "this step cannot be recorded: it needs a GPU engine, an f32 input, \
                     self-attention, up to 16 rows (or f16 weights) and a cache with room \
                     in place whose sequences are equally long",
                ));
            }
            let host = engine.download(x).await?;
            let out = self
                .forward_cached(engine, &host, cache, &options, false)
                .await?;
            return engine.upload(&out.output);
        };
        let run = Run::new(device);
        let ctx = &run;
        let weights = self.device_weights(engine, ctx)?;
        let key = WorkspaceKey {
            device: engine.device_key(),
            batch,
            n,
            m: n,
            cross: false,
        };
        let mut ws = self.take_workspace(ctx, &weights, key)?;
        let attention_options = AttentionOptions {
            qk_matmul_output_mode: None,
            return_present: false,
            return_lse: false,
            ..options
        };
        // Recording: the caller's encoder goes into the context's slot for
        // the step's recorders, and comes back whatever happens.
        let mut encoder = encoder;
        let slot = encoder.as_deref_mut().map(|encoder| {
            let stand_in = ws.stand_in.take().unwrap_or_else(|| {
                ctx.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
            });
            Arc::new(Mutex::new(Some(std::mem::replace(encoder, stand_in))))
        });
        let step_ctx = match &slot {
            Some(slot) => ctx.clone().with_capture(slot.clone()),
            None => ctx.clone(),
        };
        let step = self
            .step_in_one_submission(
                engine,
                &step_ctx,
                &weights,
                &mut ws,
                StepInput::Device(buffer),
                cache,
                &attention_options,
                false,
            )
            .await;
        let output = ws.output.clone();
        if let (Some(slot), Some(encoder)) = (slot, encoder) {
            let back = slot.lock().unwrap_or_else(PoisonError::into_inner).take();
            let Some(back) = back else {
                self.keep_workspace(ws);
                return Err(Error::Conflict(
                    "the encoder was not given back by the recorded step",
                ));
            };
            ws.stand_in = Some(std::mem::replace(encoder, back));
        }
        self.keep_workspace(ws);
        step?;
        Ok(engine.wrap_gpu(vec![batch, n, d.d_model], output))
    }

    /// [`MultiHeadAttention::forward_cached_on_device`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_cached_on_device_blocking(
        &self,
        engine: &Engine,
        x: &Tensor,
        cache: &mut KvCache,
        options: &AttentionOptions,
    ) -> Result<Tensor> {
        pollster::block_on(self.forward_cached_on_device(engine, x, cache, options))
    }

    /// [`MultiHeadAttention::record_on_device`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn record_on_device_blocking(
        &self,
        engine: &Engine,
        encoder: &mut wgpu::CommandEncoder,
        x: &Tensor,
        cache: &mut KvCache,
        options: &AttentionOptions,
    ) -> Result<Tensor> {
        pollster::block_on(self.record_on_device(engine, encoder, x, cache, options))
    }

    /// Checks an input's rank, batch and feature size; returns (batch, length).
    pub(super) fn check_input(
        &self,
        name: &'static str,
        x: &HostTensor,
        features: usize,
        batch: Option<usize>,
    ) -> Result<(usize, usize)> {
        expect_rank(name, x, 3, "3 ([batch, length, features])")?;
        expect_dim(name, x, 2, "features", features, "the layer's weights")?;
        if let Some(b) = batch {
            expect_dim(name, x, 0, "batch", b, "the query")?;
        }
        Ok((x.shape()[0], x.shape()[1]))
    }

    async fn run(
        &self,
        engine: &Engine,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        cache: Option<&mut KvCache>,
        options: &AttentionOptions,
        want_weights: bool,
    ) -> Result<Attended> {
        options.validate()?;
        // After a device loss, run on a fresh device (a KV cache made on the
        // lost one reports that it is gone).
        engine.recover().await?;
        let d = self.dims;
        if key_value.is_none() && d.d_kv != d.d_model {
            return Err(Error::Conflict(
                "self-attention needs W_K and W_V with d_model input features; \
                 pass key_value for cross-attention",
            ));
        }
        let (batch, n) = self.check_input("query", query, d.d_model, None)?;
        let kv_input = key_value.unwrap_or(query);
        self.check_input("key_value", kv_input, d.d_kv, Some(batch))?;
        let past_len = cache.as_ref().map_or(0, |c| c.len());
        if cache
            .as_ref()
            .is_some_and(|c| c.lengths().iter().any(|&l| l != past_len))
        {
            return Err(Error::Conflict(
                "a decoder's KV cache must hold sequences of one length (rotary \
                 positions continue from it); this one was appended ragged",
            ));
        }
        if let Some((pk, _)) = cache.as_ref().and_then(|c| c.tensors()) {
            if pk.shape()[0] != batch {
                return Err(Error::ShapeMismatch {
                    tensor: "query",
                    dim: "batch",
                    got: batch,
                    expected: pk.shape()[0],
                    expected_from: "the KV cache",
                    hint: "use one cache per batch of sequences",
                });
            }
        }
        let m = kv_input.shape()[1];
        let attention_options = AttentionOptions {
            qk_matmul_output_mode: want_weights.then_some(QkMatmulOutputMode::Probabilities),
            return_present: false,
            return_lse: false,
            ..options.clone()
        };
        let mut cache = cache;
        // A step of few rows (or f16 weights) runs the prepared skinny
        // products; its workspace is taken for the step and put back after.
        let mut workspace = None;
        let (q, k, v) = match engine.gpu() {
            Some(device) => {
                let run = Run::new(device);
                let ctx = &run;
                let weights = self.device_weights(engine, ctx)?;
                // (Inputs with no rows have nothing to project: the plain path.)
                let rows = batch * n.min(m);
                if rows > 0
                    && (self.storage == WeightStorage::F16
                        || batch * n.max(m) <= projection::MAX_ROWS)
                {
                    let key = WorkspaceKey {
                        device: engine.device_key(),
                        batch,
                        n,
                        m,
                        cross: key_value.is_some(),
                    };
                    let mut ws = self.take_workspace(ctx, &weights, key)?;
                    // A decoder step whose cache has room: one submission.
                    if let Some(cache) = cache.as_deref_mut() {
                        if !want_weights && key_value.is_none() && cache.has_room_in_place(n) {
                            let output = self
                                .step_in_one_submission(
                                    engine,
                                    ctx,
                                    &weights,
                                    &mut ws,
                                    StepInput::Host(query),
                                    cache,
                                    &attention_options,
                                    true,
                                )
                                .await?
                                .ok_or(Error::Readback("no output read".into()))?;
                            self.keep_workspace(ws);
                            return Ok(Attended {
                                output,
                                weights: None,
                            });
                        }
                    }
                    let qkv = self
                        .project_prepared(engine, ctx, &weights, &ws, query, key_value, past_len)
                        .await?;
                    workspace = Some(ws);
                    qkv
                } else {
                    self.project_gpu(engine, ctx, &weights, query, key_value, past_len)
                        .await?
                }
            }
            None => self.project_host(engine, query, key_value, past_len)?,
        };
        // With a cache the new keys and values are appended in place and the
        // queries attend to the cache's first `len` keys (its lengths as
        // nonpad_kv_seqlen: causal positions continue from the cached tokens).
        let result = match cache {
            Some(cache) => {
                let before = cache.lengths().to_vec();
                let step = async {
                    cache.append(engine, &k, &v).await?;
                    let lengths = cache.nonpad_lengths();
                    let inputs = cache.attention_inputs(&q, &lengths)?;
                    let out =
                        attend(engine, workspace.as_mut(), &inputs, &attention_options).await?;
                    self.finish(
                        engine,
                        &out,
                        Some(cache.len()),
                        batch,
                        n,
                        workspace.as_ref(),
                    )
                    .await
                };
                let result = step.await;
                if result.is_err() {
                    // A failed step leaves the cache as it was.
                    cache.forget_since(&before);
                }
                result
            }
            None => {
                let inputs = AttentionInputs::new(&q, &k, &v);
                let out = attend(engine, workspace.as_mut(), &inputs, &attention_options).await?;
                self.finish(engine, &out, None, batch, n, workspace.as_ref())
                    .await
            }
        };
        if let (Ok(_), Some(ws)) = (&result, workspace) {
            self.keep_workspace(ws);
        }
        result
    }

    /// The output projection of an attention's Y, and its weights (cut to
    /// the `keys_seen` cached keys' columns when read from a cache).
    pub(super) async fn finish(
        &self,
        engine: &Engine,
        out: &crate::AttentionOutputs<Tensor>,
        keys_seen: Option<usize>,
        batch: usize,
        n: usize,
        workspace: Option<&Workspace>,
    ) -> Result<Attended> {
        let d = self.dims;
        let output = match (engine.gpu(), out.y.gpu_buffer()) {
            (Some(device), Some(y)) => {
                let run = Run::new(device);
                let ctx = &run;
                let weights = self.device_weights(engine, ctx)?;
                match workspace {
                    Some(ws) => {
                        let rec = Recorder::new(ctx, "multi-head output projection");
                        self.output_prepared(rec, &weights, ws, y).await?
                    }
                    None => {
                        self.output_gpu(ctx, engine.gemm_choice(), &weights, y, batch, n)
                            .await?
                    }
                }
            }
            _ => {
                let y = engine.download(&out.y).await?;
                let threads = engine.cpu_backend().threads();
                HostTensor::new(
                    [batch, n, d.d_model],
                    out_projection_fast(y.data(), self, batch, n, threads),
                )?
            }
        };
        let weights = match &out.qk_matmul_output {
            Some(t) => {
                let all = engine.download(t).await?;
                // A cache's weights cover its capacity: keep the cached keys' columns.
                Some(match keys_seen {
                    Some(len) if len < all.shape()[3] => first_columns(&all, len)?,
                    _ => all,
                })
            }
            None => None,
        };
        Ok(Attended { output, weights })
    }

    pub(super) fn device_weights(&self, engine: &Engine, ctx: &Run) -> Result<Arc<DeviceWeights>> {
        let mut slot = self.device.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((id, weights)) = slot.as_ref() {
            if *id == engine.device_key() {
                return Ok(weights.clone());
            }
        }
        let (w, d, storage) = (&self.weights, self.dims, self.storage);
        let (q, k, v) = (
            (&w.w_q, w.b_q.as_ref()),
            (&w.w_k, w.b_k.as_ref()),
            (&w.w_v, w.b_v.as_ref()),
        );
        let inputs = if d.d_kv == d.d_model {
            InputWeights::Fused(PackedWeights::upload(ctx, "W_QKV", &[q, k, v], storage)?)
        } else {
            InputWeights::Split {
                q: PackedWeights::upload(ctx, "W_Q", &[q], storage)?,
                kv: PackedWeights::upload(ctx, "W_KV", &[k, v], storage)?,
            }
        };
        let out = PackedWeights::upload(ctx, "W_O", &[(&w.w_o, w.b_o.as_ref())], storage)?;
        let uploaded = Arc::new(DeviceWeights { inputs, out });
        *slot = Some((engine.device_key(), uploaded.clone()));
        Ok(uploaded)
    }

    /// The workspace for `key`: the one kept from an earlier step of that
    /// shape, or a new one.
    fn take_workspace(
        &self,
        ctx: &Run,
        weights: &DeviceWeights,
        key: WorkspaceKey,
    ) -> Result<Workspace> {
        let kept = self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match kept {
            Some(ws) if ws.key == key => Ok(ws),
            _ => self.prepare_workspace(ctx, weights, key),
        }
    }

    /// Puts a step's workspace back for the next step of its shape.
    fn keep_workspace(&self, ws: Workspace) {
        *self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(ws);
    }

    fn prepare_workspace(
        &self,
        ctx: &Run,
        weights: &DeviceWeights,
        key: WorkspaceKey,
    ) -> Result<Workspace> {
        let d = self.dims;
        let WorkspaceKey { batch, n, m, .. } = key;
        let in_kv = if key.cross { d.d_kv } else { d.d_model };
        let q_end = d.heads * d.head_dim;
        let (kv_w, kv_first) = weights.kv(d);
        let k_end = kv_first + d.kv_heads * d.head_dim;
        let v_end = k_end + d.kv_heads * d.v_head_dim;
        let q_seg = Segment::heads(q_end, d.heads, n, d.head_dim);
        let k_seg = Segment::heads(k_end, d.kv_heads, m, d.head_dim);
        let v_seg = Segment::heads(v_end, d.kv_heads, m, d.v_head_dim);
        let products = match (&weights.inputs, key.cross) {
            (InputWeights::Fused(w), false) => vec![(
                Projection::prepare(
                    ctx,
                    w,
                    (0, v_end),
                    batch * n,
                    InputLayout::rows(n, d.d_model),
                    &[q_seg, k_seg, v_seg],
                )?,
                Source::All,
            )],
            _ => {
                let (q_w, _) = weights.q();
                vec![
                    (
                        Projection::prepare(
                            ctx,
                            q_w,
                            (0, q_end),
                            batch * n,
                            InputLayout::rows(n, d.d_model),
                            &[q_seg],
                        )?,
                        Source::Query,
                    ),
                    (
                        Projection::prepare(
                            ctx,
                            kv_w,
                            (kv_first, v_end - kv_first),
                            batch * m,
                            InputLayout::rows(m, in_kv),
                            &[k_seg, v_seg],
                        )?,
                        Source::KeyValue,
                    ),
                ]
            }
        };
        let (rope_q, rope_k) = match &self.rope {
            Some(rope) => (
                Some(rope.prepare(ctx, batch * d.heads * n, n, d.head_dim)?),
                Some(rope.prepare(ctx, batch * d.kv_heads * m, m, d.head_dim)?),
            ),
            None => (None, None),
        };
        let append = if !key.cross && d.head_dim == d.v_head_dim {
            let rows = batch * d.kv_heads * m;
            Some(match &self.rope {
                Some(rope) => rope.prepare_append(ctx, rows, m, d.head_dim)?,
                None => PreparedCacheAppend::prepare(ctx, None, rows, d.head_dim, m)?,
            })
        } else {
            None
        };
        let out_len = batch * n * d.d_model;
        let out_product = Projection::prepare(
            ctx,
            &weights.out,
            (0, d.d_model),
            batch * n,
            InputLayout::heads(d.heads, n, d.v_head_dim),
            &[Segment::rows(d.d_model, n, d.d_model)],
        )?;
        Ok(Workspace {
            key,
            x_q: buffer::storage(ctx, "query input", batch * n * d.d_model)?,
            x_kv: if key.cross {
                Some(buffer::storage(ctx, "key/value input", batch * m * d.d_kv)?)
            } else {
                None
            },
            q: buffer::storage(ctx, "Q", batch * d.heads * n * d.head_dim)?,
            k: buffer::storage(ctx, "K", batch * d.kv_heads * m * d.head_dim)?,
            v: buffer::storage(ctx, "V", batch * d.kv_heads * m * d.v_head_dim)?,
            products,
            rope_q,
            rope_k,
            append,
            output: buffer::storage(ctx, "output", out_len)?,
            out_product,
            staging: buffer::staging(ctx, "output readback", out_len)?,
            attention: None,
            arena: Arc::default(),
            stand_in: None,
        })
    }

    /// A decoder step of self-attention recorded whole and submitted once:
    /// the fused Q|K|V product, RoPE, the append into the cache (in place,
    /// which the caller checked has room), the prepared attention over the
    /// cache, the output product and (with `read_back`) its copy to the
    /// staging buffer and one readback; without it the output stays in the
    /// workspace's `output` (`None` is returned). Allocates nothing after the
    /// first step of its shape.
    /// A failed step leaves the cache as it was.
    #[allow(clippy::too_many_arguments)]
    async fn step_in_one_submission(
        &self,
        engine: &Engine,
        ctx: &Run,
        weights: &DeviceWeights,
        ws: &mut Workspace,
        x: StepInput<'_>,
        cache: &mut KvCache,
        options: &AttentionOptions,
        read_back: bool,
    ) -> Result<Option<HostTensor>> {
        let before = cache.lengths().to_vec();
        let step = self
            .record_step(engine, ctx, weights, ws, x, cache, options, read_back)
            .await;
        if step.is_err() {
            cache.forget_since(&before);
        }
        step
    }

    /// [`MultiHeadAttention::step_in_one_submission`]'s recording and submission.
    #[allow(clippy::too_many_arguments)]
    async fn record_step(
        &self,
        engine: &Engine,
        ctx: &Run,
        weights: &DeviceWeights,
        ws: &mut Workspace,
        x: StepInput<'_>,
        cache: &mut KvCache,
        options: &AttentionOptions,
        read_back: bool,
    ) -> Result<Option<HostTensor>> {
        let d = self.dims;
        let WorkspaceKey { batch, n, .. } = ws.key;
        let past_len = cache.len();
        let ws_ref = &*ws;
        ws.arena.begin_run();
        let ctx = &ctx.clone().with_arena(ws.arena.clone());
        let mut rec = ctx
            .scoped("decoder step", || {
                let mut rec = Recorder::new(ctx, "decoder step");
                // The keys' rotation and the append in one dispatch where the
                // cache's sequences are equally long; else rotation, then copies.
                let slot = ws_ref.append.as_ref().zip(cache.uniform_slot(n));
                self.record_projections(
                    &mut rec,
                    ws_ref,
                    weights,
                    x,
                    None,
                    past_len,
                    slot.is_none(),
                )?;
                match slot {
                    Some((append, (key, value, capacity, len))) => {
                        let position = match &self.rope {
                            Some(rope) => rope.position(n, past_len)?,
                            None => 0,
                        };
                        let slot = CacheSlot {
                            key: &key,
                            value: &value,
                            capacity,
                            len,
                        };
                        append.record(&mut rec, &ws_ref.k, &ws_ref.v, slot, position)?;
                        cache.note_appended(n);
                    }
                    None if cache.record_append(&mut rec, &ws_ref.k, &ws_ref.v, n) => {}
                    None => return Err(Error::Conflict("the KV cache had no room in place")),
                }
                Ok(rec)
            })
            .await?;
        let q = engine.wrap_gpu(vec![batch, d.heads, n, d.head_dim], ws.q.clone());
        let lengths = cache.nonpad_lengths();
        let inputs = cache.attention_inputs(&q, &lengths)?;
        let dims = crate::problem::validate(&inputs, options)?;
        let prepared = match ws.attention.take() {
            Some(p) if p.dims() == &dims && p.options() == options => p,
            _ => engine.prepare(&dims, options)?,
        };
        let out = prepared.record(engine, rec.encoder(), &inputs).await;
        ws.attention = Some(prepared);
        let out = out?;
        let y = out
            .y
            .gpu_buffer()
            .ok_or(Error::ForeignTensor { tensor: "Y" })?;
        if read_back {
            return self.output_prepared(rec, weights, ws, y).await.map(Some);
        }
        ctx.scoped("multi-head output projection", || {
            ws.out_product
                .record(&mut rec, y, &weights.out, &[&ws.output])?;
            rec.submit();
            Ok(())
        })
        .await?;
        Ok(None)
    }

    /// Writes the inputs into the workspace and records its products and
    /// rotations: queries and new keys sit after the `past_len` cached
    /// tokens; a cross attention's keys start at position 0 of their own
    /// sequence. Without `rotate_keys` the keys are left for the cache
    /// append to rotate.
    #[allow(clippy::too_many_arguments)]
    fn record_projections(
        &self,
        rec: &mut Recorder<'_>,
        ws: &Workspace,
        weights: &DeviceWeights,
        query: StepInput<'_>,
        key_value: Option<&HostTensor>,
        past_len: usize,
        rotate_keys: bool,
    ) -> Result<()> {
        let ctx = rec.ctx();
        let WorkspaceKey { batch, n, m, .. } = ws.key;
        match query {
            StepInput::Host(x) => buffer::write(ctx, &ws.x_q, x.data()),
            StepInput::Device(x) => {
                rec.copy(x, 0, &ws.x_q, 0, batch * n * self.dims.d_model);
            }
        }
        if let (Some(x_kv), Some(kv)) = (&ws.x_kv, key_value) {
            buffer::write(ctx, x_kv, kv.data());
        }
        for (product, source) in &ws.products {
            match source {
                Source::All => {
                    product.record(rec, &ws.x_q, weights.q().0, &[&ws.q, &ws.k, &ws.v])?
                }
                Source::Query => product.record(rec, &ws.x_q, weights.q().0, &[&ws.q])?,
                Source::KeyValue => {
                    let x = ws.x_kv.as_ref().unwrap_or(&ws.x_q);
                    product.record(rec, x, weights.kv(self.dims).0, &[&ws.k, &ws.v])?
                }
            }
        }
        if let (Some(rope), Some(rq), Some(rk)) = (&self.rope, &ws.rope_q, &ws.rope_k) {
            rope.record_prepared(rec, rq, &ws.q, n, past_len)?;
            if rotate_keys {
                let key_offset = if key_value.is_some() { 0 } else { past_len };
                rope.record_prepared(rec, rk, &ws.k, m, key_offset)?;
            }
        }
        Ok(())
    }

    /// Projects and (with RoPE) rotates Q, K, V by the workspace's prepared
    /// products: one submission, no allocation.
    #[allow(clippy::too_many_arguments)]
    async fn project_prepared(
        &self,
        engine: &Engine,
        ctx: &Run,
        weights: &DeviceWeights,
        ws: &Workspace,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        past_len: usize,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let d = self.dims;
        let WorkspaceKey { batch, n, m, .. } = ws.key;
        ctx.scoped("multi-head projections", || {
            let mut rec = Recorder::new(ctx, "multi-head projections");
            let query = StepInput::Host(query);
            self.record_projections(&mut rec, ws, weights, query, key_value, past_len, true)?;
            rec.submit();
            Ok(())
        })
        .await?;
        Ok((
            engine.wrap_gpu(vec![batch, d.heads, n, d.head_dim], ws.q.clone()),
            engine.wrap_gpu(vec![batch, d.kv_heads, m, d.head_dim], ws.k.clone()),
            engine.wrap_gpu(vec![batch, d.kv_heads, m, d.v_head_dim], ws.v.clone()),
        ))
    }

    /// Records the output projection by the workspace's prepared product and
    /// its copy to the staging buffer after what `rec` holds, submits, and
    /// reads the output back.
    async fn output_prepared(
        &self,
        mut rec: Recorder<'_>,
        weights: &DeviceWeights,
        ws: &Workspace,
        y: &wgpu::Buffer,
    ) -> Result<HostTensor> {
        let ctx = rec.ctx();
        let WorkspaceKey { batch, n, .. } = ws.key;
        let len = batch * n * self.dims.d_model;
        ctx.scoped("multi-head output projection", || {
            ws.out_product
                .record(&mut rec, y, &weights.out, &[&ws.output])?;
            rec.copy(&ws.output, 0, &ws.staging, 0, len);
            rec.submit();
            Ok(())
        })
        .await?;
        let data = buffer::map_and_read(ctx, &ws.staging, ws.staging.size()).await?;
        HostTensor::new([batch, n, self.dims.d_model], data)
    }

    /// Projects and (with RoPE) rotates Q, K, V on the device by tiled GEMMs
    /// (many rows, f32 weights): one GEMM per head into the head-major layout.
    pub(super) async fn project_gpu(
        &self,
        engine: &Engine,
        ctx: &Run,
        weights: &DeviceWeights,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        past_len: usize,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let d = self.dims;
        let (batch, n) = (query.shape()[0], query.shape()[1]);
        let m = key_value.map_or(n, |kv| kv.shape()[1]);
        let (q_w, q_first) = weights.q();
        let (kv_w, k_first) = weights.kv(d);
        let v_first = k_first + d.kv_heads * d.head_dim;
        let gemm = engine.gemm_choice();
        let (q, k, v) = ctx
            .scoped("multi-head projections", || {
                let x_q = buffer::upload(ctx, "query input", query.data())?;
                let x_kv = key_value
                    .map(|kv| buffer::upload(ctx, "key/value input", kv.data()))
                    .transpose()?;
                let ones = buffer::upload(ctx, "ones", &vec![1.0f32; n.max(m)])?;
                let q = buffer::storage(ctx, "Q", batch * d.heads * n * d.head_dim)?;
                let k = buffer::storage(ctx, "K", batch * d.kv_heads * m * d.head_dim)?;
                let v = buffer::storage(ctx, "V", batch * d.kv_heads * m * d.v_head_dim)?;
                let mut rec = Recorder::new(ctx, "multi-head projections");
                let kv_src = x_kv.as_ref().unwrap_or(&x_q);
                let projections = [
                    (&x_q, n, (q_w, q_first), d.heads, d.head_dim, &q),
                    (kv_src, m, (kv_w, k_first), d.kv_heads, d.head_dim, &k),
                    (kv_src, m, (kv_w, v_first), d.kv_heads, d.v_head_dim, &v),
                ];
                for (x, len, part, heads, hd, out) in projections {
                    record_projection(&mut rec, gemm, x, &ones, batch, len, part, heads, hd, out)?;
                }
                if let Some(rope) = &self.rope {
                    // Queries and new keys sit after the cached tokens; a cross
                    // attention's keys start at position 0 of their own sequence.
                    rope.record(&mut rec, &q, batch * d.heads * n, n, d.head_dim, past_len)?;
                    let key_offset = if key_value.is_some() { 0 } else { past_len };
                    rope.record(
                        &mut rec,
                        &k,
                        batch * d.kv_heads * m,
                        m,
                        d.head_dim,
                        key_offset,
                    )?;
                }
                rec.submit();
                Ok((q, k, v))
            })
            .await?;
        Ok((
            engine.wrap_gpu(vec![batch, d.heads, n, d.head_dim], q),
            engine.wrap_gpu(vec![batch, d.kv_heads, m, d.head_dim], k),
            engine.wrap_gpu(vec![batch, d.kv_heads, m, d.v_head_dim], v),
        ))
    }

    /// Projects (and rotates) on the host in f32 by the fast CPU backend's
    /// product (the CPU engine's path).
    pub(super) fn project_host(
        &self,
        engine: &Engine,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        past_len: usize,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let d = self.dims;
        let w = &self.weights;
        let h = &self.host;
        let threads = engine.cpu_backend().threads();
        let (batch, n) = (query.shape()[0], query.shape()[1]);
        let m = key_value.map_or(n, |kv| kv.shape()[1]);
        let (q_width, k_width) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
        let v_width = d.kv_heads * d.v_head_dim;
        let (mut q, mut k, v) = match key_value {
            // Self-attention: one product for Q, K and V.
            None => {
                let qkv = h.qkv.get_or_init(|| {
                    HostProduct::stack(&[
                        (&w.w_q, w.b_q.as_ref()),
                        (&w.w_k, w.b_k.as_ref()),
                        (&w.w_v, w.b_v.as_ref()),
                    ])
                });
                let flat = qkv.apply(query.data(), batch * n, threads);
                let rows = (batch, n, q_width + k_width + v_width);
                (
                    heads_of(&flat, rows, 0, d.heads, d.head_dim),
                    heads_of(&flat, rows, q_width, d.kv_heads, d.head_dim),
                    heads_of(&flat, rows, q_width + k_width, d.kv_heads, d.v_head_dim),
                )
            }
            Some(kv) => {
                let qp =
                    h.q.get_or_init(|| HostProduct::stack(&[(&w.w_q, w.b_q.as_ref())]));
                let kvp = h.kv.get_or_init(|| {
                    HostProduct::stack(&[(&w.w_k, w.b_k.as_ref()), (&w.w_v, w.b_v.as_ref())])
                });
                let fq = qp.apply(query.data(), batch * n, threads);
                let fkv = kvp.apply(kv.data(), batch * m, threads);
                let rows = (batch, m, k_width + v_width);
                (
                    heads_of(&fq, (batch, n, q_width), 0, d.heads, d.head_dim),
                    heads_of(&fkv, rows, 0, d.kv_heads, d.head_dim),
                    heads_of(&fkv, rows, k_width, d.kv_heads, d.v_head_dim),
                )
            }
        };
        if let Some(rope) = &self.rope {
            // Queries and new keys sit after the cached tokens; a cross
            // attention's keys start at position 0 of their own sequence.
            rope_fast(&mut q, n, d.head_dim, rope, past_len);
            let key_offset = if key_value.is_some() { 0 } else { past_len };
            rope_fast(&mut k, m, d.head_dim, rope, key_offset);
        }
        let wrap = |shape: [usize; 4], values: Vec<f32>| {
            HostTensor::new(shape, values).map(|t| engine.wrap_host(t))
        };
        Ok((
            wrap([batch, d.heads, n, d.head_dim], q)?,
            wrap([batch, d.kv_heads, m, d.head_dim], k)?,
            wrap([batch, d.kv_heads, m, d.v_head_dim], v)?,
        ))
    }

    /// The output projection on the device: `Σ_h Y_h W_Ohᵀ + b_O`, read back.
    async fn output_gpu(
        &self,
        ctx: &Run,
        gemm: GemmChoice,
        weights: &DeviceWeights,
        y: &wgpu::Buffer,
        batch: usize,
        n: usize,
    ) -> Result<HostTensor> {
        let d = self.dims;
        let out = ctx
            .scoped("multi-head output projection", || {
                let out = buffer::storage(ctx, "output", batch * n * d.d_model)?;
                let mut rec = Recorder::new(ctx, "multi-head output projection");
                for h in 0..d.heads {
                    let spec = GemmSpec {
                        batch,
                        m: n,
                        n: d.d_model,
                        k: d.v_head_dim,
                        trans_a: false,
                        trans_b: true,
                        lda: d.v_head_dim,
                        ldb: weights.out.stride * 4,
                        ldc: d.d_model,
                        a_offset: h * n * d.v_head_dim,
                        b_offset: h * d.v_head_dim,
                        c_offset: 0,
                        a_stride: d.heads * n * d.v_head_dim,
                        b_stride: 0,
                        c_stride: n * d.d_model,
                        b_batch_base: 0,
                        b_batch_div: 1,
                        alpha: 1.0,
                        beta: if h == 0 { 0.0 } else { 1.0 },
                    };
                    let kernel = gemm.for_product(&ctx.caps, &spec);
                    gemm::record(&mut rec, kernel, &spec, y, &weights.out.words, &out)?;
                }
                if weights.out.has_bias {
                    let ones = buffer::upload(ctx, "ones", &vec![1.0f32; n])?;
                    record_bias(
                        &mut rec,
                        gemm,
                        &ones,
                        &weights.out.bias,
                        0,
                        &out,
                        batch,
                        n,
                        d.d_model,
                        0,
                        n * d.d_model,
                    )?;
                }
                rec.submit();
                Ok(out)
            })
            .await?;
        let data = buffer::read_f32(ctx, &out, 0, batch * n * d.d_model).await?;
        HostTensor::new([batch, n, d.d_model], data)
    }

    /// The oracle twin of [`MultiHeadAttention::forward`] in `F`: the output
    /// `[B, N, d_model]` and the weights `[B, heads, N, M]`. Supports the
    /// options a layer passes to its attention (causal, scale, softcap,
    /// windows, temperature, ALiBi).
    pub fn oracle<F: Real>(
        &self,
        query: &HostTensor,
        key_value: Option<&HostTensor>,
        options: &AttentionOptions,
    ) -> Result<(Vec<F>, Vec<F>)> {
        options.validate()?;
        let d = self.dims;
        let (batch, n) = self.check_input("query", query, d.d_model, None)?;
        let (_, m) =
            self.check_input("key_value", key_value.unwrap_or(query), d.d_kv, Some(batch))?;
        let (q, k, v) = projections::<F>(&self.weights, d, self.rope.as_ref(), query, key_value, 0);
        let (y, probs) = attention_core(&q, &k, &v, d, batch, n, m, options);
        Ok((out_projection(&y, &self.weights, d, batch, n), probs))
    }
}

/// The attention of a step: through the workspace's prepared call (made
/// again when the shapes or options changed, as when the cache grows), or a
/// plain call without a workspace.
async fn attend(
    engine: &Engine,
    workspace: Option<&mut Workspace>,
    inputs: &AttentionInputs<'_, Tensor>,
    options: &AttentionOptions,
) -> Result<crate::AttentionOutputs<Tensor>> {
    let Some(ws) = workspace else {
        return engine.attention(inputs, options).await;
    };
    let dims = crate::problem::validate(inputs, options)?;
    let prepared = match ws.attention.take() {
        Some(p) if p.dims() == &dims && p.options() == options => p,
        _ => engine.prepare(&dims, options)?,
    };
    let out = prepared.run(engine, inputs).await;
    ws.attention = Some(prepared);
    out
}

/// Records `out[b, h] = x[b] W_hᵀ (+ b_h)` for every head, W_h the rows of
/// a packed f32 matrix from `first`: one GEMM per head writing into the
/// head-major layout, and a rank-1 update for the bias.
#[allow(clippy::too_many_arguments)]
fn record_projection(
    rec: &mut Recorder<'_>,
    gemm: GemmChoice,
    x: &wgpu::Buffer,
    ones: &wgpu::Buffer,
    batch: usize,
    len: usize,
    (w, first): (&PackedWeights, usize),
    heads: usize,
    head_dim: usize,
    out: &wgpu::Buffer,
) -> Result<()> {
    debug_assert_eq!(w.storage, WeightStorage::F32);
    let (in_dim, ldb) = (w.in_dim, w.stride * 4);
    for h in 0..heads {
        let spec = GemmSpec {
            batch,
            m: len,
            n: head_dim,
            k: in_dim,
            trans_a: false,
            trans_b: true,
            lda: in_dim,
            ldb,
            ldc: head_dim,
            a_offset: 0,
            b_offset: (first + h * head_dim) * ldb,
            c_offset: h * len * head_dim,
            a_stride: len * in_dim,
            b_stride: 0,
            c_stride: heads * len * head_dim,
            b_batch_base: 0,
            b_batch_div: 1,
            alpha: 1.0,
            beta: 0.0,
        };
        let kernel = gemm.for_product(&rec.ctx().caps, &spec);
        gemm::record(rec, kernel, &spec, x, &w.words, out)?;
        if w.has_bias {
            record_bias(
                rec,
                gemm,
                ones,
                &w.bias,
                first + h * head_dim,
                out,
                batch,
                len,
                head_dim,
                h * len * head_dim,
                heads * len * head_dim,
            )?;
        }
    }
    Ok(())
}

/// Records `C[b] += 1 · bias[offset .. offset + width]` for `rows` rows of
/// every batch entry: a GEMM with K = 1 against a column of ones.
#[allow(clippy::too_many_arguments)]
fn record_bias(
    rec: &mut Recorder<'_>,
    gemm: GemmChoice,
    ones: &wgpu::Buffer,
    bias: &wgpu::Buffer,
    bias_offset: usize,
    out: &wgpu::Buffer,
    batch: usize,
    rows: usize,
    width: usize,
    c_offset: usize,
    c_stride: usize,
) -> Result<()> {
    let spec = GemmSpec {
        batch,
        m: rows,
        n: width,
        k: 1,
        trans_a: false,
        trans_b: false,
        lda: 1,
        ldb: width,
        ldc: width,
        a_offset: 0,
        b_offset: bias_offset,
        c_offset,
        a_stride: 0,
        b_stride: 0,
        c_stride,
        b_batch_base: 0,
        b_batch_div: 1,
        alpha: 1.0,
        beta: 1.0,
    };
    let kernel = gemm.for_product(&rec.ctx().caps, &spec);
    gemm::record(rec, kernel, &spec, ones, bias, out)
}

/// The `heads` heads of `head_dim` features that start at column `first` of
/// the row-major `[batch · len, width]` products `flat` (`rows` = (batch,
/// len, width)), head-major `[batch, heads, len, head_dim]`.
fn heads_of(
    flat: &[f32],
    (batch, len, width): (usize, usize, usize),
    first: usize,
    heads: usize,
    head_dim: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; batch * heads * len * head_dim];
    for bi in 0..batch {
        for t in 0..len {
            for h in 0..heads {
                let src = (bi * len + t) * width + first + h * head_dim;
                let dst = ((bi * heads + h) * len + t) * head_dim;
                out[dst..dst + head_dim].copy_from_slice(&flat[src..src + head_dim]);
            }
        }
    }
    out
}

/// `Σ_h Y_h W_Ohᵀ + b_O` in f32: `[B, N, d_model]` from head-major Y, by the
/// fast CPU backend's product over the heads' concatenated features (`W_O`
/// packed once).
fn out_projection_fast(
    y: &[f32],
    layer: &MultiHeadAttention,
    batch: usize,
    n: usize,
    threads: usize,
) -> Vec<f32> {
    let (d, w) = (layer.dims, &layer.weights);
    let (dv, width) = (d.v_head_dim, d.heads * d.v_head_dim);
    // [B, heads, N, Dv] -> [B, N, heads·Dv]
    let mut concat = vec![0.0f32; batch * n * width];
    for b in 0..batch {
        for h in 0..d.heads {
            for t in 0..n {
                let src = ((b * d.heads + h) * n + t) * dv;
                let dst = (b * n + t) * width + h * dv;
                concat[dst..dst + dv].copy_from_slice(&y[src..src + dv]);
            }
        }
    }
    let out = layer
        .host
        .out
        .get_or_init(|| HostProduct::stack(&[(&w.w_o, w.b_o.as_ref())]));
    out.apply(&concat, batch * n, threads)
}

/// `x W_hᵀ + b_h` for every head, head-major `[B, heads, len, head_dim]`.
#[allow(clippy::too_many_arguments)]
fn project_heads<F: Real>(
    x: &HostTensor,
    w: &HostTensor,
    b: Option<&HostTensor>,
    heads: usize,
    head_dim: usize,
) -> Vec<F> {
    let (batch, len, in_dim) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let mut out = vec![F::ZERO; batch * heads * len * head_dim];
    for bi in 0..batch {
        for t in 0..len {
            let row = &x.data()[(bi * len + t) * in_dim..][..in_dim];
            for h in 0..heads {
                for c in 0..head_dim {
                    let feature = h * head_dim + c;
                    let wrow = &w.data()[feature * in_dim..][..in_dim];
                    let mut acc = b.map_or(F::ZERO, |b| F::from_f32(b.data()[feature]));
                    for (&xi, &wi) in row.iter().zip(wrow) {
                        acc = acc + F::from_f32(xi) * F::from_f32(wi);
                    }
                    out[((bi * heads + h) * len + t) * head_dim + c] = acc;
                }
            }
        }
    }
    out
}

/// Q, K, V projected (and rotated) in `F`.
pub(super) fn projections<F: Real>(
    w: &MhaWeights,
    d: MhaDims,
    rope: Option<&Rope>,
    query: &HostTensor,
    key_value: Option<&HostTensor>,
    past_len: usize,
) -> (Vec<F>, Vec<F>, Vec<F>) {
    let kv = key_value.unwrap_or(query);
    let mut q = project_heads::<F>(query, &w.w_q, w.b_q.as_ref(), d.heads, d.head_dim);
    let mut k = project_heads::<F>(kv, &w.w_k, w.b_k.as_ref(), d.kv_heads, d.head_dim);
    let v = project_heads::<F>(kv, &w.w_v, w.b_v.as_ref(), d.kv_heads, d.v_head_dim);
    if let Some(rope) = rope {
        rope_in_place(&mut q, query.shape()[1], d.head_dim, rope, past_len);
        let key_offset = if key_value.is_some() { 0 } else { past_len };
        rope_in_place(&mut k, kv.shape()[1], d.head_dim, rope, key_offset);
    }
    (q, k, v)
}

/// Attention of head-major Q `[B, H, N, Dk]` against K, V `[B, Hkv, M, ·]`,
/// written as plainly as the contract reads; returns Y `[B, H, N, Dv]` and
/// the probabilities `[B, H, N, M]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attention_core<F: Real>(
    q: &[F],
    k: &[F],
    v: &[F],
    d: MhaDims,
    batch: usize,
    n: usize,
    m: usize,
    options: &AttentionOptions,
) -> (Vec<F>, Vec<F>) {
    let (dk, dv, group) = (d.head_dim, d.v_head_dim, d.heads / d.kv_heads);
    let scale = F::from_f32(options.effective_scale(dk));
    let softcap = F::from_f32(options.softcap);
    let temperature = F::from_f32(options.temperature);
    let slopes = alibi_slopes(d.heads);
    let mut y = vec![F::ZERO; batch * d.heads * n * dv];
    let mut probs = vec![F::ZERO; batch * d.heads * n * m];
    let mut biased = vec![F::NEG_INFINITY; m];
    for b in 0..batch {
        for h in 0..d.heads {
            let kvh = h / group;
            for i in 0..n {
                let qrow = &q[((b * d.heads + h) * n + i) * dk..][..dk];
                let pos = i as i64;
                for (j, s) in biased.iter_mut().enumerate() {
                    let jj = j as i64;
                    let masked = (options.is_causal && jj > pos)
                        || (options.left_window_size >= 0 && jj < pos - options.left_window_size)
                        || (options.right_window_size >= 0 && jj > pos + options.right_window_size);
                    if masked {
                        *s = F::NEG_INFINITY;
                        continue;
                    }
                    let krow = &k[((b * d.kv_heads + kvh) * m + j) * dk..][..dk];
                    let mut dot = F::ZERO;
                    for (&a, &c) in qrow.iter().zip(krow) {
                        dot = dot + a * c;
                    }
                    let mut score = dot * scale;
                    if options.softcap > 0.0 {
                        score = softcap * (score / softcap).tanh();
                    }
                    if options.alibi {
                        score =
                            score - F::from_f64(slopes[h]) * F::from_f64((pos - jj).abs() as f64);
                    }
                    *s = score;
                }
                let max = biased
                    .iter()
                    .fold(F::NEG_INFINITY, |acc, &s| if s > acc { s } else { acc });
                let prow = &mut probs[((b * d.heads + h) * n + i) * m..][..m];
                if max == F::NEG_INFINITY {
                    continue; // fully masked: zero probabilities and output
                }
                let mut sum = F::ZERO;
                for (p, &s) in prow.iter_mut().zip(&biased) {
                    *p = if s == F::NEG_INFINITY {
                        F::ZERO
                    } else {
                        ((s - max) / temperature).exp()
                    };
                    sum = sum + *p;
                }
                let yrow = &mut y[((b * d.heads + h) * n + i) * dv..][..dv];
                for (j, p) in prow.iter_mut().enumerate() {
                    *p = *p / sum;
                    let vrow = &v[((b * d.kv_heads + kvh) * m + j) * dv..][..dv];
                    for (acc, &val) in yrow.iter_mut().zip(vrow) {
                        *acc = *acc + *p * val;
                    }
                }
            }
        }
    }
    (y, probs)
}

/// `Σ_h Y_h W_Ohᵀ + b_O`: `[B, N, d_model]` from head-major Y.
pub(super) fn out_projection<F: Real>(
    y: &[F],
    w: &MhaWeights,
    d: MhaDims,
    batch: usize,
    n: usize,
) -> Vec<F> {
    let (dv, width) = (d.v_head_dim, d.heads * d.v_head_dim);
    let mut out = vec![F::ZERO; batch * n * d.d_model];
    for b in 0..batch {
        for t in 0..n {
            for o in 0..d.d_model {
                let wrow = &w.w_o.data()[o * width..][..width];
                let mut acc = w.b_o.as_ref().map_or(F::ZERO, |b| F::from_f32(b.data()[o]));
                for h in 0..d.heads {
                    let yrow = &y[((b * d.heads + h) * n + t) * dv..][..dv];
                    for (c, &val) in yrow.iter().enumerate() {
                        acc = acc + val * F::from_f32(wrow[h * dv + c]);
                    }
                }
                out[(b * n + t) * d.d_model + o] = acc;
            }
        }
    }
    out
}
