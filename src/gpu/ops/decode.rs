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

/// The most query rows per head the decode kernel takes (speculative decoding,
/// small prefill chunks).
pub const MAX_QUERY_ROWS: usize = 16;
/// The most rows one workgroup serves (query heads of one KV head x their rows).
pub const MAX_WORKGROUP_ROWS: usize = 16;
/// Keys from which a few query rows go to the decode kernel instead of the fused one.
pub const MIN_KEYS: usize = 512;
/// Keys per tile (one per invocation).
const TILE: usize = 64;
/// vec4 columns of K per staged slice (the kernel's DS).
const SLICE: usize = 4;
/// Workgroups to aim for: on a GPU enough to keep every SM streaming (an H100
/// holds over 2000 workgroups of 64 at once); on a CPU adapter a few per core,
/// since each split costs a merge.
const TARGET_WORKGROUPS_GPU: usize = 2048;
const TARGET_WORKGROUPS_CPU: usize = 128;

/// How the keys are split across workgroups, and how many query heads of a
/// KV head each workgroup serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    /// Splits per workgroup's heads.
    pub splits: usize,
    /// Keys per split (a multiple of the 64-key tile).
    pub split_keys: usize,
    /// Query heads per workgroup: the largest divisor of the GQA group whose
    /// rows (heads x Nq) fit [`MAX_WORKGROUP_ROWS`], so K and V are read once
    /// for all of them.
    pub heads_per_workgroup: usize,
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

    /// Splits enough to fill the device and, on drivers that cap an
    /// invocation's loop iterations, small enough to stay under the cap.
    pub fn new(dims: &AttentionDims, caps: &Capabilities) -> DecodePlan {
        let keys = dims.total_len();
        let group = dims.group();
        let heads_per_workgroup = (1..=group)
            .rev()
            .find(|h| group % h == 0 && h * dims.q_len <= MAX_WORKGROUP_ROWS)
            .unwrap_or(1);
        let rows = heads_per_workgroup * dims.q_len;
        let workgroup_heads = dims.batch * dims.q_heads / heads_per_workgroup;
        let (dk4, dv4) = (dims.head_dim.div_ceil(4), dims.v_head_dim.div_ceil(4));
        let key_groups = (TILE / dv4.max(1)).max(1);
        // Loop iterations per invocation per tile: K and Q slices and the dot
        // products, the rules, the two scans and combinations, P V.
        let per_tile = (dk4.div_ceil(SLICE) * (SLICE + 2 + SLICE * (1 + rows))
            + rows
            + 2 * (TILE / 4 + rows * 5)
            + TILE.div_ceil(key_groups) * (1 + rows)
            + 16) as u64;
        let max_split_keys = match caps.loop_budget() {
            Some(budget) => {
                ((budget.saturating_sub(64 + 4 * rows as u64) / per_tile).max(1) as usize) * TILE
            }
            None => keys,
        };
        let target = if caps.adapter.device_type == "Cpu" {
            TARGET_WORKGROUPS_CPU
        } else {
            TARGET_WORKGROUPS_GPU
        };
        let for_cap = keys.div_ceil(max_split_keys);
        let for_parallelism = target.div_ceil(workgroup_heads);
        let splits = for_cap.max(for_parallelism).min(keys.div_ceil(TILE)).max(1);
        let split_keys = keys.div_ceil(splits).div_ceil(TILE) * TILE;
        DecodePlan {
            splits: keys.div_ceil(split_keys),
            split_keys,
            heads_per_workgroup,
        }
    }

    /// The decode kernel's pipeline key for `dims` (its rows per workgroup),
    /// reading K and V as f16 when `kv_f16`.
    pub fn key(&self, dims: &AttentionDims, kv_f16: bool) -> PipelineKey {
        let kernel = if kv_f16 {
            Kernel::AttentionDecodeF16
        } else {
            Kernel::AttentionDecode
        };
        PipelineKey::new(kernel).with("ROWS", (self.heads_per_workgroup * dims.q_len) as i64)
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
        &params(dims, options, plan.splits as u32, plan.split_keys as u32)
            .with_extra3(plan.heads_per_workgroup as u32),
    );
    let pipeline = ctx.pipelines.get(&plan.key(dims, inputs.kv_f16));
    rec.dispatch_segments(
        &pipeline,
        &[
            (&uniform).into(),
            inputs.q,
            inputs.k,
            inputs.v,
            inputs.mask.into(),
            inputs.nonpad.into(),
            (&part_o).into(),
            (&part_ml).into(),
        ],
        (heads / plan.heads_per_workgroup * plan.splits) as u64,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(device_type: &str) -> Capabilities {
        Capabilities::synthetic(device_type)
    }

    fn dims(
        batch: usize,
        q_heads: usize,
        kv_heads: usize,
        q_len: usize,
        keys: usize,
    ) -> AttentionDims {
        AttentionDims {
            batch,
            q_heads,
            kv_heads,
            q_len,
            kv_len: keys,
            past_len: 0,
            head_dim: 128,
            v_head_dim: 128,
            mask: None,
            has_past: false,
            has_nonpad: false,
            placement: Default::default(),
        }
    }

    #[test]
    fn the_query_heads_of_a_kv_head_share_a_workgroup_up_to_16_rows() {
        let gpu = caps("DiscreteGpu");
        let heads =
            |hq, hkv, nq| DecodePlan::new(&dims(1, hq, hkv, nq, 4096), &gpu).heads_per_workgroup;
        assert_eq!(heads(32, 8, 1), 4);
        assert_eq!(heads(32, 8, 4), 4);
        assert_eq!(heads(32, 4, 3), 4); // group 8: 8 x 3 rows is too many, 4 x 3 fits
        assert_eq!(heads(32, 32, 1), 1);
        assert_eq!(heads(8, 1, 16), 1);
    }

    #[test]
    fn a_gpu_gets_enough_workgroups_and_a_cpu_adapter_few() {
        let d = dims(8, 32, 32, 1, 4096);
        let gpu = DecodePlan::new(&d, &caps("DiscreteGpu"));
        assert!(256 * gpu.splits >= TARGET_WORKGROUPS_GPU, "{gpu:?}");
        assert_eq!(gpu.split_keys % TILE, 0);
        let cpu = DecodePlan::new(&d, &caps("Cpu"));
        assert_eq!(cpu.splits, 1);
        // Never more splits than tiles.
        let short = DecodePlan::new(&dims(1, 1, 1, 1, 600), &caps("DiscreteGpu"));
        assert_eq!(short.splits, 600usize.div_ceil(TILE));
        assert!(DecodePlan::applies(&dims(1, 1, 1, 16, 600)));
        assert!(!DecodePlan::applies(&dims(1, 1, 1, 17, 600)));
    }
}
