//! Attention over a paged cache's device pages: the sequences of a call that
//! ask the same number of queries form one batch, whose keys and values the
//! split-K decode kernel reads where the pages are, through a block table per
//! sequence (`kernels/decode/paged.rs`). Each sequence's length goes in as
//! its `nonpad_kv_seqlen`, so causal positions, windows and ALiBi continue
//! from it as the contract has them for padded keys. More than 16 queries a
//! sequence (a prefill) run as consecutive blocks of 16 rows, each shifted to
//! its positions; the whole call is one submission.

use super::device::DevicePages;
use super::{PagedKvCache, SequenceId};
use crate::device::buffer;
use crate::device::recorder::{Recorder, Seg};
use crate::device::scope::Run;
use crate::error::Result;
use crate::kernels::ablation::Phases;
use crate::kernels::attention::{AttentionBuffers, MAX_HEAD_DIM};
use crate::kernels::decode::paged::BlockTable;
use crate::kernels::decode::{self, DecodeKernel, DecodeLayout, MAX_QUERY_ROWS};
use crate::options::{AttentionOptions, KernelPath};
use crate::problem::{validate, AttentionDims, AttentionInputs, AttentionOutputs, TensorRef};
use crate::run::present::upload_rule_data;
use crate::tensor::{DType, HostMask, HostTensor};

/// A tensor's shape alone: what validating a call on pages needs of K and V.
struct Shape(Vec<usize>);

impl TensorRef for Shape {
    type Mask = HostMask;
    fn shape(&self) -> &[usize] {
        &self.0
    }
    fn dtype(&self) -> DType {
        DType::F32
    }
}

/// Whether the paged kernel takes a call of these head dims and options:
/// head dims in whole vec4s up to 256, f32 queries, no scores asked, a GPU
/// path. Others run through the host (`PagedKvCache::attention`).
fn takes(
    cache: &PagedKvCache,
    queries: &[(SequenceId, &HostTensor)],
    options: &AttentionOptions,
) -> bool {
    let l = cache.layout;
    let dims_fit = l.head_dim.is_multiple_of(4)
        && l.v_head_dim.is_multiple_of(4)
        && l.head_dim.max(l.v_head_dim) <= MAX_HEAD_DIM;
    dims_fit
        && options.qk_matmul_output_mode.is_none()
        && matches!(options.path, KernelPath::Auto | KernelPath::Fused)
        && queries.iter().all(|(_, q)| q.dtype() == DType::F32)
}

/// [`PagedKvCache::attention`] on the device pages: `None` where the kernel
/// does not take the call.
pub(super) async fn attention(
    cache: &PagedKvCache,
    pages: &DevicePages,
    queries: &[(SequenceId, &HostTensor)],
    options: &AttentionOptions,
) -> Result<Option<Vec<AttentionOutputs<HostTensor>>>> {
    if !takes(cache, queries, options) {
        return Ok(None);
    }
    let l = cache.layout;
    // Every query checked (against its own sequence) before anything runs.
    let mut rows = Vec::with_capacity(queries.len());
    for &(seq, query) in queries {
        cache.check_query(seq, query, options)?;
        let len = cache.len(seq)?;
        let (q, k, v) = (
            Shape(query.shape().to_vec()),
            Shape(vec![1, l.kv_heads, len, l.head_dim]),
            Shape(vec![1, l.kv_heads, len, l.v_head_dim]),
        );
        let lengths = [len as i64];
        let mut inputs = AttentionInputs::new(&q, &k, &v);
        inputs.nonpad_kv_seqlen = Some(&lengths);
        let dims = validate(&inputs, options)?;
        rows.push((seq, query, dims));
    }
    let run = Run::new(&pages.ctx);
    let mut outputs: Vec<Option<AttentionOutputs<HostTensor>>> =
        (0..queries.len()).map(|_| None).collect();
    // One batch per query count, in the order they first appear.
    let mut counts: Vec<usize> = Vec::new();
    for (_, _, dims) in &rows {
        if !counts.contains(&dims.q_len) {
            counts.push(dims.q_len);
        }
    }
    for n in counts {
        let members: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].2.q_len == n).collect();
        let batch: Vec<_> = members.iter().map(|&i| (rows[i].0, rows[i].1)).collect();
        let results =
            batch_attention(cache, pages, &run, &batch, rows[members[0]].2, options).await?;
        for (i, out) in members.into_iter().zip(results) {
            outputs[i] = Some(out);
        }
    }
    Ok(Some(
        outputs
            .into_iter()
            .map(|o| o.expect("every query ran"))
            .collect(),
    ))
}

/// One batch of sequences asking `one.q_len` queries each (`one`: the dims
/// of one of them alone).
async fn batch_attention(
    cache: &PagedKvCache,
    pages: &DevicePages,
    run: &Run,
    batch: &[(SequenceId, &HostTensor)],
    one: AttentionDims,
    options: &AttentionOptions,
) -> Result<Vec<AttentionOutputs<HostTensor>>> {
    let l = cache.layout;
    let (s, n, hq) = (batch.len(), one.q_len, one.q_heads);
    let mut lengths = Vec::with_capacity(s);
    let mut tables = Vec::with_capacity(s);
    for &(seq, _) in batch {
        let sequence = cache.pool.sequence(seq)?;
        lengths.push(sequence.len as i64);
        tables.push(sequence.pages.clone());
    }
    let pages_per_sequence = tables.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let mut table = vec![0u32; s * pages_per_sequence];
    for (row, held) in table.chunks_mut(pages_per_sequence).zip(&tables) {
        row[..held.len()].copy_from_slice(held);
    }
    let keys = pages_per_sequence * l.page_size;
    let dims = AttentionDims {
        batch: s,
        kv_len: keys,
        ..one
    };
    let (dk, dv) = (l.head_dim, l.v_head_dim);
    let blocks: Vec<(usize, usize)> = (0..n)
        .step_by(MAX_QUERY_ROWS)
        .map(|a| (a, MAX_QUERY_ROWS.min(n - a)))
        .collect();
    let (ys, stats) = run
        .scoped("paged attention", || {
            let table = buffer::upload(run, "block tables", &table)?;
            let placeholder = buffer::storage(run, "no mask", 1)?;
            let nonpad = upload_rule_data(run, &dims, Some(&lengths), options.alibi)?;
            let mut rec = Recorder::new(run, "paged attention");
            let mut outs = Vec::with_capacity(blocks.len());
            for &(a, m) in &blocks {
                let mut piece = AttentionDims { q_len: m, ..dims };
                piece.placement.position_shift = m as i64 - n as i64 + a as i64;
                // The queries of rows a..a + m of every sequence, [S, Hq, m, Dk].
                let mut q = Vec::with_capacity(s * hq * m * dk);
                for &(_, query) in batch {
                    for h in 0..hq {
                        let at = (h * n + a) * dk;
                        q.extend_from_slice(&query.data()[at..at + m * dk]);
                    }
                }
                let q = buffer::upload(run, "paged queries", &q)?;
                let y = buffer::storage(run, "Y", s * hq * m * dv)?;
                let stats = buffer::storage(run, "lse", 3 * s * hq * m)?;
                let plan = DecodeLayout::new(&piece, &run.caps, DecodeKernel::Staged);
                let buffers = AttentionBuffers {
                    q: Seg::whole(&q),
                    k: Seg::whole(&pages.keys),
                    v: Seg::whole(&pages.values),
                    mask: &placeholder,
                    nonpad: &nonpad,
                    kv_f16: false,
                };
                let block_table = BlockTable {
                    pages: &table,
                    page_size: l.page_size,
                };
                decode::record_reading(
                    &mut rec,
                    &piece,
                    options,
                    &plan,
                    &buffers,
                    Some(&block_table),
                    [&y, &stats],
                    Phases::NONE,
                )?;
                outs.push((y, stats));
            }
            rec.submit();
            Ok(outs.into_iter().unzip::<_, _, Vec<_>, Vec<_>>())
        })
        .await?;
    let mut y_all = vec![vec![0f32; hq * n * dv]; s];
    let mut lse_all = vec![vec![0f32; hq * n]; s];
    for ((&(a, m), y), st) in blocks.iter().zip(&ys).zip(&stats) {
        let y = buffer::read_f32(run, y, 0, s * hq * m * dv).await?;
        let lse = buffer::read_f32(run, st, 0, s * hq * m).await?;
        for b in 0..s {
            for h in 0..hq {
                let from = (b * hq + h) * m;
                y_all[b][(h * n + a) * dv..][..m * dv]
                    .copy_from_slice(&y[from * dv..(from + m) * dv]);
                lse_all[b][h * n + a..][..m].copy_from_slice(&lse[from..from + m]);
            }
        }
    }
    y_all
        .into_iter()
        .zip(lse_all)
        .map(|(y, lse)| {
            Ok(AttentionOutputs {
                y: HostTensor::new(one.y_shape(), y)?,
                present_key: None,
                present_value: None,
                qk_matmul_output: None,
                lse: match options.return_lse {
                    true => Some(HostTensor::new(one.lse_shape(), lse)?),
                    false => None,
                },
            })
        })
        .collect()
}
