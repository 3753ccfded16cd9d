//! Every file in `shaders/` parses and validates with naga (no GPU needed),
//! with the fragments it includes spliced in, and the registry embeds each of
//! them.

use std::collections::BTreeSet;

use webattn::gpu::registry::{validate_kernel, validate_wgsl, with_includes, Kernel, FRAGMENTS};

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
    for name in &files {
        let source = std::fs::read_to_string(format!("{dir}/{name}")).expect("readable shader");
        match validate_wgsl(name, &with_includes(&source)) {
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
    let registered: BTreeSet<String> = Kernel::ALL
        .iter()
        .map(|k| k.file().to_string())
        .chain(FRAGMENTS.iter().map(|f| f.to_string()))
        .collect();
    assert_eq!(registered, shader_files());
    for kernel in Kernel::ALL {
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
