//! One plan decides each call: for every route and kernel the overrides can
//! force on this adapter, the call runs exactly the kernels its plan names
//! (the pipelines it used, by name) and allocates the workspace its plan
//! states; and an explicit request wins over the engine's heuristics.

use std::collections::{BTreeSet, HashMap};

use crate::common;
use webattn::conformance::CaseSpec;
use webattn::device::pipeline::PipelineKey;
use webattn::kernels::attention::{FusedKernel, TiledTiles};
use webattn::kernels::gemm::attention::score_blocks;
use webattn::kernels::gemm::{kernel_key, GemmSpec};
use webattn::plan::overrides::{DecodeKernelChoice, FusedKernelChoice, Overrides};
use webattn::plan::{CallPlan, GpuRoute, Pieces};
use webattn::{AttentionDims, AttentionOptions, Engine, KernelPath};

/// The kernels of the attention itself a plan names (the helpers every
/// route may add, such as the mask, the softmax, the merge, a concat or a
/// conversion, aside).
fn named_kernels(
    plan: &CallPlan,
    dims: &AttentionDims,
    options: &AttentionOptions,
) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    match plan.gpu.expect("a GPU plan") {
        GpuRoute::Fused {
            decode: Some(decode),
            ..
        } => {
            names.insert(decode.key(dims, false).kernel.name().to_string());
        }
        GpuRoute::Fused { kernel, .. } => {
            names.insert(kernel.key(dims, options).kernel.name().to_string());
        }
        GpuRoute::Unfused {
            products,
            score_budget,
            ..
        } => {
            let blocks = score_blocks(
                dims.batch * dims.q_heads,
                dims.q_len,
                dims.total_len(),
                score_budget,
            )
            .expect("score blocks");
            let specs = [
                GemmSpec::attention_scores(dims, options, &blocks[0]),
                GemmSpec::attention_values(dims, &blocks[0]),
            ];
            for (kernel, spec) in products.iter().zip(&specs) {
                names.insert(kernel_key(*kernel, spec).kernel.name().to_string());
            }
        }
    }
    names
}

/// The attention kernels (fused, decode, GEMM) among `used`.
fn attention_kernels(used: &BTreeSet<String>) -> BTreeSet<String> {
    used.iter()
        .filter(|n| {
            n.starts_with("attention_") && !n.starts_with("attention_merge")
                || n.starts_with("gemm")
        })
        .cloned()
        .collect()
}

/// The pipelines whose use count rose from `before` to `after`, by kernel name.
fn used_between(
    before: &HashMap<PipelineKey, u64>,
    after: &HashMap<PipelineKey, u64>,
) -> BTreeSet<String> {
    after
        .iter()
        .filter(|(key, n)| before.get(*key).copied().unwrap_or(0) < **n)
        .map(|(key, _)| key.kernel.name().to_string())
        .collect()
}

/// Runs `case` on `engine` and checks the plan against what ran.
fn check(engine: &Engine, label: &str, case: &CaseSpec) {
    let inputs = case.generate(common::seed()).expect("inputs");
    let options = case.options.clone();
    let host = inputs.as_inputs();
    let dims = webattn::validate(&host, &options).expect("a valid case");
    let pipelines = engine.gpu().expect("a GPU engine").pipelines();
    let before = pipelines.use_counts();
    engine
        .attention_host_blocking(&host, &options)
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let used = used_between(&before, &pipelines.use_counts());
    let stats = engine.last_call().expect("the call was recorded");
    let planned = named_kernels(&stats.plan, &dims, &options);
    println!("{label}: {} ran {used:?}", stats.plan);
    assert_eq!(
        attention_kernels(&used),
        planned,
        "{label}: the plan ({}) names other kernels than ran",
        stats.plan
    );
    match stats.plan.pieces {
        Pieces::Whole => assert_eq!(
            stats.allocated_bytes, stats.plan.workspace_bytes,
            "{label}: the planned workspace is what the call allocated"
        ),
        Pieces::Cut { .. } => assert!(stats.allocated_bytes <= stats.plan.workspace_bytes),
    }
}

#[test]
fn every_forced_route_and_kernel_runs_what_its_plan_names() {
    // An engine of its own: the pipelines' use counts say what ran, and
    // tests beside it on the shared engine's device would add to them.
    let Some(base) = common::own_gpu() else {
        return;
    };
    let caps = base.capabilities().expect("a GPU engine").clone();
    let prefill =
        CaseSpec::new("plan-prefill", [1, 4, 2], [97, 130], [32, 32]).with(|o| o.is_causal = true);
    let decode = CaseSpec::new("plan-decode", [1, 4, 2], [1, 700], [32, 32]);
    let unfused = prefill.clone().with(|o| o.path = KernelPath::Unfused);
    let mut runs: Vec<(String, Overrides, &CaseSpec)> = Vec::new();
    let mut forced = |choice: FusedKernelChoice, case: &'static str| {
        let mut overrides = *base.overrides();
        if overrides.force_fused(choice, &caps).is_ok() {
            runs.push((
                format!("{choice} on {case}"),
                overrides,
                if case == "prefill" { &prefill } else { &decode },
            ));
        }
    };
    for choice in [
        FusedKernelChoice::Auto,
        FusedKernelChoice::Portable,
        FusedKernelChoice::Subgroup,
        FusedKernelChoice::Tiled,
        FusedKernelChoice::TiledShuffle,
        FusedKernelChoice::TiledChunked,
    ] {
        forced(choice, "prefill");
    }
    for choice in [
        DecodeKernelChoice::Auto,
        DecodeKernelChoice::Staged,
        DecodeKernelChoice::Stream,
    ] {
        let mut overrides = *base.overrides();
        if overrides.force_decode(choice, &caps).is_ok() {
            runs.push((format!("decode {choice}"), overrides, &decode));
        }
    }
    let mut portable = *base.overrides();
    portable.use_portable_kernels();
    runs.push(("portable kernels, prefill".into(), portable, &prefill));
    runs.push(("portable kernels, decode".into(), portable, &decode));
    runs.push(("unfused".into(), *base.overrides(), &unfused));
    runs.push(("unfused, portable kernels".into(), portable, &unfused));
    // A pinned tile of the tiled kernel, as the tuner pins its candidates.
    if let Some(tiles) = TiledTiles::for_dims(32, 32, &caps.limits) {
        let mut pinned = *base.overrides();
        pinned.pinned_fused = webattn::plan::planner::tuned_form(&FusedKernel::Tiled(tiles));
        runs.push((format!("pinned {}", tiles.key()), pinned, &prefill));
    }
    assert!(runs.len() >= 8, "too few routes ran: {}", runs.len());
    for (label, overrides, case) in &runs {
        let engine = base
            .sharing_device()
            .expect("a GPU engine")
            .with_overrides(*overrides);
        check(&engine, label, case);
    }
}

/// A call whose keys exceed one binding runs its pieces' key ranges by the
/// kernel its plan names for them, on the fused and on the unfused route.
#[test]
fn key_ranges_run_the_kernel_their_plan_names() {
    let Some(_) = common::gpu() else { return };
    let engine = Engine::with_options_blocking(webattn::EngineOptions {
        backend: webattn::BackendPreference::Gpu,
        limits: webattn::DeviceLimits::default()
            .with("max_storage_buffer_binding_size", 64 << 10)
            .unwrap(),
        tuning_cache: webattn::tuning::TuningCache::Memory,
        ..Default::default()
    })
    .expect("an engine with small bindings");
    for path in [KernelPath::Fused, KernelPath::Unfused] {
        let case = CaseSpec::new("plan-key-ranges", [1, 1, 1], [3, 3000], [16, 16])
            .with(|o| o.path = path);
        let inputs = case.generate(common::seed()).expect("inputs");
        let host = inputs.as_inputs();
        let before = engine.gpu().unwrap().pipelines().use_counts();
        engine
            .attention_host_blocking(&host, &case.options)
            .expect("the call runs");
        let used = used_between(&before, &engine.gpu().unwrap().pipelines().use_counts());
        let plan = engine.last_call().unwrap().plan;
        let ranges = plan.key_ranges.expect("key ranges planned");
        println!("{path}: {plan}; ran {used:?}");
        assert!(
            matches!(plan.pieces, Pieces::Cut { keys, .. } if keys < 3000),
            "{plan}"
        );
        let dims = webattn::validate(&host, &case.options).unwrap();
        let range_kernel = ranges.key(&dims, &case.options).kernel.name().to_string();
        assert!(
            used.contains(&range_kernel),
            "{plan}: {range_kernel} not among {used:?}"
        );
    }
}

/// A GPU path asked for by name on an engine whose auto choice was the CPU
/// backend over a software adapter runs on that adapter, and says so.
#[test]
fn an_explicit_gpu_path_runs_on_the_adapter_the_engine_passed_over() {
    let Some(gpu) = common::gpu() else { return };
    if webattn::plan::cpu_backend_over(gpu.capabilities().unwrap()).is_none() {
        println!("not a software adapter: an engine left to choose stays on it");
        return;
    }
    let engine = Engine::with_options_blocking(webattn::EngineOptions {
        tuning_cache: webattn::tuning::TuningCache::Memory,
        ..Default::default()
    })
    .expect("an engine");
    assert_eq!(
        engine.backend(),
        webattn::BackendKind::Cpu,
        "auto takes the CPU backend"
    );
    let case = CaseSpec::new("plan-explicit", [1, 2, 2], [33, 40], [16, 16])
        .with(|o| o.path = KernelPath::Fused);
    let inputs = case.generate(common::seed()).expect("inputs");
    let out = engine
        .attention_host_blocking(&inputs.as_inputs(), &case.options)
        .expect("the fused path runs on the adapter");
    let plan = engine.last_call().unwrap().plan;
    assert_eq!(plan.path, KernelPath::Fused);
    assert!(plan.gpu.is_some(), "{plan}");
    assert!(
        plan.reason
            .as_deref()
            .is_some_and(|r| r.contains("asked for by name")),
        "{plan}"
    );
    let exact = webattn::cpu::attention_exact(&inputs.as_inputs(), &case.options).unwrap();
    let plain = webattn::cpu::attention_plain_f32(&inputs.as_inputs(), &case.options).unwrap();
    let report = webattn::conformance::compare(
        out.y.data(),
        &exact.y,
        &plain.y,
        webattn::conformance::DEFAULT_FLOOR,
    );
    assert!(report.passed(), "{report:?}");
    // Auto on the same engine stays on the CPU backend.
    let auto = AttentionOptions::default();
    engine
        .attention_host_blocking(&inputs.as_inputs(), &auto)
        .unwrap();
    assert_eq!(engine.last_call().unwrap().plan.path, KernelPath::Cpu);
}
