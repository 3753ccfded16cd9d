//! Kernel text: the fragments a kernel's WGSL includes (`// #include
//! NAME.wgsl` lines) and the slots a file leaves open for its variants
//! (`// #include SLOT`), spliced in by Rust since WGSL has no includes; and
//! naga's validation of the result, as wgpu would do it, without a GPU.

#[cfg(not(target_arch = "wasm32"))]
use crate::error::{Error, Result};

/// Files in `shaders/` that are not kernels but blocks a kernel's text takes in
/// kernels: `// #include NAME` lines ([`with_includes`]) and the slots of
/// `Kernel::slots`.
pub const FRAGMENTS: [&str; 14] = [
    "ablate.wgsl",
    "kv_rows_dense.wgsl",
    "kv_rows_paged.wgsl",
    "gemm_params.wgsl",
    "element_f32.wgsl",
    "coop16.wgsl",
    "coop8.wgsl",
    "sincos.wgsl",
    "element_f16.wgsl",
    "element_i8.wgsl",
    "attention_qkv4.wgsl",
    "attention_rules.wgsl",
    "attention_score.wgsl",
    "attention_call.wgsl",
];

/// The line that includes a fragment: `// #include NAME.wgsl`.
pub(crate) const INCLUDE: &str = "// #include ";

/// The slot a kernel's parameter block fills: `// #include PARAMS`, its
/// WGSL `struct Params` written from the Rust block.
pub const PARAMS: &str = "PARAMS";

/// The fragments a kernel can include, with their text.
const INCLUDABLE: [(&str, &str); 14] = [
    ("ablate.wgsl", include_str!("../../shaders/ablate.wgsl")),
    (
        "kv_rows_dense.wgsl",
        include_str!("../../shaders/kv_rows_dense.wgsl"),
    ),
    (
        "kv_rows_paged.wgsl",
        include_str!("../../shaders/kv_rows_paged.wgsl"),
    ),
    (
        "element_f32.wgsl",
        include_str!("../../shaders/element_f32.wgsl"),
    ),
    (
        "element_f16.wgsl",
        include_str!("../../shaders/element_f16.wgsl"),
    ),
    (
        "element_i8.wgsl",
        include_str!("../../shaders/element_i8.wgsl"),
    ),
    ("coop16.wgsl", include_str!("../../shaders/coop16.wgsl")),
    ("coop8.wgsl", include_str!("../../shaders/coop8.wgsl")),
    (
        "gemm_params.wgsl",
        include_str!("../../shaders/gemm_params.wgsl"),
    ),
    ("sincos.wgsl", include_str!("../../shaders/sincos.wgsl")),
    (
        "attention_qkv4.wgsl",
        include_str!("../../shaders/attention_qkv4.wgsl"),
    ),
    (
        "attention_rules.wgsl",
        include_str!("../../shaders/attention_rules.wgsl"),
    ),
    (
        "attention_score.wgsl",
        include_str!("../../shaders/attention_score.wgsl"),
    ),
    (
        "attention_call.wgsl",
        include_str!("../../shaders/attention_call.wgsl"),
    ),
];

/// The slots a kernel file may leave open (`// #include SLOT`), each with
/// the fragments that fill it, the first by default: how one file makes
/// several kernels (f32 or f16 K and V; 16 x 16 or 8 x 8 matrices; K and V
/// as one tensor or in a paged cache's pages).
pub const SLOTS: [(&str, &[&str]); 3] = [
    (
        "ELEMENT",
        &["element_f32.wgsl", "element_f16.wgsl", "element_i8.wgsl"],
    ),
    ("KV_ROWS", &["kv_rows_dense.wgsl", "kv_rows_paged.wgsl"]),
    ("COOP", &["coop16.wgsl", "coop8.wgsl"]),
];

/// Whether `file` is a fragment that fills a slot ([`SLOTS`]), valid only
/// inside the kernels that put it there (it may need their `enable` lines).
pub fn fills_a_slot(file: &str) -> bool {
    SLOTS.iter().any(|(_, fills)| fills.contains(&file))
}

/// `source` with each `// #include NAME.wgsl` line replaced by that
/// fragment's text (its own includes spliced in too), and each slot
/// (`// #include SLOT`) by its first fragment: WGSL has no includes, so the
/// attention kernels' shared uniforms, constants and rules live in one file
/// each. Error lines naga reports count in the expanded text.
///
/// # Panics
/// On an unknown fragment or slot name: a fault in a shader file, which the
/// shader tests expand for every file.
pub fn with_includes(source: &str) -> String {
    with_slots(source, &[], "")
}

/// [`with_includes`], each slot filled by the fragment `slots` names for it
/// (the first of [`SLOTS`] where it names none), and `// #include PARAMS`
/// by `params` (the kernel's parameter block as WGSL): the one way a
/// kernel's variants of a file are made.
///
/// # Panics
/// As [`with_includes`].
pub fn with_slots(source: &str, slots: &[(&str, &str)], params: &str) -> String {
    let mut out = String::with_capacity(source.len() + 4096);
    for line in source.split_inclusive('\n') {
        let Some(name) = line.trim_end().strip_prefix(INCLUDE) else {
            out.push_str(line);
            continue;
        };
        if name == PARAMS {
            out.push_str("// the parameter block, written from its Rust definition\n");
            out.push_str(params);
            continue;
        }
        let file = match SLOTS.iter().find(|(slot, _)| *slot == name) {
            Some((slot, fills)) => slots
                .iter()
                .find(|(s, _)| s == slot)
                .map_or(fills[0], |(_, fill)| *fill),
            None => name,
        };
        let Some((_, text)) = INCLUDABLE.iter().find(|(f, _)| *f == file) else {
            panic!(
                "`{INCLUDE}{name}`: no such fragment or slot (shader/text.rs INCLUDABLE, SLOTS)"
            );
        };
        out.push_str(&format!("// {file}: begin\n"));
        out.push_str(&with_slots(text, slots, params));
        out.push_str(&format!("// {file}: end\n"));
    }
    out
}

/// Parses and validates WGSL text with naga; the error quotes the offending line.
#[cfg(not(target_arch = "wasm32"))]
pub fn validate_wgsl(name: &str, source: &str) -> Result<naga::Module> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| Error::Shader {
        kernel: name.to_string(),
        message: e.emit_to_string(source),
    })?;
    // Subgroup operations are validated too; a kernel that uses them is only
    // chosen on adapters that report the feature.
    // So is unpack2x16float (the f16 decode kernel), which the engine uses
    // only where the adapter has it.
    // So are f16 and cooperative matrices (the matrix-unit kernels), chosen
    // only where the device has them.
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::SUBGROUP
            | naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32
            | naga::valid::Capabilities::SHADER_FLOAT16
            | naga::valid::Capabilities::COOPERATIVE_MATRIX,
    );
    validator.subgroup_stages(naga::valid::ShaderStages::COMPUTE);
    validator.subgroup_operations(naga::valid::SubgroupOperationSet::all());
    validator.validate(&module).map_err(|e| Error::Shader {
        kernel: name.to_string(),
        message: e.emit_to_string(source),
    })?;
    Ok(module)
}
