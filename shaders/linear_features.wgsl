// The feature map of linear attention, phi(x) = elu(x) + 1: x + 1 for x > 0,
// exp(x) otherwise. It is positive everywhere, so every score phi(q) . phi(k)
// and every normaliser phi(q) . z is positive.
//
// One invocation per element; workgroups are numbered linearly across the 2D
// grid so large tensors need no second dispatch.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> phi: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let index = (wid.x + wid.y * nwg.x) * WG + li;
    if (index >= p.len) {
        return;
    }
    let value = x[index];
    // exp of a clamped argument: the positive branch is discarded anyway, and
    // an overflowing exp is not left for select to carry.
    phi[index] = select(exp(min(value, 0.0)), value + 1.0, value > 0.0);
}
