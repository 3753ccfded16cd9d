// Merges split-K partial attention results (attention_decode.wgsl) by their
// maxima: with M = max_s m_s and w_s = exp(m_s - M),
//   Y = sum_s w_s O_s / sum_s w_s l_s,   lse = M + log(sum_s w_s l_s).
// A row whose every split saw no allowed key (all m_s masked) gets Y = 0 and
// lse = -inf. One workgroup per row; invocations take output quads in turn.

struct Params {
    rows: u32,
    dv: u32,
    splits: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part_o: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> part_ml: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// [lse (as bits) | m | l] per row, as the fused kernels write it.
@group(0) @binding(4) var<storage, read_write> stats: array<u32>;

const MASKED: f32 = -0x1.fffffep+127f;
const NEG_INF_BITS: u32 = 0xff800000u;
const WG: u32 = 64u;

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
    for (var s = 0u; s < p.splits; s++) {
        big_m = max(big_m, part_ml[s * p.rows + row].x);
    }
    var big_l = 0.0;
    if (big_m > MASKED) {
        for (var s = 0u; s < p.splits; s++) {
            let ml = part_ml[s * p.rows + row];
            if (ml.x > MASKED) {
                big_l += exp(ml.x - big_m) * ml.y;
            }
        }
    }
    let dv4 = (p.dv + 3u) / 4u;
    let inv = select(0.0, 1.0 / big_l, big_l > 0.0);
    for (var d4 = li; d4 < dv4; d4 += WG) {
        var acc = vec4<f32>(0.0);
        if (big_l > 0.0) {
            for (var s = 0u; s < p.splits; s++) {
                let m = part_ml[s * p.rows + row].x;
                if (m > MASKED) {
                    acc += exp(m - big_m) * part_o[(s * p.rows + row) * dv4 + d4];
                }
            }
        }
        let out = acc * inv;
        for (var c = 0u; c < 4u; c++) {
            if (d4 * 4u + c < p.dv) {
                y[row * p.dv + d4 * 4u + c] = out[c];
            }
        }
    }
    if (li == 0u) {
        stats[row] = select(NEG_INF_BITS, bitcast<u32>(big_m + log(big_l)), big_l > 0.0);
        stats[p.rows + row] = bitcast<u32>(big_m);
        stats[2u * p.rows + row] = bitcast<u32>(big_l);
    }
}
