// Batched, strided GEMM: C[z] = alpha * op(A[z]) * op(B[z]) + beta * C[z].
//
// op(A) is M x K and op(B) is K x N, both row-major with leading dimensions
// lda/ldb. TRANS_A means A is stored K x M; TRANS_B means B is stored N x K
// (so Q * K^T is TRANS_B with K stored [Nk, Dk]).
//
// Batch z reads A at a_offset + z * a_stride, C at c_offset + z * c_stride and
// B at b_offset + ((b_batch_base + z) / b_batch_div) * b_stride: the divisor lets
// several query heads share one key/value head (grouped-query attention).
//
// A workgroup of 8 x 8 invocations computes a 64 x 64 tile of C, stepping
// through K in slices of 16 held in workgroup memory as vec4 columns. Each
// invocation owns 8 rows x 8 columns of the tile (rows 4*ty.. and 32+4*ty..,
// columns 4*tx.. and 32+4*tx..) in 16 named vec4 accumulators, so neighbouring
// invocations read neighbouring vec4s of the B slice and the same vec4 of the
// A slice. Any M, N, K works: loads outside the matrices read zero and stores
// outside are skipped.
//
// Workgroups are numbered linearly (x + y * num_workgroups.x) so a dispatch
// can exceed 65535 workgroups per dimension; the host splits the count.

override TRANS_A: bool = false;
override TRANS_B: bool = false;
// Skip every term whose A value is -0 (the mark, as bits), so that -0 * NaN
// or -0 * inf in B adds nothing: attention's P V, where a key not attended
// has probability -0 and its V row may hold anything, while an attended key
// whose probability is +0 still multiplies its row (0 * inf is NaN, as in
// PyTorch; the non-finite rule of AttentionOptions).
override SKIP_MARKED_A: bool = false;

// #include gemm_params.wgsl

const TILE: u32 = 64u;
const TILE_K: u32 = 16u;
// vec4 slots per k-row of a tile slice (TILE / 4).
const SLOTS: u32 = 16u;

// [TILE_K][TILE / 4]: slot kk * 16 + q holds rows 4q..4q+3 of op(A) at column kk.
var<workgroup> a_tile: array<vec4<f32>, 256>;
// [TILE_K][TILE / 4]: slot kk * 16 + q holds columns 4q..4q+3 of op(B) at row kk.
var<workgroup> b_tile: array<vec4<f32>, 256>;

fn a_at(base: u32, row: u32, col: u32) -> f32 {
    if (row >= p.m || col >= p.k) {
        return 0.0;
    }
    if (TRANS_A) {
        return a[base + col * p.lda + row];
    }
    return a[base + row * p.lda + col];
}

fn b_at(base: u32, row: u32, col: u32) -> f32 {
    if (row >= p.k || col >= p.n) {
        return 0.0;
    }
    if (TRANS_B) {
        return b[base + col * p.ldb + row];
    }
    return b[base + row * p.ldb + col];
}

fn store1(index: u32, value: f32) {
    if (p.beta == 0.0) {
        c[index] = p.alpha * value;
    } else {
        c[index] = p.alpha * value + p.beta * c[index];
    }
}

fn store4(base: u32, row: u32, col: u32, v: vec4<f32>) {
    if (row >= p.m) {
        return;
    }
    let start = base + row * p.ldc + col;
    if (col < p.n) { store1(start, v.x); }
    if (col + 1u < p.n) { store1(start + 1u, v.y); }
    if (col + 2u < p.n) { store1(start + 2u, v.z); }
    if (col + 3u < p.n) { store1(start + 3u, v.w); }
}

@compute @workgroup_size(8, 8, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let flat = wid.x + wid.y * nwg.x;
    let tiles = p.tiles_m * p.tiles_n;
    let z = flat / tiles;
    if (z >= p.batch) {
        return;
    }
    let tile = flat % tiles;
    let row0 = (tile / p.tiles_n) * TILE;
    let col0 = (tile % p.tiles_n) * TILE;
    let a_base = p.a_offset + z * p.a_stride;
    let b_base = p.b_offset + ((p.b_batch_base + z) / p.b_batch_div) * p.b_stride;
    let c_base = p.c_offset + z * p.c_stride;
    let tx = lid.x;
    let ty = lid.y;

    var acc00 = vec4<f32>(0.0);
    var acc01 = vec4<f32>(0.0);
    var acc10 = vec4<f32>(0.0);
    var acc11 = vec4<f32>(0.0);
    var acc20 = vec4<f32>(0.0);
    var acc21 = vec4<f32>(0.0);
    var acc30 = vec4<f32>(0.0);
    var acc31 = vec4<f32>(0.0);
    var acc40 = vec4<f32>(0.0);
    var acc41 = vec4<f32>(0.0);
    var acc50 = vec4<f32>(0.0);
    var acc51 = vec4<f32>(0.0);
    var acc60 = vec4<f32>(0.0);
    var acc61 = vec4<f32>(0.0);
    var acc70 = vec4<f32>(0.0);
    var acc71 = vec4<f32>(0.0);

    let k_tiles = (p.k + TILE_K - 1u) / TILE_K;
    for (var kt = 0u; kt < k_tiles; kt++) {
        let k0 = kt * TILE_K;
        for (var s = 0u; s < 4u; s++) {
            let slot = s * 64u + li;
            let kk = k0 + slot / SLOTS;
            let q = (slot % SLOTS) * 4u;
            a_tile[slot] = vec4<f32>(
                a_at(a_base, row0 + q, kk),
                a_at(a_base, row0 + q + 1u, kk),
                a_at(a_base, row0 + q + 2u, kk),
                a_at(a_base, row0 + q + 3u, kk),
            );
            b_tile[slot] = vec4<f32>(
                b_at(b_base, kk, col0 + q),
                b_at(b_base, kk, col0 + q + 1u),
                b_at(b_base, kk, col0 + q + 2u),
                b_at(b_base, kk, col0 + q + 3u),
            );
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TILE_K; kk++) {
            let a0 = a_tile[kk * SLOTS + ty];
            let a1 = a_tile[kk * SLOTS + ty + 8u];
            let b0 = b_tile[kk * SLOTS + tx];
            let b1 = b_tile[kk * SLOTS + tx + 8u];
            if (SKIP_MARKED_A) {
                acc00 += select(a0.x * b0, vec4<f32>(0.0), marked(a0.x));
                acc01 += select(a0.x * b1, vec4<f32>(0.0), marked(a0.x));
                acc10 += select(a0.y * b0, vec4<f32>(0.0), marked(a0.y));
                acc11 += select(a0.y * b1, vec4<f32>(0.0), marked(a0.y));
                acc20 += select(a0.z * b0, vec4<f32>(0.0), marked(a0.z));
                acc21 += select(a0.z * b1, vec4<f32>(0.0), marked(a0.z));
                acc30 += select(a0.w * b0, vec4<f32>(0.0), marked(a0.w));
                acc31 += select(a0.w * b1, vec4<f32>(0.0), marked(a0.w));
                acc40 += select(a1.x * b0, vec4<f32>(0.0), marked(a1.x));
                acc41 += select(a1.x * b1, vec4<f32>(0.0), marked(a1.x));
                acc50 += select(a1.y * b0, vec4<f32>(0.0), marked(a1.y));
                acc51 += select(a1.y * b1, vec4<f32>(0.0), marked(a1.y));
                acc60 += select(a1.z * b0, vec4<f32>(0.0), marked(a1.z));
                acc61 += select(a1.z * b1, vec4<f32>(0.0), marked(a1.z));
                acc70 += select(a1.w * b0, vec4<f32>(0.0), marked(a1.w));
                acc71 += select(a1.w * b1, vec4<f32>(0.0), marked(a1.w));
            } else {
                acc00 += a0.x * b0;
                acc01 += a0.x * b1;
                acc10 += a0.y * b0;
                acc11 += a0.y * b1;
                acc20 += a0.z * b0;
                acc21 += a0.z * b1;
                acc30 += a0.w * b0;
                acc31 += a0.w * b1;
                acc40 += a1.x * b0;
                acc41 += a1.x * b1;
                acc50 += a1.y * b0;
                acc51 += a1.y * b1;
                acc60 += a1.z * b0;
                acc61 += a1.z * b1;
                acc70 += a1.w * b0;
                acc71 += a1.w * b1;
            }
        }
        workgroupBarrier();
    }

    store4(c_base, row0 + 4u * ty + 0u, col0 + 4u * tx, acc00);
    store4(c_base, row0 + 4u * ty + 0u, col0 + 32u + 4u * tx, acc01);
    store4(c_base, row0 + 4u * ty + 1u, col0 + 4u * tx, acc10);
    store4(c_base, row0 + 4u * ty + 1u, col0 + 32u + 4u * tx, acc11);
    store4(c_base, row0 + 4u * ty + 2u, col0 + 4u * tx, acc20);
    store4(c_base, row0 + 4u * ty + 2u, col0 + 32u + 4u * tx, acc21);
    store4(c_base, row0 + 4u * ty + 3u, col0 + 4u * tx, acc30);
    store4(c_base, row0 + 4u * ty + 3u, col0 + 32u + 4u * tx, acc31);
    store4(c_base, row0 + 32u + 4u * ty + 0u, col0 + 4u * tx, acc40);
    store4(c_base, row0 + 32u + 4u * ty + 0u, col0 + 32u + 4u * tx, acc41);
    store4(c_base, row0 + 32u + 4u * ty + 1u, col0 + 4u * tx, acc50);
    store4(c_base, row0 + 32u + 4u * ty + 1u, col0 + 32u + 4u * tx, acc51);
    store4(c_base, row0 + 32u + 4u * ty + 2u, col0 + 4u * tx, acc60);
    store4(c_base, row0 + 32u + 4u * ty + 2u, col0 + 32u + 4u * tx, acc61);
    store4(c_base, row0 + 32u + 4u * ty + 3u, col0 + 4u * tx, acc70);
    store4(c_base, row0 + 32u + 4u * ty + 3u, col0 + 32u + 4u * tx, acc71);
}
