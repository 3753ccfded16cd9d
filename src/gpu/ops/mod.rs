//! One module per kernel: its parameter struct, preconditions and dispatch geometry.

pub mod concat;
pub mod gemm;
pub mod mask;
pub mod softmax;
