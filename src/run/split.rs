//! Calls whose tensors exceed one storage binding, cut into pieces that fit.
//!
//! WebGPU binds at most `max_storage_buffer_binding_size` bytes of a buffer
//! (128 MiB by default, 2 GiB less 4 bytes natively in wgpu), while a buffer
//! itself may be larger. A call whose every binding fits runs whole, as
//! before. Otherwise [`Cut::plan`] picks piece sizes: it halves, for each
//! binding that does not fit, the first axis that binding depends on, in the
//! order batches, KV heads (with their query heads), query rows, keys.
//!
//! Each piece gets its slices of Q, K, V, the mask and the rule data by buffer
//! copies, runs on the path the call chose, and its Y, logsumexp and scores
//! are copied into the call's outputs. Its query positions are shifted
//! ([`Placement`]) so that causal masks, windows and ALiBi see the call's
//! positions, and its ALiBi slopes are its heads' slopes among the call's.
//! A piece that holds only some of the keys runs the fused kernel resumed
//! across its key ranges: the row state (max, sum, the attended and poisoned
//! flags) and the running O carry over in its stats and Y buffers, exactly as
//! across the key chunks of a driver's loop budget. `present_key/value` are
//! built in the call's own buffers by copies.

use crate::device::buffer;
use crate::device::capabilities::Capabilities;
use crate::device::chunks;
use crate::device::chunks::{copy_box_between, Held, Source};
use crate::device::context::GpuContext;
use crate::device::recorder::{Recorder, Seg, SEGMENT_ALIGNMENT};
use crate::error::{Error, Result};
use crate::kernels::attention as fused_op;
use crate::kernels::attention::{AttentionBuffers, KeyPart};
use crate::kernels::decode::{DecodeKernel, DecodePlan};
use crate::options::{AttentionOptions, QkMatmulOutputMode};
pub(crate) use crate::plan::GpuRoute as Route;
use crate::plan::Pieces;
use crate::problem::{AttentionDims, MaskLayout, Placement};
use crate::run::fused_route as fused;
use crate::run::present as kv;
use crate::run::present::{GpuInputs, GpuOutputs};
use crate::run::unfused_route as unfused;

/// Runs a call on `route`, whole when every binding fits, else in pieces.
pub(crate) async fn run(
    ctx: &GpuContext,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    options: &AttentionOptions,
    route: Route,
) -> Result<GpuOutputs> {
    if inputs_in_one_buffer(inputs) && runs_whole(ctx, dims, options, route) {
        return match route {
            Route::Fused { kernel, decode } => {
                fused::run(ctx, dims, inputs, options, &kernel, decode).await
            }
            Route::Unfused {
                gemm, score_budget, ..
            } => unfused::run(ctx, dims, inputs, options, gemm, score_budget).await,
        };
    }
    let limit = ctx.caps.limits.max_bindable_bytes();
    let cut = Cut::plan(&ctx.caps, dims, options, route, limit)?;
    let kv_chunks = [inputs.k.chunk_len(), inputs.v.chunk_len()];
    if inputs.kv_f16 && !f16_views_fit(dims, &cut, kv_chunks) {
        return Err(Error::Conflict(
            "f16 keys and values are read in place only by whole calls and aligned pieces",
        ));
    }
    run_pieces(ctx, dims, inputs, options, route, cut).await
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

/// Whether a call with f16 keys and values on `route` can read them in
/// place: whole, or in pieces that keep every key (the decode kernel's) and
/// whose slices of K and V are aligned views (f16 slices are never copied),
/// inside one buffer each where K and V are held in chunks of `kv_chunks`
/// values.
pub(crate) fn f16_in_place(
    ctx: &GpuContext,
    dims: &AttentionDims,
    options: &AttentionOptions,
    route: Route,
    kv_chunks: [Option<usize>; 2],
) -> bool {
    if kv_chunks == [None, None] && runs_whole(ctx, dims, options, route) {
        return true;
    }
    let limit = ctx.caps.limits.max_bindable_bytes();
    route.is_fused()
        && Cut::plan(&ctx.caps, dims, options, route, limit)
            .is_ok_and(|cut| f16_views_fit(dims, &cut, kv_chunks))
}

/// Whether every piece of `cut` keeps all keys, runs the decode kernel, and
/// binds its f16 K and V slices as aligned views of whole vec4s, each inside
/// one chunk where K or V is held in chunks of that many values.
fn f16_views_fit(dims: &AttentionDims, cut: &Cut, kv_chunks: [Option<usize>; 2]) -> bool {
    let t = dims.total_len();
    if cut.keys < t || !DecodePlan::applies(&cut.piece_dims(dims)) {
        return false;
    }
    (0..dims.batch).step_by(cut.batches).all(|b0| {
        (0..dims.kv_heads).step_by(cut.kv_heads).all(|g0| {
            let extent = piece_extent(
                dims,
                cut,
                Origin {
                    batch: b0,
                    kv_head: g0,
                    query: 0,
                    key: 0,
                },
            );
            [
                (dims.head_dim, kv_chunks[0]),
                (dims.v_head_dim, kv_chunks[1]),
            ]
            .iter()
            .all(|&(d, chunk)| {
                let full = [dims.batch, dims.kv_heads, t, d];
                contiguous_run(
                    full,
                    [b0, g0, 0, 0],
                    [extent.batches, extent.kv_heads, t, d],
                )
                .is_some_and(|(offset, len)| {
                    let local = match chunk {
                        Some(n) if offset / n != (offset + len - 1) / n => return false,
                        Some(n) => offset % n,
                        None => offset,
                    };
                    ((local * 2) as u64).is_multiple_of(SEGMENT_ALIGNMENT) && (len * 2) % 16 == 0
                })
            })
        })
    })
}

/// Whether the call runs whole, not in pieces: everything it binds fits one binding.
pub(crate) fn runs_whole(
    ctx: &GpuContext,
    dims: &AttentionDims,
    options: &AttentionOptions,
    route: Route,
) -> bool {
    let limit = ctx.caps.limits.max_bindable_bytes();
    whole_fits(&ctx.caps, dims, options, route, limit)
}

/// How a call on `route` is cut: whole where every binding fits, else the
/// pieces [`Cut::plan`] picks (a typed error where even the smallest does not fit).
pub(crate) fn pieces(
    caps: &Capabilities,
    dims: &AttentionDims,
    options: &AttentionOptions,
    route: &Route,
) -> Result<Pieces> {
    let limit = caps.limits.max_bindable_bytes();
    if whole_fits(caps, dims, options, *route, limit) {
        return Ok(Pieces::Whole);
    }
    let cut = Cut::plan(caps, dims, options, *route, limit)?;
    Ok(Pieces::Cut {
        batches: cut.batches,
        kv_heads: cut.kv_heads,
        queries: cut.queries,
        keys: cut.keys,
    })
}

/// Bytes of a storage buffer of the product of `dims` f32 values (whole
/// vec4s, never empty), in u64: on wasm32 a usize product would overflow.
fn stored(dims: &[usize]) -> u64 {
    let len = dims.iter().map(|&d| d as u64).product::<u64>();
    len.max(1).div_ceil(4) * 16
}

/// Whether the call runs whole: everything its path binds fits one binding.
fn whole_fits(
    caps: &Capabilities,
    dims: &AttentionDims,
    options: &AttentionOptions,
    route: Route,
    limit: u64,
) -> bool {
    let whole = Cut::whole(dims);
    let present = dims.has_past && dims.past_len > 0 || options.return_present;
    let kv_rows = dims.batch * dims.kv_heads;
    let mut sizes = vec![
        stored(&[kv_rows, dims.kv_len, dims.head_dim]),
        stored(&[kv_rows, dims.kv_len, dims.v_head_dim]),
    ];
    if dims.has_past {
        sizes.push(stored(&[kv_rows, dims.past_len, dims.head_dim]));
        sizes.push(stored(&[kv_rows, dims.past_len, dims.v_head_dim]));
    }
    if present {
        sizes.push(stored(&[kv_rows, dims.total_len(), dims.head_dim]));
        sizes.push(stored(&[kv_rows, dims.total_len(), dims.v_head_dim]));
    }
    sizes.iter().all(|&b| b <= limit)
        && whole
            .bindings(caps, dims, options, route)
            .iter()
            .all(|b| b.bytes <= limit)
}

/// One binding of a piece: its name, size and the axes it grows with.
#[derive(Debug, Clone, Copy)]
struct Binding {
    name: &'static str,
    bytes: u64,
    /// Batches, KV heads, query rows, keys.
    axes: [bool; 4],
}

/// Piece sizes along batches, KV heads, query rows and keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cut {
    batches: usize,
    kv_heads: usize,
    queries: usize,
    keys: usize,
}

impl Cut {
    fn whole(dims: &AttentionDims) -> Cut {
        Cut {
            batches: dims.batch,
            kv_heads: dims.kv_heads,
            queries: dims.q_len,
            keys: dims.total_len(),
        }
    }

    fn sizes(&self) -> [usize; 4] {
        [self.batches, self.kv_heads, self.queries, self.keys]
    }

    fn halve(&mut self, axis: usize) {
        let n = match axis {
            0 => &mut self.batches,
            1 => &mut self.kv_heads,
            2 => &mut self.queries,
            _ => &mut self.keys,
        };
        *n = n.div_ceil(2);
    }

    /// What a piece of this size binds.
    fn bindings(
        &self,
        caps: &Capabilities,
        dims: &AttentionDims,
        options: &AttentionOptions,
        route: Route,
    ) -> Vec<Binding> {
        let heads = self.batches * self.kv_heads;
        let q_rows = heads * dims.group() * self.queries;
        let all = [true; 4];
        let mut out = vec![
            Binding {
                name: "Q",
                bytes: stored(&[q_rows, dims.head_dim]),
                axes: [true, true, true, false],
            },
            Binding {
                name: "K",
                bytes: stored(&[heads, self.keys, dims.head_dim]),
                axes: [true, true, false, true],
            },
            Binding {
                name: "V",
                bytes: stored(&[heads, self.keys, dims.v_head_dim]),
                axes: [true, true, false, true],
            },
            Binding {
                name: "Y",
                bytes: stored(&[q_rows, dims.v_head_dim]),
                axes: [true, true, true, false],
            },
            Binding {
                // [lse | max | sum] on the fused kernels (and pieces of keys,
                // which resume them), the logsumexp alone unfused.
                name: "lse",
                bytes: stored(&[
                    if route.is_fused() || self.keys < dims.total_len() {
                        3
                    } else {
                        1
                    },
                    q_rows,
                ]),
                axes: [true, true, true, false],
            },
        ];
        if let Some(layout) = dims.mask {
            let shape = piece_mask_shape(&layout, dims, self);
            out.push(Binding {
                name: "attn_mask",
                bytes: stored(&shape),
                axes: [
                    layout.batch_stride != 0,
                    layout.head_stride != 0,
                    layout.row_stride != 0,
                    true,
                ],
            });
        }
        if options.qk_matmul_output_mode.is_some() {
            out.push(Binding {
                name: "qk_matmul_output",
                bytes: stored(&[q_rows, self.keys]),
                axes: all,
            });
        }
        let piece = self.piece_dims(dims);
        if route.is_fused() && self.keys == dims.total_len() && DecodePlan::applies(&piece) {
            // The staged kernel's splits: the most partials any decode kernel
            // writes (the streaming kernel's loop budget allows longer splits).
            let plan = DecodePlan::new(&piece, caps, DecodeKernel::Staged);
            out.push(Binding {
                name: "decode partials",
                bytes: stored(&[plan.partial_values(&piece)]),
                axes: [true, true, true, false],
            });
        }
        if matches!(route, Route::Unfused { .. }) {
            out.push(Binding {
                name: "a score row",
                bytes: stored(&[self.keys]),
                axes: [false, false, false, true],
            });
        }
        out
    }

    /// The sizes of a piece of this cut (positions are set per piece).
    fn piece_dims(&self, dims: &AttentionDims) -> AttentionDims {
        AttentionDims {
            batch: self.batches,
            q_heads: self.kv_heads * dims.group(),
            kv_heads: self.kv_heads,
            q_len: self.queries,
            kv_len: self.keys,
            past_len: 0,
            has_past: false,
            mask: dims
                .mask
                .map(|layout| piece_mask_layout(&layout, dims, self)),
            ..*dims
        }
    }

    /// Halves, for each binding that does not fit, the first axis it grows
    /// with, until every binding fits; a binding that still does not fit at one
    /// row and one key is refused.
    fn plan(
        caps: &Capabilities,
        dims: &AttentionDims,
        options: &AttentionOptions,
        route: Route,
        limit: u64,
    ) -> Result<Cut> {
        let mut cut = Cut::whole(dims);
        // Probabilities are normalised over whole rows, so their keys stay together.
        let keys_split = options.qk_matmul_output_mode != Some(QkMatmulOutputMode::Probabilities);
        loop {
            let Some(over) = cut
                .bindings(caps, dims, options, route)
                .into_iter()
                .find(|b| b.bytes > limit)
            else {
                return Ok(cut);
            };
            let sizes = cut.sizes();
            let axis =
                (0..4).find(|&axis| over.axes[axis] && sizes[axis] > 1 && (axis < 3 || keys_split));
            match axis {
                // Per-batch lengths shift positions per batch: keys split one batch at a time.
                Some(3) if dims.has_nonpad && cut.batches > 1 => cut.halve(0),
                Some(axis) => cut.halve(axis),
                None => {
                    return Err(Error::Limit {
                        what: format!("{} of the smallest piece of this call", over.name),
                        needed: over.bytes,
                        limit,
                        limit_name: "max_storage_buffer_binding_size",
                        hint: if keys_split {
                            "use an adapter with larger limits"
                        } else {
                            "ask for qk_matmul_output in mode 2 (its rows can then be \
                             split) and normalise on the host, or use larger limits"
                        },
                    })
                }
            }
        }
    }
}

/// The mask's dense shape `[B or 1, Hq or 1, Nq or 1, cols]`.
fn mask_shape(layout: &MaskLayout, dims: &AttentionDims) -> [usize; 4] {
    let or_one = |stride: usize, n: usize| if stride == 0 { 1 } else { n };
    [
        or_one(layout.batch_stride, dims.batch),
        or_one(layout.head_stride, dims.q_heads),
        or_one(layout.row_stride, dims.q_len),
        layout.cols,
    ]
}

/// A piece's mask shape: its batches, heads and rows where the mask has them,
/// and at most its keys' columns.
fn piece_mask_shape(layout: &MaskLayout, dims: &AttentionDims, cut: &Cut) -> [usize; 4] {
    let full = mask_shape(layout, dims);
    let pick = |n: usize, piece: usize| if n == 1 { 1 } else { piece };
    [
        pick(full[0], cut.batches),
        pick(full[1], cut.kv_heads * dims.group()),
        pick(full[2], cut.queries),
        layout.cols.min(cut.keys),
    ]
}

/// The dense layout of a mask of `shape` (strides 0 on broadcast axes).
fn layout_of(shape: [usize; 4], broadcast: [bool; 3], cols: usize) -> MaskLayout {
    let row = cols;
    let head = shape[2] * row;
    let batch = shape[1] * head;
    MaskLayout {
        batch_stride: if broadcast[0] { 0 } else { batch },
        head_stride: if broadcast[1] { 0 } else { head },
        row_stride: if broadcast[2] { 0 } else { row },
        cols,
    }
}

fn piece_mask_layout(layout: &MaskLayout, dims: &AttentionDims, cut: &Cut) -> MaskLayout {
    let shape = piece_mask_shape(layout, dims, cut);
    let broadcast = [
        layout.batch_stride == 0,
        layout.head_stride == 0,
        layout.row_stride == 0,
    ];
    layout_of(shape, broadcast, shape[3])
}

/// Where a piece starts along batches, KV heads, query rows and keys.
#[derive(Debug, Clone, Copy)]
struct Origin {
    batch: usize,
    kv_head: usize,
    query: usize,
    key: usize,
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

/// The elements `(offset, len)` a box of a row-major tensor covers when they
/// are one contiguous run: every axis inside the outermost partial one whole.
fn contiguous_run(
    full: [usize; 4],
    start: [usize; 4],
    extent: [usize; 4],
) -> Option<(usize, usize)> {
    let mut partial = false;
    for axis in (0..4).rev() {
        if partial && extent[axis] != 1 {
            return None;
        }
        partial |= extent[axis] != full[axis];
    }
    let offset = ((start[0] * full[1] + start[1]) * full[2] + start[2]) * full[3] + start[3];
    Some((offset, extent.iter().product()))
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
    ctx: &GpuContext,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    options: &AttentionOptions,
    route: Route,
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
                    run_piece(ctx, dims, inputs, &keys, options, route, cut, at, outputs).await?;
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

/// The extent of a piece along each axis (the last piece may be shorter).
fn piece_extent(dims: &AttentionDims, cut: &Cut, at: Origin) -> Cut {
    Cut {
        batches: cut.batches.min(dims.batch - at.batch),
        kv_heads: cut.kv_heads.min(dims.kv_heads - at.kv_head),
        queries: cut.queries.min(dims.q_len - at.query),
        keys: cut.keys.min(dims.total_len() - at.key),
    }
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
    ctx: &GpuContext,
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
    ctx: &GpuContext,
    dims: &AttentionDims,
    inputs: &GpuInputs<'_>,
    keys: &Keys<'_>,
    options: &AttentionOptions,
    route: Route,
    cut: Cut,
    at: Origin,
    outputs: (Source<'_>, Source<'_>, Option<Source<'_>>),
) -> Result<(u64, usize)> {
    let (y, lse, qk) = outputs;
    let t = dims.total_len();
    let extent = piece_extent(dims, &cut, at);
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
        let out = match route {
            // A piece decodes by its own sizes (the planner's, per piece).
            Route::Fused { kernel, .. } => {
                let decode = ctx.decode_plan(&piece.dims);
                fused::run(
                    ctx,
                    &piece.dims,
                    &piece_inputs,
                    &piece_options,
                    &kernel,
                    decode,
                )
                .await?
            }
            Route::Unfused {
                gemm, score_budget, ..
            } => {
                unfused::run(
                    ctx,
                    &piece.dims,
                    &piece_inputs,
                    &piece_options,
                    gemm,
                    score_budget,
                )
                .await?
            }
        };
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

    // Keys in ranges: the fused kernel, resumed from one range to the next.
    // (Also where the call was routed unfused: the unfused path cannot resume
    // a row over key ranges, so a call whose keys exceed a binding needs the
    // fused kernel at its head dims.)
    let planned = match route {
        Route::Fused { kernel, .. } => Ok(kernel),
        Route::Unfused { .. } => {
            ctx.fused_kernel_at(dims.head_dim, dims.v_head_dim, options.precision)
        }
    };
    let kernel = planned.map_err(|e| match e {
        Error::Limit {
            what,
            needed,
            limit,
            limit_name,
            ..
        } => Error::Limit {
            what: format!(
                "{what}, for this call's keys in ranges ({t} keys: K, V or the mask \
                     exceed one binding even one head at a time)"
            ),
            needed,
            limit,
            limit_name,
            hint: "only the fused kernel runs keys in ranges: use fewer keys per call, \
                       an adapter with larger binding limits, or head dims the fused kernel takes",
        },
        other => other,
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(binding: u64) -> Capabilities {
        let mut caps = Capabilities::synthetic("DiscreteGpu");
        caps.limits.max_storage_buffer_binding_size = binding;
        caps.limits.max_buffer_size = 1 << 40;
        caps.timestamp_query = true;
        caps
    }

    fn decode(batch: usize, heads: usize, keys: usize) -> AttentionDims {
        AttentionDims {
            batch,
            q_heads: heads,
            kv_heads: heads,
            q_len: 1,
            kv_len: keys,
            past_len: 0,
            head_dim: 128,
            v_head_dim: 128,
            mask: None,
            has_past: false,
            has_nonpad: false,
            placement: Placement::default(),
        }
    }

    /// The fused route; which kernel does not change how a call is cut.
    fn fused_route() -> Route {
        Route::Fused {
            kernel: crate::kernels::attention::FusedKernel::Subgroup { width: 8 },
            decode: None,
        }
    }

    fn plan(caps: &Capabilities, dims: &AttentionDims, options: &AttentionOptions) -> Result<Cut> {
        let limit = caps.limits.max_bindable_bytes();
        Cut::plan(caps, dims, options, fused_route(), limit)
    }

    #[test]
    fn contiguous_runs_are_whole_inner_axes_under_one_partial_axis() {
        let full = [8, 32, 100, 128];
        assert_eq!(
            contiguous_run(full, [4, 0, 0, 0], [4, 32, 100, 128]),
            Some((4 * 32 * 100 * 128, 4 * 32 * 100 * 128))
        );
        assert_eq!(
            contiguous_run(full, [2, 16, 0, 0], [1, 16, 100, 128]),
            Some(((2 * 32 + 16) * 100 * 128, 16 * 100 * 128))
        );
        // One head's range of keys is a run; two heads' are not.
        assert_eq!(
            contiguous_run(full, [0, 3, 50, 0], [1, 1, 50, 128]),
            Some(((3 * 100 + 50) * 128, 50 * 128))
        );
        assert_eq!(contiguous_run(full, [0, 0, 50, 0], [1, 2, 50, 128]), None);
        assert_eq!(contiguous_run(full, [0, 0, 0, 0], [2, 16, 100, 128]), None);
    }

    #[test]
    fn long_decodes_split_by_batch_then_by_head() {
        // wgpu's native binding limit: 2 GiB less 4 bytes.
        let h100 = gpu((2 << 30) - 4);
        let options = AttentionOptions::default();
        // B 8, H 32, d 128: K is 2 GiB at 16k keys, 16 GiB at 128k.
        let at_16k = decode(8, 32, 16384);
        assert!(!whole_fits(
            &h100,
            &at_16k,
            &options,
            fused_route(),
            (2 << 30) - 4
        ));
        let cut = plan(&h100, &at_16k, &options).unwrap();
        assert_eq!(cut.sizes(), [4, 32, 1, 16384]);
        let cut = plan(&h100, &decode(8, 32, 131072), &options).unwrap();
        assert_eq!(cut.sizes(), [1, 16, 1, 131072]);
        // In a browser (128 MiB), 128k keys of one head (64 MiB) still fit.
        let browser = gpu(128 << 20);
        let cut = plan(&browser, &decode(8, 32, 131072), &options).unwrap();
        assert_eq!(cut.sizes(), [1, 2, 1, 131072]);
        // Calls that fit run whole.
        assert!(whole_fits(
            &h100,
            &decode(8, 32, 4096),
            &options,
            fused_route(),
            (2 << 30) - 4
        ));
    }

    #[test]
    fn keys_split_last_and_never_under_probabilities() {
        let tiny = gpu(64 << 10);
        let options = AttentionOptions::default();
        // One head's K is 1.5 MiB: keys are halved until a piece's K fits.
        let cut = plan(&tiny, &decode(1, 1, 3072), &options).unwrap();
        assert_eq!(cut.sizes(), [1, 1, 1, 96]);
        let probabilities = AttentionOptions {
            qk_matmul_output_mode: Some(QkMatmulOutputMode::Probabilities),
            ..Default::default()
        };
        let err = plan(&tiny, &decode(1, 1, 3072), &probabilities).unwrap_err();
        assert!(err.to_string().contains("mode 2"), "{err}");
        // Per-batch lengths: keys split one batch at a time.
        let lengths = AttentionDims {
            has_nonpad: true,
            ..decode(4, 1, 3072)
        };
        let cut = plan(&tiny, &lengths, &options).unwrap();
        assert_eq!(cut.batches, 1);
    }
}
