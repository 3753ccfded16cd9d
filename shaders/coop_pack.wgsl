// Packs one operand of gemm_coop_packed as f16: `batches` matrices of
// rows_p x cols_p (zeros outside rows x cols; both multiples of BLOCK), each
// cut into BLOCK x BLOCK blocks stored one after another along each row of
// blocks, every block row-major. So a matrix load reads one contiguous run of
// BLOCK² values at the constant stride BLOCK, and K (the columns) is the
// contiguous axis of both operands: op(A) is packed as M x K, op(B) as its
// transpose, N x K.
//
// Element (r, c) of matrix z comes from src[offset + z * stride + r * ld + c],
// or with `transposed` from src[offset + z * stride + c * ld + r] (the stored
// matrix's transpose). One invocation per 8 values of a packed row (two vec4s
// of f16); consecutive invocations take consecutive 8-value runs of a row, or
// with `transposed` the same run of consecutive rows, so that a subgroup's
// reads are consecutive values of the stored rows either way. The rounding is
// the f16 conversion's (gemm_coop's too). Workgroups are numbered
// linearly across the 2D grid so large operands need no second dispatch.
//
// With `flag_rows` > 0 (the V of attention_coop_packed and _shared), the pass also
// notes which runs of `flag_rows` packed rows hold a value that is NaN or
// infinite once rounded: word z * (rows_p / flag_rows) + row / flag_rows of
// `flags` (zero-filled by its creator) becomes nonzero.

enable f16;

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> flags: array<atomic<u32>>;

const WG: u32 = 256u;

fn value(base: u32, row: u32, col: u32) -> f32 {
    if (row >= p.rows || col >= p.cols) {
        return 0.0;
    }
    if (p.transposed != 0u) {
        return src[base + col * p.ld + row];
    }
    return src[base + row * p.ld + col];
}

// Values (row, col) to (row, col + 3) rounded to f16.
fn quad(base: u32, row: u32, col: u32) -> vec4<f16> {
    return vec4<f16>(vec4<f32>(
        value(base, row, col),
        value(base, row, col + 1u),
        value(base, row, col + 2u),
        value(base, row, col + 3u),
    ));
}

@compute @workgroup_size(WG, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * WG + li;
    let per_row = p.cols_p / 8u;
    let per_matrix = p.rows_p * per_row;
    if (i >= p.batches * per_matrix) {
        return;
    }
    let z = i / per_matrix;
    let j = i % per_matrix;
    var row: u32;
    var col: u32;
    if (p.transposed != 0u) {
        row = j % p.rows_p;
        col = (j / p.rows_p) * 8u;
    } else {
        row = j / per_row;
        col = (j % per_row) * 8u;
    }
    let base = p.offset + z * p.stride;
    let b = p.block;
    // (8 values never straddle a block: col is a multiple of 8, b of 8.)
    let at = z * p.rows_p * p.cols_p + (row / b) * b * p.cols_p + (col / b) * b * b
        + (row % b) * b + col % b;
    let lo = quad(base, row, col);
    let hi = quad(base, row, col + 4u);
    dst[at / 4u] = lo;
    dst[at / 4u + 1u] = hi;
    if (p.flag_rows != 0u) {
        let bits = bitcast<vec4<u32>>(vec4<f32>(lo)) & vec4<u32>(0x7fffffffu);
        let bits_hi = bitcast<vec4<u32>>(vec4<f32>(hi)) & vec4<u32>(0x7fffffffu);
        let inf = vec4<u32>(0x7f800000u);
        if (any(bits >= inf) || any(bits_hi >= inf)) {
            atomicOr(&flags[z * (p.rows_p / p.flag_rows) + row / p.flag_rows], 1u);
        }
    }
}
