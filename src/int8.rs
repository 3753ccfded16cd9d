//! Int8 rows: a row of values stored as signed bytes with one f32 scale, as
//! the paged cache's int8 pages hold each token's key (and value) of a head.
//! `x ≈ q · scale` with `scale = max|x| / 127` and `q = round(x / scale)`,
//! so the largest value is exact and every other is within `scale / 2`.
//! Dequantizing is one f32 product per value, the same on every path (host,
//! CPU backend, GPU kernel), so all of them see the same numbers.

/// The largest magnitude a quantized value takes.
pub const LEVELS: f32 = 127.0;

/// Quantizes `x` into `q` (same length) and returns the row's scale. A row
/// of zeros has scale 0; a row holding a NaN or an infinity cannot be
/// represented and is stored as scale NaN (every value reads back NaN, which
/// poisons the rows that attend it as the non-finite value would have).
pub fn quantize(x: &[f32], q: &mut [i8]) -> f32 {
    debug_assert_eq!(x.len(), q.len());
    let mut amax = 0.0f32;
    let mut finite = true;
    for &v in x {
        finite &= v.is_finite();
        amax = amax.max(v.abs());
    }
    if !finite {
        q.fill(0);
        return f32::NAN;
    }
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let scale = amax / LEVELS;
    for (o, &v) in q.iter_mut().zip(x) {
        *o = (v / scale).round().clamp(-LEVELS, LEVELS) as i8;
    }
    scale
}

/// `q · scale` into `out` (same length): the values a quantized row stands for.
#[inline(always)]
pub fn dequantize(q: &[i8], scale: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(q) {
        *o = f32::from(v) * scale;
    }
}

/// A quantized row packed for the GPU: the values four to a little-endian
/// 32-bit word (lowest byte first), then the scale's bits. `q.len()` must be
/// a multiple of 4.
pub fn pack_words(q: &[i8], scale: f32, out: &mut Vec<u32>) {
    for four in q.chunks_exact(4) {
        out.push(u32::from_le_bytes([
            four[0] as u8,
            four[1] as u8,
            four[2] as u8,
            four[3] as u8,
        ]));
    }
    out.push(scale.to_bits());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.37)
            .collect();
        let mut q = vec![0i8; 64];
        let scale = quantize(&x, &mut q);
        let mut back = vec![0.0f32; 64];
        dequantize(&q, scale, &mut back);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert_eq!(scale, amax / 127.0);
        for (a, b) in x.iter().zip(&back) {
            assert!((a - b).abs() <= scale * 0.5 + 1e-6, "{a} {b}");
        }
        assert!(q.iter().any(|&v| v.abs() == 127));
    }

    #[test]
    fn zeros_and_non_finite_rows() {
        let mut q = vec![5i8; 4];
        assert_eq!(quantize(&[0.0; 4], &mut q), 0.0);
        assert_eq!(q, [0; 4]);
        assert!(quantize(&[1.0, f32::INFINITY, 0.0, 2.0], &mut q).is_nan());
        assert!(quantize(&[1.0, f32::NAN, 0.0, 2.0], &mut q).is_nan());
    }

    #[test]
    fn packed_words_little_endian_then_scale() {
        let mut out = Vec::new();
        pack_words(&[1, -1, 2, -128, 3, 4, 5, 6], 0.5, &mut out);
        assert_eq!(out, [0x80_02_ff_01, 0x06_05_04_03, 0.5f32.to_bits()]);
    }
}
