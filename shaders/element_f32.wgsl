// f32 storage for the kernels that read K and V as vec4s (the ELEMENT slot of
// attention_decode.wgsl and attention_decode_stream): read as they are.
alias KV4 = vec4<f32>;
fn widen4(x: KV4) -> vec4<f32> {
    return x;
}

// Vec4 column c of key (value) row `row`: rows are D / 4 vec4s.
fn key4(row: u32, c: u32) -> vec4<f32> {
    return widen4(k4[row * (p.dk / 4u) + c]);
}
fn value4(row: u32, c: u32) -> vec4<f32> {
    return widen4(v4[row * (p.dv / 4u) + c]);
}
