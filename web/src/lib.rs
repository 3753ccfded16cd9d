//! The webattn engine in the browser: the bindings `web/app.js` calls.
//!
//! Everything goes in and out as JSON text, so the page needs no generated
//! TypeScript types; the few large arrays (heatmaps) are small enough for it.
//! The same library runs here as natively: the browser's WebGPU adapter (or
//! the fast CPU backend, single-threaded and SIMD128-vectorised, when there is
//! none), the same WGSL kernels, the same conformance sweep and f64 oracle.

mod explore;
mod sentence;

use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use webattn::conformance::{run_sweep, sweep_len, SweepKind};
use webattn::{BackendKind, BackendPreference, Engine, EngineOptions};

fn js_error(e: impl std::fmt::Display) -> JsValue {
    JsValue::from_str(&e.to_string())
}

/// Every pipeline variant the engine compiles, as JSON `[{label, code,
/// constants, subgroups}]`: the WGSL exactly as the device receives it (with
/// `enable subgroups;` where needed) and its override constants. The page
/// compiles each with the browser's own WebGPU, including the subgroup
/// kernels, which wgpu 30 cannot run on the web (it keeps `subgroups` a
/// native-only feature, gfx-rs/wgpu#5555).
#[wasm_bindgen]
pub fn kernels() -> String {
    let list: Vec<Value> = webattn::gpu::plan::every_pipeline_variant()
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

/// The demo's engine.
#[wasm_bindgen]
pub struct Demo {
    engine: Engine,
    /// Why there is no GPU, when there is none.
    no_gpu_reason: Option<String>,
}

#[wasm_bindgen]
impl Demo {
    /// Finds the browser's WebGPU adapter, or falls back to the CPU backend
    /// (and says why).
    pub async fn create() -> Demo {
        console_error_panic_hook::set_once();
        let options = EngineOptions {
            backend: BackendPreference::Gpu,
            ..Default::default()
        };
        match Engine::with_options(options).await {
            Ok(engine) => Demo {
                engine,
                no_gpu_reason: None,
            },
            Err(e) => Demo {
                engine: Engine::cpu(),
                no_gpu_reason: Some(e.to_string()),
            },
        }
    }

    /// The adapter, its limits and features, and the kernel plan, as JSON.
    pub fn adapter(&self) -> String {
        let Some(caps) = self.engine.capabilities() else {
            return json!({
                "gpu": false,
                "reason": self.no_gpu_reason,
                "describe": self.engine.describe(),
            })
            .to_string();
        };
        let plan = self.engine.kernel_plan();
        let l = &caps.limits;
        json!({
            "gpu": true,
            "describe": self.engine.describe(),
            "name": caps.adapter.name,
            "backend": caps.adapter.backend,
            "device_type": caps.adapter.device_type,
            "limits": {
                "max_storage_buffer_binding_size": l.max_storage_buffer_binding_size,
                "max_buffer_size": l.max_buffer_size,
                "max_compute_workgroup_storage_size": l.max_compute_workgroup_storage_size,
                "max_compute_invocations_per_workgroup": l.max_compute_invocations_per_workgroup,
            },
            "features": {
                "shader_f16": caps.shader_f16,
                "subgroups": caps.subgroups,
                "subgroup_min_size": caps.subgroup_min_size,
                "subgroup_max_size": caps.subgroup_max_size,
                "timestamp_query": caps.timestamp_query,
            },
            "kernels": plan.map(|p| p.kernels.iter().map(|k| json!({"label": k.label, "role": k.role})).collect::<Vec<_>>()),
        })
        .to_string()
    }

    /// Whether the engine runs on a GPU.
    #[wasm_bindgen(js_name = hasGpu)]
    pub fn has_gpu(&self) -> bool {
        self.engine.backend() == BackendKind::Gpu
    }

    /// One attention call from the explorer's settings (JSON), checked against
    /// the oracle; returns the error, the times and a head's probabilities.
    pub async fn explore(&self, settings: String) -> Result<String, JsValue> {
        let settings: Value = serde_json::from_str(&settings).map_err(js_error)?;
        explore::run(&self.engine, &settings)
            .await
            .map(|v| v.to_string())
            .map_err(js_error)
    }

    /// The teaching example: "Le chat était assis sur le tapis" attending to
    /// "The cat sat on the mat", with embeddings made from the tokens, scored
    /// by `variant` (`dot`, `mha`, `bahdanau`, `luong-dot`, `luong-general`,
    /// `luong-concat`, `linear`).
    pub async fn sentence(&self, path: String, variant: String) -> Result<String, JsValue> {
        sentence::run(&self.engine, &path, &variant)
            .await
            .map(|v| v.to_string())
            .map_err(js_error)
    }

    /// The library's conformance sweep (`quick` or `full`) on this adapter;
    /// `progress(done, total, name, passed)` after each case. Returns the table
    /// and the `N passed, N failed` line as JSON.
    pub async fn check(&self, kind: String, progress: js_sys::Function) -> Result<String, JsValue> {
        let kind = if kind == "full" {
            SweepKind::Full
        } else {
            SweepKind::Quick
        };
        let total = sweep_len(&self.engine, kind, "");
        let mut done = 0u32;
        let report = run_sweep(&self.engine, kind, "", 0x5eed, |r| {
            done += 1;
            let _ = progress.call4(
                &JsValue::NULL,
                &JsValue::from(done),
                &JsValue::from(total as u32),
                &JsValue::from_str(&format!("{} ({})", r.name, r.path)),
                &JsValue::from_bool(r.passed()),
            );
        })
        .await;
        Ok(json!({
            "table": report.table(),
            "summary": report.summary_line(),
            "passed": report.passed(),
            "failed": report.failed(),
            "adapter": report.adapter,
        })
        .to_string())
    }

    /// The attention family's checks (multi-head layers, KV cache, positional
    /// encodings, additive and multiplicative scoring, linear attention)
    /// against their oracles; `progress(done, total, name, passed)` after each.
    #[wasm_bindgen(js_name = familyCheck)]
    pub async fn family_check(&self, progress: js_sys::Function) -> Result<String, JsValue> {
        use webattn::family::checks::{family_table, run_family_checks, FAMILY_CHECKS};
        let total = FAMILY_CHECKS.len() as u32;
        let mut done = 0u32;
        let results = run_family_checks(&self.engine, 0x5eed, |c| {
            done += 1;
            let _ = progress.call4(
                &JsValue::NULL,
                &JsValue::from(done),
                &JsValue::from(total),
                &JsValue::from_str(c.name),
                &JsValue::from_bool(c.passed()),
            );
        })
        .await
        .map_err(js_error)?;
        let table = family_table(&results);
        let summary = table.lines().last().unwrap_or_default().to_string();
        Ok(json!({
            "table": table,
            "summary": summary,
            "failed": results.iter().filter(|c| !c.passed()).count(),
        })
        .to_string())
    }

    /// Fused, unfused, CPU-backend and f64-oracle times at a few sizes (`[seq, ...]` as JSON).
    pub async fn timing(&self, seqs: String) -> Result<String, JsValue> {
        let seqs: Vec<usize> = serde_json::from_str(&seqs).map_err(js_error)?;
        explore::timing(&self.engine, &seqs)
            .await
            .map(|v| v.to_string())
            .map_err(js_error)
    }
}
