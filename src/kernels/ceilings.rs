//! The device's own ceilings, which every measured kernel is reported
//! against: FMA throughput (`shaders/fma_peak.wgsl`) and memory bandwidth,
//! a vec4 copy (`shaders/copy_peak.wgsl`). `crate::measure` times them.

use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::key::PipelineKey;
use crate::shader::uniform::ParamsText;

crate::shader::uniform::uniform_block! {
    /// `fma_peak.wgsl`'s parameters.
    pub(crate) struct FmaParams {
        pub(crate) iterations: u32,
        pub(crate) mul: f32,
        pub(crate) add: f32,
        pub(crate) _pad: u32,
    }
}

crate::shader::uniform::uniform_block! {
    /// `copy_peak.wgsl`'s parameters.
    pub(crate) struct CopyParams {
        /// vec4 elements to copy.
        pub(crate) count: u32,
        /// Invocations launched: the loop's step.
        pub(crate) stride: u32,
        pub(crate) _pad: [u32; 2],
    }
}

/// The FMA-throughput ceiling (`shaders/fma_peak.wgsl`).
pub const FMA_PEAK: Kernel = Kernel::new(&KernelDef {
    name: "fma_peak",
    origin: Origin::File("fma_peak.wgsl", include_str!("../../shaders/fma_peak.wgsl")),
    slots: &[],
    bindings: &[Binding::Uniform, Binding::ReadWrite],
    params: ParamsText::of::<FmaParams>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});
/// The memory-bandwidth ceiling: a vec4 copy (`shaders/copy_peak.wgsl`).
pub const COPY_PEAK: Kernel = Kernel::new(&KernelDef {
    name: "copy_peak",
    origin: Origin::File(
        "copy_peak.wgsl",
        include_str!("../../shaders/copy_peak.wgsl"),
    ),
    slots: &[],
    bindings: &[Binding::Uniform, Binding::Read, Binding::ReadWrite],
    params: ParamsText::of::<CopyParams>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 2] = [FMA_PEAK, COPY_PEAK];

/// The ceilings' pipelines: the FMA kernel at the workgroups the bench and
/// the clock guard run, the copy at 256.
pub fn variants() -> Vec<PipelineKey> {
    vec![
        PipelineKey::new(FMA_PEAK).with("WORKGROUP", 64),
        PipelineKey::new(FMA_PEAK).with("WORKGROUP", 256),
        PipelineKey::new(COPY_PEAK).with("WORKGROUP", 256),
    ]
}
