//! bfloat16 uploads: the bits go to the device as they are, half the bytes
//! of f32, and a kernel widens them there (exactly: a bfloat16 is the upper
//! half of an f32), so a caller holding bfloat16 weights or activations never
//! widens them on the host.

use std::sync::Arc;

use super::{Backend, Engine};
use crate::device::scope::Run;
use crate::device::{buffer, chunks};
use crate::device_tensor::{Storage, Tensor};
use crate::error::{Error, Result};
use crate::run::half;
use crate::tensor::{checked_numel, DType, HostTensor};

impl Engine {
    /// Uploads bfloat16 values, given as their bits, as an f32 tensor of
    /// `shape` (the engine computes in f32). On a GPU engine the bits are
    /// uploaded and widened on the device; a tensor larger than one buffer,
    /// and every tensor of a CPU engine, is widened on the host.
    pub async fn upload_bf16(&self, bits: &[u16], shape: &[usize]) -> Result<Tensor> {
        let len = checked_numel("tensor", shape)?;
        if bits.len() != len {
            return Err(Error::DataLength {
                tensor: "tensor",
                shape: shape.to_vec(),
                expected: len,
                got: bits.len(),
            });
        }
        let widened = || {
            let values = bits
                .iter()
                .map(|&b| f32::from_bits(u32::from(b) << 16))
                .collect::<Vec<f32>>();
            HostTensor::new(shape.to_vec(), values)
        };
        let Backend::Gpu(gpu) = &self.backend else {
            return self.upload_async(&widened()?).await;
        };
        let (device, generation) = gpu.latest();
        let run = Run::new(device);
        let ctx = &run;
        ctx.check_alive()?;
        if chunks::chunk_len(shape, DType::F32, ctx.caps.limits.max_buffer_size)?.is_some() {
            return self.upload_async(&widened()?).await;
        }
        let packed = ctx
            .scoped("uploading bfloat16 bits", || {
                buffer::upload_tensor(ctx, "bfloat16 bits", bits)
            })
            .await?;
        let wide = half::widen_bf16(ctx, &packed, len).await?;
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: DType::F32,
            storage: Storage::Gpu(Arc::new(wide)),
            engine_id: self.id,
            generation,
        })
    }

    /// [`Engine::upload_bf16`], blocking.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn upload_bf16_blocking(&self, bits: &[u16], shape: &[usize]) -> Result<Tensor> {
        pollster::block_on(self.upload_bf16(bits, shape))
    }
}
