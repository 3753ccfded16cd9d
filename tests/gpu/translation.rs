//! Every pipeline the planner can choose (each kernel every run, its other
//! variants on a rotation of three runs), translated for every backend wgpu
//! runs on: naga's SPIR-V (Vulkan), MSL (Metal), HLSL (DX12) and GLSL ES 3.1
//! (GL) writers, with the pipeline's override constants applied first, as
//! wgpu does when it creates the pipeline. Any error fails, naming the
//! pipeline and the backend. No GPU is needed: this is what lets a Linux
//! machine vouch that the same WGSL compiles for Metal and DX12.
//!
//! The browser's own compiler (Chrome's Tint) checks the same kernels in
//! `web/tests/e2e.mjs`.

use std::collections::HashMap;

use naga::back::{glsl, hlsl, msl, spv};
use naga::valid::{Capabilities, ModuleInfo, ShaderStages, SubgroupOperationSet, Validator};
use naga::{Module, ShaderStage};
use webattn::device::pipeline::PipelineKey;
use webattn::kernels::planned as every_planned_pipeline;
use webattn::shader::kernel::Kernel;

/// A backend's writer: the bytes it wrote, or its error.
type Writer = fn(&Module, &ModuleInfo, &PipelineKey) -> Result<usize, String>;

/// The backends, as wgpu names them.
const BACKENDS: [&str; 4] = [
    "vulkan (SPIR-V 1.3)",
    "metal (MSL 2.4)",
    "dx12 (HLSL SM 6.2)",
    "gl (GLSL ES 3.10)",
];

fn parse(kernel: Kernel) -> (Module, ModuleInfo) {
    let source = kernel.source();
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("{kernel}: {}", e.emit_to_string(source)));
    let info = validator()
        .validate(&module)
        .unwrap_or_else(|e| panic!("{kernel}: {}", e.emit_to_string(source)));
    (module, info)
}

fn validator() -> Validator {
    let mut validator = Validator::new(
        naga::valid::ValidationFlags::all(),
        Capabilities::SUBGROUP
            | Capabilities::SHADER_FLOAT16
            | Capabilities::SHADER_FLOAT16_IN_FLOAT32
            | Capabilities::COOPERATIVE_MATRIX,
    );
    validator.subgroup_stages(ShaderStages::COMPUTE);
    validator.subgroup_operations(SubgroupOperationSet::all());
    validator
}

/// The module with `key`'s override constants applied, as wgpu does at
/// pipeline creation.
fn specialise(module: &Module, info: &ModuleInfo, key: &PipelineKey) -> (Module, ModuleInfo) {
    let constants: naga::back::PipelineConstants = key
        .constants
        .iter()
        .map(|&(name, value)| (name.to_string(), value as f64))
        .collect();
    let entry = Some((ShaderStage::Compute, key.kernel.entry_point()));
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(module, info, entry, &constants)
            .unwrap_or_else(|e| panic!("{key}: overrides: {e}"));
    (module.into_owned(), info.into_owned())
}

fn to_spirv(module: &Module, info: &ModuleInfo, key: &PipelineKey) -> Result<usize, String> {
    let options = spv::Options {
        lang_version: (1, 3),
        ..Default::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: ShaderStage::Compute,
        entry_point: key.kernel.entry_point().to_string(),
    };
    spv::write_vec(module, info, &options, Some(&pipeline))
        .map(|words| words.len() * 4)
        .map_err(|e| e.to_string())
}

fn to_msl(module: &Module, info: &ModuleInfo, key: &PipelineKey) -> Result<usize, String> {
    let options = msl::Options {
        lang_version: (2, 4),
        ..Default::default()
    };
    let pipeline = msl::PipelineOptions {
        entry_point: Some((ShaderStage::Compute, key.kernel.entry_point().to_string())),
        ..Default::default()
    };
    msl::write_string(module, info, &options, &pipeline)
        .map(|(text, _)| text.len())
        .map_err(|e| e.to_string())
}

fn to_hlsl(module: &Module, info: &ModuleInfo, key: &PipelineKey) -> Result<usize, String> {
    let options = hlsl::Options {
        shader_model: hlsl::ShaderModel::V6_2,
        ..Default::default()
    };
    let pipeline = hlsl::PipelineOptions {
        entry_point: Some((ShaderStage::Compute, key.kernel.entry_point().to_string())),
    };
    let mut text = String::new();
    hlsl::Writer::new(&mut text, &options, &pipeline)
        .write(module, info, None)
        .map(|_| text.len())
        .map_err(|e| e.to_string())
}

fn to_glsl(module: &Module, info: &ModuleInfo, key: &PipelineKey) -> Result<usize, String> {
    let options = glsl::Options {
        version: glsl::Version::Embedded {
            version: 310,
            is_webgl: false,
        },
        ..Default::default()
    };
    let pipeline = glsl::PipelineOptions {
        shader_stage: ShaderStage::Compute,
        entry_point: key.kernel.entry_point().to_string(),
        multiview: None,
    };
    let mut text = String::new();
    glsl::Writer::new(
        &mut text,
        module,
        info,
        &options,
        &pipeline,
        naga::proc::BoundsCheckPolicies::default(),
    )
    .and_then(|mut writer| writer.write().map(|_| ()))
    .map(|_| text.len())
    .map_err(|e| e.to_string())
}

/// Whether the planner can choose `kernel` on a backend (by its index in
/// [`BACKENDS`]): wgpu's GL backend offers no subgroup operations, so the
/// subgroup kernels never run there (`Capabilities::fixed_cpu_subgroup` needs
/// the SUBGROUP feature); wgpu offers cooperative matrices on Vulkan and
/// Metal only, so the matrix-unit kernels run nowhere else.
fn runs_on(backend: usize, kernel: Kernel) -> bool {
    match backend {
        0 | 1 => true,
        2 => !kernel.runs_with_matrix_units(),
        _ => !kernel.uses_subgroups() && !kernel.runs_with_matrix_units(),
    }
}

#[test]
fn every_planned_pipeline_translates_for_every_backend() {
    let keys = every_planned_pipeline();
    // The hot kernels also as plain calls run them (`RULES` = 0: the rules
    // applied score by score folded out), at head dims 64 and 128.
    let plain: Vec<_> = keys
        .iter()
        .filter(|key| key.kernel.is_specialised_per_call())
        .filter(|key| {
            key.constants
                .iter()
                .any(|&c| matches!(c, ("DK4", 16 | 32) | ("DKP", 64 | 128)))
        })
        .map(|key| key.clone().with("RULES", 0))
        .collect();
    assert!(!plain.is_empty());
    // Each kernel's first key, and its first as plain calls run it, every
    // run; of the other variants (GEMM transposes, tile shapes, head dims,
    // ...) a third a run, on a rotation, so that three runs translate them all.
    let turn = crate::common::rotation("the other planned pipelines", 3);
    let mut seen = std::collections::HashSet::new();
    let tagged = keys
        .iter()
        .map(|k| (k, false))
        .chain(plain.iter().map(|k| (k, true)));
    let work: Vec<_> = tagged
        .enumerate()
        .filter(|&(i, (key, as_plain))| seen.insert((key.kernel, as_plain)) || i % 3 == turn)
        .map(|(_, (key, _))| key)
        .collect();
    // Shared out over the cores: each thread parses the kernels it meets.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let translate = |first: usize| {
        let mut parsed: HashMap<Kernel, (Module, ModuleInfo)> = HashMap::new();
        let mut failures = Vec::new();
        let mut translated = [0usize; 4];
        for key in work.iter().skip(first).step_by(threads) {
            let (module, info) = parsed
                .entry(key.kernel)
                .or_insert_with(|| parse(key.kernel));
            let (module, info) = specialise(module, info, key);
            let writers: [Writer; 4] = [to_spirv, to_msl, to_hlsl, to_glsl];
            for (backend, write) in writers.iter().enumerate() {
                if !runs_on(backend, key.kernel) {
                    continue;
                }
                match write(&module, &info, key) {
                    Ok(bytes) if bytes > 0 => translated[backend] += 1,
                    Ok(_) => {
                        failures.push(format!("{key} for {}: empty output", BACKENDS[backend]))
                    }
                    Err(e) => failures.push(format!("{key} for {}: {e}", BACKENDS[backend])),
                }
            }
        }
        (failures, translated)
    };
    let parts: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| s.spawn(move || translate(t)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a translating thread finishes"))
            .collect()
    });
    let mut failures = Vec::new();
    let mut translated = [0usize; 4];
    for (f, counts) in parts {
        failures.extend(f);
        for (total, n) in translated.iter_mut().zip(counts) {
            *total += n;
        }
    }
    println!(
        "{} of {} planned pipelines and of {} more as plain calls run them",
        work.len(),
        keys.len(),
        plain.len()
    );
    for (backend, count) in BACKENDS.iter().zip(translated) {
        println!("{backend}: {count} pipelines translated");
    }
    assert!(
        failures.is_empty(),
        "{} translation failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Every kernel of the registry took part.
    for kernel in webattn::kernels::all() {
        assert!(
            work.iter().any(|k| k.kernel == kernel),
            "{kernel} was not translated"
        );
    }
}

#[test]
fn the_subgroup_kernels_are_never_planned_without_subgroups() {
    use webattn::{AdapterSummary, Capabilities, KernelLimits};
    // A GL adapter on llvmpipe: CPU-backed, but wgpu's GL backend has no subgroups.
    let caps = Capabilities {
        adapter: AdapterSummary {
            name: "llvmpipe (LLVM 15.0.6, 256 bits)".into(),
            vendor: 0,
            device: 0,
            device_type: "Cpu".into(),
            backend: "Gl".into(),
            driver: String::new(),
            driver_info: String::new(),
        },
        limits: KernelLimits::WEBGPU_DEFAULTS,
        shader_f16: false,
        unpack_f16: true,
        subgroups: false,
        subgroup_min_size: 8,
        subgroup_max_size: 8,
        timestamp_query: false,
        cooperative_matrix: Vec::new(),
    };
    assert_eq!(caps.fixed_cpu_subgroup(), None);
    let overrides = webattn::plan::overrides::Overrides::default();
    for dims in [
        webattn::AttentionDims::plain(1, [8, 8], [1024, 1024], [64, 64]),
        webattn::AttentionDims::plain(1, [32, 8], [1, 4096], [128, 128]),
        webattn::AttentionDims::plain(1, [2, 2], [256, 256], [512, 512]),
    ] {
        for path in [webattn::KernelPath::Auto, webattn::KernelPath::Unfused] {
            let planner = webattn::plan::planner::Planner {
                caps: &caps,
                overrides: &overrides,
                tuned: None,
                dk: dims.head_dim,
                dv: dims.v_head_dim,
            };
            let options = webattn::AttentionOptions {
                path,
                ..Default::default()
            };
            let plan = webattn::plan::plan_call(Some(&planner), u64::MAX, &dims, &options)
                .expect("a plan");
            let text = plan.to_string();
            assert!(
                !text.contains("gemm_sg")
                    && !text.contains("attention_sg")
                    && !text.contains("stream"),
                "{text}: a subgroup kernel planned on an adapter without subgroups"
            );
        }
    }
}

/// Bytes of workgroup memory a specialised module declares, as naga lays
/// out its types.
fn workgroup_bytes(module: &Module) -> u32 {
    let mut layouter = naga::proc::Layouter::default();
    layouter
        .update(module.to_ctx())
        .expect("a validated module lays out");
    module
        .global_variables
        .iter()
        .filter(|(_, var)| var.space == naga::AddressSpace::WorkGroup)
        .map(|(_, var)| layouter[var.ty].size)
        .sum()
}

#[test]
fn the_tiled_kernels_workgroup_memory_is_what_the_host_counts() {
    // The planner takes a tile shape where `workgroup_bytes` fits the
    // adapter's limit: counting less than the kernel declares would make a
    // pipeline wgpu refuses, counting more would leave shapes out.
    use webattn::kernels::attention::tiled::TiledTiles;
    let mut parsed: HashMap<Kernel, (Module, ModuleInfo)> = HashMap::new();
    let mut checked = 0;
    for (dk, dv) in [(1, 1), (7, 5), (64, 64), (100, 36), (128, 128), (256, 256)] {
        for tiles in TiledTiles::candidates(dk, dv) {
            let key = tiles.key();
            let (module, info) = parsed
                .entry(key.kernel)
                .or_insert_with(|| parse(key.kernel));
            let (module, _) = specialise(module, info, &key);
            assert_eq!(
                workgroup_bytes(&module),
                tiles.workgroup_bytes(),
                "{key} ({})",
                tiles.describe()
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked} shapes checked");
}
