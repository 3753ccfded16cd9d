//! The attention family for JavaScript: multi-head layers (weights uploaded
//! once per engine) with their KV-cache decoder, RoPE and sinusoidal
//! positions, Bahdanau and Luong scoring, linear attention. Each call can
//! `verify` against its own f64 oracle with the 2x-plain-f32 rule.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Object, Reflect};
use wasm_bindgen::prelude::*;
use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::family::additive::AdditiveAttention;
use webattn::family::linear::{linear_attention_oracle, LinearAttention};
use webattn::family::luong::{LuongAttention, LuongScore};
use webattn::family::mha::{KvCache, MhaWeights, MultiHeadAttention};
use webattn::family::position::{rope_oracle, sinusoidal_oracle, Rope, RopeLayout, Sinusoidal};
use webattn::family::Attended;
use webattn::{Engine, HostTensor};

use crate::convert::{self, field, report_js, set};
use crate::engine::EngineCore;
use crate::errors::{js_error, IntoJs};

fn flag(options: &JsValue, key: &str) -> Result<bool, JsValue> {
    match field(options, key) {
        None => Ok(false),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| js_error("InvalidOption", format!("{key} must be true or false"))),
    }
}

fn number(options: &JsValue, key: &str) -> Result<Option<f64>, JsValue> {
    field(options, key)
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| js_error("InvalidOption", format!("{key} must be a number")))
        })
        .transpose()
}

fn whole(options: &JsValue, key: &str) -> Result<Option<usize>, JsValue> {
    match number(options, key)? {
        Some(x) if x >= 0.0 && x.fract() == 0.0 => Ok(Some(x as usize)),
        Some(_) => Err(js_error(
            "InvalidOption",
            format!("{key} must be a whole number"),
        )),
        None => Ok(None),
    }
}

fn tensor(name: &'static str, v: &JsValue) -> Result<HostTensor, JsValue> {
    if field(v, "handle").is_some() {
        return Err(js_error(
            "DType",
            format!("{name}: the family's layers take typed arrays {{data, shape}}; read() the device tensor first"),
        ));
    }
    convert::tensor(name, v).js()
}

fn optional_tensor(
    name: &'static str,
    obj: &JsValue,
    key: &str,
) -> Result<Option<HostTensor>, JsValue> {
    field(obj, key).map(|v| tensor(name, &v)).transpose()
}

fn required_tensor(name: &'static str, obj: &JsValue, key: &str) -> Result<HostTensor, JsValue> {
    let v = field(obj, key)
        .ok_or_else(|| js_error("MissingInput", format!("`{key}` ({name}) is required")))?;
    tensor(name, &v)
}

/// Options of `engine.attention` that a layer has no use for: an error, not ignored.
const NOT_FOR_LAYERS: [&str; 7] = [
    "keepOnDevice",
    "timing",
    "qNumHeads",
    "kvNumHeads",
    "returnLse",
    "returnPresent",
    "qkMatmulOutputMode",
];

/// `options` without the keys the attention options do not know, for `call_options`.
fn attention_options(
    options: &JsValue,
    family_keys: &[&str],
) -> Result<webattn::AttentionOptions, JsValue> {
    if options.is_undefined() || options.is_null() {
        return Ok(Default::default());
    }
    for key in NOT_FOR_LAYERS {
        if field(options, key).is_some() {
            return Err(js_error(
                "InvalidOption",
                format!(
                    "`{key}` is an option of engine.attention, not of the family's layers \
                     (they take the attention options, `weights` and `verify`)"
                ),
            ));
        }
    }
    let copy = Object::assign(&Object::new(), &Object::from(options.clone()));
    for key in family_keys {
        let _ = Reflect::delete_property(&copy, &JsValue::from_str(key));
    }
    Ok(convert::call_options(&copy.into())?.attention)
}

/// `{output, weights?}` (and `check` when verified).
fn attended_js(out: &Attended, check: Option<JsValue>) -> JsValue {
    let result = Object::new();
    set(&result, "output", convert::to_js(&out.output));
    if let Some(w) = &out.weights {
        set(&result, "weights", convert::to_js(w));
    }
    if let Some(c) = check {
        set(&result, "check", c);
    }
    result.into()
}

/// The check of an output (and the weights, when returned) against f64 and plain f32 oracles.
fn check_js(out: &Attended, exact: (&[f64], &[f64]), plain: (&[f32], &[f32])) -> JsValue {
    let result = Object::new();
    let y = compare(out.output.data(), exact.0, plain.0, DEFAULT_FLOOR);
    let mut passed = y.passed();
    set(&result, "output", report_js(&y));
    if let Some(w) = &out.weights {
        let r = compare(w.data(), exact.1, plain.1, DEFAULT_FLOOR);
        passed &= r.passed();
        set(&result, "weights", report_js(&r));
    }
    set(&result, "passed", passed);
    result.into()
}

/// `{output, check?}` for a positional encoding, checked against its f64 and
/// plain f32 oracles when they are given.
fn encoded_js(out: HostTensor, oracles: Option<(Vec<f64>, Vec<f32>)>) -> JsValue {
    let attended = Attended {
        output: out,
        weights: None,
    };
    let check = oracles.map(|(exact, plain)| check_js(&attended, (&exact, &[]), (&plain, &[])));
    attended_js(&attended, check)
}

fn rope_from(v: &JsValue) -> Result<Rope, JsValue> {
    let mut rope = Rope::default();
    if let Some(base) = number(v, "base")? {
        rope.base = base;
    }
    if let Some(offset) = whole(v, "offset")? {
        rope.offset = offset;
    }
    if let Some(layout) = field(v, "layout") {
        rope.layout = match layout.as_string().as_deref() {
            Some("interleaved") => RopeLayout::Interleaved,
            Some("half-split") => RopeLayout::HalfSplit,
            _ => {
                return Err(js_error(
                    "InvalidOption",
                    "rope layout must be 'interleaved' or 'half-split'",
                ))
            }
        };
    }
    Ok(rope)
}

/// A multi-head attention layer.
#[wasm_bindgen]
pub struct MhaCore {
    engine: Rc<Engine>,
    layer: Rc<MultiHeadAttention>,
}

/// The KV-cache decoder of a multi-head layer: keys and values stay on the device.
#[wasm_bindgen]
pub struct DecoderCore {
    engine: Rc<Engine>,
    layer: Rc<MultiHeadAttention>,
    /// `None` while a step runs.
    cache: RefCell<Option<KvCache>>,
    /// Tokens in the cache (kept apart, so it reads right during a step).
    tokens: std::cell::Cell<usize>,
}

#[wasm_bindgen]
impl MhaCore {
    /// `forward(query [B, N, d_model], keyValue [B, M, d_kv] | null, options)`:
    /// the attention options plus `weights` (return them) and `verify`.
    pub async fn forward(
        &self,
        query: JsValue,
        key_value: JsValue,
        options: JsValue,
    ) -> Result<JsValue, JsValue> {
        let query = tensor("query", &query)?;
        let key_value = if key_value.is_undefined() || key_value.is_null() {
            None
        } else {
            Some(tensor("keyValue", &key_value)?)
        };
        let attention = attention_options(&options, &["weights"])?;
        let want_weights = flag(&options, "weights")?;
        let out = self
            .layer
            .forward(
                &self.engine,
                &query,
                key_value.as_ref(),
                &attention,
                want_weights,
            )
            .await
            .js()?;
        let check = if flag(&options, "verify")? {
            let (y, w) = self
                .layer
                .oracle::<f64>(&query, key_value.as_ref(), &attention)
                .js()?;
            let (py, pw) = self
                .layer
                .oracle::<f32>(&query, key_value.as_ref(), &attention)
                .js()?;
            Some(check_js(&out, (&y, &w), (&py, &pw)))
        } else {
            None
        };
        Ok(attended_js(&out, check))
    }

    /// A decoder with an empty KV cache.
    pub fn decoder(&self) -> DecoderCore {
        DecoderCore {
            engine: self.engine.clone(),
            layer: self.layer.clone(),
            cache: RefCell::new(Some(KvCache::new())),
            tokens: std::cell::Cell::new(0),
        }
    }
}

#[wasm_bindgen]
impl DecoderCore {
    /// One causal step: `x` `[B, n, d_model]` holds the next `n` tokens; their
    /// keys and values join the cache. Options as `forward` (without `verify`).
    pub async fn step(&self, x: JsValue, options: JsValue) -> Result<JsValue, JsValue> {
        if field(&options, "verify").is_some() {
            return Err(js_error(
                "InvalidOption",
                "verify is not available on decoder steps (the oracle has no cache); \
                 verify layer.forward() on the whole sequence instead",
            ));
        }
        let x = tensor("x", &x)?;
        let attention = attention_options(&options, &["weights"])?;
        let want_weights = flag(&options, "weights")?;
        let mut cache = self.cache.borrow_mut().take().ok_or_else(|| {
            js_error(
                "Conflict",
                "a decoder step is already running; await it before the next",
            )
        })?;
        let out = self
            .layer
            .forward_cached(&self.engine, &x, &mut cache, &attention, want_weights)
            .await;
        self.tokens.set(cache.len());
        *self.cache.borrow_mut() = Some(cache);
        Ok(attended_js(&out.js()?, None))
    }

    /// Tokens in the cache.
    #[wasm_bindgen(getter)]
    pub fn length(&self) -> usize {
        self.tokens.get()
    }

    /// Empties the cache (an error while a step runs).
    pub fn reset(&self) -> Result<(), JsValue> {
        let mut cache = self.cache.borrow_mut();
        if cache.is_none() {
            return Err(js_error(
                "Conflict",
                "a decoder step is running; await it before reset()",
            ));
        }
        *cache = Some(KvCache::new());
        self.tokens.set(0);
        Ok(())
    }
}

/// Bahdanau or Luong scoring.
#[wasm_bindgen]
pub struct ScoredCore {
    engine: Rc<Engine>,
    layer: Scored,
}

enum Scored {
    Additive(AdditiveAttention),
    Luong(LuongAttention),
}

fn lengths(options: &JsValue) -> Result<Option<Vec<usize>>, JsValue> {
    field(options, "lengths")
        .map(|v| {
            convert::lengths(&v)
                .js()?
                .into_iter()
                .map(|n| {
                    usize::try_from(n)
                        .map_err(|_| js_error("InvalidOption", "lengths must not be negative"))
                })
                .collect()
        })
        .transpose()
}

#[wasm_bindgen]
impl ScoredCore {
    /// `forward(s [B, Nq, d_s], h [B, Nk, d_h], {lengths?, weights?, verify?})`:
    /// context vectors `[B, Nq, d_h]` and, on request, the weights `[B, Nq, Nk]`.
    pub async fn forward(
        &self,
        s: JsValue,
        h: JsValue,
        options: JsValue,
    ) -> Result<JsValue, JsValue> {
        convert::known_keys(&options, &["lengths", "weights", "verify"], "forward")?;
        let s = tensor("s", &s)?;
        let h = tensor("h", &h)?;
        let lengths = lengths(&options)?;
        let want_weights = flag(&options, "weights")?;
        let lengths = lengths.as_deref();
        let out = match &self.layer {
            Scored::Additive(l) => l.forward(&self.engine, &s, &h, lengths, want_weights).await,
            Scored::Luong(l) => l.forward(&self.engine, &s, &h, lengths, want_weights).await,
        }
        .js()?;
        let check = if flag(&options, "verify")? {
            let ((y, w), (py, pw)) = match &self.layer {
                Scored::Additive(l) => (
                    l.oracle::<f64>(&s, &h, lengths).js()?,
                    l.oracle::<f32>(&s, &h, lengths).js()?,
                ),
                Scored::Luong(l) => (
                    l.oracle::<f64>(&s, &h, lengths).js()?,
                    l.oracle::<f32>(&s, &h, lengths).js()?,
                ),
            };
            Some(check_js(&out, (&y, &w), (&py, &pw)))
        } else {
            None
        };
        Ok(attended_js(&out, check))
    }
}

#[wasm_bindgen]
impl EngineCore {
    /// A multi-head attention layer: `{weights: {wQ, bQ?, wK, bK?, wV, bV?,
    /// wO, bO?}, heads, kvHeads?, rope?: {base?, layout?}}`.
    #[wasm_bindgen(js_name = multiHeadAttention)]
    pub fn multi_head_attention(&self, config: JsValue) -> Result<MhaCore, JsValue> {
        convert::known_keys(
            &config,
            &["weights", "heads", "kvHeads", "rope"],
            "multiHeadAttention",
        )?;
        let w = field(&config, "weights").ok_or_else(|| {
            js_error(
                "MissingInput",
                "multiHeadAttention: `weights` {wQ, wK, wV, wO, ...} is required",
            )
        })?;
        convert::known_keys(
            &w,
            &["wQ", "bQ", "wK", "bK", "wV", "bV", "wO", "bO"],
            "multiHeadAttention weights",
        )?;
        let weights = MhaWeights {
            w_q: required_tensor("w_q", &w, "wQ")?,
            b_q: optional_tensor("b_q", &w, "bQ")?,
            w_k: required_tensor("w_k", &w, "wK")?,
            b_k: optional_tensor("b_k", &w, "bK")?,
            w_v: required_tensor("w_v", &w, "wV")?,
            b_v: optional_tensor("b_v", &w, "bV")?,
            w_o: required_tensor("w_o", &w, "wO")?,
            b_o: optional_tensor("b_o", &w, "bO")?,
        };
        let heads = whole(&config, "heads")?
            .ok_or_else(|| js_error("MissingInput", "multiHeadAttention: `heads` is required"))?;
        let kv_heads = whole(&config, "kvHeads")?.unwrap_or(heads);
        let mut layer = MultiHeadAttention::new(weights, heads, kv_heads).js()?;
        match field(&config, "rope") {
            None => {}
            Some(off) if off.as_bool() == Some(false) => {}
            Some(rope) if rope.as_bool() == Some(true) => {
                layer = layer.with_rope(Rope::default()).js()?;
            }
            Some(rope) if rope.is_object() => {
                convert::known_keys(&rope, &["base", "layout", "offset"], "rope")?;
                layer = layer.with_rope(rope_from(&rope)?).js()?;
            }
            Some(_) => {
                return Err(js_error(
                    "InvalidOption",
                    "multiHeadAttention: rope must be true, false or {base?, layout?, offset?}",
                ))
            }
        }
        Ok(MhaCore {
            engine: self.engine.clone(),
            layer: Rc::new(layer),
        })
    }

    /// Bahdanau's additive scoring `vᵀ tanh(W1 s + W2 h)`: `{w1, w2, v}`.
    pub fn bahdanau(&self, config: JsValue) -> Result<ScoredCore, JsValue> {
        convert::known_keys(&config, &["w1", "w2", "v"], "bahdanau")?;
        let layer = AdditiveAttention::new(
            required_tensor("w1", &config, "w1")?,
            required_tensor("w2", &config, "w2")?,
            required_tensor("v", &config, "v")?,
        )
        .js()?;
        Ok(ScoredCore {
            engine: self.engine.clone(),
            layer: Scored::Additive(layer),
        })
    }

    /// Luong's scoring: `{score: 'dot' | 'general' | 'concat', w?, v?, scale?}`.
    pub fn luong(&self, config: JsValue) -> Result<ScoredCore, JsValue> {
        convert::known_keys(&config, &["score", "w", "v", "scale"], "luong")?;
        let score_name = match field(&config, "score") {
            None => None,
            Some(s) => Some(s.as_string().ok_or_else(|| {
                js_error(
                    "InvalidOption",
                    "luong: score must be 'dot', 'general' or 'concat'",
                )
            })?),
        };
        let score = match score_name.as_deref() {
            Some("dot") | None => LuongScore::Dot,
            Some("general") => LuongScore::General {
                w: required_tensor("w", &config, "w")?,
            },
            Some("concat") => LuongScore::Concat {
                w: required_tensor("w", &config, "w")?,
                v: required_tensor("v", &config, "v")?,
            },
            Some(other) => {
                return Err(js_error(
                    "InvalidOption",
                    format!("luong: score '{other}' must be 'dot', 'general' or 'concat'"),
                ))
            }
        };
        let mut layer = LuongAttention::new(score).js()?;
        if let Some(scale) = number(&config, "scale")? {
            layer = layer.with_scale(scale as f32).js()?;
        }
        Ok(ScoredCore {
            engine: self.engine.clone(),
            layer: Scored::Luong(layer),
        })
    }

    /// Linear attention (elu+1 features) on `[B, H, N, D]` tensors:
    /// `{causal?, weights?, verify?}`.
    #[wasm_bindgen(js_name = linearAttention)]
    pub async fn linear_attention(
        &self,
        q: JsValue,
        k: JsValue,
        v: JsValue,
        options: JsValue,
    ) -> Result<JsValue, JsValue> {
        convert::known_keys(
            &options,
            &["causal", "weights", "verify"],
            "linearAttention",
        )?;
        let (q, k, v) = (tensor("Q", &q)?, tensor("K", &k)?, tensor("V", &v)?);
        let causal = flag(&options, "causal")?;
        let want_weights = flag(&options, "weights")?;
        let out = LinearAttention::new(causal)
            .forward(&self.engine, &q, &k, &v, want_weights)
            .await
            .js()?;
        let check = if flag(&options, "verify")? {
            let exact = linear_attention_oracle::<f64>(&q, &k, &v, causal, want_weights).js()?;
            let plain = linear_attention_oracle::<f32>(&q, &k, &v, causal, want_weights).js()?;
            Some(check_js(
                &out,
                (&exact.output, &exact.weights),
                (&plain.output, &plain.weights),
            ))
        } else {
            None
        };
        Ok(attended_js(&out, check))
    }

    /// Rotary embeddings of `x` `[..., N, D]`: `{base?, layout?, offset?, verify?}`.
    pub async fn rope(&self, x: JsValue, options: JsValue) -> Result<JsValue, JsValue> {
        convert::known_keys(&options, &["base", "layout", "offset", "verify"], "rope")?;
        let x = tensor("x", &x)?;
        let rope = rope_from(&options)?;
        let out = rope.apply(&self.engine, &x).await.js()?;
        let oracles = if flag(&options, "verify")? {
            Some((
                rope_oracle::<f64>(&x, &rope).js()?,
                rope_oracle::<f32>(&x, &rope).js()?,
            ))
        } else {
            None
        };
        Ok(encoded_js(out, oracles))
    }

    /// `x + PE` for embeddings `x` `[..., N, D]`: `{base?, offset?, verify?}`.
    pub async fn sinusoidal(&self, x: JsValue, options: JsValue) -> Result<JsValue, JsValue> {
        convert::known_keys(&options, &["base", "offset", "verify"], "sinusoidal")?;
        let x = tensor("x", &x)?;
        let mut encoding = Sinusoidal::default();
        if let Some(base) = number(&options, "base")? {
            encoding.base = base;
        }
        if let Some(offset) = whole(&options, "offset")? {
            encoding.offset = offset;
        }
        let out = encoding.add_to(&self.engine, &x).await.js()?;
        let oracles = if flag(&options, "verify")? {
            Some((
                sinusoidal_oracle::<f64>(&x, encoding.base, encoding.offset).js()?,
                sinusoidal_oracle::<f32>(&x, encoding.base, encoding.offset).js()?,
            ))
        } else {
            None
        };
        Ok(encoded_js(out, oracles))
    }
}
