//! Where the pages' keys and values live on the host: chunks of whole pages
//! that are added as the pool grows and never move, so a page keeps its
//! place for as long as a sequence holds it. Values are stored as f32 or as
//! f16 ([`PageElement`]), read back as f32.

use crate::error::{Error, Result};

/// How a page stores a value.
pub(super) trait PageElement: Copy + Default + std::fmt::Debug {
    /// `x` as stored (f16: rounded to nearest even).
    fn store(x: f32) -> Self;
    /// The stored value as f32 (exact).
    fn load(self) -> f32;
}

impl PageElement for f32 {
    fn store(x: f32) -> Self {
        x
    }
    fn load(self) -> f32 {
        self
    }
}

impl PageElement for half::f16 {
    fn store(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn load(self) -> f32 {
        self.to_f32()
    }
}

/// The keys or the values of every page: page `p` is `[kv_heads, page_size,
/// dim]` at its place in chunk `p / pages_per_chunk`.
#[derive(Debug, Clone)]
pub(super) struct HostPages<T: PageElement = f32> {
    /// Values in one page.
    page_floats: usize,
    /// Values in one row (one token of one head).
    dim: usize,
    page_size: usize,
    pages_per_chunk: usize,
    chunks: Vec<Vec<T>>,
}

impl<T: PageElement> HostPages<T> {
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
    pub(super) fn holding(kv_heads: usize, page_size: usize, dim: usize, data: Vec<T>) -> Self {
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
    pub(super) fn adopt(&mut self, other: HostPages<T>) {
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
                (floats * std::mem::size_of::<T>()) as u64
            ))
        })?;
        chunk.resize(floats, T::default());
        self.chunks.push(chunk);
        Ok(())
    }

    fn page(&self, page: u32) -> &[T] {
        let p = page as usize;
        let at = (p % self.pages_per_chunk) * self.page_floats;
        &self.chunks[p / self.pages_per_chunk][at..at + self.page_floats]
    }

    fn page_mut(&mut self, page: u32) -> &mut [T] {
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
                let stored = &mut self.page_mut(page)[at..at + dim];
                for (s, &x) in stored.iter_mut().zip(&rows[from..from + dim]) {
                    *s = T::store(x);
                }
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
                let stored = &self.page(page)[at..at + self.dim];
                for (o, s) in out[(h * len + t) * self.dim..][..self.dim]
                    .iter_mut()
                    .zip(stored)
                {
                    *o = s.load();
                }
            }
        }
        out
    }

    fn heads(&self) -> usize {
        self.page_floats / self.page_size / self.dim
    }

    /// Bytes the chunks hold.
    pub(super) fn bytes(&self) -> u64 {
        let size = std::mem::size_of::<T>() as u64;
        self.chunks.iter().map(|c| c.len() as u64 * size).sum()
    }
}

/// Keys and values on the host, in f32 or f16 pages.
#[derive(Debug, Clone)]
pub(super) enum HostKv {
    /// f32 pages.
    F32(HostPages<f32>, HostPages<f32>),
    /// f16 pages: half the bytes, values rounded to f16 as they are written.
    F16(HostPages<half::f16>, HostPages<half::f16>),
}

/// Runs `$body` with `$k` and `$v` bound to the keys' and values' pages,
/// whatever their element.
macro_rules! both {
    ($kv:expr, |$k:ident, $v:ident| $body:expr) => {
        match $kv {
            HostKv::F32($k, $v) => $body,
            HostKv::F16($k, $v) => $body,
        }
    };
}

impl HostKv {
    /// Empty pools of `layout`, `pages_per_chunk` pages a chunk.
    pub(super) fn new(layout: super::PagedLayout, f16: bool, pages_per_chunk: usize) -> Self {
        let (h, p) = (layout.kv_heads, layout.page_size);
        let (dk, dv) = (layout.head_dim, layout.v_head_dim);
        match f16 {
            false => HostKv::F32(
                HostPages::new(h, p, dk, pages_per_chunk),
                HostPages::new(h, p, dv, pages_per_chunk),
            ),
            true => HostKv::F16(
                HostPages::new(h, p, dk, pages_per_chunk),
                HostPages::new(h, p, dv, pages_per_chunk),
            ),
        }
    }

    /// Adds `chunks` chunks to both, or (changing nothing) refuses.
    pub(super) fn grow(&mut self, chunks: usize) -> Result<()> {
        both!(self, |keys, values| {
            let (mut more_keys, mut more_values) = (keys.clone_empty(), values.clone_empty());
            for _ in 0..chunks {
                more_keys.grow()?;
                more_values.grow()?;
            }
            keys.adopt(more_keys);
            values.adopt(more_values);
            Ok(())
        })
    }

    /// Copies page `from` onto page `to`, keys and values.
    pub(super) fn copy_page(&mut self, from: u32, to: u32) {
        both!(self, |keys, values| {
            keys.copy_page(from, to);
            values.copy_page(from, to);
        })
    }

    /// Writes keys and values `[kv_heads, n, ·]` as tokens `start..start + n`.
    pub(super) fn write(&mut self, pages: &[u32], start: usize, k: &[f32], v: &[f32]) {
        both!(self, |keys, values| {
            keys.write(pages, start, k);
            values.write(pages, start, v);
        })
    }

    /// The first `len` tokens' keys and values, as f32.
    pub(super) fn read(&self, pages: &[u32], len: usize) -> (Vec<f32>, Vec<f32>) {
        both!(self, |keys, values| (
            keys.read(pages, len),
            values.read(pages, len)
        ))
    }

    /// Bytes both hold.
    pub(super) fn bytes(&self) -> u64 {
        both!(self, |keys, values| keys.bytes() + values.bytes())
    }
}
