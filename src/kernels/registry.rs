//! The registry of WGSL kernels: each kernel's text (a file in `shaders/`,
//! embedded here, or the text a generator in `kernels/` writes), its
//! entry point and the layout of its bindings.
//!
//! Bind-group layouts are declared explicitly from [`Kernel::bindings`] rather
//! than derived from the shader, so a binding that drifts out of step with the
//! Rust side is a validation error at pipeline creation, not a silent mismatch.

#[cfg(not(target_arch = "wasm32"))]
use crate::error::{Error, Result};

pub use super::matrix_units::CoopSize;

/// One WGSL kernel of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kernel {
    /// Batched, strided GEMM with transpose flags and alpha/beta (`shaders/gemm.wgsl`).
    Gemm,
    /// Row softmax with logsumexp (`shaders/softmax.wgsl`).
    Softmax,
    /// Softcap, mask and bias of score rows (`shaders/mask.wgsl`).
    Mask,
    /// Concatenation of a KV cache with new keys or values (`shaders/concat.wgsl`).
    Concat,
    /// The FMA-throughput ceiling the benchmark measures (`shaders/fma_peak.wgsl`).
    FmaPeak,
    /// The memory-bandwidth ceiling the benchmark measures: a vec4 copy (`shaders/copy_peak.wgsl`).
    CopyPeak,
    /// Subgroup-shuffle GEMM for CPU-backed adapters (`kernels/gemm/subgroup.rs`: `gemm_sg`).
    GemmSubgroup,
    /// Portable fused attention, FlashAttention-2 style (`shaders/attention_fused.wgsl`).
    AttentionFused,
    /// qk_matmul_output recomputed from Q and K (`shaders/attention_scores.wgsl`).
    AttentionScores,
    /// Fused attention with subgroup shuffles, for CPU adapters (`kernels/attention/subgroup.rs`:
    /// `attention_sg`).
    AttentionSubgroup,
    /// Register-tiled fused attention for GPUs (`kernels/attention/tiled/generator.rs`:
    /// `attention_tiled`).
    AttentionTiled,
    /// The register-tiled kernel with up to 8 query rows per invocation, for
    /// the shapes only the tuner tries (`kernels/attention/tiled/generator.rs`:
    /// `attention_tiled_wide`).
    AttentionTiledWide,
    /// The register-tiled kernel whose row maxima and probabilities move
    /// between a row's invocations by subgroup shuffles, for the forms only
    /// the tuner tries (`kernels/attention/tiled/generator.rs`: `attention_tiled_shuffle`).
    AttentionTiledShuffle,
    /// The register-tiled kernel with its Q, K, V and P tiles in chunks of
    /// columns (one index clamp per row and chunk instead of one per load),
    /// for the forms only the tuner tries (`kernels/attention/tiled/generator.rs`:
    /// `attention_tiled_chunked`).
    AttentionTiledChunked,
    /// Split-K decode attention for a few query rows (`shaders/attention_decode.wgsl`).
    AttentionDecode,
    /// The decode kernel reading K and V stored as f16 (`shaders/attention_decode.wgsl`
    /// with `shaders/element_f16.wgsl` in its ELEMENT slot).
    AttentionDecodeF16,
    /// Split-K decode that streams K and V: teams of subgroup lanes per key,
    /// no barrier in the key loop (`kernels/decode/stream.rs`:
    /// `attention_decode_stream`).
    AttentionDecodeStream,
    /// The streaming decode kernel reading K and V stored as f16
    /// (`kernels/decode/stream.rs`: `attention_decode_stream` with
    /// `shaders/element_f16.wgsl`
    /// in its ELEMENT slot).
    AttentionDecodeStreamF16,
    /// Merges split-K partial results by their maxima (`shaders/attention_merge.wgsl`).
    AttentionMerge,
    /// Widens f16 tensors to f32, or narrows f32 to f16 (`shaders/convert_f16.wgsl`).
    ConvertF16,
    /// Sinusoidal encoding and rotary embeddings, in place (`shaders/position.wgsl`).
    Position,
    /// The elu+1 feature map of linear attention (`shaders/linear_features.wgsl`).
    LinearFeatures,
    /// Linear attention's running state over a key range; causal rows as it
    /// goes (`shaders/linear_scan.wgsl`).
    LinearScan,
    /// Non-causal linear attention rows from the final state (`shaders/linear_output.wgsl`).
    LinearOutput,
    /// Linear attention weights from scores and row normalisers (`shaders/linear_weights.wgsl`).
    LinearWeights,
    /// Additive (Bahdanau) scores `vᵀ tanh(A_i + B_j)` from projected states,
    /// with source padding (`shaders/additive_scores.wgsl`).
    AdditiveScores,
    /// GEMM on the matrix units: f16 operands, f32 accumulators
    /// (`kernels/templates.rs`: `gemm_coop`).
    GemmCoop(CoopSize),
    /// GEMM on the matrix units from operands packed as f16 by
    /// [`Kernel::CoopPack`]: no workgroup memory in the K loop
    /// (`kernels/templates.rs`: `gemm_coop_packed`).
    GemmCoopPacked(CoopSize),
    /// Packs a GEMM operand as f16, zero-padded to whole tiles, for
    /// [`Kernel::GemmCoopPacked`] (`shaders/coop_pack.wgsl`).
    CoopPack,
    /// Fused attention on the matrix units: S and O as f32 accumulator
    /// matrices, Q, K, V and P as f16 (`kernels/templates.rs`: `attention_coop`).
    AttentionCoop(CoopSize),
    /// The same with K and V packed as f16 by [`Kernel::CoopPack`] ahead of
    /// it: its products load them straight from storage, with no staging
    /// (`kernels/templates.rs`: `attention_coop_packed`).
    AttentionCoopPacked(CoopSize),
    /// The same from packed K and V, each tile copied once into workgroup
    /// memory, where every subgroup's products read it, the next tile's
    /// copy in flight behind this one's work (`kernels/templates.rs`:
    /// `attention_coop_shared`).
    AttentionCoopShared(CoopSize),
    /// Skinny products `x Wᵀ + b` for a few rows (a decoder step's
    /// projections), each weight read once, f32 or f16 weights, up to three
    /// head-major outputs from one fused matrix (`shaders/projection.wgsl`).
    Projection,
    /// A decoder step's keys (rotated by RoPE, or copied) and values into its
    /// preallocated KV cache, in one dispatch (`shaders/cache_append.wgsl`).
    CacheAppend,
    /// GEMM for products of at most 16 rows: each value of B read once,
    /// K split among invocations (`shaders/gemm_skinny.wgsl`).
    GemmSkinny,
}

/// How a kernel sees one binding (in binding-index order, group 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// A uniform buffer of parameters.
    Uniform,
    /// A read-only storage buffer.
    Read,
    /// A read-write storage buffer.
    ReadWrite,
}

/// Where a kernel's WGSL comes from ([`Kernel::origin`]).
#[derive(Clone, Copy)]
enum Origin {
    /// A file in `shaders/`, embedded.
    File(&'static str),
    /// A generator in the kernel families (`crate::kernels`), run once per process.
    Generated(fn() -> String),
}

impl Kernel {
    /// Every kernel, in a fixed order.
    pub const ALL: [Kernel; 40] = [
        Kernel::Gemm,
        Kernel::Softmax,
        Kernel::Mask,
        Kernel::Concat,
        Kernel::FmaPeak,
        Kernel::CopyPeak,
        Kernel::GemmSubgroup,
        Kernel::AttentionFused,
        Kernel::AttentionScores,
        Kernel::AttentionSubgroup,
        Kernel::AttentionTiled,
        Kernel::AttentionTiledWide,
        Kernel::AttentionTiledShuffle,
        Kernel::AttentionTiledChunked,
        Kernel::AttentionDecode,
        Kernel::AttentionDecodeF16,
        Kernel::AttentionDecodeStream,
        Kernel::AttentionDecodeStreamF16,
        Kernel::AttentionMerge,
        Kernel::ConvertF16,
        Kernel::Position,
        Kernel::LinearFeatures,
        Kernel::LinearScan,
        Kernel::LinearOutput,
        Kernel::LinearWeights,
        Kernel::AdditiveScores,
        Kernel::GemmCoop(CoopSize::Eight),
        Kernel::GemmCoop(CoopSize::Sixteen),
        Kernel::GemmCoopPacked(CoopSize::Eight),
        Kernel::GemmCoopPacked(CoopSize::Sixteen),
        Kernel::CoopPack,
        Kernel::AttentionCoop(CoopSize::Eight),
        Kernel::AttentionCoop(CoopSize::Sixteen),
        Kernel::AttentionCoopPacked(CoopSize::Eight),
        Kernel::AttentionCoopPacked(CoopSize::Sixteen),
        Kernel::AttentionCoopShared(CoopSize::Eight),
        Kernel::AttentionCoopShared(CoopSize::Sixteen),
        Kernel::Projection,
        Kernel::CacheAppend,
        Kernel::GemmSkinny,
    ];

    /// A short lowercase name, used in pipeline labels.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Gemm => "gemm",
            Kernel::Softmax => "softmax",
            Kernel::Mask => "mask",
            Kernel::Concat => "concat",
            Kernel::FmaPeak => "fma_peak",
            Kernel::CopyPeak => "copy_peak",
            Kernel::GemmSubgroup => "gemm_sg",
            Kernel::AttentionFused => "attention_fused",
            Kernel::AttentionScores => "attention_scores",
            Kernel::AttentionSubgroup => "attention_sg",
            Kernel::AttentionTiled => "attention_tiled",
            Kernel::AttentionTiledWide => "attention_tiled_wide",
            Kernel::AttentionTiledShuffle => "attention_tiled_shuffle",
            Kernel::AttentionTiledChunked => "attention_tiled_chunked",
            Kernel::AttentionDecode => "attention_decode",
            Kernel::AttentionDecodeF16 => "attention_decode_f16",
            Kernel::AttentionDecodeStream => "attention_decode_stream",
            Kernel::AttentionDecodeStreamF16 => "attention_decode_stream_f16",
            Kernel::AttentionMerge => "attention_merge",
            Kernel::ConvertF16 => "convert_f16",
            Kernel::Position => "position",
            Kernel::LinearFeatures => "linear_features",
            Kernel::LinearScan => "linear_scan",
            Kernel::LinearOutput => "linear_output",
            Kernel::LinearWeights => "linear_weights",
            Kernel::AdditiveScores => "additive_scores",
            Kernel::GemmCoop(CoopSize::Eight) => "gemm_coop8",
            Kernel::GemmCoop(CoopSize::Sixteen) => "gemm_coop16",
            Kernel::GemmCoopPacked(CoopSize::Eight) => "gemm_coop_packed8",
            Kernel::GemmCoopPacked(CoopSize::Sixteen) => "gemm_coop_packed16",
            Kernel::CoopPack => "coop_pack",
            Kernel::AttentionCoop(CoopSize::Eight) => "attention_coop8",
            Kernel::AttentionCoop(CoopSize::Sixteen) => "attention_coop16",
            Kernel::AttentionCoopPacked(CoopSize::Eight) => "attention_coop_packed8",
            Kernel::AttentionCoopPacked(CoopSize::Sixteen) => "attention_coop_packed16",
            Kernel::AttentionCoopShared(CoopSize::Eight) => "attention_coop_shared8",
            Kernel::AttentionCoopShared(CoopSize::Sixteen) => "attention_coop_shared16",
            Kernel::Projection => "projection",
            Kernel::CacheAppend => "cache_append",
            Kernel::GemmSkinny => "gemm_skinny",
        }
    }

    /// The file in `shaders/` that holds the kernel; for a generated kernel
    /// ([`Kernel::is_generated`]), the name its text goes by.
    pub fn file(self) -> &'static str {
        match self {
            Kernel::Gemm => "gemm.wgsl",
            Kernel::Softmax => "softmax.wgsl",
            Kernel::Mask => "mask.wgsl",
            Kernel::Concat => "concat.wgsl",
            Kernel::FmaPeak => "fma_peak.wgsl",
            Kernel::CopyPeak => "copy_peak.wgsl",
            Kernel::GemmSubgroup => "gemm_sg.wgsl",
            Kernel::AttentionFused => "attention_fused.wgsl",
            Kernel::AttentionScores => "attention_scores.wgsl",
            Kernel::AttentionSubgroup => "attention_sg.wgsl",
            Kernel::AttentionTiled => "attention_tiled.wgsl",
            Kernel::AttentionTiledWide => "attention_tiled_wide.wgsl",
            Kernel::AttentionTiledShuffle => "attention_tiled_shuffle.wgsl",
            Kernel::AttentionTiledChunked => "attention_tiled_chunked.wgsl",
            Kernel::AttentionDecode | Kernel::AttentionDecodeF16 => "attention_decode.wgsl",
            Kernel::AttentionDecodeStream | Kernel::AttentionDecodeStreamF16 => {
                "attention_decode_stream.wgsl"
            }
            Kernel::AttentionMerge => "attention_merge.wgsl",
            Kernel::ConvertF16 => "convert_f16.wgsl",
            Kernel::Position => "position.wgsl",
            Kernel::LinearFeatures => "linear_features.wgsl",
            Kernel::LinearScan => "linear_scan.wgsl",
            Kernel::LinearOutput => "linear_output.wgsl",
            Kernel::LinearWeights => "linear_weights.wgsl",
            Kernel::AdditiveScores => "additive_scores.wgsl",
            Kernel::GemmCoop(_) => "gemm_coop.wgsl",
            Kernel::GemmCoopPacked(_) => "gemm_coop_packed.wgsl",
            Kernel::CoopPack => "coop_pack.wgsl",
            Kernel::AttentionCoop(_) => "attention_coop.wgsl",
            Kernel::AttentionCoopPacked(_) => "attention_coop_packed.wgsl",
            Kernel::AttentionCoopShared(_) => "attention_coop_shared.wgsl",
            Kernel::Projection => "projection.wgsl",
            Kernel::CacheAppend => "cache_append.wgsl",
            Kernel::GemmSkinny => "gemm_skinny.wgsl",
        }
    }

    /// A fingerprint of every kernel's WGSL (FNV-1a, 64 bits, as 16 hex
    /// digits): what a tuning cache entry was measured on. Kernels that
    /// changed (another webattn version) give another fingerprint, so their
    /// old timings no longer choose tiles or paths.
    pub fn fingerprint() -> &'static str {
        static PRINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        PRINT.get_or_init(|| {
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            // Every kernel's source as compiled (variants too, such as f16
            // elements spliced in), but the ceilings', which only the bench runs.
            for kernel in Kernel::ALL {
                if matches!(kernel, Kernel::FmaPeak | Kernel::CopyPeak) {
                    continue;
                }
                for byte in kernel.source().bytes().chain([0]) {
                    hash ^= u64::from(byte);
                    hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
            format!("{hash:016x}")
        })
    }

    /// The WGSL source, with the fragments it includes
    /// (`// #include NAME.wgsl` lines, [`with_includes`]) spliced in.
    pub fn source(self) -> &'static str {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock, PoisonError};
        static EXPANDED: OnceLock<Mutex<HashMap<Kernel, &'static str>>> = OnceLock::new();
        let text = self.file_source();
        if !text.contains(INCLUDE) && self.slots().is_empty() {
            return text;
        }
        let mut expanded = EXPANDED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // One string per kernel for the life of the process (kernels are few).
        expanded
            .entry(self)
            .or_insert_with(|| Box::leak(with_slots(text, self.slots()).into_boxed_str()))
    }

    /// The fragments this kernel puts in its file's slots (`// #include
    /// SLOT` lines, [`SLOTS`]): its variant of a file that several kernels share.
    pub fn slots(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Kernel::AttentionDecode | Kernel::AttentionDecodeStream => {
                &[("ELEMENT", "element_f32.wgsl")]
            }
            Kernel::AttentionDecodeF16 | Kernel::AttentionDecodeStreamF16 => {
                &[("ELEMENT", "element_f16.wgsl")]
            }
            Kernel::GemmCoop(size)
            | Kernel::GemmCoopPacked(size)
            | Kernel::AttentionCoop(size)
            | Kernel::AttentionCoopPacked(size)
            | Kernel::AttentionCoopShared(size) => match size {
                CoopSize::Sixteen => &[("COOP", "coop16.wgsl")],
                CoopSize::Eight => &[("COOP", "coop8.wgsl")],
            },
            _ => &[],
        }
    }

    /// Whether a generator in `kernels/` writes the kernel's WGSL
    /// (its register loops unrolled), rather than a file in `shaders/`.
    pub fn is_generated(self) -> bool {
        matches!(self.origin(), Origin::Generated(_))
    }

    /// The kernel's text as written, before the fragments it includes and
    /// puts in its slots are spliced in: a generated kernel's is written the
    /// first time it is asked for and kept for the life of the process (one
    /// per kernel: the kernels a generator serves alike, such as the f32 and
    /// f16 decode kernels, each keep a copy, so no two can ever be mixed up).
    fn file_source(self) -> &'static str {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock, PoisonError};
        static MADE: OnceLock<Mutex<HashMap<Kernel, &'static str>>> = OnceLock::new();
        match self.origin() {
            Origin::File(text) => text,
            Origin::Generated(generate) => MADE
                .get_or_init(Default::default)
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(self)
                .or_insert_with(|| Box::leak(generate().into_boxed_str())),
        }
    }

    /// Where the kernel's text comes from: a file in `shaders/`, or a
    /// generator in the kernel families (`crate::kernels`).
    fn origin(self) -> Origin {
        use crate::kernels::attention::coop::CoopForm;
        use crate::kernels::attention::subgroup as attention_sg;
        use crate::kernels::attention::tiled::generator as attention_tiled;
        use crate::kernels::attention::tiled::generator::TiledForm;
        use crate::kernels::decode::stream as attention_decode_stream;
        use crate::kernels::gemm::subgroup as gemm_sg;
        use crate::kernels::templates as coop;
        match self {
            Kernel::Gemm => Origin::File(include_str!("../../shaders/gemm.wgsl")),
            Kernel::Softmax => Origin::File(include_str!("../../shaders/softmax.wgsl")),
            Kernel::Mask => Origin::File(include_str!("../../shaders/mask.wgsl")),
            Kernel::Concat => Origin::File(include_str!("../../shaders/concat.wgsl")),
            Kernel::FmaPeak => Origin::File(include_str!("../../shaders/fma_peak.wgsl")),
            Kernel::CopyPeak => Origin::File(include_str!("../../shaders/copy_peak.wgsl")),
            Kernel::AttentionFused => {
                Origin::File(include_str!("../../shaders/attention_fused.wgsl"))
            }
            Kernel::AttentionScores => {
                Origin::File(include_str!("../../shaders/attention_scores.wgsl"))
            }
            Kernel::AttentionDecode | Kernel::AttentionDecodeF16 => {
                Origin::File(include_str!("../../shaders/attention_decode.wgsl"))
            }
            Kernel::AttentionMerge => {
                Origin::File(include_str!("../../shaders/attention_merge.wgsl"))
            }
            Kernel::ConvertF16 => Origin::File(include_str!("../../shaders/convert_f16.wgsl")),
            Kernel::Position => Origin::File(include_str!("../../shaders/position.wgsl")),
            Kernel::LinearFeatures => {
                Origin::File(include_str!("../../shaders/linear_features.wgsl"))
            }
            Kernel::LinearScan => Origin::File(include_str!("../../shaders/linear_scan.wgsl")),
            Kernel::LinearOutput => Origin::File(include_str!("../../shaders/linear_output.wgsl")),
            Kernel::LinearWeights => {
                Origin::File(include_str!("../../shaders/linear_weights.wgsl"))
            }
            Kernel::AdditiveScores => {
                Origin::File(include_str!("../../shaders/additive_scores.wgsl"))
            }
            Kernel::Projection => Origin::File(include_str!("../../shaders/projection.wgsl")),
            Kernel::CacheAppend => Origin::File(include_str!("../../shaders/cache_append.wgsl")),
            Kernel::GemmSkinny => Origin::File(include_str!("../../shaders/gemm_skinny.wgsl")),
            Kernel::CoopPack => Origin::File(include_str!("../../shaders/coop_pack.wgsl")),
            Kernel::GemmSubgroup => {
                Origin::Generated(|| gemm_sg::render(gemm_sg::ROWS, gemm_sg::GROUPS))
            }
            Kernel::AttentionSubgroup => Origin::Generated(attention_sg::render),
            Kernel::AttentionTiled => {
                Origin::Generated(|| attention_tiled::render(TiledForm::Plain))
            }
            Kernel::AttentionTiledWide => {
                Origin::Generated(|| attention_tiled::render(TiledForm::Wide))
            }
            Kernel::AttentionTiledShuffle => {
                Origin::Generated(|| attention_tiled::render(TiledForm::Shuffle))
            }
            Kernel::AttentionTiledChunked => {
                Origin::Generated(|| attention_tiled::render(TiledForm::Chunked))
            }
            Kernel::AttentionDecodeStream | Kernel::AttentionDecodeStreamF16 => {
                Origin::Generated(attention_decode_stream::render)
            }
            Kernel::GemmCoop(_) => Origin::Generated(|| coop::gemm_coop(false)),
            Kernel::GemmCoopPacked(_) => Origin::Generated(|| coop::gemm_coop(true)),
            Kernel::AttentionCoop(_) => {
                Origin::Generated(|| coop::attention_coop(CoopForm::Staged))
            }
            Kernel::AttentionCoopPacked(_) => {
                Origin::Generated(|| coop::attention_coop(CoopForm::Packed))
            }
            Kernel::AttentionCoopShared(_) => {
                Origin::Generated(|| coop::attention_coop(CoopForm::Shared))
            }
        }
    }

    /// Whether the kernel uses subgroup operations (chosen only on adapters
    /// that have them).
    pub fn uses_subgroups(self) -> bool {
        matches!(
            self,
            Kernel::GemmSubgroup
                | Kernel::AttentionSubgroup
                | Kernel::AttentionTiledShuffle
                | Kernel::AttentionDecodeStream
                | Kernel::AttentionDecodeStreamF16
        ) || self.uses_coop()
    }

    /// Whether the kernel's key loop is made for each call: it tests the
    /// `RULES` override (the per-score rules a call applies,
    /// `shaders/attention_rules.wgsl`) and includes `shaders/ablate.wgsl`
    /// (`ABLATE`, the phases a measurement removes). These are the hot
    /// kernels: register-tiled and matrix-unit fused, streaming decode.
    pub fn is_specialised_per_call(self) -> bool {
        matches!(
            self,
            Kernel::AttentionTiled
                | Kernel::AttentionTiledWide
                | Kernel::AttentionTiledShuffle
                | Kernel::AttentionTiledChunked
                | Kernel::AttentionCoop(_)
                | Kernel::AttentionCoopPacked(_)
                | Kernel::AttentionCoopShared(_)
                | Kernel::AttentionDecodeStream
                | Kernel::AttentionDecodeStreamF16
        )
    }

    /// Whether the kernel multiplies on the matrix units (wgpu's experimental
    /// cooperative matrices, native Vulkan and Metal only; chosen only on
    /// adapters that report a configuration it is written for).
    pub fn uses_coop(self) -> bool {
        matches!(
            self,
            Kernel::GemmCoop(_)
                | Kernel::GemmCoopPacked(_)
                | Kernel::AttentionCoop(_)
                | Kernel::AttentionCoopPacked(_)
                | Kernel::AttentionCoopShared(_)
        )
    }

    /// Whether the kernel runs only beside the matrix-unit kernels: those,
    /// and [`Kernel::CoopPack`], which packs their operands as f16 (so it
    /// needs shader-f16, which every adapter with matrix units has).
    pub fn runs_with_matrix_units(self) -> bool {
        self.uses_coop() || self == Kernel::CoopPack
    }

    /// The WGSL handed to the device. Browsers require `enable subgroups;`
    /// before subgroup builtins (and check their uniformity more strictly than
    /// these kernels need), while naga rejects the directive, so it is added on
    /// the web only.
    pub fn device_source(self) -> std::borrow::Cow<'static, str> {
        if cfg!(target_arch = "wasm32") && self.uses_subgroups() {
            format!(
                "enable subgroups;\ndiagnostic(off, subgroup_uniformity);\n{}",
                self.source()
            )
            .into()
        } else {
            self.source().into()
        }
    }

    /// The compute entry point.
    pub fn entry_point(self) -> &'static str {
        "main"
    }

    /// The bindings of group 0, in binding order.
    pub fn bindings(self) -> &'static [Binding] {
        use Binding::*;
        match self {
            Kernel::Gemm | Kernel::GemmSkinny => &[Uniform, Read, Read, ReadWrite],
            // A and B twice each: an f32 view and a vec4 view of one buffer.
            Kernel::GemmSubgroup => &[Uniform, Read, Read, Read, Read, ReadWrite],
            // Q, K, V, mask, nonpad; Y, lse.
            // (decode: partial O and (m, l) instead of Y and lse)
            Kernel::AttentionFused
            | Kernel::AttentionSubgroup
            | Kernel::AttentionTiled
            | Kernel::AttentionTiledWide
            | Kernel::AttentionTiledShuffle
            | Kernel::AttentionTiledChunked
            | Kernel::AttentionCoop(_)
            | Kernel::AttentionDecode
            | Kernel::AttentionDecodeF16
            | Kernel::AttentionDecodeStream
            | Kernel::AttentionDecodeStreamF16 => {
                &[Uniform, Read, Read, Read, Read, Read, ReadWrite, ReadWrite]
            }
            // The same, K and V packed; then V's tiles' flags.
            Kernel::AttentionCoopPacked(_) | Kernel::AttentionCoopShared(_) => &[
                Uniform, Read, Read, Read, Read, Read, ReadWrite, ReadWrite, Read,
            ],
            // Q, K, mask, nonpad; qk_matmul_output.
            Kernel::AttentionScores => &[Uniform, Read, Read, Read, Read, ReadWrite],
            Kernel::Softmax => &[Uniform, ReadWrite, ReadWrite],
            Kernel::Mask => &[Uniform, ReadWrite, Read, Read, ReadWrite],
            Kernel::Concat => &[Uniform, Read, Read, ReadWrite],
            // source words; destination words.
            Kernel::ConvertF16 => &[Uniform, Read, ReadWrite],
            Kernel::FmaPeak => &[Uniform, ReadWrite],
            // source; destination.
            Kernel::CopyPeak => &[Uniform, Read, ReadWrite],
            // partial O, partial (m, l); Y, lse.
            Kernel::AttentionMerge => &[Uniform, Read, Read, ReadWrite, ReadWrite],
            // x (in place); inverse frequencies.
            Kernel::Position => &[Uniform, ReadWrite, Read],
            // X; phi(X).
            Kernel::LinearFeatures => &[Uniform, Read, ReadWrite],
            // phi(Q), phi(K), V; state, Y, normalisers.
            Kernel::LinearScan => &[Uniform, Read, Read, Read, ReadWrite, ReadWrite, ReadWrite],
            // phi(Q), state; Y, normalisers.
            Kernel::LinearOutput => &[Uniform, Read, Read, ReadWrite, ReadWrite],
            // normalisers; scores in, weights out.
            Kernel::LinearWeights => &[Uniform, Read, ReadWrite],
            // A = S W1ᵀ, Bm = H W2ᵀ, v, lengths; scores.
            Kernel::AdditiveScores => &[Uniform, Read, Read, Read, Read, ReadWrite],
            // A and B twice each: an f32 view and a vec4 view of one buffer.
            Kernel::GemmCoop(_) => &[Uniform, Read, Read, Read, Read, ReadWrite],
            // x, weight words, bias; the three outputs.
            Kernel::Projection => &[Uniform, Read, Read, Read, ReadWrite, ReadWrite, ReadWrite],
            // new K, new V, inverse frequencies; K cache, V cache.
            Kernel::CacheAppend => &[Uniform, Read, Read, Read, ReadWrite, ReadWrite],
            // packed A, packed B; C.
            Kernel::GemmCoopPacked(_) => &[Uniform, Read, Read, ReadWrite],
            // an operand as stored; packed; the non-finite flags.
            Kernel::CoopPack => &[Uniform, Read, ReadWrite, ReadWrite],
        }
    }

    /// Whether every workgroup variable is written before it is read, so the
    /// zero-initialisation that WebGPU requires can be skipped natively.
    pub fn writes_workgroup_memory_first(self) -> bool {
        // gemm, softmax, the fused kernels and additive_scores fill every
        // workgroup slot before the barrier that precedes any read of it;
        // mask, concat, position and the linear attention kernels use no
        // workgroup memory.
        true
    }
}

/// Files in `shaders/` that are not kernels but blocks the registry puts into
/// kernels: `// #include NAME` lines ([`with_includes`]) and the slots of
/// [`Kernel::slots`].
pub const FRAGMENTS: [&str; 11] = [
    "ablate.wgsl",
    "gemm_params.wgsl",
    "element_f32.wgsl",
    "coop16.wgsl",
    "coop8.wgsl",
    "sincos.wgsl",
    "element_f16.wgsl",
    "attention_qkv4.wgsl",
    "attention_rules.wgsl",
    "attention_call.wgsl",
    "attention_decode_call.wgsl",
];

/// The line that includes a fragment: `// #include NAME.wgsl`.
const INCLUDE: &str = "// #include ";

/// The fragments a kernel can include, with their text.
const INCLUDABLE: [(&str, &str); 11] = [
    ("ablate.wgsl", include_str!("../../shaders/ablate.wgsl")),
    (
        "element_f32.wgsl",
        include_str!("../../shaders/element_f32.wgsl"),
    ),
    (
        "element_f16.wgsl",
        include_str!("../../shaders/element_f16.wgsl"),
    ),
    ("coop16.wgsl", include_str!("../../shaders/coop16.wgsl")),
    ("coop8.wgsl", include_str!("../../shaders/coop8.wgsl")),
    (
        "gemm_params.wgsl",
        include_str!("../../shaders/gemm_params.wgsl"),
    ),
    ("sincos.wgsl", include_str!("../../shaders/sincos.wgsl")),
    (
        "attention_qkv4.wgsl",
        include_str!("../../shaders/attention_qkv4.wgsl"),
    ),
    (
        "attention_rules.wgsl",
        include_str!("../../shaders/attention_rules.wgsl"),
    ),
    (
        "attention_call.wgsl",
        include_str!("../../shaders/attention_call.wgsl"),
    ),
    (
        "attention_decode_call.wgsl",
        include_str!("../../shaders/attention_decode_call.wgsl"),
    ),
];

/// The slots a kernel file may leave open (`// #include SLOT`), each with
/// the fragments that fill it, the first by default: how one file makes
/// several kernels (f32 or f16 K and V; 16 x 16 or 8 x 8 matrices).
pub const SLOTS: [(&str, &[&str]); 2] = [
    ("ELEMENT", &["element_f32.wgsl", "element_f16.wgsl"]),
    ("COOP", &["coop16.wgsl", "coop8.wgsl"]),
];

/// Whether `file` is a fragment that fills a slot ([`SLOTS`]), valid only
/// inside the kernels that put it there (it may need their `enable` lines).
pub fn fills_a_slot(file: &str) -> bool {
    SLOTS.iter().any(|(_, fills)| fills.contains(&file))
}

/// `source` with each `// #include NAME.wgsl` line replaced by that
/// fragment's text (its own includes spliced in too), and each slot
/// (`// #include SLOT`) by its first fragment: WGSL has no includes, so the
/// attention kernels' shared uniforms, constants and rules live in one file
/// each. Error lines naga reports count in the expanded text.
///
/// # Panics
/// On an unknown fragment or slot name: a fault in a shader file, which the
/// shader tests expand for every file.
pub fn with_includes(source: &str) -> String {
    with_slots(source, &[])
}

/// [`with_includes`], each slot filled by the fragment `slots` names for it
/// (the first of [`SLOTS`] where it names none): the one way the registry
/// makes a kernel's variants of a file.
///
/// # Panics
/// As [`with_includes`].
pub fn with_slots(source: &str, slots: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(source.len() + 4096);
    for line in source.split_inclusive('\n') {
        let Some(name) = line.trim_end().strip_prefix(INCLUDE) else {
            out.push_str(line);
            continue;
        };
        let file = match SLOTS.iter().find(|(slot, _)| *slot == name) {
            Some((slot, fills)) => slots
                .iter()
                .find(|(s, _)| s == slot)
                .map_or(fills[0], |(_, fill)| *fill),
            None => name,
        };
        let Some((_, text)) = INCLUDABLE.iter().find(|(f, _)| *f == file) else {
            panic!("`{INCLUDE}{name}`: no such fragment or slot (registry INCLUDABLE, SLOTS)");
        };
        out.push_str(&format!("// {file}: begin\n"));
        out.push_str(&with_slots(text, slots));
        out.push_str(&format!("// {file}: end\n"));
    }
    out
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses and validates a kernel with naga, as wgpu would, without a GPU.
#[cfg(not(target_arch = "wasm32"))]
pub fn validate_kernel(kernel: Kernel) -> Result<naga::Module> {
    validate_wgsl(kernel.name(), kernel.source())
}

/// Parses and validates WGSL text with naga; the error quotes the offending line.
#[cfg(not(target_arch = "wasm32"))]
pub fn validate_wgsl(name: &str, source: &str) -> Result<naga::Module> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| Error::Shader {
        kernel: name.to_string(),
        message: e.emit_to_string(source),
    })?;
    // Subgroup operations are validated too; a kernel that uses them is only
    // chosen on adapters that report the feature.
    // So is unpack2x16float (the f16 decode kernel), which the engine uses
    // only where the adapter has it.
    // So are f16 and cooperative matrices (the matrix-unit kernels), chosen
    // only where the device has them.
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::SUBGROUP
            | naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32
            | naga::valid::Capabilities::SHADER_FLOAT16
            | naga::valid::Capabilities::COOPERATIVE_MATRIX,
    );
    validator.subgroup_stages(naga::valid::ShaderStages::COMPUTE);
    validator.subgroup_operations(naga::valid::SubgroupOperationSet::all());
    validator.validate(&module).map_err(|e| Error::Shader {
        kernel: name.to_string(),
        message: e.emit_to_string(source),
    })?;
    Ok(module)
}
