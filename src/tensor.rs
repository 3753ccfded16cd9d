//! Host-side tensors: a shape and row-major data.
//!
//! [`HostTensor`] holds `f32` values (Q, K, V, past/present, outputs);
//! [`HostMask`] holds an attention mask, boolean or additive float. Both check
//! that the data length matches the shape when they are built, so everything
//! downstream can rely on it.

use crate::error::{Error, Result};

/// Element types that appear at the engine's edges (file formats, masks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float, the engine's compute type.
    F32,
    /// 16-bit IEEE float, widened to f32 on input.
    F16,
    /// 64-bit IEEE float.
    F64,
    /// Boolean (one byte per element).
    Bool,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::F64 => "float64",
            DType::Bool => "bool",
            DType::I32 => "int32",
            DType::I64 => "int64",
        };
        f.write_str(name)
    }
}

/// The number of elements of `shape`, or an error naming `tensor` if it overflows `usize`.
pub(crate) fn checked_numel(tensor: &'static str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::Limit {
            what: format!("{tensor} of shape {shape:?}"),
            needed: u64::MAX,
            limit: usize::MAX as u64,
            limit_name: "usize",
            hint: "the element count overflows this platform's address space",
        })
}

/// `n` copies of `value` in a fresh vector, or [`Error::OutOfMemory`] naming
/// `what` where the host cannot allocate them (where `vec!` would abort the
/// process).
pub(crate) fn try_filled<T: Clone>(what: &str, n: usize, value: T) -> Result<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| {
        Error::OutOfMemory(format!(
            "allocating {what} ({} MiB of host memory)",
            (n as u128 * std::mem::size_of::<T>() as u128) >> 20
        ))
    })?;
    out.resize(n, value);
    Ok(out)
}

/// A row-major tensor in host memory, its values held as `f32`.
///
/// Its [`DType`] is `F32`, or `F16` for a tensor whose values are f16 (read
/// from float16 bytes, or rounded by [`HostTensor::into_f16`]): an engine then
/// keeps it as f16 on the device (half the bytes), and outputs computed from
/// f16 inputs are f16 too, as ONNX types them.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    shape: Vec<usize>,
    data: Vec<f32>,
    dtype: DType,
}

impl HostTensor {
    /// Wraps `data` as a tensor of `shape`; fails if the lengths disagree.
    pub fn new(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Result<Self> {
        Self::named("tensor", shape, data)
    }

    /// Like [`HostTensor::new`], naming the tensor in the error.
    pub fn named(
        tensor: &'static str,
        shape: impl Into<Vec<usize>>,
        data: Vec<f32>,
    ) -> Result<Self> {
        let shape = shape.into();
        let expected = checked_numel(tensor, &shape)?;
        if expected != data.len() {
            return Err(Error::DataLength {
                tensor,
                shape,
                expected,
                got: data.len(),
            });
        }
        Ok(Self {
            shape,
            data,
            dtype: DType::F32,
        })
    }

    /// A tensor of zeros.
    pub fn zeros(shape: impl Into<Vec<usize>>) -> Result<Self> {
        let shape = shape.into();
        let n = checked_numel("tensor", &shape)?;
        Ok(Self {
            shape,
            data: vec![0.0; n],
            dtype: DType::F32,
        })
    }

    /// The element type: `F32`, or `F16` for f16 values (see the type's docs).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The tensor as f16: every value rounded to the nearest f16 (ties to
    /// even; beyond f16's range, infinity), the dtype `F16`.
    pub fn into_f16(mut self) -> Self {
        for x in &mut self.data {
            *x = round_to_f16(*x);
        }
        self.dtype = DType::F16;
        self
    }

    /// The tensor in `dtype`: [`HostTensor::into_f16`] for `F16`, the values
    /// as they are (marked `F32`) for anything else.
    pub fn into_dtype(self, dtype: DType) -> Self {
        match dtype {
            DType::F16 => self.into_f16(),
            _ => Self {
                dtype: DType::F32,
                ..self
            },
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The values, mutable.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Takes the values out.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// Decodes little-endian `bytes` of `dtype` into f32 values: f32 as is, f16 and
/// f64 converted (f64 rounds to nearest). Other types give [`Error::DType`].
fn decode_floats(tensor: &'static str, dtype: DType, bytes: &[u8]) -> Result<Vec<f32>> {
    let width = match dtype {
        DType::F32 => 4,
        DType::F16 => 2,
        DType::F64 => 8,
        _ => {
            return Err(Error::DType {
                tensor,
                expected: "float32, float16 or float64",
                got: dtype.to_string(),
            })
        }
    };
    if !bytes.len().is_multiple_of(width) {
        return Err(Error::DataLength {
            tensor,
            shape: vec![bytes.len() / width],
            expected: bytes.len().div_ceil(width),
            got: bytes.len() / width,
        });
    }
    Ok(match dtype {
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        DType::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    })
}

impl HostTensor {
    /// A tensor from little-endian bytes of `dtype` (f32, or f16/f64 converted to
    /// f32), as read from a file or a typed array. `tensor` names it in errors.
    pub fn from_le_bytes(
        tensor: &'static str,
        dtype: DType,
        shape: impl Into<Vec<usize>>,
        bytes: &[u8],
    ) -> Result<Self> {
        let t = Self::named(tensor, shape, decode_floats(tensor, dtype, bytes)?)?;
        Ok(if dtype == DType::F16 {
            Self {
                dtype: DType::F16,
                ..t
            }
        } else {
            t
        })
    }
}

/// `x` rounded to the nearest f16 value (ties to even), as an f32.
pub(crate) fn round_to_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

impl HostMask {
    /// A mask from little-endian bytes: `Bool` (one byte each, nonzero = attend)
    /// gives a bool mask; f32, f16 or f64 an additive float mask.
    pub fn from_le_bytes(dtype: DType, shape: impl Into<Vec<usize>>, bytes: &[u8]) -> Result<Self> {
        match dtype {
            DType::Bool => Self::bool(shape, bytes.iter().map(|&b| b != 0).collect()),
            DType::F32 | DType::F16 | DType::F64 => {
                Self::float(shape, decode_floats("attn_mask", dtype, bytes)?)
            }
            _ => Err(Error::DType {
                tensor: "attn_mask",
                expected: "bool, float32, float16 or float64",
                got: dtype.to_string(),
            }),
        }
    }
}

/// `nonpad_kv_seqlen` from little-endian int32 or int64 bytes.
pub fn lengths_from_le_bytes(dtype: DType, bytes: &[u8]) -> Result<Vec<i64>> {
    let bad_length = |width: usize| Error::DataLength {
        tensor: "nonpad_kv_seqlen",
        shape: vec![bytes.len() / width],
        expected: bytes.len().div_ceil(width),
        got: bytes.len() / width,
    };
    match dtype {
        DType::I32 if bytes.len().is_multiple_of(4) => Ok(bytes
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect()),
        DType::I64 if bytes.len().is_multiple_of(8) => Ok(bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()),
        DType::I32 => Err(bad_length(4)),
        DType::I64 => Err(bad_length(8)),
        _ => Err(Error::DType {
            tensor: "nonpad_kv_seqlen",
            expected: "int32 or int64",
            got: dtype.to_string(),
        }),
    }
}

/// An attention mask in host memory.
///
/// `Bool`: `true` means *attend*, `false` masks the key. `Float`: the value is
/// added to the score; `-inf` (or `-f32::MAX`) masks the key.
#[derive(Debug, Clone, PartialEq)]
pub enum HostMask {
    /// A boolean mask.
    Bool {
        /// The mask's shape (rank 1 to 4, right-aligned to `[B, Hq, Nq, T]`).
        shape: Vec<usize>,
        /// The values, row-major.
        data: Vec<bool>,
    },
    /// An additive float mask.
    Float(HostTensor),
}

impl HostMask {
    /// A boolean mask; fails if the data length does not match the shape.
    pub fn bool(shape: impl Into<Vec<usize>>, data: Vec<bool>) -> Result<Self> {
        let shape = shape.into();
        let expected = checked_numel("attn_mask", &shape)?;
        if expected != data.len() {
            return Err(Error::DataLength {
                tensor: "attn_mask",
                shape,
                expected,
                got: data.len(),
            });
        }
        Ok(HostMask::Bool { shape, data })
    }

    /// An additive float mask; fails if the data length does not match the shape.
    pub fn float(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Result<Self> {
        Ok(HostMask::Float(HostTensor::named(
            "attn_mask",
            shape,
            data,
        )?))
    }

    /// The mask's shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            HostMask::Bool { shape, .. } => shape,
            HostMask::Float(t) => t.shape(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostMask::Bool { .. } => DType::Bool,
            HostMask::Float(_) => DType::F32,
        }
    }

    /// The mask as an additive bias: `0` or `-inf` for a bool mask, the values for a float mask.
    pub fn to_additive(&self) -> Vec<f32> {
        match self {
            HostMask::Bool { data, .. } => data
                .iter()
                .map(|&keep| if keep { 0.0 } else { f32::NEG_INFINITY })
                .collect(),
            HostMask::Float(t) => t.data().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_mismatch_is_an_error() {
        let err = HostTensor::named("Q", vec![2, 3], vec![0.0; 5]).unwrap_err();
        assert!(matches!(
            err,
            Error::DataLength {
                expected: 6,
                got: 5,
                ..
            }
        ));
        let err = HostMask::bool(vec![4], vec![true; 3]).unwrap_err();
        assert!(matches!(
            err,
            Error::DataLength {
                expected: 4,
                got: 3,
                ..
            }
        ));
    }

    #[test]
    fn overflowing_shape_is_an_error() {
        let err = HostTensor::zeros(vec![usize::MAX, 3]).unwrap_err();
        assert!(matches!(err, Error::Limit { .. }));
    }

    #[test]
    fn bytes_decode_by_dtype() {
        let f16_bytes: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        let t = HostTensor::from_le_bytes("Q", DType::F16, [2], &f16_bytes).unwrap();
        assert_eq!(t.data(), &[1.5, -2.0]);
        let f64_bytes: Vec<u8> = 0.25f64.to_le_bytes().to_vec();
        assert_eq!(
            HostTensor::from_le_bytes("K", DType::F64, [1], &f64_bytes)
                .unwrap()
                .data(),
            &[0.25]
        );
        let err = HostTensor::from_le_bytes("V", DType::I32, [1], &[0; 4]).unwrap_err();
        assert!(matches!(err, Error::DType { tensor: "V", .. }), "{err}");
        let m = HostMask::from_le_bytes(DType::Bool, [3], &[1, 0, 7]).unwrap();
        assert_eq!(m.to_additive(), vec![0.0, f32::NEG_INFINITY, 0.0]);
        assert!(matches!(
            HostMask::from_le_bytes(DType::I64, [1], &[0; 8]),
            Err(Error::DType { .. })
        ));
        assert_eq!(
            lengths_from_le_bytes(DType::I32, &7i32.to_le_bytes()).unwrap(),
            vec![7]
        );
        assert!(matches!(
            lengths_from_le_bytes(DType::F32, &[0; 4]),
            Err(Error::DType { .. })
        ));
        assert!(matches!(
            lengths_from_le_bytes(DType::I64, &[0; 5]),
            Err(Error::DataLength { .. })
        ));
    }

    #[test]
    fn bool_mask_to_bias() {
        let m = HostMask::bool(vec![2], vec![true, false]).unwrap();
        assert_eq!(m.to_additive(), vec![0.0, f32::NEG_INFINITY]);
    }
}
