// Split-K decode attention: few query rows (Nq <= 4), many keys.
//
// The fused kernels give each workgroup a block of query rows; with one or two
// rows per head almost all of that block is idle and a head's keys are
// streamed by a single workgroup. Here the keys of a head are split across
// workgroups instead: workgroup (batch, head, split) owns the head's Nq <= 4
// query rows and the keys [split * split_keys, (split + 1) * split_keys).
// Per 64-key tile, invocation t scores key t against every row; tree
// reductions in workgroup memory give each row's tile max and sum; every
// invocation keeps the rows' running max m and sum l (the same values in
// all); for P V invocation c owns output quads c, c + 64, ... of the rows, so
// O stays in registers across tiles. Each split writes its unnormalised O and
// (m, l); attention_merge.wgsl combines the splits by their maxima into Y and
// the logsumexp.
//
// The masking rules and the non-finite rule are attention_fused.wgsl's: each
// split also reports whether it attended a key and whether it met a NaN or
// +inf score, and the merge makes such rows NaN. Head dims must be multiples
// of 4 up to 256 (rows are read as vec4s); the host sends others to the fused
// kernels.

struct Params {
    batch: u32,
    q_heads: u32,
    group: u32,
    q_len: u32,
    keys: u32,
    dk: u32,
    dv: u32,
    flags: u32,
    scale: f32,
    softcap: f32,
    left_window: i32,
    right_window: i32,
    past_len: u32,
    mask_cols: u32,
    mask_batch_stride: u32,
    mask_head_stride: u32,
    mask_row_stride: u32,
    splits: u32,
    kv_heads: u32,
    split_keys: u32,
    // 1 / temperature, applied to the biased scores before the softmax.
    inv_temperature: f32,
    _reserved0: u32,
    _reserved1: u32,
    _reserved2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> mask: array<f32>;
@group(0) @binding(5) var<storage, read> nonpad: array<i32>;
// [split][row][dv4] unnormalised O.
@group(0) @binding(6) var<storage, read_write> part_o: array<vec4<f32>>;
// [split][row] as (m, l, flags, 0); flags as an exact small float
// (1: a key was attended, 2: a NaN or +inf score was).
@group(0) @binding(7) var<storage, read_write> part_ml: array<vec4<f32>>;

const MASKED: f32 = -0x1.fffffep+127f;
const FLAG_MASK: u32 = 1u;
const FLAG_CAUSAL: u32 = 2u;
const FLAG_NONPAD: u32 = 4u;
const FLAG_PAST: u32 = 8u;
const FLAG_SOFTCAP: u32 = 16u;
const FLAG_ALIBI: u32 = 32u;
const WG: u32 = 64u;
const NEG_INF_BITS: u32 = 0xff800000u;
const ROW_ATTENDED: u32 = 1u;
const ROW_POISONED: u32 = 2u;
// At most 4 query rows; output quads per invocation: 4 rows x 64 quads / 64.
const MAX_ROWS: u32 = 4u;

// NaN and -inf made at run time: WGSL constant expressions cannot hold them
// (Chrome rejects the shader), so they come from a private variable.
var<private> non_finite_bits: vec2<u32> = vec2<u32>(0xff800000u, 0x7fc00000u);

fn neg_inf() -> f32 {
    return bitcast<f32>(non_finite_bits.x);
}

fn nan() -> f32 {
    return bitcast<f32>(non_finite_bits.y);
}

var<workgroup> scores: array<f32, 256>;
var<workgroup> reduce: array<f32, 256>;
var<workgroup> batch_nonpad: i32;
// Each row's ROW_ATTENDED | ROW_POISONED over the split.
var<workgroup> row_flags: array<atomic<u32>, 4>;

// Whether a score is NaN or +inf (bit tests: WGSL comparisons need not see NaN).
fn poisons(x: f32) -> bool {
    let bits = bitcast<u32>(x);
    return (bits & 0x7fffffffu) > 0x7f800000u || bits == 0x7f800000u;
}

// tanh accurate to a few ulp (see mask.wgsl); NaN stays NaN.
fn accurate_tanh(x: f32) -> f32 {
    if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) {
        return x;
    }
    let ax = abs(x);
    if (ax < 0.4) {
        let z = x * x;
        let poly = 1.0 + z * (-1.0 / 3.0 + z * (2.0 / 15.0 + z * (-17.0 / 315.0
            + z * (62.0 / 2835.0 + z * (-1382.0 / 155925.0 + z * (21844.0 / 6081075.0))))));
        return x * poly;
    }
    let e = exp(2.0 * min(ax, 10.0));
    let t = 1.0 - 2.0 / (e + 1.0);
    return select(t, -t, x < 0.0);
}

fn key_range(i: u32, offset: i32, lengths: i32) -> vec2<i32> {
    let pos = offset + i32(i);
    var lo = 0;
    var hi = i32(p.keys) - 1;
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
        hi = min(hi, lengths - 1);
    }
    if ((p.flags & FLAG_MASK) != 0u) {
        hi = min(hi, i32(p.mask_cols) - 1);
    }
    return vec2<i32>(lo, hi);
}

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let block = wid.x + wid.y * nwg.x;
    let heads = p.batch * p.q_heads;
    let live_block = block < heads * p.splits;
    let head_index = min(block / p.splits, heads - 1u);
    let split = block % p.splits;
    let b = head_index / p.q_heads;
    let h = head_index % p.q_heads;
    let kvh = h / p.group;
    let rows = min(p.q_len, MAX_ROWS);
    let dk4 = p.dk / 4u;
    let dv4 = p.dv / 4u;

    if (li < MAX_ROWS) {
        atomicStore(&row_flags[li], 0u);
    }
    if (li == 0u) {
        var lengths = i32(p.keys);
        if ((p.flags & FLAG_NONPAD) != 0u) {
            lengths = nonpad[b];
        }
        batch_nonpad = lengths;
    }
    let lengths = workgroupUniformLoad(&batch_nonpad);
    var offset = 0;
    if ((p.flags & FLAG_PAST) != 0u) {
        offset = i32(p.past_len);
    } else if ((p.flags & FLAG_NONPAD) != 0u) {
        offset = lengths - i32(p.q_len);
    }
    // The keys any row may see, within this split.
    let split_lo = i32(split * p.split_keys);
    let split_hi = i32(min((split + 1u) * p.split_keys, p.keys)) - 1;
    var slope = 0.0;
    if ((p.flags & FLAG_ALIBI) != 0u) {
        slope = bitcast<f32>(nonpad[p.batch + h]);
    }
    let lo = max(key_range(0u, offset, lengths).x, split_lo);
    let hi = select(min(key_range(rows - 1u, offset, lengths).y, split_hi), -1, !live_block);

    // Every invocation keeps the same running max and sum of each row.
    var m = vec4<f32>(MASKED);
    var l = vec4<f32>(0.0);
    // Output quads of this invocation: quad c = li + 64 * n of the rows x dv4 grid.
    var o0 = vec4<f32>(0.0);
    var o1 = vec4<f32>(0.0);
    var o2 = vec4<f32>(0.0);
    var o3 = vec4<f32>(0.0);
    let kv_base = (b * p.kv_heads + kvh) * p.keys;

    var j0 = lo - lo % i32(WG);
    for (; j0 <= hi; j0 += i32(WG)) {
        // Scores of key j0 + li against every row.
        let j = j0 + i32(li);
        let key = u32(clamp(j, 0, i32(p.keys) - 1));
        for (var r = 0u; r < rows; r++) {
            var s = MASKED;
            let range = key_range(r, offset, lengths);
            var attended = j >= range.x && j <= range.y && j >= split_lo && j <= split_hi;
            if (attended) {
                let q_base = (head_index * p.q_len + r) * dk4;
                let k_base = (kv_base + key) * dk4;
                var dot = 0.0;
                for (var d4 = 0u; d4 < dk4; d4++) {
                    let prod = q4[q_base + d4] * k4[k_base + d4];
                    dot += (prod.x + prod.y) + (prod.z + prod.w);
                }
                s = dot * p.scale;
                if ((p.flags & FLAG_SOFTCAP) != 0u) {
                    s = p.softcap * accurate_tanh(s / p.softcap);
                }
                if ((p.flags & FLAG_MASK) != 0u) {
                    let bias = mask[b * p.mask_batch_stride + h * p.mask_head_stride + r * p.mask_row_stride + u32(j)];
                    if (bias <= MASKED) {
                        attended = false;
                    } else {
                        s += bias;
                    }
                }
            }
            if (attended) {
                if ((p.flags & FLAG_ALIBI) != 0u) {
                    s -= slope * f32(abs(offset + i32(r) - j));
                }
                s *= p.inv_temperature;
                var seen = ROW_ATTENDED;
                if (poisons(s)) {
                    // Poisons the row; counts as -inf from here on.
                    seen |= ROW_POISONED;
                    s = neg_inf();
                }
                atomicOr(&row_flags[r], seen);
            } else {
                s = MASKED;
            }
            scores[r * WG + li] = s;
            reduce[r * WG + li] = s;
        }
        workgroupBarrier();
        // Tile max of each row.
        for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
            if (li < stride) {
                for (var r = 0u; r < rows; r++) {
                    reduce[r * WG + li] = max(reduce[r * WG + li], reduce[r * WG + li + stride]);
                }
            }
            workgroupBarrier();
        }
        var m_new = m;
        for (var r = 0u; r < rows; r++) {
            m_new[r] = max(m[r], reduce[r * WG]);
        }
        workgroupBarrier();
        // This key's probabilities (-1 for a key the row does not attend;
        // an attended score of -inf gets 0), and the tile sums.
        for (var r = 0u; r < rows; r++) {
            let s = scores[r * WG + li];
            let pt = select(-1.0, exp(s - m_new[r]), s != MASKED);
            scores[r * WG + li] = pt;
            reduce[r * WG + li] = max(pt, 0.0);
        }
        workgroupBarrier();
        for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
            if (li < stride) {
                for (var r = 0u; r < rows; r++) {
                    reduce[r * WG + li] += reduce[r * WG + li + stride];
                }
            }
            workgroupBarrier();
        }
        // alpha rescales what the row had (O starts at 0; exp(0) = 1 while
        // no attended score has been finite).
        var alpha = vec4<f32>(1.0);
        for (var r = 0u; r < rows; r++) {
            alpha[r] = exp(m[r] - m_new[r]);
            l[r] = l[r] * alpha[r] + reduce[r * WG];
        }
        m = m_new;
        // O = alpha * O + P V for this invocation's output quads.
        for (var n = 0u; n < 4u; n++) {
            let c = li + WG * n;
            let r = c / dv4;
            if (r < rows) {
                let d4 = c % dv4;
                var acc = vec4<f32>(0.0);
                for (var t = 0u; t < WG; t++) {
                    let pt = scores[r * WG + t];
                    if (pt >= 0.0) {
                        let vk = u32(clamp(j0 + i32(t), 0, i32(p.keys) - 1));
                        acc += pt * v4[(kv_base + vk) * dv4 + d4];
                    }
                }
                switch n {
                    case 0u: { o0 = o0 * alpha[r] + acc; }
                    case 1u: { o1 = o1 * alpha[r] + acc; }
                    case 2u: { o2 = o2 * alpha[r] + acc; }
                    default: { o3 = o3 * alpha[r] + acc; }
                }
            }
        }
        workgroupBarrier();
    }

    if (!live_block) {
        return;
    }
    let part_rows = heads * p.q_len;
    for (var n = 0u; n < 4u; n++) {
        let c = li + WG * n;
        let r = c / dv4;
        if (r < rows) {
            let d4 = c % dv4;
            var o = o0;
            switch n {
                case 1u: { o = o1; }
                case 2u: { o = o2; }
                case 3u: { o = o3; }
                default: {}
            }
            part_o[(split * part_rows + head_index * p.q_len + r) * dv4 + d4] = o;
        }
    }
    if (li < rows) {
        let flags = f32(atomicLoad(&row_flags[li]));
        part_ml[split * part_rows + head_index * p.q_len + li] = vec4<f32>(m[li], l[li], flags, 0.0);
    }
}
