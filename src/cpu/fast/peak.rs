//! The core's f32 FMA ceiling in the instruction set the backend runs:
//! independent chains of multiply-adds on registers, nothing loaded, so the
//! CPU rows of `webattn bench` report a share of the machine's own peak, as
//! the GPU rows report one of the GPU's.

use super::isa::Isa;

/// Runs `steps` steps of independent multiply-add chains in `isa` and
/// returns the flops done (a multiply-add is two) and a value that depends
/// on every chain (for `black_box`).
pub(crate) fn fma_chains(isa: Isa, steps: usize) -> (f64, f32) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: each branch runs only where the CPU has the instruction set.
        Isa::Avx512 if isa.runs_here() => return unsafe { chains_avx512(steps) },
        Isa::Avx2Fma if isa.runs_here() => return unsafe { chains_avx2(steps) },
        _ => {}
    }
    if isa == Isa::Neon {
        return chains_fused(steps);
    }
    chains_plain(steps)
}

/// Eight chains of 8 lanes, fused multiply-adds (one instruction with NEON).
fn chains_fused(steps: usize) -> (f64, f32) {
    let mut acc = [[1.0f32; 8]; 8];
    let m = std::hint::black_box(0.999_999_9f32);
    let a = std::hint::black_box(1.0e-7f32);
    for _ in 0..steps {
        for row in acc.iter_mut() {
            for x in row.iter_mut() {
                *x = x.mul_add(m, a);
            }
        }
    }
    let sum = acc.iter().flatten().sum();
    ((steps * 64 * 2) as f64, sum)
}

/// Eight chains of 8 lanes, multiply then add (what the baseline kernels do).
fn chains_plain(steps: usize) -> (f64, f32) {
    let mut acc = [[1.0f32; 8]; 8];
    let m = std::hint::black_box(0.999_999_9f32);
    let a = std::hint::black_box(1.0e-7f32);
    for _ in 0..steps {
        for row in acc.iter_mut() {
            for x in row.iter_mut() {
                *x = *x * m + a;
            }
        }
    }
    let sum = acc.iter().flatten().sum();
    ((steps * 64 * 2) as f64, sum)
}

/// Twelve chains of 8-lane fused multiply-adds: enough to cover the latency
/// of two FMA pipes, within AVX2's 16 registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn chains_avx2(steps: usize) -> (f64, f32) {
    use std::arch::x86_64::{_mm256_fmadd_ps, _mm256_set1_ps, _mm256_storeu_ps};
    let m = _mm256_set1_ps(std::hint::black_box(0.999_999_9));
    let a = _mm256_set1_ps(std::hint::black_box(1.0e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..steps {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, m, a);
        }
    }
    let mut lanes = [0.0f32; 8];
    let mut sum = 0.0;
    for x in acc {
        // SAFETY: `lanes` holds 8 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), x) };
        sum += lanes.iter().sum::<f32>();
    }
    ((steps * 12 * 8 * 2) as f64, sum)
}

/// Sixteen chains of 16-lane fused multiply-adds (more made the compiler
/// keep some in memory).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn chains_avx512(steps: usize) -> (f64, f32) {
    use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_reduce_add_ps, _mm512_set1_ps};
    let m = _mm512_set1_ps(std::hint::black_box(0.999_999_9));
    let a = _mm512_set1_ps(std::hint::black_box(1.0e-7));
    let mut acc = [_mm512_set1_ps(1.0); 16];
    for _ in 0..steps {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, m, a);
        }
    }
    let sum = acc.into_iter().map(|x| _mm512_reduce_add_ps(x)).sum();
    ((steps * 16 * 16 * 2) as f64, sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_counts_its_flops_and_keeps_its_chains_near_one() {
        for isa in [Isa::Avx512, Isa::Avx2Fma, Isa::Baseline] {
            let (flops, sum) = fma_chains(isa, 1000);
            assert!(flops >= 1000.0 * 128.0, "{isa:?}");
            // Each lane stays within a hair of 1 (m slightly below, a tiny).
            let lanes = flops / 2000.0;
            assert!((sum as f64 / lanes - 1.0).abs() < 1e-3, "{isa:?}: {sum}");
        }
    }
}
