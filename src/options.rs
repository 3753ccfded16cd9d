//! The attention options and the contract they implement.

use crate::error::{Error, Result};

/// Which tensor the `qk_matmul_output` output holds (ONNX `qk_matmul_output_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QkMatmulOutputMode {
    /// Mode 0: the scaled scores `scale · Q Kᵀ`, before softcap, mask or bias.
    Scaled = 0,
    /// Mode 1: the scores after softcap (equal to mode 0 when softcap is off).
    Softcapped = 1,
    /// Mode 2: softcap plus the whole bias (mask, causal, window, padding, ALiBi),
    /// before the temperature;
    /// masked entries are `-inf`.
    Biased = 2,
    /// Mode 3: the softmax probabilities; fully masked rows are zero.
    Probabilities = 3,
}

impl KernelPath {
    /// The lowercase name (`auto`, `fused`, `unfused`, `cpu`, `oracle`), as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Auto => "auto",
            KernelPath::Fused => "fused",
            KernelPath::Unfused => "unfused",
            KernelPath::Cpu => "cpu",
            KernelPath::Oracle => "oracle",
        }
    }
}

impl std::fmt::Display for KernelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl QkMatmulOutputMode {
    /// The mode for its ONNX number, or an error for anything but 0 to 3.
    pub fn from_onnx(mode: i64) -> Result<Self> {
        match mode {
            0 => Ok(Self::Scaled),
            1 => Ok(Self::Softcapped),
            2 => Ok(Self::Biased),
            3 => Ok(Self::Probabilities),
            _ => Err(Error::InvalidOption {
                name: "qk_matmul_output_mode",
                value: mode.to_string(),
                reason:
                    "must be 0 (scaled QKᵀ), 1 (softcapped), 2 (with bias) or 3 (probabilities)",
            }),
        }
    }
}

/// How exact the products of a GPU call must be.
///
/// The default, [`Precision::Highest`], computes every product in f32, as the
/// contract describes. [`Precision::Fast`] lets the engine multiply on the
/// adapter's matrix units (tensor cores, through wgpu's cooperative matrices)
/// where it has them: Q and K, and the probabilities P and V, are rounded to
/// f16 for their products, which are accumulated in f32; the softmax, the
/// masks and every other step stay f32. Values beyond ±65504 become infinite
/// there, as in an f16 model. Where the adapter has no matrix units the
/// kernels run on (every browser, GL, lavapipe before Mesa 26, and adapters
/// whose subgroup width varies: AMD and Intel through Vulkan, Apple through
/// Metal as wgpu reports it) `Fast` runs the f32 kernels, so it never loses
/// anything but allows the speed. The CPU paths ignore it.
///
/// Checked with the f16 rule: the error against the f64 oracle on the
/// f16-rounded inputs is at most twice a plain f32 computation's on them,
/// plus the rounding of the probabilities (2⁻¹¹ of the largest `|V|` in Y).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Precision {
    /// Every product in f32 (the default).
    #[default]
    Highest,
    /// f16 products with f32 accumulation where the adapter has matrix units.
    Fast,
}

impl Precision {
    /// The lowercase name (`highest`, `fast`), as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Highest => "highest",
            Precision::Fast => "fast",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;

    fn from_str(text: &str) -> Result<Precision> {
        match text {
            "highest" => Ok(Precision::Highest),
            "fast" => Ok(Precision::Fast),
            _ => Err(Error::InvalidOption {
                name: "precision",
                value: text.to_string(),
                reason: "must be highest (f32 products) or fast (f16 products on the matrix units where the adapter has them)",
            }),
        }
    }
}

/// Whether an engine's device uses the adapter's matrix units (wgpu's
/// experimental cooperative-matrix feature, native only), which calls with
/// [`Precision::Fast`] multiply on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MatrixUnits {
    /// Request the feature where the adapter offers it and use the
    /// configurations it lists (the default).
    #[default]
    Auto,
    /// Never request the experimental feature: the device is created
    /// without it, and `Fast` calls run the f32 kernels.
    Off,
    /// A testing aid for CPU adapters: on one that lists 8×8×8 f16 → f32
    /// matrices (Mesa 26's lavapipe), also list 16×16×16 f16 → f32, which it
    /// executes though it does not report it, so that the 16×16 kernels that
    /// GPUs get run against the oracle on a machine without a GPU. Any other
    /// adapter refuses it with [`Error::InvalidOption`].
    Emulated16,
    /// As `Auto`, but on Vulkan the matrix-unit kernels reach the driver as
    /// wgpu's own translation of their WGSL rather than the engine's SPIR-V
    /// (`device::spirv`), which adds the memory-model operands naga omits. A
    /// measuring aid: on an H200 a loop of matrix loads from workgroup memory
    /// ran 2.7 times faster this way, but only the engine's SPIR-V has passed
    /// the full sweep there.
    NagaSpirv,
}

impl MatrixUnits {
    /// The name the CLI spells (`auto`, `off`, `emulated16`, `naga-spirv`).
    pub fn name(self) -> &'static str {
        match self {
            MatrixUnits::Auto => "auto",
            MatrixUnits::Off => "off",
            MatrixUnits::Emulated16 => "emulated16",
            MatrixUnits::NagaSpirv => "naga-spirv",
        }
    }
}

impl std::fmt::Display for MatrixUnits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for MatrixUnits {
    type Err = Error;

    fn from_str(text: &str) -> Result<MatrixUnits> {
        match text {
            "auto" => Ok(MatrixUnits::Auto),
            "off" => Ok(MatrixUnits::Off),
            "emulated16" => Ok(MatrixUnits::Emulated16),
            "naga-spirv" => Ok(MatrixUnits::NagaSpirv),
            _ => Err(Error::InvalidOption {
                name: "matrix_units",
                value: text.to_string(),
                reason: "must be auto (where the adapter offers them), off (never request wgpu's experimental feature), emulated16 (a testing aid for CPU adapters) or naga-spirv (auto, with wgpu's SPIR-V for the matrix-unit kernels: a measuring aid)",
            }),
        }
    }
}

/// Whether the kernels keep the runtime checks naga adds when it translates
/// them: index clamps on every array access the driver does not bound itself,
/// and a counter in every loop that stops it after 2^64 iterations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum RuntimeChecks {
    /// Keep them (the default; what WebGPU requires, and what a browser does
    /// whatever this says).
    #[default]
    On,
    /// Keep the index clamps and leave out the loop counters, natively
    /// (`wgpu::Device::create_shader_module_trusted`). A measuring aid:
    /// memory stays as safe as with `On` (every array index is clamped as
    /// before, storage buffers keep what `On` gives them); the counters guard
    /// against a loop that never ends, which some compilers take as undefined
    /// behaviour, and every loop of the engine's kernels ends (its bound is a
    /// uniform or an override constant, its counter only grows). The counters
    /// cost the most of the two in the fused kernel's key loop (RADV counts
    /// 1500 instructions in it with both, 1118 without the counters, 864
    /// without either: BENCHMARKS.md). `webattn tune` records its times under
    /// a key of their own.
    Bounds,
    /// Compile the kernels without index clamps and loop counters, natively
    /// (`wgpu::Device::create_shader_module_trusted`). A measuring aid: the
    /// kernels' indices were audited and the sweep passes this way on
    /// lavapipe, but an index fault would be undefined behaviour on the device
    /// rather than a clamped read, and on Metal storage buffers lose their
    /// bounds checks too (Vulkan and D3D12 keep the driver's robust buffer
    /// access). Integer division keeps its checks. The matrix-unit kernels on
    /// Vulkan, which reach the driver as the engine's own SPIR-V, are written
    /// without the checks too. `webattn tune` records its times under a key
    /// of their own (the tuning cache's `runtime_checks` column).
    Off,
}

impl RuntimeChecks {
    /// The name the CLI spells (`on`, `bounds`, `off`).
    pub fn name(self) -> &'static str {
        match self {
            RuntimeChecks::On => "on",
            RuntimeChecks::Bounds => "bounds",
            RuntimeChecks::Off => "off",
        }
    }

    /// Whether array indices are clamped (`On`, `Bounds`).
    pub fn bounds_checks(self) -> bool {
        self != RuntimeChecks::Off
    }

    /// Whether every loop carries naga's counter (`On` only).
    pub fn loop_bounding(self) -> bool {
        self == RuntimeChecks::On
    }
}

impl std::fmt::Display for RuntimeChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for RuntimeChecks {
    type Err = Error;

    fn from_str(text: &str) -> Result<RuntimeChecks> {
        match text {
            "on" => Ok(RuntimeChecks::On),
            "bounds" => Ok(RuntimeChecks::Bounds),
            "off" => Ok(RuntimeChecks::Off),
            _ => Err(Error::InvalidOption {
                name: "runtime_checks",
                value: text.to_string(),
                reason: "must be on (naga's index clamps and loop counters, the default), bounds (the clamps without the counters) or off (compiled without either); bounds and off are measuring aids",
            }),
        }
    }
}

/// Which implementation runs the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum KernelPath {
    /// The engine chooses: the fused GPU path unless the sizes rule it out (the
    /// reason is logged and kept in [`crate::Engine::last_call`]); the fast CPU
    /// backend on a CPU engine.
    #[default]
    Auto,
    /// The fused GPU path: one FlashAttention-style kernel, O(N) memory.
    Fused,
    /// The unfused GPU path: QKᵀ GEMM, mask, softmax, PV GEMM.
    Unfused,
    /// The fast CPU backend (f32, blocked and vectorised, threaded), whatever
    /// the engine's backend.
    Cpu,
    /// The f64 CPU oracle, whatever the engine's backend: the reference every
    /// other path is checked against, slow by design.
    Oracle,
}

/// Options of one attention call: the attributes of the ONNX `Attention`
/// operator (opsets 23 to 25) plus which outputs to produce.
///
/// # The contract
///
/// Shapes (4D form): Q `[B, Hq, Nq, Dk]`, K `[B, Hkv, Nk, Dk]`, V `[B, Hkv, Nk, Dv]`,
/// all `f32`, row-major. `past_key` `[B, Hkv, P, Dk]` and `past_value` `[B, Hkv, P, Dv]`
/// are prepended to K and V along the sequence axis, so the keys number `T = P + Nk`.
/// Outputs: Y `[B, Hq, Nq, Dv]`; on request `present_key` `[B, Hkv, T, Dk]`,
/// `present_value` `[B, Hkv, T, Dv]`, `qk_matmul_output` `[B, Hq, Nq, T]` and the row
/// logsumexp `[B, Hq, Nq]`.
///
/// For each batch `b`, query head `h` and query row `i`:
///
/// 1. **GQA.** `Hq` must be a multiple of `Hkv`; query head `h` reads KV head
///    `h / (Hq / Hkv)` (heads are repeated interleaved, as ONNX does, not `h % Hkv`).
///    `Dk` and `Dv` may differ, and so may `Nq` and `Nk`.
/// 2. **Scores.** `s_j = scale · (q_i · k_j)`, with `scale` defaulting to `1/√Dk`.
///    ONNX multiplies Q and K by `√scale` each; we apply `scale` once to the dot
///    product, which is the same number up to f32 rounding.
/// 3. **Softcap.** If `softcap > 0`, `s_j = softcap · tanh(s_j / softcap)`, before any
///    mask or bias, so masked keys stay masked. `0` turns it off.
/// 4. **Bias.** The bias is the sum of:
///    - `attn_mask`: bool (`true` = attend, `false` = `-inf`) or float (added as is;
///      `-inf` and `-f32::MAX` mask the key). It broadcasts right-aligned, numpy-style, to
///      `[B, Hq, Nq, T]`: rank 1 is `[T]`, rank 2 `[Nq, T]`, rank 3 `[Hq, Nq, T]` (not
///      `[B, Nq, T]`). A last dimension shorter than `T` is padded as masked; it is never
///      broadcast.
///    - causal (`is_causal`): key `j` is allowed iff `j ≤ i + offset`, where `offset` is
///      `P` when a past is given, else `nonpad_kv_seqlen[b] − Nq` when lengths are given,
///      else 0. Without a cache the alignment is therefore top-left (query 0 sees key 0
///      only), and a negative offset leaves the leading rows fully masked.
///    - windows: with `p = offset + i`, key `j` is allowed iff `j ≥ p − left_window_size`
///      (when `left_window_size ≥ 0`) and `j ≤ p + right_window_size` (when
///      `right_window_size ≥ 0`). `-1` leaves a side unbounded. The window uses the causal
///      offset even when `is_causal` is off.
///    - padding: keys `j ≥ nonpad_kv_seqlen[b]` are masked. Lengths must lie in `0..=T`
///      and cannot be combined with a past.
///    - ALiBi (`alibi`, an extension beyond ONNX): `-m_h · |p − j|` with `p = offset + i`
///      and the per-query-head slope `m_h` of [`alibi_slopes`]; for causal rows this is
///      the paper's `-m_h · (p − j)`. Computed inside the kernels, never materialised.
/// 5. **Softmax** over `j` of `(s_j + bias_j) / temperature`, with the row maximum
///    subtracted. Masked keys take no part, even when their score is not finite.
///    The temperature (an extension beyond ONNX, default 1) is distinct from `scale`:
///    it acts after softcap and bias, so it sharpens (`< 1`) or flattens (`> 1`) the
///    distribution without moving the softcap's saturation point or the mask. Every
///    backend takes the row maximum out before it divides, `exp((s_j + bias_j − max)
///    / temperature)`, with a logsumexp of `max / temperature + ln Σ`: a finite biased
///    score near `f32::MAX` under a temperature below 1 takes the row's weight rather
///    than making the row NaN (its logsumexp may round to `+inf`).
/// 6. **Fully masked rows.** A row whose every key is masked has all-zero probabilities,
///    a zero Y row, a zero mode-3 row and a logsumexp of `-inf`: never NaN.
/// 7. **Output.** `y_i = Σ_j p_j v_j` over the keys the row attends.
/// 8. **Non-finite values** propagate where a row attends them, as in PyTorch's
///    `scaled_dot_product_attention`, and are ignored where it does not (a key
///    the mask, causality, windows or padding exclude takes no part, whatever Q,
///    K, V or the score hold there). Over the attended keys' biased scores:
///    - a NaN or `+inf` score, or scores that are all `-inf`, make the row NaN:
///      its Y row, logsumexp and mode-3 row;
///    - an attended key whose score is `-inf` gets probability 0 but still
///      multiplies its V row, so a NaN in V reaches that column of every row
///      that attends the key (and `±inf` in V makes it infinite, or NaN);
///    - a float mask entry masks its key only at `-inf` or `≤ -f32::MAX`; any
///      other value, NaN and `+inf` included, is added to the score.
///
///    Softcap maps `±inf` scores to `±softcap`, so they do not poison a row. An
///    attended key's probability is the f32 softmax as it is, `0` where it
///    underflows, and still multiplies V (`0 · inf` is NaN); inside the GPU
///    kernels a key not attended carries `-0` instead, the mark that keeps it
///    out of `P · V`, and the caller's mode-3 output shows `+0` for both.
///
/// The `qk_matmul_output` modes are described on [`QkMatmulOutputMode`]; with
/// `softcap > 0`, mode 0 is the raw scaled QKᵀ as the operator's text says (one Python
/// reference returns softcapped values there; we do not follow it).
///
/// Precision: the GPU and the fast CPU backend compute in f32 (f16 inputs are widened
/// for the arithmetic; [`Precision::Fast`] allows f16 products on the matrix units);
/// the CPU oracle accumulates in f64. `softmax_precision` is not an
/// option: the result is the f32 (GPU, fast CPU backend) or f64 (oracle) softmax
/// whatever it would say.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionOptions {
    /// The score scale; `None` means `1/√Dk`. Must be finite and positive.
    pub scale: Option<f32>,
    /// Softcap `c`: scores become `c·tanh(s/c)`. `0` (the default) turns it off.
    pub softcap: f32,
    /// Causal masking with the offset described above.
    pub is_causal: bool,
    /// Keys further than this many positions before the query are masked; `-1` = unbounded.
    pub left_window_size: i64,
    /// Keys further than this many positions after the query are masked; `-1` = unbounded.
    pub right_window_size: i64,
    /// Produce `qk_matmul_output` in this mode; `None` produces nothing.
    pub qk_matmul_output_mode: Option<QkMatmulOutputMode>,
    /// Produce the row logsumexp `[B, Hq, Nq]` (natural log; `-inf` for fully masked rows).
    pub return_lse: bool,
    /// Produce `present_key`/`present_value` (the past concatenated with K/V).
    pub return_present: bool,
    /// Softmax temperature τ: probabilities are `softmax((s + bias) / τ)`. Must be
    /// finite and positive; `1` (the default) is plain softmax. Modes 0-2 of
    /// `qk_matmul_output` are before it, mode 3 and the logsumexp after.
    pub temperature: f32,
    /// Add the ALiBi bias `-m_h · |p − j|` (see the contract above), with the
    /// slopes of [`alibi_slopes`] for the query heads.
    pub alibi: bool,
    /// Which implementation runs the call.
    pub path: KernelPath,
    /// How exact the products must be (f32 unless the caller allows f16
    /// products on the matrix units).
    pub precision: Precision,
}

/// The ALiBi slopes of `heads` heads (Press et al., 2022): for a power of two
/// `n`, the geometric sequence `2^(-8/n), 2^(-16/n), …, 2^(-8)`; otherwise the
/// `n'` slopes of the largest power of two `n' < heads`, followed by every other
/// slope of `2·n'` until there are `heads`.
pub fn alibi_slopes(heads: usize) -> Vec<f64> {
    let power_of_two = |n: usize| -> Vec<f64> {
        (1..=n)
            .map(|h| (2f64).powf(-8.0 * h as f64 / n as f64))
            .collect()
    };
    if heads == 0 {
        return Vec::new();
    }
    if heads.is_power_of_two() {
        return power_of_two(heads);
    }
    let base = 1usize << heads.ilog2();
    let mut slopes = power_of_two(base);
    slopes.extend(
        power_of_two(2 * base)
            .into_iter()
            .step_by(2)
            .take(heads - base),
    );
    slopes
}

impl Default for AttentionOptions {
    fn default() -> Self {
        Self {
            scale: None,
            softcap: 0.0,
            is_causal: false,
            left_window_size: -1,
            right_window_size: -1,
            qk_matmul_output_mode: None,
            return_lse: false,
            return_present: false,
            temperature: 1.0,
            alibi: false,
            path: KernelPath::Auto,
            precision: Precision::Highest,
        }
    }
}

impl AttentionOptions {
    /// Checks every option against its domain.
    pub fn validate(&self) -> Result<()> {
        if let Some(scale) = self.scale {
            if !(scale.is_finite() && scale > 0.0) {
                return Err(Error::InvalidOption {
                    name: "scale",
                    value: scale.to_string(),
                    reason: "must be finite and greater than 0 (leave it unset for 1/sqrt(Dk))",
                });
            }
        }
        if !(self.softcap.is_finite() && self.softcap >= 0.0) {
            return Err(Error::InvalidOption {
                name: "softcap",
                value: self.softcap.to_string(),
                reason: "must be finite and at least 0 (0 turns it off)",
            });
        }
        if !(self.temperature.is_finite()
            && self.temperature >= f32::MIN_POSITIVE
            && (1.0 / self.temperature).is_finite()
            && 1.0 / self.temperature >= f32::MIN_POSITIVE)
        {
            return Err(Error::InvalidOption {
                name: "temperature",
                value: self.temperature.to_string(),
                reason:
                    "must be a normal positive f32 whose inverse is normal too (1 is plain softmax)",
            });
        }
        for (name, value) in [
            ("left_window_size", self.left_window_size),
            ("right_window_size", self.right_window_size),
        ] {
            if value < -1 || value > i64::from(i32::MAX) {
                return Err(Error::InvalidOption {
                    name,
                    value: value.to_string(),
                    reason: "must be -1 (unbounded) or between 0 and 2^31-1",
                });
            }
        }
        Ok(())
    }

    /// The scale in effect for head size `dk`.
    pub fn effective_scale(&self, dk: usize) -> f32 {
        self.scale.unwrap_or_else(|| 1.0 / (dk as f32).sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_checks_read_their_names_and_refuse_others() {
        for checks in [RuntimeChecks::On, RuntimeChecks::Bounds, RuntimeChecks::Off] {
            assert_eq!(checks.name().parse::<RuntimeChecks>().unwrap(), checks);
        }
        assert!(RuntimeChecks::Bounds.bounds_checks() && !RuntimeChecks::Bounds.loop_bounding());
        assert!(RuntimeChecks::On.bounds_checks() && RuntimeChecks::On.loop_bounding());
        assert!(!RuntimeChecks::Off.bounds_checks() && !RuntimeChecks::Off.loop_bounding());
        assert_eq!(RuntimeChecks::default(), RuntimeChecks::On);
        assert!(matches!(
            "none".parse::<RuntimeChecks>(),
            Err(Error::InvalidOption {
                name: "runtime_checks",
                ..
            })
        ));
    }

    #[test]
    fn rejects_bad_options() {
        let bad = [
            AttentionOptions {
                scale: Some(0.0),
                ..Default::default()
            },
            AttentionOptions {
                scale: Some(f32::NAN),
                ..Default::default()
            },
            AttentionOptions {
                softcap: -1.0,
                ..Default::default()
            },
            AttentionOptions {
                temperature: 0.0,
                ..Default::default()
            },
            AttentionOptions {
                temperature: 1e-39,
                ..Default::default()
            },
            AttentionOptions {
                temperature: f32::INFINITY,
                ..Default::default()
            },
            // Its inverse is subnormal: a GPU that flushes it would divide by 0.
            AttentionOptions {
                temperature: 1e38,
                ..Default::default()
            },
            AttentionOptions {
                left_window_size: -2,
                ..Default::default()
            },
            AttentionOptions {
                right_window_size: i64::MAX,
                ..Default::default()
            },
        ];
        for opts in bad {
            assert!(
                matches!(opts.validate(), Err(Error::InvalidOption { .. })),
                "{opts:?}"
            );
        }
        assert!(AttentionOptions::default().validate().is_ok());
        assert!(QkMatmulOutputMode::from_onnx(4).is_err());
        let eight = alibi_slopes(8);
        assert_eq!(eight[0], 0.5);
        assert_eq!(eight[7], 1.0 / 256.0);
        // 12 heads: the 8 of n = 8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 from n = 16.
        let twelve = alibi_slopes(12);
        assert_eq!(twelve.len(), 12);
        assert_eq!(&twelve[..8], &eight[..]);
        assert!((twelve[8] - 2f64.powf(-0.5)).abs() < 1e-15);
        assert!((twelve[11] - 2f64.powf(-3.5)).abs() < 1e-15);
        assert_eq!(
            QkMatmulOutputMode::from_onnx(2).unwrap(),
            QkMatmulOutputMode::Biased
        );
    }
}
