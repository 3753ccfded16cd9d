//! f16 tensors on the GPU: stored two values to a u32 word, computed in f32.
//!
//! The decode kernel reads f16 keys and values in place (`attention_decode_f16`),
//! halving the bytes a token step streams, where the plan says so
//! (`plan::KvRead`). Every other kernel reads f32, so for those calls f16
//! inputs are widened into f32 scratch first; outputs that
//! ONNX types as an f16 input (Y and the scores as Q, the presents as K and V)
//! are narrowed back to f16 at the end. Widening is exact and narrowing rounds
//! to nearest even, so every path returns the same f16-rounded results.

use crate::device::buffer;
use crate::device::recorder::Recorder;
use crate::device::scope::Run;
use crate::error::Result;
use crate::kernels::convert;
use crate::kernels::convert::Direction;

/// An f32 copy of the `len` f16 values in `src`.
pub(crate) async fn widen(ctx: &Run, src: &wgpu::Buffer, len: usize) -> Result<wgpu::Buffer> {
    convert_scoped(ctx, Direction::Widen, src, len).await
}

/// An f32 copy of the `len` bfloat16 values in `src` (packed two to a word).
pub(crate) async fn widen_bf16(ctx: &Run, src: &wgpu::Buffer, len: usize) -> Result<wgpu::Buffer> {
    convert_scoped(ctx, Direction::WidenBf16, src, len).await
}

/// An f16 copy of the `len` f32 values in `src`, rounded to nearest even.
pub(crate) async fn narrow(ctx: &Run, src: &wgpu::Buffer, len: usize) -> Result<wgpu::Buffer> {
    convert_scoped(ctx, Direction::Narrow, src, len).await
}

async fn convert_scoped(
    ctx: &Run,
    direction: Direction,
    src: &wgpu::Buffer,
    len: usize,
) -> Result<wgpu::Buffer> {
    let what = match direction {
        Direction::Widen => "widening an f16 tensor",
        Direction::WidenBf16 => "widening a bfloat16 tensor",
        Direction::Narrow => "narrowing to f16",
    };
    ctx.scoped(what, || {
        let dst = match direction {
            Direction::Widen | Direction::WidenBf16 => {
                buffer::tensor_storage(ctx, "widened tensor", len)?
            }
            Direction::Narrow => buffer::f16_tensor_storage(ctx, "f16 tensor", len)?,
        };
        let mut rec = Recorder::new(ctx, what);
        convert::record(&mut rec, direction, src, &dst, len)?;
        rec.submit();
        Ok(dst)
    })
    .await
}
