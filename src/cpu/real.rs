//! The arithmetic the oracle is written in, so one implementation runs in f64
//! (the oracle) and in f32 (the plain baseline that sets the tolerance).

use std::ops::{Add, Div, Mul, Sub};

/// A floating-point type the oracle can compute in.
pub trait Real:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Send
    + Sync
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// -inf.
    const NEG_INFINITY: Self;
    /// Widens (or keeps) an f32.
    fn from_f32(x: f32) -> Self;
    /// Converts to f64 (exact for both implementations).
    fn to_f64(self) -> f64;
    /// e^x.
    fn exp(self) -> Self;
    /// ln x.
    fn ln(self) -> Self;
    /// tanh x.
    fn tanh(self) -> Self;
    /// Rounds (or keeps) an f64.
    fn from_f64(x: f64) -> Self;
    /// sin x.
    fn sin(self) -> Self;
    /// cos x.
    fn cos(self) -> Self;
    /// √x.
    fn sqrt(self) -> Self;
    /// NaN.
    const NAN: Self;
    /// +inf.
    const INFINITY: Self;
    /// Whether the value is NaN.
    fn is_nan(self) -> bool;
}

macro_rules! impl_real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            const NAN: Self = <$t>::NAN;
            const INFINITY: Self = <$t>::INFINITY;
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn from_f32(x: f32) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
        }
    };
}

impl_real!(f32);
impl_real!(f64);
