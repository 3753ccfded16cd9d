//! The options of a call, in ONNX's names as Python spells them, to the
//! engine's [`AttentionOptions`]: one parser for every call that takes them
//! (`attention`, `attention_backward`). A bad value is the engine's
//! `InvalidOption`, named as the caller wrote it; an unknown name is refused
//! with the closest known one, so a misspelt option never goes unnoticed.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use webattn::{AttentionOptions, Error, KernelPath, Precision, QkMatmulOutputMode, Result};

/// Every option a call takes.
const NAMES: [&str; 13] = [
    "scale",
    "softcap",
    "is_causal",
    "left_window_size",
    "right_window_size",
    "qk_matmul_output_mode",
    "softmax_precision",
    "return_lse",
    "return_present",
    "temperature",
    "alibi",
    "path",
    "precision",
];

fn invalid(name: &'static str, value: &Bound<'_, PyAny>, reason: &'static str) -> Error {
    Error::InvalidOption {
        name,
        value: value
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "?".into()),
        reason,
    }
}

/// The path named in Python (`auto`, `fused`, `unfused`, `cpu`, `oracle`).
fn path(name: &str) -> Option<KernelPath> {
    [
        KernelPath::Auto,
        KernelPath::Fused,
        KernelPath::Unfused,
        KernelPath::Cpu,
        KernelPath::Oracle,
    ]
    .into_iter()
    .find(|p| p.name() == name)
}

/// One option's value as `T`, or the engine's error naming it.
fn value<'py, T>(name: &'static str, v: &Bound<'py, PyAny>, reason: &'static str) -> Result<T>
where
    T: for<'a> FromPyObject<'a, 'py>,
{
    v.extract().map_err(|_| invalid(name, v, reason))
}

/// The engine's options from a call's keyword options (`None` entries keep
/// the defaults), checked.
pub fn attention_options(options: Option<&Bound<'_, PyDict>>) -> Result<AttentionOptions> {
    let mut a = AttentionOptions::default();
    let Some(options) = options else {
        return Ok(a);
    };
    const NUMBER: &str = "must be a number";
    const FLAG: &str = "must be True or False";
    const WHOLE: &str = "must be a whole number";
    const PATHS: &str = "must be 'auto', 'fused', 'unfused', 'cpu' or 'oracle'";
    const PRECISIONS: &str = "must be 'highest' or 'fast'";
    for (key, v) in options.iter() {
        let key: String = key.extract().unwrap_or_default();
        if v.is_none() && NAMES.contains(&key.as_str()) {
            continue;
        }
        match key.as_str() {
            "scale" => a.scale = Some(value("scale", &v, NUMBER)?),
            "softcap" => a.softcap = value("softcap", &v, NUMBER)?,
            "is_causal" => a.is_causal = value("is_causal", &v, FLAG)?,
            "left_window_size" => a.left_window_size = value("left_window_size", &v, WHOLE)?,
            "right_window_size" => a.right_window_size = value("right_window_size", &v, WHOLE)?,
            "qk_matmul_output_mode" => {
                let mode: i64 = value("qk_matmul_output_mode", &v, WHOLE)?;
                a.qk_matmul_output_mode = Some(QkMatmulOutputMode::from_onnx(mode)?);
            }
            "softmax_precision" => {
                // Accepted as ONNX allows; the kernels compute the softmax in f32.
                let p: i64 = value("softmax_precision", &v, WHOLE)?;
                if !matches!(p, 0 | 1 | 10 | 11 | 16) {
                    return Err(invalid(
                        "softmax_precision",
                        &v,
                        "must be 1 (float), 10 (float16), 11 (double) or 16 (bfloat16)",
                    ));
                }
            }
            "return_lse" => a.return_lse = value("return_lse", &v, FLAG)?,
            "return_present" => a.return_present = value("return_present", &v, FLAG)?,
            "temperature" => a.temperature = value("temperature", &v, NUMBER)?,
            "alibi" => a.alibi = value("alibi", &v, FLAG)?,
            "path" => {
                let text: String = value("path", &v, PATHS)?;
                a.path = path(&text).ok_or_else(|| invalid("path", &v, PATHS))?;
            }
            "precision" => {
                let text: String = value("precision", &v, PRECISIONS)?;
                a.precision = text
                    .parse::<Precision>()
                    .map_err(|_| invalid("precision", &v, PRECISIONS))?;
            }
            _ => {
                return Err(Error::InvalidOption {
                    name: "options",
                    value: key,
                    reason: "is not an option of attention (scale, softcap, is_causal, \
                             left_window_size, right_window_size, qk_matmul_output_mode, \
                             softmax_precision, return_lse, return_present, temperature, alibi, \
                             path, precision)",
                })
            }
        }
    }
    a.validate()?;
    Ok(a)
}
