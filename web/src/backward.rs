//! `engine.attentionBackward(inputs, forward, options)`: the gradients of a
//! forward call, on the caller's typed arrays. `inputs` and `options` are the
//! forward's (`engine.attention`'s); `forward` holds its `y` and `lse` and
//! the loss's `dy`. With `verify` the gradients are checked against the f64
//! oracle's by the 2x-plain-f32 rule.

use js_sys::Object;
use wasm_bindgen::{JsCast, JsValue};
use webattn::layout::{merge_heads, split_heads};
use webattn::{AttentionInputs, BackwardInputs, Engine, GradientOptions, HostTensor};

use crate::attention::{host_only, parse_inputs, Input, MaskInput};
use crate::convert::{self, field, set};
use crate::errors::{js_error, IntoJs};
use crate::handles::Handles;

/// The names `forward` accepts.
const FORWARD_NAMES: [&str; 3] = ["y", "lse", "dy"];

/// `engine.attentionBackward(inputs, forward, options)`.
pub async fn call(
    engine: &Engine,
    handles: &Handles,
    inputs: &JsValue,
    forward: &JsValue,
    options: &JsValue,
) -> Result<JsValue, JsValue> {
    let call = convert::call_options(options)?;
    if call.keep_on_device {
        return Err(js_error(
            "InvalidOption",
            "keepOnDevice: attentionBackward returns typed arrays",
        ));
    }
    let c = parse_inputs(handles, inputs, &call)?;
    if !c.all_host() {
        return Err(js_error(
            "InvalidOption",
            "attentionBackward takes the inputs as typed arrays ({data, shape}); read device \
             tensors back first",
        ));
    }
    let Some(object) = forward.dyn_ref::<Object>() else {
        return Err(js_error(
            "InvalidOption",
            format!(
                "forward must be an object {{y, lse, dy}}, got {}",
                convert::type_name(forward)
            ),
        ));
    };
    for key in Object::keys(object).iter().filter_map(|k| k.as_string()) {
        if !FORWARD_NAMES.contains(&key.as_str()) {
            return Err(js_error(
                "InvalidOption",
                format!("forward: `{key}` is not one of y (the forward's Y), lse and dy"),
            ));
        }
    }
    let tensor = |name: &'static str, key: &str| -> Result<HostTensor, JsValue> {
        let v = field(forward, key).ok_or_else(|| {
            js_error(
                "MissingInput",
                format!("forward.{key} ({name}) is required"),
            )
        })?;
        let t = convert::tensor(name, &v).js()?;
        // Y and dY come as Y came back: 3-D for 3-D inputs.
        match (c.three_d, t.shape().len(), call.q_num_heads) {
            (true, 3, Some(heads)) => split_heads(name, &t, heads).js(),
            _ => Ok(t),
        }
    };
    let (y, lse, dy) = (
        tensor("Y", "y")?,
        tensor("lse", "lse")?,
        tensor("dY", "dy")?,
    );
    let (Input::Host(q), Input::Host(k), Input::Host(v)) = (&c.q, &c.k, &c.v) else {
        unreachable!("all_host checked it");
    };
    let mut view = AttentionInputs::new(q, k, v);
    if let Some(MaskInput::Host(m)) = &c.mask {
        view = view.with_mask(m);
    }
    view.past_key = host_only(&c.past_key);
    view.past_value = host_only(&c.past_value);
    view.nonpad_kv_seqlen = c.nonpad.as_deref();
    let forward = BackwardInputs {
        y: &y,
        lse: &lse,
        dy: &dy,
    };
    let options = &call.attention;
    let grads = engine
        .attention_backward_host(&view, options, &forward, GradientOptions::default())
        .await
        .js()?;
    let check = if call.verify {
        let (output, report) =
            webattn::conformance::verify_gradients(&view, options, &forward, &grads)
                .map_err(|e| js_error("Conflict", e))?;
        let out = Object::new();
        set(&out, "worstOutput", output);
        set(&out, "maxAbs", report.max_abs);
        set(&out, "allowed", report.allowed);
        set(&out, "passed", report.passed());
        Some(out)
    } else {
        None
    };
    let result = Object::new();
    let as_given = |t: &HostTensor| {
        if c.three_d {
            merge_heads(t).js()
        } else {
            Ok(t.clone())
        }
    };
    set(&result, "dq", convert::to_js(&as_given(&grads.dq)?));
    set(&result, "dk", convert::to_js(&as_given(&grads.dk)?));
    set(&result, "dv", convert::to_js(&as_given(&grads.dv)?));
    if let Some(t) = &grads.d_past_key {
        set(&result, "dpastKey", convert::to_js(t));
    }
    if let Some(t) = &grads.d_past_value {
        set(&result, "dpastValue", convert::to_js(t));
    }
    if let Some(plan) = engine.last_backward() {
        set(&result, "path", plan.path.name());
        set(&result, "plan", plan.to_string());
    }
    if let Some(check) = check {
        set(&result, "check", check);
    }
    Ok(result.into())
}
