//! NumPy `.npy` files in and out (feature `npy`), through the `npyz` crate.
//!
//! Inputs may be f32 or f16 (widened to f32; f64 is narrowed); masks bool, f32
//! or f16; lengths int32 or int64. Only C-ordered arrays are accepted. Outputs
//! are written as f32, whole or not at all: to a temporary file beside the
//! target, then renamed over it.

use std::path::Path;

use crate::error::{Error, Result};
use crate::tensor::{DType, HostMask, HostTensor};

fn file_error(path: &Path, reason: impl Into<String>) -> Error {
    Error::File {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// A parsed `.npy` file: its element type, shape and raw little-endian values.
struct Array {
    dtype: DType,
    shape: Vec<usize>,
    le_bytes: Vec<u8>,
}

fn read_array(path: &Path, tensor: &'static str) -> Result<Array> {
    if path.is_dir() {
        return Err(file_error(path, "is a directory, not a .npy file"));
    }
    let bytes = std::fs::read(path).map_err(|e| file_error(path, format!("cannot read: {e}")))?;
    parse_array(&bytes, path, tensor)
}

/// Where the data of a `.npy` file starts: after the magic string, the
/// version, the header length (2 bytes in version 1, 4 in versions 2 and 3)
/// and the header. `None` when the prefix is too short to say.
fn data_offset(bytes: &[u8]) -> Option<usize> {
    let major = *bytes.get(6)?;
    let (width, len) = match major {
        1 => (
            2,
            u16::from_le_bytes(bytes.get(8..10)?.try_into().ok()?) as usize,
        ),
        _ => (
            4,
            u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as usize,
        ),
    };
    (8usize + width).checked_add(len)
}

/// The dimensions the header's `'shape'` declares, where the header reads as
/// text with one: checked before npyz parses it, since npyz multiplies them
/// unchecked (a panic in a build with overflow checks, for a file of a
/// hundred bytes).
fn header_shape(bytes: &[u8]) -> Option<Vec<u64>> {
    let start = if *bytes.get(6)? == 1 { 10 } else { 12 };
    let end = data_offset(bytes)?.min(bytes.len());
    let header = std::str::from_utf8(bytes.get(start..end)?).ok()?;
    // The key in either quotes; its last occurrence (numpy writes it last,
    // after a descr that may name a field 'shape'); a tuple or a list.
    let at = header.rfind("'shape'").max(header.rfind("\"shape\""))?;
    let after = &header[at + "'shape'".len()..];
    let open = after.find(['(', '['])?;
    let close = open + after[open..].find([')', ']'])?;
    after[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.trim_end_matches('L').parse().ok())
        .collect()
}

fn parse_array(bytes: &[u8], path: &Path, tensor: &'static str) -> Result<Array> {
    // Every product of dimensions npyz forms (the count, the strides) is at
    // most the product of the non-zero ones.
    if let Some(shape) = header_shape(bytes) {
        let mut nonzero = shape.iter().filter(|&&d| d != 0);
        if nonzero
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_none()
        {
            return Err(file_error(
                path,
                format!("declares a shape {shape:?} whose element count overflows"),
            ));
        }
    }
    let npy = npyz::NpyFile::new(bytes)
        .map_err(|e| file_error(path, format!("not a valid .npy file: {e}")))?;
    if npy.order() == npyz::Order::Fortran {
        return Err(file_error(
            path,
            "is Fortran-ordered; save it C-ordered (np.save(path, np.ascontiguousarray(a)))",
        ));
    }
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let npyz::DType::Plain(type_str) = npy.dtype() else {
        return Err(Error::DType {
            tensor,
            expected: "a plain numeric array",
            got: "a structured array".into(),
        });
    };
    let unsupported = || Error::DType {
        tensor,
        expected: "float32, float16, float64, bool, int32 or int64",
        got: type_str.to_string(),
    };
    // The header's shape must fit in the file before anything is allocated
    // for it: a corrupt header must not ask for terabytes.
    let width: usize = match (type_str.type_char(), type_str.size_field()) {
        (npyz::TypeChar::Float | npyz::TypeChar::Int, w @ (2 | 4 | 8)) => w as usize,
        (npyz::TypeChar::Bool, 1) => 1,
        _ => return Err(unsupported()),
    };
    let needed = shape
        .iter()
        .try_fold(width, |n, &d| n.checked_mul(d))
        .ok_or_else(|| file_error(path, format!("shape {shape:?} is too large")))?;
    let available = data_offset(bytes).map_or(0, |start| bytes.len().saturating_sub(start));
    if needed > available {
        return Err(file_error(
            path,
            format!(
                "is truncated: its shape {shape:?} needs {needed} bytes of data, the file has {available}"
            ),
        ));
    }
    let truncated =
        |e: std::io::Error| file_error(path, format!("data is truncated or malformed: {e}"));
    use npyz::TypeChar;
    let (dtype, le_bytes): (DType, Vec<u8>) = match (type_str.type_char(), type_str.size_field()) {
        (TypeChar::Float, 4) => (
            DType::F32,
            to_le(npy.into_vec::<f32>().map_err(truncated)?, f32::to_le_bytes),
        ),
        (TypeChar::Float, 2) => (
            DType::F16,
            to_le(
                npy.into_vec::<half::f16>().map_err(truncated)?,
                half::f16::to_le_bytes,
            ),
        ),
        (TypeChar::Float, 8) => (
            DType::F64,
            to_le(npy.into_vec::<f64>().map_err(truncated)?, f64::to_le_bytes),
        ),
        (TypeChar::Bool, 1) => (
            DType::Bool,
            npy.into_vec::<bool>()
                .map_err(truncated)?
                .into_iter()
                .map(u8::from)
                .collect(),
        ),
        (TypeChar::Int, 4) => (
            DType::I32,
            to_le(npy.into_vec::<i32>().map_err(truncated)?, i32::to_le_bytes),
        ),
        (TypeChar::Int, 8) => (
            DType::I64,
            to_le(npy.into_vec::<i64>().map_err(truncated)?, i64::to_le_bytes),
        ),
        _ => return Err(unsupported()),
    };
    let expected: usize = needed / width;
    let width = match dtype {
        DType::Bool => 1,
        DType::F16 => 2,
        DType::F32 | DType::I32 => 4,
        DType::F64 | DType::I64 => 8,
    };
    if le_bytes.len() != expected * width {
        return Err(file_error(
            path,
            format!(
                "holds {} values but its shape {shape:?} needs {expected}",
                le_bytes.len() / width
            ),
        ));
    }
    Ok(Array {
        dtype,
        shape,
        le_bytes,
    })
}

fn to_le<T: Copy, const N: usize>(values: Vec<T>, to_bytes: fn(T) -> [u8; N]) -> Vec<u8> {
    values.into_iter().flat_map(to_bytes).collect()
}

/// Reads a float tensor (f32, f16 or f64) named `tensor` (for errors).
pub fn read_tensor(path: impl AsRef<Path>, tensor: &'static str) -> Result<HostTensor> {
    let path = path.as_ref();
    tensor_from_array(read_array(path, tensor)?, tensor)
}

/// Parses the bytes of a `.npy` file holding a float tensor (f32, f16 or
/// f64), named `tensor` in errors. Malformed bytes give an error, never a panic.
pub fn parse_tensor(bytes: &[u8], tensor: &'static str) -> Result<HostTensor> {
    tensor_from_array(parse_array(bytes, Path::new(tensor), tensor)?, tensor)
}

/// Parses the bytes of a `.npy` file holding an attention mask.
pub fn parse_mask(bytes: &[u8]) -> Result<HostMask> {
    let array = parse_array(bytes, Path::new("attn_mask"), "attn_mask")?;
    HostMask::from_le_bytes(array.dtype, array.shape, &array.le_bytes)
}

fn tensor_from_array(array: Array, tensor: &'static str) -> Result<HostTensor> {
    match array.dtype {
        DType::F32 | DType::F16 | DType::F64 => {
            HostTensor::from_le_bytes(tensor, array.dtype, array.shape, &array.le_bytes)
        }
        other => Err(Error::DType {
            tensor,
            expected: "float32 or float16",
            got: other.to_string(),
        }),
    }
}

/// Reads an attention mask: bool, or an additive f32/f16/f64 mask.
pub fn read_mask(path: impl AsRef<Path>) -> Result<HostMask> {
    let array = read_array(path.as_ref(), "attn_mask")?;
    HostMask::from_le_bytes(array.dtype, array.shape, &array.le_bytes)
}

/// Reads `nonpad_kv_seqlen`: a 1D int32 or int64 array.
pub fn read_lengths(path: impl AsRef<Path>) -> Result<Vec<i64>> {
    let array = read_array(path.as_ref(), "nonpad_kv_seqlen")?;
    if array.shape.len() != 1 {
        return Err(Error::Rank {
            tensor: "nonpad_kv_seqlen",
            expected: "1 ([batch])",
            got: array.shape,
        });
    }
    crate::tensor::lengths_from_le_bytes(array.dtype, &array.le_bytes)
}

/// Writes `tensor` as an `.npy` file of its dtype (f32, or f16 for an f16
/// tensor), atomically: the data goes to a
/// temporary file beside `path`, which is renamed over `path` once complete.
pub fn write_tensor(path: impl AsRef<Path>, tensor: &HostTensor) -> Result<()> {
    use npyz::WriterBuilder;
    let path = path.as_ref();
    let name = path
        .file_name()
        .ok_or_else(|| file_error(path, "is not a file path"))?
        .to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let file = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        let shape: Vec<u64> = tensor.shape().iter().map(|&d| d as u64).collect();
        if tensor.dtype() == DType::F16 {
            let mut writer = npyz::WriteOptions::<half::f16>::new()
                .default_dtype()
                .shape(&shape)
                .writer(file)
                .begin_nd()?;
            writer.extend(tensor.data().iter().map(|&x| half::f16::from_f32(x)))?;
            writer.finish()?;
        } else {
            let mut writer = npyz::WriteOptions::<f32>::new()
                .default_dtype()
                .shape(&shape)
                .writer(file)
                .begin_nd()?;
            writer.extend(tensor.data().iter().copied())?;
            writer.finish()?;
        }
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        file_error(path, format!("cannot write: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let dir = std::env::temp_dir().join(format!("webattn-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = HostTensor::new([2, 3], vec![1.0, -2.0, 3.5, 0.0, f32::MAX, -0.25]).unwrap();
        let p = dir.join("t.npy");
        write_tensor(&p, &t).unwrap();
        assert_eq!(read_tensor(&p, "Q").unwrap(), t);
        // f16 tensors stay f16 through a file.
        let half = t.clone().into_f16();
        write_tensor(&p, &half).unwrap();
        assert_eq!(read_tensor(&p, "Q").unwrap(), half);
        assert_eq!(std::fs::metadata(&p).unwrap().len() % 2, 0);
        assert!(matches!(read_mask(&p).unwrap(), HostMask::Float(_)));
        assert!(matches!(read_lengths(&p), Err(Error::Rank { .. })));
        // Truncated: drop the last 4 bytes.
        let bytes = std::fs::read(&p).unwrap();
        let cut = dir.join("cut.npy");
        std::fs::write(&cut, &bytes[..bytes.len() - 4]).unwrap();
        let err = read_tensor(&cut, "Q").unwrap_err();
        assert!(matches!(err, Error::File { .. }), "{err}");
        assert!(matches!(read_tensor(&dir, "Q"), Err(Error::File { .. })));
        assert!(matches!(
            read_tensor(dir.join("missing.npy"), "Q"),
            Err(Error::File { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
