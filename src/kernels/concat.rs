//! KV-cache concatenation (`shaders/concat.wgsl`).

use crate::device::buffer;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::Result;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Invocations per workgroup (one output element each); matches the WGSL.
pub const WORKGROUP: usize = 256;

crate::shader::uniform::uniform_block! {
    pub(crate) struct Params {
        total: u32,
        past_len: u32,
        new_len: u32,
        width: u32,
    }
}

/// The pipeline key.
pub fn key() -> PipelineKey {
    PipelineKey::new(crate::kernels::concat::CONCAT)
}

/// Writes `present[h] = concat(past[h], new[h])` for `heads` heads of rows of `width`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    heads: usize,
    past_len: usize,
    new_len: usize,
    width: usize,
    past: &wgpu::Buffer,
    new: &wgpu::Buffer,
    present: &wgpu::Buffer,
) -> Result<()> {
    let total = heads * (past_len + new_len) * width;
    let params = Params {
        total: total as u32,
        past_len: past_len as u32,
        new_len: new_len as u32,
        width: width as u32,
    };
    let ctx = rec.ctx();
    let pipeline = ctx.pipelines.get(&key());
    let uniform = buffer::uniform(ctx, "concat params", &params);
    rec.dispatch(
        &pipeline,
        &[&uniform, past, new, present],
        total.div_ceil(WORKGROUP) as u64,
    )
}

/// Concatenation of a KV cache with new keys or values (`shaders/concat.wgsl`).
pub const CONCAT: Kernel = Kernel::new(&KernelDef {
    name: "concat",
    origin: Origin::File("concat.wgsl", include_str!("../../shaders/concat.wgsl")),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 1] = [CONCAT];

/// The family's pipelines (no override constants).
pub fn variants() -> Vec<PipelineKey> {
    [CONCAT].map(PipelineKey::new).to_vec()
}
