//! The unfused attention's two products as GEMMs: `S = scale Q Kᵀ` and
//! `Y = P V` over blocks of score rows, each block as many rows as one
//! storage binding holds (`run/unfused_route.rs` records them; the plan
//! picks each product's kernel from the largest block).

use crate::error::{Error, Result};
use crate::kernels::gemm::GemmSpec;
use crate::options::AttentionOptions;
use crate::problem::AttentionDims;

/// A block of score rows computed together: `heads` consecutive heads starting
/// at `head0`, rows `row0..row0 + rows_per_head` of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreBlock {
    /// The first head (of `B x Hq`).
    pub head0: usize,
    /// Heads in the block.
    pub heads: usize,
    /// The first row of each head.
    pub row0: usize,
    /// Rows of each head.
    pub rows_per_head: usize,
}

impl ScoreBlock {
    /// Rows in the block.
    pub fn rows(&self) -> usize {
        self.heads * self.rows_per_head
    }
}

/// Splits the `heads x q_len` score rows of width `cols` into chunks of at most `budget` bytes.
pub fn score_blocks(
    heads: usize,
    q_len: usize,
    cols: usize,
    budget: u64,
) -> Result<Vec<ScoreBlock>> {
    let row_bytes = cols as u64 * 4;
    let rows_fit = (budget / row_bytes) as usize;
    if rows_fit == 0 {
        return Err(Error::buffer_limit(
            format!("one row of {cols} attention scores"),
            row_bytes,
            budget,
            "score budget (max_storage_buffer_binding_size)",
        ));
    }
    let mut chunks = Vec::new();
    if rows_fit >= q_len {
        let per_chunk = (rows_fit / q_len).min(heads);
        let mut head0 = 0;
        while head0 < heads {
            let n = per_chunk.min(heads - head0);
            chunks.push(ScoreBlock {
                head0,
                heads: n,
                row0: 0,
                rows_per_head: q_len,
            });
            head0 += n;
        }
    } else {
        for head in 0..heads {
            let mut row0 = 0;
            while row0 < q_len {
                let n = rows_fit.min(q_len - row0);
                chunks.push(ScoreBlock {
                    head0: head,
                    heads: 1,
                    row0,
                    rows_per_head: n,
                });
                row0 += n;
            }
        }
    }
    Ok(chunks)
}

impl GemmSpec {
    /// `S = scale Q Kᵀ` for the rows of `block`: each head's query rows
    /// against its KV head's keys (B read through `b_batch_div`: GQA
    /// without copies), into the block's score rows.
    pub fn attention_scores(
        dims: &AttentionDims,
        options: &AttentionOptions,
        block: &ScoreBlock,
    ) -> GemmSpec {
        let (nq, dk, t) = (dims.q_len, dims.head_dim, dims.total_len());
        let m = block.rows_per_head;
        GemmSpec {
            batch: block.heads,
            m,
            n: t,
            k: dk,
            trans_a: false,
            trans_b: true,
            lda: dk,
            ldb: dk,
            ldc: t,
            a_offset: (block.head0 * nq + block.row0) * dk,
            b_offset: 0,
            c_offset: 0,
            a_stride: nq * dk,
            b_stride: t * dk,
            c_stride: m * t,
            b_batch_base: block.head0,
            b_batch_div: dims.group(),
            alpha: options.effective_scale(dk),
            beta: 0.0,
        }
    }

    /// `Y = P V` for the rows of `block`: its probabilities against its KV
    /// head's values, into the block's rows of Y.
    pub fn attention_values(dims: &AttentionDims, block: &ScoreBlock) -> GemmSpec {
        let (nq, dv, t) = (dims.q_len, dims.v_head_dim, dims.total_len());
        let m = block.rows_per_head;
        let global_row0 = block.head0 * nq + block.row0;
        GemmSpec {
            batch: block.heads,
            m,
            n: dv,
            k: t,
            trans_a: false,
            trans_b: false,
            lda: t,
            ldb: dv,
            ldc: dv,
            a_offset: 0,
            b_offset: 0,
            c_offset: global_row0 * dv,
            a_stride: m * t,
            b_stride: t * dv,
            c_stride: nq * dv,
            b_batch_base: block.head0,
            b_batch_div: dims.group(),
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_row_once() {
        for (heads, q_len, cols, budget) in [
            (6, 7, 5, 1 << 20),
            (6, 7, 5, 4 * 5 * 7 * 2),
            (6, 7, 5, 4 * 5 * 3),
            (1, 1025, 1025, 4 * 1025 * 100),
        ] {
            let chunks = score_blocks(heads, q_len, cols, budget).unwrap();
            let mut seen = vec![0u8; heads * q_len];
            for c in &chunks {
                assert!(c.rows() as u64 * cols as u64 * 4 <= budget);
                for h in c.head0..c.head0 + c.heads {
                    for r in c.row0..c.row0 + c.rows_per_head {
                        seen[h * q_len + r] += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&s| s == 1),
                "{heads} {q_len} {cols} {budget}"
            );
        }
        assert!(score_blocks(1, 1, 100, 399).is_err());
    }
}
