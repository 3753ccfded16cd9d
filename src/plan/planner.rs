//! The planner: turns (capabilities, the engine's choices, the tuning table,
//! the problem's head dims) into the GEMM kernel and the fused kernel with its
//! tiles. It sits above the ops and the context: the ops know their own tile
//! arithmetic, the context holds the choices as data (`plan/overrides.rs`), the
//! capabilities describe the adapter, and only this module decides.

use crate::device::capabilities::{Capabilities, KernelLimits};
use crate::device::context::GpuContext;
use crate::error::Result;
use crate::kernels::attention::{CoopForm, CoopTiles, FusedKernel, FusedTiles, TiledTiles};
use crate::kernels::decode::{DecodeKernel, DecodeLayout, GROUPED_ROWS, TUNED_ROWS};
use crate::kernels::gemm::{gemm_kernel_for, GemmChoice, GemmKernel};
use crate::kernels::matrix_units::{coop_shape, CoopShape};
use crate::options::{AttentionOptions, Precision};
use crate::plan::overrides::{DecodeKernelChoice, FusedKernelChoice, Overrides};
use crate::problem::AttentionDims;
use crate::tuning::{TunedCoop, TunedEntry, TunedKernel, TuningKey, TuningTable};
use std::sync::{Arc, Mutex, PoisonError};

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
    /// has one ([`crate::kernels::gemm::tiles_for`]). A forced kernel stays, whatever the precision.
    pub fn gemm_kernel_at(&self, precision: Precision) -> GemmKernel {
        match self.overrides.gemm {
            Some(forced) => forced,
            None => crate::kernels::gemm::tiles_for(self.caps, precision),
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
        let choice = self.gemm_choice();
        if choice.takes_skinny(self.caps, rows) {
            return GemmKernel::Skinny;
        }
        self.gemm_kernel_for_call(precision)
    }

    /// How products outside an attention call (the attention family's
    /// layers: projections, scores, contexts) choose their f32 kernel: the
    /// forced GEMM, else the adapter's for each product's rows.
    pub fn gemm_choice(&self) -> GemmChoice {
        GemmChoice {
            forced: self.overrides.gemm,
        }
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
    /// head-dim class; else [`crate::kernels::attention::tiles_for`] the adapter.
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
                Ok(crate::kernels::attention::tiled_or_portable(
                    tiles,
                    dk,
                    dv,
                    &caps.limits,
                ))
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
                    None => {
                        crate::kernels::attention::tiled_or_portable(tiles, dk, dv, &caps.limits)
                    }
                })
            }
            // The matrix-unit kernel is for calls that allow f16 products
            // ([`Planner::fused_kernel_at`]); f32 calls run what auto picks.
            FusedKernelChoice::Auto
            | FusedKernelChoice::Coop
            | FusedKernelChoice::CoopStaged
            | FusedKernelChoice::CoopShared => {
                // The head-dim limits have their say first.
                let chosen =
                    crate::kernels::attention::tiles_for(caps, dk, dv, Precision::Highest)?;
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

    /// `kernel` in the form a call of `dims` takes: the matrix-unit kernel
    /// packs K and V as f16 ahead of it where they fit one binding; where
    /// they would not, the same tiles staged where they fit the workgroup
    /// memory (the packed form needs less), else the largest staged
    /// candidate that does, else the f32 kernel.
    pub fn fused_kernel_for(
        &self,
        kernel: FusedKernel,
        dims: &AttentionDims,
    ) -> Result<FusedKernel> {
        let FusedKernel::Coop(tiles) = kernel else {
            return Ok(kernel);
        };
        let limits = &self.caps.limits;
        let kv_heads = dims.batch * dims.kv_heads;
        if !tiles.form.packs_ahead() || tiles.packs(kv_heads, dims.total_len(), limits) {
            return Ok(kernel);
        }
        let staged = tiles.staged();
        if staged.fits(limits) {
            return Ok(FusedKernel::Coop(staged));
        }
        match CoopTiles::candidates(tiles.shape, dims.head_dim, dims.v_head_dim)
            .into_iter()
            .map(CoopTiles::staged)
            .find(|t| t.fits(limits))
        {
            Some(t) => Ok(FusedKernel::Coop(t)),
            None => self.fused_kernel(),
        }
    }

    /// The kernel of each of the unfused route's products at `dims` (the
    /// largest piece's) when `gemm` is asked for: `S = Q Kᵀ`, then `Y = P V`
    /// ([`crate::kernels::gemm::kernel_for`] on the largest block of score
    /// rows the budget allows).
    pub fn unfused_products(
        &self,
        gemm: GemmKernel,
        dims: &AttentionDims,
        options: &AttentionOptions,
        score_budget: u64,
    ) -> Result<[GemmKernel; 2]> {
        use crate::kernels::gemm::{kernel_for, AValues, GemmSpec};
        let blocks = crate::kernels::gemm::attention::score_blocks(
            dims.batch * dims.q_heads,
            dims.q_len,
            dims.total_len(),
            score_budget,
        )?;
        let first = blocks[0];
        Ok([
            kernel_for(
                self.caps,
                gemm,
                &GemmSpec::attention_scores(dims, options, &first),
                AValues::Any,
            ),
            kernel_for(
                self.caps,
                gemm,
                &GemmSpec::attention_values(dims, &first),
                AValues::Probabilities,
            ),
        ])
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

    /// The decode layout for `dims` (whose head dims are the planner's), or
    /// `None` where the decode kernels do not apply (more than 16 query
    /// rows, few keys, head dims not multiples of 4). Its kernel: a pinned
    /// one (tuner); a forced one; else the tuning table's for this head-dim
    /// class where it suits the call's rows per workgroup
    /// ([`StreamShape::suits`]; the tuner measures one row per workgroup and
    /// [`GROUPED_ROWS`], and a call with several rows tries the grouped
    /// winner first, one row the one-row winner); else
    /// [`crate::kernels::decode::tiles_for`]; in each case the staged kernel where a
    /// streaming shape does not hold the call's rows.
    pub fn decode_layout(&self, dims: &AttentionDims) -> Option<DecodeLayout> {
        debug_assert_eq!((dims.head_dim, dims.v_head_dim), (self.dk, self.dv));
        if !DecodeLayout::applies(dims) {
            return None;
        }
        let caps = self.caps;
        let chosen = || crate::kernels::decode::tiles_for(caps, dims);
        let kernel = match (self.overrides.pinned_decode, self.overrides.decode) {
            (Some(pinned), _) => pinned,
            (None, DecodeKernelChoice::Staged) => DecodeKernel::Staged,
            (None, DecodeKernelChoice::Stream) => chosen(),
            (None, DecodeKernelChoice::Auto) => {
                let rows = DecodeLayout::heads_per_workgroup(dims) * dims.q_len;
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
                        DecodeLayout::runnable(kernel, dims, caps) == kernel
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
        Some(DecodeLayout::new(dims, caps, kernel))
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

/// What an engine plans its calls with besides the adapter: what it is told
/// to run in place of the planner's picks, and its tuning table (shared by
/// every device the engine makes and every engine made beside it to time a
/// candidate). The engine owns it; the device knows nothing of it.
#[derive(Debug, Clone, Default)]
pub struct PlanInputs {
    /// Forced and pinned kernels, removed phases.
    pub overrides: Overrides,
    /// Measured kernel and path choices (`webattn tune`).
    pub tuning: Arc<Mutex<TuningTable>>,
}

impl PlanInputs {
    /// The planner for calls at head dims `dk`, `dv` on `device`: its
    /// capabilities, these overrides, and a snapshot of the tuning entry.
    pub fn planner<'a>(&'a self, device: &'a GpuContext, dk: usize, dv: usize) -> Planner<'a> {
        Planner {
            caps: device.capabilities(),
            overrides: &self.overrides,
            tuned: self.snapshot(device, dk, dv),
            dk,
            dv,
        }
    }

    /// The tuning table's key for head dims `dk`, `dv` on `device`'s
    /// adapter, with its runtime-checks setting.
    pub fn tuning_key(device: &GpuContext, dk: usize, dv: usize) -> TuningKey {
        TuningKey::new(device.capabilities(), dk, dv).with_runtime_checks(device.runtime_checks())
    }

    fn table(&self) -> std::sync::MutexGuard<'_, TuningTable> {
        self.tuning.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The measured entry for head dims `dk`, `dv` on `device`'s adapter, if any.
    pub fn tuned(&self, device: &GpuContext, dk: usize, dv: usize) -> Option<TunedEntry> {
        let table = self.table();
        // Every call asks: an untuned engine builds no key.
        if table.is_empty() {
            return None;
        }
        table.get(&Self::tuning_key(device, dk, dv)).copied()
    }

    /// Records a measurement in the tuning table, in place of the same
    /// class's entries measured on other kernels (an older webattn's: the
    /// table's next save removes them from the file).
    pub fn record_tuning(&self, key: TuningKey, entry: TunedEntry) {
        let mut table = self.table();
        let superseded: Vec<_> = table
            .entries()
            .map(|(k, _)| k)
            .filter(|k| {
                k.kernels != key.kernels && {
                    let mut same = (*k).clone();
                    same.kernels.clone_from(&key.kernels);
                    same == key
                }
            })
            .cloned()
            .collect();
        for old in superseded {
            table.remove(&old);
        }
        table.insert(key, entry);
    }

    /// The tuning table's entry for head dims `dk`, `dv` on `device`, with
    /// what no longer runs there dropped from the table, with a warning,
    /// once: a fused kernel the kernel no longer offers or whose tiles no
    /// longer fit (the whole entry), matrix-unit tiles no candidate matches
    /// (those tiles and their time).
    pub fn snapshot(&self, device: &GpuContext, dk: usize, dv: usize) -> Option<TunedEntry> {
        let caps = device.capabilities();
        let mut entry = self.tuned(device, dk, dv)?;
        let subgroup_elsewhere = entry.kernel == TunedKernel::Subgroup
            && (!dk.is_multiple_of(4) || !dv.is_multiple_of(4));
        if !subgroup_elsewhere {
            if let Err(why) = resolve_tuned(entry.kernel, caps, dk, dv) {
                log::warn!("webattn: tuning entry for head dims {dk}/{dv} ignored: {why}");
                self.table().remove(&Self::tuning_key(device, dk, dv));
                return None;
            }
        }
        if let (Some(shape), Some(want)) = (coop_shape(caps), entry.coop_tiles) {
            let stale = !coop_forms(shape, dk, dv)
                .any(|t| coop_matches(&t, want, &caps.limits) && t.form == want.form);
            if stale {
                log::warn!(
                    "webattn: tuned matrix-unit tiles {} for head dims {dk}/{dv} ignored: no \
                     candidate that fits here",
                    want.name()
                );
                entry.coop_tiles = None;
                entry.coop_ms = None;
                self.table().insert(Self::tuning_key(device, dk, dv), entry);
            }
        }
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matrix_units::CoopSize;

    fn fused_f32(caps: &Capabilities, dk: usize, dv: usize) -> Result<FusedKernel> {
        crate::kernels::attention::tiles_for(caps, dk, dv, Precision::Highest)
    }

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
            crate::kernels::gemm::tiles_for(&h100, Precision::Fast),
            GemmKernel::CoopPacked {
                shape,
                tile: crate::kernels::gemm::PackedTile::DEFAULT
            }
        );
        assert_eq!(
            crate::kernels::gemm::tiles_for(&h100, Precision::Highest),
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
                crate::kernels::gemm::tiles_for(&caps, Precision::Fast),
                GemmKernel::Tiled
            );
        }
        // A tile that does not fit the workgroup memory falls back too.
        let small = Capabilities {
            limits: KernelLimits::WEBGPU_DEFAULTS,
            ..with_matrix_units(&[(16, "f16", "f32")], 32, 32)
        };
        assert_eq!(
            crate::kernels::gemm::tiles_for(&small, Precision::Fast),
            GemmKernel::Tiled
        );
    }

    #[test]
    fn limits_alone_pick_the_tiled_kernel_on_gpus_and_the_portable_one_beyond_its_tiles() {
        let small = Capabilities::for_tests(KernelLimits::WEBGPU_DEFAULTS);
        assert_eq!(fused_f32(&small, 64, 64).unwrap().name(), "attention_tiled");
        assert_eq!(
            fused_f32(&small, 256, 256).unwrap().name(),
            "attention_fused"
        );
        assert!(fused_f32(&small, 257, 64).is_err());
        assert_eq!(gemm_kernel_for(&small), GemmKernel::Tiled);
        // A CPU adapter without fixed subgroups (SwiftShader in a browser,
        // llvmpipe through GL) runs the portable kernel.
        let mut cpu = Capabilities::for_tests(KernelLimits::WEBGPU_DEFAULTS);
        cpu.adapter.device_type = "Cpu".into();
        assert_eq!(fused_f32(&cpu, 64, 64).unwrap().name(), "attention_fused");
    }
}
