//! A decoding step's scores with the keys in the vector lanes: `out[k] =
//! key_k · q` for one query against rows of keys read in place.
//!
//! The tiled kernel puts queries in the lanes, and a step has one or two
//! queries, so seven of eight lanes multiplied padding. Here eight keys share
//! a register: eight rows' next eight values are loaded and transposed, then
//! added in order of the inner index. Each dot product is still the plain f32
//! sum (a rounded product and a rounded sum per step, in order of `d`), the
//! numbers whose error sets the tolerance, bit for bit.

#[cfg(target_arch = "x86_64")]
use super::isa::Isa;

/// `out[k] = keys[k] · q` (the plain f32 sum in order of `d`; `q.len()`
/// values of each key are read).
///
/// # Panics
/// If a key row is shorter than `q` or `out` shorter than `keys`.
pub(crate) fn dots(keys: &[&[f32]], q: &[f32], out: &mut [f32]) {
    let out = &mut out[..keys.len()];
    #[cfg(target_arch = "x86_64")]
    if matches!(Isa::detect(), Isa::Avx512 | Isa::Avx2Fma)
        && std::arch::is_x86_feature_detected!("avx")
    {
        // SAFETY: the CPU has AVX (checked just above).
        return unsafe { dots_avx(keys, q, out) };
    }
    dots_plain(keys, q, out);
}

/// Asks the CPU to bring `row` into its caches (a hint; nothing elsewhere).
#[inline(always)]
pub(crate) fn prefetch<T>(row: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = std::mem::size_of_val(row);
        let start = row.as_ptr().cast::<i8>();
        for line in (0..bytes).step_by(64) {
            // SAFETY: SSE is part of x86-64; a prefetch reads nothing the
            // program sees, and the address lies within `row`.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    start.wrapping_add(line),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// [`dots`] one key at a time.
fn dots_plain(keys: &[&[f32]], q: &[f32], out: &mut [f32]) {
    for (o, key) in out.iter_mut().zip(keys) {
        let mut acc = 0.0f32;
        for (&k, &x) in key[..q.len()].iter().zip(q) {
            acc += k * x;
        }
        *o = acc;
    }
}

/// [`dots`] eight keys at a time in 256-bit registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn dots_avx(keys: &[&[f32]], q: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_loadu_ps, _mm256_mul_ps, _mm256_permute2f128_ps, _mm256_set1_ps,
        _mm256_setzero_ps, _mm256_shuffle_ps, _mm256_storeu_ps, _mm256_unpackhi_ps,
        _mm256_unpacklo_ps,
    };
    let d = q.len();
    let whole = d / 8 * 8;
    let groups = keys.len() / 8;
    for g in 0..groups {
        let rows: [&[f32]; 8] = std::array::from_fn(|r| &keys[g * 8 + r][..d]);
        let mut acc = _mm256_setzero_ps();
        for c in (0..whole).step_by(8) {
            // SAFETY: c + 8 <= d, the length of every row (sliced above).
            let r: [_; 8] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(rows[i][c..].as_ptr()) });
            // The 8 × 8 block transposed: t[j] holds value c + j of each key.
            let a0 = _mm256_unpacklo_ps(r[0], r[1]);
            let a1 = _mm256_unpackhi_ps(r[0], r[1]);
            let a2 = _mm256_unpacklo_ps(r[2], r[3]);
            let a3 = _mm256_unpackhi_ps(r[2], r[3]);
            let a4 = _mm256_unpacklo_ps(r[4], r[5]);
            let a5 = _mm256_unpackhi_ps(r[4], r[5]);
            let a6 = _mm256_unpacklo_ps(r[6], r[7]);
            let a7 = _mm256_unpackhi_ps(r[6], r[7]);
            let b0 = _mm256_shuffle_ps::<0x44>(a0, a2);
            let b1 = _mm256_shuffle_ps::<0xee>(a0, a2);
            let b2 = _mm256_shuffle_ps::<0x44>(a1, a3);
            let b3 = _mm256_shuffle_ps::<0xee>(a1, a3);
            let b4 = _mm256_shuffle_ps::<0x44>(a4, a6);
            let b5 = _mm256_shuffle_ps::<0xee>(a4, a6);
            let b6 = _mm256_shuffle_ps::<0x44>(a5, a7);
            let b7 = _mm256_shuffle_ps::<0xee>(a5, a7);
            let t = [
                _mm256_permute2f128_ps::<0x20>(b0, b4),
                _mm256_permute2f128_ps::<0x20>(b1, b5),
                _mm256_permute2f128_ps::<0x20>(b2, b6),
                _mm256_permute2f128_ps::<0x20>(b3, b7),
                _mm256_permute2f128_ps::<0x31>(b0, b4),
                _mm256_permute2f128_ps::<0x31>(b1, b5),
                _mm256_permute2f128_ps::<0x31>(b2, b6),
                _mm256_permute2f128_ps::<0x31>(b3, b7),
            ];
            for (j, t) in t.into_iter().enumerate() {
                acc = _mm256_add_ps(acc, _mm256_mul_ps(t, _mm256_set1_ps(q[c + j])));
            }
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds 8 values.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
        // The last `d % 8` steps, in order, lane by lane.
        for (lane, row) in lanes.iter_mut().zip(rows) {
            for (&k, &x) in row[whole..].iter().zip(&q[whole..]) {
                *lane += k * x;
            }
        }
        out[g * 8..g * 8 + 8].copy_from_slice(&lanes);
    }
    dots_plain(&keys[groups * 8..], q, &mut out[groups * 8..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn the_plain_sums_bit_for_bit() {
        let mut rng = SplitMix64::new(9);
        for (n, d) in [(0, 4), (1, 1), (7, 9), (8, 8), (17, 128), (64, 61), (9, 3)] {
            let data = rng.normal_vec(n * (d + 3), 30.0);
            let keys: Vec<&[f32]> = data.chunks(d + 3).map(|r| &r[1..]).collect();
            let q = rng.normal_vec(d, 1.0);
            let mut want = vec![0.0; n];
            dots_plain(&keys, &q, &mut want);
            let mut got = vec![f32::NAN; n + 1];
            dots(&keys, &q, &mut got);
            assert_eq!(&got[..n], &want[..], "{n} keys of {d}");
            for (k, w) in keys.iter().zip(&want) {
                let mut plain = 0.0f32;
                for i in 0..d {
                    plain += k[i] * q[i];
                }
                assert_eq!(plain.to_bits(), w.to_bits());
            }
        }
    }
}
