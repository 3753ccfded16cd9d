#!/usr/bin/env python3
"""Writes shaders/attention_tiled.wgsl, the register-tiled fused attention
kernel for GPUs, with its register loops written out.

WGSL has no macros, and a private array indexed by a loop variable is slow on
GPUs: an NVIDIA H100 ran the looped kernel at 3% of its FMA ceiling, its
arrays in local memory (BENCHMARKS.md). So every register here is a named
variable: the loops over an invocation's query rows (up to MAX_RQ), keys (up
to MAX_RK) and vec4 columns of O (up to MAX_DVT) are unrolled, each step
guarded by `if (RQ > i)` and the like. RQ, RK and DVT are override constants,
so the guards fold when the pipeline is made and the unused registers vanish.
`render()` returns the kernel's WGSL; its forms' scripts
(attention_tiled_wide.py, _shuffle.py, _chunked.py) call it with their form's
argument. `.ci/run` checks the committed file matches this output:
    python3 shaders/gen/attention_tiled.py > shaders/attention_tiled.wgsl
"""

MAX_RK = 4
MAX_DVT = 8
MAX_O = 16  # RQ * DVT at most: O's registers
MAX_SLOTS = 8  # vec4s of a K or V tile an invocation prefetches
MAX_TK = 16  # invocations per row (a multiple of 4, the host checks)
# vec4 columns per chunk of the chunked form's tiles (src/gpu/ops/tiled.rs's
# CHUNK_COLUMNS): a chunk holds CW columns of one row and a vec4 of padding.
CW = 8


def has_o(i, c):
    """Whether an invocation can hold O's block (i, c): RQ > i and DVT > c
    with RQ * DVT within MAX_O."""
    return (i + 1) * (c + 1) <= MAX_O


def guard(conds, body, indent):
    """`body` (lines) under `if (a && b)` of the conditions that are not
    trivially true; the conditions are override comparisons that fold."""
    conds = [c for c in conds if c]
    pad = " " * indent
    if not conds:
        return [pad + line if line else "" for line in body]
    lines = [pad + "if (" + " && ".join(conds) + ") {"]
    lines += [pad + "    " + line if line else "" for line in body]
    lines.append(pad + "}")
    return lines


def rq(i):
    return f"RQ > {i}u" if i > 0 else ""


def rk(j):
    return f"RK > {j}u" if j > 0 else ""


def dvt(c):
    return f"DVT > {c}u" if c > 0 else ""


def online_softmax(i, tile_max, keep_p):
    """Row i's online-softmax step for a key tile whose row maximum is the
    expression `tile_max`: the new maximum, each key's P (`keep_p(j)` gives
    the lines that keep key j's P, `pt`), the rescaled partial sum and O."""
    lines = [
        f"let m_new = max(m{i}, {tile_max});",
        "// exp(0) = 1 while no attended score has been finite yet.",
        f"let alpha = exp(tempered(m{i} - m_new, p.inv_temperature));",
        "var sum = 0.0;",
    ]
    for j in range(MAX_RK):
        lines += guard(
            [rk(j)],
            [
                "// -0 for a key the row does not attend (it adds nothing to",
                "// the sum, nor, times a finite V, to O); an attended key's P",
                "// is +0 or more, even where its score is -inf.",
                f"let pt = select(not_attended(), exp(tempered(s{i}_{j} - m_new, p.inv_temperature)), s{i}_{j} != MASKED);",
            ]
            + keep_p(j)
            + ["sum += pt;"],
            0,
        )
    lines += [f"l{i} = l{i} * alpha + sum;"]
    for c in filter(lambda c: has_o(i, c), range(MAX_DVT)):
        lines += guard([dvt(c)], [f"o{i}_{c} *= alpha;"], 0)
    lines += [f"m{i} = m_new;"]
    return lines


def row_parts_read(*body):
    """Row rr's TK partials read from `row_parts` a vec4 `v` at a time, in
    order, each step under `body` (unrolled: naga's loop counters would keep
    a GPU compiler from unrolling a loop over TK, and this runs per key
    tile)."""
    lines = []
    for t4 in range(MAX_TK // 4):
        lines += guard([f"TK > {4 * t4}u" if t4 else ""], [
            "{",
            f"    let v = row_parts[rr * (TK / 4u) + {t4}u];",
        ] + ["    " + b for b in body] + ["}"], 0)
    return lines


def shuffle_softmax(i):
    """The shuffle form's step 3 for row i, in the block of its rules: the
    tile's row maximum by a butterfly over the row's TK lanes, then the
    online-softmax step, P kept in place of the scores."""
    lines = ["// The row's tile maximum: a butterfly over its TK lanes."]
    for off in (1, 2, 4, 8, 16, 32, 64):
        lines += guard([f"TK > {off}u"], [f"part = max(part, subgroupShuffleXor(part, {off}u));"], 0)
    return lines + online_softmax(i, "part", lambda j: [f"s{i}_{j} = pt;"])


def render(wide=False, shuffle=False, chunked=False):
    """The kernel's WGSL, in its common form or with one of these set (each
    its own kernel, kept apart so the common kernel's source stays small,
    and written by its own script in shaders/gen/, which calls this):

    wide: the same kernel with up to 8 query rows per invocation
        (attention_tiled_wide.py, for the tuner's 8-row shapes; lavapipe
        compiled the quick sweep's tiled pipelines 4 times slower from the
        8-row source, though the overrides fold the same).
    shuffle: the row maxima and P move between the invocations of a row by
        subgroup shuffles (attention_tiled_shuffle.py, for adapters with
        subgroups), so K and V are staged side by side and a key tile takes
        two barriers instead of four.
    chunked: the Q, K and V tiles held in chunks of CW columns of a row
        (attention_tiled_chunked.py, tuner-only): one index clamp per row and
        chunk instead of one per load. Of the 4-row kernel only: not with
        wide or shuffle.
    """
    if chunked and (wide or shuffle):
        raise ValueError("attention_tiled: the chunked form is of the 4-row kernel only "
                         "(not with wide or shuffle)")
    MAX_RQ = 8 if wide else 4
    K_TILE = "k_tile" if shuffle else "kv_tile"
    out = []
    w = out.append

    def emit(lines):
        for line in lines:
            w(line)

    def keep_phase(start, phase, indent, otherwise=()):
        """Puts the lines written since `out[start]` under `if` the phase
        `ABLATE_<phase>` of the key loop is kept (shaders/ablate.wgsl: always, but
        where `webattn phases` measures the kernel without it); `otherwise` are
        lines for the kernel without it."""
        body = [line for chunk in out[start:] for line in chunk.split("\n")]
        del out[start:]
        pad = " " * indent
        w(pad + f"if ((ABLATE & ABLATE_{phase}) == 0u) {{")
        for line in body:
            w("    " + line if line else "")
        if otherwise:
            w(pad + "} else {")
            for line in otherwise:
                w(pad + "    " + line if line else "")
        w(pad + "}")

    def staging_loop(src, tile, d4s, length, on_value):
        """WGSL lines that stage a tile of K (src 1) or V (src 2) into `tile`,
        zeros past the last key and past the row; `on_value` are lines run on
        each loaded vec4 `val`."""
        return (
            [
                f"for (var slot = li; slot < BK * {d4s}; slot += WG) {{",
                f"    let t = slot / {d4s};",
                f"    let d4 = slot % {d4s};",
                "    let key = u32(j0) + t;",
                "    var val = vec4<f32>(0.0);",
                "    if (key < p.keys) {",
                f"        val = quad({src}u, (kv_base + key) * {length}, d4 * 4u, {length});",
            ]
            + ["        " + x for x in on_value]
            + ["    }", (f"    {tile}[(d4 / CW) * BK + t][d4 % CW] = val;" if chunked
                           else f"    {tile}[t * KS + d4] = val;"), "}"]
        )

    if chunked:
        w("// GENERATED by shaders/gen/attention_tiled_chunked.py (attention_tiled.py with tiles in\n"
          "// chunks of columns); edit the generator, not this file.")
    elif wide:
        w("// GENERATED by shaders/gen/attention_tiled_wide.py (attention_tiled.py with 8 rows per\n"
          "// invocation); edit the generator, not this file.")
    elif shuffle:
        w("// GENERATED by shaders/gen/attention_tiled_shuffle.py (attention_tiled.py with subgroup\n"
          "// shuffles); edit the generator, not this file.")
    else:
        w("// GENERATED by shaders/gen/attention_tiled.py; edit the generator, not this file.")
    w("""//
// Fused attention (FlashAttention-2 forward), register-tiled for GPUs.
//
// A workgroup owns BQ consecutive query rows of one (batch, query head) and
// streams the keys in tiles of BK. Its WG = TQ x TK invocations form a grid:
// invocation (tr, tc) owns the RQ = BQ / TQ query rows tr, tr + TQ, ... and,
// in each key tile, the RK = BK / TK keys tc, tc + TK, ...; in O it owns the
// same rows and the DVT vec4 columns tc, tc + TK, ... of the head dim.
""" + ("" if shuffle else """//
// Invocations are numbered in pairs: invocations 2n and 2n + 1 share their
// column tc (so their reads of K and of V are of one address) and stand on
// neighbouring rows; 2n and 2n + 2 share their row (so do their reads of Q
// and of P). NVIDIA's workgroup memory returns 128 bytes a cycle to a whole
// SM, so a subgroup's 16-byte read takes 4 cycles, and 2 where lanes 2n and
// 2n + 1 (or 2n and 2n + 2) read one address (as NVIDIA describes its Volta
// and Turing GPUs): every read of the hot loops is then such a read, where
// K's and V's took 4 cycles with rows of consecutive invocations. The
// padding of the tiles' rows keeps a pair's two rows on different banks.
""") + """//
// Per workgroup: Q's block is staged once in workgroup memory (vec4s, rows
// padded to QS to spread the banks). Per key tile:
//   1. K's tile is staged in workgroup memory (coalesced: consecutive
//      invocations read consecutive vec4s of a row).
//   2. S = Q K^T as an RQ x RK register micro-tile per invocation (fma
//      chains); the contract's rules (scale, softcap, mask, ALiBi, ranges)
//      applied in registers; each invocation's partial row maxima go to
//      workgroup memory.
//   3. Each invocation reads its rows' TK partial maxima, rescales its O
//      registers and its partial row sums by exp((m_old - m_new) / τ) and
//      writes its probabilities P = exp((s - m_new) / τ) to workgroup memory
//      (vec4s of four keys); V's tile replaces K's, noting whether it holds a
//      non-finite value. (τ is the temperature; the maxima are of the biased
//      scores before it: see tempered() in attention_rules.wgsl.)
//   4. O += P V as an RQ x DVT (vec4) register micro-tile per invocation, four
//      keys per step (one vec4 of P per row).
// O stays in registers for the whole key loop and is written once, with the
// logsumexp, at the end. The row sums are kept as per-invocation partials (the
// same rescaling applies to each) and added up once at the end.
//
// Every register is a named variable (the generator unrolls the loops over
// rows, keys and columns up to MAX_RQ, MAX_RK, MAX_DVT); RQ, RK and DVT are
// overrides, so the `if (RQ > i)` guards fold when the pipeline is made.
//
// The contract is attention_fused.wgsl's, and so are the uniforms, the
// bindings, the non-finite rules (ROW_ATTENDED / ROW_POISONED, NaN rows, an
// attended -inf score still multiplies its V row, a key not attended never
// does: P is -0 for a key not attended and +0 or more for an attended one, a
// tile whose V is all finite multiplies by P as it is (-0 times a finite V
// adds nothing), and one that holds a non-finite value multiplies only where
// P's sign bit is clear), the workgroup's key range that skips
// tiles no row can see, and the resumable key chunks (O in Y, row state in
// `stats` between chunks; chunks start on tile boundaries).
"""
      + ("""//
// This form (attention_tiled_chunked) holds the Q, K, V and P tiles in chunks
// of CW vec4 columns of one row and a vec4 of padding (which spreads a
// column's rows over the banks): row r's columns CW c .. CW c + CW - 1 are
// chunk c * (rows of the tile) + r. S = Q K^T takes a chunk of columns a
// step, the columns within it constants: naga's runtime checks then clamp
// an invocation's row once per chunk, not every load's index, and a
// compiler folds the column into the load's offset (so too for P's vec4s in
// O += P V, once the compiler unrolls that loop). The padding costs
// workgroup memory (a vec4 per CW columns instead of one per row), and a
// compiler may keep more of a chunk's loads in flight (more registers); only
// `webattn tune` tries it.
""" if chunked else "")
      + ("""//
// This form (attention_tiled_shuffle) runs where the adapter has subgroups of
// at least TK lanes: the TK invocations of a row are lanes of one subgroup
// (consecutive invocation indices, aligned to TK). The rows' tile maxima are
// reduced by a butterfly of subgroupShuffleXor instead of through workgroup
// memory, and O += P V takes each key's P from the lane that computed it by
// subgroupShuffle instead of from a P tile. K and V are staged side by side
// at the start of a tile, so a tile takes two barriers (K and V staged; K and
// V read) instead of four. The V tile's non-finite flag holds the number of
// the last tile that had one (tiles count from 1), so it is never reset.
// WGSL does not promise how invocations map to subgroup lanes: the kernel
// checks the layout it relies on and makes the rows NaN where it does not
// hold, as attention_decode_stream.wgsl does.
""" if shuffle else "")
      + """
// Query rows per workgroup, keys per tile (a multiple of 4).
override BQ: u32 = 64u;
override BK: u32 = 32u;
// The invocation grid: TQ rows x TK columns, WG = TQ * TK invocations.
override TQ: u32 = 16u;
override TK: u32 = 8u;
override WG: u32 = 128u;
// Query rows (BQ / TQ) and keys (BK / TK) per invocation.
override RQ: u32 = 4u;
override RK: u32 = 4u;
// vec4s per K row and per V row (head dims rounded up to 4).
override DK4: u32 = 16u;
override DV4: u32 = 16u;
// vec4 columns of O per invocation: ceil(DV4 / TK).
override DVT: u32 = 2u;
""" + ("""// Chunks of CW columns per row of the Q tile (ceil(DK4 / CW)) and of the
// K/V tile (ceil(max(DK4, DV4) / CW)).
override QB: u32 = 2u;
override KB: u32 = 2u;
""" if chunked else """// Row strides of the Q tile and of the K/V tile, in vec4s.
override QS: u32 = 17u;
override KS: u32 = 17u;
""") + """// Prefetch: each invocation loads its SLOTS vec4s of the next tile (V's
// during S = Q K^T, the next K's during O += P V) into registers, so their
// latency overlaps the arithmetic, and stores them to workgroup memory after
// the barrier (SLOTS = ceil(BK * max(DK4, DV4) / WG), at most MAX_SLOTS).
// Without it, each tile is loaded from storage between two barriers.
override PREFETCH: bool = false;
override SLOTS: u32 = 2u;
""")
    if chunked:
        w(f"""// vec4 columns per chunk of the Q and K/V tiles.
const CW: u32 = {CW}u;""")
    w(f"""// The most rows, keys and columns an invocation holds (the host keeps RQ, RK
// and DVT within them, and RQ * RK, RQ * DVT within MAX_S, MAX_O).
const MAX_RQ: u32 = {MAX_RQ}u;
const MAX_RK: u32 = {MAX_RK}u;
const MAX_DVT: u32 = {MAX_DVT}u;
""")
    w("""// #include attention_call.wgsl

// #include attention_qkv4.wgsl
@group(0) @binding(4) var<storage, read> mask: array<f32>;
@group(0) @binding(5) var<storage, read> nonpad: array<i32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
// [lse (as bits) | row max m | row sum l], one entry each per row.
@group(0) @binding(7) var<storage, read_write> lse: array<u32>;

""" + ("""// Q's block: BQ rows in QB chunks each.
var<workgroup> q_tile: array<array<vec4<f32>, CW + 1u>, BQ * QB>;
""" if chunked else """// Q's block, BQ rows of QS vec4s.
var<workgroup> q_tile: array<vec4<f32>, BQ * QS>;
""") + ("""// K's tile and V's: BK rows of KS vec4s each.
var<workgroup> k_tile: array<vec4<f32>, BK * KS>;
var<workgroup> v_tile: array<vec4<f32>, BK * KS>;
// Per row: the TK invocations' partial sums at the end (TK / 4 vec4s); the
// row's flags.
var<workgroup> row_parts: array<vec4<f32>, BQ * TK / 4u>;
var<workgroup> row_flags: array<atomic<u32>, BQ>;
var<workgroup> batch_nonpad: i32;
// The last tile (counted from 1) whose V held a non-finite value (P V then
// tests each key).
var<workgroup> v_nonfinite: atomic<u32>;
// Whether some invocation's subgroup lanes are not laid out as the shuffles
// need (then every row is NaN).
var<workgroup> layout_bad: atomic<u32>;
""" if shuffle else ("""// K's tile, then V's: BK rows in KB chunks.
var<workgroup> kv_tile: array<array<vec4<f32>, CW + 1u>, BK * KB>;
""" if chunked else """// K's tile, then V's: BK rows of KS vec4s.
var<workgroup> kv_tile: array<vec4<f32>, BK * KS>;
""") + ("""// P, BQ rows of BK / 4 vec4s (keys 4t .. 4t + 3) in chunks of CW; -0 for
// a key the row does not attend.
var<workgroup> p_tile: array<array<vec4<f32>, CW + 1u>, BQ * ((BK / 4u + CW - 1u) / CW)>;""" if chunked else """// P, BQ rows of BK / 4 vec4s (keys 4t .. 4t + 3) and a vec4 of padding
// (so that the two rows a pair of lanes reads fall on different banks); -0
// for a key the row does not attend.
var<workgroup> p_tile: array<vec4<f32>, BQ * (BK / 4u + 1u)>;""") + """
// Per row: the TK invocations' partial maxima, later their partial sums,
// as TK / 4 vec4s (invocation tc's in component tc % 4 of vec4 tc / 4); the
// row's flags.
var<workgroup> row_parts: array<vec4<f32>, BQ * TK / 4u>;
var<workgroup> row_flags: array<atomic<u32>, BQ>;
var<workgroup> batch_nonpad: i32;
// Whether V's tile holds a non-finite value (P V then tests each key).
var<workgroup> v_nonfinite: atomic<u32>;
""") + """
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

// Prefetch slot `slot` of the tile at key j0 of K (src 1, rows of d4s vec4s,
// len values) or V (src 2): zeros past the tile, the last key and the row.
fn slot_load(src: u32, kv_base: u32, j0: i32, slot: u32, d4s: u32, len: u32) -> vec4<f32> {
    let key = u32(j0) + slot / d4s;
    if (slot >= BK * d4s || key >= p.keys) {
        return vec4<f32>(0.0);
    }
    return quad(src, (kv_base + key) * len, (slot % d4s) * 4u, len);
}

""" + ("""// Stores a prefetched slot into K's tile.
fn slot_store(slot: u32, d4s: u32, val: vec4<f32>) {
    if (slot < BK * d4s) {
        k_tile[(slot / d4s) * KS + slot % d4s] = val;
    }
}

// Stores a prefetched slot into V's tile.
fn slot_store_v(slot: u32, d4s: u32, val: vec4<f32>) {
    if (slot < BK * d4s) {
        v_tile[(slot / d4s) * KS + slot % d4s] = val;
    }
}
""" if shuffle else """// Stores a prefetched slot into the K/V tile.
fn slot_store(slot: u32, d4s: u32, val: vec4<f32>) {
    if (slot < BK * d4s) {
        """ + ("kv_tile[(slot % d4s / CW) * BK + slot / d4s][slot % d4s % CW] = val;" if chunked
                     else "kv_tile[(slot / d4s) * KS + slot % d4s] = val;") + """
    }
}
""") + """
// Whether any of four values is infinite or NaN (a bit test: WGSL
// comparisons need not see NaN).
fn nonfinite4(x: vec4<f32>) -> bool {
    let exponent = vec4<u32>(0x7f800000u);
    return any((bitcast<vec4<u32>>(x) & exponent) == exponent);
}

// P of a key a row does not attend: -0, as bits (a sign bit no arithmetic
// makes: exp never returns -0). Times a finite V it adds nothing; the
// careful product, for a V tile with a non-finite value, skips it.
fn not_attended() -> f32 {
    return bitcast<f32>(0x80000000u);
}

// Whether P belongs to a key the row attends: its sign bit is clear.
fn attended_p(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x80000000u) == 0u;
}

@compute @workgroup_size(WG, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,""" + ("""
    @builtin(subgroup_invocation_id) sg_lane: u32,""" if shuffle else "") + """
) {
    // Workgroups beyond the last block still reach every barrier below.
    let block = wid.x + wid.y * nwg.x;
    let head_index = min(block / p.q_blocks, p.batch * p.q_heads - 1u);
    let live_block = block < p.q_blocks * p.batch * p.q_heads;
    let b = head_index / p.q_heads;
    let h = head_index % p.q_heads;
    let kvh = h / p.group;
    let row0 = (block % p.q_blocks) * BQ;
    let tr = """ + ("li / TK;" if shuffle else "(li & 1u) | ((li / (2u * TK)) << 1u);") + """
    let tc = """ + ("li % TK;" if shuffle else "(li >> 1u) % TK;") + """
    // Where this invocation's partials go in `row_parts` (its first row's;
    // its other rows are TQ rows on).
    let part_at = tr * (TK / 4u) + tc / 4u;""" + ("""
    // A row's TK invocations must be TK consecutive lanes of one subgroup,
    // aligned to TK, for the shuffles below: checked here (a lane whose place
    // is not so, or whose row's first lane holds another invocation), and a
    // layout that is not makes every row of the workgroup NaN at the end,
    // never silently wrong.
    let lane0 = sg_lane - sg_lane % TK;
    let first_of_row = subgroupShuffle(li, lane0);
    let layout_ok = sg_lane % TK == tc && first_of_row == li - tc;""" if shuffle else "") + """
    let rows_total = p.batch * p.q_heads * p.q_len;
    let bk4 = BK / 4u;""" + ("" if shuffle or chunked else """
    // vec4s per row of the P tile.
    let ps = bk4 + 1u;""") + """

    if (li == 0u) {
        var lengths = i32(p.keys);
        if ((p.flags & FLAG_NONPAD) != 0u) {
            lengths = nonpad[b];
        }
        batch_nonpad = lengths;""" + ("""
        atomicStore(&v_nonfinite, 0u);
        atomicStore(&layout_bad, 0u);""" if shuffle else "") + """
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
        """ + ("q_tile[(d4 / CW) * BQ + rr][d4 % CW] = val;" if chunked
                     else "q_tile[rr * QS + d4] = val;") + """
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
    // online-softmax state; its block of O.""")

    # Per-row state, named.
    for i in range(MAX_RQ):
        w(f"    var live{i} = false;")
        w(f"    var qrow{i} = 0u;")
        w(f"    var lo{i} = 0;")
        w(f"    var hi{i} = -1;")
        w(f"    var m{i} = MASKED;")
        w(f"    var l{i} = 0.0;")
        w(f"    var fl{i} = 0u;")
        for c in range(MAX_DVT):
            if has_o(i, c):
                w(f"    var o{i}_{c} = vec4<f32>(0.0);")
    for i in range(MAX_RQ):
        body = [
            "{",
            f"    let row = row0 + tr + TQ * {i}u;",
            f"    live{i} = live_block && row < p.q_len;",
            f"    qrow{i} = min(row, p.q_len - 1u);",
            f"    let range = key_range(qrow{i}, offset, lengths);",
            f"    lo{i} = max(range.x, i32(p.chunk_start));",
            f"    hi{i} = min(range.y, i32(p.chunk_end) - 1);",
            f"    if ((p.chunk_flags & FIRST_CHUNK) == 0u && live{i}) {{",
            "        // Resume: the row's state from the previous chunk. Its sum is",
            "        // taken by column 0 only (the partial sums add up at the end).",
            f"        let r = head_index * p.q_len + qrow{i};",
            f"        fl{i} = lse[r];",
            f"        m{i} = bitcast<f32>(lse[rows_total + r]);",
            "        if (tc == 0u) {",
            f"            l{i} = bitcast<f32>(lse[2u * rows_total + r]);",
            "        }",
            f"        if ((fl{i} & ROW_ATTENDED) != 0u) {{",
        ]
        for c in filter(lambda c: has_o(i, c), range(MAX_DVT)):
            body += guard(
                [dvt(c)],
                [
                    f"if (tc + TK * {c}u < DV4) {{",
                    f"    o{i}_{c} = y_quad(r * p.dv, (tc + TK * {c}u) * 4u);",
                    "}",
                ],
                12,
            )
        body += ["        }", "    }", "}"]
        emit(guard([rq(i)], body, 4))

    w("""    let kv_base = (b * p.kv_heads + kvh) * p.keys;
    var slope = 0.0;
    if ((p.flags & FLAG_ALIBI) != 0u) {
        slope = bitcast<f32>(nonpad[p.batch + h]);
    }
    """ + ("""// Its vec4 columns of V: their chunk's first row and their place in it
    // (a column past Dv, where TK does not divide DV4, reads the row's last
    // vec4 and is never stored).""" if chunked else """// Where the invocation's first query row starts in the Q tile""" + ("" if shuffle else " and in\n    // P's") + """, and its
    // first key in the K tile: its other rows are TQ rows on, its keys TK
    // keys on (constant offsets from these). Its vec4 columns of V: a column
    // past Dv (where TK does not divide DV4) reads the row's last vec4 and is
    // never stored.
    let q_at = tr * QS;
    let k_at = tc * KS;""" + ("" if shuffle else """
    let p_at = tr * ps;""")) + """""")
    for c in range(MAX_DVT):
        w(f"    let v_at{c} = min(tc + TK * {c}u, DV4 - 1u);")
        if chunked:
            w(f"    let v_chunk{c} = (v_at{c} / CW) * BK;")
            w(f"    let v_col{c} = v_at{c} % CW;")
    w("""
    var j0 = wg_lo - wg_lo % i32(BK);""")
    if shuffle:
        w("""    // The prefetch registers: the first K and V tiles.""")
        for sl in range(MAX_SLOTS):
            w(f"    var pf{sl} = vec4<f32>(0.0);")
            w(f"    var pv{sl} = vec4<f32>(0.0);")
        emit(guard(["PREFETCH"], [
            line for sl in range(MAX_SLOTS) for line in guard(
                [f"SLOTS > {sl}u" if sl > 0 else ""],
                [f"pf{sl} = slot_load(1u, kv_base, j0, li + {sl}u * WG, DK4, p.dk);",
                 f"pv{sl} = slot_load(2u, kv_base, j0, li + {sl}u * WG, DV4, p.dv);"], 0)
        ], 4))
        w("""    var tile_no = 0u;
    for (; j0 <= wg_hi; j0 += i32(BK)) {
        // 1. K's and V's tiles (zeros past the last key and past the head
        // dim); a non-finite value in V's is noted under the tile's number.
        tile_no += 1u;
        var bad = false;
        if (PREFETCH) {""")
        for sl in range(MAX_SLOTS):
            emit(guard([f"SLOTS > {sl}u" if sl > 0 else ""], [
                f"slot_store(li + {sl}u * WG, DK4, pf{sl});",
                f"slot_store_v(li + {sl}u * WG, DV4, pv{sl});",
                f"bad = bad || nonfinite4(pv{sl});",
            ], 12))
        w("        } else {")
        emit(["            " + x for x in staging_loop(1, "k_tile", "DK4", "p.dk", [])])
        emit(["            " + x for x in staging_loop(2, "v_tile", "DV4", "p.dv", ["bad = bad || nonfinite4(val);"])])
        w("""        }
        if (bad) {
            atomicMax(&v_nonfinite, tile_no);
        }
        workgroupBarrier();
        let careful = atomicLoad(&v_nonfinite) == tile_no;
        // The next tiles in flight while this one is multiplied.""")
        emit(guard(["PREFETCH"], [
            line for sl in range(MAX_SLOTS) for line in guard(
                [f"SLOTS > {sl}u" if sl > 0 else ""],
                [f"pf{sl} = slot_load(1u, kv_base, j0 + i32(BK), li + {sl}u * WG, DK4, p.dk);",
                 f"pv{sl} = slot_load(2u, kv_base, j0 + i32(BK), li + {sl}u * WG, DV4, p.dv);"], 0)
        ], 8))
    else:
        w("""    // The prefetch registers: the first K tile.""")
        for sl in range(MAX_SLOTS):
            w(f"    var pf{sl} = vec4<f32>(0.0);")
        emit(guard(["PREFETCH"], [
            line for sl in range(MAX_SLOTS) for line in guard(
                [f"SLOTS > {sl}u" if sl > 0 else ""],
                [f"pf{sl} = slot_load(1u, kv_base, j0, li + {sl}u * WG, DK4, p.dk);"], 0)
        ], 4))
        w("""    for (; j0 <= wg_hi; j0 += i32(BK)) {
        // 1. K's tile (zeros past the last key and past Dk).
        if (li == 0u) {
            atomicStore(&v_nonfinite, 0u);
        }
        if (PREFETCH) {""")
        for sl in range(MAX_SLOTS):
            emit(guard([f"SLOTS > {sl}u" if sl > 0 else ""], [f"slot_store(li + {sl}u * WG, DK4, pf{sl});"], 12))
        w("        } else {")
        emit(["            " + x for x in staging_loop(1, "kv_tile", "DK4", "p.dk", [])])
        w("""        }
        workgroupBarrier();
        // V's tile in flight while S is computed.""")
        emit(guard(["PREFETCH"], [
            line for sl in range(MAX_SLOTS) for line in guard(
                [f"SLOTS > {sl}u" if sl > 0 else ""],
                [f"pf{sl} = slot_load(2u, kv_base, j0, li + {sl}u * WG, DV4, p.dv);"], 0)
        ], 8))
    w("""
        // 2. S = Q K^T, RQ x RK per invocation.""")
    for i in range(MAX_RQ):
        for j in range(MAX_RK):
            w(f"        var s{i}_{j} = 0.0;")
    scores_start = len(out)

    def s_step(d4):
        """One vec4 column `d4` (an expression) of S = Q K^T: the invocation's K
        rows and Q rows at that column, and their fma chains (the chunked form:
        column `d4` of the chunks that begin at `qc` and `kc`). Rows and keys
        past RQ and RK are never read (their guards fold away)."""
        lines = []
        for j in range(MAX_RK):
            lines.append(f"var k{j} = vec4<f32>(0.0);")
            load = (f"{K_TILE}[kc + {j}u * TK][{d4}]" if chunked
                    else f"{K_TILE}[k_at + {j}u * TK * KS + {d4}]")
            lines += guard([rk(j)], [f"k{j} = {load};"], 0)
        for i in range(MAX_RQ):
            load = f"q_tile[qc + {i}u * TQ][{d4}]" if chunked else f"q_tile[q_at + {i}u * TQ * QS + {d4}]"
            body = [f"let q{i} = {load};"]
            for j in range(MAX_RK):
                body += guard(
                    [rk(j)],
                    [
                        f"s{i}_{j} = fma(q{i}.w, k{j}.w, fma(q{i}.z, k{j}.z, "
                        f"fma(q{i}.y, k{j}.y, fma(q{i}.x, k{j}.x, s{i}_{j}))));"
                    ],
                    0,
                )
            lines += guard([rq(i)], body, 0)
        return ["{"] + ["    " + x if x else "" for x in lines] + ["}"]

    if chunked:
        # A chunk of CW columns a step (constant columns: one clamp per row and
        # chunk), then the last DK4 % CW columns one a step; the chains add in
        # column order.
        w("""        for (var chunk = 0u; chunk < DK4 / CW; chunk++) {
            let qc = chunk * BQ + tr;
            let kc = chunk * BK + tc;""")
        for col in range(CW):
            emit(["            " + x if x else "" for x in s_step(f"{col}u")])
        w("""        }
        for (var col = 0u; col < DK4 % CW; col++) {
            let qc = (DK4 / CW) * BQ + tr;
            let kc = (DK4 / CW) * BK + tc;""")
        emit(["            " + x if x else "" for x in s_step("col")])
        w("        }")
    else:
        # Two columns a step (so each step's loads can be issued together), and
        # the last column of an odd DK4 after the loop; the chains add in column
        # order.
        w("        for (var d4 = 0u; d4 + 1u < DK4; d4 += 2u) {")
        emit(["            " + x if x else "" for x in s_step("d4") + s_step("d4 + 1u")])
        w("        }")
        emit(guard(["DK4 % 2u == 1u"], s_step("DK4 - 1u"), 8))
    # Without S = Q K^T the scores are zeros the compiler cannot see (a key count
    # is below 2^31), so that the rules on them are not folded away.
    unseen = ["let unseen = f32(p.keys >> 31u);"]
    for i in range(MAX_RQ):
        for j in range(MAX_RK):
            unseen += guard([rq(i), rk(j)], [f"s{i}_{j} = unseen;"], 0)
    keep_phase(scores_start, "SCORES", 8, unseen)
    w("""        // Scale, softcap, mask, ALiBi (the temperature divides the online
        // softmax's exponents). Keys a row does not attend become MASKED; a
        // NaN or +inf score poisons the row and counts as -inf from here on.""")
    rules_start = len(out)
    for i in range(MAX_RQ):
        lines = [
            f"let pos = offset + i32(qrow{i});",
            "let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride",
            f"    + qrow{i} * p.mask_row_stride;",
            "var part = MASKED;",
        ]
        for j in range(MAX_RK):
            lines += guard(
                [rk(j)],
                [
                    f"let key = j0 + i32(tc + TK * {j}u);",
                    "var sc = MASKED;",
                    f"var attended = live{i} && key >= lo{i} && key <= hi{i};",
                    "if (attended) {",
                    f"    sc = s{i}_{j} * p.scale;",
                    "    if ((RULES & FLAG_SOFTCAP) != 0u && (p.flags & FLAG_SOFTCAP) != 0u) {",
                    "        sc = p.softcap * accurate_tanh(sc / p.softcap);",
                    "    }",
                    "    if ((RULES & FLAG_MASK) != 0u && (p.flags & FLAG_MASK) != 0u) {",
                    "        let bias = mask[mask_base + u32(key)];",
                    "        if (bias <= MASKED) {",
                    "            attended = false;",
                    "        } else {",
                    "            sc += bias;",
                    "        }",
                    "    }",
                    "}",
                    "if (attended) {",
                    "    if ((RULES & FLAG_ALIBI) != 0u && (p.flags & FLAG_ALIBI) != 0u) {",
                    "        sc -= slope * f32(abs(pos - key));",
                    "    }",
                    "    if (poisons(sc)) {",
                    f"        fl{i} |= ROW_POISONED;",
                    "        sc = neg_inf();",
                    "    }",
                    f"    fl{i} |= ROW_ATTENDED;",
                    "    part = max(part, sc);",
                    "} else {",
                    "    sc = MASKED;",
                    "}",
                    f"s{i}_{j} = sc;",
                ],
                0,
            )
        if shuffle:
            lines += shuffle_softmax(i)
        else:
            lines.append(f"row_parts[part_at + {i}u * TQ * (TK / 4u)][tc % 4u] = part;")
        emit(guard([rq(i)], ["{"] + ["    " + x for x in lines] + ["}"], 8))
    keep_phase(rules_start, "SOFTMAX", 8)
    if not shuffle:
        w("""        workgroupBarrier();

        // 3. The rows' new maxima; O and the partial sums rescaled; P.""")
        softmax_start = len(out)
        # Without the softmax, the raw scores stand in for P, so that S = Q K^T
        # (read by nothing else here) is not dead code the compiler drops.
        raw_p = []
        for i in range(MAX_RQ):
            lines = [
                "{",
                f"    let rr = tr + TQ * {i}u;",
                "    var tile_max = MASKED;",
            ] + ["    " + x for x in row_parts_read("tile_max = max(tile_max, max(max(v.x, v.y), max(v.z, v.w)));")]
            # Key tc + TK j of the tile is in vec4 (tc + TK j) / 4 = tc / 4 + j TK / 4
            # of the row (TK a multiple of 4), component tc % 4.
            if chunked:
                keep = lambda j: [
                    f"let t4 = tc / 4u + {j}u * (TK / 4u);",
                    f"p_tile[(t4 / CW) * BQ + rr][t4 % CW][tc % 4u] = pt;",
                ]
            else:
                keep = lambda j: [f"p_tile[p_at + {i}u * TQ * ps + tc / 4u + {j}u * (TK / 4u)][tc % 4u] = pt;"]
            lines += ["    " + x if x else "" for x in online_softmax(i, "tile_max", keep)]
            lines += ["}"]
            emit(guard([rq(i)], lines, 8))
            raw = []
            for j in range(MAX_RK):
                raw += guard([rk(j)], ["{", f"    let pt = s{i}_{j};"] + ["    " + x for x in keep(j)] + ["}"], 0)
            raw_p += guard([rq(i)], ["{", f"    let rr = tr + TQ * {i}u;"] + ["    " + x for x in raw] + ["}"], 0)
        keep_phase(softmax_start, "SOFTMAX", 8, raw_p)
        w("""        // V's tile replaces K's (every read of K ended at the barrier above).
        if (PREFETCH) {
            var bad = false;""")
        for sl in range(MAX_SLOTS):
            emit(guard([f"SLOTS > {sl}u" if sl > 0 else ""], [
                f"slot_store(li + {sl}u * WG, DV4, pf{sl});",
                f"bad = bad || nonfinite4(pf{sl});",
            ], 12))
        w("""            if (bad) {
                atomicStore(&v_nonfinite, 1u);
            }
        } else {""")
        emit(["            " + x for x in staging_loop(
            2, "kv_tile", "DV4", "p.dv", ["if (nonfinite4(val)) {", "    atomicStore(&v_nonfinite, 1u);", "}"])])
        w("""        }
        workgroupBarrier();
        // The next K tile in flight while O += P V is computed.""")
        emit(guard(["PREFETCH"], [
            line for sl in range(MAX_SLOTS) for line in guard(
                [f"SLOTS > {sl}u" if sl > 0 else ""],
                [f"pf{sl} = slot_load(1u, kv_base, j0 + i32(BK), li + {sl}u * WG, DK4, p.dk);"], 0)
        ], 8))
        w("""

        // 4. O += P V, RQ x DVT vec4s per invocation, four keys a step.
        // Columns past Dv read some vec4 of the tile and are never stored.
        let careful = atomicLoad(&v_nonfinite) != 0u;""")

    def product(careful):
        """O += P V: four keys a step (one vec4 of P per row). The careful form
        (V's tile holds a non-finite value) adds a key's P V only where the row
        attends the key (P's sign bit clear): -0 x inf would be NaN where a key
        not attended must add nothing, and an attended key whose P is 0 must still
        add 0 x V."""
        lines = []
        lines.append("for (var t4 = 0u; t4 < bk4; t4++) {")
        for i in range(MAX_RQ):
            lines.append(f"    var p{i} = vec4<f32>(0.0);")
            if chunked:
                load = f"p_tile[(t4 / CW) * BQ + tr + {i}u * TQ][t4 % CW]"
            else:
                load = f"p_tile[p_at + {i}u * TQ * ps + t4]"
            lines += guard([rq(i)], [f"p{i} = {load};"], 4)
        comps = "xyzw"
        for u in range(4):
            lines.append("    {")
            for c in range(MAX_DVT):
                if chunked:
                    lines.append(f"        let v{c} = kv_tile[v_chunk{c} + t4 * 4u + {u}u][v_col{c}];")
                else:
                    lines.append(f"        let v{c} = kv_tile[(t4 * 4u + {u}u) * KS + v_at{c}];")
            for i in range(MAX_RQ):
                for c in filter(lambda c: has_o(i, c), range(MAX_DVT)):
                    if careful:
                        stmt = (
                            f"o{i}_{c} += select(vec4<f32>(0.0), p{i}.{comps[u]} * v{c}, "
                            f"attended_p(p{i}.{comps[u]}));"
                        )
                    else:
                        stmt = f"o{i}_{c} = fma(vec4<f32>(p{i}.{comps[u]}), v{c}, o{i}_{c});"
                    lines += guard([rq(i), dvt(c)], [stmt], 8)
            lines.append("    }")
        lines.append("}")
        return lines

    def product_shuffle(careful):
        """O += P V in the shuffle form: key t + TK * j of the tile has its P in
        register s{i}_{j} of lane t of the row's TK lanes. The careful form as
        in [`product`]."""
        lines = []
        lines += ["for (var t = 0u; t < TK; t++) {", "    let src = lane0 + t;"]
        for j in range(MAX_RK):
            body = []
            for c in range(MAX_DVT):
                body.append(f"let v{c} = v_tile[(t + TK * {j}u) * KS + v_at{c}];")
            for i in range(MAX_RQ):
                p_lines = [f"let p{i} = subgroupShuffle(s{i}_{j}, src);"]
                for c in filter(lambda c: has_o(i, c), range(MAX_DVT)):
                    if careful:
                        stmt = f"o{i}_{c} += select(vec4<f32>(0.0), p{i} * v{c}, attended_p(p{i}));"
                    else:
                        stmt = f"o{i}_{c} = fma(vec4<f32>(p{i}), v{c}, o{i}_{c});"
                    p_lines += guard([dvt(c)], [stmt], 0)
                body += guard([rq(i)], p_lines, 0)
            lines += guard([rk(j)], ["{"] + ["    " + x for x in body] + ["}"], 4)
        lines.append("}")
        return lines

    if shuffle:
        w("""
        // 3. O += P V, RQ x DVT vec4s per invocation, a key a step, its P
        // shuffled from the lane that holds it. Columns past Dv read some
        // vec4 of the tile and are never stored.""")
    product_start = len(out)
    w("        if (careful) {")
    emit(["            " + x if x else "" for x in (product_shuffle if shuffle else product)(True)])
    w("        } else {")
    emit(["            " + x if x else "" for x in (product_shuffle if shuffle else product)(False)])
    w("        }")
    keep_phase(product_start, "PRODUCT", 8)
    w("""        workgroupBarrier();
    }

    // The rows' sums and flags, gathered from their TK invocations.""" + ("""
    if (!layout_ok) {
        atomicOr(&layout_bad, 1u);
    }""" if shuffle else "") + """""")
    for i in range(MAX_RQ):
        emit(
            guard(
                [rq(i)],
                [
                    f"row_parts[part_at + {i}u * TQ * (TK / 4u)][tc % 4u] = l{i};",
                    f"atomicOr(&row_flags[tr + TQ * {i}u], fl{i});",
                ],
                4,
            )
        )
    w("""    workgroupBarrier();
    // Every invocation's resume reads of `lse` (the row state) come before
    // column 0 overwrites it below: a storage barrier orders those too.
    storageBarrier();""")
    for i in range(MAX_RQ):
        lines = [
            f"if (live{i}) {{",
            f"    let rr = tr + TQ * {i}u;",
            "    var total = 0.0;",
        ] + ["    " + x for x in row_parts_read("total += v.x;", "total += v.y;", "total += v.z;", "total += v.w;")] + [
            "    let flags = atomicLoad(&row_flags[rr])" + (
                " | select(0u, ROW_ATTENDED | ROW_POISONED, atomicLoad(&layout_bad) != 0u);"
                if shuffle else ";"),
            f"    let r = head_index * p.q_len + qrow{i};",
            "    let y_base = r * p.dv;",
            "    if ((p.chunk_flags & LAST_CHUNK) == 0u) {",
        ]
        for c in filter(lambda c: has_o(i, c), range(MAX_DVT)):
            lines += guard(
                [dvt(c)],
                [
                    f"if (tc + TK * {c}u < DV4) {{",
                    f"    store_y_quad(y_base, (tc + TK * {c}u) * 4u, o{i}_{c});",
                    "}",
                ],
                8,
            )
        lines += [
            "        if (tc == 0u) {",
            "            lse[r] = flags;",
            f"            lse[rows_total + r] = bitcast<u32>(m{i});",
            "            lse[2u * rows_total + r] = bitcast<u32>(total);",
            "        }",
            "    } else {",
            "        // Normalise. A row with no attended key gets zeros and -inf; a",
            "        // poisoned row, or one whose attended scores were all -inf (sum 0), NaN.",
            "        let attended = (flags & ROW_ATTENDED) != 0u;",
            "        let nan_row = attended && ((flags & ROW_POISONED) != 0u || !(total > 0.0));",
            "        let inv = select(0.0, 1.0 / total, total > 0.0);",
        ]
        for c in filter(lambda c: has_o(i, c), range(MAX_DVT)):
            lines += guard(
                [dvt(c)],
                [
                    f"if (tc + TK * {c}u < DV4) {{",
                    "    var val = vec4<f32>(0.0);",
                    "    if (nan_row) {",
                    "        val = vec4<f32>(nan());",
                    "    } else if (attended) {",
                    f"        val = o{i}_{c} * inv;",
                    "    }",
                    f"    store_y_quad(y_base, (tc + TK * {c}u) * 4u, val);",
                    "}",
                ],
                8,
            )
        lines += [
            "        if (tc == 0u) {",
            "            var bits = NEG_INF_BITS;",
            "            if (nan_row) {",
            "                bits = NAN_BITS;",
            "            } else if (attended) {",
            f"                bits = bitcast<u32>(tempered(m{i}, p.inv_temperature) + log(total));",
            "            }",
            "            lse[r] = bits;",
            f"            lse[rows_total + r] = bitcast<u32>(m{i});",
            "            lse[2u * rows_total + r] = bitcast<u32>(select(total, nan(), nan_row));",
            "        }",
            "    }",
            "}",
        ]
        emit(guard([rq(i)], lines, 4))
    w("}")

    return "\n".join(out)


if __name__ == "__main__":
    print(render())
