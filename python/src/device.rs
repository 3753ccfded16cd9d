//! What lives on the engine between calls: prepared calls (planned once,
//! run many times) and the KV cache (keys and values appended in place).
//! Each holds its engine (a reference to the Python object), so it outlives
//! no engine; the cache sits behind a lock, so threads may share it.

use std::sync::Mutex;

use crate::arrays::{tensor, to_numpy};
use crate::engine::{tensors_dict, CallTensors, F16Flags, Given, Inputs, NativeEngine};
use crate::errors::IntoPy;
use crate::options::attention_options;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use webattn::{AttentionOutputs, Engine, HostTensor, KvCache, PreparedAttention, Tensor};

/// The host inputs uploaded to the engine.
fn upload(engine: &Engine, inputs: Inputs) -> webattn::Result<CallTensors<Tensor>> {
    let past = match &inputs.past {
        Some((pk, pv)) => Some((engine.upload(pk)?, engine.upload(pv)?)),
        None => None,
    };
    Ok(CallTensors {
        q: engine.upload(&inputs.q)?,
        k: engine.upload(&inputs.k)?,
        v: engine.upload(&inputs.v)?,
        mask: inputs
            .mask
            .as_ref()
            .map(|m| engine.upload_mask(m))
            .transpose()?,
        past,
        nonpad: inputs.nonpad,
    })
}

/// The outputs read back, as a dict of NumPy arrays.
fn outputs_dict<'py>(
    py: Python<'py>,
    out: AttentionOutputs<HostTensor>,
) -> PyResult<Bound<'py, PyDict>> {
    tensors_dict(
        py,
        [
            ("y", Some(out.y)),
            ("present_key", out.present_key),
            ("present_value", out.present_value),
            ("qk_matmul_output", out.qk_matmul_output),
            ("lse", out.lse),
        ],
    )
}

/// A call planned once for its shapes and options (`Engine.prepare`).
#[pyclass(frozen, module = "webattn._webattn")]
pub struct NativePrepared {
    engine: Py<NativeEngine>,
    prepared: PreparedAttention,
}

#[pymethods]
impl NativePrepared {
    /// The plan every run takes: path, kernels, pieces, workspace and why.
    #[getter]
    fn plan(&self) -> String {
        self.prepared.plan().to_string()
    }

    /// Device buffers the prepared call's workspace holds, and their bytes.
    #[getter]
    fn workspace(&self) -> (usize, u64) {
        self.prepared.workspace()
    }

    /// Runs the call on `inputs` of the prepared shapes.
    #[pyo3(signature = (inputs, *, f16 = None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Given<'py>,
        f16: Option<F16Flags>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let inputs = Inputs::read(py, inputs, f16.unwrap_or_default())?;
        let engine = &self.engine.get().engine;
        let prepared = &self.prepared;
        let out = py
            .detach(|| {
                let uploaded = upload(engine, inputs)?;
                let out = prepared.run_blocking(engine, &uploaded.as_inputs())?;
                pollster::block_on(engine.download_outputs(&out))
            })
            .py_err(py)?;
        outputs_dict(py, out)
    }
}

/// Plans a call for the shapes of `inputs` (`Engine.prepare`).
pub fn prepare(
    py: Python<'_>,
    engine: Py<NativeEngine>,
    inputs: Given<'_>,
    f16: F16Flags,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<NativePrepared> {
    let options = attention_options(options).py_err(py)?;
    let inputs = Inputs::read(py, inputs, f16)?;
    let dims = webattn::validate(&inputs.as_inputs(), &options).py_err(py)?;
    let prepared = engine.get().engine.prepare(&dims, &options).py_err(py)?;
    Ok(NativePrepared { engine, prepared })
}

/// A KV cache on the engine (`webattn.KvCache`).
#[pyclass(frozen, module = "webattn._webattn")]
pub struct NativeKvCache {
    engine: Py<NativeEngine>,
    cache: Mutex<KvCache>,
}

impl NativeKvCache {
    /// The cache, locked for this thread.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, KvCache> {
        // A panic while the lock was held cannot leave the cache half
        // written (appends replace it whole), so a poisoned lock is usable.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl NativeKvCache {
    /// An empty cache on `engine` whose first allocation holds `capacity` tokens.
    #[new]
    #[pyo3(signature = (engine, capacity = 256))]
    fn new(engine: Py<NativeEngine>, capacity: usize) -> Self {
        NativeKvCache {
            engine,
            cache: Mutex::new(KvCache::with_capacity(capacity)),
        }
    }

    /// Tokens cached per sequence.
    #[getter]
    fn lengths(&self) -> Vec<usize> {
        self.lock().lengths().to_vec()
    }

    /// Tokens each sequence can hold before the cache grows.
    #[getter]
    fn capacity(&self) -> usize {
        self.lock().capacity()
    }

    /// Appends `key` `[B, Hkv, n, Dk]` and `value` `[B, Hkv, n, Dv]`; with
    /// `counts`, the last `counts[b]` rows to sequence `b`.
    #[pyo3(signature = (key, value, counts = None, *, f16 = (false, false)))]
    fn append(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        counts: Option<Vec<usize>>,
        f16: (bool, bool),
    ) -> PyResult<()> {
        let (key, value) = (tensor("key", key, f16.0)?, tensor("value", value, f16.1)?);
        let engine = &self.engine.get().engine;
        py.detach(|| {
            let (k, v) = (engine.upload(&key)?, engine.upload(&value)?);
            let mut cache = self.lock();
            match counts {
                Some(counts) => cache.append_ragged_blocking(engine, &k, &v, &counts),
                None => cache.append_blocking(engine, &k, &v),
            }
        })
        .py_err(py)
    }

    /// Attention of `query` `[B, Hq, n, Dk]` (the last `n` tokens of each
    /// sequence) against everything cached, causal positions continuing from
    /// the cached lengths where `is_causal`.
    #[pyo3(signature = (query, *, f16 = false, **options))]
    fn attention<'py>(
        &self,
        py: Python<'py>,
        query: &Bound<'py, PyAny>,
        f16: bool,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let options = attention_options(options).py_err(py)?;
        let query = tensor("Q", query, f16)?;
        let engine = &self.engine.get().engine;
        let out = py
            .detach(|| {
                let q = engine.upload(&query)?;
                let cache = self.lock();
                let lengths = cache.nonpad_lengths();
                let inputs = cache.attention_inputs(&q, &lengths)?;
                let out = pollster::block_on(engine.attention(&inputs, &options))?;
                pollster::block_on(engine.download_outputs(&out))
            })
            .py_err(py)?;
        outputs_dict(py, out)
    }

    /// The cached keys and values as ONNX's `present_key`/`present_value`
    /// (every sequence's rows up to the longest length).
    fn present<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let engine = &self.engine.get().engine;
        let (k, v) = py
            .detach(|| {
                let (k, v) = self.lock().present_blocking(engine)?;
                Ok::<_, webattn::Error>((
                    engine.download_blocking(&k)?,
                    engine.download_blocking(&v)?,
                ))
            })
            .py_err(py)?;
        Ok((to_numpy(py, k)?.into_any(), to_numpy(py, v)?.into_any()))
    }
}
