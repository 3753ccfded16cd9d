//! Running a call whole, or in the pieces its plan cut it into
//! (`plan/pieces.rs` says how a call is cut).
//!
//! Each piece gets its slices of Q, K, V, the mask and the rule data by buffer
//! copies, runs on the path the call chose, and its Y, logsumexp and scores
//! are copied into the call's outputs. Its query positions are shifted
//! ([`Placement`]) so that causal masks, windows and ALiBi see the call's
//! positions, and its ALiBi slopes are its heads' slopes among the call's.
//! A piece that holds only some of the keys runs the planned fused kernel
//! resumed across its key ranges: the row state (max, sum, the attended and
//! poisoned flags) and the running O carry over in its stats and Y buffers,
//! exactly as across the key chunks of a driver's loop budget.
//! `present_key/value` are built in the call's own buffers by copies.

use crate::device::buffer;
use crate::device::chunks;
use crate::device::chunks::{copy_box_between, Held, Source};
use crate::device::recorder::{Recorder, Seg, SEGMENT_ALIGNMENT};
use crate::device::scope::Run;
use crate::error::{Error, Result};
use crate::kernels::attention as fused_op;
use crate::kernels::attention::{AttentionBuffers, KeyPart};
use crate::options::AttentionOptions;
use crate::plan::pieces::{
    contiguous_run, layout_of, mask_shape, piece_extent, piece_mask_shape, Cut, Origin,
};
use crate::plan::{CallPlan, GpuRoute as Route};
use crate::problem::{AttentionDims, Placement};
use crate::run::fused_route as fused;
use crate::run::present as kv;
use crate::run::present::{GpuInputs, GpuOutputs};
use crate::run::unfused_route as unfused;

/// Runs a call as `plan` says: whole, or in its pieces.
pub(crate) async fn run(
    ctx: &Run,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    options: &AttentionOptions,
    plan: &CallPlan,
) -> Result<GpuOutputs> {
    let route = plan.gpu.ok_or(Error::Conflict(
        "a call planned for the host runs no GPU kernels",
    ))?;
    match plan.cut() {
        None if inputs_in_one_buffer(inputs) => {
            run_whole(ctx, dims, inputs, options, plan, route, None).await
        }
        // Inputs held in several buffers (past a buffer's size) but whose
        // bindings fit: one piece, gathered out of them.
        None => run_pieces(ctx, dims, inputs, options, plan, Cut::whole(dims)).await,
        Some(cut) => run_pieces(ctx, dims, inputs, options, plan, cut).await,
    }
}

/// Runs `dims` (the call's, or a piece's whose decode layout is `decode`)
/// whole on the plan's route.
async fn run_whole(
    ctx: &Run,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    options: &AttentionOptions,
    plan: &CallPlan,
    route: Route,
    piece_decode: Option<Option<crate::kernels::decode::DecodeLayout>>,
) -> Result<GpuOutputs> {
    match route {
        Route::Fused { kernel, decode } => {
            let decode = piece_decode.unwrap_or(decode);
            fused::run(
                ctx,
                dims,
                inputs,
                options,
                &kernel,
                decode,
                plan.removed_phases,
            )
            .await
        }
        Route::Unfused {
            products,
            score_budget,
            ..
        } => unfused::run(ctx, dims, inputs, options, products, score_budget).await,
    }
}

/// Whether Q, K, V, the past and the mask are each in one buffer (not in chunks).
fn inputs_in_one_buffer(inputs: &GpuInputs<'_>) -> bool {
    [inputs.q, inputs.k, inputs.v]
        .into_iter()
        .chain(inputs.past_key)
        .chain(inputs.past_value)
        .chain(inputs.mask)
        .all(|s| s.chunk_len().is_none())
}

/// A piece's inputs, copied out of the call's.
struct PieceInputs<'a> {
    dims: AttentionDims,
    q: Part<'a>,
    k: Part<'a>,
    v: Part<'a>,
    mask: Option<wgpu::Buffer>,
    nonpad: Option<Vec<i64>>,
}

/// A piece's Q, K or V: copied out of the call's tensor, or (on the fused
/// route, where the slice is one aligned run of it) a view of it, read in place.
enum Part<'a> {
    Copied(wgpu::Buffer),
    View(Seg<'a>),
}

impl Part<'_> {
    fn seg(&self) -> Seg<'_> {
        match self {
            Part::Copied(b) => Seg::whole(b),
            Part::View(s) => *s,
        }
    }

    /// Bytes of device memory the piece allocated for it.
    fn copied_bytes(&self) -> u64 {
        match self {
            Part::Copied(b) => b.size(),
            Part::View(_) => 0,
        }
    }
}

/// A box of `src` as a piece's tensor: a view where it is one run at an
/// aligned offset, in whole vec4s (and `in_place`), else copied out. `f16`
/// values (two bytes each) are only ever viewed.
#[allow(clippy::too_many_arguments)]
fn part<'a>(
    rec: &mut Recorder<'_>,
    name: &str,
    src: Source<'a>,
    full: [usize; 4],
    start: [usize; 4],
    extent: [usize; 4],
    in_place: bool,
    f16: bool,
) -> Result<Part<'a>> {
    let width = if f16 { 2 } else { 4 };
    if in_place || f16 {
        let view = contiguous_run(full, start, extent)
            .and_then(|(offset, len)| src.run(offset, len, width));
        if let Some(seg) = view {
            let size = seg.size.unwrap_or(0);
            if seg.offset % SEGMENT_ALIGNMENT == 0 && size % 16 == 0 && size > 0 {
                return Ok(Part::View(seg));
            }
        }
    }
    if f16 {
        return Err(Error::Conflict(
            "an f16 slice of a piece is not an aligned run of the call's tensor",
        ));
    }
    let dst = buffer::storage(rec.ctx(), name, extent.iter().product())?;
    copy_box_between(
        rec,
        src,
        full,
        start,
        Source::whole(&dst),
        extent,
        [0; 4],
        extent,
    );
    Ok(Part::Copied(dst))
}

/// The call's keys and values as one `[B, Hkv, T, D]` tensor each (the
/// present buffers when there is a past or they were asked for).
struct Keys<'a> {
    k: Source<'a>,
    v: Source<'a>,
}

async fn run_pieces(
    ctx: &Run,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    options: &AttentionOptions,
    plan: &CallPlan,
    cut: Cut,
) -> Result<GpuOutputs> {
    let (b, hq, hkv, nq, t) = (
        dims.batch,
        dims.q_heads,
        dims.kv_heads,
        dims.q_len,
        dims.total_len(),
    );
    let (dk, dv) = (dims.head_dim, dims.v_head_dim);
    let want_present = dims.has_past && dims.past_len > 0 || options.return_present;
    let (call_k, call_v) = (inputs.k, inputs.v);
    log::info!(
        "webattn: tensors exceed one storage binding; running in pieces of \
         {} batches x {} KV heads x {} query rows x {} keys",
        cut.batches,
        cut.kv_heads,
        cut.queries,
        cut.keys
    );

    // Outputs larger than one buffer are held in several (`device/chunks.rs`).
    let (y, lse, qk, present) = ctx
        .scoped("attention outputs (in pieces)", || {
            let y = chunks::output(ctx, "Y", [b, hq, nq, dv])?;
            let lse = chunks::output(ctx, "lse", [b, hq, nq, 1])?;
            let qk = match options.qk_matmul_output_mode {
                Some(_) => Some(chunks::output(ctx, "qk_matmul_output", [b, hq, nq, t])?),
                None => None,
            };
            let present = if want_present {
                let pk = chunks::output(ctx, "present_key", [b, hkv, t, dk])?;
                let pv = chunks::output(ctx, "present_value", [b, hkv, t, dv])?;
                let mut rec = Recorder::new(ctx, "present (in pieces)");
                let p = if dims.has_past { dims.past_len } else { 0 };
                for (new, past, present, d) in [
                    (call_k, inputs.past_key, &pk, dk),
                    (call_v, inputs.past_value, &pv, dv),
                ] {
                    if p > 0 {
                        let Some(past) = past else {
                            return Err(Error::Conflict(
                                "past_key and past_value must be given together",
                            ));
                        };
                        let past_shape = [b, hkv, p, d];
                        copy_box_between(
                            &mut rec,
                            past,
                            past_shape,
                            [0; 4],
                            present.source(),
                            [b, hkv, t, d],
                            [0; 4],
                            past_shape,
                        );
                    }
                    let new_shape = [b, hkv, dims.kv_len, d];
                    copy_box_between(
                        &mut rec,
                        new,
                        new_shape,
                        [0; 4],
                        present.source(),
                        [b, hkv, t, d],
                        [0, 0, p, 0],
                        new_shape,
                    );
                }
                rec.submit();
                Some((pk, pv))
            } else {
                None
            };
            Ok((y, lse, qk, present))
        })
        .await?;
    let mut allocated = y.bytes() + lse.bytes() + qk.as_ref().map_or(0, Held::bytes);
    if let Some((pk, pv)) = &present {
        allocated += pk.bytes() + pv.bytes();
    }
    let keys = match &present {
        Some((k, v)) => Keys {
            k: k.source(),
            v: v.source(),
        },
        None => Keys {
            k: call_k,
            v: call_v,
        },
    };

    let mut piece_bytes = 0u64;
    let mut pieces = 0;
    for b0 in (0..b).step_by(cut.batches) {
        for g0 in (0..hkv).step_by(cut.kv_heads) {
            for q0 in (0..nq).step_by(cut.queries) {
                let at = Origin {
                    batch: b0,
                    kv_head: g0,
                    query: q0,
                    key: 0,
                };
                let outputs = (y.source(), lse.source(), qk.as_ref().map(Held::source));
                let (used, runs) =
                    run_piece(ctx, dims, inputs, &keys, options, plan, cut, at, outputs).await?;
                piece_bytes = piece_bytes.max(used);
                pieces += runs;
            }
        }
    }
    let (present_key, present_value) = match present {
        Some((k, v)) if options.return_present => (Some(k), Some(v)),
        _ => (None, None),
    };
    Ok(GpuOutputs {
        y,
        lse,
        qk,
        present_key,
        present_value,
        allocated_bytes: allocated + piece_bytes,
        pieces,
    })
}

/// Copies one piece's inputs out of the call's and sets its positions.
#[allow(clippy::too_many_arguments)]
fn gather<'a>(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    inputs: &GpuInputs<'a>,
    keys: &Keys<'a>,
    extent: &Cut,
    at: Origin,
    in_place: bool,
) -> Result<PieceInputs<'a>> {
    let ctx = rec.ctx();
    let (g, t) = (dims.group(), dims.total_len());
    let mut piece = extent.piece_dims(dims);
    let (nb, ng, nq, nk) = (extent.batches, extent.kv_heads, extent.queries, extent.keys);
    let q_head = at.kv_head * g;
    let q = part(
        rec,
        "Q (piece)",
        inputs.q,
        [dims.batch, dims.q_heads, dims.q_len, dims.head_dim],
        [at.batch, q_head, at.query, 0],
        [nb, ng * g, nq, dims.head_dim],
        in_place,
        false,
    )?;
    let mut kv = Vec::new();
    for (src, d, name) in [
        (keys.k, dims.head_dim, "K (piece)"),
        (keys.v, dims.v_head_dim, "V (piece)"),
    ] {
        kv.push(part(
            rec,
            name,
            src,
            [dims.batch, dims.kv_heads, t, d],
            [at.batch, at.kv_head, at.key, 0],
            [nb, ng, nk, d],
            in_place,
            inputs.kv_f16,
        )?);
    }
    let mask = match (dims.mask, inputs.mask) {
        (Some(layout), Some(src)) => {
            let full = mask_shape(&layout, dims);
            let shape = piece_mask_shape(&layout, dims, extent);
            // Columns past the mask's end stay masked: the piece's mask is shorter.
            let cols = layout.cols.saturating_sub(at.key).min(nk);
            let pick = |n: usize, start: usize| if n == 1 { 0 } else { start };
            let dst = buffer::storage(
                ctx,
                "attn_mask (piece)",
                shape[..3].iter().product::<usize>() * cols,
            )?;
            copy_box_between(
                rec,
                src,
                full,
                [
                    pick(full[0], at.batch),
                    pick(full[1], q_head),
                    pick(full[2], at.query),
                    at.key.min(layout.cols),
                ],
                Source::whole(&dst),
                [shape[0], shape[1], shape[2], cols],
                [0; 4],
                [shape[0], shape[1], shape[2], cols],
            );
            let broadcast = [
                layout.batch_stride == 0,
                layout.head_stride == 0,
                layout.row_stride == 0,
            ];
            piece.mask = Some(layout_of(
                [shape[0], shape[1], shape[2], cols],
                broadcast,
                cols,
            ));
            Some(dst)
        }
        _ => None,
    };
    // Positions: the call's query position, in the piece's key coordinates,
    // less what the piece's own offset (its nonpad length less its rows) gives.
    let mut nonpad = None;
    let mut shift = at.query as i64 - at.key as i64;
    if dims.has_past {
        shift += dims.past_len as i64;
    }
    if let Some(lengths) = inputs.nonpad {
        let piece_lengths: Vec<i64> = lengths[at.batch..at.batch + nb]
            .iter()
            .map(|&n| (n - at.key as i64).clamp(0, nk as i64))
            .collect();
        // The call's offset is n - Nq; the piece's kernel computes n' - nq.
        // With keys split the piece holds one batch (Cut::plan), so n' is one value.
        let n = lengths[at.batch];
        shift += (n - dims.q_len as i64) - (piece_lengths[0] - nq as i64);
        nonpad = Some(piece_lengths);
    }
    piece.placement = Placement {
        position_shift: shift,
        first_q_head: q_head,
        all_q_heads: dims.q_heads,
    };
    let mut kv = kv.into_iter();
    let (k, v) = (kv.next().expect("K"), kv.next().expect("V"));
    Ok(PieceInputs {
        dims: piece,
        q,
        k,
        v,
        mask,
        nonpad,
    })
}

/// Copies a piece's Y, logsumexp and scores into the call's outputs.
#[allow(clippy::too_many_arguments)]
fn scatter(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    extent: &Cut,
    at: Origin,
    piece: (Source<'_>, Source<'_>),
    call: (Source<'_>, Source<'_>),
) {
    let (nb, nh, nq) = (
        extent.batches,
        extent.kv_heads * dims.group(),
        extent.queries,
    );
    let start = [at.batch, at.kv_head * dims.group(), at.query, 0];
    let full = [dims.batch, dims.q_heads, dims.q_len];
    for (src, dst, d) in [(piece.0, call.0, dims.v_head_dim), (piece.1, call.1, 1)] {
        copy_box_between(
            rec,
            src,
            [nb, nh, nq, d],
            [0; 4],
            dst,
            [full[0], full[1], full[2], d],
            start,
            [nb, nh, nq, d],
        );
    }
}

/// Copies a piece's `qk_matmul_output` (its keys' columns) into the call's.
fn scatter_scores(
    rec: &mut Recorder<'_>,
    dims: &AttentionDims,
    extent: &Cut,
    at: Origin,
    piece: Source<'_>,
    call: Source<'_>,
) {
    let (nb, nh, nq, nk) = (
        extent.batches,
        extent.kv_heads * dims.group(),
        extent.queries,
        extent.keys,
    );
    copy_box_between(
        rec,
        piece,
        [nb, nh, nq, nk],
        [0; 4],
        call,
        [dims.batch, dims.q_heads, dims.q_len, dims.total_len()],
        [at.batch, at.kv_head * dims.group(), at.query, at.key],
        [nb, nh, nq, nk],
    );
}

/// Bytes a piece's copied inputs take.
fn input_bytes(p: &PieceInputs) -> u64 {
    p.q.copied_bytes()
        + p.k.copied_bytes()
        + p.v.copied_bytes()
        + p.mask.as_ref().map_or(0, |m| m.size())
}

/// A piece's inputs out of the call's (views where `in_place` allows),
/// inside error scopes.
#[allow(clippy::too_many_arguments)]
async fn gather_scoped<'a>(
    ctx: &Run,
    dims: &AttentionDims,
    inputs: &GpuInputs<'a>,
    keys: &Keys<'a>,
    extent: &Cut,
    at: Origin,
    in_place: bool,
) -> Result<PieceInputs<'a>> {
    ctx.scoped("piece inputs", || {
        let mut rec = Recorder::new(ctx, "piece inputs");
        let piece = gather(&mut rec, dims, inputs, keys, extent, at, in_place)?;
        rec.submit();
        Ok(piece)
    })
    .await
}

/// Runs one piece (all its keys at once, or key range by key range) and
/// copies its outputs into the call's; returns the bytes it allocated and
/// the runs it took (one per key range).
#[allow(clippy::too_many_arguments)]
async fn run_piece(
    ctx: &Run,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    keys: &Keys<'_>,
    options: &AttentionOptions,
    plan: &CallPlan,
    cut: Cut,
    at: Origin,
    outputs: (Source<'_>, Source<'_>, Option<Source<'_>>),
) -> Result<(u64, usize)> {
    let (y, lse, qk) = outputs;
    let t = dims.total_len();
    let extent = piece_extent(dims, &cut, at);
    let route = plan.gpu.ok_or(Error::Conflict(
        "a call planned for the host runs no GPU kernels",
    ))?;
    let piece_options = AttentionOptions {
        return_present: false,
        ..options.clone()
    };
    // The fused kernels read views of the call's tensors in place; the
    // unfused path's GEMMs bind whole buffers, so its pieces are copies.
    let in_place = route.is_fused();
    if extent.keys == t {
        let piece = gather_scoped(ctx, dims, inputs, keys, &extent, at, in_place).await?;
        let piece_inputs = GpuInputs {
            q: Source::One(piece.q.seg()),
            k: Source::One(piece.k.seg()),
            v: Source::One(piece.v.seg()),
            mask: piece.mask.as_ref().map(Source::whole),
            past_key: None,
            past_value: None,
            nonpad: piece.nonpad.as_deref(),
            kv_f16: inputs.kv_f16,
        };
        // A piece decodes by its own sizes (as planned for its extent; a call
        // whole in one piece, by the call's).
        let decode = match (plan.cut(), route) {
            (Some(_), Route::Fused { .. }) => {
                Some(plan.piece_decode([extent.batches, extent.kv_heads, extent.queries])?)
            }
            _ => None,
        };
        let out = run_whole(
            ctx,
            &piece.dims,
            &piece_inputs,
            &piece_options,
            plan,
            route,
            decode,
        )
        .await?;
        ctx.scoped("piece outputs", || {
            let mut rec = Recorder::new(ctx, "piece outputs");
            let piece = (out.y.source(), out.lse.source());
            scatter(&mut rec, dims, &extent, at, piece, (y, lse));
            if let (Some(src), Some(dst)) = (&out.qk, qk) {
                scatter_scores(&mut rec, dims, &extent, at, src.source(), dst);
            }
            rec.submit();
            Ok(())
        })
        .await?;
        return Ok((out.allocated_bytes + input_bytes(&piece), 1));
    }

    // Keys in ranges: the planned fused kernel, resumed from one range to the next.
    let kernel = plan.key_ranges.ok_or(Error::Conflict(
        "a call in pieces of some of its keys has no kernel planned for its key ranges",
    ))?;
    let rows = extent.batches * extent.kv_heads * dims.group() * extent.queries;
    let (piece_y, stats) = ctx
        .scoped("piece outputs", || {
            Ok((
                buffer::storage(ctx, "Y (piece)", rows * dims.v_head_dim)?,
                buffer::storage(ctx, "lse (piece)", 3 * rows)?,
            ))
        })
        .await?;
    let mut allocated = piece_y.size() + stats.size();
    let mut key = 0;
    let mut runs = 0;
    while key < t {
        runs += 1;
        let range_at = Origin { key, ..at };
        let range = piece_extent(dims, &cut, range_at);
        let part = KeyPart {
            first: key == 0,
            last: key + range.keys >= t,
        };
        let piece = gather_scoped(ctx, dims, inputs, keys, &range, range_at, true).await?;
        let used = ctx
            .scoped("attention (a key range of a piece)", || {
                let mut rec = Recorder::new(ctx, "attention (a key range of a piece)");
                let placeholder = buffer::storage(ctx, "no mask", 1)?;
                let rule_data =
                    kv::upload_rule_data(ctx, &piece.dims, piece.nonpad.as_deref(), options.alibi)?;
                let buffers = AttentionBuffers {
                    q: piece.q.seg(),
                    k: piece.k.seg(),
                    v: piece.v.seg(),
                    mask: piece.mask.as_ref().unwrap_or(&placeholder),
                    nonpad: &rule_data,
                    kv_f16: false,
                };
                fused_op::record_forward(
                    &mut rec,
                    &piece.dims,
                    &piece_options,
                    &kernel,
                    &buffers,
                    &piece_y,
                    &stats,
                    part,
                    plan.removed_phases,
                )?;
                let mut used = input_bytes(&piece)
                    + fused_op::scratch_bytes(&kernel, &piece.dims, &ctx.caps.limits);
                if let (Some(mode), Some(dst)) = (options.qk_matmul_output_mode, qk) {
                    let scores =
                        buffer::storage(ctx, "qk_matmul_output (piece)", rows * range.keys)?;
                    let scratch = buffer::storage(ctx, "probabilities lse", rows)?;
                    fused_op::record_scores(
                        &mut rec,
                        &piece.dims,
                        &piece_options,
                        mode,
                        &buffers,
                        &scores,
                        &scratch,
                    )?;
                    let piece = Source::whole(&scores);
                    scatter_scores(&mut rec, dims, &range, range_at, piece, dst);
                    used += scores.size();
                }
                rec.submit();
                Ok(used)
            })
            .await?;
        allocated = allocated.max(piece_y.size() + stats.size() + used);
        key += range.keys;
    }
    ctx.scoped("piece outputs", || {
        let mut rec = Recorder::new(ctx, "piece outputs");
        let piece = (Source::whole(&piece_y), Source::whole(&stats));
        scatter(&mut rec, dims, &extent, at, piece, (y, lse));
        rec.submit();
        Ok(())
    })
    .await?;
    Ok((allocated, runs))
}
