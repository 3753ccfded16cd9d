//! The masking rules as kernel parameters, computed once from the checked sizes
//! and the options, for every kernel that applies them (mask, fused, scores).

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
    /// `1 / temperature`, applied to the biased scores before the softmax.
    pub inv_temperature: f32,
    pub past_len: u32,
    /// Added to every query's position (a piece of a split call).
    pub position_shift: i32,
    pub mask: MaskLayout,
}

impl Rules {
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
