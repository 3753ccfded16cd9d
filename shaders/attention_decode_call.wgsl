// The uniforms of the split-K decode kernels (attention_decode and
// attention_decode_stream; src/kernels/decode/mod.rs writes them) and the key
// range of a query row, with the contract's rules. Included as
// `// #include attention_decode_call.wgsl`.

// #include attention_rules.wgsl

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;

// The allowed key range [lo, hi] of query row i (hi < lo when none).
fn key_range(i: u32, offset: i32, lengths: i32) -> vec2<i32> {
    return allowed_keys(
        offset + i32(i), p.keys, p.flags, p.left_window, p.right_window, lengths, p.mask_cols
    );
}
