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
use crate::kernels::attention::{AttentionBuffers, FusedTiles, MAX_HEAD_DIM};
use crate::kernels::decode::paged::{BlockTable, PagedElement};
use crate::kernels::decode::{self, DecodeKernel, DecodeLayout, MAX_QUERY_ROWS};
use crate::options::{AttentionOptions, KernelPath};
use crate::plan::paged::{PagedBatch, PagedBlock, PagedKernel};
use crate::problem::{AttentionDims, AttentionOutputs};
use crate::run::present::upload_rule_data;
use crate::tensor::{DType, HostTensor};

/// Why the paged kernel does not take a call of these head dims, queries
/// and options (`None`: it takes it): it needs head dims in whole vec4s up
/// to 256, f32 queries, no scores asked and a GPU path.
pub(super) fn refusal(
    cache: &PagedKvCache,
    queries: &[(SequenceId, &HostTensor)],
    options: &AttentionOptions,
) -> Option<&'static str> {
    let l = cache.layout;
    if !(l.head_dim.is_multiple_of(4) && l.v_head_dim.is_multiple_of(4)) {
        Some("the paged kernel reads rows of whole vec4s: head sizes must be multiples of 4")
    } else if l.head_dim.max(l.v_head_dim) > MAX_HEAD_DIM {
        Some("head sizes past 256 are beyond the paged kernel")
    } else if options.qk_matmul_output_mode.is_some() {
        Some("scores were asked for (qk_matmul_output), which the paged kernel does not keep")
    } else if !matches!(options.path, KernelPath::Auto | KernelPath::Fused) {
        Some("a host path was asked for by name")
    } else if queries.iter().any(|(_, q)| q.dtype() != DType::F32) {
        Some("f16 queries")
    } else {
        None
    }
}

/// The batches of a call the paged kernel takes (`dims`: each query's
/// validated call): one per query count, in the order they first appear,
/// each in blocks of up to 16 query rows with their decode layouts.
pub(super) fn plan_batches(
    cache: &PagedKvCache,
    pages: &DevicePages,
    dims: &[AttentionDims],
) -> Vec<PagedBatch> {
    let caps = pages.ctx.capabilities();
    let mut counts: Vec<usize> = Vec::new();
    for d in dims {
        if !counts.contains(&d.q_len) {
            counts.push(d.q_len);
        }
    }
    counts
        .into_iter()
        .map(|n| {
            let members: Vec<usize> = (0..dims.len()).filter(|&i| dims[i].q_len == n).collect();
            // Keys padded to the longest sequence's whole pages.
            let pages_each = members
                .iter()
                .map(|&i| dims[i].kv_len.div_ceil(cache.layout.page_size))
                .max()
                .unwrap_or(1)
                .max(1);
            let batch = AttentionDims {
                batch: members.len(),
                kv_len: pages_each * cache.layout.page_size,
                ..dims[members[0]]
            };
            // A prefill on f32 pages: the fused kernel, every row at once.
            let fused = (n > MAX_QUERY_ROWS && pages.element() == PagedElement::F32)
                .then(|| FusedTiles::for_dims(batch.head_dim, batch.v_head_dim, &caps.limits).ok())
                .flatten();
            let kernel = match fused {
                Some(tiles) => PagedKernel::Fused(tiles),
                None => PagedKernel::DecodeBlocks(
                    (0..n)
                        .step_by(MAX_QUERY_ROWS)
                        .map(|first| {
                            let rows = MAX_QUERY_ROWS.min(n - first);
                            let shape = PagedBlock::shape(first, rows, &batch);
                            PagedBlock {
                                first,
                                rows,
                                decode: DecodeLayout::new(&shape, caps, DecodeKernel::Staged),
                            }
                        })
                        .collect(),
                ),
            };
            PagedBatch {
                members,
                dims: batch,
                kernel,
            }
        })
        .collect()
}

/// [`PagedKvCache::attention`] on the device pages under `batches` (the
/// plan's): the whole call one submission.
pub(super) async fn attention(
    cache: &PagedKvCache,
    pages: &DevicePages,
    queries: &[(SequenceId, &HostTensor)],
    options: &AttentionOptions,
    (element, planned): (PagedElement, &[PagedBatch]),
) -> Result<Vec<AttentionOutputs<HostTensor>>> {
    let run = Run::new(&pages.ctx);
    let batches: Vec<Batch<'_>> = planned
        .iter()
        .map(|plan| Batch::new(cache, queries, plan))
        .collect::<Result<_>>()?;
    let recorded = run
        .scoped("paged attention", || {
            let mut rec = Recorder::new(&run, "paged attention");
            let recorded = batches
                .iter()
                .map(|batch| batch.record(&mut rec, pages, element, options))
                .collect::<Result<Vec<_>>>()?;
            rec.submit();
            Ok(recorded)
        })
        .await?;
    let mut outputs: Vec<Option<AttentionOutputs<HostTensor>>> =
        (0..queries.len()).map(|_| None).collect();
    for (batch, blocks) in batches.iter().zip(recorded) {
        let results = batch.read(&run, blocks, options).await?;
        for (&i, out) in batch.plan.members.iter().zip(results) {
            outputs[i] = Some(out);
        }
    }
    Ok(outputs
        .into_iter()
        .map(|o| o.expect("every query ran"))
        .collect())
}

/// A planned batch with its data: the queries, lengths and block tables.
struct Batch<'a> {
    plan: &'a PagedBatch,
    /// Their queries `[1, Hq, n, Dk]`.
    queries: Vec<&'a HostTensor>,
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
        queries: &[(SequenceId, &'a HostTensor)],
        plan: &'a PagedBatch,
    ) -> Result<Self> {
        let l = cache.layout;
        let per_sequence = plan.dims.kv_len / l.page_size;
        let mut lengths = Vec::with_capacity(plan.members.len());
        let mut table = vec![0u32; plan.members.len() * per_sequence];
        for (&i, row) in plan.members.iter().zip(table.chunks_mut(per_sequence)) {
            let sequence = cache.pool.sequence(queries[i].0)?;
            lengths.push(sequence.len as i64);
            row[..sequence.pages.len()].copy_from_slice(&sequence.pages);
        }
        Ok(Batch {
            plan,
            queries: plan.members.iter().map(|&i| queries[i].1).collect(),
            lengths,
            table,
            page_size: l.page_size,
        })
    }

    /// The batch's pieces of query rows `(first, rows)`: the decode blocks,
    /// or every row at once on the fused kernel.
    fn pieces(&self) -> Vec<(usize, usize)> {
        match &self.plan.kernel {
            PagedKernel::DecodeBlocks(blocks) => blocks.iter().map(|b| (b.first, b.rows)).collect(),
            PagedKernel::Fused(_) => vec![(0, self.plan.dims.q_len)],
        }
    }

    /// Records the batch's pieces: the paged decode kernel and the merge
    /// each, or the paged fused kernel.
    fn record(
        &self,
        rec: &mut Recorder<'_>,
        pages: &DevicePages,
        element: PagedElement,
        options: &AttentionOptions,
    ) -> Result<Vec<Block>> {
        let run = rec.ctx();
        let d = self.plan.dims;
        let (s, n, hq, dk, dv) = (d.batch, d.q_len, d.q_heads, d.head_dim, d.v_head_dim);
        let table = buffer::upload(run, "block tables", &self.table)?;
        let placeholder = buffer::storage(run, "no mask", 1)?;
        let nonpad = upload_rule_data(run, &d, Some(&self.lengths), options.alibi)?;
        let mut outs = Vec::new();
        for (i, (a, m)) in self.pieces().into_iter().enumerate() {
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
                element,
            };
            match &self.plan.kernel {
                PagedKernel::DecodeBlocks(blocks) => decode::record_reading(
                    rec,
                    &blocks[i].dims(&d),
                    options,
                    &blocks[i].decode,
                    &buffers,
                    Some(&block_table),
                    [&y, &stats],
                    Phases::NONE,
                )?,
                PagedKernel::Fused(tiles) => crate::kernels::attention::paged::record(
                    rec,
                    &d,
                    options,
                    tiles,
                    &buffers,
                    &block_table,
                    &y,
                    &stats,
                )?,
            }
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
        let d = self.plan.dims;
        let (s, n, hq, dv) = (d.batch, d.q_len, d.q_heads, d.v_head_dim);
        let mut y_all = vec![vec![0f32; hq * n * dv]; s];
        let mut lse_all = vec![vec![0f32; hq * n]; s];
        for ((a, m), (y, stats)) in self.pieces().into_iter().zip(&blocks) {
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
