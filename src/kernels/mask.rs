//! Softcap, mask and bias of score rows (`shaders/mask.wgsl`).

use crate::device::buffer;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::Result;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

use crate::kernels::attention::rules::Rules;
use crate::options::{AttentionOptions, QkMatmulOutputMode};
use crate::problem::AttentionDims;

/// Invocations per workgroup (one workgroup per score row); matches the WGSL.
pub const WORKGROUP: u32 = 128;

crate::shader::uniform::uniform_block! {
    pub(crate) struct Params {
        rows: u32,
        /// Keys: the score rows' length.
        keys: u32,
        row_base: u32,
        q_len: u32,
        q_heads: u32,
        flags: u32,
        mask_cols: u32,
        past_len: u32,
        mask_batch_stride: u32,
        mask_head_stride: u32,
        mask_row_stride: u32,
        capture: u32,
        left_window: i32,
        right_window: i32,
        softcap: f32,
        batch: u32,
        /// The factor on the scores read: 1, the GEMM applied the call's
        /// scale (shaders/attention_score.wgsl's rules take it).
        scale: f32,
        /// Added to every query's position (a piece of a call split across bindings).
        position_shift: i32,
        _pad: u32,
    }
}

/// The pipeline key.
pub fn key() -> PipelineKey {
    PipelineKey::new(crate::kernels::mask::MASK)
}

/// The buffers the mask kernel reads besides the scores.
pub(crate) struct MaskBuffers<'a> {
    /// The additive mask (masked entries hold `MASKED`), or a placeholder.
    pub mask: &'a wgpu::Buffer,
    /// The rule data: `nonpad_kv_seqlen` as i32 (B words, zeros when absent),
    /// then with ALiBi the query heads' slopes as f32 bits.
    pub nonpad: &'a wgpu::Buffer,
    /// Where modes 0-2 of `qk_matmul_output` are captured, or a placeholder.
    pub qk_out: &'a wgpu::Buffer,
}

/// Applies softcap, mask and bias to `rows` score rows starting at global row
/// `row_base` of `[B·Hq·Nq, T]`; the scores hold only these rows.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
    row_base: usize,
    rows: usize,
    scores: &wgpu::Buffer,
    buffers: &MaskBuffers<'_>,
) -> Result<()> {
    let capture = match options.qk_matmul_output_mode {
        Some(QkMatmulOutputMode::Scaled) => 1,
        Some(QkMatmulOutputMode::Softcapped) => 2,
        Some(QkMatmulOutputMode::Biased) => 3,
        Some(QkMatmulOutputMode::Probabilities) | None => 0,
    };
    let rules = Rules::new(dims, options);
    let layout = rules.mask;
    let params = Params {
        rows: rows as u32,
        keys: dims.total_len() as u32,
        row_base: row_base as u32,
        q_len: dims.q_len as u32,
        q_heads: dims.q_heads as u32,
        flags: rules.flags,
        mask_cols: layout.cols as u32,
        past_len: rules.past_len,
        mask_batch_stride: layout.batch_stride as u32,
        mask_head_stride: layout.head_stride as u32,
        mask_row_stride: layout.row_stride as u32,
        capture,
        left_window: rules.left_window,
        right_window: rules.right_window,
        softcap: rules.softcap,
        batch: dims.batch as u32,
        scale: 1.0,
        position_shift: rules.position_shift,
        _pad: 0,
    };
    let ctx = rec.ctx();
    let pipeline = ctx.pipelines.get(&key());
    let uniform = buffer::uniform(ctx, "mask params", &params);
    rec.dispatch(
        &pipeline,
        &[
            &uniform,
            scores,
            buffers.mask,
            buffers.nonpad,
            buffers.qk_out,
        ],
        rows as u64,
    )
}

/// Softcap, mask and bias of score rows (`shaders/mask.wgsl`).
pub const MASK: Kernel = Kernel::new(&KernelDef {
    name: "mask",
    origin: Origin::File("mask.wgsl", include_str!("../../shaders/mask.wgsl")),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::ReadWrite,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 1] = [MASK];

/// The family's pipelines (no override constants).
pub fn variants() -> Vec<PipelineKey> {
    [MASK].map(PipelineKey::new).to_vec()
}
