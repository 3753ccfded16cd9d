// Q, K and V as vec4s, for the attention kernels that stage quads of their
// rows (attention_tiled, attention_tiled_wide, attention_coop): an aligned
// quad of a row is one 16-byte load (head dims that are multiples of 4); any
// other element is a component of its vec4. Every buffer and view bound here
// holds whole vec4s (buffers are rounded to 16 bytes, views are 16-byte runs).

// #include ablate.wgsl

@group(0) @binding(1) var<storage, read> q_words: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_words: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_words: array<vec4<f32>>;

// The vec4 at vec4 index w of Q (src 0), K (1) or V (2).
fn word4(src: u32, w: u32) -> vec4<f32> {
    if (src == 0u) {
        return q_words[w];
    } else if (src == 1u) {
        return k_words[w];
    }
    return v_words[w];
}

// Four consecutive values of a row of Q (src 0), K (1) or V (2) starting at
// element `base` + d, zero past `len`: one load where they are one aligned vec4.
fn quad(src: u32, base: u32, d: u32, len: u32) -> vec4<f32> {
    if (src != 0u && (ABLATE & ABLATE_KV_LOADS) != 0u) {
        return vec4<f32>(0.0);
    }
    let at = base + d;
    if (d + 4u <= len && (at & 3u) == 0u) {
        return word4(src, at >> 2u);
    }
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (d + c < len) {
            let e = at + c;
            out[c] = word4(src, e >> 2u)[e & 3u];
        }
    }
    return out;
}
