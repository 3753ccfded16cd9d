//! Split-K decode, staged (`shaders/attention_decode.wgsl`) or streaming
//! (`kernels/decode/stream.rs`: `attention_decode_stream`), and the merge of its
//! partial
//! results (`shaders/attention_merge.wgsl`).

pub mod paged;
pub(crate) mod stream;

use crate::device::buffer;
use crate::device::capabilities::Capabilities;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::Result;
use crate::kernels::attention::rules::Rules;
use crate::kernels::attention::{params, AttentionBuffers};
use crate::options::AttentionOptions;
use crate::problem::AttentionDims;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// The most query rows per head the decode kernel takes (speculative decoding,
/// small prefill chunks).
pub const MAX_QUERY_ROWS: usize = 16;
/// The most rows one workgroup serves (query heads of one KV head x their rows).
pub const MAX_WORKGROUP_ROWS: usize = 16;
/// Rows per workgroup of the decode problem `webattn tune` times (one query
/// row per head, as many KV heads as query heads).
pub const TUNED_ROWS: usize = 1;
/// Rows per workgroup of the grouped decode problem `webattn tune` also
/// times: the query heads of a GQA group of 4, one row each (32 query heads
/// over 8 KV heads, as Llama's layers have).
pub const GROUPED_ROWS: usize = 4;
/// Keys from which a few query rows go to the decode kernel instead of the fused one.
pub const MIN_KEYS: usize = 512;
/// Keys per tile of the staged kernel (one per invocation); splits are
/// multiples of it.
const TILE: usize = 64;
/// Invocations per workgroup of the streaming kernel (its WG).
pub(crate) const STREAM_WORKGROUP: u32 = 128;
/// The streaming kernel's register budget: vec4s of Q (and of O) a lane holds
/// over the workgroup's rows, and of K (and of V) over a step's keys (its
/// MAX_BLOCK); and the most keys per step (MAX_KB).
pub(crate) const STREAM_BLOCK: usize = 16;
/// The most keys a team takes per step (the kernel's MAX_KB).
pub(crate) const STREAM_MAX_KEYS_PER_STEP: u32 = 4;
/// The untuned choice's register budget: vec4s of Q, O, K and V a lane
/// holds at once ([`StreamShape::registers`]). On RADV (gfx1100, `bash
/// .ci/shader-stats decode`) every shape at or under 24 compiled without
/// spilling (24 to 132 registers), and 20 of 22 above it spilled: 4 rows at
/// d 128 in teams of 8, two keys a step (48), spilled 152; in teams of 16
/// (24), none.
pub const STREAM_REGISTERS: usize = 24;
/// Lanes per key team of the streaming kernel: powers of two from 4 (at most
/// 32 teams, its MAX_TEAMS) to 32.
const STREAM_LANES: [u32; 4] = [4, 8, 16, 32];

/// The streaming decode kernel's shape: how many lanes of a subgroup share
/// a key (each holds every `lanes`-th vec4 column of the rows), and how many
/// consecutive keys a team takes per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamShape {
    /// Lanes per key team (4 to 32, a power of two).
    pub lanes: u32,
    /// Keys per team and step (1 to 4).
    pub keys_per_step: u32,
    /// Whether each lane loads its team's next step of K and V into a second
    /// set of registers while the current step is computed (the kernel's
    /// PREFETCH; only where both sets fit its register budget). Tried by
    /// `webattn tune`, never the untuned choice.
    pub prefetch: bool,
}

impl StreamShape {
    /// Every shape the kernel offers, in the order tried when none was
    /// measured: teams of 8 lanes first, two keys a step; then the same
    /// shapes prefetching the next step (not yet measured on a GPU: only
    /// `webattn tune` tries them).
    pub fn all() -> Vec<StreamShape> {
        let mut shapes = Vec::new();
        for prefetch in [false, true] {
            for keys_per_step in [2, 1, 4] {
                for lanes in [8, 16, 4, 32] {
                    shapes.push(StreamShape {
                        lanes,
                        keys_per_step,
                        prefetch,
                    });
                }
            }
        }
        shapes
    }

    /// Whether this shape runs `dims` on the adapter: lanes within its
    /// smallest subgroup, the rows' Q and O and a step's K and V within the
    /// register budget, the teams' O within its workgroup memory.
    pub fn fits(&self, dims: &AttentionDims, rows: usize, caps: &Capabilities) -> bool {
        caps.stream_decode_subgroups()
            && self.lanes <= caps.subgroup_min_size
            && self.holds(dims, rows)
            && self.workgroup_bytes(dims) <= caps.limits.max_compute_workgroup_storage_size as usize
            && STREAM_WORKGROUP <= caps.limits.max_compute_invocations_per_workgroup
    }

    /// Whether the kernel's registers hold `rows` rows at `dims`' head dims
    /// with this shape: a lane's columns of Q and O over the rows, and of K
    /// and V over a step's keys, within its register budget (the named
    /// registers it declares).
    pub fn holds(&self, dims: &AttentionDims, rows: usize) -> bool {
        // (The lanes first: a shape read from a corrupt cache may have none.)
        if !STREAM_LANES.contains(&self.lanes) {
            return false;
        }
        let (kt, vt) = self.columns(dims);
        let block = kt.max(vt);
        (1..=STREAM_MAX_KEYS_PER_STEP).contains(&self.keys_per_step)
            && (1..=MAX_WORKGROUP_ROWS).contains(&rows)
            && rows * block <= STREAM_BLOCK
            && self.keys_per_step as usize * block * (1 + usize::from(self.prefetch))
                <= STREAM_BLOCK
    }

    /// On a GPU, the first shape of [`StreamShape::all`] that fits within
    /// the register budget (teams of 8 lanes, two keys a step, where the
    /// rows allow), whether K and V are f32 or f16; where none is within it
    /// (many rows, or subgroups too narrow for the teams that would be), the
    /// first that fits; on a CPU adapter the first that fits. Never a
    /// prefetching one (those run where `webattn tune`
    /// measured them faster). Every lane of a team repeats its keys'
    /// softmax, so wider teams repeat more of it per byte: on an H200
    /// (BENCHMARKS.md, 2026-11-27) f16 K and V in teams of 16 took 2.4-3.7
    /// ms at B 8 x H 32 x 16k keys, the softmax 41-47% of it, where f32 in
    /// teams of 8, twice the bytes, took 1.1-3.5 ms. But a lane of a team of
    /// 8 holds a quarter of each row's Q and O, so for the 4 query heads of
    /// a GQA group at d 128 it would hold 48 vec4s and spill: teams of 16
    /// hold 24.
    pub fn choose(dims: &AttentionDims, rows: usize, caps: &Capabilities) -> Option<StreamShape> {
        let fitting = StreamShape::all()
            .into_iter()
            .filter(|s| s.fits(dims, rows, caps));
        if caps.adapter.device_type == "Cpu" {
            // A CPU adapter's "registers" are its compiler's vectors: the
            // budget is a GPU's, and lavapipe keeps the list's order.
            return fitting.into_iter().find(|s| !s.prefetch);
        }
        StreamShape::untuned(fitting, dims, rows)
    }

    /// The untuned pick on a GPU among `shapes` (in [`StreamShape::all`]'s
    /// order, each holding `rows` rows at `dims`): the first that does not
    /// prefetch within [`STREAM_REGISTERS`], else the first that does not
    /// prefetch.
    fn untuned(
        shapes: impl IntoIterator<Item = StreamShape>,
        dims: &AttentionDims,
        rows: usize,
    ) -> Option<StreamShape> {
        let plain: Vec<StreamShape> = shapes.into_iter().filter(|s| !s.prefetch).collect();
        plain
            .iter()
            .find(|s| s.registers(dims, rows) <= STREAM_REGISTERS)
            .or(plain.first())
            .copied()
    }

    /// Whether this shape, measured fastest by `webattn tune` on a decode
    /// problem of `measured_rows` rows per workgroup ([`TUNED_ROWS`], or
    /// [`GROUPED_ROWS`]), also suits a call with `rows` rows per workgroup on
    /// a GPU: where a lane's registers for them stay within the budget,
    /// within what it held when measured, or within what the untuned choice
    /// would hold. (The tuner measures one row; a
    /// lane of the same shape holds 4 rows' Q and O for a GQA group of 4,
    /// and teams of 8 at d 128 would spill: BENCHMARKS.md.) Always on a CPU
    /// adapter, which has no such budget.
    pub fn suits(
        &self,
        dims: &AttentionDims,
        rows: usize,
        measured_rows: usize,
        caps: &Capabilities,
    ) -> bool {
        if caps.adapter.device_type == "Cpu" {
            return true;
        }
        let untuned =
            StreamShape::choose(dims, rows, caps).map_or(usize::MAX, |s| s.registers(dims, rows));
        self.registers(dims, rows)
            <= STREAM_REGISTERS
                .max(self.registers(dims, measured_rows))
                .max(untuned)
    }

    /// vec4 registers a lane names for `rows` rows at `dims`: its columns of
    /// each row's Q and O, and of K and V for each key of a step (twice
    /// where it prefetches the next step).
    pub fn registers(&self, dims: &AttentionDims, rows: usize) -> usize {
        let (kt, vt) = self.columns(dims);
        let keys = self.keys_per_step as usize * (1 + usize::from(self.prefetch));
        (rows + keys) * (kt + vt)
    }

    /// vec4 columns of K and of V per lane.
    fn columns(&self, dims: &AttentionDims) -> (usize, usize) {
        let lanes = self.lanes as usize;
        (
            dims.head_dim.div_ceil(4).div_ceil(lanes),
            dims.v_head_dim.div_ceil(4).div_ceil(lanes),
        )
    }

    /// Workgroup memory the kernel declares at `dims`.
    pub fn workgroup_bytes(&self, dims: &AttentionDims) -> usize {
        let teams = (STREAM_WORKGROUP / self.lanes) as usize;
        let dv4 = dims.v_head_dim.div_ceil(4);
        // row_span, row_slope, team_ml, team_o, row_flags, the place counter,
        // the layout flag, nonpad.
        16 * 16 + 16 * 4 + 512 * 8 + teams * dv4 * 16 + 16 * 4 + 4 + 4 + 4
    }

    /// A short description, as pipeline labels and `webattn tune` show it.
    pub fn label(&self) -> String {
        format!(
            "attention_decode_stream[L={},KB={}{}]",
            self.lanes,
            self.keys_per_step,
            if self.prefetch { ",prefetch" } else { "" }
        )
    }
}

/// Which decode kernel a plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecodeKernel {
    /// `attention_decode`: 64 invocations stage 64-key tiles of K through
    /// workgroup memory; any adapter.
    Staged,
    /// `attention_decode_stream`: teams of subgroup lanes stream their own
    /// keys with no barrier in the key loop; adapters with subgroups.
    Stream(StreamShape),
}

impl DecodeKernel {
    /// The kernel's name, as `--decode-kernel` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            DecodeKernel::Staged => names::STAGED,
            DecodeKernel::Stream(_) => names::STREAM,
        }
    }

    /// The kernel with its shape, as `webattn tune` reports it.
    pub fn label(&self) -> String {
        match self {
            DecodeKernel::Staged => names::STAGED.to_string(),
            DecodeKernel::Stream(shape) => shape.label(),
        }
    }
}
/// vec4 columns of K per staged slice (the kernel's DS).
const SLICE: usize = 4;
/// Workgroups to aim for: on a GPU enough to keep every SM streaming (an H100
/// holds over 2000 workgroups of 64 at once); on a CPU adapter a few per core,
/// since each split costs a merge.
const TARGET_WORKGROUPS_GPU: usize = 2048;
const TARGET_WORKGROUPS_CPU: usize = 128;

/// How the keys are split across workgroups, how many query heads of a KV
/// head each workgroup serves, and which kernel runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLayout {
    /// The kernel.
    pub kernel: DecodeKernel,
    /// Splits per workgroup's heads.
    pub splits: usize,
    /// Keys per split (a multiple of the staged kernel's 64-key tile).
    pub split_keys: usize,
    /// Query heads per workgroup: the largest divisor of the GQA group whose
    /// rows (heads x Nq) fit [`MAX_WORKGROUP_ROWS`], so K and V are read once
    /// for all of them.
    pub heads_per_workgroup: usize,
}

impl DecodeLayout {
    /// Whether a problem goes to the decode kernel: a few query rows, many
    /// keys, head dims that are multiples of 4 (read as vec4s), up to 256.
    pub fn applies(dims: &AttentionDims) -> bool {
        dims.q_len <= MAX_QUERY_ROWS
            && dims.total_len() >= MIN_KEYS
            && dims.head_dim.is_multiple_of(4)
            && dims.v_head_dim.is_multiple_of(4)
            && dims.head_dim.max(dims.v_head_dim) <= crate::kernels::attention::MAX_HEAD_DIM
    }

    /// Query heads per workgroup: the largest divisor of the GQA group whose
    /// rows (heads x Nq) fit [`MAX_WORKGROUP_ROWS`].
    pub fn heads_per_workgroup(dims: &AttentionDims) -> usize {
        let group = dims.group();
        (1..=group)
            .rev()
            .find(|h| group.is_multiple_of(*h) && h * dims.q_len <= MAX_WORKGROUP_ROWS)
            .unwrap_or(1)
    }

    /// `kernel` where it runs `dims` here (a streaming shape must fit:
    /// [`StreamShape::fits`]), else the staged kernel.
    pub fn runnable(
        kernel: DecodeKernel,
        dims: &AttentionDims,
        caps: &Capabilities,
    ) -> DecodeKernel {
        let rows = Self::heads_per_workgroup(dims) * dims.q_len;
        match kernel {
            DecodeKernel::Stream(shape) if shape.fits(dims, rows, caps) => kernel,
            _ => DecodeKernel::Staged,
        }
    }

    /// Splits enough to fill the device and, on drivers that cap an
    /// invocation's loop iterations, small enough to stay under the cap;
    /// `kernel` where it runs `dims` here ([`DecodeLayout::runnable`]).
    pub fn new(dims: &AttentionDims, caps: &Capabilities, kernel: DecodeKernel) -> DecodeLayout {
        let kernel = Self::runnable(kernel, dims, caps);
        let keys = dims.total_len();
        let heads_per_workgroup = Self::heads_per_workgroup(dims);
        let rows = heads_per_workgroup * dims.q_len;
        let workgroup_heads = dims.batch * dims.q_heads / heads_per_workgroup;
        let (dk4, dv4) = (dims.head_dim.div_ceil(4), dims.v_head_dim.div_ceil(4));
        let key_groups = (TILE / dv4.max(1)).max(1);
        // Loop iterations per invocation per tile: K and Q slices and the dot
        // products, the rules, the two scans and combinations, P V.
        let per_tile = match kernel {
            DecodeKernel::Staged => {
                (dk4.div_ceil(SLICE) * (SLICE + 2 + SLICE * (1 + rows))
                    + rows
                    + 2 * (TILE / 4 + rows * 5)
                    + TILE.div_ceil(key_groups) * (1 + rows)
                    + 16) as u64
            }
            // One iteration per step of TEAMS * KB keys (the rest unrolled).
            DecodeKernel::Stream(shape) => {
                let per_step = (STREAM_WORKGROUP / shape.lanes * shape.keys_per_step) as usize;
                TILE.div_ceil(per_step) as u64
            }
        };
        // The end: the staged kernel's partial O's, or the streaming one's
        // merge of its teams (three loops over them per row).
        let end = match kernel {
            DecodeKernel::Staged => 64 + 4 * rows as u64,
            DecodeKernel::Stream(_) => 64 + 3 * 32 * rows as u64 + dv4 as u64,
        };
        let max_split_keys = match caps.loop_budget() {
            Some(budget) => ((budget.saturating_sub(end) / per_tile).max(1) as usize) * TILE,
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
        DecodeLayout {
            kernel,
            splits: keys.div_ceil(split_keys),
            split_keys,
            heads_per_workgroup,
        }
    }

    /// The decode kernel's pipeline key for `dims` (its rows per workgroup;
    /// the streaming kernel's shape and head dims), reading K and V as f16
    /// when `kv_f16`.
    pub fn key(&self, dims: &AttentionDims, kv_f16: bool) -> PipelineKey {
        let rows = (self.heads_per_workgroup * dims.q_len) as i64;
        match self.kernel {
            DecodeKernel::Staged => PipelineKey::new(if kv_f16 {
                crate::kernels::decode::ATTENTION_DECODE_F16
            } else {
                crate::kernels::decode::ATTENTION_DECODE
            })
            .with("ROWS", rows),
            DecodeKernel::Stream(shape) => stream_key(shape, dims, rows, kv_f16),
        }
    }

    /// Device memory of the partial results, in f32 values.
    pub fn partial_values(&self, dims: &AttentionDims) -> usize {
        let rows = dims.batch * dims.q_heads * dims.q_len;
        self.splits * rows * (dims.v_head_dim.div_ceil(4) * 4 + 4)
    }
}

/// The streaming kernel's pipeline for `rows` rows per workgroup at `dims`'
/// head dims.
pub fn stream_key(
    shape: StreamShape,
    dims: &AttentionDims,
    rows: i64,
    kv_f16: bool,
) -> PipelineKey {
    let kernel = if kv_f16 {
        crate::kernels::decode::stream::ATTENTION_DECODE_STREAM_F16
    } else {
        crate::kernels::decode::stream::ATTENTION_DECODE_STREAM
    };
    let (kt, vt) = shape.columns(dims);
    PipelineKey::new(kernel)
        .with("ROWS", rows)
        .with("L", shape.lanes as i64)
        .with("KB", shape.keys_per_step as i64)
        .with_flag("PREFETCH", shape.prefetch)
        .with("DK4", dims.head_dim.div_ceil(4) as i64)
        .with("DV4", dims.v_head_dim.div_ceil(4) as i64)
        .with("KT", kt as i64)
        .with("VT", vt as i64)
}

crate::shader::uniform::uniform_block! {
    pub(crate) struct MergeParams {
        rows: u32,
        dv: u32,
        splits: u32,
        /// 1 / temperature.
        inv_temperature: f32,
    }
}

/// Records the split-K decode and the merge into `y` and `stats` ([lse | m | l]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
    plan: &DecodeLayout,
    inputs: &AttentionBuffers<'_>,
    y: &wgpu::Buffer,
    stats: &wgpu::Buffer,
    phases: crate::kernels::ablation::Phases,
) -> Result<()> {
    record_reading(rec, dims, options, plan, inputs, None, [y, stats], phases)
}

/// [`record`], K and V read through `table` where a paged cache holds them
/// (the staged kernel's paged variant, [`paged`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_reading(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
    plan: &DecodeLayout,
    inputs: &AttentionBuffers<'_>,
    table: Option<&paged::BlockTable<'_>>,
    [y, stats]: [&wgpu::Buffer; 2],
    phases: crate::kernels::ablation::Phases,
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
    let kernel_key = match table {
        Some(table) => table.key(plan, dims),
        None => plan.key(dims, inputs.kv_f16),
    };
    let key = Rules::new(dims, options).specialise(kernel_key);
    let key = phases.key(key)?;
    let pipeline = ctx.pipelines.get(&key);
    let mut segments = vec![
        (&uniform).into(),
        inputs.q,
        inputs.k,
        inputs.v,
        inputs.mask.into(),
        inputs.nonpad.into(),
        (&part_o).into(),
        (&part_ml).into(),
    ];
    if let Some(table) = table {
        segments.push(table.pages.into());
    }
    rec.dispatch_segments(
        &pipeline,
        &segments,
        (heads / plan.heads_per_workgroup * plan.splits) as u64,
    )?;
    let merge_params = MergeParams {
        rows: rows as u32,
        dv: dims.v_head_dim as u32,
        splits: plan.splits as u32,
        inv_temperature: 1.0 / options.temperature,
    };
    let uniform = buffer::uniform(ctx, "merge params", &merge_params);
    let pipeline = ctx
        .pipelines
        .get(&PipelineKey::new(crate::kernels::decode::ATTENTION_MERGE));
    rec.dispatch(
        &pipeline,
        &[&uniform, &part_o, &part_ml, y, stats],
        rows as u64,
    )
}

/// Split-K decode attention for a few query rows, K staged per tile (`shaders/attention_decode.wgsl`).
pub const ATTENTION_DECODE: Kernel = Kernel::new(&KernelDef {
    name: names::STAGED,
    origin: Origin::File(
        "attention_decode.wgsl",
        include_str!("../../../shaders/attention_decode.wgsl"),
    ),
    slots: &[("ELEMENT", "element_f32.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<crate::kernels::attention::Params>()
        .named(crate::kernels::decode::DECODE_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});
/// The staged decode kernel reading K and V stored as f16.
pub const ATTENTION_DECODE_F16: Kernel = Kernel::new(&KernelDef {
    name: "attention_decode_f16",
    origin: Origin::File(
        "attention_decode.wgsl",
        include_str!("../../../shaders/attention_decode.wgsl"),
    ),
    slots: &[("ELEMENT", "element_f16.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<crate::kernels::attention::Params>()
        .named(crate::kernels::decode::DECODE_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});
/// Merges split-K partial results by their maxima (`shaders/attention_merge.wgsl`).
pub const ATTENTION_MERGE: Kernel = Kernel::new(&KernelDef {
    name: "attention_merge",
    origin: Origin::File(
        "attention_merge.wgsl",
        include_str!("../../../shaders/attention_merge.wgsl"),
    ),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<MergeParams>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// What the decode kernels call the words the attention kernels' parameter
/// block shares with other meanings: their WGSL `struct Params` names them so.
pub(crate) const DECODE_NAMES: &[(&str, &str)] = &[
    ("extra0", "splits"),
    ("extra2", "split_keys"),
    ("extra3", "heads_per_wg"),
];

/// The decode kernels' names, as `--decode-kernel`, `webattn info`, the
/// tuning table and the plans spell them.
pub mod names {
    /// The staged kernel (`shaders/attention_decode.wgsl`).
    pub const STAGED: &str = "attention_decode";
    /// The streaming kernel (`stream.rs`).
    pub const STREAM: &str = "attention_decode_stream";
}

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 8] = [
    ATTENTION_DECODE,
    ATTENTION_DECODE_F16,
    paged::ATTENTION_DECODE_PAGED,
    paged::ATTENTION_DECODE_PAGED_F16,
    paged::ATTENTION_DECODE_PAGED_I8,
    ATTENTION_MERGE,
    stream::ATTENTION_DECODE_STREAM,
    stream::ATTENTION_DECODE_STREAM_F16,
];

/// Representative pipelines of the family (what the browser test hands to
/// the browser's own shader compiler): the staged kernel at one row, a GQA
/// group of 4 and the most rows; the streaming kernel at one row and at a
/// group of 4 in teams of the widths SwiftShader (4), lavapipe (8) and GPUs
/// (32) give it, f16 K and V at 16 (16 rows compile natively and run on
/// lavapipe; SwiftShader in Chromium loses its device compiling that
/// variant, and wgpu gives the web no subgroups to run the kernel with);
/// the merge.
pub fn variants() -> Vec<PipelineKey> {
    let mut keys = Vec::new();
    for rows in [1, 4, 16] {
        keys.push(PipelineKey::new(ATTENTION_DECODE).with("ROWS", rows));
        keys.push(PipelineKey::new(ATTENTION_DECODE_F16).with("ROWS", rows));
    }
    for (rows, d) in [(1, 128), (4, 64)] {
        let dims = AttentionDims::plain(1, [rows, 1], [1, 4096], [d, d]);
        let shape = |lanes| StreamShape {
            lanes,
            keys_per_step: 2,
            prefetch: false,
        };
        for lanes in [4, 8, 32] {
            keys.push(stream_key(shape(lanes), &dims, rows as i64, false));
        }
        keys.push(stream_key(shape(16), &dims, rows as i64, true));
    }
    keys.extend(paged::variants());
    keys.push(PipelineKey::new(ATTENTION_MERGE));
    keys
}

/// Every pipeline of the family the planner can choose on some adapter:
/// the staged kernel at every row count, every shape of the streaming
/// kernel that holds 1, 2, 4, 8 or 16 rows at each head-dim class it takes,
/// K and V in f32 and in f16.
pub fn planned() -> Vec<PipelineKey> {
    let mut keys = Vec::new();
    for rows in 1..=MAX_WORKGROUP_ROWS as i64 {
        keys.push(PipelineKey::new(ATTENTION_DECODE).with("ROWS", rows));
        keys.push(PipelineKey::new(ATTENTION_DECODE_F16).with("ROWS", rows));
    }
    for d in crate::kernels::HEAD_DIM_CLASSES
        .into_iter()
        .filter(|d| d % 4 == 0)
    {
        for rows in [1, 2, 4, 8, 16] {
            let dims = AttentionDims::plain(1, [rows, 1], [1, 4096], [d, d]);
            for shape in StreamShape::all()
                .into_iter()
                .filter(|shape| shape.holds(&dims, rows))
            {
                for kv_f16 in [false, true] {
                    keys.push(stream_key(shape, &dims, rows as i64, kv_f16));
                }
            }
        }
    }
    keys.extend(paged::planned());
    keys
}

/// The family's kernel for the decode problem `dims` on an adapter, from its
/// capabilities alone (the tuning cache and the overrides take precedence:
/// `plan::planner`): the streaming kernel on adapters with subgroups wide
/// enough for its teams, where a shape holds the call's rows
/// ([`StreamShape::choose`]); the staged kernel elsewhere. (lavapipe ran
/// the streaming kernel 3.6-4.1 times as fast as the staged one at 4096 and
/// 8192 keys, BENCHMARKS.md; GPUs are still to be measured.)
pub fn tiles_for(caps: &Capabilities, dims: &AttentionDims) -> DecodeKernel {
    let rows = DecodeLayout::heads_per_workgroup(dims) * dims.q_len;
    match StreamShape::choose(dims, rows, caps) {
        Some(shape) => DecodeKernel::Stream(shape),
        None => DecodeKernel::Staged,
    }
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
        AttentionDims::plain(batch, [q_heads, kv_heads], [q_len, keys], [128, 128])
    }

    /// A GPU with subgroups of `width` lanes and 48 KiB of workgroup memory.
    fn with_subgroups(width: u32) -> Capabilities {
        let mut caps = caps("DiscreteGpu");
        caps.subgroups = true;
        caps.subgroup_min_size = width;
        caps.subgroup_max_size = width;
        caps.limits.max_compute_workgroup_storage_size = 48 << 10;
        caps
    }

    #[test]
    fn a_lanes_registers_count_its_rows_and_its_steps_keys() {
        let d = dims(1, 8, 8, 1, 4096);
        let shape = |lanes, keys_per_step, prefetch| StreamShape {
            lanes,
            keys_per_step,
            prefetch,
        };
        // d 128 in teams of 8: 4 vec4 columns of Q, O, K and V per lane.
        assert_eq!(shape(8, 2, false).registers(&d, 1), 24);
        assert_eq!(shape(8, 2, false).registers(&d, 4), 48);
        assert_eq!(shape(8, 2, true).registers(&d, 1), 40);
        assert_eq!(shape(16, 2, false).registers(&d, 4), 24);
        assert_eq!(shape(32, 1, false).registers(&d, 16), 34);
        // Dk != Dv: Q and K take Dk's columns, O and V Dv's.
        let wide_v = AttentionDims::plain(1, [8, 8], [1, 4096], [64, 128]);
        assert_eq!(shape(8, 1, false).registers(&wide_v, 1), 2 * (2 + 4));
    }

    #[test]
    fn the_untuned_shape_stays_within_the_register_budget_where_one_does() {
        let gpu = with_subgroups(32);
        for d in [64, 128, 256] {
            for (hq, hkv) in [(32, 32), (32, 16), (32, 8), (32, 4), (32, 2)] {
                let dims = AttentionDims::plain(8, [hq, hkv], [1, 16384], [d, d]);
                let rows = DecodeLayout::heads_per_workgroup(&dims);
                let fitting: Vec<StreamShape> = StreamShape::all()
                    .into_iter()
                    .filter(|s| !s.prefetch && s.fits(&dims, rows, &gpu))
                    .collect();
                let chosen = StreamShape::choose(&dims, rows, &gpu);
                let within = fitting
                    .iter()
                    .any(|s| s.registers(&dims, rows) <= STREAM_REGISTERS);
                match chosen {
                    Some(s) if within => {
                        assert!(
                            s.registers(&dims, rows) <= STREAM_REGISTERS,
                            "{d} {rows} {s:?}"
                        )
                    }
                    Some(s) => assert_eq!(Some(&s), fitting.first(), "{d} {rows}"),
                    None => assert!(fitting.is_empty(), "{d} {rows}"),
                }
            }
        }
    }

    #[test]
    fn a_shape_without_lanes_holds_nothing() {
        // (As a corrupt tuning cache could give one: refused, not a panic.)
        let dims = dims(8, 32, 8, 1, 16384);
        let shape = StreamShape {
            lanes: 0,
            keys_per_step: 2,
            prefetch: false,
        };
        assert!(!shape.holds(&dims, 4));
        assert!(!shape.fits(&dims, 4, &with_subgroups(32)));
    }

    #[test]
    fn a_tuned_shape_suits_the_rows_it_holds_without_more_registers() {
        let gpu = with_subgroups(32);
        let shape = |lanes, keys_per_step| StreamShape {
            lanes,
            keys_per_step,
            prefetch: false,
        };
        let mha = dims(8, 32, 32, 1, 16384);
        let gqa4 = dims(8, 32, 8, 1, 16384);
        // Measured on one row: it suits one row, whatever its registers.
        assert!(shape(8, 2).suits(&mha, 1, TUNED_ROWS, &gpu));
        // (40 vec4s, as measured.)
        assert!(shape(8, 4).suits(&mha, 1, TUNED_ROWS, &gpu));
        // Four rows in teams of 8 hold 48 where teams of 16 hold 24: the
        // untuned choice instead.
        assert!(!shape(8, 2).suits(&gqa4, 4, TUNED_ROWS, &gpu));
        assert!(shape(16, 2).suits(&gqa4, 4, TUNED_ROWS, &gpu));
        // Measured on the grouped problem's four rows, teams of 8 suit four
        // rows (48, as measured), not eight (80).
        assert!(shape(8, 2).suits(&gqa4, 4, GROUPED_ROWS, &gpu));
        let gqa8 = dims(8, 32, 4, 1, 16384);
        assert!(!shape(8, 2).suits(&gqa8, 8, GROUPED_ROWS, &gpu));
        // Where nothing that fits stays within the budget (subgroups of 8),
        // the measured shape where it holds no more than the untuned pick.
        let narrow = with_subgroups(8);
        assert_eq!(
            StreamShape::choose(&gqa4, 4, &narrow).map(|s| s.registers(&gqa4, 4)),
            Some(48)
        );
        assert!(shape(8, 2).suits(&gqa4, 4, TUNED_ROWS, &narrow));
        // (64.)
        assert!(!shape(8, 4).suits(&gqa4, 4, TUNED_ROWS, &narrow));
        // A CPU adapter has no register budget.
        let mut cpu = with_subgroups(8);
        cpu.adapter.device_type = "Cpu".to_string();
        assert!(shape(8, 4).suits(&gqa4, 4, TUNED_ROWS, &cpu));
    }

    #[test]
    fn the_streaming_shape_grows_its_teams_with_the_rows_alone() {
        let h100 = with_subgroups(32);
        let shape = |hq, hkv, nq| {
            let d = dims(8, hq, hkv, nq, 16384);
            let rows = DecodeLayout::heads_per_workgroup(&d) * nq;
            StreamShape::choose(&d, rows, &h100).map(|s| (s.lanes, s.keys_per_step))
        };
        // d 128: 32 vec4 columns; a lane holds 16 vec4s of Q (and of O) at
        // most, and 24 vec4s of Q, O, K and V within the untuned budget.
        assert_eq!(shape(32, 32, 1), Some((8, 2))); // MHA: (1 + 2) x (4 + 4)
        assert_eq!(shape(32, 8, 1), Some((16, 2))); // GQA 4: (4 + 2) x (2 + 2)
        assert_eq!(shape(32, 4, 1), Some((32, 2))); // GQA 8: (8 + 2) x (1 + 1)
        assert_eq!(shape(32, 2, 1), Some((32, 2))); // GQA 16: none within, the first

        // MHA past d 128: teams of 8 would hold 48 vec4s at d 256, teams of
        // 16 hold 24.
        let d256 = AttentionDims::plain(8, [32, 32], [1, 16384], [256, 256]);
        assert_eq!(
            StreamShape::choose(&d256, 1, &h100).map(|s| (s.lanes, s.keys_per_step)),
            Some((16, 2))
        );
        // A CPU adapter keeps the list's order: 2 rows at d 128 in teams of
        // 8, two keys a step (32 vec4s), as on lavapipe before the budget.
        let mut lavapipe_like = with_subgroups(8);
        lavapipe_like.adapter.device_type = "Cpu".to_string();
        let gqa2 = dims(1, 8, 4, 1, 4096);
        assert_eq!(
            StreamShape::choose(&gqa2, 2, &lavapipe_like).map(|s| (s.lanes, s.keys_per_step)),
            Some((8, 2))
        );
        // Subgroups of 8 on a GPU have no team within the budget for 4
        // rows: the first that fits, as before the budget.
        let d = dims(1, 32, 8, 1, 4096);
        assert_eq!(
            StreamShape::choose(&d, 4, &with_subgroups(8)).map(|s| (s.lanes, s.keys_per_step)),
            Some((8, 2))
        );

        // lavapipe (subgroups of 8): 16 rows at d 128 need teams of 32: staged.
        let lavapipe = with_subgroups(8);
        let d = dims(1, 32, 2, 1, 4096);
        assert_eq!(StreamShape::choose(&d, 16, &lavapipe), None);
        assert_eq!(
            DecodeLayout::runnable(
                DecodeKernel::Stream(StreamShape {
                    lanes: 8,
                    keys_per_step: 2,
                    prefetch: false
                }),
                &d,
                &lavapipe
            ),
            DecodeKernel::Staged
        );
        // SwiftShader-like subgroups of 4 take teams of 4; none, or 2 lanes, none.
        let d = dims(1, 8, 8, 1, 4096);
        assert_eq!(
            StreamShape::choose(&d, 1, &with_subgroups(4)).map(|s| s.lanes),
            Some(4)
        );
        assert_eq!(StreamShape::choose(&d, 1, &with_subgroups(2)), None);
        assert_eq!(StreamShape::choose(&d, 1, &caps("DiscreteGpu")), None);
        // The teams' O must fit the workgroup memory: d 256 in 16 KiB needs
        // teams of 16 lanes or more (8 teams x 64 vec4s).
        let mut small = with_subgroups(32);
        small.limits.max_compute_workgroup_storage_size = 16 << 10;
        let d256 = AttentionDims::plain(1, [8, 8], [1, 4096], [256, 256]);
        let s = StreamShape::choose(&d256, 1, &small).expect("a shape");
        assert!(
            s.lanes >= 16 && s.workgroup_bytes(&d256) <= 16 << 10,
            "{s:?}"
        );
    }

    #[test]
    fn the_query_heads_of_a_kv_head_share_a_workgroup_up_to_16_rows() {
        let gpu = caps("DiscreteGpu");
        let heads = |hq, hkv, nq| {
            DecodeLayout::new(&dims(1, hq, hkv, nq, 4096), &gpu, DecodeKernel::Staged)
                .heads_per_workgroup
        };
        assert_eq!(heads(32, 8, 1), 4);
        assert_eq!(heads(32, 8, 4), 4);
        assert_eq!(heads(32, 4, 3), 4); // group 8: 8 x 3 rows is too many, 4 x 3 fits
        assert_eq!(heads(32, 32, 1), 1);
        assert_eq!(heads(8, 1, 16), 1);
    }

    #[test]
    fn a_gpu_gets_enough_workgroups_and_a_cpu_adapter_few() {
        let d = dims(8, 32, 32, 1, 4096);
        let gpu = DecodeLayout::new(&d, &caps("DiscreteGpu"), DecodeKernel::Staged);
        assert!(256 * gpu.splits >= TARGET_WORKGROUPS_GPU, "{gpu:?}");
        assert_eq!(gpu.split_keys % TILE, 0);
        let cpu = DecodeLayout::new(&d, &caps("Cpu"), DecodeKernel::Staged);
        assert_eq!(cpu.splits, 1);
        // Never more splits than tiles.
        let short = DecodeLayout::new(
            &dims(1, 1, 1, 1, 600),
            &caps("DiscreteGpu"),
            DecodeKernel::Staged,
        );
        assert_eq!(short.splits, 600usize.div_ceil(TILE));
        assert!(DecodeLayout::applies(&dims(1, 1, 1, 16, 600)));
        assert!(!DecodeLayout::applies(&dims(1, 1, 1, 17, 600)));
    }
}
