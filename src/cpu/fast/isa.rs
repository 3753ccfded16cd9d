//! Which instruction set the kernels run in, chosen once per call.
//!
//! The kernels are plain Rust loops over fixed-size arrays that the compiler
//! vectorises. What it can vectorise them *to* depends on the target features
//! a function is compiled with, so every hot loop is generic and
//! `#[inline(always)]`, and [`dispatch`] instantiates the whole job inside a
//! function compiled for AVX2 + FMA when the CPU has them (checked at run
//! time), or for the build's baseline otherwise (SSE2 on x86-64; SIMD128 on
//! wasm32 when the build enables `+simd128`, see `.cargo/config.toml`).

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
    /// x86-64 with AVX2 and FMA: 6 × 16 register tiles, fused multiply-adds.
    Avx2Fma,
    /// wasm32 with SIMD128: 4 × 8 tiles, separate multiply and add.
    Simd128,
    /// The build's baseline (SSE2 on x86-64, NEON on aarch64, scalar elsewhere): 4 × 8 tiles.
    Baseline,
}

impl Isa {
    /// The instruction set this machine runs the CPU backend in.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2Fma;
            }
        }
        if cfg!(all(target_arch = "wasm32", target_feature = "simd128")) {
            return Isa::Simd128;
        }
        Isa::Baseline
    }

    /// A short name (`avx2+fma`, `simd128`, `baseline`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx2Fma => "avx2+fma",
            Isa::Simd128 => "simd128",
            Isa::Baseline => "baseline",
        }
    }

    /// The register tile `(MR, NR)` the kernels use with this instruction
    /// set: the widest, or the narrow `4 × 8` one for short query blocks
    /// (where wide tiles would mostly compute padding).
    pub(crate) fn tiles(self, narrow: bool) -> (usize, usize) {
        match (self, narrow) {
            (Isa::Avx2Fma, false) => (6, 16),
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
    if isa == Isa::Avx2Fma
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
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
    let _ = (isa, narrow);
    job.run::<4, 8, false>()
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
