//! Buffer creation with limit checks, uploads, and wasm-safe readback.

use wgpu::util::DeviceExt;

use crate::device::arena::Kind;
use crate::device::context::GpuContext;
use crate::device::scope::Run;
use crate::device::staging::StagingPool;
use crate::error::{Error, Result};

/// Usages of every storage buffer the engine creates: bindable, copyable both ways.
const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Checks that `bytes` fits in one buffer that can be bound whole as storage.
pub(crate) fn check_bindable(ctx: &GpuContext, what: &str, bytes: u64) -> Result<()> {
    check_buffer(ctx, what, bytes)?;
    let limits = &ctx.caps.limits;
    if bytes > limits.max_storage_buffer_binding_size {
        return Err(Error::buffer_limit(
            what,
            bytes,
            limits.max_storage_buffer_binding_size,
            "max_storage_buffer_binding_size",
        ));
    }
    Ok(())
}

/// Checks that `bytes` fits in one buffer (which may be larger than a
/// binding: a call's tensors, which `run/split.rs` binds piece by piece).
pub(crate) fn check_buffer(ctx: &GpuContext, what: &str, bytes: u64) -> Result<()> {
    let limit = ctx.caps.limits.max_buffer_size;
    if bytes > limit {
        return Err(Error::buffer_limit(what, bytes, limit, "max_buffer_size"));
    }
    Ok(())
}

/// Bytes of a buffer for `len` f32 values: rounded up to whole vec4s (16 bytes),
/// so every buffer can also be bound as `array<vec4<f32>>`, and never empty.
pub(crate) fn f32_bytes(len: usize) -> u64 {
    (len.max(1) as u64).div_ceil(4) * 16
}

/// A zero-filled storage buffer of `len` f32 (or u32/i32) values.
pub(crate) fn storage(ctx: &Run, label: &str, len: usize) -> Result<wgpu::Buffer> {
    let size = f32_bytes(len);
    check_bindable(ctx, label, size)?;
    Ok(create(ctx, label, size, Kind::Zeroed))
}

/// A zero-filled storage buffer of `len` f32 values that holds a call's
/// tensor: it may exceed one binding (checked against `max_buffer_size` only).
pub(crate) fn tensor_storage(ctx: &Run, label: &str, len: usize) -> Result<wgpu::Buffer> {
    let size = f32_bytes(len);
    check_buffer(ctx, label, size)?;
    Ok(create(ctx, label, size, Kind::Zeroed))
}

/// A storage buffer of `size` bytes (checked by the caller): zero-filled, or
/// (`Kind::Filled`) about to be written whole. A prepared call's runs take
/// the one their first run created (`device/arena.rs`).
pub(crate) fn create(ctx: &Run, label: &str, size: u64, kind: Kind) -> wgpu::Buffer {
    let make = || new_storage(ctx, label, size);
    match ctx.arena() {
        Some(arena) => arena.take(kind, size, make),
        None => make(),
    }
}

/// A new storage buffer, counted.
fn new_storage(ctx: &GpuContext, label: &str, size: u64) -> wgpu::Buffer {
    ctx.counters.buffer_created();
    ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: STORAGE,
        mapped_at_creation: false,
    })
}

/// Bytes of a buffer holding `bytes`: whole vec4s, never empty.
fn padded_bytes(bytes: &[u8]) -> u64 {
    (bytes.len().max(1).div_ceil(16) * 16) as u64
}

/// A storage buffer holding `data`, which a kernel binds whole.
pub(crate) fn upload<T: bytemuck::Pod>(ctx: &Run, label: &str, data: &[T]) -> Result<wgpu::Buffer> {
    check_bindable(ctx, label, padded_bytes(bytemuck::cast_slice(data)))?;
    upload_tensor(ctx, label, data)
}

/// A storage buffer holding a call's tensor `data`: it may exceed one binding
/// (checked against `max_buffer_size` only; `run/split.rs` binds it in pieces).
pub(crate) fn upload_tensor<T: bytemuck::Pod>(
    ctx: &Run,
    label: &str,
    data: &[T],
) -> Result<wgpu::Buffer> {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    let size = padded_bytes(bytes);
    check_buffer(ctx, label, size)?;
    let buffer = create(ctx, label, size, Kind::Filled);
    fill(ctx, &buffer, bytes);
    Ok(buffer)
}

/// [`upload`] for data no kernel writes (a call's rule data): in a prepared
/// call's workspace, a buffer that already holds these bytes from the last
/// run is not written again (a queue write stages through a new buffer of
/// wgpu's own each time).
pub(crate) fn upload_constant<T: bytemuck::Pod>(
    ctx: &Run,
    label: &str,
    data: &[T],
) -> Result<wgpu::Buffer> {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    let size = padded_bytes(bytes);
    check_bindable(ctx, label, size)?;
    let Some(arena) = ctx.arena() else {
        return upload(ctx, label, data);
    };
    let make = || new_storage(ctx, label, size);
    let (buffer, holds) = arena.take_remembered(Kind::Filled, size, bytes, make);
    if !holds {
        fill(ctx, &buffer, bytes);
    }
    Ok(buffer)
}

/// Writes `bytes` at the start of `buffer`, the last word padded with zeros.
fn fill(ctx: &GpuContext, buffer: &wgpu::Buffer, bytes: &[u8]) {
    // Whole 4-byte words go straight in; the padding stays zero.
    let whole = bytes.len() & !3;
    if whole > 0 {
        write_bytes(ctx, buffer, 0, &bytes[..whole]);
    }
    if whole < bytes.len() {
        let mut tail = [0u8; 4];
        tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
        write_bytes(ctx, buffer, whole as u64, &tail);
    }
}

/// A storage buffer holding a call's tensor `values` as `dtype`: f32 as they
/// are, f16 rounded to nearest and packed two to a u32 word.
pub(crate) fn upload_values(
    ctx: &Run,
    label: &str,
    values: &[f32],
    dtype: crate::tensor::DType,
) -> Result<wgpu::Buffer> {
    if dtype == crate::tensor::DType::F16 {
        upload_tensor(ctx, label, &f16_bits(values, 0))
    } else {
        upload_tensor(ctx, label, values)
    }
}

/// The f16 bits of `values` (rounded to nearest even), then `pad` zeros.
fn f16_bits(values: &[f32], pad: usize) -> Vec<u16> {
    values
        .iter()
        .map(|&x| half::f16::from_f32(x).to_bits())
        .chain(std::iter::repeat_n(0, pad))
        .collect()
}

/// Writes `values` as `dtype` into `buffer` from byte `offset` (a multiple
/// of 4), queued before the next submission; an odd count of f16 values
/// ends in a word whose second half is written as zero. Creates nothing.
pub(crate) fn write_values_at(
    ctx: &Run,
    buffer: &wgpu::Buffer,
    offset: u64,
    values: &[f32],
    dtype: crate::tensor::DType,
) {
    let halves: Vec<u16>;
    let bytes: &[u8] = if dtype == crate::tensor::DType::F16 {
        halves = f16_bits(values, values.len() % 2);
        bytemuck::cast_slice(&halves)
    } else {
        bytemuck::cast_slice(values)
    };
    if !bytes.is_empty() {
        write_bytes(ctx, buffer, offset, bytes);
    }
}

/// A zero-filled storage buffer of `len` f16 values (packed two to a word),
/// for a call's tensor: it may exceed one binding.
pub(crate) fn f16_tensor_storage(ctx: &Run, label: &str, len: usize) -> Result<wgpu::Buffer> {
    tensor_storage(ctx, label, len.div_ceil(2))
}

/// Copies `len` f16 values (packed two to a word) back to the host, widened to f32.
pub(crate) async fn read_f16(ctx: &Run, buffer: &wgpu::Buffer, len: usize) -> Result<Vec<f32>> {
    let words = read_f32(ctx, buffer, 0, len.div_ceil(2)).await?;
    Ok(words
        .iter()
        .flat_map(|w| {
            let bits = w.to_bits();
            [bits as u16, (bits >> 16) as u16]
        })
        .take(len)
        .map(|h| half::f16::from_bits(h).to_f32())
        .collect())
}

/// Writes `data` at the start of `buffer` (queued: it lands before the next
/// submission's commands run). Allocates nothing on the device.
pub(crate) fn write<T: bytemuck::Pod>(ctx: &GpuContext, buffer: &wgpu::Buffer, data: &[T]) {
    let bytes: &[u8] = bytemuck::cast_slice(data);
    let whole = bytes.len() & !3;
    if whole > 0 {
        write_bytes(ctx, buffer, 0, &bytes[..whole]);
    }
}

/// A `MAP_READ` buffer of exactly `len` f32 values that a prepared call
/// copies its output into and reads back each time ([`map_and_read`]).
pub(crate) fn staging(ctx: &Run, label: &str, len: usize) -> Result<wgpu::Buffer> {
    let size = (len.max(1) * 4) as u64;
    check_buffer(ctx, label, size)?;
    ctx.counters.buffer_created();
    Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    }))
}

/// Writes `bytes` into `buffer` at `offset` through the queue (staged by
/// wgpu, applied before the next submission), counted as a write.
pub(crate) fn write_bytes(ctx: &GpuContext, buffer: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
    ctx.counters.written();
    ctx.queue.write_buffer(buffer, offset, bytes);
}

/// A uniform buffer holding one parameter struct (rewritable in place by
/// `queue.write_buffer`: prepared calls update positions per step).
pub(crate) fn uniform<T: bytemuck::Pod>(ctx: &Run, label: &str, value: &T) -> wgpu::Buffer {
    let contents = bytemuck::bytes_of(value);
    let make = || {
        ctx.counters.buffer_created();
        ctx.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            })
    };
    match ctx.arena() {
        Some(arena) => {
            let mut fresh = false;
            let make = || {
                fresh = true;
                make()
            };
            let (buffer, holds) =
                arena.take_remembered(Kind::Uniform, contents.len() as u64, contents, make);
            if !holds && !fresh {
                write_bytes(ctx, &buffer, 0, contents);
            }
            buffer
        }
        None => make(),
    }
}

/// Copies `len` f32 values starting at element `offset` of `buffer` back to the host.
///
/// Works on wasm too: completion is awaited through a futures-intrusive
/// oneshot channel fed by `map_async`, and the device is polled only natively
/// (the browser drives it on the web).
pub(crate) async fn read_f32(
    ctx: &Run,
    buffer: &wgpu::Buffer,
    offset: usize,
    len: usize,
) -> Result<Vec<f32>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    if ctx.captures() {
        return Err(Error::Conflict(
            "a call recorded into an encoder cannot read back before it is submitted",
        ));
    }
    let size = (len * 4) as u64;
    // Outside a prepared call's workspace, a kept buffer of the device's
    // pool where one is free (given back after the read).
    let pooled = ctx.arena().is_none();
    let staging = ctx.scoped("readback", || {
        let make = |size| {
            ctx.counters.buffer_created();
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback staging"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        let staging = match ctx.arena() {
            Some(arena) => arena.take(Kind::Staging, size, || make(size)),
            None => ctx
                .staging
                .take(size)
                .unwrap_or_else(|| make(StagingPool::size_for(size))),
        };
        let mut encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("readback"),
            });
        ctx.clear_pending(&mut encoder);
        encoder.copy_buffer_to_buffer(buffer, (offset * 4) as u64, &staging, 0, size);
        ctx.counters.submitted();
        ctx.queue.submit([encoder.finish()]);
        Ok(staging)
    });
    let staging = staging.await?;
    let values = map_and_read(ctx, &staging, size).await?;
    if pooled {
        ctx.staging.give(staging);
    }
    Ok(values)
}

/// Maps the first `bytes` of a `MAP_READ` buffer, waits for them (polling
/// natively; the browser drives the web), and returns them as f32 values.
pub(crate) async fn map_and_read(
    ctx: &GpuContext,
    staging: &wgpu::Buffer,
    bytes: u64,
) -> Result<Vec<f32>> {
    let (sender, receiver) = futures_intrusive::channel::shared::oneshot_channel();
    staging
        .slice(..bytes)
        .map_async(wgpu::MapMode::Read, move |result| {
            // The receiver may be gone if the caller dropped the future; nothing to do then.
            let _ = sender.send(result);
        });
    #[cfg(not(target_arch = "wasm32"))]
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Readback(e.to_string()))?;
    let mapped = receiver
        .receive()
        .await
        .ok_or_else(|| Error::Readback("the map callback never ran".into()))?;
    ctx.check_alive()?;
    mapped.map_err(|e| Error::Readback(e.to_string()))?;
    let values = {
        let view = staging
            .slice(..bytes)
            .get_mapped_range()
            .map_err(|e| Error::Readback(e.to_string()))?;
        bytemuck::pod_collect_to_vec::<u8, f32>(&view)
    };
    staging.unmap();
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::context::PowerPreference;

    /// A failed map (here: of a destroyed buffer) is a typed readback error.
    #[test]
    fn a_failed_map_is_a_readback_error() {
        let ctx = match pollster::block_on(GpuContext::request(PowerPreference::Default)) {
            Ok(ctx) => ctx,
            Err(e) if std::env::var("WEBATTN_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
                panic!("WEBATTN_REQUIRE_GPU=1 but no GPU: {e}")
            }
            Err(e) => return eprintln!("SKIPPING GPU test: {e}"),
        };
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("destroyed staging"),
            size: 16,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        staging.destroy();
        let err = pollster::block_on(map_and_read(&ctx, &staging, 16)).unwrap_err();
        assert!(matches!(err, Error::Readback(_)), "{err}");
    }
}
