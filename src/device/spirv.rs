//! The matrix-unit kernels' SPIR-V, written by us and handed to Vulkan as is.
//!
//! A module with cooperative matrices must declare the Vulkan memory model,
//! and wgpu 30's naga does so, but it writes every other access as under the
//! GLSL450 model: its loads and stores of workgroup and storage memory are
//! *private* (no `NonPrivatePointer`) and its barriers make nothing available
//! or visible (gfx-rs/wgpu#8805, open). Under that model a driver may keep a
//! value one invocation stored in workgroup memory out of another's reach
//! after the barrier, which the kernels' staging relies on.
//!
//! So, on Vulkan, the engine compiles these kernels itself: naga writes the
//! SPIR-V (overrides applied), [`make_accesses_non_private`] marks every load
//! and store of workgroup and storage memory `NonPrivatePointer` and gives
//! every barrier `MakeAvailable | MakeVisible`, and the words reach the driver
//! through wgpu's SPIR-V passthrough.
//!
//! What was measured (an H200, driver 580, `examples/coop_probe.rs`): naga's
//! own SPIR-V computed the same products as ours on every probe, so the wrong
//! results the kernels once gave there came from elsewhere (a 4-byte
//! workgroup variable misaligning the f16 tiles, fixed in the kernels).
//! The full sweep at precision fast passed through this SPIR-V (516 cases).
//! Its price: a loop of matrix loads from workgroup memory ran at 38.7
//! TFLOP/s here against 103 through naga's SPIR-V (products on registers: 495
//! both). The kernels as they are do not reach either bound, so it does not
//! show in their figures yet.

use std::collections::HashMap;

use crate::device::pipeline::PipelineKey;
use crate::options::RuntimeChecks;

const OP_CONSTANT: u32 = 43;
const OP_TYPE_POINTER: u32 = 32;
const OP_FUNCTION_PARAMETER: u32 = 55;
const OP_VARIABLE: u32 = 59;
const OP_LOAD: u32 = 61;
const OP_STORE: u32 = 62;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
const OP_PTR_ACCESS_CHAIN: u32 = 67;
const OP_COPY_OBJECT: u32 = 83;
const OP_SELECT: u32 = 169;
const OP_PHI: u32 = 245;
const OP_MEMORY_MODEL: u32 = 14;
const OP_DECORATE: u32 = 71;
const OP_CONTROL_BARRIER: u32 = 224;
const OP_MEMORY_BARRIER: u32 = 225;
const OP_COOPERATIVE_MATRIX_LOAD: u32 = 4457;
const OP_COOPERATIVE_MATRIX_STORE: u32 = 4458;

const MEMORY_MODEL_VULKAN: u32 = 3;
const DECORATION_NON_WRITABLE: u32 = 24;
const STORAGE_CLASS_WORKGROUP: u32 = 4;
const STORAGE_CLASS_STORAGE_BUFFER: u32 = 12;

/// Memory operand: the access takes part in the ordering between invocations.
pub const NON_PRIVATE_POINTER: u32 = 0x20;
/// Memory semantics: acquire and release together.
const ACQUIRE_RELEASE: u32 = 0x8;
/// Memory semantics: the barrier makes earlier writes available.
pub const MAKE_AVAILABLE: u32 = 0x2000;
/// Memory semantics: the barrier makes available writes visible.
pub const MAKE_VISIBLE: u32 = 0x4000;

/// An instruction's opcode and its words (the first word included).
fn instructions(words: &[u32]) -> impl Iterator<Item = (u32, std::ops::Range<usize>)> + '_ {
    let mut at = 5;
    std::iter::from_fn(move || {
        if at >= words.len() {
            return None;
        }
        let count = (words[at] >> 16) as usize;
        let op = words[at] & 0xffff;
        let range = at..(at + count.max(1)).min(words.len());
        at = range.end;
        Some((op, range))
    })
}

/// Rewrites a SPIR-V module that declares the Vulkan memory model so that
/// workgroup and storage-buffer memory is shared the way the GLSL450 model
/// shares it: every `OpLoad`, `OpStore` and cooperative-matrix load or store
/// through such a pointer gets `NonPrivatePointer`, and every barrier with
/// acquire-release semantics gets `MakeAvailable | MakeVisible` (a new
/// constant each, since naga shares its integer constants). Modules under
/// another memory model come back unchanged.
///
/// Loads from read-only storage buffers (`NonWritable`: `var<storage, read>`)
/// stay private: no invocation writes them during the dispatch (WebGPU
/// forbids binding a buffer read-only and writable at once), so there is
/// nothing to order, and a compiler may keep and reuse what it loaded. The
/// kernels' operands are such buffers; `gemm_coop_packed`'s K loop is
/// nothing but loads from them.
pub fn make_accesses_non_private(words: &[u32]) -> Vec<u32> {
    if words.len() < 5
        || !instructions(words).any(|(op, r)| {
            op == OP_MEMORY_MODEL && words.get(r.start + 2) == Some(&MEMORY_MODEL_VULKAN)
        })
    {
        return words.to_vec();
    }
    // Pass 1: the storage class of each pointer type and value, the integer
    // constants, and the semantics each barrier names.
    let mut pointer_types: HashMap<u32, u32> = HashMap::new();
    let mut pointers: HashMap<u32, u32> = HashMap::new();
    let mut constants: HashMap<u32, (u32, u32)> = HashMap::new();
    let mut semantics_ids: Vec<u32> = Vec::new();
    // Variables decorated NonWritable, and the pointers derived from them.
    let mut read_only: std::collections::HashSet<u32> = std::collections::HashSet::new();
    for (op, r) in instructions(words) {
        let w = &words[r];
        if op == OP_DECORATE && w.len() >= 3 && w[2] == DECORATION_NON_WRITABLE {
            read_only.insert(w[1]);
        }
        if matches!(
            op,
            OP_ACCESS_CHAIN | OP_IN_BOUNDS_ACCESS_CHAIN | OP_PTR_ACCESS_CHAIN | OP_COPY_OBJECT
        ) && w.len() >= 4
            && read_only.contains(&w[3])
        {
            read_only.insert(w[2]);
        }
        match op {
            OP_TYPE_POINTER if w.len() >= 3 => {
                pointer_types.insert(w[1], w[2]);
            }
            OP_CONSTANT if w.len() == 4 => {
                constants.insert(w[2], (w[1], w[3]));
            }
            OP_VARIABLE
            | OP_FUNCTION_PARAMETER
            | OP_ACCESS_CHAIN
            | OP_IN_BOUNDS_ACCESS_CHAIN
            | OP_PTR_ACCESS_CHAIN
            | OP_COPY_OBJECT
            // (naga writes no pointer selects or phis; a pointer one yields
            // is shared, and never counted read-only.)
            | OP_SELECT
            | OP_PHI
                if w.len() >= 3 =>
            {
                if let Some(&class) = pointer_types.get(&w[1]) {
                    pointers.insert(w[2], class);
                }
            }
            OP_CONTROL_BARRIER if w.len() == 4 => semantics_ids.push(w[3]),
            OP_MEMORY_BARRIER if w.len() == 3 => semantics_ids.push(w[2]),
            _ => {}
        }
    }
    let mut bound = words[3];
    // Old semantics constant -> (new id, its type, its value).
    let mut replaced: HashMap<u32, (u32, u32, u32)> = HashMap::new();
    for id in semantics_ids {
        if replaced.contains_key(&id) {
            continue;
        }
        if let Some(&(ty, value)) = constants.get(&id) {
            if value & ACQUIRE_RELEASE != 0 {
                replaced.insert(id, (bound, ty, value | MAKE_AVAILABLE | MAKE_VISIBLE));
                bound += 1;
            }
        }
    }
    let shared = |id: u32| match pointers.get(&id) {
        Some(&STORAGE_CLASS_WORKGROUP) => true,
        Some(&STORAGE_CLASS_STORAGE_BUFFER) => !read_only.contains(&id),
        _ => false,
    };
    // Pass 2: the rewritten module.
    let mut out = Vec::with_capacity(words.len() + words.len() / 8);
    out.extend_from_slice(&words[..5]);
    out[3] = bound;
    for (op, r) in instructions(words) {
        let mut w = words[r].to_vec();
        // (operand index of the pointer, index the memory operand mask has)
        let access = match op {
            OP_LOAD => Some((3, 4)),
            OP_STORE => Some((1, 3)),
            OP_COOPERATIVE_MATRIX_LOAD if w.len() >= 6 => Some((3, 6)),
            OP_COOPERATIVE_MATRIX_STORE if w.len() >= 5 => Some((1, 5)),
            _ => None,
        };
        if let Some((pointer, mask)) = access {
            if w.len() > pointer && shared(w[pointer]) {
                if w.len() > mask {
                    w[mask] |= NON_PRIVATE_POINTER;
                } else if w.len() == mask {
                    w.push(NON_PRIVATE_POINTER);
                }
            }
        }
        match op {
            OP_CONTROL_BARRIER if w.len() == 4 => {
                if let Some(&(new, _, _)) = replaced.get(&w[3]) {
                    w[3] = new;
                }
            }
            OP_MEMORY_BARRIER if w.len() == 3 => {
                if let Some(&(new, _, _)) = replaced.get(&w[2]) {
                    w[2] = new;
                }
            }
            _ => {}
        }
        w[0] = ((w.len() as u32) << 16) | op;
        let constant_id = (op == OP_CONSTANT && w.len() == 4).then(|| w[2]);
        out.extend_from_slice(&w);
        if let Some(&(new, ty, value)) = constant_id.and_then(|id| replaced.get(&id)) {
            out.extend_from_slice(&[(4 << 16) | OP_CONSTANT, ty, new, value]);
        }
    }
    out
}

/// Compiles `key`'s kernel to SPIR-V for a Vulkan device with cooperative
/// matrices, by [`compile_wgsl`] with the key's override constants.
pub fn compile_coop_kernel(
    key: &PipelineKey,
    zero_workgroup_memory: bool,
    checks: RuntimeChecks,
) -> Result<Vec<u32>, String> {
    let constants: Vec<(String, f64)> = key
        .constants
        .iter()
        .map(|&(name, value)| (name.to_string(), value as f64))
        .collect();
    compile_wgsl(
        key.kernel.source(),
        key.kernel.entry_point(),
        &constants,
        zero_workgroup_memory,
        checks,
    )
    .map_err(|e| format!("{key}: {e}"))
}

/// Compiles a compute shader's WGSL to SPIR-V for a Vulkan device: naga
/// parses and validates it (every capability allowed), applies the override
/// `constants` and writes SPIR-V 1.5 (the Vulkan memory model is core there),
/// with index clamping on arrays in workgroup and function memory; then
/// [`make_accesses_non_private`]. Storage buffers are left to the kernels' own
/// bounds and the driver's robust buffer access, as wgpu leaves them where
/// the device has robustBufferAccess2 (naga's clamped form lost the last
/// element of a buffer on lavapipe: `examples/coop_probe.rs` showed it).
/// `zero_workgroup_memory` zeroes workgroup memory first, as wgpu would.
/// With [`RuntimeChecks::Bounds`] the loop counters are left out, with
/// [`RuntimeChecks::Off`] the index clamps too, as wgpu's trusted modules
/// leave them out.
pub fn compile_wgsl(
    source: &str,
    entry_point: &str,
    constants: &[(String, f64)],
    zero_workgroup_memory: bool,
    checks: RuntimeChecks,
) -> Result<Vec<u32>, String> {
    use naga::back::spv;
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    );
    validator.subgroup_stages(naga::valid::ShaderStages::COMPUTE);
    validator.subgroup_operations(naga::valid::SubgroupOperationSet::all());
    let info = validator
        .validate(&module)
        .map_err(|e| e.emit_to_string(source))?;
    let constants: naga::back::PipelineConstants = constants.iter().cloned().collect();
    let entry = Some((naga::ShaderStage::Compute, entry_point));
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(&module, &info, entry, &constants)
            .map_err(|e| format!("overrides: {e}"))?;
    let restrict = if checks.bounds_checks() {
        naga::proc::BoundsCheckPolicy::Restrict
    } else {
        naga::proc::BoundsCheckPolicy::Unchecked
    };
    let policies = naga::proc::BoundsCheckPolicies {
        index: restrict,
        buffer: naga::proc::BoundsCheckPolicy::Unchecked,
        image_load: restrict,
        binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
    };
    let options = spv::Options {
        lang_version: (1, 5),
        bounds_check_policies: policies,
        zero_initialize_workgroup_memory: if zero_workgroup_memory {
            spv::ZeroInitializeWorkgroupMemoryMode::Polyfill
        } else {
            spv::ZeroInitializeWorkgroupMemoryMode::None
        },
        force_loop_bounding: checks.loop_bounding(),
        ..Default::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: entry_point.to_string(),
    };
    let words = spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| format!("SPIR-V: {e}"))?;
    Ok(make_accesses_non_private(&words))
}
