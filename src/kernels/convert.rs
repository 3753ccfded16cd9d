//! Conversion between f32 tensors and f16 tensors stored as packed words
//! (`shaders/convert_f16.wgsl`): f16 inputs are widened for the kernels that
//! read f32, and f32 results narrowed where the caller's tensors are f16;
//! bfloat16 uploads are widened to f32 on the device.

use crate::device::buffer;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::Result;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Invocations per workgroup (one u32 word, two elements, each); matches the WGSL.
pub const WORKGROUP: usize = 256;

crate::shader::uniform::uniform_block! {
    pub(crate) struct Params {
        /// Elements (f16 and f32 alike).
        len: u32,
        _pad: [u32; 3],
    }
}

/// Which way a conversion goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// f16 words to f32 values (exact).
    Widen,
    /// f32 values to f16 words (rounded to nearest even).
    Narrow,
    /// bfloat16 words to f32 values (exact: a shift).
    WidenBf16,
}

/// The pipeline key.
pub fn key(direction: Direction) -> PipelineKey {
    PipelineKey::new(crate::kernels::convert::CONVERT_F16)
        .with_flag("NARROW", direction == Direction::Narrow)
        .with_flag("BFLOAT16", direction == Direction::WidenBf16)
}

/// Converts the first `len` elements of `src` into `dst`. Tensors larger than
/// one storage binding are converted a slice at a time through scratch
/// buffers that fit one.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    direction: Direction,
    src: &wgpu::Buffer,
    dst: &wgpu::Buffer,
    len: usize,
) -> Result<()> {
    let ctx = rec.ctx();
    let limit = ctx.caps.limits.max_storage_buffer_binding_size;
    if src.size() <= limit && dst.size() <= limit {
        return dispatch(rec, direction, src, dst, len);
    }
    // Elements per slice: even (whole words on the f16 side), f32 side within a binding.
    let slice = ((limit / 4) as usize & !1).max(2);
    let (src_len, dst_len) = match direction {
        Direction::Widen | Direction::WidenBf16 => (slice / 2, slice),
        Direction::Narrow => (slice, slice / 2),
    };
    let scratch_src = buffer::storage(ctx, "conversion source slice", src_len)?;
    let scratch_dst = buffer::storage(ctx, "conversion result slice", dst_len)?;
    let mut first = 0;
    while first < len {
        let n = slice.min(len - first);
        let (src_at, src_n, dst_at, dst_n) = match direction {
            Direction::Widen | Direction::WidenBf16 => (first / 2, n.div_ceil(2), first, n),
            Direction::Narrow => (first, n, first / 2, n.div_ceil(2)),
        };
        rec.copy(src, src_at, &scratch_src, 0, src_n);
        dispatch(rec, direction, &scratch_src, &scratch_dst, n)?;
        rec.copy(&scratch_dst, 0, dst, dst_at, dst_n);
        first += n;
    }
    Ok(())
}

fn dispatch(
    rec: &mut Recorder<'_>,
    direction: Direction,
    src: &wgpu::Buffer,
    dst: &wgpu::Buffer,
    len: usize,
) -> Result<()> {
    let ctx = rec.ctx();
    let pipeline = ctx.pipelines.get(&key(direction));
    let params = Params {
        len: len as u32,
        _pad: [0; 3],
    };
    let uniform = buffer::uniform(ctx, "conversion params", &params);
    let words = len.div_ceil(2);
    rec.dispatch(
        &pipeline,
        &[&uniform, src, dst],
        words.div_ceil(WORKGROUP) as u64,
    )
}

/// Widens f16 (or bfloat16) tensors to f32, or narrows f32 to f16 (`shaders/convert_f16.wgsl`).
pub const CONVERT_F16: Kernel = Kernel::new(&KernelDef {
    name: "convert_f16",
    origin: Origin::File(
        "convert_f16.wgsl",
        include_str!("../../shaders/convert_f16.wgsl"),
    ),
    slots: &[],
    bindings: &[Binding::Uniform, Binding::Read, Binding::ReadWrite],
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 1] = [CONVERT_F16];

/// The family's pipelines: each direction.
pub fn variants() -> Vec<PipelineKey> {
    [Direction::Widen, Direction::Narrow, Direction::WidenBf16]
        .map(key)
        .to_vec()
}
