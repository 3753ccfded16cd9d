//! The portable fused kernel reading K and V where a paged cache keeps them:
//! `shaders/attention_fused.wgsl` with its KV_ROWS slot filled by
//! `shaders/kv_rows_paged.wgsl`, for a paged cache's prefills (many query
//! rows a sequence), which the split-K decode kernel would otherwise run in
//! blocks of 16 rows, each reading the sequence's keys again. f32 pages.

use super::{
    record_key_chunks, AttentionBuffers, ChunkParams, FusedTiles, KeyChunks, KeyPart, FUSED_NAMES,
};
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::Result;
use crate::kernels::decode::paged::BlockTable;
use crate::options::AttentionOptions;
use crate::problem::AttentionDims;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// The portable fused kernel over a paged cache's f32 pages.
pub const ATTENTION_FUSED_PAGED: Kernel = Kernel::new(&KernelDef {
    name: "attention_fused_paged",
    origin: Origin::File(
        "attention_fused.wgsl",
        include_str!("../../../shaders/attention_fused.wgsl"),
    ),
    slots: &[("KV_ROWS", "kv_rows_paged.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
        Binding::Read,
    ],
    params: ParamsText::of::<ChunkParams>().named(FUSED_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The paged fused kernel's pipeline: `tiles` at `page_size` tokens a page.
pub fn key(tiles: &FusedTiles, page_size: usize) -> PipelineKey {
    PipelineKey::new(ATTENTION_FUSED_PAGED)
        .with("BQ", i64::from(tiles.query_rows))
        .with("BK", i64::from(tiles.keys_per_tile))
        .with("DK4", i64::from(tiles.dk4))
        .with("DV4", i64::from(tiles.dv4))
        .with("PAGE", page_size as i64)
}

/// Representative pipelines: 64-row blocks of 32-key tiles at d 64, 16- and
/// 256-token pages.
pub fn variants() -> Vec<PipelineKey> {
    let tiles = FusedTiles {
        query_rows: 64,
        keys_per_tile: 32,
        dk4: 16,
        dv4: 16,
    };
    vec![key(&tiles, 16), key(&tiles, 256)]
}

/// Records the paged fused kernel for every query row of `dims` (a batch of
/// sequences as a padded call, keys padded to whole pages): Y and `stats` =
/// [lse | row max | row sum], in as many key chunks as the adapter's loop
/// budget needs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
    tiles: &FusedTiles,
    inputs: &AttentionBuffers<'_>,
    table: &BlockTable<'_>,
    y: &wgpu::Buffer,
    stats: &wgpu::Buffer,
) -> Result<()> {
    let keys = dims.total_len();
    let chunks = KeyChunks {
        chunk: tiles.keys_per_chunk(keys, rec.ctx().caps.loop_budget()),
        part: KeyPart::WHOLE,
        packed_keys: 0,
        q_blocks: dims.q_len.div_ceil(tiles.query_rows as usize),
    };
    let bindings = [
        inputs.q,
        inputs.k,
        inputs.v,
        inputs.mask.into(),
        inputs.nonpad.into(),
        y.into(),
        stats.into(),
        table.pages.into(),
    ];
    record_key_chunks(
        rec,
        dims,
        options,
        &key(tiles, table.page_size),
        chunks,
        &bindings,
    )
}
