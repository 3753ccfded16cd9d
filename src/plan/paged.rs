//! The plan of a call through a paged KV cache
//! ([`crate::PagedKvCache::plan`]): where it runs and, on device pages, the
//! paged decode kernel's batches, blocks of query rows and layouts. It is
//! made once, from the cache's pages, the engine and the call, before
//! anything runs; `PagedKvCache::attention` runs what it names.

use super::CallPlan;
use crate::kernels::attention::FusedTiles;
use crate::kernels::decode::paged::PagedElement;
use crate::kernels::decode::DecodeLayout;
use crate::problem::AttentionDims;

/// How a paged call runs.
#[derive(Debug, Clone, PartialEq)]
pub enum PagedPlan {
    /// Device pages read in place by the paged kernels: the sequences asking
    /// the same number of queries form one batch; every batch is recorded
    /// into one submission.
    DeviceKernel {
        /// How the pages store keys and values (the kernel's form).
        element: PagedElement,
        /// The batches, in the order their query counts first appear.
        batches: Vec<PagedBatch>,
    },
    /// Host pages read in place by the CPU backend, each sequence one call
    /// under its own plan.
    HostInPlace {
        /// Each sequence's plan, in the call's order.
        calls: Vec<CallPlan>,
    },
    /// Each sequence's keys and values read back and its call run by the
    /// engine's host path (which plans it as any call).
    ReadBack {
        /// Why the pages are not read in place.
        reason: String,
    },
}

/// The sequences of a call that ask the same number of queries: one batch
/// of the paged kernels.
#[derive(Debug, Clone, PartialEq)]
pub struct PagedBatch {
    /// Their places among the call's queries.
    pub members: Vec<usize>,
    /// The batch as a padded call: its sequences, their queries, keys padded
    /// to the longest's whole pages (each sequence's length goes in as its
    /// `nonpad_kv_seqlen`).
    pub dims: AttentionDims,
    /// How its rows run.
    pub kernel: PagedKernel,
}

/// The kernel a batch's query rows run on.
#[derive(Debug, Clone, PartialEq)]
pub enum PagedKernel {
    /// The split-K decode kernel in blocks of query rows, each block one
    /// decode kernel and its merge (decoding; prefills on f16 and int8 pages).
    DecodeBlocks(Vec<PagedBlock>),
    /// The portable fused kernel over every query row at once, its tiles
    /// (prefills on f32 pages: each key tile read once per block of rows).
    Fused(FusedTiles),
}

/// Query rows `first .. first + rows` of every sequence in a batch, shifted
/// to their positions, and the decode layout they run under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedBlock {
    /// The block's first query row.
    pub first: usize,
    /// Its query rows.
    pub rows: usize,
    /// The split-K layout of the paged decode kernel.
    pub decode: DecodeLayout,
}

impl PagedBlock {
    /// The block's dims: `batch`'s with the block's rows, shifted to their
    /// positions (the rows are the last `q_len - first` of each sequence's
    /// queries, the first `rows` of them).
    pub fn dims(&self, batch: &AttentionDims) -> AttentionDims {
        Self::shape(self.first, self.rows, batch)
    }

    /// The dims of rows `first .. first + rows` of `batch` (see [`PagedBlock::dims`]).
    pub fn shape(first: usize, rows: usize, batch: &AttentionDims) -> AttentionDims {
        let mut piece = AttentionDims {
            q_len: rows,
            ..*batch
        };
        piece.placement.position_shift = rows as i64 - batch.q_len as i64 + first as i64;
        piece
    }
}

impl std::fmt::Display for PagedPlan {
    /// One line per batch: `paged decode (int8 pages): 3 sequences x 1 row, 1 block: ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PagedPlan::DeviceKernel { element, batches } => {
                write!(f, "paged kernels ({} pages)", element.name())?;
                for b in batches {
                    write!(
                        f,
                        "; {} sequence{} x {} quer{}: ",
                        b.members.len(),
                        if b.members.len() == 1 { "" } else { "s" },
                        b.dims.q_len,
                        if b.dims.q_len == 1 { "y" } else { "ies" },
                    )?;
                    match &b.kernel {
                        PagedKernel::DecodeBlocks(blocks) => {
                            let d = blocks[0].decode;
                            write!(
                                f,
                                "decode, {} block{} of up to {} rows, {} split{} of {} keys, {} head{} a workgroup",
                                blocks.len(),
                                if blocks.len() == 1 { "" } else { "s" },
                                blocks[0].rows,
                                d.splits,
                                if d.splits == 1 { "" } else { "s" },
                                d.split_keys,
                                d.heads_per_workgroup,
                                if d.heads_per_workgroup == 1 { "" } else { "s" },
                            )?;
                        }
                        PagedKernel::Fused(tiles) => write!(
                            f,
                            "fused, {} rows x {} keys a tile",
                            tiles.query_rows, tiles.keys_per_tile
                        )?,
                    }
                }
                Ok(())
            }
            PagedPlan::HostInPlace { calls } => write!(
                f,
                "host pages read in place by the CPU backend, {} call{}",
                calls.len(),
                if calls.len() == 1 { "" } else { "s" }
            ),
            PagedPlan::ReadBack { reason } => {
                write!(f, "pages read back, the engine's host path: {reason}")
            }
        }
    }
}
