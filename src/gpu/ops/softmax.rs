//! Row softmax with logsumexp (`shaders/softmax.wgsl`).

use bytemuck::{Pod, Zeroable};

use crate::error::Result;
use crate::gpu::buffer;
use crate::gpu::pipeline::PipelineKey;
use crate::gpu::recorder::Recorder;
use crate::gpu::registry::Kernel;

/// The value the mask kernel writes for a masked score (`-f32::MAX`); the
/// softmax treats anything at or below it as masked.
pub const MASKED: f32 = -f32::MAX;

/// Invocations per workgroup (one workgroup per row); matches the WGSL.
pub const WORKGROUP: u32 = 128;
/// Workgroup memory: a running max and sum per invocation.
pub const WORKGROUP_BYTES: u32 = 2 * 4 * WORKGROUP;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    lse_offset: u32,
    _pad: u32,
}

/// The pipeline key.
pub fn key() -> PipelineKey {
    PipelineKey::new(Kernel::Softmax)
}

/// Replaces each of `rows` rows of `cols` scores (from element 0 of `scores`)
/// by its softmax and writes the row's logsumexp at `lse[lse_offset + row]`.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    rows: usize,
    cols: usize,
    scores: &wgpu::Buffer,
    lse: &wgpu::Buffer,
    lse_offset: usize,
) -> Result<()> {
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        lse_offset: lse_offset as u32,
        _pad: 0,
    };
    let ctx = rec.ctx();
    let pipeline = ctx.pipelines.get(&key());
    let uniform = buffer::uniform(ctx, "softmax params", &params);
    rec.dispatch(&pipeline, &[&uniform, scores, lse], rows as u64)
}
