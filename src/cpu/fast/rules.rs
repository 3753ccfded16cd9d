//! Which keys a query row attends, in the form the blocked kernel needs.
//!
//! The causal, window and padding rules each bound the keys from one side, so
//! together they allow one interval `[lo, hi)` per row (key tiles outside every
//! row's interval are skipped). The mask then removes single keys inside it:
//! a float entry `<= -f32::MAX` (or `-inf`) or a bool `false` masks the key,
//! any other float (NaN and `+inf` included) is added to the score.

use std::borrow::Cow;

use crate::options::AttentionOptions;
use crate::problem::{AttentionDims, MaskLayout};
use crate::tensor::HostMask;

/// The mask as additive values (bool masks become `0` / `-inf`), with its layout.
#[derive(Debug)]
pub(crate) struct MaskBias<'a> {
    values: Cow<'a, [f32]>,
    layout: MaskLayout,
}

impl<'a> MaskBias<'a> {
    /// Borrows a float mask, converts a bool mask.
    pub(crate) fn new(mask: &'a HostMask, layout: MaskLayout) -> MaskBias<'a> {
        let values = match mask {
            HostMask::Float(t) => Cow::Borrowed(t.data()),
            HostMask::Bool { data, .. } => Cow::Owned(
                data.iter()
                    .map(|&keep| if keep { 0.0 } else { f32::NEG_INFINITY })
                    .collect(),
            ),
        };
        MaskBias { values, layout }
    }

    /// The mask row of `(b, h, i)`: one value per key up to the mask's last dimension.
    pub(crate) fn row(&self, b: usize, h: usize, i: usize) -> &[f32] {
        let l = &self.layout;
        let start = b * l.batch_stride + h * l.head_stride + i * l.row_stride;
        &self.values[start..start + l.cols]
    }
}

/// Whether a mask value masks its key (`-inf`, `-f32::MAX`); NaN does not.
#[inline(always)]
pub(crate) fn masks(value: f32) -> bool {
    value <= -f32::MAX
}

/// The rules of one (batch, query head).
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadRules {
    /// The causal/window offset of this batch entry.
    offset: i64,
    causal: bool,
    left: i64,
    right: i64,
    /// Keys at or beyond this are masked: `T`, the batch's nonpad length, the mask's last dim.
    limit: usize,
    /// The ALiBi slope of this head (0 without ALiBi).
    pub slope: f32,
}

impl HeadRules {
    /// The rules of batch `b`, query head `h`.
    pub(crate) fn new(
        dims: &AttentionDims,
        options: &AttentionOptions,
        nonpad: Option<&[i64]>,
        slopes: &[f32],
        b: usize,
        h: usize,
    ) -> HeadRules {
        let mut limit = dims.total_len();
        if let Some(lengths) = nonpad {
            limit = limit.min(lengths[b].max(0) as usize);
        }
        if let Some(mask) = &dims.mask {
            limit = limit.min(mask.cols);
        }
        HeadRules {
            offset: dims.position_offset(nonpad, b),
            causal: options.is_causal,
            left: options.left_window_size,
            right: options.right_window_size,
            limit,
            slope: slopes.get(h).copied().unwrap_or(0.0),
        }
    }

    /// The position `offset + i` of query row `i`.
    pub(crate) fn position(&self, i: usize) -> i64 {
        self.offset + i as i64
    }

    /// The keys `[lo, hi)` that causality, the windows and padding allow query
    /// row `i` (empty when `lo == hi`).
    pub(crate) fn interval(&self, i: usize) -> (usize, usize) {
        let p = self.position(i);
        let mut lo = 0i64;
        let mut hi = self.limit as i64;
        if self.causal {
            hi = hi.min(p + 1);
        }
        if self.left >= 0 {
            lo = lo.max(p - self.left);
        }
        if self.right >= 0 {
            hi = hi.min(p + self.right + 1);
        }
        let hi = hi.clamp(0, self.limit as i64) as usize;
        let lo = (lo.max(0) as usize).min(hi);
        (lo, hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(q_len: usize, kv_len: usize, past_len: usize) -> AttentionDims {
        AttentionDims {
            batch: 2,
            q_heads: 1,
            kv_heads: 1,
            q_len,
            kv_len,
            past_len,
            head_dim: 4,
            v_head_dim: 4,
            mask: None,
            has_past: past_len > 0,
            has_nonpad: false,
            f16: Default::default(),
            placement: Default::default(),
        }
    }

    #[test]
    fn intervals_follow_the_contract() {
        let causal = AttentionOptions {
            is_causal: true,
            ..Default::default()
        };
        let r = HeadRules::new(&dims(4, 6, 0), &causal, None, &[], 0, 0);
        assert_eq!(r.interval(0), (0, 1));
        assert_eq!(r.interval(3), (0, 4));
        // With a past of 3 the offset is 3.
        let r = HeadRules::new(&dims(2, 2, 3), &causal, None, &[], 0, 0);
        assert_eq!(r.interval(0), (0, 4));
        // nonpad - Nq as the offset, and the padding limit; a negative offset empties rows.
        let r = HeadRules::new(&dims(4, 6, 0), &causal, Some(&[6, 2]), &[], 1, 0);
        assert_eq!(r.interval(0), (0, 0));
        assert_eq!(r.interval(2), (0, 1));
        assert_eq!(r.interval(3), (0, 2));
        let window = AttentionOptions {
            left_window_size: 1,
            right_window_size: 0,
            ..Default::default()
        };
        let r = HeadRules::new(&dims(4, 6, 0), &window, None, &[], 0, 0);
        assert_eq!(r.interval(0), (0, 1));
        assert_eq!(r.interval(3), (2, 4));
        assert!(masks(f32::NEG_INFINITY) && masks(-f32::MAX) && !masks(f32::NAN));
    }
}
