// The device's memory-bandwidth ceiling: a vec4 copy of a buffer much larger
// than any cache, as the FMA ceiling is for arithmetic. Each invocation copies
// every `stride`-th vec4 from its index (a grid-stride loop), so consecutive
// invocations touch consecutive 16-byte words: coalesced loads and stores.
// Bytes moved per run: 2 x 16 x count (read and write).

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

override WORKGROUP: u32 = 256u;

@compute @workgroup_size(WORKGROUP, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let first = (wid.x + wid.y * nwg.x) * WORKGROUP + li;
    // A 2D grid may launch a few workgroups more than asked: they do nothing,
    // so no element is copied twice.
    if first >= p.stride {
        return;
    }
    for (var i = first; i < p.count; i += p.stride) {
        dst[i] = src[i];
    }
}
