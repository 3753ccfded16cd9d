//! `webattn info [--json] [--wgsl KERNEL]`.

use std::process::ExitCode;

use serde_json::json;
use webattn::kernels::decode::GROUPED_ROWS;
use webattn::{BackendKind, Engine};

/// Arguments of `webattn info`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Print a kernel's WGSL as the engine compiles it (the generated
    /// kernels too, with their fragments spliced in; override constants are
    /// applied by the pipeline) and nothing else.
    #[arg(long, value_name = "KERNEL", conflicts_with = "json")]
    wgsl: Option<String>,
}

pub fn run(engine_args: &super::EngineArgs, args: &Args) -> anyhow::Result<ExitCode> {
    if let Some(name) = &args.wgsl {
        let Some(kernel) = webattn::kernels::named(name) else {
            let names: Vec<&str> = webattn::kernels::all().iter().map(|k| k.name()).collect();
            anyhow::bail!(
                "no kernel is named {name:?}; the kernels: {}",
                names.join(", ")
            );
        };
        print!("{}", kernel.source());
        return Ok(ExitCode::SUCCESS);
    }
    let engine = super::adapter_engine(engine_args)?;
    let report = describe(&engine);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&engine, engine_args));
    }
    Ok(ExitCode::SUCCESS)
}

/// The report as JSON.
fn describe(engine: &Engine) -> serde_json::Value {
    let Some(caps) = engine.capabilities() else {
        return json!({
            "backend": "cpu",
            "adapter": null,
            "cpu_backend": engine.cpu_backend().describe(),
            "note": "no GPU adapter in use: the fast CPU backend computes every call (the f64 oracle on --path oracle)",
            "paths": ["cpu", "oracle"],
        });
    };
    let a = &caps.adapter;
    let l = &caps.limits;
    json!({
        "backend": "gpu",
        "adapter": {
            "name": a.name, "vendor": format!("0x{:04x}", a.vendor), "device": format!("0x{:04x}", a.device),
            "backend": a.backend, "device_type": a.device_type, "driver": a.driver, "driver_info": a.driver_info,
        },
        "limits": {
            "max_storage_buffer_binding_size": l.max_storage_buffer_binding_size,
            "max_buffer_size": l.max_buffer_size,
            "max_compute_workgroup_storage_size": l.max_compute_workgroup_storage_size,
            "max_compute_invocations_per_workgroup": l.max_compute_invocations_per_workgroup,
            "max_compute_workgroups_per_dimension": l.max_compute_workgroups_per_dimension,
            "max_storage_buffers_per_shader_stage": l.max_storage_buffers_per_shader_stage,
        },
        "features": {
            "shader_f16": caps.shader_f16,
            "subgroups": caps.subgroups,
            "subgroup_min_size": caps.subgroup_min_size,
            "subgroup_max_size": caps.subgroup_max_size,
            "timestamp_query": caps.timestamp_query,
            "cooperative_matrix": caps.cooperative_matrix.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        },
        "fused_kernel": engine.gpu().map(|_| fused_kernel(engine).0),
        "fused_kernel_forced": engine.gpu().map(|_| fused_kernel(engine).1),
        "decode_kernel": engine.gpu().map(|_| decode_kernel(engine).0),
        "decode_kernel_forced": engine.gpu().map(|_| decode_kernel(engine).1),
        "tuning_cache": engine.tuning_cache_path().map(|p| p.display().to_string()),
        "stale_tuning_entries": engine.gpu().map(|_| tuned_here(engine).1),
        "tuned": engine.gpu().map(|_| tuned_here(engine).0.iter().map(|(dk4, dv4, e)| json!({
            "head_dims": [4 * dk4, 4 * dv4], "kernel": e.kernel.name(),
            "fused_ms": e.fused_ms, "unfused_ms": e.unfused_ms,
            "decode_kernel": e.decode.map(|d| d.kernel.label()),
            "decode_ms": e.decode.map(|d| d.decode_ms),
            "grouped_decode_kernel": e.grouped_decode.map(|d| d.kernel.label()),
            "grouped_decode_ms": e.grouped_decode.map(|d| d.decode_ms),
            "coop_ms": e.coop_ms, "unfused_coop_ms": e.unfused_coop_ms,
            "fast_gemm": e.fast_gemm.map(|g| g.form.name()),
            "coop_tiles": e.coop_tiles.map(|t| t.name()),
        })).collect::<Vec<_>>()),
        "paths": engine.paths().iter().map(|p| p.name()).chain(["oracle"]).collect::<Vec<_>>(),
        "cpu_backend": engine.cpu_backend().describe(),
        "auto_backend": if webattn::plan::cpu_backend_over(caps).is_some() { "cpu" } else { "gpu" },
        "auto_reason": webattn::plan::cpu_backend_over(caps),
        "plans": sample_plans(engine).into_iter().map(|(call, plan)| json!({
            "call": call.trim(), "plan": plan,
        })).collect::<Vec<_>>(),
    })
}

/// The plans of a few typical calls on this engine, each with what it is:
/// the plan's one line, or the error that refuses it.
fn sample_plans(engine: &Engine) -> Vec<(String, String)> {
    engine
        .typical_plans()
        .into_iter()
        .map(|(call, plan)| {
            let plan = match plan {
                Ok(plan) => plan.to_string(),
                Err(e) => format!("refused: {e}"),
            };
            (call.to_string(), plan)
        })
        .collect()
}

/// The fused kernel in use at head dims 64/64 and whether `--kernel` forced it.
pub fn fused_kernel(engine: &Engine) -> (&'static str, bool) {
    let name = match engine.planner(64, 64).map(|p| p.fused_kernel()) {
        Some(Ok(kernel)) => kernel.name(),
        _ => "none at head dim 64",
    };
    // (A matrix-unit kernel forced runs only at Precision::Fast: it did not
    // force this one.)
    (name, engine.overrides().fused.name() == name)
}

/// The decode kernel (with its shape) in use for a typical decode call (one
/// token of 32 query heads over 8 KV heads of 128, 4096 cached keys) and
/// whether `--decode-kernel` forced it.
pub fn decode_kernel(engine: &Engine) -> (String, bool) {
    let dims = webattn::AttentionDims::plain(1, [32, 8], [1, 4096], [128, 128]);
    let label = engine
        .planner(128, 128)
        .and_then(|p| p.decode_layout(&dims))
        .map_or_else(|| "none".to_string(), |plan| plan.kernel.label());
    (
        label,
        engine.overrides().decode != webattn::DecodeKernelChoice::Auto,
    )
}

/// The tuning cache and what it holds for this adapter, as text lines.
fn tuning_text(engine: &Engine) -> String {
    let source = match engine.tuning_cache_path() {
        Some(path) => path.display().to_string(),
        None => "none (memory only)".to_string(),
    };
    let (mine, stale) = tuned_here(engine);
    let stale_note = match stale {
        0 => String::new(),
        n => format!(
            "  {n} entr{} for this adapter measured on other kernels (another webattn version): \
             ignored until `webattn tune` measures these\n",
            if n == 1 { "y" } else { "ies" }
        ),
    };
    if mine.is_empty() {
        return format!(
            "tuning:   {source}: nothing measured for this adapter (`webattn tune` fills it); \
             tiles are the largest that fit its limits\n{stale_note}"
        );
    }
    let mut out = format!("tuning:   {source}\n{stale_note}");
    for (dk4, dv4, entry) in mine {
        out += &format!(
            "  head dims {}/{}: {} {:.3} ms, unfused {:.3} ms: auto takes {}\n",
            4 * dk4,
            4 * dv4,
            match engine
                .planner(4 * dk4 as usize, 4 * dv4 as usize)
                .map(|p| p.fused_kernel())
            {
                Some(Ok(kernel)) if kernel.name() == entry.kernel.name() => kernel.label(),
                _ => format!("{} (not runnable here now)", entry.kernel.name()),
            },
            entry.fused_ms,
            entry.unfused_ms,
            if entry.unfused_ms < entry.fused_ms {
                "unfused"
            } else {
                "fused"
            }
        );
        if let Some(decode) = entry.decode {
            out += &format!(
                "    decode: {} {:.3} ms\n",
                decode.kernel.label(),
                decode.decode_ms
            );
        }
        if let Some(decode) = entry.grouped_decode {
            out += &format!(
                "    decode, GQA groups of {GROUPED_ROWS}: {} {:.3} ms\n",
                decode.kernel.label(),
                decode.decode_ms
            );
        }
        let verdict = |coop: f64, f32_ms: f64| if coop > f32_ms { "f32 kept" } else { "taken" };
        let mut fast = Vec::new();
        if let Some(coop) = entry.coop_ms {
            let tiles = entry
                .coop_tiles
                .map_or(String::new(), |t| format!(", tiles {}", t.name()));
            fast.push(format!(
                "fused {coop:.3} ms ({}{tiles})",
                verdict(coop, entry.fused_ms)
            ));
        }
        if let Some(unfused) = entry.unfused_coop_ms {
            let gemm = entry
                .fast_gemm
                .map_or(String::new(), |g| format!(", its GEMM {}", g.form.name()));
            fast.push(format!(
                "unfused {unfused:.3} ms ({}{gemm})",
                verdict(unfused, entry.unfused_ms)
            ));
        }
        if !fast.is_empty() {
            let (fused_ms, unfused_ms) = entry.fast_path_ms();
            let path = if unfused_ms < fused_ms {
                "unfused"
            } else {
                "fused"
            };
            out += &format!(
                "    matrix units at precision fast: {}; auto at fast takes {path}\n",
                fast.join(", ")
            );
        }
    }
    out
}

/// The tuning entries for this adapter, driver, workgroup-memory limit and
/// runtime-checks setting measured on this build's kernels, and how many
/// others were measured on other kernels.
fn tuned_here(engine: &Engine) -> (Vec<(u32, u32, webattn::tuning::TunedEntry)>, usize) {
    let Some(probe) = engine.tuning_key(4, 4) else {
        return (Vec::new(), 0);
    };
    let here: Vec<_> = engine
        .tuning_table()
        .map(|table| {
            table
                .entries()
                .filter(|(k, _)| {
                    (
                        &k.adapter,
                        &k.backend,
                        &k.driver,
                        k.workgroup_bytes,
                        k.runtime_checks,
                    ) == (
                        &probe.adapter,
                        &probe.backend,
                        &probe.driver,
                        probe.workgroup_bytes,
                        probe.runtime_checks,
                    )
                })
                .map(|(k, e)| (k.clone(), *e))
                .collect()
        })
        .unwrap_or_default();
    let stale = here
        .iter()
        .filter(|(k, _)| k.kernels != probe.kernels)
        .count();
    let current = here
        .into_iter()
        .filter(|(k, _)| k.kernels == probe.kernels)
        .map(|(k, e)| (k.dk4, k.dv4, e))
        .collect();
    (current, stale)
}

/// The report as text.
fn text(engine: &Engine, engine_args: &super::EngineArgs) -> String {
    let Some(caps) = engine.capabilities() else {
        debug_assert_eq!(engine.backend(), BackendKind::Cpu);
        return format!(
            "adapter:  none: no GPU adapter in use\n\
             backend:  CPU ({}; paths: cpu, and oracle, the f64 reference)\n",
            engine.cpu_backend().describe()
        );
    };
    let a = &caps.adapter;
    let l = &caps.limits;
    let mib = |b: u64| format!("{} MiB", b >> 20);
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut out = String::new();
    out += &format!("adapter:  {}\n", a.name);
    out += &format!(
        "          vendor 0x{:04x}, device 0x{:04x}, {} on {}\n",
        a.vendor, a.device, a.device_type, a.backend
    );
    out += &format!("driver:   {} {}\n", a.driver, a.driver_info);
    if engine_args.device_limits().is_adapter_default() {
        out += "limits:\n";
    } else {
        out += &format!("limits:   lowered: {}\n", engine_args.device_limits());
    }
    out += &format!(
        "  storage binding        {}\n",
        mib(l.max_storage_buffer_binding_size)
    );
    out += &format!("  buffer                 {}\n", mib(l.max_buffer_size));
    out += &format!(
        "  workgroup storage      {} KiB\n",
        l.max_compute_workgroup_storage_size / 1024
    );
    out += &format!(
        "  invocations/workgroup  {}\n",
        l.max_compute_invocations_per_workgroup
    );
    out += &format!(
        "  workgroups/dimension   {}\n",
        l.max_compute_workgroups_per_dimension
    );
    out += &format!(
        "  storage buffers/stage  {}\n",
        l.max_storage_buffers_per_shader_stage
    );
    out += "features:\n";
    out += &format!("  shader-f16             {}\n", yes(caps.shader_f16));
    out += &format!(
        "  subgroups              {}{}\n",
        yes(caps.subgroups),
        if caps.subgroups {
            format!(
                " (width {}..{})",
                caps.subgroup_min_size, caps.subgroup_max_size
            )
        } else {
            String::new()
        }
    );
    out += &format!("  timestamp-query        {}\n", yes(caps.timestamp_query));
    out += &format!(
        "  cooperative matrix     {}\n",
        if caps.cooperative_matrix.is_empty() {
            "no (no matrix units offered through wgpu here)".to_string()
        } else {
            format!(
                "{} (wgpu's experimental feature; {})",
                caps.cooperative_matrix
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                match webattn::kernels::matrix_units::coop_shape(caps) {
                    Some(_) => "calls with --precision fast multiply on them",
                    None => "none the kernels run on: they need f16 -> f32 at 8 or 16 with fixed-width subgroups",
                }
            )
        }
    );
    if let Some(why) = webattn::plan::cpu_backend_over(caps) {
        out += &format!("auto:     an engine left to choose runs the CPU backend: {why}\n");
    }
    out += &format!(
        "paths:    {} (auto takes the plan's path: the plans below); cpu ({}) and oracle always\n",
        engine
            .paths()
            .iter()
            .filter(|p| p.name() != "cpu")
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", "),
        engine.cpu_backend().describe()
    );
    if engine.gpu().is_some() {
        let (fused, forced) = fused_kernel(engine);
        let how = if forced {
            "forced by --kernel"
        } else {
            "chosen for this adapter; --kernel NAME forces one"
        };
        out += &format!("fused:    {fused} ({how})\n");
        let (decode, forced) = decode_kernel(engine);
        let how = if forced {
            "forced by --decode-kernel"
        } else {
            "chosen for this adapter; --decode-kernel NAME forces one"
        };
        out += &format!(
            "decode:   {decode} ({how}; shown for 32 query heads over 8 KV heads of 128)\n"
        );
        out += &tuning_text(engine);
    }
    out += "plans:    (what `attention` runs for these calls; `Engine::plan`, `last_call`)\n";
    for (call, plan) in sample_plans(engine) {
        out += &format!("  {call:<40} {plan}\n");
    }
    out
}
