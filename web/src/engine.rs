//! `EngineCore`: the engine as the JavaScript library's `WebAttn` class sees
//! it. `web/lib/webattn.js` wraps it (device tensors as objects, options
//! defaults); everything here takes and returns plain JavaScript values.

use std::rc::Rc;

use js_sys::{Array, Function, Object};
use wasm_bindgen::prelude::*;
use web_time::Instant;
use webattn::conformance::{run_sweep, sweep_len, SweepKind};
use webattn::measure as bench;
use webattn::measure::{AttentionShape, Repeats};
use webattn::Precision;
use webattn::{
    AttentionInputs, BackendKind, BackendPreference, DeviceLimits, Engine, EngineOptions,
    HostTensor, KernelPath, LimitOverride, LimitsPreset, PowerPreference,
};

use crate::convert::{self, field, set, type_name};
use crate::errors::{js_error, to_js, IntoJs};
use crate::handles::{Handles, Held};

/// An engine on the browser's WebGPU adapter, or on the CPU backend.
#[wasm_bindgen]
pub struct EngineCore {
    pub(crate) engine: Rc<Engine>,
    handles: Handles,
    /// Prepared calls (`prepare`), by number.
    prepared: std::cell::RefCell<std::collections::HashMap<u32, Rc<webattn::PreparedAttention>>>,
    /// Why the engine runs on the CPU, when it fell back to it.
    no_gpu_reason: Option<String>,
}

/// `maxStorageBufferBindingSize` → `max_storage_buffer_binding_size`.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// `limits`: a preset name, or `{preset?, maxStorageBufferBindingSize: 4 << 20, ...}`
/// (values as numbers or strings such as `"4MiB"`).
fn device_limits(v: &JsValue) -> Result<DeviceLimits, JsValue> {
    if let Some(name) = v.as_string() {
        let preset: LimitsPreset = name.parse().js()?;
        return Ok(DeviceLimits {
            preset,
            overrides: Vec::new(),
        });
    }
    let Some(object) = v.dyn_ref::<Object>() else {
        return Err(js_error(
            "InvalidOption",
            format!(
                "limits must be 'adapter', 'webgpu-default', 'downlevel' or an object of \
                 WebGPU limits, got {}",
                type_name(v)
            ),
        ));
    };
    let mut limits = DeviceLimits::default();
    for key in Object::keys(object).iter() {
        let key = key.as_string().unwrap_or_default();
        let value = field(v, &key).unwrap_or(JsValue::UNDEFINED);
        if key == "preset" {
            limits.preset = value.as_string().unwrap_or_default().parse().js()?;
            continue;
        }
        let amount = match (value.as_f64(), value.as_string()) {
            (Some(x), _) if x >= 0.0 && x.fract() == 0.0 => x as u64,
            (_, Some(text)) => webattn::limits::parse_size(&text).js()?,
            _ => {
                return Err(js_error(
                    "InvalidOption",
                    format!(
                        "limits.{key} must be a whole number of bytes or a size such as '4MiB'"
                    ),
                ))
            }
        };
        limits
            .overrides
            .push(LimitOverride::new(&snake_case(&key), amount).js()?);
    }
    Ok(limits)
}

const CREATE_OPTIONS: [&str; 4] = ["backend", "powerPreference", "limits", "cpuThreads"];

fn engine_options(v: &JsValue) -> Result<EngineOptions, JsValue> {
    let mut options = EngineOptions::default();
    if v.is_undefined() || v.is_null() {
        return Ok(options);
    }
    let Some(object) = v.dyn_ref::<Object>() else {
        return Err(js_error(
            "InvalidOption",
            "create(options): options must be an object",
        ));
    };
    for key in Object::keys(object).iter() {
        let key = key.as_string().unwrap_or_default();
        if !CREATE_OPTIONS.contains(&key.as_str()) {
            return Err(js_error(
                "InvalidOption",
                format!(
                    "create(options): `{key}` is not an option; the options are backend, \
                     powerPreference, limits and cpuThreads"
                ),
            ));
        }
    }
    if let Some(b) = field(v, "backend") {
        options.backend = match b.as_string().as_deref() {
            Some("auto") => BackendPreference::Auto,
            Some("gpu") => BackendPreference::Gpu,
            Some("cpu") => BackendPreference::Cpu,
            _ => {
                return Err(js_error(
                    "InvalidOption",
                    "backend must be 'auto', 'gpu' or 'cpu'",
                ))
            }
        };
    }
    if let Some(p) = field(v, "powerPreference") {
        options.power = match p.as_string().as_deref() {
            Some("default") => PowerPreference::Default,
            Some("low-power") => PowerPreference::LowPower,
            Some("high-performance") => PowerPreference::HighPerformance,
            _ => {
                return Err(js_error(
                    "InvalidOption",
                    "powerPreference must be 'high-performance', 'low-power' or 'default'",
                ))
            }
        };
    }
    if let Some(l) = field(v, "limits") {
        options.limits = device_limits(&l)?;
    }
    if let Some(t) = field(v, "cpuThreads") {
        match t.as_f64() {
            Some(n) if n >= 1.0 && n.fract() == 0.0 => options.cpu_threads = Some(n as usize),
            _ => {
                return Err(js_error(
                    "InvalidOption",
                    "cpuThreads must be a positive whole number",
                ))
            }
        }
    }
    Ok(options)
}

fn array_of_numbers<T: Into<JsValue> + Copy>(values: &[T]) -> Array {
    values.iter().map(|&v| v.into()).collect()
}

#[wasm_bindgen]
impl EngineCore {
    /// Creates an engine: the browser's WebGPU adapter when it has one (unless
    /// `backend` is `'cpu'`), else the CPU backend (unless `backend` is `'gpu'`).
    /// Left to choose, it takes the CPU backend over an adapter that is a CPU
    /// implementation (SwiftShader: several times slower on the same cores)
    /// unless the caller asked for limits of its own.
    pub async fn create(options: JsValue) -> Result<EngineCore, JsValue> {
        console_error_panic_hook::set_once();
        let options = engine_options(&options)?;
        let wanted = options.backend;
        let gpu_options = EngineOptions {
            backend: BackendPreference::Gpu,
            ..options.clone()
        };
        let cpu_options = EngineOptions {
            backend: BackendPreference::Cpu,
            ..options.clone()
        };
        let (engine, no_gpu_reason) = match wanted {
            BackendPreference::Cpu => (Engine::with_options(cpu_options).await.js()?, None),
            BackendPreference::Gpu => (Engine::with_options(gpu_options).await.js()?, None),
            BackendPreference::Auto => match Engine::with_options(gpu_options).await {
                Ok(engine) => {
                    let software = engine
                        .capabilities()
                        .filter(|caps| webattn::plan::cpu_backend_over(caps).is_some())
                        .filter(|_| options.limits == DeviceLimits::default())
                        .map(|caps| {
                            // Browsers may report no name (SwiftShader in Chromium).
                            let name = match caps.adapter.name.as_str() {
                                "" => "the browser's WebGPU adapter",
                                name => name,
                            };
                            format!(
                                "the only adapter, {name}, is a CPU implementation: the CPU \
                                 backend computes the same calls several times faster on these \
                                 cores (ask for the adapter with backend: \"gpu\")"
                            )
                        });
                    match software {
                        Some(why) => {
                            drop(engine);
                            (Engine::with_options(cpu_options).await.js()?, Some(why))
                        }
                        None => (engine, None),
                    }
                }
                // No adapter (or no device on its defaults): the CPU backend.
                // A device refused under limits the caller asked for is their error.
                Err(e @ webattn::Error::NoAdapter(_)) => (
                    Engine::with_options(cpu_options).await.js()?,
                    Some(e.to_string()),
                ),
                Err(e @ webattn::Error::RequestDevice(_))
                    if options.limits == DeviceLimits::default() =>
                {
                    (
                        Engine::with_options(cpu_options).await.js()?,
                        Some(e.to_string()),
                    )
                }
                Err(e) => return Err(to_js(&e)),
            },
        };
        Ok(EngineCore {
            engine: Rc::new(engine),
            handles: Handles::default(),
            prepared: Default::default(),
            no_gpu_reason,
        })
    }

    /// The adapter (or the CPU backend), its limits, features and kernel plan.
    pub fn adapter(&self) -> JsValue {
        let out = Object::new();
        set(&out, "describe", self.engine.describe());
        set(
            &out,
            "paths",
            self.engine
                .paths()
                .iter()
                .map(|p| JsValue::from(p.name()))
                .collect::<Array>(),
        );
        let Some(caps) = self.engine.capabilities() else {
            set(&out, "gpu", false);
            set(&out, "backend", "cpu");
            if let Some(reason) = &self.no_gpu_reason {
                set(&out, "reason", reason.as_str());
            }
            return out.into();
        };
        set(&out, "gpu", true);
        set(&out, "name", caps.adapter.name.as_str());
        set(&out, "backend", caps.adapter.backend.as_str());
        set(&out, "deviceType", caps.adapter.device_type.as_str());
        let l = &caps.limits;
        let limits = Object::new();
        set(
            &limits,
            "maxStorageBufferBindingSize",
            l.max_storage_buffer_binding_size as f64,
        );
        set(&limits, "maxBufferSize", l.max_buffer_size as f64);
        set(
            &limits,
            "maxComputeWorkgroupStorageSize",
            l.max_compute_workgroup_storage_size,
        );
        set(
            &limits,
            "maxComputeInvocationsPerWorkgroup",
            l.max_compute_invocations_per_workgroup,
        );
        set(
            &limits,
            "maxComputeWorkgroupsPerDimension",
            l.max_compute_workgroups_per_dimension,
        );
        set(&out, "limits", limits);
        let features = Object::new();
        set(&features, "shaderF16", caps.shader_f16);
        set(&features, "subgroups", caps.subgroups);
        set(&features, "subgroupMinSize", caps.subgroup_min_size);
        set(&features, "subgroupMaxSize", caps.subgroup_max_size);
        set(&features, "timestampQuery", caps.timestamp_query);
        set(&out, "features", features);
        let plans: Array = self
            .engine
            .typical_plans()
            .into_iter()
            .map(|(call, plan)| {
                let o = Object::new();
                set(&o, "call", call.trim());
                set(
                    &o,
                    "plan",
                    match plan {
                        Ok(plan) => plan.to_string(),
                        Err(e) => format!("refused: {e}"),
                    },
                );
                JsValue::from(o)
            })
            .collect();
        set(&out, "plans", plans);
        if let Some(Ok(kernel)) = self.engine.planner(64, 64).map(|p| p.fused_kernel()) {
            set(&out, "fusedKernel", kernel.name());
        }
        out.into()
    }

    /// `'gpu'` or `'cpu'`.
    pub fn backend(&self) -> String {
        match self.engine.backend() {
            BackendKind::Gpu => "gpu".into(),
            BackendKind::Cpu => "cpu".into(),
        }
    }

    /// One call of the ONNX `Attention` operator (see `attention.rs`).
    pub async fn attention(&self, inputs: JsValue, options: JsValue) -> Result<JsValue, JsValue> {
        crate::attention::call(&self.engine, &self.handles, &inputs, &options, None).await
    }

    /// The gradients of a forward call (see `backward.rs`): `inputs` and
    /// `options` as the forward's, `forward` `{y, lse, dy}`; resolves to
    /// `{dq, dk, dv, dpastKey?, dpastValue?, path, plan, check?}`.
    #[wasm_bindgen(js_name = attentionBackward)]
    pub async fn attention_backward(
        &self,
        inputs: JsValue,
        forward: JsValue,
        options: JsValue,
    ) -> Result<JsValue, JsValue> {
        crate::backward::call(&self.engine, &self.handles, &inputs, &forward, &options).await
    }

    /// Packed sequences without padding (see `ragged.rs`): `inputs` `{q, k,
    /// v, cuSeqlensQ, cuSeqlensK}`; resolves to `{y, lse?}` packed as Q.
    #[wasm_bindgen(js_name = attentionRagged)]
    pub async fn attention_ragged(
        &self,
        inputs: JsValue,
        options: JsValue,
    ) -> Result<JsValue, JsValue> {
        crate::ragged::call(&self.engine, &inputs, &options).await
    }

    /// A paged KV cache on this engine (see `paged.rs`): `layout` `{kvHeads,
    /// headDim, vHeadDim?, pageSize?, pageLimit?}`.
    #[wasm_bindgen(js_name = pagedCache)]
    pub fn paged_cache(&self, layout: JsValue) -> Result<crate::paged::PagedCacheCore, JsValue> {
        crate::paged::PagedCacheCore::new(&self.engine, &layout)
    }

    /// Plans a call of the shapes of `inputs` with `options` once; returns
    /// `{id, path, plan, reason}`. Runs of it (`runPrepared`) reuse one workspace.
    pub async fn prepare(&self, inputs: JsValue, options: JsValue) -> Result<JsValue, JsValue> {
        let prepared =
            crate::attention::prepare(&self.engine, &self.handles, &inputs, &options).await?;
        let plan = prepared.plan().clone();
        let id = {
            let mut map = self.prepared.borrow_mut();
            let id = map.keys().max().map_or(1, |k| k + 1);
            map.insert(id, Rc::new(prepared));
            id
        };
        let out = Object::new();
        set(&out, "id", id);
        set(&out, "path", plan.path.name());
        set(&out, "plan", plan.to_string());
        if let Some(reason) = plan.reason {
            set(&out, "reason", reason);
        }
        Ok(out.into())
    }

    /// Runs prepared call `id` on `inputs` of its shapes; `options` may hold
    /// only `keepOnDevice`, `timing` and `verify` (the attributes are the
    /// prepared ones). Resolves as `attention` does.
    #[wasm_bindgen(js_name = runPrepared)]
    pub async fn run_prepared(
        &self,
        id: u32,
        inputs: JsValue,
        options: JsValue,
    ) -> Result<JsValue, JsValue> {
        let prepared = self.prepared.borrow().get(&id).cloned().ok_or_else(|| {
            js_error(
                "Conflict",
                format!("prepared call {id} was disposed (or belongs to another engine)"),
            )
        })?;
        crate::attention::call(
            &self.engine,
            &self.handles,
            &inputs,
            &options,
            Some(&prepared),
        )
        .await
    }

    /// Frees a prepared call's workspace; `false` if it was already freed.
    #[wasm_bindgen(js_name = disposePrepared)]
    pub fn dispose_prepared(&self, id: u32) -> bool {
        self.prepared.borrow_mut().remove(&id).is_some()
    }

    /// Uploads a tensor `{data, shape}`; returns `{handle, shape, kind}`.
    /// bfloat16 bits go to the device as they are and are widened there.
    pub async fn upload(&self, tensor: JsValue) -> Result<JsValue, JsValue> {
        if let Some((bits, shape)) = convert::bf16_bits("tensor", &tensor).js()? {
            self.engine.recover().await.js()?;
            let t = self.engine.upload_bf16(&bits, &shape).await.js()?;
            return Ok(self.handles.hold(Held::Tensor(t)));
        }
        let host = convert::tensor("tensor", &tensor).js()?;
        self.engine.recover().await.js()?;
        let t = self.engine.upload_async(&host).await.js()?;
        Ok(self.handles.hold(Held::Tensor(t)))
    }

    /// Writes `{data, shape}` (of the tensor's shape and dtype) into a held
    /// device tensor, in place: no buffer is created.
    pub async fn write(&self, handle: u32, tensor: JsValue) -> Result<(), JsValue> {
        let host = convert::tensor("values", &tensor).js()?;
        let Held::Tensor(mut t) = self.handles.get(handle)? else {
            return Err(crate::errors::js_error(
                "InvalidOption",
                "a mask is written by uploading it again",
            ));
        };
        self.engine.recover().await.js()?;
        self.engine.write(&mut t, &host).js()?;
        self.handles.replace(handle, Held::Tensor(t));
        Ok(())
    }

    /// Uploads a mask `{data, shape}` (bool as Uint8Array, or additive floats).
    #[wasm_bindgen(js_name = uploadMask)]
    pub async fn upload_mask(&self, mask: JsValue) -> Result<JsValue, JsValue> {
        let host = convert::mask(&mask).js()?;
        self.engine.recover().await.js()?;
        let m = self.engine.upload_mask_async(&host).await.js()?;
        Ok(self.handles.hold(Held::Mask(m)))
    }

    /// Reads a device tensor back as `{data: Float32Array, shape}` (a mask as
    /// its additive float form).
    pub async fn read(&self, handle: u32) -> Result<JsValue, JsValue> {
        let host = match self.handles.get(handle)? {
            Held::Tensor(t) => self.engine.download(&t).await.js()?,
            Held::Mask(m) => {
                let mask = self.engine.download_mask(&m).await.js()?;
                HostTensor::new(mask.shape().to_vec(), mask.to_additive()).js()?
            }
        };
        Ok(convert::to_js(&host))
    }

    /// Frees a device tensor; `false` if it was already freed.
    pub fn dispose(&self, handle: u32) -> bool {
        self.handles.release(handle)
    }

    /// How many device tensors are held (not yet disposed).
    #[wasm_bindgen(js_name = heldTensors)]
    pub fn held_tensors(&self) -> usize {
        self.handles.len()
    }

    /// Compiles ahead every pipeline the given calls need: each entry is
    /// `{q, k, v, mask?, pastKey?, pastValue?}` of shapes, run once on zeros
    /// with `options`. Returns the milliseconds it took.
    pub async fn warmup(&self, shapes: JsValue, options: JsValue) -> Result<f64, JsValue> {
        let start = Instant::now();
        if !Array::is_array(&shapes) {
            return Err(js_error(
                "InvalidOption",
                "warmup(shapes): shapes must be an array of {q, k, v} shapes",
            ));
        }
        let call = convert::call_options(&options)?;
        for entry in Array::from(&shapes).iter() {
            convert::known_keys(
                &entry,
                &["q", "k", "v", "mask", "pastKey", "pastValue"],
                "warmup entry",
            )?;
            // Zeros of a shape; 3-D [B, S, H·D] as the call would split it.
            let zeros = |name: &'static str,
                         key: &str,
                         heads: Option<usize>|
             -> Result<Option<HostTensor>, JsValue> {
                let Some(shape) = field(&entry, key) else {
                    return Ok(None);
                };
                let shape = convert::shape(name, Some(shape)).js()?;
                let len = convert::elements(name, &shape).js()?;
                // Fallible: several tensors, each within the per-tensor cap,
                // can still exceed what wasm32's memory holds (an abort there
                // would end the module).
                let mut zeros = Vec::new();
                zeros.try_reserve_exact(len).map_err(|_| {
                    to_js(&webattn::Error::OutOfMemory(format!(
                        "allocating {name} for the warm-up ({} MiB)",
                        (len as u64 * 4) >> 20
                    )))
                })?;
                zeros.resize(len, 0.0);
                let t = HostTensor::named(name, shape, zeros).js()?;
                match heads {
                    Some(h) if t.shape().len() == 3 => {
                        webattn::layout::split_heads(name, &t, h).js().map(Some)
                    }
                    _ => Ok(Some(t)),
                }
            };
            let missing = |key: &str| {
                js_error(
                    "MissingInput",
                    format!("warmup: every entry needs a `{key}` shape"),
                )
            };
            let q = zeros("Q", "q", call.q_num_heads)?.ok_or_else(|| missing("q"))?;
            let k = zeros("K", "k", call.kv_num_heads)?.ok_or_else(|| missing("k"))?;
            let v = zeros("V", "v", call.kv_num_heads)?.ok_or_else(|| missing("v"))?;
            let mask = zeros("attn_mask", "mask", None)?
                .map(|m| webattn::HostMask::float(m.shape().to_vec(), m.into_data()))
                .transpose()
                .js()?;
            let past_key = zeros("past_key", "pastKey", None)?;
            let past_value = zeros("past_value", "pastValue", None)?;
            let mut inputs = AttentionInputs::new(&q, &k, &v);
            if let Some(m) = &mask {
                inputs = inputs.with_mask(m);
            }
            inputs.past_key = past_key.as_ref();
            inputs.past_value = past_value.as_ref();
            if self.engine.gpu().is_some() {
                self.engine
                    .attention_host(&inputs, &call.attention)
                    .await
                    .js()?;
            } else {
                webattn::validate(&inputs, &call.attention).js()?;
            }
        }
        Ok(start.elapsed().as_secs_f64() * 1e3)
    }

    /// The labels of the pipelines compiled so far (each once per engine).
    #[wasm_bindgen(js_name = compiledPipelines)]
    pub fn compiled_pipelines(&self) -> Array {
        self.engine
            .gpu()
            .map(|ctx| ctx.pipelines().compiled_keys())
            .unwrap_or_default()
            .iter()
            .map(|key| JsValue::from(key.to_string()))
            .collect()
    }

    /// The plan the last call ran: its path, the plan in one line (kernels,
    /// tiles, pieces; `Engine::last_call` natively), and why when the path
    /// was not the default.
    #[wasm_bindgen(js_name = lastCall)]
    pub fn last_call(&self) -> JsValue {
        let Some(stats) = self.engine.last_call() else {
            return JsValue::NULL;
        };
        let out = Object::new();
        set(&out, "path", stats.plan.path.name());
        set(&out, "plan", stats.plan.to_string());
        set(&out, "allocatedBytes", stats.allocated_bytes as f64);
        set(&out, "pieces", stats.pieces as f64);
        set(&out, "widenedBytes", stats.widened_bytes as f64);
        if let Some(reason) = stats.plan.reason {
            set(&out, "reason", reason);
        }
        out.into()
    }

    /// The conformance sweep (`quick`, `full`) or the family's checks
    /// (`family`) on this adapter, against the f64 oracle;
    /// `progress(done, total, name, passed)` after each case.
    pub async fn check(
        &self,
        kind: String,
        progress: Option<Function>,
    ) -> Result<JsValue, JsValue> {
        // A lost device is replaced first, as attention and upload do.
        self.engine.recover().await.js()?;
        let report = |done: u32, total: u32, name: &str, passed: bool| {
            if let Some(f) = &progress {
                let args = Array::of4(&done.into(), &total.into(), &name.into(), &passed.into());
                let _ = f.apply(&JsValue::NULL, &args);
            }
        };
        let out = Object::new();
        if kind == "family" {
            use webattn::family::checks::{family_table, run_family_checks, FAMILY_CHECKS};
            let total = FAMILY_CHECKS.len() as u32;
            let mut done = 0;
            let results = run_family_checks(&self.engine, 0x5eed, |c| {
                done += 1;
                report(done, total, c.name, c.passed());
            })
            .await
            .js()?;
            let table = family_table(&results);
            let failed = results.iter().filter(|c| !c.passed()).count();
            set(
                &out,
                "summary",
                table.lines().last().unwrap_or_default().to_string(),
            );
            set(&out, "table", table);
            set(&out, "passed", results.len() - failed);
            set(&out, "failed", failed);
            return Ok(out.into());
        }
        let sweep = match kind.as_str() {
            "quick" => SweepKind::Quick,
            "full" => SweepKind::Full,
            _ => {
                return Err(js_error(
                    "InvalidOption",
                    "check(kind): kind must be 'quick', 'full' or 'family'",
                ))
            }
        };
        let total = sweep_len(&self.engine, sweep, "") as u32;
        let mut done = 0;
        let results = run_sweep(&self.engine, sweep, "", 0x5eed, Precision::Highest, |r| {
            done += 1;
            report(done, total, &format!("{} ({})", r.name, r.path), r.passed());
        })
        .await;
        set(&out, "table", results.table());
        set(&out, "summary", results.summary_line());
        set(&out, "passed", results.passed());
        set(&out, "failed", results.failed());
        set(&out, "adapter", results.adapter.clone());
        Ok(out.into())
    }

    /// Trains webattn's small attention model on associative recall from
    /// scratch (`webattn::train`): `{steps = 150, batch = 64, seed = 7,
    /// learningRate = 0.01}`; `progress({step, loss, accuracy})` after each
    /// step (a promise it returns is awaited). Returns `{curve, heldOut:
    /// {loss, accuracy}, map: {data, shape: [heads, 9, 9]}, example: {keys,
    /// values, asked}}`.
    #[wasm_bindgen(js_name = trainRecall)]
    pub async fn train_recall(
        &self,
        options: JsValue,
        progress: Option<Function>,
    ) -> Result<JsValue, JsValue> {
        crate::train::call(&self.engine, &options, progress).await
    }

    /// Tunes this adapter (`webattn tune` natively): times every fused kernel
    /// and tile that fits, and the unfused path, for each head-dim class of
    /// `headDims` (`[[dk, dv], ...]` or `[d, ...]`; default `[64]`), keeps the
    /// fastest in the engine's tuning table (in memory in the browser), which
    /// later calls follow. `progress(label)` before each configuration.
    /// Returns `[{headDims, problem: {heads, seq, decodeHeads, decodeKeys}, timings: [{label,
    /// medianMs}], decodeTimings: [{label, medianMs}], groupedDecodeTimings,
    /// kernel, fusedMs, unfusedMs, decodeKernel, decodeMs,
    /// groupedDecodeKernel, groupedDecodeMs}]` (the decode fields null or
    /// empty where the decode kernels do not apply; the grouped ones are the
    /// decode kernels timed on GQA groups of 4 query heads).
    pub async fn tune(
        &self,
        options: JsValue,
        progress: Option<Function>,
    ) -> Result<JsValue, JsValue> {
        convert::known_keys(&options, &["headDims"], "tune options")?;
        // A lost device is replaced first: the tuner's engines share its context.
        self.engine.recover().await.js()?;
        let bad = |what: String| js_error("InvalidOption", format!("tune: headDims {what}"));
        let dim = |v: &JsValue| -> Result<usize, JsValue> {
            match v.as_f64() {
                Some(n) if n >= 1.0 && n.fract() == 0.0 && n <= 4096.0 => Ok(n as usize),
                _ => Err(bad(format!(
                    "must hold head dims (whole numbers 1 to 4096), got {}",
                    type_name(v)
                ))),
            }
        };
        let head_dims = match field(&options, "headDims") {
            None => vec![(64, 64)],
            Some(list) if Array::is_array(&list) => {
                let mut dims = Vec::new();
                for entry in Array::from(&list).iter() {
                    if Array::is_array(&entry) {
                        let pair = Array::from(&entry);
                        if pair.length() != 2 {
                            return Err(bad("entries must be [dk, dv] or d".into()));
                        }
                        dims.push((dim(&pair.get(0))?, dim(&pair.get(1))?));
                    } else {
                        let d = dim(&entry)?;
                        dims.push((d, d));
                    }
                }
                if dims.is_empty() {
                    return Err(bad("is empty".into()));
                }
                dims
            }
            Some(other) => return Err(bad(format!("must be an array, got {}", type_name(&other)))),
        };
        let reports = webattn::tuning::tune(&self.engine, &head_dims, |label| {
            if let Some(f) = &progress {
                let _ = f.call1(&JsValue::NULL, &label.into());
            }
        })
        .await
        .js()?;
        let out = Array::new();
        for r in reports {
            let item = Object::new();
            let dims = Array::of2(&r.head_dims.0.into(), &r.head_dims.1.into());
            set(&item, "headDims", dims);
            let problem = Object::new();
            set(&problem, "heads", r.problem.heads);
            set(&problem, "seq", r.problem.seq);
            set(&problem, "decodeHeads", r.problem.decode_heads);
            set(&problem, "decodeKeys", r.problem.decode_keys);
            set(&item, "problem", problem);
            let rows = |list: &[webattn::tuning::Timed]| {
                let timings = Array::new();
                for t in list {
                    let row = Object::new();
                    set(&row, "label", t.label.as_str());
                    set(&row, "medianMs", t.median_ms);
                    timings.push(&row);
                }
                timings
            };
            set(&item, "timings", rows(&r.timings));
            set(&item, "decodeTimings", rows(&r.decode_timings));
            set(
                &item,
                "groupedDecodeTimings",
                rows(&r.grouped_decode_timings),
            );
            set(&item, "kernel", r.entry.kernel.name());
            set(&item, "fusedMs", r.entry.fused_ms);
            set(&item, "unfusedMs", r.entry.unfused_ms);
            for (decode, kernel, ms) in [
                (r.entry.decode, "decodeKernel", "decodeMs"),
                (
                    r.entry.grouped_decode,
                    "groupedDecodeKernel",
                    "groupedDecodeMs",
                ),
            ] {
                match decode {
                    Some(d) => {
                        set(&item, kernel, d.kernel.label().as_str());
                        set(&item, ms, d.decode_ms);
                    }
                    None => {
                        set(&item, kernel, JsValue::NULL);
                        set(&item, ms, JsValue::NULL);
                    }
                }
            }
            out.push(&item);
        }
        Ok(out.into())
    }

    /// Times attention of `shape` `{batch, heads, seqQ, seqK, headDim, causal}`
    /// on `path` (`warmup` untimed runs, then the median of `timed`):
    /// `{path, medianMs, gflops}`.
    pub async fn benchmark(&self, shape: JsValue, options: JsValue) -> Result<JsValue, JsValue> {
        convert::known_keys(
            &shape,
            &[
                "batch", "heads", "kvHeads", "seqQ", "seqK", "headDim", "causal",
            ],
            "benchmark shape",
        )?;
        convert::known_keys(&options, &["path", "warmup", "timed"], "benchmark options")?;
        // A lost device is replaced first: the inputs are uploaded before the call.
        self.engine.recover().await.js()?;
        let whole = |v: &JsValue, key: &str, default: usize| -> Result<usize, JsValue> {
            match field(v, key) {
                None => Ok(default),
                Some(x) => match x.as_f64() {
                    Some(n) if n >= 0.0 && n.fract() == 0.0 && n <= f64::from(u32::MAX) => {
                        Ok(n as usize)
                    }
                    _ => Err(js_error(
                        "InvalidOption",
                        format!("benchmark: {key} must be a whole number"),
                    )),
                },
            }
        };
        let causal = match field(&shape, "causal") {
            None => false,
            Some(c) => c.as_bool().ok_or_else(|| {
                js_error("InvalidOption", "benchmark: causal must be true or false")
            })?,
        };
        let seq_q = whole(&shape, "seqQ", 128)?;
        let heads = whole(&shape, "heads", 1)?;
        if heads == 0 {
            return Err(js_error(
                "InvalidOption",
                "benchmark: heads must be at least 1",
            ));
        }
        let kv_heads = whole(&shape, "kvHeads", heads)?;
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(js_error(
                "InvalidOption",
                format!("benchmark: kvHeads ({kv_heads}) must divide heads ({heads})"),
            ));
        }
        let shape = AttentionShape {
            batch: whole(&shape, "batch", 1)?,
            heads,
            kv_heads,
            seq_q,
            seq_k: whole(&shape, "seqK", seq_q)?,
            head_dim: whole(&shape, "headDim", 64)?,
            causal,
        };
        // The inputs it makes must fit before anything is allocated.
        let longest = shape.seq_q.max(shape.seq_k);
        convert::elements(
            "benchmark input",
            &[shape.batch, shape.heads, longest, shape.head_dim],
        )
        .js()?;
        let asked = field(&options, "path")
            .map(|p| convert::path(&p))
            .transpose()
            .js()?
            .unwrap_or(KernelPath::Auto);
        if self.engine.backend() == BackendKind::Cpu
            && matches!(asked, KernelPath::Fused | KernelPath::Unfused)
        {
            return Err(to_js(&webattn::Error::Conflict(
                "a GPU path was asked for but this engine runs on the CPU backend",
            )));
        }
        let repeats = Repeats {
            warmup: whole(&options, "warmup", 1)?,
            timed: whole(&options, "timed", 3)?.max(1),
        };
        // The path a call of this shape takes (auto: the one `attention`
        // would take at these sizes and head dims, the tuner's choice included).
        let dims = webattn::AttentionDims::plain(
            shape.batch,
            [shape.heads, shape.kv_heads],
            [shape.seq_q, shape.seq_k],
            [shape.head_dim, shape.head_dim],
        );
        let path = self
            .engine
            .plan(
                &dims,
                &webattn::AttentionOptions {
                    path: asked,
                    is_causal: shape.causal,
                    ..Default::default()
                },
            )
            .js()?
            .path;
        let m = bench::attention(&self.engine, shape, path, repeats)
            .await
            .js()?;
        let out = Object::new();
        set(&out, "path", path.name());
        set(&out, "medianMs", m.measurement.median_ms());
        set(&out, "gflops", m.gflops);
        set(
            &out,
            "samplesMs",
            array_of_numbers(&m.measurement.samples_ms),
        );
        Ok(out.into())
    }
}
