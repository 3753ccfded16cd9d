//! Attention over a paged cache's device pages: the sequences of a call that
//! ask the same number of queries form one batch, whose keys and values the
//! split-K decode kernel reads where the pages are, through a block table per
//! sequence (`kernels/decode/paged.rs`). Each sequence's length goes in as
//! its `nonpad_kv_seqlen`, so causal positions, windows and ALiBi continue
//! from it as the contract has them for padded keys. More than 16 queries a
//! sequence (a prefill) run as consecutive blocks of 16 rows, each shifted to
//! its positions; the whole call is one submission.

use super::device::DevicePages;
use super::{PageStorage, PagedKvCache, SequenceId};
use crate::device::buffer;
use crate::device::recorder::{Recorder, Seg};
use crate::device::scope::Run;
use crate::error::Result;
use crate::kernels::ablation::Phases;
use crate::kernels::attention::{AttentionBuffers, MAX_HEAD_DIM};
use crate::kernels::decode::paged::{BlockTable, PagedElement};
use crate::kernels::decode::{self, DecodeKernel, DecodeLayout, MAX_QUERY_ROWS};
use crate::options::{AttentionOptions, KernelPath};
use crate::problem::{AttentionDims, AttentionOutputs};
use crate::run::present::upload_rule_data;
use crate::tensor::{DType, HostTensor};

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
    // Every query checked (against its own sequence) before anything runs.
    let mut rows = Vec::with_capacity(queries.len());
    for &(seq, query) in queries {
        rows.push((seq, query, cache.call_dims(seq, query, options)?));
    }
    let run = Run::new(&pages.ctx);
    // One batch per query count, in the order they first appear.
    let mut counts: Vec<usize> = Vec::new();
    for (_, _, dims) in &rows {
        if !counts.contains(&dims.q_len) {
            counts.push(dims.q_len);
        }
    }
    let batches: Vec<Batch<'_>> = counts
        .into_iter()
        .map(|n| {
            let members: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].2.q_len == n).collect();
            Batch::new(cache, &rows, members)
        })
        .collect::<Result<_>>()?;
    let recorded = run
        .scoped("paged attention", || {
            let mut rec = Recorder::new(&run, "paged attention");
            let recorded = batches
                .iter()
                .map(|batch| batch.record(&mut rec, pages, options))
                .collect::<Result<Vec<_>>>()?;
            rec.submit();
            Ok(recorded)
        })
        .await?;
    let mut outputs: Vec<Option<AttentionOutputs<HostTensor>>> =
        (0..queries.len()).map(|_| None).collect();
    for (batch, blocks) in batches.iter().zip(recorded) {
        let results = batch.read(&run, blocks, options).await?;
        for (&i, out) in batch.members.iter().zip(results) {
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

/// The sequences of a call that ask the same number of queries: one batch
/// of the paged kernel (in blocks of 16 query rows).
struct Batch<'a> {
    /// Their places among the call's queries.
    members: Vec<usize>,
    /// Their queries `[1, Hq, n, Dk]`.
    queries: Vec<&'a HostTensor>,
    /// The dims of the batch: its sequences, their queries, keys padded to
    /// the longest's whole pages, their lengths as `nonpad_kv_seqlen`.
    dims: AttentionDims,
    lengths: Vec<i64>,
    /// Each sequence's block table, padded with page 0.
    table: Vec<u32>,
    page_size: usize,
}

/// One block's outputs on the device: Y and the statistics ([lse | m | l]).
type Block = (wgpu::Buffer, wgpu::Buffer);

impl<'a> Batch<'a> {
    fn new(
        cache: &PagedKvCache,
        rows: &[(SequenceId, &'a HostTensor, AttentionDims)],
        members: Vec<usize>,
    ) -> Result<Self> {
        let l = cache.layout;
        let mut lengths = Vec::with_capacity(members.len());
        let mut tables = Vec::with_capacity(members.len());
        for &i in &members {
            let sequence = cache.pool.sequence(rows[i].0)?;
            lengths.push(sequence.len as i64);
            tables.push(sequence.pages.clone());
        }
        let per_sequence = tables.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let mut table = vec![0u32; members.len() * per_sequence];
        for (row, held) in table.chunks_mut(per_sequence).zip(&tables) {
            row[..held.len()].copy_from_slice(held);
        }
        let dims = AttentionDims {
            batch: members.len(),
            kv_len: per_sequence * l.page_size,
            ..rows[members[0]].2
        };
        Ok(Batch {
            queries: members.iter().map(|&i| rows[i].1).collect(),
            members,
            dims,
            lengths,
            table,
            page_size: l.page_size,
        })
    }

    /// Query rows `a..a + m` of every sequence in the batch.
    fn blocks(&self) -> Vec<(usize, usize)> {
        let n = self.dims.q_len;
        (0..n)
            .step_by(MAX_QUERY_ROWS)
            .map(|a| (a, MAX_QUERY_ROWS.min(n - a)))
            .collect()
    }

    /// Records the batch's blocks: the paged decode kernel and the merge each.
    fn record(
        &self,
        rec: &mut Recorder<'_>,
        pages: &DevicePages,
        options: &AttentionOptions,
    ) -> Result<Vec<Block>> {
        let run = rec.ctx();
        let d = self.dims;
        let (s, n, hq, dk, dv) = (d.batch, d.q_len, d.q_heads, d.head_dim, d.v_head_dim);
        let table = buffer::upload(run, "block tables", &self.table)?;
        let placeholder = buffer::storage(run, "no mask", 1)?;
        let nonpad = upload_rule_data(run, &d, Some(&self.lengths), options.alibi)?;
        let mut outs = Vec::new();
        for (a, m) in self.blocks() {
            let mut piece = AttentionDims { q_len: m, ..d };
            piece.placement.position_shift = m as i64 - n as i64 + a as i64;
            // Rows a..a + m of every sequence's queries, [S, Hq, m, Dk].
            let mut q = Vec::with_capacity(s * hq * m * dk);
            for query in &self.queries {
                for h in 0..hq {
                    q.extend_from_slice(&query.data()[(h * n + a) * dk..][..m * dk]);
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
                page_size: self.page_size,
                element: match pages.storage {
                    PageStorage::F32 => PagedElement::F32,
                    PageStorage::F16 => PagedElement::F16,
                    PageStorage::Int8 => PagedElement::I8,
                },
            };
            decode::record_reading(
                rec,
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
        Ok(outs)
    }

    /// Reads the batch's blocks back into each sequence's outputs.
    async fn read(
        &self,
        run: &Run,
        blocks: Vec<Block>,
        options: &AttentionOptions,
    ) -> Result<Vec<AttentionOutputs<HostTensor>>> {
        let d = self.dims;
        let (s, n, hq, dv) = (d.batch, d.q_len, d.q_heads, d.v_head_dim);
        let mut y_all = vec![vec![0f32; hq * n * dv]; s];
        let mut lse_all = vec![vec![0f32; hq * n]; s];
        for ((a, m), (y, stats)) in self.blocks().into_iter().zip(&blocks) {
            let y = buffer::read_f32(run, y, 0, s * hq * m * dv).await?;
            let lse = buffer::read_f32(run, stats, 0, s * hq * m).await?;
            for b in 0..s {
                for h in 0..hq {
                    let from = (b * hq + h) * m;
                    y_all[b][(h * n + a) * dv..][..m * dv]
                        .copy_from_slice(&y[from * dv..(from + m) * dv]);
                    lse_all[b][h * n + a..][..m].copy_from_slice(&lse[from..from + m]);
                }
            }
        }
        let one = AttentionDims { batch: 1, ..d };
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
}
