// (sin x, cos x) of an angle in f32, for the rotary and sinusoidal
// encodings (`position.wgsl`, `cache_append.wgsl`; included as
// `// #include sincos.wgsl`). WGSL's sin and cos need only be accurate to
// 2^-11 on [-pi, pi] and are unspecified beyond; angles here reach thousands
// of radians, so the angle is reduced by pi/2 in three parts (Cody-Waite) and
// polynomials are evaluated on [-pi/4, pi/4].

// pi/2 in three parts: the first two have few enough bits that k * part is exact.
const PIO2_1: f32 = 1.5703125;
const PIO2_2: f32 = 4.837512969970703125e-4;
const PIO2_3: f32 = 7.54978995489188216e-8;
const TWO_OVER_PI: f32 = 0.636619772367581343;

// (sin x, cos x) for |x| up to about 1e5.
fn sincos(x: f32) -> vec2<f32> {
    let k = round(x * TWO_OVER_PI);
    let r = ((x - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
    let z = r * r;
    let s = r + r * z * (-1.0 / 6.0 + z * (1.0 / 120.0 + z * (-1.0 / 5040.0 + z * (1.0 / 362880.0))));
    let c = 1.0 + z * (-0.5 + z * (1.0 / 24.0 + z * (-1.0 / 720.0 + z * (1.0 / 40320.0 + z * (-1.0 / 3628800.0)))));
    // Rotate by the quadrant k mod 4.
    let q = i32(k) & 3;
    switch q {
        case 0: { return vec2<f32>(s, c); }
        case 1: { return vec2<f32>(c, -s); }
        case 2: { return vec2<f32>(-s, -c); }
        default: { return vec2<f32>(-c, s); }
    }
}
