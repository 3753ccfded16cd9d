//! Which instruction set the kernels run in, chosen once per process.
//!
//! The kernels are plain Rust loops over fixed-size arrays that the compiler
//! vectorises. What it can vectorise them *to* depends on the target features
//! a function is compiled with, so every hot loop is generic and
//! `#[inline(always)]`, and [`dispatch`] instantiates the whole job inside a
//! function compiled for AVX-512 or AVX2 + FMA when the CPU has them (checked
//! at run time), with NEON's fused multiply-adds on aarch64, or for the
//! build's baseline otherwise (SSE2 on x86-64; SIMD128 on wasm32 when the
//! build enables `+simd128`, see `.cargo/config.toml`, and relaxed SIMD in
//! the second wasm package, built with the `relaxed-simd` feature). Under AVX-512
//! (`avx512.rs`) and relaxed SIMD (`relaxed.rs`) the micro-kernels are
//! written by hand; `WEBATTN_CPU_ISA` (`avx512`, `avx2`, `baseline`) caps the
//! choice (`neon` on aarch64), to measure one instruction set against
//! another on one machine.

use std::sync::OnceLock;

/// The environment variable that caps the instruction set.
pub const ISA_VARIABLE: &str = "WEBATTN_CPU_ISA";

/// Work written once for any register tile: the micro-kernels keep an
/// `MR × NR` block of accumulators in registers, and `FMA` says whether
/// `a * b + c` may be fused. [`dispatch`] picks the instantiation.
pub(crate) trait Job {
    /// What the job returns.
    type Output;
    /// Runs the job with `MR × NR` register tiles, fusing multiply-adds when `FMA`.
    fn run<const MR: usize, const NR: usize, const FMA: bool>(self) -> Self::Output;
}

/// The instruction set `dispatch` picks on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// x86-64 with AVX-512F and VL: 8 × 32 register tiles on hand-written
    /// micro-kernels, 128-key tiles.
    Avx512,
    /// x86-64 with AVX2 and FMA: 6 × 16 register tiles, fused multiply-adds.
    Avx2Fma,
    /// aarch64 with NEON (always there): 8 × 8 tiles, fused multiply-adds.
    Neon,
    /// wasm32 with relaxed SIMD (the second wasm package): 4 × 8 tiles, the
    /// P·V products on `f32x4.relaxed_madd` (`relaxed.rs`).
    RelaxedSimd,
    /// wasm32 with SIMD128: 4 × 8 tiles, separate multiply and add.
    Simd128,
    /// The build's baseline (SSE2 on x86-64, scalar elsewhere): 4 × 8 tiles, no fused multiply-adds.
    Baseline,
}

impl Isa {
    /// The instruction set this machine runs the CPU backend in: the best it
    /// has, at most the one `WEBATTN_CPU_ISA` names (read once per process).
    pub fn detect() -> Isa {
        static CHOSEN: OnceLock<Isa> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let cap = std::env::var(ISA_VARIABLE).ok();
            let best = Isa::best();
            match cap.as_deref().map(Isa::from_name) {
                None => best,
                Some(Some(cap)) => best.min(cap),
                Some(None) => {
                    log::warn!(
                        "{ISA_VARIABLE}={:?} is not one of avx512, avx2, baseline; using {}",
                        cap.unwrap_or_default(),
                        best.name()
                    );
                    best
                }
            }
        })
    }

    /// The best instruction set this CPU has, whatever `WEBATTN_CPU_ISA` says.
    pub fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::Avx512.runs_here() {
                return Isa::Avx512;
            }
            if Isa::Avx2Fma.runs_here() {
                return Isa::Avx2Fma;
            }
        }
        if cfg!(target_arch = "aarch64") {
            return Isa::Neon;
        }
        if cfg!(all(target_arch = "wasm32", feature = "relaxed-simd")) {
            return Isa::RelaxedSimd;
        }
        if cfg!(all(target_arch = "wasm32", target_feature = "simd128")) {
            return Isa::Simd128;
        }
        Isa::Baseline
    }

    /// Whether this CPU has the instruction set (the baseline always runs).
    pub fn runs_here(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && Isa::Avx2Fma.runs_here()
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            Isa::Neon => cfg!(target_arch = "aarch64"),
            Isa::RelaxedSimd => cfg!(all(target_arch = "wasm32", feature = "relaxed-simd")),
            Isa::Simd128 => cfg!(all(target_arch = "wasm32", target_feature = "simd128")),
            Isa::Baseline => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The instruction set a name (as [`Isa::name`] gives it, or `avx2`)
    /// stands for.
    pub fn from_name(name: &str) -> Option<Isa> {
        match name.trim().to_ascii_lowercase().as_str() {
            "avx512" | "avx-512" | "avx512f" => Some(Isa::Avx512),
            "avx2" | "avx2+fma" => Some(Isa::Avx2Fma),
            "neon" => Some(Isa::Neon),
            "relaxed-simd" => Some(Isa::RelaxedSimd),
            "simd128" => Some(Isa::Simd128),
            "baseline" | "scalar" | "none" => Some(Isa::Baseline),
            _ => None,
        }
    }

    /// Its rank among the others: a cap takes the lower of two.
    fn min(self, cap: Isa) -> Isa {
        let rank = |isa: Isa| match isa {
            Isa::Baseline => 0,
            Isa::Simd128 => 1,
            Isa::RelaxedSimd | Isa::Avx2Fma | Isa::Neon => 2,
            Isa::Avx512 => 3,
        };
        if rank(cap) < rank(self) && cap.runs_here() {
            cap
        } else if rank(cap) < rank(self) {
            Isa::Baseline
        } else {
            self
        }
    }

    /// A short name (`avx2+fma`, `simd128`, `baseline`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2Fma => "avx2+fma",
            Isa::Neon => "neon",
            Isa::RelaxedSimd => "relaxed-simd",
            Isa::Simd128 => "simd128",
            Isa::Baseline => "baseline",
        }
    }

    /// The register tile `(MR, NR)` the kernels use with this instruction
    /// set: the widest, or the narrow `4 × 8` one for short query blocks
    /// (where wide tiles would mostly compute padding).
    pub(crate) fn tiles(self, narrow: bool) -> (usize, usize) {
        match (self, narrow) {
            (Isa::Avx512, false) => (8, 32),
            (Isa::Avx2Fma, false) => (6, 16),
            (Isa::Neon, false) => (8, 8),
            _ => (4, 8),
        }
    }

    /// `MR` of the widest tile.
    pub(crate) fn mr(self) -> usize {
        self.tiles(false).0
    }

    /// `NR` of the widest tile.
    pub(crate) fn nr(self) -> usize {
        self.tiles(false).1
    }

    /// Keys per tile of the attention kernel with the widest tiles: what
    /// fits beside the query block in L1 (measured: 128 beat 48, 64 and 96
    /// under AVX-512 on a Zen 4; 48 under AVX2 on a Zen 3).
    pub(crate) fn key_tile(self) -> usize {
        match self {
            Isa::Avx512 => 128,
            _ => 48,
        }
    }
}

/// Runs `job` with the widest tiles of `isa` (which must come from
/// [`Isa::detect`] on this machine).
pub(crate) fn dispatch<J: Job>(isa: Isa, job: J) -> J::Output {
    dispatch_tiles(isa, false, job)
}

/// Runs `job` with the tiles `isa.tiles(narrow)` says, in the instruction set
/// of `isa` (which must come from [`Isa::detect`] on this machine).
pub(crate) fn dispatch_tiles<J: Job>(isa: Isa, narrow: bool, job: J) -> J::Output {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && !narrow && isa.runs_here() {
        // SAFETY: the CPU has AVX-512F, VL, AVX2 and FMA (checked just
        // above), which is all that `run_avx512_wide` requires of its caller.
        return unsafe { run_avx512_wide(job) };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx512 | Isa::Avx2Fma) && Isa::Avx2Fma.runs_here() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above), which is all
        // that the `run_avx2_fma_*` functions require of their caller.
        return unsafe {
            if narrow {
                run_avx2_fma_narrow(job)
            } else {
                run_avx2_fma_wide(job)
            }
        };
    }
    if isa == Isa::Neon && isa.runs_here() {
        // NEON's fused multiply-add is one instruction on every aarch64 CPU;
        // its 32 registers hold an 8 × 8 tile (16) beside the operands.
        return if narrow {
            job.run::<4, 8, true>()
        } else {
            job.run::<8, 8, true>()
        };
    }
    if isa == Isa::RelaxedSimd && isa.runs_here() {
        // `FMA` lets the P·V products fuse in `relaxed.rs`; scalars on wasm
        // are never fused (`math::madd`).
        return job.run::<4, 8, true>();
    }
    let _ = (isa, narrow);
    job.run::<4, 8, false>()
}

/// The job compiled with AVX-512 enabled, 8 × 32 tiles: the micro-kernels
/// take the hand-written path for that width, and the element-wise loops
/// around them are vectorised at 16 lanes. (A decoding step's narrow tiles
/// run under AVX2, where the compiler's own vectorisation is known good.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
fn run_avx512_wide<J: Job>(job: J) -> J::Output {
    job.run::<8, 32, true>()
}

/// The job compiled with AVX2 and FMA enabled, 6 × 16 tiles; every kernel it
/// calls is `#[inline(always)]`, so they are compiled with them too.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2_fma_wide<J: Job>(job: J) -> J::Output {
    job.run::<6, 16, true>()
}

/// [`run_avx2_fma_wide`] with 4 × 8 tiles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2_fma_narrow<J: Job>(job: J) -> J::Output {
    job.run::<4, 8, true>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_caps() {
        for isa in [
            Isa::Avx512,
            Isa::Avx2Fma,
            Isa::Neon,
            Isa::RelaxedSimd,
            Isa::Simd128,
            Isa::Baseline,
        ] {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
        }
        assert_eq!(Isa::from_name(" AVX2 "), Some(Isa::Avx2Fma));
        assert_eq!(Isa::from_name("sse9"), None);
        assert!(Isa::Baseline.runs_here() && Isa::best().runs_here());
        // A cap never raises the choice, and lands on something that runs.
        let best = Isa::best();
        assert_eq!(best.min(Isa::Avx512), best);
        assert_eq!(best.min(Isa::Baseline), Isa::Baseline);
        for cap in [
            Isa::Avx512,
            Isa::Avx2Fma,
            Isa::Neon,
            Isa::RelaxedSimd,
            Isa::Simd128,
            Isa::Baseline,
        ] {
            assert!(best.min(cap).runs_here());
        }
        for narrow in [false, true] {
            for isa in [Isa::Avx512, Isa::Avx2Fma, Isa::Neon, Isa::Baseline] {
                let (mr, nr) = isa.tiles(narrow);
                assert!(mr > 0 && nr % 8 == 0);
            }
        }
    }
}
