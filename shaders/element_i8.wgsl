// int8 storage for the paged decode kernel (its ELEMENT slot): a row of D
// values is D / 4 u32 words, four signed bytes each (lowest byte first),
// then one word holding the row's f32 scale; a value is its byte times the
// scale (src/int8.rs), one f32 product, as on the host. The bytes are
// widened with shifts (core WGSL: no adapter needs the packed-integer
// features).
alias KV4 = u32;

fn widen_i8(word: u32) -> vec4<f32> {
    let bytes = vec4<i32>(
        bitcast<i32>(word << 24u),
        bitcast<i32>(word << 16u),
        bitcast<i32>(word << 8u),
        bitcast<i32>(word),
    ) >> vec4<u32>(24u);
    return vec4<f32>(bytes);
}

// Vec4 column c of key row `row`.
fn key4(row: u32, c: u32) -> vec4<f32> {
    let stride = p.dk / 4u + 1u;
    return widen_i8(k4[row * stride + c]) * bitcast<f32>(k4[row * stride + p.dk / 4u]);
}

// Vec4 column c of value row `row`.
fn value4(row: u32, c: u32) -> vec4<f32> {
    let stride = p.dv / 4u + 1u;
    return widen_i8(v4[row * stride + c]) * bitcast<f32>(v4[row * stride + p.dv / 4u]);
}
