//! Serving many sequences from Python: ragged calls on packed sequences
//! (`Engine.attention_ragged`) and the paged KV cache
//! (`webattn.PagedKvCache`), over `webattn::paged`.

use std::sync::Mutex;

use crate::arrays::{lengths, tensor, to_numpy};
use crate::engine::{tensors_dict, NativeEngine};
use crate::errors::IntoPy;
use crate::options::attention_options;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use webattn::{HostTensor, PageStorage, PagedKvCache, PagedLayout, RaggedInputs, SequenceId};

/// Attention of packed sequences, each against its own keys: `q` `[total_q,
/// Hq, Dk]`, `k` `[total_k, Hkv, Dk]`, `v` `[total_k, Hkv, Dv]` with the
/// offsets `cu_seqlens_q`/`cu_seqlens_k` (`batch + 1`, from 0 to the packed
/// rows). Returns a dict of `y` (packed as `q`) and `lse` where asked.
pub fn attention_ragged<'py>(
    py: Python<'py>,
    engine: &NativeEngine,
    (q, k, v): (&Bound<'py, PyAny>, &Bound<'py, PyAny>, &Bound<'py, PyAny>),
    (cu_q, cu_k): (&Bound<'py, PyAny>, &Bound<'py, PyAny>),
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyDict>> {
    let options = attention_options(options).py_err(py)?;
    let (q, k, v) = (
        tensor("Q", q, false)?,
        tensor("K", k, false)?,
        tensor("V", v, false)?,
    );
    let (cu_seqlens_q, cu_seqlens_k) = (lengths(cu_q)?, lengths(cu_k)?);
    let engine = &engine.engine;
    let out = py
        .detach(|| {
            let inputs = RaggedInputs {
                q: &q,
                k: &k,
                v: &v,
                cu_seqlens_q: &cu_seqlens_q,
                cu_seqlens_k: &cu_seqlens_k,
            };
            engine.attention_ragged_blocking(&inputs, &options)
        })
        .py_err(py)?;
    tensors_dict(py, [("y", Some(out.y)), ("lse", out.lse)])
}

/// A sequence of a paged cache: an opaque handle (its number names it in
/// errors), valid until the sequence is freed.
#[pyclass(frozen, eq, hash, from_py_object, module = "webattn._webattn")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sequence(pub(crate) SequenceId);

#[pymethods]
impl Sequence {
    /// The number errors and logs name the sequence by.
    #[getter]
    fn number(&self) -> u64 {
        self.0.number()
    }

    fn __repr__(&self) -> String {
        format!("Sequence({})", self.0.number())
    }
}

/// A paged KV cache (`webattn.PagedKvCache`) on an engine.
#[pyclass(frozen, module = "webattn._webattn")]
pub struct NativePagedKvCache {
    engine: Py<NativeEngine>,
    cache: Mutex<PagedKvCache>,
}

impl NativePagedKvCache {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, PagedKvCache> {
        // Every operation is all or nothing, so a poisoned lock still guards
        // a whole cache.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl NativePagedKvCache {
    /// An empty cache of pages of `page_size` tokens (16-256) holding keys
    /// of `head_dim` and values of `v_head_dim` for `kv_heads` heads, where
    /// `engine` computes (its GPU's memory, or the host); at most
    /// `page_limit` pages where given; values stored as `storage` ("f32"
    /// or "f16").
    #[new]
    #[pyo3(signature = (engine, kv_heads, head_dim, v_head_dim, page_size, page_limit = None, storage = "f32"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        engine: Py<NativeEngine>,
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
        page_size: usize,
        page_limit: Option<usize>,
        storage: &str,
    ) -> PyResult<Self> {
        let layout = PagedLayout {
            kv_heads,
            head_dim,
            v_head_dim,
            page_size,
        };
        let mut cache = PagedKvCache::on_engine(&engine.get().engine, layout).py_err(py)?;
        if let Some(pages) = page_limit {
            cache = cache.with_page_limit(pages);
        }
        let storage = PageStorage::parse(storage).py_err(py)?;
        let cache = cache.with_storage(storage).py_err(py)?;
        Ok(NativePagedKvCache {
            engine,
            cache: Mutex::new(cache),
        })
    }

    /// A new, empty sequence.
    fn add_sequence(&self) -> Sequence {
        Sequence(self.lock().add_sequence())
    }

    /// The live sequences.
    fn sequences(&self) -> Vec<Sequence> {
        self.lock().sequences().into_iter().map(Sequence).collect()
    }

    /// Tokens cached for `seq`.
    fn length(&self, py: Python<'_>, seq: Sequence) -> PyResult<usize> {
        self.lock().len(seq.0).py_err(py)
    }

    /// `seq`'s pages in order.
    fn block_table(&self, py: Python<'_>, seq: Sequence) -> PyResult<Vec<u32>> {
        self.lock()
            .block_table(seq.0)
            .map(<[u32]>::to_vec)
            .py_err(py)
    }

    /// `(pages in the pool, pages in use, bytes held)`.
    fn usage(&self) -> (usize, usize, u64) {
        let cache = self.lock();
        (cache.pages(), cache.pages_in_use(), cache.bytes())
    }

    /// A new sequence sharing `seq`'s pages (copied on write).
    fn fork(&self, py: Python<'_>, seq: Sequence) -> PyResult<Sequence> {
        self.lock().fork(seq.0).map(Sequence).py_err(py)
    }

    /// Frees `seq`: its pages go back to the pool at once.
    fn free(&self, py: Python<'_>, seq: Sequence) -> PyResult<()> {
        self.lock().free(seq.0).py_err(py)
    }

    /// Appends to several sequences at once, all or nothing: `items` is a
    /// list of `(seq, key [Hkv, n, Dk], value [Hkv, n, Dv])`.
    fn append(
        &self,
        py: Python<'_>,
        items: Vec<(Sequence, Bound<'_, PyAny>, Bound<'_, PyAny>)>,
    ) -> PyResult<()> {
        let mut read: Vec<(SequenceId, HostTensor, HostTensor)> = Vec::with_capacity(items.len());
        for (seq, key, value) in &items {
            read.push((
                seq.0,
                tensor("key", key, false)?,
                tensor("value", value, false)?,
            ));
        }
        let appends: Vec<_> = read.iter().map(|(s, k, v)| (*s, k, v)).collect();
        py.detach(|| self.lock().append_many(&appends)).py_err(py)
    }

    /// `seq`'s keys `[1, Hkv, len, Dk]` and values, read through its pages.
    fn read<'py>(
        &self,
        py: Python<'py>,
        seq: Sequence,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let (k, v) = py.detach(|| self.lock().read_blocking(seq.0)).py_err(py)?;
        Ok((to_numpy(py, k)?.into_any(), to_numpy(py, v)?.into_any()))
    }

    /// Attention of each sequence's new queries `[1, Hq, n, Dk]` (its last
    /// `n` tokens) against its pages; `queries` a list of `(seq, q)`.
    /// Returns one dict of outputs per query.
    #[pyo3(signature = (queries, **options))]
    fn attention<'py>(
        &self,
        py: Python<'py>,
        queries: Vec<(Sequence, Bound<'py, PyAny>)>,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let options = attention_options(options).py_err(py)?;
        let read = queries
            .iter()
            .map(|(seq, q)| Ok((seq.0, tensor("Q", q, false)?)))
            .collect::<PyResult<Vec<_>>>()?;
        let engine = &self.engine.get().engine;
        let outs = py
            .detach(|| {
                let queries: Vec<_> = read.iter().map(|(s, q)| (*s, q)).collect();
                self.lock().attention_blocking(engine, &queries, &options)
            })
            .py_err(py)?;
        outs.into_iter()
            .map(|o| {
                tensors_dict(
                    py,
                    [
                        ("y", Some(o.y)),
                        ("qk_matmul_output", o.qk_matmul_output),
                        ("lse", o.lse),
                    ],
                )
            })
            .collect()
    }
}
