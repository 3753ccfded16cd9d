//! Writing new values into a tensor the engine already holds, in place: a
//! decoder feeds token after token through one device tensor, so a step
//! allocates nothing on the device for its input.

use std::sync::Arc;

use super::{Backend, Engine};
use crate::device::buffer;
use crate::device::scope::Run;
use crate::device_tensor::{Storage, Tensor};
use crate::error::{Error, Result};
use crate::tensor::{DType, HostTensor};

impl Engine {
    /// Overwrites `tensor`'s values with `values`, of the same shape and
    /// dtype. On a GPU engine the write is queued before the next submission
    /// and creates no buffer; every clone of `tensor` shares its buffer and
    /// sees the new values, and work submitted earlier still reads the old
    /// ones. On a CPU engine `tensor` alone takes the new values.
    pub fn write(&self, tensor: &mut Tensor, values: &HostTensor) -> Result<()> {
        self.own("tensor", tensor)?;
        if tensor.dtype != values.dtype() {
            return Err(Error::DType {
                tensor: "values",
                expected: if tensor.dtype == DType::F16 {
                    "f16, the tensor's"
                } else {
                    "f32, the tensor's"
                },
                got: values.dtype().to_string(),
            });
        }
        if tensor.shape != values.shape() {
            return Err(Error::Rank {
                tensor: "values",
                expected: "the tensor's shape",
                got: values.shape().to_vec(),
            });
        }
        let Backend::Gpu(gpu) = &self.backend else {
            return match tensor.storage {
                Storage::Host(_) => {
                    tensor.storage = Storage::Host(Arc::new(values.clone()));
                    Ok(())
                }
                _ => Err(Error::ForeignTensor { tensor: "tensor" }),
            };
        };
        let (buffer, offset) = match &tensor.storage {
            Storage::Gpu(buffer) => (buffer, 0),
            // Half a word past an odd count of f16 values may be the caller's.
            Storage::GpuAt(..) if tensor.dtype == DType::F16 && values.len() % 2 == 1 => {
                return Err(Error::Conflict(
                    "an odd count of f16 values at an offset in a caller's buffer ends inside a \
                     word; write it with the caller's own queue",
                ))
            }
            Storage::GpuAt(buffer, offset) => (buffer, *offset),
            Storage::GpuChunks(_) => {
                return Err(Error::Conflict(
                    "a tensor held in several buffers (larger than one) is written by uploading \
                     it again",
                ))
            }
            Storage::Host(_) => return Err(Error::ForeignTensor { tensor: "tensor" }),
        };
        let run = Run::new(gpu.current());
        let ctx = &run;
        ctx.check_alive()?;
        if !buffer.usage().contains(wgpu::BufferUsages::COPY_DST) {
            return Err(Error::Conflict(
                "a tensor written in place needs BufferUsages::COPY_DST",
            ));
        }
        buffer::write_values_at(ctx, buffer, offset, values.data(), tensor.dtype);
        Ok(())
    }
}
