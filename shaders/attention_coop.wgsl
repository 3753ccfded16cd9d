// Fused attention (FlashAttention-2 forward) on the matrix units
// (cooperative matrices): S = Q K^T and O += P V as products of f16 matrices
// accumulated in f32 (Precision::Fast); the online softmax and every rule of
// the contract in f32 scalar code.
//
// A workgroup owns BQ = NSG * CM consecutive query rows of one (batch, query
// head): NSG subgroups of SG invocations, subgroup s the CM-row strip
// s * CM .. s * CM + CM. Q's block is staged once in workgroup memory as f16,
// and each subgroup keeps its strip as matrices for the whole key loop.
// Per key tile of BK keys:
//   1. K's tile is staged as f16 (zeros past the last key and past Dk).
//   2. Each subgroup computes its strip of S (CM x BK: BK / CM accumulators,
//      DKP / CM products each) and stores it to workgroup memory as f32.
//   3. Scalar code, every invocation at work: each row's keys are split in
//      LPR parts of KPI consecutive keys, and each invocation owns RPI
//      (row, part) pairs. Per pair: scale, softcap, mask, ALiBi,
//      temperature, the row's key range, a partial maximum; then (after a
//      barrier) the row's maximum from its parts, P as f16 in workgroup
//      memory, and which keys the row attends as bits (one word set per
//      pair). Meanwhile V's tile replaces K's, and a V value that is NaN or
//      infinite is noted. Each pair keeps a partial row sum; the parts' sums
//      and flags are gathered once, at the end.
//   4. O += P V: each subgroup's strip of O (CM x DVP: DVP / CM accumulators)
//      stays in accumulator matrices for the whole key loop.
//
// The reference maximum is lazy (as in FlashAttention-4): P is exp(s - m)
// against the row's reference m, which moves only when a score exceeds it by
// more than RESCALE, so the O matrices, whose element layout is opaque, are
// seldom rescaled: then each is stored to workgroup memory, its rows scaled,
// and loaded back. P stays below e^4 and is stored times P_SCALE (2^10, so
// below 56,000, inside f16's range): probabilities down to 6e-8 of the
// reference keep f16's 11 bits instead of becoming subnormal. The row sums
// stay f32 and use the unrounded probabilities; O carries the scale until it
// is normalised (Y between key chunks holds it without).
//
// A V tile holding NaN or an infinity is multiplied in scalar code instead,
// into workgroup memory, and added to the O matrices from there: a key a row
// does not attend (P = 0) must not reach it, while an attended key must,
// whether its score is -inf (P = 0, so 0 times inf is NaN) or its
// probability merely rounds to 0 in f16 (then a tiny positive weight stands
// in, so inf stays inf). Every other rule, the uniforms, the

// bindings, the workgroup's key range (tiles no row sees are skipped) and the
// resumable key chunks (O in Y and the row state in `lse` between chunks) are
// attention_tiled.wgsl's.
//
// Matrix operations run at subgroup scope in uniform control flow: every
// loop bound and branch around them depends on uniforms, constants and
// workgroup-uniform loads only.

enable f16;
enable wgpu_cooperative_matrix;

// COOP BEGIN
alias MatA = coop_mat16x16<f16, A>;
alias MatB = coop_mat16x16<f16, B>;
alias MatC = coop_mat16x16<f32, C>;
const CM: u32 = 16u;
// COOP END

// The adapter's (fixed) subgroup width; subgroups per workgroup.
override SG: u32 = 32u;
override NSG: u32 = 4u;
// Query rows per workgroup (one strip per subgroup), invocations.
override BQ: u32 = NSG * CM;
override WG: u32 = NSG * SG;
// Keys per tile (a multiple of CM), and its matrices (BK / CM).
override BK: u32 = 32u;
override BKT: u32 = 2u;
// Head dims rounded up to CM, and their matrices.
override DKP: u32 = 64u;
override DVP: u32 = 64u;
override DKT: u32 = 4u;
override DVT: u32 = 4u;
// Invocations (parts) per row in the scalar steps, keys per part (BK / LPR),
// bit words per part (ceil(KPI / 32)); (row, part) pairs per invocation:
// ceil(BQ * LPR / WG).
override LPR: u32 = 1u;
override KPI: u32 = 32u;
override WPP: u32 = 1u;
override RPI: u32 = 1u;
// Row strides, padded by 16 bytes: Q's tile, the K/V tile (f16); S (f32),
// P (f16), an O block of CM columns (f32).
override QS: u32 = 72u;
override KS: u32 = 72u;
override SS: u32 = 36u;
override PS: u32 = 40u;
override OS: u32 = 20u;
// Words of workgroup scratch: max(BQ * SS, BQ * OS).
override FS: u32 = 2304u;
// u32 words of attended-key bits per row: LPR * WPP.
override BW: u32 = 1u;

// The largest head dim the kernel takes, in matrices; rows per invocation.
const MAX_DT: u32 = 256u / CM;
const MAX_RPI: u32 = 4u;
// The reference maximum moves when a score exceeds it by more than this;
// P is stored times P_SCALE (a power of two: exact to undo).
const RESCALE: f32 = 4.0;
const P_SCALE: f32 = 1024.0;

// #include attention_call.wgsl

// #include attention_qkv4.wgsl
@group(0) @binding(4) var<storage, read> mask: array<f32>;
@group(0) @binding(5) var<storage, read> nonpad: array<i32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
// [lse (as bits) | row max m | row sum l], one entry each per row.
@group(0) @binding(7) var<storage, read_write> lse: array<u32>;

// Q's block, f16, BQ rows of QS.
var<workgroup> q_s: array<f16, BQ * QS>;
// K's tile, then V's, f16, BK rows of KS.
var<workgroup> kv_s: array<f16, BK * KS>;
// S for the tile (rows of SS), or one CM-column block of O (rows of OS).
var<workgroup> f_s: array<f32, FS>;
// P for the tile, f16, rows of PS; 0 where a row does not attend a key.
var<workgroup> p_s: array<f16, BQ * PS>;
// Which keys of the tile each row attends, BW words per row (WPP per part,
// `bit_word`); which of those have a positive probability (one f16 may round
// to 0). At the end att_s gathers the pairs' flags.
var<workgroup> att_s: array<u32, BQ * BW>;
var<workgroup> pos_s: array<u32, BQ * BW>;
// Each row's rescaling factor when the reference maxima move.
var<workgroup> alpha_s: array<f32, BQ>;
// Per (row, part) pair: its partial maximum of the tile; at the end, its
// partial row sum.
var<workgroup> part_s: array<f32, BQ * LPR>;
// The workgroup's scalars, in one 16-byte array: whether any row's reference
// moved (O must be rescaled), whether V's tile holds a non-finite value, the
// batch's nonpad length (as bits). Every workgroup variable here is a multiple
// of 16 bytes, so wherever the driver places them the f16 tiles start
// 16-byte aligned, as the matrix loads require (gemm_coop.wgsl says more).
var<workgroup> wg_scalars: array<u32, 4>;
const WG_RESCALE: u32 = 0u;
const WG_V_BAD: u32 = 1u;
const WG_NONPAD: u32 = 2u;
// Zeros the O and S accumulators start from.
var<workgroup> zero_s: array<f32, CM * CM>;

// The word of `att_s` and `pos_s` that holds key t of row rr, and its bit.
fn bit_word(rr: u32, t: u32) -> u32 {
    return rr * BW + (t / KPI) * WPP + (t % KPI) / 32u;
}

fn key_bit(t: u32) -> u32 {
    return 1u << ((t % KPI) % 32u);
}

fn non_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) >= 0x7f800000u;
}

@compute @workgroup_size(WG, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sg: u32,
) {
    // Workgroups beyond the last block still run every matrix operation and
    // reach every barrier below (on a clamped block), and store nothing.
    let block = wid.x + wid.y * nwg.x;
    let head_index = min(block / p.q_blocks, p.batch * p.q_heads - 1u);
    let live_block = block < p.q_blocks * p.batch * p.q_heads;
    let b = head_index / p.q_heads;
    let h = head_index % p.q_heads;
    let kvh = h / p.group;
    let row0 = (block % p.q_blocks) * BQ;
    let rows_total = p.batch * p.q_heads * p.q_len;
    // This subgroup's strip of rows.
    let strip = sg * CM;

    if (li == 0u) {
        var lengths = i32(p.keys);
        if ((p.flags & FLAG_NONPAD) != 0u) {
            lengths = nonpad[b];
        }
        wg_scalars[WG_NONPAD] = bitcast<u32>(lengths);
        wg_scalars[WG_RESCALE] = 0u;
    }
    // Q's block as f16, zeros past the last row and past Dk, a quad of a
    // row per slot.
    for (var slot = li; slot < BQ * DKP / 4u; slot += WG) {
        let rr = slot / (DKP / 4u);
        let d = (slot % (DKP / 4u)) * 4u;
        let row = row0 + rr;
        var val = vec4<f32>(0.0);
        if (live_block && row < p.q_len) {
            val = quad(0u, (head_index * p.q_len + row) * p.dk, d, p.dk);
        }
        // (Written out: a loop would carry naga's loop counter.)
        let half4 = vec4<f16>(val);
        let at = rr * QS + d;
        q_s[at] = half4.x;
        q_s[at + 1u] = half4.y;
        q_s[at + 2u] = half4.z;
        q_s[at + 3u] = half4.w;
    }
    for (var i = li; i < CM * CM; i += WG) {
        zero_s[i] = 0.0;
    }
    let lengths = bitcast<i32>(workgroupUniformLoad(&wg_scalars[WG_NONPAD]));
    let zero_c = coopLoadT<MatC>(&zero_s[0], CM);
    // This subgroup's strip of Q as matrices, for the whole key loop.
    var q_mat: array<MatA, MAX_DT>;
    for (var d = 0u; d < DKT; d++) {
        q_mat[d] = coopLoadT<MatA>(&q_s[strip * QS + d * CM], QS);
    }
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
    let resume = (p.chunk_flags & FIRST_CHUNK) == 0u;

    // The (row, part) pairs this invocation owns in the scalar steps (pair
    // li + WG i is part (li + WG i) % LPR of row (li + WG i) / LPR): their
    // rows' ranges (within the chunk) and reference maxima (the same in
    // every part of a row), their partial sums and flags.
    var live: array<bool, MAX_RPI>;
    var row_of: array<u32, MAX_RPI>;
    var lo: array<i32, MAX_RPI>;
    var hi: array<i32, MAX_RPI>;
    var m: array<f32, MAX_RPI>;
    var l: array<f32, MAX_RPI>;
    var fl: array<u32, MAX_RPI>;
    for (var i = 0u; i < RPI; i++) {
        let pair = li + WG * i;
        let rr = pair / LPR;
        let row = row0 + rr;
        live[i] = live_block && rr < BQ && row < p.q_len;
        row_of[i] = min(row, p.q_len - 1u);
        let range = key_range(row_of[i], offset, lengths);
        lo[i] = max(range.x, i32(p.chunk_start));
        hi[i] = min(range.y, i32(p.chunk_end) - 1);
        m[i] = MASKED;
        l[i] = 0.0;
        fl[i] = 0u;
        if (resume && live[i]) {
            let r = head_index * p.q_len + row_of[i];
            fl[i] = lse[r];
            m[i] = bitcast<f32>(lse[rows_total + r]);
            // The sum is taken by part 0 only (the parts add up at the end).
            if (pair % LPR == 0u) {
                l[i] = bitcast<f32>(lse[2u * rows_total + r]);
            }
        }
    }

    // The O matrices: zero, or (resuming) the previous chunk's O from Y,
    // one CM-column block at a time through workgroup memory.
    var o_acc: array<MatC, MAX_DT>;
    for (var c = 0u; c < DVT; c++) {
        o_acc[c] = zero_c;
    }
    if (resume) {
        for (var c = 0u; c < DVT; c++) {
            for (var e = li; e < BQ * CM; e += WG) {
                let rr = e / CM;
                let col = c * CM + e % CM;
                let row = row0 + rr;
                var val = 0.0;
                if (live_block && row < p.q_len && col < p.dv) {
                    let r = head_index * p.q_len + row;
                    if ((lse[r] & ROW_ATTENDED) != 0u) {
                        val = y[r * p.dv + col] * P_SCALE;
                    }
                }
                f_s[rr * OS + e % CM] = val;
            }
            workgroupBarrier();
            o_acc[c] = coopLoadT<MatC>(&f_s[strip * OS], OS);
            workgroupBarrier();
        }
    }
    // Every resume read of Y and `lse` comes before the final writes, which
    // other invocations make.
    storageBarrier();

    let kv_base = (b * p.kv_heads + kvh) * p.keys;
    var slope = 0.0;
    if ((p.flags & FLAG_ALIBI) != 0u) {
        slope = bitcast<f32>(nonpad[p.batch + h]);
    }

    var j0 = wg_lo - wg_lo % i32(BK);
    for (; j0 <= wg_hi; j0 += i32(BK)) {
        // 1. K's tile as f16 (zeros past the last key and past Dk), a quad
        // of a row per slot.
        for (var slot = li; slot < BK * DKP / 4u; slot += WG) {
            let t = slot / (DKP / 4u);
            let d = (slot % (DKP / 4u)) * 4u;
            let key = u32(j0) + t;
            var val = vec4<f32>(0.0);
            if (key < p.keys) {
                val = quad(1u, (kv_base + key) * p.dk, d, p.dk);
            }
            let half4 = vec4<f16>(val);
            let at = t * KS + d;
            kv_s[at] = half4.x;
            kv_s[at + 1u] = half4.y;
            kv_s[at + 2u] = half4.z;
            kv_s[at + 3u] = half4.w;
        }
        if (li == 0u) {
            wg_scalars[WG_V_BAD] = 0u;
        }
        workgroupBarrier();

        // 2. This subgroup's strip of S = Q K^T.
        for (var jb = 0u; jb < BKT; jb++) {
            var acc = zero_c;
            for (var d = 0u; d < DKT; d++) {
                // K's rows, read column-major: the matrix K^T.
                let kb = coopLoad<MatB>(&kv_s[jb * CM * KS + d * CM], KS);
                acc = coopMultiplyAdd(q_mat[d], kb, acc);
            }
            coopStoreT(acc, &f_s[strip * SS + jb * CM], SS);
        }
        workgroupBarrier();

        // 3a. The rules and each pair's partial maximum. Keys a row does not
        // attend become MASKED; a NaN or +inf score poisons the row and counts
        // as -inf (P = 0, attended).
        for (var i = 0u; i < RPI; i++) {
            let pair = li + WG * i;
            if (pair >= BQ * LPR) {
                continue;
            }
            let rr = pair / LPR;
            let t0 = (pair % LPR) * KPI;
            let pos = offset + i32(row_of[i]);
            let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride
                + row_of[i] * p.mask_row_stride;
            var part_max = MASKED;
            for (var u = 0u; u < KPI; u++) {
                let t = t0 + u;
                let key = j0 + i32(t);
                var sc = MASKED;
                var attended = live[i] && key >= lo[i] && key <= hi[i];
                if (attended) {
                    sc = f_s[rr * SS + t] * p.scale;
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
                    part_max = max(part_max, sc);
                } else {
                    sc = MASKED;
                }
                f_s[rr * SS + t] = sc;
            }
            part_s[pair] = part_max;
        }
        workgroupBarrier();

        // 3b. The rows' maxima from their parts; the reference maxima, P and
        // the attended keys, pair by pair.
        for (var i = 0u; i < RPI; i++) {
            let pair = li + WG * i;
            if (pair >= BQ * LPR) {
                continue;
            }
            let rr = pair / LPR;
            let t0 = (pair % LPR) * KPI;
            var tile_max = MASKED;
            for (var k = 0u; k < LPR; k++) {
                tile_max = max(tile_max, part_s[rr * LPR + k]);
            }
            // The reference moves the first time a row attends a key, and
            // when a score exceeds it by more than RESCALE (alike in every
            // part of the row: the same maxima, the same test).
            var alpha = 1.0;
            // (tile_max - m, not m + RESCALE: the sum rounds where |m| is large.)
            if (tile_max > MASKED && (m[i] == MASKED || tile_max - m[i] > RESCALE)) {
                let m_new = max(m[i], tile_max);
                // exp(-f32::MAX - m) = 0: the row had no O yet.
                alpha = exp(m[i] - m_new);
                if (m[i] != MASKED) {
                    wg_scalars[WG_RESCALE] = 1u;
                }
                m[i] = m_new;
            }
            if (t0 == 0u) {
                alpha_s[rr] = alpha;
            }
            l[i] *= alpha;
            var bits = 0u;
            var positive = 0u;
            for (var u = 0u; u < KPI; u++) {
                let t = t0 + u;
                let sc = f_s[rr * SS + t];
                var pt = 0.0;
                if (sc != MASKED) {
                    // An attended -inf score: probability 0 (and not
                    // exp(-inf - -inf)), still multiplying its V row.
                    if (sc > neg_inf()) {
                        pt = exp(sc - m[i]);
                    }
                    l[i] += pt;
                    bits |= key_bit(t);
                    if (pt > 0.0) {
                        positive |= key_bit(t);
                    }
                }
                p_s[rr * PS + t] = f16(pt * P_SCALE);
                if (u % 32u == 31u || u == KPI - 1u) {
                    att_s[bit_word(rr, t)] = bits;
                    pos_s[bit_word(rr, t)] = positive;
                    bits = 0u;
                    positive = 0u;
                }
            }
        }
        // V's tile replaces K's (every read of K ended at the barrier above).
        var bad = false;
        for (var slot = li; slot < BK * DVP / 4u; slot += WG) {
            let t = slot / (DVP / 4u);
            let d = (slot % (DVP / 4u)) * 4u;
            let key = u32(j0) + t;
            var val = vec4<f32>(0.0);
            if (key < p.keys) {
                val = quad(2u, (kv_base + key) * p.dv, d, p.dv);
            }
            let rounded = vec4<f16>(val);
            let back = vec4<f32>(rounded);
            bad = bad || any((bitcast<vec4<u32>>(back) & vec4<u32>(0x7fffffffu)) >= vec4<u32>(0x7f800000u));
            let at = t * KS + d;
            kv_s[at] = rounded.x;
            kv_s[at + 1u] = rounded.y;
            kv_s[at + 2u] = rounded.z;
            kv_s[at + 3u] = rounded.w;
        }
        if (bad) {
            wg_scalars[WG_V_BAD] = 1u;
        }
        let rescale = workgroupUniformLoad(&wg_scalars[WG_RESCALE]) != 0u;

        // The O matrices of rows whose reference moved, rescaled.
        if (rescale) {
            for (var c = 0u; c < DVT; c++) {
                coopStoreT(o_acc[c], &f_s[strip * OS], OS);
                workgroupBarrier();
                for (var e = li; e < BQ * CM; e += WG) {
                    let rr = e / CM;
                    f_s[rr * OS + e % CM] *= alpha_s[rr];
                }
                workgroupBarrier();
                o_acc[c] = coopLoadT<MatC>(&f_s[strip * OS], OS);
                workgroupBarrier();
            }
            if (li == 0u) {
                wg_scalars[WG_RESCALE] = 0u;
            }
        }

        // 4. O += P V.
        if (workgroupUniformLoad(&wg_scalars[WG_V_BAD]) != 0u) {
            // In scalar code: the keys a row attends only; a positive
            // probability that rounded to 0 in f16 weighs a tiny amount.
            for (var c = 0u; c < DVT; c++) {
                for (var e = li; e < BQ * CM; e += WG) {
                    let rr = e / CM;
                    let col = c * CM + e % CM;
                    var sum = 0.0;
                    for (var t = 0u; t < BK; t++) {
                        let bit = key_bit(t);
                        let word = bit_word(rr, t);
                        if ((att_s[word] & bit) != 0u) {
                            var pt = f32(p_s[rr * PS + t]);
                            if (pt == 0.0 && (pos_s[word] & bit) != 0u) {
                                pt = 1e-30;
                            }
                            sum += pt * f32(kv_s[t * KS + col]);
                        }
                    }
                    f_s[rr * OS + e % CM] = sum;
                }
                workgroupBarrier();
                o_acc[c] = o_acc[c] + coopLoadT<MatC>(&f_s[strip * OS], OS);
                workgroupBarrier();
            }
        } else {
            for (var c = 0u; c < DVT; c++) {
                var acc = o_acc[c];
                for (var jb = 0u; jb < BKT; jb++) {
                    let pa = coopLoadT<MatA>(&p_s[strip * PS + jb * CM], PS);
                    let vb = coopLoadT<MatB>(&kv_s[jb * CM * KS + c * CM], KS);
                    acc = coopMultiplyAdd(pa, vb, acc);
                }
                o_acc[c] = acc;
            }
        }
        workgroupBarrier();
    }

    // The rows' sums and flags, gathered from their parts (every pair of a
    // row ends with the row's, so each writes its own columns below). The
    // key loop ended at a barrier: att_s is free.
    for (var i = 0u; i < RPI; i++) {
        let pair = li + WG * i;
        if (pair < BQ * LPR) {
            part_s[pair] = l[i];
            att_s[pair] = fl[i];
        }
    }
    workgroupBarrier();
    for (var i = 0u; i < RPI; i++) {
        let pair = li + WG * i;
        if (pair < BQ * LPR) {
            let rr = pair / LPR;
            var total = 0.0;
            var flags = 0u;
            for (var k = 0u; k < LPR; k++) {
                total += part_s[rr * LPR + k];
                flags |= att_s[rr * LPR + k];
            }
            l[i] = total;
            fl[i] = flags;
        }
    }

    // The rows' outputs, one CM-column block at a time through workgroup
    // memory: normalised (last chunk) or as the state the next chunk resumes;
    // part k of a row writes columns k, k + LPR, ... of each block.
    let last_chunk = (p.chunk_flags & LAST_CHUNK) != 0u;
    for (var c = 0u; c < DVT; c++) {
        coopStoreT(o_acc[c], &f_s[strip * OS], OS);
        workgroupBarrier();
        for (var i = 0u; i < RPI; i++) {
            let pair = li + WG * i;
            if (!live[i]) {
                continue;
            }
            let rr = pair / LPR;
            let r = head_index * p.q_len + row_of[i];
            let attended = (fl[i] & ROW_ATTENDED) != 0u;
            let nan_row = attended && ((fl[i] & ROW_POISONED) != 0u || !(l[i] > 0.0));
            // O carries P_SCALE: removed with the sum, or alone between chunks.
            let inv = select(0.0, 1.0 / (l[i] * P_SCALE), l[i] > 0.0);
            for (var e = pair % LPR; e < CM; e += LPR) {
                let col = c * CM + e;
                if (col >= p.dv) {
                    break;
                }
                var val = f_s[rr * OS + e];
                if (!last_chunk) {
                    val = val / P_SCALE;
                } else {
                    if (nan_row) {
                        val = nan();
                    } else if (attended) {
                        val = val * inv;
                    } else {
                        val = 0.0;
                    }
                }
                y[r * p.dv + col] = val;
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < RPI; i++) {
        let pair = li + WG * i;
        if (!live[i] || pair % LPR != 0u) {
            continue;
        }
        let r = head_index * p.q_len + row_of[i];
        if (!last_chunk) {
            lse[r] = fl[i];
            lse[rows_total + r] = bitcast<u32>(m[i]);
            lse[2u * rows_total + r] = bitcast<u32>(l[i]);
            continue;
        }
        // A row with no attended key gets zeros and -inf; a poisoned row, or
        // one whose attended scores were all -inf (sum 0), NaN.
        let attended = (fl[i] & ROW_ATTENDED) != 0u;
        let nan_row = attended && ((fl[i] & ROW_POISONED) != 0u || !(l[i] > 0.0));
        var bits = NEG_INF_BITS;
        if (nan_row) {
            bits = NAN_BITS;
        } else if (attended) {
            bits = bitcast<u32>(m[i] + log(l[i]));
        }
        lse[r] = bits;
        lse[rows_total + r] = bitcast<u32>(m[i]);
        lse[2u * rows_total + r] = bitcast<u32>(select(l[i], nan(), nan_row));
    }
}
