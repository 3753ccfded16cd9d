// Fused attention (FlashAttention-2 forward), portable: no subgroups, runs on
// any WebGPU adapter within its workgroup-memory limit.
//
// A workgroup owns BQ consecutive query rows of one (batch, query head); each
// invocation owns one row. Keys are streamed in tiles of BK: the workgroup
// copies K[j0 .. j0+BK] and V[j0 .. j0+BK] into workgroup memory (vec4s, head
// dims padded to 4), then each invocation scores its row against the tile,
// updates its running max m and sum l (online softmax: O and l are rescaled by
// exp((m_old - m_new) / temperature) when the max grows), and accumulates O += p * v. The
// Nq x T score matrix is never written. At the end O / l goes to Y and
// m / temperature + log(l) to the logsumexp (m is the maximum of the biased
// scores, before the temperature: see tempered()); the row's m and l also go
// to `stats`, for the score recompute kernel.
//
// The unnormalised O accumulates in the row's own slice of Y (read, rescaled
// and written back once per tile): only the invocation that owns a row touches
// it, and no private array larger than one tile's scores is needed, whatever
// the head dims (up to 256).
//
// The contract (see AttentionOptions): scale, softcap before any bias, ALiBi
// (slopes in the rule data after the lengths), temperature after the bias, causal
// and windows with the position offset (past length, else nonpad - Nq, else 0),
// nonpad lengths, an additive mask broadcast by strides (bool masks arrive as
// 0 / MASKED) whose columns past mask_cols are masked, GQA (query head h reads
// KV head h / group), Dk != Dv. A row with every key masked gets Y = 0 and a
// logsumexp of -inf. Masked keys never enter a sum, even with a non-finite score.
//
// Non-finite values where a row attends them (see AttentionOptions): a NaN or
// +inf biased score, or attended scores that are all -inf, make the row NaN
// (Y and logsumexp); an attended key with a score of -inf gets probability 0
// but still multiplies its V row, so a NaN in V reaches every row that
// attends that key. Per row the kernel keeps FLAG_ATTENDED and FLAG_POISONED
// beside (m, l); between key chunks they ride in the row's logsumexp slot.
//
// Tiles no row of the workgroup can see are skipped: the workgroup's key range
// is [lo of its first row, hi of its last row], computed from uniform values
// (nonpad goes through workgroupUniformLoad) so every barrier stays in uniform
// control flow.
//
// Resumable over key chunks: a dispatch covers keys [chunk_start, chunk_end)
// and carries the online-softmax state (O in Y, m and l in `stats`) from the
// previous chunk's dispatch; only the last chunk normalises. One chunk covers
// all keys except on drivers that cap the loop iterations of an invocation
// (llvmpipe stops every loop of an invocation after about 65535 iterations in
// all, silently), where the host sizes chunks to stay under the cap.

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
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
// [lse (as bits) | row max m | row sum l], one entry each per row.
@group(0) @binding(7) var<storage, read_write> lse: array<u32>;

// Where key `key` of batch b's KV head kvh is stored, in rows of K (and V):
// the KV_ROWS slot holds shaders/kv_rows_dense.wgsl ([B, Hkv, T, D]), or in
// the paged variant (attention_fused_paged: a paged cache's prefill)
// shaders/kv_rows_paged.wgsl, which reads the row's page from the
// sequence's block table.
// #include KV_ROWS

// The most keys per tile (the private score array's length).
const MAX_BK: u32 = 64u;

var<workgroup> k_tile: array<vec4<f32>, BK * DK4>;
var<workgroup> v_tile: array<vec4<f32>, BK * DV4>;
var<workgroup> batch_nonpad: i32;

// Loads four consecutive values of a head-dim row, zero past `len`.
fn quad(src: u32, base: u32, d: u32, len: u32) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (d + c < len) {
            if (src == 0u) {
                out[c] = k[base + d + c];
            } else {
                out[c] = v[base + d + c];
            }
        }
    }
    return out;
}

// Four values of the row's Y slice from element d (zeros past Dv).
fn y_quad(base: u32, d: u32) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (d + c < p.dv) {
            out[c] = y[base + d + c];
        }
    }
    return out;
}

fn store_y_quad(base: u32, d: u32, val: vec4<f32>) {
    for (var c = 0u; c < 4u; c++) {
        if (d + c < p.dv) {
            y[base + d + c] = val[c];
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
    // The workgroup's key range: rows' ranges grow with the row index.
    let last_row = min(row0 + BQ - 1u, p.q_len - 1u);
    let first = key_range(row0, offset, lengths);
    let last = key_range(last_row, offset, lengths);
    let wg_lo = max(first.x, i32(p.chunk_start));
    let wg_hi = select(min(last.y, i32(p.chunk_end) - 1), -1, !live_block);
    let mine = key_range(min(i, p.q_len - 1u), offset, lengths);

    let row = min(i, p.q_len - 1u);
    let q_base = (head_index * p.q_len + row) * p.dk;
    let y_base = (head_index * p.q_len + row) * p.dv;
    let rows = p.batch * p.q_heads * p.q_len;
    let r = head_index * p.q_len + row;
    var m = MASKED;
    var l = 0.0;
    var row_flags = 0u;
    if ((p.chunk_flags & FIRST_CHUNK) == 0u) {
        row_flags = lse[r];
        m = bitcast<f32>(lse[rows + r]);
        l = bitcast<f32>(lse[2u * rows + r]);
    }
    var scores: array<f32, MAX_BK>;
    let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride + row * p.mask_row_stride;
    // ALiBi: this head's slope follows the batch's lengths in the rule data.
    let slope = head_slope(h);
    let pos = offset + i32(row);

    var j0 = wg_lo - wg_lo % i32(BK);
    for (; j0 <= wg_hi; j0 += i32(BK)) {
        // Stage the tile (zeros past the last key and past the head dims).
        for (var slot = li; slot < BK * DK4; slot += BQ) {
            let key = u32(j0) + slot / DK4;
            let d = (slot % DK4) * 4u;
            var val = vec4<f32>(0.0);
            if (key < p.keys) {
                val = quad(0u, kv_row(b, kvh, key) * p.dk, d, p.dk);
            }
            k_tile[slot] = val;
        }
        for (var slot = li; slot < BK * DV4; slot += BQ) {
            let key = u32(j0) + slot / DV4;
            let d = (slot % DV4) * 4u;
            var val = vec4<f32>(0.0);
            if (key < p.keys) {
                val = quad(1u, kv_row(b, kvh, key) * p.dv, d, p.dv);
            }
            v_tile[slot] = val;
        }
        workgroupBarrier();

        if (live_row) {
            // Dot products, one Q vec4 at a time against every key of the tile.
            for (var t = 0u; t < BK; t++) {
                scores[t] = 0.0;
            }
            for (var d4 = 0u; d4 < DK4; d4++) {
                var qq = vec4<f32>(0.0);
                for (var c = 0u; c < 4u; c++) {
                    if (d4 * 4u + c < p.dk) {
                        qq[c] = q[q_base + d4 * 4u + c];
                    }
                }
                for (var t = 0u; t < BK; t++) {
                    let prod = qq * k_tile[t * DK4 + d4];
                    scores[t] += (prod.x + prod.y) + (prod.z + prod.w);
                }
            }
            // The rules (attention_score.wgsl): keys the row does not
            // attend become MASKED; a NaN or +inf score poisons the row and
            // counts as -inf from here on. ROW_ATTENDED joins the row's
            // flags after the tile: Y holds O only from then on.
            var tile_max = MASKED;
            var tile_attended = false;
            let span = vec4<i32>(mine.x, mine.y, bitcast<i32>(mask_base), pos);
            for (var t = 0u; t < BK; t++) {
                let sc = scored(scores[t], j0 + i32(t), span, slope);
                row_flags |= sc.flags & ROW_POISONED;
                tile_attended = tile_attended || sc.flags != 0u;
                tile_max = max(tile_max, sc.s);
                scores[t] = sc.s;
            }
            if (tile_attended) {
                let m_new = max(m, tile_max);
                // exp(0) = 1 while no attended score has been finite yet.
                let alpha = exp(tempered(m - m_new, p.inv_temperature));
                l = l * alpha;
                for (var t = 0u; t < BK; t++) {
                    // -1 marks a key the row does not attend; an attended key
                    // whose score is -inf gets 0 and still multiplies V.
                    let pt = select(-1.0, exp(tempered(scores[t] - m_new, p.inv_temperature)), scores[t] != MASKED);
                    scores[t] = pt;
                    l += max(pt, 0.0);
                }
                // O = alpha * O + P V, in the row's slice of Y (which holds
                // nothing before the row's first attended key).
                let had = (row_flags & ROW_ATTENDED) != 0u;
                for (var d4 = 0u; d4 < DV4; d4++) {
                    var acc = vec4<f32>(0.0);
                    if (had) {
                        acc = y_quad(y_base, d4 * 4u) * alpha;
                    }
                    for (var t = 0u; t < BK; t++) {
                        if (scores[t] >= 0.0) {
                            acc += scores[t] * v_tile[t * DV4 + d4];
                        }
                    }
                    store_y_quad(y_base, d4 * 4u, acc);
                }
                m = m_new;
                row_flags |= ROW_ATTENDED;
            }
        }
        workgroupBarrier();
    }

    if (live_row && (p.chunk_flags & LAST_CHUNK) == 0u) {
        lse[r] = row_flags;
        lse[rows + r] = bitcast<u32>(m);
        lse[2u * rows + r] = bitcast<u32>(l);
    }
    if (live_row && (p.chunk_flags & LAST_CHUNK) != 0u) {
        // Normalise. A row with no attended key was never written: zeros and
        // -inf. A poisoned row, or one whose attended scores were all -inf
        // (l = 0), is NaN.
        let attended = (row_flags & ROW_ATTENDED) != 0u;
        let nan_row = attended && ((row_flags & ROW_POISONED) != 0u || !(l > 0.0));
        let inv = select(0.0, 1.0 / l, l > 0.0);
        for (var d4 = 0u; d4 < DV4; d4++) {
            var val = vec4<f32>(0.0);
            if (nan_row) {
                val = vec4<f32>(nan());
            } else if (attended) {
                val = y_quad(y_base, d4 * 4u) * inv;
            }
            store_y_quad(y_base, d4 * 4u, val);
        }
        var bits = NEG_INF_BITS;
        if (nan_row) {
            bits = NAN_BITS;
        } else if (attended) {
            bits = bitcast<u32>(tempered(m, p.inv_temperature) + log(l));
        }
        lse[r] = bits;
        lse[rows + r] = bitcast<u32>(m);
        lse[2u * rows + r] = bitcast<u32>(select(l, nan(), nan_row));
    }
}
