//! The streaming split-K decode kernel's WGSL
//! ([`crate::kernels::decode::stream::ATTENTION_DECODE_STREAM`] and its f16 variant): no barrier inside
//! its key loop, each key read by a team of lanes of one subgroup, the rows'
//! Q and O in named registers.
//!
//! A private array indexed by a loop variable may live in local memory on a
//! GPU (an H100 ran such register blocks at 3% of its FMA ceiling,
//! BENCHMARKS.md), so every register here is a named variable: the loops over
//! the workgroup's rows (up to [`MAX_ROWS`]), a lane's vec4 columns of a row
//! (up to [`MAX_COLS`]) and a step's keys (up to [`MAX_KB`]) are unrolled,
//! each step guarded by `if (ROWS > r)` and the like. ROWS, KT, VT and KB are
//! override constants, so the guards fold when the pipeline is made and the
//! unused registers vanish. The engine makes the text from [`render`] when
//! the pipeline is built.

use crate::kernels::decode;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// The most query rows a workgroup holds.
const MAX_ROWS: u32 = decode::MAX_WORKGROUP_ROWS as u32;
/// The most vec4 columns of a row one lane holds.
const MAX_COLS: u32 = 16;
/// The most keys a team takes per step.
const MAX_KB: u32 = decode::STREAM_MAX_KEYS_PER_STEP;
/// Registers a lane may hold of Q and of O (rows x columns, in vec4s), and of
/// one step's K and V rows (keys x columns).
const MAX_BLOCK: u32 = decode::STREAM_BLOCK as u32;
/// The widest team: lanes per key (a power of two up to 32).
const MAX_LANES: u32 = 32;

// The kernel's text declares its workgroup and its arrays for 128
// invocations, 16 rows and 32 teams (`team_ml`: 16 × 32) in words of its
// own; these hold the host's sizes to them.
const _: () = assert!(MAX_ROWS == 16 && decode::STREAM_WORKGROUP == 128 && MAX_LANES == 32);

/// The text's first line: where it comes from, for a reader of a compiled or
/// dumped shader.
const HEADER: &str =
    "// Made by src/kernels/decode/stream.rs when the pipeline is built; edit the generator.";

/// Whether the named register (a, b) exists: (a + 1) (b + 1) vec4s fit.
fn has(a: u32, b: u32) -> bool {
    (a + 1) * (b + 1) <= MAX_BLOCK
}

/// `body` (lines) under `if (a && b)` of the conditions that are not
/// trivially true, at `indent`; the conditions are override comparisons that
/// fold.
fn guard(conds: &[String], body: &[String], indent: usize) -> Vec<String> {
    let conds: Vec<&str> = conds
        .iter()
        .map(String::as_str)
        .filter(|c| !c.is_empty())
        .collect();
    let pad = " ".repeat(indent);
    let padded = |prefix: &str| {
        body.iter()
            .map(|line| {
                if line.is_empty() {
                    String::new()
                } else {
                    format!("{prefix}{line}")
                }
            })
            .collect::<Vec<_>>()
    };
    if conds.is_empty() {
        return padded(&pad);
    }
    let mut lines = vec![format!("{pad}if ({}) {{", conds.join(" && "))];
    lines.extend(padded(&format!("{pad}    ")));
    lines.push(format!("{pad}}}"));
    lines
}

/// The condition that `name` exceeds `i`: empty (true) where `i` is 0, since
/// each of these overrides is at least 1.
fn more(name: &str, i: u32) -> String {
    if i > 0 {
        format!("{name} > {i}u")
    } else {
        String::new()
    }
}

/// The prefetch registers loaded with the step whose first key is `first`
/// (clamped into the range, which is not empty).
fn next_loads(first: &str, indent: usize) -> Vec<String> {
    let mut out_lines = Vec::new();
    for u in 0..MAX_KB {
        let mut body = vec![format!(
            "let nat = kv_base + u32(clamp({first} + {u}, lo, hi));"
        )];
        for c in 0..MAX_COLS {
            if has(u, c) {
                body.extend(guard(
                    &[more("KT", c)],
                    &[format!("nk{u}_{c} = k_col(nat, lane + L * {c}u);")],
                    0,
                ));
                body.extend(guard(
                    &[more("VT", c)],
                    &[format!("nv{u}_{c} = v_col(nat, lane + L * {c}u);")],
                    0,
                ));
            }
        }
        let mut braced = vec!["{".to_string()];
        braced.extend(body.iter().map(|x| format!("    {x}")));
        braced.push("}".to_string());
        out_lines.extend(guard(&[more("KB", u)], &braced, indent));
    }
    out_lines
}

/// The kernel's WGSL: the whole text, ending in one newline.
pub(crate) fn render() -> String {
    let sections = [
        vec![HEADER.to_string()],
        overview(),
        bindings(),
        constants_and_overrides(),
        workgroup_memory(),
        team_sum(),
        helper_functions(),
        main_opening(),
        workgroup_state_init(),
        team_places(),
        key_range(),
        row_spans(),
        row_registers(),
        q_loads(),
        key_loop_state(),
        first_prefetch(),
        key_loop_opening(),
        kv_loads(),
        v_sink(),
        row_steps(),
        end_key_loop(),
        team_states(),
        merge_teams(),
    ];
    sections.concat().join("\n") + "\n"
}

// The kernel's sections, in the order `render` joins them: each returns its
// own lines (entries joined by newlines), so no section's text runs on into
// the next.

/// The comment that explains the kernel: how the work is split, the teams
/// that stream the keys, the layout check and the contract.
fn overview() -> Vec<String> {
    vec![r"//
// Split-K decode attention that streams K and V: few query rows, many keys,
// on adapters with subgroups.
//
// The work is split as in attention_decode.wgsl: workgroup (batch, KV head,
// head group, split) owns the ROWS = heads_per_wg * Nq query rows (<= 16) of
// the query heads h0 .. h0 + heads_per_wg of one KV head, and the keys
// [split * split_keys, (split + 1) * split_keys); each split writes its
// unnormalised O and (m, l, flags), which attention_merge.wgsl combines.
//
// Inside a workgroup nothing waits on anything while the keys stream: the
// WG invocations form TEAMS = WG / L teams of L lanes, each team L
// consecutive lanes of one subgroup, and each team runs its own online
// softmax over its own keys, KB consecutive keys a step (a step of the
// workgroup covers TEAMS * KB consecutive keys):
//   - lane c of a team holds the vec4 columns c, c + L, ... (KT of them) of
//     every row's Q, and of every row's O (VT of them), in named registers;
//   - per step it loads those columns of its team's KB key rows of K and of
//     V (consecutive lanes read consecutive vec4s: a team reads whole rows,
//     a subgroup several rows back to back), so K and V are read from memory
//     once, with no staging and no barrier;
//   - each dot product is the lane's partial sum, completed across the team
//     by a butterfly of subgroup shuffles (every lane ends with the same
//     bits, so the lanes of a team take the same decisions);
//   - the contract's rules, the row's new maximum, O and the sum rescaled,
//     O += P V: all in registers.
// After the key loop the teams' states are merged in workgroup memory (by
// their maxima, as the splits are merged), a row at a time.
//
// A team's lanes must be L consecutive lanes of one subgroup, whatever order
// the adapter gives its subgroups: lane 0 of each subgroup reserves as many
// places as the subgroup has lanes from a workgroup counter, and an
// invocation's place is the first of them plus its lane. The host keeps L
// within the adapter's smallest subgroup width; WG is a multiple of every
// width. A layout the teams cannot use (lanes not numbered 0 .. width - 1, a
// width that is not a multiple of L, places that do not cover the workgroup
// once: a driver that reports widths it does not run) makes the rows NaN,
// never silently wrong.
//
// The masking rules and the non-finite rule are attention_fused.wgsl's: a key
// a row does not attend never multiplies V; an attended key whose score is
// -inf gets probability 0 and still does (so a NaN or inf in its V reaches
// Y); a NaN or +inf score poisons the row. Head dims must be multiples of 4
// up to 256. K and V may be stored as f16 (the ELEMENT slot); the arithmetic
// is f32 either way."
        .to_string()]
}

/// The includes and the bindings (Q, K, V in vec4s, the mask, the lengths,
/// the split's O and row state), and the slot that says how K and V are stored.
fn bindings() -> Vec<String> {
    vec![r"
// #include attention_call.wgsl
// #include ablate.wgsl

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

// How K and V are stored: the ELEMENT slot holds shaders/element_f32.wgsl, or
// in the f16 variant (attention_decode_stream_f16) shaders/element_f16.wgsl.
// #include ELEMENT"
        .to_string()]
}

/// The workgroup size, the override constants the host picks when it makes
/// the pipeline (team width, keys per step, rows, head dims) and the bounds.
fn constants_and_overrides() -> Vec<String> {
    vec![r"
// Invocations per workgroup: a multiple of every subgroup width.
const WG: u32 = 128u;
// Lanes per team (a power of two, at most the adapter's smallest subgroup
// width and at most 32), and keys per team and step.
override L: u32 = 8u;
override KB: u32 = 2u;
// Query rows per workgroup (heads_per_wg * Nq).
override ROWS: u32 = 1u;
// vec4s per K row and per V row (Dk / 4, Dv / 4), and per lane: ceil(DK4 / L),
// ceil(DV4 / L).
override DK4: u32 = 32u;
override DV4: u32 = 32u;
override KT: u32 = 4u;
override VT: u32 = 4u;
override TEAMS: u32 = WG / L;
// Prefetch: each lane loads its columns of its team's next step of K and V
// into a second set of registers while the current step is computed, so the
// loads' latency overlaps the arithmetic instead of opening every step.
override PREFETCH: bool = false;
// The most rows, and the most teams (L >= 4).
const MAX_ROWS: u32 = 16u;
const MAX_TEAMS: u32 = 32u;"
        .to_string()]
}

/// The workgroup memory: the rows' spans and slopes, the teams' states for
/// the merge, the rows' flags and the layout check's counters.
fn workgroup_memory() -> Vec<String> {
    vec![r"
// Per row: its key range within the split (lo, hi), its mask row's offset
// (as bits) and its query position; its ALiBi slope.
var<workgroup> row_span: array<vec4<i32>, MAX_ROWS>;
var<workgroup> row_slope: array<f32, MAX_ROWS>;
// [row][team] running (m, l) at the end of the key loop.
var<workgroup> team_ml: array<vec2<f32>, 512>;
// [team][dv4] one row's O per team, scaled to the row's maximum.
var<workgroup> team_o: array<vec4<f32>, TEAMS * DV4>;
// Each row's ROW_ATTENDED | ROW_POISONED over the split.
var<workgroup> row_flags: array<atomic<u32>, MAX_ROWS>;
// Places reserved by the subgroups as they arrive; whether a subgroup found
// a layout the teams cannot use.
var<workgroup> subgroups_seen: atomic<u32>;
var<workgroup> misplaced: atomic<u32>;
var<workgroup> batch_nonpad: i32;"
        .to_string()]
}

/// `team_sum`, the team's butterfly of shuffles, a step per power of two up
/// to the widest team (the steps past L fold away).
fn team_sum() -> Vec<String> {
    let mut out = vec![r"
// Lane `lane`'s part of a dot product, summed over its team: a butterfly of
// shuffles, so every lane of the team gets the same bits.
fn team_sum(x: f32) -> f32 {
    var s = x;"
        .to_string()];
    let mut lanes = 1;
    while lanes < MAX_LANES {
        out.push(format!("    if (L > {lanes}u) {{"));
        out.push(format!("        s += subgroupShuffleXor(s, {lanes}u);"));
        out.push("    }".to_string());
        lanes *= 2;
    }
    out.push(
        r"    return s;
}"
        .to_string(),
    );
    out
}

/// The other functions main calls, written as they are: the unseen zeros, a
/// lane's column loads of K and V.
fn helper_functions() -> Vec<String> {
    vec![r"
// Zeros a compiler cannot fold (a key count is below 2^31), for K and V
// without their loads: the arithmetic on them must stay.
fn unseen_zero() -> vec4<f32> {
    return vec4<f32>(f32(p.keys >> 31u));
}

// Column `col` (in vec4s) of key row `key` of K and of V, zero past the row.
// Where L divides the row (KT = DK4 / L), every lane's columns lie within
// it: one plain load (the test folds when the pipeline is made).
fn k_col(row_base: u32, col: u32) -> vec4<f32> {
    if ((ABLATE & ABLATE_KV_LOADS) != 0u) {
        return unseen_zero();
    }
    if (DK4 % L == 0u) {
        return widen4(k4[row_base * DK4 + col]);
    }
    return select(vec4<f32>(0.0), widen4(k4[row_base * DK4 + min(col, DK4 - 1u)]), col < DK4);
}

fn v_col(row_base: u32, col: u32) -> vec4<f32> {
    if ((ABLATE & ABLATE_KV_LOADS) != 0u) {
        return unseen_zero();
    }
    if (DV4 % L == 0u) {
        return widen4(v4[row_base * DV4 + col]);
    }
    return select(vec4<f32>(0.0), widen4(v4[row_base * DV4 + min(col, DV4 - 1u)]), col < DV4);
}
"
    .to_string()]
}

/// main's signature and the workgroup's place: its (batch, KV head, head
/// group, split) and its first query head.
fn main_opening() -> Vec<String> {
    vec![r"
@compute @workgroup_size(WG, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
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
    let h0 = kvh * p.group + (within % groups_per_kv) * hpw;"
        .to_string()]
}

/// The workgroup variables' first values: the rows' flags, the layout
/// check's counters and the batch's key count.
fn workgroup_state_init() -> Vec<String> {
    vec![r"
    if (li < MAX_ROWS) {
        atomicStore(&row_flags[li], 0u);
    }
    if (li == 0u) {
        atomicStore(&subgroups_seen, 0u);
        atomicStore(&misplaced, 0u);
        batch_nonpad = batch_lengths(b);
    }"
    .to_string()]
}

/// Each invocation's place from its subgroup's reservation, the layout check
/// on it, and its team and lane.
fn team_places() -> Vec<String> {
    vec![
        r"    // (A barrier: the counter is zero for every subgroup after it.)
    let lengths = workgroupUniformLoad(&batch_nonpad);
    // Every lane is active here (uniform control flow), so lane 0 speaks for
    // its subgroup, and the subgroup's width is its count of lanes (which
    // lavapipe at 1024-bit vectors reports as 32 for subgroups of 16).
    let width = subgroupAdd(1u);
    var first_place = 0u;
    if (sg_lane == 0u) {
        first_place = atomicAdd(&subgroups_seen, width);
    }
    let place = subgroupBroadcast(first_place, 0u) + sg_lane;
    if (subgroupExclusiveAdd(1u) != sg_lane || (place - sg_lane) % L != 0u || width % L != 0u) {
        atomicOr(&misplaced, 1u);
    }
    // (Clamped: a layout that overflows the workgroup poisons the rows below
    // and must not write past the teams' arrays meanwhile.)
    let team = min(place / L, TEAMS - 1u);
    let lane = place % L;"
            .to_string(),
    ]
}

/// The rows' key offset and the keys any row may see within the split.
fn key_range() -> Vec<String> {
    vec![r"
    let offset = position_offset(lengths);
    // The keys any row may see, within this split (rows' ranges grow with
    // the query position, the same for every head).
    let split_lo = i32(split * p.split_keys);
    let split_hi = i32(min((split + 1u) * p.split_keys, p.keys)) - 1;
    let lo = max(key_range(0u, offset, lengths).x, split_lo);
    let hi = select(min(key_range(p.q_len - 1u, offset, lengths).y, split_hi), -1, !live_block);"
        .to_string()]
}

/// Each row's span (key range, mask row, position) and ALiBi slope in
/// workgroup memory, an invocation per row.
fn row_spans() -> Vec<String> {
    vec![r"
    if (li < ROWS) {
        let h = h0 + li / p.q_len;
        let i = li % p.q_len;
        let range = key_range(i, offset, lengths);
        let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride + i * p.mask_row_stride;
        row_span[li] = vec4<i32>(
            max(range.x, split_lo),
            min(range.y, split_hi),
            bitcast<i32>(mask_base),
            offset + i32(i),
        );
        let slope = head_slope(h);
        row_slope[li] = slope;
    }"
    .to_string()]
}

/// The rows' registers, a named variable each: m, l, and the lane's columns
/// of Q and of O.
fn row_registers() -> Vec<String> {
    let mut out =
        vec!["\n    // This lane's columns of every row's Q; the rows' running state.".to_string()];
    for r in 0..MAX_ROWS {
        out.push(format!("    var m{r} = MASKED;"));
        out.push(format!("    var l{r} = 0.0;"));
        for c in 0..MAX_COLS {
            if has(r, c) {
                out.push(format!("    var q{r}_{c} = vec4<f32>(0.0);"));
                out.push(format!("    var o{r}_{c} = vec4<f32>(0.0);"));
            }
        }
    }
    out
}

/// The lane's columns of each row's Q, loaded once (zeros past the row).
fn q_loads() -> Vec<String> {
    let mut out = Vec::new();
    for r in 0..MAX_ROWS {
        let mut body = vec![
            "{".to_string(),
            format!("    let h = h0 + {r}u / p.q_len;"),
            format!("    let i = {r}u % p.q_len;"),
            "    let q_base = ((b * p.q_heads + h) * p.q_len + i) * DK4;".to_string(),
        ];
        for c in 0..MAX_COLS {
            if has(r, c) {
                body.extend(guard(
                    &[more("KT", c)],
                    &[
                        format!("let col = lane + L * {c}u;"),
                        format!(
                            "q{r}_{c} = select(vec4<f32>(0.0), q4[q_base + min(col, DK4 - 1u)], col < DK4);"
                        ),
                    ],
                    4,
                ));
            }
        }
        body.push("}".to_string());
        out.extend(guard(&[more("ROWS", r)], &body, 4));
    }
    out
}

/// What the key loop keeps beside the rows' registers (the rows' flags as
/// bits, the ablation's V sink), K's and V's base, and the barrier after
/// the row spans.
fn key_loop_state() -> Vec<String> {
    vec![
        r"    // Bit r: row r attended a key; bit 16 + r: it met a NaN or +inf score.
    var seen = 0u;
    // Without O += P V: a sum of V's registers, added to O once after the
    // key loop times a zero the compiler cannot see, so that their loads are
    // not dead code (O stays 0).
    var v_sink = 0.0;
    let kv_base = (b * p.kv_heads + kvh) * p.keys;
    workgroupBarrier();"
            .to_string(),
    ]
}

/// The step of the workgroup, and the prefetch registers with the team's
/// first step of K and V loaded into them.
fn first_prefetch() -> Vec<String> {
    let mut out = vec![r"
    let step = i32(TEAMS * KB);
    // The prefetch registers: this team's first step of K and V."
        .to_string()];
    for u in 0..MAX_KB {
        for c in 0..MAX_COLS {
            if has(u, c) {
                out.push(format!("    var nk{u}_{c} = vec4<f32>(0.0);"));
                out.push(format!("    var nv{u}_{c} = vec4<f32>(0.0);"));
            }
        }
    }
    let mut first_loads = vec!["let first = lo + i32(team * KB);".to_string()];
    first_loads.extend(
        next_loads("first", 4)
            .iter()
            .map(|x| x.get(4..).unwrap_or("").to_string()),
    );
    out.extend(guard(
        &["PREFETCH && lo <= hi".to_string()],
        &first_loads,
        4,
    ));
    out
}

/// The key loop's opening: the team's keys of the step, their rows (clamped
/// into the range) and the K and V registers of the step.
fn key_loop_opening() -> Vec<String> {
    let mut out = vec![r"    for (var j0 = lo; j0 <= hi; j0 += step) {
        // This team's keys (clamped into the range for the loads; the rules
        // drop those past it) and their columns of K and V.
        let first = j0 + i32(team * KB);"
        .to_string()];
    for u in 0..MAX_KB {
        out.push(format!("        let key{u} = first + {u};"));
        out.push(format!(
            "        let at{u} = kv_base + u32(clamp(key{u}, lo, hi));"
        ));
    }
    // out-of-range keys beyond KB fold away with their uses; declare all K/V
    // registers, loaded under guards.
    for u in 0..MAX_KB {
        for c in 0..MAX_COLS {
            if has(u, c) {
                out.push(format!("        var k{u}_{c} = vec4<f32>(0.0);"));
                out.push(format!("        var v{u}_{c} = vec4<f32>(0.0);"));
            }
        }
    }
    out
}

/// The step's K and V: taken from the prefetch registers (the next step's
/// then loaded into them), or loaded from storage without prefetch.
fn kv_loads() -> Vec<String> {
    let mut out = vec!["        if (PREFETCH) {".to_string()];
    out.extend(prefetched_kv().iter().map(|x| format!("            {x}")));
    out.push("            // The next step's, in flight while this one is computed.".to_string());
    out.push("            if (j0 + step <= hi) {".to_string());
    out.extend(next_loads("first + step", 16));
    out.push("            }".to_string());
    out.push("        } else {".to_string());
    out.extend(direct_kv_loads().iter().map(|x| format!("            {x}")));
    out.push("        }".to_string());
    out
}

/// The step's K and V registers taken from the prefetch registers.
fn prefetched_kv() -> Vec<String> {
    let mut taken = Vec::new();
    for u in 0..MAX_KB {
        for c in 0..MAX_COLS {
            if has(u, c) {
                taken.extend(guard(
                    &[more("KB", u), more("KT", c)],
                    &[format!("k{u}_{c} = nk{u}_{c};")],
                    0,
                ));
                taken.extend(guard(
                    &[more("KB", u), more("VT", c)],
                    &[format!("v{u}_{c} = nv{u}_{c};")],
                    0,
                ));
            }
        }
    }
    taken
}

/// The step's K registers, then its V registers, loaded from storage.
fn direct_kv_loads() -> Vec<String> {
    let mut loads = Vec::new();
    for u in 0..MAX_KB {
        for c in 0..MAX_COLS {
            if has(u, c) {
                loads.extend(guard(
                    &[more("KB", u), more("KT", c)],
                    &[format!("k{u}_{c} = k_col(at{u}, lane + L * {c}u);")],
                    0,
                ));
            }
        }
    }
    for u in 0..MAX_KB {
        for c in 0..MAX_COLS {
            if has(u, c) {
                loads.extend(guard(
                    &[more("KB", u), more("VT", c)],
                    &[format!("v{u}_{c} = v_col(at{u}, lane + L * {c}u);")],
                    0,
                ));
            }
        }
    }
    loads
}

/// Without O += P V (ablated), V's registers summed into `v_sink`, so that
/// their loads are not dead code.
fn v_sink() -> Vec<String> {
    let mut sink = Vec::new();
    for u in 0..MAX_KB {
        for c in 0..MAX_COLS {
            if has(u, c) {
                sink.extend(guard(
                    &[more("KB", u), more("VT", c)],
                    &[format!("v_sink += v{u}_{c}.x;")],
                    0,
                ));
            }
        }
    }
    guard(&["(ABLATE & ABLATE_PRODUCT) != 0u".to_string()], &sink, 8)
}

/// The step for every row, each under its row's guard.
fn row_steps() -> Vec<String> {
    let mut out = vec![r"
        // Each row: its scores, new maximum, rescaled state and O += P V."
        .to_string()];
    for r in 0..MAX_ROWS {
        out.extend(guard(&[more("ROWS", r)], &row_step(r), 8));
    }
    out
}

/// Row r's step, in a block of its own: its scores, its online softmax and
/// O += P V.
fn row_step(r: u32) -> Vec<String> {
    let mut lines = vec!["{".to_string()];
    lines.extend(row_scores(r));
    lines.extend(row_softmax(r));
    lines.extend(every_key());
    lines.extend(row_product(r));
    lines.push("}".to_string());
    lines
}

/// Row r's span and slope, and its score of each key of the step after the
/// rules (`scored{u}`), its flags noted in `seen`.
fn row_scores(r: u32) -> Vec<String> {
    let mut lines = vec![
        format!("    let span = row_span[{r}];"),
        format!("    let slope = row_slope[{r}];"),
    ];
    for u in 0..MAX_KB {
        let body = key_score(r, u);
        lines.push(format!("    var scored{u} = Scored(MASKED, 0u);"));
        let mut braced = vec!["{".to_string()];
        braced.extend(body.iter().map(|x| format!("    {x}")));
        braced.push("}".to_string());
        lines.extend(guard(&[more("KB", u)], &braced, 4));
    }
    lines
}

/// Row r's score of key u: the lane's part of the dot product summed over
/// the team, then the rules (each step with its ablation's stand-in).
fn key_score(r: u32, u: u32) -> Vec<String> {
    let mut dots = Vec::new();
    for c in 0..MAX_COLS {
        if has(r, c) && has(u, c) {
            dots.extend(guard(
                &[more("KT", c)],
                &[format!("dot{u} += dot(q{r}_{c}, k{u}_{c});")],
                0,
            ));
        }
    }
    let mut body = vec![format!("var dot{u} = 0.0;")];
    // Without S = Q K^T, the lane's K registers still make its score (a
    // sum of their first components, times a zero the compiler cannot
    // see: no products, no butterfly, and the score is 0), so their loads
    // are not dead code.
    let mut sums = Vec::new();
    for c in 0..MAX_COLS {
        if has(r, c) && has(u, c) {
            sums.extend(guard(
                &[more("KT", c)],
                &[format!("dot{u} += k{u}_{c}.x;")],
                0,
            ));
        }
    }
    sums.push(format!("dot{u} *= unseen_zero().x;"));
    body.push("if ((ABLATE & ABLATE_SCORES) == 0u) {".to_string());
    body.extend(dots.iter().map(|x| format!("    {x}")));
    body.push(format!("    dot{u} = team_sum(dot{u});"));
    body.push("} else {".to_string());
    body.extend(sums.iter().map(|x| format!("    {x}")));
    body.push("}".to_string());
    body.extend([
        "if ((ABLATE & ABLATE_SOFTMAX) == 0u) {".to_string(),
        format!("    scored{u} = scored(dot{u}, key{u}, span, slope);"),
        "} else {".to_string(),
        format!("    scored{u} = Scored(dot{u}, 0u);"),
        "}".to_string(),
        format!("seen |= (scored{u}.flags & ROW_ATTENDED) << {r}u;"),
        format!(
            "seen |= ((scored{u}.flags & ROW_POISONED) >> 1u) << {}u;",
            16 + r
        ),
    ]);
    body
}

/// Row r's online-softmax step: the new maximum, the rescaling `alpha`, the
/// keys' P and the rescaled sum (the raw scores as P where it is ablated).
fn row_softmax(r: u32) -> Vec<String> {
    let mut lines = vec!["    var alpha = 1.0;".to_string()];
    for u in 0..MAX_KB {
        lines.push(format!("    var p{u} = 0.0;"));
    }
    let mut softmax = vec![format!("var m_new = max(m{r}, scored0.s);")];
    for u in 1..MAX_KB {
        softmax.extend(guard(
            &[more("KB", u)],
            &[format!("m_new = max(m_new, scored{u}.s);")],
            0,
        ));
    }
    softmax.extend([
        "// exp(0) = 1 while no attended score has been finite yet.".to_string(),
        format!("alpha = exp(tempered(m{r} - m_new, p.inv_temperature));"),
        format!("m{r} = m_new;"),
        "// 0 for a key the row does not attend.".to_string(),
    ]);
    for u in 0..MAX_KB {
        softmax.extend(guard(
            &[more("KB", u)],
            &[format!(
                "p{u} = select(0.0, exp(tempered(scored{u}.s - m_new, p.inv_temperature)), scored{u}.s != MASKED);"
            )],
            0,
        ));
    }
    let rest: String = (1..MAX_KB).map(|u| format!(" + p{u}")).collect();
    softmax.push(format!("l{r} = l{r} * alpha + p0{rest};"));
    lines.push("    if ((ABLATE & ABLATE_SOFTMAX) == 0u) {".to_string());
    lines.extend(softmax.iter().map(|x| format!("        {x}")));
    lines.push("    } else {".to_string());
    for u in 0..MAX_KB {
        lines.extend(guard(
            &[more("KB", u)],
            &[format!("p{u} = scored{u}.s;")],
            8,
        ));
    }
    lines.push("    }".to_string());
    lines
}

/// Whether the row attends every key of the step: the same on every lane of
/// the team (the scores are the team's sums), so the branch on it in O += P V
/// does not split a team.
fn every_key() -> Vec<String> {
    let mut lines = vec!["    var every_key = scored0.s != MASKED;".to_string()];
    for u in 1..MAX_KB {
        lines.extend(guard(
            &[more("KB", u)],
            &[format!("every_key = every_key && scored{u}.s != MASKED;")],
            4,
        ));
    }
    lines
}

/// Row r's O += P V on its rescaled O: P as it is where the row attends every
/// key of the step, each key's product tested otherwise (unless ablated).
fn row_product(r: u32) -> Vec<String> {
    let (mut fast, mut careful) = (Vec::new(), Vec::new());
    for c in 0..MAX_COLS {
        if !has(r, c) {
            continue;
        }
        let mut f_body = vec![format!("var acc = o{r}_{c} * alpha;")];
        let mut c_body = vec![format!("var acc = o{r}_{c} * alpha;")];
        for u in 0..MAX_KB {
            if has(u, c) {
                f_body.extend(guard(
                    &[more("KB", u)],
                    &[format!("acc = fma(vec4<f32>(p{u}), v{u}_{c}, acc);")],
                    0,
                ));
                c_body.extend(guard(
                    &[more("KB", u)],
                    &[format!(
                        "acc += select(vec4<f32>(0.0), p{u} * v{u}_{c}, scored{u}.s != MASKED);"
                    )],
                    0,
                ));
            }
        }
        f_body.push(format!("o{r}_{c} = acc;"));
        c_body.push(format!("o{r}_{c} = acc;"));
        fast.extend(guard(&[more("VT", c)], &f_body, 0));
        careful.extend(guard(&[more("VT", c)], &c_body, 0));
    }
    let mut lines: Vec<String> = [
        "    // O += P V. Where the row attends every key of the step, P is",
        "    // multiplied as it is (an attended key whose P is 0 still adds",
        "    // 0 x V, so a NaN or inf there reaches the row); otherwise a key",
        "    // the row does not attend must add nothing, even where its V is",
        "    // not finite.",
        "    if ((ABLATE & ABLATE_PRODUCT) == 0u) {",
        "        if (every_key) {",
    ]
    .map(String::from)
    .into();
    lines.extend(fast.iter().map(|x| format!("            {x}")));
    lines.push("        } else {".to_string());
    lines.extend(careful.iter().map(|x| format!("            {x}")));
    lines.push("        }".to_string());
    lines.push("    }".to_string());
    lines
}

/// The key loop's end, and the ablation's V sink added to O (times a zero
/// the compiler cannot see).
fn end_key_loop() -> Vec<String> {
    vec![r"    }
    if ((ABLATE & ABLATE_PRODUCT) != 0u) {
        o0_0.x += v_sink * unseen_zero().x;
    }"
    .to_string()]
}

/// Each team's (m, l) of every row into workgroup memory and the rows' flags
/// gathered (NaN rows where the layout check failed), by lane 0 of a team.
fn team_states() -> Vec<String> {
    let mut out = vec![r"
    // The teams' states, merged a row at a time by the row's maximum. A
    // layout the teams cannot use (see the top) made their sums wrong, so the
    // rows are made NaN rather than silently wrong.
    let layout_bad = atomicLoad(&misplaced) != 0u || atomicLoad(&subgroups_seen) != WG;
    let misfit = select(0u, ROW_ATTENDED | ROW_POISONED, layout_bad);
    if (lane == 0u) {"
        .to_string()];
    for r in 0..MAX_ROWS {
        out.extend(guard(
            &[more("ROWS", r)],
            &[
                format!("team_ml[{r}u * MAX_TEAMS + team] = vec2<f32>(m{r}, l{r});"),
                format!(
                    "let flags{r} = ((seen >> {r}u) & 1u) | (((seen >> {}u) & 1u) << 1u) | misfit;",
                    16 + r
                ),
                format!("if (flags{r} != 0u) {{"),
                format!("    atomicOr(&row_flags[{r}], flags{r});"),
                "}".to_string(),
            ],
            8,
        ));
    }
    out.push(
        r"    }
    workgroupBarrier();"
            .to_string(),
    );
    out
}

/// The teams' states merged a row at a time into the split's O and (m, l,
/// flags), then main's end.
fn merge_teams() -> Vec<String> {
    let mut out = vec!["    let part_rows = p.batch * p.q_heads * p.q_len;".to_string()];
    for r in 0..MAX_ROWS {
        out.extend(guard(&[more("ROWS", r)], &row_merge(r), 4));
    }
    out.push("}".to_string());
    out
}

/// Row r's merge: the teams' O rescaled to the row's maximum and added up,
/// the sums likewise, written by the workgroup as the split's part.
fn row_merge(r: u32) -> Vec<String> {
    let mut lines = vec![
        "{".to_string(),
        "    var m_all = MASKED;".to_string(),
        "    for (var t = 0u; t < TEAMS; t++) {".to_string(),
        format!("        m_all = max(m_all, team_ml[{r}u * MAX_TEAMS + t].x);"),
        "    }".to_string(),
        format!("    let factor = exp(tempered(m{r} - m_all, p.inv_temperature));"),
    ];
    for c in 0..MAX_COLS {
        if has(r, c) {
            lines.extend(guard(
                &[more("VT", c)],
                &[
                    format!("let col = lane + L * {c}u;"),
                    "if (col < DV4) {".to_string(),
                    format!("    team_o[team * DV4 + col] = o{r}_{c} * factor;"),
                    "}".to_string(),
                ],
                4,
            ));
        }
    }
    lines.extend([
        "    workgroupBarrier();".to_string(),
        format!("    let h = h0 + {r}u / p.q_len;"),
        format!("    let i = {r}u % p.q_len;"),
        "    let row = (b * p.q_heads + h) * p.q_len + i;".to_string(),
        "    if (live_block) {".to_string(),
        "        for (var col = li; col < DV4; col += WG) {".to_string(),
        "            var total = vec4<f32>(0.0);".to_string(),
        "            for (var t = 0u; t < TEAMS; t++) {".to_string(),
        "                total += team_o[t * DV4 + col];".to_string(),
        "            }".to_string(),
        "            part_o[(split * part_rows + row) * DV4 + col] = total;".to_string(),
        "        }".to_string(),
        "        if (li == 0u) {".to_string(),
        "            var l_all = 0.0;".to_string(),
        "            for (var t = 0u; t < TEAMS; t++) {".to_string(),
        format!("                let ml = team_ml[{r}u * MAX_TEAMS + t];"),
        "                l_all += ml.y * exp(tempered(ml.x - m_all, p.inv_temperature));"
            .to_string(),
        "            }".to_string(),
        format!("            let flags = f32(atomicLoad(&row_flags[{r}]));"),
        "            part_ml[split * part_rows + row] = vec4<f32>(m_all, l_all, flags, 0.0);"
            .to_string(),
        "        }".to_string(),
        "    }".to_string(),
        "    workgroupBarrier();".to_string(),
        "}".to_string(),
    ]);
    lines
}

/// Split-K decode that streams K and V: teams of subgroup lanes per key, no barrier in the key loop, written by [`render`].
pub const ATTENTION_DECODE_STREAM: Kernel = Kernel::new(&KernelDef {
    name: crate::kernels::decode::names::STREAM,
    origin: Origin::Generated("attention_decode_stream.wgsl", render),
    slots: &[("ELEMENT", "element_f32.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<crate::kernels::attention::Params>()
        .named(crate::kernels::decode::DECODE_NAMES),
    needs: Needs::SUBGROUPS,
    specialised_per_call: true,
});
/// The streaming decode kernel reading K and V stored as f16.
pub const ATTENTION_DECODE_STREAM_F16: Kernel = Kernel::new(&KernelDef {
    name: "attention_decode_stream_f16",
    origin: Origin::Generated("attention_decode_stream.wgsl", render),
    slots: &[("ELEMENT", "element_f16.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<crate::kernels::attention::Params>()
        .named(crate::kernels::decode::DECODE_NAMES),
    needs: Needs::SUBGROUPS,
    specialised_per_call: true,
});
