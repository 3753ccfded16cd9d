// Batched, strided GEMM on the matrix units (cooperative matrices):
// C[z] = alpha * op(A[z]) * op(B[z]) + beta * C[z], with op(A) and op(B)
// rounded to f16 and the products accumulated in f32 (Precision::Fast).
//
// The contract is gemm.wgsl's: the same uniforms and bindings, TRANS_A,
// TRANS_B, SKIP_MARKED_A, offsets, strides and b_batch_div; any M, N, K.
//
// A workgroup of 4 subgroups of SG invocations computes a BT x BT tile of C
// (BT = 4 * CM, CM the matrix size of the COOP block below). Each subgroup
// owns a 2 x 2 block of CM x CM accumulators (a quadrant of the tile) for the
// whole K loop. K is stepped in slices of BKK: op(A)'s BT x BKK slice and
// op(B)'s BKK x BT slice are staged in workgroup memory as f16 (zeros
// outside the matrices), then each subgroup loads its operands from there and
// multiplies.
//
// Staging reads storage as vec4s where the host found the matrix aligned
// (VEC_A, VEC_B in p.vec_ab: leading dimension, offset and batch stride all
// multiples of 4) and the vec4 lies inside it, else element by element; each
// invocation reads V vec4s of each operand per slice, consecutive ones along
// the stored rows. The next slice's vec4s are read into registers before the
// current slice is multiplied, so their latency hides behind the products.
//
// SKIP_MARKED_A (attention's P V): a -0 in A (the mark of a key not
// attended, as bits) must not multiply a NaN or an infinity in B, while any
// other value of A must, +0 and values that round to zero in f16 included
// (0 * inf is NaN, as in PyTorch). A slice of B that holds a non-finite value
// (after rounding to f16) is multiplied in scalar code instead, with A as
// stored (f32), skipping the terms whose A is marked, into workgroup memory,
// and added to the accumulators from there.
//
// PROBABILITIES (attention's P V): A holds values in [0, 1], staged times
// 2^14 so that small probabilities keep f16's 11 bits instead of becoming
// subnormal; the epilogue divides by 2^14 (exact).
//
// The epilogue goes through workgroup memory too: each subgroup stores its
// accumulators there, and every invocation writes its share of the tile to C
// with the bounds and beta applied (beta = 0 ignores C's contents).
//
// Matrix operations run at subgroup scope in uniform control flow: every
// loop bound and branch around them depends on uniforms and constants only.

enable f16;
enable wgpu_cooperative_matrix;

// COOP BEGIN
alias MatA = coop_mat16x16<f16, A>;
alias MatB = coop_mat16x16<f16, B>;
alias MatC = coop_mat16x16<f32, C>;
const CM: u32 = 16u;
// COOP END

override TRANS_A: bool = false;
override TRANS_B: bool = false;
override SKIP_MARKED_A: bool = false;
override PROBABILITIES: bool = false;
// The adapter's (fixed) subgroup width; the workgroup is 4 subgroups.
override SG: u32 = 32u;

const BT: u32 = 4u * CM;
const BKK: u32 = 32u;
// vec4s of each operand's slice per invocation (the host keeps SG within
// CM / 2 ..= 8 * CM, so 1 <= V <= MAXV).
override V: u32 = 8u * CM / SG;
const MAXV: u32 = 16u;
const VEC_A: u32 = 1u;
const VEC_B: u32 = 2u;
// Row strides of the staged slices and of the C tile, padded by 16 bytes so
// rows start 16-byte aligned on different banks.
const AS: u32 = BKK + 8u;
const BS: u32 = BT + 8u;
const CS: u32 = BT + 4u;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    lda: u32,
    ldb: u32,
    ldc: u32,
    tiles_n: u32,
    tiles_m: u32,
    a_offset: u32,
    b_offset: u32,
    c_offset: u32,
    a_stride: u32,
    b_stride: u32,
    c_stride: u32,
    b_batch_base: u32,
    b_batch_div: u32,
    alpha: f32,
    beta: f32,
    // VEC_A | VEC_B: which operands may be read as vec4s.
    vec_ab: u32,
}

// A and B twice each: an f32 view and a vec4 view of one buffer.
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> c: array<f32>;

// op(A)'s slice, row-major BT x BKK; op(B)'s slice, row-major BKK x BT.
var<workgroup> a_s: array<f16, BT * AS>;
var<workgroup> b_s: array<f16, BKK * BS>;
// The C tile (epilogue) or a slice's scalar product (SKIP_MARKED_A), row-major.
var<workgroup> c_s: array<f32, BT * CS>;
// Whether the staged slice of B holds a non-finite value (element 0), in a
// 16-byte array: every workgroup variable here is a multiple of 16 bytes.
// The matrix loads of f16 tiles need 16-byte aligned rows, and a driver
// places workgroup variables as it likes: with a lone u32 among them,
// NVIDIA's left the tiles off that alignment and every product through them
// came out wrong (an H200, driver 580; examples/coop_probe.rs narrowed it
// down; lavapipe does not care). tests/coop_spirv.rs keeps the rule.
var<workgroup> b_bad: array<u32, 4>;
// Zeros the accumulators start from.
var<workgroup> zero_s: array<f32, CM * CM>;

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

fn non_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) >= 0x7f800000u;
}

// Vec4 slot s of op(A)'s slice at (row0, k0): four consecutive values of a
// stored row (along K, or along M when A is stored transposed).
fn a_slot(base: u32, row0: u32, k0: u32, s: u32) -> vec4<f32> {
    var r: u32;
    var kk: u32;
    var run_ok: bool;
    var at: u32;
    if (TRANS_A) {
        kk = s / (BT / 4u);
        r = (s % (BT / 4u)) * 4u;
        run_ok = k0 + kk < p.k && row0 + r + 4u <= p.m;
        at = base + (k0 + kk) * p.lda + row0 + r;
    } else {
        r = s / (BKK / 4u);
        kk = (s % (BKK / 4u)) * 4u;
        run_ok = row0 + r < p.m && k0 + kk + 4u <= p.k;
        at = base + (row0 + r) * p.lda + k0 + kk;
    }
    if ((p.vec_ab & VEC_A) != 0u && run_ok) {
        return a4[at / 4u];
    }
    if (TRANS_A) {
        return vec4<f32>(
            a_at(base, row0 + r, k0 + kk),
            a_at(base, row0 + r + 1u, k0 + kk),
            a_at(base, row0 + r + 2u, k0 + kk),
            a_at(base, row0 + r + 3u, k0 + kk),
        );
    }
    return vec4<f32>(
        a_at(base, row0 + r, k0 + kk),
        a_at(base, row0 + r, k0 + kk + 1u),
        a_at(base, row0 + r, k0 + kk + 2u),
        a_at(base, row0 + r, k0 + kk + 3u),
    );
}

// Stores slot s of op(A)'s slice, scaled and rounded to f16.
fn a_put(s: u32, v: vec4<f32>, scale: f32) {
    let h = vec4<f16>(scale * v);
    if (TRANS_A) {
        let kk = s / (BT / 4u);
        let r = (s % (BT / 4u)) * 4u;
        // (Written out: a loop would carry naga's loop counter.)
        a_s[r * AS + kk] = h.x;
        a_s[(r + 1u) * AS + kk] = h.y;
        a_s[(r + 2u) * AS + kk] = h.z;
        a_s[(r + 3u) * AS + kk] = h.w;
    } else {
        let r = s / (BKK / 4u);
        let kk = (s % (BKK / 4u)) * 4u;
        let at = r * AS + kk;
        a_s[at] = h.x;
        a_s[at + 1u] = h.y;
        a_s[at + 2u] = h.z;
        a_s[at + 3u] = h.w;
    }
}

// Vec4 slot s of op(B)'s slice at (k0, col0): four consecutive values of a
// stored row (along N, or along K when B is stored transposed).
fn b_slot(base: u32, k0: u32, col0: u32, s: u32) -> vec4<f32> {
    var kk: u32;
    var cc: u32;
    var run_ok: bool;
    var at: u32;
    if (TRANS_B) {
        cc = s / (BKK / 4u);
        kk = (s % (BKK / 4u)) * 4u;
        run_ok = col0 + cc < p.n && k0 + kk + 4u <= p.k;
        at = base + (col0 + cc) * p.ldb + k0 + kk;
    } else {
        kk = s / (BT / 4u);
        cc = (s % (BT / 4u)) * 4u;
        run_ok = k0 + kk < p.k && col0 + cc + 4u <= p.n;
        at = base + (k0 + kk) * p.ldb + col0 + cc;
    }
    if ((p.vec_ab & VEC_B) != 0u && run_ok) {
        return b4[at / 4u];
    }
    if (TRANS_B) {
        return vec4<f32>(
            b_at(base, k0 + kk, col0 + cc),
            b_at(base, k0 + kk + 1u, col0 + cc),
            b_at(base, k0 + kk + 2u, col0 + cc),
            b_at(base, k0 + kk + 3u, col0 + cc),
        );
    }
    return vec4<f32>(
        b_at(base, k0 + kk, col0 + cc),
        b_at(base, k0 + kk, col0 + cc + 1u),
        b_at(base, k0 + kk, col0 + cc + 2u),
        b_at(base, k0 + kk, col0 + cc + 3u),
    );
}

// Stores slot s of op(B)'s slice rounded to f16; whether a value is not
// finite after the rounding.
fn b_put(s: u32, v: vec4<f32>) -> bool {
    let h = vec4<f16>(v);
    let w = vec4<f32>(h);
    let bad = non_finite(w.x) || non_finite(w.y) || non_finite(w.z) || non_finite(w.w);
    if (TRANS_B) {
        let cc = s / (BKK / 4u);
        let kk = (s % (BKK / 4u)) * 4u;
        b_s[kk * BS + cc] = h.x;
        b_s[(kk + 1u) * BS + cc] = h.y;
        b_s[(kk + 2u) * BS + cc] = h.z;
        b_s[(kk + 3u) * BS + cc] = h.w;
    } else {
        let kk = s / (BT / 4u);
        let cc = (s % (BT / 4u)) * 4u;
        let at = kk * BS + cc;
        b_s[at] = h.x;
        b_s[at + 1u] = h.y;
        b_s[at + 2u] = h.z;
        b_s[at + 3u] = h.w;
    }
    return bad;
}

@compute @workgroup_size(4 * SG, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let wg = 4u * SG;
    let flat = wid.x + wid.y * nwg.x;
    let tiles = p.tiles_m * p.tiles_n;
    // Workgroups past the last tile compute a clamped copy and store nothing:
    // the matrix operations below stay in uniform control flow.
    let live = flat < tiles * p.batch;
    let index = min(flat, tiles * p.batch - 1u);
    let z = index / tiles;
    let tile = index % tiles;
    let row0 = (tile / p.tiles_n) * BT;
    let col0 = (tile % p.tiles_n) * BT;
    let a_base = p.a_offset + z * p.a_stride;
    let b_base = p.b_offset + ((p.b_batch_base + z) / p.b_batch_div) * p.b_stride;
    let c_base = p.c_offset + z * p.c_stride;
    let a_scale = select(1.0, 16384.0, PROBABILITIES);
    // This subgroup's quadrant of the tile.
    let qr = (sg / 2u) * 2u * CM;
    let qc = (sg % 2u) * 2u * CM;

    for (var i = li; i < CM * CM; i += wg) {
        zero_s[i] = 0.0;
    }
    workgroupBarrier();
    var acc00 = coopLoadT<MatC>(&zero_s[0], CM);
    var acc01 = acc00;
    var acc10 = acc00;
    var acc11 = acc00;

    let k_slices = (p.k + BKK - 1u) / BKK;
    // This invocation's vec4s of the next slice: slots li, li + wg, ...
    // (consecutive invocations read consecutive vec4s of a stored row).
    var next_a: array<vec4<f32>, MAXV>;
    var next_b: array<vec4<f32>, MAXV>;
    for (var i = 0u; i < V; i++) {
        next_a[i] = a_slot(a_base, row0, 0u, li + i * wg);
        next_b[i] = b_slot(b_base, 0u, col0, li + i * wg);
    }
    for (var ks = 0u; ks < k_slices; ks++) {
        let k0 = ks * BKK;
        if (li == 0u) {
            b_bad[0] = 0u;
        }
        var bad = false;
        for (var i = 0u; i < V; i++) {
            a_put(li + i * wg, next_a[i], a_scale);
            bad = b_put(li + i * wg, next_b[i]) || bad;
        }
        workgroupBarrier();
        // The next slice's reads go out now; the products below hide them.
        if (ks + 1u < k_slices) {
            for (var i = 0u; i < V; i++) {
                next_a[i] = a_slot(a_base, row0, k0 + BKK, li + i * wg);
                next_b[i] = b_slot(b_base, k0 + BKK, col0, li + i * wg);
            }
        }
        if (SKIP_MARKED_A && bad) {
            b_bad[0] = 1u;
        }
        // (select, not &&: naga lowers a short-circuit condition through a
        // local variable, which its uniformity analysis takes as non-uniform.)
        let slice_bad = workgroupUniformLoad(&b_bad[0]) != 0u;
        if (select(false, slice_bad, SKIP_MARKED_A)) {
            // The slice's product in scalar code, marked terms of A skipped.
            for (var e = li; e < BT * BT; e += wg) {
                let r = e / BT;
                let cc = e % BT;
                var sum = 0.0;
                for (var kk = 0u; kk < BKK; kk++) {
                    let x = a_at(a_base, row0 + r, k0 + kk);
                    if (bitcast<u32>(x) != 0x80000000u) {
                        sum += a_scale * x * f32(b_s[kk * BS + cc]);
                    }
                }
                c_s[r * CS + cc] = sum;
            }
            workgroupBarrier();
            acc00 = acc00 + coopLoadT<MatC>(&c_s[qr * CS + qc], CS);
            acc01 = acc01 + coopLoadT<MatC>(&c_s[qr * CS + qc + CM], CS);
            acc10 = acc10 + coopLoadT<MatC>(&c_s[(qr + CM) * CS + qc], CS);
            acc11 = acc11 + coopLoadT<MatC>(&c_s[(qr + CM) * CS + qc + CM], CS);
        } else {
            for (var kk = 0u; kk < BKK; kk += CM) {
                let a0 = coopLoadT<MatA>(&a_s[qr * AS + kk], AS);
                let a1 = coopLoadT<MatA>(&a_s[(qr + CM) * AS + kk], AS);
                let b0 = coopLoadT<MatB>(&b_s[kk * BS + qc], BS);
                let b1 = coopLoadT<MatB>(&b_s[kk * BS + qc + CM], BS);
                acc00 = coopMultiplyAdd(a0, b0, acc00);
                acc01 = coopMultiplyAdd(a0, b1, acc01);
                acc10 = coopMultiplyAdd(a1, b0, acc10);
                acc11 = coopMultiplyAdd(a1, b1, acc11);
            }
        }
        workgroupBarrier();
    }

    coopStoreT(acc00, &c_s[qr * CS + qc], CS);
    coopStoreT(acc01, &c_s[qr * CS + qc + CM], CS);
    coopStoreT(acc10, &c_s[(qr + CM) * CS + qc], CS);
    coopStoreT(acc11, &c_s[(qr + CM) * CS + qc + CM], CS);
    workgroupBarrier();
    if (!live) {
        return;
    }
    for (var e = li; e < BT * BT; e += wg) {
        let r = e / BT;
        let cc = e % BT;
        let row = row0 + r;
        let col = col0 + cc;
        if (row < p.m && col < p.n) {
            let at = c_base + row * p.ldc + col;
            let value = p.alpha * (c_s[r * CS + cc] / a_scale);
            if (p.beta == 0.0) {
                c[at] = value;
            } else {
                c[at] = value + p.beta * c[at];
            }
        }
    }
}
