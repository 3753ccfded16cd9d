//! The kernels whose WGSL is written by Rust rather than by hand: WGSL has
//! no macros and no loop unrolling a GPU compiler can be relied on for, and
//! an array in private memory indexed by a loop variable is slow on GPUs, so
//! these generators write every register as a named variable and every
//! register loop out (`attention_tiled`, `attention_sg`, `gemm_sg`, the
//! streaming decode kernel), or expand a template's counted blocks (`coop`:
//! the matrix-unit kernels).
//!
//! This is the one way variants are made: a generator here writes a file's
//! text, [`super::registry::Kernel::source`] splices in its `// #include`
//! fragments and slots, and the pipeline's override constants specialise it
//! (`RQ`, `RK`, `DVT`, ... fold the generated guards when the pipeline is
//! made). Nothing generated is checked in: the engine makes each text once,
//! the first time a kernel's source is asked for.

pub(crate) mod attention_decode_stream;
pub(crate) mod attention_sg;
pub(crate) mod attention_tiled;
pub(crate) mod coop;
pub(crate) mod gemm_sg;
