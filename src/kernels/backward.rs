//! Attention's backward pass, fused (FlashAttention-2's): the rows' sums D =
//! dY·Y (`attention_backward_rows.wgsl`), dQ by query tile walking the keys
//! (`attention_backward_dq.wgsl`) and dK, dV by key tile walking the queries
//! of every query head of the group (`attention_backward_dkdv.wgsl`). The
//! probabilities are recomputed from the forward's logsumexp and never
//! stored: memory is linear in the sequence. Every output element is written
//! by one invocation in a fixed order (no atomics): bit-for-bit repeatable.
//! The contract's rules come from `attention_score.wgsl`, as the forward's.

use crate::device::buffer;
use crate::device::capabilities::KernelLimits;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::{Recorder, Seg};
use crate::error::{Error, Result};
use crate::kernels::attention::{params, AttentionBuffers, FusedTiles, Params, MAX_HEAD_DIM};
use crate::options::AttentionOptions;
use crate::problem::AttentionDims;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Keys per workgroup of the dK/dV kernel (one per invocation).
pub const KEYS_PER_WORKGROUP: u32 = 64;
/// The most query rows per tile of the dK/dV kernel (its private arrays' length).
pub const MAX_QUERY_ROWS_PER_TILE: u32 = 32;
/// Invocations per workgroup of the row sums' kernel.
const ROWS_WORKGROUP: u64 = 64;

/// The tiles of the backward kernels for one problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackwardTiles {
    /// The dQ kernel's: query rows per workgroup, keys per K/V tile (the
    /// forward's portable tiles: the same workgroup memory).
    pub dq: FusedTiles,
    /// The dK/dV kernel's keys per workgroup.
    pub keys: u32,
    /// The dK/dV kernel's query rows per Q/dY tile.
    pub query_rows: u32,
}

impl BackwardTiles {
    /// The largest tiles whose K/V (dQ) and Q/dY (dK/dV) rows fit the
    /// adapter's workgroup memory; head dims up to 256.
    pub fn for_dims(dk: usize, dv: usize, limits: &KernelLimits) -> Result<BackwardTiles> {
        let dq = FusedTiles::for_dims(dk, dv, limits).map_err(|e| match e {
            Error::Limit {
                what,
                needed,
                limit,
                limit_name,
                ..
            } => Error::Limit {
                what,
                needed,
                limit,
                limit_name,
                hint: "the fused backward takes head dims up to 256 within the adapter's \
                       workgroup memory; use the CPU backend",
            },
            other => other,
        })?;
        // Per query row: its Q and dY rows (vec4s) and two f32 (lse, D);
        // and one i32 for the batch's nonpad length.
        let per_row = (dq.dk4 + dq.dv4) * 16 + 8;
        let budget = limits.max_compute_workgroup_storage_size.saturating_sub(16);
        let query_rows = (budget / per_row).min(MAX_QUERY_ROWS_PER_TILE);
        if query_rows == 0 {
            return Err(Error::Limit {
                what: format!(
                    "one query row of Q and dY (Dk = {dk}, Dv = {dv}) in workgroup memory"
                ),
                needed: u64::from(per_row + 16),
                limit: u64::from(limits.max_compute_workgroup_storage_size),
                limit_name: "max_compute_workgroup_storage_size",
                hint: "use the CPU backend on this adapter",
            });
        }
        Ok(BackwardTiles {
            dq,
            keys: KEYS_PER_WORKGROUP.min(limits.max_compute_invocations_per_workgroup),
            query_rows,
        })
    }

    /// The dQ kernel's pipeline key.
    pub fn dq_key(&self) -> PipelineKey {
        PipelineKey::new(ATTENTION_BACKWARD_DQ)
            .with("BQ", i64::from(self.dq.query_rows))
            .with("BK", i64::from(self.dq.keys_per_tile))
            .with("DK4", i64::from(self.dq.dk4))
            .with("DV4", i64::from(self.dq.dv4))
    }

    /// The dK/dV kernel's pipeline key.
    pub fn dkdv_key(&self) -> PipelineKey {
        PipelineKey::new(ATTENTION_BACKWARD_DKDV)
            .with("BK", i64::from(self.keys))
            .with("BQ", i64::from(self.query_rows))
            .with("DK4", i64::from(self.dq.dk4))
            .with("DV4", i64::from(self.dq.dv4))
    }

    /// Keys per dQ dispatch so that no invocation loops more than `budget`
    /// times (all keys without a budget).
    pub fn dq_keys_per_chunk(&self, keys: usize, budget: Option<u64>) -> usize {
        let Some(budget) = budget else {
            return keys.max(1);
        };
        let (bq, bk) = (
            u64::from(self.dq.query_rows),
            u64::from(self.dq.keys_per_tile),
        );
        let (dk4, dv4) = (u64::from(self.dq.dk4), u64::from(self.dq.dv4));
        let per_tile = (bk * dk4).div_ceil(bq)
            + (bk * dv4).div_ceil(bq)
            + 2 * dk4 * (bk + 1)
            + dv4 * (bk + 1)
            + 8 * bk
            + 8;
        (budget / per_tile).max(1) as usize * bk as usize
    }

    /// Query rows per dK/dV dispatch so that no invocation loops more than
    /// `budget` times over the `group` query heads (all rows without one).
    pub fn dkdv_rows_per_chunk(&self, q_len: usize, group: usize, budget: Option<u64>) -> usize {
        let Some(budget) = budget else {
            return q_len.max(1);
        };
        let (bq, bk) = (u64::from(self.query_rows), u64::from(self.keys));
        let (dk4, dv4) = (u64::from(self.dq.dk4), u64::from(self.dq.dv4));
        let per_tile = (bq * dk4).div_ceil(bk)
            + (bq * dv4).div_ceil(bk)
            + 2 * (dk4 + dv4) * (bq + 1)
            + 8 * bq
            + 8;
        let tiles = (budget / (per_tile * group as u64 + 2 * (dk4 + dv4))).max(1);
        tiles as usize * bq as usize
    }

    /// Workgroup memory of the dK/dV kernel.
    pub fn dkdv_workgroup_bytes(&self) -> u32 {
        self.query_rows * ((self.dq.dk4 + self.dq.dv4) * 16 + 8) + 4
    }
}

crate::shader::uniform::uniform_block! {
    /// The row sums' uniforms.
    pub(crate) struct RowsParams {
        rows: u32,
        dv: u32,
        _pad: [u32; 2],
    }
}

crate::shader::uniform::uniform_block! {
    /// The dQ and dK/dV kernels' uniforms: the attention block plus the chunk.
    pub(crate) struct BackwardParams {
        base: Params,
        /// dQ: the keys [start, end) of this dispatch; dK/dV: the query rows.
        chunk_start: u32,
        chunk_end: u32,
        /// FIRST_CHUNK: the outputs start at 0 (later chunks add to them).
        chunk_flags: u32,
        _pad: u32,
    }
}

const FIRST_CHUNK: u32 = 1;
const LAST_CHUNK: u32 = 2;

/// The buffers of one backward call on the device.
pub(crate) struct BackwardBuffers<'a> {
    /// Q, K and V (the present ones where the call has a past), the mask
    /// and the rule data, as the forward binds them.
    pub attention: AttentionBuffers<'a>,
    /// The forward's Y `[B, Hq, Nq, Dv]`.
    pub y: Seg<'a>,
    /// dY `[B, Hq, Nq, Dv]`.
    pub dy: Seg<'a>,
    /// The forward's logsumexp `[B, Hq, Nq]`, from its first element.
    pub lse: &'a wgpu::Buffer,
}

/// The outputs of [`record`]: dQ `[B, Hq, Nq, Dk]` and [dK | dV] of the
/// present keys, `[B, Hkv, T, Dk]` then `[B, Hkv, T, Dv]`.
pub(crate) struct BackwardOutputs {
    pub dq: wgpu::Buffer,
    pub dkdv: wgpu::Buffer,
}

/// Bytes [`record`] allocates: dQ, dK and dV, the rows' [lse | D] and D.
pub(crate) fn workspace_bytes(dims: &AttentionDims) -> u64 {
    let rows = dims.batch * dims.q_heads * dims.q_len;
    let keys = dims.batch * dims.kv_heads * dims.total_len();
    [
        rows * dims.head_dim,
        keys * (dims.head_dim + dims.v_head_dim),
        2 * rows,
        rows,
    ]
    .into_iter()
    .map(buffer::f32_bytes)
    .sum()
}

/// Records the backward: D, then dQ in key chunks, then dK and dV in
/// chunks of query rows, as the adapter's loop budget needs.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
    tiles: &BackwardTiles,
    inputs: &BackwardBuffers<'_>,
) -> Result<BackwardOutputs> {
    let ctx = rec.ctx();
    let rows = dims.batch * dims.q_heads * dims.q_len;
    let keys = dims.total_len();
    if dims.head_dim > MAX_HEAD_DIM || dims.v_head_dim > MAX_HEAD_DIM {
        return Err(Error::Conflict(
            "the planned backward tiles do not fit these head dims",
        ));
    }
    let dq = buffer::storage(ctx, "dQ", rows * dims.head_dim)?;
    let dkdv = buffer::storage(
        ctx,
        "dK and dV",
        dims.batch * dims.kv_heads * keys * (dims.head_dim + dims.v_head_dim),
    )?;
    let stats = buffer::storage(ctx, "lse and D", 2 * rows)?;

    // [lse | D]: the caller's logsumexp copied in, D computed beside it.
    let rows_uniform = buffer::uniform(
        ctx,
        "backward rows params",
        &RowsParams {
            rows: rows as u32,
            dv: dims.v_head_dim as u32,
            _pad: [0; 2],
        },
    );
    let rows_pipeline = ctx
        .pipelines
        .get(&PipelineKey::new(ATTENTION_BACKWARD_ROWS));
    // D goes to a buffer of its own, then beside the logsumexp.
    let d = buffer::storage(ctx, "D", rows)?;
    rec.dispatch_segments(
        &rows_pipeline,
        &[(&rows_uniform).into(), inputs.y, inputs.dy, (&d).into()],
        (rows as u64).div_ceil(ROWS_WORKGROUP),
    )?;
    rec.copy(inputs.lse, 0, &stats, 0, rows);
    rec.copy(&d, 0, &stats, rows, rows);

    let a = &inputs.attention;
    let budget = ctx.caps.loop_budget();
    // dQ: one workgroup per BQ rows of each (batch, query head).
    let q_blocks = dims.q_len.div_ceil(tiles.dq.query_rows as usize);
    let dq_pipeline = ctx.pipelines.get(&tiles.dq_key());
    let chunk = tiles.dq_keys_per_chunk(keys, budget);
    let base = params(dims, options, q_blocks as u32, 0);
    for (start, end, flags) in chunks(keys, chunk) {
        let uniform = chunk_uniform(rec, "backward dQ params", base, start, end, flags);
        rec.dispatch_segments(
            &dq_pipeline,
            &[
                (&uniform).into(),
                a.q,
                a.k,
                a.v,
                a.mask.into(),
                a.nonpad.into(),
                inputs.dy,
                (&stats).into(),
                (&dq).into(),
            ],
            (dims.batch * dims.q_heads * q_blocks) as u64,
        )?;
    }
    // dK, dV: one workgroup per BK keys of each (batch, KV head).
    let k_blocks = keys.div_ceil(tiles.keys as usize);
    let dkdv_pipeline = ctx.pipelines.get(&tiles.dkdv_key());
    let chunk = tiles.dkdv_rows_per_chunk(dims.q_len, dims.group(), budget);
    let base = params(dims, options, k_blocks as u32, 0);
    for (start, end, flags) in chunks(dims.q_len, chunk) {
        let uniform = chunk_uniform(rec, "backward dK dV params", base, start, end, flags);
        rec.dispatch_segments(
            &dkdv_pipeline,
            &[
                (&uniform).into(),
                a.q,
                a.k,
                a.v,
                a.mask.into(),
                a.nonpad.into(),
                inputs.dy,
                (&stats).into(),
                (&dkdv).into(),
            ],
            (dims.batch * dims.kv_heads * k_blocks) as u64,
        )?;
    }
    Ok(BackwardOutputs { dq, dkdv })
}

/// [start, end) and the chunk flags of each chunk of `len` in steps of `chunk`.
fn chunks(len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize, u32)> {
    let chunk = chunk.max(1);
    (0..len.max(1)).step_by(chunk).map(move |start| {
        let end = (start + chunk).min(len);
        let first = if start == 0 { FIRST_CHUNK } else { 0 };
        let last = if end == len { LAST_CHUNK } else { 0 };
        (start, end, first | last)
    })
}

fn chunk_uniform(
    rec: &Recorder<'_>,
    label: &str,
    base: Params,
    start: usize,
    end: usize,
    flags: u32,
) -> wgpu::Buffer {
    buffer::uniform(
        rec.ctx(),
        label,
        &BackwardParams {
            base,
            chunk_start: start as u32,
            chunk_end: end as u32,
            chunk_flags: flags,
            _pad: 0,
        },
    )
}

/// What the backward kernels call the words the attention block shares.
const DQ_NAMES: &[(&str, &str)] = &[
    ("extra0", "q_blocks"),
    ("extra2", "_pad0"),
    ("extra3", "_reserved0"),
];
const DKDV_NAMES: &[(&str, &str)] = &[
    ("extra0", "k_blocks"),
    ("extra2", "_pad0"),
    ("extra3", "_reserved0"),
];

/// The backward's row sums D = dY·Y (`shaders/attention_backward_rows.wgsl`).
pub const ATTENTION_BACKWARD_ROWS: Kernel = Kernel::new(&KernelDef {
    name: "attention_backward_rows",
    origin: Origin::File(
        "attention_backward_rows.wgsl",
        include_str!("../../shaders/attention_backward_rows.wgsl"),
    ),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<RowsParams>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

const BACKWARD_BINDINGS: &[Binding] = &[
    Binding::Uniform,
    Binding::Read,
    Binding::Read,
    Binding::Read,
    Binding::Read,
    Binding::Read,
    Binding::Read,
    Binding::Read,
    Binding::ReadWrite,
];

/// dQ by query tile (`shaders/attention_backward_dq.wgsl`).
pub const ATTENTION_BACKWARD_DQ: Kernel = Kernel::new(&KernelDef {
    name: "attention_backward_dq",
    origin: Origin::File(
        "attention_backward_dq.wgsl",
        include_str!("../../shaders/attention_backward_dq.wgsl"),
    ),
    slots: &[],
    bindings: BACKWARD_BINDINGS,
    params: ParamsText::of::<BackwardParams>().named(DQ_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// dK and dV by key tile (`shaders/attention_backward_dkdv.wgsl`).
pub const ATTENTION_BACKWARD_DKDV: Kernel = Kernel::new(&KernelDef {
    name: "attention_backward_dkdv",
    origin: Origin::File(
        "attention_backward_dkdv.wgsl",
        include_str!("../../shaders/attention_backward_dkdv.wgsl"),
    ),
    slots: &[],
    bindings: BACKWARD_BINDINGS,
    params: ParamsText::of::<BackwardParams>().named(DKDV_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels.
pub const KERNELS: [Kernel; 3] = [
    ATTENTION_BACKWARD_ROWS,
    ATTENTION_BACKWARD_DQ,
    ATTENTION_BACKWARD_DKDV,
];

/// Representative pipelines: the tiles at the head dims and workgroup
/// memories the forward's variants stand for.
pub fn variants() -> Vec<PipelineKey> {
    let mut keys = vec![PipelineKey::new(ATTENTION_BACKWARD_ROWS)];
    for (dk, dv, storage) in [(64, 64, 16 << 10), (256, 256, 16 << 10), (8, 200, 32 << 10)] {
        let limits = KernelLimits {
            max_compute_workgroup_storage_size: storage,
            ..KernelLimits::WEBGPU_DEFAULTS
        };
        if let Ok(tiles) = BackwardTiles::for_dims(dk, dv, &limits) {
            keys.push(tiles.dq_key());
            keys.push(tiles.dkdv_key());
        }
    }
    keys
}

/// The pipelines the planner chooses across adapters: the tiles at each
/// head-dim class (equal head dims, and the extremes of Dv) and
/// workgroup-memory class.
pub fn planned() -> Vec<PipelineKey> {
    use crate::kernels::{HEAD_DIM_CLASSES, WORKGROUP_STORAGE_CLASSES};
    let mut keys = vec![PipelineKey::new(ATTENTION_BACKWARD_ROWS)];
    for storage in WORKGROUP_STORAGE_CLASSES {
        let limits = KernelLimits {
            max_compute_workgroup_storage_size: storage,
            ..KernelLimits::WEBGPU_DEFAULTS
        };
        // Equal head dims, and Dv the smallest and the largest beside each Dk.
        for dk in HEAD_DIM_CLASSES {
            for dv in [dk, 1, 256] {
                if let Ok(tiles) = BackwardTiles::for_dims(dk, dv, &limits) {
                    keys.push(tiles.dq_key());
                    keys.push(tiles.dkdv_key());
                }
            }
        }
    }
    keys
}
