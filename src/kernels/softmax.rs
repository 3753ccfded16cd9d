//! Row softmax with logsumexp (`shaders/softmax.wgsl`).

use crate::device::buffer;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::Result;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// The value the mask kernel writes for a masked score (`-f32::MAX`); the
/// softmax treats anything at or below it as masked.
pub const MASKED: f32 = -f32::MAX;

/// Invocations per workgroup (one workgroup per row); matches the WGSL.
pub const WORKGROUP: u32 = 128;
/// Workgroup memory: a running max and sum per invocation.
pub const WORKGROUP_BYTES: u32 = 2 * 4 * WORKGROUP;

crate::shader::uniform::uniform_block! {
    pub(crate) struct Params {
        rows: u32,
        cols: u32,
        /// Index in `lse` of this dispatch's first row.
        lse_offset: u32,
        /// MODE_ZERO, MODE_MARKED or MODE_CLEAR.
        mode: u32,
        /// 1 / temperature: the exponents' divisor (1 for a plain softmax).
        inv_temperature: f32,
        _pad: [u32; 3],
    }
}

/// What the softmax writes for a key its row does not attend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotAttended {
    /// `+0`: probabilities the caller reads.
    Zero,
    /// `-0`: the mark the `P · V` GEMM with `SKIP_MARKED_A` skips, so that a
    /// key not attended never multiplies its V row while an attended key whose
    /// probability is `+0` still does (`0 · inf` is NaN, as in PyTorch). Clear
    /// the marks with [`record_clear_marks`] before the caller reads the rows.
    Marked,
}

const MODE_ZERO: u32 = 0;
const MODE_MARKED: u32 = 1;
const MODE_CLEAR: u32 = 2;

/// The pipeline key.
pub fn key() -> PipelineKey {
    PipelineKey::new(crate::kernels::softmax::SOFTMAX)
}

/// Replaces each of `rows` rows of `cols` scores (from element 0 of `scores`)
/// by its softmax at the temperature `1 / inv_temperature` (the scores are
/// divided only after the row maximum is taken out) and writes the row's
/// logsumexp at `lse[lse_offset + row]`; a key the row does not attend gets
/// `not_attended`'s value.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    rows: usize,
    cols: usize,
    scores: &wgpu::Buffer,
    lse: &wgpu::Buffer,
    lse_offset: usize,
    not_attended: NotAttended,
    inv_temperature: f32,
) -> Result<()> {
    let mode = match not_attended {
        NotAttended::Zero => MODE_ZERO,
        NotAttended::Marked => MODE_MARKED,
    };
    dispatch(
        rec,
        rows,
        cols,
        scores,
        lse,
        lse_offset,
        mode,
        inv_temperature,
    )
}

/// Rewrites the `-0` marks ([`NotAttended::Marked`]) in `rows` rows of `cols`
/// probabilities as `+0`; `lse` is bound but untouched.
pub(crate) fn record_clear_marks(
    rec: &mut Recorder<'_>,
    rows: usize,
    cols: usize,
    probabilities: &wgpu::Buffer,
    lse: &wgpu::Buffer,
) -> Result<()> {
    dispatch(rec, rows, cols, probabilities, lse, 0, MODE_CLEAR, 1.0)
}

#[allow(clippy::too_many_arguments)]
fn dispatch(
    rec: &mut Recorder<'_>,
    rows: usize,
    cols: usize,
    scores: &wgpu::Buffer,
    lse: &wgpu::Buffer,
    lse_offset: usize,
    mode: u32,
    inv_temperature: f32,
) -> Result<()> {
    let params = Params {
        rows: rows as u32,
        cols: cols as u32,
        lse_offset: lse_offset as u32,
        mode,
        inv_temperature,
        _pad: [0; 3],
    };
    let ctx = rec.ctx();
    let pipeline = ctx.pipelines.get(&key());
    let uniform = buffer::uniform(ctx, "softmax params", &params);
    rec.dispatch(&pipeline, &[&uniform, scores, lse], rows as u64)
}

/// Row softmax with logsumexp (`shaders/softmax.wgsl`).
pub const SOFTMAX: Kernel = Kernel::new(&KernelDef {
    name: "softmax",
    origin: Origin::File("softmax.wgsl", include_str!("../../shaders/softmax.wgsl")),
    slots: &[],
    bindings: &[Binding::Uniform, Binding::ReadWrite, Binding::ReadWrite],
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 1] = [SOFTMAX];

/// The family's pipelines (no override constants).
pub fn variants() -> Vec<PipelineKey> {
    [SOFTMAX].map(PipelineKey::new).to_vec()
}
