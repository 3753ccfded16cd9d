// present = concat(past, new) along the sequence axis of [B * H, len, width] tensors.
//
// One invocation per output element; workgroups are numbered linearly across
// the 2D grid so large caches need no second dispatch.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> past: array<f32>;
@group(0) @binding(2) var<storage, read> new_rows: array<f32>;
@group(0) @binding(3) var<storage, read_write> present: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let index = (wid.x + wid.y * nwg.x) * WG + li;
    if (index >= p.total) {
        return;
    }
    let len = p.past_len + p.new_len;
    let d = index % p.width;
    let t = (index / p.width) % len;
    let head = index / (p.width * len);
    if (t < p.past_len) {
        present[index] = past[(head * p.past_len + t) * p.width + d];
    } else {
        present[index] = new_rows[(head * p.new_len + t - p.past_len) * p.width + d];
    }
}
