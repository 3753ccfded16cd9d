// K and V in the pages of a paged cache (the KV_ROWS slot of the paged
// decode kernels): page g holds [Hkv, PAGE, D], and sequence b's key `key`
// lives on page block_table[b * pages_per_sequence + key / PAGE] at row
// key % PAGE. p.keys is the batch's longest sequence rounded up to whole
// pages, so each sequence's row of the table holds p.keys / PAGE pages (the
// unused tail names page 0, whose keys the lengths mask).
@group(0) @binding(8) var<storage, read> block_table: array<u32>;

// Tokens per page: a power of two from 16 to 256 (src/paged).
override PAGE: u32 = 16u;

fn kv_row(b: u32, kvh: u32, key: u32) -> u32 {
    let page = block_table[b * (p.keys / PAGE) + key / PAGE];
    return (page * p.kv_heads + kvh) * PAGE + key % PAGE;
}
