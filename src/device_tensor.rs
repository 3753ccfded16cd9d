//! Tensors that live with an engine: in a GPU buffer on a GPU engine, in host
//! memory on a CPU engine. Upload once, run many calls, read back when asked.

use std::sync::Arc;

use crate::device::chunks::Chunked;
use crate::problem::{MaskRef, TensorRef};
use crate::tensor::{DType, HostMask, HostTensor};

/// Where a tensor's values are.
#[derive(Debug, Clone)]
pub(crate) enum Storage<H> {
    /// A GPU buffer: f32 values, or f16 values packed two to a word.
    Gpu(Arc<wgpu::Buffer>),
    /// Several GPU buffers, for a tensor larger than one (`device/chunks.rs`).
    GpuChunks(Arc<Chunked>),
    /// A caller's GPU buffer from a byte offset ([`crate::Engine::wrap_buffer_at`]):
    /// calls copy it into their workspace on the device, since kernels bind
    /// whole buffers.
    GpuAt(Arc<wgpu::Buffer>, u64),
    /// Host values (CPU engine).
    Host(Arc<H>),
}

impl<H> Storage<H> {
    /// The device storage (one buffer or several), shared; `None` for host values.
    pub(crate) fn held(&self) -> Option<crate::device::chunks::Held> {
        use crate::device::chunks::Held;
        match self {
            Storage::Gpu(b) => Some(Held::One(b.clone())),
            Storage::GpuChunks(c) => Some(Held::Many(c.clone())),
            Storage::GpuAt(..) | Storage::Host(_) => None,
        }
    }
}

impl<H> From<crate::device::chunks::Held> for Storage<H> {
    fn from(held: crate::device::chunks::Held) -> Self {
        match held {
            crate::device::chunks::Held::One(b) => Storage::Gpu(b),
            crate::device::chunks::Held::Many(c) => Storage::GpuChunks(c),
        }
    }
}

/// A tensor owned by an [`crate::Engine`], f32 or f16 ([`Tensor::dtype`]).
/// Cloning shares the storage.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub(crate) shape: Vec<usize>,
    /// `F32`, or `F16` (stored as f16 on the GPU, half the bytes).
    pub(crate) dtype: DType,
    pub(crate) storage: Storage<HostTensor>,
    pub(crate) engine_id: u64,
    /// The engine's device generation the buffer was made on (0 for host values).
    pub(crate) generation: u64,
}

impl Tensor {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// The element type: `F32`, or `F16` (held as f16 on the GPU; computed
    /// in f32 and read back widened).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the values are in GPU memory.
    pub fn is_on_gpu(&self) -> bool {
        matches!(
            self.storage,
            Storage::Gpu(_) | Storage::GpuChunks(_) | Storage::GpuAt(..)
        )
    }

    /// How many device buffers hold the values: 1 on the GPU, more for a
    /// tensor larger than one buffer (`max_buffer_size`), 0 on a CPU engine.
    pub fn device_buffers(&self) -> usize {
        match &self.storage {
            Storage::Gpu(_) | Storage::GpuAt(..) => 1,
            Storage::GpuChunks(c) => c.buffers().len(),
            Storage::Host(_) => 0,
        }
    }

    /// 4-byte words of its values (f16 packed two to a word).
    pub(crate) fn words(&self) -> usize {
        match self.dtype {
            DType::F16 => self.len().div_ceil(2),
            _ => self.len(),
        }
    }

    /// The GPU buffer, on a GPU engine, when one buffer holds the tensor.
    pub(crate) fn gpu_buffer(&self) -> Option<&wgpu::Buffer> {
        match &self.storage {
            Storage::Gpu(b) => Some(b),
            Storage::GpuChunks(_) | Storage::GpuAt(..) | Storage::Host(_) => None,
        }
    }

    /// Bytes of device memory the tensor holds (0 on a CPU engine).
    pub fn device_bytes(&self) -> u64 {
        match &self.storage {
            Storage::Gpu(b) => b.size(),
            Storage::GpuChunks(c) => c.bytes(),
            // The caller's buffer, of which the tensor is a part.
            Storage::GpuAt(b, offset) => b.size() - offset,
            Storage::Host(_) => 0,
        }
    }
}

/// An attention mask owned by an [`crate::Engine`].
///
/// On the GPU it is stored as an additive f32 bias: `0` or a masked marker for a
/// bool mask, the values for a float mask (`-inf` becomes the marker).
#[derive(Debug, Clone)]
pub struct Mask {
    pub(crate) shape: Vec<usize>,
    pub(crate) storage: Storage<HostMask>,
    pub(crate) engine_id: u64,
    /// The engine's device generation the buffer was made on (0 for host values).
    pub(crate) generation: u64,
}

impl Mask {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Whether the values are in GPU memory.
    pub fn is_on_gpu(&self) -> bool {
        matches!(
            self.storage,
            Storage::Gpu(_) | Storage::GpuChunks(_) | Storage::GpuAt(..)
        )
    }
}

impl TensorRef for Tensor {
    type Mask = Mask;
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> crate::tensor::DType {
        self.dtype
    }
}

impl MaskRef for Mask {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
}

/// A copy of `t` in a buffer of its own where `t` is a view of a caller's
/// buffer at an offset ([`crate::Engine::wrap_buffer_at`]), which kernels
/// cannot bind in place; `None` where `t` can be used as it is.
pub(crate) async fn unview(
    ctx: &crate::device::scope::Run,
    t: &Tensor,
) -> crate::error::Result<Option<Tensor>> {
    let Storage::GpuAt(buffer, offset) = &t.storage else {
        return Ok(None);
    };
    let copy = crate::device::chunks::contiguous(ctx, buffer, *offset, t.words()).await?;
    Ok(Some(Tensor {
        storage: Storage::Gpu(Arc::new(copy)),
        ..t.clone()
    }))
}
