//! Additive (Bahdanau) attention scores from projected states
//! (`shaders/additive_scores.wgsl`).
//!
//! `e[b, i, j] = scale · Σ_a v[a] · tanh(A[b, i, a] + Bm[b, j, a])`, with keys
//! `j >= lengths[b]` written as [`MASKED`](crate::kernels::softmax::MASKED). A and Bm
//! come from the GEMM; the `[Nq, Nk, d_a]` tensor of sums is never stored.

use crate::device::buffer;
use crate::device::capabilities::Capabilities;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::{Error, Result};
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Scores per workgroup side: one workgroup computes `TILE × TILE` scores.
pub const TILE: usize = 8;
/// Values of `a` staged in workgroup memory at a time.
pub const CHUNK: usize = 32;
/// Invocations per workgroup (one per score of the tile); matches the WGSL.
pub const WORKGROUP: u32 = (TILE * TILE) as u32;
/// Workgroup memory: `TILE` rows of A and of Bm, `CHUNK` values each.
pub const WORKGROUP_BYTES: u32 = (2 * 4 * TILE * CHUNK) as u32;

crate::shader::uniform::uniform_block! {
    pub(crate) struct Params {
        batch: u32,
        q_len: u32,
        k_len: u32,
        d_a: u32,
        tiles_q: u32,
        tiles_k: u32,
        scale: f32,
        _pad: u32,
    }
}

/// The sizes of one additive score computation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdditiveSpec {
    /// Batch entries B.
    pub batch: usize,
    /// Query (decoder) rows per batch entry, Nq.
    pub q_len: usize,
    /// Key (encoder) rows per batch entry, Nk.
    pub k_len: usize,
    /// The attention dimension d_a (row length of A and Bm, length of v).
    pub d_a: usize,
    /// Multiplies every score (1 for Bahdanau and Luong).
    pub scale: f32,
}

impl AdditiveSpec {
    /// Loop iterations one invocation runs: per slice of `a`, one of the slice
    /// loop, `TILE · CHUNK / WORKGROUP` staging the tiles and `CHUNK` summing.
    pub fn loop_iterations(&self) -> u64 {
        let per_chunk = 1 + (TILE * CHUNK) as u64 / u64::from(WORKGROUP) + CHUNK as u64;
        self.d_a.div_ceil(CHUNK) as u64 * per_chunk
    }

    /// Checks the sizes against 32-bit indexing and the driver's loop budget.
    pub fn check(&self, caps: &Capabilities) -> Result<()> {
        if self.batch == 0 || self.q_len == 0 || self.k_len == 0 || self.d_a == 0 {
            return Err(Error::InvalidOption {
                name: "additive scores",
                value: format!("{self:?}"),
                reason: "batch, q_len, k_len and d_a must be at least 1",
            });
        }
        let elements = |x: usize, y: usize| self.batch.checked_mul(x)?.checked_mul(y);
        let largest = [
            elements(self.q_len, self.d_a),
            elements(self.k_len, self.d_a),
            elements(self.q_len, self.k_len),
        ]
        .into_iter()
        .try_fold(0, |m, x| x.map(|x| x.max(m)));
        if largest.is_none_or(|x| x > u32::MAX as usize) {
            return Err(Error::Limit {
                what: format!(
                    "additive scores for B = {}, Nq = {}, Nk = {}, d_a = {}",
                    self.batch, self.q_len, self.k_len, self.d_a
                ),
                needed: largest.unwrap_or(usize::MAX) as u64,
                limit: u64::from(u32::MAX),
                limit_name: "32-bit element indices",
                hint: "split the batch across calls",
            });
        }
        if let Some(budget) = caps.loop_budget() {
            let needed = self.loop_iterations();
            if needed > budget {
                return Err(Error::Limit {
                    what: format!(
                        "additive scores with attention dimension d_a = {}",
                        self.d_a
                    ),
                    needed,
                    limit: budget,
                    limit_name: "loop iterations per invocation (llvmpipe)",
                    hint: "use a smaller attention dimension on this driver",
                });
            }
        }
        Ok(())
    }

    /// Workgroups of the dispatch.
    pub fn workgroups(&self) -> u64 {
        (self.batch * self.q_len.div_ceil(TILE) * self.k_len.div_ceil(TILE)) as u64
    }
}

/// The pipeline key.
pub fn key() -> PipelineKey {
    PipelineKey::new(crate::kernels::additive::ADDITIVE_SCORES)
}

/// Writes the `[B, Nq, Nk]` scores for `a_proj` (`[B·Nq, d_a]`) and `b_proj`
/// (`[B·Nk, d_a]`), both packed; `lengths` holds B u32 key counts (at most Nk).
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    spec: &AdditiveSpec,
    a_proj: &wgpu::Buffer,
    b_proj: &wgpu::Buffer,
    v: &wgpu::Buffer,
    lengths: &wgpu::Buffer,
    scores: &wgpu::Buffer,
) -> Result<()> {
    let ctx = rec.ctx();
    spec.check(&ctx.caps)?;
    let u = |x: usize| x as u32;
    let params = Params {
        batch: u(spec.batch),
        q_len: u(spec.q_len),
        k_len: u(spec.k_len),
        d_a: u(spec.d_a),
        tiles_q: u(spec.q_len.div_ceil(TILE)),
        tiles_k: u(spec.k_len.div_ceil(TILE)),
        scale: spec.scale,
        _pad: 0,
    };
    let pipeline = ctx.pipelines.get(&key());
    let uniform = buffer::uniform(ctx, "additive scores params", &params);
    rec.dispatch(
        &pipeline,
        &[&uniform, a_proj, b_proj, v, lengths, scores],
        spec.workgroups(),
    )
}

/// Additive (Bahdanau) scores `vᵀ tanh(A_i + B_j)` from projected states, with source padding (`shaders/additive_scores.wgsl`).
pub const ADDITIVE_SCORES: Kernel = Kernel::new(&KernelDef {
    name: "additive_scores",
    origin: Origin::File(
        "additive_scores.wgsl",
        include_str!("../../shaders/additive_scores.wgsl"),
    ),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 1] = [ADDITIVE_SCORES];

/// The family's pipelines (no override constants).
pub fn variants() -> Vec<PipelineKey> {
    [ADDITIVE_SCORES].map(PipelineKey::new).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's geometry must be the shader's.
    #[test]
    fn geometry_matches_the_shader() {
        let src = crate::kernels::additive::ADDITIVE_SCORES.source();
        assert!(src.contains(&format!("const TILE: u32 = {TILE}u;")));
        assert!(src.contains(&format!("const CHUNK: u32 = {CHUNK}u;")));
        assert!(src.contains(&format!("const WG: u32 = {WORKGROUP}u;")));
        assert!(src.contains(&format!("@workgroup_size({TILE}, {TILE}, 1)")));
        assert!(src.contains(&format!("array<f32, {}>", TILE * CHUNK)));
    }

    #[test]
    fn loop_iterations_grow_per_slice() {
        let spec = |d_a| AdditiveSpec {
            batch: 1,
            q_len: 1,
            k_len: 1,
            d_a,
            scale: 1.0,
        };
        assert_eq!(spec(1).loop_iterations(), 37);
        assert_eq!(spec(32).loop_iterations(), 37);
        assert_eq!(spec(33).loop_iterations(), 74);
    }
}
