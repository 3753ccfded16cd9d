// dK and dV of fused attention (FlashAttention-2's backward, the key side): a
// workgroup owns BK consecutive keys of one (batch, KV head), one invocation
// per key, and walks the query rows of every query head of the KV head's
// group in tiles of BQ rows, Q and dY staged in workgroup memory with the
// rows' logsumexp and D. For each row that attends the key, P = exp(biased /
// τ - lse) is recomputed (never stored), dV_j += P·dY_i, and dK_j +=
// scale·d(raw)·q_i with d(biased) = P (dP - D) / τ and the chain through
// softcap, as in attention_backward_dq.wgsl. With GQA the group's query heads
// are summed in order inside the invocation: no atomics, no reduction pass,
// deterministic bit for bit.
//
// Tiles of rows that cannot see any of the workgroup's keys are skipped (the
// rows' key ranges grow with the row, so a tile sees [lo of its first row,
// hi of its last row]; uniform values, so every barrier stays in uniform
// control flow). dK and dV accumulate in the key's own rows of the outputs.
// Resumable over chunks of query rows (for drivers that cap loop
// iterations): the first chunk starts the rows at 0, the others add to them.

// Keys per workgroup (one per invocation).
override BK: u32 = 64u;
// Query rows per tile.
override BQ: u32 = 16u;
// vec4s per K row and per V row (head dims rounded up to 4).
override DK4: u32 = 16u;
override DV4: u32 = 16u;

// #include attention_call.wgsl

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> mask: array<f32>;
@group(0) @binding(5) var<storage, read> nonpad: array<i32>;
@group(0) @binding(6) var<storage, read> dy: array<f32>;
// [lse | D]: the forward's logsumexp, then the rows' dY·Y.
@group(0) @binding(7) var<storage, read> stats: array<f32>;
// [dK | dV]: dK [B, Hkv, T, Dk], then dV [B, Hkv, T, Dv] (one binding for
// both keeps the kernel within WebGPU's 8 storage buffers per stage).
@group(0) @binding(8) var<storage, read_write> grads: array<f32>;

// The most query rows per tile (the private arrays' length).
const MAX_BQ: u32 = 32u;

var<workgroup> q_tile: array<vec4<f32>, BQ * DK4>;
var<workgroup> dy_tile: array<vec4<f32>, BQ * DV4>;
// Per row of the tile: lse·τ and D.
var<workgroup> row_lse: array<f32, BQ>;
var<workgroup> row_d: array<f32, BQ>;
var<workgroup> batch_nonpad: i32;

// Four consecutive values of a row of `src` (0: K, 1: V, 2: Q, 3: dY, 4:
// the gradients) from element d, zeros past `len`.
fn quad(src: u32, base: u32, d: u32, len: u32) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (d + c < len) {
            switch (src) {
                case 0u: { out[c] = k[base + d + c]; }
                case 1u: { out[c] = v[base + d + c]; }
                case 2u: { out[c] = q[base + d + c]; }
                case 3u: { out[c] = dy[base + d + c]; }
                default: { out[c] = grads[base + d + c]; }
            }
        }
    }
    return out;
}

fn store_quad(base: u32, d: u32, len: u32, val: vec4<f32>) {
    for (var c = 0u; c < 4u; c++) {
        if (d + c < len) {
            grads[base + d + c] = val[c];
        }
    }
}

@compute @workgroup_size(BK, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    // Workgroups beyond the last block still reach every barrier below.
    let block = wid.x + wid.y * nwg.x;
    let kv_index = min(block / p.k_blocks, p.batch * p.kv_heads - 1u);
    let live_block = block < p.k_blocks * p.batch * p.kv_heads;
    let b = kv_index / p.kv_heads;
    let kvh = kv_index % p.kv_heads;
    let key0 = (block % p.k_blocks) * BK;
    let live_key = live_block && key0 + li < p.keys;
    let key = min(key0 + li, p.keys - 1u);
    let j = i32(key);
    let key_hi = i32(min(key0 + BK, p.keys)) - 1;

    if (li == 0u) {
        batch_nonpad = batch_lengths(b);
    }
    let lengths = workgroupUniformLoad(&batch_nonpad);
    let offset = position_offset(lengths);
    let rows = p.batch * p.q_heads * p.q_len;
    let k_base = (kv_index * p.keys + key) * p.dk;
    let v_base = (kv_index * p.keys + key) * p.dv;
    // This key's rows of dK and of dV in `grads`.
    let dk_base = k_base;
    let dv_base = p.batch * p.kv_heads * p.keys * p.dk + v_base;

    if (live_key && (p.chunk_flags & FIRST_CHUNK) != 0u) {
        for (var d4 = 0u; d4 < DK4; d4++) {
            store_quad(dk_base, d4 * 4u, p.dk, vec4<f32>(0.0));
        }
        for (var d4 = 0u; d4 < DV4; d4++) {
            store_quad(dv_base, d4 * 4u, p.dv, vec4<f32>(0.0));
        }
    }

    var grads: array<f32, MAX_BQ>;
    var probs: array<f32, MAX_BQ>;
    // Rows that attend this key: only they reach dK and dV.
    var attends: array<bool, MAX_BQ>;
    for (var g = 0u; g < p.group; g++) {
        let h = kvh * p.group + g;
        let head_index = b * p.q_heads + h;
        let slope = head_slope(h);
        for (var i0 = p.chunk_start; i0 < p.chunk_end; i0 += BQ) {
            let i_last = min(i0 + BQ, p.chunk_end) - 1u;
            let seen_lo = key_range(i0, offset, lengths).x;
            let seen_hi = key_range(i_last, offset, lengths).y;
            if (!live_block || seen_hi < i32(key0) || seen_lo > key_hi) {
                continue;
            }
            for (var slot = li; slot < BQ * DK4; slot += BK) {
                let i = i0 + slot / DK4;
                var val = vec4<f32>(0.0);
                if (i <= i_last) {
                    val = quad(2u, (head_index * p.q_len + i) * p.dk, (slot % DK4) * 4u, p.dk);
                }
                q_tile[slot] = val;
            }
            for (var slot = li; slot < BQ * DV4; slot += BK) {
                let i = i0 + slot / DV4;
                var val = vec4<f32>(0.0);
                if (i <= i_last) {
                    val = quad(3u, (head_index * p.q_len + i) * p.dv, (slot % DV4) * 4u, p.dv);
                }
                dy_tile[slot] = val;
            }
            for (var t = li; t < BQ; t += BK) {
                let r = head_index * p.q_len + min(i0 + t, i_last);
                // exp(biased / τ - lse) as exp((biased - lse·τ) / τ): no
                // overflow for a biased score near f32::MAX below τ = 1.
                row_lse[t] = stats[r] / p.inv_temperature;
                row_d[t] = stats[rows + r];
            }
            workgroupBarrier();

            if (live_key) {
                for (var t = 0u; t < BQ; t++) {
                    grads[t] = 0.0;
                    probs[t] = 0.0;
                }
                for (var d4 = 0u; d4 < DK4; d4++) {
                    let kk = quad(0u, k_base, d4 * 4u, p.dk);
                    for (var t = 0u; t < BQ; t++) {
                        let prod = q_tile[t * DK4 + d4] * kk;
                        grads[t] += (prod.x + prod.y) + (prod.z + prod.w);
                    }
                }
                for (var d4 = 0u; d4 < DV4; d4++) {
                    let vv = quad(1u, v_base, d4 * 4u, p.dv);
                    for (var t = 0u; t < BQ; t++) {
                        // Summed as attention_backward_rows.wgsl sums D.
                        let prod = dy_tile[t * DV4 + d4] * vv;
                        probs[t] += (prod.x + prod.y) + (prod.z + prod.w);
                    }
                }
                // Per row: P in probs, scale · d(raw) in grads.
                var any = false;
                for (var t = 0u; t < BQ; t++) {
                    let i = i0 + t;
                    attends[t] = false;
                    if (i <= i_last) {
                        let range = key_range(i, offset, lengths);
                        if (j >= range.x && j <= range.y) {
                            let raw = grads[t] * p.scale;
                            let pos = offset + i32(i);
                            let mask_index = b * p.mask_batch_stride + h * p.mask_head_stride
                                + i * p.mask_row_stride + key;
                            let bb = biased(capped(raw), mask_index, pos - j, slope);
                            if (bb.attended) {
                                let prob = exp(tempered(bb.s - row_lse[t], p.inv_temperature));
                                let d_biased = tempered(prob * (probs[t] - row_d[t]), p.inv_temperature);
                                grads[t] = p.scale * d_biased * capped_slope(raw);
                                probs[t] = prob;
                                attends[t] = true;
                                any = true;
                            }
                        }
                    }
                }
                if (any) {
                    for (var d4 = 0u; d4 < DV4; d4++) {
                        var acc = quad(4u, dv_base, d4 * 4u, p.dv);
                        for (var t = 0u; t < BQ; t++) {
                            if (attends[t]) {
                                acc += probs[t] * dy_tile[t * DV4 + d4];
                            }
                        }
                        store_quad(dv_base, d4 * 4u, p.dv, acc);
                    }
                    for (var d4 = 0u; d4 < DK4; d4++) {
                        var acc = quad(4u, dk_base, d4 * 4u, p.dk);
                        for (var t = 0u; t < BQ; t++) {
                            if (attends[t]) {
                                acc += grads[t] * q_tile[t * DK4 + d4];
                            }
                        }
                        store_quad(dk_base, d4 * 4u, p.dk, acc);
                    }
                }
            }
            workgroupBarrier();
        }
    }
}
