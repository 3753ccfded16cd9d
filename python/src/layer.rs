//! The multi-head attention layer (`webattn.MultiHeadAttention`): the
//! projections, RoPE and attention of `webattn::family::mha` on the engine,
//! over whole sequences or one decoder step at a time through a KV cache.

use crate::arrays::{tensor, to_numpy};
use crate::device::NativeKvCache;
use crate::engine::NativeEngine;
use crate::errors::IntoPy;
use crate::options::attention_options;
use crate::serving::{NativePagedKvCache, Sequence};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use webattn::family::mha::{MhaWeights, MultiHeadAttention};
use webattn::family::position::{Rope, RopeLayout};
use webattn::family::Attended;
use webattn::{Error, HostTensor, WeightStorage};

/// The weight names of a layer, in `MhaWeights`' order.
const WEIGHTS: [&str; 8] = ["w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o"];

/// A layer on an engine.
#[pyclass(frozen, module = "webattn._webattn")]
pub struct NativeMha {
    engine: Py<NativeEngine>,
    layer: MultiHeadAttention,
}

/// The output and, where asked, the attention weights.
fn attended<'py>(
    py: Python<'py>,
    a: Attended,
) -> PyResult<(Bound<'py, PyAny>, Option<Bound<'py, PyAny>>)> {
    let weights = a.weights.map(|w| to_numpy(py, w)).transpose()?;
    Ok((
        to_numpy(py, a.output)?.into_any(),
        weights.map(|w| w.into_any()),
    ))
}

#[pymethods]
impl NativeMha {
    /// A layer from `weights` (a dict of float32 arrays: `w_q`, `w_k`,
    /// `w_v`, `w_o` `[out, in]`, and optional biases `b_q`... `[out]`),
    /// `heads` query heads and `kv_heads` key/value heads; RoPE on the
    /// queries and keys where `rope_base` is given; the weights kept in f16
    /// on the device where `f16_weights`.
    #[new]
    #[pyo3(signature = (engine, weights, heads, kv_heads, rope_base = None, rope_layout = "interleaved", f16_weights = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        engine: Py<NativeEngine>,
        weights: &Bound<'_, PyDict>,
        heads: usize,
        kv_heads: usize,
        rope_base: Option<f64>,
        rope_layout: &str,
        f16_weights: bool,
    ) -> PyResult<Self> {
        let weights = read_weights(py, weights)?;
        let mut layer = MultiHeadAttention::new(weights, heads, kv_heads).py_err(py)?;
        if let Some(base) = rope_base {
            layer = layer
                .with_rope(rope(base, rope_layout).py_err(py)?)
                .py_err(py)?;
        }
        if f16_weights {
            layer = layer.with_weight_storage(WeightStorage::F16);
        }
        Ok(NativeMha { engine, layer })
    }

    /// Self- or cross-attention over whole sequences: `query` `[B, N,
    /// d_model]`, `key_value` `[B, M, d_kv]` (`None`: self-attention).
    /// Returns `(output, weights)`, the weights `[B, heads, N, M]` where asked.
    #[pyo3(signature = (query, key_value = None, *, need_weights = false, **options))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        query: &Bound<'py, PyAny>,
        key_value: Option<&Bound<'py, PyAny>>,
        need_weights: bool,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<(Bound<'py, PyAny>, Option<Bound<'py, PyAny>>)> {
        let options = attention_options(options).py_err(py)?;
        let query = tensor("query", query, false)?;
        let key_value = key_value
            .map(|kv| tensor("key_value", kv, false))
            .transpose()?;
        let engine = &self.engine.get().engine;
        let layer = &self.layer;
        let out = py
            .detach(|| {
                layer.forward_blocking(engine, &query, key_value.as_ref(), &options, need_weights)
            })
            .py_err(py)?;
        attended(py, out)
    }

    /// One decoder step: `x` `[B, n, d_model]` holds the next `n` tokens,
    /// whose keys and values are appended to `cache`; causal.
    #[pyo3(signature = (x, cache, *, need_weights = false, **options))]
    fn step<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        cache: &NativeKvCache,
        need_weights: bool,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<(Bound<'py, PyAny>, Option<Bound<'py, PyAny>>)> {
        let options = attention_options(options).py_err(py)?;
        let x = tensor("x", x, false)?;
        let engine = &self.engine.get().engine;
        let layer = &self.layer;
        let out = py
            .detach(|| {
                let mut cache = cache.lock();
                layer.forward_cached_blocking(engine, &x, &mut cache, &options, need_weights)
            })
            .py_err(py)?;
        attended(py, out)
    }

    /// One serving step over a paged cache: `steps` `[(seq, x)]`, each
    /// sequence's next tokens `[1, n, d_model]`, whose keys and values are
    /// appended to its pages; causal, positions continuing from each
    /// sequence's length. Each sequence's output, in order.
    #[pyo3(signature = (cache, steps, **options))]
    fn serve<'py>(
        &self,
        py: Python<'py>,
        cache: &NativePagedKvCache,
        steps: Vec<(Sequence, Bound<'py, PyAny>)>,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let options = attention_options(options).py_err(py)?;
        let xs = steps
            .iter()
            .map(|(seq, x)| Ok((seq.0, tensor("x", x, false)?)))
            .collect::<PyResult<Vec<_>>>()?;
        let engine = &self.engine.get().engine;
        let layer = &self.layer;
        let outs = py
            .detach(|| {
                let mut cache = cache.lock();
                let asked: Vec<_> = xs.iter().map(|(s, x)| (*s, x)).collect();
                layer.forward_paged_blocking(engine, &mut cache, &asked, &options)
            })
            .py_err(py)?;
        outs.into_iter()
            .map(|t| Ok(to_numpy(py, t)?.into_any()))
            .collect()
    }

    /// `(d_model, d_kv, heads, kv_heads, head_dim, v_head_dim)`.
    #[getter]
    fn dims(&self) -> (usize, usize, usize, usize, usize, usize) {
        let d = self.layer.dims();
        (
            d.d_model,
            d.d_kv,
            d.heads,
            d.kv_heads,
            d.head_dim,
            d.v_head_dim,
        )
    }
}

/// A layer's weights from a dict of arrays named as [`WEIGHTS`].
fn read_weights(py: Python<'_>, weights: &Bound<'_, PyDict>) -> PyResult<MhaWeights> {
    let mut read = Vec::with_capacity(WEIGHTS.len());
    for name in WEIGHTS {
        read.push(match weights.get_item(name)? {
            Some(w) if !w.is_none() => Some(tensor(name, &w, false)?),
            _ => None,
        });
    }
    let required = |t: Option<HostTensor>, name: &'static str| {
        t.ok_or_else(|| {
            crate::errors::to_py(
                py,
                Error::InvalidOption {
                    name: "weights",
                    value: format!("no {name:?}"),
                    reason: "the layer needs w_q, w_k, w_v and w_o ([out, in] each)",
                },
            )
        })
    };
    let [w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o]: [Option<HostTensor>; 8] =
        read.try_into().unwrap_or_else(|_| Default::default());
    Ok(MhaWeights {
        w_q: required(w_q, "w_q")?,
        b_q,
        w_k: required(w_k, "w_k")?,
        b_k,
        w_v: required(w_v, "w_v")?,
        b_v,
        w_o: required(w_o, "w_o")?,
        b_o,
    })
}

/// RoPE of base `base` in the layout named.
fn rope(base: f64, layout: &str) -> webattn::Result<Rope> {
    let layout = match layout {
        "interleaved" => RopeLayout::Interleaved,
        "half" => RopeLayout::HalfSplit,
        other => {
            return Err(Error::InvalidOption {
                name: "rope_layout",
                value: format!("{other:?}"),
                reason: "must be 'interleaved' (GPT-J, LLaMA) or 'half' (GPT-NeoX)",
            })
        }
    };
    Ok(Rope {
        base,
        layout,
        ..Default::default()
    })
}

/// Random weights for a layer (uniform in ±1/√fan_in, with biases), as a
/// dict of float32 arrays.
#[pyfunction]
#[pyo3(signature = (d_model, heads, head_dim, kv_heads, d_kv, seed))]
pub fn random_mha_weights<'py>(
    py: Python<'py>,
    d_model: usize,
    heads: usize,
    head_dim: usize,
    kv_heads: usize,
    d_kv: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let w = MhaWeights::random(d_model, d_kv, heads, kv_heads, head_dim, seed).py_err(py)?;
    let all = [
        ("w_q", Some(w.w_q)),
        ("b_q", w.b_q),
        ("w_k", Some(w.w_k)),
        ("b_k", w.b_k),
        ("w_v", Some(w.w_v)),
        ("b_v", w.b_v),
        ("w_o", Some(w.w_o)),
        ("b_o", w.b_o),
    ];
    crate::engine::tensors_dict(py, all)
}
