// The contract's shared constants and value tests, included by the attention
// kernels (`// #include attention_rules.wgsl`) before attention_score.wgsl,
// the rules that read a kernel's uniforms.

// A masked score: the most negative finite f32 (softmax gives it weight 0;
// a float mask's -inf still reaches the rules as -inf).
const MASKED: f32 = -0x1.fffffep+127f;
const NEG_INF_BITS: u32 = 0xff800000u;
const NAN_BITS: u32 = 0x7fc00000u;
// Params.flags.
const FLAG_MASK: u32 = 1u;
const FLAG_CAUSAL: u32 = 2u;
const FLAG_NONPAD: u32 = 4u;
const FLAG_PAST: u32 = 8u;
const FLAG_SOFTCAP: u32 = 16u;
const FLAG_ALIBI: u32 = 32u;
// The rules applied score by score that a pipeline is made for: bits of
// FLAG_MASK, FLAG_SOFTCAP and FLAG_ALIBI, and RULE_TEMPERATURE, which
// attention_score.wgsl's rules test. The kernels compiled per call (tiled,
// matrix-unit, subgroup, streaming decode) are made with none for a call that
// applies none, so its key loop has none of their code, and with all of them
// otherwise (src/kernels/attention/rules.rs, from the same rules as
// Params.flags); the default compiles every rule.
override RULES: u32 = 113u;
// A RULES bit: the temperature is not 1 (its product is made only then).
const RULE_TEMPERATURE: u32 = 64u;
// Params.chunk_flags: the first and the last chunk of a row's keys.
const FIRST_CHUNK: u32 = 1u;
const LAST_CHUNK: u32 = 2u;
// Row state between key chunks: a key was attended; the row is NaN.
const ROW_ATTENDED: u32 = 1u;
const ROW_POISONED: u32 = 2u;

// NaN and -inf made at run time: WGSL constant expressions cannot hold them
// (Chrome rejects the shader), so they come from a private variable.
var<private> non_finite_bits: vec2<u32> = vec2<u32>(0xff800000u, 0x7fc00000u);

fn neg_inf() -> f32 {
    return bitcast<f32>(non_finite_bits.x);
}

fn nan() -> f32 {
    return bitcast<f32>(non_finite_bits.y);
}

// An exponent's argument divided by the temperature: `inv_temperature` times
// `x`, where the pipeline applies one. The kernels keep the biased scores and
// the rows' maxima as they are and divide only differences from the maximum
// (never above 0) and, at the end, the maximum in the logsumexp: a biased
// score near f32::MAX is finite, but divided by a temperature below 1 it
// would not be, and the row would turn NaN where the contract gives a number.
fn tempered(x: f32, inv_temperature: f32) -> f32 {
    if ((RULES & RULE_TEMPERATURE) != 0u) {
        return x * inv_temperature;
    }
    return x;
}

// Whether a score is NaN or +inf (bit tests: WGSL comparisons need not see NaN).
fn poisons(x: f32) -> bool {
    let bits = bitcast<u32>(x);
    return (bits & 0x7fffffffu) > 0x7f800000u || bits == 0x7f800000u;
}

// tanh accurate to a few ulp over the whole range: an odd Taylor polynomial
// near zero (where 1 - 2/(e^2x + 1) cancels) and the exponential form beyond,
// with the argument clamped so e^2x cannot overflow (tanh(10) rounds to 1).
// NaN stays NaN.
fn accurate_tanh(x: f32) -> f32 {
    if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) {
        return x;
    }
    let ax = abs(x);
    if (ax < 0.4) {
        let z = x * x;
        let poly = 1.0 + z * (-1.0 / 3.0 + z * (2.0 / 15.0 + z * (-17.0 / 315.0
            + z * (62.0 / 2835.0 + z * (-1382.0 / 155925.0 + z * (21844.0 / 6081075.0))))));
        return x * poly;
    }
    let e = exp(2.0 * min(ax, 10.0));
    let t = 1.0 - 2.0 / (e + 1.0);
    return select(t, -t, x < 0.0);
}

// Which of four values are NaN (bit tests: WGSL comparisons need not see NaN).
fn is_nan4(x: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(x) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}

// Which of four scores are NaN or +inf: they make the row NaN.
fn poisons4(x: vec4<f32>) -> vec4<bool> {
    return is_nan4(x) | (bitcast<vec4<u32>>(x) == vec4<u32>(0x7f800000u));
}

// accurate_tanh on four values; NaN stays NaN.
fn accurate_tanh4(x: vec4<f32>) -> vec4<f32> {
    let ax = abs(x);
    let z = x * x;
    let poly = 1.0 + z * (-1.0 / 3.0 + z * (2.0 / 15.0 + z * (-17.0 / 315.0
        + z * (62.0 / 2835.0 + z * (-1382.0 / 155925.0 + z * (21844.0 / 6081075.0))))));
    let e = exp(2.0 * min(ax, vec4<f32>(10.0)));
    let t = 1.0 - 2.0 / (e + 1.0);
    let y = select(select(t, -t, x < vec4<f32>(0.0)), x * poly, ax < vec4<f32>(0.4));
    return select(y, x, is_nan4(x));
}
