//! The tuner and its cache: `webattn tune` measures and writes the cache, later
//! engines follow it (kernel and path), and a corrupt or stale cache is ignored
//! with a warning and rebuilt, never a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use webattn::conformance::{compare, CaseSpec, DEFAULT_FLOOR};
use webattn::cpu;
use webattn::gpu::ops::decode::{DecodeKernel, StreamShape};
use webattn::tuning::{
    TunedDecode, TunedEntry, TunedKernel, TuningCache, TuningKey, TuningTable, HEADER,
};
use webattn::{
    AttentionInputs, AttentionOptions, BackendPreference, Engine, EngineOptions, HostTensor,
    KernelPath,
};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("webattn-tuning-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn webattn(cache: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_webattn"))
        .arg("--tuning-cache")
        .arg(cache)
        .args(args)
        .output()
        .expect("the binary runs");
    eprintln!(
        "$ webattn {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn engine_with(cache: &Path) -> Engine {
    Engine::with_options_blocking(EngineOptions {
        backend: BackendPreference::Gpu,
        tuning_cache: TuningCache::File(cache.to_path_buf()),
        ..Default::default()
    })
    .expect("a GPU engine")
}

#[test]
fn tune_writes_the_cache_and_info_shows_what_it_chose() {
    if common::gpu().is_none() {
        return;
    }
    let cache = scratch("tune").join("cache").join("tuning.tsv");
    let out = webattn(&cache, &["tune", "--head-dims", "8,12/4"]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("<- fastest") && stdout.contains("unfused"),
        "{stdout}"
    );
    let (table, warnings) = TuningTable::parse(&std::fs::read_to_string(&cache).unwrap());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(table.len(), 2);
    // Both classes take the decode kernels (head dims multiples of 4): their
    // winner is recorded too.
    assert!(
        table.entries().all(|(_, entry)| entry.decode.is_some()),
        "{table:?}"
    );
    assert!(
        stdout.contains("decode (B 1") && stdout.contains("attention_decode"),
        "{stdout}"
    );
    // And the grouped problem's (GQA groups of 4).
    assert!(
        table
            .entries()
            .all(|(_, entry)| entry.grouped_decode.is_some()),
        "{table:?}"
    );
    assert!(stdout.contains("grouped decode (B 1"), "{stdout}");
    let info = webattn(&cache, &["info"]);
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        text.contains("head dims 8/8:") && text.contains("head dims 12/4:"),
        "{text}"
    );
    // The JSON report holds the same entries.
    let json = webattn(&cache, &["info", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["tuned"].as_array().map(Vec::len), Some(2));
}

#[test]
fn a_corrupt_cache_is_ignored_with_a_warning_and_rebuilt() {
    if common::gpu().is_none() {
        return;
    }
    let cache = scratch("corrupt").join("tuning.tsv");
    std::fs::write(&cache, b"\x00\x01 not a cache\n").unwrap();
    let info = webattn(&cache, &["info"]);
    assert!(info.status.success());
    let stderr = String::from_utf8_lossy(&info.stderr);
    assert!(
        stderr.contains("tuning cache") && stderr.contains("ignored"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&info.stdout).contains("nothing measured"));
    let tune = webattn(&cache, &["tune", "--head-dims", "8"]);
    assert!(tune.status.success());
    let text = std::fs::read_to_string(&cache).unwrap();
    assert!(text.starts_with(HEADER), "{text}");
    assert_eq!(TuningTable::parse(&text).0.len(), 1);
}

/// Head dims 8 (the class of the quick sweep's small cases) on the test adapter.
fn key_for_d8(engine: &Engine) -> TuningKey {
    TuningKey::new(engine.capabilities().unwrap(), 8, 8)
}

#[test]
fn a_stale_entry_is_ignored_with_a_warning_and_calls_stay_right() {
    let Some(gpu) = common::gpu() else { return };
    let cache = scratch("stale").join("tuning.tsv");
    let mut table = TuningTable::new();
    table.insert(
        key_for_d8(gpu),
        TunedEntry {
            // Tiles the register-tiled kernel does not offer.
            kernel: TunedKernel::Tiled {
                query_rows: 48,
                keys_per_tile: 24,
                tq: 12,
                tk: 4,
                prefetch: false,
                shuffle: false,
                chunked: false,
            },
            grouped_decode: None,
            fused_ms: 1.0,
            unfused_ms: 2.0,
            decode: None,
            coop_ms: None,
            unfused_coop_ms: None,
            fast_gemm: None,
            coop_tiles: None,
        },
    );
    table.save(&cache).unwrap();
    let out = webattn(
        &cache,
        &[
            "--kernel",
            "attention_tiled",
            "check",
            "--quick",
            "--filter",
            "nan-q",
        ],
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tuning entry for head dims 8/8 ignored"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("tuning entry").count(),
        1,
        "warned once: {stderr}"
    );
}

#[test]
fn auto_follows_the_measured_path_and_kernel() {
    let Some(gpu) = common::gpu() else { return };
    let cache = scratch("follow").join("tuning.tsv");
    let mut table = TuningTable::new();
    // Measured (so the table says): unfused faster at head dims 8.
    table.insert(
        key_for_d8(gpu),
        TunedEntry {
            kernel: TunedKernel::Portable,
            grouped_decode: None,
            fused_ms: 2.0,
            unfused_ms: 1.0,
            decode: None,
            coop_ms: None,
            unfused_coop_ms: None,
            fast_gemm: None,
            coop_tiles: None,
        },
    );
    table.save(&cache).unwrap();
    let engine = engine_with(&cache);
    let mut rng = webattn::rng::SplitMix64::new(common::seed());
    let tensor = |shape: [usize; 4], rng: &mut webattn::rng::SplitMix64| {
        HostTensor::new(shape.to_vec(), rng.normal_vec(shape.iter().product(), 1.0)).unwrap()
    };
    let (q, k, v) = (
        tensor([1, 2, 33, 8], &mut rng),
        tensor([1, 2, 40, 8], &mut rng),
        tensor([1, 2, 40, 8], &mut rng),
    );
    let inputs = AttentionInputs::new(&q, &k, &v);
    let options = AttentionOptions::default();
    let out = engine.attention_host_blocking(&inputs, &options).unwrap();
    let call = engine.last_call().unwrap();
    assert_eq!(call.path, KernelPath::Unfused);
    assert!(call.reason.unwrap_or_default().contains("webattn tune"));
    let exact = cpu::attention_exact(&inputs, &options).unwrap();
    let plain = cpu::attention_plain_f32(&inputs, &options).unwrap();
    let report = compare(out.y.data(), &exact.y, &plain.y, DEFAULT_FLOOR);
    println!(
        "unfused by measurement: worst {:.2e} of {:.2e}",
        report.max_abs, report.allowed
    );
    assert!(report.passed());

    // Now fused is faster with the portable kernel: auto takes it, and the
    // fused path runs that kernel (not the one the limits alone would pick).
    let mut table = TuningTable::new();
    table.insert(
        key_for_d8(gpu),
        TunedEntry {
            kernel: TunedKernel::Portable,
            grouped_decode: None,
            fused_ms: 1.0,
            unfused_ms: 2.0,
            decode: None,
            coop_ms: None,
            unfused_coop_ms: None,
            fast_gemm: None,
            coop_tiles: None,
        },
    );
    table.save(&cache).unwrap();
    let engine = engine_with(&cache);
    let out = engine.attention_host_blocking(&inputs, &options).unwrap();
    assert_eq!(engine.last_call().unwrap().path, KernelPath::Fused);
    assert_eq!(
        engine.gpu().unwrap().fused_kernel(8, 8).unwrap().name(),
        "attention_fused"
    );
    assert!(compare(out.y.data(), &exact.y, &plain.y, DEFAULT_FLOOR).passed());
    // At precision fast each path counts at its faster precision: unfused is
    // faster in f32 (1.5 against 2.0 ms), but the matrix-unit fused kernel
    // (0.6) beats the unfused path on the matrix units (1.0), so auto takes
    // the fused path at fast and the unfused one at highest.
    let mut table = TuningTable::new();
    table.insert(
        key_for_d8(gpu),
        TunedEntry {
            kernel: TunedKernel::Portable,
            grouped_decode: None,
            fused_ms: 2.0,
            unfused_ms: 1.5,
            decode: None,
            coop_ms: Some(0.6),
            unfused_coop_ms: Some(1.0),
            fast_gemm: None,
            coop_tiles: None,
        },
    );
    table.save(&cache).unwrap();
    let engine = engine_with(&cache);
    engine.attention_host_blocking(&inputs, &options).unwrap();
    assert_eq!(engine.last_call().unwrap().path, KernelPath::Unfused);
    let fast = AttentionOptions {
        precision: webattn::Precision::Fast,
        ..Default::default()
    };
    engine.attention_host_blocking(&inputs, &fast).unwrap();
    assert_eq!(engine.last_call().unwrap().path, KernelPath::Fused);
    // A memory-only engine reads no file.
    let memory = Engine::with_options_blocking(EngineOptions {
        backend: BackendPreference::Gpu,
        tuning_cache: TuningCache::Memory,
        ..Default::default()
    })
    .unwrap();
    assert!(memory.tuning_table().unwrap().is_empty());
    assert!(memory.tuning_cache_path().is_none());
}

#[test]
fn decode_follows_the_measured_kernel_where_it_runs() {
    let Some(gpu) = common::gpu() else { return };
    let dims = webattn::AttentionDims::plain(1, [4, 2], [1, 1024], [8, 8]);
    let plain = gpu.gpu().unwrap().decode_plan(&dims).unwrap().kernel;
    let cache = scratch("decode").join("tuning.tsv");
    let shape = StreamShape {
        lanes: 4,
        keys_per_step: 1,
        prefetch: false,
    };
    for measured in [DecodeKernel::Staged, DecodeKernel::Stream(shape)] {
        let mut table = TuningTable::new();
        table.insert(
            key_for_d8(gpu),
            TunedEntry {
                kernel: TunedKernel::Portable,
                grouped_decode: None,
                fused_ms: 1.0,
                unfused_ms: 2.0,
                decode: Some(TunedDecode {
                    kernel: measured,
                    decode_ms: 0.5,
                }),
                coop_ms: None,
                unfused_coop_ms: None,
                fast_gemm: None,
                coop_tiles: None,
            },
        );
        table.save(&cache).unwrap();
        let engine = engine_with(&cache);
        let chosen = engine.gpu().unwrap().decode_plan(&dims).unwrap().kernel;
        // The streaming kernel where the adapter has subgroups for it; the
        // limits' own choice where the measured kernel cannot run here.
        let runs = match measured {
            DecodeKernel::Staged => true,
            DecodeKernel::Stream(_) => gpu.capabilities().unwrap().stream_decode_subgroups(),
        };
        assert_eq!(chosen, if runs { measured } else { plain }, "{measured:?}");
        // Other head dims keep the limits' choice.
        let d64 = webattn::AttentionDims::plain(1, [4, 2], [1, 1024], [64, 64]);
        assert_eq!(
            engine
                .gpu()
                .unwrap()
                .decode_plan(&d64)
                .unwrap()
                .kernel
                .name(),
            gpu.gpu().unwrap().decode_plan(&d64).unwrap().kernel.name()
        );
    }
}

#[test]
fn calls_with_several_rows_per_workgroup_follow_the_grouped_winner() {
    let Some(gpu) = common::gpu() else { return };
    if !gpu.capabilities().unwrap().stream_decode_subgroups() {
        return;
    }
    let shape = StreamShape {
        lanes: 4,
        keys_per_step: 1,
        prefetch: false,
    };
    let measured = |grouped: Option<DecodeKernel>| {
        let mut table = TuningTable::new();
        table.insert(
            key_for_d8(gpu),
            TunedEntry {
                kernel: TunedKernel::Portable,
                grouped_decode: grouped.map(|kernel| TunedDecode {
                    kernel,
                    decode_ms: 0.25,
                }),
                fused_ms: 1.0,
                unfused_ms: 2.0,
                decode: Some(TunedDecode {
                    kernel: DecodeKernel::Staged,
                    decode_ms: 0.5,
                }),
                coop_ms: None,
                unfused_coop_ms: None,
                fast_gemm: None,
                coop_tiles: None,
            },
        );
        let cache = scratch(&format!("grouped-{}", grouped.is_some())).join("tuning.tsv");
        table.save(&cache).unwrap();
        engine_with(&cache)
    };
    let kernel = |engine: &Engine, heads: [usize; 2], q_len: usize| {
        let dims = webattn::AttentionDims::plain(1, heads, [q_len, 1024], [8, 8]);
        engine.gpu().unwrap().decode_plan(&dims).unwrap().kernel
    };
    let engine = measured(Some(DecodeKernel::Stream(shape)));
    // One row per workgroup: the one-row winner; several (a GQA group of 4,
    // of 2, or an MHA call with 4 query rows): the grouped winner.
    assert_eq!(kernel(&engine, [4, 4], 1), DecodeKernel::Staged);
    assert_eq!(kernel(&engine, [4, 1], 1), DecodeKernel::Stream(shape));
    assert_eq!(kernel(&engine, [4, 2], 1), DecodeKernel::Stream(shape));
    assert_eq!(kernel(&engine, [4, 4], 4), DecodeKernel::Stream(shape));
    // Without a grouped measurement (a format 8 cache), the one-row winner.
    let engine = measured(None);
    assert_eq!(kernel(&engine, [4, 1], 1), DecodeKernel::Staged);
    // And the grouped winner's calls stay right.
    let engine = measured(Some(DecodeKernel::Stream(shape)));
    let cases = [
        CaseSpec::new("grouped-decode", [2, 8, 2], [1, 700], [8, 8]),
        CaseSpec::new("grouped-decode-rows", [1, 4, 4], [3, 600], [8, 8]),
    ];
    common::run_cases(&engine, &cases, KernelPath::Fused);
}

/// Times taken without naga's runtime checks are kept apart from the checked
/// ones: an engine follows only the entries of its own setting.
#[test]
fn entries_timed_without_runtime_checks_are_followed_only_without_them() {
    let Some(gpu) = common::gpu() else { return };
    let cache = scratch("checks").join("tuning.tsv");
    let mut table = TuningTable::new();
    table.insert(
        key_for_d8(gpu).with_runtime_checks(webattn::RuntimeChecks::Off),
        TunedEntry {
            kernel: TunedKernel::Portable,
            grouped_decode: None,
            fused_ms: 1.0,
            unfused_ms: 2.0,
            decode: None,
            coop_ms: None,
            unfused_coop_ms: None,
            fast_gemm: None,
            coop_tiles: None,
        },
    );
    table.save(&cache).unwrap();
    let text = std::fs::read_to_string(&cache).unwrap();
    assert!(
        text.lines().nth(2).unwrap().ends_with("\toff\t-\t-\t-\t-"),
        "{text}"
    );
    let checked = webattn(&cache, &["info"]);
    assert!(checked.status.success());
    let checked = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.contains("nothing measured") && !checked.contains("head dims 8/8:"),
        "{checked}"
    );
    let unchecked = webattn(&cache, &["--runtime-checks", "off", "info"]);
    assert!(unchecked.status.success());
    let unchecked = String::from_utf8_lossy(&unchecked.stdout);
    assert!(unchecked.contains("head dims 8/8:"), "{unchecked}");
}

/// An engine saving its tuning keeps the entries another process saved to
/// the file since the engine read it (two tunes at once, of two adapters or
/// head dims), and its own replace the file's key by key.
#[test]
fn saving_keeps_what_another_process_saved_meanwhile() {
    let Some(gpu) = common::gpu() else { return };
    let cache = scratch("merge").join("tuning.tsv");
    let caps = gpu.capabilities().unwrap();
    let entry = |fused_ms: f64| TunedEntry {
        kernel: TunedKernel::Portable,
        grouped_decode: None,
        fused_ms,
        unfused_ms: 9.0,
        decode: None,
        coop_ms: None,
        unfused_coop_ms: None,
        fast_gemm: None,
        coop_tiles: None,
    };
    let (mine, theirs) = (TuningKey::new(caps, 8, 8), TuningKey::new(caps, 16, 16));
    let mut table = TuningTable::new();
    table.insert(mine.clone(), entry(1.0));
    table.save(&cache).unwrap();
    let engine = engine_with(&cache);
    // Another process saves its own table meanwhile: its entry for our key
    // is older than ours, its other entry new to us.
    let mut other = TuningTable::new();
    other.insert(mine.clone(), entry(5.0));
    other.insert(theirs.clone(), entry(2.0));
    other.save(&cache).unwrap();
    engine.save_tuning().unwrap();
    let saved = TuningTable::load(&cache);
    assert_eq!(saved.get(&mine).map(|e| e.fused_ms), Some(1.0));
    assert_eq!(saved.get(&theirs).map(|e| e.fused_ms), Some(2.0));
    // No temporary file is left beside it.
    let left: Vec<_> = std::fs::read_dir(cache.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}
