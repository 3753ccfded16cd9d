// dQ of fused attention (FlashAttention-2's backward, the query side): a
// workgroup owns BQ consecutive query rows of one (batch, query head), one
// invocation per row, and streams K and V in tiles of BK keys through
// workgroup memory as the forward (attention_fused.wgsl) does. For each key
// the row attends, its probability is recomputed from the forward's
// logsumexp, P = exp(biased / τ - lse), never stored; then dP = dY·v,
// d(biased) = P (dP - D) / τ (D from attention_backward_rows.wgsl), the chain
// through softcap (capped_slope) and the scale, and dQ_i += scale·d(raw)·k.
// The scores are summed in the forward's order (vec4 quads), so P matches the
// logsumexp it came with.
//
// The rules come from attention_score.wgsl, as the forward's: a key the row
// does not attend gets no gradient; a fully masked row (lse -inf) has none
// and its dQ is 0; a row the forward made NaN (lse NaN) gets NaN.
//
// dQ accumulates in the row's own slice of the output (one invocation owns a
// row, so no two write it, and no atomics): deterministic bit for bit.
// Resumable over key chunks (for drivers that cap loop iterations): the
// first chunk starts the row at 0, the others add to it.

// Query rows per workgroup (one per invocation).
override BQ: u32 = 64u;
// Keys per tile.
override BK: u32 = 32u;
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
@group(0) @binding(8) var<storage, read_write> dq: array<f32>;

// The most keys per tile (the private arrays' length).
const MAX_BK: u32 = 64u;

var<workgroup> k_tile: array<vec4<f32>, BK * DK4>;
var<workgroup> v_tile: array<vec4<f32>, BK * DV4>;
var<workgroup> batch_nonpad: i32;

// Four consecutive values of a row of `src` (0: K, 1: V, 2: Q, 3: dY, 4:
// dQ) from element d, zeros past `len`.
fn quad(src: u32, base: u32, d: u32, len: u32) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (d + c < len) {
            switch (src) {
                case 0u: { out[c] = k[base + d + c]; }
                case 1u: { out[c] = v[base + d + c]; }
                case 2u: { out[c] = q[base + d + c]; }
                case 3u: { out[c] = dy[base + d + c]; }
                default: { out[c] = dq[base + d + c]; }
            }
        }
    }
    return out;
}

fn store_dq_quad(base: u32, d: u32, val: vec4<f32>) {
    for (var c = 0u; c < 4u; c++) {
        if (d + c < p.dk) {
            dq[base + d + c] = val[c];
        }
    }
}

@compute @workgroup_size(BQ, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    // Workgroups beyond the last block still reach every barrier below.
    let block = wid.x + wid.y * nwg.x;
    let head_index = min(block / p.q_blocks, p.batch * p.q_heads - 1u);
    let live_block = block < p.q_blocks * p.batch * p.q_heads;
    let b = head_index / p.q_heads;
    let h = head_index % p.q_heads;
    let kvh = h / p.group;
    let row0 = (block % p.q_blocks) * BQ;
    let i = row0 + li;
    let live_row = live_block && i < p.q_len;

    if (li == 0u) {
        batch_nonpad = batch_lengths(b);
    }
    let lengths = workgroupUniformLoad(&batch_nonpad);
    let offset = position_offset(lengths);
    let last_row = min(row0 + BQ - 1u, p.q_len - 1u);
    let first = key_range(row0, offset, lengths);
    let last = key_range(last_row, offset, lengths);
    let wg_lo = max(first.x, i32(p.chunk_start));
    let wg_hi = select(min(last.y, i32(p.chunk_end) - 1), -1, !live_block);

    let row = min(i, p.q_len - 1u);
    let mine = key_range(row, offset, lengths);
    let r = head_index * p.q_len + row;
    let rows = p.batch * p.q_heads * p.q_len;
    let q_base = r * p.dk;
    let dy_base = r * p.dv;
    let kv_base = (b * p.kv_heads + kvh) * p.keys;
    let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride + row * p.mask_row_stride;
    let slope = head_slope(h);
    let pos = offset + i32(row);
    // exp(biased / τ - lse) as exp((biased - lse·τ) / τ): no overflow for a
    // biased score near f32::MAX at a temperature below 1.
    let lse_t = stats[r] / p.inv_temperature;
    let d_row = stats[rows + r];

    if (live_row && (p.chunk_flags & FIRST_CHUNK) != 0u) {
        for (var d4 = 0u; d4 < DK4; d4++) {
            store_dq_quad(q_base, d4 * 4u, vec4<f32>(0.0));
        }
    }

    var scores: array<f32, MAX_BK>;
    var dps: array<f32, MAX_BK>;
    // Keys the row attends: only they reach dQ (a masked key's K may hold NaN).
    var attended: array<bool, MAX_BK>;
    var j0 = wg_lo - wg_lo % i32(BK);
    for (; j0 <= wg_hi; j0 += i32(BK)) {
        for (var slot = li; slot < BK * DK4; slot += BQ) {
            let key = u32(j0) + slot / DK4;
            var val = vec4<f32>(0.0);
            if (key < p.keys) {
                val = quad(0u, (kv_base + key) * p.dk, (slot % DK4) * 4u, p.dk);
            }
            k_tile[slot] = val;
        }
        for (var slot = li; slot < BK * DV4; slot += BQ) {
            let key = u32(j0) + slot / DV4;
            var val = vec4<f32>(0.0);
            if (key < p.keys) {
                val = quad(1u, (kv_base + key) * p.dv, (slot % DV4) * 4u, p.dv);
            }
            v_tile[slot] = val;
        }
        workgroupBarrier();

        if (live_row) {
            for (var t = 0u; t < BK; t++) {
                scores[t] = 0.0;
                dps[t] = 0.0;
            }
            for (var d4 = 0u; d4 < DK4; d4++) {
                let qq = quad(2u, q_base, d4 * 4u, p.dk);
                for (var t = 0u; t < BK; t++) {
                    let prod = qq * k_tile[t * DK4 + d4];
                    scores[t] += (prod.x + prod.y) + (prod.z + prod.w);
                }
            }
            for (var d4 = 0u; d4 < DV4; d4++) {
                let g = quad(3u, dy_base, d4 * 4u, p.dv);
                for (var t = 0u; t < BK; t++) {
                    // Summed as attention_backward_rows.wgsl sums D, so that
                    // dP - D cancels exactly where a row's P is one-hot.
                    let prod = g * v_tile[t * DV4 + d4];
                    dps[t] += (prod.x + prod.y) + (prod.z + prod.w);
                }
            }
            // scale · d(raw) per key the row attends.
            var any = false;
            for (var t = 0u; t < BK; t++) {
                let j = j0 + i32(t);
                var grad = 0.0;
                attended[t] = false;
                if (j >= mine.x && j <= mine.y) {
                    let raw = scores[t] * p.scale;
                    let bb = biased(capped(raw), mask_base + u32(j), pos - j, slope);
                    if (bb.attended) {
                        let prob = exp(tempered(bb.s - lse_t, p.inv_temperature));
                        let d_biased = tempered(prob * (dps[t] - d_row), p.inv_temperature);
                        grad = p.scale * d_biased * capped_slope(raw);
                        attended[t] = true;
                        any = true;
                    }
                }
                scores[t] = grad;
            }
            if (any) {
                for (var d4 = 0u; d4 < DK4; d4++) {
                    var acc = quad(4u, q_base, d4 * 4u, p.dk);
                    for (var t = 0u; t < BK; t++) {
                        if (attended[t]) {
                            acc += scores[t] * k_tile[t * DK4 + d4];
                        }
                    }
                    store_dq_quad(q_base, d4 * 4u, acc);
                }
            }
        }
        workgroupBarrier();
    }
}
