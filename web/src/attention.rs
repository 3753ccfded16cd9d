//! `engine.attention(inputs, options)`: the ONNX `Attention` operator on the
//! caller's typed arrays or device tensors.
//!
//! Host inputs with host outputs go through `Engine::attention_host` (no
//! uploads at all on the CPU backend); device handles, or `keepOnDevice`, go
//! through `Engine::attention` with only the host inputs uploaded. Only the
//! outputs the options ask for are computed and read back. With `verify` the
//! call is repeated by the f64 oracle and checked with the 2x-plain-f32 rule.

use js_sys::Object;
use wasm_bindgen::{JsCast, JsValue};
use web_time::Instant;
use webattn::conformance::{compare_baselines, DEFAULT_FLOOR, F16_UNIT_ROUNDOFF};
use webattn::cpu::{attention_exact, attention_plain_f32_in, SumOrder};
use webattn::layout::{merge_heads, split_heads};
use webattn::PreparedAttention;
use webattn::{
    AttentionInputs, AttentionOptions, AttentionOutputs, Engine, Error, HostMask, HostTensor,
    KernelPath, Mask, Tensor,
};

use crate::convert::{self, field, report_js, set, CallOptions};
use crate::errors::{js_error, IntoJs};
use crate::handles::{Handles, Held};

/// A tensor input: the caller's values, or a device tensor of this engine.
pub(crate) enum Input {
    Host(HostTensor),
    Device(Tensor),
}

/// A mask input.
pub(crate) enum MaskInput {
    Host(HostMask),
    Device(Mask),
}

/// The names `engine.attention` accepts in its inputs object.
const INPUT_NAMES: [&str; 7] = [
    "q",
    "k",
    "v",
    "mask",
    "pastKey",
    "pastValue",
    "nonpadKvSeqlen",
];

/// The parsed inputs of one call.
pub(crate) struct CallInputs {
    pub q: Input,
    pub k: Input,
    pub v: Input,
    pub mask: Option<MaskInput>,
    pub past_key: Option<Input>,
    pub past_value: Option<Input>,
    pub nonpad: Option<Vec<i64>>,
    /// Q came in ONNX's 3-D form `[B, S, H·D]`, so Y goes back in it.
    pub three_d: bool,
}

impl CallInputs {
    /// Whether every input is the caller's values (no device tensor).
    pub(crate) fn all_host(&self) -> bool {
        let host = |i: &Input| matches!(i, Input::Host(_));
        host(&self.q)
            && host(&self.k)
            && host(&self.v)
            && self.past_key.as_ref().is_none_or(host)
            && self.past_value.as_ref().is_none_or(host)
            && self
                .mask
                .as_ref()
                .is_none_or(|m| matches!(m, MaskInput::Host(_)))
    }
}

/// The handle number in `{handle}` (a `DeviceTensor` as the wrapper passes it).
fn handle_of(v: &JsValue) -> Option<u32> {
    field(v, "handle")
        .and_then(|h| h.as_f64())
        .map(|h| h as u32)
}

/// A float tensor argument: a handle of this engine or `{data, shape}`.
fn tensor_input(handles: &Handles, name: &'static str, v: &JsValue) -> Result<Input, JsValue> {
    match handle_of(v) {
        Some(id) => match handles.get(id)? {
            Held::Tensor(t) => Ok(Input::Device(t)),
            Held::Mask(_) => Err(js_error(
                "DType",
                format!("{name}: device tensor {id} is a mask; pass it as `mask`"),
            )),
        },
        None => convert::tensor(name, v).js().map(Input::Host),
    }
}

fn mask_input(handles: &Handles, v: &JsValue) -> Result<MaskInput, JsValue> {
    match handle_of(v) {
        Some(id) => match handles.get(id)? {
            Held::Mask(m) => Ok(MaskInput::Device(m)),
            Held::Tensor(_) => Err(js_error(
                "DType",
                format!(
                    "mask: device tensor {id} was uploaded with upload(), not uploadMask(); \
                     upload masks with engine.uploadMask()"
                ),
            )),
        },
        None => convert::mask(v).js().map(MaskInput::Host),
    }
}

/// `[B, S, H·D]` to `[B, H, S, D]` for a host tensor; device tensors must be 4-D.
fn to_four_d(
    name: &'static str,
    input: Input,
    heads: Option<usize>,
    option: &'static str,
) -> Result<Input, JsValue> {
    match input {
        Input::Host(t) if t.shape().len() == 3 => {
            let heads = heads.ok_or_else(|| {
                crate::errors::to_js(&Error::InvalidOption {
                    name: option,
                    value: "missing".into(),
                    reason: "3-D inputs [batch, sequence, heads·head size] need qNumHeads and \
                             kvNumHeads in the options (ONNX's q_num_heads and kv_num_heads)",
                })
            })?;
            split_heads(name, &t, heads).js().map(Input::Host)
        }
        Input::Device(t) if t.shape().len() == 3 => Err(crate::errors::to_js(&Error::Rank {
            tensor: name,
            expected: "4 ([batch, heads, sequence, head size]) for device tensors; \
                       pass 3-D inputs as typed arrays",
            got: t.shape().to_vec(),
        })),
        other => Ok(other),
    }
}

/// The inputs object of `engine.attention` (and of the backward), 3-D
/// tensors split into heads as the options say.
pub(crate) fn parse_inputs(
    handles: &Handles,
    inputs: &JsValue,
    call: &CallOptions,
) -> Result<CallInputs, JsValue> {
    let Some(object) = inputs.dyn_ref::<Object>() else {
        return Err(js_error(
            "InvalidOption",
            format!(
                "inputs must be an object {{q, k, v, mask?, pastKey?, pastValue?, nonpadKvSeqlen?}}, got {}",
                convert::type_name(inputs)
            ),
        ));
    };
    for key in Object::keys(object).iter() {
        let key = key.as_string().unwrap_or_default();
        if !INPUT_NAMES.contains(&key.as_str()) {
            return Err(js_error(
                "InvalidOption",
                format!(
                    "inputs: `{key}` is not an input; the inputs are q, k, v, mask, pastKey, \
                     pastValue and nonpadKvSeqlen"
                ),
            ));
        }
    }
    let required = |name: &'static str, key: &str| -> Result<Input, JsValue> {
        let v = field(inputs, key).ok_or_else(|| {
            js_error("MissingInput", format!("inputs.{key} ({name}) is required"))
        })?;
        tensor_input(handles, name, &v)
    };
    let optional = |name: &'static str, key: &str| -> Result<Option<Input>, JsValue> {
        field(inputs, key)
            .map(|v| tensor_input(handles, name, &v))
            .transpose()
    };
    let q = required("Q", "q")?;
    let three_d = matches!(&q, Input::Host(t) if t.shape().len() == 3);
    Ok(CallInputs {
        q: to_four_d("Q", q, call.q_num_heads, "qNumHeads")?,
        k: to_four_d("K", required("K", "k")?, call.kv_num_heads, "kvNumHeads")?,
        v: to_four_d("V", required("V", "v")?, call.kv_num_heads, "kvNumHeads")?,
        mask: field(inputs, "mask")
            .map(|m| mask_input(handles, &m))
            .transpose()?,
        past_key: optional("past_key", "pastKey")?,
        past_value: optional("past_value", "pastValue")?,
        nonpad: field(inputs, "nonpadKvSeqlen")
            .map(|v| convert::lengths(&v))
            .transpose()
            .js()?,
        three_d,
    })
}

/// Host views of every input (device ones read back), for the host path and the oracle.
struct HostInputs {
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    mask: Option<HostMask>,
    past: Option<(HostTensor, HostTensor)>,
}

async fn host_tensor(engine: &Engine, input: &Input) -> webattn::Result<HostTensor> {
    match input {
        Input::Host(t) => Ok(t.clone()),
        Input::Device(t) => engine.download(t).await,
    }
}

async fn host_inputs(engine: &Engine, c: &CallInputs) -> webattn::Result<HostInputs> {
    let mask = match &c.mask {
        Some(MaskInput::Host(m)) => Some(m.clone()),
        Some(MaskInput::Device(m)) => Some(engine.download_mask(m).await?),
        None => None,
    };
    let past = match (&c.past_key, &c.past_value) {
        (Some(pk), Some(pv)) => Some((
            host_tensor(engine, pk).await?,
            host_tensor(engine, pv).await?,
        )),
        _ => None,
    };
    Ok(HostInputs {
        q: host_tensor(engine, &c.q).await?,
        k: host_tensor(engine, &c.k).await?,
        v: host_tensor(engine, &c.v).await?,
        mask,
        past,
    })
}

impl HostInputs {
    fn view<'a>(&'a self, nonpad: Option<&'a [i64]>) -> AttentionInputs<'a, HostTensor> {
        let mut inputs = AttentionInputs::new(&self.q, &self.k, &self.v);
        if let Some(m) = &self.mask {
            inputs = inputs.with_mask(m);
        }
        if let Some((pk, pv)) = &self.past {
            inputs = inputs.with_past(pk, pv);
        }
        inputs.nonpad_kv_seqlen = nonpad;
        inputs
    }
}

async fn device_tensor(engine: &Engine, input: &Input) -> webattn::Result<Tensor> {
    match input {
        Input::Host(t) => engine.upload_async(t).await,
        Input::Device(t) => Ok(t.clone()),
    }
}

/// Runs on the engine with every input on it; the outputs stay there.
async fn optional_tensor(
    engine: &Engine,
    input: &Option<Input>,
) -> webattn::Result<Option<Tensor>> {
    match input {
        Some(t) => device_tensor(engine, t).await.map(Some),
        None => Ok(None),
    }
}

/// A call's inputs on the device (host values uploaded).
struct DeviceInputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Option<webattn::Mask>,
    past_key: Option<Tensor>,
    past_value: Option<Tensor>,
}

impl DeviceInputs {
    async fn of(engine: &Engine, c: &CallInputs) -> webattn::Result<DeviceInputs> {
        engine.recover().await?;
        Ok(DeviceInputs {
            q: device_tensor(engine, &c.q).await?,
            k: device_tensor(engine, &c.k).await?,
            v: device_tensor(engine, &c.v).await?,
            mask: match &c.mask {
                Some(MaskInput::Host(m)) => Some(engine.upload_mask_async(m).await?),
                Some(MaskInput::Device(m)) => Some(m.clone()),
                None => None,
            },
            past_key: optional_tensor(engine, &c.past_key).await?,
            past_value: optional_tensor(engine, &c.past_value).await?,
        })
    }

    fn view<'a>(&'a self, nonpad: Option<&'a [i64]>) -> AttentionInputs<'a, Tensor> {
        AttentionInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            attn_mask: self.mask.as_ref(),
            past_key: self.past_key.as_ref(),
            past_value: self.past_value.as_ref(),
            nonpad_kv_seqlen: nonpad,
        }
    }
}

async fn run_on_device(
    engine: &Engine,
    c: &CallInputs,
    options: &AttentionOptions,
    prepared: Option<&PreparedAttention>,
) -> webattn::Result<AttentionOutputs<Tensor>> {
    let held = DeviceInputs::of(engine, c).await?;
    let inputs = held.view(c.nonpad.as_deref());
    match prepared {
        Some(p) => p.run(engine, &inputs).await,
        None => engine.attention(&inputs, options).await,
    }
}

/// Plans a call of the shapes of `inputs` (values or device tensors; host
/// values are uploaded once to take their shapes) with `options`: the
/// prepared call (whose plan says its path, kernels and why).
pub async fn prepare(
    engine: &Engine,
    handles: &Handles,
    inputs: &JsValue,
    options: &JsValue,
) -> Result<PreparedAttention, JsValue> {
    let call = convert::call_options(options)?;
    if call.keep_on_device || call.timing || call.verify {
        return Err(js_error(
            "InvalidOption",
            "keepOnDevice, timing and verify are options of run(), not of prepare()",
        ));
    }
    let c = parse_inputs(handles, inputs, &call)?;
    let held = DeviceInputs::of(engine, &c).await.js()?;
    let dims = webattn::validate(&held.view(c.nonpad.as_deref()), &call.attention).js()?;
    engine.prepare(&dims, &call.attention).js()
}

/// What a call produced: host values, or tensors kept on the device.
enum Produced {
    Host(AttentionOutputs<HostTensor>),
    Device(AttentionOutputs<Tensor>),
}

/// Checks `got` against the f64 oracle (tolerance: twice the worst of three
/// plain f32 summation orders, plus the floor, plus f16 rounding for the
/// outputs of f16 queries).
fn verify(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    got: &AttentionOutputs<HostTensor>,
) -> webattn::Result<JsValue> {
    let start = Instant::now();
    let exact = attention_exact(inputs, options)?;
    let oracle_ms = start.elapsed().as_secs_f64() * 1e3;
    let plains = [SumOrder::Sequential, SumOrder::Quads, SumOrder::Reverse]
        .into_iter()
        .map(|order| attention_plain_f32_in(inputs, options, order))
        .collect::<webattn::Result<Vec<_>>>()?;
    let out = Object::new();
    let mut passed = true;
    let rounding = if inputs.q.dtype() == webattn::DType::F16 {
        F16_UNIT_ROUNDOFF
    } else {
        0.0
    };
    let mut check = |key: &str, got: &[f32], exact: &[f64], baselines: Vec<&[f32]>| {
        // The logsumexp stays f32 whatever Q is.
        let unit = if key == "lse" { 0.0 } else { rounding };
        let r = compare_baselines(got, exact, &baselines, DEFAULT_FLOOR)
            .allow_output_rounding(exact, unit);
        passed &= r.passed();
        set(&out, key, report_js(&r));
    };
    check(
        "y",
        got.y.data(),
        &exact.y,
        plains.iter().map(|p| &p.y[..]).collect(),
    );
    if let Some(qk) = &got.qk_matmul_output {
        check(
            "qkMatmulOutput",
            qk.data(),
            &exact.qk,
            plains.iter().map(|p| &p.qk[..]).collect(),
        );
    }
    if let Some(lse) = &got.lse {
        check(
            "lse",
            lse.data(),
            &exact.lse,
            plains.iter().map(|p| &p.lse[..]).collect(),
        );
    }
    set(&out, "passed", passed);
    set(&out, "oracleMs", oracle_ms);
    Ok(out.into())
}

/// `engine.attention(inputs, options)`.
pub async fn call(
    engine: &Engine,
    handles: &Handles,
    inputs: &JsValue,
    options: &JsValue,
    prepared: Option<&PreparedAttention>,
) -> Result<JsValue, JsValue> {
    let mut call = convert::call_options(options)?;
    if let Some(p) = prepared {
        // A prepared call's attributes were fixed when it was prepared.
        const RUN_OPTIONS: [&str; 5] = [
            "keepOnDevice",
            "timing",
            "verify",
            "qNumHeads",
            "kvNumHeads",
        ];
        if let Some(object) = options.dyn_ref::<Object>() {
            for key in Object::keys(object).iter().filter_map(|k| k.as_string()) {
                if !RUN_OPTIONS.contains(&key.as_str()) {
                    return Err(js_error(
                        "InvalidOption",
                        format!(
                            "{key}: a prepared call runs with the options it was prepared \
                             with; run() takes only keepOnDevice, timing, verify (and \
                             qNumHeads, kvNumHeads for 3-D inputs)"
                        ),
                    ));
                }
            }
        }
        call.attention = p.options().clone();
    }
    let c = parse_inputs(handles, inputs, &call)?;
    if call.keep_on_device && c.three_d {
        return Err(js_error(
            "InvalidOption",
            "keepOnDevice: outputs stay on the device in the 4-D form [batch, heads, sequence, \
             head size]; pass 4-D inputs (or read the 3-D Y back without keepOnDevice)",
        ));
    }
    let options = &call.attention;
    let start = Instant::now();
    // A GPU engine's calls but those asked for on the host run on its adapter.
    let profiled = call.timing
        && !matches!(options.path, KernelPath::Cpu | KernelPath::Oracle)
        && engine.gpu().is_some_and(|ctx| ctx.set_profiling(true));
    let produced = if c.all_host() && !call.keep_on_device && prepared.is_none() {
        let Input::Host(q) = &c.q else { unreachable!() };
        let Input::Host(k) = &c.k else { unreachable!() };
        let Input::Host(v) = &c.v else { unreachable!() };
        let mut view = AttentionInputs::new(q, k, v);
        if let Some(MaskInput::Host(m)) = &c.mask {
            view = view.with_mask(m);
        }
        // Each past tensor as given, so that one without the other is the
        // engine's typed error, not silently dropped.
        view.past_key = host_only(&c.past_key);
        view.past_value = host_only(&c.past_value);
        view.nonpad_kv_seqlen = c.nonpad.as_deref();
        engine
            .attention_host(&view, options)
            .await
            .map(Produced::Host)
    } else {
        run_on_device(engine, &c, options, prepared)
            .await
            .map(Produced::Device)
    };
    let stats = engine.last_call();
    let gpu_ms = match engine.gpu() {
        Some(ctx) if profiled => {
            let ms = ctx.last_gpu_ms().await.ok().flatten();
            ctx.set_profiling(false);
            ms
        }
        _ => None,
    };
    // The host values of the outputs: returned, or (with keepOnDevice) read
    // back only to be verified, after the wall time is taken.
    let (mut host_out, device_out) = match produced.js()? {
        Produced::Host(out) => (Some(out), None),
        Produced::Device(out) if call.keep_on_device => (None, Some(out)),
        Produced::Device(out) => (Some(engine.download_outputs(&out).await.js()?), None),
    };
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    let check = if call.verify {
        if let (None, Some(out)) = (&host_out, &device_out) {
            host_out = Some(engine.download_outputs(out).await.js()?);
        }
        let host = host_inputs(engine, &c).await.js()?;
        let got = host_out
            .as_ref()
            .ok_or_else(|| js_error("Conflict", "no outputs to verify"))?;
        Some(verify(&host.view(c.nonpad.as_deref()), options, got).js()?)
    } else {
        None
    };

    // Nothing fails from here on, so handles are only made for results that
    // reach JavaScript.
    let result = Object::new();
    if let Some(out) = &device_out {
        set(&result, "y", handles.hold(Held::Tensor(out.y.clone())));
        for (key, t) in output_fields(out) {
            set(&result, key, handles.hold(Held::Tensor(t.clone())));
        }
    } else if let Some(out) = &host_out {
        // ONNX's 3-D Y [B, S, H·Dv] for 3-D inputs (never kept on the device).
        let y = if c.three_d {
            merge_heads(&out.y).js()?
        } else {
            out.y.clone()
        };
        set(&result, "y", convert::to_js(&y));
        for (key, t) in output_fields(out) {
            set(&result, key, convert::to_js(t));
        }
    }
    if let Some(stats) = stats {
        set(&result, "path", stats.plan.path.name());
        set(&result, "plan", stats.plan.to_string());
        if let Some(reason) = stats.plan.reason {
            set(&result, "reason", reason);
        }
    }
    if call.timing {
        let timing = Object::new();
        set(&timing, "wallMs", wall_ms);
        set(
            &timing,
            "gpuMs",
            gpu_ms.map_or(JsValue::NULL, JsValue::from),
        );
        set(&result, "timing", timing);
    }
    if let Some(check) = check {
        set(&result, "check", check);
    }
    Ok(result.into())
}

/// A host tensor input as a reference (`None` for none, and for device ones,
/// which never reach the host path).
pub(crate) fn host_only(input: &Option<Input>) -> Option<&HostTensor> {
    match input {
        Some(Input::Host(t)) => Some(t),
        _ => None,
    }
}

/// The optional outputs that are present, under their JavaScript names.
fn output_fields<T>(out: &AttentionOutputs<T>) -> Vec<(&'static str, &T)> {
    [
        ("presentKey", out.present_key.as_ref()),
        ("presentValue", out.present_value.as_ref()),
        ("qkMatmulOutput", out.qk_matmul_output.as_ref()),
        ("lse", out.lse.as_ref()),
    ]
    .into_iter()
    .filter_map(|(k, t)| t.map(|t| (k, t)))
    .collect()
}
