//! The tuner and its cache: `webattn tune` measures and writes the cache, later
//! engines follow it (kernel and path), and a corrupt or stale cache is ignored
//! with a warning and rebuilt, never a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use webattn::conformance::{compare, CaseSpec, DEFAULT_FLOOR};
use webattn::cpu;
use webattn::kernels::decode::{DecodeKernel, StreamShape};
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
    // Not this format: set aside beside it, with one warning.
    assert!(
        stderr.contains("tuning cache") && stderr.contains("set aside"),
        "{stderr}"
    );
    assert!(cache.with_file_name("tuning.tsv.old").exists());
    assert!(String::from_utf8_lossy(&info.stdout).contains("nothing measured"));
    let tune = webattn(&cache, &["tune", "--head-dims", "8"]);
    assert!(tune.status.success());
    let text = std::fs::read_to_string(&cache).unwrap();
    assert!(text.starts_with(HEADER), "{text}");
    assert_eq!(TuningTable::parse(&text).0.len(), 1);
}

/// An entry where the portable kernel measured 1 ms fused against 2 ms
/// unfused, nothing else measured.
fn portable_entry() -> TunedEntry {
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
    }
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
            ..portable_entry()
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
    assert_eq!(call.plan.path, KernelPath::Unfused);
    assert!(call
        .plan
        .reason
        .unwrap_or_default()
        .contains("webattn tune"));
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
    table.insert(key_for_d8(gpu), portable_entry());
    table.save(&cache).unwrap();
    let engine = engine_with(&cache);
    let out = engine.attention_host_blocking(&inputs, &options).unwrap();
    assert_eq!(engine.last_call().unwrap().plan.path, KernelPath::Fused);
    assert_eq!(
        engine.planner(8, 8).unwrap().fused_kernel().unwrap().name(),
        "attention_fused"
    );
    assert!(compare(out.y.data(), &exact.y, &plain.y, DEFAULT_FLOOR).passed());
    // At precision fast each path counts as it runs here. An adapter without
    // matrix units (as the CI's lavapipe) runs both in f32, so the entry's
    // matrix-unit times (fused 0.6, unfused 1.0) do not apply: unfused (1.5
    // against 2.0 in f32) at both precisions. (`tests/matrix_units.rs`
    // checks the same entry where the matrix units run: fused at fast.)
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
    let fast = AttentionOptions {
        precision: webattn::Precision::Fast,
        ..Default::default()
    };
    let has_units =
        webattn::kernels::matrix_units::coop_shape(engine.capabilities().unwrap()).is_some();
    for (options, want) in [
        (&options, KernelPath::Unfused),
        (
            &fast,
            if has_units {
                KernelPath::Fused
            } else {
                KernelPath::Unfused
            },
        ),
    ] {
        engine.attention_host_blocking(&inputs, options).unwrap();
        assert_eq!(
            engine.last_call().unwrap().plan.path,
            want,
            "{:?}",
            options.precision
        );
    }
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
    let plain = gpu
        .planner(dims.head_dim, dims.v_head_dim)
        .unwrap()
        .decode_layout(&dims)
        .unwrap()
        .kernel;
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
        let chosen = engine
            .planner(dims.head_dim, dims.v_head_dim)
            .unwrap()
            .decode_layout(&dims)
            .unwrap()
            .kernel;
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
                .planner(d64.head_dim, d64.v_head_dim)
                .unwrap()
                .decode_layout(&d64)
                .unwrap()
                .kernel
                .name(),
            gpu.planner(d64.head_dim, d64.v_head_dim)
                .unwrap()
                .decode_layout(&d64)
                .unwrap()
                .kernel
                .name()
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
        engine
            .planner(dims.head_dim, dims.v_head_dim)
            .unwrap()
            .decode_layout(&dims)
            .unwrap()
            .kernel
    };
    let engine = measured(Some(DecodeKernel::Stream(shape)));
    // One row per workgroup: the one-row winner; several (a GQA group of 4,
    // of 2, or an MHA call with 4 query rows): the grouped winner.
    assert_eq!(kernel(&engine, [4, 4], 1), DecodeKernel::Staged);
    assert_eq!(kernel(&engine, [4, 1], 1), DecodeKernel::Stream(shape));
    assert_eq!(kernel(&engine, [4, 2], 1), DecodeKernel::Stream(shape));
    assert_eq!(kernel(&engine, [4, 4], 4), DecodeKernel::Stream(shape));
    // Without a grouped measurement, the one-row winner.
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
        portable_entry(),
    );
    table.save(&cache).unwrap();
    let text = std::fs::read_to_string(&cache).unwrap();
    assert!(
        text.lines().nth(2).unwrap().contains("\toff\t-\t-\t-\t-\t"),
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

/// An entry measured on other kernels (another webattn version: the key's
/// fingerprint of the kernels' WGSL differs) chooses nothing, and `info`
/// says it is there; the same entry under this build's fingerprint is
/// followed.
#[test]
fn entries_measured_on_other_kernels_are_ignored() {
    let Some(gpu) = common::gpu() else { return };
    let cache = scratch("kernels").join("tuning.tsv");
    let entry = portable_entry();
    let current = key_for_d8(gpu);
    assert!(current.is_current());
    assert_eq!(current.kernels, webattn::kernels::fingerprint());
    let mut old = current.clone();
    old.kernels = "0123456789abcdef".into();
    assert!(!old.is_current());
    let mut table = TuningTable::new();
    table.insert(old.clone(), entry);
    table.save(&cache).unwrap();
    let text = std::fs::read_to_string(&cache).unwrap();
    assert!(
        text.lines().nth(2).unwrap().ends_with("\t0123456789abcdef"),
        "{text}"
    );
    // The stale entry names the portable kernel; calls keep the planner's.
    let planned = gpu.planner(8, 8).unwrap().fused_kernel().unwrap().name();
    assert_eq!(
        engine_with(&cache)
            .planner(8, 8)
            .unwrap()
            .fused_kernel()
            .unwrap()
            .name(),
        planned
    );
    let info = webattn(&cache, &["info"]);
    assert!(info.status.success());
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.contains("nothing measured")
            && info.contains("1 entry for this adapter measured on other kernels"),
        "{info}"
    );
    // A measurement on this build's kernels replaces the class's old entry,
    // in the table and, on save, in the file.
    let engine = engine_with(&cache);
    engine.record_tuning(current.clone(), entry);
    engine.save_tuning().unwrap();
    let (saved, _) = TuningTable::parse(&std::fs::read_to_string(&cache).unwrap());
    assert_eq!(saved.len(), 1);
    assert_eq!(saved.get(&current), Some(&entry));
    let info = webattn(&cache, &["info"]);
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.contains("head dims 8/8:") && !info.contains("other kernels"),
        "{info}"
    );
    assert_eq!(
        engine_with(&cache)
            .planner(8, 8)
            .unwrap()
            .fused_kernel()
            .unwrap()
            .name(),
        "attention_fused"
    );
}

/// An engine saving its tuning writes what it changed since it read the
/// file, nothing more: another process's entries saved meanwhile (a tune of
/// another adapter or head dim at the same time), new keys or newer
/// measurements of keys the engine also holds, are kept; the engine's own new
/// measurements replace the file's; an entry it dropped is removed where
/// nobody replaced it.
#[test]
fn saving_writes_what_the_engine_changed_and_keeps_what_others_saved() {
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
    let key = |d: usize| TuningKey::new(caps, d, d);
    let mut table = TuningTable::new();
    table.insert(key(8), entry(1.0));
    table.insert(key(12), entry(1.5));
    table.insert(key(20), entry(4.0));
    table.save(&cache).unwrap();
    let engine = engine_with(&cache);
    // Another process saves meanwhile: a newer measurement of d 8, a new
    // d 16; it leaves d 12 and d 20 as they were.
    let mut other = TuningTable::new();
    other.insert(key(8), entry(5.0));
    other.insert(key(12), entry(1.5));
    other.insert(key(16), entry(2.0));
    other.insert(key(20), entry(4.0));
    other.save(&cache).unwrap();
    // This engine re-measures d 12 and drops d 20 (as the planner drops a
    // stale entry).
    engine.record_tuning(key(12), entry(0.5));
    engine.tuning().lock().unwrap().remove(&key(20));
    engine.save_tuning().unwrap();
    let saved = TuningTable::load(&cache);
    let ms = |d: usize| saved.get(&key(d)).map(|e| e.fused_ms);
    assert_eq!(ms(8), Some(5.0), "the other process's newer d 8 was lost");
    assert_eq!(ms(16), Some(2.0), "the other process's d 16 was lost");
    assert_eq!(ms(12), Some(0.5), "this engine's d 12 was not written");
    assert_eq!(ms(20), None, "the dropped d 20 came back");
    // No temporary file is left beside it.
    let left: Vec<_> = std::fs::read_dir(cache.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
}
