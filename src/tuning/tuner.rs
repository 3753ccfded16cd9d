//! The tuner: times every fused kernel and tile configuration that fits the
//! adapter, and the unfused path, on one problem per head-dim class, and
//! records the fastest in the engine's tuning table, which the kernel choice
//! and `KernelPath::Auto` then follow.

use crate::conformance::{CaseInputs, CaseSpec};
use crate::error::{Error, Result};
use crate::kernels::attention::coop::CoopForm;
use crate::kernels::attention::{CoopTiles, FusedKernel, FusedTiles, TiledTiles};
use crate::kernels::decode::{DecodeKernel, DecodeLayout, StreamShape, GROUPED_ROWS};
use crate::kernels::gemm::{FastGemm, GemmKernel};
use crate::measure::{measure_gpu, Repeats};
use crate::plan::overrides::Overrides;
use crate::problem::AttentionDims;
use crate::{AttentionInputs, AttentionOptions, Engine, FusedKernelChoice, KernelPath, Precision};

use super::table::{TunedCoop, TunedDecode, TunedEntry, TunedGemm, TunedKernel};

/// The problems each head-dim class is timed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuningProblem {
    /// Query heads (batch 1; as many KV heads).
    pub heads: usize,
    /// Query and key length.
    pub seq: usize,
    /// Heads of the decode problem (batch 1, as many KV heads, one query row
    /// each); the grouped decode problem has as many query heads in GQA
    /// groups of [`GROUPED_ROWS`] (a quarter as many KV heads).
    pub decode_heads: usize,
    /// Keys of the decode problem.
    pub decode_keys: usize,
}

impl TuningProblem {
    /// Problems that fill a GPU for a millisecond or so (16 heads x 2048;
    /// decode: 128 heads x 4096 keys, batch 8 x 16 heads' worth: a batch
    /// fills a large GPU, where a few heads leave most of it idle and the
    /// staged kernel's fewer, larger splits win on an H200 though the
    /// streaming kernel is 5x faster on full batches; K and V outgrow any
    /// cache), or small ones on a CPU adapter (4 heads x 256; 4 x 2048 keys).
    pub fn for_device_type(device_type: &str) -> TuningProblem {
        if device_type == "Cpu" {
            TuningProblem {
                heads: 4,
                seq: 256,
                decode_heads: 4,
                decode_keys: 2048,
            }
        } else {
            TuningProblem {
                heads: 16,
                seq: 2048,
                decode_heads: 128,
                decode_keys: 4096,
            }
        }
    }
}

impl TuningProblem {
    /// The decode problem's heads at head dims `dk`, `dv` on an adapter whose
    /// storage bindings hold `binding_bytes`: `decode_heads`, or fewer, so
    /// that K and V (f32) each fit one binding (a browser's 128 MiB, say).
    pub fn decode_heads_within(&self, binding_bytes: u64, dk: usize, dv: usize) -> usize {
        let per_head = (self.decode_keys * dk.max(dv) * 4) as u64;
        let fit = (binding_bytes / per_head.max(1)) as usize;
        self.decode_heads.min(fit).max(1)
    }
}

/// The matrix-unit fused kernel's tiles that the tuner times at head dims
/// `dk`, `dv` on `engine`'s adapter, where it has matrix units: every
/// candidate that fits (on a CPU adapter the first only, as for the f32
/// kernel: each takes seconds to compile there), packed, and (not on a CPU
/// adapter) the largest that fits in the staged form and every one that
/// fits in the shared form, to compare the forms. Calls at
/// `Precision::Fast` take the fastest.
pub fn coop_candidates(engine: &Engine, dk: usize, dv: usize) -> Vec<CoopTiles> {
    let Some(ctx) = engine.gpu() else {
        return Vec::new();
    };
    let caps = ctx.capabilities();
    let Some(shape) = crate::kernels::matrix_units::coop_shape(caps) else {
        return Vec::new();
    };
    let tried = if caps.adapter.device_type == "Cpu" {
        1
    } else {
        usize::MAX
    };
    let fitting = |t: &CoopTiles| t.fits(&caps.limits);
    let all = CoopTiles::candidates(shape, dk, dv);
    let mut tiles: Vec<CoopTiles> = all.iter().copied().filter(fitting).take(tried).collect();
    if tried > 1 {
        // The first staged tiles that fit, and every shared one.
        tiles.extend(all.iter().map(|t| t.staged()).find(fitting));
        tiles.extend(
            all.iter()
                .map(|t| t.in_form(CoopForm::Shared))
                .filter(|t| t.is_valid() && fitting(t)),
        );
    }
    tiles
}

/// One configuration's time.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    /// The kernel and its tiles, as a pipeline label (or `unfused`).
    pub label: String,
    /// Median time in ms.
    pub median_ms: f64,
}

/// What tuning one head-dim class found.
#[derive(Debug, Clone, PartialEq)]
pub struct TuneReport {
    /// Head dims Dk, Dv.
    pub head_dims: (usize, usize),
    /// The problem timed.
    pub problem: TuningProblem,
    /// Every configuration timed on the prefill problem, fastest first (the
    /// unfused path among them).
    pub timings: Vec<Timed>,
    /// Every decode kernel timed on the decode problem, fastest first (empty
    /// where the decode kernels do not apply).
    pub decode_timings: Vec<Timed>,
    /// Every decode kernel timed on the grouped decode problem (GQA groups
    /// of [`GROUPED_ROWS`] query heads), fastest first.
    pub grouped_decode_timings: Vec<Timed>,
    /// What the table now holds for this class.
    pub entry: TunedEntry,
}

/// Every fused kernel that can run head dims `dk`, `dv` on the engine's
/// adapter: each tile of the register-tiled kernel that fits (on a CPU
/// adapter, the first one only), the portable kernel, and the subgroup
/// kernel where the adapter has fixed subgroups.
pub fn fused_candidates(engine: &Engine, dk: usize, dv: usize) -> Result<Vec<FusedKernel>> {
    let ctx = engine.gpu().ok_or(Error::Conflict(
        "tuning needs a GPU engine; this one runs on the CPU",
    ))?;
    let caps = ctx.capabilities();
    // The register-tiled kernel's shapes are a GPU's choice; on a CPU adapter
    // one shape (the first that fits) stands for the kernel: its unrolled
    // source takes seconds to compile per shape there (SwiftShader in
    // Chromium lost the device compiling all of them).
    let tiles_tried = if caps.adapter.device_type == "Cpu" {
        1
    } else {
        usize::MAX
    };
    // In a browser the 8-row shapes are left out: SwiftShader in Chromium
    // loses its device compiling their kernel (attention_tiled_wide).
    let browser = cfg!(target_arch = "wasm32");
    let mut kernels: Vec<FusedKernel> = TiledTiles::candidates(dk, dv)
        .into_iter()
        .filter(|t| t.runs_on(caps) && !(browser && t.is_wide()))
        .take(tiles_tried)
        .map(FusedKernel::Tiled)
        .collect();
    kernels.push(FusedKernel::Portable(FusedTiles::for_dims(
        dk,
        dv,
        &caps.limits,
    )?));
    if let Some(width) = caps.fixed_cpu_subgroup() {
        if dk.is_multiple_of(4) && dv.is_multiple_of(4) {
            kernels.push(FusedKernel::Subgroup { width });
        }
    }
    Ok(kernels)
}

/// The decode problem's dims: batch 1, `heads` query heads over as many KV
/// heads, one query row each ([`decode::TUNED_ROWS`] rows per workgroup,
/// which [`StreamShape::suits`] takes as what was measured).
///
/// [`decode::TUNED_ROWS`]: crate::kernels::decode::TUNED_ROWS
fn decode_problem(heads: usize, keys: usize, head_dims: [usize; 2]) -> AttentionDims {
    AttentionDims::plain(1, [heads, heads], [1, keys], head_dims)
}

/// The grouped decode problem's dims: batch 1, `heads` query heads (at least
/// [`GROUPED_ROWS`], rounded down to a multiple of it) in GQA groups of
/// [`GROUPED_ROWS`] over their KV heads, one query row each: [`GROUPED_ROWS`]
/// rows per workgroup.
fn grouped_decode_problem(heads: usize, keys: usize, head_dims: [usize; 2]) -> AttentionDims {
    let heads = (heads / GROUPED_ROWS).max(1) * GROUPED_ROWS;
    AttentionDims::plain(1, [heads, heads / GROUPED_ROWS], [1, keys], head_dims)
}

/// Times every decode kernel that runs the decode problem `dims` on
/// `engine`'s adapter (inputs from `seed`), each on an engine of its own that
/// runs only it, into `timings` (fastest first); the fastest, or `None` where
/// the decode kernels do not apply or none ran. `what` names the problem in
/// `progress`.
async fn time_decode(
    engine: &Engine,
    dims: &AttentionDims,
    seed: u64,
    what: &str,
    timings: &mut Vec<Timed>,
    progress: &mut impl FnMut(&str),
) -> Result<Option<TunedDecode>> {
    let kernels = decode_candidates(engine, dims)?;
    if kernels.is_empty() {
        return Ok(None);
    }
    let (dk, dv) = (dims.head_dim, dims.v_head_dim);
    let case = CaseSpec::new(
        "tune-decode",
        [dims.batch, dims.q_heads, dims.kv_heads],
        [dims.q_len, dims.kv_len],
        [dk, dv],
    );
    let inputs = case.generate(seed)?;
    let mut best: Option<TunedDecode> = None;
    for kernel in kernels {
        let label = kernel.label();
        progress(&format!("head dims {dk}/{dv}: {what} {label}"));
        let pinned = candidate(engine, |o| o.pinned_decode = Some(kernel))?;
        let Some(ms) = left_out(
            time_call(&pinned, &inputs, KernelPath::Fused, Precision::Highest).await,
            |why| {
                progress(&format!(
                    "head dims {dk}/{dv}: {what} {label} left out: {why}"
                ))
            },
        )?
        else {
            continue;
        };
        timings.push(Timed {
            label,
            median_ms: ms,
        });
        if best.is_none_or(|b| ms < b.decode_ms) {
            best = Some(TunedDecode {
                kernel,
                decode_ms: ms,
            });
        }
    }
    timings.sort_by(|a, b| a.median_ms.total_cmp(&b.median_ms));
    Ok(best)
}

/// Every decode kernel that can run the decode problem `dims` on the
/// engine's adapter: the staged kernel and each shape of the streaming kernel
/// that fits (on a CPU adapter, the first one only). Empty where the decode
/// kernels do not apply (head dims not multiples of 4).
pub fn decode_candidates(engine: &Engine, dims: &AttentionDims) -> Result<Vec<DecodeKernel>> {
    let ctx = engine.gpu().ok_or(Error::Conflict(
        "tuning needs a GPU engine; this one runs on the CPU",
    ))?;
    if !DecodeLayout::applies(dims) {
        return Ok(Vec::new());
    }
    let caps = ctx.capabilities();
    let shapes_tried = if caps.adapter.device_type == "Cpu" {
        1
    } else {
        usize::MAX
    };
    let rows = DecodeLayout::heads_per_workgroup(dims) * dims.q_len;
    let mut kernels = vec![DecodeKernel::Staged];
    kernels.extend(
        StreamShape::all()
            .into_iter()
            .filter(|shape| shape.fits(dims, rows, caps))
            .take(shapes_tried)
            .map(DecodeKernel::Stream),
    );
    Ok(kernels)
}

/// The forms of the matrix-unit GEMM the tuner times on the unfused path at
/// `Precision::Fast`: every one that fits where the adapter has matrix
/// units, none elsewhere.
pub fn fast_gemm_candidates(engine: &Engine) -> Vec<FastGemm> {
    let Some(planner) = engine.planner(0, 0) else {
        return Vec::new();
    };
    let shape = match planner.gemm_kernel_at(Precision::Fast) {
        GemmKernel::CoopPacked { shape, .. } | GemmKernel::Coop(shape) => shape,
        _ => return Vec::new(),
    };
    let limits = &planner.caps.limits;
    FastGemm::ALL
        .into_iter()
        .filter(|form| match form {
            FastGemm::Packed(tile) => crate::kernels::gemm::packed::fits(shape, *tile, limits),
            FastGemm::Staged => crate::kernels::gemm::coop_fits(shape, limits),
        })
        .collect()
}

/// An engine of its own on `engine`'s device, sharing its tuning table,
/// whose overrides `pin` sets: one candidate the tuner times while calls
/// made on `engine` meanwhile keep their kernels.
fn candidate(engine: &Engine, pin: impl FnOnce(&mut Overrides)) -> Result<Engine> {
    let shared = engine.sharing_device().ok_or(Error::Conflict(
        "tuning needs a GPU engine; this one runs on the CPU",
    ))?;
    let mut overrides = *engine.overrides();
    pin(&mut overrides);
    Ok(shared.with_overrides(overrides))
}

/// The median time of `path` on `engine` (whose tensors are its own) on
/// `inputs` at `precision`, in ms: one warm-up, three timed runs.
async fn time_call(
    engine: &Engine,
    inputs: &CaseInputs,
    path: KernelPath,
    precision: Precision,
) -> Result<f64> {
    let repeats = Repeats {
        warmup: 1,
        timed: 3,
    };
    let (q, k, v) = (
        engine.upload(&inputs.q)?,
        engine.upload(&inputs.k)?,
        engine.upload(&inputs.v)?,
    );
    let device_inputs = AttentionInputs::new(&q, &k, &v);
    let options = AttentionOptions {
        path,
        precision,
        ..Default::default()
    };
    let ctx = engine.gpu().ok_or(Error::Conflict(
        "tuning needs a GPU engine; this one runs on the CPU",
    ))?;
    let m = measure_gpu(ctx, repeats, async || {
        engine.attention(&device_inputs, &options).await.map(|_| ())
    })
    .await?;
    Ok(m.median_ms())
}

/// A candidate's time, or `None` when it failed in a way that leaves the
/// device usable (a pipeline the driver refused, say), which `note` hears:
/// one candidate that cannot run here must not stop the tuning. A lost
/// device is an error (nothing after it would run).
fn left_out(result: Result<f64>, note: impl FnOnce(&str)) -> Result<Option<f64>> {
    match result {
        Ok(ms) => Ok(Some(ms)),
        Err(e @ Error::DeviceLost(_)) => Err(e),
        Err(e) => {
            log::warn!("webattn: tuning left a candidate out: {e}");
            note(&e.to_string());
            Ok(None)
        }
    }
}

/// Tunes each head-dim class of `head_dims` on `engine`'s adapter and records
/// the outcome in its tuning table (see [`Engine::tuning_table`]); `progress`
/// hears each configuration as it is timed. Calls made on the engine meanwhile
/// keep their kernels: the candidates run on engines of their own that share
/// the device. Each class's winner applies from then on.
pub async fn tune(
    engine: &Engine,
    head_dims: &[(usize, usize)],
    mut progress: impl FnMut(&str),
) -> Result<Vec<TuneReport>> {
    let ctx = engine.gpu().ok_or(Error::Conflict(
        "tuning needs a GPU engine; this one runs on the CPU",
    ))?;
    let problem = TuningProblem::for_device_type(&ctx.capabilities().adapter.device_type);
    let mut reports = Vec::new();
    for &(dk, dv) in head_dims {
        let case = CaseSpec::new(
            "tune",
            [1, problem.heads, problem.heads],
            [problem.seq, problem.seq],
            [dk, dv],
        );
        let inputs = case.generate(7)?;
        let mut timings = Vec::new();
        let mut best: Option<(TunedKernel, f64)> = None;
        for kernel in fused_candidates(engine, dk, dv)? {
            let label = kernel.label();
            progress(&format!("head dims {dk}/{dv}: {label}"));
            // An engine of its own on the same device, running only this kernel.
            let form = crate::plan::planner::tuned_form(&kernel);
            let pinned = candidate(engine, |o| o.pinned_fused = form)?;
            let Some(ms) = left_out(
                time_call(&pinned, &inputs, KernelPath::Fused, Precision::Highest).await,
                |why| progress(&format!("head dims {dk}/{dv}: {label} left out: {why}")),
            )?
            else {
                continue;
            };
            timings.push(Timed {
                label,
                median_ms: ms,
            });
            // Every candidate is an f32 kernel, which the table keeps.
            let form = crate::plan::planner::tuned_form(&kernel);
            if let Some(form) = form.filter(|_| best.as_ref().is_none_or(|(_, b)| ms < *b)) {
                best = Some((form, ms));
            }
        }
        progress(&format!("head dims {dk}/{dv}: unfused"));
        let unfused = time_call(engine, &inputs, KernelPath::Unfused, Precision::Highest).await?;
        timings.push(Timed {
            label: "unfused".to_string(),
            median_ms: unfused,
        });
        // The matrix-unit kernel at Precision::Fast, where the adapter has
        // one: calls at Fast take it only where it is not measured slower
        // than the f32 winner.
        let mut coop_ms = None;
        let mut coop_tiles = None;
        for tiles in coop_candidates(engine, dk, dv) {
            let label = format!("{} (precision fast)", tiles.key());
            progress(&format!("head dims {dk}/{dv}: {label}"));
            let tuned = TunedCoop {
                subgroups: tiles.subgroups,
                keys_per_tile: tiles.keys_per_tile,
                form: tiles.form,
            };
            let coop = candidate(engine, |o| {
                o.fused = FusedKernelChoice::Coop;
                o.pinned_coop = Some(tuned);
            })?;
            if let Some(ms) = left_out(
                time_call(&coop, &inputs, KernelPath::Fused, Precision::Fast).await,
                |why| progress(&format!("head dims {dk}/{dv}: {label} left out: {why}")),
            )? {
                timings.push(Timed {
                    label,
                    median_ms: ms,
                });
                if coop_ms.is_none_or(|best| ms < best) {
                    coop_ms = Some(ms);
                    coop_tiles = Some(tuned);
                }
            }
        }
        // The unfused path at Precision::Fast (its GEMMs on the matrix units),
        // where the adapter has them, once per form of the matrix-unit GEMM:
        // its calls at Fast take the fastest form, and keep their GEMMs in
        // f32 where even that is measured slower. Timed with the matrix
        // units forced, so an earlier entry cannot turn them off.
        let mut unfused_coop_ms = None;
        let mut fast_gemm: Option<TunedGemm> = None;
        for form in fast_gemm_candidates(engine) {
            let label = format!("unfused (precision fast, {})", form.name());
            progress(&format!("head dims {dk}/{dv}: {label}"));
            let coop = candidate(engine, |o| {
                o.fused = FusedKernelChoice::Coop;
                o.pinned_fast_gemm = Some(form);
            })?;
            if let Some(ms) = left_out(
                time_call(&coop, &inputs, KernelPath::Unfused, Precision::Fast).await,
                |why| progress(&format!("head dims {dk}/{dv}: {label} left out: {why}")),
            )? {
                timings.push(Timed {
                    label,
                    median_ms: ms,
                });
                if fast_gemm.is_none_or(|best| ms < best.unfused_ms) {
                    fast_gemm = Some(TunedGemm {
                        form,
                        unfused_ms: ms,
                    });
                    unfused_coop_ms = Some(ms);
                }
            }
        }
        drop(inputs);
        // The decode problems: one query row per head over many keys
        // (decode::TUNED_ROWS rows per workgroup), and the query heads of GQA
        // groups of decode::GROUPED_ROWS over as many keys.
        let decode_heads = problem.decode_heads_within(
            ctx.capabilities().limits.max_storage_buffer_binding_size,
            dk,
            dv,
        );
        let mut decode_timings = Vec::new();
        let decode = time_decode(
            engine,
            &decode_problem(decode_heads, problem.decode_keys, [dk, dv]),
            11,
            "decode",
            &mut decode_timings,
            &mut progress,
        )
        .await?;
        let mut grouped_decode_timings = Vec::new();
        let grouped_decode = time_decode(
            engine,
            &grouped_decode_problem(decode_heads, problem.decode_keys, [dk, dv]),
            13,
            "grouped decode",
            &mut grouped_decode_timings,
            &mut progress,
        )
        .await?;
        timings.sort_by(|a, b| a.median_ms.total_cmp(&b.median_ms));
        let (kernel, fused_ms) = best.ok_or(Error::Conflict(
            "no fused kernel ran at these head dims on this adapter",
        ))?;
        let entry = TunedEntry {
            kernel,
            fused_ms,
            unfused_ms: unfused,
            decode,
            grouped_decode,
            coop_ms,
            unfused_coop_ms,
            fast_gemm,
            coop_tiles,
        };
        if let Some(key) = engine.tuning_key(dk, dv) {
            engine.record_tuning(key, entry);
        }
        reports.push(TuneReport {
            head_dims: (dk, dv),
            problem: TuningProblem {
                decode_heads,
                ..problem
            },
            timings,
            decode_timings,
            grouped_decode_timings,
            entry,
        });
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_candidate_is_left_out_but_a_lost_device_stops_the_tuning() {
        let mut heard = String::new();
        let refused = Error::Gpu {
            kernel: "attention_tiled_wide[..]".to_string(),
            message: "the driver refused the pipeline".to_string(),
        };
        assert_eq!(
            left_out(Err(refused), |why| heard = why.to_string()).ok(),
            Some(None)
        );
        assert!(heard.contains("refused"), "{heard}");
        assert_eq!(left_out(Ok(1.5), |_| unreachable!()).ok(), Some(Some(1.5)));
        let lost = left_out(Err(Error::DeviceLost("reset".to_string())), |_| {});
        assert!(matches!(lost, Err(Error::DeviceLost(_))));
    }

    #[test]
    fn the_grouped_decode_problem_has_the_grouped_rows_per_workgroup() {
        for heads in [1, 4, 6, 128] {
            let dims = grouped_decode_problem(heads, 4096, [128, 128]);
            assert_eq!(
                DecodeLayout::heads_per_workgroup(&dims) * dims.q_len,
                GROUPED_ROWS
            );
            assert_eq!(dims.q_heads % GROUPED_ROWS, 0, "{heads}");
            assert!(dims.q_heads <= heads.max(GROUPED_ROWS), "{heads}");
        }
    }

    #[test]
    fn the_decode_problem_has_the_rows_per_workgroup_the_planner_assumes() {
        for heads in [1, 4, 128] {
            let dims = decode_problem(heads, 4096, [128, 128]);
            assert_eq!(
                DecodeLayout::heads_per_workgroup(&dims) * dims.q_len,
                crate::kernels::decode::TUNED_ROWS
            );
        }
    }
}
