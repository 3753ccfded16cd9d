//! Skinny products for decoder steps (`shaders/projection.wgsl`): `x Wᵀ + b`
//! for a few rows of `x`, each weight read once, from weights laid out at load
//! (`PackedWeights`: f32, or f16 pairs that halve the bytes a step reads).
//!
//! A `Projection` is prepared once per shape (pipeline and parameter
//! buffers) and recorded as often as wanted with no allocation: a decoder
//! step's Q, K and V come from one dispatch of a fused matrix, its output
//! projection from another.

use crate::device::scope::Run;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;
use std::sync::Arc;

use crate::device::buffer;
use crate::device::pipeline::{Pipeline, PipelineKey};
use crate::device::recorder::Recorder;
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

/// Rows of `x` one dispatch takes; more rows take one dispatch per block.
pub const MAX_ROWS: usize = 16;
/// Output features per workgroup; matches the WGSL.
const TEAMS: usize = 4;
/// Invocations per feature; matches the WGSL.
const LANES: usize = 32;

/// How a layer keeps its weights on the device. Arithmetic is f32 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum WeightStorage {
    /// Four bytes a weight.
    #[default]
    F32,
    /// Two bytes a weight (rounded to nearest at load): half the bytes a
    /// decoder step streams.
    F16,
}

impl WeightStorage {
    /// Weights in one 16-byte word of the packed matrix.
    fn per_word(self) -> usize {
        match self {
            WeightStorage::F32 => 4,
            WeightStorage::F16 => 8,
        }
    }

    /// Bytes one weight takes on the device.
    pub fn bytes_per_weight(self) -> usize {
        match self {
            WeightStorage::F32 => 4,
            WeightStorage::F16 => 2,
        }
    }
}

crate::shader::uniform::uniform_block! {
    /// The uniform block of `shaders/projection.wgsl`.
    pub(crate) struct Params {
        rows: u32,
        row_base: u32,
        in_dim: u32,
        w_stride: u32,
        features: u32,
        seq_len: u32,
        x_batch: u32,
        x_row: u32,
        x_group: u32,
        x_group_stride: u32,
        /// The first feature this dispatch computes (`features` is one past its last).
        feature_base: u32,
        _pad: u32,
        seg_end: [u32; 4],
        seg_width: [u32; 4],
        out_base: [u32; 4],
        out_batch: [u32; 4],
        out_head: [u32; 4],
        out_row: [u32; 4],
    }
}

/// The pipeline key: weights' storage, and rows of x (1..=[`MAX_ROWS`]).
pub fn key(f16_weights: bool, rows: usize) -> PipelineKey {
    PipelineKey::new(crate::kernels::projection::PROJECTION)
        .with_flag("F16_WEIGHTS", f16_weights)
        .with("ROWS", rows.clamp(1, MAX_ROWS) as i64)
}

/// Linear maps stacked into one matrix `[features, in_dim]`, stored as the
/// kernel reads it: each row padded with zeros to whole 16-byte words, the
/// biases (zeros where a map has none) beside it in f32.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    pub words: wgpu::Buffer,
    pub bias: wgpu::Buffer,
    pub features: usize,
    pub in_dim: usize,
    /// 16-byte words per row.
    pub stride: usize,
    pub storage: WeightStorage,
    /// Whether any of the maps has a bias.
    pub has_bias: bool,
}

impl PackedWeights {
    /// Packs `maps` (weights `[out, in_dim]` each, optional bias `[out]`) one
    /// after another and uploads them.
    pub(crate) fn upload(
        ctx: &Run,
        label: &str,
        maps: &[(&HostTensor, Option<&HostTensor>)],
        storage: WeightStorage,
    ) -> Result<PackedWeights> {
        let in_dim = maps[0].0.shape()[1];
        let features: usize = maps.iter().map(|(w, _)| w.shape()[0]).sum();
        let per_word = storage.per_word();
        let stride = in_dim.div_ceil(per_word);
        let row_values = stride * per_word;
        let mut bits: Vec<u32> = Vec::new();
        bits.try_reserve_exact(features * stride * 4)
            .map_err(|_| Error::OutOfMemory(format!("packing {label}")))?;
        let mut bias = Vec::with_capacity(features);
        for (w, b) in maps {
            debug_assert_eq!(w.shape()[1], in_dim);
            for row in w.data().chunks(in_dim) {
                let padded = row.iter().copied().chain(std::iter::repeat(0.0));
                match storage {
                    WeightStorage::F32 => bits.extend(padded.take(row_values).map(f32::to_bits)),
                    WeightStorage::F16 => {
                        let halves: Vec<u32> = padded
                            .take(row_values)
                            .map(|v| u32::from(half::f16::from_f32(v).to_bits()))
                            .collect();
                        bits.extend(halves.chunks(2).map(|p| p[0] | (p[1] << 16)));
                    }
                }
            }
            match b {
                Some(b) => bias.extend_from_slice(b.data()),
                None => bias.extend(std::iter::repeat_n(0.0, w.shape()[0])),
            }
        }
        Ok(PackedWeights {
            words: buffer::upload(ctx, label, &bits)?,
            bias: buffer::upload(ctx, "projection bias", &bias)?,
            features,
            in_dim,
            stride,
            storage,
            has_bias: maps.iter().any(|(_, b)| b.is_some()),
        })
    }

    /// Bytes of weights a product reads (each once).
    pub(crate) fn bytes(&self) -> u64 {
        (self.features * self.stride * 16) as u64
    }
}

/// Where feature `k` of row `(b, t)` of `x` sits: `b·batch + t·row +
/// g·group_stride + k - g·group`, `g = k / group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InputLayout {
    pub seq_len: usize,
    pub batch: usize,
    pub row: usize,
    pub group: usize,
    pub group_stride: usize,
}

impl InputLayout {
    /// `[B, seq_len, features]`.
    pub(crate) fn rows(seq_len: usize, features: usize) -> Self {
        Self {
            seq_len,
            batch: seq_len * features,
            row: features,
            group: features.max(1),
            group_stride: 0,
        }
    }

    /// `[B, heads, seq_len, head_dim]` read as `[B, seq_len, heads·head_dim]`.
    pub(crate) fn heads(heads: usize, seq_len: usize, head_dim: usize) -> Self {
        Self {
            seq_len,
            batch: heads * seq_len * head_dim,
            row: head_dim,
            group: head_dim.max(1),
            group_stride: seq_len * head_dim,
        }
    }
}

/// Features below `end` (absolute) as heads of `width` values, written at
/// `base + b·batch + h·head + t·row + c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub end: usize,
    pub width: usize,
    pub base: usize,
    pub batch: usize,
    pub head: usize,
    pub row: usize,
}

impl Segment {
    /// `[B, heads, seq_len, width]` from `base`, ending at feature `end`.
    pub(crate) fn heads(end: usize, heads: usize, seq_len: usize, width: usize) -> Self {
        Self {
            end,
            width,
            base: 0,
            batch: heads * seq_len * width,
            head: seq_len * width,
            row: width,
        }
    }

    /// `[B, seq_len, features]`, ending at feature `end`.
    pub(crate) fn rows(end: usize, seq_len: usize, features: usize) -> Self {
        Self {
            end,
            width: features,
            base: 0,
            batch: seq_len * features,
            head: 0,
            row: features,
        }
    }
}

/// One prepared product: features `[first, first + count)` of a packed matrix
/// for `rows` rows of `x`, into up to three outputs. Its parameters are on
/// the device already; recording it allocates nothing.
#[derive(Debug)]
pub(crate) struct Projection {
    /// One pipeline and parameter block per block of [`MAX_ROWS`] rows (the
    /// last block's pipeline compiled for its own row count).
    blocks: Vec<(Arc<Pipeline>, wgpu::Buffer)>,
    workgroups: u64,
    outputs: usize,
    /// Bound in place of the outputs a product lacks (WebGPU forbids one
    /// buffer in two writable bindings).
    spares: Vec<wgpu::Buffer>,
}

impl Projection {
    /// Prepares the product; `segments` (one to three) cover the features in
    /// order, `segments.last().end == first + count`.
    pub(crate) fn prepare(
        ctx: &Run,
        weights: &PackedWeights,
        (first, count): (usize, usize),
        rows: usize,
        input: InputLayout,
        segments: &[Segment],
    ) -> Result<Projection> {
        if !(1..=3).contains(&segments.len())
            || count == 0
            || rows == 0
            || segments.last().map(|s| s.end) != Some(first + count)
        {
            return Err(Error::Conflict(
                "a projection needs rows, features and one to three segments ending at its last feature",
            ));
        }
        // llvmpipe ends an invocation's loops past a budget: the weight walk
        // takes stride / LANES steps of MAX_ROWS rows each.
        let steps = 3 * MAX_ROWS + LANES + weights.stride.div_ceil(LANES) * (MAX_ROWS + 1);
        if let Some(budget) = ctx.caps.loop_budget() {
            if steps as u64 > budget {
                return Err(Error::Limit {
                    what: format!("a projection of {} input features", weights.in_dim),
                    needed: steps as u64,
                    limit: budget,
                    limit_name: "loop iterations per invocation (llvmpipe)",
                    hint: "use fewer input features per layer",
                });
            }
        }
        let u = |x: usize| {
            u32::try_from(x).map_err(|_| Error::Limit {
                what: "a projection's index".into(),
                needed: x as u64,
                limit: u64::from(u32::MAX),
                limit_name: "u32 indices",
                hint: "use smaller layers",
            })
        };
        let pick = |f: fn(&Segment) -> usize| -> Result<[u32; 4]> {
            let mut out = [0u32; 4];
            for (i, slot) in out.iter_mut().take(3).enumerate() {
                // Segments a product lacks end where the last one does.
                let s = segments.get(i).unwrap_or(&segments[segments.len() - 1]);
                *slot = u(f(s))?;
            }
            Ok(out)
        };
        let template = Params {
            rows: 0,
            row_base: 0,
            in_dim: u(weights.in_dim)?,
            w_stride: u(weights.stride)?,
            features: u(first + count)?,
            seq_len: u(input.seq_len.max(1))?,
            x_batch: u(input.batch)?,
            x_row: u(input.row)?,
            x_group: u(input.group)?,
            x_group_stride: u(input.group_stride)?,
            feature_base: u(first)?,
            _pad: 0,
            seg_end: pick(|s| s.end)?,
            seg_width: pick(|s| s.width.max(1))?,
            out_base: pick(|s| s.base)?,
            out_batch: pick(|s| s.batch)?,
            out_head: pick(|s| s.head)?,
            out_row: pick(|s| s.row)?,
        };
        let f16 = weights.storage == WeightStorage::F16;
        let blocks = (0..rows)
            .step_by(MAX_ROWS)
            .map(|base| {
                let block_rows = (rows - base).min(MAX_ROWS);
                let params = Params {
                    rows: block_rows as u32,
                    row_base: base as u32,
                    ..template
                };
                (
                    ctx.pipelines.get(&key(f16, block_rows)),
                    buffer::uniform(ctx, "projection params", &params),
                )
            })
            .collect();
        let spares = (segments.len()..3)
            .map(|_| buffer::storage(ctx, "projection spare output", 4))
            .collect::<Result<Vec<_>>>()?;
        Ok(Projection {
            blocks,
            workgroups: count.div_ceil(TEAMS) as u64,
            outputs: segments.len(),
            spares,
        })
    }

    /// Records the product of `x` with `weights` (those it was prepared
    /// for) into `outputs` (as many as its segments).
    pub(crate) fn record(
        &self,
        rec: &mut Recorder<'_>,
        x: &wgpu::Buffer,
        weights: &PackedWeights,
        outputs: &[&wgpu::Buffer],
    ) -> Result<()> {
        debug_assert_eq!(outputs.len(), self.outputs);
        let mut outs: Vec<&wgpu::Buffer> = outputs.to_vec();
        outs.extend(self.spares.iter());
        for (pipeline, uniform) in &self.blocks {
            rec.dispatch(
                pipeline,
                &[
                    uniform,
                    x,
                    &weights.words,
                    &weights.bias,
                    outs[0],
                    outs[1],
                    outs[2],
                ],
                self.workgroups,
            )?;
        }
        Ok(())
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The Rust parameter block is the WGSL one, field by field: a field
    /// added on one side cannot shift the other silently.
    #[test]
    fn params_match_the_wgsl_struct() {
        let module =
            naga::front::wgsl::parse_str(crate::kernels::projection::PROJECTION.source()).unwrap();
        let params = module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some("Params"))
            .expect("a Params struct");
        let naga::TypeInner::Struct { members, span } = &params.1.inner else {
            panic!("Params is a struct");
        };
        let rust = [
            ("rows", offset_of!(Params, rows)),
            ("row_base", offset_of!(Params, row_base)),
            ("in_dim", offset_of!(Params, in_dim)),
            ("w_stride", offset_of!(Params, w_stride)),
            ("features", offset_of!(Params, features)),
            ("seq_len", offset_of!(Params, seq_len)),
            ("x_batch", offset_of!(Params, x_batch)),
            ("x_row", offset_of!(Params, x_row)),
            ("x_group", offset_of!(Params, x_group)),
            ("x_group_stride", offset_of!(Params, x_group_stride)),
            ("feature_base", offset_of!(Params, feature_base)),
            ("_pad", offset_of!(Params, _pad)),
            ("seg_end", offset_of!(Params, seg_end)),
            ("seg_width", offset_of!(Params, seg_width)),
            ("out_base", offset_of!(Params, out_base)),
            ("out_batch", offset_of!(Params, out_batch)),
            ("out_head", offset_of!(Params, out_head)),
            ("out_row", offset_of!(Params, out_row)),
        ];
        let wgsl: Vec<(String, usize)> = members
            .iter()
            .map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize))
            .collect();
        let rust: Vec<(String, usize)> = rust.iter().map(|&(n, o)| (n.to_string(), o)).collect();
        assert_eq!(wgsl, rust);
        assert_eq!(*span as usize, size_of::<Params>());
    }
}

/// Skinny products `x Wᵀ + b` for a few rows, f32 or f16 weights, up to three head-major outputs (`shaders/projection.wgsl`).
pub const PROJECTION: Kernel = Kernel::new(&KernelDef {
    name: "projection",
    origin: Origin::File(
        "projection.wgsl",
        include_str!("../../shaders/projection.wgsl"),
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
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 1] = [PROJECTION];

/// The family's pipelines: f32 and f16 weights at one row, a few and the most.
pub fn variants() -> Vec<PipelineKey> {
    let mut keys = Vec::new();
    for f16 in [false, true] {
        for rows in [1, 7, MAX_ROWS] {
            keys.push(key(f16, rows));
        }
    }
    keys
}
