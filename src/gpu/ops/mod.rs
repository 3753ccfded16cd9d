//! One module per kernel: its parameter struct, preconditions and dispatch geometry.

pub mod additive;
pub(crate) mod cache_append;
pub mod concat;
pub mod convert;
pub mod coop;
pub mod decode;
pub mod fused;
pub mod gemm;
pub mod gemm_packed;
pub mod linear;
pub mod mask;
pub mod position;
pub mod projection;
pub(crate) mod rules;
pub mod softmax;
pub mod tiled;
