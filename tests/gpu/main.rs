//! The GPU kernels, paths, family and library API against the f64 oracle,
//! in one test binary: one link instead of twenty, and one engine with its
//! compiled pipelines (`common::gpu()`) shared by every module. The tests that
//! run a binary, set the environment or measure the device stay apart.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod attention;
mod backward;
mod chunks;
mod coop_spirv;
mod decode_stream;
mod errors;
mod f16;
mod family_additive;
mod family_linear;
mod family_mha;
mod family_position;
mod fuzz;
mod gemm;
mod kv_cache;
mod paged;
mod plans;
mod prepared;
mod softmax;
mod split;
mod tiled;
mod translation;
mod worked_examples;
