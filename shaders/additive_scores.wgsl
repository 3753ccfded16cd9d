// Additive (Bahdanau) attention scores, without the [Nq, Nk, d_a] tensor.
//
//   e[b, i, j] = scale * sum_a v[a] * tanh(A[b, i, a] + Bm[b, j, a])
//
// where A = S W1ᵀ ([B * Nq, d_a]) and Bm = H W2ᵀ ([B * Nk, d_a]) were computed
// beforehand by the GEMM, both packed row-major. Keys j >= lengths[b] (source
// padding) get MASKED instead, for the softmax to skip.
//
// One workgroup computes an 8 x 8 tile of scores of one batch entry, one
// invocation per score. The tile's 8 rows of A and 8 rows of Bm pass through
// workgroup memory in slices of 32 values of `a`; each invocation sums its
// score over `a` in order. An invocation runs 37 loop iterations per slice,
// which the host checks against the driver's loop budget.
//
// Workgroups are numbered linearly across the 2D grid so large dispatches work.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a_proj: array<f32>;
@group(0) @binding(2) var<storage, read> b_proj: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> lengths: array<u32>;
@group(0) @binding(5) var<storage, read_write> scores: array<f32>;

const TILE: u32 = 8u;
const CHUNK: u32 = 32u;
const WG: u32 = 64u;
const MASKED: f32 = -0x1.fffffep+127f;

var<workgroup> a_tile: array<f32, 256>;
var<workgroup> b_tile: array<f32, 256>;

// tanh accurate to a few ulp over the whole range: an odd Taylor polynomial
// near zero (where 1 - 2/(e^2x + 1) cancels) and the exponential form beyond,
// with the argument clamped so e^2x cannot overflow (tanh(10) rounds to 1).
fn accurate_tanh(x: f32) -> f32 {
    let ax = abs(x);
    if (ax < 0.4) {
        let z = x * x;
        let poly = 1.0 + z * (-1.0 / 3.0 + z * (2.0 / 15.0 + z * (-17.0 / 315.0
            + z * (62.0 / 2835.0 + z * (-1382.0 / 155925.0 + z * (21844.0 / 6081075.0))))));
        return x * poly;
    }
    let e = exp(2.0 * min(ax, 10.0));
    let t = 1.0 - 2.0 / (e + 1.0);
    return select(t, -t, x < 0.0);
}

@compute @workgroup_size(8, 8, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let tile = wid.x + wid.y * nwg.x;
    let tiles_per_batch = p.tiles_q * p.tiles_k;
    // Uniform across the workgroup, so every barrier below stays uniform.
    if (tile >= p.batch * tiles_per_batch) {
        return;
    }
    let b = tile / tiles_per_batch;
    let t = tile % tiles_per_batch;
    let i0 = (t / p.tiles_k) * TILE;
    let j0 = (t % p.tiles_k) * TILE;
    let a_row0 = b * p.q_len + i0;
    let b_row0 = b * p.k_len + j0;
    let i = i0 + lid.y;
    let j = j0 + lid.x;
    let inside = i < p.q_len && j < p.k_len;

    var acc = 0.0;
    for (var a0 = 0u; a0 < p.d_a; a0 += CHUNK) {
        let width = min(CHUNK, p.d_a - a0);
        // Stage 8 rows x `width` values of A and of Bm (zeros beyond the edges).
        for (var e = li; e < TILE * CHUNK; e += WG) {
            let r = e / CHUNK;
            let c = e % CHUNK;
            var x = 0.0;
            var y = 0.0;
            if (c < width) {
                if (i0 + r < p.q_len) {
                    x = a_proj[(a_row0 + r) * p.d_a + a0 + c];
                }
                if (j0 + r < p.k_len) {
                    y = b_proj[(b_row0 + r) * p.d_a + a0 + c];
                }
            }
            a_tile[e] = x;
            b_tile[e] = y;
        }
        workgroupBarrier();
        if (inside) {
            for (var c = 0u; c < width; c++) {
                acc += v[a0 + c] * accurate_tanh(a_tile[lid.y * CHUNK + c] + b_tile[lid.x * CHUNK + c]);
            }
        }
        workgroupBarrier();
    }
    if (inside) {
        let index = (b * p.q_len + i) * p.k_len + j;
        scores[index] = select(MASKED, acc * p.scale, j < lengths[b]);
    }
}
