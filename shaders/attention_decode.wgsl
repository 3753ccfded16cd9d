// Split-K decode attention: few query rows, many keys.
//
// The fused kernels give each workgroup a block of query rows; with one or a
// few rows per head almost all of that block is idle and a head's keys are
// streamed by a single workgroup. Here the keys are split across workgroups
// instead, and each workgroup serves every query row that reads the same KV
// head, so K and V are read from memory once per split, not once per query
// head (GQA): workgroup (batch, KV head, head group, split) owns the
// `heads_per_wg` query heads h0 .. h0 + heads_per_wg of that KV head, their Nq
// query rows each (rows = heads_per_wg * Nq <= 16), and the keys
// [split * split_keys, (split + 1) * split_keys).
//
// Per 64-key tile:
//   - scores: K's tile is staged in workgroup memory a slice of DS vec4
//     columns at a time (coalesced: consecutive invocations read consecutive
//     vec4s of a key row), with the same slice of every row's Q; invocation t
//     accumulates key t's dot product against every row;
//   - each row's tile max and sum: invocation i scans 16 keys of row i % 16,
//     and every invocation combines the 4 partials of each row;
//   - P V: invocation i owns vec4 column i % dv4 of every row and the keys
//     g, g + G, ... of the tile (g = i / dv4, G = 64 / dv4 groups), so each V
//     row is read once, coalesced; O stays in registers across tiles and the
//     G partial O's are added up once at the end.
// Each split writes its unnormalised O and (m, l, flags); attention_merge.wgsl
// combines the splits by their maxima into Y and the logsumexp.
//
// The masking rules and the non-finite rule are attention_fused.wgsl's: each
// split also reports whether it attended a key and whether it met a NaN or
// +inf score, and the merge makes such rows NaN. Head dims must be multiples
// of 4 up to 256 (rows are read as vec4s); the host sends others to the fused
// kernels. K and V may be stored as f16 (see ELEMENT below); the arithmetic
// is f32 either way.

// #include attention_call.wgsl

@group(0) @binding(1) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k4: array<KV4>;
@group(0) @binding(3) var<storage, read> v4: array<KV4>;
@group(0) @binding(4) var<storage, read> mask: array<f32>;
@group(0) @binding(5) var<storage, read> nonpad: array<i32>;
// [split][row][dv4] unnormalised O.
@group(0) @binding(6) var<storage, read_write> part_o: array<vec4<f32>>;
// [split][row] as (m, l, flags, 0); flags as an exact small float
// (1: a key was attended, 2: a NaN or +inf score was).
@group(0) @binding(7) var<storage, read_write> part_ml: array<vec4<f32>>;

// How K and V are stored (key4 and value4 read a row's vec4 column): the
// ELEMENT slot holds shaders/element_f32.wgsl, or in the f16 variants
// shaders/element_f16.wgsl (four f16 values in two u32 words, widened with
// unpack2x16float: half the bytes), or in the paged int8 variant
// shaders/element_i8.wgsl (four bytes a word and a scale per row).
// #include ELEMENT

// Where key `key` of batch b's KV head kvh is stored, in rows of K (and V):
// the KV_ROWS slot holds shaders/kv_rows_dense.wgsl ([B, Hkv, T, D]), or in
// the paged variants (attention_decode_paged) shaders/kv_rows_paged.wgsl,
// which reads the row's page from the sequence's block table.
// #include KV_ROWS

// Invocations, and keys per tile.
const WG: u32 = 64u;
// vec4 columns of K per staged slice (and its padded row stride).
const DS: u32 = 4u;
const DS_STRIDE: u32 = 5u;
// The most rows per workgroup, and this pipeline's rows (heads_per_wg * Nq):
// loops over rows have a constant trip count, so the per-row registers stay
// registers.
const MAX_ROWS: u32 = 16u;
override ROWS: u32 = 1u;
// Partial maxima and sums per row: WG / MAX_ROWS.
const PARTS: u32 = 4u;

// K's slice of the tile (then, at the end, the partial O's being added up).
var<workgroup> k_slice: array<vec4<f32>, 320>;
// Every row's slice of Q.
var<workgroup> q_slice: array<vec4<f32>, 64>;
// [row][key] scores, then probabilities.
var<workgroup> scores: array<f32, 1024>;
// [row][part] partial maxima, then partial sums.
var<workgroup> parts: array<f32, 64>;
var<workgroup> batch_nonpad: i32;
// Each row's ROW_ATTENDED | ROW_POISONED over the split.
var<workgroup> row_flags: array<atomic<u32>, 16>;

@compute @workgroup_size(64, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let block = wid.x + wid.y * nwg.x;
    let hpw = p.heads_per_wg;
    let groups_per_kv = p.group / hpw;
    let head_groups = p.batch * p.kv_heads * groups_per_kv;
    let live_block = block < head_groups * p.splits;
    let head_group = min(block / p.splits, head_groups - 1u);
    let split = block % p.splits;
    let b = head_group / (p.kv_heads * groups_per_kv);
    let within = head_group % (p.kv_heads * groups_per_kv);
    let kvh = within / groups_per_kv;
    let h0 = kvh * p.group + (within % groups_per_kv) * hpw;
    let rows = ROWS;
    let dk4 = p.dk / 4u;
    let dv4 = p.dv / 4u;

    if (li < MAX_ROWS) {
        atomicStore(&row_flags[li], 0u);
    }
    if (li == 0u) {
        batch_nonpad = batch_lengths(b);
    }
    let lengths = workgroupUniformLoad(&batch_nonpad);
    let offset = position_offset(lengths);
    // The keys any row may see, within this split (rows' ranges grow with
    // the query position, the same for every head).
    let split_lo = i32(split * p.split_keys);
    let split_hi = i32(min((split + 1u) * p.split_keys, p.keys)) - 1;
    let lo = max(key_range(0u, offset, lengths).x, split_lo);
    let hi = select(min(key_range(p.q_len - 1u, offset, lengths).y, split_hi), -1, !live_block);

    // Every invocation keeps the same running max and sum of each row.
    var m: array<f32, MAX_ROWS>;
    var l: array<f32, MAX_ROWS>;
    // This invocation's vec4 column of every row, over its key group.
    var o: array<vec4<f32>, MAX_ROWS>;
    for (var r = 0u; r < MAX_ROWS; r++) {
        m[r] = MASKED;
        l[r] = 0.0;
        o[r] = vec4<f32>(0.0);
    }
    let key_groups = max(WG / dv4, 1u);
    let my_group = li / dv4;
    let my_col = li % dv4;

    var j0 = lo - lo % i32(WG);
    for (; j0 <= hi; j0 += i32(WG)) {
        // Scores of key j0 + li against every row, a slice of K at a time.
        var dots: array<f32, MAX_ROWS>;
        for (var r = 0u; r < MAX_ROWS; r++) {
            dots[r] = 0.0;
        }
        for (var s0 = 0u; s0 < dk4; s0 += DS) {
            for (var slot = li; slot < WG * DS; slot += WG) {
                let t = slot / DS;
                let c = slot % DS;
                let key = u32(j0) + t;
                var val = vec4<f32>(0.0);
                if (key < p.keys && s0 + c < dk4) {
                    val = key4(kv_row(b, kvh, key), s0 + c);
                }
                k_slice[t * DS_STRIDE + c] = val;
            }
            if (li < MAX_ROWS * DS) {
                let r = li / DS;
                let c = li % DS;
                var val = vec4<f32>(0.0);
                if (r < rows && s0 + c < dk4) {
                    let h = h0 + r / p.q_len;
                    let i = r % p.q_len;
                    val = q4[((b * p.q_heads + h) * p.q_len + i) * dk4 + s0 + c];
                }
                q_slice[li] = val;
            }
            workgroupBarrier();
            for (var c = 0u; c < DS; c++) {
                let kk = k_slice[li * DS_STRIDE + c];
                for (var r = 0u; r < rows; r++) {
                    let prod = q_slice[r * DS + c] * kk;
                    dots[r] += (prod.x + prod.y) + (prod.z + prod.w);
                }
            }
            workgroupBarrier();
        }
        // The rules (attention_score.wgsl): MASKED for keys a row does not
        // attend; a NaN or +inf score poisons its row.
        let j = j0 + i32(li);
        for (var r = 0u; r < rows; r++) {
            let h = h0 + r / p.q_len;
            let i = r % p.q_len;
            let range = key_range(i, offset, lengths);
            let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride + i * p.mask_row_stride;
            let span = vec4<i32>(max(range.x, split_lo), min(range.y, split_hi), bitcast<i32>(mask_base), offset + i32(i));
            let sc = scored(dots[r], j, span, head_slope(h));
            if (sc.flags != 0u) {
                atomicOr(&row_flags[r], sc.flags);
            }
            scores[r * WG + li] = sc.s;
        }
        workgroupBarrier();
        // Each row's tile max: 4 partials of 16 keys, then combined by all.
        let scan_row = li % MAX_ROWS;
        let scan_from = (li / MAX_ROWS) * (WG / PARTS);
        if (scan_row < rows) {
            var part = MASKED;
            for (var t = 0u; t < WG / PARTS; t++) {
                part = max(part, scores[scan_row * WG + scan_from + t]);
            }
            parts[scan_row * PARTS + li / MAX_ROWS] = part;
        }
        workgroupBarrier();
        var alpha: array<f32, MAX_ROWS>;
        for (var r = 0u; r < rows; r++) {
            var tile_max = MASKED;
            for (var q = 0u; q < PARTS; q++) {
                tile_max = max(tile_max, parts[r * PARTS + q]);
            }
            let m_new = max(m[r], tile_max);
            // exp(0) = 1 while no attended score has been finite yet.
            alpha[r] = exp(tempered(m[r] - m_new, p.inv_temperature));
            m[r] = m_new;
            // This key's probability (-1 for a key the row does not attend;
            // an attended score of -inf gets 0 and still multiplies V).
            let s = scores[r * WG + li];
            scores[r * WG + li] = select(-1.0, exp(tempered(s - m_new, p.inv_temperature)), s != MASKED);
        }
        workgroupBarrier();
        if (scan_row < rows) {
            var part = 0.0;
            for (var t = 0u; t < WG / PARTS; t++) {
                part += max(scores[scan_row * WG + scan_from + t], 0.0);
            }
            parts[scan_row * PARTS + li / MAX_ROWS] = part;
        }
        workgroupBarrier();
        for (var r = 0u; r < rows; r++) {
            var sum = 0.0;
            for (var q = 0u; q < PARTS; q++) {
                sum += parts[r * PARTS + q];
            }
            l[r] = l[r] * alpha[r] + sum;
            o[r] *= alpha[r];
        }
        // O += P V over this invocation's keys, for its column of every row.
        if (my_group < key_groups) {
            for (var t = my_group; t < WG; t += key_groups) {
                let key = u32(j0) + t;
                if (key < p.keys) {
                    let vv = value4(kv_row(b, kvh, key), my_col);
                    for (var r = 0u; r < rows; r++) {
                        let pt = scores[r * WG + t];
                        o[r] += select(vec4<f32>(0.0), pt * vv, pt >= 0.0);
                    }
                }
            }
        }
        workgroupBarrier();
    }

    // Add up the key groups' partial O's, one row at a time, and write the split.
    let part_rows = p.batch * p.q_heads * p.q_len;
    for (var r = 0u; r < rows; r++) {
        k_slice[li] = o[r];
        workgroupBarrier();
        if (live_block && my_group == 0u && li < dv4) {
            var total = k_slice[li];
            for (var g = 1u; g < key_groups; g++) {
                total += k_slice[g * dv4 + li];
            }
            let h = h0 + r / p.q_len;
            let i = r % p.q_len;
            let row = (b * p.q_heads + h) * p.q_len + i;
            part_o[(split * part_rows + row) * dv4 + li] = total;
        }
        workgroupBarrier();
    }
    if (live_block && li < rows) {
        let h = h0 + li / p.q_len;
        let i = li % p.q_len;
        let row = (b * p.q_heads + h) * p.q_len + i;
        let flags = f32(atomicLoad(&row_flags[li]));
        part_ml[split * part_rows + row] = vec4<f32>(m[li], l[li], flags, 0.0);
    }
}
