//! A small seeded random generator (SplitMix64) for reproducible test inputs.
//!
//! Every GPU check in webattn draws its inputs from a fixed seed, so a failure
//! can be replayed exactly.

/// SplitMix64: fast, seedable, and good enough for test data.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)` as f32.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit() as f32
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }

    /// Uniform integer in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }

    /// `len` normal values times `scale`.
    pub fn normal_vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.normal() * scale).collect()
    }

    /// [`SplitMix64::normal_vec`] of as many values as the product of
    /// `dims`, or [`crate::Error::OutOfMemory`] naming `what` where the host
    /// cannot hold them (a count past `usize` included), where a plain
    /// vector would abort the process (and in a browser, the page's wasm).
    pub fn try_normal_vec(
        &mut self,
        what: &str,
        dims: &[usize],
        scale: f32,
    ) -> crate::Result<Vec<f32>> {
        let refused = |bytes: u128| {
            crate::Error::OutOfMemory(format!(
                "drawing {what} ({} MiB of host memory)",
                bytes >> 20
            ))
        };
        let len = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                let bytes = dims.iter().fold(4u128, |n, &d| n.saturating_mul(d as u128));
                refused(bytes)
            })?;
        let mut out = Vec::new();
        out.try_reserve_exact(len)
            .map_err(|_| refused(len as u128 * 4))?;
        out.extend((0..len).map(|_| self.normal() * scale));
        Ok(out)
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    #[test]
    fn is_reproducible_and_in_range() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let u = a.unit();
            assert_eq!(u, b.unit());
            assert!((0.0..1.0).contains(&u));
            let n = a.below(13);
            assert_eq!(n, b.below(13));
            assert!(n < 13);
        }
    }
}
