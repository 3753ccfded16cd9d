//! Engine errors as JavaScript `Error`s: the message is the engine's own typed
//! message (sizes named, what to do), and `name` says its kind
//! (`ShapeMismatch`, `Limit`, `DeviceLost`, ...), so callers can branch on it.

use wasm_bindgen::JsValue;

/// A JavaScript `Error` for an engine error. Options are named as a
/// JavaScript caller writes them (`isCausal`, not ONNX's `is_causal`).
pub fn to_js(e: &webattn::Error) -> JsValue {
    let message = match e {
        webattn::Error::InvalidOption {
            name,
            value,
            reason,
        } => format!("option {} = {value} is invalid: {reason}", camel_case(name)),
        _ => e.to_string(),
    };
    let error = js_sys::Error::new(&message);
    error.set_name(e.kind());
    error.into()
}

/// A JavaScript `Error` of kind `name` with `message` (for failures outside
/// the engine: a handle that was disposed, a malformed argument object).
pub fn js_error(name: &str, message: impl AsRef<str>) -> JsValue {
    let error = js_sys::Error::new(message.as_ref());
    error.set_name(name);
    error.into()
}

/// `Result<T, webattn::Error>` to `Result<T, JsValue>`.
pub trait IntoJs<T> {
    /// Converts the error side.
    fn js(self) -> Result<T, JsValue>;
}

impl<T> IntoJs<T> for webattn::Result<T> {
    fn js(self) -> Result<T, JsValue> {
        self.map_err(|e| to_js(&e))
    }
}

/// `left_window_size` → `leftWindowSize`.
pub fn camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        match c {
            '_' => upper = !out.is_empty(),
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}
