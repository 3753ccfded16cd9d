// Row softmax with the maximum subtracted, in place, writing each row's logsumexp.
// The scores are the biased scores before the temperature: the probabilities
// are exp((s - max) / temperature) / sum and the logsumexp is
// max / temperature + log(sum), so that a finite score near f32::MAX stays
// finite (divided by a temperature below 1 first, it would not be).
//
// One workgroup per row of `cols` scores. Masked scores carry the value
// MASKED (-f32::MAX, written by the mask kernel) and take no part. Each
// invocation keeps an online (max, sum) pair over its strided share of the
// row; the pairs are merged in workgroup memory; a second sweep writes
// exp((s - max) / temperature) / sum. A row with no unmasked score becomes all zeros and its
// logsumexp -inf (written as bits, since WGSL arithmetic need not produce inf).
//
// Non-finite scores follow attention_fused.wgsl: a NaN or +inf score the row
// attends (any value but MASKED), or attended scores that are all -inf, make
// the whole row NaN, logsumexp included. An attended key's probability is
// exp(s - max) / sum as it is, 0 where that underflows or s is -inf.
//
// p.mode says what a key the row does not attend gets:
//   MODE_ZERO      +0 (probabilities the caller reads);
//   MODE_MARKED    -0, written as bits, for the P V product (gemm with
//                  SKIP_MARKED_A), which skips exactly those: a key not
//                  attended never multiplies its V row, while an attended key
//                  whose probability is +0 still does (0 x inf or 0 x NaN is
//                  NaN, as in PyTorch); exp never returns -0, so the sign bit
//                  tells them apart;
//   MODE_CLEAR     no softmax: rewrites the -0 marks of rows already
//                  normalised as +0 (before the caller reads them).
//
// Rows are numbered linearly across the 2D grid so more than 65535 rows work.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> scores: array<f32>;
@group(0) @binding(2) var<storage, read_write> lse: array<u32>;

const WG: u32 = 128u;
const MASKED: f32 = -0x1.fffffep+127f;
const NEG_INF_BITS: u32 = 0xff800000u;
const NAN_BITS: u32 = 0x7fc00000u;
const MASKED_BITS: u32 = 0xff7fffffu;
// -0: the mark of a key not attended (MODE_MARKED).
const MARK_BITS: u32 = 0x80000000u;
const MODE_ZERO: u32 = 0u;
const MODE_MARKED: u32 = 1u;
const MODE_CLEAR: u32 = 2u;
const ROW_ATTENDED: u32 = 1u;
const ROW_POISONED: u32 = 2u;

// NaN and -inf made at run time: WGSL constant expressions cannot hold them
// (Chrome rejects the shader), so they come from a private variable.
var<private> non_finite_bits: vec2<u32> = vec2<u32>(0xff800000u, 0x7fc00000u);

fn neg_inf() -> f32 {
    return bitcast<f32>(non_finite_bits.x);
}

fn nan() -> f32 {
    return bitcast<f32>(non_finite_bits.y);
}

var<workgroup> red_max: array<f32, WG>;
var<workgroup> red_sum: array<f32, WG>;
var<workgroup> red_flags: array<u32, WG>;

// Whether a score is NaN or +inf (bit tests: WGSL comparisons need not see NaN).
fn poisons(x: f32) -> bool {
    let bits = bitcast<u32>(x);
    return (bits & 0x7fffffffu) > 0x7f800000u || bits == 0x7f800000u;
}

// exp(x / temperature).
fn exp_tempered(x: f32) -> f32 {
    return exp(x * p.inv_temperature);
}

// Merges two (max, sum-of-exp) pairs; a pair whose max is MASKED has sum 0.
fn merge(m1: f32, l1: f32, m2: f32, l2: f32) -> vec2<f32> {
    let m = max(m1, m2);
    var l = 0.0;
    if (m1 > MASKED) {
        l += l1 * exp_tempered(m1 - m);
    }
    if (m2 > MASKED) {
        l += l2 * exp_tempered(m2 - m);
    }
    return vec2<f32>(m, l);
}

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
    let base = row * p.cols;
    if (p.mode == MODE_CLEAR) {
        for (var j = li; j < p.cols; j += WG) {
            if (bitcast<u32>(scores[base + j]) == MARK_BITS) {
                scores[base + j] = 0.0;
            }
        }
        return;
    }

    var m = MASKED;
    var l = 0.0;
    var flags = 0u;
    for (var j = li; j < p.cols; j += WG) {
        let s = scores[base + j];
        // Compared as bits: a float comparison with NaN may be ordered (false).
        if (bitcast<u32>(s) != MASKED_BITS) {
            flags |= ROW_ATTENDED;
            if (poisons(s)) {
                flags |= ROW_POISONED;
            } else if (s > MASKED) {
                // (An attended -inf adds nothing to the sum.)
                if (s > m) {
                    if (m > MASKED) {
                        l = l * exp_tempered(m - s);
                    }
                    l += 1.0;
                    m = s;
                } else {
                    l += exp_tempered(s - m);
                }
            }
        }
    }
    red_max[li] = m;
    red_sum[li] = l;
    red_flags[li] = flags;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (li < stride) {
            let merged = merge(red_max[li], red_sum[li], red_max[li + stride], red_sum[li + stride]);
            red_max[li] = merged.x;
            red_sum[li] = merged.y;
            red_flags[li] = red_flags[li] | red_flags[li + stride];
        }
        workgroupBarrier();
    }
    let row_max = red_max[0];
    let row_sum = red_sum[0];
    let attended = (red_flags[0] & ROW_ATTENDED) != 0u;
    let nan_row = attended && ((red_flags[0] & ROW_POISONED) != 0u || !(row_sum > 0.0));
    let live = attended && !nan_row;
    let inv_sum = select(0.0, 1.0 / row_sum, live);

    let not_attended = bitcast<f32>(select(0u, MARK_BITS, p.mode == MODE_MARKED));
    for (var j = li; j < p.cols; j += WG) {
        let s = scores[base + j];
        var prob = not_attended;
        if (nan_row) {
            prob = nan();
        } else if (live && bitcast<u32>(s) != MASKED_BITS) {
            prob = exp_tempered(s - row_max) * inv_sum;
        }
        scores[base + j] = prob;
    }
    if (li == 0u) {
        var bits = NEG_INF_BITS;
        if (nan_row) {
            bits = NAN_BITS;
        } else if (live) {
            bits = bitcast<u32>(row_max * p.inv_temperature + log(row_sum));
        }
        lse[p.lse_offset + row] = bits;
    }
}
