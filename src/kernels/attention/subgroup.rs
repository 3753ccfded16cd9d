//! The fused attention kernel for CPU-backed adapters (subgroup shuffles, no
//! workgroup memory; [`crate::kernels::attention::subgroup::ATTENTION_SG`]), unrolled.
//!
//! The 64 score accumulators are named and the loops over rows, key groups and
//! keys are written out here (WGSL has no macros; private arrays indexed by a
//! loop variable are slow). The engine makes the text from [`render`] when
//! the pipeline is built.

use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Query rows per invocation.
pub(crate) const ROWS: u32 = 4;
/// Key groups of 4 per tile: 64 keys.
const GROUPS: u32 = 16;
/// Keys per tile.
pub(crate) const KEYS: u32 = GROUPS * 4;
/// K vec4 slots per lane, at the smallest subgroup (4).
const MAX_SLOTS: u32 = GROUPS / 4;
/// V rows per lane, at the smallest subgroup (4).
const MAX_VSLOTS: u32 = KEYS / 4;

/// Where the `pick4` and `pick16` functions go in the text, filled in last.
const PICK_PLACEHOLDER: &str = "PICK_PLACEHOLDER";

/// The vec4 components in order, as indexed by a key within its group of 4.
const XYZW: [char; 4] = ['x', 'y', 'z', 'w'];

// The tree of a tile's maxima is written out for 16 groups.
const _: () = assert!(GROUPS == 16);

/// The text's first line: where it comes from, for a reader of a compiled or
/// dumped shader.
const HEADER: &str =
    "// Made by src/kernels/attention/subgroup.rs when the pipeline is built; edit the generator.";

/// WGSL function `name`: one of `n` vec4 slot values by a slot index (a
/// switch, since the slot registers are named, not an array).
fn pick(name: &str, n: u32) -> String {
    let params = (0..n)
        .map(|s| format!("v{s}: vec4<f32>"))
        .collect::<Vec<_>>()
        .join(", ");
    let cases = (0..n.saturating_sub(1))
        .map(|s| format!("        case {s}u: {{ return v{s}; }}"))
        .collect::<Vec<_>>()
        .join("\n");
    let last = i64::from(n) - 1;
    format!(
        r"// One of the slot values, by a slot index that is constant once SG is known.
fn {name}(slot: u32, {params}) -> vec4<f32> {{
    switch slot {{
{cases}
        default: {{ return v{last}; }}
    }}
}}
"
    )
}

/// The kernel's WGSL: the whole text, ending in one newline. Each section
/// appends its lines to the text, in the kernel's order.
pub(crate) fn render() -> String {
    let mut out = vec![HEADER.to_string()];
    overview(&mut out);
    overrides_and_constants(&mut out);
    bindings(&mut out);
    value_tests(&mut out);
    pick_functions(&mut out);
    rule_functions(&mut out);
    main_opening(&mut out);
    block_key_range(&mut out);
    row_state(&mut out);
    registers(&mut out);
    key_loop_opening(&mut out);
    scores(&mut out);
    rules_and_softmax(&mut out);
    product(&mut out);
    end_key_loop(&mut out);
    chunk_state_writes(&mut out);
    normalise(&mut out);
    finish(out)
}

/// The comment that explains the kernel: its layout, its steps and its
/// contract.
fn overview(out: &mut Vec<String>) {
    out.push(format!(
        r"//
// Fused attention (FlashAttention-2 forward) for CPU-backed adapters with
// fixed subgroups of 4 or 8 (lavapipe, SwiftShader): the same contract and
// bindings as attention_fused.wgsl, laid out like gemm_sg. On these
// drivers a storage load is a loop over the SIMD lanes while a subgroup
// shuffle is one permute, so K and V are loaded once per subgroup and shared
// by shuffles, and the scores never leave registers.
//
// A workgroup is one subgroup of SG invocations and owns {ROWS} * SG query rows of
// one (batch, head); invocation `lane` owns rows {ROWS} * lane .. +{ROWS}. Keys go
// in tiles of {KEYS}:
//   1. S = Q K^T for the tile: {ROWS} x {GROUPS} named vec4 accumulators (key groups
//      of 4), one step per 4 head dims; key group g is loaded by lane g % SG
//      (slot g / SG) and shuffled to all.
//   2. scale, softcap, position rules and mask; online softmax per row
//      (m, l; alpha = exp((m_old - m_new) / temperature)); S becomes
//      P = exp((S - m_new) / temperature) (m is of the biased scores before
//      the temperature: see tempered() in attention_rules.wgsl).
//   3. O = alpha * O + P V, 4 value dims at a time: key k's V quad is loaded
//      by lane k % SG and shuffled; P[r][k] is a component of a score register.
//      O lives in the row's slice of Y (read, updated, written per quad).
// The last key chunk divides by l and writes the logsumexp; the row's m and l
// go to `stats` as for attention_fused.wgsl (resumable over key chunks, for
// drivers that cap an invocation's loop iterations).
//
// Non-finite values follow attention_fused.wgsl: a NaN or +inf score a row
// attends, or attended scores that are all -inf, make the row NaN; attended
// keys with a score of -inf multiply their V row by 0. Keys a row does not
// attend get probability -0.0, which adds nothing to finite values; a tile
// whose V holds a non-finite value (rare, found with subgroupAny) takes the
// careful P V path, which skips those keys instead of multiplying by -0.0.
//
// Requires Dk and Dv to be multiples of 4 (rows are read as vec4s); the host
// sends other head dims to attention_fused.wgsl.
"
    ));
}

/// The override constants and the plain ones (rows per invocation, keys per
/// tile).
fn overrides_and_constants(out: &mut Vec<String>) {
    out.push(format!(
        r"override SG: u32 = 8u;

const ROWS: u32 = {ROWS}u;
const KEYS: u32 = {KEYS}u;
"
    ));
}

/// The include of the call's uniforms and the storage bindings.
fn bindings(out: &mut Vec<String>) {
    out.push(
        r"// #include attention_call.wgsl

@group(0) @binding(1) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> mask: array<f32>;
@group(0) @binding(5) var<storage, read> nonpad: array<i32>;
@group(0) @binding(6) var<storage, read_write> y4: array<vec4<f32>>;
// [lse (as bits) | row max m | row sum l], one entry each per row.
@group(0) @binding(7) var<storage, read_write> stats: array<u32>;
"
        .to_string(),
    );
}

/// Negative zero's bits and the non-finite test on four values.
fn value_tests(out: &mut Vec<String>) {
    out.push(
        r"const NEG_ZERO_BITS: u32 = 0x80000000u;

// Whether any of four values is NaN or infinite.
fn non_finite4(x: vec4<f32>) -> bool {
    return any((bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u)) == vec4<u32>(0x7f800000u));
}
"
        .to_string(),
    );
}

/// Where the `pick4` and `pick16` functions go ([`finish`] fills them in).
fn pick_functions(out: &mut Vec<String>) {
    out.push(PICK_PLACEHOLDER.to_string());
}

/// The contract's rules on four scores (`bias4`) and the maximum of four
/// values (`max4`).
fn rule_functions(out: &mut Vec<String>) {
    out.push(
        r"// The rules on four raw scores of keys j..j+3 of one row (attention_score.wgsl).
fn bias4(s: vec4<f32>, j: i32, range: vec2<i32>, mask_row: u32, pos: i32, slope: f32) -> vec4<f32> {
    return biased4(capped4(s * p.scale), j, range, mask_row, pos, slope);
}

fn max4(v: vec4<f32>) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}
"
        .to_string(),
    );
}

/// Main's signature and the workgroup's block: its (batch, head), its rows and
/// the head dims in vec4s.
fn main_opening(out: &mut Vec<String>) {
    out.push(
        r"@compute @workgroup_size(SG, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let block = wid.x + wid.y * nwg.x;
    if (block >= p.q_blocks * p.batch * p.q_heads) {
        return;
    }
    let head_index = block / p.q_blocks;
    let b = head_index / p.q_heads;
    let h = head_index % p.q_heads;
    let kvh = h / p.group;
    let block_row0 = (block % p.q_blocks) * ROWS * SG;
    let lane_row0 = block_row0 + ROWS * lane;
    let dk4 = p.dk / 4u;
    let dv4 = p.dv / 4u;
    let rows = p.batch * p.q_heads * p.q_len;
"
        .to_string(),
    );
}

/// The key lengths and position offset, the block's key range (keys no row of
/// the block sees are skipped), K and V's base and the head's ALiBi slope.
fn block_key_range(out: &mut Vec<String>) {
    out.push(
        r"    let lengths = batch_lengths(b);
    let offset = position_offset(lengths);
    // The block's key range: rows' ranges grow with the row index.
    let block_last = min(block_row0 + ROWS * SG - 1u, p.q_len - 1u);
    let wg_lo = max(key_range(block_row0, offset, lengths).x, i32(p.chunk_start));
    let wg_hi = min(key_range(block_last, offset, lengths).y, i32(p.chunk_end) - 1);
    let kv_base = (b * p.kv_heads + kvh) * p.keys;
    let last_key = p.keys - 1u;
    let slope = head_slope(h);
"
        .to_string(),
    );
}

/// Each row's index, key range, bases in Q, Y and the mask, and its state (m,
/// l, flags): fresh at the first key chunk, else from `stats`.
fn row_state(out: &mut Vec<String>) {
    for r in 0..ROWS {
        out.push(format!(
            r"    let row{r} = min(lane_row0 + {r}u, p.q_len - 1u);
    let live{r} = lane_row0 + {r}u < p.q_len;
    let range{r} = key_range(row{r}, offset, lengths);
    let stat{r} = head_index * p.q_len + row{r};
    let q_base{r} = stat{r} * dk4;
    let y_base{r} = stat{r} * dv4;
    let mask_row{r} = b * p.mask_batch_stride + h * p.mask_head_stride + row{r} * p.mask_row_stride;
    var m{r} = MASKED;
    var l{r} = 0.0;
    var flags{r} = 0u;
    if ((p.chunk_flags & FIRST_CHUNK) == 0u) {{
        flags{r} = stats[stat{r}];
        m{r} = bitcast<f32>(stats[rows + stat{r}]);
        l{r} = bitcast<f32>(stats[2u * rows + stat{r}]);
    }}"
        ));
    }
}

/// The named registers: the score accumulators, the K slots and the V slots.
fn registers(out: &mut Vec<String>) {
    for r in 0..ROWS {
        for g in 0..GROUPS {
            out.push(format!("    var s{r}_{g} = vec4<f32>(0.0);"));
        }
    }
    for s in 0..MAX_SLOTS {
        for kk in 0..4 {
            out.push(format!("    var b{s}_{kk} = vec4<f32>(0.0);"));
        }
    }
    for i in 0..MAX_VSLOTS {
        out.push(format!("    var vs{i} = vec4<f32>(0.0);"));
    }
}

/// The key loop's opening: the first tile of the block's key range, a tile
/// of KEYS keys a step.
fn key_loop_opening(out: &mut Vec<String>) {
    out.push(
        r"
    var j0 = wg_lo - wg_lo % i32(KEYS);
    for (; j0 <= wg_hi; j0 += i32(KEYS)) {"
            .to_string(),
    );
}

/// Step 1, S = Q K^T for the tile: each lane loads its slots' key groups,
/// transposed, and every group reaches every lane by shuffle.
fn scores(out: &mut Vec<String>) {
    out.push("        // 1. S = Q K^T for this tile.".to_string());
    for r in 0..ROWS {
        for g in 0..GROUPS {
            out.push(format!("        s{r}_{g} = vec4<f32>(0.0);"));
        }
    }
    out.push("        for (var d4 = 0u; d4 < dk4; d4++) {".to_string());
    for r in 0..ROWS {
        out.push(format!("            let q{r} = q4[q_base{r} + d4];"));
    }
    for s in 0..MAX_SLOTS {
        out.push(format!("            if (SG * {s}u < {GROUPS}u) {{"));
        out.push(format!(
            "                let key{s} = u32(j0) + 4u * ({s}u * SG + lane);"
        ));
        for c in 0..4 {
            out.push(format!(
                "                let t{c} = k4[(kv_base + min(key{s} + {c}u, last_key)) * dk4 + d4];"
            ));
        }
        for (kk, comp) in XYZW.iter().enumerate() {
            out.push(format!(
                "                b{s}_{kk} = vec4<f32>(t0.{comp}, t1.{comp}, t2.{comp}, t3.{comp});"
            ));
        }
        out.push("            }".to_string());
    }
    let slot_args = |kk: u32| {
        (0..MAX_SLOTS)
            .map(|s| format!("b{s}_{kk}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for g in 0..GROUPS {
        for kk in 0..4 {
            out.push(format!(
                "            let k{kk}_{g} = subgroupShuffle(pick4({g}u / SG, {}), {g}u % SG);",
                slot_args(kk)
            ));
        }
        for r in 0..ROWS {
            out.push(format!(
                "            s{r}_{g} += q{r}.x * k0_{g} + q{r}.y * k1_{g} + q{r}.z * k2_{g} + q{r}.w * k3_{g};"
            ));
        }
    }
    out.push("        }".to_string());
}

/// Step 2, row by row: the contract's rules on the scores, then the online
/// softmax, which turns S into P.
fn rules_and_softmax(out: &mut Vec<String>) {
    out.push("        // 2. Rules and online softmax; S becomes P.".to_string());
    for r in 0..ROWS {
        row_rules(out, r);
        row_softmax(out, r);
    }
}

/// Row r's rules (`bias4` on each key group) and its poisoning scores noted,
/// then counted as -inf.
fn row_rules(out: &mut Vec<String>, r: u32) {
    for g in 0..GROUPS {
        let j = 4 * g;
        out.push(format!(
            "        s{r}_{g} = bias4(s{r}_{g}, j0 + {j}, range{r}, mask_row{r}, offset + i32(row{r}), slope);"
        ));
    }
    let poisoned = (0..GROUPS)
        .map(|g| format!("poisons4(s{r}_{g})"))
        .collect::<Vec<_>>()
        .join(" | ");
    out.push(
        "        // A NaN or +inf score poisons the row and counts as -inf from here on."
            .to_string(),
    );
    out.push(format!("        if (any({poisoned})) {{"));
    out.push(format!("            flags{r} |= ROW_POISONED;"));
    for g in 0..GROUPS {
        out.push(format!(
            "            s{r}_{g} = select(s{r}_{g}, vec4<f32>(neg_inf()), poisons4(s{r}_{g}));"
        ));
    }
    out.push("        }".to_string());
}

/// Row r's online-softmax step: the tile's maximum, the rescaling factor
/// alpha, P in place of the scores, and the new sum and maximum.
fn row_softmax(out: &mut Vec<String>, r: u32) {
    // The tree of maxima is written out for GROUPS = 16.
    out.push(format!(
        "        let tile_max{r} = max(max(max(max4(s{r}_0), max4(s{r}_1)), max(max4(s{r}_2), max4(s{r}_3))), max(max(max4(s{r}_4), max4(s{r}_5)), max(max4(s{r}_6), max4(s{r}_7))));"
    ));
    out.push(format!(
        "        let tile_max{r}b = max(max(max(max4(s{r}_8), max4(s{r}_9)), max(max4(s{r}_10), max4(s{r}_11))), max(max(max4(s{r}_12), max4(s{r}_13)), max(max4(s{r}_14), max4(s{r}_15))));"
    ));
    out.push(format!(
        "        let m_new{r} = max(m{r}, max(tile_max{r}, tile_max{r}b));"
    ));
    out.push(
        "        // Start from zero when the row had no attended key yet (Y holds nothing)."
            .to_string(),
    );
    out.push(format!(
        "        let fresh{r} = (flags{r} & ROW_ATTENDED) == 0u;"
    ));
    out.push(format!(
        "        let alpha{r} = select(exp(tempered(m{r} - m_new{r}, p.inv_temperature)), 0.0, fresh{r});"
    ));
    out.push(
        "        // (Not clamped: a row whose scores all lie below -3e38 still has weights.)"
            .to_string(),
    );
    out.push(format!("        let live_max{r} = vec4<f32>(m_new{r});"));
    let attended = (0..GROUPS)
        .map(|g| format!("(s{r}_{g} != vec4<f32>(MASKED))"))
        .collect::<Vec<_>>()
        .join(" | ");
    out.push(format!(
        "        if (any({attended})) {{ flags{r} |= ROW_ATTENDED; }}"
    ));
    for g in 0..GROUPS {
        out.push(format!(
            "        s{r}_{g} = select(vec4<f32>(bitcast<f32>(NEG_ZERO_BITS)), exp((s{r}_{g} - live_max{r}) * p.inv_temperature), s{r}_{g} != vec4<f32>(MASKED));"
        ));
    }
    let sums = (0..GROUPS)
        .map(|g| format!("s{r}_{g}"))
        .collect::<Vec<_>>()
        .join(" + ");
    out.push(format!("        let p_sum{r} = {sums};"));
    out.push(format!(
        "        l{r} = l{r} * alpha{r} + (p_sum{r}.x + p_sum{r}.y + p_sum{r}.z + p_sum{r}.w);"
    ));
    out.push(format!("        m{r} = m_new{r};"));
}

/// Step 3, O = alpha * O + P V a vec4 of value dims at a time: each lane
/// loads its V slots, O is read from Y, the keys' P V added (carefully where
/// the tile's V holds a non-finite value) and O written back.
fn product(out: &mut Vec<String>) {
    out.push("        // 3. O = alpha * O + P V, four value dims at a time.".to_string());
    out.push("        for (var d4 = 0u; d4 < dv4; d4++) {".to_string());
    for i in 0..MAX_VSLOTS {
        out.push(format!("            if (SG * {i}u < KEYS) {{"));
        out.push(format!(
            "                vs{i} = v4[(kv_base + min(u32(j0) + SG * {i}u + lane, last_key)) * dv4 + d4];"
        ));
        out.push("            }".to_string());
    }
    for r in 0..ROWS {
        out.push(format!(
            "            var o{r} = select(y4[y_base{r} + d4] * alpha{r}, vec4<f32>(0.0), fresh{r});"
        ));
    }
    let bad = (0..MAX_VSLOTS)
        .map(|i| format!("(SG * {i}u < KEYS && non_finite4(vs{i}))"))
        .collect::<Vec<_>>()
        .join(" || ");
    out.push(format!("            let careful = subgroupAny({bad});"));
    out.push("            if (!careful) {".to_string());
    key_products(out, false);
    out.push("            } else {".to_string());
    out.push(
        "                // A non-finite V value in this tile: keys a row does not attend"
            .to_string(),
    );
    out.push(
        "                // (probability -0.0) are skipped, so 0 * NaN never reaches O."
            .to_string(),
    );
    key_products(out, true);
    out.push("            }".to_string());
    for r in 0..ROWS {
        out.push(format!(
            "            if (live{r}) {{ y4[y_base{r} + d4] = o{r}; }}"
        ));
    }
    out.push("        }".to_string());
}

/// Each key's V quad shuffled from the lane that loaded it, times each row's
/// P of the key, added to O; the careful form skips keys a row does not
/// attend (P = -0.0).
fn key_products(out: &mut Vec<String>, careful: bool) {
    let vargs = (0..MAX_VSLOTS)
        .map(|i| format!("vs{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    for k in 0..KEYS {
        let (g, comp) = (k / 4, XYZW[(k % 4) as usize]);
        out.push(format!(
            "                let vk{k} = subgroupShuffle(pick16({k}u / SG, {vargs}), {k}u % SG);"
        ));
        for r in 0..ROWS {
            out.push(if careful {
                format!(
                    "                o{r} += select(s{r}_{g}.{comp} * vk{k}, vec4<f32>(0.0), bitcast<u32>(s{r}_{g}.{comp}) == NEG_ZERO_BITS);"
                )
            } else {
                format!("                o{r} += s{r}_{g}.{comp} * vk{k};")
            });
        }
    }
}

/// The key loop's end.
fn end_key_loop(out: &mut Vec<String>) {
    out.push("    }".to_string());
}

/// Where another key chunk follows: each row's flags, m and l into `stats`,
/// and main returns (O stays in Y).
fn chunk_state_writes(out: &mut Vec<String>) {
    out.push(
        r"
    if ((p.chunk_flags & LAST_CHUNK) == 0u) {"
            .to_string(),
    );
    for r in 0..ROWS {
        out.push(format!(
            r"        if (live{r}) {{
            stats[stat{r}] = flags{r};
            stats[rows + stat{r}] = bitcast<u32>(m{r});
            stats[2u * rows + stat{r}] = bitcast<u32>(l{r});
        }}"
        ));
    }
    out.push("        return;".to_string());
    out.push("    }".to_string());
}

/// The last key chunk: each row's Y divided by its sum (zeros and -inf for a
/// row that attends nothing, NaN for a poisoned one) and its logsumexp.
fn normalise(out: &mut Vec<String>) {
    out.push(
        "    // Last chunk: normalise. Rows with no attended key get zeros and -inf;".to_string(),
    );
    out.push(
        "    // poisoned rows, and rows whose attended scores were all -inf, NaN.".to_string(),
    );
    for r in 0..ROWS {
        out.push(format!(
            "    let attended{r} = (flags{r} & ROW_ATTENDED) != 0u;"
        ));
        out.push(format!(
            "    let nan_row{r} = attended{r} && ((flags{r} & ROW_POISONED) != 0u || !(l{r} > 0.0));"
        ));
        out.push(format!(
            "    let inv{r} = select(0.0, 1.0 / l{r}, l{r} > 0.0);"
        ));
    }
    out.push("    for (var d4 = 0u; d4 < dv4; d4++) {".to_string());
    for r in 0..ROWS {
        out.push(format!(
            "        if (live{r}) {{ y4[y_base{r} + d4] = select(select(vec4<f32>(0.0), y4[y_base{r} + d4] * inv{r}, attended{r}), vec4<f32>(nan()), nan_row{r}); }}"
        ));
    }
    out.push("    }".to_string());
    for r in 0..ROWS {
        out.push(format!(
            r"    if (live{r}) {{
        stats[stat{r}] = select(select(NEG_INF_BITS, bitcast<u32>(tempered(m{r}, p.inv_temperature) + log(l{r})), attended{r}), NAN_BITS, nan_row{r});
        stats[rows + stat{r}] = bitcast<u32>(m{r});
        stats[2u * rows + stat{r}] = select(bitcast<u32>(l{r}), NAN_BITS, nan_row{r});
    }}"
        ));
    }
}

/// Closes main and fills in the `pick4` and `pick16` functions; the whole
/// text, ending in one newline.
fn finish(mut out: Vec<String>) -> String {
    out.push("}".to_string());
    let picks = pick("pick4", MAX_SLOTS) + "\n" + &pick("pick16", MAX_VSLOTS);
    out.join("\n").replace(PICK_PLACEHOLDER, &picks) + "\n"
}

/// Fused attention with subgroup shuffles for CPU adapters, written by [`render`].
pub const ATTENTION_SG: Kernel = Kernel::new(&KernelDef {
    name: "attention_sg",
    origin: Origin::Generated("attention_sg.wgsl", render),
    slots: &[],
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
    params: ParamsText::of::<crate::kernels::attention::ChunkParams>()
        .named(crate::kernels::attention::FUSED_NAMES),
    needs: Needs::SUBGROUPS,
    specialised_per_call: true,
});
