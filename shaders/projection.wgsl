// Skinny products for a decoder step: y = x Wᵀ + b for a few rows of x
// (at most MAX_ROWS per dispatch), reading each weight once.
//
// A workgroup owns TEAMS output features (rows of W); a team of LANES
// invocations walks one weight row in words of 4 values (f32) or 8 values
// (f16 pairs, F16_WEIGHTS), coalesced, and keeps one partial sum per row of
// x. The teams' partial sums meet in workgroup memory and one invocation per
// (feature, row) adds its team's lanes and the bias. Weight rows are padded
// with zeros to whole words by the host (`w_stride` words a row), so every
// load is a whole vec4<u32>; x past `in_dim` reads as 0.
//
// x's row r (r = row_base + local row) is (b, t) = (r / seq_len, r % seq_len),
// and its feature k sits at b·x_batch + t·x_row + g·x_group_stride + k - g·x_group
// with g = k / x_group: a row-major [B, N, K] input has x_group = K, a
// head-major [B, H, N, D] one (attention's Y) has x_group = D.
//
// A dispatch computes features feature_base .. features of the matrix; they
// fall into up to three segments (a fused Q|K|V matrix): segment s
// holds features below seg_end[s], as heads of seg_width[s] values, written
// to out_s at out_base[s] + b·out_batch[s] + h·out_head[s] + t·out_row[s] + c.
// So Q, K and V land head-major (or straight in a cache) from one dispatch.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out0: array<f32>;
@group(0) @binding(5) var<storage, read_write> out1: array<f32>;
@group(0) @binding(6) var<storage, read_write> out2: array<f32>;

// Weights stored as f16 pairs (8 values a word) rather than f32 (4 a word).
override F16_WEIGHTS: bool = false;
// Rows of x this pipeline takes (1..MAX_ROWS): the row loops have constant
// bounds, so the compiler keeps one sum per row in registers.
override ROWS: u32 = 1u;

const LANES: u32 = 32u;
const TEAMS: u32 = 4u;
const INVOCATIONS: u32 = 128u; // LANES * TEAMS
const MAX_ROWS: u32 = 16u;

var<workgroup> partial: array<f32, 2048>; // [MAX_ROWS][INVOCATIONS]

// Where feature k of any row sits, less the row's own base.
fn x_column(k: u32) -> u32 {
    let g = k / p.x_group;
    return g * p.x_group_stride + k - g * p.x_group;
}

fn x_row_base(r: u32) -> u32 {
    let row = p.row_base + r;
    let b = row / p.seq_len;
    return b * p.x_batch + (row - b * p.seq_len) * p.x_row;
}

// Four consecutive features of row r from k0, zero past in_dim.
fn x_quad(base: u32, cols: vec4<u32>, valid: vec4<bool>) -> vec4<f32> {
    return select(
        vec4<f32>(0.0),
        vec4<f32>(x[base + cols.x], x[base + cols.y], x[base + cols.z], x[base + cols.w]),
        valid,
    );
}

fn quad_columns(k0: u32) -> vec4<u32> {
    let last = max(p.in_dim, 1u) - 1u;
    return vec4<u32>(
        x_column(min(k0, last)),
        x_column(min(k0 + 1u, last)),
        x_column(min(k0 + 2u, last)),
        x_column(min(k0 + 3u, last)),
    );
}

fn quad_valid(k0: u32) -> vec4<bool> {
    return vec4<u32>(k0, k0 + 1u, k0 + 2u, k0 + 3u) < vec4<u32>(p.in_dim);
}

@compute @workgroup_size(128)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let group = wid.x + wid.y * nwg.x;
    let team = lid / LANES;
    let lane = lid % LANES;
    // Every invocation reaches the barrier: a team past the last feature
    // reads the last one's weights and writes nothing.
    let feature = min(p.feature_base + group * TEAMS + team, p.features - 1u);
    let rows = min(ROWS, MAX_ROWS);

    var bases: array<u32, MAX_ROWS>;
    for (var r = 0u; r < rows; r++) {
        bases[r] = x_row_base(r);
    }
    var acc: array<f32, MAX_ROWS>;
    let per_word = select(4u, 8u, F16_WEIGHTS);
    let w_row = feature * p.w_stride;
    for (var q = lane; q < p.w_stride; q += LANES) {
        let word = w[w_row + q];
        let k0 = q * per_word;
        var lo: vec4<f32>;
        var hi = vec4<f32>(0.0);
        if (F16_WEIGHTS) {
            lo = vec4<f32>(unpack2x16float(word.x), unpack2x16float(word.y));
            hi = vec4<f32>(unpack2x16float(word.z), unpack2x16float(word.w));
        } else {
            lo = bitcast<vec4<f32>>(word);
        }
        let cols_lo = quad_columns(k0);
        let valid_lo = quad_valid(k0);
        let cols_hi = quad_columns(k0 + 4u);
        let valid_hi = quad_valid(k0 + 4u) & vec4<bool>(F16_WEIGHTS);
        for (var r = 0u; r < rows; r++) {
            var sum = dot(lo, x_quad(bases[r], cols_lo, valid_lo));
            if (F16_WEIGHTS) {
                sum += dot(hi, x_quad(bases[r], cols_hi, valid_hi));
            }
            acc[r] += sum;
        }
    }
    for (var r = 0u; r < rows; r++) {
        partial[r * INVOCATIONS + lid] = acc[r];
    }
    workgroupBarrier();

    // One invocation per (team, row) finishes a sum.
    if (lid >= TEAMS * rows) {
        return;
    }
    let sum_team = lid / rows;
    let r = lid % rows;
    let f = p.feature_base + group * TEAMS + sum_team;
    if (f >= p.features) {
        return;
    }
    var total = bias[f];
    for (var l = 0u; l < LANES; l++) {
        total += partial[r * INVOCATIONS + sum_team * LANES + l];
    }
    var s = 0u;
    var start = p.feature_base;
    if (f >= p.seg_end.x) {
        s = 1u;
        start = p.seg_end.x;
    }
    if (f >= p.seg_end.y) {
        s = 2u;
        start = p.seg_end.y;
    }
    let local_f = f - start;
    let h = local_f / p.seg_width[s];
    let c = local_f - h * p.seg_width[s];
    let row = p.row_base + r;
    let b = row / p.seq_len;
    let t = row - b * p.seq_len;
    let at = p.out_base[s] + b * p.out_batch[s] + h * p.out_head[s] + t * p.out_row[s] + c;
    if (s == 0u) {
        out0[at] = total;
    } else if (s == 1u) {
        out1[at] = total;
    } else {
        out2[at] = total;
    }
}
