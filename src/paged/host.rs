//! Attention over a paged cache's host pages on the CPU backend: each
//! sequence's call reads its keys and values where its block table says
//! they are (f32 rows in place, f16 and int8 rows widened a tile at a time
//! in the caches), so no copy of a sequence is made and a decoding step
//! reads each stored byte once. Calls the engine plans elsewhere (the
//! oracle, a GPU path asked for by name) and f16 queries read the sequence
//! back and take the engine's host path (`PagedKvCache::attention`).

use super::store::{HostKv, SequenceRows};
use super::{PagedKvCache, SequenceId};
use crate::engine::Engine;
use crate::error::Result;
use crate::options::{AttentionOptions, KernelPath};
use crate::problem::AttentionOutputs;
use crate::tensor::{DType, HostTensor};

/// [`PagedKvCache::attention`] on host pages by the CPU backend: `None`
/// where the engine plans any call of them elsewhere.
pub(super) fn attention(
    cache: &PagedKvCache,
    kv: &HostKv,
    engine: &Engine,
    queries: &[(SequenceId, &HostTensor)],
    options: &AttentionOptions,
) -> Result<Option<Vec<AttentionOutputs<HostTensor>>>> {
    // Every query checked and planned before anything runs.
    let mut calls = Vec::with_capacity(queries.len());
    for &(seq, query) in queries {
        let dims = cache.call_dims(seq, query, options)?;
        let plan = engine.plan(&dims, options)?;
        if plan.path != KernelPath::Cpu || query.dtype() != DType::F32 {
            return Ok(None);
        }
        calls.push((seq, query, dims, plan));
    }
    let backend = engine.cpu_backend();
    let mut outputs = Vec::with_capacity(calls.len());
    for (seq, query, dims, plan) in calls {
        let sequence = cache.pool.sequence(seq)?;
        let rows = SequenceRows {
            kv,
            pages: &sequence.pages,
            page_size: cache.layout.page_size,
        };
        let lengths = [sequence.len as i64];
        outputs.push(backend.attention_stored(
            dims,
            query.data(),
            &rows,
            Some(&lengths),
            options,
        )?);
        engine.record_host_call(plan);
    }
    Ok(Some(outputs))
}
