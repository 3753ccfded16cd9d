//! The kernels, one module per family: each holds its variants, their
//! parameter block, pipeline keys, tiles and recording. Where WGSL has no
//! macros and GPU compilers cannot be relied on to unroll, a family's
//! generator writes the kernel's text (registers as named variables, register
//! loops written out), or a template's counted blocks are expanded
//! (`templates`: the matrix-unit kernels); nothing generated is checked in.

pub mod ablation;
pub mod additive;
pub mod attention;
pub mod backward;
pub(crate) mod cache_append;
pub mod ceilings;
pub mod concat;
pub mod convert;
pub mod decode;
pub mod gemm;
pub mod linear;
pub mod mask;
pub mod matrix_units;
pub mod position;
pub mod projection;
pub mod softmax;

use crate::shader::kernel::Kernel;
use crate::shader::key::PipelineKey;

/// Every kernel of the engine, family by family.
pub fn all() -> Vec<Kernel> {
    [
        &gemm::KERNELS[..],
        &attention::KERNELS,
        &backward::KERNELS,
        &decode::KERNELS,
        &softmax::KERNELS,
        &mask::KERNELS,
        &concat::KERNELS,
        &convert::KERNELS,
        &position::KERNELS,
        &projection::KERNELS,
        &cache_append::KERNELS,
        &additive::KERNELS,
        &linear::KERNELS,
        &ceilings::KERNELS,
    ]
    .concat()
}

/// The kernel named `name`, if there is one.
pub fn named(name: &str) -> Option<Kernel> {
    all().into_iter().find(|k| k.name() == name)
}

/// A fingerprint of every kernel's WGSL (FNV-1a, 64 bits, as 16 hex
/// digits): what a tuning cache entry was measured on. Kernels that changed
/// (another webattn version) give another fingerprint, so their old timings
/// no longer choose tiles or paths.
pub fn fingerprint() -> &'static str {
    static PRINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PRINT.get_or_init(|| {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        // Every kernel's source as compiled (variants too, such as f16
        // elements spliced in), but the ceilings', which only the bench runs.
        for kernel in all() {
            if ceilings::KERNELS.contains(&kernel) {
                continue;
            }
            for byte in kernel.source().bytes().chain([0]) {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        format!("{hash:016x}")
    })
}

/// Head dims that stand for every class the planner distinguishes: the
/// smallest, vec4 multiples and not, the common sizes, and the largest the
/// fused kernels take.
pub const HEAD_DIM_CLASSES: [usize; 10] = [1, 3, 4, 8, 63, 64, 65, 128, 200, 256];

/// Workgroup-memory sizes adapters report: WebGPU's default (16 KiB), common
/// desktop GPUs (32 and 48 KiB) and large ones (64 KiB).
pub const WORKGROUP_STORAGE_CLASSES: [u32; 4] = [16 << 10, 32 << 10, 48 << 10, 64 << 10];

/// Every family's representative pipelines, at representative head dims and
/// tile sizes: what the browser test hands to the browser's own shader
/// compiler (stricter than naga: literal ranges, barrier uniformity, the
/// `enable subgroups;` directive).
pub fn variants() -> Vec<PipelineKey> {
    [
        gemm::variants(),
        attention::variants(),
        backward::variants(),
        decode::variants(),
        ceilings::variants(),
        convert::variants(),
        projection::variants(),
        softmax::variants(),
        mask::variants(),
        concat::variants(),
        position::variants(),
        cache_append::variants(),
        linear::variants(),
        additive::variants(),
    ]
    .concat()
}

/// Every pipeline the planner can choose on some adapter: each family's
/// kernels x each override combination it can pick x each head-dim class
/// (and the tile sizes the workgroup-memory classes give), sorted. Larger
/// than [`variants`], which it holds; the shader translation test pushes
/// each through naga's SPIR-V, MSL, HLSL and GLSL writers.
pub fn planned() -> Vec<PipelineKey> {
    let mut keys = [
        variants(),
        gemm::planned(),
        attention::planned(),
        backward::planned(),
        decode::planned(),
    ]
    .concat();
    keys.sort();
    keys.dedup();
    keys
}
