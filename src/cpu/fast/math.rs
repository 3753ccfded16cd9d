//! Element-wise math the compiler can vectorise: `exp` and `tanh` as
//! polynomials with branch-free range handling (Cephes' `expf`/`tanhf`, about
//! 1 ulp), where the standard library's are calls to scalar libm.
//!
//! Everything is `#[inline(always)]`: it is compiled inside the kernels that
//! call it, with their instruction set (see [`super::isa`]).

/// `a * b + c`, fused when `FMA` (only where the CPU has FMA: otherwise
/// `mul_add` is a slow library call). On wasm32 a scalar is never fused
/// (wasm has no scalar fused multiply-add): there `FMA` only lets the
/// relaxed-SIMD micro-kernels fuse.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA && !cfg!(target_arch = "wasm32") {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `e^x` to about 1 ulp: exact 0 below `-87.34` (where e^x is subnormal) and
/// for `-inf`, `+inf` above `88.72`, NaN for NaN. The polynomial fuses its
/// multiply-adds when `FMA`.
#[inline(always)]
pub(crate) fn exp<const FMA: bool>(x: f32) -> f32 {
    const LO: f32 = -87.336_55;
    const HI: f32 = 88.722_83;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, the first exact in a few bits, so n·C1 is exact.
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(LO, HI);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let n_int = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = madd::<FMA>(-n, C2, madd::<FMA>(-n, C1, xc));
    let mut p = 1.987_569_1e-4_f32;
    p = madd::<FMA>(p, r, 1.398_199_9e-3);
    p = madd::<FMA>(p, r, 8.333_452e-3);
    p = madd::<FMA>(p, r, 4.166_579_6e-2);
    p = madd::<FMA>(p, r, 1.666_666_5e-1);
    p = madd::<FMA>(p, r, 5e-1);
    let e = madd::<FMA>(p, r * r, r) + 1.0;
    // 2^n in two factors, so n from -126 to 128 stays within the exponent range.
    let half = n_int >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((n_int - half + 127) as u32) << 23);
    let y = e * s1 * s2;
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        y
    }
}

/// `tanh x` to a few ulp, NaN for NaN, ±1 for ±inf.
#[inline(always)]
pub(crate) fn tanh<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    // |x| >= 0.625: 1 - 2 / (e^{2|x|} + 1), with the sign of x.
    let big = (1.0 - 2.0 / (exp::<FMA>(a + a) + 1.0)).copysign(x);
    // |x| < 0.625: x + x³·P(x²).
    let z = x * x;
    let mut p = -5.704_988_7e-3_f32;
    p = madd::<FMA>(p, z, 2.063_909e-2);
    p = madd::<FMA>(p, z, -5.373_971_6e-2);
    p = madd::<FMA>(p, z, 1.333_144_2e-1);
    p = madd::<FMA>(p, z, -3.333_328e-1);
    let small = madd::<FMA>(p * z, x, x);
    if a >= 0.625 {
        big
    } else {
        small
    }
}

/// Whether every value is finite, in one branch-free pass the compiler
/// vectorises (`iter().all` stops early, which keeps it scalar).
#[inline(always)]
pub(crate) fn all_finite(values: &[f32]) -> bool {
    const EXPONENT: u32 = 0x7f80_0000;
    let mut lanes = [0u32; 8];
    let chunks = values.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l |= u32::from(x.to_bits() & EXPONENT == EXPONENT);
        }
    }
    lanes.iter().all(|&l| l == 0) && tail.iter().all(|x| x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_matches_std_within_two_ulp() {
        let mut worst = 0;
        let mut x = -87.3f32;
        while x < 88.7 {
            let want = (f64::from(x)).exp() as f32;
            worst = worst.max(ulps(exp::<false>(x), want));
            worst = worst.max(ulps(exp::<true>(x), want));
            x += 0.0137;
        }
        assert!(worst <= 2, "worst {worst} ulp");
        assert_eq!(exp::<false>(0.0), 1.0);
        assert_eq!(exp::<true>(0.0), 1.0);
        assert_eq!(exp::<false>(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp::<false>(-100.0), 0.0);
        assert_eq!(exp::<false>(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp::<false>(89.0), f32::INFINITY);
        assert!(exp::<false>(f32::NAN).is_nan());
        assert!(exp::<false>(88.7).is_finite() && exp::<false>(88.7) > 3.0e38);
    }

    #[test]
    fn finiteness() {
        let mut v = vec![1.0f32; 21];
        assert!(all_finite(&v) && all_finite(&[]));
        for (i, bad) in [(3, f32::NAN), (20, f32::INFINITY), (9, f32::NEG_INFINITY)] {
            v[i] = bad;
            assert!(!all_finite(&v));
            v[i] = f32::MAX;
            assert!(all_finite(&v));
        }
    }

    #[test]
    fn tanh_matches_std() {
        let mut worst = 0;
        let mut x = -12.0f32;
        while x < 12.0 {
            let want = (f64::from(x)).tanh() as f32;
            worst = worst.max(ulps(tanh::<false>(x), want));
            worst = worst.max(ulps(tanh::<true>(x), want));
            x += 0.00731;
        }
        assert!(worst <= 4, "worst {worst} ulp");
        assert_eq!(tanh::<false>(f32::INFINITY), 1.0);
        assert_eq!(tanh::<false>(f32::NEG_INFINITY), -1.0);
        assert!(tanh::<false>(f32::NAN).is_nan());
        assert_eq!(tanh::<false>(0.0), 0.0);
        assert!(tanh::<false>(1e-30) == 1e-30);
    }
}
