//! Where the pages' keys and values live on the host: chunks of whole pages
//! that are added as the pool grows and never move, so a page keeps its
//! place for as long as a sequence holds it. Values are stored as f32 or as
//! f16 ([`PageElement`]), or as int8 with a scale per row ([`QuantPages`],
//! `quant.rs`); read back as f32.

use crate::cpu::fast::stored::{RowStore, StoredRow, StoredRows};
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
pub(super) struct HostPages<T: Copy + Default = f32> {
    /// Values in one page.
    page_floats: usize,
    /// Values in one row (one token of one head).
    dim: usize,
    page_size: usize,
    pages_per_chunk: usize,
    chunks: Vec<Vec<T>>,
}

impl<T: Copy + Default> HostPages<T> {
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

    fn heads(&self) -> usize {
        self.page_floats / self.page_size / self.dim
    }

    /// Head `h`'s row `row` of page `page`, as stored.
    pub(super) fn row(&self, page: u32, h: usize, row: usize) -> &[T] {
        let at = (h * self.page_size + row) * self.dim;
        &self.page(page)[at..at + self.dim]
    }

    /// Head `h`'s rows `row ..` of page `page` (to the page's end), as stored.
    pub(super) fn rows_from(&self, page: u32, h: usize, row: usize) -> &[T] {
        let at = h * self.page_size * self.dim;
        &self.page(page)[at + row * self.dim..at + self.page_size * self.dim]
    }

    fn row_mut(&mut self, page: u32, h: usize, row: usize) -> &mut [T] {
        let (dim, page_size) = (self.dim, self.page_size);
        let at = (h * page_size + row) * dim;
        &mut self.page_mut(page)[at..at + dim]
    }

    /// Bytes the chunks hold.
    pub(super) fn bytes(&self) -> u64 {
        let size = std::mem::size_of::<T>() as u64;
        self.chunks.iter().map(|c| c.len() as u64 * size).sum()
    }
}

impl<T: PageElement> HostPages<T> {
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
}

/// Int8 pages: each row's values as signed bytes and its scale
/// (`crate::int8`), the scales kept as pages of one value a row.
#[derive(Debug, Clone)]
pub(super) struct QuantPages {
    values: HostPages<i8>,
    scales: HostPages<f32>,
}

impl QuantPages {
    fn new(kv_heads: usize, page_size: usize, dim: usize, pages_per_chunk: usize) -> Self {
        Self {
            values: HostPages::new(kv_heads, page_size, dim, pages_per_chunk),
            scales: HostPages::new(kv_heads, page_size, 1, pages_per_chunk),
        }
    }

    fn clone_empty(&self) -> Self {
        Self {
            values: self.values.clone_empty(),
            scales: self.scales.clone_empty(),
        }
    }

    fn adopt(&mut self, other: QuantPages) {
        self.values.adopt(other.values);
        self.scales.adopt(other.scales);
    }

    fn grow(&mut self) -> Result<()> {
        let (mut values, mut scales) = (self.values.clone_empty(), self.scales.clone_empty());
        values.grow()?;
        scales.grow()?;
        self.values.adopt(values);
        self.scales.adopt(scales);
        Ok(())
    }

    fn copy_page(&mut self, from: u32, to: u32) {
        self.values.copy_page(from, to);
        self.scales.copy_page(from, to);
    }

    /// Quantizes and writes `rows` (`[kv_heads, n, dim]`) as tokens
    /// `start..start + n`.
    fn write(&mut self, pages: &[u32], start: usize, rows: &[f32]) {
        let (dim, page_size, heads) = (self.values.dim, self.values.page_size, self.values.heads());
        let n = rows.len() / dim / heads;
        for h in 0..heads {
            for i in 0..n {
                let t = start + i;
                let (page, row) = (pages[t / page_size], t % page_size);
                let from = (h * n + i) * dim;
                let q = self.values.row_mut(page, h, row);
                let scale = crate::int8::quantize(&rows[from..from + dim], q);
                self.scales.row_mut(page, h, row)[0] = scale;
            }
        }
    }

    /// The row as stored: its values and scale.
    fn stored(&self, page: u32, h: usize, row: usize) -> StoredRow<'_> {
        StoredRow::I8(
            self.values.row(page, h, row),
            self.scales.row(page, h, row)[0],
        )
    }

    /// Rows `row ..` of the page, as stored.
    fn stored_rows(&self, page: u32, h: usize, row: usize) -> StoredRows<'_> {
        StoredRows::I8(
            self.values.rows_from(page, h, row),
            self.scales.rows_from(page, h, row),
        )
    }

    /// The first `len` tokens, dequantized: `[kv_heads, len, dim]`.
    fn read(&self, pages: &[u32], len: usize) -> Vec<f32> {
        let (dim, page_size, heads) = (self.values.dim, self.values.page_size, self.values.heads());
        let mut out = vec![0.0f32; heads * len * dim];
        for h in 0..heads {
            for t in 0..len {
                let (page, row) = (pages[t / page_size], t % page_size);
                self.stored(page, h, row)
                    .widen_into(&mut out[(h * len + t) * dim..][..dim]);
            }
        }
        out
    }

    fn bytes(&self) -> u64 {
        self.values.bytes() + self.scales.bytes()
    }
}

/// A stored element that is its own value (f32, f16): its rows read in
/// place.
pub(super) trait PlainElement: PageElement {
    fn stored(rows: &[Self]) -> StoredRows<'_>;
}

impl PlainElement for f32 {
    fn stored(rows: &[f32]) -> StoredRows<'_> {
        StoredRows::F32(rows)
    }
}

impl PlainElement for half::f16 {
    fn stored(rows: &[half::f16]) -> StoredRows<'_> {
        StoredRows::F16(rows)
    }
}

impl<T: PlainElement> HostPages<T> {
    /// Rows `row ..` of the page, as stored.
    fn stored_rows(&self, page: u32, h: usize, row: usize) -> StoredRows<'_> {
        T::stored(self.rows_from(page, h, row))
    }
}

/// Keys and values on the host, in f32, f16 or int8 pages.
#[derive(Debug, Clone)]
pub(super) enum HostKv {
    /// f32 pages.
    F32(HostPages<f32>, HostPages<f32>),
    /// f16 pages: half the bytes, values rounded to f16 as they are written.
    F16(HostPages<half::f16>, HostPages<half::f16>),
    /// int8 pages with a scale per row: about a quarter of the bytes.
    I8(QuantPages, QuantPages),
}

/// Runs `$body` with `$k` and `$v` bound to the keys' and values' pages,
/// whatever their element.
macro_rules! both {
    ($kv:expr, |$k:ident, $v:ident| $body:expr) => {
        match $kv {
            HostKv::F32($k, $v) => $body,
            HostKv::F16($k, $v) => $body,
            HostKv::I8($k, $v) => $body,
        }
    };
}

impl HostKv {
    /// Empty pools of `layout` in `storage`, `pages_per_chunk` pages a chunk.
    pub(super) fn new(
        layout: super::PagedLayout,
        storage: super::PageStorage,
        pages_per_chunk: usize,
    ) -> Self {
        let (h, p) = (layout.kv_heads, layout.page_size);
        let (dk, dv) = (layout.head_dim, layout.v_head_dim);
        match storage {
            super::PageStorage::F32 => HostKv::F32(
                HostPages::new(h, p, dk, pages_per_chunk),
                HostPages::new(h, p, dv, pages_per_chunk),
            ),
            super::PageStorage::F16 => HostKv::F16(
                HostPages::new(h, p, dk, pages_per_chunk),
                HostPages::new(h, p, dv, pages_per_chunk),
            ),
            super::PageStorage::Int8 => HostKv::I8(
                QuantPages::new(h, p, dk, pages_per_chunk),
                QuantPages::new(h, p, dv, pages_per_chunk),
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

    /// Head `h`'s rows `row ..` of page `page`, keys or (where `value`)
    /// values, as stored.
    fn stored_rows(&self, value: bool, page: u32, h: usize, row: usize) -> StoredRows<'_> {
        both!(self, |keys, values| if value {
            values.stored_rows(page, h, row)
        } else {
            keys.stored_rows(page, h, row)
        })
    }

    /// Bytes both hold.
    pub(super) fn bytes(&self) -> u64 {
        both!(self, |keys, values| keys.bytes() + values.bytes())
    }
}

/// One sequence's keys and values on host pages, as the CPU backend reads
/// them in place (`bkv` is the KV head: the call is the sequence's alone).
#[derive(Debug)]
pub(super) struct SequenceRows<'a> {
    pub(super) kv: &'a HostKv,
    pub(super) pages: &'a [u32],
    pub(super) page_size: usize,
}

impl RowStore for SequenceRows<'_> {
    fn rows(&self, value: bool, bkv: usize, t: usize) -> StoredRows<'_> {
        let page = self.pages[t / self.page_size];
        self.kv.stored_rows(value, page, bkv, t % self.page_size)
    }
}
