// The uniforms of the fused attention kernels (attention_fused, _tiled, _sg,
// _coop; src/kernels/attention/mod.rs writes them) and the key range of a query row,
// with the contract's rules. Included as `// #include attention_call.wgsl`.

// #include attention_rules.wgsl

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
    q_blocks: u32,
    kv_heads: u32,
    _pad: u32,
    // 1 / temperature, applied to the biased scores before the softmax.
    inv_temperature: f32,
    _reserved0: u32,
    // Added to every query's position (a piece of a call split across bindings).
    position_shift: i32,
    _reserved2: u32,
    chunk_start: u32,
    chunk_end: u32,
    // FIRST_CHUNK: start from an empty state; LAST_CHUNK: normalise and write lse.
    chunk_flags: u32,
    // attention_coop_packed: keys per (batch, KV head) in the packed K and V
    // (the keys padded to whole tiles); unused elsewhere.
    packed_keys: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// The allowed key range [lo, hi] of query row i (hi < lo when none).
fn key_range(i: u32, offset: i32, lengths: i32) -> vec2<i32> {
    return allowed_keys(
        offset + i32(i), p.keys, p.flags, p.left_window, p.right_window, lengths, p.mask_cols
    );
}
