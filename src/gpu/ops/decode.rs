//! Split-K decode (`shaders/attention_decode.wgsl`) and the merge of its
//! partial results (`shaders/attention_merge.wgsl`).

use bytemuck::{Pod, Zeroable};

use super::fused::{params, AttentionBuffers};
use crate::error::Result;
use crate::gpu::buffer;
use crate::gpu::capabilities::Capabilities;
use crate::gpu::pipeline::PipelineKey;
use crate::gpu::recorder::Recorder;
use crate::gpu::registry::Kernel;
use crate::options::AttentionOptions;
use crate::problem::AttentionDims;

/// The most query rows per head the decode kernel takes.
pub const MAX_QUERY_ROWS: usize = 4;
/// Keys from which a few query rows go to the decode kernel instead of the fused one.
pub const MIN_KEYS: usize = 512;
/// Keys per tile (one per invocation).
const TILE: usize = 64;
/// Workgroups to aim for, so every core (or SM) has splits to work on.
const TARGET_WORKGROUPS: usize = 128;

/// How the keys are split across workgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    /// Splits per head.
    pub splits: usize,
    /// Keys per split (a multiple of the 64-key tile).
    pub split_keys: usize,
}

impl DecodePlan {
    /// Whether a problem goes to the decode kernel: a few query rows, many
    /// keys, head dims that are multiples of 4 (read as vec4s), up to 256.
    pub fn applies(dims: &AttentionDims) -> bool {
        dims.q_len <= MAX_QUERY_ROWS
            && dims.total_len() >= MIN_KEYS
            && dims.head_dim % 4 == 0
            && dims.v_head_dim % 4 == 0
            && dims.head_dim.max(dims.v_head_dim) <= super::fused::MAX_HEAD_DIM
    }

    /// Splits enough for parallelism and, on drivers that cap an invocation's
    /// loop iterations, small enough to stay under the cap.
    pub fn new(dims: &AttentionDims, caps: &Capabilities) -> DecodePlan {
        let keys = dims.total_len();
        let heads = dims.batch * dims.q_heads;
        let dk4 = dims.head_dim.div_ceil(4);
        // Loop iterations per invocation per tile: scores, two reductions of
        // 6 steps over the rows, P V over the tile's keys for 4 quads.
        let per_tile =
            (MAX_QUERY_ROWS * (dk4 + 1) + 2 * 6 * (MAX_QUERY_ROWS + 1) + 4 * TILE + 16) as u64;
        let max_split_keys = match caps.loop_budget() {
            Some(budget) => ((budget / per_tile).max(1) as usize) * TILE,
            None => keys,
        };
        let for_cap = keys.div_ceil(max_split_keys);
        let for_parallelism = TARGET_WORKGROUPS.div_ceil(heads);
        let splits = for_cap.max(for_parallelism).min(keys.div_ceil(TILE)).max(1);
        let split_keys = keys.div_ceil(splits).div_ceil(TILE) * TILE;
        DecodePlan {
            splits: keys.div_ceil(split_keys),
            split_keys,
        }
    }

    /// Device memory of the partial results, in f32 values.
    pub fn partial_values(&self, dims: &AttentionDims) -> usize {
        let rows = dims.batch * dims.q_heads * dims.q_len;
        self.splits * rows * (dims.v_head_dim.div_ceil(4) * 4 + 4)
    }
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct MergeParams {
    rows: u32,
    dv: u32,
    splits: u32,
    _pad: u32,
}

/// Records the split-K decode and the merge into `y` and `stats` ([lse | m | l]).
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
    plan: &DecodePlan,
    inputs: &AttentionBuffers<'_>,
    y: &wgpu::Buffer,
    stats: &wgpu::Buffer,
) -> Result<()> {
    let ctx = rec.ctx();
    let heads = dims.batch * dims.q_heads;
    let rows = heads * dims.q_len;
    let part_o = buffer::storage(
        ctx,
        "decode partial O",
        plan.splits * rows * dims.v_head_dim.div_ceil(4) * 4,
    )?;
    // (m, l, flags, 0) per split and row.
    let part_ml = buffer::storage(ctx, "decode partial (m, l)", plan.splits * rows * 4)?;
    let uniform = buffer::uniform(
        ctx,
        "decode params",
        &params(dims, options, plan.splits as u32, plan.split_keys as u32),
    );
    let pipeline = ctx
        .pipelines
        .get(&PipelineKey::new(Kernel::AttentionDecode));
    rec.dispatch(
        &pipeline,
        &[
            &uniform,
            inputs.q,
            inputs.k,
            inputs.v,
            inputs.mask,
            inputs.nonpad,
            &part_o,
            &part_ml,
        ],
        (heads * plan.splits) as u64,
    )?;
    let merge_params = MergeParams {
        rows: rows as u32,
        dv: dims.v_head_dim as u32,
        splits: plan.splits as u32,
        _pad: 0,
    };
    let uniform = buffer::uniform(ctx, "merge params", &merge_params);
    let pipeline = ctx.pipelines.get(&PipelineKey::new(Kernel::AttentionMerge));
    rec.dispatch(
        &pipeline,
        &[&uniform, &part_o, &part_ml, y, stats],
        rows as u64,
    )
}
