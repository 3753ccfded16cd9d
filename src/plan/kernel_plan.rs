//! The kernel plan: which paths and kernel configurations the engine uses on
//! an adapter, derived from its capability profile. `webattn info` prints it.

use crate::device::capabilities::Capabilities;
use crate::kernels::attention::{CoopForm, CoopTiles, FusedKernel, FusedTiles, TiledTiles};
use crate::kernels::decode;
use crate::kernels::decode::StreamShape;
use crate::kernels::{concat, gemm, mask, softmax};
use crate::options::{KernelPath, Precision};

/// One kernel configuration as it will be compiled on this adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelConfig {
    /// The pipeline key's text, also its wgpu label (e.g. `gemm[TRANS_A=0,TRANS_B=1]`).
    pub label: String,
    /// Invocations per workgroup.
    pub invocations: u32,
    /// The work one workgroup does, in words.
    pub tile: String,
    /// Workgroup memory the kernel uses, in bytes.
    pub workgroup_bytes: u32,
    /// Which step of which path uses it.
    pub role: &'static str,
}

/// The paths and kernels an engine uses on one adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPlan {
    /// What `KernelPath::Auto` resolves to.
    pub default_path: KernelPath,
    /// The GPU paths available.
    pub paths: Vec<KernelPath>,
    /// The kernel configurations, in dispatch order of the unfused path.
    pub kernels: Vec<KernelConfig>,
    /// The largest score block the unfused path materialises at once, in bytes.
    pub max_score_chunk_bytes: u64,
    /// Why each choice was made, in words.
    pub notes: Vec<String>,
}

impl KernelPlan {
    /// The plan for an adapter with these capabilities.
    pub fn for_capabilities(caps: &Capabilities) -> KernelPlan {
        let limits = &caps.limits;
        let gemm_kernel = crate::kernels::gemm::gemm_kernel_for(caps);
        let gemm_config = |gemm_kernel: gemm::GemmKernel, trans_b: bool, role: &'static str| {
            let spec = gemm::GemmSpec::contiguous(1, 64, 64, 64, false, trans_b);
            let a_values = if trans_b {
                gemm::AValues::Any
            } else {
                gemm::AValues::Probabilities
            };
            let gemm_kernel = gemm::marks_to_staged(gemm_kernel, a_values);
            let (invocations, tile, workgroup_bytes) = match gemm_kernel {
                gemm::GemmKernel::Tiled => (gemm::INVOCATIONS, gemm::TILE_TEXT.to_string(), gemm::WORKGROUP_BYTES),
                gemm::GemmKernel::Skinny => (
                    gemm::SKINNY_INVOCATIONS,
                    gemm::SKINNY_TEXT.to_string(),
                    gemm::SKINNY_WORKGROUP_BYTES,
                ),
                gemm::GemmKernel::Subgroup { width } => (
                    width,
                    format!(
                        "{}x{} of C per subgroup of {width}, {}x{} per invocation, B shared by shuffles",
                        gemm::SUBGROUP_ROWS_PER_LANE * width as usize,
                        gemm::SUBGROUP_COLS,
                        gemm::SUBGROUP_ROWS_PER_LANE,
                        gemm::SUBGROUP_COLS
                    ),
                    0,
                ),
                gemm::GemmKernel::Coop(shape) => {
                    let (n, tile) = (shape.size.dim(), gemm::coop_tile(shape));
                    (
                        gemm::coop_invocations(shape),
                        format!(
                            "{tile}x{tile} of C, 4 subgroups of {} each 2x2 f32 accumulators of {n}x{n}, \
                             f16 operands staged in slices of K = {}",
                            shape.subgroup,
                            gemm::COOP_SLICE
                        ),
                        gemm::coop_workgroup_bytes(shape),
                    )
                }
                gemm::GemmKernel::CoopPacked { shape, tile } => {
                    let n = shape.size.dim();
                    let (rows, cols) = crate::kernels::gemm::packed::tile_dims(shape, tile);
                    (
                        crate::kernels::gemm::packed::invocations(shape),
                        format!(
                            "{rows}x{cols} of C, 4 subgroups of {} each {}x{} f32 accumulators of {n}x{n}, \
                             f16 operands packed first (coop_pack) and loaded from storage",
                            shape.subgroup, tile.rows, tile.cols
                        ),
                        crate::kernels::gemm::packed::workgroup_bytes(shape),
                    )
                }
            };
            KernelConfig {
                // P V skips keys not attended (probability -0), whatever V holds there.
                label: gemm::variant_key(gemm_kernel, &spec, a_values).to_string(),
                invocations,
                tile,
                workgroup_bytes,
                role,
            }
        };
        let mut kernels = Vec::new();
        // The fused kernel at head dims 64/64 (tiles of the portable kernel follow the dims).
        match crate::plan::planner::fused_kernel_for(caps, 64, 64) {
            Ok(FusedKernel::Subgroup { width }) => kernels.push(KernelConfig {
                label: format!("attention_sg[SG={width}]"),
                invocations: width,
                tile: format!(
                    "{} query rows x {}-key tiles per subgroup, 4 rows per invocation; K, V shared by shuffles",
                    4 * width,
                    crate::kernels::attention::SUBGROUP_KEYS
                ),
                workgroup_bytes: 0,
                role: "fused: Q K^T, online softmax, P V in one pass (head dims multiple of 4)",
            }),
            Ok(FusedKernel::Portable(tiles)) => kernels.push(portable(tiles)),
            Ok(FusedKernel::Tiled(tiles)) => kernels.push(tiled(tiles)),
            Ok(FusedKernel::Coop(tiles)) => kernels.push(coop(tiles)),
            Err(_) => {}
        }
        if let Some(tiles) = crate::kernels::matrix_units::coop_shape(caps)
            .and_then(|shape| CoopTiles::for_dims(shape, 64, 64, limits))
        {
            kernels.push(coop(tiles));
        }
        if let Some(tiles) = TiledTiles::for_dims(64, 64, limits) {
            if !kernels.iter().any(|k| k.label == tiles.key().to_string()) {
                kernels.push(tiled(tiles));
            }
        }
        // The tiled kernel's shuffle form where subgroups hold a row of its
        // invocations, and its chunked form (each forced by name, or taken
        // where tuned).
        type OfForm = fn(&TiledTiles) -> bool;
        let forms: [(OfForm, &'static str); 2] = [
            (
                |t| t.shuffle,
                "fused (register-tiled, row maxima and P by subgroup shuffles): \
                 --kernel attention_tiled_shuffle, or where webattn tune measured it faster",
            ),
            (
                |t| t.chunked,
                "fused (register-tiled, Q, K, V and P tiles in chunks of columns: one index \
                 clamp per row and chunk): --kernel attention_tiled_chunked, or where \
                 webattn tune measured it faster",
            ),
        ];
        for (of_form, role) in forms {
            if let Some(tiles) = TiledTiles::candidates(64, 64)
                .into_iter()
                .find(|t| of_form(t) && !t.prefetch && t.runs_on(caps))
            {
                kernels.push(KernelConfig {
                    role,
                    ..tiled(tiles)
                });
            }
        }
        if let Ok(tiles) = FusedTiles::for_dims(64, 64, limits) {
            if !kernels.iter().any(|k| k.label == tiles.key().to_string()) {
                kernels.push(portable(tiles));
            }
        }
        kernels.extend([
            KernelConfig {
                label: concat::key().to_string(),
                invocations: concat::WORKGROUP as u32,
                tile: format!("{} elements of present_key/value", concat::WORKGROUP),
                workgroup_bytes: 0,
                role: "unfused: KV cache concatenation",
            },
            gemm_config(gemm_kernel, true, "unfused: S = scale * Q K^T"),
            KernelConfig {
                label: mask::key().to_string(),
                invocations: mask::WORKGROUP,
                tile: "one score row".to_string(),
                workgroup_bytes: 0,
                role: "unfused: softcap, masks, causal, windows, padding",
            },
            KernelConfig {
                label: softmax::key().to_string(),
                invocations: softmax::WORKGROUP,
                tile: "one score row".to_string(),
                workgroup_bytes: softmax::WORKGROUP_BYTES,
                role: "unfused: row softmax and logsumexp",
            },
            gemm_config(gemm_kernel, false, "unfused: Y = P V"),
        ]);
        // Products of a few query rows (decoding), where the adapter's
        // kernel is not the subgroup one (`Planner::gemm_kernel_for_rows`).
        if !matches!(gemm_kernel, gemm::GemmKernel::Subgroup { .. }) {
            kernels.push(gemm_config(
                gemm::GemmKernel::Skinny,
                true,
                "unfused, up to 16 query rows a head (decoding): S = scale * Q K^T",
            ));
            kernels.push(gemm_config(
                gemm::GemmKernel::Skinny,
                false,
                "unfused, up to 16 query rows a head (decoding): Y = P V",
            ));
        }
        let fast_gemm = crate::plan::planner::gemm_kernel_at(caps, Precision::Fast, gemm_kernel);
        if fast_gemm != gemm_kernel {
            if let gemm::GemmKernel::CoopPacked { .. } = fast_gemm {
                kernels.push(KernelConfig {
                    label: crate::kernels::gemm::packed::pack_key().to_string(),
                    invocations: crate::kernels::gemm::packed::PACK_INVOCATIONS,
                    tile: "8 values of a packed row per invocation".to_string(),
                    workgroup_bytes: 0,
                    role: "unfused, precision fast: Q and K as f16, padded to whole tiles",
                });
            }
            kernels.push(gemm_config(
                fast_gemm,
                true,
                "unfused, precision fast: S = scale * Q K^T on the matrix units",
            ));
            kernels.push(gemm_config(
                fast_gemm,
                false,
                "unfused, precision fast: Y = P V on the matrix units",
            ));
        }
        kernels.retain(|k| {
            k.workgroup_bytes <= limits.max_compute_workgroup_storage_size
                && k.invocations <= limits.max_compute_invocations_per_workgroup
        });
        let gemm_note = match gemm_kernel {
            gemm::GemmKernel::Tiled => "GEMM: workgroup-memory tiles (no fixed CPU subgroups here)".to_string(),
            gemm::GemmKernel::Subgroup { width } => format!(
                "GEMM: subgroup shuffles (CPU adapter, subgroups of {width}: a storage load costs a loop over the lanes)"
            ),
            gemm::GemmKernel::Coop(_) | gemm::GemmKernel::CoopPacked { .. } => {
                "GEMM: matrix units".to_string()
            }
            gemm::GemmKernel::Skinny => "GEMM: skinny products".to_string(),
        };
        let coop_note = match crate::kernels::matrix_units::coop_shape(caps) {
            Some(shape) => format!(
                "matrix units: {n}x{n}x{n} f16 -> f32 at subgroups of {}, used by calls with precision fast",
                shape.subgroup,
                n = shape.size.dim()
            ),
            None if caps.cooperative_matrix.is_empty() => {
                "matrix units: none offered (precision fast runs the f32 kernels)".to_string()
            }
            None => "matrix units: no f16 -> f32 configuration of 8 or 16 with fixed-width subgroups \
                     (precision fast runs the f32 kernels)"
                .to_string(),
        };
        let notes = vec![
            gemm_note,
            coop_note,
            format!(
                "score blocks of at most {} MiB (max_storage_buffer_binding_size)",
                limits.max_bindable_bytes() >> 20
            ),
            format!(
                "dispatches beyond {} workgroups per dimension fold into a 2D grid",
                limits.max_compute_workgroups_per_dimension
            ),
        ];
        let mut notes = notes;
        if let Some(budget) = caps.loop_budget() {
            notes.push(format!(
                "this driver stops an invocation's loops after ~65535 iterations: long key ranges \
                 run in chunks of at most {budget} loop iterations per invocation"
            ));
        }
        KernelPlan {
            default_path: KernelPath::Fused,
            paths: vec![KernelPath::Fused, KernelPath::Unfused],
            kernels,
            max_score_chunk_bytes: limits.max_bindable_bytes(),
            notes,
        }
    }
}

/// The register-tiled fused kernel's configuration.
fn tiled(tiles: TiledTiles) -> KernelConfig {
    KernelConfig {
        label: tiles.key().to_string(),
        invocations: tiles.invocations(),
        tile: format!("{} (at Dk = Dv = 64)", tiles.describe()),
        workgroup_bytes: tiles.workgroup_bytes(),
        role: "fused (register-tiled): GPUs, head dims up to 256 where a tile fits",
    }
}

/// The matrix-unit fused kernel's configuration.
fn coop(tiles: CoopTiles) -> KernelConfig {
    KernelConfig {
        label: tiles.key().to_string(),
        invocations: tiles.invocations(),
        tile: format!("{} (at Dk = Dv = 64)", tiles.describe()),
        workgroup_bytes: tiles.workgroup_bytes(),
        role: "fused, precision fast: Q K^T and P V on the matrix units",
    }
}

/// The portable fused kernel's configuration.
fn portable(tiles: FusedTiles) -> KernelConfig {
    KernelConfig {
        label: tiles.key().to_string(),
        invocations: tiles.query_rows,
        tile: format!(
            "{} query rows x {}-key K/V tiles in workgroup memory (at Dk = Dv = 64)",
            tiles.query_rows, tiles.keys_per_tile
        ),
        workgroup_bytes: tiles.workgroup_bytes(),
        role: "fused (portable): any adapter, any head dims up to 256",
    }
}

/// Every pipeline variant the engine can compile, at representative head dims
/// and tile sizes: what the browser test hands to the browser's own shader
/// compiler (stricter than naga: literal ranges, barrier uniformity, the
/// `enable subgroups;` directive).
pub fn every_pipeline_variant() -> Vec<crate::device::pipeline::PipelineKey> {
    use crate::device::pipeline::PipelineKey;
    use crate::kernels::gemm;
    use crate::kernels::gemm::{GemmKernel, GemmSpec};
    use crate::kernels::registry::Kernel;
    let mut keys = Vec::new();
    for trans_a in [false, true] {
        for trans_b in [false, true] {
            keys.push(gemm::key(trans_a, trans_b));
        }
    }
    // The P V product of the unfused path skips masked keys.
    keys.push(gemm::key(false, false).with_flag("SKIP_MARKED_A", true));
    // The skinny kernel at each height it compiles: decoding's Q Kᵀ and P V,
    // then a plain product and a transposed A.
    for m in [1, 2, 4, 8, 16] {
        let scores = GemmSpec::contiguous(1, m, 64, 64, false, true);
        keys.push(gemm::variant_key(
            GemmKernel::Skinny,
            &scores,
            gemm::AValues::Any,
        ));
        let output = GemmSpec::contiguous(1, m, 64, 64, false, false);
        let probabilities = gemm::AValues::Probabilities;
        keys.push(gemm::variant_key(
            GemmKernel::Skinny,
            &output,
            probabilities,
        ));
    }
    for trans_a in [false, true] {
        let spec = GemmSpec::contiguous(1, 16, 64, 64, trans_a, false);
        keys.push(gemm::kernel_key(GemmKernel::Skinny, &spec));
    }
    for width in [4, 8] {
        for trans_b in [false, true] {
            for (k, ld) in [(64, 64), (63, 63)] {
                let spec = GemmSpec {
                    lda: ld,
                    ldb: ld,
                    ..GemmSpec::contiguous(1, 64, 64, k, false, trans_b)
                };
                keys.push(gemm::kernel_key(GemmKernel::Subgroup { width }, &spec));
                if !trans_b {
                    let kernel = GemmKernel::Subgroup { width };
                    keys.push(gemm::variant_key(
                        kernel,
                        &spec,
                        gemm::AValues::Probabilities,
                    ));
                }
            }
        }
        for mask in [false, true] {
            for softcap in [false, true] {
                keys.push(
                    PipelineKey::new(Kernel::AttentionSubgroup)
                        .with("SG", i64::from(width))
                        .with_flag("HAS_MASK", mask)
                        .with_flag("SOFTCAP", softcap),
                );
            }
        }
    }
    for (dk, dv, storage) in [
        (64, 64, 16 << 10),
        (64, 64, 32 << 10),
        (256, 256, 16 << 10),
        (8, 200, 16 << 10),
    ] {
        let limits = crate::device::capabilities::KernelLimits {
            max_compute_workgroup_storage_size: storage,
            ..crate::device::capabilities::KernelLimits::WEBGPU_DEFAULTS
        };
        if let Ok(tiles) = FusedTiles::for_dims(dk, dv, &limits) {
            keys.push(tiles.key());
        }
        if let Some(tiles) = TiledTiles::for_dims(dk, dv, &limits) {
            keys.push(tiles.key());
        }
    }
    // More tiles of the register-tiled kernel, within the 32 KiB a browser
    // offers (the browser test compiles this list on its own device).
    for (dk, dv) in [(128, 128), (256, 256), (65, 3)] {
        let limits = crate::device::capabilities::KernelLimits {
            max_compute_workgroup_storage_size: 32 << 10,
            ..crate::device::capabilities::KernelLimits::WEBGPU_DEFAULTS
        };
        if let Some(tiles) = TiledTiles::for_dims(dk, dv, &limits) {
            keys.push(tiles.key());
        }
    }
    // A shape that prefetches the next tile into registers (tried by the
    // tuner), at head dim 64 within 32 KiB.
    let browser = crate::device::capabilities::KernelLimits {
        max_compute_workgroup_storage_size: 32 << 10,
        ..crate::device::capabilities::KernelLimits::WEBGPU_DEFAULTS
    };
    if let Some(tiles) = TiledTiles::candidates(64, 64)
        .into_iter()
        .find(|t| t.prefetch && !t.shuffle && !t.chunked && t.fits(&browser))
    {
        keys.push(tiles.key());
    }
    // The chunked form (tried by the tuner where the adapter is a GPU).
    if let Some(tiles) = TiledTiles::candidates(64, 64)
        .into_iter()
        .find(|t| t.chunked && !t.prefetch && t.fits(&browser))
    {
        keys.push(tiles.key());
    }
    keys.push(PipelineKey::new(Kernel::FmaPeak).with("WORKGROUP", 64));
    keys.push(PipelineKey::new(Kernel::CopyPeak).with("WORKGROUP", 256));
    // Decode: one query row, a GQA group of 4 rows, and the most rows.
    for rows in [1, 4, 16] {
        keys.push(PipelineKey::new(Kernel::AttentionDecode).with("ROWS", rows));
        keys.push(PipelineKey::new(Kernel::AttentionDecodeF16).with("ROWS", rows));
    }
    // The streaming decode kernel at one row and at a GQA group of 4, in
    // teams of the widths SwiftShader (4), lavapipe (8) and GPUs (32) give
    // it, f16 K and V at 16. (16 rows compile natively and run on lavapipe;
    // SwiftShader in Chromium loses its device compiling that variant, and
    // wgpu gives the web no subgroups to run the kernel with.)
    for (rows, d) in [(1, 128), (4, 64)] {
        let dims = crate::problem::AttentionDims::plain(1, [rows, 1], [1, 4096], [d, d]);
        let shape = |lanes| StreamShape {
            lanes,
            keys_per_step: 2,
            prefetch: false,
        };
        for lanes in [4, 8, 32] {
            keys.push(decode::stream_key(shape(lanes), &dims, rows as i64, false));
        }
        keys.push(decode::stream_key(shape(16), &dims, rows as i64, true));
    }
    {
        use crate::kernels::convert::{key, Direction};
        keys.extend([Direction::Widen, Direction::Narrow, Direction::WidenBf16].map(key));
    }
    for f16 in [false, true] {
        for rows in [1, 7, crate::kernels::projection::MAX_ROWS] {
            keys.push(crate::kernels::projection::key(f16, rows));
        }
    }
    for kernel in [
        Kernel::Softmax,
        Kernel::Mask,
        Kernel::Concat,
        Kernel::AttentionScores,
        Kernel::AttentionMerge,
        Kernel::Position,
        Kernel::CacheAppend,
        Kernel::LinearFeatures,
        Kernel::LinearScan,
        Kernel::LinearOutput,
        Kernel::LinearWeights,
        Kernel::AdditiveScores,
    ] {
        keys.push(PipelineKey::new(kernel));
    }
    keys
}

/// Head dims that stand for every class the planner distinguishes: the
/// smallest, vec4 multiples and not, the common sizes, and the largest the
/// fused kernels take.
pub const HEAD_DIM_CLASSES: [usize; 10] = [1, 3, 4, 8, 63, 64, 65, 128, 200, 256];

/// Workgroup-memory sizes adapters report: WebGPU's default (16 KiB), common
/// desktop GPUs (32 and 48 KiB) and large ones (64 KiB).
pub const WORKGROUP_STORAGE_CLASSES: [u32; 4] = [16 << 10, 32 << 10, 48 << 10, 64 << 10];

/// Every pipeline the planner can choose on some adapter: each kernel × each
/// override combination it can pick × each head-dim class (and the tile sizes
/// the workgroup-memory classes give). Larger than
/// [`every_pipeline_variant`]; the shader translation test pushes each through
/// naga's SPIR-V, MSL, HLSL and GLSL writers.
pub fn every_planned_pipeline() -> Vec<crate::device::pipeline::PipelineKey> {
    use crate::device::pipeline::PipelineKey;
    use crate::kernels::gemm;
    use crate::kernels::registry::Kernel;
    let mut keys = every_pipeline_variant();
    let flags = [false, true];
    for trans_a in flags {
        for trans_b in flags {
            for vec_a in flags {
                for vec_b in flags {
                    for width in [4, 8] {
                        let key = PipelineKey::new(Kernel::GemmSubgroup)
                            .with("SG", width)
                            .with_flag("TRANS_A", trans_a)
                            .with_flag("TRANS_B", trans_b)
                            .with_flag("VEC_A", vec_a)
                            .with_flag("VEC_B", vec_b);
                        keys.push(key.clone().with_flag("SKIP_MARKED_A", true));
                        keys.push(key);
                    }
                }
            }
            keys.push(gemm::key(trans_a, trans_b));
            keys.push(gemm::key(trans_a, trans_b).with_flag("SKIP_MARKED_A", true));
        }
    }
    for storage in WORKGROUP_STORAGE_CLASSES {
        for invocations in [256, 1024] {
            let limits = crate::device::capabilities::KernelLimits {
                max_compute_workgroup_storage_size: storage,
                max_compute_invocations_per_workgroup: invocations,
                ..crate::device::capabilities::KernelLimits::WEBGPU_DEFAULTS
            };
            for dk in HEAD_DIM_CLASSES {
                for dv in HEAD_DIM_CLASSES {
                    if let Ok(tiles) = FusedTiles::for_dims(dk, dv, &limits) {
                        keys.push(tiles.key());
                    }
                }
            }
        }
    }
    // Every tile of the register-tiled kernel at every head-dim class: the
    // tuner may pick any candidate that fits.
    for dk in HEAD_DIM_CLASSES {
        for dv in HEAD_DIM_CLASSES {
            keys.extend(TiledTiles::candidates(dk, dv).iter().map(TiledTiles::key));
        }
    }
    for rows in 1..=crate::kernels::decode::MAX_WORKGROUP_ROWS as i64 {
        keys.push(PipelineKey::new(Kernel::AttentionDecode).with("ROWS", rows));
        keys.push(PipelineKey::new(Kernel::AttentionDecodeF16).with("ROWS", rows));
    }
    // Every shape of the streaming decode kernel that holds 1, 2, 4, 8 or 16
    // rows at each head-dim class it takes, with K and V in f32 and in f16
    // (any of them may be an adapter's untuned pick or its tuned one).
    for d in HEAD_DIM_CLASSES.into_iter().filter(|d| d % 4 == 0) {
        for rows in [1, 2, 4, 8, 16] {
            let dims = crate::problem::AttentionDims::plain(1, [rows, 1], [1, 4096], [d, d]);
            let shapes: Vec<StreamShape> = StreamShape::all()
                .into_iter()
                .filter(|shape| shape.holds(&dims, rows))
                .collect();
            for shape in &shapes {
                for kv_f16 in [false, true] {
                    keys.push(decode::stream_key(*shape, &dims, rows as i64, kv_f16));
                }
            }
        }
    }
    for workgroup in [64, 256] {
        keys.push(PipelineKey::new(Kernel::FmaPeak).with("WORKGROUP", workgroup));
    }
    keys.push(PipelineKey::new(Kernel::CopyPeak).with("WORKGROUP", 256));
    // The matrix-unit GEMM at both sizes, every transpose, with and without
    // zero skipping, at the subgroup widths adapters report; the matrix-unit
    // fused kernel's every candidate tile at every head-dim class, in both forms.
    for size in [
        crate::kernels::matrix_units::CoopSize::Eight,
        crate::kernels::matrix_units::CoopSize::Sixteen,
    ] {
        for subgroup in [8, 32, 64] {
            let shape = gemm::CoopShape { size, subgroup };
            for dk in HEAD_DIM_CLASSES {
                for dv in HEAD_DIM_CLASSES {
                    // (Each in every form: packed, as calls take it,
                    // staged and shared.)
                    keys.extend(
                        CoopTiles::candidates(shape, dk, dv)
                            .into_iter()
                            .flat_map(|t| CoopForm::ALL.map(|form| t.in_form(form)))
                            .filter(CoopTiles::is_valid)
                            .map(|t| t.key()),
                    );
                }
            }
            for trans_a in flags {
                for trans_b in flags {
                    let spec = gemm::GemmSpec::contiguous(1, 64, 64, 64, trans_a, trans_b);
                    for a_values in [
                        gemm::AValues::Any,
                        gemm::AValues::MarksSkipped,
                        gemm::AValues::Probabilities,
                    ] {
                        keys.push(gemm::variant_key(
                            gemm::GemmKernel::Coop(shape),
                            &spec,
                            a_values,
                        ));
                    }
                    for tile in gemm::PackedTile::CANDIDATES {
                        keys.push(crate::kernels::gemm::packed::key(shape, tile));
                    }
                }
            }
        }
    }
    keys.push(crate::kernels::gemm::packed::pack_key());
    keys.sort();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planned_list_holds_the_representative_one() {
        let planned = every_planned_pipeline();
        for key in every_pipeline_variant() {
            assert!(planned.contains(&key), "{key} missing");
        }
    }

    /// `webattn info` lists the skinny GEMM's decoding products where the
    /// planner takes it (adapters without fixed CPU subgroups), and not on
    /// lavapipe, which keeps the subgroup kernel for them.
    #[test]
    fn the_skinny_gemm_is_listed_where_decoding_takes_it() {
        let listed = |caps: &Capabilities| {
            KernelPlan::for_capabilities(caps)
                .kernels
                .iter()
                .filter(|k| k.label.starts_with("gemm_skinny"))
                .count()
        };
        assert_eq!(listed(&Capabilities::synthetic("DiscreteGpu")), 2);
        let mut lavapipe = Capabilities::synthetic("Cpu");
        (
            lavapipe.subgroups,
            lavapipe.subgroup_min_size,
            lavapipe.subgroup_max_size,
        ) = (true, 8, 8);
        assert!(lavapipe.fixed_cpu_subgroup().is_some());
        assert_eq!(listed(&lavapipe), 0);
    }

    #[test]
    fn every_kernel_has_a_variant_in_the_list() {
        let keys = every_pipeline_variant();
        // The matrix-unit kernels (and the pass that packs their operands)
        // never run in a browser (wgpu offers no cooperative matrices
        // there), nor do attention_tiled_wide and
        // attention_tiled_shuffle (SwiftShader in Chromium loses its device
        // compiling either, and its subgroups of 4 run no shuffle form); the
        // translation test covers them.
        for kernel in crate::kernels::registry::Kernel::ALL {
            use crate::kernels::registry::Kernel::{AttentionTiledShuffle, AttentionTiledWide};
            if !kernel.runs_with_matrix_units()
                && kernel != AttentionTiledWide
                && kernel != AttentionTiledShuffle
            {
                assert!(keys.iter().any(|k| k.kernel == kernel), "{kernel} missing");
            }
        }
    }
}
