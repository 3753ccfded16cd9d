// The device's FMA ceiling: many independent vec4 multiply-add chains per
// invocation, so the measured rate is arithmetic throughput, not latency.
//
// Each invocation keeps 32 vec4 accumulators (ILP: lavapipe needs many
// independent chains per invocation to fill its SIMD pipes) and runs
// `iterations` rounds of one fma per accumulator: 32 * 4 * 2 flops a round.
// The multiplier and addend come from the uniform so nothing folds away, and
// the sum of the accumulators is stored so nothing is dead.

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> sink: array<vec4<f32>>;

override WORKGROUP: u32 = 64u;

@compute @workgroup_size(WORKGROUP, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let index = (wid.x + wid.y * nwg.x) * WORKGROUP + li;
    // Each lane its own start: with equal lanes a compiler that splits the
    // vec4s into scalars could keep one chain per accumulator and count four.
    let seed = vec4<f32>(f32(index & 1023u) * 1e-3) + vec4<f32>(0.0, 0.25, 0.5, 0.75);
    let m = vec4<f32>(p.mul);
    let c = vec4<f32>(p.add);
    var a0 = seed + vec4<f32>(0.0);
    var a1 = seed + vec4<f32>(1.0);
    var a2 = seed + vec4<f32>(2.0);
    var a3 = seed + vec4<f32>(3.0);
    var a4 = seed + vec4<f32>(4.0);
    var a5 = seed + vec4<f32>(5.0);
    var a6 = seed + vec4<f32>(6.0);
    var a7 = seed + vec4<f32>(7.0);
    var a8 = seed + vec4<f32>(8.0);
    var a9 = seed + vec4<f32>(9.0);
    var a10 = seed + vec4<f32>(10.0);
    var a11 = seed + vec4<f32>(11.0);
    var a12 = seed + vec4<f32>(12.0);
    var a13 = seed + vec4<f32>(13.0);
    var a14 = seed + vec4<f32>(14.0);
    var a15 = seed + vec4<f32>(15.0);
    var a16 = seed + vec4<f32>(16.0);
    var a17 = seed + vec4<f32>(17.0);
    var a18 = seed + vec4<f32>(18.0);
    var a19 = seed + vec4<f32>(19.0);
    var a20 = seed + vec4<f32>(20.0);
    var a21 = seed + vec4<f32>(21.0);
    var a22 = seed + vec4<f32>(22.0);
    var a23 = seed + vec4<f32>(23.0);
    var a24 = seed + vec4<f32>(24.0);
    var a25 = seed + vec4<f32>(25.0);
    var a26 = seed + vec4<f32>(26.0);
    var a27 = seed + vec4<f32>(27.0);
    var a28 = seed + vec4<f32>(28.0);
    var a29 = seed + vec4<f32>(29.0);
    var a30 = seed + vec4<f32>(30.0);
    var a31 = seed + vec4<f32>(31.0);
    for (var it = 0u; it < p.iterations; it++) {
        a0 = fma(a0, m, c);
        a1 = fma(a1, m, c);
        a2 = fma(a2, m, c);
        a3 = fma(a3, m, c);
        a4 = fma(a4, m, c);
        a5 = fma(a5, m, c);
        a6 = fma(a6, m, c);
        a7 = fma(a7, m, c);
        a8 = fma(a8, m, c);
        a9 = fma(a9, m, c);
        a10 = fma(a10, m, c);
        a11 = fma(a11, m, c);
        a12 = fma(a12, m, c);
        a13 = fma(a13, m, c);
        a14 = fma(a14, m, c);
        a15 = fma(a15, m, c);
        a16 = fma(a16, m, c);
        a17 = fma(a17, m, c);
        a18 = fma(a18, m, c);
        a19 = fma(a19, m, c);
        a20 = fma(a20, m, c);
        a21 = fma(a21, m, c);
        a22 = fma(a22, m, c);
        a23 = fma(a23, m, c);
        a24 = fma(a24, m, c);
        a25 = fma(a25, m, c);
        a26 = fma(a26, m, c);
        a27 = fma(a27, m, c);
        a28 = fma(a28, m, c);
        a29 = fma(a29, m, c);
        a30 = fma(a30, m, c);
        a31 = fma(a31, m, c);
    }
    sink[index] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7
        + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15
        + a16 + a17 + a18 + a19 + a20 + a21 + a22 + a23
        + a24 + a25 + a26 + a27 + a28 + a29 + a30 + a31;
}
