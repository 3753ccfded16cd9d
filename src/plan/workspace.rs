//! What a plan takes on the device, worked out from its sizes alone: the
//! bytes of outputs and scratch a call allocates, and whether its f16 keys
//! and values are read in place. The run reports the same figures for the
//! buffers it makes ([`crate::CallStats::allocated_bytes`]).

use crate::device::capabilities::Capabilities;
use crate::device::chunks::chunk_len;
use crate::error::Result;
use crate::kernels::attention::{scratch_bytes, FusedKernel};
use crate::kernels::decode::DecodeLayout;
use crate::kernels::gemm::attention::score_blocks;
use crate::kernels::gemm::{packed, GemmKernel, GemmSpec};
use crate::options::AttentionOptions;
use crate::plan::pieces::{self, Cut};
use crate::plan::{CallPlan, GpuRoute, KvRead};
use crate::problem::AttentionDims;
use crate::tensor::DType;

/// Bytes of `values` f32 values.
pub(crate) fn bytes(values: usize) -> u64 {
    values as u64 * 4
}

/// Whether the call needs the `[past; new]` buffers.
pub(crate) fn needs_present(dims: &AttentionDims, want_present: bool) -> bool {
    (dims.has_past && dims.past_len > 0) || want_present
}

/// Bytes of `present_key` and `present_value`.
pub(crate) fn present_bytes(dims: &AttentionDims) -> (u64, u64) {
    let rows = dims.batch * dims.kv_heads * dims.total_len();
    (bytes(rows * dims.head_dim), bytes(rows * dims.v_head_dim))
}

/// Bytes of the presents where the call makes them, else 0.
fn presents(dims: &AttentionDims, options: &AttentionOptions) -> u64 {
    if needs_present(dims, options.return_present) {
        let (k, v) = present_bytes(dims);
        k + v
    } else {
        0
    }
}

/// Bytes of `qk_matmul_output` where asked for, else 0.
fn scores_output(dims: &AttentionDims, options: &AttentionOptions) -> u64 {
    match options.qk_matmul_output_mode {
        Some(_) => bytes(dims.batch * dims.q_heads * dims.q_len * dims.total_len()),
        None => 0,
    }
}

/// What a whole run of `dims` on the fused route allocates: Y, the row
/// state, the decode partials or the fused kernel's scratch (packed K and
/// V), the presents and the scores.
pub(crate) fn fused_bytes(
    caps: &Capabilities,
    dims: &AttentionDims,
    options: &AttentionOptions,
    kernel: &FusedKernel,
    decode: Option<&DecodeLayout>,
) -> u64 {
    let rows = dims.batch * dims.q_heads * dims.q_len;
    bytes(rows * dims.v_head_dim)
        + bytes(3 * rows)
        + match decode {
            Some(plan) => bytes(plan.partial_values(dims)),
            None => scratch_bytes(kernel, dims, &caps.limits),
        }
        + presents(dims, options)
        + scores_output(dims, options)
}

/// What a whole run of `dims` on the unfused route allocates: Y, the
/// logsumexp, one block of scores, the packed operands of `S = Q Kᵀ` where
/// `scores_kernel` packs them, the presents and the scores.
pub(crate) fn unfused_bytes(
    _caps: &Capabilities,
    dims: &AttentionDims,
    options: &AttentionOptions,
    scores_kernel: GemmKernel,
    score_budget: u64,
) -> Result<u64> {
    let heads = dims.batch * dims.q_heads;
    let (nq, t) = (dims.q_len, dims.total_len());
    let blocks = score_blocks(heads, nq, t, score_budget)?;
    let block_rows = blocks.iter().map(|b| b.rows()).max().unwrap_or(1);
    let packed: u64 = match scores_kernel {
        GemmKernel::CoopPacked { shape, tile } => blocks
            .iter()
            .map(|block| {
                packed::scratch_bytes(
                    shape,
                    tile,
                    &GemmSpec::attention_scores(dims, options, block),
                )
            })
            .sum(),
        _ => 0,
    };
    Ok(bytes(heads * nq * dims.v_head_dim)
        + bytes(heads * nq)
        + bytes(block_rows * t)
        + packed
        + presents(dims, options)
        + scores_output(dims, options))
}

/// Whether a call's f16 keys and values are read in place: by the decode
/// kernel, on an adapter that unpacks f16 in f32 code, without a past,
/// presents or scores, whole or in pieces whose slices of K and V are
/// aligned views (held in chunks as an upload of their size would be).
pub(crate) fn reads_f16_in_place(
    caps: &Capabilities,
    dims: &AttentionDims,
    options: &AttentionOptions,
    route: GpuRoute,
    cut: Option<&Cut>,
) -> bool {
    let decodes = matches!(
        route,
        GpuRoute::Fused {
            decode: Some(_),
            ..
        }
    );
    decodes
        && caps.unpack_f16
        && !dims.has_past
        && !options.return_present
        && options.qk_matmul_output_mode.is_none()
        && pieces::f16_in_place(dims, route, cut, kv_chunks(caps, dims))
}

/// Values per buffer of f16 K and V where an upload of their size is held
/// in chunks (larger than one buffer), as `device/chunks.rs` cuts them.
pub(crate) fn kv_chunks(caps: &Capabilities, dims: &AttentionDims) -> [Option<usize>; 2] {
    let rows = [dims.batch, dims.kv_heads, dims.kv_len];
    [dims.head_dim, dims.v_head_dim].map(|d| {
        chunk_len(
            &[rows[0], rows[1], rows[2], d],
            DType::F16,
            caps.limits.max_buffer_size,
        )
        .ok()
        .flatten()
    })
}

/// Bytes of f32 scratch the call widens its f16 inputs into: every f16
/// input but keys and values read in place.
pub(crate) fn widened_bytes(dims: &AttentionDims, kv_in_place: bool) -> u64 {
    let kv_rows = dims.batch * dims.kv_heads;
    let f = &dims.f16;
    [
        (f.q, dims.batch * dims.q_heads * dims.q_len * dims.head_dim),
        (f.k && !kv_in_place, kv_rows * dims.kv_len * dims.head_dim),
        (f.v && !kv_in_place, kv_rows * dims.kv_len * dims.v_head_dim),
        (
            f.past_key && dims.has_past,
            kv_rows * dims.past_len * dims.head_dim,
        ),
        (
            f.past_value && dims.has_past,
            kv_rows * dims.past_len * dims.v_head_dim,
        ),
    ]
    .iter()
    .filter(|(f16, _)| *f16)
    .map(|&(_, n)| bytes(n))
    .sum()
}

/// The plan's device memory: a whole call's outputs and scratch, or, in
/// pieces, the call's outputs and presents and the largest piece's inputs,
/// outputs and scratch (each piece's inputs counted as copies: views of
/// aligned slices take none, so a call in pieces takes at most this); plus
/// the widened f16 inputs.
pub(crate) fn planned_bytes(
    caps: &Capabilities,
    dims: &AttentionDims,
    options: &AttentionOptions,
    plan: &CallPlan,
) -> u64 {
    let Some(route) = plan.gpu else {
        return 0;
    };
    let widened = widened_bytes(dims, plan.kv_f16 == Some(KvRead::InPlace));
    let whole = |dims: &AttentionDims, route: GpuRoute, decode: Option<&DecodeLayout>| match route {
        GpuRoute::Fused { kernel, .. } => fused_bytes(caps, dims, options, &kernel, decode),
        GpuRoute::Unfused {
            products,
            score_budget,
            ..
        } => unfused_bytes(caps, dims, options, products[0], score_budget).unwrap_or(0),
    };
    let Some(cut) = plan.cut() else {
        let decode = match &route {
            GpuRoute::Fused { decode, .. } => decode.as_ref(),
            GpuRoute::Unfused { .. } => None,
        };
        return whole(dims, route, decode) + widened;
    };
    let piece = AttentionDims {
        has_past: false,
        past_len: 0,
        ..cut.piece_dims(dims)
    };
    let piece_options = AttentionOptions {
        return_present: false,
        ..options.clone()
    };
    let rows = dims.batch * dims.q_heads * dims.q_len;
    let call_outputs = bytes(rows * dims.v_head_dim)
        + bytes(rows)
        + scores_output(dims, options)
        + presents(dims, options);
    let piece_rows = piece.batch * piece.q_heads * piece.q_len;
    let inputs = bytes(piece_rows * dims.head_dim)
        + bytes(piece.batch * piece.kv_heads * piece.kv_len * (dims.head_dim + dims.v_head_dim))
        + piece.mask.map_or(0, |layout| {
            bytes(pieces::mask_shape(&layout, &piece).iter().product())
        });
    let run = match plan.key_ranges {
        Some(kernel) => {
            bytes(piece_rows * dims.v_head_dim)
                + bytes(3 * piece_rows)
                + scratch_bytes(&kernel, &piece, &caps.limits)
                + scores_output(&piece, &piece_options)
                + bytes(piece_rows)
        }
        None => {
            let decode = plan
                .piece_decodes
                .iter()
                .find(|p| p.extent == [cut.batches, cut.kv_heads, cut.queries])
                .and_then(|p| p.decode);
            whole(&piece, route, decode.as_ref())
        }
    };
    call_outputs + inputs + run + widened
}
