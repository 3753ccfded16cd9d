//! Engine errors as JavaScript `Error`s: the message is the engine's own typed
//! message (sizes named, what to do), and `name` says its kind
//! (`ShapeMismatch`, `Limit`, `DeviceLost`, ...), so callers can branch on it.

use wasm_bindgen::JsValue;

/// A JavaScript `Error` for an engine error.
pub fn to_js(e: &webattn::Error) -> JsValue {
    let error = js_sys::Error::new(&e.to_string());
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
