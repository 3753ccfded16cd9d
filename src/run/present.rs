//! What every GPU attention path needs before its kernels: keys and values in
//! one `[B, Hkv, T, D]` buffer (the past concatenated in front, or copies when
//! the caller asks for `present_key/value`), and `nonpad_kv_seqlen` on the device.

use crate::device::buffer;
use crate::device::chunks::{Held, Source};
use crate::device::recorder::Recorder;
use crate::device::scope::Run;
use crate::error::{Error, Result};
use crate::kernels::concat;
use crate::problem::AttentionDims;

/// The device buffers of one call's inputs. Q, K and V are whole buffers,
/// several buffers (a tensor larger than one, which `run/split.rs` cuts
/// into pieces), or (a piece of a call, on the fused route only) views of
/// the call's.
pub(crate) struct GpuInputs<'a> {
    pub q: Source<'a>,
    pub k: Source<'a>,
    pub v: Source<'a>,
    pub mask: Option<Source<'a>>,
    pub past_key: Option<Source<'a>>,
    pub past_value: Option<Source<'a>>,
    pub nonpad: Option<&'a [i64]>,
    /// Whether K and V hold f16 values (see `run/half.rs`); the other
    /// buffers hold f32.
    pub kv_f16: bool,
}

/// The device buffers of one call's outputs: one buffer each, or several
/// where a call in pieces has an output larger than one.
pub(crate) struct GpuOutputs {
    pub y: Held,
    pub lse: Held,
    pub qk: Option<Held>,
    pub present_key: Option<Held>,
    pub present_value: Option<Held>,
    /// Bytes of device memory the call allocated (outputs and scratch).
    pub allocated_bytes: u64,
    /// Pieces the call ran in (1: whole; more when its tensors exceed a binding).
    pub pieces: usize,
}

impl<'a> GpuInputs<'a> {
    /// The mask as one whole buffer, for the steps that bind it whole.
    pub(crate) fn whole_mask(&self) -> Result<Option<&'a wgpu::Buffer>> {
        match self.mask {
            None => Ok(None),
            Some(m) => m.whole_buffer().map(Some).ok_or(Error::Conflict(
                "a mask held in several buffers goes to the kernels only in pieces",
            )),
        }
    }

    /// Q, K and V as whole buffers, for the steps that bind or copy them
    /// whole (the unfused path, the presents); views are a piece's, which
    /// never reach those, and chunks are cut into pieces first.
    pub(crate) fn whole_qkv(
        &self,
    ) -> Result<(&'a wgpu::Buffer, &'a wgpu::Buffer, &'a wgpu::Buffer)> {
        match (
            self.q.whole_buffer(),
            self.k.whole_buffer(),
            self.v.whole_buffer(),
        ) {
            (Some(q), Some(k), Some(v)) => Ok((q, k, v)),
            _ => Err(Error::Conflict(
                "views of a call's tensors go to the fused kernels only",
            )),
        }
    }
}

pub(crate) use crate::plan::workspace::{bytes, needs_present};

/// Checks, before anything is recorded, that the present buffers fit.
pub(crate) fn check_present(
    ctx: &crate::device::context::GpuContext,
    dims: &AttentionDims,
    want_present: bool,
) -> Result<u64> {
    if !needs_present(dims, want_present) {
        return Ok(0);
    }
    let (kb, vb) = crate::plan::workspace::present_bytes(dims);
    buffer::check_bindable(ctx, "present_key", kb)?;
    buffer::check_bindable(ctx, "present_value", vb)?;
    Ok(kb + vb)
}

/// Records `present = [past; new]` for keys and values when there is a past
/// (or copies of K and V when only the presents were asked for). Returns them,
/// or `None` when K and V can be read as they are.
pub(crate) fn record_present(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    want_present: bool,
) -> Result<Option<(wgpu::Buffer, wgpu::Buffer)>> {
    if !needs_present(dims, want_present) {
        return Ok(None);
    }
    let ctx = rec.ctx();
    let (_, k, v) = inputs.whole_qkv()?;
    let heads = dims.batch * dims.kv_heads;
    let (dk, dv, t) = (dims.head_dim, dims.v_head_dim, dims.total_len());
    let pk = buffer::storage(ctx, "present_key", heads * t * dk)?;
    let pv = buffer::storage(ctx, "present_value", heads * t * dv)?;
    if dims.has_past && dims.past_len > 0 {
        let past_k = inputs.past_key.and_then(|s| s.whole_buffer());
        let past_v = inputs.past_value.and_then(|s| s.whole_buffer());
        let (Some(past_k), Some(past_v)) = (past_k, past_v) else {
            return Err(Error::Conflict(
                "past_key and past_value must be given together",
            ));
        };
        concat::record(rec, heads, dims.past_len, dims.kv_len, dk, past_k, k, &pk)?;
        concat::record(rec, heads, dims.past_len, dims.kv_len, dv, past_v, v, &pv)?;
    } else {
        rec.copy(k, 0, &pk, 0, heads * t * dk);
        rec.copy(v, 0, &pv, 0, heads * t * dv);
    }
    Ok(Some((pk, pv)))
}

/// The per-call rule data every masking kernel binds as `nonpad` (i32 words):
/// `nonpad_kv_seqlen` (B words, zeros when absent), then with ALiBi the
/// query heads' slopes as f32 bits at `[B + h]`.
pub(crate) fn upload_rule_data(
    ctx: &Run,
    dims: &AttentionDims,
    nonpad: Option<&[i64]>,
    alibi: bool,
) -> Result<wgpu::Buffer> {
    let mut words: Vec<i32> = match nonpad {
        Some(lengths) => lengths.iter().map(|&x| x as i32).collect(),
        None => vec![0; dims.batch],
    };
    if alibi {
        // A piece of a split call takes its heads' slopes from the call's.
        let place = dims.placement;
        let all_heads = if place.all_q_heads == 0 {
            dims.q_heads
        } else {
            place.all_q_heads
        };
        words.extend(
            crate::options::alibi_slopes(all_heads)
                .into_iter()
                .skip(place.first_q_head)
                .take(dims.q_heads)
                .map(|slope| (slope as f32).to_bits() as i32),
        );
    }
    buffer::upload_constant(ctx, "rule data (nonpad_kv_seqlen, ALiBi slopes)", &words)
}
