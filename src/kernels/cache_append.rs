//! A decoder step's keys and values into its preallocated KV cache in one
//! dispatch (`shaders/cache_append.wgsl`): the keys rotated by RoPE on the
//! way (or copied), the values copied. Prepared once per step shape; each
//! step rewrites the cache's length and the position in its uniform and
//! records with no allocation.

use crate::device::scope::Run;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;
use std::sync::Mutex;

use crate::device::buffer;
use crate::device::pipeline::{Pipeline, PipelineKey};
use crate::device::recorder::Recorder;
use crate::error::Result;
use crate::kernels::position::PositionMode;

/// Invocations per workgroup; matches the WGSL.
const WORKGROUP: usize = 64;

crate::shader::uniform::uniform_block! {
    /// The uniform block of `shaders/cache_append.wgsl`.
    pub(crate) struct Params {
        rows: u32,
        dim: u32,
        /// Pairs per row: dim / 2 for RoPE, ceil(dim / 2) for copies.
        pairs: u32,
        seq_len: u32,
        /// The position of each sequence's first new token.
        offset: u32,
        /// 0: copy, 1: RoPE on interleaved pairs, 2: RoPE on half-split pairs.
        mode: u32,
        cache_len: u32,
        capacity: u32,
    }
}

/// Where a step's rows go: the cache's buffers, its rows per sequence, and
/// the tokens each sequence held before the step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheSlot<'a> {
    pub key: &'a wgpu::Buffer,
    pub value: &'a wgpu::Buffer,
    pub capacity: usize,
    pub len: usize,
}

/// The append prepared for `rows` rows of `dim` values (sequences of
/// `seq_len` new tokens), rotating the keys when `rope` gives a RoPE layout
/// and its inverse frequencies.
#[derive(Debug)]
pub(crate) struct PreparedCacheAppend {
    pipeline: std::sync::Arc<Pipeline>,
    uniform: wgpu::Buffer,
    inv_freq: wgpu::Buffer,
    /// What the uniform holds now.
    params: Mutex<Params>,
    workgroups: u64,
}

impl PreparedCacheAppend {
    /// Prepares the pipeline, its uniform and the inverse frequencies.
    pub(crate) fn prepare(
        ctx: &Run,
        rope: Option<(PositionMode, &[f32])>,
        rows: usize,
        dim: usize,
        seq_len: usize,
    ) -> Result<Self> {
        let (mode, pairs, freqs) = match rope {
            Some((mode, freqs)) => (mode as u32, dim / 2, freqs),
            None => (0, dim.div_ceil(2), &[0.0f32][..]),
        };
        let params = Params {
            rows: rows as u32,
            dim: dim as u32,
            pairs: pairs as u32,
            seq_len: seq_len.max(1) as u32,
            offset: 0,
            mode,
            cache_len: 0,
            capacity: 0,
        };
        Ok(PreparedCacheAppend {
            pipeline: ctx.pipelines.get(&PipelineKey::new(
                crate::kernels::cache_append::CACHE_APPEND,
            )),
            uniform: buffer::uniform(ctx, "cache append params", &params),
            inv_freq: buffer::upload(ctx, "inverse frequencies", freqs)?,
            params: Mutex::new(params),
            workgroups: (rows * pairs).div_ceil(WORKGROUP) as u64,
        })
    }

    /// Records the append of `key` and `value` (the step's rows) into
    /// `slot`, the keys' first new token at RoPE position `offset`.
    pub(crate) fn record(
        &self,
        rec: &mut Recorder<'_>,
        key: &wgpu::Buffer,
        value: &wgpu::Buffer,
        slot: CacheSlot<'_>,
        offset: usize,
    ) -> Result<()> {
        {
            let mut params = self
                .params
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Params {
                offset: offset as u32,
                cache_len: slot.len as u32,
                capacity: slot.capacity as u32,
                ..*params
            };
            if bytemuck::bytes_of(&now) != bytemuck::bytes_of(&*params) {
                crate::device::buffer::write_bytes(
                    rec.ctx(),
                    &self.uniform,
                    0,
                    bytemuck::bytes_of(&now),
                );
                *params = now;
            }
        }
        rec.dispatch(
            &self.pipeline,
            &[
                &self.uniform,
                key,
                value,
                &self.inv_freq,
                slot.key,
                slot.value,
            ],
            self.workgroups,
        )
    }
}

/// A decoder step's keys (rotated by RoPE, or copied) and values into its preallocated KV cache (`shaders/cache_append.wgsl`).
pub const CACHE_APPEND: Kernel = Kernel::new(&KernelDef {
    name: "cache_append",
    origin: Origin::File(
        "cache_append.wgsl",
        include_str!("../../shaders/cache_append.wgsl"),
    ),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 1] = [CACHE_APPEND];

/// The family's pipelines (no override constants).
pub fn variants() -> Vec<PipelineKey> {
    [CACHE_APPEND].map(PipelineKey::new).to_vec()
}
