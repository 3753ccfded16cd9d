// f16 storage for the kernels that read K and V as vec4s: four f16 values in
// two u32 words (little-endian halves), widened to f32 with unpack2x16float,
// which is core WGSL, so no adapter needs the shader-f16 feature for it. The
// f16 variants of the decode kernels put it in their ELEMENT slot.
alias KV4 = vec2<u32>;
fn widen4(x: KV4) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y));
}

// Vec4 column c of key (value) row `row`: rows are D / 4 word pairs.
fn key4(row: u32, c: u32) -> vec4<f32> {
    return widen4(k4[row * (p.dk / 4u) + c]);
}
fn value4(row: u32, c: u32) -> vec4<f32> {
    return widen4(v4[row * (p.dv / 4u) + c]);
}
