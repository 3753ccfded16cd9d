//! `webattn._webattn.NativeEngine`: one engine (a device, or the CPU
//! backend), shared by every thread that calls it. Each call reads its
//! arrays with the GIL held, then releases the GIL while the engine works.

use crate::arrays::{lengths, mask, tensor, to_numpy};
use crate::errors::IntoPy;
use crate::options::attention_options;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use webattn::conformance::{run_sweep, sweep_len, CaseResult, SweepKind};
use webattn::{
    AttentionInputs, BackendKind, BackendPreference, BackwardInputs, Engine, EngineOptions,
    GradientOptions, HostTensor, Precision, TensorRef,
};

/// The engine behind `webattn.Engine`.
#[pyclass(frozen, module = "webattn._webattn")]
pub struct NativeEngine {
    pub(crate) engine: Engine,
}

/// Which tensors are stored in f16 (their arrays came as float16).
#[derive(Debug, Clone, Copy, Default, FromPyObject)]
#[pyo3(from_item_all)]
pub(crate) struct F16Flags {
    q: bool,
    k: bool,
    v: bool,
    past_key: bool,
    past_value: bool,
}

/// The tensors of one call, on the host ([`Inputs`]) or on the engine.
pub(crate) struct CallTensors<T: TensorRef> {
    pub q: T,
    pub k: T,
    pub v: T,
    pub mask: Option<T::Mask>,
    pub past: Option<(T, T)>,
    pub nonpad: Option<Vec<i64>>,
}

/// The host inputs of one call.
pub(crate) type Inputs = CallTensors<HostTensor>;

impl<T: TensorRef> CallTensors<T> {
    /// The call's inputs as the engine takes them.
    pub fn as_inputs(&self) -> AttentionInputs<'_, T> {
        let mut inputs = AttentionInputs::new(&self.q, &self.k, &self.v);
        if let Some(m) = &self.mask {
            inputs = inputs.with_mask(m);
        }
        if let Some((pk, pv)) = &self.past {
            inputs = inputs.with_past(pk, pv);
        }
        if let Some(n) = &self.nonpad {
            inputs = inputs.with_nonpad_kv_seqlen(n);
        }
        inputs
    }
}

/// The arrays of one call as Python passes them: `(q, k, v, attn_mask,
/// past_key, past_value, nonpad_kv_seqlen)`, the last four `None` where absent.
#[derive(FromPyObject)]
pub(crate) struct Given<'py>(
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
);

impl Inputs {
    /// Reads the arrays (with the GIL held), each refusal naming its tensor.
    pub fn read(py: Python<'_>, given: Given<'_>, f16: F16Flags) -> PyResult<Inputs> {
        let Given(q, k, v, attn_mask, past_key, past_value, nonpad) = given;
        let past = match (past_key, past_value) {
            (None, None) => None,
            (Some(pk), Some(pv)) => Some((
                tensor("past_key", &pk, f16.past_key)?,
                tensor("past_value", &pv, f16.past_value)?,
            )),
            _ => {
                return Err(crate::errors::to_py(
                    py,
                    webattn::Error::Conflict("past_key and past_value must be given together"),
                ))
            }
        };
        Ok(Inputs {
            q: tensor("Q", &q, f16.q)?,
            k: tensor("K", &k, f16.k)?,
            v: tensor("V", &v, f16.v)?,
            mask: attn_mask.as_ref().map(mask).transpose()?,
            past,
            nonpad: nonpad.as_ref().map(lengths).transpose()?,
        })
    }
}

#[pymethods]
impl NativeEngine {
    /// An engine on `backend`: `"auto"` (a GPU where one is faster than the
    /// CPU backend), `"gpu"` (an adapter, or an error) or `"cpu"`.
    #[new]
    #[pyo3(signature = (backend = "auto"))]
    fn new(py: Python<'_>, backend: &str) -> PyResult<Self> {
        let backend = match backend {
            "auto" => BackendPreference::Auto,
            "gpu" => BackendPreference::Gpu,
            "cpu" => BackendPreference::Cpu,
            other => {
                return Err(crate::errors::to_py(
                    py,
                    webattn::Error::InvalidOption {
                        name: "backend",
                        value: format!("{other:?}"),
                        reason: "must be 'auto', 'gpu' or 'cpu'",
                    },
                ))
            }
        };
        let options = EngineOptions {
            backend,
            ..Default::default()
        };
        let engine = py
            .detach(|| Engine::with_options_blocking(options))
            .py_err(py)?;
        Ok(NativeEngine { engine })
    }

    /// What the engine runs on: backend, adapter, paths.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let info = PyDict::new(py);
        let backend = match self.engine.backend() {
            BackendKind::Gpu => "gpu",
            BackendKind::Cpu => "cpu",
        };
        info.set_item("backend", backend)?;
        info.set_item("description", self.engine.describe())?;
        let paths: Vec<&str> = self.engine.paths().iter().map(|p| p.name()).collect();
        info.set_item("paths", paths)?;
        info.set_item("cpu_reason", self.engine.cpu_reason())?;
        info.set_item("version", env!("CARGO_PKG_VERSION"))?;
        Ok(info)
    }

    /// One call of the ONNX `Attention` operator on 4-D float32 arrays (the
    /// package converts dtypes, 3-D inputs and tensors): `inputs` is `(q, k,
    /// v, attn_mask, past_key, past_value, nonpad_kv_seqlen)`, the options
    /// by name. Returns a dict of the outputs asked for: `y`, and
    /// `present_key`, `present_value`, `qk_matmul_output`, `lse`.
    #[pyo3(signature = (inputs, *, f16 = None, **options))]
    fn attention<'py>(
        &self,
        py: Python<'py>,
        inputs: Given<'py>,
        f16: Option<F16Flags>,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let options = attention_options(options).py_err(py)?;
        let inputs = Inputs::read(py, inputs, f16.unwrap_or_default())?;
        let engine = &self.engine;
        let out = py
            .detach(|| engine.attention_host_blocking(&inputs.as_inputs(), &options))
            .py_err(py)?;
        let outputs = [
            ("y", Some(out.y)),
            ("present_key", out.present_key),
            ("present_value", out.present_value),
            ("qk_matmul_output", out.qk_matmul_output),
            ("lse", out.lse),
        ];
        tensors_dict(py, outputs)
    }

    /// The gradients of one call: the forward's `inputs` (as `attention`
    /// takes them) and options, its Y and logsumexp (`return_lse`), and dY.
    /// Returns a dict of `dq`, `dk`, `dv`, and `d_past_key`, `d_past_value`
    /// and `d_mask` where they exist.
    #[pyo3(signature = (inputs, y, lse, dy, *, f16 = None, mask_gradient = false, **options))]
    #[allow(clippy::too_many_arguments)]
    fn attention_backward<'py>(
        &self,
        py: Python<'py>,
        inputs: Given<'py>,
        y: &Bound<'py, PyAny>,
        lse: &Bound<'py, PyAny>,
        dy: &Bound<'py, PyAny>,
        f16: Option<F16Flags>,
        mask_gradient: bool,
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let options = attention_options(options).py_err(py)?;
        let inputs = Inputs::read(py, inputs, f16.unwrap_or_default())?;
        let (y, lse, dy) = (
            tensor("Y", y, false)?,
            tensor("lse", lse, false)?,
            tensor("dY", dy, false)?,
        );
        let forward = BackwardInputs {
            y: &y,
            lse: &lse,
            dy: &dy,
        };
        let grads = GradientOptions { mask_gradient };
        let engine = &self.engine;
        let out = py
            .detach(|| {
                engine.attention_backward_host_blocking(
                    &inputs.as_inputs(),
                    &options,
                    &forward,
                    grads,
                )
            })
            .py_err(py)?;
        let outputs = [
            ("dq", Some(out.dq)),
            ("dk", Some(out.dk)),
            ("dv", Some(out.dv)),
            ("d_past_key", out.d_past_key),
            ("d_past_value", out.d_past_value),
            ("d_mask", out.d_mask),
        ];
        tensors_dict(py, outputs)
    }

    /// The conformance sweep on every path the engine has: `full` for the
    /// whole sweep, else the quick one; `filter` keeps cases whose name
    /// contains it; `progress(done, total, case_name)` after each result.
    #[pyo3(signature = (full = false, filter = String::new(), seed = 1, fast = false, progress = None))]
    fn check<'py>(
        &self,
        py: Python<'py>,
        full: bool,
        filter: String,
        seed: u64,
        fast: bool,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let kind = if full {
            SweepKind::Full
        } else {
            SweepKind::Quick
        };
        let precision = if fast {
            Precision::Fast
        } else {
            Precision::Highest
        };
        let engine = &self.engine;
        let total = sweep_len(engine, kind, &filter);
        let mut done = 0usize;
        let mut callback_error: Option<PyErr> = None;
        let report = py.detach(|| {
            pollster::block_on(run_sweep(engine, kind, &filter, seed, precision, |r| {
                done += 1;
                if let (Some(cb), None) = (&progress, &callback_error) {
                    let called = Python::attach(|py| cb.call1(py, (done, total, r.name.as_str())));
                    callback_error = called.err();
                }
            }))
        });
        if let Some(e) = callback_error {
            return Err(e);
        }
        let dict = PyDict::new(py);
        dict.set_item("adapter", &report.adapter)?;
        dict.set_item("passed", report.passed())?;
        dict.set_item("failed", report.failed())?;
        dict.set_item("worst_share_of_allowed", report.worst_share_of_allowed())?;
        dict.set_item("summary", report.summary_line())?;
        dict.set_item("table", report.table())?;
        let results = report
            .results
            .iter()
            .map(|r| result_dict(py, r))
            .collect::<PyResult<Vec<_>>>()?;
        dict.set_item("results", results)?;
        Ok(dict)
    }

    /// Attention of packed sequences (`Engine.attention_ragged`):
    /// `(q, k, v)` packed `[tokens, heads, head size]`, `(cu_seqlens_q,
    /// cu_seqlens_k)` their offsets.
    #[pyo3(signature = (packed, offsets, **options))]
    fn attention_ragged<'py>(
        &self,
        py: Python<'py>,
        packed: (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>),
        offsets: (Bound<'py, PyAny>, Bound<'py, PyAny>),
        options: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        crate::serving::attention_ragged(
            py,
            self,
            (&packed.0, &packed.1, &packed.2),
            (&offsets.0, &offsets.1),
            options,
        )
    }

    /// Plans a call for the shapes (and dtypes) of `inputs` with `options`:
    /// every run of the result takes that plan.
    #[pyo3(signature = (inputs, *, f16 = None, **options))]
    fn prepare(
        slf: Py<Self>,
        py: Python<'_>,
        inputs: Given<'_>,
        f16: Option<F16Flags>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<crate::device::NativePrepared> {
        crate::device::prepare(py, slf, inputs, f16.unwrap_or_default(), options)
    }

    /// Seconds of each of `calls` calls made from Rust on these arrays (the
    /// tensors built once): the baseline of the Python call's overhead
    /// (python/benches/overhead.py).
    fn call_seconds(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        calls: usize,
    ) -> PyResult<Vec<f64>> {
        let (q, k, v) = (
            tensor("Q", q, false)?,
            tensor("K", k, false)?,
            tensor("V", v, false)?,
        );
        let inputs = AttentionInputs::new(&q, &k, &v);
        let options = webattn::AttentionOptions::default();
        let engine = &self.engine;
        py.detach(|| {
            (0..calls)
                .map(|_| {
                    let start = std::time::Instant::now();
                    engine.attention_host_blocking(&inputs, &options)?;
                    Ok(start.elapsed().as_secs_f64())
                })
                .collect::<webattn::Result<Vec<f64>>>()
        })
        .py_err(py)
    }

    fn __repr__(&self) -> String {
        format!("Engine({})", self.engine.describe())
    }
}

/// The named tensors that exist, as NumPy arrays in a dict.
pub(crate) fn tensors_dict<'py, const N: usize>(
    py: Python<'py>,
    tensors: [(&str, Option<HostTensor>); N],
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, t) in tensors {
        if let Some(t) = t {
            dict.set_item(name, to_numpy(py, t)?)?;
        }
    }
    Ok(dict)
}

/// One case's result as a dict.
fn result_dict<'py>(py: Python<'py>, r: &CaseResult) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &r.name)?;
    d.set_item("shapes", &r.shapes)?;
    d.set_item("path", r.path.name())?;
    d.set_item("passed", r.passed())?;
    d.set_item("failure", r.failure.as_deref())?;
    d.set_item("millis", r.millis)?;
    if let Some(report) = &r.report {
        d.set_item("worst_error", report.max_abs)?;
        d.set_item("allowed", report.allowed)?;
        d.set_item("share_of_allowed", report.share_of_allowed())?;
    }
    Ok(d)
}
