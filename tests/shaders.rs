//! Every file in `shaders/` parses and validates with naga (no GPU needed),
//! with the fragments it includes spliced in, the registry embeds each of
//! them, and every kernel (the generated ones too) validates as compiled.

use std::collections::BTreeSet;

use webattn::shader::kernel::validate_kernel;
use webattn::shader::text::{fills_a_slot, validate_wgsl, with_includes, FRAGMENTS};

fn shader_files() -> BTreeSet<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/shaders");
    std::fs::read_dir(dir)
        .expect("shaders/ exists")
        .map(|e| {
            e.expect("readable entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".wgsl"))
        .collect()
}

#[test]
fn every_shader_file_validates() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/shaders");
    let files = shader_files();
    assert!(!files.is_empty());
    let mut failures = Vec::new();
    // A slot's fragments are validated inside the kernels that fill the slot
    // with them (registry_embeds_every_file_and_nothing_else): they may need
    // those kernels' `enable` lines. Files with slots validate with the
    // first fragment of each. A file that takes a kernel's parameter block
    // (`// #include PARAMS`, directly or through a fragment) is validated as
    // the kernels that include it are: it names no block of its own. So is
    // a fragment that reads its includer's bindings (the rules read `p`).
    for name in files.iter().filter(|name| !fills_a_slot(name)) {
        let source = std::fs::read_to_string(format!("{dir}/{name}")).expect("readable shader");
        let expanded = with_includes(&source);
        let borrows_bindings = !expanded.contains("var<uniform>") && expanded.contains("(p.");
        if borrows_bindings {
            println!("{name}: reads its includer's bindings (validated as its kernels)");
            continue;
        }
        if expanded.contains("// the parameter block, written from its Rust definition") {
            println!("{name}: takes a kernel's parameter block (validated as its kernels)");
            continue;
        }
        match validate_wgsl(name, &expanded) {
            Ok(module) => println!(
                "{name}: ok ({} functions)",
                module.functions.len() + module.entry_points.len()
            ),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn registry_embeds_every_file_and_nothing_else() {
    // A generated kernel's text has no file (`src/kernels/`).
    let registered: BTreeSet<String> = webattn::kernels::all()
        .iter()
        .filter(|k| !k.is_generated())
        .map(|k| k.file().to_string())
        .chain(FRAGMENTS.iter().map(|f| f.to_string()))
        .collect();
    assert_eq!(registered, shader_files());
    for kernel in webattn::kernels::all() {
        let module = validate_kernel(kernel).expect("registered kernel validates");
        assert!(
            module
                .entry_points
                .iter()
                .any(|e| e.name == kernel.entry_point()),
            "{kernel} has no entry point {}",
            kernel.entry_point()
        );
    }
}

#[test]
fn invalid_wgsl_is_a_typed_error_quoting_the_line() {
    let err = validate_wgsl("broken", "fn main() { let x: f32 = 1u; }").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("broken") && text.contains("let x"), "{text}");
}

/// Each kernel's WGSL `Params` (its uniform block, written from the Rust
/// block by `shader::uniform::ParamsText`) as naga lays it out, against the
/// Rust block the engine writes, word by word: the same types at the same
/// offsets and the same names (WGSL's alignment rules could move a field the
/// generator writes; no kernel declares a block of its own: every one
/// includes `PARAMS`).
#[test]
fn every_kernels_uniform_block_matches_its_rust_definition() {
    use naga::{AddressSpace, ScalarKind, TypeInner};
    use webattn::shader::uniform::Scalar;
    let mut failures = Vec::new();
    for kernel in webattn::kernels::all() {
        let module = naga::front::wgsl::parse_str(kernel.source()).expect("the kernel parses");
        let uniforms: Vec<_> = module
            .global_variables
            .iter()
            .filter(|(_, v)| v.space == AddressSpace::Uniform)
            .collect();
        let [(_, global)] = uniforms[..] else {
            failures.push(format!(
                "{kernel}: {} uniform blocks, expected 1",
                uniforms.len()
            ));
            continue;
        };
        let TypeInner::Struct { members, span } = &module.types[global.ty].inner else {
            failures.push(format!("{kernel}: its uniform is not a struct"));
            continue;
        };
        // The WGSL's words: (offset, name, type).
        let mut wgsl = Vec::new();
        for member in members {
            let name = member.name.clone().unwrap_or_default();
            let (scalar, count) = match &module.types[member.ty].inner {
                TypeInner::Scalar(s) => (*s, 1),
                TypeInner::Vector { size, scalar } => (*scalar, *size as u32),
                other => {
                    failures.push(format!("{kernel}: `{name}` is {other:?}, not words"));
                    continue;
                }
            };
            let scalar = match (scalar.kind, scalar.width) {
                (ScalarKind::Uint, 4) => Scalar::U32,
                (ScalarKind::Sint, 4) => Scalar::I32,
                (ScalarKind::Float, 4) => Scalar::F32,
                _ => {
                    failures.push(format!("{kernel}: `{name}` is {scalar:?}"));
                    continue;
                }
            };
            for i in 0..count {
                wgsl.push((member.offset + 4 * i, name.clone(), scalar));
            }
        }
        let rust = kernel.params_words();
        if *span as usize != 4 * rust.len() || wgsl.len() != rust.len() {
            failures.push(format!(
                "{kernel}: the WGSL block is {span} bytes in {} words, the Rust one {} words",
                wgsl.len(),
                rust.len()
            ));
            continue;
        }
        for (i, ((offset, name, scalar), word)) in wgsl.iter().zip(&rust).enumerate() {
            if *offset as usize != 4 * i {
                failures.push(format!("{kernel}: `{name}` at byte {offset}, word {i}"));
            } else if *scalar != word.scalar {
                failures.push(format!(
                    "{kernel}: word {i} is `{name}`: {scalar:?} in WGSL, `{}`: {:?} in Rust",
                    word.name, word.scalar
                ));
            } else if !name.starts_with('_') && !name.starts_with(word.name) {
                failures.push(format!(
                    "{kernel}: word {i} is `{name}` in WGSL, `{}` in Rust",
                    word.name
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// No kernel declares its parameter block by hand: each takes it from its
/// Rust definition at a `// #include PARAMS` line.
#[test]
fn every_kernels_params_come_from_rust() {
    for kernel in webattn::kernels::all() {
        let source = kernel.source();
        assert_eq!(
            source.matches("struct Params {").count(),
            1,
            "{kernel}: one struct Params"
        );
        assert!(
            source.contains("// the parameter block, written from its Rust definition"),
            "{kernel} declares its Params by hand"
        );
    }
}
