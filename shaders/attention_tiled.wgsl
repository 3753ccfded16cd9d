// Fused attention (FlashAttention-2 forward), register-tiled for GPUs.
//
// A workgroup owns BQ consecutive query rows of one (batch, query head) and
// streams the keys in tiles of BK. Its WG = TQ x TK invocations form a grid:
// invocation (tr, tc) owns the RQ = BQ / TQ query rows tr, tr + TQ, ... and,
// in each key tile, the RK = BK / TK keys tc, tc + TK, ...; in O it owns the
// same rows and the DVT vec4 columns tc, tc + TK, ... of the head dim.
//
// Per workgroup: Q's block is staged once in workgroup memory (vec4s, rows
// padded to QS to spread the banks). Per key tile:
//   1. K's tile is staged in workgroup memory (coalesced: consecutive
//      invocations read consecutive vec4s of a row).
//   2. S = Q K^T as an RQ x RK register micro-tile per invocation; the
//      contract's rules (scale, softcap, mask, ALiBi, temperature, ranges)
//      applied in registers; each invocation's partial row maxima go to
//      workgroup memory.
//   3. Each invocation reads its rows' TK partial maxima, rescales its O
//      registers and its partial row sums by exp(m_old - m_new) and writes its
//      probabilities P to workgroup memory; V's tile replaces K's.
//   4. O += P V as an RQ x DVT (vec4) register micro-tile per invocation.
// O stays in registers for the whole key loop and is written once, with the
// logsumexp, at the end. The row sums are kept as per-invocation partials (the
// same rescaling applies to each) and added up once at the end.
//
// The contract is attention_fused.wgsl's, and so are the uniforms, the
// bindings, the non-finite rules (ROW_ATTENDED / ROW_POISONED, NaN rows, an
// attended -inf score still multiplies its V row, a key not attended never
// does), the workgroup's key range that skips tiles no row can see, and the
// resumable key chunks (O in Y, row state in `stats` between chunks; chunks
// start on tile boundaries).

// Query rows per workgroup, keys per tile.
override BQ: u32 = 32u;
override BK: u32 = 32u;
// The invocation grid: TQ rows x TK columns, WG = TQ * TK invocations.
override TQ: u32 = 16u;
override TK: u32 = 16u;
override WG: u32 = 256u;
// Query rows (BQ / TQ) and keys (BK / TK) per invocation.
override RQ: u32 = 2u;
override RK: u32 = 2u;
// vec4s per K row and per V row (head dims rounded up to 4).
override DK4: u32 = 16u;
override DV4: u32 = 16u;
// vec4 columns of O per invocation: ceil(DV4 / TK).
override DVT: u32 = 1u;
// Row strides of the Q tile and of the K/V tile, in vec4s.
override QS: u32 = 17u;
override KS: u32 = 17u;

// The register arrays' capacities (the host keeps RQ, RK, DVT within them).
const MAX_RQ: u32 = 8u;
const MAX_RK: u32 = 4u;
const MAX_DVT: u32 = 8u;
const MAX_S: u32 = 16u;
const MAX_O: u32 = 16u;

// #include attention_call.wgsl

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> mask: array<f32>;
@group(0) @binding(5) var<storage, read> nonpad: array<i32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
// [lse (as bits) | row max m | row sum l], one entry each per row.
@group(0) @binding(7) var<storage, read_write> lse: array<u32>;

var<workgroup> q_tile: array<vec4<f32>, BQ * QS>;
// K's tile, then V's (rows of KS vec4s).
var<workgroup> kv_tile: array<vec4<f32>, BK * KS>;
// P for the tile, row-major BQ x BK; -1 marks a key the row does not attend.
var<workgroup> p_tile: array<f32, BQ * BK>;
// Per row, each column invocation's partial max (in the key loop) or partial
// row sum (at the end).
var<workgroup> row_parts: array<f32, BQ * TK>;
var<workgroup> row_flags: array<atomic<u32>, BQ>;
var<workgroup> batch_nonpad: i32;

// Four consecutive values of a row of Q (src 0), K (1) or V (2) from element
// d, zero past `len`.
fn quad(src: u32, base: u32, d: u32, len: u32) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (d + c < len) {
            let at = base + d + c;
            if (src == 0u) {
                out[c] = q[at];
            } else if (src == 1u) {
                out[c] = k[at];
            } else {
                out[c] = v[at];
            }
        }
    }
    return out;
}

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

@compute @workgroup_size(WG, 1, 1)
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
    let tr = li / TK;
    let tc = li % TK;
    let rows_total = p.batch * p.q_heads * p.q_len;

    if (li == 0u) {
        var lengths = i32(p.keys);
        if ((p.flags & FLAG_NONPAD) != 0u) {
            lengths = nonpad[b];
        }
        batch_nonpad = lengths;
    }
    for (var r = li; r < BQ; r += WG) {
        atomicStore(&row_flags[r], 0u);
    }
    // Q's block, zeros past the last row and past Dk.
    for (var slot = li; slot < BQ * DK4; slot += WG) {
        let rr = slot / DK4;
        let d4 = slot % DK4;
        let row = row0 + rr;
        var val = vec4<f32>(0.0);
        if (live_block && row < p.q_len) {
            val = quad(0u, (head_index * p.q_len + row) * p.dk, d4 * 4u, p.dk);
        }
        q_tile[rr * QS + d4] = val;
    }
    let lengths = workgroupUniformLoad(&batch_nonpad);
    var offset = 0;
    if ((p.flags & FLAG_PAST) != 0u) {
        offset = i32(p.past_len);
    } else if ((p.flags & FLAG_NONPAD) != 0u) {
        offset = lengths - i32(p.q_len);
    }
    offset = offset + p.position_shift;
    // The workgroup's key range: rows' ranges grow with the row index.
    let last_row = min(row0 + BQ - 1u, p.q_len - 1u);
    let first = key_range(row0, offset, lengths);
    let last = key_range(last_row, offset, lengths);
    let wg_lo = max(first.x, i32(p.chunk_start));
    let wg_hi = select(min(last.y, i32(p.chunk_end) - 1), -1, !live_block);

    // This invocation's rows: their ranges (within the chunk), positions and
    // online-softmax state.
    var live: array<bool, MAX_RQ>;
    var row_of: array<u32, MAX_RQ>;
    var lo: array<i32, MAX_RQ>;
    var hi: array<i32, MAX_RQ>;
    var m: array<f32, MAX_RQ>;
    var l: array<f32, MAX_RQ>;
    var fl: array<u32, MAX_RQ>;
    var o: array<vec4<f32>, MAX_O>;
    for (var i = 0u; i < RQ; i++) {
        let row = row0 + tr + TQ * i;
        live[i] = live_block && row < p.q_len;
        row_of[i] = min(row, p.q_len - 1u);
        let range = key_range(row_of[i], offset, lengths);
        lo[i] = max(range.x, i32(p.chunk_start));
        hi[i] = min(range.y, i32(p.chunk_end) - 1);
        m[i] = MASKED;
        l[i] = 0.0;
        fl[i] = 0u;
        for (var c = 0u; c < DVT; c++) {
            o[i * DVT + c] = vec4<f32>(0.0);
        }
        if ((p.chunk_flags & FIRST_CHUNK) == 0u && live[i]) {
            // Resume: the row's state from the previous chunk. Its sum is
            // taken by column 0 only (the partial sums add up at the end).
            let r = head_index * p.q_len + row_of[i];
            fl[i] = lse[r];
            m[i] = bitcast<f32>(lse[rows_total + r]);
            if (tc == 0u) {
                l[i] = bitcast<f32>(lse[2u * rows_total + r]);
            }
            if ((fl[i] & ROW_ATTENDED) != 0u) {
                for (var c = 0u; c < DVT; c++) {
                    let col = tc + TK * c;
                    if (col < DV4) {
                        o[i * DVT + c] = y_quad(r * p.dv, col * 4u);
                    }
                }
            }
        }
    }
    let kv_base = (b * p.kv_heads + kvh) * p.keys;
    var slope = 0.0;
    if ((p.flags & FLAG_ALIBI) != 0u) {
        slope = bitcast<f32>(nonpad[p.batch + h]);
    }

    var j0 = wg_lo - wg_lo % i32(BK);
    for (; j0 <= wg_hi; j0 += i32(BK)) {
        // 1. K's tile (zeros past the last key and past Dk).
        for (var slot = li; slot < BK * DK4; slot += WG) {
            let t = slot / DK4;
            let d4 = slot % DK4;
            let key = u32(j0) + t;
            var val = vec4<f32>(0.0);
            if (key < p.keys) {
                val = quad(1u, (kv_base + key) * p.dk, d4 * 4u, p.dk);
            }
            kv_tile[t * KS + d4] = val;
        }
        workgroupBarrier();

        // 2. S = Q K^T, RQ x RK per invocation.
        var s: array<f32, MAX_S>;
        for (var e = 0u; e < RQ * RK; e++) {
            s[e] = 0.0;
        }
        for (var d4 = 0u; d4 < DK4; d4++) {
            var kk: array<vec4<f32>, MAX_RK>;
            for (var j = 0u; j < RK; j++) {
                kk[j] = kv_tile[(tc + TK * j) * KS + d4];
            }
            for (var i = 0u; i < RQ; i++) {
                let qq = q_tile[(tr + TQ * i) * QS + d4];
                for (var j = 0u; j < RK; j++) {
                    let prod = qq * kk[j];
                    s[i * RK + j] += (prod.x + prod.y) + (prod.z + prod.w);
                }
            }
        }
        // Scale, softcap, mask, ALiBi, temperature. Keys a row does not
        // attend become MASKED; a NaN or +inf score poisons the row and counts
        // as -inf from here on.
        for (var i = 0u; i < RQ; i++) {
            let pos = offset + i32(row_of[i]);
            let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride
                + row_of[i] * p.mask_row_stride;
            var part = MASKED;
            for (var j = 0u; j < RK; j++) {
                let key = j0 + i32(tc + TK * j);
                var sc = MASKED;
                var attended = live[i] && key >= lo[i] && key <= hi[i];
                if (attended) {
                    sc = s[i * RK + j] * p.scale;
                    if ((p.flags & FLAG_SOFTCAP) != 0u) {
                        sc = p.softcap * accurate_tanh(sc / p.softcap);
                    }
                    if ((p.flags & FLAG_MASK) != 0u) {
                        let bias = mask[mask_base + u32(key)];
                        if (bias <= MASKED) {
                            attended = false;
                        } else {
                            sc += bias;
                        }
                    }
                }
                if (attended) {
                    if ((p.flags & FLAG_ALIBI) != 0u) {
                        sc -= slope * f32(abs(pos - key));
                    }
                    sc *= p.inv_temperature;
                    if (poisons(sc)) {
                        fl[i] |= ROW_POISONED;
                        sc = neg_inf();
                    }
                    fl[i] |= ROW_ATTENDED;
                    part = max(part, sc);
                } else {
                    sc = MASKED;
                }
                s[i * RK + j] = sc;
            }
            row_parts[(tr + TQ * i) * TK + tc] = part;
        }
        workgroupBarrier();

        // 3. The rows' new maxima; O and the partial sums rescaled; P.
        for (var i = 0u; i < RQ; i++) {
            let rr = tr + TQ * i;
            var tile_max = MASKED;
            for (var t = 0u; t < TK; t++) {
                tile_max = max(tile_max, row_parts[rr * TK + t]);
            }
            let m_new = max(m[i], tile_max);
            // exp(0) = 1 while no attended score has been finite yet.
            let alpha = exp(m[i] - m_new);
            var sum = 0.0;
            for (var j = 0u; j < RK; j++) {
                let sc = s[i * RK + j];
                // -1 marks a key the row does not attend; an attended key
                // whose score is -inf gets 0 and still multiplies V.
                let pt = select(-1.0, exp(sc - m_new), sc != MASKED);
                p_tile[rr * BK + tc + TK * j] = pt;
                sum += max(pt, 0.0);
            }
            l[i] = l[i] * alpha + sum;
            for (var c = 0u; c < DVT; c++) {
                o[i * DVT + c] *= alpha;
            }
            m[i] = m_new;
        }
        // V's tile replaces K's (every read of K ended at the barrier above).
        for (var slot = li; slot < BK * DV4; slot += WG) {
            let t = slot / DV4;
            let d4 = slot % DV4;
            let key = u32(j0) + t;
            var val = vec4<f32>(0.0);
            if (key < p.keys) {
                val = quad(2u, (kv_base + key) * p.dv, d4 * 4u, p.dv);
            }
            kv_tile[t * KS + d4] = val;
        }
        workgroupBarrier();

        // 4. O += P V, RQ x DVT vec4s per invocation.
        for (var t = 0u; t < BK; t++) {
            var vv: array<vec4<f32>, MAX_DVT>;
            for (var c = 0u; c < DVT; c++) {
                // Columns past Dv read some vec4 of the tile and are never stored.
                vv[c] = kv_tile[t * KS + min(tc + TK * c, DV4 - 1u)];
            }
            for (var i = 0u; i < RQ; i++) {
                let pt = p_tile[(tr + TQ * i) * BK + t];
                for (var c = 0u; c < DVT; c++) {
                    o[i * DVT + c] += select(vec4<f32>(0.0), pt * vv[c], pt >= 0.0);
                }
            }
        }
        workgroupBarrier();
    }

    // The rows' sums and flags, gathered from their TK invocations.
    for (var i = 0u; i < RQ; i++) {
        let rr = tr + TQ * i;
        row_parts[rr * TK + tc] = l[i];
        atomicOr(&row_flags[rr], fl[i]);
    }
    workgroupBarrier();
    // Every invocation's resume reads of `lse` (the row state) come before
    // column 0 overwrites it below: a storage barrier orders those too.
    storageBarrier();
    for (var i = 0u; i < RQ; i++) {
        if (!live[i]) {
            continue;
        }
        let rr = tr + TQ * i;
        var total = 0.0;
        for (var t = 0u; t < TK; t++) {
            total += row_parts[rr * TK + t];
        }
        let flags = atomicLoad(&row_flags[rr]);
        let r = head_index * p.q_len + row_of[i];
        let y_base = r * p.dv;
        if ((p.chunk_flags & LAST_CHUNK) == 0u) {
            for (var c = 0u; c < DVT; c++) {
                let col = tc + TK * c;
                if (col < DV4) {
                    store_y_quad(y_base, col * 4u, o[i * DVT + c]);
                }
            }
            if (tc == 0u) {
                lse[r] = flags;
                lse[rows_total + r] = bitcast<u32>(m[i]);
                lse[2u * rows_total + r] = bitcast<u32>(total);
            }
            continue;
        }
        // Normalise. A row with no attended key gets zeros and -inf; a
        // poisoned row, or one whose attended scores were all -inf (sum 0), NaN.
        let attended = (flags & ROW_ATTENDED) != 0u;
        let nan_row = attended && ((flags & ROW_POISONED) != 0u || !(total > 0.0));
        let inv = select(0.0, 1.0 / total, total > 0.0);
        for (var c = 0u; c < DVT; c++) {
            let col = tc + TK * c;
            if (col < DV4) {
                var val = vec4<f32>(0.0);
                if (nan_row) {
                    val = vec4<f32>(nan());
                } else if (attended) {
                    val = o[i * DVT + c] * inv;
                }
                store_y_quad(y_base, col * 4u, val);
            }
        }
        if (tc == 0u) {
            var bits = NEG_INF_BITS;
            if (nan_row) {
                bits = NAN_BITS;
            } else if (attended) {
                bits = bitcast<u32>(m[i] + log(total));
            }
            lse[r] = bits;
            lse[rows_total + r] = bitcast<u32>(m[i]);
            lse[2u * rows_total + r] = bitcast<u32>(select(total, nan(), nan_row));
        }
    }
}
