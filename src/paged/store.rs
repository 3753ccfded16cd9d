//! Where the pages' keys and values live on the host: chunks of whole pages
//! that are added as the pool grows and never move, so a page keeps its
//! place for as long as a sequence holds it.

use crate::error::{Error, Result};

/// The keys or the values of every page: page `p` is `[kv_heads, page_size,
/// dim]` at its place in chunk `p / pages_per_chunk`.
#[derive(Debug, Clone)]
pub(super) struct HostPages {
    /// Floats in one page.
    page_floats: usize,
    /// Floats in one row (one token of one head).
    dim: usize,
    page_size: usize,
    pages_per_chunk: usize,
    chunks: Vec<Vec<f32>>,
}

impl HostPages {
    pub(super) fn new(
        kv_heads: usize,
        page_size: usize,
        dim: usize,
        pages_per_chunk: usize,
    ) -> Self {
        Self {
            page_floats: kv_heads * page_size * dim,
            dim,
            page_size,
            pages_per_chunk,
            chunks: Vec::new(),
        }
    }

    /// A pool of one chunk holding `data`: whole pages, as a device's page
    /// buffer holds them (read back by `device.rs`).
    pub(super) fn holding(kv_heads: usize, page_size: usize, dim: usize, data: Vec<f32>) -> Self {
        let page_floats = kv_heads * page_size * dim;
        Self {
            page_floats,
            dim,
            page_size,
            pages_per_chunk: (data.len() / page_floats).max(1),
            chunks: vec![data],
        }
    }

    /// An empty pool of the same layout: new chunks are grown into it first
    /// and adopted once all of them could be made.
    pub(super) fn clone_empty(&self) -> Self {
        Self {
            chunks: Vec::new(),
            ..*self
        }
    }

    /// Takes `other`'s chunks after this pool's.
    pub(super) fn adopt(&mut self, other: HostPages) {
        self.chunks.extend(other.chunks);
    }

    /// Adds one chunk: `pages_per_chunk` pages of zeros. Refuses (changing
    /// nothing) where the host cannot hold it.
    pub(super) fn grow(&mut self) -> Result<()> {
        let floats = self.page_floats * self.pages_per_chunk;
        let mut chunk = Vec::new();
        chunk.try_reserve_exact(floats).map_err(|_| {
            Error::OutOfMemory(format!(
                "the paged cache could not grow by {} bytes",
                floats as u64 * 4
            ))
        })?;
        chunk.resize(floats, 0.0);
        self.chunks.push(chunk);
        Ok(())
    }

    fn page(&self, page: u32) -> &[f32] {
        let p = page as usize;
        let at = (p % self.pages_per_chunk) * self.page_floats;
        &self.chunks[p / self.pages_per_chunk][at..at + self.page_floats]
    }

    fn page_mut(&mut self, page: u32) -> &mut [f32] {
        let p = page as usize;
        let at = (p % self.pages_per_chunk) * self.page_floats;
        &mut self.chunks[p / self.pages_per_chunk][at..at + self.page_floats]
    }

    /// Copies page `from` onto page `to`.
    pub(super) fn copy_page(&mut self, from: u32, to: u32) {
        let data = self.page(from).to_vec();
        self.page_mut(to).copy_from_slice(&data);
    }

    /// Writes `rows` (`[kv_heads, n, dim]`) as the tokens `start..start + n`
    /// of a sequence whose pages are `pages`.
    pub(super) fn write(&mut self, pages: &[u32], start: usize, rows: &[f32]) {
        let n = rows.len() / self.dim / self.heads();
        for h in 0..self.heads() {
            for i in 0..n {
                let t = start + i;
                let (page, row) = (pages[t / self.page_size], t % self.page_size);
                let at = (h * self.page_size + row) * self.dim;
                let from = (h * n + i) * self.dim;
                let dim = self.dim;
                self.page_mut(page)[at..at + dim].copy_from_slice(&rows[from..from + dim]);
            }
        }
    }

    /// The first `len` tokens of a sequence whose pages are `pages`, read
    /// through its block table: `[kv_heads, len, dim]`.
    pub(super) fn read(&self, pages: &[u32], len: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; self.heads() * len * self.dim];
        for h in 0..self.heads() {
            for t in 0..len {
                let (page, row) = (pages[t / self.page_size], t % self.page_size);
                let at = (h * self.page_size + row) * self.dim;
                out[(h * len + t) * self.dim..][..self.dim]
                    .copy_from_slice(&self.page(page)[at..at + self.dim]);
            }
        }
        out
    }

    fn heads(&self) -> usize {
        self.page_floats / self.page_size / self.dim
    }

    /// Bytes the chunks hold.
    pub(super) fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.len() as u64 * 4).sum()
    }
}
