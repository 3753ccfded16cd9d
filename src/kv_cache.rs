//! A preallocated KV cache: keys and values of every sequence of a batch in
//! `[B, Hkv, capacity, D]` tensors on the engine, appended in place.
//!
//! Appending `n` tokens copies `n` rows per (sequence, KV head): O(new
//! tokens), whatever is cached. When a sequence would pass the capacity, the
//! cache grows to twice its capacity (or what is needed, where the device
//! lacks the memory to double), copying once; a cache larger than one buffer
//! is held in several (`device/chunks.rs`), which attention reads in pieces. The
//! sequences of a batch may hold different lengths ([`KvCache::append_ragged`]).
//!
//! Attention reads the cache as it is: K and V are the whole capacity and the
//! lengths go in as ONNX's `nonpad_kv_seqlen` ([`KvCache::attention_inputs`]),
//! so keys past a sequence's length are masked (and their tiles skipped), and
//! causal positions continue from the lengths: the new queries are the last
//! tokens of each sequence, as ONNX's external-cache form defines. Where a
//! caller needs ONNX's `present_key/value` as fresh tensors,
//! [`KvCache::present`] copies them out.

use std::sync::Arc;

use crate::device::chunks;
use crate::device::chunks::Held;
use crate::device::recorder::{box_runs, Recorder};
use crate::device::scope::Run;
use crate::device_tensor::{Storage, Tensor};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::problem::AttentionInputs;
use crate::tensor::{checked_numel, DType, HostTensor};

/// Capacity of a cache's first allocation unless asked otherwise (tokens).
pub const DEFAULT_CAPACITY: usize = 256;

/// Keys and values of a batch of sequences, preallocated and appended in place.
///
/// A clone shares the storage until one of them appends: the one that
/// appends then copies (beam search and speculative decoding can fork a cache).
#[derive(Debug, Clone)]
pub struct KvCache {
    key: Option<Tensor>,
    value: Option<Tensor>,
    lengths: Vec<usize>,
    first_capacity: usize,
}

impl Default for KvCache {
    fn default() -> KvCache {
        KvCache::with_capacity(DEFAULT_CAPACITY)
    }
}

impl KvCache {
    /// An empty cache; the first append sets the batch, heads and head dims,
    /// and allocates [`DEFAULT_CAPACITY`] tokens (or what it needs).
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// An empty cache whose first allocation holds at least `capacity` tokens.
    pub fn with_capacity(capacity: usize) -> KvCache {
        KvCache {
            key: None,
            value: None,
            lengths: Vec::new(),
            first_capacity: capacity.max(1),
        }
    }

    /// The longest sequence's length (every sequence's, unless appended ragged).
    pub fn len(&self) -> usize {
        self.lengths.iter().copied().max().unwrap_or(0)
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens cached per sequence.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// Tokens each sequence can hold before the cache grows (0 before the first append).
    pub fn capacity(&self) -> usize {
        self.key.as_ref().map_or(0, |k| k.shape()[2])
    }

    /// The cache's storage, `[B, Hkv, capacity, Dk]` and `[B, Hkv, capacity, Dv]`:
    /// rows past a sequence's length are unused.
    pub fn tensors(&self) -> Option<(&Tensor, &Tensor)> {
        Some((self.key.as_ref()?, self.value.as_ref()?))
    }

    /// The lengths as `nonpad_kv_seqlen`.
    pub fn nonpad_lengths(&self) -> Vec<i64> {
        self.lengths.iter().map(|&n| n as i64).collect()
    }

    /// Attention inputs that read the cache in place: `query` against the
    /// cached keys and values, with the lengths as `nonpad_kv_seqlen` (pass
    /// [`KvCache::nonpad_lengths`]). The cache must hold something.
    pub fn attention_inputs<'a>(
        &'a self,
        query: &'a Tensor,
        lengths: &'a [i64],
    ) -> Result<AttentionInputs<'a, Tensor>> {
        let (k, v) = self.tensors().ok_or(Error::Conflict(
            "the KV cache is empty: append keys and values first",
        ))?;
        let mut inputs = AttentionInputs::new(query, k, v);
        inputs.nonpad_kv_seqlen = Some(lengths);
        Ok(inputs)
    }

    /// Appends `key` `[B, Hkv, n, Dk]` and `value` `[B, Hkv, n, Dv]`: `n`
    /// tokens to every sequence.
    pub async fn append(&mut self, engine: &Engine, key: &Tensor, value: &Tensor) -> Result<()> {
        let n = key.shape().get(2).copied().unwrap_or(0);
        let counts = vec![n; key.shape().first().copied().unwrap_or(0)];
        self.append_ragged(engine, key, value, &counts).await
    }

    /// Appends the last `counts[b]` of the `n` rows of `key` and `value` to
    /// sequence `b` (the rows before them are padding), so a batch of
    /// sequences of different lengths shares one cache. Padding comes first
    /// because attention through the lengths places a step's queries at the
    /// end of each sequence (ONNX's `nonpad_kv_seqlen` offset): query row i of
    /// `n` sits at position `length - n + i`, so a sequence's real queries are
    /// its last `counts[b]` rows too.
    pub async fn append_ragged(
        &mut self,
        engine: &Engine,
        key: &Tensor,
        value: &Tensor,
        counts: &[usize],
    ) -> Result<()> {
        // Tensors wrapped at an offset are appended from copies of their own.
        let (key_copy, value_copy) = match engine.gpu() {
            Some(ctx) if key.is_on_gpu() || value.is_on_gpu() => (
                crate::device_tensor::unview(&Run::new(ctx), engine.own("key", key)?).await?,
                crate::device_tensor::unview(&Run::new(ctx), engine.own("value", value)?).await?,
            ),
            _ => (None, None),
        };
        let key = key_copy.as_ref().unwrap_or(key);
        let value = value_copy.as_ref().unwrap_or(value);
        let [b, h, n, dk] = rank4("key", key)?;
        let [vb, vh, vn, dv] = rank4("value", value)?;
        for (dim, got, expected) in [("batch", vb, b), ("heads", vh, h), ("length", vn, n)] {
            if got != expected {
                return Err(Error::ShapeMismatch {
                    tensor: "value",
                    dim,
                    got,
                    expected,
                    expected_from: "key",
                    hint: "keys and values of a step hold the same tokens",
                });
            }
        }
        if counts.len() != b {
            return Err(Error::ShapeMismatch {
                tensor: "counts",
                dim: "length",
                got: counts.len(),
                expected: b,
                expected_from: "the batch of key",
                hint: "give one count per sequence",
            });
        }
        if let Some(&bad) = counts.iter().find(|&&c| c > n) {
            return Err(Error::InvalidOption {
                name: "counts",
                value: bad.to_string(),
                reason: "a sequence cannot take more tokens than the step holds",
            });
        }
        if let Some((k, v)) = self.tensors() {
            let expected = [k.shape()[0], k.shape()[1], k.shape()[3], v.shape()[3]];
            for (dim, got, want) in [
                ("batch", b, expected[0]),
                ("heads", h, expected[1]),
                ("head dim", dk, expected[2]),
                ("value head dim", dv, expected[3]),
            ] {
                if got != want {
                    return Err(Error::ShapeMismatch {
                        tensor: "key",
                        dim,
                        got,
                        expected: want,
                        expected_from: "the KV cache",
                        hint: "use one cache per batch of sequences and layer",
                    });
                }
            }
        }
        engine.own("key", key)?;
        engine.own("value", value)?;
        check_dtype("key", key, self.key.as_ref(), engine)?;
        check_dtype("value", value, self.value.as_ref(), engine)?;
        if let Some((k, v)) = self.tensors() {
            engine.own("the KV cache's keys", k)?;
            engine.own("the KV cache's values", v)?;
        }
        let lengths = if self.lengths.is_empty() {
            vec![0; b]
        } else {
            self.lengths.clone()
        };
        let needed = lengths
            .iter()
            .zip(counts)
            .map(|(l, c)| l + c)
            .max()
            .unwrap_or(0);
        let capacity = self.capacity();
        if needed <= capacity {
            return self
                .append_into(engine, key, value, capacity, lengths, counts)
                .await;
        }
        // Twice the capacity, but within one buffer while what is needed
        // fits one (attention reads a cache in one buffer whole); past that
        // a cache is held in several, and where the device lacks the memory
        // to double, it takes what is needed.
        let mut doubled = capacity
            .saturating_mul(2)
            .max(needed)
            .max(self.first_capacity);
        let row_bytes = 4 * (b * h * dk.max(dv)).max(1) as u64;
        let one_buffer = engine.capabilities().map_or(u64::MAX, |c| {
            c.limits.max_buffer_size.saturating_sub(16) / row_bytes
        });
        let one_buffer = usize::try_from(one_buffer).unwrap_or(usize::MAX);
        if needed <= one_buffer {
            doubled = doubled.min(one_buffer);
        }
        // Where the memory for that is missing (a first capacity larger than
        // the device or the host holds): twice the present, then what is needed.
        let mut tries: Vec<usize> = Vec::new();
        for c in [doubled, capacity.saturating_mul(2).max(needed), needed] {
            if tries.last().is_none_or(|&l| c < l) {
                tries.push(c);
            }
        }
        let (&last, larger) = tries.split_last().expect("at least one capacity");
        for &c in larger {
            match self
                .append_into(engine, key, value, c, lengths.clone(), counts)
                .await
            {
                Err(Error::OutOfMemory(_)) => {}
                done => return done,
            }
        }
        self.append_into(engine, key, value, last, lengths, counts)
            .await
    }

    /// Appends into a cache of `capacity` tokens per sequence (a fresh one
    /// where that differs from the present capacity).
    async fn append_into(
        &mut self,
        engine: &Engine,
        key: &Tensor,
        value: &Tensor,
        capacity: usize,
        lengths: Vec<usize>,
        counts: &[usize],
    ) -> Result<()> {
        let [b, h, _, dk] = rank4("key", key)?;
        let dv = value.shape()[3];
        let key_shape = [b, h, capacity, dk];
        let value_shape = [b, h, capacity, dv];
        // A capacity whose element count overflows is more memory than any
        // device or host has: the growth then retries smaller.
        for shape in [key_shape, value_shape] {
            checked_numel("the KV cache", &shape).map_err(|_| {
                Error::OutOfMemory(format!(
                    "growing the KV cache to {capacity} tokens per sequence"
                ))
            })?;
        }
        // Growing on a GPU: both new tensors are allocated before anything is
        // recorded, so a device without the memory for them has nothing in
        // flight to free before a smaller try.
        let (key_dst, value_dst) = match engine.gpu() {
            Some(device) if capacity != self.capacity() => {
                let run = Run::new(device);
                let ctx = &run;
                let (k, v) = ctx
                    .scoped("KV cache growth", || {
                        Ok((
                            chunks::allocate(ctx, "KV cache", key_shape, key.dtype())?,
                            chunks::allocate(ctx, "KV cache", value_shape, value.dtype())?,
                        ))
                    })
                    .await?;
                (Some(k), Some(v))
            }
            _ => (None, None),
        };
        // Both tensors are built before either is replaced: a failed append
        // (memory, limits) leaves the cache as it was.
        let new_key = append_rows(
            engine,
            self.key.as_mut(),
            ("key", key),
            (key_shape, key_dst),
            &lengths,
            counts,
        )
        .await?;
        let new_value = append_rows(
            engine,
            self.value.as_mut(),
            ("value", value),
            (value_shape, value_dst),
            &lengths,
            counts,
        )
        .await?;
        if let Some(t) = new_key {
            self.key = Some(t);
        }
        if let Some(t) = new_value {
            self.value = Some(t);
        }
        self.lengths = lengths.iter().zip(counts).map(|(l, c)| l + c).collect();
        Ok(())
    }

    /// Records the append of `n` tokens to every sequence into `rec`, copied
    /// from `key` `[B, Hkv, n, Dk]` and `value` `[B, Hkv, n, Dv]` (f32 buffers
    /// of the engine's device), in place: a decoder step's append in its one
    /// submission. Records nothing and returns `false` unless the cache holds
    /// f32 rows in one buffer each, has room for the tokens, and shares its
    /// storage with no clone; [`KvCache::append`] covers those cases.
    pub(crate) fn record_append(
        &mut self,
        rec: &mut Recorder<'_>,
        key: &wgpu::Buffer,
        value: &wgpu::Buffer,
        n: usize,
    ) -> bool {
        let Some((kb, vb)) = self.in_place_buffers(n) else {
            return false;
        };
        let (k, v) = (
            self.key.as_ref().expect("checked"),
            self.value.as_ref().expect("checked"),
        );
        for (dst, src, shape) in [(&kb, key, k.shape()), (&vb, value, v.shape())] {
            let cache_shape = [shape[0], shape[1], shape[2], shape[3]];
            let new_shape = [shape[0], shape[1], n, shape[3]];
            for (b, &len) in self.lengths.iter().enumerate() {
                let runs = box_runs(
                    new_shape,
                    [b, 0, 0, 0],
                    cache_shape,
                    [b, 0, len, 0],
                    [1, shape[1], n, shape[3]],
                );
                for (from, to, count) in runs {
                    rec.copy(src, from, dst, to, count);
                }
            }
        }
        for len in &mut self.lengths {
            *len += n;
        }
        true
    }

    /// Where `n` new tokens per sequence go in place when every sequence
    /// holds the same number of tokens (a decoder's steps): the cache's K
    /// and V buffers, its capacity and that number. A kernel the caller
    /// records writes them there, and [`KvCache::note_appended`] counts them.
    pub(crate) fn uniform_slot(
        &self,
        n: usize,
    ) -> Option<(Arc<wgpu::Buffer>, Arc<wgpu::Buffer>, usize, usize)> {
        let (kb, vb) = self.in_place_buffers(n)?;
        let len = *self.lengths.first()?;
        let capacity = self.key.as_ref()?.shape()[2];
        self.lengths
            .iter()
            .all(|&l| l == len)
            .then_some((kb, vb, capacity, len))
    }

    /// Counts `n` tokens per sequence written in place by the caller's kernel
    /// (see [`KvCache::uniform_slot`]).
    pub(crate) fn note_appended(&mut self, n: usize) {
        for len in &mut self.lengths {
            *len += n;
        }
    }

    /// Whether `n` tokens per sequence can be appended in place by
    /// [`KvCache::record_append`].
    pub(crate) fn has_room_in_place(&self, n: usize) -> bool {
        self.in_place_buffers(n).is_some()
    }

    fn in_place_buffers(&self, n: usize) -> Option<(Arc<wgpu::Buffer>, Arc<wgpu::Buffer>)> {
        let (Some(k), Some(v)) = (&self.key, &self.value) else {
            return None;
        };
        let (Storage::Gpu(kb), Storage::Gpu(vb)) = (&k.storage, &v.storage) else {
            return None;
        };
        let unshared = Arc::strong_count(kb) == 1 && Arc::strong_count(vb) == 1;
        let f32_rows = k.dtype() == DType::F32 && v.dtype() == DType::F32;
        let capacity = k.shape()[2];
        let room = self.lengths.iter().all(|&len| len + n <= capacity);
        (unshared && f32_rows && room).then(|| (kb.clone(), vb.clone()))
    }

    /// Forgets the tokens appended since the cache held `lengths` (a failed step).
    pub(crate) fn forget_since(&mut self, lengths: &[usize]) {
        if lengths.is_empty() {
            *self = KvCache::with_capacity(self.first_capacity);
        } else {
            self.lengths = lengths.to_vec();
        }
    }

    /// `present_key/value` as ONNX defines them: fresh `[B, Hkv, T, D]`
    /// copies of the cached tokens, T the common length (the sequences must
    /// hold the same number of tokens).
    pub async fn present(&self, engine: &Engine) -> Result<(Tensor, Tensor)> {
        let (k, v) = self.tensors().ok_or(Error::Conflict(
            "the KV cache is empty: append keys and values first",
        ))?;
        let t = self.len();
        if self.lengths.iter().any(|&l| l != t) {
            return Err(Error::Conflict(
                "present_key/value need sequences of one length; read ragged \
                 sequences with attention_inputs",
            ));
        }
        Ok((
            copy_rows(engine, k, t).await?,
            copy_rows(engine, v, t).await?,
        ))
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl KvCache {
    /// [`KvCache::append`], blocking.
    pub fn append_blocking(&mut self, engine: &Engine, key: &Tensor, value: &Tensor) -> Result<()> {
        pollster::block_on(self.append(engine, key, value))
    }

    /// [`KvCache::append_ragged`], blocking.
    pub fn append_ragged_blocking(
        &mut self,
        engine: &Engine,
        key: &Tensor,
        value: &Tensor,
        counts: &[usize],
    ) -> Result<()> {
        pollster::block_on(self.append_ragged(engine, key, value, counts))
    }

    /// [`KvCache::present`], blocking.
    pub fn present_blocking(&self, engine: &Engine) -> Result<(Tensor, Tensor)> {
        pollster::block_on(self.present(engine))
    }
}

/// A step's tensor must have the cache's dtype (the first step's), and an
/// f16 cache on a GPU an even head dim: its rows are copied as whole words.
fn check_dtype(
    name: &'static str,
    step: &Tensor,
    cache: Option<&Tensor>,
    engine: &Engine,
) -> Result<()> {
    if let Some(cache) = cache {
        if cache.dtype() != step.dtype() {
            return Err(Error::DType {
                tensor: name,
                expected: match cache.dtype() {
                    DType::F16 => "float16, as the KV cache holds",
                    _ => "float32, as the KV cache holds",
                },
                got: step.dtype().to_string(),
            });
        }
    }
    if step.dtype() == DType::F16 && engine.gpu().is_some() && step.shape()[3] % 2 == 1 {
        return Err(Error::DType {
            tensor: name,
            expected:
                "float32 for an odd head dim (an f16 cache copies rows as whole 4-byte words)",
            got: step.dtype().to_string(),
        });
    }
    Ok(())
}

/// Shape in the units a GPU copy moves: f32 values, or words of two f16s
/// (the last dim halved; even, as [`check_dtype`] requires).
fn copy_units(shape: [usize; 4], dtype: DType) -> [usize; 4] {
    match dtype {
        DType::F16 => [shape[0], shape[1], shape[2], shape[3] / 2],
        _ => shape,
    }
}

fn rank4(name: &'static str, t: &Tensor) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(t.shape()).map_err(|_| Error::Rank {
        tensor: name,
        expected: "4 ([batch, kv_heads, tokens, head_dim])",
        got: t.shape().to_vec(),
    })
}

/// Appends `counts[b]` rows of `new` (its last ones: a step's padding comes
/// first, as its queries are right-aligned) to sequence b at `lengths[b]` of
/// the cache tensor `old`. In place when `old` has `shape`'s capacity and no
/// clone of the cache shares its storage (returns `None`); else into a fresh
/// tensor of `shape` (on a GPU, `allocated` where given), `old`'s rows first
/// (returns it). Nothing of `old` is
/// dropped here, so a failed append leaves the cache whole.
async fn append_rows(
    engine: &Engine,
    old: Option<&mut Tensor>,
    (name, new): (&'static str, &Tensor),
    (shape, allocated): ([usize; 4], Option<Held>),
    lengths: &[usize],
    counts: &[usize],
) -> Result<Option<Tensor>> {
    let dtype = new.dtype();
    // On a GPU, f16 rows are copied as words of two values.
    let unit = |s: [usize; 4]| match engine.gpu() {
        Some(_) => copy_units(s, dtype),
        None => s,
    };
    let new_shape = unit(<[usize; 4]>::try_from(new.shape()).expect("checked rank"));
    let old_shape = old
        .as_ref()
        .map(|t| unit(<[usize; 4]>::try_from(t.shape()).expect("a cache tensor")));
    let full_shape = shape;
    let shape = unit(shape);
    // (source element in `old` or `new`, destination element, length) runs.
    let mut fresh = Vec::new();
    for (b, (&len, &count)) in lengths.iter().zip(counts).enumerate() {
        let extent = [1, shape[1], count, shape[3]];
        let first = new_shape[2] - count;
        fresh.extend(box_runs(
            new_shape,
            [b, 0, first, 0],
            shape,
            [b, 0, len, 0],
            extent,
        ));
    }
    let same_capacity = old_shape.is_some_and(|s| s[2] == shape[2]);
    let keep = |s: [usize; 4]| box_runs(s, [0; 4], shape, [0; 4], s);
    match engine.gpu() {
        Some(device) => {
            let run = Run::new(device);
            let ctx = &run;
            let new_held = new
                .storage
                .held()
                .ok_or(Error::ForeignTensor { tensor: name })?;
            let old_held = match &old {
                Some(t) => Some(t.storage.held().ok_or(Error::ForeignTensor {
                    tensor: "the KV cache",
                })?),
                None => None,
            };
            // Another holder of the storage (a clone of the cache) keeps its
            // rows; `old_held` is the second reference here.
            let in_place = same_capacity
                && old_held.as_ref().is_some_and(|h| match h {
                    Held::One(b) => Arc::strong_count(b) == 2,
                    Held::Many(c) => Arc::strong_count(c) == 2,
                });
            ctx.scoped("KV cache append", || {
                let mut rec = Recorder::new(ctx, "KV cache append");
                // A cache larger than one buffer is held in several (device/chunks.rs).
                let replaced = match (in_place, allocated) {
                    (true, _) => None,
                    (false, Some(h)) => Some(h),
                    (false, None) => Some(chunks::allocate(ctx, "KV cache", full_shape, dtype)?),
                };
                let dst = match (&replaced, &old_held) {
                    (Some(h), _) | (None, Some(h)) => h.source(),
                    (None, None) => unreachable!("in place needs a cache tensor"),
                };
                // f16 words or f32 values: either way one 4-byte unit each.
                if let (Some(src), Some(s), Some(_)) = (&old_held, old_shape, &replaced) {
                    chunks::copy_runs(&mut rec, src.source(), dst, &keep(s));
                }
                chunks::copy_runs(&mut rec, new_held.source(), dst, &fresh);
                rec.submit();
                Ok(replaced.map(|h| engine.wrap_held(full_shape.to_vec(), h, dtype)))
            })
            .await
        }
        None => {
            let src = match &new.storage {
                Storage::Host(h) => h.data(),
                Storage::Gpu(_) | Storage::GpuChunks(_) | Storage::GpuAt(..) => {
                    return Err(Error::ForeignTensor { tensor: name })
                }
            };
            match old {
                // In place: copy-on-write when a clone of the cache shares the values.
                Some(t) if same_capacity => {
                    let Storage::Host(values) = &mut t.storage else {
                        return Err(Error::ForeignTensor {
                            tensor: "the KV cache",
                        });
                    };
                    let data = Arc::make_mut(values).data_mut();
                    for &(from, to, len) in &fresh {
                        data[to..to + len].copy_from_slice(&src[from..from + len]);
                    }
                    Ok(None)
                }
                old => {
                    // A typed error, not an abort, where the host cannot hold
                    // the grown cache: the growth then retries smaller, as on
                    // a GPU. (`append_into` checked that the count fits.)
                    let numel = shape.iter().product();
                    let mut data = Vec::new();
                    data.try_reserve_exact(numel).map_err(|_| {
                        Error::OutOfMemory(format!(
                            "growing the KV cache to {} tokens per sequence in host memory",
                            shape[2]
                        ))
                    })?;
                    data.resize(numel, 0.0f32);
                    if let Some(t) = old {
                        let Storage::Host(values) = &t.storage else {
                            return Err(Error::ForeignTensor {
                                tensor: "the KV cache",
                            });
                        };
                        let s = <[usize; 4]>::try_from(t.shape()).expect("a cache tensor");
                        for (from, to, len) in keep(s) {
                            data[to..to + len].copy_from_slice(&values.data()[from..from + len]);
                        }
                    }
                    for &(from, to, len) in &fresh {
                        data[to..to + len].copy_from_slice(&src[from..from + len]);
                    }
                    Ok(Some(engine.wrap_host(
                        HostTensor::new(shape.to_vec(), data)?.into_dtype(dtype),
                    )))
                }
            }
        }
    }
}

/// The first `rows` tokens of a cache tensor, as a fresh `[B, Hkv, rows, D]` tensor.
async fn copy_rows(engine: &Engine, t: &Tensor, rows: usize) -> Result<Tensor> {
    let shape = <[usize; 4]>::try_from(t.shape()).expect("a cache tensor");
    let out = [shape[0], shape[1], rows, shape[3]];
    if let Storage::Host(h) = &t.storage {
        let runs = box_runs(shape, [0; 4], out, [0; 4], out);
        let mut data = vec![0.0f32; out.iter().product()];
        for &(s, d, len) in &runs {
            data[d..d + len].copy_from_slice(&h.data()[s..s + len]);
        }
        return Ok(engine.wrap_host(HostTensor::new(out.to_vec(), data)?.into_dtype(t.dtype())));
    }
    let (Some(device), Some(src)) = (engine.gpu(), t.storage.held()) else {
        return Err(Error::ForeignTensor {
            tensor: "the KV cache",
        });
    };
    let run = Run::new(device);
    let ctx = &run;
    // f16 rows move as words of two values.
    let (units, out_units) = (copy_units(shape, t.dtype()), copy_units(out, t.dtype()));
    let runs = box_runs(units, [0; 4], out_units, [0; 4], out_units);
    ctx.scoped("present from the KV cache", || {
        let dst = chunks::allocate(ctx, "present", out, t.dtype())?;
        let mut rec = Recorder::new(ctx, "present from the KV cache");
        chunks::copy_runs(&mut rec, src.source(), dst.source(), &runs);
        rec.submit();
        Ok(engine.wrap_held(out.to_vec(), dst, t.dtype()))
    })
    .await
}
