//! Our results against the ONNX reference implementation (onnx 1.23.2,
//! `onnx.reference`), on the fixtures `tests/fixtures/onnx/generate.py` wrote:
//! 30 small cases covering GQA, Dk != Dv, scale, softcap, every mask form
//! (including masks shorter than T), causal offsets, past KV, nonpad lengths,
//! windows, the qk output modes and the 3D form. Both the CPU oracle and the
//! GPU's unfused path must reproduce them.

mod common;

use std::path::{Path, PathBuf};

use webattn::layout::{merge_heads, split_heads};
use webattn::{
    npy, AttentionInputs, AttentionOptions, Engine, HostTensor, KernelPath, QkMatmulOutputMode,
};

/// ONNX computes in f32 with `sqrt(scale)` applied to Q and K separately; we apply
/// `scale` once in f64. The two agree to a few f32 ulps of the largest value.
const TOLERANCE: f64 = 2e-6;

fn fixture_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("fixtures exist")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("attrs.json").exists())
        .collect();
    dirs.sort();
    dirs
}

fn max_error(got: &HostTensor, want: &HostTensor) -> f64 {
    assert_eq!(got.shape(), want.shape());
    let scale = want
        .data()
        .iter()
        .filter(|x| x.is_finite())
        .fold(1.0f64, |m, &x| m.max(f64::from(x.abs())));
    got.data()
        .iter()
        .zip(want.data())
        .map(|(&g, &w)| {
            if w.is_finite() {
                f64::from((g - w).abs()) / scale
            } else if g == w {
                0.0
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

struct Fixture {
    name: String,
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    mask: Option<webattn::HostMask>,
    past: Option<(HostTensor, HostTensor)>,
    nonpad: Option<Vec<i64>>,
    options: AttentionOptions,
    three_d: bool,
    expected: Vec<(&'static str, HostTensor)>,
}

fn load(dir: &Path) -> Fixture {
    let attrs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("attrs.json")).unwrap()).unwrap();
    let int = |key: &str| attrs.get(key).and_then(|v| v.as_i64());
    let three_d = attrs["form"] == "3d";
    let read =
        |name: &'static str| npy::read_tensor(dir.join(format!("{name}.npy")), name).unwrap();
    let optional =
        |name: &'static str| dir.join(format!("{name}.npy")).exists().then(|| read(name));
    let (mut q, mut k, mut v) = (read("Q"), read("K"), read("V"));
    if three_d {
        let hq = int("q_num_heads").unwrap() as usize;
        let hkv = int("kv_num_heads").unwrap() as usize;
        q = split_heads("Q", &q, hq).unwrap();
        k = split_heads("K", &k, hkv).unwrap();
        v = split_heads("V", &v, hkv).unwrap();
    }
    let mut options = AttentionOptions {
        scale: attrs
            .get("scale")
            .and_then(|v| v.as_f64())
            .map(|s| s as f32),
        softcap: attrs.get("softcap").and_then(|v| v.as_f64()).unwrap_or(0.0) as f32,
        is_causal: int("is_causal") == Some(1),
        left_window_size: int("left_window_size").unwrap_or(-1),
        right_window_size: int("right_window_size").unwrap_or(-1),
        qk_matmul_output_mode: None,
        ..Default::default()
    };
    let mut expected = vec![("Y", read("Y"))];
    if let Some(qk) = optional("qk_matmul_output") {
        options.qk_matmul_output_mode =
            Some(QkMatmulOutputMode::from_onnx(int("qk_matmul_output_mode").unwrap_or(0)).unwrap());
        expected.push(("qk_matmul_output", qk));
    }
    if let Some(pk) = optional("present_key") {
        options.return_present = true;
        expected.push(("present_key", pk));
        expected.push(("present_value", read("present_value")));
    }
    let mask = dir
        .join("attn_mask.npy")
        .exists()
        .then(|| npy::read_mask(dir.join("attn_mask.npy")).unwrap());
    let past = optional("past_key").map(|pk| (pk, read("past_value")));
    let nonpad = dir
        .join("nonpad_kv_seqlen.npy")
        .exists()
        .then(|| npy::read_lengths(dir.join("nonpad_kv_seqlen.npy")).unwrap());
    Fixture {
        name: dir.file_name().unwrap().to_string_lossy().into_owned(),
        q,
        k,
        v,
        mask,
        past,
        nonpad,
        options,
        three_d,
        expected,
    }
}

fn check_engine(engine: &Engine, path: KernelPath) {
    let dirs = fixture_dirs();
    assert!(
        dirs.len() >= 30,
        "expected the 30 ONNX fixtures, found {}",
        dirs.len()
    );
    let mut worst = 0.0f64;
    for dir in dirs {
        let f = load(&dir);
        let mut inputs = AttentionInputs::new(&f.q, &f.k, &f.v);
        if let Some(m) = &f.mask {
            inputs = inputs.with_mask(m);
        }
        if let Some((pk, pv)) = &f.past {
            inputs = inputs.with_past(pk, pv);
        }
        inputs.nonpad_kv_seqlen = f.nonpad.as_deref();
        let options = AttentionOptions {
            path,
            ..f.options.clone()
        };
        let out = engine
            .attention_host_blocking(&inputs, &options)
            .unwrap_or_else(|e| panic!("{}: {e}", f.name));
        for (name, want) in &f.expected {
            let got = match *name {
                "Y" if f.three_d => merge_heads(&out.y).unwrap(),
                "Y" => out.y.clone(),
                "qk_matmul_output" => out.qk_matmul_output.clone().unwrap(),
                "present_key" => out.present_key.clone().unwrap(),
                _ => out.present_value.clone().unwrap(),
            };
            let err = max_error(&got, want);
            println!("{:<34} {name:<18} max error {err:.2e}", f.name);
            assert!(
                err <= TOLERANCE,
                "{} {name}: error {err:e} against ONNX",
                f.name
            );
            worst = worst.max(err);
        }
    }
    println!("worst error against the ONNX reference on {path:?}: {worst:.2e}");
}

#[test]
fn cpu_oracle_reproduces_onnx() {
    check_engine(&Engine::cpu(), KernelPath::Auto);
}

#[test]
fn gpu_fused_path_reproduces_onnx() {
    let Some(engine) = common::gpu() else { return };
    check_engine(engine, KernelPath::Fused);
}

#[test]
fn gpu_unfused_path_reproduces_onnx() {
    let Some(engine) = common::gpu() else { return };
    check_engine(engine, KernelPath::Unfused);
}
