// Softcap, mask and bias for a block of score rows, in place: the unfused
// path's rules (shaders/attention_score.wgsl), with the captures of
// qk_matmul_output between them.
//
// Rows are global rows r = row_base + row of the [B * Hq * Nq, T] score matrix
// (r = ((b * Hq) + h) * Nq + i), already scaled by the GEMM. For each key j
// the kernel captures the scaled score (capture 1), softcaps and captures
// (capture 2), drops keys outside the row's allowed range or that the mask
// drops, adds the mask and ALiBi, captures (capture 3, dropped keys -inf) and
// writes the biased score, or MASKED for a dropped key (softmax.wgsl divides
// by the temperature once the row's maximum is taken out).

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> scores: array<f32>;
@group(0) @binding(2) var<storage, read> mask: array<f32>;
@group(0) @binding(3) var<storage, read> nonpad: array<i32>;
@group(0) @binding(4) var<storage, read_write> qk_out: array<u32>;

const WG: u32 = 128u;

// #include attention_rules.wgsl
// #include attention_score.wgsl

const CAPTURE_SCALED: u32 = 1u;
const CAPTURE_SOFTCAPPED: u32 = 2u;
const CAPTURE_BIASED: u32 = 3u;

@compute @workgroup_size(128, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let global_row = p.row_base + row;
    let i = global_row % p.q_len;
    let head = global_row / p.q_len;
    let h = head % p.q_heads;
    let b = head / p.q_heads;

    let lengths = batch_lengths(b);
    let pos = position_offset(lengths) + i32(i);
    let range = allowed_keys(pos, lengths);
    let slope = head_slope(h);
    let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride + i * p.mask_row_stride;
    let base = row * p.keys;
    let out_base = global_row * p.keys;

    for (var j = li; j < p.keys; j += WG) {
        var s = scores[base + j];
        if (p.capture == CAPTURE_SCALED) {
            qk_out[out_base + j] = bitcast<u32>(s);
        }
        s = capped(s);
        if (p.capture == CAPTURE_SOFTCAPPED) {
            qk_out[out_base + j] = bitcast<u32>(s);
        }
        var biased_score = Biased(MASKED, false);
        if (i32(j) >= range.x && i32(j) <= range.y) {
            biased_score = biased(s, mask_base + j, pos - i32(j), slope);
        }
        if (p.capture == CAPTURE_BIASED) {
            qk_out[out_base + j] = select(NEG_INF_BITS, bitcast<u32>(biased_score.s), biased_score.attended);
        }
        scores[base + j] = biased_score.s;
    }
}
