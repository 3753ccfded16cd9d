//! Error measurement against the f64 oracle, with the tolerance rule.
//!
//! The rule, after FlashAttention's tests: a result passes when its worst
//! absolute error against the f64 oracle is at most twice the worst error of a
//! plain f32 CPU computation of the same thing, plus a small floor that scales
//! with the output's largest magnitude (at least 1): an output near 16 (a
//! logsumexp over large logits) has ulps 16 times those of an output near 1,
//! and WGSL specifies `exp`, `log` and `tanh` to a few ulps, while the CPU's
//! plain f32 baseline can round exactly by luck. Non-finite
//! values must match exactly: a masked score is `-inf` in both or neither, a row
//! the contract makes NaN (a NaN or +inf score it attends) is NaN in both, and a
//! NaN where the oracle has a number always fails.

/// The unit roundoff of f16 (half an ulp of 1): the most an f16 output's
/// rounding adds, relative to its magnitude.
pub const F16_UNIT_ROUNDOFF: f64 = 1.0 / 2048.0;

/// The floor added to the allowed error, so exactly computable results (where
/// the plain f32 baseline has no error at all) still leave room for rounding;
/// it is multiplied by the largest finite `|exact|` of the output when that
/// exceeds 1, so that it is the same number of ulps at every magnitude.
pub const DEFAULT_FLOOR: f64 = 1e-6;

/// How far one output is from the oracle, and whether that is within tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorReport {
    /// Elements compared.
    pub len: usize,
    /// Worst `|got − exact|` over the finite elements.
    pub max_abs: f64,
    /// `max_abs` divided by the largest finite `|exact|` (normwise relative error).
    pub max_rel: f64,
    /// Index of the worst element.
    pub worst_index: usize,
    /// The plain f32 computation's worst absolute error.
    pub baseline_abs: f64,
    /// The error allowed: `2 · baseline_abs + floor · max(1, largest |exact|)`.
    pub allowed: f64,
    /// Elements that are NaN, or whose infinity does not match the oracle's.
    pub mismatched_non_finite: usize,
}

impl ErrorReport {
    /// Whether the output is within tolerance.
    pub fn passed(&self) -> bool {
        self.mismatched_non_finite == 0 && self.max_abs <= self.allowed
    }

    /// A report for outputs that must match exactly (copies such as `present_key`).
    pub fn exact(got: &[f32], expected: &[f32]) -> ErrorReport {
        let exact: Vec<f64> = expected.iter().map(|&x| f64::from(x)).collect();
        let mut report = measure(got, &exact);
        report.allowed = 0.0;
        report
    }

    /// Adds to the allowance the rounding of an output stored in a narrower
    /// type: `unit_roundoff` (2⁻¹¹ for f16) times the largest finite `|exact|`.
    pub fn allow_output_rounding(mut self, exact: &[f64], unit_roundoff: f64) -> Self {
        self.allowed += unit_roundoff * largest_finite(exact);
        self
    }

    /// Adds `extra` to the allowance: a rounding the computation makes on
    /// purpose (the f16 probabilities of `Precision::Fast`).
    pub fn allow_more(mut self, extra: f64) -> Self {
        self.allowed += extra;
        self
    }

    /// How much of its allowance the error uses (`1.0` = exactly at the limit;
    /// infinite for NaN or mismatched infinities).
    pub fn share_of_allowed(&self) -> f64 {
        if self.mismatched_non_finite > 0 {
            f64::INFINITY
        } else if self.allowed > 0.0 {
            self.max_abs / self.allowed
        } else if self.max_abs > 0.0 {
            f64::INFINITY
        } else {
            0.0
        }
    }
}

/// Measures `got` against `exact` without a tolerance (`allowed` is 0).
fn measure(got: &[f32], exact: &[f64]) -> ErrorReport {
    let mut report = ErrorReport {
        len: got.len().min(exact.len()),
        max_abs: 0.0,
        max_rel: 0.0,
        worst_index: 0,
        baseline_abs: 0.0,
        allowed: 0.0,
        mismatched_non_finite: got.len().abs_diff(exact.len()),
    };
    let mut largest = 0.0f64;
    for (i, (&g, &e)) in got.iter().zip(exact).enumerate() {
        let g = f64::from(g);
        let e = in_f32_range(e);
        if e.is_finite() {
            largest = largest.max(e.abs());
            if !g.is_finite() {
                report.mismatched_non_finite += 1;
                continue;
            }
            let err = (g - e).abs();
            if err > report.max_abs {
                report.max_abs = err;
                report.worst_index = i;
            }
        } else if !(g == e || (g.is_nan() && e.is_nan())) {
            // The oracle's infinities (masked scores, empty rows' logsumexp) and
            // NaNs (rows that attend a non-finite score) must be matched.
            report.mismatched_non_finite += 1;
        }
    }
    report.max_rel = if largest > 0.0 {
        report.max_abs / largest
    } else {
        report.max_abs
    };
    report
}

/// Compares `got` with the oracle's `exact` values, allowing twice the error of
/// the plain f32 `baseline` plus `floor` (scaled by the output's magnitude, see
/// [`DEFAULT_FLOOR`]).
pub fn compare(got: &[f32], exact: &[f64], baseline: &[f32], floor: f64) -> ErrorReport {
    compare_baselines(got, exact, &[baseline], floor)
}

/// [`compare`] against the worst of several plain f32 computations of the same
/// thing (summed in different orders): no order is the right one, and with
/// large logits the f32 error depends on the order as much as on anything else.
pub fn compare_baselines(
    got: &[f32],
    exact: &[f64],
    baselines: &[&[f32]],
    floor: f64,
) -> ErrorReport {
    let mut report = measure(got, exact);
    report.baseline_abs = baselines
        .iter()
        .map(|b| measure(b, exact).max_abs)
        .fold(0.0, f64::max);
    report.allowed = 2.0 * report.baseline_abs + floor * largest_finite(exact).max(1.0);
    report
}

/// `exact` as an f32 output can hold it: a finite value beyond f32's range
/// (a logsumexp of scores near `f32::MAX` divided by a temperature below 1)
/// rounds to an infinity of its sign, which the result must then match.
fn in_f32_range(exact: f64) -> f64 {
    if exact.is_finite() && (exact as f32).is_infinite() {
        f64::from(exact as f32)
    } else {
        exact
    }
}

/// The largest finite `|x|` in `values` (0 when there is none), as f32 holds them.
fn largest_finite(values: &[f64]) -> f64 {
    values
        .iter()
        .map(|&x| in_f32_range(x))
        .filter(|x| x.is_finite())
        .fold(0.0, |m, x| m.max(x.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_twice_the_baseline_passes() {
        let exact = [1.0, 2.0, 3.0];
        let baseline = [1.0, 2.0 + 1e-3, 3.0];
        let good = [1.0 + 1.5e-3, 2.0, 3.0];
        let bad = [1.0, 2.0, 3.0 + 3e-3];
        assert!(compare(&good, &exact, &baseline, 0.0).passed());
        let r = compare(&bad, &exact, &baseline, 0.0);
        assert!(!r.passed());
        assert_eq!(r.worst_index, 2);
    }

    #[test]
    fn the_floor_scales_with_the_output_magnitude() {
        // Exact baselines; one ulp of 16 off passes, ten ulps of 1 off does not.
        let exact = [16.0, -3.0];
        let one_ulp = [16.0 + 2.0f32.powi(-19), -3.0];
        assert!(compare(&one_ulp, &exact, &[16.0, -3.0], 1e-6).passed());
        let off = [0.5, 1.0 + 10.0 * f32::EPSILON];
        assert!(!compare(&off, &[0.5, 1.0], &[0.5, 1.0], 1e-6).passed());
    }

    #[test]
    fn infinities_must_match_and_nan_fails() {
        let exact = [f64::NEG_INFINITY, 0.5];
        let ok = [f32::NEG_INFINITY, 0.5];
        assert!(compare(&ok, &exact, &ok, 1e-6).passed());
        let finite_for_inf = [-3.0e38, 0.5];
        assert_eq!(
            compare(&finite_for_inf, &exact, &ok, 1e-6).mismatched_non_finite,
            1
        );
        let nan = [f32::NEG_INFINITY, f32::NAN];
        assert!(!compare(&nan, &exact, &ok, 1e-6).passed());
        let expected_nan = [f64::NAN, 0.5];
        assert!(compare(&[f32::NAN, 0.5], &expected_nan, &[f32::NAN, 0.5], 1e-6).passed());
        assert!(!compare(&[0.0, 0.5], &expected_nan, &[f32::NAN, 0.5], 1e-6).passed());
    }

    #[test]
    fn exact_values_beyond_the_f32_range_expect_infinities() {
        // 1.2e39 overflows f32: +inf matches it, f32::MAX does not; a value
        // that rounds to f32::MAX stays finite.
        let exact = [1.2e39, -1.0e39, 0.5];
        let inf = [f32::INFINITY, f32::NEG_INFINITY, 0.5];
        assert!(compare(&inf, &exact, &inf, 1e-6).passed());
        let max = [f32::MAX, f32::NEG_INFINITY, 0.5];
        assert_eq!(compare(&max, &exact, &inf, 1e-6).mismatched_non_finite, 1);
        let near = [f64::from(f32::MAX) * (1.0 + 1e-9)];
        assert!(compare(&[f32::MAX], &near, &[f32::MAX], 1e-6).passed());
    }

    #[test]
    fn length_mismatch_fails() {
        assert!(!compare(&[1.0], &[1.0, 2.0], &[1.0, 2.0], 1.0).passed());
    }
}
