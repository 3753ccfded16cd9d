//! `webattn._webattn`: the engine for Python. The package `webattn`
//! (python/webattn) wraps it: dtypes, PyTorch tensors, 3-D inputs, SDPA's
//! signature and the exception classes are Python's side; this crate turns
//! NumPy arrays into host tensors, runs the call with the GIL released and
//! hands the outputs back as NumPy arrays that own the engine's memory.

use pyo3::prelude::*;

mod arrays;
mod device;
mod engine;
mod errors;
mod layer;
mod options;
mod serving;

/// The native module.
#[pymodule]
fn _webattn(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::NativeEngine>()?;
    m.add_class::<device::NativePrepared>()?;
    m.add_class::<device::NativeKvCache>()?;
    m.add_class::<layer::NativeMha>()?;
    m.add_class::<serving::Sequence>()?;
    m.add_class::<serving::NativePagedKvCache>()?;
    m.add_function(wrap_pyfunction!(layer::random_mha_weights, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
