// The uniform binding of the attention kernels that score keys (the fused
// kernels in every form, the split-K decode kernels; their families write the
// block) with the contract's rules. Included as
// `// #include attention_call.wgsl`.

// #include attention_rules.wgsl

// #include PARAMS

@group(0) @binding(0) var<uniform> p: Params;

// #include attention_score.wgsl
