// Softcap, mask and bias for a block of score rows, in place.
//
// Rows are global rows r = row_base + row of the [B * Hq * Nq, T] score matrix
// (r = ((b * Hq) + h) * Nq + i). For each key j the kernel:
//   1. optionally captures the scaled score (qk_matmul_output mode 0),
//   2. applies softcap c * tanh(s / c) when enabled, and captures (mode 1),
//   3. decides whether the key is allowed: inside [lo, hi], where hi folds in
//      the causal frontier, the right window, nonpad_kv_seqlen and the mask's
//      last dimension, and lo the left window; then, with a mask, the mask
//      value must not be MASKED (bool false and -inf arrive as MASKED),
//   4. adds the float mask value and the ALiBi bias (the head's slope times
//      |position - j|; slopes follow the lengths in the rule data), captures
//      (mode 2, masked = -inf), and writes the biased score, or MASKED for a
//      masked key (softmax.wgsl divides by the temperature once the row's
//      maximum is taken out).
// Positions use the causal offset: the past length, else nonpad[b] - Nq, else 0.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> scores: array<f32>;
@group(0) @binding(2) var<storage, read> mask: array<f32>;
@group(0) @binding(3) var<storage, read> nonpad: array<i32>;
@group(0) @binding(4) var<storage, read_write> qk_out: array<u32>;

const WG: u32 = 128u;

// #include attention_rules.wgsl

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

    var offset = 0;
    if ((p.flags & FLAG_PAST) != 0u) {
        offset = i32(p.past_len);
    } else if ((p.flags & FLAG_NONPAD) != 0u) {
        offset = nonpad[b] - i32(p.q_len);
    }
    offset = offset + p.position_shift;
    let pos = offset + i32(i);
    var lo = 0;
    var hi = i32(p.cols) - 1;
    if ((p.flags & FLAG_CAUSAL) != 0u) {
        hi = min(hi, pos);
    }
    if (p.right_window >= 0) {
        hi = min(hi, pos + p.right_window);
    }
    if (p.left_window >= 0) {
        lo = max(lo, pos - p.left_window);
    }
    if ((p.flags & FLAG_NONPAD) != 0u) {
        hi = min(hi, nonpad[b] - 1);
    }
    let has_mask = (p.flags & FLAG_MASK) != 0u;
    if (has_mask) {
        hi = min(hi, i32(p.mask_cols) - 1);
    }
    var slope = 0.0;
    if ((p.flags & FLAG_ALIBI) != 0u) {
        slope = bitcast<f32>(nonpad[p.batch + h]);
    }
    let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride + i * p.mask_row_stride;
    let base = row * p.cols;
    let out_base = global_row * p.cols;

    for (var j = li; j < p.cols; j += WG) {
        var s = scores[base + j];
        if (p.capture == CAPTURE_SCALED) {
            qk_out[out_base + j] = bitcast<u32>(s);
        }
        if ((p.flags & FLAG_SOFTCAP) != 0u) {
            s = p.softcap * accurate_tanh(s / p.softcap);
        }
        if (p.capture == CAPTURE_SOFTCAPPED) {
            qk_out[out_base + j] = bitcast<u32>(s);
        }
        var allowed = i32(j) >= lo && i32(j) <= hi;
        if (allowed && has_mask) {
            // MASKED (and below) masks the key; any other value, NaN and
            // +inf included, is added (and then makes the row NaN).
            let bias = mask[mask_base + j];
            if (bias <= MASKED) {
                allowed = false;
            } else {
                s += bias;
            }
        }
        if (allowed && (p.flags & FLAG_ALIBI) != 0u) {
            s -= slope * f32(abs(pos - i32(j)));
        }
        if (p.capture == CAPTURE_BIASED) {
            qk_out[out_base + j] = select(NEG_INF_BITS, bitcast<u32>(s), allowed);
        }
        scores[base + j] = select(MASKED, s, allowed);
    }
}
