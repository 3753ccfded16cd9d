// The uniform block and bindings of the batched, strided GEMMs (gemm.wgsl,
// gemm_skinny.wgsl): `gemm::Params` in Rust, which tests/shaders.rs checks
// word by word against this block.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    lda: u32,
    ldb: u32,
    ldc: u32,
    tiles_n: u32,
    tiles_m: u32,
    a_offset: u32,
    b_offset: u32,
    c_offset: u32,
    a_stride: u32,
    b_stride: u32,
    c_stride: u32,
    b_batch_base: u32,
    b_batch_div: u32,
    alpha: f32,
    beta: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

// Whether x is the mark -0 (compared as bits) that SKIP_MARKED_A skips.
fn marked(x: f32) -> bool {
    return bitcast<u32>(x) == 0x80000000u;
}
