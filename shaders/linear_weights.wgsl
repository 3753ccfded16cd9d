// Attention weights of linear attention, in place over the scores
// phi(q_i) . phi(k_j) [BH, N, M] (a GEMM of phi(Q) and phi(K)^T):
// w_ij = score_ij / norm_i, where norm_i = phi(q_i) . z_i is the row's
// normaliser from the output kernels; causal, keys after the query get 0.
//
// One invocation per weight; workgroups are numbered linearly across the 2D grid.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
// [BH, N].
@group(0) @binding(1) var<storage, read> norm: array<f32>;
// [BH, N, M]: scores in, weights out.
@group(0) @binding(2) var<storage, read_write> w: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let index = (wid.x + wid.y * nwg.x) * WG + li;
    if (index >= p.rows * p.kv_len) {
        return;
    }
    let j = index % p.kv_len;
    let row = index / p.kv_len;
    let i = row % p.q_len;
    var weight = 0.0;
    if (p.causal == 0u || j <= i) {
        weight = w[index] / norm[row];
    }
    w[index] = weight;
}
