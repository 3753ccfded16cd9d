//! `engine.attentionRagged(inputs, options)`: packed sequences without
//! padding (FlashAttention's varlen form) on the caller's typed arrays.
//! `inputs` is `{q, k, v, cuSeqlensQ, cuSeqlensK}`: Q `[total queries, Hq,
//! Dk]`, K and V `[total keys, Hkv, ·]`, the offsets `batch + 1` whole
//! numbers rising from 0 to the packed rows; each sequence attends only its
//! own keys. Resolves to `{y, lse?}` packed as Q.

use js_sys::Object;
use wasm_bindgen::{JsCast, JsValue};
use webattn::{Engine, RaggedInputs};

use crate::convert::{self, field, set};
use crate::errors::{js_error, IntoJs};

/// The names `inputs` accepts.
const INPUT_NAMES: [&str; 5] = ["q", "k", "v", "cuSeqlensQ", "cuSeqlensK"];

/// `engine.attentionRagged(inputs, options)`.
pub async fn call(
    engine: &Engine,
    inputs: &JsValue,
    options: &JsValue,
) -> Result<JsValue, JsValue> {
    let call = convert::call_options(options)?;
    if call.keep_on_device || call.q_num_heads.is_some() || call.kv_num_heads.is_some() {
        return Err(js_error(
            "InvalidOption",
            "attentionRagged takes packed [tokens, heads, head size] typed arrays and returns \
             typed arrays: keepOnDevice, qNumHeads and kvNumHeads do not apply",
        ));
    }
    convert::known_keys(inputs, &INPUT_NAMES, "inputs")?;
    if inputs.dyn_ref::<Object>().is_none() {
        return Err(js_error(
            "InvalidOption",
            format!(
                "inputs must be an object {{q, k, v, cuSeqlensQ, cuSeqlensK}}, got {}",
                convert::type_name(inputs)
            ),
        ));
    }
    let required = |key: &str| {
        field(inputs, key)
            .ok_or_else(|| js_error("MissingInput", format!("inputs.{key} is required")))
    };
    let q = convert::tensor("Q", &required("q")?).js()?;
    let k = convert::tensor("K", &required("k")?).js()?;
    let v = convert::tensor("V", &required("v")?).js()?;
    let cu_seqlens_q = convert::integers("cuSeqlensQ", &required("cuSeqlensQ")?).js()?;
    let cu_seqlens_k = convert::integers("cuSeqlensK", &required("cuSeqlensK")?).js()?;
    let ragged = RaggedInputs {
        q: &q,
        k: &k,
        v: &v,
        cu_seqlens_q: &cu_seqlens_q,
        cu_seqlens_k: &cu_seqlens_k,
    };
    let out = engine
        .attention_ragged(&ragged, &call.attention)
        .await
        .map_err(|e| crate::errors::to_js(&e))?;
    let result = Object::new();
    set(&result, "y", convert::to_js(&out.y));
    if let Some(lse) = &out.lse {
        set(&result, "lse", convert::to_js(lse));
    }
    Ok(result.into())
}
