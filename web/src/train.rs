//! `engine.trainRecall(options, onProgress)`: trains webattn's small
//! attention model (`webattn::train`) from scratch on associative recall on
//! this engine, the attention's forward and backward on its path; resolves
//! to the loss and accuracy curves, a held-out batch's score and the learned
//! attention of one held-out sequence.

use js_sys::{Array, Function, Object, Promise};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;
use webattn::rng::SplitMix64;
use webattn::train::{Adam, RecallModel, RecallTask};
use webattn::Engine;

use crate::convert::{self, field, set};
use crate::errors::{js_error, IntoJs};

/// A whole number option in `1..=max`, or `default`.
fn count(options: &JsValue, key: &str, default: usize, max: usize) -> Result<usize, JsValue> {
    match field(options, key) {
        None => Ok(default),
        Some(v) => match v.as_f64() {
            Some(x) if x.fract() == 0.0 && x >= 1.0 && x <= max as f64 => Ok(x as usize),
            _ => Err(js_error(
                "InvalidOption",
                format!("trainRecall: {key} must be a whole number from 1 to {max}"),
            )),
        },
    }
}

/// `engine.trainRecall(options, onProgress)`.
pub async fn call(
    engine: &Engine,
    options: &JsValue,
    progress: Option<Function>,
) -> Result<JsValue, JsValue> {
    convert::known_keys(
        options,
        &["steps", "batch", "seed", "learningRate"],
        "trainRecall options",
    )?;
    let steps = count(options, "steps", 150, 100_000)?;
    let batch_size = count(options, "batch", 64, 4096)?;
    let seed = count(options, "seed", 7, u32::MAX as usize)? as u64;
    let mut adam = Adam::default();
    if let Some(v) = field(options, "learningRate") {
        match v.as_f64() {
            Some(lr) if lr > 0.0 && lr < 1.0 => adam.learning_rate = lr as f32,
            _ => {
                return Err(js_error(
                    "InvalidOption",
                    "trainRecall: learningRate must be a number in (0, 1)",
                ))
            }
        }
    }
    engine.recover().await.js()?;
    let task = RecallTask::default();
    let mut model = RecallModel::new(task, 32, 2, seed).js()?;
    let held_out = task.batch(&mut SplitMix64::new(seed ^ 0x9e1d), 256).js()?;
    let mut rng = SplitMix64::new(seed.wrapping_add(4));
    let curve = Array::new();
    for step in 1..=steps {
        let batch = task.batch(&mut rng, batch_size).js()?;
        let stats = model.train_step(engine, &batch, &adam).await.js()?;
        let point = Object::new();
        set(&point, "step", step as u32);
        set(&point, "loss", stats.loss);
        set(&point, "accuracy", stats.accuracy);
        curve.push(&point);
        if let Some(f) = &progress {
            // A promise returned by the callback is awaited: the page can
            // yield to the browser there to draw.
            let ret = f.call1(&JsValue::NULL, &point)?;
            if let Some(p) = ret.dyn_ref::<Promise>() {
                JsFuture::from(p.clone()).await?;
            }
        }
    }
    let eval = model.evaluate(engine, &held_out).await.js()?;
    let out = Object::new();
    set(&out, "curve", curve);
    let held = Object::new();
    set(&held, "loss", eval.loss);
    set(&held, "accuracy", eval.accuracy);
    set(&out, "heldOut", held);
    set(
        &out,
        "map",
        convert::to_js(&model.attention_map(&held_out, 0).js()?),
    );
    let example = Object::new();
    let numbers = |v: &[usize]| {
        v.iter()
            .map(|&x| JsValue::from(x as u32))
            .collect::<Array>()
    };
    set(&example, "keys", numbers(&held_out.keys[..task.pairs]));
    set(&example, "values", numbers(&held_out.values[..task.pairs]));
    set(&example, "asked", held_out.asked[0] as u32);
    set(&out, "example", example);
    Ok(out.into())
}
