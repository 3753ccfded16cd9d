// Positional encodings, in place: the sinusoidal absolute encoding added to
// embeddings, and rotary embeddings (RoPE) applied to queries or keys.
//
// The tensor is `rows` rows of `dim` values; row r sits at position
// offset + r % seq_len (the offset is the KV cache's length when decoding).
// One invocation handles one pair of values with frequency index f, whose
// inverse frequency base^(-2f / dim) comes from the host (computed in f64,
// rounded to f32), and angle = position * inv_freq[f]:
//   mode 0 (sinusoidal): x[2f] += sin(angle), x[2f + 1] += cos(angle)
//                        (an odd dim's last value gets only the sine);
//   mode 1 (RoPE, interleaved pairs (2f, 2f + 1)) and
//   mode 2 (RoPE, half-split pairs (f, f + dim / 2)):
//        (a, b) -> (a cos - b sin, a sin + b cos).
//
// WGSL's sin and cos need only be accurate to 2^-11 on [-pi, pi] and are
// unspecified beyond; angles here reach thousands of radians, so the kernel
// reduces them by pi/2 in three parts (Cody-Waite) and evaluates polynomials
// on [-pi/4, pi/4]: within a few ulp of the f32 angle's true sine while the
// products k * part stay exact (|angle| below about 1.3e4); beyond, up to the
// host's limit of 2^24, the reduction adds about half an ulp of the angle,
// the size of the f32 rounding of the angle itself.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> inv_freq: array<f32>;

const MODE_SINUSOIDAL: u32 = 0u;
const MODE_ROPE_INTERLEAVED: u32 = 1u;

// #include sincos.wgsl

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let index = (wid.x + wid.y * nwg.x) * 64u + li;
    if (index >= p.rows * p.pairs) {
        return;
    }
    let row = index / p.pairs;
    let f = index % p.pairs;
    let position = f32(p.offset + row % p.seq_len);
    let sc = sincos(position * inv_freq[f]);
    let base = row * p.dim;
    if (p.mode == MODE_SINUSOIDAL) {
        x[base + 2u * f] += sc.x;
        if (2u * f + 1u < p.dim) {
            x[base + 2u * f + 1u] += sc.y;
        }
        return;
    }
    var i1 = base + f;
    var i2 = base + f + p.dim / 2u;
    if (p.mode == MODE_ROPE_INTERLEAVED) {
        i1 = base + 2u * f;
        i2 = i1 + 1u;
    }
    let a = x[i1];
    let b = x[i2];
    x[i1] = a * sc.y - b * sc.x;
    x[i2] = a * sc.x + b * sc.y;
}
