//! NumPy arrays to the engine's host tensors and back. Inputs are read in
//! their logical order whatever their strides (a contiguous array is one
//! copy into the tensor); outputs hand the engine's own vector to NumPy, so
//! nothing is copied on the way out.

use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;
use webattn::{DType, Error, HostMask, HostTensor};

/// The values of `array` in C order.
fn values<T: numpy::Element + Copy>(array: &PyReadonlyArrayDyn<'_, T>) -> Vec<T> {
    match array.as_slice() {
        Ok(slice) => slice.to_vec(),
        Err(_) => array.as_array().iter().copied().collect(),
    }
}

/// A float32 array as a tensor named `name`; `f16` keeps it in f16 storage
/// (its values came from float16, so the rounding is exact).
pub fn tensor(name: &'static str, array: &Bound<'_, PyAny>, f16: bool) -> PyResult<HostTensor> {
    let array: PyReadonlyArrayDyn<'_, f32> = array.extract().map_err(|_| {
        crate::errors::to_py(
            array.py(),
            Error::DType {
                tensor: name,
                expected: "a NumPy float32 array (the package converts float16, bfloat16 and \
                           float64)",
                got: describe(array),
            },
        )
    })?;
    let shape = array.shape().to_vec();
    let data = values(&array);
    let t =
        HostTensor::named(name, shape, data).map_err(|e| crate::errors::to_py(array.py(), e))?;
    Ok(if f16 { t.into_dtype(DType::F16) } else { t })
}

/// A bool or float32 array as the attention mask.
pub fn mask(array: &Bound<'_, PyAny>) -> PyResult<HostMask> {
    let py = array.py();
    let made = if let Ok(bools) = array.extract::<PyReadonlyArrayDyn<'_, bool>>() {
        HostMask::bool(bools.shape().to_vec(), values(&bools))
    } else if let Ok(floats) = array.extract::<PyReadonlyArrayDyn<'_, f32>>() {
        HostMask::float(floats.shape().to_vec(), values(&floats))
    } else {
        Err(Error::DType {
            tensor: "attn_mask",
            expected: "a NumPy bool array (True = attend) or a float32 array (added to the scores)",
            got: describe(array),
        })
    };
    made.map_err(|e| crate::errors::to_py(py, e))
}

/// An int64 array of the valid key count per batch.
pub fn lengths(array: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let lengths: PyReadonlyArrayDyn<'_, i64> = array.extract().map_err(|_| {
        crate::errors::to_py(
            array.py(),
            Error::DType {
                tensor: "nonpad_kv_seqlen",
                expected: "a NumPy int64 array of shape [batch]",
                got: describe(array),
            },
        )
    })?;
    if lengths.ndim() != 1 {
        return Err(crate::errors::to_py(
            array.py(),
            Error::Rank {
                tensor: "nonpad_kv_seqlen",
                expected: "1 ([batch])",
                got: lengths.shape().to_vec(),
            },
        ));
    }
    Ok(values(&lengths))
}

/// A tensor as a float32 NumPy array that owns the tensor's vector.
pub fn to_numpy<'py>(py: Python<'py>, t: HostTensor) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
    let shape = t.shape().to_vec();
    PyArray1::from_vec(py, t.into_data()).reshape(shape)
}

/// A short description of a value for errors: its type, and a NumPy array's
/// dtype and shape.
fn describe(value: &Bound<'_, PyAny>) -> String {
    let type_name = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "a value".into());
    match (value.getattr("dtype"), value.getattr("shape")) {
        (Ok(dtype), Ok(shape)) => format!("{type_name} of dtype {dtype} and shape {shape}"),
        _ => type_name,
    }
}
