//! The engine: one backend (a GPU device, or the CPU), tensors tied to it, and
//! the attention call that validates, picks a path and dispatches.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::cpu;
use crate::cpu::fast::CpuBackend;
use crate::device::buffer;
use crate::device::capabilities::Capabilities;
use crate::device::chunks;
use crate::device::chunks::Held;
use crate::device::context::{GpuContext, PowerPreference};
use crate::device::scope::Run;
use crate::device_tensor::{Mask, Storage, Tensor};
use crate::engine::devices::{DeviceRecipe, GpuDevices};
use crate::error::{Error, Result};
use crate::kernels::softmax::MASKED;
use crate::limits::DeviceLimits;
use crate::options::{AttentionOptions, KernelPath};
use crate::plan::overrides::{DecodeKernelChoice, FusedKernelChoice, Overrides};
use crate::plan::planner::PlanInputs;
use crate::plan::CallPlan;
use crate::problem::{validate, AttentionDims, AttentionInputs, AttentionOutputs};
use crate::tensor::{DType, HostMask, HostTensor};

mod backward;
mod bf16;
mod call_cache;
mod devices;
mod gpu_call;
mod prepared;
mod write;

pub use prepared::PreparedAttention;

/// Which backend an engine computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// A GPU adapter through wgpu (Vulkan, Metal, DX12, GL or browser WebGPU).
    Gpu,
    /// The CPU: the fast f32 backend (and the f64 oracle on request), used
    /// when no adapter exists or when asked for.
    Cpu,
}

/// Which backend to ask for when creating an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendPreference {
    /// A GPU if one exists, else the CPU with a logged warning; and the CPU
    /// backend, not the adapter, where the only adapter is a CPU
    /// implementation (lavapipe, SwiftShader, WARP: several times slower on
    /// the same cores; [`Engine::cpu_reason`] says so) unless an option asks
    /// for what only the adapter does (a kernel, portable kernels, matrix
    /// units, limits, runtime checks). An option the adapter cannot honour (a
    /// limit beyond it, a kernel or matrix units it lacks) is an error, not a
    /// fallback.
    #[default]
    Auto,
    /// A GPU, or [`Error::NoAdapter`].
    Gpu,
    /// The CPU, without looking for an adapter.
    Cpu,
}

/// How to create an [`Engine`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineOptions {
    /// Which backend.
    pub backend: BackendPreference,
    /// Which adapter to prefer.
    pub power: PowerPreference,
    /// Most bytes of attention scores the unfused path materialises at once
    /// (`None`: as much as one storage binding allows). Smaller values make it
    /// work in more, smaller chunks.
    pub score_budget_bytes: Option<u64>,
    /// Device limits to request: the default takes the adapter's full limits;
    /// [`DeviceLimits::webgpu_default`] runs under the WebGPU defaults that every
    /// browser guarantees, and overrides lower single limits by name, so one
    /// machine can behave as a small adapter. A limit beyond the adapter's is an
    /// error.
    pub limits: DeviceLimits,
    /// Use only the kernels that need no subgroups (tiled GEMM, portable fused
    /// attention), as on adapters without subgroups. Off: chosen from the
    /// adapter's capability profile.
    pub portable_kernels: bool,
    /// Whether the device uses the adapter's matrix units for calls with
    /// [`crate::Precision::Fast`]: where offered (default), never (`Off`:
    /// wgpu's experimental feature is not requested), or `Emulated16`, a
    /// testing aid for CPU adapters ([`crate::MatrixUnits`]).
    pub matrix_units: crate::options::MatrixUnits,
    /// Whether the kernels keep naga's runtime checks (index clamps, loop
    /// counters; the default), only the clamps, or are compiled without them
    /// natively; the last two are measuring aids ([`crate::RuntimeChecks`]).
    pub runtime_checks: crate::options::RuntimeChecks,
    /// The fused kernel to use (default: chosen from the adapter's profile);
    /// forcing one runs it wherever the adapter can, e.g. to check a kernel on
    /// lavapipe that a GPU would pick. A kernel the adapter cannot run is an
    /// error when the engine is created.
    pub fused_kernel: crate::plan::overrides::FusedKernelChoice,
    /// The decode kernel to use for calls of a few query rows over many keys
    /// (default: chosen from the adapter's profile and the tuning table);
    /// forcing the streaming kernel on an adapter without subgroups of 4
    /// lanes or more is an error when the engine is created.
    pub decode_kernel: crate::plan::overrides::DecodeKernelChoice,
    /// Where the tuning table (`webattn tune`'s measured kernel and path
    /// choices) comes from: by default the user's cache file natively
    /// (`$WEBATTN_TUNING_CACHE`, else `~/.cache/webattn/tuning.tsv`), memory in
    /// the browser. Without an entry for the adapter and head dims, the kernel
    /// is chosen from the adapter's limits alone.
    pub tuning_cache: crate::tuning::TuningCache,
    /// Threads the fast CPU backend uses (`None`: one per available core;
    /// always one on wasm32). It runs every call of a CPU engine and
    /// [`KernelPath::Cpu`] calls of a GPU engine.
    pub cpu_threads: Option<usize>,
}

#[derive(Debug)]
enum Backend {
    Gpu(Box<GpuDevices>),
    Cpu,
}

static NEXT_ENGINE_ID: AtomicU64 = AtomicU64::new(1);

/// An engine's identity and its device generation: buffers made under one key
/// are valid exactly as long as the key is the engine's current one.
pub(crate) type DeviceKey = (u64, u64);

/// What one attention call did on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallStats {
    /// The plan the call ran: its path, kernels, pieces and reasons.
    pub plan: CallPlan,
    /// Device memory the call allocated: outputs and scratch (not the inputs).
    pub allocated_bytes: u64,
    /// Pieces the call ran in: 1 when every tensor fits one storage binding,
    /// more when the call was cut into pieces that do (`run/split.rs`).
    pub pieces: usize,
    /// Bytes of f32 scratch the call widened f16 inputs into (0 when it had
    /// none, or when its kernel read them as f16 in place, as decode does).
    pub widened_bytes: u64,
}

/// The attention engine. Create one per device and keep it: pipelines are
/// compiled once per engine and tensors stay on its device between calls.
#[derive(Debug)]
pub struct Engine {
    id: u64,
    backend: Backend,
    score_budget: u64,
    cpu: CpuBackend,
    last_call: Mutex<Option<CallStats>>,
    /// The plan of the last backward call.
    last_backward: Mutex<Option<crate::plan::backward::BackwardPlan>>,
    /// The tuning cache file the table was read from and is saved to.
    tuning_path: Option<std::path::PathBuf>,
    /// Why an engine left to choose runs on the CPU backend.
    cpu_reason: Option<String>,
    /// The table as last read from or written to that file: what this
    /// engine changed since is what a save writes (see [`Engine::save_tuning`]).
    tuning_base: Mutex<crate::tuning::TuningTable>,
    /// The workspaces of recent calls, kept by their plan.
    call_cache: call_cache::CallCache,
    /// What the engine plans with besides the adapter: its overrides and
    /// tuning table.
    plan_inputs: PlanInputs,
    /// The software adapter an engine left to choose passed over for the
    /// CPU backend, kept as a GPU engine of its own: calls that ask for a
    /// GPU path by name run there.
    adapter: Option<Box<Engine>>,
}

impl Engine {
    /// A GPU engine on the default adapter, or a CPU engine (with a logged
    /// warning) when no adapter exists.
    pub async fn new() -> Engine {
        match Self::with_options(EngineOptions::default()).await {
            Ok(engine) => engine,
            Err(e) => {
                log::warn!("webattn: {e}; falling back to the CPU backend");
                Self::cpu()
            }
        }
    }

    /// An engine as `options` ask.
    pub async fn with_options(options: EngineOptions) -> Result<Engine> {
        use crate::plan::overrides::FusedKernelChoice;
        let forced = options.fused_kernel != FusedKernelChoice::Auto;
        if forced && options.backend == BackendPreference::Cpu {
            return Err(Error::InvalidOption {
                name: "kernel",
                value: options.fused_kernel.name().to_string(),
                reason: "names a GPU kernel, but the engine was asked to run on the CPU backend",
            });
        }
        if options.portable_kernels && options.fused_kernel == FusedKernelChoice::Subgroup {
            return Err(Error::InvalidOption {
                name: "kernel",
                value: options.fused_kernel.name().to_string(),
                reason: "needs subgroups, but portable_kernels asks for none",
            });
        }
        if options.decode_kernel != DecodeKernelChoice::Auto
            && options.backend == BackendPreference::Cpu
        {
            return Err(Error::InvalidOption {
                name: "decode kernel",
                value: options.decode_kernel.name().to_string(),
                reason: "names a GPU kernel, but the engine was asked to run on the CPU backend",
            });
        }
        if options.portable_kernels && options.decode_kernel == DecodeKernelChoice::Stream {
            return Err(Error::InvalidOption {
                name: "decode kernel",
                value: options.decode_kernel.name().to_string(),
                reason: "needs subgroups, but portable_kernels asks for none",
            });
        }
        let forced = forced || options.decode_kernel != DecodeKernelChoice::Auto;
        let recipe = DeviceRecipe {
            power: options.power,
            limits: options.limits.clone(),
            matrix_units: options.matrix_units,
            runtime_checks: options.runtime_checks,
        };
        let plan_inputs = PlanInputs {
            overrides: Overrides::default(),
            tuning: Arc::new(Mutex::new(options.tuning_cache.load())),
        };
        // The engine's overrides, checked against the adapter it runs on.
        let gpu_engine = |ctx: GpuContext| -> Result<Engine> {
            let caps = ctx.capabilities().clone();
            let mut engine = Self::with_backend(
                Backend::Gpu(Box::new(GpuDevices::new(ctx, Some(recipe.clone())))),
                options.score_budget_bytes,
            );
            engine.plan_inputs = plan_inputs.clone();
            let overrides = &mut engine.plan_inputs.overrides;
            if options.portable_kernels {
                overrides.use_portable_kernels();
            }
            overrides.force_fused(options.fused_kernel, &caps)?;
            overrides.force_decode(options.decode_kernel, &caps)?;
            Ok(engine)
        };
        // Options only an adapter honours keep an engine left to choose on it.
        let asks_adapter = forced
            || options.portable_kernels
            || options.matrix_units != crate::options::MatrixUnits::default()
            || options.runtime_checks != crate::options::RuntimeChecks::default()
            || !options.limits.is_adapter_default();
        let mut engine = match options.backend {
            BackendPreference::Cpu => Self::with_backend(Backend::Cpu, options.score_budget_bytes),
            BackendPreference::Gpu => gpu_engine(recipe.request().await?)?,
            BackendPreference::Auto => match recipe.request().await {
                Ok(ctx) => match crate::plan::cpu_backend_over(ctx.capabilities()) {
                    Some(why) if !asks_adapter => {
                        log::info!("webattn: using the CPU backend: {why}");
                        let mut engine =
                            Self::with_backend(Backend::Cpu, options.score_budget_bytes);
                        engine.cpu_reason = Some(why);
                        engine.adapter = Some(Box::new(gpu_engine(ctx)?));
                        engine
                    }
                    _ => gpu_engine(ctx)?,
                },
                // A kernel was asked for by name: without an adapter that can
                // run it, say so rather than fall back to the CPU.
                Err(e) if forced => return Err(e),
                // An option the adapter cannot honour is the caller's to fix.
                Err(e @ Error::InvalidOption { .. }) => return Err(e),
                Err(e) => {
                    log::warn!("webattn: {e}; using the CPU backend");
                    let mut engine = Self::with_backend(Backend::Cpu, options.score_budget_bytes);
                    engine.cpu_reason = Some(format!("no GPU adapter: {e}"));
                    engine
                }
            },
        };
        engine.cpu = CpuBackend::new(options.cpu_threads);
        engine.tuning_path = options.tuning_cache.path();
        engine.plan_inputs.tuning = plan_inputs.tuning.clone();
        if let Some(adapter) = &mut engine.adapter {
            adapter.tuning_path = engine.tuning_path.clone();
        }
        if let Some(table) = engine.tuning_table() {
            *engine
                .tuning_base
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = table;
        }
        Ok(engine)
    }

    /// A CPU engine.
    pub fn cpu() -> Engine {
        Self::with_backend(Backend::Cpu, None)
    }

    /// A GPU engine on an existing context. Such an engine cannot replace a
    /// lost device by itself: it does not know how the device was made.
    pub fn from_context(ctx: GpuContext) -> Engine {
        Self::with_backend(Backend::Gpu(Box::new(GpuDevices::new(ctx, None))), None)
    }

    /// A GPU engine on the caller's own wgpu device (see
    /// [`GpuContext::from_wgpu`]): tensors can wrap the caller's buffers
    /// ([`Engine::wrap_buffer`]) and prepared calls record into its encoders
    /// ([`crate::PreparedAttention::record`]).
    pub fn from_wgpu(
        adapter: &wgpu::Adapter,
        device: wgpu::Device,
        queue: wgpu::Queue,
    ) -> Result<Engine> {
        Ok(Self::from_context(GpuContext::from_wgpu(
            adapter, device, queue,
        )?))
    }

    /// The caller's buffer (of this engine's device, made with
    /// `BufferUsages::STORAGE`) as a tensor of `shape` and `dtype` (f16
    /// packed two to a 4-byte word), with no copy: a call reads it in place.
    pub fn wrap_buffer(
        &self,
        buffer: wgpu::Buffer,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        self.wrap_buffer_at(buffer, 0, shape, dtype)
    }

    /// [`Engine::wrap_buffer`] for a tensor that starts `offset` bytes into
    /// the buffer (a multiple of 4; e.g. Q, K and V of one fused projection).
    /// A call copies such a tensor into its workspace on the device first
    /// (kernels bind whole buffers; the buffer needs `COPY_SRC`), and
    /// [`crate::PreparedAttention::record_into`] writes outputs there in place.
    pub fn wrap_buffer_at(
        &self,
        buffer: wgpu::Buffer,
        offset: u64,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor> {
        if !offset.is_multiple_of(4) {
            return Err(Error::Conflict(
                "a wrapped tensor starts at a multiple of 4 bytes",
            ));
        }
        if offset > 0 && !buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(Error::Conflict(
                "a buffer wrapped at an offset needs BufferUsages::COPY_SRC: \
                 calls copy the tensor out of it",
            ));
        }
        if self.gpu().is_none() {
            return Err(Error::Conflict(
                "a CPU engine has no device to read the buffer from",
            ));
        }
        if !buffer.usage().contains(wgpu::BufferUsages::STORAGE) {
            return Err(Error::Conflict(
                "a wrapped buffer needs BufferUsages::STORAGE (and COPY_SRC/COPY_DST \
                 where calls copy it: caches, pieces of large calls)",
            ));
        }
        let numel = crate::tensor::checked_numel("the wrapped buffer", shape)?;
        let bytes = match dtype {
            DType::F16 => numel.div_ceil(2) as u64 * 4,
            DType::F32 => numel as u64 * 4,
            _ => return Err(Error::Conflict("a wrapped buffer holds f32 or f16 values")),
        };
        if buffer.size() < bytes.saturating_add(offset) {
            return Err(Error::Limit {
                what: format!("a {dtype} tensor of shape {shape:?} from byte {offset}"),
                needed: bytes.saturating_add(offset),
                limit: buffer.size(),
                limit_name: "the wrapped buffer's size in bytes",
                hint: "wrap a buffer that holds the whole tensor",
            });
        }
        if let Some(ctx) = self.gpu() {
            if ctx.made_here(&buffer) == Some(false) {
                return Err(Error::ForeignBuffer {
                    buffer: format!(
                        "the buffer of {} bytes wrapped as a {dtype} tensor of shape {shape:?}",
                        buffer.size()
                    ),
                    device: ctx.capabilities().summary(),
                });
            }
        }
        let mut tensor = self.wrap_gpu_as(shape.to_vec(), buffer, dtype);
        if offset > 0 {
            if let Storage::Gpu(buffer) = tensor.storage {
                tensor.storage = Storage::GpuAt(buffer, offset);
            }
        }
        Ok(tensor)
    }

    /// Which device a GPU engine runs on: 0 for its first, one more each time
    /// it replaced a lost device. `None` on a CPU engine.
    pub fn device_generation(&self) -> Option<u64> {
        match &self.backend {
            Backend::Gpu(gpu) => Some(gpu.generation()),
            Backend::Cpu => None,
        }
    }

    /// Replaces a lost GPU device with a fresh one requested as the first was
    /// (power preference, limits, kernel set), and says whether it did. Every
    /// async call does this first, so the call after a loss runs on a fresh
    /// device; tensors of the lost device then report [`Error::TensorLost`].
    /// Fails with [`Error::DeviceLost`] when no fresh device can be made, or
    /// when the engine was made from a caller's context.
    pub async fn recover(&self) -> Result<bool> {
        match &self.backend {
            Backend::Gpu(gpu) => gpu.recover().await,
            Backend::Cpu => Ok(false),
        }
    }

    fn with_backend(backend: Backend, score_budget: Option<u64>) -> Engine {
        Engine {
            id: NEXT_ENGINE_ID.fetch_add(1, Ordering::Relaxed),
            backend,
            score_budget: score_budget.unwrap_or(u64::MAX),
            cpu: CpuBackend::default(),
            last_call: Mutex::new(None),
            last_backward: Mutex::new(None),
            tuning_path: None,
            tuning_base: Mutex::new(crate::tuning::TuningTable::new()),
            cpu_reason: None,
            call_cache: call_cache::CallCache::default(),
            plan_inputs: PlanInputs::default(),
            adapter: None,
        }
    }

    /// How many recent calls' workspaces [`Engine::attention`] keeps for the
    /// next call of the same plan (parameter blocks, scratch buffers and bind
    /// groups; never outputs), and the device bytes they hold. Only small
    /// workspaces are kept, of at most eight calls.
    pub fn kept_workspaces(&self) -> (usize, u64) {
        self.call_cache.held()
    }

    /// Frees the kept workspaces ([`Engine::kept_workspaces`]) and the
    /// readback buffers kept for downloads (at most four of up to 16 MiB);
    /// the next call of each shape makes its own again.
    pub fn free_kept_workspaces(&self) {
        self.call_cache.clear();
        if let Backend::Gpu(gpu) = &self.backend {
            gpu.current().staging.clear();
        }
    }

    /// Why this engine runs on the CPU backend though it was left to choose
    /// (`BackendPreference::Auto`): no adapter, or one that is a CPU
    /// implementation ([`crate::plan::cpu_backend_over`]); `None` otherwise.
    pub fn cpu_reason(&self) -> Option<&str> {
        self.cpu_reason.as_deref()
    }

    /// The tuning cache file this engine read its table from, natively (see
    /// [`EngineOptions::tuning_cache`]); `None` for memory-only tables.
    pub fn tuning_cache_path(&self) -> Option<&std::path::Path> {
        self.tuning_path.as_deref()
    }

    /// The engine's tuning table (GPU engines): measured kernel and path
    /// choices per adapter and head-dim class, filled by [`crate::tuning::tune`].
    pub fn tuning_table(&self) -> Option<crate::tuning::TuningTable> {
        self.gpu().map(|_| {
            self.plan_inputs
                .tuning
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        })
    }

    /// Writes the tuning table to the engine's cache file, natively; returns
    /// the file, or `None` when the table lives in memory only. Only what the
    /// engine changed since it read (or last wrote) the file is written: its
    /// new or re-measured entries, and the removal of stale ones nobody else
    /// has replaced meanwhile. Entries another process saved in between (a
    /// tune of another adapter or head dim at the same time) are kept.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn save_tuning(&self) -> Result<Option<std::path::PathBuf>> {
        let (Some(path), Some(table)) = (&self.tuning_path, self.tuning_table()) else {
            return Ok(None);
        };
        let mut base = self
            .tuning_base
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut merged = std::fs::read_to_string(path)
            .map(|text| crate::tuning::TuningTable::parse(&text).0)
            .unwrap_or_default();
        for (key, entry) in table.entries() {
            if base.get(key) != Some(entry) {
                merged.insert(key.clone(), *entry);
            }
        }
        for (key, entry) in base.entries() {
            if table.get(key).is_none() && merged.get(key) == Some(entry) {
                merged.remove(key);
            }
        }
        merged.save(path)?;
        *base = table;
        Ok(Some(path.clone()))
    }

    /// The backend in use.
    pub fn backend(&self) -> BackendKind {
        match self.backend {
            Backend::Gpu(_) => BackendKind::Gpu,
            Backend::Cpu => BackendKind::Cpu,
        }
    }

    /// The concrete paths this engine checks in a conformance sweep: the GPU
    /// paths and the fast CPU backend on a GPU engine, the fast CPU backend on
    /// a CPU engine (the oracle, [`KernelPath::Oracle`], is what they are checked against).
    pub fn paths(&self) -> Vec<KernelPath> {
        match self.backend {
            Backend::Gpu(_) => vec![KernelPath::Fused, KernelPath::Unfused, KernelPath::Cpu],
            Backend::Cpu => vec![KernelPath::Cpu],
        }
    }

    /// The fast CPU backend this engine runs CPU calls on.
    pub fn cpu_backend(&self) -> &CpuBackend {
        &self.cpu
    }

    /// The plan of a validated call of `dims` with `options` on this engine
    /// ([`crate::plan::plan_call`] on its adapter, overrides and tuning
    /// table as they are now): what [`Engine::attention`] runs, and what
    /// [`Engine::last_call`] then reports. A typed error where no kernel takes
    /// the call (head dims beyond the fused kernels on a forced fused path,
    /// pieces that cannot fit).
    pub fn plan(&self, dims: &AttentionDims, options: &AttentionOptions) -> Result<CallPlan> {
        let gpu_path = matches!(options.path, KernelPath::Fused | KernelPath::Unfused);
        if let (Backend::Cpu, Some(adapter), true) = (&self.backend, &self.adapter, gpu_path) {
            // Asked for by name: the adapter this engine's default passed over.
            let mut plan = adapter.plan(dims, options)?;
            let why = format!(
                "asked for by name: runs on {}, which this engine leaves to the CPU backend \
                 otherwise",
                adapter.describe()
            );
            plan.reason = Some(match plan.reason {
                Some(reason) => format!("{why}; {reason}"),
                None => why,
            });
            return Ok(plan);
        }
        let planner = match &self.backend {
            Backend::Gpu(gpu) if !matches!(options.path, KernelPath::Cpu | KernelPath::Oracle) => {
                Some(
                    self.plan_inputs
                        .planner(gpu.current(), dims.head_dim, dims.v_head_dim),
                )
            }
            _ => None,
        };
        crate::plan::plan_call(planner.as_ref(), self.score_budget, dims, options)
    }

    /// The plans of a few typical calls on this engine (a prefill, the same
    /// at [`crate::Precision::Fast`] where the adapter has matrix units, a
    /// decoder step, head dims past the fused kernels), each named: what
    /// `webattn info` and the JavaScript `info().plans` show.
    pub fn typical_plans(&self) -> Vec<(&'static str, Result<CallPlan>)> {
        use crate::options::Precision;
        let prefill = AttentionDims::plain(1, [8, 8], [1024, 1024], [64, 64]);
        let causal = AttentionOptions {
            is_causal: true,
            ..Default::default()
        };
        let mut calls = vec![("prefill B1 H8 N1024 d64 causal", prefill, causal.clone())];
        let matrix_units = self
            .capabilities()
            .is_some_and(|caps| crate::kernels::matrix_units::coop_shape(caps).is_some());
        if matrix_units {
            let fast = AttentionOptions {
                precision: Precision::Fast,
                ..causal
            };
            calls.push(("  the same at --precision fast", prefill, fast));
        }
        calls.push((
            "decode 32/8 heads of 128, 4096 keys",
            AttentionDims::plain(1, [32, 8], [1, 4096], [128, 128]),
            AttentionOptions::default(),
        ));
        calls.push((
            "B1 H2 N256 head dim 512",
            AttentionDims::plain(1, [2, 2], [256, 256], [512, 512]),
            AttentionOptions::default(),
        ));
        calls
            .into_iter()
            .map(|(call, dims, options)| (call, self.plan(&dims, &options)))
            .collect()
    }

    /// The planner for calls at head dims `dk`, `dv` on a GPU engine: its
    /// adapter, its overrides and a snapshot of its tuning table's entry.
    pub fn planner(&self, dk: usize, dv: usize) -> Option<crate::plan::planner::Planner<'_>> {
        self.gpu().map(|ctx| self.plan_inputs.planner(ctx, dk, dv))
    }

    /// How the attention family's layers on this engine choose their
    /// products' kernels (the forced GEMM, else the adapter's).
    pub fn gemm_choice(&self) -> crate::kernels::gemm::GemmChoice {
        crate::kernels::gemm::GemmChoice {
            forced: self.plan_inputs.overrides.gemm,
        }
    }

    /// What this engine is told to run in place of the planner's picks.
    pub fn overrides(&self) -> &Overrides {
        &self.plan_inputs.overrides
    }

    /// This engine with `overrides` in place of its own, unchecked: for
    /// pinning a candidate to time it (the tuner), or removing phases.
    pub fn with_overrides(mut self, overrides: Overrides) -> Engine {
        self.plan_inputs.overrides = overrides;
        self
    }

    /// This engine with its fused kernel forced to `choice` (the other
    /// kernels as chosen); refused where the adapter cannot run it
    /// ([`Overrides::force_fused`]) or on a CPU engine.
    pub fn with_fused_kernel(mut self, choice: FusedKernelChoice) -> Result<Engine> {
        let caps = self.gpu_capabilities("kernel", choice.name())?;
        self.plan_inputs.overrides.force_fused(choice, &caps)?;
        Ok(self)
    }

    /// This engine with its decode kernel forced to `choice`
    /// ([`Overrides::force_decode`]).
    pub fn with_decode_kernel(mut self, choice: DecodeKernelChoice) -> Result<Engine> {
        let caps = self.gpu_capabilities("decode kernel", choice.name())?;
        self.plan_inputs.overrides.force_decode(choice, &caps)?;
        Ok(self)
    }

    /// This engine restricted to the kernels that need no subgroups
    /// ([`Overrides::use_portable_kernels`]).
    pub fn with_portable_kernels(mut self) -> Engine {
        self.plan_inputs.overrides.use_portable_kernels();
        self
    }

    /// This engine with its subgroup kernels compiled for subgroups of
    /// `width` ([`Overrides::force_subgroup_width`]).
    pub fn with_subgroup_width(mut self, width: u32) -> Result<Engine> {
        let caps = self.gpu_capabilities("subgroup width", &width.to_string())?;
        self.plan_inputs
            .overrides
            .force_subgroup_width(width, &caps)?;
        Ok(self)
    }

    /// This engine with its fused and decode calls compiled without
    /// `phases`: **their results are wrong by design**, for measuring what
    /// each phase costs (`webattn phases`). Calls whose kernel has no phase
    /// switches fail with [`Error::Conflict`]; the unfused path is unchanged.
    pub fn without_phases(mut self, phases: crate::kernels::ablation::Phases) -> Engine {
        self.plan_inputs.overrides.removed_phases = phases;
        self
    }

    /// The adapter's capabilities, for checking an option named `name` with
    /// `value` against them; refused on a CPU engine.
    fn gpu_capabilities(&self, name: &'static str, value: &str) -> Result<Capabilities> {
        self.capabilities()
            .cloned()
            .ok_or_else(|| Error::InvalidOption {
                name,
                value: value.to_string(),
                reason: "names a GPU kernel, but this engine runs on the CPU backend",
            })
    }

    /// Another engine on this engine's device (its newest), planning with
    /// the same overrides and tuning table but keeping its own calls'
    /// workspaces: what the tuner times each candidate on. `None` on a CPU
    /// engine.
    pub fn sharing_device(&self) -> Option<Engine> {
        let ctx = self.gpu()?.clone();
        let mut engine = Self::with_backend(
            Backend::Gpu(Box::new(GpuDevices::new(ctx, None))),
            Some(self.score_budget),
        );
        engine.plan_inputs = self.plan_inputs.clone();
        Some(engine)
    }

    /// The tuning table's key for head dims `dk`, `dv` on this engine's
    /// adapter (GPU engines).
    pub fn tuning_key(&self, dk: usize, dv: usize) -> Option<crate::tuning::TuningKey> {
        self.gpu().map(|ctx| PlanInputs::tuning_key(ctx, dk, dv))
    }

    /// Records a measurement in the engine's tuning table (shared with every
    /// engine made by [`Engine::sharing_device`]).
    pub fn record_tuning(&self, key: crate::tuning::TuningKey, entry: crate::tuning::TunedEntry) {
        self.plan_inputs.record_tuning(key, entry);
    }

    /// The measured entry for head dims `dk`, `dv` on this engine's adapter, if any.
    pub fn tuned(&self, dk: usize, dv: usize) -> Option<crate::tuning::TunedEntry> {
        self.gpu()
            .and_then(|ctx| self.plan_inputs.tuned(ctx, dk, dv))
    }

    /// The engine's tuning table, shared: what [`crate::tuning::tune`]
    /// records there every engine that holds it sees.
    pub fn tuning(&self) -> &Arc<Mutex<crate::tuning::TuningTable>> {
        &self.plan_inputs.tuning
    }

    /// What the last attention call on this engine did.
    pub fn last_call(&self) -> Option<CallStats> {
        self.last_call
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The GPU context, on a GPU engine: that of its newest device.
    pub fn gpu(&self) -> Option<&GpuContext> {
        match &self.backend {
            Backend::Gpu(gpu) => Some(gpu.current()),
            Backend::Cpu => None,
        }
    }

    /// The adapter's capability profile, on a GPU engine.
    pub fn capabilities(&self) -> Option<&Capabilities> {
        self.gpu().map(GpuContext::capabilities)
    }

    /// One line saying what the engine runs on.
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Gpu(gpu) => gpu.current().capabilities().summary(),
            Backend::Cpu => match &self.cpu_reason {
                Some(why) => format!("CPU backend ({}): {why}", self.cpu.describe()),
                None => format!(
                    "CPU backend ({}; no GPU adapter in use)",
                    self.cpu.describe()
                ),
            },
        }
    }

    /// The engine and device a GPU buffer made now belongs to: what caches of
    /// device data (uploaded weights) are keyed by.
    pub(crate) fn device_key(&self) -> DeviceKey {
        (self.id, self.device_generation().unwrap_or(0))
    }

    /// A device buffer of f32 values of this engine's GPU, wrapped as a tensor.
    pub(crate) fn wrap_gpu(&self, shape: Vec<usize>, buffer: wgpu::Buffer) -> Tensor {
        self.wrap_gpu_as(shape, buffer, DType::F32)
    }

    /// A device buffer of `dtype` values (f16 packed two to a word), wrapped as a tensor.
    pub(crate) fn wrap_gpu_as(
        &self,
        shape: Vec<usize>,
        buffer: wgpu::Buffer,
        dtype: DType,
    ) -> Tensor {
        Tensor {
            shape,
            dtype,
            storage: Storage::Gpu(Arc::new(buffer)),
            engine_id: self.id,
            generation: self.device_generation().unwrap_or(0),
        }
    }

    /// Device storage (one buffer or several) of `dtype` values wrapped as a tensor.
    pub(crate) fn wrap_held(&self, shape: Vec<usize>, held: Held, dtype: DType) -> Tensor {
        Tensor {
            shape,
            dtype,
            storage: held.into(),
            engine_id: self.id,
            generation: self.device_generation().unwrap_or(0),
        }
    }

    /// Host values wrapped as a tensor of this (CPU) engine, without a copy to a device.
    pub(crate) fn wrap_host(&self, tensor: HostTensor) -> Tensor {
        Tensor {
            shape: tensor.shape().to_vec(),
            dtype: tensor.dtype(),
            storage: Storage::Host(Arc::new(tensor)),
            engine_id: self.id,
            generation: 0,
        }
    }

    /// Checks that a tensor belongs to this engine and, if it is on the GPU,
    /// to the device the engine runs on now.
    pub(crate) fn own<'t>(&self, name: &'static str, t: &'t Tensor) -> Result<&'t Tensor> {
        self.check_owner(name, t.engine_id, t.generation, t.is_on_gpu())?;
        Ok(t)
    }

    fn check_owner(
        &self,
        name: &'static str,
        engine: u64,
        generation: u64,
        on_gpu: bool,
    ) -> Result<()> {
        if engine != self.id {
            return Err(Error::ForeignTensor { tensor: name });
        }
        match self.device_generation() {
            Some(now) if on_gpu && generation != now => Err(Error::TensorLost { tensor: name }),
            _ => Ok(()),
        }
    }

    /// Uploads a host tensor. Natively the allocation is checked in error
    /// scopes, so memory the device lacks is [`Error::OutOfMemory`] here and the
    /// engine stays usable; in the browser, where nothing can block, use
    /// [`Engine::upload_async`] for that check.
    pub fn upload(&self, tensor: &HostTensor) -> Result<Tensor> {
        #[cfg(not(target_arch = "wasm32"))]
        return pollster::block_on(self.upload_async(tensor));
        #[cfg(target_arch = "wasm32")]
        return Ok(self.host_or_gpu(
            tensor,
            self.upload_unchecked("tensor", tensor.data(), tensor.dtype(), tensor.shape())?,
        ));
    }

    /// A tensor of `shape` whose values repeat `pattern`'s in order (its
    /// dtype too): a benchmark's large inputs without drawing every value on
    /// the host. On a GPU engine the pattern is uploaded once and copied
    /// into place on the device, so a tensor of many gigabytes takes about
    /// as long as its copies; `pattern` must hold an even number of values,
    /// at least one. Memory the device lacks is [`Error::OutOfMemory`].
    pub async fn upload_repeated(&self, shape: &[usize], pattern: &HostTensor) -> Result<Tensor> {
        let len = crate::tensor::checked_numel("tensor", shape)?;
        let period = pattern.len();
        if period == 0 || !period.is_multiple_of(2) {
            return Err(Error::InvalidOption {
                name: "pattern",
                value: period.to_string(),
                reason: "a repeated pattern needs an even number of values, at least two",
            });
        }
        let Backend::Gpu(gpu) = &self.backend else {
            let mut data = crate::tensor::try_filled("a repeated tensor", len, 0.0f32)?;
            for (out, value) in data.iter_mut().zip(pattern.data().iter().cycle()) {
                *out = *value;
            }
            let tensor = HostTensor::new(shape.to_vec(), data)?.into_dtype(pattern.dtype());
            return Ok(self.wrap_host(tensor));
        };
        let (device, generation) = gpu.latest();
        let run = Run::new(device);
        let ctx = &run;
        let f16 = pattern.dtype() == DType::F16;
        let chunk_len = chunks::chunk_len(shape, pattern.dtype(), ctx.caps.limits.max_buffer_size)?;
        let storage = ctx
            .scoped("uploading a repeated tensor", || {
                let source =
                    buffer::upload_values(ctx, "pattern", pattern.data(), pattern.dtype())?;
                let storage = match chunk_len {
                    Some(n) => Storage::GpuChunks(Arc::new(chunks::storage(
                        ctx,
                        "repeated tensor",
                        len,
                        pattern.dtype(),
                        n,
                    )?)),
                    None => Storage::Gpu(Arc::new(match f16 {
                        true => buffer::f16_tensor_storage(ctx, "repeated tensor", len)?,
                        false => buffer::tensor_storage(ctx, "repeated tensor", len)?,
                    })),
                };
                let targets: Vec<(&wgpu::Buffer, usize)> = match &storage {
                    Storage::Gpu(b) | Storage::GpuAt(b, _) => vec![(&**b, 0)],
                    Storage::GpuChunks(c) => c
                        .buffers()
                        .iter()
                        .enumerate()
                        .map(|(i, b)| (b, i * c.chunk_len()))
                        .collect(),
                    Storage::Host(_) => Vec::new(),
                };
                ctx.encode("repeat a pattern", |encoder| {
                    chunks::fill_repeated(encoder, &source, period, pattern.dtype(), &targets)
                });
                Ok(storage)
            })
            .await?;
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype: pattern.dtype(),
            storage,
            engine_id: self.id,
            generation,
        })
    }

    /// Uploads a host tensor and waits until the device has accepted the
    /// allocation: memory it lacks is [`Error::OutOfMemory`].
    pub async fn upload_async(&self, tensor: &HostTensor) -> Result<Tensor> {
        self.upload_named("tensor", tensor).await
    }

    async fn upload_named(&self, name: &'static str, tensor: &HostTensor) -> Result<Tensor> {
        Ok(self.host_or_gpu(
            tensor,
            self.upload_scoped(name, tensor.data(), tensor.dtype(), tensor.shape())
                .await?,
        ))
    }

    /// A tensor of this engine: the uploaded buffer on a GPU engine, the host
    /// values (shared, not copied to a device) on a CPU engine.
    fn host_or_gpu(
        &self,
        tensor: &HostTensor,
        uploaded: Option<(Storage<HostTensor>, u64)>,
    ) -> Tensor {
        let (storage, generation) = match uploaded {
            Some(uploaded) => uploaded,
            None => (Storage::Host(Arc::new(tensor.clone())), 0),
        };
        Tensor {
            shape: tensor.shape().to_vec(),
            dtype: tensor.dtype(),
            storage,
            engine_id: self.id,
            generation,
        }
    }

    /// Uploads `data` as `dtype` inside error scopes on a GPU engine: its
    /// storage and the device generation it lives on, or `None` on a CPU
    /// engine. A tensor of `shape` larger than one buffer is held in several
    /// (`device/chunks.rs`).
    async fn upload_scoped<H>(
        &self,
        name: &'static str,
        data: &[f32],
        dtype: DType,
        shape: &[usize],
    ) -> Result<Option<(Storage<H>, u64)>> {
        let Backend::Gpu(gpu) = &self.backend else {
            return Ok(None);
        };
        let (device, generation) = gpu.latest();
        let run = Run::new(device);
        let ctx = &run;
        let storage = ctx
            .scoped(&format!("uploading {name}"), || {
                upload_storage(ctx, name, data, dtype, shape)
            })
            .await?;
        Ok(Some((storage, generation)))
    }

    /// [`Engine::upload_scoped`] without the scopes, for the browser's synchronous calls.
    #[cfg(target_arch = "wasm32")]
    fn upload_unchecked<H>(
        &self,
        name: &'static str,
        data: &[f32],
        dtype: DType,
        shape: &[usize],
    ) -> Result<Option<(Storage<H>, u64)>> {
        let Backend::Gpu(gpu) = &self.backend else {
            return Ok(None);
        };
        let (device, generation) = gpu.latest();
        let run = Run::new(device);
        let ctx = &run;
        ctx.check_alive()?;
        Ok(Some((
            upload_storage(ctx, name, data, dtype, shape)?,
            generation,
        )))
    }

    /// Uploads an attention mask (stored as an additive bias on the GPU);
    /// natively checked as [`Engine::upload`] is.
    pub fn upload_mask(&self, mask: &HostMask) -> Result<Mask> {
        #[cfg(not(target_arch = "wasm32"))]
        return pollster::block_on(self.upload_mask_async(mask));
        #[cfg(target_arch = "wasm32")]
        {
            let uploaded = match self.backend {
                Backend::Gpu(_) => {
                    self.upload_unchecked("attn_mask", &mask_bias(mask), DType::F32, mask.shape())?
                }
                Backend::Cpu => None,
            };
            Ok(self.mask_host_or_gpu(mask, uploaded))
        }
    }

    /// Uploads an attention mask and waits until the device has accepted the
    /// allocation.
    pub async fn upload_mask_async(&self, mask: &HostMask) -> Result<Mask> {
        let uploaded = match self.backend {
            Backend::Gpu(_) => {
                self.upload_scoped("attn_mask", &mask_bias(mask), DType::F32, mask.shape())
                    .await?
            }
            Backend::Cpu => None,
        };
        Ok(self.mask_host_or_gpu(mask, uploaded))
    }

    fn mask_host_or_gpu(
        &self,
        mask: &HostMask,
        uploaded: Option<(Storage<HostMask>, u64)>,
    ) -> Mask {
        let (storage, generation) = match uploaded {
            Some(uploaded) => uploaded,
            None => (Storage::Host(Arc::new(mask.clone())), 0),
        };
        Mask {
            shape: mask.shape().to_vec(),
            storage,
            engine_id: self.id,
            generation,
        }
    }

    /// Reads a tensor back to the host.
    pub async fn download(&self, tensor: &Tensor) -> Result<HostTensor> {
        let tensor = self.own("tensor", tensor)?;
        match (&self.backend, &tensor.storage) {
            (Backend::Gpu(gpu), Storage::Gpu(buf)) => {
                let run = Run::new(gpu.current());
                let ctx = &run;
                let data = match tensor.dtype {
                    DType::F16 => buffer::read_f16(ctx, buf, tensor.len()).await?,
                    _ => buffer::read_f32(ctx, buf, 0, tensor.len()).await?,
                };
                Ok(HostTensor::new(tensor.shape.clone(), data)?.into_dtype(tensor.dtype))
            }
            (Backend::Gpu(gpu), Storage::GpuChunks(c)) => {
                let data = chunks::read(&Run::new(gpu.current()), c, tensor.dtype).await?;
                Ok(HostTensor::new(tensor.shape.clone(), data)?.into_dtype(tensor.dtype))
            }
            (Backend::Gpu(gpu), Storage::GpuAt(buf, offset)) => {
                let run = Run::new(gpu.current());
                let ctx = &run;
                let copy = chunks::contiguous(ctx, buf, *offset, tensor.words()).await?;
                let data = match tensor.dtype {
                    DType::F16 => buffer::read_f16(ctx, &copy, tensor.len()).await?,
                    _ => buffer::read_f32(ctx, &copy, 0, tensor.len()).await?,
                };
                Ok(HostTensor::new(tensor.shape.clone(), data)?.into_dtype(tensor.dtype))
            }
            (_, Storage::Host(host)) => Ok((**host).clone()),
            (Backend::Cpu, Storage::Gpu(_) | Storage::GpuChunks(_) | Storage::GpuAt(..)) => {
                Err(Error::ForeignTensor { tensor: "tensor" })
            }
        }
    }

    /// Reads every present output back to the host.
    pub async fn download_outputs(
        &self,
        outputs: &AttentionOutputs<Tensor>,
    ) -> Result<AttentionOutputs<HostTensor>> {
        let y = self.download(&outputs.y).await?;
        let fetch = |t: &Option<Tensor>| {
            let t = t.clone();
            async move {
                match t {
                    Some(t) => self.download(&t).await.map(Some),
                    None => Ok(None),
                }
            }
        };
        Ok(AttentionOutputs {
            y,
            present_key: fetch(&outputs.present_key).await?,
            present_value: fetch(&outputs.present_value).await?,
            qk_matmul_output: fetch(&outputs.qk_matmul_output).await?,
            lse: fetch(&outputs.lse).await?,
        })
    }

    /// The host values of a tensor: shared on a CPU engine, read back on a GPU engine.
    async fn to_host(&self, t: &Tensor) -> Result<Arc<HostTensor>> {
        match &t.storage {
            Storage::Host(h) => Ok(h.clone()),
            Storage::Gpu(_) | Storage::GpuChunks(_) | Storage::GpuAt(..) => {
                Ok(Arc::new(self.download(t).await?))
            }
        }
    }

    /// A call's inputs on the host (read back from the device where they live
    /// there), for the paths that compute on the host.
    pub(crate) async fn host_inputs(
        &self,
        inputs: &AttentionInputs<'_, Tensor>,
    ) -> Result<HostInputs> {
        let past = match (inputs.past_key, inputs.past_value) {
            (Some(pk), Some(pv)) => Some((self.to_host(pk).await?, self.to_host(pv).await?)),
            _ => None,
        };
        let mask = match inputs.attn_mask {
            Some(m) => Some(self.download_mask(m).await?),
            None => None,
        };
        Ok(HostInputs {
            q: self.to_host(inputs.q).await?,
            k: self.to_host(inputs.k).await?,
            v: self.to_host(inputs.v).await?,
            past,
            mask,
        })
    }

    /// Reads a mask back to the host. A mask on the GPU comes back as the
    /// equivalent float mask (masked entries are `-f32::MAX`).
    pub async fn download_mask(&self, mask: &Mask) -> Result<HostMask> {
        self.check_owner(
            "attn_mask",
            mask.engine_id,
            mask.generation,
            mask.is_on_gpu(),
        )?;
        match (&self.backend, &mask.storage) {
            (_, Storage::Host(m)) => Ok((**m).clone()),
            (Backend::Gpu(gpu), Storage::Gpu(buf)) => {
                let len = mask.shape.iter().product();
                let data = buffer::read_f32(&Run::new(gpu.current()), buf, 0, len).await?;
                HostMask::float(mask.shape.clone(), data)
            }
            (Backend::Gpu(gpu), Storage::GpuChunks(c)) => {
                let data = chunks::read(&Run::new(gpu.current()), c, DType::F32).await?;
                HostMask::float(mask.shape.clone(), data)
            }
            (Backend::Cpu, Storage::Gpu(_) | Storage::GpuChunks(_)) => Err(Error::ForeignTensor {
                tensor: "attn_mask",
            }),
            (_, Storage::GpuAt(..)) => Err(Error::Conflict("masks are never wrapped buffers")),
        }
    }

    /// Attention on tensors already owned by this engine; the outputs stay on
    /// the engine too (read them with [`Engine::download`]).
    pub async fn attention(
        &self,
        inputs: &AttentionInputs<'_, Tensor>,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<Tensor>> {
        // After a device loss, this call runs on a fresh device (and tensors of
        // the lost one say so below).
        self.recover().await?;
        self.check_input_owners(inputs)?;
        let dims = validate(inputs, options)?;
        self.refuse_gpu_path_on_cpu(options)?;
        let plan = self.plan(&dims, options)?;
        match (&self.backend, plan.gpu) {
            (Backend::Cpu, Some(_)) => {
                // A GPU path asked for by name on the adapter this engine
                // passed over: its tensors are on the host, so as host data.
                let out = self.on_adapter(inputs, options, plan).await?;
                self.adopt_outputs(out).await
            }
            (Backend::Gpu(gpu), Some(_)) => {
                let (device, generation) = gpu.latest();
                // The workspace of the last call of this plan, if kept.
                let taken = self.call_cache.take(&dims, options, &plan, generation);
                let ctx = Run::new(device).with_arena(taken.arena().clone());
                let out = self
                    .attention_on_gpu(&ctx, generation, inputs, options, &dims, &plan)
                    .await?;
                self.call_cache.put_back(taken, &out);
                Ok(out)
            }
            _ => {
                // The CPU: on a CPU engine, or when asked for on a GPU engine.
                let copies = self.host_inputs(inputs).await?;
                let host_inputs = copies.view(inputs.nonpad_kv_seqlen);
                let out = self.run_on_host(plan.path, &host_inputs, options)?;
                let out = typed_host_outputs(out, &host_inputs);
                self.record_call(CallStats {
                    plan,
                    allocated_bytes: 0,
                    pieces: 1,
                    widened_bytes: 0,
                });
                self.adopt_outputs(out).await
            }
        }
    }

    /// Checks that every input tensor belongs to this engine's current device.
    fn check_input_owners(&self, inputs: &AttentionInputs<'_, Tensor>) -> Result<()> {
        for (name, t) in [
            ("Q", Some(inputs.q)),
            ("K", Some(inputs.k)),
            ("V", Some(inputs.v)),
        ]
        .into_iter()
        .chain([
            ("past_key", inputs.past_key),
            ("past_value", inputs.past_value),
        ]) {
            if let Some(t) = t {
                self.own(name, t)?;
            }
        }
        if let Some(m) = inputs.attn_mask {
            self.check_owner("attn_mask", m.engine_id, m.generation, m.is_on_gpu())?;
        }
        Ok(())
    }

    /// A GPU path asked of a CPU engine is a conflict, not a silent CPU run.
    fn refuse_gpu_path_on_cpu(&self, options: &AttentionOptions) -> Result<()> {
        if self.backend() == BackendKind::Cpu
            && self.adapter.is_none()
            && matches!(options.path, KernelPath::Unfused | KernelPath::Fused)
        {
            return Err(Error::Conflict(
                "a GPU path was asked for but this engine runs on the CPU backend; \
                 use KernelPath::Auto, Cpu or Oracle, or create the engine on a GPU",
            ));
        }
        Ok(())
    }

    /// The oracle for [`KernelPath::Oracle`], else the fast CPU backend.
    fn run_on_host(
        &self,
        path: KernelPath,
        inputs: &AttentionInputs<'_, HostTensor>,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<HostTensor>> {
        if path == KernelPath::Oracle {
            cpu::attention(inputs, options)
        } else {
            self.cpu.attention(inputs, options)
        }
    }

    /// Records a call the CPU backend ran on its own data (a paged cache's
    /// host pages) under `plan`: what [`Engine::last_call`] reports.
    pub(crate) fn record_host_call(&self, plan: CallPlan) {
        self.record_call(CallStats {
            plan,
            allocated_bytes: 0,
            pieces: 1,
            widened_bytes: 0,
        });
    }

    fn record_call(&self, stats: CallStats) {
        if let Some(reason) = &stats.plan.reason {
            log::info!("webattn: {} path: {reason}", stats.plan.path);
        }
        *self
            .last_call
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(stats);
    }

    /// Runs a call planned for the adapter this CPU engine passed over
    /// (a GPU path asked for by name) on its host tensors; records `plan`.
    async fn on_adapter(
        &self,
        inputs: &AttentionInputs<'_, Tensor>,
        options: &AttentionOptions,
        plan: CallPlan,
    ) -> Result<AttentionOutputs<HostTensor>> {
        let adapter = self.adapter.as_ref().ok_or(Error::Conflict(
            "a GPU path was asked for but this engine runs on the CPU backend",
        ))?;
        let copies = self.host_inputs(inputs).await?;
        let host_inputs = copies.view(inputs.nonpad_kv_seqlen);
        let out = Box::pin(adapter.attention_host(&host_inputs, options)).await?;
        self.record_call(CallStats {
            plan,
            ..adapter
                .last_call()
                .expect("the adapter's call was recorded")
        });
        Ok(out)
    }

    /// Wraps host outputs as tensors of this engine (uploading on a GPU engine).
    async fn adopt_outputs(
        &self,
        out: AttentionOutputs<HostTensor>,
    ) -> Result<AttentionOutputs<Tensor>> {
        let adopt = |t: Option<HostTensor>| async move {
            match t {
                Some(t) => self.upload_named("output", &t).await.map(Some),
                None => Ok(None),
            }
        };
        Ok(AttentionOutputs {
            y: self.upload_named("output", &out.y).await?,
            present_key: adopt(out.present_key).await?,
            present_value: adopt(out.present_value).await?,
            qk_matmul_output: adopt(out.qk_matmul_output).await?,
            lse: adopt(out.lse).await?,
        })
    }

    /// Attention on host data: uploads, runs and reads back every requested output.
    pub async fn attention_host(
        &self,
        inputs: &AttentionInputs<'_, HostTensor>,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<HostTensor>> {
        let dims = validate(inputs, options)?;
        self.refuse_gpu_path_on_cpu(options)?;
        let plan = self.plan(&dims, options)?;
        if let (Some(adapter), Some(_), Backend::Cpu) = (&self.adapter, plan.gpu, &self.backend) {
            let out = Box::pin(adapter.attention_host(inputs, options)).await?;
            self.record_call(CallStats {
                plan,
                ..adapter
                    .last_call()
                    .expect("the adapter's call was recorded")
            });
            return Ok(out);
        }
        if plan.gpu.is_none() {
            let out = typed_host_outputs(self.run_on_host(plan.path, inputs, options)?, inputs);
            self.record_call(CallStats {
                plan,
                allocated_bytes: 0,
                pieces: 1,
                widened_bytes: 0,
            });
            return Ok(out);
        }
        // After a device loss, the uploads go to a fresh device.
        self.recover().await?;
        let q = self.upload_named("Q", inputs.q).await?;
        let k = self.upload_named("K", inputs.k).await?;
        let v = self.upload_named("V", inputs.v).await?;
        let mask = match inputs.attn_mask {
            Some(m) => Some(self.upload_mask_async(m).await?),
            None => None,
        };
        let past_key = match inputs.past_key {
            Some(t) => Some(self.upload_named("past_key", t).await?),
            None => None,
        };
        let past_value = match inputs.past_value {
            Some(t) => Some(self.upload_named("past_value", t).await?),
            None => None,
        };
        let device_inputs = AttentionInputs {
            q: &q,
            k: &k,
            v: &v,
            attn_mask: mask.as_ref(),
            past_key: past_key.as_ref(),
            past_value: past_value.as_ref(),
            nonpad_kv_seqlen: inputs.nonpad_kv_seqlen,
        };
        let out = self.attention(&device_inputs, options).await?;
        self.download_outputs(&out).await
    }
}

/// Host outputs as ONNX types them: Y and the scores in Q's dtype, the
/// presents in K's and V's (f16 ones rounded); the logsumexp stays f32.
fn typed_host_outputs(
    out: AttentionOutputs<HostTensor>,
    inputs: &AttentionInputs<'_, HostTensor>,
) -> AttentionOutputs<HostTensor> {
    let (q, k, v) = (inputs.q.dtype(), inputs.k.dtype(), inputs.v.dtype());
    AttentionOutputs {
        y: out.y.into_dtype(q),
        present_key: out.present_key.map(|t| t.into_dtype(k)),
        present_value: out.present_value.map(|t| t.into_dtype(v)),
        qk_matmul_output: out.qk_matmul_output.map(|t| t.into_dtype(q)),
        lse: out.lse,
    }
}

/// `data` uploaded as `dtype`: one buffer, or several where a tensor of
/// `shape` is larger than one buffer.
fn upload_storage<H>(
    ctx: &Run,
    name: &'static str,
    data: &[f32],
    dtype: DType,
    shape: &[usize],
) -> Result<Storage<H>> {
    Ok(
        match chunks::chunk_len(shape, dtype, ctx.caps.limits.max_buffer_size)? {
            Some(n) => Storage::GpuChunks(Arc::new(chunks::upload(ctx, name, data, dtype, n)?)),
            None => Storage::Gpu(Arc::new(buffer::upload_values(ctx, name, data, dtype)?)),
        },
    )
}

/// A mask as the GPU kernels read it: an additive bias, masked entries (bool
/// `false`, `-inf` and anything at or below `-f32::MAX`) as the MASKED marker.
/// Any other value, NaN included, is added to the score as it is.
fn mask_bias(mask: &HostMask) -> Vec<f32> {
    mask.to_additive()
        .into_iter()
        .map(|x| if x <= MASKED { MASKED } else { x })
        .collect()
}

#[cfg(not(target_arch = "wasm32"))]
impl Engine {
    /// [`Engine::new`], blocking.
    pub fn new_blocking() -> Engine {
        pollster::block_on(Self::new())
    }

    /// [`Engine::with_options`], blocking.
    pub fn with_options_blocking(options: EngineOptions) -> Result<Engine> {
        pollster::block_on(Self::with_options(options))
    }

    /// [`Engine::download`], blocking.
    pub fn download_blocking(&self, tensor: &Tensor) -> Result<HostTensor> {
        pollster::block_on(self.download(tensor))
    }

    /// [`Engine::attention`], blocking until the work is submitted.
    pub fn attention_blocking(
        &self,
        inputs: &AttentionInputs<'_, Tensor>,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<Tensor>> {
        pollster::block_on(self.attention(inputs, options))
    }

    /// [`Engine::attention_host`], blocking.
    pub fn attention_host_blocking(
        &self,
        inputs: &AttentionInputs<'_, HostTensor>,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<HostTensor>> {
        pollster::block_on(self.attention_host(inputs, options))
    }
}

/// A call's inputs read to the host: what [`Engine::host_inputs`] returns.
pub(crate) struct HostInputs {
    q: Arc<HostTensor>,
    k: Arc<HostTensor>,
    v: Arc<HostTensor>,
    past: Option<(Arc<HostTensor>, Arc<HostTensor>)>,
    mask: Option<HostMask>,
}

impl HostInputs {
    /// The call's inputs over these copies, with the call's `nonpad` lengths.
    pub(crate) fn view<'a>(&'a self, nonpad: Option<&'a [i64]>) -> AttentionInputs<'a, HostTensor> {
        let mut inputs = AttentionInputs::new(&*self.q, &*self.k, &*self.v);
        if let Some((pk, pv)) = &self.past {
            inputs = inputs.with_past(pk, pv);
        }
        if let Some(m) = &self.mask {
            inputs = inputs.with_mask(m);
        }
        inputs.nonpad_kv_seqlen = nonpad;
        inputs
    }
}
