//! Device-resident tensors held for JavaScript: each upload or kept output
//! gets a numeric handle; JavaScript's `DeviceTensor` carries the number and
//! frees the buffer with `dispose()`.

use std::cell::RefCell;
use std::collections::HashMap;

use js_sys::{Array, Object};
use wasm_bindgen::JsValue;
use webattn::{Mask, Tensor};

use crate::convert::set;
use crate::errors::js_error;

/// A tensor or a mask on the engine.
#[derive(Clone)]
pub enum Held {
    /// A float tensor.
    Tensor(Tensor),
    /// An attention mask (an additive bias on the GPU).
    Mask(Mask),
}

impl Held {
    fn shape(&self) -> &[usize] {
        match self {
            Held::Tensor(t) => t.shape(),
            Held::Mask(m) => m.shape(),
        }
    }
}

/// The handles of one engine.
#[derive(Default)]
pub struct Handles {
    next: RefCell<u32>,
    held: RefCell<HashMap<u32, Held>>,
}

impl Handles {
    /// Holds `value` and returns its descriptor `{handle, shape, kind}`.
    pub fn hold(&self, value: Held) -> JsValue {
        let id = {
            let mut next = self.next.borrow_mut();
            *next += 1;
            *next
        };
        let out = Object::new();
        set(&out, "handle", id);
        let shape: Array = value
            .shape()
            .iter()
            .map(|&d| JsValue::from(d as f64))
            .collect();
        set(&out, "shape", shape);
        set(
            &out,
            "kind",
            if matches!(value, Held::Mask(_)) {
                "mask"
            } else {
                "tensor"
            },
        );
        self.held.borrow_mut().insert(id, value);
        out.into()
    }

    /// The value behind `id`, or an `Error` named `DisposedTensor`.
    pub fn get(&self, id: u32) -> Result<Held, JsValue> {
        self.held.borrow().get(&id).cloned().ok_or_else(|| {
            js_error(
                "DisposedTensor",
                format!(
                    "device tensor {id} was disposed (or belongs to another engine); \
                     upload the values again"
                ),
            )
        })
    }

    /// Puts `value` behind a held `id` (a tensor given new values).
    pub fn replace(&self, id: u32, value: Held) {
        if let Some(slot) = self.held.borrow_mut().get_mut(&id) {
            *slot = value;
        }
    }

    /// Frees `id`'s buffer (once nothing else uses it); `false` if it was not held.
    pub fn release(&self, id: u32) -> bool {
        self.held.borrow_mut().remove(&id).is_some()
    }

    /// How many handles are held.
    pub fn len(&self) -> usize {
        self.held.borrow().len()
    }
}
