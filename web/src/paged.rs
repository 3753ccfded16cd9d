//! `engine.pagedCache(layout)`: a paged KV cache for serving many sequences
//! (`webattn::PagedKvCache`, its pages where the engine computes: WebGPU
//! buffers on a GPU engine, wasm memory on the CPU backend). Sequences are
//! numbers handed out by the cache; keys, values and queries are `{data,
//! shape}` tensors as `attention` takes them.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use js_sys::{Array, Object, Uint32Array};
use wasm_bindgen::prelude::*;
use webattn::{Engine, HostTensor, PageStorage, PagedKvCache, PagedLayout, SequenceId};

use crate::convert::{self, field, set};
use crate::errors::{js_error, IntoJs};

/// The names `layout` accepts.
const LAYOUT_NAMES: [&str; 6] = [
    "kvHeads",
    "headDim",
    "vHeadDim",
    "pageSize",
    "pageLimit",
    "storage",
];

/// A paged cache held for JavaScript (the library's `PagedKvCache`).
#[wasm_bindgen]
pub struct PagedCacheCore {
    engine: Rc<Engine>,
    cache: RefCell<PagedKvCache>,
    /// The sequences by the numbers JavaScript holds.
    sequences: RefCell<HashMap<u32, SequenceId>>,
    next: Cell<u32>,
}

/// A whole number `layout[key]`, or `default` where it is absent.
fn count(layout: &JsValue, key: &str, default: Option<usize>) -> Result<usize, JsValue> {
    match field(layout, key) {
        Some(v) => v
            .as_f64()
            .filter(|x| x.fract() == 0.0 && *x >= 0.0)
            .map(|x| x as usize)
            .ok_or_else(|| {
                js_error(
                    "InvalidOption",
                    format!(
                        "layout.{key} must be a whole number, got {}",
                        convert::type_name(&v)
                    ),
                )
            }),
        None => {
            default.ok_or_else(|| js_error("MissingInput", format!("layout.{key} is required")))
        }
    }
}

impl PagedCacheCore {
    /// A cache of `layout` (`{kvHeads, headDim, vHeadDim?, pageSize?,
    /// pageLimit?, storage?: "f32" | "f16"}`) on `engine`.
    pub fn new(engine: &Rc<Engine>, layout: &JsValue) -> Result<PagedCacheCore, JsValue> {
        convert::known_keys(layout, &LAYOUT_NAMES, "layout")?;
        let head_dim = count(layout, "headDim", None)?;
        let paged = PagedLayout {
            kv_heads: count(layout, "kvHeads", None)?,
            head_dim,
            v_head_dim: count(layout, "vHeadDim", Some(head_dim))?,
            page_size: count(layout, "pageSize", Some(16))?,
        };
        let mut cache = PagedKvCache::on_engine(engine, paged).js()?;
        if field(layout, "pageLimit").is_some() {
            cache = cache.with_page_limit(count(layout, "pageLimit", None)?);
        }
        let storage = match field(layout, "storage").and_then(|v| v.as_string()) {
            None => PageStorage::F32,
            Some(name) => PageStorage::parse(&name).map_err(|_| {
                js_error(
                    "InvalidOption",
                    format!("layout.storage must be \"f32\", \"f16\" or \"int8\", got {name:?}"),
                )
            })?,
        };
        let cache = cache.with_storage(storage).js()?;
        Ok(PagedCacheCore {
            engine: Rc::clone(engine),
            cache: RefCell::new(cache),
            sequences: RefCell::new(HashMap::new()),
            next: Cell::new(1),
        })
    }

    /// The sequence JavaScript calls `seq`.
    fn sequence(&self, seq: u32) -> Result<SequenceId, JsValue> {
        self.sequences.borrow().get(&seq).copied().ok_or_else(|| {
            js_error(
                "Paged",
                format!("sequence {seq} is not in this cache (never added, or freed)"),
            )
        })
    }

    /// A number for `id`.
    fn hand_out(&self, id: SequenceId) -> u32 {
        let seq = self.next.get();
        self.next.set(seq + 1);
        self.sequences.borrow_mut().insert(seq, id);
        seq
    }

    fn cache_mut(&self) -> Result<std::cell::RefMut<'_, PagedKvCache>, JsValue> {
        self.cache.try_borrow_mut().map_err(|_| {
            js_error(
                "Conflict",
                "the paged cache is in use by a call that has not finished: await it first",
            )
        })
    }

    /// The `seq` of `item` (an object), as a sequence of this cache.
    fn item_sequence(&self, item: &JsValue, what: &str) -> Result<SequenceId, JsValue> {
        let seq = field(item, "seq")
            .and_then(|v| v.as_f64())
            .ok_or_else(|| js_error("MissingInput", format!("each {what} needs a numeric seq")))?;
        self.sequence(seq as u32)
    }
}

#[wasm_bindgen]
impl PagedCacheCore {
    /// A new, empty sequence: its number.
    #[wasm_bindgen(js_name = addSequence)]
    pub fn add_sequence(&self) -> Result<u32, JsValue> {
        let id = self.cache_mut()?.add_sequence();
        Ok(self.hand_out(id))
    }

    /// A sequence sharing every token of `seq` (pages shared until written).
    pub fn fork(&self, seq: u32) -> Result<u32, JsValue> {
        let parent = self.sequence(seq)?;
        let id = self.cache_mut()?.fork(parent).js()?;
        Ok(self.hand_out(id))
    }

    /// Ends `seq`: its pages no other sequence holds are free at once.
    /// (`freeSequence`: wasm-bindgen's `free()` releases the object itself.)
    #[wasm_bindgen(js_name = freeSequence)]
    pub fn free_sequence(&self, seq: u32) -> Result<(), JsValue> {
        let id = self.sequence(seq)?;
        self.cache_mut()?.free(id).js()?;
        self.sequences.borrow_mut().remove(&seq);
        Ok(())
    }

    /// Tokens `seq` holds.
    pub fn length(&self, seq: u32) -> Result<u32, JsValue> {
        let id = self.sequence(seq)?;
        Ok(self.cache.borrow().len(id).js()? as u32)
    }

    /// `seq`'s pages in token order.
    #[wasm_bindgen(js_name = blockTable)]
    pub fn block_table(&self, seq: u32) -> Result<Uint32Array, JsValue> {
        let id = self.sequence(seq)?;
        Ok(Uint32Array::from(self.cache.borrow().block_table(id).js()?))
    }

    /// `{pages, pagesInUse, bytes, sequences, onDevice}`.
    pub fn usage(&self) -> JsValue {
        let cache = self.cache.borrow();
        let out = Object::new();
        set(&out, "pages", cache.pages() as f64);
        set(&out, "pagesInUse", cache.pages_in_use() as f64);
        set(&out, "bytes", cache.bytes() as f64);
        set(&out, "sequences", cache.sequences().len() as f64);
        set(&out, "onDevice", cache.on_device());
        set(&out, "storage", cache.storage().name());
        out.into()
    }

    /// Appends `items` (`[{seq, k, v}]`, keys `[kvHeads, n, headDim]` and
    /// values `[kvHeads, n, vHeadDim]`), all or nothing.
    pub fn append(&self, items: JsValue) -> Result<(), JsValue> {
        let items = items.dyn_into::<Array>().map_err(|v| {
            js_error(
                "InvalidOption",
                format!(
                    "append takes an array of {{seq, k, v}}, got {}",
                    convert::type_name(&v)
                ),
            )
        })?;
        let mut read: Vec<(SequenceId, HostTensor, HostTensor)> = Vec::new();
        for item in items.iter() {
            let seq = self.item_sequence(&item, "append item")?;
            let tensor = |key: &str, name: &'static str| {
                let v = field(&item, key).ok_or_else(|| {
                    js_error("MissingInput", format!("each append item needs {key}"))
                })?;
                convert::tensor(name, &v).js()
            };
            read.push((seq, tensor("k", "key")?, tensor("v", "value")?));
        }
        let appends: Vec<_> = read.iter().map(|(s, k, v)| (*s, k, v)).collect();
        self.cache_mut()?.append_many(&appends).js()
    }

    /// Attention of each sequence's new queries (`[{seq, q}]`, Q `[1, Hq, n,
    /// headDim]`: its last n tokens) against its pages; resolves to `[{y,
    /// lse?}]` in the same order.
    // The borrow is held across the call's await on purpose: a change made
    // meanwhile (the library queues none) is refused as a Conflict by
    // `cache_mut`, never a panic, and cloning a host pool per call would
    // copy every page.
    #[allow(clippy::await_holding_refcell_ref)]
    pub async fn attention(&self, queries: JsValue, options: JsValue) -> Result<JsValue, JsValue> {
        let call = convert::call_options(&options)?;
        let queries = queries.dyn_into::<Array>().map_err(|v| {
            js_error(
                "InvalidOption",
                format!(
                    "attention takes an array of {{seq, q}}, got {}",
                    convert::type_name(&v)
                ),
            )
        })?;
        let mut read = Vec::new();
        for item in queries.iter() {
            let seq = self.item_sequence(&item, "query")?;
            let q =
                field(&item, "q").ok_or_else(|| js_error("MissingInput", "each query needs q"))?;
            read.push((seq, convert::tensor("Q", &q).js()?));
        }
        let asked: Vec<_> = read.iter().map(|(s, q)| (*s, q)).collect();
        let cache = self.cache.try_borrow().map_err(|_| {
            js_error(
                "Conflict",
                "the paged cache is being changed: await that first",
            )
        })?;
        let outs = cache
            .attention(&self.engine, &asked, &call.attention)
            .await
            .js()?;
        let results = Array::new();
        for out in outs {
            let result = Object::new();
            set(&result, "y", convert::to_js(&out.y));
            if let Some(lse) = &out.lse {
                set(&result, "lse", convert::to_js(lse));
            }
            results.push(&result);
        }
        Ok(results.into())
    }

    /// `seq`'s keys and values read through its block table: `{k, v}`,
    /// `[1, kvHeads, length, ·]`.
    #[allow(clippy::await_holding_refcell_ref)] // as `attention`'s
    pub async fn read(&self, seq: u32) -> Result<JsValue, JsValue> {
        let id = self.sequence(seq)?;
        let cache = self.cache.try_borrow().map_err(|_| {
            js_error(
                "Conflict",
                "the paged cache is being changed: await that first",
            )
        })?;
        let (k, v) = cache.read(id).await.js()?;
        let out = Object::new();
        set(&out, "k", convert::to_js(&k));
        set(&out, "v", convert::to_js(&v));
        Ok(out.into())
    }
}
