// Conversion between f32 tensors and f16 tensors stored as packed u32 words
// (element 2i in the low half of word i, element 2i + 1 in the high half),
// and the widening of bfloat16 tensors packed the same way (BFLOAT16).
//
// One invocation per word: with NARROW it reads two f32 values (as bits) and
// writes one word of two f16s, rounded to nearest even, overflowing to
// infinity and keeping NaN a NaN, computed on the bits so it does not rest on
// pack2x16float (whose result WGSL leaves indeterminate outside f16's finite
// range); without NARROW it reads one word and writes two f32 values, widened
// exactly (infinities and NaNs included). Workgroups are numbered linearly
// across the 2D grid so large tensors need no second dispatch.

// #include PARAMS

override NARROW: bool = false;
// Widen bfloat16 words instead of f16 ones: a bfloat16 is the upper half of
// an f32, so widening is a shift (exact, infinities and NaNs included).
override BFLOAT16: bool = false;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

const WG: u32 = 256u;

// The f16 bits nearest to the f32 with bits `x` (ties to even).
fn half_bits(x: u32) -> u32 {
    let sign = (x >> 16u) & 0x8000u;
    let e = i32((x >> 23u) & 0xffu);
    let m = x & 0x7fffffu;
    if (e == 255) {
        // Infinity, or a NaN kept quiet and non-zero.
        return sign | 0x7c00u | select(0u, 0x200u | (m >> 13u), m != 0u);
    }
    let he = e - 112; // f16 exponent field: e - 127 + 15
    if (he >= 31) {
        return sign | 0x7c00u;
    }
    if (he <= 0) {
        // Subnormal f16 (or zero): the significand with its implicit bit,
        // shifted right by 14 - he, rounded to nearest even.
        if (he < -10) {
            return sign;
        }
        let full = m | 0x800000u;
        let shift = u32(14 - he);
        let kept = full >> shift;
        let rest = full & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        let up = rest > half || (rest == half && (kept & 1u) == 1u);
        return sign | (kept + select(0u, 1u, up));
    }
    let kept = (u32(he) << 10u) | (m >> 13u);
    let rest = m & 0x1fffu;
    let up = rest > 0x1000u || (rest == 0x1000u && (kept & 1u) == 1u);
    // A carry out of the significand steps the exponent, up to infinity.
    return sign | (kept + select(0u, 1u, up));
}

// The f32 bits of the f16 with bits `h`.
fn float_bits(h: u32) -> u32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 31u) {
        return sign | 0x7f800000u | (m << 13u);
    }
    if (e == 0u) {
        // Zero or subnormal: m * 2^-24, exact in f32.
        return sign | bitcast<u32>(f32(m) * 0x1p-24f);
    }
    return sign | ((e + 112u) << 23u) | (m << 13u);
}

@compute @workgroup_size(256, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let word = (wid.x + wid.y * nwg.x) * WG + li;
    let first = 2u * word;
    if (first >= p.len) {
        return;
    }
    let second = first + 1u < p.len;
    if (NARROW) {
        var bits = half_bits(src[first]);
        if (second) {
            bits |= half_bits(src[first + 1u]) << 16u;
        }
        dst[word] = bits;
    } else {
        let w = src[word];
        if (BFLOAT16) {
            dst[first] = w << 16u;
            if (second) {
                dst[first + 1u] = w & 0xffff0000u;
            }
        } else {
            dst[first] = float_bits(w & 0xffffu);
            if (second) {
                dst[first + 1u] = float_bits(w >> 16u);
            }
        }
    }
}
