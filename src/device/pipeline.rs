//! Compiled pipelines, cached by a typed key.
//!
//! A [`PipelineKey`] names a kernel and the values of its `override`
//! constants (`shader/key.rs`). Each key is compiled once per device;
//! shader modules and bind-group layouts are shared across the keys of a kernel.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::options::RuntimeChecks;
use crate::shader::kernel::{Binding, Kernel};
pub use crate::shader::key::PipelineKey;

/// A compiled compute pipeline and the bind-group layout it expects.
#[derive(Debug)]
pub struct Pipeline {
    /// The key it was compiled for.
    pub key: PipelineKey,
    /// Its label (the key's text).
    pub label: String,
    /// The pipeline.
    pub pipeline: wgpu::ComputePipeline,
    /// The layout of bind group 0.
    pub bind_group_layout: wgpu::BindGroupLayout,
    /// Whether it was built from SPIR-V the engine wrote (the matrix-unit
    /// kernels on Vulkan, `device::spirv`) rather than from WGSL by wgpu.
    pub own_spirv: bool,
}

#[derive(Default)]
struct CacheState {
    modules: HashMap<Kernel, wgpu::ShaderModule>,
    layouts: HashMap<Kernel, (wgpu::BindGroupLayout, wgpu::PipelineLayout)>,
    pipelines: HashMap<PipelineKey, Arc<Pipeline>>,
    /// How many times each pipeline was handed out ([`PipelineCache::use_counts`]).
    uses: HashMap<PipelineKey, u64>,
}

/// Compiles each pipeline once and hands out shared references.
pub struct PipelineCache {
    device: wgpu::Device,
    /// Whether the matrix-unit kernels go to the driver as SPIR-V the engine
    /// wrote (Vulkan, see `device::spirv`) rather than as WGSL.
    coop_spirv: bool,
    /// Whether the kernels keep naga's runtime checks ([`RuntimeChecks`]).
    runtime_checks: RuntimeChecks,
    state: Mutex<CacheState>,
}

impl fmt::Debug for PipelineCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineCache")
            .field("compiled", &self.compiled_keys())
            .finish()
    }
}

fn layout_entry(index: usize, binding: Binding) -> wgpu::BindGroupLayoutEntry {
    let ty = match binding {
        Binding::Uniform => wgpu::BufferBindingType::Uniform,
        Binding::Read => wgpu::BufferBindingType::Storage { read_only: true },
        Binding::ReadWrite => wgpu::BufferBindingType::Storage { read_only: false },
    };
    wgpu::BindGroupLayoutEntry {
        binding: index as u32,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty,
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    }
}

/// `key`'s kernel as a module of SPIR-V the engine wrote (`device::spirv`),
/// through wgpu's passthrough; `None` (the WGSL path then) where naga cannot
/// write it, which the test suite rules out for every planned key.
#[cfg(not(target_arch = "wasm32"))]
fn own_spirv_module(
    device: &wgpu::Device,
    key: &PipelineKey,
    zero_workgroup_memory: bool,
    checks: RuntimeChecks,
) -> Option<wgpu::ShaderModule> {
    let words = match crate::device::spirv::compile_coop_kernel(key, zero_workgroup_memory, checks)
    {
        Ok(words) => words,
        Err(e) => {
            log::error!("webattn: {key}: own SPIR-V failed, WGSL used instead: {e}");
            return None;
        }
    };
    let label = key.to_string();
    let entry_points = [wgpu::PassthroughShaderEntryPoint {
        name: key.kernel.entry_point().into(),
        workgroup_size: (0, 0, 0),
    }];
    // SAFETY: the words are naga's validated translation of our WGSL, with
    // memory operands and barrier semantics made stricter (device::spirv); the
    // bindings match the explicit layout every pipeline of the kernel uses.
    Some(unsafe {
        device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
            label: Some(&label),
            entry_points: entry_points[..].into(),
            spirv: Some(words.into()),
            ..Default::default()
        })
    })
}

#[cfg(target_arch = "wasm32")]
fn own_spirv_module(
    _device: &wgpu::Device,
    _key: &PipelineKey,
    _zero_workgroup_memory: bool,
    _checks: RuntimeChecks,
) -> Option<wgpu::ShaderModule> {
    None
}

/// `kernel`'s module, with or without naga's runtime checks.
fn shader_module(
    device: &wgpu::Device,
    kernel: Kernel,
    runtime_checks: RuntimeChecks,
) -> wgpu::ShaderModule {
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(kernel.name()),
        source: wgpu::ShaderSource::Wgsl(kernel.device_source()),
    };
    match runtime_checks {
        RuntimeChecks::On => device.create_shader_module(desc),
        RuntimeChecks::Bounds | RuntimeChecks::Off => {
            let checks = wgpu::ShaderRuntimeChecks {
                bounds_checks: runtime_checks.bounds_checks(),
                force_loop_bounding: false,
                ..wgpu::ShaderRuntimeChecks::checked()
            };
            // SAFETY: the caller asked for kernels without loop counters
            // (`Bounds`) or without any checks (`Off`), measuring aids
            // documented as such. Every loop of the engine's kernels ends
            // (their bounds are uniforms and override constants, their
            // counters only grow). Under `Off` their array indices were
            // audited (explicit clamps where a lane reads past a tile) and
            // the quick sweep passes this way in the tests, which is evidence,
            // not proof: an out-of-bounds workgroup read on lavapipe need not
            // fail. Integer division keeps its checks.
            unsafe { device.create_shader_module_trusted(desc, checks) }
        }
    }
}

impl PipelineCache {
    pub(crate) fn new(device: wgpu::Device, coop_spirv: bool) -> Self {
        Self {
            device,
            coop_spirv,
            runtime_checks: RuntimeChecks::On,
            state: Mutex::new(CacheState::default()),
        }
    }

    /// An empty cache for the same device that compiles its kernels with or
    /// without naga's runtime checks.
    pub(crate) fn with_runtime_checks(&self, runtime_checks: RuntimeChecks) -> Self {
        Self {
            device: self.device.clone(),
            coop_spirv: self.coop_spirv,
            runtime_checks,
            state: Mutex::new(CacheState::default()),
        }
    }

    /// Whether the kernels keep naga's runtime checks.
    pub fn runtime_checks(&self) -> RuntimeChecks {
        self.runtime_checks
    }

    /// The pipeline for `key`, compiling it on first use.
    pub fn get(&self, key: &PipelineKey) -> Arc<Pipeline> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match state.uses.get_mut(key) {
            Some(uses) => *uses += 1,
            None => {
                state.uses.insert(key.clone(), 1);
            }
        }
        if let Some(p) = state.pipelines.get(key) {
            return p.clone();
        }
        let kernel = key.kernel;
        let device = &self.device;
        let zero_workgroup_memory = !kernel.writes_workgroup_memory_first();
        // On Vulkan the matrix-unit kernels go to the driver as SPIR-V the
        // engine wrote, one module per key (its overrides are applied).
        let own_spirv_module = if self.coop_spirv && kernel.uses_coop() {
            own_spirv_module(device, key, zero_workgroup_memory, self.runtime_checks)
        } else {
            None
        };
        let own_spirv = own_spirv_module.is_some();
        let module = match &own_spirv_module {
            Some(module) => module.clone(),
            None => state
                .modules
                .entry(kernel)
                .or_insert_with(|| shader_module(device, kernel, self.runtime_checks))
                .clone(),
        };
        let (bind_group_layout, pipeline_layout) = state
            .layouts
            .entry(kernel)
            .or_insert_with(|| {
                let entries: Vec<_> = kernel
                    .bindings()
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| layout_entry(i, b))
                    .collect();
                let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some(kernel.name()),
                    entries: &entries,
                });
                let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some(kernel.name()),
                    bind_group_layouts: &[Some(&bgl)],
                    immediate_size: 0,
                });
                (bgl, pl)
            })
            .clone();
        let label = key.to_string();
        // The engine's own SPIR-V has its overrides applied already.
        let constants: Vec<(&str, f64)> = match own_spirv_module {
            Some(_) => Vec::new(),
            None => key
                .constants
                .iter()
                .map(|&(name, value)| (name, value as f64))
                .collect(),
        };
        // The driver compiles here: the log says how long (lavapipe's LLVM
        // takes seconds for the largest kernels).
        let started = web_time::Instant::now();
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(kernel.entry_point()),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                zero_initialize_workgroup_memory: zero_workgroup_memory,
            },
            cache: None,
        });
        log::debug!(
            "compiled pipeline {label} in {:.0} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        let compiled = Arc::new(Pipeline {
            key: key.clone(),
            label,
            pipeline,
            bind_group_layout,
            own_spirv,
        });
        state.pipelines.insert(key.clone(), compiled.clone());
        compiled
    }

    /// The keys compiled so far from SPIR-V the engine wrote, sorted.
    pub fn own_spirv_keys(&self) -> Vec<PipelineKey> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut keys: Vec<_> = state
            .pipelines
            .values()
            .filter(|p| p.own_spirv)
            .map(|p| p.key.clone())
            .collect();
        keys.sort();
        keys
    }

    /// How many times each pipeline was handed out for a dispatch so far: a
    /// measurement compares two readings to learn which kernels a call ran
    /// (`webattn phases` checks each ablated kernel ran in its own row).
    pub fn use_counts(&self) -> HashMap<PipelineKey, u64> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.uses.clone()
    }

    /// The keys compiled so far, sorted.
    pub fn compiled_keys(&self) -> Vec<PipelineKey> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut keys: Vec<_> = state.pipelines.keys().cloned().collect();
        keys.sort();
        keys
    }
}
