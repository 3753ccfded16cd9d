// Batched, strided GEMM for skinny products: gemm.wgsl's product (the same
// Params, bindings and layouts: C[z] = alpha * op(A[z]) * op(B[z]) + beta * C[z],
// B shared by b_batch_div batch entries) where op(A) has at most MAX_ROWS rows,
// as a decoder step's Q Kᵀ and P V have. Each value of B is read once, where
// 64 x 64 tiles would compute 63 rows of C that no one asked for.
//
// A workgroup owns COLS columns of C, every row, and splits K among SPLIT
// invocations per column. With TRANS_B (B stored n x k, as keys are) the
// SPLIT invocations of one column are neighbours and walk its row of B
// together; without (B stored k x n, as values are) the COLS invocations of
// one step are neighbours and read a row of B together. So reads of B are
// coalesced either way. Each invocation keeps one sum per row of op(A) in
// registers; the partial sums meet in workgroup memory, and one invocation
// per (row, column) adds its column's SPLIT sums and stores.
//
// Workgroups are numbered linearly (x + y * num_workgroups.x): the host folds
// batch x column blocks into a grid that fits the dispatch limits.

override TRANS_A: bool = false;
override TRANS_B: bool = false;
// Skip every term whose A value is -0 (the mark, as bits): attention's P V,
// as in gemm.wgsl.
override SKIP_MARKED_A: bool = false;
// Rows of op(A) this pipeline holds sums for (1..MAX_ROWS; rows past p.m read
// zeros and are not stored): constant loop bounds keep the sums in registers.
override ROWS: u32 = 16u;

// #include gemm_params.wgsl

const INVOCATIONS: u32 = 128u;
const MAX_ROWS: u32 = 16u;

// [MAX_ROWS][INVOCATIONS]: each invocation's sum for each row.
var<workgroup> partial: array<f32, 2048>;

// Invocations sharing one column: 16 along a stored row of B (TRANS_B),
// 8 down its rows otherwise (16 neighbouring columns read 64 bytes together).
fn split() -> u32 {
    return select(8u, 16u, TRANS_B);
}

// Where invocation `lid`'s sum for a column sits among the workgroup's.
fn slot(column: u32, part: u32) -> u32 {
    if (TRANS_B) {
        return column * split() + part;
    }
    return part * (INVOCATIONS / split()) + column;
}

fn a_at(base: u32, row: u32, col: u32) -> f32 {
    if (row >= p.m) {
        return 0.0;
    }
    if (TRANS_A) {
        return a[base + col * p.lda + row];
    }
    return a[base + row * p.lda + col];
}

fn b_at(base: u32, row: u32, col: u32) -> f32 {
    if (TRANS_B) {
        return b[base + col * p.ldb + row];
    }
    return b[base + row * p.ldb + col];
}

@compute @workgroup_size(128, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let flat = wid.x + wid.y * nwg.x;
    let z = flat / p.tiles_n;
    if (z >= p.batch) {
        return;
    }
    let parts = split();
    let cols = INVOCATIONS / parts;
    let col0 = (flat % p.tiles_n) * cols;
    var column = lid % cols;
    var part = lid / cols;
    if (TRANS_B) {
        column = lid / parts;
        part = lid % parts;
    }
    let a_base = p.a_offset + z * p.a_stride;
    let b_base = p.b_offset + ((p.b_batch_base + z) / p.b_batch_div) * p.b_stride;
    let c_base = p.c_offset + z * p.c_stride;
    // A column past n reads the last one and stores nothing.
    let col = min(col0 + column, p.n - 1u);
    let rows = min(ROWS, MAX_ROWS);

    var acc: array<f32, MAX_ROWS>;
    for (var kk = part; kk < p.k; kk += parts) {
        let bv = b_at(b_base, kk, col);
        for (var r = 0u; r < rows; r++) {
            let av = a_at(a_base, r, kk);
            if (!SKIP_MARKED_A || !marked(av)) {
                acc[r] += av * bv;
            }
        }
    }
    for (var r = 0u; r < rows; r++) {
        partial[r * INVOCATIONS + lid] = acc[r];
    }
    workgroupBarrier();

    // One invocation per (row, column) adds the column's sums in order.
    let live_rows = min(rows, p.m);
    for (var i = lid; i < live_rows * cols; i += INVOCATIONS) {
        let r = i / cols;
        let cc = i % cols;
        let out_col = col0 + cc;
        if (out_col >= p.n) {
            continue;
        }
        var total = 0.0;
        for (var q = 0u; q < parts; q++) {
            total += partial[r * INVOCATIONS + slot(cc, q)];
        }
        let at = c_base + r * p.ldc + out_col;
        if (p.beta == 0.0) {
            c[at] = p.alpha * total;
        } else {
            c[at] = p.alpha * total + p.beta * c[at];
        }
    }
}
