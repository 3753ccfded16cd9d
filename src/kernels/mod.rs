//! The kernels, one module per family: each holds its variants, their
//! parameter block, pipeline keys, tiles and recording. Where WGSL has no
//! macros and GPU compilers cannot be relied on to unroll, a family's
//! generator writes the kernel's text (registers as named variables, register
//! loops written out), or a template's counted blocks are expanded
//! (`templates`: the matrix-unit kernels); nothing generated is checked in.

pub mod additive;
pub mod attention;
pub(crate) mod cache_append;
pub(crate) mod ceilings;
pub mod concat;
pub mod convert;
pub mod decode;
pub mod gemm;
pub mod linear;
pub mod mask;
pub mod matrix_units;
pub mod position;
pub mod projection;
pub mod registry;
pub mod softmax;
pub(crate) mod templates;
pub mod uniform;
