// Linear attention's running state, swept over one range of keys.
//
// For batch-head bh the state is S = sum_j phi(k_j) v_j^T (Dk x Dv) and the
// normaliser z = sum_j phi(k_j) (Dk), over the keys seen so far. Invocation
// (bh, c) owns column c of S and its own copy of z, laid out [BH, 2, Dk, Dv]
// (S, then z repeated per column) so neighbouring invocations touch
// neighbouring words. The state buffer starts zeroed; each dispatch adds keys
// [start, end) in order, so drivers that cap an invocation's loop iterations
// get several dispatches that carry the state between them.
//
// Causal (N == M): right after adding key i the invocation emits output row i
// from the prefix state, o_i[c] = phi(q_i) . S[:, c] / phi(q_i) . z, and
// invocation c = 0 writes the normaliser phi(q_i) . z that the weights kernel
// divides by. Not causal, rows are emitted afterwards by linear_output.wgsl.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
// phi(Q) [BH, N, Dk], phi(K) [BH, M, Dk], V [BH, M, Dv].
@group(0) @binding(1) var<storage, read> phi_q: array<f32>;
@group(0) @binding(2) var<storage, read> phi_k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
// [BH, 2, Dk, Dv].
@group(0) @binding(4) var<storage, read_write> state: array<f32>;
// Y [BH, N, Dv] and the normalisers [BH, N] (causal only).
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<storage, read_write> norm: array<f32>;

const WG: u32 = 64u;

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let index = (wid.x + wid.y * nwg.x) * WG + li;
    if (index >= p.heads * p.dv) {
        return;
    }
    let bh = index / p.dv;
    let c = index % p.dv;
    let s_base = bh * 2u * p.dk * p.dv + c;
    let z_base = s_base + p.dk * p.dv;
    let causal = p.causal != 0u;

    for (var j = p.start; j < p.end; j++) {
        let key = bh * p.kv_len + j;
        let vj = v[key * p.dv + c];
        let k_base = key * p.dk;
        if (causal) {
            let row = bh * p.q_len + j;
            let q_base = row * p.dk;
            var num = 0.0;
            var den = 0.0;
            for (var d = 0u; d < p.dk; d++) {
                let f = phi_k[k_base + d];
                let s = state[s_base + d * p.dv] + f * vj;
                let z = state[z_base + d * p.dv] + f;
                state[s_base + d * p.dv] = s;
                state[z_base + d * p.dv] = z;
                let fq = phi_q[q_base + d];
                num += fq * s;
                den += fq * z;
            }
            y[row * p.dv + c] = num / den;
            if (c == 0u) {
                norm[row] = den;
            }
        } else {
            for (var d = 0u; d < p.dk; d++) {
                let f = phi_k[k_base + d];
                state[s_base + d * p.dv] += f * vj;
                state[z_base + d * p.dv] += f;
            }
        }
    }
}
