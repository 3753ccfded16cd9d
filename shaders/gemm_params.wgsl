// The uniform block and bindings of the batched, strided GEMMs (gemm.wgsl,
// gemm_skinny.wgsl): the block is written from `kernels::gemm::Params`.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

// Whether x is the mark -0 (compared as bits) that SKIP_MARKED_A skips.
fn marked(x: f32) -> bool {
    return bitcast<u32>(x) == 0x80000000u;
}
