//! The webattn engine in the browser: the wasm core of the JavaScript
//! library (`web/lib/webattn.js` wraps it as `WebAttn`; the demo page is its
//! first user).
//!
//! The same library runs here as natively: the browser's WebGPU adapter (or
//! the fast CPU backend, single-threaded and SIMD128-vectorised, when there is
//! none), the same WGSL kernels, the same conformance sweep and f64 oracle.
//! Values cross as JavaScript objects and typed arrays; every failure is a
//! JavaScript `Error` named by its kind, never a panic.

mod attention;
mod backward;
mod convert;
mod engine;
mod errors;
mod family;
mod handles;
mod paged;
mod ragged;
mod train;

pub use engine::EngineCore;
pub use family::{DecoderCore, MhaCore, ScoredCore};

use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

/// Every pipeline variant the engine compiles, as JSON `[{label, code,
/// constants, subgroups}]`: the WGSL exactly as the device receives it (with
/// `enable subgroups;` where needed) and its override constants. The page
/// compiles each with the browser's own WebGPU, including the subgroup
/// kernels, which wgpu 30 cannot run on the web (it keeps `subgroups` a
/// native-only feature, gfx-rs/wgpu#5555).
#[wasm_bindgen(js_name = kernelSources)]
pub fn kernel_sources() -> String {
    let list: Vec<Value> = webattn::kernels::variants()
        .into_iter()
        .map(|key| {
            let constants: serde_json::Map<String, Value> = key
                .constants
                .iter()
                .map(|&(name, value)| (name.to_string(), json!(value)))
                .collect();
            json!({
                "label": key.to_string(),
                "code": key.kernel.device_source(),
                "entry": key.kernel.entry_point(),
                "constants": constants,
                "subgroups": key.kernel.uses_subgroups(),
            })
        })
        .collect();
    Value::Array(list).to_string()
}
