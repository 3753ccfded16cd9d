// The backward pass's row sums (FlashAttention-2's preprocessing): D_i =
// dY_i · Y_i, which every score gradient of row i subtracts (dP - D; it
// equals Σ_j P_ij dP_ij). One invocation per row of Y; rows are numbered
// across the 2D grid so that more than 65535 workgroups work. A NaN in Y (a
// row the forward made NaN) or in dY makes D NaN, and with it the row's
// gradients, as the contract's non-finite rule says.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> d: array<f32>;

const WG: u32 = 64u;

@compute @workgroup_size(WG, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let r = (wid.x + wid.y * nwg.x) * WG + li;
    if (r >= p.rows) {
        return;
    }
    let base = r * p.dv;
    // By quads, (a + b) + (c + d), zeros past Dv: the order in which the dQ
    // and dK/dV kernels sum dP = dY·v, so that dP - D is exactly 0 where a
    // row's P is one-hot (Y = v), as at large logits.
    var sum = 0.0;
    for (var d4 = 0u; d4 < p.dv; d4 += 4u) {
        var prod = vec4<f32>(0.0);
        for (var c = 0u; c < 4u; c++) {
            if (d4 + c < p.dv) {
                prod[c] = dy[base + d4 + c] * y[base + d4 + c];
            }
        }
        sum += (prod.x + prod.y) + (prod.z + prod.w);
    }
    d[r] = sum;
}
