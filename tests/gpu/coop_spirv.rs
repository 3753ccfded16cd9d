//! The matrix-unit kernels' own SPIR-V (`webattn::device::spirv`), which the
//! engine hands to Vulkan drivers through wgpu's passthrough: every planned
//! key compiles, every load and store of workgroup or writable storage
//! memory is `NonPrivatePointer` (loads from read-only storage stay
//! private: nothing writes it), every acquire-release barrier makes memory available
//! and visible, and, where a `spirv-val` that knows cooperative matrices is
//! on the PATH (SPIRV-Tools 2023.4 or later; Debian 12's is older), it
//! accepts the module for Vulkan 1.2 (the Vulkan memory model's version);
//! otherwise that part is reported as not run. The kernels themselves run
//! on lavapipe with cooperative matrices (tests/matrix_units.rs) through this SPIR-V.

use std::collections::HashMap;
use std::process::Command;

use webattn::device::spirv::{
    compile_coop_kernel, MAKE_AVAILABLE, MAKE_VISIBLE, NON_PRIVATE_POINTER,
};
use webattn::kernels::planned as every_planned_pipeline;
use webattn::RuntimeChecks;

/// (opcode, operands after the first word) of each instruction.
fn instructions(words: &[u32]) -> Vec<(u32, &[u32])> {
    let mut out = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        assert!(
            count > 0 && at + count <= words.len(),
            "bad instruction at word {at}"
        );
        out.push((words[at] & 0xffff, &words[at + 1..at + count]));
        at += count;
    }
    out
}

/// The ways `words` breaks the rules above.
fn violations(words: &[u32]) -> Vec<String> {
    let ins = instructions(words);
    let mut pointer_types = HashMap::new();
    let mut pointers = HashMap::new();
    let mut constants = HashMap::new();
    let mut read_only = std::collections::HashSet::new();
    let mut bad = Vec::new();
    for &(op, w) in &ins {
        // OpDecorate NonWritable; pointers derived from such variables.
        if op == 71 && w.len() >= 2 && w[1] == 24 {
            read_only.insert(w[0]);
        }
        if matches!(op, 65 | 66 | 67 | 83) && w.len() >= 3 && read_only.contains(&w[2]) {
            read_only.insert(w[1]);
        }
        match op {
            32 => {
                pointer_types.insert(w[0], w[1]);
            }
            43 if w.len() == 3 => {
                constants.insert(w[1], w[2]);
            }
            59 | 55 | 65 | 66 | 67 | 83 => {
                if let Some(&class) = pointer_types.get(&w[0]) {
                    pointers.insert(w[1], class);
                }
            }
            _ => {}
        }
        for &id in w.iter().take(2) {
            if op != 43 && id >= words[3] && matches!(op, 59 | 61 | 65) {
                bad.push(format!("op {op}: id {id} past the bound {}", words[3]));
            }
        }
    }
    let shared = |id: u32| match pointers.get(&id) {
        Some(4) => true,
        Some(12) => !read_only.contains(&id),
        _ => false,
    };
    for &(op, w) in &ins {
        // (pointer operand, memory operand mask) after the first word
        let access = match op {
            61 => Some((2, 3)),
            62 => Some((0, 2)),
            4457 => Some((2, 5)),
            4458 => Some((0, 4)),
            _ => None,
        };
        if let Some((pointer, mask)) = access {
            let non_private = w.get(mask).is_some_and(|m| m & NON_PRIVATE_POINTER != 0);
            if shared(w[pointer]) && !non_private {
                bad.push(format!("op {op} through %{} is private", w[pointer]));
            }
            if read_only.contains(&w[pointer]) && non_private {
                bad.push(format!(
                    "op {op} through read-only %{} is non-private",
                    w[pointer]
                ));
            }
        }
        let semantics = match op {
            224 => Some(w[2]),
            225 => Some(w[1]),
            _ => None,
        };
        if let Some(id) = semantics {
            let value = constants.get(&id).copied().unwrap_or(0);
            if value & 0x8 != 0
                && value & (MAKE_AVAILABLE | MAKE_VISIBLE) != MAKE_AVAILABLE | MAKE_VISIBLE
            {
                bad.push(format!(
                    "barrier semantics {value:#x} make nothing available or visible"
                ));
            }
        }
    }
    bad
}

/// Whether spirv-val exists and knows cooperative matrices: a tiny module
/// that declares the capability passes it.
fn spirv_val() -> Option<&'static str> {
    let module: [u32; 12] = [
        0x0723_0203,
        0x0001_0500,
        0,
        1,
        0,
        (2 << 16) | 17, // OpCapability Shader
        1,
        (2 << 16) | 17, // OpCapability CooperativeMatrixKHR
        6022,
        (3 << 16) | 14, // OpMemoryModel Logical Vulkan
        0,
        3,
    ];
    let path = std::env::temp_dir().join(format!("webattn-coop-probe-{}.spv", std::process::id()));
    std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(&module)).ok()?;
    let out = Command::new("spirv-val")
        .args(["--target-env", "vulkan1.2"])
        .arg(&path)
        .output();
    let _ = std::fs::remove_file(&path);
    let stderr = String::from_utf8_lossy(&out.ok()?.stderr).into_owned();
    (!stderr.contains("Invalid capability operand")).then_some("spirv-val")
}

#[test]
fn every_matrix_unit_kernel_compiles_to_spirv_that_shares_its_memory() {
    let keys: Vec<_> = every_planned_pipeline()
        .into_iter()
        .filter(|k| k.kernel.uses_coop())
        .collect();
    assert!(!keys.is_empty(), "no matrix-unit pipelines planned");
    let validator = spirv_val();
    let dir = std::env::temp_dir().join(format!("webattn-coop-spirv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Each kernel's first key every run, the others (tile shapes, head dims,
    // forms) half a run on a rotation, so that two runs compile them all;
    // each with naga's runtime checks (the default), and either without its
    // loop counters (`Bounds`) or without both (`Off`) on a rotation of its
    // own; shared out over the cores.
    let turn = crate::common::rotation("the other matrix-unit pipelines", 2);
    let unchecked = [RuntimeChecks::Bounds, RuntimeChecks::Off]
        [crate::common::rotation("the runtime checks left out", 2)];
    let mut seen = std::collections::HashSet::new();
    let variants: Vec<_> = keys
        .iter()
        .enumerate()
        .filter(|&(i, key)| seen.insert(key.kernel) || i % 2 == turn)
        .flat_map(|(_, key)| [RuntimeChecks::On, unchecked].map(|checks| (key, checks)))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let check = |first: usize| {
        let mut failures = Vec::new();
        let mut validated = 0;
        for &(key, checks) in variants.iter().skip(first).step_by(threads) {
            let words = match compile_coop_kernel(key, true, checks) {
                Ok(words) => words,
                Err(e) => {
                    failures.push(format!("{key} (runtime checks {checks}): {e}"));
                    continue;
                }
            };
            for v in violations(&words) {
                failures.push(format!("{key} (runtime checks {checks}): {v}"));
            }
            if let Some(tool) = validator {
                let path = dir.join(format!("kernel{first}.spv"));
                std::fs::write(&path, bytemuck::cast_slice::<u32, u8>(&words)).unwrap();
                let out = Command::new(tool)
                    .args(["--target-env", "vulkan1.2"])
                    .arg(&path)
                    .output()
                    .unwrap();
                if out.status.success() {
                    validated += 1;
                } else {
                    failures.push(format!(
                        "{key} (runtime checks {checks}): spirv-val: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
            }
        }
        (failures, validated)
    };
    let parts: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads).map(|t| s.spawn(move || check(t))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a compiling thread finishes"))
            .collect()
    });
    let mut failures = Vec::new();
    let mut validated = 0;
    for (f, n) in parts {
        failures.extend(f);
        validated += n;
    }
    let _ = std::fs::remove_dir_all(&dir);
    match validator {
        Some(_) => println!(
            "{} of {} matrix-unit pipelines compiled (with and without runtime checks), {validated} accepted by spirv-val",
            variants.len() / 2,
            keys.len()
        ),
        None => println!(
            "{} of {} matrix-unit pipelines compiled (with and without runtime checks); no spirv-val that knows cooperative matrices, not run",
            variants.len() / 2,
            keys.len()
        ),
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn modules_under_the_glsl450_model_are_left_alone() {
    // A header and OpMemoryModel Logical GLSL450 only.
    let words = [0x0723_0203, 0x0001_0500, 0, 10, 0, (3 << 16) | 14, 0, 1];
    assert_eq!(
        webattn::device::spirv::make_accesses_non_private(&words),
        words.to_vec()
    );
}

/// Every workgroup variable of every planned matrix-unit pipeline is a
/// multiple of 16 bytes: a driver places workgroup variables in an order of
/// its own, and the matrix loads of f16 tiles need 16-byte aligned rows, so
/// one lone 4-byte flag can put every tile after it off by 4. On an H200
/// (driver 580) that made every product wrong; lavapipe did not mind
/// (examples/coop_probe.rs has the probe that showed it).
#[test]
fn matrix_unit_kernels_keep_their_workgroup_variables_in_16_byte_multiples() {
    let mut failures = Vec::new();
    let mut checked = 0;
    // Each kernel parsed and validated once, specialised per key.
    let mut parsed = HashMap::new();
    for key in every_planned_pipeline()
        .into_iter()
        .filter(|k| k.kernel.uses_coop())
    {
        let (module, info) = parsed.entry(key.kernel).or_insert_with(|| {
            let source = key.kernel.source();
            let module = naga::front::wgsl::parse_str(source).expect("the kernel parses");
            let mut validator = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            );
            validator.subgroup_stages(naga::valid::ShaderStages::COMPUTE);
            validator.subgroup_operations(naga::valid::SubgroupOperationSet::all());
            let info = validator.validate(&module).expect("the kernel validates");
            (module, info)
        });
        let constants: naga::back::PipelineConstants = key
            .constants
            .iter()
            .map(|&(name, value)| (name.to_string(), value as f64))
            .collect();
        let entry = Some((naga::ShaderStage::Compute, key.kernel.entry_point()));
        let (module, _) =
            naga::back::pipeline_constants::process_overrides(module, info, entry, &constants)
                .expect("the overrides apply");
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).expect("the types lay out");
        for (_, var) in module.global_variables.iter() {
            if var.space != naga::AddressSpace::WorkGroup {
                continue;
            }
            let size = layouter[var.ty].size;
            checked += 1;
            if size % 16 != 0 {
                failures.push(format!(
                    "{key}: `{}` is {size} bytes",
                    var.name.as_deref().unwrap_or("?")
                ));
            }
        }
    }
    println!("{checked} workgroup variables checked");
    assert!(checked > 0);
    assert!(
        failures.is_empty(),
        "not multiples of 16 bytes:\n{}",
        failures.join("\n")
    );
}
