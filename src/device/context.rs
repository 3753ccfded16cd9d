//! Adapter and device acquisition, and the state every GPU operation shares.

use std::sync::{Arc, Mutex, PoisonError};

use crate::device::capabilities::{Capabilities, KernelLimits};
use crate::device::pipeline::PipelineCache;
use crate::error::{Error, Result};
use crate::limits::DeviceLimits;
use crate::options::{MatrixUnits, RuntimeChecks};

/// Features the kernels can use when the adapter has them; none is required.
/// Natively that includes wgpu's experimental cooperative matrices (the
/// matrix-unit kernels) unless `matrix_units` is [`MatrixUnits::Off`];
/// browsers offer none.
fn wanted_features(matrix_units: MatrixUnits) -> wgpu::Features {
    let features = wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
    #[cfg(not(target_arch = "wasm32"))]
    if matrix_units != MatrixUnits::Off {
        // Passthrough: the matrix-unit kernels' SPIR-V is written by the
        // engine on Vulkan (device::spirv says why).
        return features
            | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
            | wgpu::Features::PASSTHROUGH_SHADERS;
    }
    let _ = matrix_units;
    features
}

/// How to look for an adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PowerPreference {
    /// Let wgpu choose (`WGPU_POWER_PREF` is honoured natively).
    #[default]
    Default,
    /// Prefer an integrated or low-power adapter.
    LowPower,
    /// Prefer a discrete or high-performance adapter.
    HighPerformance,
}

/// Storage buffers the kernels bind at most in one stage (attention: Q, K,
/// V, mask, lengths, Y and its statistics).
const HOST_STORAGE_BUFFERS: u32 = 7;

/// A device with its queue, capability profile and pipeline cache.
///
/// Cloning is cheap and shares everything.
#[derive(Clone)]
pub struct GpuContext {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) caps: Arc<Capabilities>,
    pub(crate) pipelines: Arc<PipelineCache>,
    /// The timestamps of a measurement in progress on this device, shared
    /// by clones: each run started meanwhile writes them ([`crate::measure`]).
    pub(crate) measurement: Arc<Mutex<Option<Arc<crate::device::profile::Profiler>>>>,
    lost: Arc<Mutex<Option<String>>>,
    /// The clock guard of measurements on this device, shared by clones.
    pub(crate) clock_guard: Arc<Mutex<crate::device::profile::ClockGuardState>>,
    /// Buffers, dispatches and submissions given to this device so far.
    pub(crate) counters: Arc<crate::device::counters::Counters>,
    /// Readback buffers kept for the next download of a similar size.
    pub(crate) staging: Arc<crate::device::staging::StagingPool>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("adapter", &self.caps.adapter.name)
            .finish()
    }
}

/// Keeps a headless machine's stderr clean. Mesa's device-select layer (an
/// implicit Vulkan layer installed with Mesa's drivers) asks the Wayland
/// compositor which GPU is the default while the adapters are enumerated; with
/// no `XDG_RUNTIME_DIR`, libwayland prints "error: XDG_RUNTIME_DIR is invalid or
/// not set in the environment." twice. Where no display server can be reached
/// (no valid `XDG_RUNTIME_DIR`, no `WAYLAND_DISPLAY` or `DISPLAY`) and the user
/// has not asked the layer for a device (`DRI_PRIME`, `MESA_VK_DEVICE_SELECT`),
/// the layer has nothing to choose by, so it is turned off with its own switch,
/// `NODEVICE_SELECT=1`, once, before the first Vulkan instance.
#[cfg(not(target_arch = "wasm32"))]
fn quiet_headless_vulkan() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let unset = |name: &str| std::env::var_os(name).is_none_or(|v| v.is_empty());
        let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR")
            .is_some_and(|dir| std::path::Path::new(&dir).is_dir());
        let headless = !runtime_dir && unset("WAYLAND_DISPLAY") && unset("DISPLAY");
        let chosen = !unset("DRI_PRIME") || !unset("MESA_VK_DEVICE_SELECT");
        if headless && !chosen && unset("NODEVICE_SELECT") {
            log::debug!("webattn: headless machine, setting NODEVICE_SELECT=1");
            std::env::set_var("NODEVICE_SELECT", "1");
        }
    });
}

/// An instance over `backends`, with the other `WGPU_*` settings from the environment.
fn instance(backends: wgpu::Backends) -> wgpu::Instance {
    #[cfg(not(target_arch = "wasm32"))]
    quiet_headless_vulkan();
    let desc = wgpu::InstanceDescriptor::new_without_display_handle();
    #[cfg(not(target_arch = "wasm32"))]
    let desc = wgpu::InstanceDescriptor {
        flags: instance_flags(),
        ..desc.with_env()
    };
    wgpu::Instance::new(wgpu::InstanceDescriptor { backends, ..desc })
}

/// wgpu's flags for this build without shader debug info unless `WGPU_DEBUG=1`
/// asks for it: a debug build would write a source line for every statement
/// of every kernel into its SPIR-V, which naga finds by scanning the source
/// from its start each time (a third of a pipeline's creation on lavapipe),
/// and nothing here reads them. Validation stays as the build config has it.
#[cfg(not(target_arch = "wasm32"))]
fn instance_flags() -> wgpu::InstanceFlags {
    wgpu::InstanceFlags::from_build_config()
        .difference(wgpu::InstanceFlags::DEBUG)
        .with_env()
}

/// The backend sets to search, in order. Natively: the one `WGPU_BACKEND` names,
/// else the primary backends (Vulkan, Metal, DX12) and then GL, so that GL is
/// initialised only where no primary driver exists. In the browser: WebGPU.
fn backend_tiers() -> Vec<wgpu::Backends> {
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(from_env) = wgpu::Backends::from_env() {
        return vec![from_env];
    }
    #[cfg(not(target_arch = "wasm32"))]
    return vec![wgpu::Backends::PRIMARY, wgpu::Backends::SECONDARY];
    #[cfg(target_arch = "wasm32")]
    return vec![wgpu::Backends::BROWSER_WEBGPU];
}

impl GpuContext {
    /// Finds an adapter (honouring `WGPU_BACKEND` and `WGPU_ADAPTER_NAME` natively)
    /// and creates a device with the adapter's full limits and the optional
    /// features the kernels can use.
    pub async fn request(power: PowerPreference) -> Result<GpuContext> {
        Self::request_with_limits(power, &DeviceLimits::default()).await
    }

    /// Like [`GpuContext::request`], creating the device with `limits` instead of
    /// the adapter's full limits: [`DeviceLimits::webgpu_default`] gives the
    /// WebGPU defaults a browser guarantees, so native tests can run under them,
    /// and overrides lower single limits further.
    pub async fn request_with_limits(
        power: PowerPreference,
        limits: &DeviceLimits,
    ) -> Result<GpuContext> {
        Self::request_with(power, limits, MatrixUnits::Auto).await
    }

    /// Like [`GpuContext::request_with_limits`], with the matrix units as
    /// `matrix_units` asks ([`MatrixUnits::Off`] creates the device without
    /// wgpu's experimental feature).
    pub async fn request_with(
        power: PowerPreference,
        limits: &DeviceLimits,
        matrix_units: MatrixUnits,
    ) -> Result<GpuContext> {
        let power_preference = match power {
            PowerPreference::Default => wgpu::PowerPreference::from_env().unwrap_or_default(),
            PowerPreference::LowPower => wgpu::PowerPreference::LowPower,
            PowerPreference::HighPerformance => wgpu::PowerPreference::HighPerformance,
        };
        let mut adapter = Err(Error::NoAdapter("no backend was searched".into()));
        for backends in backend_tiers() {
            let instance = instance(backends);
            #[cfg(not(target_arch = "wasm32"))]
            if let Ok(found) = wgpu::util::initialize_adapter_from_env(&instance, None).await {
                adapter = Ok(found);
                break;
            }
            let options = wgpu::RequestAdapterOptions {
                power_preference,
                ..Default::default()
            };
            match instance.request_adapter(&options).await {
                Ok(found) => {
                    adapter = Ok(found);
                    break;
                }
                Err(e) => adapter = Err(Error::NoAdapter(format!("{backends:?}: {e}"))),
            }
        }
        let adapter = adapter?;
        Self::from_adapter_with(&adapter, limits, matrix_units).await
    }

    /// Creates the device on a given adapter with its full limits.
    pub async fn from_adapter(adapter: &wgpu::Adapter) -> Result<GpuContext> {
        Self::from_adapter_with_limits(adapter, &DeviceLimits::default()).await
    }

    /// Creates the device on a given adapter with `limits` resolved against the
    /// adapter's own. An override beyond the adapter's gives
    /// [`Error::InvalidOption`]; exact limits beyond it give [`Error::RequestDevice`].
    pub async fn from_adapter_with_limits(
        adapter: &wgpu::Adapter,
        limits: &DeviceLimits,
    ) -> Result<GpuContext> {
        Self::from_adapter_with(adapter, limits, MatrixUnits::Auto).await
    }

    /// Like [`GpuContext::from_adapter_with_limits`], with the matrix units
    /// as `matrix_units` asks.
    pub async fn from_adapter_with(
        adapter: &wgpu::Adapter,
        limits: &DeviceLimits,
        matrix_units: MatrixUnits,
    ) -> Result<GpuContext> {
        crate::device::capabilities::check_emulation(adapter, matrix_units)?;
        let features = adapter.features() & wanted_features(matrix_units);
        let limits = limits.resolve(&adapter.limits())?;
        #[cfg(not(target_arch = "wasm32"))]
        let experimental_features =
            if features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
                // SAFETY: wgpu marks the cooperative-matrix feature experimental
                // (its validation is incomplete). Only the matrix-unit kernels use
                // it; each is validated by naga in the test suite, written for the
                // configurations the adapter reports, and checked against the
                // oracle wherever such an adapter is at hand.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            };
        #[cfg(target_arch = "wasm32")]
        let experimental_features = wgpu::ExperimentalFeatures::disabled();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("webattn"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::RequestDevice(e.to_string()))?;

        let ctx = Self::assemble(adapter, device, queue, Some(&limits), matrix_units);
        ctx.watch_device();
        Ok(ctx)
    }

    /// Runs the engine on a device the caller made (a renderer's, an ML
    /// runtime's), with its features and limits as they are. The engine sets
    /// no callbacks on it (the caller's stay), so a lost device shows as the
    /// calls' errors, and it cannot be replaced by the engine. A device whose
    /// limits cannot bind the kernels is refused, naming the limit.
    pub fn from_wgpu(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
    ) -> Result<GpuContext> {
        let limits = device.limits();
        for (name, have, need) in [
            (
                "max_storage_buffers_per_shader_stage",
                limits.max_storage_buffers_per_shader_stage,
                HOST_STORAGE_BUFFERS,
            ),
            (
                "max_compute_invocations_per_workgroup",
                limits.max_compute_invocations_per_workgroup,
                256,
            ),
            ("max_bind_groups", limits.max_bind_groups, 1),
        ] {
            if have < need {
                return Err(Error::Limit {
                    what: "the host's wgpu device".into(),
                    needed: u64::from(need),
                    limit: u64::from(have),
                    limit_name: name,
                    hint: "request the device with at least WebGPU's default limits \
                           (wgpu::Limits::default())",
                });
            }
        }
        Ok(Self::assemble(
            adapter,
            device,
            queue,
            None,
            MatrixUnits::Auto,
        ))
    }

    /// Watches the engine's own device: a loss is recorded (the next call
    /// replaces the device), and errors outside the engine's scopes are logged.
    fn watch_device(&self) {
        let device = &self.device;
        let lost_flag = self.lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            log::error!("webattn: GPU device lost ({reason:?}): {message}");
            *lost_flag.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(format!("{reason:?}: {message}"));
        });
        // Errors outside our error scopes would otherwise panic inside wgpu.
        device.on_uncaptured_error(Arc::new(|e: wgpu::Error| {
            log::error!("webattn: uncaptured GPU error: {e}");
        }));
    }

    /// The context of a device: its capability profile (limits as the device
    /// has them, at most `requested` where the engine asked), pipeline cache
    /// and caches.
    fn assemble(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
        requested: Option<&wgpu::Limits>,
        matrix_units: MatrixUnits,
    ) -> GpuContext {
        let info = adapter.get_info();
        let lost = Arc::new(Mutex::new(None));
        let mut caps = Capabilities::new(&info, &device.limits(), device.features());
        // Browsers raise a request below WebGPU's defaults to the defaults; the
        // engine keeps to what was asked, so a small adapter can be imitated there too.
        if let Some(limits) = requested {
            caps.limits = caps.limits.at_most(&KernelLimits::from(limits));
        }
        caps.cooperative_matrix =
            crate::device::capabilities::cooperative_matrix_configs(adapter, &device, matrix_units);
        caps.unpack_f16 = adapter
            .get_downlevel_capabilities()
            .flags
            .contains(wgpu::DownlevelFlags::SHADER_F16_IN_F32);
        log::info!("webattn: using {}", caps.summary());
        GpuContext {
            pipelines: Arc::new(PipelineCache::new(
                device.clone(),
                info.backend == wgpu::Backend::Vulkan
                    && matrix_units != MatrixUnits::NagaSpirv
                    && device.features().contains(
                        wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
                            | wgpu::Features::PASSTHROUGH_SHADERS,
                    ),
            )),
            device,
            queue,
            clock_guard: Default::default(),
            counters: Default::default(),
            staging: Default::default(),
            caps: Arc::new(caps),
            measurement: Arc::new(Mutex::new(None)),
            lost,
        }
    }

    /// The wgpu device, for sharing it with the caller's own wgpu work.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The wgpu queue the engine submits to.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// The capability profile.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// Buffers created, dispatches recorded and submissions made on this
    /// device so far (read before and after a call: the difference is its cost).
    pub fn work_counts(&self) -> crate::device::counters::WorkCounts {
        self.counters.snapshot()
    }

    /// Whether the kernels keep naga's runtime checks.
    pub fn runtime_checks(&self) -> RuntimeChecks {
        self.pipelines.runtime_checks()
    }

    /// This context with its kernels compiled with or without naga's runtime
    /// checks ([`RuntimeChecks`]); it starts a pipeline cache of its own, so
    /// call it before the first dispatch. In a browser the checks stay: the
    /// browser adds its own whatever this says.
    pub fn with_runtime_checks(mut self, runtime_checks: RuntimeChecks) -> GpuContext {
        if runtime_checks != self.pipelines.runtime_checks() {
            self.pipelines = Arc::new(self.pipelines.with_runtime_checks(runtime_checks));
        }
        self
    }

    /// Device buffer memory and buffers alive, from wgpu's own counters
    /// (natively; `None` in the browser, whose WebGPU does not say).
    pub fn memory_in_use(&self) -> Option<super::counters::MemoryReading> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let hal = self.device.get_internal_counters().hal;
            Some(super::counters::MemoryReading {
                buffer_bytes: hal.buffer_memory.read().max(0) as u64,
                buffers: hal.buffers.read().max(0) as u64,
            })
        }
        #[cfg(target_arch = "wasm32")]
        None
    }

    /// The pipeline cache.
    pub fn pipelines(&self) -> &PipelineCache {
        &self.pipelines
    }

    /// Whether `buffer` was made on this context's device, where that is
    /// known at once: wgpu offers no way to ask a buffer for its device, so
    /// a one-binding bind group of it is made inside a validation scope,
    /// which wgpu-core answers before returning. `None` in the browser,
    /// whose WebGPU answers later (the JavaScript library makes its own
    /// buffers), and for buffers too small to bind.
    pub(crate) fn made_here(&self, buffer: &wgpu::Buffer) -> Option<bool> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let size = std::num::NonZeroU64::new(4).filter(|s| buffer.size() >= s.get())?;
            let layout = self
                .device
                .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("webattn: device probe"),
                    entries: &[wgpu::BindGroupLayoutEntry {
                        binding: 0,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: true },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    }],
                });
            let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
            let _probe = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("webattn: device probe"),
                layout: &layout,
                entries: &[wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer,
                        offset: 0,
                        size: Some(size),
                    }),
                }],
            });
            Some(pollster::block_on(scope.pop()).is_none())
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = buffer;
            None
        }
    }

    /// `Err(DeviceLost)` once the device has been lost.
    pub(crate) fn check_alive(&self) -> Result<()> {
        match &*self.lost.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(reason) => Err(Error::DeviceLost(reason.clone())),
            None => Ok(()),
        }
    }

    /// Waits until every submitted command has finished on the GPU.
    pub async fn finish(&self) -> Result<()> {
        let (sender, receiver) = futures_intrusive::channel::shared::oneshot_channel();
        self.queue.on_submitted_work_done(move || {
            let _ = sender.send(());
        });
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Readback(e.to_string()))?;
        receiver.receive().await;
        self.check_alive()
    }

    /// Destroys the device, as a driver reset would. Every later call fails with
    /// [`Error::DeviceLost`]. Meant for testing recovery paths.
    pub fn destroy_device(&self) {
        self.device.destroy();
        let mut lost = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        lost.get_or_insert_with(|| "Destroyed: destroy_device() was called".to_string());
    }

    /// Runs `record` inside validation and out-of-memory error scopes and turns
    /// a captured wgpu error into a typed [`Error`].
    pub(crate) async fn scoped<T>(
        &self,
        what: &str,
        record: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.check_alive()?;
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let result = record();
        let validation = validation.pop();
        let oom = oom.pop();
        let validation_error = validation.await;
        let oom_error = oom.await;
        self.check_alive()?;
        match oom_error.or(validation_error) {
            Some(e) => Err(classify(what, &e)),
            None => result,
        }
    }
}

/// Turns an error captured in a scope around `what` into a typed [`Error`].
pub(crate) fn classify(what: &str, error: &wgpu::Error) -> Error {
    // wgpu's Display is only the top line ("Validation Error"); the causes say what.
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    match error {
        wgpu::Error::OutOfMemory { .. } => Error::OutOfMemory(format!("{what}: {message}")),
        _ => Error::Gpu {
            kernel: what.to_string(),
            message,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_errors_become_typed_errors() {
        let oom = wgpu::Error::OutOfMemory {
            source: Box::new(std::io::Error::other("no memory left")),
        };
        assert!(matches!(classify("scores", &oom), Error::OutOfMemory(m) if m.contains("scores")));
        let validation = wgpu::Error::Validation {
            source: Box::new(std::io::Error::other("binding too small")),
            description: "binding too small".into(),
        };
        match classify("gemm[TRANS_A=0,TRANS_B=1]", &validation) {
            Error::Gpu { kernel, message } => {
                assert_eq!(kernel, "gemm[TRANS_A=0,TRANS_B=1]");
                assert!(message.contains("binding too small"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn kernels_carry_no_shader_debug_info_unless_asked() {
        if std::env::var_os("WGPU_DEBUG").is_none() {
            assert!(!instance_flags().contains(wgpu::InstanceFlags::DEBUG));
        }
    }
}
