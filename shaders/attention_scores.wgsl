// qk_matmul_output recomputed from Q and K, so the fused path can return
// scores or probabilities without the unfused path.
//
// One invocation per (query row, key); a workgroup covers 64 keys of one row.
// For key j of row i it computes s = scale * q_i . k_j and writes, by mode:
//   0: s;  1: softcap(s);  2: softcap(s) + bias (mask and ALiBi), or -inf when
//      the key is masked;
//   3: softcap(s) + bias, or MASKED (-f32::MAX) when masked; the host then runs
//      softmax.wgsl over these rows in place (dividing by the temperature), so each row's max and sum come
//      from the very scores being normalised. (exp(s - lse) with the fused
//      kernel's lse is off by the rounding difference between the two kernels'
//      dot products: 2e-3 at logits of 1e4.)
// The rules are every attention kernel's (attention_score.wgsl).

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> mask: array<f32>;
@group(0) @binding(4) var<storage, read> nonpad: array<i32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;

// #include attention_rules.wgsl
// #include attention_score.wgsl

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let block = wid.x + wid.y * nwg.x;
    let row = block / p.key_blocks;
    let j = (block % p.key_blocks) * 64u + li;
    if (row >= p.batch * p.q_heads * p.q_len || j >= p.keys) {
        return;
    }
    let i = row % p.q_len;
    let head_index = row / p.q_len;
    let b = head_index / p.q_heads;
    let h = head_index % p.q_heads;
    let kvh = h / p.group;

    var dot = 0.0;
    let q_base = row * p.dk;
    let k_base = ((b * p.kv_heads + kvh) * p.keys + j) * p.dk;
    for (var d = 0u; d < p.dk; d += 4u) {
        var qq = vec4<f32>(0.0);
        var kk = vec4<f32>(0.0);
        for (var c = 0u; c < 4u; c++) {
            if (d + c < p.dk) {
                qq[c] = q[q_base + d + c];
                kk[c] = k[k_base + d + c];
            }
        }
        let prod = qq * kk;
        dot += (prod.x + prod.y) + (prod.z + prod.w);
    }
    let index = row * p.keys + j;
    if (p.mode == 0u) {
        out[index] = bitcast<u32>(dot * p.scale);
        return;
    }
    let s = capped(dot * p.scale);
    if (p.mode == 1u) {
        out[index] = bitcast<u32>(s);
        return;
    }
    let lengths = batch_lengths(b);
    let pos = position_offset(lengths) + i32(i);
    let range = allowed_keys(pos, lengths);
    var biased_score = Biased(MASKED, false);
    if (i32(j) >= range.x && i32(j) <= range.y) {
        let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride + i * p.mask_row_stride;
        biased_score = biased(s, mask_base + j, pos - i32(j), head_slope(h));
    }
    if (p.mode == 2u) {
        out[index] = select(NEG_INF_BITS, bitcast<u32>(biased_score.s), biased_score.attended);
        return;
    }
    out[index] = bitcast<u32>(biased_score.s);
}
