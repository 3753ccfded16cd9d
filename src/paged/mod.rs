//! A paged KV cache for serving many sequences: one pool of fixed-size pages
//! (keys and values of `page_size` tokens for every KV head) and a block
//! table per sequence, as vLLM's PagedAttention keeps them.
//!
//! Sequences are added, appended to (several in one call), forked and freed
//! at any time. A fork shares its parent's pages (counted per page); the
//! shared last page, where partly filled, is copied by whichever sequence
//! writes into it first. A freed sequence's pages no other sequence holds
//! are free at once. The pool grows by whole chunks of pages that never
//! move, up to an optional page limit. Every call checks everything before
//! it changes anything: a refused call leaves every sequence as it was.
//!
//! Ragged batches without a cache (`cu_seqlens`) are in [`ragged`].
//!
//! The pages live where the cache is made: on the host
//! ([`PagedKvCache::new`]: attention through the engine's CPU path, each
//! sequence's keys and values read through its block table), or in a GPU
//! engine's device memory ([`PagedKvCache::on_engine`]: the split-K decode
//! kernel reads them in place through the block tables, every sequence of a
//! call in one submission; `gpu.rs`).

mod device;
mod gpu;
mod host;
mod pool;
pub mod ragged;
mod store;

pub use pool::SequenceId;
pub use ragged::{RaggedInputs, RaggedOutputs};

use crate::cpu;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::options::AttentionOptions;
pub use crate::plan::paged::PagedPlan;
use crate::problem::{validate, AttentionDims, AttentionInputs, AttentionOutputs, TensorRef};
use crate::tensor::{DType, HostMask, HostTensor};
use device::DevicePages;
use pool::PagePool;
use store::HostKv;

/// The page sizes the cache takes: powers of two from 16 to 256 tokens.
pub use crate::kernels::decode::paged::PAGE_SIZES;

/// Host bytes a chunk of keys (or values) aims at when the pool grows.
const CHUNK_BYTES: usize = 1 << 20;

/// What every page holds: `page_size` tokens of `kv_heads` heads, keys of
/// `head_dim` and values of `v_head_dim` values each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedLayout {
    /// Key/value heads.
    pub kv_heads: usize,
    /// Values in a key row.
    pub head_dim: usize,
    /// Values in a value row.
    pub v_head_dim: usize,
    /// Tokens a page holds (one of [`PAGE_SIZES`]).
    pub page_size: usize,
}

impl PagedLayout {
    /// Checks the sizes: at least one head and one value a row, a page size
    /// of [`PAGE_SIZES`].
    pub fn check(&self) -> Result<()> {
        if !PAGE_SIZES.contains(&self.page_size) {
            return Err(Error::InvalidOption {
                name: "page_size",
                value: self.page_size.to_string(),
                reason: "must be 16, 32, 64, 128 or 256 tokens",
            });
        }
        for (name, value) in [
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("v_head_dim", self.v_head_dim),
        ] {
            if value == 0 {
                return Err(Error::InvalidOption {
                    name,
                    value: "0".into(),
                    reason: "must be at least 1",
                });
            }
        }
        Ok(())
    }
}

/// Keys and values of many sequences in pages ([module docs](self)).
#[derive(Debug, Clone)]
pub struct PagedKvCache {
    layout: PagedLayout,
    pool: PagePool,
    pages: Pages,
    /// Pages the pool grows by (at least).
    pages_per_chunk: usize,
    max_pages: Option<usize>,
    storage: PageStorage,
}

/// How pages store keys and values: the arithmetic is f32 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageStorage {
    /// f32: values as appended.
    #[default]
    F32,
    /// f16 (IEEE half, rounded to nearest even as appended): half the bytes,
    /// read in place by the paged decode kernel's f16 form. Attention is exact
    /// against the oracle on the stored (rounded) values.
    F16,
    /// int8 with an f32 scale per token and head (`scale = max|x| / 127`,
    /// each value rounded to the nearest step): `(D + 4) / 4D` of f32's
    /// bytes, about half of f16's. Every value is within half a step of
    /// the one appended; attention is exact against the oracle on the
    /// dequantized values. A row holding a NaN or an infinity reads back as
    /// NaN throughout. On a GPU the head sizes must be multiples of 4.
    Int8,
}

impl PageStorage {
    /// Its name: `f32`, `f16` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            PageStorage::F32 => "f32",
            PageStorage::F16 => "f16",
            PageStorage::Int8 => "int8",
        }
    }

    /// Bytes of a stored row of `dim` values (int8: the values and the scale).
    pub fn row_bytes(self, dim: usize) -> u64 {
        let dim = dim as u64;
        match self {
            PageStorage::F32 => 4 * dim,
            PageStorage::F16 => 2 * dim,
            PageStorage::Int8 => dim + 4,
        }
    }

    /// `row` replaced by the values it reads back as once stored (f16:
    /// rounded; int8: quantized with the row's scale and dequantized).
    pub fn round_trip(self, row: &mut [f32]) {
        match self {
            PageStorage::F32 => {}
            PageStorage::F16 => row
                .iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
            PageStorage::Int8 => {
                let mut q = vec![0i8; row.len()];
                let scale = crate::int8::quantize(row, &mut q);
                crate::int8::dequantize(&q, scale, row);
            }
        }
    }

    /// The storage a name (`f32`, `f16`, `int8`) stands for.
    pub fn parse(name: &str) -> Result<PageStorage> {
        match name {
            "f32" => Ok(PageStorage::F32),
            "f16" => Ok(PageStorage::F16),
            "int8" => Ok(PageStorage::Int8),
            other => Err(Error::InvalidOption {
                name: "storage",
                value: other.into(),
                reason: "must be f32, f16 or int8",
            }),
        }
    }
}

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

/// Where a cache's pages are.
#[derive(Debug, Clone)]
enum Pages {
    /// Host memory, in chunks that never move.
    Host(HostKv),
    /// A GPU engine's device memory, with the engine and device they belong to.
    Device {
        pages: DevicePages,
        device: crate::engine::DeviceKey,
    },
}

/// One sequence's new tokens for [`PagedKvCache::append_many`]: keys
/// `[kv_heads, n, head_dim]` and values `[kv_heads, n, v_head_dim]`.
pub type Append<'a> = (SequenceId, &'a HostTensor, &'a HostTensor);

impl PagedKvCache {
    /// An empty cache of `layout`; the pool grows as sequences need pages.
    pub fn new(layout: PagedLayout) -> Result<Self> {
        layout.check()?;
        let row_bytes = layout.kv_heads * layout.head_dim.max(layout.v_head_dim) * 4;
        let pages_per_chunk = (CHUNK_BYTES / (row_bytes * layout.page_size)).clamp(1, 1024);
        Ok(Self {
            layout,
            pool: PagePool::new(layout.page_size),
            pages: Pages::Host(HostKv::new(layout, PageStorage::F32, pages_per_chunk)),
            storage: PageStorage::F32,
            pages_per_chunk,
            max_pages: None,
        })
    }

    /// An empty cache of `layout` whose pages live where `engine` computes:
    /// its GPU's memory on a GPU engine (attention reads them in place, with
    /// this engine only), the host on a CPU engine ([`PagedKvCache::new`]).
    pub fn on_engine(engine: &Engine, layout: PagedLayout) -> Result<Self> {
        let mut cache = Self::new(layout)?;
        if let Some(ctx) = engine.gpu() {
            cache.pages = Pages::Device {
                pages: DevicePages::new(ctx, layout),
                device: engine.device_key(),
            };
        }
        Ok(cache)
    }

    /// The same empty cache, its pages storing `storage`. Refused
    /// ([`Error::Conflict`]) once the cache holds pages; f16 and int8 pages
    /// on a GPU need head sizes in multiples of 4 (rows of whole words).
    pub fn with_storage(mut self, storage: PageStorage) -> Result<Self> {
        if self.pool.pages() > 0 {
            return Err(Error::Conflict(
                "a paged cache's storage is chosen before it holds pages",
            ));
        }
        self.pages = match self.pages {
            Pages::Host(_) => Pages::Host(HostKv::new(self.layout, storage, self.pages_per_chunk)),
            Pages::Device { pages, device } => Pages::Device {
                pages: DevicePages::with_storage(&pages.ctx, self.layout, storage)?,
                device,
            },
        };
        self.storage = storage;
        Ok(self)
    }

    /// How the pages store keys and values.
    pub fn storage(&self) -> PageStorage {
        self.storage
    }

    /// Whether the pages live in a GPU's memory.
    pub fn on_device(&self) -> bool {
        matches!(self.pages, Pages::Device { .. })
    }

    /// The same cache, never holding more than `pages` pages (a server's
    /// memory budget): an append that would need more is refused with
    /// [`Error::OutOfMemory`].
    pub fn with_page_limit(mut self, pages: usize) -> Self {
        self.max_pages = Some(pages);
        self
    }

    /// What every page holds.
    pub fn layout(&self) -> PagedLayout {
        self.layout
    }

    /// A new empty sequence.
    pub fn add_sequence(&mut self) -> SequenceId {
        self.pool.add()
    }

    /// The live sequences.
    pub fn sequences(&self) -> Vec<SequenceId> {
        self.pool.ids()
    }

    /// Tokens `seq` holds.
    pub fn len(&self, seq: SequenceId) -> Result<usize> {
        Ok(self.pool.sequence(seq)?.len)
    }

    /// `seq`'s pages in token order: its block table.
    pub fn block_table(&self, seq: SequenceId) -> Result<&[u32]> {
        Ok(&self.pool.sequence(seq)?.pages)
    }

    /// Sequences holding `page` (0: the page is free).
    pub fn page_references(&self, page: u32) -> Result<u32> {
        self.pool.references(page)
    }

    /// Pages the pool holds, in use or free.
    pub fn pages(&self) -> usize {
        self.pool.pages()
    }

    /// Pages some sequence holds.
    pub fn pages_in_use(&self) -> usize {
        self.pool.pages_in_use()
    }

    /// Bytes the pool holds (keys and values), on the host or the device.
    pub fn bytes(&self) -> u64 {
        match &self.pages {
            Pages::Host(kv) => kv.bytes(),
            Pages::Device { pages, .. } => pages.bytes(),
        }
    }

    /// Stored bytes of one token's keys and values, every KV head: what a
    /// decoding step reads per cached token.
    pub fn token_bytes(&self) -> u64 {
        let (l, s) = (self.layout, self.storage);
        l.kv_heads as u64 * (s.row_bytes(l.head_dim) + s.row_bytes(l.v_head_dim))
    }

    /// A sequence that shares every token of `seq` (a common prefix, a beam):
    /// no page is copied until one of them appends into a shared page.
    pub fn fork(&mut self, seq: SequenceId) -> Result<SequenceId> {
        self.pool.fork(seq)
    }

    /// Ends `seq`; the pages no other sequence holds are free at once.
    pub fn free(&mut self, seq: SequenceId) -> Result<()> {
        self.pool.free(seq)
    }

    /// Appends `key` `[kv_heads, n, head_dim]` and `value` `[kv_heads, n,
    /// v_head_dim]` to `seq`.
    pub fn append(&mut self, seq: SequenceId, key: &HostTensor, value: &HostTensor) -> Result<()> {
        self.append_many(&[(seq, key, value)])
    }

    /// Appends to several sequences at once, each its own number of tokens.
    /// All or nothing: any refusal (a sequence not in the cache or named
    /// twice, a shape, the page limit, the host's memory) changes nothing.
    pub fn append_many(&mut self, items: &[Append<'_>]) -> Result<()> {
        let mut needed = 0;
        for (i, &(seq, key, value)) in items.iter().enumerate() {
            if items[..i].iter().any(|&(other, _, _)| other == seq) {
                return Err(Error::Conflict(
                    "a sequence is named twice in one append: concatenate its tokens",
                ));
            }
            let n = self.check_rows(key, value)?;
            let needs = self.pool.needs(seq, n)?;
            needed += usize::from(needs.copy_last) + needs.new_pages;
        }
        self.reserve(needed)?;
        for &(seq, key, value) in items {
            let n = key.shape()[1];
            let needs = self.pool.needs(seq, n)?;
            if needs.copy_last {
                let (old, new) = self.pool.copy_last_page(seq)?;
                match &mut self.pages {
                    Pages::Host(kv) => kv.copy_page(old, new),
                    Pages::Device { pages, .. } => pages.copy_page(old, new),
                }
            }
            self.pool.extend(seq, needs.new_pages)?;
            let sequence = self.pool.sequence(seq)?;
            let (held, start) = (sequence.pages.clone(), sequence.len);
            match &mut self.pages {
                Pages::Host(kv) => kv.write(&held, start, key.data(), value.data()),
                Pages::Device { pages, .. } => {
                    pages.write(true, &held, start, key.data());
                    pages.write(false, &held, start, value.data());
                }
            }
            self.pool.advance(seq, n)?;
        }
        Ok(())
    }

    /// Checks one append's tensors against the layout; returns its tokens.
    fn check_rows(&self, key: &HostTensor, value: &HostTensor) -> Result<usize> {
        let layout = self.layout;
        for (name, t) in [("key", key), ("value", value)] {
            if t.shape().len() != 3 {
                return Err(Error::Rank {
                    tensor: name,
                    expected: "3 ([kv_heads, tokens, head size])",
                    got: t.shape().to_vec(),
                });
            }
        }
        let mismatch = |tensor, dim, got, expected, expected_from| Error::ShapeMismatch {
            tensor,
            dim,
            got,
            expected,
            expected_from,
            hint: "append [kv_heads, tokens, head size] keys and values",
        };
        let checks = [
            (
                "key",
                "kv heads",
                key.shape()[0],
                layout.kv_heads,
                "the cache's layout",
            ),
            (
                "key",
                "head size",
                key.shape()[2],
                layout.head_dim,
                "the cache's layout",
            ),
            (
                "value",
                "kv heads",
                value.shape()[0],
                layout.kv_heads,
                "the cache's layout",
            ),
            (
                "value",
                "head size",
                value.shape()[2],
                layout.v_head_dim,
                "the cache's layout",
            ),
            ("value", "tokens", value.shape()[1], key.shape()[1], "key"),
        ];
        for (tensor, dim, got, expected, from) in checks {
            if got != expected {
                return Err(mismatch(tensor, dim, got, expected, from));
            }
        }
        Ok(key.shape()[1])
    }

    /// Makes `pages` free pages, growing the pool by whole chunks within the
    /// page limit; refuses (changing nothing) where it cannot.
    fn reserve(&mut self, pages: usize) -> Result<()> {
        if let Some(limit) = self.max_pages {
            if self.pool.pages_in_use() + pages > limit {
                return Err(Error::OutOfMemory(format!(
                    "the paged cache needs {pages} more pages, {} are free and its limit is \
                     {limit} pages ({} in use)",
                    self.pool.free_pages(),
                    self.pool.pages_in_use()
                )));
            }
        }
        let missing = pages.saturating_sub(self.pool.free_pages());
        if missing == 0 {
            return Ok(());
        }
        let chunks = missing.div_ceil(self.pages_per_chunk);
        let mut grown = self.pool.pages() + chunks * self.pages_per_chunk;
        match &mut self.pages {
            Pages::Host(kv) => kv.grow(chunks)?,
            // A device pool is copied whole when it grows: it at least
            // doubles, so a growing cache copies each page a few times at most.
            Pages::Device { pages, .. } => {
                let doubled = grown.max(2 * self.pool.pages());
                grown = match pages.grow_to(doubled) {
                    Ok(()) => doubled,
                    Err(_) => pages.grow_to(grown).map(|()| grown)?,
                };
            }
        }
        // The limit caps pages in use; the last chunk may pass it by its
        // tail, which no sequence is given.
        self.pool.grow(grown - self.pool.pages());
        Ok(())
    }

    /// `seq`'s keys `[1, kv_heads, len, head_dim]` and values `[1, kv_heads,
    /// len, v_head_dim]`, read through its block table (from the device,
    /// where the pages live there).
    pub async fn read(&self, seq: SequenceId) -> Result<(HostTensor, HostTensor)> {
        let s = self.pool.sequence(seq)?;
        let l = self.layout;
        let (k, v) = match &self.pages {
            Pages::Host(kv) => kv.read(&s.pages, s.len),
            Pages::Device { pages, .. } => pages.read(&s.pages, s.len).await?,
        };
        Ok((
            HostTensor::new([1, l.kv_heads, s.len, l.head_dim], k)?,
            HostTensor::new([1, l.kv_heads, s.len, l.v_head_dim], v)?,
        ))
    }

    /// How [`PagedKvCache::attention`] runs a call of `queries` with
    /// `options` on `engine` ([`PagedPlan`]): every query checked against
    /// its sequence, then the route (the paged decode kernel on device
    /// pages, its batches, blocks and layouts; the CPU backend on host
    /// pages in place; or the pages read back, with why) decided once.
    pub fn plan(
        &self,
        engine: &Engine,
        queries: &[(SequenceId, &HostTensor)],
        options: &AttentionOptions,
    ) -> Result<PagedPlan> {
        let dims = queries
            .iter()
            .map(|&(seq, q)| self.call_dims(seq, q, options))
            .collect::<Result<Vec<_>>>()?;
        self.plan_checked(engine, queries, &dims, options)
    }

    /// [`PagedKvCache::plan`] of queries whose calls are `dims`.
    fn plan_checked(
        &self,
        engine: &Engine,
        queries: &[(SequenceId, &HostTensor)],
        dims: &[AttentionDims],
        options: &AttentionOptions,
    ) -> Result<PagedPlan> {
        match &self.pages {
            Pages::Device { pages, device } => {
                if engine.device_key() != *device {
                    return Err(Error::Conflict(
                        "the paged cache's pages live on another engine's device: attend with \
                         the engine it was made on",
                    ));
                }
                Ok(match gpu::refusal(self, queries, options) {
                    Some(reason) => PagedPlan::ReadBack {
                        reason: reason.into(),
                    },
                    None => PagedPlan::DeviceKernel {
                        element: pages.element(),
                        batches: gpu::plan_batches(self, pages, dims),
                    },
                })
            }
            Pages::Host(_) => Ok(match host::plan(engine, queries, dims, options)? {
                Ok(calls) => PagedPlan::HostInPlace { calls },
                Err(reason) => PagedPlan::ReadBack { reason },
            }),
        }
    }

    /// Attention of each sequence's new queries `[1, q_heads, n, head_dim]`
    /// against its cached keys and values, on `engine`, as
    /// [`PagedKvCache::plan`] says: device pages read in place by the paged
    /// decode kernel, every sequence in one submission; host pages read in
    /// place by a CPU engine's backend; otherwise each sequence read back and
    /// run by the engine's host path. The queries are the sequence's last
    /// `n` tokens (append their keys and values first), so causal positions
    /// continue from its length. Every option of the contract applies to each
    /// sequence; `return_present` is refused (read the pages with
    /// [`PagedKvCache::read`]).
    pub async fn attention(
        &self,
        engine: &Engine,
        queries: &[(SequenceId, &HostTensor)],
        options: &AttentionOptions,
    ) -> Result<Vec<AttentionOutputs<HostTensor>>> {
        let dims = queries
            .iter()
            .map(|&(seq, q)| self.call_dims(seq, q, options))
            .collect::<Result<Vec<_>>>()?;
        match (
            self.plan_checked(engine, queries, &dims, options)?,
            &self.pages,
        ) {
            (PagedPlan::DeviceKernel { element, batches }, Pages::Device { pages, .. }) => {
                gpu::attention(self, pages, queries, options, (element, &batches)).await
            }
            (PagedPlan::HostInPlace { calls }, Pages::Host(kv)) => {
                host::attention(self, kv, engine, queries, options, (&dims, &calls))
            }
            _ => {
                let mut outputs = Vec::with_capacity(queries.len());
                for &(seq, query) in queries {
                    let (k, v, lengths) = self.sequence_inputs(seq, query, options).await?;
                    let mut inputs = AttentionInputs::new(query, &k, &v);
                    inputs.nonpad_kv_seqlen = Some(&lengths);
                    outputs.push(engine.attention_host(&inputs, options).await?);
                }
                Ok(outputs)
            }
        }
    }

    /// [`PagedKvCache::attention`] by the f64 oracle, on the same pages: the
    /// reference every path through the cache is checked against.
    pub async fn oracle(
        &self,
        seq: SequenceId,
        query: &HostTensor,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<HostTensor>> {
        let (k, v, lengths) = self.sequence_inputs(seq, query, options).await?;
        let mut inputs = AttentionInputs::new(query, &k, &v);
        inputs.nonpad_kv_seqlen = Some(&lengths);
        cpu::attention(&inputs, options)
    }

    /// `seq`'s keys, values and length for a call with `query`, checked.
    async fn sequence_inputs(
        &self,
        seq: SequenceId,
        query: &HostTensor,
        options: &AttentionOptions,
    ) -> Result<(HostTensor, HostTensor, Vec<i64>)> {
        self.check_query(seq, query, options)?;
        let (k, v) = self.read(seq).await?;
        Ok((k, v, vec![self.len(seq)? as i64]))
    }

    /// The dims of `seq`'s call with `query`, checked and validated as a
    /// padded call of one sequence whose `nonpad_kv_seqlen` is its length
    /// (so every option means what it means for padded keys).
    fn call_dims(
        &self,
        seq: SequenceId,
        query: &HostTensor,
        options: &AttentionOptions,
    ) -> Result<AttentionDims> {
        self.check_query(seq, query, options)?;
        let (l, len) = (self.layout, self.len(seq)?);
        let (q, k, v) = (
            Shape(query.shape().to_vec()),
            Shape(vec![1, l.kv_heads, len, l.head_dim]),
            Shape(vec![1, l.kv_heads, len, l.v_head_dim]),
        );
        let lengths = [len as i64];
        let mut inputs = AttentionInputs::new(&q, &k, &v);
        inputs.nonpad_kv_seqlen = Some(&lengths);
        validate(&inputs, options)
    }

    /// Checks a call's `query` for `seq`: no presents asked, no more
    /// queries than the sequence holds tokens.
    fn check_query(
        &self,
        seq: SequenceId,
        query: &HostTensor,
        options: &AttentionOptions,
    ) -> Result<()> {
        if options.return_present {
            return Err(Error::Conflict(
                "a paged cache returns no present K/V: read a sequence's pages with read()",
            ));
        }
        let len = self.len(seq)?;
        let n = query.shape().get(2).copied().unwrap_or(0);
        if query.shape().len() == 4 && n > len {
            return Err(Error::ShapeMismatch {
                tensor: "query",
                dim: "tokens",
                got: n,
                expected: len,
                expected_from: "the sequence's cached tokens",
                hint:
                    "the queries are a sequence's last tokens: append their keys and values first",
            });
        }
        Ok(())
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl PagedKvCache {
    /// [`PagedKvCache::attention`], blocking.
    pub fn attention_blocking(
        &self,
        engine: &Engine,
        queries: &[(SequenceId, &HostTensor)],
        options: &AttentionOptions,
    ) -> Result<Vec<AttentionOutputs<HostTensor>>> {
        pollster::block_on(self.attention(engine, queries, options))
    }

    /// [`PagedKvCache::read`], blocking.
    pub fn read_blocking(&self, seq: SequenceId) -> Result<(HostTensor, HostTensor)> {
        pollster::block_on(self.read(seq))
    }

    /// [`PagedKvCache::oracle`], blocking.
    pub fn oracle_blocking(
        &self,
        seq: SequenceId,
        query: &HostTensor,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<HostTensor>> {
        pollster::block_on(self.oracle(seq, query, options))
    }
}
