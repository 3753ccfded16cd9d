// Packs one operand of gemm_coop_packed.wgsl: `batches` matrices stored
// row-major (rows x cols values each, leading dimension ld, `stride` values
// apart from `offset`) rounded to f16 into a dense buffer of rows_p x cols_p
// matrices, zeros outside (cols_p a multiple of 8). The matrices keep their
// stored orientation: the GEMM loads a transposed operand column-major.
//
// One invocation per 8 values of a packed row, written as two vec4s of
// f16; consecutive invocations read consecutive values of a stored row. The rounding is the f16 conversion's
// (gemm_coop.wgsl's too). Workgroups are numbered linearly across the 2D grid
// so large operands need no second dispatch.

enable f16;

struct Params {
    rows: u32,
    cols: u32,
    ld: u32,
    offset: u32,
    stride: u32,
    batches: u32,
    rows_p: u32,
    cols_p: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f16>>;

const WG: u32 = 256u;

fn value(base: u32, row: u32, col: u32) -> f32 {
    if (row < p.rows && col < p.cols) {
        return src[base + row * p.ld + col];
    }
    return 0.0;
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
    if (i >= p.batches * p.rows_p * per_row) {
        return;
    }
    let col = (i % per_row) * 8u;
    let row_z = i / per_row;
    let row = row_z % p.rows_p;
    let base = p.offset + (row_z / p.rows_p) * p.stride;
    dst[2u * i] = quad(base, row, col);
    dst[2u * i + 1u] = quad(base, row, col + 4u);
}
