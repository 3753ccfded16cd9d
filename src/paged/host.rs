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
use crate::plan::CallPlan;
use crate::problem::{AttentionDims, AttentionOutputs};
use crate::tensor::{DType, HostTensor};

/// The plans of a call on host pages by the CPU backend, one per query
/// (`dims`: each query's validated call), or why it does not take them: the
/// engine plans some call elsewhere (the oracle, a GPU path asked for by
/// name), or f16 queries.
pub(super) fn plan(
    engine: &Engine,
    queries: &[(SequenceId, &HostTensor)],
    dims: &[AttentionDims],
    options: &AttentionOptions,
) -> Result<std::result::Result<Vec<CallPlan>, String>> {
    let mut calls = Vec::with_capacity(queries.len());
    for (&(_, query), d) in queries.iter().zip(dims) {
        let plan = engine.plan(d, options)?;
        if plan.path != KernelPath::Cpu {
            return Ok(Err(format!(
                "the engine plans the call on the {} path",
                plan.path
            )));
        }
        if query.dtype() != DType::F32 {
            return Ok(Err("f16 queries".into()));
        }
        calls.push(plan);
    }
    Ok(Ok(calls))
}

/// [`PagedKvCache::attention`] on host pages by the CPU backend, under each
/// query's plan (`calls`) and validated dims.
pub(super) fn attention(
    cache: &PagedKvCache,
    kv: &HostKv,
    engine: &Engine,
    queries: &[(SequenceId, &HostTensor)],
    options: &AttentionOptions,
    (dims, calls): (&[AttentionDims], &[CallPlan]),
) -> Result<Vec<AttentionOutputs<HostTensor>>> {
    let backend = engine.cpu_backend();
    let mut outputs = Vec::with_capacity(queries.len());
    for ((&(seq, query), &dims), plan) in queries.iter().zip(dims).zip(calls) {
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
        engine.record_host_call(plan.clone());
    }
    Ok(outputs)
}
