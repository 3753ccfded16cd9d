//! Tensors larger than one buffer, held as several.
//!
//! A device caps a buffer at `max_buffer_size` (4 GiB on the NVIDIA drivers
//! measured, 256 MiB by WebGPU's default), and K and V of a long decode are
//! larger: 8 batches x 32 heads x 64k keys x 128 f32 values is 8.6 GB each. Such a
//! tensor is held as a [`Chunked`]: consecutive runs of its row-major
//! elements, each in its own buffer. A chunk holds a power of two of whole
//! heads (the last two axes) where a head fits in a buffer, so the pieces
//! `run/split.rs` cuts by batches and heads lie inside one chunk and are read
//! in place; a piece that straddles two chunks is copied out of both. Chunks
//! are sized for f32 values even when they hold f16, so that widening one
//! gives a chunk that fits too.

use crate::device::buffer;
use crate::device::recorder::{box_runs, Recorder, Seg};
use crate::device::scope::Run;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// A tensor's values in several buffers: consecutive runs of its row-major
/// elements, `chunk_len` in each buffer but the last.
#[derive(Debug)]
pub(crate) struct Chunked {
    buffers: Vec<wgpu::Buffer>,
    chunk_len: usize,
    len: usize,
    /// Whether the values are f16, packed two to a 4-byte word.
    f16: bool,
}

impl Chunked {
    /// The buffers, in order.
    pub(crate) fn buffers(&self) -> &[wgpu::Buffer] {
        &self.buffers
    }

    /// Values in each buffer but the last.
    pub(crate) fn chunk_len(&self) -> usize {
        self.chunk_len
    }

    /// Values in chunk `i`.
    pub(crate) fn values_in(&self, i: usize) -> usize {
        (self.len - i * self.chunk_len).min(self.chunk_len)
    }

    /// Bytes of device memory the chunks take.
    pub(crate) fn bytes(&self) -> u64 {
        self.buffers.iter().map(wgpu::Buffer::size).sum()
    }

    /// Values per 4-byte word: 2 for f16, else 1.
    fn per_word(&self) -> usize {
        if self.f16 {
            2
        } else {
            1
        }
    }
}

/// The values per chunk of a tensor of `shape` and `dtype` where one buffer of
/// `max_buffer_size` bytes cannot hold it, else `None`: a power of two of
/// whole heads (`shape`'s last two axes), or of whole rows (its last axis)
/// where a head is larger than a buffer, in multiples of 8 values.
pub(crate) fn chunk_len(
    shape: &[usize],
    dtype: DType,
    max_buffer_size: u64,
) -> Result<Option<usize>> {
    let len = crate::tensor::checked_numel("tensor", shape)? as u64;
    let stored = match dtype {
        DType::F16 => len.div_ceil(2).checked_mul(4),
        _ => len.checked_mul(4),
    }
    .ok_or_else(|| {
        Error::buffer_limit(
            "a tensor's bytes",
            u64::MAX,
            max_buffer_size,
            "max_buffer_size",
        )
    })?;
    if stored
        .div_ceil(16)
        .checked_mul(16)
        .is_some_and(|padded| padded <= max_buffer_size)
    {
        return Ok(None);
    }
    // f32 values per buffer, so that a widened chunk fits one too (and, on
    // 32-bit targets, so that its bytes count in a usize).
    let most = (max_buffer_size.min(usize::MAX as u64) / 4) as usize;
    let rank = shape.len();
    let head = shape[rank.saturating_sub(2)..].iter().product::<usize>();
    let row = shape.last().copied().unwrap_or(1);
    let unit = [lcm(head, 8), lcm(row, 8), Some(8)]
        .into_iter()
        .flatten()
        .find(|&u| u <= most)
        .ok_or_else(|| {
            Error::buffer_limit(
                "one chunk of a tensor",
                32,
                max_buffer_size,
                "max_buffer_size",
            )
        })?;
    let mut chunk = unit;
    while chunk * 2 <= most {
        chunk *= 2;
    }
    Ok(Some(chunk))
}

/// The least common multiple, where it fits a usize.
fn lcm(a: usize, b: usize) -> Option<usize> {
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    (a.max(1) / gcd(a.max(1), b)).checked_mul(b)
}

/// Uploads `values` as `dtype` in chunks of `chunk_len` values.
pub(crate) fn upload(
    ctx: &Run,
    label: &str,
    values: &[f32],
    dtype: DType,
    chunk_len: usize,
) -> Result<Chunked> {
    let buffers = values
        .chunks(chunk_len)
        .map(|run| buffer::upload_values(ctx, label, run, dtype))
        .collect::<Result<Vec<_>>>()?;
    Ok(Chunked {
        buffers,
        chunk_len,
        len: values.len(),
        f16: dtype == DType::F16,
    })
}

/// Zero-filled chunks for `len` values of `dtype`.
pub(crate) fn storage(
    ctx: &Run,
    label: &str,
    len: usize,
    dtype: DType,
    chunk_len: usize,
) -> Result<Chunked> {
    let count = len.div_ceil(chunk_len).max(1);
    let buffers = (0..count)
        .map(|i| {
            let n = (len - i * chunk_len).min(chunk_len);
            match dtype {
                DType::F16 => buffer::f16_tensor_storage(ctx, label, n),
                _ => buffer::tensor_storage(ctx, label, n),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Chunked {
        buffers,
        chunk_len,
        len,
        f16: dtype == DType::F16,
    })
}

/// Chunks of the same layout in `buffers`, holding `dtype` values (the
/// values converted, say).
pub(crate) fn with_buffers(chunked: &Chunked, buffers: Vec<wgpu::Buffer>, dtype: DType) -> Chunked {
    debug_assert_eq!(buffers.len(), chunked.buffers.len());
    Chunked {
        buffers,
        chunk_len: chunked.chunk_len,
        len: chunked.len,
        f16: dtype == DType::F16,
    }
}

/// The `len` f16 values of one buffer copied into chunks of `chunk_len`
/// values (to widen them chunk by chunk where the f32 values would not fit
/// one buffer).
pub(crate) fn split_f16(
    ctx: &Run,
    src: &wgpu::Buffer,
    len: usize,
    chunk_len: usize,
) -> Result<Chunked> {
    let chunked = storage(ctx, "f16 tensor (in chunks)", len, DType::F16, chunk_len)?;
    debug_assert!(chunked.f16);
    ctx.encode("f16 tensor into chunks", |encoder| {
        for (i, dst) in chunked.buffers.iter().enumerate() {
            // Whole words: chunk_len is a multiple of 8 values, the buffers are padded.
            let bytes = chunked.values_in(i).div_ceil(2) as u64 * 4;
            let from = i as u64 * chunk_len as u64 * 2;
            encoder.copy_buffer_to_buffer(src, from, dst, 0, bytes);
        }
    });
    Ok(chunked)
}

/// Reads every chunk back, in order, as f32 values (f16 widened).
pub(crate) async fn read(ctx: &Run, chunked: &Chunked, dtype: DType) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(chunked.len);
    for (i, b) in chunked.buffers.iter().enumerate() {
        let n = chunked.values_in(i);
        out.extend(match dtype {
            DType::F16 => buffer::read_f16(ctx, b, n).await?,
            _ => buffer::read_f32(ctx, b, 0, n).await?,
        });
    }
    Ok(out)
}

/// Fills `chunks` (f32 values, or f16 packed two to a word) with the values
/// of `pattern`, a buffer of `period` values, repeated from the tensor's
/// first element on. `period` is even, so every copy moves whole words.
pub(crate) fn fill_repeated(
    encoder: &mut wgpu::CommandEncoder,
    pattern: &wgpu::Buffer,
    period: usize,
    dtype: DType,
    chunks: &[(&wgpu::Buffer, usize)],
) {
    let width = if dtype == DType::F16 { 2 } else { 4 };
    let period_bytes = period as u64 * width as u64;
    for &(target, first) in chunks {
        let phase = (first % period) as u64 * width as u64;
        let size = target.size();
        let mut at = 0;
        while at < size {
            let from = (phase + at) % period_bytes;
            let n = (period_bytes - from).min(size - at);
            encoder.copy_buffer_to_buffer(pattern, from, target, at, n);
            at += n;
        }
    }
}

/// A tensor's device storage as a call holds it: one buffer or several.
#[derive(Debug, Clone)]
pub(crate) enum Held {
    /// One buffer.
    One(std::sync::Arc<wgpu::Buffer>),
    /// Several buffers.
    Many(std::sync::Arc<Chunked>),
}

impl Held {
    /// One buffer.
    pub(crate) fn single(buffer: wgpu::Buffer) -> Held {
        Held::One(std::sync::Arc::new(buffer))
    }

    /// Bytes of device memory it takes.
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            Held::One(b) => b.size(),
            Held::Many(c) => c.bytes(),
        }
    }

    /// The storage as the GPU paths read it.
    pub(crate) fn source(&self) -> Source<'_> {
        match self {
            Held::One(b) => Source::whole(b),
            Held::Many(c) => Source::Chunks(c),
        }
    }
}

/// A call's tensor as the GPU paths read it: one buffer (or a view of one),
/// or several chunks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source<'a> {
    /// One buffer, or a view of one.
    One(Seg<'a>),
    /// Several buffers.
    Chunks(&'a Chunked),
}

impl<'a> Source<'a> {
    /// The whole buffer `b`.
    pub(crate) fn whole(b: &'a wgpu::Buffer) -> Self {
        Source::One(Seg::whole(b))
    }

    /// The view a kernel binds; a tensor in several buffers is cut into
    /// pieces by `run/split.rs` before it reaches a kernel.
    pub(crate) fn seg(&self) -> Result<Seg<'a>> {
        match self {
            Source::One(seg) => Ok(*seg),
            Source::Chunks(_) => Err(Error::Conflict(
                "a tensor held in several buffers goes to a kernel only in pieces",
            )),
        }
    }

    /// The whole buffer, for the steps that bind or copy one whole.
    pub(crate) fn whole_buffer(&self) -> Option<&'a wgpu::Buffer> {
        match self {
            Source::One(seg) if seg.is_whole() => Some(seg.buffer),
            _ => None,
        }
    }

    /// Values per chunk, where the tensor is held in several buffers.
    pub(crate) fn chunk_len(&self) -> Option<usize> {
        match self {
            Source::One(_) => None,
            Source::Chunks(c) => Some(c.chunk_len),
        }
    }

    /// The `len` values from element `at` (of `width` bytes each) as one
    /// view, where they lie in one buffer.
    pub(crate) fn run(&self, at: usize, len: usize, width: usize) -> Option<Seg<'a>> {
        let (buffer, base, local) = match self {
            Source::One(seg) => (seg.buffer, seg.offset, at),
            Source::Chunks(c) => {
                let i = at / c.chunk_len;
                let local = at - i * c.chunk_len;
                if i >= c.buffers.len() || local + len > c.values_in(i) {
                    return None;
                }
                (&c.buffers[i], 0, local)
            }
        };
        Some(Seg {
            buffer,
            offset: base + local as u64 * width as u64,
            size: Some(len as u64 * width as u64),
        })
    }

    /// The first stretch of 4-byte units `at..at + len` (f32 values, or
    /// words of two f16 values) inside one buffer: (buffer, first unit in
    /// it, units).
    fn span_at(&self, at: usize, len: usize) -> (&'a wgpu::Buffer, usize, usize) {
        match self {
            Source::One(seg) => (seg.buffer, seg.offset as usize / 4 + at, len),
            Source::Chunks(c) => {
                // chunk_len is a multiple of 8 values: whole words per chunk.
                let per_chunk = c.chunk_len / c.per_word();
                let i = at / per_chunk;
                let start = i * per_chunk;
                let end = start + c.values_in(i).div_ceil(c.per_word());
                (&c.buffers[i], at - start, len.min(end - at))
            }
        }
    }
}

/// Records the copies that move the box `extent` at `src_start` of a tensor
/// of `src_shape` to `dst_start` of one of `dst_shape`, either of them in one
/// buffer or several: each run split where a buffer changes. Shapes count
/// 4-byte units: f32 values, or words of two f16 values (the last axis
/// halved).
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_box_between(
    rec: &mut Recorder<'_>,
    src: Source<'_>,
    src_shape: [usize; 4],
    src_start: [usize; 4],
    dst: Source<'_>,
    dst_shape: [usize; 4],
    dst_start: [usize; 4],
    extent: [usize; 4],
) {
    let runs = box_runs(src_shape, src_start, dst_shape, dst_start, extent);
    copy_runs(rec, src, dst, &runs);
}

/// Records copies of `(source unit, destination unit, units)` runs (4-byte
/// units), each split where a buffer of either side changes.
pub(crate) fn copy_runs(
    rec: &mut Recorder<'_>,
    src: Source<'_>,
    dst: Source<'_>,
    runs: &[(usize, usize, usize)],
) {
    for &(mut s, mut d, mut len) in runs {
        while len > 0 {
            let (sb, sat, sn) = src.span_at(s, len);
            let (db, dat, dn) = dst.span_at(d, len);
            let n = sn.min(dn);
            rec.copy(sb, sat, db, dat, n);
            (s, d, len) = (s + n, d + n, len - n);
        }
    }
}

/// Zero-filled f32 storage for a call's output of `shape`: one buffer, or
/// several where one cannot hold it.
pub(crate) fn output(ctx: &Run, label: &str, shape: [usize; 4]) -> Result<Held> {
    allocate(ctx, label, shape, DType::F32)
}

/// Zero-filled storage for a tensor of `shape` and `dtype` (f16 packed two to
/// a word): one buffer, or several where one cannot hold it.
pub(crate) fn allocate(ctx: &Run, label: &str, shape: [usize; 4], dtype: DType) -> Result<Held> {
    // chunk_len checks that the element count fits a usize.
    let chunks = chunk_len(&shape, dtype, ctx.caps.limits.max_buffer_size)?;
    let len = shape.iter().product();
    Ok(match chunks {
        Some(n) => Held::Many(std::sync::Arc::new(storage(ctx, label, len, dtype, n)?)),
        None => Held::One(std::sync::Arc::new(match dtype {
            DType::F16 => buffer::f16_tensor_storage(ctx, label, len)?,
            _ => buffer::tensor_storage(ctx, label, len)?,
        })),
    })
}

/// A buffer of the call's own holding the `words` 4-byte words of `src` from
/// byte `offset` (a multiple of 4): a tensor wrapped at an offset, which the
/// kernels, binding whole buffers, cannot read in place.
pub(crate) async fn contiguous(
    ctx: &Run,
    src: &wgpu::Buffer,
    offset: u64,
    words: usize,
) -> Result<wgpu::Buffer> {
    let what = "copying a wrapped tensor from its offset";
    ctx.scoped(what, || {
        let size = buffer::f32_bytes(words);
        buffer::check_buffer(ctx, what, size)?;
        let dst = buffer::create(
            ctx,
            "wrapped tensor",
            size,
            crate::device::arena::Kind::Filled,
        );
        let mut rec = Recorder::new(ctx, what);
        rec.copy(src, (offset / 4) as usize, &dst, 0, words);
        rec.submit();
        Ok(dst)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_that_fit_one_buffer_are_not_chunked() {
        assert_eq!(
            chunk_len(&[2, 4, 16, 8], DType::F32, 1 << 20).unwrap(),
            None
        );
        // 1024 f16 values take 2 KiB: one buffer of 2 KiB holds them.
        assert_eq!(chunk_len(&[1, 1, 1024], DType::F16, 2048).unwrap(), None);
    }

    #[test]
    fn chunks_hold_a_power_of_two_of_whole_heads() {
        // Heads of 100 x 64 values (25,600 bytes); a buffer of 64 KiB holds 16,384
        // values: lcm(6400, 8) = 6400, twice that is 12,800.
        let n = chunk_len(&[2, 8, 100, 64], DType::F32, 64 << 10).unwrap();
        assert_eq!(n, Some(12_800));
        // f16 chunks are sized for f32, so a widened chunk fits too.
        let n = chunk_len(&[2, 8, 100, 64], DType::F16, 64 << 10).unwrap();
        assert_eq!(n, Some(12_800));
        // A head larger than a buffer: whole rows, in multiples of 8 values.
        let n = chunk_len(&[1, 1, 10_000, 3], DType::F32, 4096).unwrap();
        assert_eq!(n, Some(768));
        // An odd head of 7 x 5 values: lcm(35, 8) = 280.
        let n = chunk_len(&[4, 4, 7, 5], DType::F32, 2048).unwrap();
        assert_eq!(n, Some(280));
    }

    #[test]
    fn least_common_multiples() {
        assert_eq!(lcm(6, 8), Some(24));
        assert_eq!(lcm(8, 8), Some(8));
        assert_eq!(lcm(0, 8), Some(8));
        assert_eq!(lcm(usize::MAX, 8), None);
    }
}
