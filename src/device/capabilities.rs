//! The capability profile of an adapter: who it is, the limits and features
//! that matter to our kernels. Kernel choices are made from this profile.

use crate::error::{Error, Result};
use crate::options::MatrixUnits;

/// The adapter's identity, as text fit for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// The adapter's name (e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`).
    pub name: String,
    /// The PCI vendor id (or the backend's equivalent).
    pub vendor: u32,
    /// The PCI device id (or the backend's equivalent).
    pub device: u32,
    /// `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` or `Other`.
    pub device_type: String,
    /// `Vulkan`, `Metal`, `Dx12`, `Gl` or `BrowserWebGpu`.
    pub backend: String,
    /// The driver's name.
    pub driver: String,
    /// The driver's version text.
    pub driver_info: String,
}

/// The limits our kernels and buffers depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelLimits {
    /// Largest storage buffer binding, in bytes.
    pub max_storage_buffer_binding_size: u64,
    /// Largest buffer, in bytes.
    pub max_buffer_size: u64,
    /// Workgroup memory per workgroup, in bytes.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations per workgroup.
    pub max_compute_invocations_per_workgroup: u32,
    /// Workgroups per dispatch dimension.
    pub max_compute_workgroups_per_dimension: u32,
    /// Storage buffers per shader stage.
    pub max_storage_buffers_per_shader_stage: u32,
}

impl KernelLimits {
    /// The WebGPU defaults: what every adapter offers at least.
    pub const WEBGPU_DEFAULTS: KernelLimits = KernelLimits {
        max_storage_buffer_binding_size: 128 << 20,
        max_buffer_size: 256 << 20,
        max_compute_workgroup_storage_size: 16 << 10,
        max_compute_invocations_per_workgroup: 256,
        max_compute_workgroups_per_dimension: 65535,
        max_storage_buffers_per_shader_stage: 8,
    };

    /// Each limit no larger than `other`'s.
    pub fn at_most(&self, other: &KernelLimits) -> KernelLimits {
        KernelLimits {
            max_storage_buffer_binding_size: self
                .max_storage_buffer_binding_size
                .min(other.max_storage_buffer_binding_size),
            max_buffer_size: self.max_buffer_size.min(other.max_buffer_size),
            max_compute_workgroup_storage_size: self
                .max_compute_workgroup_storage_size
                .min(other.max_compute_workgroup_storage_size),
            max_compute_invocations_per_workgroup: self
                .max_compute_invocations_per_workgroup
                .min(other.max_compute_invocations_per_workgroup),
            max_compute_workgroups_per_dimension: self
                .max_compute_workgroups_per_dimension
                .min(other.max_compute_workgroups_per_dimension),
            max_storage_buffers_per_shader_stage: self
                .max_storage_buffers_per_shader_stage
                .min(other.max_storage_buffers_per_shader_stage),
        }
    }

    /// The largest buffer that can also be bound whole as storage.
    pub fn max_bindable_bytes(&self) -> u64 {
        self.max_storage_buffer_binding_size
            .min(self.max_buffer_size)
    }
}

impl Capabilities {
    /// A made-up adapter of `device_type` at WebGPU's default limits, with no
    /// optional features: for unit tests of the planning code.
    #[cfg(test)]
    pub(crate) fn synthetic(device_type: &str) -> Capabilities {
        Capabilities {
            adapter: AdapterSummary {
                name: "test".into(),
                vendor: 0,
                device: 0,
                device_type: device_type.into(),
                backend: "Vulkan".into(),
                driver: "test".into(),
                driver_info: String::new(),
            },
            limits: KernelLimits::WEBGPU_DEFAULTS,
            shader_f16: false,
            unpack_f16: true,
            subgroups: false,
            subgroup_min_size: 0,
            subgroup_max_size: 0,
            timestamp_query: false,
            cooperative_matrix: Vec::new(),
        }
    }
}

impl From<&wgpu::Limits> for KernelLimits {
    fn from(l: &wgpu::Limits) -> Self {
        Self {
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_buffer_size: l.max_buffer_size,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
        }
    }
}

/// What the engine knows about its adapter and device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Who the adapter is.
    pub adapter: AdapterSummary,
    /// The limits the device was created with.
    pub limits: KernelLimits,
    /// `shader-f16` is available.
    pub shader_f16: bool,
    /// WGSL's `unpack2x16float` is (wgpu's `SHADER_F16_IN_F32` downlevel
    /// flag: every WebGPU and native adapter; not every GL ES one): the decode
    /// kernel then reads f16 keys and values in place.
    pub unpack_f16: bool,
    /// Subgroup operations are available.
    pub subgroups: bool,
    /// The smallest subgroup width the adapter may use.
    pub subgroup_min_size: u32,
    /// The largest subgroup width the adapter may use.
    pub subgroup_max_size: u32,
    /// GPU timestamps can be written at pass boundaries.
    pub timestamp_query: bool,
    /// The matrix-unit configurations the adapter reports through wgpu's
    /// experimental cooperative-matrix feature (natively, on Vulkan with
    /// `VK_KHR_cooperative_matrix` and on Metal), with the device created
    /// with that feature; empty where it has none, and always in the browser.
    /// The matrix-unit kernels run on the f16 -> f32 ones
    /// (`kernels::matrix_units::coop_shape`).
    pub cooperative_matrix: Vec<CoopMatrixConfig>,
}

/// One cooperative-matrix configuration an adapter offers: `C (m×n, cr) +=
/// A (m×k, ab) · B (k×n, ab)` at subgroup scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoopMatrixConfig {
    /// Rows of A and C.
    pub m: u32,
    /// Columns of B and C.
    pub n: u32,
    /// Columns of A, rows of B.
    pub k: u32,
    /// The inputs' element type (`f16`, `f32`, `i32`, `u32`).
    pub ab: &'static str,
    /// The accumulator's element type.
    pub cr: &'static str,
    /// Not listed by the adapter: added by [`crate::MatrixUnits::Emulated16`],
    /// a testing aid on CPU adapters.
    pub emulated: bool,
}

impl std::fmt::Display for CoopMatrixConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{}x{} {}->{}{}",
            self.m,
            self.n,
            self.k,
            self.ab,
            self.cr,
            if self.emulated { " (emulated)" } else { "" }
        )
    }
}

/// Whether `adapter` can take [`MatrixUnits::Emulated16`]: a CPU adapter
/// offering wgpu's cooperative matrices with the 8×8×8 f16 → f32
/// configuration (Mesa 26's lavapipe); else an [`Error::InvalidOption`],
/// before any device is made.
pub(crate) fn check_emulation(adapter: &wgpu::Adapter, matrix_units: MatrixUnits) -> Result<()> {
    if matrix_units != MatrixUnits::Emulated16 {
        return Ok(());
    }
    #[cfg(not(target_arch = "wasm32"))]
    let eight = adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (8, 8, 8)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        });
    #[cfg(target_arch = "wasm32")]
    let eight = false;
    if eight && adapter.get_info().device_type == wgpu::DeviceType::Cpu {
        return Ok(());
    }
    Err(Error::InvalidOption {
        name: "matrix_units",
        value: matrix_units.name().to_string(),
        reason: "is a testing aid for CPU adapters that list 8x8x8 f16->f32 matrices (Mesa 26's lavapipe: .ci/lavapipe-coop); this adapter does not",
    })
}

/// The cooperative-matrix configurations `adapter` reports, when `device`
/// was created with wgpu's `EXPERIMENTAL_COOPERATIVE_MATRIX` feature (none
/// otherwise; none on the web), with the 16×16×16 f16 → f32 configuration
/// added under [`MatrixUnits::Emulated16`] (which [`check_emulation`]
/// admitted) where the 8×8×8 one is listed.
pub(crate) fn cooperative_matrix_configs(
    adapter: &wgpu::Adapter,
    device: &wgpu::Device,
    matrix_units: MatrixUnits,
) -> Vec<CoopMatrixConfig> {
    #[cfg(not(target_arch = "wasm32"))]
    let mut configs: Vec<CoopMatrixConfig> = if device
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    {
        let name = |t: wgpu::CooperativeScalarType| match t {
            wgpu::CooperativeScalarType::F32 => "f32",
            wgpu::CooperativeScalarType::F16 => "f16",
            wgpu::CooperativeScalarType::I32 => "i32",
            wgpu::CooperativeScalarType::U32 => "u32",
        };
        adapter
            .cooperative_matrix_properties()
            .into_iter()
            .map(|p| CoopMatrixConfig {
                m: p.m_size,
                n: p.n_size,
                k: p.k_size,
                ab: name(p.ab_type),
                cr: name(p.cr_type),
                emulated: false,
            })
            .collect()
    } else {
        Vec::new()
    };
    #[cfg(target_arch = "wasm32")]
    let mut configs: Vec<CoopMatrixConfig> = {
        let _ = (adapter, device);
        Vec::new()
    };
    configs.dedup();
    let square = |n: u32| CoopMatrixConfig {
        m: n,
        n,
        k: n,
        ab: "f16",
        cr: "f32",
        emulated: false,
    };
    if matrix_units == MatrixUnits::Emulated16
        && configs.contains(&square(8))
        && !configs.contains(&square(16))
    {
        configs.insert(
            0,
            CoopMatrixConfig {
                emulated: true,
                ..square(16)
            },
        );
    }
    configs
}

impl Capabilities {
    pub(crate) fn new(
        info: &wgpu::AdapterInfo,
        limits: &wgpu::Limits,
        features: wgpu::Features,
    ) -> Self {
        Self {
            adapter: AdapterSummary {
                name: info.name.clone(),
                vendor: info.vendor,
                device: info.device,
                device_type: format!("{:?}", info.device_type),
                backend: format!("{:?}", info.backend),
                driver: info.driver.clone(),
                driver_info: info.driver_info.clone(),
            },
            limits: KernelLimits::from(limits),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            unpack_f16: true,
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            cooperative_matrix: Vec::new(),
        }
    }

    /// Whether the streaming decode kernel can run here: subgroups whose
    /// smallest width holds a team of 4 lanes and whose largest divides its
    /// 128 invocations.
    pub fn stream_decode_subgroups(&self) -> bool {
        self.subgroups
            && self.subgroup_min_size >= 4
            && self.subgroup_max_size <= 128
            && self.subgroup_max_size.is_power_of_two()
    }

    /// The subgroup width when the adapter is CPU-backed, has subgroups, and
    /// their width is fixed at 4 or 8 (lavapipe: 8, SwiftShader: 4).
    pub fn fixed_cpu_subgroup(&self) -> Option<u32> {
        let fixed = self.subgroups && self.subgroup_min_size == self.subgroup_max_size;
        (self.adapter.device_type == "Cpu" && fixed && matches!(self.subgroup_min_size, 4 | 8))
            .then_some(self.subgroup_min_size)
    }

    /// The matrix units the cooperative-matrix kernels can run on, as (matrix
    /// size, subgroup width): a square configuration of 16 (preferred) or 8
    /// with f16 inputs and f32 accumulators among [`Capabilities::cooperative_matrix`],
    /// on an adapter with shader-f16 and subgroups of one fixed width (the
    /// kernels give each subgroup its own block of a tile, so the workgroup's
    /// subgroup count is fixed when a pipeline is compiled). `None` elsewhere:
    /// every browser, adapters without matrix units, and adapters whose
    /// subgroups vary in width.
    pub fn f16_matrix_units(&self) -> Option<(u32, u32)> {
        let fixed = self.subgroups
            && self.subgroup_min_size == self.subgroup_max_size
            && (4..=128).contains(&self.subgroup_min_size);
        if !self.shader_f16 || !fixed {
            return None;
        }
        [16, 8]
            .into_iter()
            .find(|&n| {
                self.cooperative_matrix
                    .iter()
                    .any(|c| (c.m, c.n, c.k, c.ab, c.cr) == (n, n, n, "f16", "f32"))
            })
            .map(|n| (n, self.subgroup_min_size))
    }

    /// The most loop iterations one invocation may run in all, on drivers that
    /// cap them: llvmpipe (lavapipe, and Mesa's GL on the CPU) silently exits
    /// every loop of an invocation after about 65535 iterations in total (32768
    /// for a single flat loop). Kernels whose loop counts grow with the problem
    /// split their work across dispatches to stay under this; `None` means no cap.
    pub fn loop_budget(&self) -> Option<u64> {
        // Measured on Mesa 22.3 llvmpipe; half of the flat-loop cap, for margin.
        self.adapter.name.contains("llvmpipe").then_some(16_000)
    }

    /// One line naming the adapter, its type and backend.
    pub fn summary(&self) -> String {
        format!(
            "{} ({}, {}, {} {})",
            self.adapter.name,
            self.adapter.device_type,
            self.adapter.backend,
            self.adapter.driver,
            self.adapter.driver_info
        )
    }
}
