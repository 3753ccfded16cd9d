// The contract's per-score rules, written once for every kernel that scores
// keys: the fused kernels in every form, the decode kernels, the scores'
// recompute (attention_scores.wgsl) and the unfused path's mask kernel.
// Included after attention_rules.wgsl by a kernel with the attention Params
// (`p`), a `mask` and a `nonpad` binding. The kernels made per call gate each
// rule on RULES (attention_rules.wgsl); the others take its default, every
// rule, and test the call's flags alone.

// Whether the call applies the rule `flag` (FLAG_SOFTCAP, FLAG_MASK,
// FLAG_ALIBI) and this pipeline has its code.
fn applies(flag: u32) -> bool {
    return (RULES & flag) != 0u && (p.flags & flag) != 0u;
}

// Batch b's key count: its nonpad length where the call has them.
fn batch_lengths(b: u32) -> i32 {
    if ((p.flags & FLAG_NONPAD) != 0u) {
        return nonpad[b];
    }
    return i32(p.keys);
}

// The position of query 0 given the batch's key count: the past length,
// else (nonpad lengths) the keys less the queries, else 0; plus the shift of
// a piece of a split call.
fn position_offset(lengths: i32) -> i32 {
    var offset = 0;
    if ((p.flags & FLAG_PAST) != 0u) {
        offset = i32(p.past_len);
    } else if ((p.flags & FLAG_NONPAD) != 0u) {
        offset = lengths - i32(p.q_len);
    }
    return offset + p.position_shift;
}

// The allowed key range [lo, hi] of the query at position `pos` (hi < lo
// when none), given its batch's key count `lengths`: causal, the windows
// (negative: none), the nonpad lengths and the mask's columns.
fn allowed_keys(pos: i32, lengths: i32) -> vec2<i32> {
    var lo = 0;
    var hi = i32(p.keys) - 1;
    if ((p.flags & FLAG_CAUSAL) != 0u) {
        hi = min(hi, pos);
    }
    if (p.right_window >= 0) {
        hi = min(hi, pos + p.right_window);
    }
    if (p.left_window >= 0) {
        lo = max(lo, pos - p.left_window);
    }
    if ((p.flags & FLAG_NONPAD) != 0u) {
        hi = min(hi, lengths - 1);
    }
    if ((p.flags & FLAG_MASK) != 0u) {
        hi = min(hi, i32(p.mask_cols) - 1);
    }
    return vec2<i32>(lo, hi);
}

// The allowed key range of query row i, its queries starting at `offset`.
fn key_range(i: u32, offset: i32, lengths: i32) -> vec2<i32> {
    return allowed_keys(offset + i32(i), lengths);
}

// Query head h's ALiBi slope (after the batch's lengths in `nonpad`), 0
// where the call has no ALiBi.
fn head_slope(h: u32) -> f32 {
    if (applies(FLAG_ALIBI)) {
        return bitcast<f32>(nonpad[p.batch + h]);
    }
    return 0.0;
}

// A scaled score, softcapped where the call asks: softcap * tanh(s / softcap).
fn capped(scaled: f32) -> f32 {
    if (applies(FLAG_SOFTCAP)) {
        return p.softcap * accurate_tanh(scaled / p.softcap);
    }
    return scaled;
}

// The derivative of `capped` at a scaled score (the backward's chain rule):
// sech²(scaled / softcap) = 1 - tanh², as 4e / (1 + e)² with e = exp(-2|x|),
// which keeps its precision where tanh nears ±1; 1 without softcap.
fn capped_slope(scaled: f32) -> f32 {
    if (applies(FLAG_SOFTCAP)) {
        let e = exp(-2.0 * abs(scaled / p.softcap));
        return 4.0 * e / ((1.0 + e) * (1.0 + e));
    }
    return 1.0;
}

// `capped` on four scores.
fn capped4(scaled: vec4<f32>) -> vec4<f32> {
    if (applies(FLAG_SOFTCAP)) {
        return p.softcap * accurate_tanh4(scaled / p.softcap);
    }
    return scaled;
}

// A key's capped score after the mask and ALiBi, for a key in the row's
// range: the mask's value at `mask_index` drops the key where it is MASKED
// or below (`attended` false, `s` MASKED) and is added otherwise (NaN and
// +inf too); ALiBi subtracts `slope` times |distance| from the query.
struct Biased {
    s: f32,
    attended: bool,
}

fn biased(s: f32, mask_index: u32, distance: i32, slope: f32) -> Biased {
    var out = Biased(s, true);
    if (applies(FLAG_MASK)) {
        let bias = mask[mask_index];
        if (bias <= MASKED) {
            return Biased(MASKED, false);
        }
        out.s += bias;
    }
    if (applies(FLAG_ALIBI)) {
        out.s -= slope * f32(abs(distance));
    }
    return out;
}

// A dot product through every rule, for key `key` of a row whose allowed
// keys are span.x..span.y, whose mask row starts at span.z (u32 bits) and
// whose position is span.w: MASKED where the row does not attend the key,
// -inf where the score is NaN or +inf (it poisons the row), and the row
// flags it sets (ROW_ATTENDED, ROW_POISONED). The temperature divides the
// online softmax's exponents, not the score (`tempered`).
struct Scored {
    s: f32,
    flags: u32,
}

fn scored(dot: f32, key: i32, span: vec4<i32>, slope: f32) -> Scored {
    if (key < span.x || key > span.y) {
        return Scored(MASKED, 0u);
    }
    let b = biased(capped(dot * p.scale), bitcast<u32>(span.z) + u32(key), span.w - key, slope);
    if (!b.attended) {
        return Scored(MASKED, 0u);
    }
    if (poisons(b.s)) {
        return Scored(neg_inf(), ROW_ATTENDED | ROW_POISONED);
    }
    return Scored(b.s, ROW_ATTENDED);
}

// `biased` on four capped scores of keys j..j+3 of one row (allowed keys
// range.x..range.y, its mask row at `mask_row`, its position `pos`): MASKED
// where the row does not attend a key. The mask reads are clamped to the
// mask's columns, past which the range already ends.
fn biased4(s: vec4<f32>, j: i32, range: vec2<i32>, mask_row: u32, pos: i32, slope: f32) -> vec4<f32> {
    var x = s;
    let js = vec4<i32>(j) + vec4<i32>(0, 1, 2, 3);
    var allowed = (js >= vec4<i32>(range.x)) & (js <= vec4<i32>(range.y));
    if (applies(FLAG_MASK)) {
        let last = i32(p.mask_cols) - 1;
        let cols = vec4<u32>(clamp(js, vec4<i32>(0), vec4<i32>(last)));
        let bias = vec4<f32>(mask[mask_row + cols.x], mask[mask_row + cols.y],
                             mask[mask_row + cols.z], mask[mask_row + cols.w]);
        allowed = allowed & !(bias <= vec4<f32>(MASKED));
        x += select(vec4<f32>(0.0), bias, allowed);
    }
    if (applies(FLAG_ALIBI)) {
        x -= slope * vec4<f32>(abs(vec4<i32>(pos) - js));
    }
    return select(vec4<f32>(MASKED), x, allowed);
}
