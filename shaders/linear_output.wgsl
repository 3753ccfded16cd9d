// Output rows of non-causal linear attention from the final state:
// o_i[c] = phi(q_i) . S[:, c] / phi(q_i) . z, with S and z as
// linear_scan.wgsl leaves them ([BH, 2, Dk, Dv]). Invocation c = 0 of each row
// also writes the normaliser phi(q_i) . z, which the weights kernel divides by.
//
// One invocation per output element (bh, i, c); the only loop runs over Dk.
// Workgroups are numbered linearly across the 2D grid.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
// phi(Q) [BH, N, Dk].
@group(0) @binding(1) var<storage, read> phi_q: array<f32>;
// [BH, 2, Dk, Dv].
@group(0) @binding(2) var<storage, read> state: array<f32>;
// Y [BH, N, Dv] and the normalisers [BH, N].
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> norm: array<f32>;

const WG: u32 = 64u;

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let index = (wid.x + wid.y * nwg.x) * WG + li;
    if (index >= p.heads * p.q_len * p.dv) {
        return;
    }
    let c = index % p.dv;
    let row = index / p.dv;
    let bh = row / p.q_len;
    let s_base = bh * 2u * p.dk * p.dv + c;
    let z_base = s_base + p.dk * p.dv;
    let q_base = row * p.dk;
    var num = 0.0;
    var den = 0.0;
    for (var d = 0u; d < p.dk; d++) {
        let fq = phi_q[q_base + d];
        num += fq * state[s_base + d * p.dv];
        den += fq * state[z_base + d * p.dv];
    }
    y[index] = num / den;
    if (c == 0u) {
        norm[row] = den;
    }
}
