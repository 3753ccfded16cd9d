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
// The masking rules are attention_fused.wgsl's: causal and windows with the
// position offset, nonpad lengths, the broadcast additive mask, mask_cols.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> mask: array<f32>;
@group(0) @binding(4) var<storage, read> nonpad: array<i32>;
@group(0) @binding(5) var<storage, read_write> out: array<u32>;

// #include attention_rules.wgsl

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
    var s = dot * p.scale;
    let index = row * p.keys + j;
    if (p.mode == 0u) {
        out[index] = bitcast<u32>(s);
        return;
    }
    if ((p.flags & FLAG_SOFTCAP) != 0u) {
        s = p.softcap * accurate_tanh(s / p.softcap);
    }
    if (p.mode == 1u) {
        out[index] = bitcast<u32>(s);
        return;
    }

    var lengths = i32(p.keys);
    var offset = 0;
    if ((p.flags & FLAG_NONPAD) != 0u) {
        lengths = nonpad[b];
    }
    if ((p.flags & FLAG_PAST) != 0u) {
        offset = i32(p.past_len);
    } else if ((p.flags & FLAG_NONPAD) != 0u) {
        offset = lengths - i32(p.q_len);
    }
    offset = offset + p.position_shift;
    let pos = offset + i32(i);
    let jj = i32(j);
    var allowed = jj < lengths;
    if ((p.flags & FLAG_CAUSAL) != 0u) {
        allowed = allowed && jj <= pos;
    }
    if (p.right_window >= 0) {
        allowed = allowed && jj <= pos + p.right_window;
    }
    if (p.left_window >= 0) {
        allowed = allowed && jj >= pos - p.left_window;
    }
    if ((p.flags & FLAG_MASK) != 0u) {
        allowed = allowed && j < p.mask_cols;
        if (allowed) {
            // MASKED (and below) masks the key; any other value, NaN included, is added.
            let bias = mask[b * p.mask_batch_stride + h * p.mask_head_stride + i * p.mask_row_stride + j];
            allowed = !(bias <= MASKED);
            s += select(0.0, bias, allowed);
        }
    }
    if (allowed && (p.flags & FLAG_ALIBI) != 0u) {
        s -= bitcast<f32>(nonpad[p.batch + h]) * f32(abs(pos - jj));
    }
    if (p.mode == 2u) {
        out[index] = select(NEG_INF_BITS, bitcast<u32>(s), allowed);
        return;
    }
    out[index] = bitcast<u32>(select(MASKED, s, allowed));
}
