//! Positional encodings: the sinusoidal absolute encoding added to embeddings
//! (Vaswani et al., 2017) and rotary embeddings, RoPE (Su et al., 2021), in
//! the interleaved and half-split layouts, with a base θ and a position offset
//! for decoding with a KV cache. (ALiBi, the third kind, is a bias inside the
//! attention kernels: [`crate::AttentionOptions::alibi`].)
//!
//! Frequencies: pair `f` of a `dim`-wide row turns at `θ^(-2f/dim)` radians per
//! position. Sinusoidal: `PE[p, 2f] = sin(p·ω_f)`, `PE[p, 2f+1] = cos(p·ω_f)`.
//! RoPE rotates each pair `(a, b)` by the angle `p·ω_f`:
//! `(a cos − b sin, a sin + b cos)`.

use crate::cpu::Real;
use crate::device::buffer;
use crate::device::recorder::Recorder;
use crate::device::scope::Run;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::kernels::position;
use crate::kernels::position::PositionMode;
use crate::tensor::HostTensor;

/// The base θ of the original papers.
pub const DEFAULT_BASE: f64 = 10_000.0;

/// The sinusoidal absolute encoding, added to `[..., N, D]` embeddings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sinusoidal {
    /// The base θ (10000 in the paper).
    pub base: f64,
    /// The position of the first row.
    pub offset: usize,
}

impl Default for Sinusoidal {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            offset: 0,
        }
    }
}

/// How RoPE pairs the values of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeLayout {
    /// Pairs `(2f, 2f + 1)`: the paper's layout (GPT-J, LLaMA's original code).
    #[default]
    Interleaved,
    /// Pairs `(f, f + D/2)`: the "rotate half" layout (GPT-NeoX, Hugging Face).
    HalfSplit,
}

/// Rotary position embeddings for `[..., N, D]` queries or keys (D even).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// The base θ (10000 in the paper; long-context models use larger ones).
    pub base: f64,
    /// How values are paired.
    pub layout: RopeLayout,
    /// The position of the first row: the KV cache's length when decoding.
    pub offset: usize,
}

impl Default for Rope {
    fn default() -> Self {
        Self {
            base: DEFAULT_BASE,
            layout: RopeLayout::Interleaved,
            offset: 0,
        }
    }
}

fn check_base(base: f64) -> Result<()> {
    if !(base.is_finite() && base > 1.0) {
        return Err(Error::InvalidOption {
            name: "base",
            value: base.to_string(),
            reason: "the base θ must be finite and greater than 1",
        });
    }
    Ok(())
}

/// The rows, sequence length and row width of a `[..., N, D]` tensor.
fn row_shape(name: &'static str, x: &HostTensor) -> Result<(usize, usize, usize)> {
    let shape = x.shape();
    if shape.len() < 2 {
        return Err(Error::Rank {
            tensor: name,
            expected: "at least 2 ([..., positions, features])",
            got: shape.to_vec(),
        });
    }
    if shape.contains(&0) {
        return Err(Error::EmptyTensor {
            tensor: name,
            shape: shape.to_vec(),
        });
    }
    let dim = shape[shape.len() - 1];
    Ok((x.len() / dim, shape[shape.len() - 2], dim))
}

fn check_positions(rows_at: usize, offset: usize) -> Result<()> {
    // Positions must stay exact in f32 and in the kernel's u32.
    let last = offset as u64 + rows_at as u64;
    if last > 1 << 24 {
        return Err(Error::Limit {
            what: format!("positions up to {last}"),
            needed: last,
            limit: 1 << 24,
            limit_name: "largest position exact in f32",
            hint: "positions beyond 2^24 lose precision; reduce the offset",
        });
    }
    Ok(())
}

/// Runs `mode` over `x` on the engine's GPU; `None` on a CPU engine.
async fn run_gpu(
    engine: &Engine,
    mode: PositionMode,
    x: &HostTensor,
    base: f64,
    offset: usize,
) -> Result<Option<HostTensor>> {
    // After a device loss, run on a fresh device.
    engine.recover().await?;
    let Some(device) = engine.gpu() else {
        return Ok(None);
    };
    let run = Run::new(device);
    let ctx = &run;
    let (rows, seq_len, dim) = row_shape("x", x)?;
    let pairs = match mode {
        PositionMode::Sinusoidal => dim.div_ceil(2),
        _ => dim / 2,
    };
    let freqs = position::inverse_frequencies(base, dim, pairs);
    let out = ctx
        .scoped("positional encoding", || {
            let buf = buffer::upload(ctx, "x", x.data())?;
            let freq_buf = buffer::upload(ctx, "inverse frequencies", &freqs)?;
            let mut rec = Recorder::new(ctx, "positional encoding");
            position::record(&mut rec, mode, rows, dim, seq_len, offset, &buf, &freq_buf)?;
            rec.submit();
            Ok(buf)
        })
        .await?;
    let data = buffer::read_f32(ctx, &out, 0, x.len()).await?;
    HostTensor::new(x.shape().to_vec(), data).map(Some)
}

impl Sinusoidal {
    /// The encoding itself, `[positions, dim]`, from position `offset` (f64, rounded).
    pub fn table(&self, positions: usize, dim: usize) -> Result<HostTensor> {
        let zeros = HostTensor::zeros([positions, dim])?;
        let values = sinusoidal_oracle::<f64>(&zeros, self.base, self.offset)?;
        HostTensor::new([positions, dim], values.iter().map(|&v| v as f32).collect())
    }

    /// `x + PE` for embeddings `x` of shape `[..., N, D]`: on the GPU on a GPU
    /// engine, in f32 with the angles' sines from f64 on a CPU engine.
    pub async fn add_to(&self, engine: &Engine, x: &HostTensor) -> Result<HostTensor> {
        check_base(self.base)?;
        let (_, seq_len, _) = row_shape("x", x)?;
        check_positions(seq_len, self.offset)?;
        if let Some(out) =
            run_gpu(engine, PositionMode::Sinusoidal, x, self.base, self.offset).await?
        {
            return Ok(out);
        }
        let (_, seq_len, dim) = row_shape("x", x)?;
        let table = self.table(seq_len, dim)?;
        let mut out = x.data().to_vec();
        for row in out.chunks_mut(dim * seq_len) {
            for (o, &pe) in row.iter_mut().zip(table.data()) {
                *o += pe;
            }
        }
        HostTensor::new(x.shape().to_vec(), out)
    }

    /// [`Sinusoidal::add_to`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn add_to_blocking(&self, engine: &Engine, x: &HostTensor) -> Result<HostTensor> {
        pollster::block_on(self.add_to(engine, x))
    }
}

impl Rope {
    /// Checks the base and that `dim` is even.
    pub(crate) fn check(&self, dim: usize) -> Result<()> {
        check_base(self.base)?;
        if !dim.is_multiple_of(2) {
            return Err(Error::InvalidOption {
                name: "rope",
                value: format!("head dim {dim}"),
                reason: "RoPE rotates pairs of values: the head dim must be even",
            });
        }
        Ok(())
    }

    /// `x` rotated, for queries or keys of shape `[..., N, D]`: on the GPU on a
    /// GPU engine, in f32 with the angles' sines and cosines from f64 on a CPU engine.
    pub async fn apply(&self, engine: &Engine, x: &HostTensor) -> Result<HostTensor> {
        let (_, seq_len, dim) = row_shape("x", x)?;
        self.check(dim)?;
        check_positions(seq_len, self.offset)?;
        if let Some(out) = run_gpu(engine, self.mode(), x, self.base, self.offset).await? {
            return Ok(out);
        }
        let mut out = x.data().to_vec();
        rope_fast(&mut out, seq_len, dim, self, 0);
        HostTensor::new(x.shape().to_vec(), out)
    }

    /// [`Rope::apply`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn apply_blocking(&self, engine: &Engine, x: &HostTensor) -> Result<HostTensor> {
        pollster::block_on(self.apply(engine, x))
    }

    fn mode(&self) -> PositionMode {
        match self.layout {
            RopeLayout::Interleaved => PositionMode::RopeInterleaved,
            RopeLayout::HalfSplit => PositionMode::RopeHalfSplit,
        }
    }

    /// The rotation of `rows` rows of `dim` values (`seq_len` a sequence)
    /// prepared once for a decoder's steps.
    pub(crate) fn prepare(
        &self,
        ctx: &Run,
        rows: usize,
        seq_len: usize,
        dim: usize,
    ) -> Result<position::PreparedPosition> {
        self.check(dim)?;
        let freqs = position::inverse_frequencies(self.base, dim, dim / 2);
        position::PreparedPosition::prepare(ctx, self.mode(), rows, dim, seq_len, &freqs)
    }

    /// The append of a decoder step's keys (rotated) and values into its KV
    /// cache, prepared once: `rows` rows of `dim` values, `seq_len` a sequence.
    pub(crate) fn prepare_append(
        &self,
        ctx: &Run,
        rows: usize,
        seq_len: usize,
        dim: usize,
    ) -> Result<crate::kernels::cache_append::PreparedCacheAppend> {
        self.check(dim)?;
        let freqs = position::inverse_frequencies(self.base, dim, dim / 2);
        crate::kernels::cache_append::PreparedCacheAppend::prepare(
            ctx,
            Some((self.mode(), &freqs)),
            rows,
            dim,
            seq_len,
        )
    }

    /// The position of the first of `seq_len` rows at `extra_offset` past
    /// this encoding's own offset, checked to stay exact in f32.
    pub(crate) fn position(&self, seq_len: usize, extra_offset: usize) -> Result<usize> {
        check_positions(seq_len, self.offset + extra_offset)?;
        Ok(self.offset + extra_offset)
    }

    /// Records a prepared rotation of `x` (sequences of `seq_len` rows) from
    /// position `offset + extra_offset`.
    pub(crate) fn record_prepared(
        &self,
        rec: &mut Recorder<'_>,
        prepared: &position::PreparedPosition,
        x: &wgpu::Buffer,
        seq_len: usize,
        extra_offset: usize,
    ) -> Result<()> {
        check_positions(seq_len, self.offset + extra_offset)?;
        prepared.record(rec, x, self.offset + extra_offset)
    }

    /// Records the rotation of `rows` rows of `dim` values on the device (row
    /// `r` at position `offset + extra_offset + r % seq_len`), for the layers
    /// that keep their activations on the GPU.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        rec: &mut Recorder<'_>,
        x: &wgpu::Buffer,
        rows: usize,
        seq_len: usize,
        dim: usize,
        extra_offset: usize,
    ) -> Result<()> {
        self.check(dim)?;
        check_positions(seq_len, self.offset + extra_offset)?;
        let freqs = position::inverse_frequencies(self.base, dim, dim / 2);
        let freq_buf = buffer::upload(rec.ctx(), "inverse frequencies", &freqs)?;
        position::record(
            rec,
            self.mode(),
            rows,
            dim,
            seq_len,
            self.offset + extra_offset,
            x,
            &freq_buf,
        )
    }
}

/// The angle of pair `f` at position `pos`, as the GPU forms it in f32 (the
/// inverse frequency rounded, one product) and exactly in f64.
fn angle<F: Real>(base: f64, dim: usize, f: usize, pos: usize) -> F {
    F::from_f64(pos as f64) * F::from_f64(base.powf(-2.0 * f as f64 / dim as f64))
}

/// The oracle twin of [`Sinusoidal::add_to`]: `x + PE`, in `F`.
pub fn sinusoidal_oracle<F: Real>(x: &HostTensor, base: f64, offset: usize) -> Result<Vec<F>> {
    let (_, seq_len, dim) = row_shape("x", x)?;
    let mut out: Vec<F> = x.data().iter().map(|&v| F::from_f32(v)).collect();
    for (r, row) in out.chunks_mut(dim).enumerate() {
        let pos = offset + r % seq_len;
        for f in 0..dim.div_ceil(2) {
            let a: F = angle(base, dim, f, pos);
            row[2 * f] = row[2 * f] + a.sin();
            if 2 * f + 1 < dim {
                row[2 * f + 1] = row[2 * f + 1] + a.cos();
            }
        }
    }
    Ok(out)
}

/// The oracle twin of [`Rope::apply`], in `F`.
pub fn rope_oracle<F: Real>(x: &HostTensor, rope: &Rope) -> Result<Vec<F>> {
    let (_, seq_len, dim) = row_shape("x", x)?;
    rope.check(dim)?;
    let mut out: Vec<F> = x.data().iter().map(|&v| F::from_f32(v)).collect();
    rope_in_place(&mut out, seq_len, dim, rope, 0);
    Ok(out)
}

/// Rotates rows of `dim` values in place in f32 (a CPU engine's RoPE): row `r`
/// at position `rope.offset + extra_offset + r % seq_len` (`dim` even). Each
/// angle's cosine and sine come from f64 and are rounded once, so positions in
/// the thousands keep their accuracy; the rotation itself is f32.
pub(crate) fn rope_fast(
    rows: &mut [f32],
    seq_len: usize,
    dim: usize,
    rope: &Rope,
    extra_offset: usize,
) {
    let half = dim / 2;
    let table: Vec<(f32, f32)> = (0..seq_len)
        .flat_map(|t| {
            let pos = rope.offset + extra_offset + t;
            (0..half).map(move |f| {
                let a: f64 = angle(rope.base, dim, f, pos);
                (a.cos() as f32, a.sin() as f32)
            })
        })
        .collect();
    for (r, row) in rows.chunks_mut(dim).enumerate() {
        let angles = &table[(r % seq_len) * half..(r % seq_len + 1) * half];
        for (f, &(cos, sin)) in angles.iter().enumerate() {
            let (i1, i2) = match rope.layout {
                RopeLayout::Interleaved => (2 * f, 2 * f + 1),
                RopeLayout::HalfSplit => (f, f + half),
            };
            let (x1, x2) = (row[i1], row[i2]);
            row[i1] = x1 * cos - x2 * sin;
            row[i2] = x1 * sin + x2 * cos;
        }
    }
}

/// Rotates rows of `dim` values in place, row `r` at position
/// `rope.offset + extra_offset + r % seq_len` (`dim` even).
pub(crate) fn rope_in_place<F: Real>(
    rows: &mut [F],
    seq_len: usize,
    dim: usize,
    rope: &Rope,
    extra_offset: usize,
) {
    rotate_pairs(rows, seq_len, dim, rope, extra_offset, F::from_f32(1.0));
}

/// RoPE's transpose (the rotation by minus each angle): a gradient through
/// [`rope_in_place`] back to its input.
pub(crate) fn rope_transpose_in_place<F: Real>(
    rows: &mut [F],
    seq_len: usize,
    dim: usize,
    rope: &Rope,
    extra_offset: usize,
) {
    rotate_pairs(rows, seq_len, dim, rope, extra_offset, F::from_f32(-1.0));
}

/// Rotates each pair by `sign` times its position's angle.
fn rotate_pairs<F: Real>(
    rows: &mut [F],
    seq_len: usize,
    dim: usize,
    rope: &Rope,
    extra_offset: usize,
    sign: F,
) {
    let half = dim / 2;
    for (r, row) in rows.chunks_mut(dim).enumerate() {
        let pos = rope.offset + extra_offset + r % seq_len;
        for f in 0..half {
            let (i1, i2) = match rope.layout {
                RopeLayout::Interleaved => (2 * f, 2 * f + 1),
                RopeLayout::HalfSplit => (f, f + half),
            };
            let a: F = angle(rope.base, dim, f, pos);
            let (sin, cos) = (sign * a.sin(), a.cos());
            let (x1, x2) = (row[i1], row[i2]);
            row[i1] = x1 * cos - x2 * sin;
            row[i2] = x1 * sin + x2 * cos;
        }
    }
}
