//! Linear attention's kernels: the elu+1 feature map
//! (`shaders/linear_features.wgsl`), the state sweep over key chunks
//! (`shaders/linear_scan.wgsl`), non-causal output rows
//! (`shaders/linear_output.wgsl`) and the weights
//! (`shaders/linear_weights.wgsl`, after a GEMM of φ(Q) and φ(K)ᵀ).

use crate::device::buffer;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::{Error, Result};
use crate::kernels::gemm;
use crate::kernels::gemm::GemmSpec;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Invocations per workgroup of the element-wise kernels (feature map, weights).
pub const ELEMENT_WORKGROUP: usize = 256;
/// Invocations per workgroup of the scan and output kernels.
pub const COLUMN_WORKGROUP: usize = 64;

/// The sizes of one linear attention problem, batch and heads folded together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearSizes {
    /// Batch × heads.
    pub heads: usize,
    /// Query rows N.
    pub q_len: usize,
    /// Key/value rows M.
    pub kv_len: usize,
    /// Query/key width Dk.
    pub dk: usize,
    /// Value width Dv.
    pub dv: usize,
}

impl LinearSizes {
    /// Elements of the running state: S and a copy of z per value column, `[BH, 2, Dk, Dv]`.
    pub fn state_len(&self) -> usize {
        self.heads * 2 * self.dk * self.dv
    }

    /// Loop iterations the scan kernel runs per key (the Dk loop, the key
    /// loop's own step, and margin).
    pub fn scan_iterations_per_key(&self) -> u64 {
        self.dk as u64 + 2
    }

    /// Keys per scan dispatch so that no invocation exceeds `budget` loop
    /// iterations (all keys at once without a budget). An error when even one
    /// key's Dk loop exceeds the budget.
    pub fn keys_per_chunk(&self, budget: Option<u64>) -> Result<usize> {
        let Some(budget) = budget else {
            return Ok(self.kv_len.max(1));
        };
        let per_key = self.scan_iterations_per_key();
        if per_key > budget {
            return Err(Error::Limit {
                what: format!("linear attention with Dk = {}", self.dk),
                needed: per_key,
                limit: budget,
                limit_name: "loop iterations per invocation on this driver",
                hint: "use a smaller head dim, or the CPU engine",
            });
        }
        Ok(((budget / per_key) as usize).clamp(1, self.kv_len.max(1)))
    }
}

crate::shader::uniform::uniform_block! {
    pub(crate) struct FeatureParams {
        len: u32,
        _pad: [u32; 3],
    }
}

crate::shader::uniform::uniform_block! {
    pub(crate) struct ScanParams {
        /// B * H.
        heads: u32,
        q_len: u32,
        kv_len: u32,
        dk: u32,
        dv: u32,
        start: u32,
        end: u32,
        causal: u32,
    }
}

crate::shader::uniform::uniform_block! {
    pub(crate) struct OutputParams {
        /// B * H.
        heads: u32,
        q_len: u32,
        dk: u32,
        dv: u32,
    }
}

crate::shader::uniform::uniform_block! {
    pub(crate) struct WeightParams {
        /// B * H * N.
        rows: u32,
        q_len: u32,
        kv_len: u32,
        causal: u32,
    }
}

/// The device buffers of one forward call.
pub(crate) struct LinearBuffers<'a> {
    /// Q `[BH, N, Dk]`.
    pub q: &'a wgpu::Buffer,
    /// K `[BH, M, Dk]`.
    pub k: &'a wgpu::Buffer,
    /// V `[BH, M, Dv]`.
    pub v: &'a wgpu::Buffer,
    /// Scratch: φ(Q), same size as Q.
    pub phi_q: &'a wgpu::Buffer,
    /// Scratch: φ(K), same size as K.
    pub phi_k: &'a wgpu::Buffer,
    /// Scratch: the running state, [`LinearSizes::state_len`] zeros.
    pub state: &'a wgpu::Buffer,
    /// Scratch: the row normalisers φ(q_i)·z_i, `[BH, N]`.
    pub norm: &'a wgpu::Buffer,
    /// Output Y `[BH, N, Dv]`.
    pub y: &'a wgpu::Buffer,
    /// Output weights `[BH, N, M]`, when asked for.
    pub weights: Option<&'a wgpu::Buffer>,
}

/// Records the whole forward: feature maps, the state sweep in as many key
/// chunks as the driver's loop budget needs, the output rows and, when there
/// is a weights buffer, the weights. No readback in between.
pub(crate) fn record_forward(
    rec: &mut Recorder<'_>,
    sizes: &LinearSizes,
    causal: bool,
    buffers: &LinearBuffers<'_>,
    gemm: gemm::GemmChoice,
) -> Result<()> {
    let ctx = rec.ctx();
    let chunk = sizes.keys_per_chunk(ctx.caps.loop_budget())?;
    let q_len = sizes.heads * sizes.q_len * sizes.dk;
    let k_len = sizes.heads * sizes.kv_len * sizes.dk;
    record_features(rec, buffers.q, buffers.phi_q, q_len)?;
    record_features(rec, buffers.k, buffers.phi_k, k_len)?;

    let scan = ctx
        .pipelines
        .get(&PipelineKey::new(crate::kernels::linear::LINEAR_SCAN));
    let columns = (sizes.heads * sizes.dv).div_ceil(COLUMN_WORKGROUP) as u64;
    let mut start = 0;
    while start < sizes.kv_len {
        let end = (start + chunk).min(sizes.kv_len);
        let uniform = buffer::uniform(
            ctx,
            "linear scan params",
            &ScanParams {
                heads: sizes.heads as u32,
                q_len: sizes.q_len as u32,
                kv_len: sizes.kv_len as u32,
                dk: sizes.dk as u32,
                dv: sizes.dv as u32,
                start: start as u32,
                end: end as u32,
                causal: u32::from(causal),
            },
        );
        rec.dispatch(
            &scan,
            &[
                &uniform,
                buffers.phi_q,
                buffers.phi_k,
                buffers.v,
                buffers.state,
                buffers.y,
                buffers.norm,
            ],
            columns,
        )?;
        start = end;
    }

    if !causal {
        let uniform = buffer::uniform(
            ctx,
            "linear output params",
            &OutputParams {
                heads: sizes.heads as u32,
                q_len: sizes.q_len as u32,
                dk: sizes.dk as u32,
                dv: sizes.dv as u32,
            },
        );
        let pipeline = ctx
            .pipelines
            .get(&PipelineKey::new(crate::kernels::linear::LINEAR_OUTPUT));
        let elements = sizes.heads * sizes.q_len * sizes.dv;
        rec.dispatch(
            &pipeline,
            &[
                &uniform,
                buffers.phi_q,
                buffers.state,
                buffers.y,
                buffers.norm,
            ],
            elements.div_ceil(COLUMN_WORKGROUP) as u64,
        )?;
    }

    if let Some(weights) = buffers.weights {
        let spec = GemmSpec::contiguous(
            sizes.heads,
            sizes.q_len,
            sizes.kv_len,
            sizes.dk,
            false,
            true,
        );
        spec.check()?;
        let kernel = gemm.for_product(&ctx.caps, &spec);
        gemm::record(rec, kernel, &spec, buffers.phi_q, buffers.phi_k, weights)?;
        let uniform = buffer::uniform(
            ctx,
            "linear weights params",
            &WeightParams {
                rows: (sizes.heads * sizes.q_len) as u32,
                q_len: sizes.q_len as u32,
                kv_len: sizes.kv_len as u32,
                causal: u32::from(causal),
            },
        );
        let pipeline = ctx
            .pipelines
            .get(&PipelineKey::new(crate::kernels::linear::LINEAR_WEIGHTS));
        let elements = sizes.heads * sizes.q_len * sizes.kv_len;
        rec.dispatch(
            &pipeline,
            &[&uniform, buffers.norm, weights],
            elements.div_ceil(ELEMENT_WORKGROUP) as u64,
        )?;
    }
    Ok(())
}

/// Records φ(x) = elu(x) + 1 of `len` values from `x` into `phi`.
pub(crate) fn record_features(
    rec: &mut Recorder<'_>,
    x: &wgpu::Buffer,
    phi: &wgpu::Buffer,
    len: usize,
) -> Result<()> {
    let ctx = rec.ctx();
    let uniform = buffer::uniform(
        ctx,
        "linear features params",
        &FeatureParams {
            len: len as u32,
            _pad: [0; 3],
        },
    );
    let pipeline = ctx
        .pipelines
        .get(&PipelineKey::new(crate::kernels::linear::LINEAR_FEATURES));
    rec.dispatch(
        &pipeline,
        &[&uniform, x, phi],
        len.div_ceil(ELEMENT_WORKGROUP) as u64,
    )
}

/// The elu+1 feature map of linear attention (`shaders/linear_features.wgsl`).
pub const LINEAR_FEATURES: Kernel = Kernel::new(&KernelDef {
    name: "linear_features",
    origin: Origin::File(
        "linear_features.wgsl",
        include_str!("../../shaders/linear_features.wgsl"),
    ),
    slots: &[],
    bindings: &[Binding::Uniform, Binding::Read, Binding::ReadWrite],
    params: ParamsText::of::<FeatureParams>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});
/// Linear attention's running state over a key range; causal rows as it goes (`shaders/linear_scan.wgsl`).
pub const LINEAR_SCAN: Kernel = Kernel::new(&KernelDef {
    name: "linear_scan",
    origin: Origin::File(
        "linear_scan.wgsl",
        include_str!("../../shaders/linear_scan.wgsl"),
    ),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<ScanParams>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});
/// Non-causal linear attention rows from the final state (`shaders/linear_output.wgsl`).
pub const LINEAR_OUTPUT: Kernel = Kernel::new(&KernelDef {
    name: "linear_output",
    origin: Origin::File(
        "linear_output.wgsl",
        include_str!("../../shaders/linear_output.wgsl"),
    ),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<OutputParams>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});
/// Linear attention weights from scores and row normalisers (`shaders/linear_weights.wgsl`).
pub const LINEAR_WEIGHTS: Kernel = Kernel::new(&KernelDef {
    name: "linear_weights",
    origin: Origin::File(
        "linear_weights.wgsl",
        include_str!("../../shaders/linear_weights.wgsl"),
    ),
    slots: &[],
    bindings: &[Binding::Uniform, Binding::Read, Binding::ReadWrite],
    params: ParamsText::of::<WeightParams>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 4] = [LINEAR_FEATURES, LINEAR_SCAN, LINEAR_OUTPUT, LINEAR_WEIGHTS];

/// The family's pipelines (no override constants).
pub fn variants() -> Vec<PipelineKey> {
    [LINEAR_FEATURES, LINEAR_SCAN, LINEAR_OUTPUT, LINEAR_WEIGHTS]
        .map(PipelineKey::new)
        .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_respect_the_loop_budget() {
        let sizes = LinearSizes {
            heads: 1,
            q_len: 1025,
            kv_len: 1025,
            dk: 64,
            dv: 64,
        };
        assert_eq!(sizes.keys_per_chunk(None).unwrap(), 1025);
        let chunk = sizes.keys_per_chunk(Some(16_000)).unwrap();
        assert!(chunk as u64 * sizes.scan_iterations_per_key() <= 16_000);
        assert!(chunk < 1025, "N = 1025 at Dk = 64 needs several chunks");
        let wide = LinearSizes {
            dk: 20_000,
            ..sizes
        };
        assert!(matches!(
            wide.keys_per_chunk(Some(16_000)),
            Err(Error::Limit { .. })
        ));
    }
}
