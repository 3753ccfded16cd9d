//! Fused attention (`shaders/attention_fused.wgsl`, and the choice among it,
//! `attention_sg` and `attention_tiled`) and the score recompute
//! kernel (`shaders/attention_scores.wgsl`): parameters, tile sizes chosen from
//! the adapter's limits, and dispatch geometry.

pub mod coop;
pub mod paged;
pub(crate) mod rules;
pub(crate) mod subgroup;
pub mod tiled;

use crate::device::buffer;
use crate::device::capabilities::KernelLimits;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::{Recorder, Seg};
use crate::error::{Error, Result};
use crate::kernels::ablation::Phases;
pub use crate::kernels::attention::coop::{CoopForm, CoopTiles};
use crate::kernels::attention::rules::Rules;
pub use crate::kernels::attention::tiled::TiledTiles;
use crate::options::{AttentionOptions, QkMatmulOutputMode};
use crate::problem::AttentionDims;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Query rows per workgroup of the portable fused kernel (one per invocation).
pub const QUERY_ROWS: u32 = 64;
/// The most keys per tile (the kernel's private score array holds 64).
pub const MAX_KEYS_PER_TILE: u32 = 64;
/// The largest head dim the fused kernels take.
pub const MAX_HEAD_DIM: usize = 256;
/// Keys per workgroup of the score recompute kernel.
const SCORE_KEYS: usize = 64;

/// The tile configuration of the portable fused kernel for one problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedTiles {
    /// Query rows per workgroup.
    pub query_rows: u32,
    /// Keys per K/V tile.
    pub keys_per_tile: u32,
    /// vec4s per K row.
    pub dk4: u32,
    /// vec4s per V row.
    pub dv4: u32,
}

impl FusedTiles {
    /// The largest key tile whose K and V rows fit the adapter's workgroup memory.
    pub fn for_dims(dk: usize, dv: usize, limits: &KernelLimits) -> Result<FusedTiles> {
        if dk > MAX_HEAD_DIM || dv > MAX_HEAD_DIM {
            return Err(Error::Limit {
                what: format!("head dims Dk = {dk}, Dv = {dv}"),
                needed: dk.max(dv) as u64,
                limit: MAX_HEAD_DIM as u64,
                limit_name: "largest head dim of the fused kernel",
                hint: "use KernelPath::Unfused for head dims above 256",
            });
        }
        let (dk4, dv4) = (dk.div_ceil(4) as u32, dv.div_ceil(4) as u32);
        // 16 bytes per vec4, and one i32 for the batch's nonpad length.
        let budget = limits.max_compute_workgroup_storage_size.saturating_sub(16);
        let keys = (budget / ((dk4 + dv4) * 16)).min(MAX_KEYS_PER_TILE);
        if keys == 0 {
            return Err(Error::Limit {
                what: format!("one key of K and V rows (Dk = {dk}, Dv = {dv}) in workgroup memory"),
                needed: u64::from((dk4 + dv4) * 16 + 16),
                limit: u64::from(limits.max_compute_workgroup_storage_size),
                limit_name: "max_compute_workgroup_storage_size",
                hint: "use KernelPath::Unfused on this adapter",
            });
        }
        Ok(FusedTiles {
            query_rows: QUERY_ROWS.min(limits.max_compute_invocations_per_workgroup),
            keys_per_tile: keys,
            dk4,
            dv4,
        })
    }

    /// Workgroup memory the kernel uses with these tiles.
    pub fn workgroup_bytes(&self) -> u32 {
        self.keys_per_tile * (self.dk4 + self.dv4) * 16 + 4
    }

    /// Loop iterations one invocation runs per key tile (every loop counted,
    /// with margin), for drivers that cap them.
    pub fn loop_iterations_per_tile(&self) -> u64 {
        let (bq, bk) = (u64::from(self.query_rows), u64::from(self.keys_per_tile));
        let (dk4, dv4) = (u64::from(self.dk4), u64::from(self.dv4));
        let staging = (bk * dk4).div_ceil(bq) + (bk * dv4).div_ceil(bq);
        staging + dk4 * (bk + 1) + dv4 * (bk + 1) + 4 * bk + 8
    }

    /// Keys per dispatch so that no invocation exceeds `budget` loop iterations
    /// (all keys in one dispatch when there is no budget).
    pub fn keys_per_chunk(&self, keys: usize, budget: Option<u64>) -> usize {
        match budget {
            None => keys.max(1),
            Some(budget) => {
                let tiles = (budget / self.loop_iterations_per_tile()).max(1) as usize;
                // Chunks start on tile boundaries so the kernel's tile grid lines up.
                tiles * self.keys_per_tile as usize
            }
        }
    }

    /// The pipeline key.
    pub fn key(&self) -> PipelineKey {
        PipelineKey::new(crate::kernels::attention::ATTENTION_FUSED)
            .with("BQ", i64::from(self.query_rows))
            .with("BK", i64::from(self.keys_per_tile))
            .with("DK4", i64::from(self.dk4))
            .with("DV4", i64::from(self.dv4))
    }
}

/// Which fused kernel runs a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FusedKernel {
    /// `attention_fused.wgsl`: workgroup-memory K/V tiles; any adapter.
    Portable(FusedTiles),
    /// `attention_sg`: subgroup shuffles, for CPU adapters with fixed
    /// subgroups of 4 or 8, head dims multiples of 4.
    Subgroup {
        /// The subgroup width.
        width: u32,
    },
    /// `attention_tiled`: register micro-tiles of S and O; GPUs.
    Tiled(TiledTiles),
    /// `attention_coop`: S and O on the matrix units (f16 products,
    /// f32 accumulators); calls at `Precision::Fast` only.
    Coop(CoopTiles),
}

/// The fused kernels' names, as `--kernel`, `webattn info`, the tuning table
/// and the plans spell them (each form of a kernel that `--kernel` can force).
pub mod names {
    /// The portable kernel (`shaders/attention_fused.wgsl`).
    pub const PORTABLE: &str = "attention_fused";
    /// Subgroup shuffles for CPU adapters.
    pub const SUBGROUP: &str = "attention_sg";
    /// Register micro-tiles for GPUs.
    pub const TILED: &str = "attention_tiled";
    /// The tiled kernel with row maxima and P by subgroup shuffles.
    pub const TILED_SHUFFLE: &str = "attention_tiled_shuffle";
    /// The tiled kernel with its tiles in chunks of columns.
    pub const TILED_CHUNKED: &str = "attention_tiled_chunked";
    /// The matrix-unit kernel, K and V packed as f16 ahead of it.
    pub const COOP: &str = "attention_coop";
    /// The matrix-unit kernel, K and V staged tile by tile.
    pub const COOP_STAGED: &str = "attention_coop_staged";
    /// The matrix-unit kernel, each packed tile shared in workgroup memory.
    pub const COOP_SHARED: &str = "attention_coop_shared";
}

/// Query rows per invocation of `attention_sg` (its generator's ROWS).
pub const SUBGROUP_ROWS_PER_LANE: usize = crate::kernels::attention::subgroup::ROWS as usize;
/// Keys per tile of `attention_sg` (its generator's KEYS).
pub const SUBGROUP_KEYS: usize = crate::kernels::attention::subgroup::KEYS as usize;

impl FusedKernel {
    /// The kernel and its tiles, as a pipeline label shows them.
    pub fn label(&self) -> String {
        match self {
            FusedKernel::Portable(tiles) => tiles.key().to_string(),
            FusedKernel::Tiled(tiles) => tiles.key().to_string(),
            FusedKernel::Coop(tiles) => tiles.key().to_string(),
            FusedKernel::Subgroup { width } => format!("attention_sg[SG={width}]"),
        }
    }

    /// The kernel's name, as `--kernel` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            FusedKernel::Portable(_) => names::PORTABLE,
            FusedKernel::Subgroup { .. } => names::SUBGROUP,
            FusedKernel::Tiled(tiles) if tiles.shuffle => names::TILED_SHUFFLE,
            FusedKernel::Tiled(tiles) if tiles.chunked => names::TILED_CHUNKED,
            FusedKernel::Tiled(_) => names::TILED,
            FusedKernel::Coop(tiles) => match tiles.form {
                CoopForm::Staged => names::COOP_STAGED,
                CoopForm::Packed => names::COOP,
                CoopForm::Shared => names::COOP_SHARED,
            },
        }
    }

    /// Query rows per workgroup.
    pub fn query_rows(&self) -> usize {
        match self {
            FusedKernel::Portable(tiles) => tiles.query_rows as usize,
            FusedKernel::Subgroup { width } => SUBGROUP_ROWS_PER_LANE * *width as usize,
            FusedKernel::Tiled(tiles) => tiles.query_rows as usize,
            FusedKernel::Coop(tiles) => tiles.query_rows() as usize,
        }
    }

    /// Keys per dispatch under a loop budget (all keys without one).
    pub fn keys_per_chunk(&self, dims: &AttentionDims, budget: Option<u64>) -> usize {
        let keys = dims.total_len();
        match (self, budget) {
            (_, None) => keys.max(1),
            (FusedKernel::Portable(tiles), budget) => tiles.keys_per_chunk(keys, budget),
            (FusedKernel::Tiled(tiles), budget) => tiles.keys_per_chunk(keys, budget),
            (FusedKernel::Coop(tiles), budget) => tiles.keys_per_chunk(keys, budget),
            (FusedKernel::Subgroup { .. }, Some(budget)) => {
                let per_tile = (dims.head_dim / 4 + dims.v_head_dim / 4 + 8) as u64;
                (budget / per_tile).max(1) as usize * SUBGROUP_KEYS
            }
        }
    }

    /// The pipeline key for a call: the register-tiled, matrix-unit and
    /// subgroup kernels' made for whether it applies per-score rules (`RULES`).
    pub fn key(&self, dims: &AttentionDims, options: &AttentionOptions) -> PipelineKey {
        match self {
            FusedKernel::Portable(tiles) => tiles.key(),
            FusedKernel::Tiled(tiles) => Rules::new(dims, options).specialise(tiles.key()),
            FusedKernel::Coop(tiles) => Rules::new(dims, options).specialise(tiles.key()),
            FusedKernel::Subgroup { width } => Rules::new(dims, options)
                .specialise(PipelineKey::new(subgroup::ATTENTION_SG).with("SG", i64::from(*width))),
        }
    }
}

crate::shader::uniform::uniform_block! {
    /// The uniform block the attention kernels take (fused, subgroup, decode, scores;
    /// same layout in every WGSL file; words 17, 19 and 21 differ in meaning).
    pub(crate) struct Params {
        batch: u32,
        q_heads: u32,
        group: u32,
        q_len: u32,
        keys: u32,
        dk: u32,
        dv: u32,
        flags: u32,
        scale: f32,
        softcap: f32,
        left_window: i32,
        right_window: i32,
        past_len: u32,
        mask_cols: u32,
        mask_batch_stride: u32,
        mask_head_stride: u32,
        mask_row_stride: u32,
        extra0: u32,
        kv_heads: u32,
        extra2: u32,
        /// 1 / temperature, applied to the biased scores before the softmax.
        inv_temperature: f32,
        extra3: u32,
        /// Added to every query's position (a piece of a call split across bindings).
        position_shift: i32,
        _reserved: u32,
    }
}

impl Params {
    /// The block with word 21 set (the decode kernel's query heads per workgroup).
    pub(crate) fn with_extra3(mut self, value: u32) -> Params {
        self.extra3 = value;
        self
    }
}

pub(crate) fn params(
    dims: &AttentionDims,
    options: &AttentionOptions,
    extra0: u32,
    extra2: u32,
) -> Params {
    let rules = Rules::new(dims, options);
    Params {
        batch: dims.batch as u32,
        q_heads: dims.q_heads as u32,
        group: dims.group() as u32,
        q_len: dims.q_len as u32,
        keys: dims.total_len() as u32,
        dk: dims.head_dim as u32,
        dv: dims.v_head_dim as u32,
        flags: rules.flags,
        scale: rules.scale,
        softcap: rules.softcap,
        left_window: rules.left_window,
        right_window: rules.right_window,
        past_len: rules.past_len,
        mask_cols: rules.mask.cols as u32,
        mask_batch_stride: rules.mask.batch_stride as u32,
        mask_head_stride: rules.mask.head_stride as u32,
        mask_row_stride: rules.mask.row_stride as u32,
        extra0,
        kv_heads: dims.kv_heads as u32,
        extra2,
        inv_temperature: rules.inv_temperature,
        extra3: 0,
        position_shift: rules.position_shift,
        _reserved: 0,
    }
}

/// The buffers the attention kernels read.
pub(crate) struct AttentionBuffers<'a> {
    /// Queries `[B, Hq, Nq, Dk]`: a buffer, or a view of a call's (a piece).
    pub q: Seg<'a>,
    /// Keys `[B, Hkv, T, Dk]` (the present keys when there is a past).
    pub k: Seg<'a>,
    /// Values `[B, Hkv, T, Dv]`.
    pub v: Seg<'a>,
    /// The additive mask, or a placeholder.
    pub mask: &'a wgpu::Buffer,
    /// The rule data: `nonpad_kv_seqlen` as i32 (B words, zeros when absent),
    /// then with ALiBi the query heads' slopes as f32 bits.
    pub nonpad: &'a wgpu::Buffer,
    /// Whether K and V hold f16 values (packed two to a word): only the
    /// decode kernel reads them so (`attention_decode_f16`).
    pub kv_f16: bool,
}

crate::shader::uniform::uniform_block! {
    /// The fused kernel's uniforms: the shared block plus the key chunk.
    pub(crate) struct ChunkParams {
        base: Params,
        chunk_start: u32,
        chunk_end: u32,
        /// FIRST_CHUNK: start from an empty state; LAST_CHUNK: normalise and write lse.
        chunk_flags: u32,
        /// `attention_coop_packed` and `_shared`: keys per (batch, KV head)
        /// in packed K and V.
        packed_keys: u32,
    }
}

const FIRST_CHUNK: u32 = 1;
const LAST_CHUNK: u32 = 2;

/// Which part of a row's keys a forward covers: a piece of a split call
/// resumes the row state its earlier key ranges left in `stats` and Y.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyPart {
    /// The row state starts empty.
    pub first: bool,
    /// Rows are normalised and the logsumexp written.
    pub last: bool,
}

impl KeyPart {
    /// All of the keys.
    pub(crate) const WHOLE: KeyPart = KeyPart {
        first: true,
        last: true,
    };
}

/// Records the fused forward: Y and `stats` = [lse | row max | row sum] for
/// every query row, in as many key chunks as the adapter's loop budget needs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_forward(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
    kernel: &FusedKernel,
    inputs: &AttentionBuffers<'_>,
    y: &wgpu::Buffer,
    stats: &wgpu::Buffer,
    part: KeyPart,
    phases: Phases,
) -> Result<()> {
    let ctx = rec.ctx();
    let keys = dims.total_len();
    // The matrix-unit kernel's packed form packs K and V first (the plan
    // took it only where they fit: `Planner::fused_kernel_for`).
    let kv_heads = dims.batch * dims.kv_heads;
    let packed = match *kernel {
        FusedKernel::Coop(tiles) if tiles.form.packs_ahead() => {
            if !tiles.packs(kv_heads, keys, &ctx.caps.limits) {
                return Err(Error::Conflict(
                    "the planned packed matrix-unit kernel does not fit this call's K and V",
                ));
            }
            Some(record_kv_pack(rec, dims, &tiles, inputs)?)
        }
        _ => None,
    };
    let q_blocks = dims.q_len.div_ceil(kernel.query_rows());
    let packed_keys = match kernel {
        FusedKernel::Coop(tiles) => tiles.packed_keys(keys) as u32,
        _ => 0,
    };
    let chunk = kernel.keys_per_chunk(dims, ctx.caps.loop_budget());
    let key = phases.key(kernel.key(dims, options))?;
    let mut bindings = vec![
        inputs.q,
        inputs.k,
        inputs.v,
        inputs.mask.into(),
        inputs.nonpad.into(),
        y.into(),
        stats.into(),
    ];
    if let Some(packed) = &packed {
        bindings[1] = (&packed.k).into();
        bindings[2] = (&packed.v).into();
        bindings.push((&packed.v_flags).into());
    }
    let chunks = KeyChunks {
        chunk,
        part,
        packed_keys,
        q_blocks,
    };
    record_key_chunks(rec, dims, options, &key, chunks, &bindings)
}

/// How [`record_key_chunks`] cuts a fused kernel's keys: `chunk` keys a
/// dispatch, the call's part of the keys, the packed keys per (batch, KV
/// head) where K and V were packed, and the query blocks per head.
pub(crate) struct KeyChunks {
    pub chunk: usize,
    pub part: KeyPart,
    pub packed_keys: u32,
    pub q_blocks: usize,
}

/// Records fused kernel `key` over the keys in chunks, one dispatch each
/// with its own uniform ([`ChunkParams`]) before `bindings`.
pub(crate) fn record_key_chunks(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
    key: &PipelineKey,
    chunks: KeyChunks,
    bindings: &[Seg<'_>],
) -> Result<()> {
    let ctx = rec.ctx();
    let keys = dims.total_len();
    let pipeline = ctx.pipelines.get(key);
    let workgroups = (dims.batch * dims.q_heads * chunks.q_blocks) as u64;
    let base = params(dims, options, chunks.q_blocks as u32, 0);
    let mut start = 0;
    while start < keys {
        let end = (start + chunks.chunk).min(keys);
        let first = chunks.part.first && start == 0;
        let last = chunks.part.last && end == keys;
        let flags = if first { FIRST_CHUNK } else { 0 } | if last { LAST_CHUNK } else { 0 };
        let uniform = buffer::uniform(
            ctx,
            "fused params",
            &ChunkParams {
                base,
                chunk_start: start as u32,
                chunk_end: end as u32,
                chunk_flags: flags,
                packed_keys: chunks.packed_keys,
            },
        );
        let mut segments = Vec::with_capacity(bindings.len() + 1);
        segments.push((&uniform).into());
        segments.extend_from_slice(bindings);
        rec.dispatch_segments(&pipeline, &segments, workgroups)?;
        start = end;
    }
    Ok(())
}

/// Bytes of scratch [`record_forward`] allocates for `kernel` at `dims`: the
/// packed K and V and V's flags where the matrix-unit kernel runs packed,
/// else nothing.
pub(crate) fn scratch_bytes(
    kernel: &FusedKernel,
    dims: &AttentionDims,
    limits: &KernelLimits,
) -> u64 {
    let (kv_heads, keys) = (dims.batch * dims.kv_heads, dims.total_len());
    match kernel {
        FusedKernel::Coop(tiles) if tiles.packs(kv_heads, keys, limits) => {
            let (k, v) = tiles.packed_bytes(kv_heads, keys);
            let flags = kv_heads * tiles.packed_keys(keys) / tiles.keys_per_tile as usize;
            k + v + 4 * flags as u64
        }
        _ => 0,
    }
}

/// K and V packed as f16 for `attention_coop_packed` and `_shared`, and the flags of
/// V's tiles that hold a non-finite value.
struct PackedKv {
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    v_flags: wgpu::Buffer,
}

/// Records the packing of K and V (`coop_pack.wgsl`) for the packed
/// matrix-unit kernel: per (batch, KV head) a matrix of the keys padded to
/// whole tiles by the head dim padded to the matrix size, in blocks of one
/// matrix; V's flags per tile of keys.
fn record_kv_pack(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    tiles: &CoopTiles,
    inputs: &AttentionBuffers<'_>,
) -> Result<PackedKv> {
    let keys = dims.total_len();
    let operand = |cols: usize, cols_p: u32| crate::kernels::gemm::packed::Operand {
        rows: keys,
        cols,
        transposed: false,
        ld: cols,
        offset: 0,
        stride: keys * cols,
        batches: dims.batch * dims.kv_heads,
        rows_p: tiles.packed_keys(keys),
        cols_p: cols_p as usize,
    };
    let shape = tiles.shape;
    let (k, _) = crate::kernels::gemm::packed::record_pack(
        rec,
        "K as f16",
        shape,
        &operand(dims.head_dim, tiles.dk_padded),
        inputs.k,
        0,
    )?;
    let (v, v_flags) = crate::kernels::gemm::packed::record_pack(
        rec,
        "V as f16",
        shape,
        &operand(dims.v_head_dim, tiles.dv_padded),
        inputs.v,
        tiles.keys_per_tile as usize,
    )?;
    Ok(PackedKv { k, v, v_flags })
}

/// Records the recompute of `qk_matmul_output` in `mode` from Q and K; for
/// probabilities the scores are then normalised in place by the row softmax
/// (its logsumexp goes to `scratch_lse`, `rows` values).
pub(crate) fn record_scores(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
    mode: QkMatmulOutputMode,
    inputs: &AttentionBuffers<'_>,
    out: &wgpu::Buffer,
    scratch_lse: &wgpu::Buffer,
) -> Result<()> {
    let keys = dims.total_len();
    let key_blocks = keys.div_ceil(SCORE_KEYS);
    let ctx = rec.ctx();
    let uniform = buffer::uniform(
        ctx,
        "scores params",
        &params(dims, options, mode as u32, key_blocks as u32),
    );
    let pipeline = ctx.pipelines.get(&PipelineKey::new(
        crate::kernels::attention::ATTENTION_SCORES,
    ));
    let rows = dims.batch * dims.q_heads * dims.q_len;
    rec.dispatch_segments(
        &pipeline,
        &[
            (&uniform).into(),
            inputs.q,
            inputs.k,
            inputs.mask.into(),
            inputs.nonpad.into(),
            out.into(),
        ],
        (rows * key_blocks) as u64,
    )?;
    if mode == QkMatmulOutputMode::Probabilities {
        crate::kernels::softmax::record(
            rec,
            rows,
            keys,
            out,
            scratch_lse,
            0,
            crate::kernels::softmax::NotAttended::Zero,
            1.0 / options.temperature,
        )?;
    }
    Ok(())
}

/// What the fused kernels call the words [`Params`] shares with other
/// meanings: its WGSL `struct Params` names them so.
pub(crate) const FUSED_NAMES: &[(&str, &str)] = &[
    ("extra0", "q_blocks"),
    ("extra2", "_pad"),
    ("extra3", "_reserved0"),
];

/// What the scores' recompute calls the words [`Params`] shares.
const SCORES_NAMES: &[(&str, &str)] = &[
    ("extra0", "mode"),
    ("extra2", "key_blocks"),
    ("extra3", "_reserved0"),
];

/// Portable fused attention, FlashAttention-2 style (`shaders/attention_fused.wgsl`).
pub const ATTENTION_FUSED: Kernel = Kernel::new(&KernelDef {
    name: names::PORTABLE,
    origin: Origin::File(
        "attention_fused.wgsl",
        include_str!("../../../shaders/attention_fused.wgsl"),
    ),
    slots: &[("KV_ROWS", "kv_rows_dense.wgsl")],
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
    params: ParamsText::of::<ChunkParams>().named(FUSED_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});
/// `qk_matmul_output` recomputed from Q and K (`shaders/attention_scores.wgsl`).
pub const ATTENTION_SCORES: Kernel = Kernel::new(&KernelDef {
    name: "attention_scores",
    origin: Origin::File(
        "attention_scores.wgsl",
        include_str!("../../../shaders/attention_scores.wgsl"),
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
    params: ParamsText::of::<Params>().named(SCORES_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 14] = [
    ATTENTION_FUSED,
    paged::ATTENTION_FUSED_PAGED,
    ATTENTION_SCORES,
    subgroup::ATTENTION_SG,
    tiled::ATTENTION_TILED,
    tiled::ATTENTION_TILED_WIDE,
    tiled::ATTENTION_TILED_SHUFFLE,
    tiled::ATTENTION_TILED_CHUNKED,
    coop::ATTENTION_COOP16,
    coop::ATTENTION_COOP8,
    coop::ATTENTION_COOP_PACKED16,
    coop::ATTENTION_COOP_PACKED8,
    coop::ATTENTION_COOP_SHARED16,
    coop::ATTENTION_COOP_SHARED8,
];

/// Representative pipelines of the family (what the browser test hands to
/// the browser's own shader compiler): the subgroup kernel at the widths CPU
/// adapters have, the portable and tiled kernels' tiles at representative
/// head dims and workgroup memories, a prefetching and a chunked tile, and
/// the scores' recompute.
pub fn variants() -> Vec<PipelineKey> {
    use crate::device::capabilities::KernelLimits;
    let mut keys = Vec::new();
    for width in [4, 8] {
        let key = PipelineKey::new(subgroup::ATTENTION_SG).with("SG", i64::from(width));
        keys.push(rules::without_rules(key.clone()));
        keys.push(key);
    }
    for (dk, dv, storage) in [
        (64, 64, 16 << 10),
        (64, 64, 32 << 10),
        (256, 256, 16 << 10),
        (8, 200, 16 << 10),
    ] {
        let limits = KernelLimits {
            max_compute_workgroup_storage_size: storage,
            ..KernelLimits::WEBGPU_DEFAULTS
        };
        if let Ok(tiles) = FusedTiles::for_dims(dk, dv, &limits) {
            keys.push(tiles.key());
        }
        if let Some(tiles) = TiledTiles::for_dims(dk, dv, &limits) {
            keys.push(tiles.key());
        }
    }
    keys.extend(paged::variants());
    // More tiles of the register-tiled kernel, within the 32 KiB a browser
    // offers (the browser test compiles this list on its own device).
    let browser = KernelLimits {
        max_compute_workgroup_storage_size: 32 << 10,
        ..KernelLimits::WEBGPU_DEFAULTS
    };
    for (dk, dv) in [(128, 128), (256, 256), (65, 3)] {
        if let Some(tiles) = TiledTiles::for_dims(dk, dv, &browser) {
            keys.push(tiles.key());
        }
    }
    // A shape that prefetches the next tile into registers (tried by the
    // tuner), and the chunked form, at head dim 64 within 32 KiB.
    let candidates = TiledTiles::candidates(64, 64);
    if let Some(tiles) = candidates
        .iter()
        .find(|t| t.prefetch && !t.shuffle && !t.chunked && t.fits(&browser))
    {
        keys.push(tiles.key());
    }
    if let Some(tiles) = candidates
        .iter()
        .find(|t| t.chunked && !t.prefetch && t.fits(&browser))
    {
        keys.push(tiles.key());
    }
    keys.push(PipelineKey::new(ATTENTION_SCORES));
    keys
}

/// Every pipeline of the family the planner can choose on some adapter:
/// the portable kernel's tiles at every workgroup-memory and head-dim
/// class, every tile of the register-tiled kernel and of the matrix-unit
/// kernel (every form, both sizes, the subgroup widths adapters report).
pub fn planned() -> Vec<PipelineKey> {
    use crate::device::capabilities::KernelLimits;
    use crate::kernels::{HEAD_DIM_CLASSES, WORKGROUP_STORAGE_CLASSES};
    let mut keys = Vec::new();
    for storage in WORKGROUP_STORAGE_CLASSES {
        for invocations in [256, 1024] {
            let limits = KernelLimits {
                max_compute_workgroup_storage_size: storage,
                max_compute_invocations_per_workgroup: invocations,
                ..KernelLimits::WEBGPU_DEFAULTS
            };
            for dk in HEAD_DIM_CLASSES {
                for dv in HEAD_DIM_CLASSES {
                    if let Ok(tiles) = FusedTiles::for_dims(dk, dv, &limits) {
                        keys.push(tiles.key());
                    }
                }
            }
        }
    }
    // Every tile of the register-tiled kernel at every head-dim class: the
    // tuner may pick any candidate that fits.
    for dk in HEAD_DIM_CLASSES {
        for dv in HEAD_DIM_CLASSES {
            keys.extend(TiledTiles::candidates(dk, dv).iter().map(TiledTiles::key));
        }
    }
    for size in [
        crate::kernels::matrix_units::CoopSize::Eight,
        crate::kernels::matrix_units::CoopSize::Sixteen,
    ] {
        for subgroup in [8, 32, 64] {
            let shape = crate::kernels::matrix_units::CoopShape { size, subgroup };
            for dk in HEAD_DIM_CLASSES {
                for dv in HEAD_DIM_CLASSES {
                    // (Each in every form: packed, as calls take it, staged and shared.)
                    keys.extend(
                        CoopTiles::candidates(shape, dk, dv)
                            .into_iter()
                            .flat_map(|t| CoopForm::ALL.map(|form| t.in_form(form)))
                            .filter(CoopTiles::is_valid)
                            .map(|t| t.key()),
                    );
                }
            }
        }
    }
    keys
}

/// The family's kernel and tiles for an adapter at head dims `dk`, `dv` and
/// `precision`, from its capabilities alone (the tuning cache and the
/// overrides take precedence: `plan::planner`). Under
/// [`crate::Precision::Fast`], on an adapter with matrix units, the
/// matrix-unit kernel's largest tiles that fit, K and V packed. Else on a
/// GPU the register-tiled kernel's largest tile that fits (else the
/// portable kernel); on a CPU adapter `attention_sg` where it has fixed
/// subgroups (head dims multiples of 4), else the portable kernel, which a
/// CPU runs faster (SwiftShader in Chromium: 52 ms against 310 ms for the
/// tiled kernel on the library's repeated call; BENCHMARKS.md). Head dims
/// beyond the fused kernels, or a workgroup memory too small for one key,
/// are a typed error.
pub fn tiles_for(
    caps: &crate::device::capabilities::Capabilities,
    dk: usize,
    dv: usize,
    precision: crate::Precision,
) -> Result<FusedKernel> {
    let tiles = FusedTiles::for_dims(dk, dv, &caps.limits)?;
    if precision == crate::Precision::Fast {
        let coop = crate::kernels::matrix_units::coop_shape(caps)
            .and_then(|shape| CoopTiles::for_dims(shape, dk, dv, &caps.limits));
        if let Some(coop) = coop {
            return Ok(FusedKernel::Coop(coop));
        }
    }
    Ok(match caps.fixed_cpu_subgroup() {
        Some(width) if dk.is_multiple_of(4) && dv.is_multiple_of(4) => {
            FusedKernel::Subgroup { width }
        }
        Some(_) => FusedKernel::Portable(tiles),
        None if caps.adapter.device_type == "Cpu" => FusedKernel::Portable(tiles),
        None => tiled_or_portable(tiles, dk, dv, &caps.limits),
    })
}

/// The register-tiled kernel where one of its tiles fits, else the portable
/// kernel with `portable` tiles.
pub fn tiled_or_portable(
    portable: FusedTiles,
    dk: usize,
    dv: usize,
    limits: &KernelLimits,
) -> FusedKernel {
    match TiledTiles::for_dims(dk, dv, limits) {
        Some(tiles) => FusedKernel::Tiled(tiles),
        None => FusedKernel::Portable(portable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_phase_leaves_every_key_as_it_is_ablation() {
        let key = PipelineKey::new(ATTENTION_FUSED).with("BQ", 64);
        assert_eq!(Phases::NONE.key(key.clone()).unwrap(), key);
    }

    #[test]
    fn removed_phases_name_the_ablate_constant_of_kernels_that_have_it() {
        let key = PipelineKey::new(tiled::ATTENTION_TILED).with("BQ", 64);
        let removed = (Phases::SCORES | Phases::PRODUCT).key(key).unwrap();
        assert!(removed.constants.contains(&("ABLATE", 10)));
        assert!(removed.to_string().contains("ABLATE=10"));
        assert!(Phases::SOFTMAX
            .key(PipelineKey::new(ATTENTION_FUSED))
            .is_err());
        assert_eq!(
            Phases::ALL.name(),
            "K/V loads + S = QK^T + softmax + O += PV"
        );
        assert_eq!(Phases::NONE.name(), "none");
        assert_eq!(
            Phases::EACH.iter().fold(Phases::NONE, |a, &b| a | b),
            Phases::ALL
        );
    }

    #[test]
    fn the_kernels_with_switches_declare_the_constant() {
        for kernel in crate::kernels::all() {
            assert_eq!(
                crate::kernels::ablation::has_phase_switches(kernel),
                kernel.source().contains("override ABLATE"),
                "{}",
                kernel.name()
            );
        }
    }
}
