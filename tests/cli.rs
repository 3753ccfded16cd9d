//! The `webattn` binary: `attend` round trips on every option compared with the
//! oracle, the ONNX reference cases through the binary, malformed files and
//! usage errors (exit codes 1 and 2, no output file created), `info`, and
//! `check --quick` with its last line.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use webattn::conformance::{compare, CaseSpec, MaskForm, DEFAULT_FLOOR};
use webattn::{npy, AttentionInputs, AttentionOptions, HostTensor, QkMatmulOutputMode};

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_webattn"));
    cmd.env("RUST_LOG", "warn");
    cmd
}

/// `--backend gpu` when the tests have a GPU, else `--backend cpu`.
fn backend() -> &'static str {
    if common::gpu().is_some() {
        "gpu"
    } else {
        "cpu"
    }
}

/// A fresh folder for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("webattn-cli-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write<T: npyz::AutoSerialize + Copy>(
    path: &Path,
    shape: &[usize],
    data: &[T],
    order: npyz::Order,
) {
    use npyz::WriterBuilder;
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = npyz::WriteOptions::<T>::new()
        .default_dtype()
        .order(order)
        .shape(&shape)
        .writer(file)
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
}

fn write_f32(dir: &Path, name: &str, t: &HostTensor) -> PathBuf {
    let p = dir.join(format!("{name}.npy"));
    npy::write_tensor(&p, t).unwrap();
    p
}

fn run(args: &[&str]) -> Output {
    let out = bin().args(args).output().expect("the binary runs");
    eprintln!(
        "$ webattn {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Checks an output file against the oracle's values with the tolerance rule.
fn assert_close(name: &str, file: &Path, exact: &[f64], plain: &[f32]) {
    let got = npy::read_tensor(file, "output").unwrap();
    let report = compare(got.data(), exact, plain, DEFAULT_FLOOR);
    println!(
        "{name:<40} max abs {:.2e} allowed {:.2e}",
        report.max_abs, report.allowed
    );
    assert!(report.passed(), "{name}: {report:?}");
}

/// Runs `attend` on a generated case with extra flags, and checks Y, the
/// logsumexp and (when asked) qk_matmul_output against the oracle.
fn round_trip(test: &str, case: CaseSpec, flags: &[&str]) {
    let dir = scratch(test);
    let inputs = case.generate(11).unwrap();
    let mut args: Vec<String> = vec!["--backend".into(), backend().into(), "attend".into()];
    for (flag, name, t) in [
        ("--q", "Q", &inputs.q),
        ("--k", "K", &inputs.k),
        ("--v", "V", &inputs.v),
    ] {
        args.extend([
            flag.to_string(),
            write_f32(&dir, name, t).display().to_string(),
        ]);
    }
    if let Some((pk, pv)) = &inputs.past {
        args.extend([
            "--past-key".into(),
            write_f32(&dir, "PK", pk).display().to_string(),
        ]);
        args.extend([
            "--past-value".into(),
            write_f32(&dir, "PV", pv).display().to_string(),
        ]);
        args.extend([
            "--present-key".into(),
            dir.join("present_key.npy").display().to_string(),
        ]);
        args.extend([
            "--present-value".into(),
            dir.join("present_value.npy").display().to_string(),
        ]);
    }
    if let Some(mask) = &inputs.mask {
        let p = dir.join("mask.npy");
        match mask {
            webattn::HostMask::Bool { shape, data } => write(&p, shape, data, npyz::Order::C),
            webattn::HostMask::Float(t) => {
                // Float masks go in as f16 when every value is exact in f16, else f32.
                let as_f16: Vec<half::f16> =
                    t.data().iter().map(|&x| half::f16::from_f32(x)).collect();
                write(&p, t.shape(), &as_f16, npyz::Order::C);
            }
        }
        args.extend(["--attn-mask".into(), p.display().to_string()]);
    }
    if let Some(lengths) = &inputs.nonpad {
        let p = dir.join("nonpad.npy");
        let as_i32: Vec<i32> = lengths.iter().map(|&l| l as i32).collect();
        write(&p, &[as_i32.len()], &as_i32, npyz::Order::C);
        args.extend(["--nonpad-kv-seqlen".into(), p.display().to_string()]);
    }
    let y = dir.join("Y.npy");
    let lse = dir.join("lse.npy");
    let qk = dir.join("qk.npy");
    args.extend([
        "--y".into(),
        y.display().to_string(),
        "--lse".into(),
        lse.display().to_string(),
    ]);
    if case.options.qk_matmul_output_mode.is_some() {
        args.extend(["--qk-matmul-output".into(), qk.display().to_string()]);
    }
    args.extend(flags.iter().map(|s| s.to_string()));
    let out = bin().args(&args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{test}: {stderr}");
    assert!(stderr.contains("webattn: path "), "{stderr}");

    // The oracle on what the files hold (f16 masks were rounded on the way).
    let mask = inputs.mask.as_ref().map(|m| match m {
        webattn::HostMask::Float(t) => webattn::HostMask::float(
            t.shape().to_vec(),
            t.data()
                .iter()
                .map(|&x| half::f16::from_f32(x).to_f32())
                .collect(),
        )
        .unwrap(),
        other => other.clone(),
    });
    let mut host = AttentionInputs::new(&inputs.q, &inputs.k, &inputs.v);
    if let Some(m) = &mask {
        host = host.with_mask(m);
    }
    if let Some((pk, pv)) = &inputs.past {
        host = host.with_past(pk, pv);
    }
    host.nonpad_kv_seqlen = inputs.nonpad.as_deref();
    let exact = webattn::cpu::attention_exact(&host, &case.options).unwrap();
    let plain = webattn::cpu::attention_plain_f32(&host, &case.options).unwrap();
    assert_close(&format!("{test} Y"), &y, &exact.y, &plain.y);
    assert_close(&format!("{test} lse"), &lse, &exact.lse, &plain.lse);
    if case.options.qk_matmul_output_mode.is_some() {
        assert_close(&format!("{test} qk"), &qk, &exact.qk, &plain.qk);
    }
    if let Some((pk, _)) = &inputs.past {
        let present = npy::read_tensor(dir.join("present_key.npy"), "present_key").unwrap();
        assert_eq!(present.shape()[2], pk.shape()[2] + inputs.k.shape()[2]);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn attend_round_trips_every_option() {
    let qk = |mode| move |o: &mut AttentionOptions| o.qk_matmul_output_mode = Some(mode);
    round_trip(
        "plain",
        CaseSpec::new("plain", [2, 4, 2], [7, 33], [8, 16]),
        &[],
    );
    round_trip(
        "causal-bool-mask-scale",
        CaseSpec::new("c", [1, 2, 2], [33, 33], [8, 8])
            .mask(MaskForm::Bool(2))
            .with(|o| {
                o.is_causal = true;
                o.scale = Some(0.25);
            }),
        &["--is-causal", "--scale", "0.25"],
    );
    round_trip(
        "float-mask-softcap-mode1",
        CaseSpec::new("s", [2, 3, 1], [7, 9], [8, 8])
            .mask(MaskForm::Float(4))
            .logits(8.0)
            .with(|o| {
                o.softcap = 3.0;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Softcapped);
            }),
        &["--softcap", "3", "--qk-matmul-output-mode", "1"],
    );
    round_trip(
        "past-windows-mode2",
        CaseSpec::new("p", [1, 4, 2], [5, 5], [8, 8])
            .past(6)
            .with(|o| {
                o.is_causal = true;
                o.left_window_size = 3;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased);
            }),
        &[
            "--is-causal",
            "--left-window-size",
            "3",
            "--qk-matmul-output-mode",
            "2",
        ],
    );
    round_trip(
        "nonpad-right-window-mode3-unfused",
        CaseSpec::new("n", [3, 2, 2], [6, 12], [8, 8])
            .nonpad()
            .with(|o| {
                o.right_window_size = 2;
                o.left_window_size = 4;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
            }),
        &[
            "--right-window-size",
            "2",
            "--left-window-size",
            "4",
            "--qk-matmul-output-mode",
            "3",
            "--path",
            if backend() == "gpu" {
                "unfused"
            } else {
                "auto"
            },
        ],
    );
    round_trip(
        "mode0-cpu-path",
        CaseSpec::new("m", [1, 2, 1], [4, 9], [8, 4]).with(qk(QkMatmulOutputMode::Scaled)),
        &["--qk-matmul-output-mode", "0", "--path", "cpu"],
    );
    round_trip(
        "mode3-oracle-path",
        CaseSpec::new("o", [1, 2, 1], [4, 9], [8, 4])
            .with(qk(QkMatmulOutputMode::Probabilities))
            .with(|o| o.is_causal = true),
        &[
            "--qk-matmul-output-mode",
            "3",
            "--is-causal",
            "--path",
            "oracle",
            "--cpu-threads",
            "1",
        ],
    );
}

#[test]
fn attend_reads_f16_inputs_and_the_3d_form() {
    let dir = scratch("f16-3d");
    // 3D: Q [B, S, Hq*D] with 4 query heads, K/V [B, L, Hkv*D] with 2 KV heads, f16.
    let mut rng = webattn::rng::SplitMix64::new(3);
    let (b, s, l, d) = (2, 5, 7, 8);
    let to_f16 = |v: Vec<f32>| v.into_iter().map(half::f16::from_f32).collect::<Vec<_>>();
    let q = to_f16(rng.normal_vec(b * s * 4 * d, 1.0));
    let k = to_f16(rng.normal_vec(b * l * 2 * d, 1.0));
    let v = to_f16(rng.normal_vec(b * l * 2 * d, 1.0));
    write(&dir.join("q.npy"), &[b, s, 4 * d], &q, npyz::Order::C);
    write(&dir.join("k.npy"), &[b, l, 2 * d], &k, npyz::Order::C);
    write(&dir.join("v.npy"), &[b, l, 2 * d], &v, npyz::Order::C);
    let y = dir.join("y.npy");
    let out = run(&[
        "--backend",
        backend(),
        "attend",
        "--q",
        arg(&dir.join("q.npy")),
        "--k",
        arg(&dir.join("k.npy")),
        "--v",
        arg(&dir.join("v.npy")),
        "--q-num-heads",
        "4",
        "--kv-num-heads",
        "2",
        "--is-causal",
        "--y",
        arg(&y),
    ]);
    assert!(out.status.success());
    let got = npy::read_tensor(&y, "Y").unwrap();
    assert_eq!(got.shape(), &[b, s, 4 * d]);

    let widen = |v: &[half::f16], shape: [usize; 3]| {
        HostTensor::new(shape, v.iter().map(|x| x.to_f32()).collect()).unwrap()
    };
    let q4 = webattn::layout::split_heads("Q", &widen(&q, [b, s, 4 * d]), 4).unwrap();
    let k4 = webattn::layout::split_heads("K", &widen(&k, [b, l, 2 * d]), 2).unwrap();
    let v4 = webattn::layout::split_heads("V", &widen(&v, [b, l, 2 * d]), 2).unwrap();
    let options = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let host = AttentionInputs::new(&q4, &k4, &v4);
    let exact = webattn::cpu::attention_exact(&host, &options).unwrap();
    let plain = webattn::cpu::attention_plain_f32(&host, &options).unwrap();
    let to_3d = |v: Vec<f32>| {
        webattn::layout::merge_heads(&HostTensor::new([b, 4, s, d], v).unwrap())
            .unwrap()
            .into_data()
    };
    let exact_3d: Vec<f64> = to_3d(exact.y.iter().map(|&x| x as f32).collect())
        .into_iter()
        .map(f64::from)
        .collect();
    let report = compare(got.data(), &exact_3d, &to_3d(plain.y), 1e-6);
    println!(
        "3D f16 Y max abs {:.2e} allowed {:.2e} plus Y's rounding to f16",
        report.max_abs, report.allowed
    );
    // An f16 Q gives an f16 Y in the 3-D form too, as in the 4-D one: the
    // f16 rule allows the f32 allowance plus Y's rounding (half an ulp,
    // |y| 2^-11 at most; 2^-10 here for a value rounded across a power of 2).
    assert_eq!(got.dtype(), webattn::DType::F16, "3-D f16 Q gave an f32 Y");
    for (i, (&g, &e)) in got.data().iter().zip(&exact_3d).enumerate() {
        let allowed = report.allowed + e.abs() * 2f64.powi(-10);
        assert!(
            (f64::from(g) - e).abs() <= allowed,
            "Y[{i}] = {g}, exact {e}, allowed {allowed:.2e}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every ONNX case through `attend`'s flags and files, on the CPU backend (a
/// process starts in a tenth of a GPU engine's time; tests/onnx_reference.rs
/// runs the same cases on both GPU paths through the library).
#[test]
fn attend_reproduces_the_onnx_reference_cases() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx");
    let dir = scratch("onnx");
    let mut count = 0;
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("attrs.json").exists())
        .collect();
    cases.sort();
    for case in cases {
        let attrs: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(case.join("attrs.json")).unwrap())
                .unwrap();
        let file = |n: &str| case.join(format!("{n}.npy"));
        let mut args: Vec<String> = vec!["--backend".into(), "cpu".into(), "attend".into()];
        for (flag, name) in [
            ("--q", "Q"),
            ("--k", "K"),
            ("--v", "V"),
            ("--attn-mask", "attn_mask"),
            ("--past-key", "past_key"),
            ("--past-value", "past_value"),
            ("--nonpad-kv-seqlen", "nonpad_kv_seqlen"),
        ] {
            if file(name).exists() {
                args.extend([flag.into(), file(name).display().to_string()]);
            }
        }
        for (key, flag) in [
            ("scale", "--scale"),
            ("softcap", "--softcap"),
            ("q_num_heads", "--q-num-heads"),
            ("kv_num_heads", "--kv-num-heads"),
            ("left_window_size", "--left-window-size"),
            ("right_window_size", "--right-window-size"),
            ("qk_matmul_output_mode", "--qk-matmul-output-mode"),
        ] {
            if let Some(v) = attrs.get(key) {
                args.extend([flag.into(), v.to_string()]);
            }
        }
        if attrs.get("is_causal").and_then(|v| v.as_i64()) == Some(1) {
            args.push("--is-causal".into());
        }
        let mut produced = vec![("Y", dir.join("Y.npy"))];
        for name in ["present_key", "present_value", "qk_matmul_output"] {
            if file(name).exists() {
                produced.push((name, dir.join(format!("{name}.npy"))));
            }
        }
        for (name, path) in &produced {
            args.extend([
                format!("--{}", name.to_lowercase().replace('_', "-")),
                path.display().to_string(),
            ]);
        }
        let out = bin().args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            case.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        for (name, path) in &produced {
            let got = npy::read_tensor(path, "output").unwrap();
            let want = npy::read_tensor(file(name), "expected").unwrap();
            assert_eq!(got.shape(), want.shape(), "{} {name}", case.display());
            let worst = got
                .data()
                .iter()
                .zip(want.data())
                .map(|(&g, &w)| {
                    if w.is_finite() {
                        (g - w).abs()
                    } else if g == w {
                        0.0
                    } else {
                        f32::INFINITY
                    }
                })
                .fold(0.0f32, f32::max);
            assert!(
                worst <= 2e-6,
                "{} {name}: max error {worst:e} against ONNX",
                case.display()
            );
        }
        count += 1;
    }
    println!("webattn attend reproduced {count} ONNX reference cases");
    assert!(count >= 30);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `attend` with Q from `q` (K and V valid) and expects exit code 1, an
/// error message containing `needle`, and no output file.
fn expect_failure(test: &str, q: impl FnOnce(&Path) -> PathBuf, needle: &str) {
    let dir = scratch(test);
    let k = write_f32(
        &dir,
        "K",
        &HostTensor::new([1, 1, 3, 4], vec![0.5; 12]).unwrap(),
    );
    let v = write_f32(
        &dir,
        "V",
        &HostTensor::new([1, 1, 3, 4], vec![0.5; 12]).unwrap(),
    );
    let q = q(&dir);
    let y = dir.join("Y.npy");
    let before = std::fs::read(&q).ok();
    let out = run(&[
        "--backend",
        backend(),
        "attend",
        "--q",
        arg(&q),
        "--k",
        arg(&k),
        "--v",
        arg(&v),
        "--y",
        arg(&y),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{test}: {stderr}");
    assert!(
        stderr.contains("error:") && stderr.contains(needle),
        "{test}: {stderr}"
    );
    assert!(!y.exists(), "{test}: an output file was created");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(
        !leftovers
            .iter()
            .any(|n| n.to_string_lossy().contains("partial")),
        "{leftovers:?}"
    );
    assert_eq!(before, std::fs::read(&q).ok(), "{test}: the input changed");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_inputs_fail_cleanly() {
    let good = || HostTensor::new([1, 1, 2, 4], vec![0.25; 8]).unwrap();
    expect_failure(
        "truncated",
        |d| {
            let p = write_f32(d, "Q", &good());
            let bytes = std::fs::read(&p).unwrap();
            std::fs::write(&p, &bytes[..bytes.len() - 6]).unwrap();
            p
        },
        "truncated",
    );
    expect_failure(
        "dtype",
        |d| {
            let p = d.join("Q.npy");
            write(&p, &[1, 1, 2, 4], &[1i8; 8], npyz::Order::C);
            p
        },
        "element type",
    );
    expect_failure(
        "int32-q",
        |d| {
            let p = d.join("Q.npy");
            write(&p, &[1, 1, 2, 4], &[1i32; 8], npyz::Order::C);
            p
        },
        "int32",
    );
    expect_failure(
        "rank",
        |d| write_f32(d, "Q", &HostTensor::new([2, 4], vec![0.0; 8]).unwrap()),
        "3D [B, S, H*D] or 4D",
    );
    expect_failure(
        "mismatch",
        |d| {
            write_f32(
                d,
                "Q",
                &HostTensor::new([2, 1, 2, 4], vec![0.0; 16]).unwrap(),
            )
        },
        "batch",
    );
    expect_failure(
        "directory",
        |d| {
            let p = d.join("Q.npy");
            std::fs::create_dir(&p).unwrap();
            p
        },
        "directory",
    );
    expect_failure("missing", |d| d.join("nope.npy"), "cannot read");
    expect_failure(
        "fortran",
        |d| {
            let p = d.join("Q.npy");
            write(&p, &[1, 1, 2, 4], &[0.5f32; 8], npyz::Order::Fortran);
            p
        },
        "Fortran",
    );
    expect_failure(
        "not-npy",
        |d| {
            let p = d.join("Q.npy");
            std::fs::write(&p, b"this is not numpy").unwrap();
            p
        },
        "not a valid .npy",
    );
}

#[test]
fn outputs_never_overwrite_inputs() {
    let dir = scratch("overwrite");
    let q = write_f32(
        &dir,
        "Q",
        &HostTensor::new([1, 1, 2, 4], vec![0.25; 8]).unwrap(),
    );
    let before = std::fs::read(&q).unwrap();
    let out = run(&[
        "attend",
        "--q",
        arg(&q),
        "--k",
        arg(&q),
        "--v",
        arg(&q),
        "--y",
        arg(&q),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("would overwrite input"));
    assert_eq!(before, std::fs::read(&q).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn usage_errors_exit_with_2() {
    for args in [
        vec!["attend", "--q", "q.npy"],
        vec!["frobnicate"],
        vec![
            "attend",
            "--q",
            "a",
            "--k",
            "b",
            "--v",
            "c",
            "--y",
            "d",
            "--qk-matmul-output-mode",
            "5",
        ],
        vec!["check", "--quick", "--full"],
        vec![
            "attend",
            "--q",
            "a",
            "--k",
            "b",
            "--v",
            "c",
            "--y",
            "d",
            "--past-key",
            "p",
        ],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn info_reports_the_adapter_and_the_plan() {
    let out = run(&["--backend", backend(), "info", "--json"]);
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    if backend() == "gpu" {
        assert!(json["adapter"]["name"]
            .as_str()
            .is_some_and(|n| !n.is_empty()));
        // The plans of typical calls, as `Engine::plan` makes them: a decode
        // call plans the decode kernel, head dims past the fused kernels the
        // unfused path with its reason.
        let plans = json["plans"].as_array().unwrap();
        let plan = |call: &str| {
            plans
                .iter()
                .find(|p| p["call"].as_str().unwrap().starts_with(call))
                .map(|p| p["plan"].as_str().unwrap().to_string())
                .unwrap()
        };
        assert!(plan("prefill").starts_with("fused: attention_"));
        assert!(plan("decode").starts_with("fused, decode: attention_decode"));
        assert!(plan("B1 H2 N256 head dim 512").contains("fused path unavailable"));
        let text = run(&["--backend", "gpu", "info"]);
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("plans:"), "{text}");
    }
    let cpu = run(&["--backend", "cpu", "info"]);
    assert!(cpu.status.success());
    assert!(String::from_utf8_lossy(&cpu.stdout).contains("CPU"));
    // A generated kernel's text, as the engine compiles it; a wrong name
    // lists the right ones.
    let wgsl = run(&["info", "--wgsl", "attention_tiled_wide"]);
    let text = String::from_utf8_lossy(&wgsl.stdout);
    assert!(
        wgsl.status.success()
            && text.starts_with("// Made by src/kernels/attention/tiled/generator.rs")
    );
    let spliced = !text
        .lines()
        .any(|l| l.trim_start().starts_with("// #include "));
    assert!(
        text.contains("const MAX_RQ: u32 = 8u;") && spliced,
        "{text}"
    );
    let wrong = run(&["info", "--wgsl", "attention_tiled_wid"]);
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success() && err.contains("attention_tiled_wide"),
        "{err}"
    );
}

#[test]
fn every_fused_kernel_can_be_forced_by_name() {
    if common::gpu().is_none() {
        return;
    }
    // lavapipe picks attention_sg; the register-tiled kernel (what GPUs run)
    // and the portable one are forced by name and run the whole quick sweep,
    // the tiled one also at WebGPU's default limits (smaller tiles: 16 KiB of
    // workgroup memory, 256 invocations); so does the tiled kernel's shuffle
    // form (row maxima and P by subgroup shuffles). The kernels GPUs run go
    // without naga's runtime checks (`off`: no index clamps or loop counters;
    // `bounds`: no loop counters): an access that relied on a clamp may read
    // a neighbour's data there (lavapipe need not fault on it), so passing
    // without them is the stricter test. The sweep with the checks on goes
    // through every tile shape in tests/gpu/tiled.rs.
    let mut forced = vec![
        ("attention_tiled", "adapter", "off"),
        ("attention_tiled", "webgpu-default", "bounds"),
        ("attention_fused", "adapter", "on"),
    ];
    if common::runs_shuffle_forms() {
        forced.push(("attention_tiled_shuffle", "adapter", "off"));
    }
    // Every name is forced each run; the sweeps (each kernel is swept with
    // its checks on elsewhere each run) take turns, one a run (each compiles
    // its own pipelines: about 40 s of lavapipe's compiler on a cold cache).
    let sweeps = forced.len();
    let turn = common::rotation("the forced kernels' sweeps without runtime checks", sweeps);
    for (i, (kernel, limits, checks)) in forced.into_iter().enumerate() {
        let info = run(&["--kernel", kernel, "--limits", limits, "info"]);
        let text = String::from_utf8_lossy(&info.stdout);
        assert!(info.status.success());
        assert!(
            text.contains(&format!("fused:    {kernel} (forced by --kernel")),
            "{text}"
        );
        if i != turn {
            continue;
        }
        assert_sweep_passes(
            &[
                "--backend",
                "gpu",
                "--kernel",
                kernel,
                "--limits",
                limits,
                "--runtime-checks",
                checks,
                "check",
                "--quick",
            ],
            &format!("{kernel} at {limits}, runtime checks {checks}"),
        );
    }
    let bad = run(&["--runtime-checks", "sometimes", "info"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("runtime_checks"));
    // The subgroup kernel by name too, where the adapter has fixed subgroups
    // (the sweep through it is check_quick_ends_with_the_summary_line's).
    if common::gpu()
        .and_then(|engine| engine.capabilities())
        .is_some_and(|caps| caps.fixed_cpu_subgroup().is_some())
    {
        let sg = run(&["--kernel", "attention_sg", "info"]);
        assert!(sg.status.success());
        assert!(String::from_utf8_lossy(&sg.stdout).contains("fused:    attention_sg (forced"));
    }
    // A GPU kernel named for a CPU engine is an error, not ignored.
    let cpu = run(&["--backend", "cpu", "--kernel", "attention_fused", "info"]);
    assert_eq!(cpu.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&cpu.stderr).contains("CPU backend"));
    // A name that is not a kernel is a usage error that lists the names.
    let bad = run(&["--kernel", "flash3", "info"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("attention_fused"));
}

#[test]
fn every_decode_kernel_can_be_forced_by_name() {
    if common::gpu().is_none() {
        return;
    }
    let streams = common::gpu()
        .and_then(|engine| engine.capabilities())
        .is_some_and(|caps| caps.stream_decode_subgroups());
    // The quick sweep's decode cases (GQA groups sharing a workgroup, 16
    // query rows, past, nonpad, windows, ALiBi, softcap, f16 K and V,
    // non-finite values) through each decode kernel: the staged one, and the
    // streaming one at WebGPU's default limits (at the adapter's, it is what
    // lavapipe chooses: check_quick_ends_with_the_summary_line sweeps it).
    let mut runs = vec![("attention_decode", "adapter", true)];
    if streams {
        runs.push(("attention_decode_stream", "adapter", false));
        runs.push(("attention_decode_stream", "webgpu-default", true));
    }
    for (kernel, limits, sweep) in runs {
        let info = run(&["--decode-kernel", kernel, "info"]);
        let text = String::from_utf8_lossy(&info.stdout);
        assert!(info.status.success());
        assert!(
            text.contains(&format!("decode:   {kernel}"))
                && text.contains("forced by --decode-kernel"),
            "{text}"
        );
        if !sweep {
            continue;
        }
        assert_sweep_passes(
            &[
                "--backend",
                "gpu",
                "--decode-kernel",
                kernel,
                "--limits",
                limits,
                "check",
                "--quick",
                "--filter",
                "decode",
            ],
            &format!("{kernel} at {limits}"),
        );
    }
    // lavapipe at 512-bit vectors runs subgroups of 16, so the streaming
    // kernel's teams of 16 (what a GPU's GQA groups take) run there too.
    let llvmpipe = common::gpu()
        .and_then(|engine| engine.capabilities())
        .is_some_and(|caps| caps.adapter.name.contains("llvmpipe"));
    // Every other run (the streaming kernel's default teams are swept each run).
    let wide_turn = common::rotation("the streaming decode kernel at 512-bit vectors", 2) == 0;
    if streams && llvmpipe && wide_turn {
        let out = bin()
            .env("LP_NATIVE_VECTOR_WIDTH", "512")
            .args([
                "--backend",
                "gpu",
                "--decode-kernel",
                "attention_decode_stream",
                "check",
                "--quick",
                "--filter",
                "decode",
            ])
            .output()
            .expect("the binary runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.trim_end().lines().last().unwrap_or_default();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stdout.contains("512 bits") || stderr.contains("512 bits"),
            "{stdout}{stderr}"
        );
        assert!(
            out.status.success() && last.ends_with(" passed, 0 failed"),
            "subgroups of 16: {stdout}"
        );
    }
    if !streams {
        // Forcing the streaming kernel without subgroups is refused.
        let out = run(&["--decode-kernel", "attention_decode_stream", "info"]);
        assert_eq!(out.status.code(), Some(1));
    }
    let bad = run(&["--decode-kernel", "flash", "info"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("attention_decode_stream"));
}

#[test]
fn check_passes_when_tensors_exceed_a_binding() {
    if common::gpu().is_none() {
        return;
    }
    // At 64 KiB per storage binding a dozen quick cases exceed one binding and
    // run in pieces (by batch and head, query rows and keys); the sweep passes
    // through one kernel a run, on a rotation: the adapter's own, or a GPU's,
    // the register-tiled one or its shuffle form (pieces are cut above the
    // kernels, which see views of the call's buffers).
    let mut kernels = vec!["auto", "attention_tiled"];
    if common::runs_shuffle_forms() {
        kernels.push("attention_tiled_shuffle");
    }
    let kernel = kernels[common::rotation("the kernel in pieces", kernels.len())];
    assert_sweep_passes(
        &[
            "--backend",
            "gpu",
            "--kernel",
            kernel,
            "--limit",
            "max_storage_buffer_binding_size=64KiB",
            "check",
            "--quick",
        ],
        kernel,
    );
}

/// Runs `webattn ARGS` (a `check`) and asserts it passed every case of a
/// sweep that was not empty; `what` names the run in the failure.
fn assert_sweep_passes(args: &[&str], what: &str) {
    let out = run(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.trim_end().lines().last().unwrap_or_default();
    assert!(out.status.success(), "{what}: {stdout}");
    assert!(
        last.ends_with(" passed, 0 failed") && !last.starts_with("0 "),
        "{what}: {last}"
    );
}

#[test]
fn check_quick_ends_with_the_summary_line() {
    let dir = scratch("check");
    let json = dir.join("check.json");
    let out = run(&[
        "--backend",
        backend(),
        "check",
        "--quick",
        "--json",
        arg(&json),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    println!("{stdout}");
    let (passed, failed) = last
        .split_once(" passed, ")
        .expect("last line is 'N passed, N failed'");
    let passed: usize = passed.parse().unwrap();
    assert_eq!(failed, "0 failed", "{last}");
    assert!(passed > 30, "{last}");
    assert!(out.status.success());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["passed"].as_u64(), Some(passed as u64));

    // The CPU backend runs the same sweep, and a filter narrows it.
    let out = run(&["--backend", "cpu", "check", "--filter", "mask-float"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.trim_end().ends_with("4 passed, 0 failed"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_on_a_cpu_engine_times_the_cpu_backend_and_the_oracle() {
    let dir = scratch("bench-cpu");
    let json = dir.join("bench.json");
    let out = run(&[
        "--backend",
        "cpu",
        "--cpu-threads",
        "2",
        "bench",
        "--quick",
        "--tokens",
        "256",
        "--width",
        "64",
        "--json",
        arg(&json),
    ]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("f32, 2 threads"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(report["adapter"].is_null() && report["fma_ceiling_gflops"].is_null());
    let paths: std::collections::BTreeSet<&str> = report["attention"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["path"].as_str())
        .collect();
    assert_eq!(paths, ["cpu", "oracle"].into_iter().collect());
    assert!(report["decode"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["path"] == "cpu" && d["ms"].is_number()));
    // The backward beside its forward.
    let backward = report["backward"].as_array().unwrap();
    assert!(!backward.is_empty());
    assert!(backward.iter().all(|b| b["path"] == "cpu"
        && b["backward_ms"].is_number()
        && b["forward_ms"].is_number()));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `webattn phases` on the register-tiled kernel and the decode kernel: the
/// whole kernel and five variants (each phase removed, then all four), in
/// the table and the JSON; a kernel without phase switches is refused by name.
#[test]
fn phases_times_the_tiled_kernel_without_each_phase() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("phases");
    let json = dir.join("phases.json");
    let small = [
        "phases",
        "--quick",
        "--head-dims",
        "8",
        "--seq",
        "64",
        "--tokens",
        "128",
        "--width",
        "16",
        "--decode-keys",
        "300",
    ];
    let mut args = vec!["--backend", "gpu", "--kernel", "attention_tiled"];
    args.extend(small);
    args.extend(["--json", arg(&json)]);
    let out = run(&args);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("skeleton") && stdout.contains("FMA ceiling"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(report["fma_ceiling_gflops"]
        .as_f64()
        .is_some_and(|g| g > 0.0));
    let rows = report["rows"].as_array().unwrap();
    // The tiled kernel's rows, and the decode kernel's where it streams.
    assert!(rows.iter().any(|row| row["kind"] == "fused"));
    for row in rows {
        let kernel = row["kernel"].as_str().unwrap();
        match row["kind"].as_str().unwrap() {
            "fused" => assert!(kernel.starts_with("attention_tiled["), "{row}"),
            _ => assert!(kernel.starts_with("attention_decode_stream["), "{row}"),
        }
        assert!(row["whole_ms"].as_f64().is_some_and(|ms| ms > 0.0));
        let without = row["without"].as_array().unwrap();
        let bits: Vec<u64> = without
            .iter()
            .map(|v| v["bits"].as_u64().unwrap())
            .collect();
        assert_eq!(bits, [1, 2, 4, 8, 15]);
        assert!(without
            .iter()
            .all(|v| v["ms"].as_f64().is_some_and(|ms| ms > 0.0)));
    }
    let mut args = vec!["--backend", "gpu", "--kernel", "attention_fused"];
    args.extend(small);
    args.extend(["--only", "fused"]);
    let out = run(&args);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no phase switches"));
}

#[test]
fn bench_writes_the_documented_json_and_a_plot() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("bench");
    let json = dir.join("bench.json");
    let svg = dir.join("bench.svg");
    // A small model width and length (`--seqs`: the attention, decode and
    // backward rows at 256) keep this a functional check, not a measurement.
    let out = run(&[
        "--backend",
        "gpu",
        "bench",
        "--quick",
        "--seqs",
        "256",
        "--tokens",
        "512",
        "--width",
        "64",
        "--json",
        arg(&json),
        "--plot",
        arg(&svg),
    ]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("FMA ceiling") && stdout.contains("decode"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in ["name", "backend", "device_type"] {
        assert!(report["adapter"][key].is_string(), "adapter.{key}");
    }
    assert!(report["fma_ceiling_gflops"]
        .as_f64()
        .is_some_and(|g| g > 0.0));
    assert!(report["bandwidth_ceiling_gbs"]
        .as_f64()
        .is_some_and(|g| g > 0.0));
    assert!(stdout.contains("bandwidth ceiling"), "{stdout}");
    // The clock guard: off by default on a CPU adapter, on on a GPU; its
    // tallies and every row's runs are in the report.
    let cpu_adapter = report["adapter"]["device_type"] == "Cpu";
    let guard = report["clock_guard"]
        .as_bool()
        .expect("a GPU engine's guard");
    assert!(!(cpu_adapter && guard), "the guard is off on a CPU adapter");
    assert!(stdout.contains("clock guard: "), "{stdout}");
    for key in ["retaken_runs", "throttled_runs"] {
        assert!(report[key].is_u64(), "{key}");
    }
    for row in ["gemm", "attention", "decode"]
        .iter()
        .flat_map(|kind| report[*kind].as_array().unwrap())
    {
        assert!(row["samples_ms"].as_array().is_some_and(|s| !s.is_empty()));
        if row["path"] != "cpu" && row["path"] != "oracle" {
            assert!(row["min_ms"].as_f64().unwrap() <= row["ms"].as_f64().unwrap());
            assert!(row["retaken"].is_u64() && row["throttled"].is_u64());
        }
    }
    // The fused backward beside its forward, its workspace reported.
    let backward = report["backward"].as_array().unwrap();
    assert!(backward
        .iter()
        .any(|b| b["path"] == "fused" && b["workspace_bytes"].as_u64().is_some_and(|w| w > 0)));
    assert!(stdout.contains("backward ms"), "{stdout}");
    for g in report["gemm"].as_array().unwrap() {
        for key in ["m", "n", "k", "gflops", "share_of_ceiling"] {
            assert!(g[key].is_number(), "gemm.{key}");
        }
    }
    let attention = report["attention"].as_array().unwrap();
    let paths: std::collections::BTreeSet<&str> = attention
        .iter()
        .filter_map(|a| a["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        ["cpu", "fused", "oracle", "unfused"].into_iter().collect()
    );
    for a in attention {
        for key in [
            "batch",
            "heads",
            "seq_q",
            "seq_k",
            "head_dim",
            "ms",
            "gflops",
            "peak_bytes",
        ] {
            assert!(a[key].is_number(), "attention.{key}");
        }
        assert!(a["causal"].is_boolean());
        // A share of the FMA ceiling on every path: the GPU's for the GPU
        // paths, the host's for the CPU backend and the oracle.
        assert!(
            a["share_of_ceiling"].as_f64().is_some_and(|s| s > 0.0),
            "attention.share_of_ceiling on {}",
            a["path"]
        );
    }
    let decode = report["decode"].as_array().unwrap();
    // The fused path's decode rows come in f32 and with f16 keys and values,
    // which stream half the bytes.
    for dtype in ["float32", "float16"] {
        assert!(
            decode
                .iter()
                .any(|d| d["path"] == "fused" && d["dtype"] == dtype),
            "a fused {dtype} decode row"
        );
    }
    for d in decode {
        for key in [
            "batch", "seq_k", "head_dim", "ms", "gflops", "kv_bytes", "kv_gbs",
        ] {
            assert!(d[key].is_number(), "decode.{key}");
        }
        assert!(d["path"].is_string() && d["dtype"].is_string());
        let per_value = if d["dtype"] == "float16" { 2 } else { 4 };
        let values = 2
            * d["batch"].as_u64().unwrap()
            * d["heads"].as_u64().unwrap()
            * d["seq_k"].as_u64().unwrap()
            * d["head_dim"].as_u64().unwrap();
        assert_eq!(d["kv_bytes"].as_u64().unwrap(), per_value * values);
        // A share of the copy ceiling on every path: the GPU's for the GPU
        // paths, the host's (measured in the same run) for the CPU backend.
        assert!(
            d["share_of_bandwidth"].as_f64().is_some_and(|s| s > 0.0),
            "decode.share_of_bandwidth: {d}"
        );
    }
    // Two cache lengths, each with f32 and f16 weights on a device; after
    // its first token a step creates no buffer and submits once. The CPU
    // engine's rows beside them, shared against the host's copy ceiling.
    let steps = report["token_step"].as_array().unwrap();
    let on = |engine: &'static str| {
        steps
            .iter()
            .filter(move |t| t["engine"] == engine && t["layers"] == 1)
    };
    assert_eq!(on("gpu").count(), 4, "GPU token_step rows");
    // The stack of 32 layers, its hidden state on the device: the token
    // written in place, every layer's step in one submission and one
    // readback a token (its staging kept), nothing created.
    let stacks: Vec<_> = steps.iter().filter(|t| t["layers"] == 32).collect();
    assert_eq!(stacks.len(), 4, "stack rows");
    for t in stacks {
        assert_eq!(t["buffers_created"], 0, "{t}");
        assert_eq!(t["submissions"], 2, "the stack's and the readback's: {t}");
        assert!(t["dispatches"].as_u64().is_some_and(|d| d <= 32 * 8), "{t}");
    }
    assert_eq!(on("cpu").count(), 2, "CPU token_step rows");
    assert!(report["host_copy_gbs"].as_f64().is_some_and(|g| g > 0.0));
    for t in on("cpu") {
        assert!(t["share_of_bandwidth"].as_f64().is_some_and(|s| s > 0.0));
        assert_eq!(t["submissions"], 0, "no device work on a CPU engine");
    }
    for t in on("gpu") {
        for key in [
            "d_model",
            "heads",
            "kv_heads",
            "head_dim",
            "cached",
            "ms",
            "append_ms",
            "dispatches",
            "copies",
            "buffers_created",
            "submissions",
            "queue_writes",
            "weight_bytes",
            "kv_bytes",
            "gbs",
        ] {
            assert!(t[key].is_number(), "token_step.{key}");
        }
        assert!(["f32", "f16"].contains(&t["weights"].as_str().unwrap()));
        assert_eq!(t["buffers_created"], 0, "token_step.buffers_created");
        assert_eq!(t["submissions"], 1, "token_step.submissions");
    }
    let overhead = &report["call_overhead"];
    for key in [
        "attention_ms",
        "prepared_ms",
        "recorded_ms",
        "record_only_ms",
        "empty_submit_ms",
    ] {
        assert!(
            overhead[key].as_f64().is_some_and(|ms| ms > 0.0),
            "call_overhead.{key}"
        );
    }
    assert!(stdout.contains("token step"), "{stdout}");
    assert!(stdout.contains("per-call host overhead"), "{stdout}");
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    let replot = dir.join("again.svg");
    assert!(
        run(&["bench", "--replot", arg(&json), "--plot", arg(&replot)])
            .status
            .success()
    );
    assert!(replot.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_runs_decode_rows_past_one_buffer_in_chunks() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("bench-decode-limits");
    let json = dir.join("bench.json");
    // f32 K and V of 1 x 8 heads x 4096 keys x 128 are 16 MiB each: past an
    // 8 MiB buffer limit, so they are held in two buffers each and read in
    // pieces; the f16 rows (8 MiB) fit one.
    let out = run(&[
        "--backend",
        "gpu",
        "bench",
        "--quick",
        "--only",
        "decode",
        "--seqs",
        "4096",
        "--paths",
        "fused",
        "--limit",
        "max_buffer_size=8MiB",
        "--limit",
        "max_storage_buffer_binding_size=8MiB",
        "--json",
        arg(&json),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("skipped:"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(report["decode_skipped"].as_array().unwrap().is_empty());
    let measured = report["decode"].as_array().unwrap();
    for dtype in ["float32", "float16"] {
        assert!(
            measured.iter().any(|d| d["dtype"] == dtype),
            "no {dtype} row: {measured:?}"
        );
    }
}

/// `attend --dy` writes dQ, dK, dV and the past's gradients beside Y, each
/// within the tolerance rule of the oracle's; `check --backward` sweeps.
#[test]
fn attend_writes_the_gradients_and_check_sweeps_the_backward() {
    let dir = scratch("backward");
    let case = CaseSpec::new("cli-backward", [1, 4, 2], [7, 9], [8, 4])
        .past(5)
        .with(|o| o.is_causal = true);
    let oracle = webattn::conformance::BackwardOracle::new(&case, 3).unwrap();
    let inputs = &oracle.inputs;
    let (pk, pv) = inputs.past.as_ref().unwrap();
    let files: Vec<PathBuf> = [
        ("Q", &inputs.q),
        ("K", &inputs.k),
        ("V", &inputs.v),
        ("PK", pk),
        ("PV", pv),
        ("DY", &oracle.dy),
    ]
    .iter()
    .map(|(name, t)| write_f32(&dir, name, t))
    .collect();
    let out_path = |name: &str| dir.join(format!("{name}.npy"));
    let mut args: Vec<String> = vec!["--backend".into(), backend().into(), "attend".into()];
    for (flag, file) in ["--q", "--k", "--v", "--past-key", "--past-value", "--dy"]
        .iter()
        .zip(&files)
    {
        args.extend([flag.to_string(), arg(file).to_string()]);
    }
    args.push("--is-causal".into());
    for name in ["y", "dq", "dk", "dv", "dpast-key", "dpast-value"] {
        args.extend([format!("--{name}"), arg(&out_path(name)).to_string()]);
    }
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success());
    let read = |name: &str| npy::read_tensor(out_path(name), "gradient").unwrap();
    let got = webattn::AttentionGradients {
        dq: read("dq"),
        dk: read("dk"),
        dv: read("dv"),
        d_past_key: Some(read("dpast-key")),
        d_past_value: Some(read("dpast-value")),
        d_mask: None,
    };
    let (output, report) = oracle.compare(&got).unwrap();
    println!(
        "attend --dy: worst {output} max abs {:.2e} allowed {:.2e}",
        report.max_abs, report.allowed
    );
    assert!(report.passed(), "{output}: {report:?}");

    assert_sweep_passes(
        &[
            "--backend",
            backend(),
            "check",
            "--backward",
            "--filter",
            "mask-float",
        ],
        "check --backward",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn attend_runs_packed_sequences_against_each_sequence_alone() {
    let dir = scratch("ragged");
    // Three sequences of 5, 1 and 13 queries over 9, 4 and 13 keys (GQA 4/2).
    let (q_lens, k_lens) = ([5usize, 1, 13], [9usize, 4, 13]);
    let mut rng = webattn::rng::SplitMix64::new(11);
    let mut packed = |rows: usize, heads: usize, d: usize| {
        let data = (0..rows * heads * d)
            .map(|_| rng.uniform(-1.0, 1.0))
            .collect();
        HostTensor::new([rows, heads, d], data).unwrap()
    };
    let (total_q, total_k) = (q_lens.iter().sum(), k_lens.iter().sum());
    let (q, k, v) = (
        packed(total_q, 4, 16),
        packed(total_k, 2, 16),
        packed(total_k, 2, 8),
    );
    let offsets = |lens: &[usize]| -> Vec<i32> {
        std::iter::once(0)
            .chain(lens.iter().scan(0, |acc, &n| {
                *acc += n as i32;
                Some(*acc)
            }))
            .collect()
    };
    let (cu_q, cu_k) = (offsets(&q_lens), offsets(&k_lens));
    let (cq, ck) = (dir.join("cq.npy"), dir.join("ck.npy"));
    write(&cq, &[4], &cu_q, npyz::Order::C);
    write(&ck, &[4], &cu_k, npyz::Order::C);
    let files = [("Q", &q), ("K", &k), ("V", &v)].map(|(n, t)| write_f32(&dir, n, t));
    let (y, lse) = (dir.join("y.npy"), dir.join("lse.npy"));
    let args = [
        "--backend",
        backend(),
        "attend",
        "--q",
        arg(&files[0]),
        "--k",
        arg(&files[1]),
        "--v",
        arg(&files[2]),
        "--cu-seqlens-q",
        arg(&cq),
        "--cu-seqlens-k",
        arg(&ck),
        "--is-causal",
        "--softcap",
        "5",
        "--y",
        arg(&y),
        "--lse",
        arg(&lse),
    ];
    let out = run(&args);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ragged, 3 sequences"));
    // The oracle on each sequence alone, in the 4D form.
    let options = AttentionOptions {
        is_causal: true,
        softcap: 5.0,
        return_lse: true,
        ..Default::default()
    };
    let rows = |t: &HostTensor, from: usize, to: usize| {
        let (h, d) = (t.shape()[1], t.shape()[2]);
        let three = HostTensor::new(
            [1, to - from, h * d],
            t.data()[from * h * d..to * h * d].to_vec(),
        );
        webattn::layout::split_heads("T", &three.unwrap(), h).unwrap()
    };
    // [1, H, n, d] (row-major) to packed [n, H, d].
    fn packed_rows<F: Copy>(x: &[F], heads: usize, n: usize, d: usize, out: &mut Vec<F>) {
        for i in 0..n {
            for h in 0..heads {
                out.extend_from_slice(&x[(h * n + i) * d..(h * n + i + 1) * d]);
            }
        }
    }
    let (mut exact, mut plain, mut exact_lse, mut plain_lse) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..3 {
        let (qs, qe) = (cu_q[i] as usize, cu_q[i + 1] as usize);
        let (ks, ke) = (cu_k[i] as usize, cu_k[i + 1] as usize);
        let (qi, ki, vi) = (rows(&q, qs, qe), rows(&k, ks, ke), rows(&v, ks, ke));
        let inputs = AttentionInputs::new(&qi, &ki, &vi);
        let e = webattn::cpu::attention_exact(&inputs, &options).unwrap();
        let p = webattn::cpu::attention_plain_f32(&inputs, &options).unwrap();
        let n = qe - qs;
        packed_rows(&e.y, 4, n, 8, &mut exact);
        packed_rows(&p.y, 4, n, 8, &mut plain);
        packed_rows(&e.lse, 4, n, 1, &mut exact_lse);
        packed_rows(&p.lse, 4, n, 1, &mut plain_lse);
    }
    assert_close("attend --cu-seqlens: Y", &y, &exact, &plain);
    assert_close("attend --cu-seqlens: lse", &lse, &exact_lse, &plain_lse);
    // Offsets that miss the packed rows are the engine's typed refusal (exit
    // 1, no output); a mask beside them a usage error (exit 2).
    write(&cq, &[4], &[0i32, 5, 6, 18], npyz::Order::C);
    std::fs::remove_file(&y).unwrap();
    let refused = run(&args);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cu_seqlens_q"));
    assert!(!y.exists());
    let mut with_mask = args.to_vec();
    with_mask.extend(["--attn-mask", arg(&files[0])]);
    assert_eq!(run(&with_mask).status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_paged_runs_the_sweep_through_a_paged_cache_on_each_backend() {
    // On the adapter (device pages, the paged decode kernel) and on the CPU
    // backend (host pages): the quick sweep's cases a cache can be asked.
    for backend in [backend(), "cpu"] {
        let out = run(&["--backend", backend, "check", "--paged"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{backend}:\n{stdout}");
        let last = stdout.trim_end().lines().last().unwrap_or_default();
        assert!(out.status.success(), "check --paged on {backend}: {stdout}");
        assert!(
            last.ends_with(" passed, 0 failed") && !last.starts_with("0 "),
            "{last}"
        );
        assert!(stdout.contains("(paged)"), "{stdout}");
    }
    // int8 pages: judged on the stored values, their distance from f32 K/V said.
    let out = run(&[
        "--backend",
        backend(),
        "check",
        "--paged",
        "--storage",
        "int8",
        "--filter",
        "decode",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "check --paged --storage int8: {stdout}"
    );
    assert!(stdout.contains("(paged, int8)"), "{stdout}");
    let line = stdout.lines().last().unwrap_or_default();
    assert!(
        line.starts_with("int8 pages: worst normwise error against the oracle on f32"),
        "{line}"
    );
    let bad = run(&["check", "--paged", "--storage", "int4"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("must be f32, f16 or int8"));
}
