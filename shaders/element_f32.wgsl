// f32 storage for the kernels that read K and V as vec4s (the ELEMENT slot of
// attention_decode.wgsl and attention_decode_stream): read as they are.
alias KV4 = vec4<f32>;
fn widen4(x: KV4) -> vec4<f32> {
    return x;
}
