//! How a call is cut so that each binding fits: pure arithmetic on the
//! call's sizes and the adapter's limits, which the plan runs once
//! ([`crate::plan::plan_call`]) and `run/split.rs` follows.
//!
//! WebGPU binds at most `max_storage_buffer_binding_size` bytes of a buffer
//! (128 MiB by default, 2 GiB less 4 bytes natively in wgpu), while a buffer
//! itself may be larger. A call whose every binding fits runs whole.
//! Otherwise [`Cut::plan`] picks piece sizes: it halves, for each binding
//! that does not fit, the first axis that binding depends on, in the order
//! batches, KV heads (with their query heads), query rows, keys.

use crate::device::capabilities::Capabilities;
use crate::device::recorder::SEGMENT_ALIGNMENT;
use crate::error::{Error, Result};
use crate::kernels::decode::{DecodeKernel, DecodeLayout};
use crate::options::{AttentionOptions, QkMatmulOutputMode};
use crate::plan::GpuRoute as Route;
use crate::problem::{AttentionDims, MaskLayout};

/// How a call on `route` is cut: `None` where every binding fits (it runs
/// whole), else the pieces [`Cut::plan`] picks (a typed error where even
/// the smallest does not fit).
pub(crate) fn cut_for(
    caps: &Capabilities,
    dims: &AttentionDims,
    options: &AttentionOptions,
    route: Route,
) -> Result<Option<Cut>> {
    let limit = caps.limits.max_bindable_bytes();
    if whole_fits(caps, dims, options, route, limit) {
        return Ok(None);
    }
    Cut::plan(caps, dims, options, route, limit).map(Some)
}

/// Whether a call with f16 keys and values on `route`, cut as `cut`, can
/// read them in place: whole, or in pieces that keep every key (the decode
/// kernel's) and whose slices of K and V are aligned views (f16 slices are
/// never copied), inside one buffer each where K and V are held in chunks
/// of `kv_chunks` values.
pub(crate) fn f16_in_place(
    dims: &AttentionDims,
    route: Route,
    cut: Option<&Cut>,
    kv_chunks: [Option<usize>; 2],
) -> bool {
    match cut {
        None => {
            kv_chunks == [None, None] || {
                route.is_fused() && f16_views_fit(dims, &Cut::whole(dims), kv_chunks)
            }
        }
        Some(cut) => route.is_fused() && f16_views_fit(dims, cut, kv_chunks),
    }
}

/// Whether every piece of `cut` keeps all keys, runs the decode kernel, and
/// binds its f16 K and V slices as aligned views of whole vec4s, each inside
/// one chunk where K or V is held in chunks of that many values.
pub(crate) fn f16_views_fit(
    dims: &AttentionDims,
    cut: &Cut,
    kv_chunks: [Option<usize>; 2],
) -> bool {
    let t = dims.total_len();
    if cut.keys < t || !DecodeLayout::applies(&cut.piece_dims(dims)) {
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

/// Bytes of a storage buffer of the product of `dims` f32 values (whole
/// vec4s, never empty), in u64: on wasm32 a usize product would overflow.
pub(crate) fn stored(dims: &[usize]) -> u64 {
    let len = dims.iter().map(|&d| d as u64).product::<u64>();
    len.max(1).div_ceil(4) * 16
}

/// Whether the call runs whole: everything its path binds fits one binding.
pub(crate) fn whole_fits(
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
pub(crate) struct Binding {
    name: &'static str,
    bytes: u64,
    /// Batches, KV heads, query rows, keys.
    axes: [bool; 4],
}

/// Piece sizes along batches, KV heads, query rows and keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    pub(crate) batches: usize,
    pub(crate) kv_heads: usize,
    pub(crate) queries: usize,
    pub(crate) keys: usize,
}

impl Cut {
    pub(crate) fn whole(dims: &AttentionDims) -> Cut {
        Cut {
            batches: dims.batch,
            kv_heads: dims.kv_heads,
            queries: dims.q_len,
            keys: dims.total_len(),
        }
    }

    pub(crate) fn sizes(&self) -> [usize; 4] {
        [self.batches, self.kv_heads, self.queries, self.keys]
    }

    pub(crate) fn halve(&mut self, axis: usize) {
        let n = match axis {
            0 => &mut self.batches,
            1 => &mut self.kv_heads,
            2 => &mut self.queries,
            _ => &mut self.keys,
        };
        *n = n.div_ceil(2);
    }

    /// The extents (batches, KV heads, query rows) the call's pieces take:
    /// this cut's, and the shorter last pieces' along each axis.
    pub(crate) fn extents(&self, dims: &AttentionDims) -> Vec<[usize; 3]> {
        let options = |size: usize, total: usize| {
            let mut sizes = vec![size.min(total)];
            if !total.is_multiple_of(size) && total > size {
                sizes.push(total % size);
            }
            sizes
        };
        let mut out = Vec::new();
        for b in options(self.batches, dims.batch) {
            for g in options(self.kv_heads, dims.kv_heads) {
                for q in options(self.queries, dims.q_len) {
                    out.push([b, g, q]);
                }
            }
        }
        out
    }

    /// This cut with pieces of `extent` (batches, KV heads, query rows).
    pub(crate) fn with_extent(&self, [batches, kv_heads, queries]: [usize; 3]) -> Cut {
        Cut {
            batches,
            kv_heads,
            queries,
            keys: self.keys,
        }
    }

    /// What a piece of this size binds.
    pub(crate) fn bindings(
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
        if route.is_fused() && self.keys == dims.total_len() && DecodeLayout::applies(&piece) {
            // The staged kernel's splits: the most partials any decode kernel
            // writes (the streaming kernel's loop budget allows longer splits).
            let plan = DecodeLayout::new(&piece, caps, DecodeKernel::Staged);
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
    pub(crate) fn piece_dims(&self, dims: &AttentionDims) -> AttentionDims {
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
    pub(crate) fn plan(
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
pub(crate) fn mask_shape(layout: &MaskLayout, dims: &AttentionDims) -> [usize; 4] {
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
pub(crate) fn piece_mask_shape(layout: &MaskLayout, dims: &AttentionDims, cut: &Cut) -> [usize; 4] {
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
pub(crate) fn layout_of(shape: [usize; 4], broadcast: [bool; 3], cols: usize) -> MaskLayout {
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

pub(crate) fn piece_mask_layout(
    layout: &MaskLayout,
    dims: &AttentionDims,
    cut: &Cut,
) -> MaskLayout {
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
pub(crate) struct Origin {
    pub(crate) batch: usize,
    pub(crate) kv_head: usize,
    pub(crate) query: usize,
    pub(crate) key: usize,
}

/// The elements `(offset, len)` a box of a row-major tensor covers when they
/// are one contiguous run: every axis inside the outermost partial one whole.
pub(crate) fn contiguous_run(
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

/// The extent of a piece along each axis (the last piece may be shorter).
pub(crate) fn piece_extent(dims: &AttentionDims, cut: &Cut, at: Origin) -> Cut {
    Cut {
        batches: cut.batches.min(dims.batch - at.batch),
        kv_heads: cut.kv_heads.min(dims.kv_heads - at.kv_head),
        queries: cut.queries.min(dims.q_len - at.query),
        keys: cut.keys.min(dims.total_len() - at.key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Placement;

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
            f16: Default::default(),
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
