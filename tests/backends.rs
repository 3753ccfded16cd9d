//! The conformance sweep on every backend and limit set this machine can run:
//! Vulkan (lavapipe) under WebGPU's default limits, Mesa's GL through wgpu's GL
//! backend, and limits far below any real adapter's, where every problem that
//! does not fit must come back as a typed error, never as a GPU validation
//! error. Run through the `webattn` binary, so the options are tested as users
//! type them.

mod common;

use std::process::{Command, Output};

fn webattn(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_webattn"));
    cmd.env("RUST_LOG", "warn").args(args);
    for (name, value) in env {
        cmd.env(name, value);
    }
    let out = cmd.output().expect("the binary runs");
    eprintln!(
        "$ {} webattn {}\n{}",
        env.iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The sweep's last line, `N passed, M failed`, as numbers.
fn summary(out: &Output) -> (usize, usize) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default().to_string();
    let numbers: Vec<usize> = last
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    match numbers[..] {
        [passed, failed] if last.contains("passed") => (passed, failed),
        _ => panic!("no summary line in:\n{stdout}"),
    }
}

#[test]
fn the_quick_sweep_passes_under_webgpu_default_limits() {
    if common::gpu().is_none() {
        return;
    }
    let out = webattn(
        &[
            "--backend",
            "gpu",
            "--limits",
            "webgpu-default",
            "check",
            "--quick",
        ],
        &[],
    );
    let (passed, failed) = summary(&out);
    assert!(out.status.success(), "exit {:?}", out.status);
    assert_eq!(failed, 0);
    assert!(passed >= 90, "{passed} cases");

    let info = webattn(
        &["--backend", "gpu", "--limits", "webgpu-default", "info"],
        &[],
    );
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("lowered: WebGPU's default limits"), "{text}");
    assert!(text.contains("storage binding        128 MiB"), "{text}");
    assert!(text.contains("workgroup storage      16 KiB"), "{text}");
    assert!(text.contains("invocations/workgroup  256"), "{text}");
}

#[test]
fn the_quick_sweep_passes_on_mesa_gl() {
    if common::gpu().is_none() {
        return;
    }
    let gl = [("WGPU_BACKEND", "gl")];
    let info = webattn(&["--backend", "gpu", "info", "--json"], &gl);
    assert!(
        info.status.success(),
        "no GL adapter: install libegl1 and libgl1-mesa-dri"
    );
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(text.contains("\"backend\": \"Gl\""), "{text}");
    let out = webattn(&["--backend", "gpu", "check", "--quick"], &gl);
    let (passed, failed) = summary(&out);
    assert!(out.status.success(), "exit {:?}", out.status);
    assert_eq!(failed, 0);
    assert!(passed >= 90, "{passed} cases");
}

/// The sweep with every buffer and binding at 16 KiB: Q, K, V, masks, pasts
/// and outputs larger than that are held in several buffers and every call
/// runs in pieces that cross their boundaries (`device/chunks.rs`,
/// `run/split.rs`), still against the oracle.
#[test]
fn the_quick_sweep_passes_with_tiny_buffers() {
    if common::gpu().is_none() {
        return;
    }
    let out = webattn(
        &[
            "--backend",
            "gpu",
            "--limit",
            "max_storage_buffer_binding_size=16KiB",
            "--limit",
            "max_buffer_size=16KiB",
            "check",
            "--quick",
        ],
        &[],
    );
    let (passed, failed) = summary(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert_eq!(failed, 0, "{stdout}");
    assert!(passed >= 90, "{passed} cases");
}

#[test]
fn limit_options_are_checked() {
    let unknown = webattn(&["--limit", "max_textures=4", "info"], &[]);
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("not a limit webattn can set"), "{stderr}");

    let malformed = webattn(&["--limit", "max_buffer_size", "info"], &[]);
    assert_eq!(malformed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("NAME=VALUE"));

    let preset = webattn(&["--limits", "tiny", "info"], &[]);
    assert_eq!(preset.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&preset.stderr).contains("webgpu-default"));

    if common::gpu().is_none() {
        return;
    }
    // Raising a limit beyond the adapter's is refused with the adapter's value.
    let beyond = webattn(
        &[
            "--backend",
            "gpu",
            "--limit",
            "max_compute_invocations_per_workgroup=1000000",
            "info",
        ],
        &[],
    );
    assert_eq!(beyond.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&beyond.stderr);
    assert!(stderr.contains("limits can only be lowered"), "{stderr}");
}

#[test]
fn a_headless_run_is_quiet() {
    if common::gpu().is_none() {
        return;
    }
    // No display server and no XDG_RUNTIME_DIR, as on a CI machine or over ssh.
    let quiet = |path: &std::path::Path, args: &[&str]| {
        let out = Command::new(path)
            .args(args)
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("WAYLAND_DISPLAY")
            .env_remove("DISPLAY")
            .env_remove("NODEVICE_SELECT")
            .env("RUST_LOG", "warn")
            .output()
            .expect("runs");
        assert!(out.status.success(), "{path:?} failed");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.trim().is_empty(),
            "{path:?} wrote to stderr:\n{stderr}"
        );
    };
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_webattn"));
    quiet(&bin, &["--backend", "gpu", "info"]);
    if let Some(example) = current_example("positional_encodings") {
        quiet(&example, &[]);
    }
}

/// An example, as `cargo test` builds it beside the binary. A bare `cargo
/// test --test backends` leaves older builds of the examples in place: one
/// older than the library's sources (or its own) is not judged.
fn current_example(name: &str) -> Option<std::path::PathBuf> {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_webattn"));
    let example = bin.with_file_name("examples").join(name);
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let newest_source = newest_file(&root.join("src"), &modified)
        .max(modified(&root.join("examples").join(format!("{name}.rs"))));
    match modified(&example) {
        Some(built) if Some(built) >= newest_source => Some(example),
        _ => {
            eprintln!("not judging {example:?}: not built from the current sources");
            None
        }
    }
}

#[test]
fn the_continuous_batching_example_serves_its_requests_from_device_pages() {
    if common::gpu().is_none() {
        return;
    }
    let Some(example) = current_example("continuous_batching") else {
        return;
    };
    let out = Command::new(&example)
        .args(["--quick", "--backend", "gpu"])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "in device memory",
        "12 requests in",
        "a padded cache:",
        "worst",
    ] {
        assert!(stdout.contains(expected), "{expected:?} missing:\n{stdout}");
    }
    println!("{stdout}");
}

#[test]
fn a_short_soak_passes_with_flat_memory() {
    if common::gpu().is_none() {
        return;
    }
    let out = webattn(
        &["--backend", "gpu", "check", "--soak", "150", "--seed", "11"],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("soak: 150 cases"), "{stdout}");
    assert!(stdout.contains(": 0 failed"), "{stdout}");
    let memory = stdout
        .lines()
        .find(|l| l.starts_with("device memory:"))
        .unwrap_or_default();
    assert!(memory.ends_with(": flat"), "{memory}");
    assert!(
        memory.contains("MiB in"),
        "the memory was not measured: {memory}"
    );
}

/// The allowance of a soak's worst case, from its line `worst error: X of Y
/// allowed ...`.
fn soak_worst_allowed(stdout: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("worst error:"))
        .unwrap_or_else(|| panic!("no worst error in:\n{stdout}"));
    line.split_whitespace()
        .nth(4)
        .and_then(|y| y.parse().ok())
        .unwrap_or_else(|| panic!("no allowance in {line:?}"))
}

#[test]
fn a_soak_at_precision_fast_runs_its_cases_at_fast() {
    if common::gpu().is_none() {
        return;
    }
    // The same random cases at both precisions: at `fast` the operands are
    // rounded to f16 and the f16 rule also allows for the probabilities'
    // rounding, so each case's allowance grows (2.6 times at this seed on
    // lavapipe, whose f32 kernels run these cases). A soak that ignored the
    // precision would show the same allowances at both.
    let soak = |precision: &str| {
        let out = webattn(
            &[
                "--backend",
                "gpu",
                "--precision",
                precision,
                "check",
                "--soak",
                "9",
                "--seed",
                "5",
            ],
            &[],
        );
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains(": 0 failed"), "{stdout}");
        stdout
    };
    let highest = soak("highest");
    let fast = soak("fast");
    assert!(fast.contains("matrix units:"), "{fast}");
    let (highest, fast) = (soak_worst_allowed(&highest), soak_worst_allowed(&fast));
    assert!(
        fast > 1.5 * highest,
        "the worst allowance at fast ({fast:e}) is an f32 one (highest: {highest:e})"
    );
}

/// The newest modification time of any file under `dir`.
fn newest_file(
    dir: &std::path::Path,
    modified: &dyn Fn(&std::path::Path) -> Option<std::time::SystemTime>,
) -> Option<std::time::SystemTime> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            if path.is_dir() {
                newest_file(&path, modified)
            } else {
                modified(&path)
            }
        })
        .max()
}
