//! Engine errors as Python exceptions of the package's classes
//! (`webattn.ShapeError`, `LimitError`, ...: python/webattn/_errors.py),
//! chosen by the error's kind, with the engine's own message.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The Python exception for `e`.
pub fn to_py(py: Python<'_>, e: webattn::Error) -> PyErr {
    let kind = e.kind();
    let message = e.to_string();
    let made = py
        .import("webattn._errors")
        .and_then(|m| m.getattr("from_kind"))
        .and_then(|f| f.call1((kind, message.as_str())));
    match made {
        Ok(exception) => PyErr::from_value(exception),
        // Only when the package's Python half is missing (the native module
        // imported alone): still the engine's message.
        Err(_) => PyRuntimeError::new_err(format!("{kind}: {message}")),
    }
}

/// `webattn::Result` to `PyResult`.
pub trait IntoPy<T> {
    /// Converts the error side.
    fn py_err(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for webattn::Result<T> {
    fn py_err(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
