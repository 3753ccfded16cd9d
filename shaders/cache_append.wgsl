// A decoder step's new keys and values into its preallocated KV cache, in
// one dispatch: each key row rotated by RoPE on the way (or copied as it is),
// each value row copied. It replaces a RoPE dispatch on the step's keys and
// two copies per (batch, KV head) into the cache.
//
// The step's K and V are `rows` = B·Hkv·n rows of `dim` values, head-major
// ([B, Hkv, n, dim]); row r is token t = r % seq_len of sequence
// g = r / seq_len, and lands at row g·capacity + cache_len + t of the cache
// ([B, Hkv, capacity, dim]), every sequence holding cache_len tokens before
// the step. One invocation handles one pair of values of one row: the pair
// (2f, 2f + 1) (interleaved RoPE, and copies) or (f, f + dim / 2) (half-split
// RoPE), rotated by the angle (offset + t) · inv_freq[f] as `position.wgsl`
// rotates it.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> k_new: array<f32>;
@group(0) @binding(2) var<storage, read> v_new: array<f32>;
@group(0) @binding(3) var<storage, read> inv_freq: array<f32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;

const MODE_COPY: u32 = 0u;
const MODE_ROPE_HALF_SPLIT: u32 = 2u;

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
    let t = row % p.seq_len;
    let src = row * p.dim;
    let dst = ((row / p.seq_len) * p.capacity + p.cache_len + t) * p.dim;
    var i1 = 2u * f;
    var i2 = i1 + 1u;
    if (p.mode == MODE_ROPE_HALF_SPLIT) {
        i1 = f;
        i2 = f + p.dim / 2u;
    }
    // An odd dim's last pair (copies only) has one value.
    let two = i2 < p.dim;
    v_cache[dst + i1] = v_new[src + i1];
    if (two) {
        v_cache[dst + i2] = v_new[src + i2];
    }
    let a = k_new[src + i1];
    if (p.mode == MODE_COPY) {
        k_cache[dst + i1] = a;
        if (two) {
            k_cache[dst + i2] = k_new[src + i2];
        }
        return;
    }
    let b = k_new[src + i2];
    let sc = sincos(f32(p.offset + t) * inv_freq[f]);
    k_cache[dst + i1] = a * sc.y - b * sc.x;
    k_cache[dst + i2] = a * sc.x + b * sc.y;
}
