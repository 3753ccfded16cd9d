//! Positional encodings in place (`shaders/position.wgsl`): the sinusoidal
//! encoding added to embeddings, and rotary embeddings on queries or keys.

use crate::device::buffer;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::Result;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Invocations per workgroup; matches the WGSL.
pub const WORKGROUP: u32 = 64;

/// What the kernel does to each pair of values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionMode {
    /// Adds `sin` and `cos` of the angle to values `2f` and `2f + 1`.
    Sinusoidal = 0,
    /// Rotates the pairs `(2f, 2f + 1)`.
    RopeInterleaved = 1,
    /// Rotates the pairs `(f, f + dim / 2)`.
    RopeHalfSplit = 2,
}

crate::shader::uniform::uniform_block! {
    pub(crate) struct Params {
        rows: u32,
        dim: u32,
        /// Pairs per row: ceil(dim / 2) for mode 0, dim / 2 for RoPE.
        pairs: u32,
        seq_len: u32,
        offset: u32,
        mode: u32,
        _pad: [u32; 2],
    }
}

/// The pipeline key.
pub fn key() -> PipelineKey {
    PipelineKey::new(crate::kernels::position::POSITION)
}

/// The inverse frequencies `base^(-2f / dim)` for `pairs` frequency indices,
/// computed in f64 and rounded to f32 (the values the kernel multiplies by).
pub fn inverse_frequencies(base: f64, dim: usize, pairs: usize) -> Vec<f32> {
    (0..pairs)
        .map(|f| base.powf(-2.0 * f as f64 / dim as f64) as f32)
        .collect()
}

/// The parameter block of `rows` rows of `dim` values from position
/// `offset`, and the pairs a row has.
fn params(
    mode: PositionMode,
    rows: usize,
    dim: usize,
    seq_len: usize,
    offset: usize,
) -> (Params, usize) {
    let pairs = match mode {
        PositionMode::Sinusoidal => dim.div_ceil(2),
        PositionMode::RopeInterleaved | PositionMode::RopeHalfSplit => dim / 2,
    };
    let params = Params {
        rows: rows as u32,
        dim: dim as u32,
        pairs: pairs as u32,
        seq_len: seq_len as u32,
        offset: offset as u32,
        mode: mode as u32,
        _pad: [0; 2],
    };
    (params, pairs)
}

/// Records the encoding of `rows` rows of `dim` values in `x`, row `r` at
/// position `offset + r % seq_len`. `inv_freq` holds the pairs' inverse frequencies.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    mode: PositionMode,
    rows: usize,
    dim: usize,
    seq_len: usize,
    offset: usize,
    x: &wgpu::Buffer,
    inv_freq: &wgpu::Buffer,
) -> Result<()> {
    let (params, pairs) = params(mode, rows, dim, seq_len, offset);
    let ctx = rec.ctx();
    let pipeline = ctx.pipelines.get(&key());
    let uniform = buffer::uniform(ctx, "position params", &params);
    let workgroups = (rows * pairs).div_ceil(WORKGROUP as usize) as u64;
    rec.dispatch(&pipeline, &[&uniform, x, inv_freq], workgroups)
}

/// A rotation prepared once for a shape (pipeline, parameters and inverse
/// frequencies on the device): each decoder step rewrites its position in
/// place and records it with no allocation.
#[derive(Debug)]
pub(crate) struct PreparedPosition {
    pipeline: std::sync::Arc<crate::device::pipeline::Pipeline>,
    uniform: wgpu::Buffer,
    inv_freq: wgpu::Buffer,
    params: Params,
    /// The position the uniform holds now.
    offset: std::sync::atomic::AtomicU32,
    workgroups: u64,
}

impl PreparedPosition {
    /// Prepares the encoding of `rows` rows of `dim` values (row `r` at
    /// position `offset + r % seq_len`, the offset set per step).
    pub(crate) fn prepare(
        ctx: &crate::device::scope::Run,
        mode: PositionMode,
        rows: usize,
        dim: usize,
        seq_len: usize,
        inv_freq: &[f32],
    ) -> Result<Self> {
        let (params, pairs) = params(mode, rows, dim, seq_len, 0);
        Ok(PreparedPosition {
            pipeline: ctx.pipelines.get(&key()),
            uniform: buffer::uniform(ctx, "position params", &params),
            inv_freq: buffer::upload(ctx, "inverse frequencies", inv_freq)?,
            params,
            offset: std::sync::atomic::AtomicU32::new(0),
            workgroups: (rows * pairs).div_ceil(WORKGROUP as usize) as u64,
        })
    }

    /// Records the encoding of `x` with its first row at `offset`.
    pub(crate) fn record(
        &self,
        rec: &mut Recorder<'_>,
        x: &wgpu::Buffer,
        offset: usize,
    ) -> Result<()> {
        use std::sync::atomic::Ordering;
        let offset = offset as u32;
        if self.offset.swap(offset, Ordering::Relaxed) != offset {
            let params = Params {
                offset,
                ..self.params
            };
            crate::device::buffer::write_bytes(
                rec.ctx(),
                &self.uniform,
                0,
                bytemuck::bytes_of(&params),
            );
        }
        rec.dispatch(
            &self.pipeline,
            &[&self.uniform, x, &self.inv_freq],
            self.workgroups,
        )
    }
}

/// Sinusoidal encoding and rotary embeddings, in place (`shaders/position.wgsl`).
pub const POSITION: Kernel = Kernel::new(&KernelDef {
    name: "position",
    origin: Origin::File("position.wgsl", include_str!("../../shaders/position.wgsl")),
    slots: &[],
    bindings: &[Binding::Uniform, Binding::ReadWrite, Binding::Read],
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 1] = [POSITION];

/// The family's pipelines (no override constants).
pub fn variants() -> Vec<PipelineKey> {
    [POSITION].map(PipelineKey::new).to_vec()
}
