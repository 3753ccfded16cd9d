//! JavaScript values to engine values and back: tensors `{data, shape}` with
//! Float32Array (or Float16Array, or Uint16Array holding f16 bits or, with
//! `dtype: "bfloat16"`, bfloat16 bits, or Float64Array) data, masks, lengths,
//! and the options in camelCase. Every
//! malformed value is a typed engine error that names it; nothing panics.

use js_sys::{
    Array, BigInt64Array, Float32Array, Float64Array, Int32Array, Object, Reflect, Uint16Array,
    Uint8Array,
};
use wasm_bindgen::{JsCast, JsValue};
use webattn::{
    AttentionOptions, DType, Error, HostMask, HostTensor, KernelPath, QkMatmulOutputMode, Result,
};

/// `obj[key]`, or `None` when it is missing, `undefined` or `null`.
pub fn field(obj: &JsValue, key: &str) -> Option<JsValue> {
    if !obj.is_object() {
        return None;
    }
    Reflect::get(obj, &JsValue::from_str(key))
        .ok()
        .filter(|v| !v.is_undefined() && !v.is_null())
}

/// A short description of a value's type, for errors.
pub fn type_name(v: &JsValue) -> String {
    if v.is_undefined() {
        return "undefined".into();
    }
    if v.is_null() {
        return "null".into();
    }
    match v.dyn_ref::<Object>() {
        Some(o) => o.constructor().name().into(),
        None => v
            .js_typeof()
            .as_string()
            .unwrap_or_else(|| "a value".into()),
    }
}

/// A tensor's shape: an array of whole, non-negative numbers.
pub fn shape(name: &'static str, v: Option<JsValue>) -> Result<Vec<usize>> {
    let bad = |got: String| Error::DType {
        tensor: name,
        expected: "a shape: an array of whole numbers, e.g. [1, 8, 128, 64]",
        got,
    };
    let v = v.ok_or_else(|| bad("no shape".into()))?;
    if !Array::is_array(&v) {
        return Err(bad(type_name(&v)));
    }
    Array::from(&v)
        .iter()
        .map(|d| match d.as_f64() {
            Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= f64::from(u32::MAX) => Ok(x as usize),
            _ => Err(bad(format!(
                "an entry {}",
                d.as_string().unwrap_or_else(|| type_name(&d))
            ))),
        })
        .collect()
}

/// An error for `data` (a typed array's, a mask's or lengths') whose buffer
/// was detached: transferred to a worker (`postMessage`, `structuredClone`
/// with `transfer`) or by `ArrayBuffer.prototype.transfer`. Reading such an
/// array throws in JavaScript, which inside the engine's call would leave its
/// promise pending and the engine busy; so it is refused first. (Browsers
/// without `ArrayBuffer.prototype.detached` show a detached buffer as one of
/// no bytes, as an empty one: there any buffer of no bytes is refused.)
fn refuse_detached(name: &'static str, data: &JsValue) -> Result<()> {
    let Some(buffer) = field(data, "buffer").filter(|b| b.is_object()) else {
        return Ok(());
    };
    let number = |v: &JsValue, key: &str| field(v, key).and_then(|x| x.as_f64());
    let detached = match field(&buffer, "detached").and_then(|d| d.as_bool()) {
        Some(detached) => detached,
        None => number(&buffer, "byteLength") == Some(0.0),
    };
    if detached {
        return Err(Error::DType {
            tensor: name,
            expected: "data whose buffer is still this page's (not transferred)",
            got: "a typed array over a detached ArrayBuffer (transferred to a worker, or by \
                  ArrayBuffer.prototype.transfer; or, where the browser cannot tell, an empty one)"
                .into(),
        });
    }
    Ok(())
}

/// Values from a Float16Array (read through its bytes as f16 bits).
fn float16_bits(data: &JsValue) -> Option<Vec<u16>> {
    let name = data.dyn_ref::<Object>()?.constructor().name();
    if name != "Float16Array" {
        return None;
    }
    let buffer = Reflect::get(data, &"buffer".into()).ok()?;
    let offset = Reflect::get(data, &"byteOffset".into()).ok()?.as_f64()? as u32;
    let length = Reflect::get(data, &"length".into()).ok()?.as_f64()? as u32;
    Some(Uint16Array::new_with_byte_offset_and_length(&buffer, offset, length).to_vec())
}

/// f16 bits widened to f32.
fn widen_f16(name: &'static str, bits: &[u16]) -> Result<Vec<f32>> {
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    Ok(HostTensor::from_le_bytes(name, DType::F16, [bits.len()], &bytes)?.into_data())
}

/// bfloat16 bits widened to f32: exact, the bits are an f32's upper half.
fn widen_bf16(bits: &[u16]) -> Vec<f32> {
    bits.iter()
        .map(|&b| f32::from_bits(u32::from(b) << 16))
        .collect()
}

/// Float values of `data` (f32 as is; f16, bfloat16 and f64 converted), with
/// the name of the element type they came in.
fn floats(
    name: &'static str,
    data: &JsValue,
    dtype: Option<&str>,
) -> Result<(Vec<f32>, &'static str)> {
    let expected = "Float32Array, Float16Array, Uint16Array (f16 bits, or bfloat16 bits with \
                    dtype \"bfloat16\"), Float64Array or an array of numbers";
    refuse_detached(name, data)?;
    if let Some(other) = dtype.filter(|d| !matches!(*d, "float16" | "float32" | "bfloat16")) {
        return Err(Error::DType {
            tensor: name,
            expected: "dtype \"float16\", \"bfloat16\" or \"float32\" (or none)",
            got: format!("dtype {other:?}"),
        });
    }
    if dtype == Some("bfloat16") {
        // bfloat16 has no typed array: its bits come in a Uint16Array, and
        // are widened to f32 exactly (the engine computes in f32).
        return match data.dyn_ref::<Uint16Array>() {
            Some(a) => Ok((widen_bf16(&a.to_vec()), "bfloat16")),
            None => Err(Error::DType {
                tensor: name,
                expected: "a Uint16Array of bfloat16 bits for dtype \"bfloat16\"",
                got: type_name(data),
            }),
        };
    }
    if let Some(bits) = float16_bits(data) {
        return Ok((widen_f16(name, &bits)?, "float16"));
    }
    if let Some(a) = data.dyn_ref::<Uint16Array>() {
        if dtype.is_some_and(|d| d != "float16") {
            return Err(Error::DType {
                tensor: name,
                expected: "float16 or bfloat16 for Uint16Array data (it holds f16 bits, or \
                           bfloat16 bits with dtype \"bfloat16\")",
                got: dtype.unwrap_or_default().to_string(),
            });
        }
        return Ok((widen_f16(name, &a.to_vec())?, "float16"));
    }
    if let Some(a) = data.dyn_ref::<Float32Array>() {
        return Ok((a.to_vec(), "float32"));
    }
    if let Some(a) = data.dyn_ref::<Float64Array>() {
        return Ok((
            a.to_vec().into_iter().map(|x| x as f32).collect(),
            "float64",
        ));
    }
    if Array::is_array(data) {
        let values: Option<Vec<f32>> = Array::from(data)
            .iter()
            .map(|x| x.as_f64().map(|x| x as f32))
            .collect();
        return values.map(|v| (v, "number")).ok_or_else(|| Error::DType {
            tensor: name,
            expected,
            got: "an array holding something other than numbers".into(),
        });
    }
    Err(Error::DType {
        tensor: name,
        expected,
        got: type_name(data),
    })
}

/// A float tensor from `{data, shape, dtype?}`: f16 (a Float16Array, f16
/// bits in a Uint16Array, or `dtype: "float16"`) stays f16 on the device.
pub fn tensor(name: &'static str, v: &JsValue) -> Result<HostTensor> {
    if !v.is_object() {
        return Err(Error::DType {
            tensor: name,
            expected: "a tensor {data, shape}",
            got: type_name(v),
        });
    }
    let shape = shape(name, field(v, "shape"))?;
    let data = field(v, "data").ok_or(Error::DType {
        tensor: name,
        expected: "a tensor {data, shape}",
        got: "an object without data".into(),
    })?;
    let dtype = field(v, "dtype").and_then(|d| d.as_string());
    let (values, kind) = floats(name, &data, dtype.as_deref())?;
    let t = HostTensor::named(name, shape, values)?;
    Ok(match (kind, dtype.as_deref()) {
        ("float16", _) | (_, Some("float16")) => t.into_f16(),
        _ => t,
    })
}

/// The bits and shape of a tensor `{data: Uint16Array, shape, dtype:
/// "bfloat16"}`, for an upload that widens them on the device; `None` for
/// any other tensor (which [`tensor`] reads, and checks).
pub fn bf16_bits(name: &'static str, v: &JsValue) -> Result<Option<(Vec<u16>, Vec<usize>)>> {
    if !v.is_object()
        || field(v, "dtype").and_then(|d| d.as_string()).as_deref() != Some("bfloat16")
    {
        return Ok(None);
    }
    let Some(data) = field(v, "data") else {
        return Ok(None);
    };
    refuse_detached(name, &data)?;
    let Some(bits) = data.dyn_ref::<Uint16Array>() else {
        return Ok(None);
    };
    Ok(Some((bits.to_vec(), shape(name, field(v, "shape"))?)))
}

/// An attention mask from `{data, shape}`: bool (Uint8Array, nonzero attends,
/// or an array of booleans) or an additive float mask.
pub fn mask(v: &JsValue) -> Result<HostMask> {
    let name = "attn_mask";
    if !v.is_object() {
        return Err(Error::DType {
            tensor: name,
            expected: "a mask {data, shape}",
            got: type_name(v),
        });
    }
    let shape = shape(name, field(v, "shape"))?;
    let data = field(v, "data").unwrap_or(JsValue::UNDEFINED);
    refuse_detached(name, &data)?;
    if let Some(a) = data.dyn_ref::<Uint8Array>() {
        return HostMask::bool(shape, a.to_vec().into_iter().map(|b| b != 0).collect());
    }
    if Array::is_array(&data) && Array::from(&data).iter().all(|x| x.as_bool().is_some()) {
        let values = Array::from(&data)
            .iter()
            .map(|x| x.as_bool() == Some(true))
            .collect();
        return HostMask::bool(shape, values);
    }
    let dtype = field(v, "dtype").and_then(|d| d.as_string());
    let (values, _) = floats(name, &data, dtype.as_deref())?;
    HostMask::float(shape, values)
}

/// `nonpad_kv_seqlen`: BigInt64Array, Int32Array or an array of whole numbers.
pub fn lengths(v: &JsValue) -> Result<Vec<i64>> {
    integers("nonpad_kv_seqlen", v)
}

/// Whole numbers named `name` (lengths, offsets): BigInt64Array, Int32Array
/// or an array of whole numbers.
pub fn integers(name: &'static str, v: &JsValue) -> Result<Vec<i64>> {
    let bad = |got: String| Error::DType {
        tensor: name,
        expected: "BigInt64Array, Int32Array or an array of whole numbers",
        got,
    };
    refuse_detached(name, v)?;
    if let Some(a) = v.dyn_ref::<BigInt64Array>() {
        return Ok(a.to_vec());
    }
    if let Some(a) = v.dyn_ref::<Int32Array>() {
        return Ok(a.to_vec().into_iter().map(i64::from).collect());
    }
    if Array::is_array(v) {
        return Array::from(v)
            .iter()
            .map(|x| match x.as_f64() {
                Some(n) if n.fract() == 0.0 && n.abs() < 9e15 => Ok(n as i64),
                _ => Err(bad(
                    "an array holding something other than whole numbers".into()
                )),
            })
            .collect();
    }
    Err(bad(type_name(v)))
}

/// A host tensor as `{data: Float32Array, shape}`.
pub fn to_js(t: &HostTensor) -> JsValue {
    let out = Object::new();
    let _ = Reflect::set(&out, &"data".into(), &Float32Array::from(t.data()).into());
    let shape: Array = t.shape().iter().map(|&d| JsValue::from(d as f64)).collect();
    let _ = Reflect::set(&out, &"shape".into(), &shape.into());
    let dtype = if t.dtype() == DType::F16 {
        "float16"
    } else {
        "float32"
    };
    let _ = Reflect::set(&out, &"dtype".into(), &dtype.into());
    out.into()
}

/// Sets `obj[key] = value`.
pub fn set(obj: &Object, key: &str, value: impl Into<JsValue>) {
    let _ = Reflect::set(obj, &JsValue::from_str(key), &value.into());
}

/// The options of one attention call, beyond [`AttentionOptions`].
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// The ONNX attributes and the outputs asked for.
    pub attention: AttentionOptions,
    /// Return device handles instead of typed arrays.
    pub keep_on_device: bool,
    /// Query heads of 3D inputs `[B, S, H·D]`.
    pub q_num_heads: Option<usize>,
    /// KV heads of 3D inputs.
    pub kv_num_heads: Option<usize>,
    /// Measure the GPU time (timestamp queries) and the wall time of the call.
    pub timing: bool,
    /// Repeat the call in the f64 oracle and report the errors.
    pub verify: bool,
}

/// The option names [`call_options`] accepts.
pub const OPTION_NAMES: [&str; 18] = [
    "scale",
    "softcap",
    "isCausal",
    "leftWindowSize",
    "rightWindowSize",
    "qkMatmulOutputMode",
    "softmaxPrecision",
    "temperature",
    "alibi",
    "returnLse",
    "returnPresent",
    "path",
    "precision",
    "keepOnDevice",
    "qNumHeads",
    "kvNumHeads",
    "timing",
    "verify",
];

fn invalid(name: &'static str, v: &JsValue, reason: &'static str) -> Error {
    Error::InvalidOption {
        name,
        value: v
            .as_string()
            .or_else(|| v.as_f64().map(|x| x.to_string()))
            .unwrap_or_else(|| type_name(v)),
        reason,
    }
}

fn number(options: &JsValue, name: &'static str) -> Result<Option<f64>> {
    field(options, name)
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| invalid(name, &v, "must be a number"))
        })
        .transpose()
}

fn flag(options: &JsValue, name: &'static str) -> Result<bool> {
    field(options, name)
        .map(|v| {
            v.as_bool()
                .ok_or_else(|| invalid(name, &v, "must be true or false"))
        })
        .transpose()
        .map(|b| b.unwrap_or(false))
}

fn whole(options: &JsValue, name: &'static str) -> Result<Option<i64>> {
    match number(options, name)? {
        Some(x) if x.fract() == 0.0 && x.abs() < 9e15 => Ok(Some(x as i64)),
        Some(x) => Err(invalid(name, &JsValue::from(x), "must be a whole number")),
        None => Ok(None),
    }
}

/// The path named in JavaScript (`auto`, `fused`, `unfused`, `cpu`, `oracle`).
pub fn path(v: &JsValue) -> Result<KernelPath> {
    match v.as_string().as_deref() {
        Some("auto") => Ok(KernelPath::Auto),
        Some("fused") => Ok(KernelPath::Fused),
        Some("unfused") => Ok(KernelPath::Unfused),
        Some("cpu") => Ok(KernelPath::Cpu),
        Some("oracle") => Ok(KernelPath::Oracle),
        _ => Err(invalid(
            "path",
            v,
            "must be 'auto', 'fused', 'unfused', 'cpu' or 'oracle'",
        )),
    }
}

/// The options of `engine.attention(inputs, options)`, in ONNX's names in
/// camelCase. Unknown names are an error, so a misspelt option never goes
/// unnoticed.
pub fn call_options(options: &JsValue) -> std::result::Result<CallOptions, JsValue> {
    known_keys(options, &OPTION_NAMES, "options")?;
    checked_call_options(options).map_err(|e| crate::errors::to_js(&e))
}

/// [`call_options`] once the names are known.
fn checked_call_options(options: &JsValue) -> Result<CallOptions> {
    if options.is_undefined() || options.is_null() {
        return Ok(CallOptions::default());
    }
    if options.dyn_ref::<Object>().is_none() {
        return Err(invalid("options", options, "must be an object"));
    }
    let mut a = AttentionOptions {
        scale: number(options, "scale")?.map(|x| x as f32),
        is_causal: flag(options, "isCausal")?,
        alibi: flag(options, "alibi")?,
        return_lse: flag(options, "returnLse")?,
        return_present: flag(options, "returnPresent")?,
        ..Default::default()
    };
    if let Some(x) = number(options, "softcap")? {
        a.softcap = x as f32;
    }
    if let Some(x) = number(options, "temperature")? {
        a.temperature = x as f32;
    }
    if let Some(x) = whole(options, "leftWindowSize")? {
        a.left_window_size = x;
    }
    if let Some(x) = whole(options, "rightWindowSize")? {
        a.right_window_size = x;
    }
    if let Some(mode) = whole(options, "qkMatmulOutputMode")? {
        a.qk_matmul_output_mode = Some(QkMatmulOutputMode::from_onnx(mode)?);
    }
    if let Some(p) = whole(options, "softmaxPrecision")? {
        // Accepted as ONNX allows; the kernels compute the softmax in f32.
        if !matches!(p, 0 | 1 | 10 | 11 | 16) {
            return Err(invalid(
                "softmaxPrecision",
                &JsValue::from(p as f64),
                "must be 1 (float), 10 (float16), 11 (double) or 16 (bfloat16)",
            ));
        }
    }
    if let Some(p) = field(options, "path") {
        a.path = path(&p)?;
    }
    if let Some(p) = field(options, "precision") {
        a.precision = p
            .as_string()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| invalid("precision", &p, "must be 'highest' or 'fast'"))?;
    }
    let heads = |name: &'static str| -> Result<Option<usize>> {
        match whole(options, name)? {
            // (Within u32: `as usize` would wrap on wasm32, 2^32 + 4 heads to 4.)
            Some(n) if n > 0 && n <= i64::from(u32::MAX) => Ok(Some(n as usize)),
            Some(n) => Err(invalid(
                name,
                &JsValue::from(n as f64),
                "must be a positive whole number below 2^32",
            )),
            None => Ok(None),
        }
    };
    a.validate()?;
    Ok(CallOptions {
        attention: a,
        keep_on_device: flag(options, "keepOnDevice")?,
        q_num_heads: heads("qNumHeads")?,
        kv_num_heads: heads("kvNumHeads")?,
        timing: flag(options, "timing")?,
        verify: flag(options, "verify")?,
    })
}

/// The most elements the bindings allocate for a tensor they make themselves
/// (warm-up zeros, benchmark inputs): 2^28 f32 values, 1 GiB. Beyond it the
/// allocation would abort the wasm instance instead of failing.
pub const MAX_ELEMENTS: u64 = 1 << 28;

/// The element count of `shape`, or a [`Error::Limit`] when it overflows or
/// exceeds [`MAX_ELEMENTS`].
pub fn elements(name: &str, shape: &[usize]) -> Result<usize> {
    let count = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .unwrap_or(u64::MAX);
    if count > MAX_ELEMENTS {
        return Err(Error::Limit {
            what: format!("{name} of shape {shape:?}"),
            needed: count,
            limit: MAX_ELEMENTS,
            limit_name: "elements of one tensor made in the browser",
            hint: "use smaller shapes",
        });
    }
    Ok(count as usize)
}

/// Rejects keys of `obj` outside `allowed`, naming the call, so that a misspelt
/// option is an error rather than silently ignored.
pub fn known_keys(obj: &JsValue, allowed: &[&str], what: &str) -> std::result::Result<(), JsValue> {
    let Some(object) = obj.dyn_ref::<Object>() else {
        return Ok(());
    };
    for key in Object::keys(object).iter() {
        let key = key.as_string().unwrap_or_default();
        if !allowed.contains(&key.as_str()) {
            let hint = match closest(&key, allowed) {
                Some(name) => format!(" (did you mean `{name}`?)"),
                None => String::new(),
            };
            return Err(crate::errors::js_error(
                "InvalidOption",
                format!(
                    "{what}: `{key}` is not an option{hint}; the options are {}",
                    allowed.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// The name in `names` closest to `key` (a misspelling, another case, or
/// snake_case for camelCase), where one is within two edits.
pub fn closest<'n>(key: &str, names: &[&'n str]) -> Option<&'n str> {
    let plain = |s: &str| s.replace('_', "").to_lowercase();
    let key = plain(key);
    names
        .iter()
        .map(|name| (edits(&key, &plain(name)), *name))
        .filter(|&(d, _)| d <= 2)
        .min_by_key(|&(d, _)| d)
        .map(|(_, name)| name)
}

/// Levenshtein distance (insertions, deletions, substitutions).
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// An error report as `{maxAbs, allowed, passed}`.
pub fn report_js(r: &webattn::conformance::ErrorReport) -> JsValue {
    let out = Object::new();
    set(&out, "maxAbs", r.max_abs);
    set(&out, "allowed", r.allowed);
    set(&out, "passed", r.passed());
    out.into()
}
