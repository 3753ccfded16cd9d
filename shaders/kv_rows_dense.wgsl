// K and V as one tensor [B, Hkv, T, D] (the KV_ROWS slot of
// attention_decode.wgsl): key `key` of batch b's KV head kvh is row
// (b * Hkv + kvh) * T + key.
fn kv_row(b: u32, kvh: u32, key: u32) -> u32 {
    return (b * p.kv_heads + kvh) * p.keys + key;
}
