//! The device's own ceilings, which every measured kernel is reported
//! against: FMA throughput (`shaders/fma_peak.wgsl`) and memory bandwidth,
//! a vec4 copy (`shaders/copy_peak.wgsl`). `crate::measure` times them.

crate::kernels::uniform::uniform_block! {
    /// `fma_peak.wgsl`'s parameters.
    pub(crate) struct FmaParams {
        pub(crate) iterations: u32,
        pub(crate) mul: f32,
        pub(crate) add: f32,
        pub(crate) _pad: u32,
    }
}

crate::kernels::uniform::uniform_block! {
    /// `copy_peak.wgsl`'s parameters.
    pub(crate) struct CopyParams {
        pub(crate) count: u32,
        pub(crate) stride: u32,
        pub(crate) _pad: [u32; 2],
    }
}
