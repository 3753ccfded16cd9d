//! The masking rules as kernel parameters, computed once from the checked sizes
//! and the options, for every kernel that applies them (mask, fused, scores).

use crate::device::pipeline::PipelineKey;
use crate::options::AttentionOptions;
use crate::problem::{AttentionDims, MaskLayout};

/// An attention mask is bound.
pub const FLAG_MASK: u32 = 1;
/// Causal masking.
pub const FLAG_CAUSAL: u32 = 2;
/// `nonpad_kv_seqlen` is bound.
pub const FLAG_NONPAD: u32 = 4;
/// A past was given: the position offset is its length.
pub const FLAG_PAST: u32 = 8;
/// Softcap is on.
pub const FLAG_SOFTCAP: u32 = 16;
/// ALiBi: the query head's slope is at `nonpad[batch + h]` (f32 bits).
pub const FLAG_ALIBI: u32 = 32;

/// A bit of the `RULES` override (`shaders/attention_rules.wgsl`): the
/// temperature is not 1, so the softmax's exponents (differences from the
/// row maximum) are multiplied by its inverse.
pub const RULE_TEMPERATURE: u32 = 64;
/// The rules a kernel applies score by score, which `RULES` can leave out of
/// a pipeline: its bits.
const PER_SCORE_RULES: u32 = FLAG_MASK | FLAG_SOFTCAP | FLAG_ALIBI | RULE_TEMPERATURE;

/// Window sizes are clamped to this so `position ± window` stays within i32.
const WINDOW_CLAMP: i64 = 1 << 29;

/// The rule parameters every masking kernel takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rules {
    pub flags: u32,
    pub left_window: i32,
    pub right_window: i32,
    pub softcap: f32,
    pub scale: f32,
    /// `1 / temperature`, applied to the softmax's exponents (the biased
    /// scores less the row maximum) and to the maximum in the logsumexp.
    pub inv_temperature: f32,
    pub past_len: u32,
    /// Added to every query's position (a piece of a split call).
    pub position_shift: i32,
    pub mask: MaskLayout,
}

impl Rules {
    /// The rules this call applies score by score, as `RULES` bits: its
    /// mask, softcap and ALiBi flags, and [`RULE_TEMPERATURE`] where the
    /// temperature is not 1 (a product by exactly 1 changes nothing).
    pub(crate) fn per_score(&self) -> u32 {
        let temperature = if self.inv_temperature == 1.0 {
            0
        } else {
            RULE_TEMPERATURE
        };
        (self.flags | temperature) & PER_SCORE_RULES
    }

    /// `key` made for these rules: a kernel whose key loop tests `RULES`
    /// ([`crate::shader::kernel::Kernel::is_specialised_per_call`]) is
    /// compiled without any per-score rule for a call that applies none (no
    /// mask, softcap, ALiBi or temperature: the common call runs a key loop
    /// without their code and registers), and with all of them otherwise.
    /// Two pipelines per shape, not one per combination of rules: each
    /// combination would be one more compile of the largest kernels, and the
    /// sweep through every tiled shape on lavapipe took several times as
    /// long with one per combination. Other kernels' keys are returned as
    /// they are.
    pub(crate) fn specialise(&self, key: PipelineKey) -> PipelineKey {
        if !key.kernel.is_specialised_per_call() {
            return key;
        }
        if self.per_score() == 0 {
            without_rules(key)
        } else {
            key.with("RULES", i64::from(PER_SCORE_RULES))
        }
    }

    /// The rules of a call's sizes and options.
    pub(crate) fn new(dims: &AttentionDims, options: &AttentionOptions) -> Rules {
        let mut flags = 0;
        if dims.mask.is_some() {
            flags |= FLAG_MASK;
        }
        if options.is_causal {
            flags |= FLAG_CAUSAL;
        }
        if dims.has_nonpad {
            flags |= FLAG_NONPAD;
        }
        if dims.has_past {
            flags |= FLAG_PAST;
        }
        if options.softcap > 0.0 {
            flags |= FLAG_SOFTCAP;
        }
        if options.alibi {
            flags |= FLAG_ALIBI;
        }
        let window = |w: i64| {
            if w < 0 {
                -1
            } else {
                w.min(WINDOW_CLAMP) as i32
            }
        };
        Rules {
            flags,
            left_window: window(options.left_window_size),
            right_window: window(options.right_window_size),
            softcap: options.softcap,
            scale: options.effective_scale(dims.head_dim),
            inv_temperature: 1.0 / options.temperature,
            past_len: dims.past_len as u32,
            position_shift: dims.placement.position_shift as i32,
            mask: dims.mask.unwrap_or(MaskLayout {
                batch_stride: 0,
                head_stride: 0,
                row_stride: 0,
                cols: dims.total_len(),
            }),
        }
    }
}

/// `key` made without any per-score rule: the pipeline for calls that apply
/// none (`RULES` 0).
pub(crate) fn without_rules(key: PipelineKey) -> PipelineKey {
    key.with("RULES", 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(options: &AttentionOptions, masked: bool) -> Rules {
        let mut dims = AttentionDims::plain(1, [2, 1], [3, 5], [8, 8]);
        if masked {
            dims.mask = Some(MaskLayout {
                batch_stride: 0,
                head_stride: 0,
                row_stride: 5,
                cols: 5,
            });
        }
        Rules::new(&dims, options)
    }

    #[test]
    fn a_plain_call_compiles_no_per_score_rule_and_each_rule_its_bit() {
        let plain = AttentionOptions::default();
        assert_eq!(rules(&plain, false).per_score(), 0);
        // Causal masking and windows narrow each row's key range; they are
        // not applied score by score.
        let ranged = AttentionOptions {
            is_causal: true,
            left_window_size: 2,
            right_window_size: 0,
            ..plain.clone()
        };
        assert_eq!(rules(&ranged, false).per_score(), 0);
        assert_eq!(rules(&plain, true).per_score(), FLAG_MASK);
        let softcap = AttentionOptions {
            softcap: 30.0,
            ..plain.clone()
        };
        assert_eq!(rules(&softcap, false).per_score(), FLAG_SOFTCAP);
        let alibi = AttentionOptions {
            alibi: true,
            ..plain.clone()
        };
        assert_eq!(rules(&alibi, false).per_score(), FLAG_ALIBI);
        let temperature = AttentionOptions {
            temperature: 0.5,
            ..plain.clone()
        };
        assert_eq!(rules(&temperature, false).per_score(), RULE_TEMPERATURE);
        let everything = AttentionOptions {
            softcap: 30.0,
            alibi: true,
            temperature: 2.0,
            ..ranged
        };
        assert_eq!(rules(&everything, true).per_score(), PER_SCORE_RULES);
    }

    #[test]
    fn the_rules_are_written_once_and_specialised_kernels_take_them() {
        let plain = rules(&AttentionOptions::default(), false);
        for kernel in crate::kernels::all() {
            let source = kernel.source();
            let takes_rules = source.contains("fn applies(");
            // Every per-score rule goes through attention_score.wgsl's
            // `applies`, which tests RULES: no kernel tests the flag itself
            // outside that fragment.
            let source = match (
                source.find("// attention_score.wgsl: begin"),
                source.find("// attention_score.wgsl: end"),
            ) {
                (Some(begin), Some(end)) => format!("{}{}", &source[..begin], &source[end..]),
                _ => source.to_string(),
            };
            for rule in ["SOFTCAP", "MASK", "ALIBI"] {
                let own_test = format!("(p.flags & FLAG_{rule}) != 0u");
                assert!(!source.contains(&own_test), "{}: {own_test}", kernel.name());
            }
            if kernel.is_specialised_per_call() {
                assert!(takes_rules, "{}", kernel.name());
            }
            let key = plain.specialise(PipelineKey::new(kernel));
            assert_eq!(
                key.constants.contains(&("RULES", 0)),
                kernel.is_specialised_per_call(),
                "{}",
                kernel.name()
            );
        }
        // A call with any per-score rule gets them all compiled.
        let masked = rules(&AttentionOptions::default(), true);
        let key = masked.specialise(PipelineKey::new(
            crate::kernels::attention::tiled::ATTENTION_TILED,
        ));
        let all = i64::from(PER_SCORE_RULES);
        assert!(key.constants.contains(&("RULES", all)));
    }

    #[test]
    fn the_shaders_bits_are_these() {
        let source = include_str!("../../../shaders/attention_rules.wgsl");
        for line in [
            format!("override RULES: u32 = {PER_SCORE_RULES}u;"),
            format!("const RULE_TEMPERATURE: u32 = {RULE_TEMPERATURE}u;"),
            format!("const FLAG_MASK: u32 = {FLAG_MASK}u;"),
            format!("const FLAG_SOFTCAP: u32 = {FLAG_SOFTCAP}u;"),
            format!("const FLAG_ALIBI: u32 = {FLAG_ALIBI}u;"),
        ] {
            assert!(source.contains(&line), "{line}");
        }
    }
}
