//! Kernel text and identity, below the device and the kernels: a kernel's
//! definition and handle (`kernel.rs`), its pipeline key (`key.rs`), the
//! parameter blocks written once in Rust and spliced into the WGSL as
//! `struct Params` (`uniform.rs`), the `// #include` fragments and slots
//! (`text.rs`) and the matrix-unit kernels' template language
//! (`template.rs`). Nothing here knows a kernel family.

pub mod kernel;
pub mod key;
pub(crate) mod template;
pub mod text;
pub mod uniform;
