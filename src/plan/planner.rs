//! The planner: turns (capabilities, the engine's choices, the tuning table,
//! the problem's head dims) into the GEMM kernel and the fused kernel with its
//! tiles. It sits above the ops and the context: the ops know their own tile
//! arithmetic, the context holds the choices as data (`plan/overrides.rs`), the
//! capabilities describe the adapter, and only this module decides.

use crate::device::capabilities::{Capabilities, KernelLimits};
use crate::device::context::GpuContext;
use crate::error::Result;
use crate::kernels::attention::{CoopForm, CoopTiles, FusedKernel, FusedTiles, TiledTiles};
use crate::kernels::decode::{DecodeKernel, DecodePlan, StreamShape, GROUPED_ROWS, TUNED_ROWS};
use crate::kernels::gemm::SKINNY_MAX_ROWS;
use crate::kernels::gemm::{gemm_kernel_for, FastGemm, GemmKernel};
use crate::kernels::matrix_units::{coop_shape, CoopShape};
use crate::options::Precision;
use crate::plan::overrides::{DecodeKernelChoice, FusedKernelChoice, Overrides};
use crate::problem::AttentionDims;
use crate::tuning::{TunedCoop, TunedEntry, TunedKernel};

/// The GEMM kernel for `precision`: under [`Precision::Fast`] the
/// matrix-unit kernel where [`coop_shape`] finds a configuration and the
/// staged kernel's tile fits the limits (the packed kernel, at its default
/// tile, where that fits too: it hands the staged one what it cannot hold),
/// else (and always under `Highest`) `f32_kernel`.
pub fn gemm_kernel_at(
    caps: &Capabilities,
    precision: Precision,
    f32_kernel: GemmKernel,
) -> GemmKernel {
    match (precision, coop_shape(caps)) {
        (Precision::Fast, Some(shape)) if crate::kernels::gemm::coop_fits(shape, &caps.limits) => {
            let tile = crate::kernels::gemm::PackedTile::DEFAULT;
            if crate::kernels::gemm::packed::fits(shape, tile, &caps.limits) {
                GemmKernel::CoopPacked { shape, tile }
            } else {
                GemmKernel::Coop(shape)
            }
        }
        _ => f32_kernel,
    }
}

/// The fused kernel an adapter runs at head dims `dk`, `dv` from its limits
/// alone (no tuning): on a GPU the register-tiled kernel's largest tile that
/// fits (else the portable kernel); on a CPU adapter `attention_sg` where it
/// has fixed subgroups (head dims multiples of 4), else the portable kernel,
/// which a CPU runs faster (SwiftShader in Chromium: 52 ms against 310 ms for
/// the tiled kernel on the library's repeated call; BENCHMARKS.md). Head dims
/// beyond the fused kernels, or a workgroup memory too small for one key, are
/// a typed error.
pub fn fused_kernel_for(caps: &Capabilities, dk: usize, dv: usize) -> Result<FusedKernel> {
    let tiles = FusedTiles::for_dims(dk, dv, &caps.limits)?;
    Ok(match caps.fixed_cpu_subgroup() {
        Some(width) if dk.is_multiple_of(4) && dv.is_multiple_of(4) => {
            FusedKernel::Subgroup { width }
        }
        Some(_) => FusedKernel::Portable(tiles),
        None if caps.adapter.device_type == "Cpu" => FusedKernel::Portable(tiles),
        None => tiled_or_portable(tiles, dk, dv, &caps.limits),
    })
}

/// The register-tiled kernel where one of its tiles fits, else the portable
/// kernel with `portable` tiles.
pub fn tiled_or_portable(
    portable: FusedTiles,
    dk: usize,
    dv: usize,
    limits: &KernelLimits,
) -> FusedKernel {
    match TiledTiles::for_dims(dk, dv, limits) {
        Some(tiles) => FusedKernel::Tiled(tiles),
        None => FusedKernel::Portable(portable),
    }
}

/// The form of `kernel` the tuning table keeps (`None` for the matrix-unit
/// kernel: the tuner measures f32 products, and the table holds f32 kernels).
pub fn tuned_form(kernel: &FusedKernel) -> Option<TunedKernel> {
    match kernel {
        FusedKernel::Tiled(t) => Some(TunedKernel::Tiled {
            query_rows: t.query_rows,
            keys_per_tile: t.keys_per_tile,
            tq: t.tq,
            tk: t.tk,
            prefetch: t.prefetch,
            shuffle: t.shuffle,
            chunked: t.chunked,
        }),
        FusedKernel::Portable(_) => Some(TunedKernel::Portable),
        FusedKernel::Subgroup { .. } => Some(TunedKernel::Subgroup),
        FusedKernel::Coop(_) => None,
    }
}

/// The runnable kernel a tuning entry names, at head dims `dk`, `dv` on
/// `caps`, or why not: the kernel no longer offers those tiles, or they do not
/// fit the limits.
pub fn resolve_tuned(
    tuned: TunedKernel,
    caps: &Capabilities,
    dk: usize,
    dv: usize,
) -> std::result::Result<FusedKernel, String> {
    let name = tuned.name();
    match tuned {
        TunedKernel::Tiled {
            query_rows,
            keys_per_tile,
            tq,
            tk,
            ..
        } => TiledTiles::candidates(dk, dv)
            .into_iter()
            .find(|t| tuned_form(&FusedKernel::Tiled(*t)) == Some(tuned))
            .filter(|t| t.runs_on(caps))
            .map(FusedKernel::Tiled)
            .ok_or_else(|| {
                format!(
                    "{name} has no {query_rows}x{keys_per_tile} tile on a {tq}x{tk} grid \
                     that runs on this adapter at head dims {dk}/{dv}"
                )
            }),
        TunedKernel::Portable => FusedTiles::for_dims(dk, dv, &caps.limits)
            .map(FusedKernel::Portable)
            .map_err(|e| e.to_string()),
        TunedKernel::Subgroup => match caps.fixed_cpu_subgroup() {
            Some(width) if dk.is_multiple_of(4) && dv.is_multiple_of(4) => {
                Ok(FusedKernel::Subgroup { width })
            }
            _ => Err("attention_sg does not run here at these head dims".to_string()),
        },
    }
}

/// The kernel choices for calls at head dims `dk`, `dv` on one adapter, as a
/// pure function of its inputs: the capabilities, a snapshot of the tuning
/// table's entry for these head dims, and the overrides. Nothing here touches
/// a device, so every choice can be tested on made-up adapters.
#[derive(Debug, Clone, Copy)]
pub struct Planner<'a> {
    /// The adapter.
    pub caps: &'a Capabilities,
    /// What the engine is told to run in place of the planner's picks.
    pub overrides: &'a Overrides,
    /// The tuning table's entry for these head dims (stale parts already
    /// dropped, see [`GpuContext::tuning_snapshot`]).
    pub tuned: Option<TunedEntry>,
    /// The query and key head dim.
    pub dk: usize,
    /// The value head dim.
    pub dv: usize,
}

impl Planner<'_> {
    /// The GEMM kernel the context records: the one forced by the
    /// overrides, else the adapter's ([`gemm_kernel_for`]).
    pub fn gemm_kernel(&self) -> GemmKernel {
        self.overrides
            .gemm
            .unwrap_or_else(|| gemm_kernel_for(self.caps))
    }

    /// The GEMM kernel for products of `precision`: [`Planner::gemm_kernel`],
    /// or the matrix-unit kernel under [`Precision::Fast`] where the adapter
    /// has one ([`gemm_kernel_at`]). A forced kernel stays, whatever the precision.
    pub fn gemm_kernel_at(&self, precision: Precision) -> GemmKernel {
        match self.overrides.gemm {
            Some(forced) => forced,
            None => gemm_kernel_at(self.caps, precision, gemm_kernel_for(self.caps)),
        }
    }

    /// The GEMM kernel a call at `precision` records: [`Planner::gemm_kernel_at`],
    /// except that at [`Precision::Fast`] on the matrix units the form pinned
    /// in the overrides, else the one `webattn tune` measured fastest for
    /// these head dims, replaces the default where it fits.
    pub fn gemm_kernel_for_call(&self, precision: Precision) -> GemmKernel {
        let default = self.gemm_kernel_at(precision);
        if self.overrides.gemm.is_some() {
            return default;
        }
        let (GemmKernel::CoopPacked { shape, .. } | GemmKernel::Coop(shape)) = default else {
            return default;
        };
        let form = self.overrides.pinned_fast_gemm.or_else(|| {
            self.tuned
                .and_then(|entry| entry.fast_gemm)
                .map(|tuned| tuned.form)
        });
        match form.map(|form| form.kernel(shape)) {
            Some(GemmKernel::CoopPacked { tile, .. })
                if !crate::kernels::gemm::packed::fits(shape, tile, &self.caps.limits) =>
            {
                default
            }
            Some(kernel) => kernel,
            None => default,
        }
    }

    /// The GEMM kernel for products of `rows` rows of op(A) at `precision`:
    /// the skinny kernel up to [`SKINNY_MAX_ROWS`] rows (a decoder step's
    /// products read each value of B once; matrix units and 64-row tiles would
    /// compute rows of zeros), else [`Planner::gemm_kernel_for_call`]. CPU
    /// adapters with fixed subgroups keep the subgroup kernel, whose shuffles
    /// spare the per-lane loads that the skinny kernel's split K makes
    /// (measured 1.3-1.9x slower on lavapipe). A forced kernel stays, but
    /// for the tiled one (the portable kernels), which hands such products to
    /// the skinny kernel as an adapter without subgroups does.
    pub fn gemm_kernel_for_rows(&self, precision: Precision, rows: usize) -> GemmKernel {
        let skinny = match self.overrides.gemm {
            None => self.caps.fixed_cpu_subgroup().is_none(),
            Some(forced) => matches!(forced, GemmKernel::Tiled | GemmKernel::Skinny),
        };
        if skinny && rows <= SKINNY_MAX_ROWS {
            return GemmKernel::Skinny;
        }
        self.gemm_kernel_for_call(precision)
    }

    /// The precision the unfused path's GEMMs take in a call at `precision`:
    /// `precision`, except that under `Auto` a call at [`Precision::Fast`]
    /// keeps them in f32 where the tuning table measured the unfused path
    /// slower on the matrix units than in f32 (`Fast` allows f16 products;
    /// it does not ask for a slower path). Forcing the matrix-unit kernel
    /// keeps them on the matrix units.
    pub fn unfused_precision(&self, precision: Precision) -> Precision {
        let measured_slower = precision == Precision::Fast
            && self.overrides.fused == FusedKernelChoice::Auto
            && self
                .tuned
                .and_then(|e| e.unfused_coop_ms.map(|coop| coop > e.unfused_ms))
                .unwrap_or(false);
        if measured_slower {
            Precision::Highest
        } else {
            precision
        }
    }

    /// The tuned fused kernel, if one was measured and still runs here.
    fn tuned_fused_kernel(&self) -> Option<FusedKernel> {
        let entry = self.tuned?;
        // The subgroup kernel's class also holds head dims it leaves to the
        // portable kernel (not multiples of 4).
        if entry.kernel == TunedKernel::Subgroup
            && (!self.dk.is_multiple_of(4) || !self.dv.is_multiple_of(4))
        {
            return None;
        }
        resolve_tuned(entry.kernel, self.caps, self.dk, self.dv).ok()
    }

    /// The f32 fused kernel: a pinned kernel (tuner); a forced one wherever
    /// it can run; else the tuning table's winner for this adapter and
    /// head-dim class; else [`fused_kernel_for`] the adapter's limits.
    pub fn fused_kernel(&self) -> Result<FusedKernel> {
        let (dk, dv, caps) = (self.dk, self.dv, self.caps);
        if let Some(pinned) = self.overrides.pinned_fused {
            if let Ok(kernel) = resolve_tuned(pinned, caps, dk, dv) {
                return Ok(kernel);
            }
        }
        let with_width = |kernel: FusedKernel| match (kernel, self.overrides.subgroup_width) {
            (FusedKernel::Subgroup { .. }, Some(width)) => FusedKernel::Subgroup { width },
            (kernel, _) => kernel,
        };
        match self.overrides.fused {
            FusedKernelChoice::Portable => Ok(FusedKernel::Portable(FusedTiles::for_dims(
                dk,
                dv,
                &caps.limits,
            )?)),
            // attention_sg wherever it can run: head dims that are not
            // multiples of 4 take attention_fused, as they do under auto, and
            // the same head-dim limits apply.
            FusedKernelChoice::Subgroup => {
                let tiles = FusedTiles::for_dims(dk, dv, &caps.limits)?;
                if dk % 4 != 0 || dv % 4 != 0 {
                    return Ok(FusedKernel::Portable(tiles));
                }
                let width = self
                    .overrides
                    .subgroup_width
                    .or(caps.fixed_cpu_subgroup())
                    .unwrap_or(8);
                Ok(FusedKernel::Subgroup { width })
            }
            // attention_tiled wherever one of its tiles fits (the tuned one
            // where measured); where none does (head dims of 256 in 16 KiB of
            // workgroup memory) attention_fused.
            FusedKernelChoice::Tiled => {
                let tiles = FusedTiles::for_dims(dk, dv, &caps.limits)?;
                if let Some(tuned @ FusedKernel::Tiled(t)) = self.tuned_fused_kernel() {
                    if !t.shuffle && !t.chunked {
                        return Ok(tuned);
                    }
                }
                Ok(tiled_or_portable(tiles, dk, dv, &caps.limits))
            }
            // The shuffle or the chunked form: the tuned one where measured,
            // else the first that runs here; where none does, what
            // attention_tiled runs.
            choice @ (FusedKernelChoice::TiledShuffle | FusedKernelChoice::TiledChunked) => {
                let of_form = |t: &TiledTiles| match choice {
                    FusedKernelChoice::TiledShuffle => t.shuffle,
                    _ => t.chunked,
                };
                let tiles = FusedTiles::for_dims(dk, dv, &caps.limits)?;
                if let Some(tuned @ FusedKernel::Tiled(t)) = self.tuned_fused_kernel() {
                    if of_form(&t) {
                        return Ok(tuned);
                    }
                }
                let form = TiledTiles::candidates(dk, dv)
                    .into_iter()
                    .find(|t| of_form(t) && t.runs_on(caps));
                Ok(match form {
                    Some(t) => FusedKernel::Tiled(t),
                    None => tiled_or_portable(tiles, dk, dv, &caps.limits),
                })
            }
            // The matrix-unit kernel is for calls that allow f16 products
            // ([`Planner::fused_kernel_at`]); f32 calls run what auto picks.
            FusedKernelChoice::Auto
            | FusedKernelChoice::Coop
            | FusedKernelChoice::CoopStaged
            | FusedKernelChoice::CoopShared => {
                // The head-dim limits have their say first.
                let chosen = fused_kernel_for(caps, dk, dv)?;
                Ok(with_width(self.tuned_fused_kernel().unwrap_or(chosen)))
            }
        }
    }

    /// The fused kernel in a call at `precision`: under [`Precision::Fast`],
    /// unless a kernel is pinned or an f32 kernel forced, the matrix-unit
    /// kernel where the adapter has matrix units ([`coop_shape`]) and one of
    /// its tiles fits, and (under `Auto`) the tuning table does not measure
    /// it slower than the f32 winner; else (and always under `Highest`)
    /// [`Planner::fused_kernel`].
    pub fn fused_kernel_at(&self, precision: Precision) -> Result<FusedKernel> {
        let choice = self.overrides.fused;
        let chooses = choice == FusedKernelChoice::Auto || choice.is_coop();
        if precision == Precision::Fast && chooses && self.overrides.pinned_fused.is_none() {
            // The head-dim limits have their say first.
            FusedTiles::for_dims(self.dk, self.dv, &self.caps.limits)?;
            let tiles =
                coop_shape(self.caps).and_then(|shape| self.coop_tiles(shape, choice.coop_form()));
            // Fast allows f16 products; it does not ask for a slower kernel.
            let measured_slower = choice == FusedKernelChoice::Auto
                && self
                    .tuned
                    .and_then(|entry| entry.coop_ms.map(|coop| coop > entry.fused_ms))
                    .unwrap_or(false);
            if let Some(tiles) = tiles
                .map(|tiles| match self.overrides.coop_lanes_per_row {
                    Some(lanes) => Some(tiles.with_lanes_per_row(lanes))
                        .filter(|t| t.is_valid() && t.fits(&self.caps.limits))
                        .unwrap_or(tiles),
                    None => tiles,
                })
                .filter(|_| !measured_slower)
            {
                return Ok(FusedKernel::Coop(tiles));
            }
        }
        self.fused_kernel()
    }

    /// The matrix-unit kernel's tiles, in the `forced` form only where one
    /// is ([`CoopTiles::form`]): those pinned in the overrides, else those
    /// `webattn tune` measured fastest (in the form measured, unless one is
    /// forced), where either is a candidate that fits; else the largest
    /// candidate that fits, packed unless a form is forced.
    fn coop_tiles(&self, shape: CoopShape, forced: Option<CoopForm>) -> Option<CoopTiles> {
        let limits = &self.caps.limits;
        let (dk, dv) = (self.dk, self.dv);
        let in_form = move |form: Option<CoopForm>| {
            coop_forms(shape, dk, dv).filter(move |t| form.is_none_or(|f| t.form == f))
        };
        let candidate = |want: TunedCoop| {
            in_form(Some(forced.unwrap_or(want.form))).find(|t| coop_matches(t, want, limits))
        };
        self.overrides
            .pinned_coop
            .and_then(candidate)
            .or_else(|| self.tuned.and_then(|e| e.coop_tiles).and_then(candidate))
            .or_else(|| in_form(Some(forced.unwrap_or(CoopForm::Packed))).find(|t| t.fits(limits)))
    }

    /// The decode plan for `dims` (whose head dims are the planner's), or
    /// `None` where the decode kernels do not apply (more than 16 query
    /// rows, few keys, head dims not multiples of 4). Its kernel: a pinned
    /// one (tuner); a forced one; else the tuning table's for this head-dim
    /// class where it suits the call's rows per workgroup
    /// ([`StreamShape::suits`]; the tuner measures one row per workgroup and
    /// [`GROUPED_ROWS`], and a call with several rows tries the grouped
    /// winner first, one row the one-row winner); else
    /// [`decode_kernel_for`]; in each case the staged kernel where a
    /// streaming shape does not hold the call's rows.
    pub fn decode_plan(&self, dims: &AttentionDims) -> Option<DecodePlan> {
        debug_assert_eq!((dims.head_dim, dims.v_head_dim), (self.dk, self.dv));
        if !DecodePlan::applies(dims) {
            return None;
        }
        let caps = self.caps;
        let chosen = || decode_kernel_for(caps, dims);
        let kernel = match (self.overrides.pinned_decode, self.overrides.decode) {
            (Some(pinned), _) => pinned,
            (None, DecodeKernelChoice::Staged) => DecodeKernel::Staged,
            (None, DecodeKernelChoice::Stream) => chosen(),
            (None, DecodeKernelChoice::Auto) => {
                let rows = DecodePlan::heads_per_workgroup(dims) * dims.q_len;
                let one_row = self.tuned.and_then(|e| e.decode).map(|d| (d, TUNED_ROWS));
                let grouped = self
                    .tuned
                    .and_then(|e| e.grouped_decode)
                    .map(|d| (d, GROUPED_ROWS));
                // The grouped problem's winner first for a call with several
                // rows per workgroup, the one-row problem's for one.
                let measured = if rows > TUNED_ROWS {
                    [grouped, one_row]
                } else {
                    [one_row, grouped]
                };
                measured
                    .into_iter()
                    .flatten()
                    .map(|(tuned, measured_rows)| (tuned.kernel, measured_rows))
                    .find(|&(kernel, measured_rows)| {
                        DecodePlan::runnable(kernel, dims, caps) == kernel
                            && match kernel {
                                DecodeKernel::Stream(shape) => {
                                    shape.suits(dims, rows, measured_rows, caps)
                                }
                                DecodeKernel::Staged => true,
                            }
                    })
                    .map_or_else(chosen, |(kernel, _)| kernel)
            }
        };
        Some(DecodePlan::new(dims, caps, kernel))
    }
}

/// Every matrix-unit candidate at these head dims in every form the kernel
/// takes it in (each candidate's forms together, the default first).
fn coop_forms(shape: CoopShape, dk: usize, dv: usize) -> impl Iterator<Item = CoopTiles> {
    CoopTiles::candidates(shape, dk, dv)
        .into_iter()
        .flat_map(|t| CoopForm::ALL.map(|form| t.in_form(form)))
        .filter(CoopTiles::is_valid)
}

/// Whether matrix-unit tiles `t` are the tuned tiles `want` and fit `limits`.
fn coop_matches(t: &CoopTiles, want: TunedCoop, limits: &KernelLimits) -> bool {
    t.subgroups == want.subgroups && t.keys_per_tile == want.keys_per_tile && t.fits(limits)
}

impl GpuContext {
    /// What this context is told to run in place of the planner's picks.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// The planner for calls at head dims `dk`, `dv` on this context: its
    /// capabilities, overrides, and a snapshot of its tuning entry.
    pub fn planner(&self, dk: usize, dv: usize) -> Planner<'_> {
        Planner {
            caps: &self.caps,
            overrides: &self.overrides,
            tuned: self.tuning_snapshot(dk, dv),
            dk,
            dv,
        }
    }

    /// The tuning table's entry for head dims `dk`, `dv`, with what no longer
    /// runs here dropped from the table, with a warning, once: a fused kernel
    /// the kernel no longer offers or whose tiles no longer fit (the whole
    /// entry), matrix-unit tiles no candidate matches (those tiles and their
    /// time).
    pub fn tuning_snapshot(&self, dk: usize, dv: usize) -> Option<TunedEntry> {
        let mut entry = self.tuned(dk, dv)?;
        let subgroup_elsewhere = entry.kernel == TunedKernel::Subgroup
            && (!dk.is_multiple_of(4) || !dv.is_multiple_of(4));
        if !subgroup_elsewhere {
            if let Err(why) = resolve_tuned(entry.kernel, &self.caps, dk, dv) {
                log::warn!("webattn: tuning entry for head dims {dk}/{dv} ignored: {why}");
                self.tuning
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&self.tuning_key(dk, dv));
                return None;
            }
        }
        if let (Some(shape), Some(want)) = (coop_shape(&self.caps), entry.coop_tiles) {
            let stale = !coop_forms(shape, dk, dv)
                .any(|t| coop_matches(&t, want, &self.caps.limits) && t.form == want.form);
            if stale {
                log::warn!(
                    "webattn: tuned matrix-unit tiles {} for head dims {dk}/{dv} ignored: no \
                     candidate that fits here",
                    want.name()
                );
                entry.coop_tiles = None;
                entry.coop_ms = None;
                self.tuning
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(self.tuning_key(dk, dv), entry);
            }
        }
        Some(entry)
    }

    /// The GEMM kernel this context records ([`Planner::gemm_kernel`]).
    pub fn gemm_kernel(&self) -> GemmKernel {
        self.untuned_planner().gemm_kernel()
    }

    /// The f32 GEMM kernel this context records for a product of `rows`
    /// rows ([`Planner::gemm_kernel_for_rows`]).
    pub fn gemm_kernel_for_rows(&self, rows: usize) -> GemmKernel {
        self.untuned_planner()
            .gemm_kernel_for_rows(Precision::Highest, rows)
    }

    /// A planner for the choices no tuning entry touches.
    fn untuned_planner(&self) -> Planner<'_> {
        Planner {
            caps: &self.caps,
            overrides: &self.overrides,
            tuned: None,
            dk: 0,
            dv: 0,
        }
    }

    /// The GEMM kernel this context records for products of `precision`
    /// ([`Planner::gemm_kernel_at`]).
    pub fn gemm_kernel_at(&self, precision: Precision) -> GemmKernel {
        self.untuned_planner().gemm_kernel_at(precision)
    }

    /// The GEMM kernel a call at `precision` with head dims `dk`, `dv`
    /// records ([`Planner::gemm_kernel_for_call`]).
    pub fn gemm_kernel_for_call(&self, precision: Precision, dk: usize, dv: usize) -> GemmKernel {
        self.planner(dk, dv).gemm_kernel_for_call(precision)
    }

    /// The precision of the unfused path's GEMMs ([`Planner::unfused_precision`]).
    pub fn unfused_precision(&self, dk: usize, dv: usize, precision: Precision) -> Precision {
        self.planner(dk, dv).unfused_precision(precision)
    }

    /// The f32 fused kernel for head dims `dk`, `dv` ([`Planner::fused_kernel`]).
    pub fn fused_kernel(&self, dk: usize, dv: usize) -> Result<FusedKernel> {
        self.planner(dk, dv).fused_kernel()
    }

    /// The fused kernel for head dims `dk`, `dv` in a call at `precision`
    /// ([`Planner::fused_kernel_at`]).
    pub fn fused_kernel_at(
        &self,
        dk: usize,
        dv: usize,
        precision: Precision,
    ) -> Result<FusedKernel> {
        self.planner(dk, dv).fused_kernel_at(precision)
    }

    /// The decode plan for `dims` ([`Planner::decode_plan`]).
    pub fn decode_plan(&self, dims: &AttentionDims) -> Option<DecodePlan> {
        self.planner(dims.head_dim, dims.v_head_dim)
            .decode_plan(dims)
    }

    /// This context with every fused call running `kernel` (an f32 kernel,
    /// whose head-dim class must be the calls'); for timing one candidate.
    pub fn with_pinned_fused_kernel(mut self, kernel: FusedKernel) -> GpuContext {
        debug_assert!(tuned_form(&kernel).is_some(), "only f32 kernels are tuned");
        self.overrides.pinned_fused = tuned_form(&kernel);
        self
    }

    /// This context with the matrix-unit kernel's scalar steps (the rules,
    /// the maxima, P) sharing each row among `lanes` invocations where its
    /// tiles take that many ([`CoopTiles::with_lanes_per_row`]; else their
    /// default): for testing the shares an adapter's own shapes do not use.
    pub fn with_coop_lanes_per_row(mut self, lanes: u32) -> GpuContext {
        self.overrides.coop_lanes_per_row = Some(lanes);
        self
    }

    /// This context with calls at [`Precision::Fast`] that take the
    /// matrix-unit fused kernel taking `tiles` where they fit (else its
    /// tuned or default tiles): for timing or testing one configuration.
    pub fn with_pinned_coop_tiles(mut self, tiles: TunedCoop) -> GpuContext {
        self.overrides.pinned_coop = Some(tiles);
        self
    }

    /// This context with calls at [`Precision::Fast`] taking `form` of the
    /// matrix-unit GEMM where it runs: for timing or testing one form.
    pub fn with_pinned_fast_gemm(mut self, form: FastGemm) -> GpuContext {
        self.overrides.pinned_fast_gemm = Some(form);
        self
    }

    /// This context with every decode call running `kernel` where it can
    /// (else the staged kernel): for timing or testing one candidate.
    pub fn with_pinned_decode(mut self, kernel: DecodeKernel) -> GpuContext {
        self.overrides.pinned_decode = Some(kernel);
        self
    }
}

/// The decode kernel an adapter runs for `dims` from its capabilities alone
/// (no tuning): the streaming kernel on adapters with subgroups wide enough
/// for its teams, where a shape holds the call's rows
/// ([`StreamShape::choose`]); the staged kernel elsewhere. (lavapipe ran
/// the streaming kernel 3.6-4.1 times as fast as the staged one at 4096 and
/// 8192 keys, BENCHMARKS.md; GPUs are still to be measured.)
pub fn decode_kernel_for(caps: &Capabilities, dims: &AttentionDims) -> DecodeKernel {
    let rows = DecodePlan::heads_per_workgroup(dims) * dims.q_len;
    match StreamShape::choose(dims, rows, caps) {
        Some(shape) => DecodeKernel::Stream(shape),
        None => DecodeKernel::Staged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matrix_units::CoopSize;

    impl Capabilities {
        /// A discrete GPU without subgroups, with these limits.
        fn for_tests(limits: KernelLimits) -> Capabilities {
            Capabilities {
                limits,
                ..Capabilities::synthetic("DiscreteGpu")
            }
        }
    }

    #[test]
    fn tuned_forms_resolve_back_to_their_kernel() {
        let limits = KernelLimits {
            max_compute_workgroup_storage_size: 48 << 10,
            ..KernelLimits::WEBGPU_DEFAULTS
        };
        let mut caps = Capabilities::for_tests(limits);
        (
            caps.subgroups,
            caps.subgroup_min_size,
            caps.subgroup_max_size,
        ) = (true, 32, 32);
        let all = TiledTiles::candidates(64, 64);
        assert!(all.iter().any(|t| t.shuffle && t.runs_on(&caps)));
        for kernel in all
            .into_iter()
            .filter(|t| t.runs_on(&caps))
            .map(FusedKernel::Tiled)
            .chain([FusedKernel::Portable(
                FusedTiles::for_dims(64, 64, &limits).unwrap(),
            )])
        {
            let form = tuned_form(&kernel).expect("an f32 kernel");
            assert_eq!(resolve_tuned(form, &caps, 64, 64), Ok(kernel));
        }
        let missing = TunedKernel::Tiled {
            query_rows: 48,
            keys_per_tile: 24,
            tq: 12,
            tk: 4,
            prefetch: false,
            shuffle: false,
            chunked: false,
        };
        assert!(resolve_tuned(missing, &caps, 64, 64).is_err());
        // A shuffle form does not resolve where subgroups are narrower than
        // its rows of invocations.
        let shuffled = TiledTiles::candidates(64, 64)
            .into_iter()
            .find(|t| t.shuffle && t.tk == 16 && t.fits(&limits))
            .expect("a shuffle form on rows of 16");
        let form = tuned_form(&FusedKernel::Tiled(shuffled)).unwrap();
        caps.subgroup_min_size = 8;
        assert!(resolve_tuned(form, &caps, 64, 64).is_err());
        assert!(resolve_tuned(TunedKernel::Subgroup, &caps, 64, 64).is_err());
    }

    /// An adapter reporting `configs` (m = n = k, ab, cr) with subgroups of
    /// `min..=max` lanes, shader-f16, and 48 KiB of workgroup memory.
    fn with_matrix_units(
        configs: &[(u32, &'static str, &'static str)],
        min: u32,
        max: u32,
    ) -> Capabilities {
        use crate::device::capabilities::CoopMatrixConfig;
        let mut caps = Capabilities::for_tests(KernelLimits {
            max_compute_workgroup_storage_size: 48 << 10,
            max_compute_invocations_per_workgroup: 1024,
            ..KernelLimits::WEBGPU_DEFAULTS
        });
        caps.shader_f16 = true;
        caps.subgroups = true;
        caps.subgroup_min_size = min;
        caps.subgroup_max_size = max;
        caps.cooperative_matrix = configs
            .iter()
            .map(|&(n, ab, cr)| CoopMatrixConfig {
                m: n,
                n,
                k: n,
                ab,
                cr,
                emulated: false,
            })
            .collect();
        caps
    }

    #[test]
    fn the_matrix_units_need_f16_to_f32_fixed_subgroups_and_precision_fast() {
        // An H100 through Vulkan: 16x16x16 f16 -> f16 and f16 -> f32, subgroups of 32.
        let h100 = with_matrix_units(&[(16, "f16", "f16"), (16, "f16", "f32")], 32, 32);
        let shape = CoopShape {
            size: CoopSize::Sixteen,
            subgroup: 32,
        };
        assert_eq!(coop_shape(&h100), Some(shape));
        assert_eq!(
            gemm_kernel_at(&h100, Precision::Fast, GemmKernel::Tiled),
            GemmKernel::CoopPacked {
                shape,
                tile: crate::kernels::gemm::PackedTile::DEFAULT
            }
        );
        assert_eq!(
            gemm_kernel_at(&h100, Precision::Highest, GemmKernel::Tiled),
            GemmKernel::Tiled
        );
        // lavapipe from Mesa 26: 8x8x8, subgroups of 8. 16 is preferred where both exist.
        let lavapipe = with_matrix_units(&[(8, "f16", "f16"), (8, "f16", "f32")], 8, 8);
        assert_eq!(coop_shape(&lavapipe).map(|s| s.size), Some(CoopSize::Eight));
        let both = with_matrix_units(&[(8, "f16", "f32"), (16, "f16", "f32")], 32, 32);
        assert_eq!(coop_shape(&both).map(|s| s.size), Some(CoopSize::Sixteen));
        // No f16 -> f32 (f16 accumulators only), f32 inputs only, subgroups of
        // varying width, no shader-f16, or none reported: the f32 kernels.
        for caps in [
            with_matrix_units(&[(16, "f16", "f16")], 32, 32),
            with_matrix_units(&[(8, "f32", "f32")], 32, 32),
            with_matrix_units(&[(16, "f16", "f32")], 32, 64),
            with_matrix_units(&[], 32, 32),
            Capabilities {
                shader_f16: false,
                ..with_matrix_units(&[(16, "f16", "f32")], 32, 32)
            },
        ] {
            assert_eq!(coop_shape(&caps), None, "{:?}", caps.cooperative_matrix);
            assert_eq!(
                gemm_kernel_at(&caps, Precision::Fast, GemmKernel::Tiled),
                GemmKernel::Tiled
            );
        }
        // A tile that does not fit the workgroup memory falls back too.
        let small = Capabilities {
            limits: KernelLimits::WEBGPU_DEFAULTS,
            ..with_matrix_units(&[(16, "f16", "f32")], 32, 32)
        };
        assert_eq!(
            gemm_kernel_at(&small, Precision::Fast, GemmKernel::Tiled),
            GemmKernel::Tiled
        );
    }

    #[test]
    fn limits_alone_pick_the_tiled_kernel_on_gpus_and_the_portable_one_beyond_its_tiles() {
        let small = Capabilities::for_tests(KernelLimits::WEBGPU_DEFAULTS);
        assert_eq!(
            fused_kernel_for(&small, 64, 64).unwrap().name(),
            "attention_tiled"
        );
        assert_eq!(
            fused_kernel_for(&small, 256, 256).unwrap().name(),
            "attention_fused"
        );
        assert!(fused_kernel_for(&small, 257, 64).is_err());
        assert_eq!(gemm_kernel_for(&small), GemmKernel::Tiled);
        // A CPU adapter without fixed subgroups (SwiftShader in a browser,
        // llvmpipe through GL) runs the portable kernel.
        let mut cpu = Capabilities::for_tests(KernelLimits::WEBGPU_DEFAULTS);
        cpu.adapter.device_type = "Cpu".into();
        assert_eq!(
            fused_kernel_for(&cpu, 64, 64).unwrap().name(),
            "attention_fused"
        );
    }
}
