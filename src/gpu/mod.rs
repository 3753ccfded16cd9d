//! The GPU backend: device acquisition, the kernel registry, the pipeline
//! cache, buffers, and the kernels' dispatch code.

pub(crate) mod arena;
pub mod buffer;
pub mod capabilities;
pub mod choice;
pub(crate) mod chunks;
pub mod context;
pub mod counters;
pub(crate) mod fused;
pub(crate) mod generators;
pub(crate) mod half;
pub mod kernels;
pub(crate) mod kv;
pub mod ops;
pub mod phases;
pub mod pipeline;
pub mod plan;
pub mod planner;
pub mod profile;
pub(crate) mod recorder;
pub mod registry;
#[cfg(not(target_arch = "wasm32"))]
pub mod spirv;
pub(crate) mod split;
pub(crate) mod staging;
pub(crate) mod unfused;
pub mod uniform;
