//! # webattn
//!
//! Attention on WebGPU compute shaders, implementing the ONNX `Attention`
//! operator (opsets 23 to 25), with an f64 CPU oracle that checks every GPU
//! result and serves as the backend when no adapter exists.
//!
//! The same WGSL kernels run natively (Vulkan, Metal, DX12, GL through wgpu)
//! and in the browser (wasm + WebGPU).
//!
//! ```no_run
//! use webattn::{AttentionInputs, AttentionOptions, Engine, HostTensor};
//!
//! # fn main() -> webattn::Result<()> {
//! let engine = Engine::new_blocking(); // a GPU if there is one, else the CPU backend (also over a CPU adapter such as lavapipe)
//! let q = HostTensor::new([1, 8, 128, 64], vec![0.1; 8 * 128 * 64])?;
//! let k = HostTensor::new([1, 2, 128, 64], vec![0.2; 2 * 128 * 64])?;
//! let v = HostTensor::new([1, 2, 128, 32], vec![0.3; 2 * 128 * 32])?;
//! let options = AttentionOptions { is_causal: true, ..Default::default() };
//! let out = engine.attention_host_blocking(&AttentionInputs::new(&q, &k, &v), &options)?;
//! assert_eq!(out.y.shape(), &[1, 8, 128, 32]);
//! # Ok(()) }
//! ```
//!
//! See [`AttentionOptions`] for the contract, and `ARCHITECTURE.md` for the
//! path from a call to a dispatch.

#![warn(missing_docs)]
// In the browser wgpu's handles are !Send (one thread); the Arcs that share them
// between tensors natively are harmless there.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

pub mod conformance;
pub mod cpu;
pub mod device;
mod device_tensor;
mod engine;
mod error;
pub mod family;
mod gradients;
pub(crate) mod int8;
pub mod kernels;
pub mod kv_cache;
pub mod layout;
pub mod limits;
pub mod measure;
#[cfg(feature = "npy")]
pub mod npy;
mod options;
pub mod paged;
pub mod plan;
mod problem;
pub mod rng;
pub mod run;
pub mod shader;
mod tensor;
pub mod train;
pub mod tuning;

pub use device::capabilities::{AdapterSummary, Capabilities, KernelLimits};
pub use device::context::{GpuContext, PowerPreference};
pub use device::counters::WorkCounts;
pub use device_tensor::{Mask, Tensor};
pub use engine::{
    BackendKind, BackendPreference, CallStats, Engine, EngineOptions, PreparedAttention,
};
pub use error::{Error, Result};
pub use gradients::{check_backward, AttentionGradients, BackwardInputs, GradientOptions};
pub use kernels::projection::WeightStorage;
pub use kv_cache::KvCache;
pub use limits::{DeviceLimits, LimitOverride, LimitsPreset};
pub use options::{
    alibi_slopes, AttentionOptions, KernelPath, MatrixUnits, Precision, QkMatmulOutputMode,
    RuntimeChecks,
};
pub use paged::{
    PageStorage, PagedKvCache, PagedLayout, PagedPlan, RaggedInputs, RaggedOutputs, SequenceId,
};
pub use plan::overrides::DecodeKernelChoice;
pub use plan::overrides::FusedKernelChoice;
pub use plan::CallPlan;
pub use problem::{
    validate, AttentionDims, AttentionInputs, AttentionOutputs, F16Inputs, MaskLayout, MaskRef,
    TensorRef,
};
pub use tensor::{lengths_from_le_bytes, DType, HostMask, HostTensor};
/// The wgpu this crate is built on, so callers name the same `Limits` and `Adapter` types.
pub use wgpu;

/// The README's code, compiled as a doctest so it stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
