//! One call's plan, as a value, and the only decision the call's run
//! follows: the path; on a GPU the route with its kernels and tiles (for a
//! decode, the split-K layout; on the unfused route, the GEMM of each
//! product); whole or the pieces the call is cut into, each piece shape's
//! decode layout and the kernel that runs key ranges; whether f16 keys and
//! values are read in place or widened; the phases a measurement removes; the
//! device memory the call takes; and why. [`plan_call`] makes it from the
//! adapter's capabilities, the engine's overrides and a snapshot of its
//! tuning table ([`planner::Planner`]) and the call's sizes and options,
//! touching no device. `Engine::last_call`, `webattn info`, `webattn phases`
//! and the JavaScript `lastCall` print that same value.

pub mod backward;
pub mod overrides;
pub mod paged;
pub mod pieces;
pub mod planner;
pub mod workspace;

use crate::device::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::kernels::ablation::Phases;
use crate::kernels::attention::{FusedKernel, FusedTiles};
use crate::kernels::decode::DecodeLayout;
use crate::kernels::gemm::GemmKernel;
use crate::kernels::matrix_units::coop_shape;
use crate::options::{AttentionOptions, KernelPath, Precision};
use crate::plan::overrides::FusedKernelChoice;
use crate::plan::pieces::Cut;
use crate::plan::planner::Planner;
use crate::problem::AttentionDims;

/// The kernels a GPU call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuRoute {
    /// The fused kernel, or (for a few query rows over many keys) the
    /// split-K decode kernel and its merge; `kernel` also runs the scores'
    /// recompute.
    Fused {
        /// The fused kernel with its tiles, in the form the call's sizes take
        /// (the matrix-unit kernel staged where its packed K and V would not
        /// fit a binding).
        kernel: FusedKernel,
        /// The decode kernel's layout where the whole call decodes.
        decode: Option<DecodeLayout>,
    },
    /// Scores in memory: GEMM, mask, softmax, GEMM, in blocks of rows.
    Unfused {
        /// The GEMM kernel the call asks for (forced, tuned or the adapter's).
        gemm: GemmKernel,
        /// The kernel each product runs: `S = Q Kᵀ`, then `Y = P V` (the
        /// packed matrix-unit GEMM hands products it cannot hold, and `P V`,
        /// whose probabilities carry marks to skip, to the staged one).
        products: [GemmKernel; 2],
        /// The products' precision (`Fast` may stay f32 where measured slower).
        precision: Precision,
        /// Bytes of scores one block holds at most.
        score_budget: u64,
    },
}

impl GpuRoute {
    /// Whether this is the fused route.
    pub fn is_fused(&self) -> bool {
        matches!(self, GpuRoute::Fused { .. })
    }
}

/// How a call is cut so that each binding fits (`plan/pieces.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pieces {
    /// Every binding fits: one run.
    Whole,
    /// Pieces of at most these many batches, KV heads (with their query
    /// heads), query rows and keys.
    Cut {
        /// Batches per piece.
        batches: usize,
        /// KV heads per piece.
        kv_heads: usize,
        /// Query rows per piece.
        queries: usize,
        /// Keys per piece (fewer than the call's: the fused kernel resumes).
        keys: usize,
    },
}

/// The decode layout of the pieces of one shape (the last piece along an
/// axis may be shorter than the others, and decodes by its own sizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceDecode {
    /// Batches, KV heads and query rows of the piece.
    pub extent: [usize; 3],
    /// Its decode layout (`None`: the fused kernel runs it).
    pub decode: Option<DecodeLayout>,
}

/// How a call's f16 keys and values reach the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvRead {
    /// Read as f16 in place by the decode kernel.
    InPlace,
    /// Widened to f32 scratch first (every kernel but the decode kernel, a
    /// past, presents or scores, or slices that are not aligned views).
    Widened,
}

/// One call's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPlan {
    /// The concrete path (never `Auto`).
    pub path: KernelPath,
    /// Why the path was taken where it was not the one asked for or the
    /// default (auto's fused-against-unfused choice, an explicit request
    /// over a software adapter).
    pub reason: Option<String>,
    /// The kernels, on a GPU path (`None` on the CPU backend and the oracle).
    pub gpu: Option<GpuRoute>,
    /// Whole, or the pieces the call is cut into (GPU paths).
    pub pieces: Pieces,
    /// The decode layout of each shape of piece, where the call runs in
    /// pieces on the fused route with every key in each piece (empty otherwise).
    pub piece_decodes: Vec<PieceDecode>,
    /// The fused kernel that runs each piece's key ranges, resuming its rows
    /// from one range to the next, where the pieces cut the keys (on the
    /// unfused route too: only the fused kernel resumes a row).
    pub key_ranges: Option<FusedKernel>,
    /// How f16 keys and values are read, where K and V are f16 on a GPU path.
    pub kv_f16: Option<KvRead>,
    /// Phases the fused and decode kernels run without (`webattn phases`:
    /// results wrong by design; none for every other engine).
    pub removed_phases: Phases,
    /// Device memory the call allocates, in bytes: outputs, scratch and f16
    /// inputs widened to f32 (inputs not counted). For a call in pieces, at
    /// most this (a piece's slices that are aligned views take none).
    pub workspace_bytes: u64,
}

impl CallPlan {
    /// A plan for the host: the fast CPU backend or the oracle.
    fn host(path: KernelPath, reason: Option<String>) -> CallPlan {
        CallPlan {
            path,
            reason,
            gpu: None,
            pieces: Pieces::Whole,
            piece_decodes: Vec::new(),
            key_ranges: None,
            kv_f16: None,
            removed_phases: Phases::NONE,
            workspace_bytes: 0,
        }
    }

    /// The cut, where the call runs in pieces.
    pub(crate) fn cut(&self) -> Option<Cut> {
        match self.pieces {
            Pieces::Whole => None,
            Pieces::Cut {
                batches,
                kv_heads,
                queries,
                keys,
            } => Some(Cut {
                batches,
                kv_heads,
                queries,
                keys,
            }),
        }
    }

    /// The decode layout of a piece of `extent` (batches, KV heads, query
    /// rows), as planned; a typed error where the plan has none for it (a
    /// bug: the plan lists every shape its pieces take).
    pub(crate) fn piece_decode(&self, extent: [usize; 3]) -> Result<Option<DecodeLayout>> {
        self.piece_decodes
            .iter()
            .find(|p| p.extent == extent)
            .map(|p| p.decode)
            .ok_or_else(|| Error::Gpu {
                kernel: "the call's plan".to_string(),
                message: format!("no decode layout planned for a piece of {extent:?}"),
            })
    }
}

impl std::fmt::Display for CallPlan {
    /// One line: `fused: attention_tiled[...] (whole)`, `decode: ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.gpu {
            None => write!(f, "{}", self.path)?,
            Some(GpuRoute::Fused {
                decode: Some(plan), ..
            }) => write!(
                f,
                "fused, decode: {} ({} splits of {} keys, {} heads a workgroup)",
                plan.kernel.label(),
                plan.splits,
                plan.split_keys,
                plan.heads_per_workgroup
            )?,
            Some(GpuRoute::Fused { kernel, .. }) => write!(f, "fused: {}", kernel.label())?,
            Some(GpuRoute::Unfused {
                gemm,
                products,
                precision,
                score_budget,
            }) => {
                write!(f, "unfused: {} at {precision}", gemm.label())?;
                if products.iter().any(|p| p != gemm) {
                    write!(
                        f,
                        " (S by {}, P V by {})",
                        products[0].label(),
                        products[1].label()
                    )?;
                }
                write!(f, ", scores in blocks of {} MiB", score_budget >> 20)?;
            }
        }
        if let Pieces::Cut {
            batches,
            kv_heads,
            queries,
            keys,
        } = self.pieces
        {
            write!(
                f,
                "; in pieces of {batches} batches x {kv_heads} KV heads x {queries} rows x {keys} keys"
            )?;
            if let Some(kernel) = &self.key_ranges {
                write!(f, ", key ranges by {}", kernel.label())?;
            }
        }
        match self.kv_f16 {
            Some(KvRead::InPlace) => write!(f, "; f16 K and V read in place")?,
            Some(KvRead::Widened) => write!(f, "; f16 K and V widened")?,
            None => {}
        }
        if !self.removed_phases.is_empty() {
            write!(f, "; without phases {}", self.removed_phases.name())?;
        }
        if let Some(reason) = &self.reason {
            write!(f, " ({reason})")?;
        }
        Ok(())
    }
}

/// Why an engine left to choose (`BackendPreference::Auto`) should run its
/// calls on the CPU backend rather than on `caps`'s adapter, if it should:
/// where the adapter is a CPU implementation of its API (device type `Cpu`:
/// llvmpipe/lavapipe, SwiftShader, WARP). Such adapters run the same kernels
/// several times slower than the CPU backend on the same cores (the README's
/// main job: 338 ms on lavapipe against 50.5 ms; a B1 H4 N128 d64 call in
/// Chromium: 52 ms on SwiftShader against 1.6-2.4 ms in wasm); they are for
/// testing the kernels (`--backend gpu`), not for users' work.
pub fn cpu_backend_over(caps: &Capabilities) -> Option<String> {
    let a = &caps.adapter;
    (a.device_type == "Cpu").then(|| {
        format!(
            "the only adapter, {} ({}), is a CPU implementation: the CPU backend computes the \
             same calls several times faster on these cores (ask for the adapter with \
             --backend gpu or BackendPreference::Gpu)",
            a.name, a.backend
        )
    })
}

/// Plans a validated call of `dims` with `options`. `gpu`: the planner for
/// the call's head dims on a GPU engine, `None` on a CPU engine;
/// `score_budget`: the unfused path's bytes of scores per block. Pure: the
/// same inputs give the same plan, on any machine.
pub fn plan_call(
    gpu: Option<&Planner<'_>>,
    score_budget: u64,
    dims: &AttentionDims,
    options: &AttentionOptions,
) -> Result<CallPlan> {
    let planner = match (gpu, options.path) {
        (_, KernelPath::Oracle) => return Ok(CallPlan::host(KernelPath::Oracle, None)),
        (None, _) | (_, KernelPath::Cpu) => return Ok(CallPlan::host(KernelPath::Cpu, None)),
        (Some(planner), _) => planner,
    };
    let caps = planner.caps;
    let (path, reason) = match options.path {
        KernelPath::Auto => auto_path(planner, dims, options),
        forced => (forced, None),
    };
    let score_budget = score_budget.min(caps.limits.max_bindable_bytes());
    let route = match path {
        KernelPath::Fused => GpuRoute::Fused {
            kernel: planner.fused_kernel_at(options.precision)?,
            decode: planner.decode_layout(dims),
        },
        _ => {
            let precision = planner.unfused_precision(options.precision);
            // Each product has a block's rows of one head: a call's query rows at most.
            let gemm = planner.gemm_kernel_for_rows(precision, dims.q_len);
            GpuRoute::Unfused {
                gemm,
                products: [gemm; 2],
                precision,
                score_budget,
            }
        }
    };
    let cut = pieces::cut_for(caps, dims, options, route)?;
    // The kernels are chosen for the largest piece (the call, whole): what
    // fits it fits every smaller piece.
    let run_dims = cut.map_or(*dims, |cut| cut.piece_dims(dims));
    let route = match route {
        GpuRoute::Fused { kernel, decode } => GpuRoute::Fused {
            kernel: planner.fused_kernel_for(kernel, &run_dims)?,
            decode,
        },
        GpuRoute::Unfused {
            gemm,
            precision,
            score_budget,
            ..
        } => GpuRoute::Unfused {
            gemm,
            products: planner.unfused_products(gemm, &run_dims, options, score_budget)?,
            precision,
            score_budget,
        },
    };
    let piece_decodes = match (&cut, route) {
        (Some(cut), GpuRoute::Fused { .. }) if cut.keys == dims.total_len() => cut
            .extents(dims)
            .into_iter()
            .map(|extent| PieceDecode {
                extent,
                decode: planner.decode_layout(&cut.with_extent(extent).piece_dims(dims)),
            })
            .collect(),
        _ => Vec::new(),
    };
    let key_ranges = match cut {
        Some(cut) if cut.keys < dims.total_len() => Some(key_range_kernel(
            planner,
            route,
            &cut.piece_dims(dims),
            options,
        )?),
        _ => None,
    };
    let kv_f16 = dims.f16.kv().then(|| {
        if workspace::reads_f16_in_place(caps, dims, options, route, cut.as_ref()) {
            KvRead::InPlace
        } else {
            KvRead::Widened
        }
    });
    let mut plan = CallPlan {
        path,
        reason,
        gpu: Some(route),
        pieces: match cut {
            None => Pieces::Whole,
            Some(cut) => Pieces::Cut {
                batches: cut.batches,
                kv_heads: cut.kv_heads,
                queries: cut.queries,
                keys: cut.keys,
            },
        },
        piece_decodes,
        key_ranges,
        kv_f16,
        removed_phases: planner.overrides.removed_phases,
        workspace_bytes: 0,
    };
    plan.workspace_bytes = workspace::planned_bytes(caps, dims, options, &plan);
    Ok(plan)
}

/// The fused kernel that runs the key ranges of pieces of `piece` sizes:
/// the route's, or on the unfused route the fused kernel at the call's
/// precision (the unfused path cannot resume a row over key ranges, so a
/// call whose keys exceed a binding needs the fused kernel at its head dims).
fn key_range_kernel(
    planner: &Planner<'_>,
    route: GpuRoute,
    piece: &AttentionDims,
    options: &AttentionOptions,
) -> Result<FusedKernel> {
    let planned = match route {
        GpuRoute::Fused { kernel, .. } => Ok(kernel),
        GpuRoute::Unfused { .. } => planner
            .fused_kernel_at(options.precision)
            .and_then(|kernel| planner.fused_kernel_for(kernel, piece)),
    };
    let t = piece.total_len();
    planned.map_err(|e| match e {
        Error::Limit {
            what,
            needed,
            limit,
            limit_name,
            ..
        } => Error::Limit {
            what: format!(
                "{what}, for this call's keys in ranges (K, V or the mask exceed one binding \
                 even one head at a time; ranges of {t} keys)"
            ),
            needed,
            limit,
            limit_name,
            hint: "only the fused kernel runs keys in ranges: use fewer keys per call, \
                   an adapter with larger binding limits, or head dims the fused kernel takes",
        },
        other => other,
    })
}

/// The path `Auto` takes on a GPU: fused, unless its kernels cannot take the
/// head dims, or `webattn tune` measured the unfused path faster here at
/// these head dims and precision (each path on the matrix units where it
/// would run there). Decoding runs its own kernel, which the tuner does not
/// compare with the unfused path.
fn auto_path(
    planner: &Planner<'_>,
    dims: &AttentionDims,
    options: &AttentionOptions,
) -> (KernelPath, Option<String>) {
    let (dk, dv) = (dims.head_dim, dims.v_head_dim);
    if let Err(e) = FusedTiles::for_dims(dk, dv, &planner.caps.limits) {
        return (
            KernelPath::Unfused,
            Some(format!("fused path unavailable: {e}")),
        );
    }
    let compares =
        planner.overrides.fused == FusedKernelChoice::Auto && !DecodeLayout::applies(dims);
    let Some(entry) = planner.tuned.filter(|_| compares) else {
        return (KernelPath::Fused, None);
    };
    let fast = options.precision == Precision::Fast && coop_shape(planner.caps).is_some();
    let fused_units = fast
        && matches!(
            planner.fused_kernel_at(Precision::Fast),
            Ok(FusedKernel::Coop(_))
        );
    let unfused_units = fast && planner.unfused_precision(Precision::Fast) == Precision::Fast;
    let (fused_ms, unfused_ms) = entry.path_ms([fused_units, unfused_units]);
    if unfused_ms < fused_ms {
        let why = format!(
            "unfused measured faster on this adapter at head dims {dk}/{dv}, precision {} \
             ({unfused_ms:.3} ms against {fused_ms:.3} ms fused, webattn tune)",
            options.precision
        );
        (KernelPath::Unfused, Some(why))
    } else {
        (KernelPath::Fused, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::capabilities::{Capabilities, CoopMatrixConfig, KernelLimits};
    use crate::kernels::decode::DecodeKernel;
    use crate::plan::overrides::Overrides;
    use crate::tuning::{TunedEntry, TunedKernel};

    /// An H100 through Vulkan: 16x16x16 f16 -> f32 matrix units, subgroups
    /// of 32, 48 KiB of workgroup memory, wgpu's 2 GiB bindings.
    fn h100() -> Capabilities {
        let mut caps = Capabilities::synthetic("DiscreteGpu");
        caps.limits = KernelLimits {
            max_storage_buffer_binding_size: (2 << 30) - 4,
            max_buffer_size: 1 << 40,
            max_compute_workgroup_storage_size: 48 << 10,
            max_compute_invocations_per_workgroup: 1024,
            max_compute_workgroups_per_dimension: 65535,
            max_storage_buffers_per_shader_stage: 16,
        };
        (caps.shader_f16, caps.subgroups) = (true, true);
        (caps.subgroup_min_size, caps.subgroup_max_size) = (32, 32);
        caps.cooperative_matrix = ["f16", "f32"]
            .into_iter()
            .map(|cr| CoopMatrixConfig {
                m: 16,
                n: 16,
                k: 16,
                ab: "f16",
                cr,
                emulated: false,
            })
            .collect();
        caps
    }

    /// An Apple GPU through Metal: subgroups of 32, 32 KiB of workgroup
    /// memory, no matrix units offered through wgpu.
    fn apple() -> Capabilities {
        let mut caps = Capabilities::synthetic("IntegratedGpu");
        caps.adapter.backend = "Metal".into();
        caps.limits.max_compute_workgroup_storage_size = 32 << 10;
        caps.limits.max_compute_invocations_per_workgroup = 1024;
        caps.limits.max_storage_buffer_binding_size = 1 << 30;
        caps.limits.max_buffer_size = 1 << 30;
        (caps.shader_f16, caps.subgroups) = (true, true);
        (caps.subgroup_min_size, caps.subgroup_max_size) = (32, 32);
        caps
    }

    /// lavapipe as `webattn info` reports it: a CPU adapter with fixed
    /// subgroups of 8, 32 KiB of workgroup memory, 128 MiB bindings.
    fn lavapipe() -> Capabilities {
        let mut caps = Capabilities::synthetic("Cpu");
        caps.limits.max_compute_workgroup_storage_size = 32 << 10;
        caps.limits.max_compute_invocations_per_workgroup = 1024;
        caps.limits.max_buffer_size = 2047 << 20;
        (caps.shader_f16, caps.subgroups) = (true, true);
        (caps.subgroup_min_size, caps.subgroup_max_size) = (8, 8);
        caps
    }

    /// A browser's WebGPU at its default limits, without subgroups.
    fn webgpu_default() -> Capabilities {
        let mut caps = Capabilities::synthetic("DiscreteGpu");
        caps.adapter.backend = "BrowserWebGpu".into();
        caps
    }

    fn plan_on(
        caps: &Capabilities,
        overrides: &Overrides,
        tuned: Option<TunedEntry>,
        dims: &AttentionDims,
        options: &AttentionOptions,
    ) -> Result<CallPlan> {
        let planner = Planner {
            caps,
            overrides,
            tuned,
            dk: dims.head_dim,
            dv: dims.v_head_dim,
        };
        plan_call(Some(&planner), u64::MAX, dims, options)
    }

    fn plan(caps: &Capabilities, dims: &AttentionDims, options: &AttentionOptions) -> CallPlan {
        plan_on(caps, &Overrides::default(), None, dims, options).expect("a plan")
    }

    fn prefill(d: usize) -> AttentionDims {
        AttentionDims::plain(1, [8, 8], [1024, 1024], [d, d])
    }

    fn decode(keys: usize) -> AttentionDims {
        AttentionDims::plain(1, [32, 8], [1, keys], [128, 128])
    }

    fn fused_kernel(plan: &CallPlan) -> FusedKernel {
        match plan.gpu {
            Some(GpuRoute::Fused { kernel, .. }) => kernel,
            other => panic!("not fused: {other:?}"),
        }
    }

    fn decode_kernel(plan: &CallPlan) -> DecodeKernel {
        match plan.gpu {
            Some(GpuRoute::Fused {
                decode: Some(d), ..
            }) => d.kernel,
            other => panic!("no decode: {other:?}"),
        }
    }

    fn fast() -> AttentionOptions {
        AttentionOptions {
            precision: Precision::Fast,
            ..Default::default()
        }
    }

    #[test]
    fn an_h100_runs_the_tiled_kernel_in_f32_and_the_matrix_units_at_fast() {
        let caps = h100();
        let f32_plan = plan(&caps, &prefill(64), &AttentionOptions::default());
        assert_eq!(
            (f32_plan.path, f32_plan.pieces),
            (KernelPath::Fused, Pieces::Whole)
        );
        assert_eq!(fused_kernel(&f32_plan).name(), "attention_tiled");
        assert!(
            f32_plan.to_string().starts_with("fused: attention_tiled["),
            "{f32_plan}"
        );
        let at_fast = plan(&caps, &prefill(64), &fast());
        assert!(
            matches!(fused_kernel(&at_fast), FusedKernel::Coop(_)),
            "{at_fast}"
        );
        // A decoder step streams its keys through subgroup teams, split-K.
        let step = plan(&caps, &decode(4096), &AttentionOptions::default());
        assert!(
            matches!(decode_kernel(&step), DecodeKernel::Stream(_)),
            "{step}"
        );
        assert!(step
            .to_string()
            .starts_with("fused, decode: attention_decode_stream["));
        // Unfused products at fast run on the matrix units too.
        let unfused = plan(
            &caps,
            &prefill(64),
            &AttentionOptions {
                path: KernelPath::Unfused,
                ..fast()
            },
        );
        assert!(matches!(
            unfused.gpu,
            Some(GpuRoute::Unfused {
                gemm: GemmKernel::CoopPacked { .. },
                precision: Precision::Fast,
                ..
            })
        ));
    }

    /// A call of at most 16 query rows a head on the unfused path takes the
    /// skinny GEMM at either precision, but on CPU adapters with fixed
    /// subgroups (their shuffling kernel); taller calls the adapter's
    /// kernel. The portable kernels (the tiled GEMM forced) take it too;
    /// another forced kernel stays.
    #[test]
    fn few_query_rows_take_the_skinny_gemm_unless_a_kernel_is_forced() {
        let unfused = |precision| AttentionOptions {
            path: KernelPath::Unfused,
            precision,
            ..Default::default()
        };
        let gemm = |plan: &CallPlan| match plan.gpu {
            Some(GpuRoute::Unfused { gemm, .. }) => gemm,
            ref other => panic!("not unfused: {other:?}"),
        };
        for caps in [h100(), apple(), lavapipe(), webgpu_default()] {
            let few_rows = match caps.fixed_cpu_subgroup() {
                Some(width) => GemmKernel::Subgroup { width },
                None => GemmKernel::Skinny,
            };
            for precision in [Precision::Highest, Precision::Fast] {
                for rows in [1, 16] {
                    let dims = AttentionDims::plain(1, [32, 8], [rows, 4096], [128, 128]);
                    let step = plan(&caps, &dims, &unfused(precision));
                    assert_eq!(gemm(&step), few_rows, "{step}");
                }
                let tall = AttentionDims::plain(1, [32, 8], [17, 4096], [128, 128]);
                assert_ne!(
                    gemm(&plan(&caps, &tall, &unfused(precision))),
                    GemmKernel::Skinny
                );
            }
            for (forced, kernel) in [
                (GemmKernel::Tiled, GemmKernel::Skinny),
                (
                    GemmKernel::Subgroup { width: 4 },
                    GemmKernel::Subgroup { width: 4 },
                ),
            ] {
                let overrides = Overrides {
                    gemm: Some(forced),
                    ..Overrides::default()
                };
                let dims = decode(4096);
                let step = plan_on(&caps, &overrides, None, &dims, &unfused(Precision::Highest));
                assert_eq!(gemm(&step.unwrap()), kernel);
            }
        }
        let step = plan(&h100(), &decode(4096), &unfused(Precision::Fast));
        assert!(
            step.to_string().starts_with("unfused: gemm_skinny at fast"),
            "{step}"
        );
    }

    #[test]
    fn an_apple_gpu_without_matrix_units_keeps_fast_calls_on_the_f32_kernels() {
        let caps = apple();
        let at_fast = plan(&caps, &prefill(64), &fast());
        assert_eq!(
            fused_kernel(&at_fast).name(),
            "attention_tiled",
            "{at_fast}"
        );
        let step = plan(&caps, &decode(4096), &AttentionOptions::default());
        assert!(
            matches!(decode_kernel(&step), DecodeKernel::Stream(_)),
            "{step}"
        );
    }

    #[test]
    fn lavapipe_runs_the_subgroup_kernels() {
        let caps = lavapipe();
        let prefill = plan(&caps, &prefill(64), &AttentionOptions::default());
        assert_eq!(fused_kernel(&prefill), FusedKernel::Subgroup { width: 8 });
        // Head dims that are not multiples of 4 take the portable kernel.
        let odd = plan(
            &caps,
            &AttentionDims::plain(1, [1, 1], [7, 7], [7, 7]),
            &AttentionOptions::default(),
        );
        assert_eq!(fused_kernel(&odd).name(), "attention_fused");
        let unfused = plan(
            &caps,
            &super::tests::prefill(64),
            &AttentionOptions {
                path: KernelPath::Unfused,
                ..Default::default()
            },
        );
        assert!(
            matches!(
                unfused.gpu,
                Some(GpuRoute::Unfused {
                    gemm: GemmKernel::Subgroup { width: 8 },
                    score_budget,
                    ..
                }) if score_budget == 128 << 20
            ),
            "{unfused}"
        );
    }

    #[test]
    fn webgpu_defaults_stage_decode_and_cut_what_exceeds_a_binding() {
        let caps = webgpu_default();
        assert_eq!(
            fused_kernel(&plan(&caps, &prefill(64), &AttentionOptions::default())).name(),
            "attention_tiled"
        );
        assert_eq!(
            fused_kernel(&plan(&caps, &prefill(256), &AttentionOptions::default())).name(),
            "attention_fused"
        );
        // No subgroups: the staged decode kernel.
        let step = plan(&caps, &decode(4096), &AttentionOptions::default());
        assert_eq!(decode_kernel(&step), DecodeKernel::Staged);
        // 8 KV heads x 64k keys x 128 x 4 bytes = 256 MiB of K: two pieces of 4 heads.
        let long = plan(&caps, &decode(65536), &AttentionOptions::default());
        assert!(
            matches!(
                long.pieces,
                Pieces::Cut {
                    kv_heads: 4,
                    keys: 65536,
                    ..
                }
            ),
            "{long}"
        );
        assert!(
            long.to_string()
                .contains("in pieces of 1 batches x 4 KV heads"),
            "{long}"
        );
    }

    #[test]
    fn head_dims_beyond_the_fused_kernels_go_unfused_under_auto_and_are_refused_when_forced() {
        for caps in [h100(), apple(), lavapipe(), webgpu_default()] {
            let wide = AttentionDims::plain(1, [2, 2], [64, 64], [512, 512]);
            let auto = plan(&caps, &wide, &AttentionOptions::default());
            assert_eq!(auto.path, KernelPath::Unfused);
            assert!(auto
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("fused path unavailable")));
            let forced = AttentionOptions {
                path: KernelPath::Fused,
                ..Default::default()
            };
            assert!(plan_on(&caps, &Overrides::default(), None, &wide, &forced).is_err());
        }
    }

    #[test]
    fn the_host_paths_plan_no_kernels() {
        let dims = prefill(64);
        for (gpu, path, want) in [
            (true, KernelPath::Cpu, KernelPath::Cpu),
            (true, KernelPath::Oracle, KernelPath::Oracle),
            (false, KernelPath::Auto, KernelPath::Cpu),
            (false, KernelPath::Oracle, KernelPath::Oracle),
        ] {
            let options = AttentionOptions {
                path,
                ..Default::default()
            };
            let caps = h100();
            let overrides = Overrides::default();
            let planner = Planner {
                caps: &caps,
                overrides: &overrides,
                tuned: None,
                dk: 64,
                dv: 64,
            };
            let plan = plan_call(gpu.then_some(&planner), 0, &dims, &options).unwrap();
            assert_eq!((plan.path, plan.gpu), (want, None));
            assert_eq!(plan.to_string(), want.name());
        }
    }

    #[test]
    fn an_engine_left_to_choose_takes_the_cpu_backend_over_a_cpu_adapter_only() {
        let mut swiftshader = Capabilities::synthetic("Cpu");
        swiftshader.adapter.backend = "BrowserWebGpu".into();
        for caps in [lavapipe(), swiftshader] {
            let why = cpu_backend_over(&caps).expect("a CPU adapter");
            assert!(
                why.contains("CPU implementation") && why.contains("--backend gpu"),
                "{why}"
            );
        }
        for caps in [h100(), apple(), webgpu_default()] {
            assert_eq!(
                cpu_backend_over(&caps),
                None,
                "{}",
                caps.adapter.device_type
            );
        }
    }

    #[test]
    fn the_tuning_snapshot_and_the_overrides_steer_the_plan() {
        let caps = h100();
        let entry = TunedEntry {
            kernel: TunedKernel::Portable,
            fused_ms: 2.0,
            unfused_ms: 1.0,
            decode: None,
            grouped_decode: None,
            coop_ms: None,
            unfused_coop_ms: None,
            fast_gemm: None,
            coop_tiles: None,
        };
        let none = Overrides::default();
        // Measured faster: auto goes unfused, and says why.
        let dims = prefill(64);
        let tuned = plan_on(
            &caps,
            &none,
            Some(entry),
            &dims,
            &AttentionOptions::default(),
        )
        .unwrap();
        assert_eq!(tuned.path, KernelPath::Unfused);
        assert!(tuned.to_string().contains("webattn tune"), "{tuned}");
        // A decoder step keeps its own kernel whatever the prefill measured.
        let step = plan_on(
            &caps,
            &none,
            Some(entry),
            &decode(4096),
            &AttentionOptions::default(),
        );
        assert_eq!(step.unwrap().path, KernelPath::Fused);
        // Measured slower: the tuned kernel runs.
        let slower = TunedEntry {
            unfused_ms: 3.0,
            ..entry
        };
        let fused = plan_on(
            &caps,
            &none,
            Some(slower),
            &dims,
            &AttentionOptions::default(),
        )
        .unwrap();
        assert_eq!(fused_kernel(&fused).name(), "attention_fused");
        // Portable kernels forced: the portable fused and staged decode kernels, the tiled GEMM.
        let portable = Overrides {
            gemm: Some(GemmKernel::Tiled),
            fused: FusedKernelChoice::Portable,
            decode: crate::plan::overrides::DecodeKernelChoice::Staged,
            ..Overrides::default()
        };
        let forced = plan_on(&caps, &portable, None, &dims, &fast()).unwrap();
        assert_eq!(fused_kernel(&forced).name(), "attention_fused");
        let step = plan_on(
            &caps,
            &portable,
            None,
            &decode(4096),
            &AttentionOptions::default(),
        );
        assert_eq!(decode_kernel(&step.unwrap()), DecodeKernel::Staged);
        // One plan per inputs: planning twice gives the same value.
        assert_eq!(
            plan_on(&caps, &none, Some(entry), &dims, &fast()).unwrap(),
            plan_on(&caps, &none, Some(entry), &dims, &fast()).unwrap()
        );
    }
}
