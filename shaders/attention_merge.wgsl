// Merges split-K partial attention results (attention_decode.wgsl) by their
// maxima: with M = max_s m_s and w_s = exp((m_s - M) / temperature),
//   Y = sum_s w_s O_s / sum_s w_s l_s,   lse = M / temperature + log(sum_s w_s l_s)
// (the maxima are of the biased scores before the temperature, as the decode
// kernels keep them: see tempered() in attention_rules.wgsl).
// A row whose every split saw no attended key gets Y = 0 and lse = -inf; a
// row for which a split met a NaN or +inf score, or whose attended scores were
// all -inf (sum 0), is NaN (attention_fused.wgsl's rule). Splits that attended
// only keys with a score of -inf still add 0 * O, so a NaN in their V reaches
// Y. One workgroup per row; invocations take output quads in turn.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part_o: array<vec4<f32>>;
// (m, l, flags, 0) per split and row; flags 1: attended, 2: poisoned.
@group(0) @binding(2) var<storage, read> part_ml: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// [lse (as bits) | m | l] per row, as the fused kernels write it.
@group(0) @binding(4) var<storage, read_write> stats: array<u32>;

const MASKED: f32 = -0x1.fffffep+127f;
const NEG_INF_BITS: u32 = 0xff800000u;
const NAN_BITS: u32 = 0x7fc00000u;
const WG: u32 = 64u;

// NaN and -inf made at run time: WGSL constant expressions cannot hold them
// (Chrome rejects the shader), so they come from a private variable.
var<private> non_finite_bits: vec2<u32> = vec2<u32>(0xff800000u, 0x7fc00000u);

fn neg_inf() -> f32 {
    return bitcast<f32>(non_finite_bits.x);
}

fn nan() -> f32 {
    return bitcast<f32>(non_finite_bits.y);
}

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    var big_m = MASKED;
    var attended = false;
    var poisoned = false;
    for (var s = 0u; s < p.splits; s++) {
        let ml = part_ml[s * p.rows + row];
        big_m = max(big_m, ml.x);
        attended = attended || ml.z >= 1.0;
        poisoned = poisoned || ml.z >= 2.0;
    }
    var big_l = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let ml = part_ml[s * p.rows + row];
        if (ml.z >= 1.0) {
            big_l += exp((ml.x - big_m) * p.inv_temperature) * ml.y;
        }
    }
    let nan_row = attended && (poisoned || !(big_l > 0.0));
    let dv4 = (p.dv + 3u) / 4u;
    let inv = select(0.0, 1.0 / big_l, big_l > 0.0);
    for (var d4 = li; d4 < dv4; d4 += WG) {
        var acc = vec4<f32>(0.0);
        for (var s = 0u; s < p.splits; s++) {
            let ml = part_ml[s * p.rows + row];
            if (ml.z >= 1.0) {
                acc += exp((ml.x - big_m) * p.inv_temperature) * part_o[(s * p.rows + row) * dv4 + d4];
            }
        }
        var out = acc * inv;
        if (nan_row) {
            out = vec4<f32>(nan());
        }
        for (var c = 0u; c < 4u; c++) {
            if (d4 * 4u + c < p.dv) {
                y[row * p.dv + d4 * 4u + c] = out[c];
            }
        }
    }
    if (li == 0u) {
        var bits = NEG_INF_BITS;
        if (nan_row) {
            bits = NAN_BITS;
        } else if (attended) {
            bits = bitcast<u32>(big_m * p.inv_temperature + log(big_l));
        }
        stats[row] = bits;
        stats[p.rows + row] = bitcast<u32>(big_m);
        stats[2u * p.rows + row] = select(bitcast<u32>(big_l), NAN_BITS, nan_row);
    }
}
