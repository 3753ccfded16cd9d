//! The device: adapter and device acquisition, the capability profile, the
//! pipeline cache, buffers (one or in chunks), the recorder of dispatches and
//! copies, timestamps and work counters. Nothing here chooses a kernel.

pub(crate) mod arena;
pub mod buffer;
pub mod capabilities;
pub(crate) mod chunks;
pub mod context;
pub mod counters;
pub mod measurement;
pub mod pipeline;
pub mod profile;
pub(crate) mod recorder;
pub(crate) mod scope;
#[cfg(not(target_arch = "wasm32"))]
pub mod spirv;
pub(crate) mod staging;
