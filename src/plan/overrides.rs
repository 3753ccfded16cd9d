//! The kernel choices as plain data: which GEMM kernel and which fused
//! attention kernel, as an engine is told or the planner decides. The planner
//! (`plan/planner.rs`) turns them, with the capabilities and the tuning table,
//! into kernels and tiles; the context only holds them.

use crate::device::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::kernels::decode;
use crate::kernels::gemm::{FastGemm, GemmKernel};

/// Which fused kernel an engine uses: chosen from the adapter's capabilities,
/// or forced by name (`webattn check --kernel attention_fused`), so that every
/// fused kernel can be run and checked on any adapter that can run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FusedKernelChoice {
    /// The capability profile decides (the tuning table where it measured
    /// this adapter; else the register-tiled kernel on GPUs, the portable one
    /// where none of its tiles fits; on CPU adapters subgroup shuffles where
    /// subgroups are fixed, else the portable kernel).
    #[default]
    Auto,
    /// `attention_fused`: the portable kernel, on any adapter.
    Portable,
    /// `attention_sg`: the subgroup-shuffle kernel (CPU adapters with fixed
    /// subgroups of 4 or 8; head dims multiples of 4).
    Subgroup,
    /// `attention_tiled`: the register-tiled kernel, on any adapter whose
    /// workgroup memory holds one of its tiles at the problem's head dims.
    Tiled,
    /// `attention_tiled_shuffle`: the register-tiled kernel whose row maxima
    /// and probabilities move by subgroup shuffles, on adapters whose
    /// subgroups hold a row of its invocations (8 lanes or more); head dims
    /// none of its tiles fits run what `Tiled` runs.
    TiledShuffle,
    /// `attention_tiled_chunked`: the register-tiled kernel with its Q, K
    /// and V tiles in chunks of columns; head dims none of its tiles fits run
    /// what `Tiled` runs.
    TiledChunked,
    /// `attention_coop`: the matrix-unit kernel, for calls that allow f16
    /// products (`Precision::Fast`) on adapters with matrix units; calls at
    /// `Precision::Highest` run what `Auto` picks. K and V are packed as
    /// f16 ahead of it where they fit one binding, else staged.
    Coop,
    /// `attention_coop_staged`: the matrix-unit kernel with K and V staged
    /// tile by tile through workgroup memory (no packing pass), as `Coop`
    /// runs where its packed K and V do not fit; for comparing the forms.
    CoopStaged,
    /// `attention_coop_shared`: the matrix-unit kernel from packed K and V,
    /// each tile copied once into workgroup memory and shared by the
    /// workgroup's subgroups (FlashAttention-2's way), where its packed K
    /// and V fit one binding (else staged) and a shared tile fits the
    /// adapter (else the f32 kernels); for the tuner and for comparing the
    /// forms.
    CoopShared,
}

impl FusedKernelChoice {
    /// Whether this names the matrix-unit kernel (any form).
    pub fn is_coop(self) -> bool {
        matches!(
            self,
            FusedKernelChoice::Coop | FusedKernelChoice::CoopStaged | FusedKernelChoice::CoopShared
        )
    }

    /// The matrix-unit kernel's form this forces, if any (`Coop` takes the
    /// tuned or default one).
    pub fn coop_form(self) -> Option<crate::kernels::attention::coop::CoopForm> {
        use crate::kernels::attention::coop::CoopForm;
        match self {
            FusedKernelChoice::CoopStaged => Some(CoopForm::Staged),
            FusedKernelChoice::CoopShared => Some(CoopForm::Shared),
            _ => None,
        }
    }

    /// Every choice, `Auto` first.
    pub const ALL: [FusedKernelChoice; 9] = [
        FusedKernelChoice::Auto,
        FusedKernelChoice::Portable,
        FusedKernelChoice::Subgroup,
        FusedKernelChoice::Tiled,
        FusedKernelChoice::TiledShuffle,
        FusedKernelChoice::TiledChunked,
        FusedKernelChoice::Coop,
        FusedKernelChoice::CoopStaged,
        FusedKernelChoice::CoopShared,
    ];

    /// The names `--kernel` takes, as `webattn info` lists the kernels.
    pub const NAMES: [&'static str; 9] = {
        let mut names = [""; 9];
        let mut i = 0;
        while i < 9 {
            names[i] = FusedKernelChoice::ALL[i].name();
            i += 1;
        }
        names
    };

    /// The kernel's name (the attention family's, `auto` for `Auto`).
    pub const fn name(self) -> &'static str {
        use crate::kernels::attention::names;
        match self {
            FusedKernelChoice::Auto => "auto",
            FusedKernelChoice::Portable => names::PORTABLE,
            FusedKernelChoice::Subgroup => names::SUBGROUP,
            FusedKernelChoice::Tiled => names::TILED,
            FusedKernelChoice::TiledShuffle => names::TILED_SHUFFLE,
            FusedKernelChoice::TiledChunked => names::TILED_CHUNKED,
            FusedKernelChoice::Coop => names::COOP,
            FusedKernelChoice::CoopStaged => names::COOP_STAGED,
            FusedKernelChoice::CoopShared => names::COOP_SHARED,
        }
    }
}

impl std::str::FromStr for FusedKernelChoice {
    type Err = Error;

    fn from_str(text: &str) -> Result<FusedKernelChoice> {
        match FusedKernelChoice::ALL.into_iter().find(|c| c.name() == text) {
            Some(choice) => Ok(choice),
            None => Err(Error::InvalidOption {
                name: "kernel",
                value: text.to_string(),
                reason: "must be auto, attention_fused, attention_sg, attention_tiled, attention_tiled_shuffle, attention_tiled_chunked, attention_coop, attention_coop_staged or attention_coop_shared (the fused kernels `webattn info` lists)",
            }),
        }
    }
}

impl std::fmt::Display for FusedKernelChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which decode kernel runs calls of a few query rows over many keys (Nq up
/// to 16, 512 keys or more): chosen from the adapter's capabilities, or
/// forced by name (`webattn check --decode-kernel attention_decode_stream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodeKernelChoice {
    /// The tuning table's winner where it measured this adapter; else the
    /// streaming kernel on GPUs with subgroups wherever its shape fits, the
    /// staged kernel elsewhere.
    #[default]
    Auto,
    /// `attention_decode`: K staged through workgroup memory; any adapter.
    Staged,
    /// `attention_decode_stream`: teams of subgroup lanes stream K and V with
    /// no barrier in the key loop; adapters with subgroups of 4 lanes or
    /// more, where its registers hold the call's rows (else the staged
    /// kernel runs the call).
    Stream,
}

impl DecodeKernelChoice {
    /// The names `--decode-kernel` takes.
    pub const NAMES: [&'static str; 3] = ["auto", decode::names::STAGED, decode::names::STREAM];

    /// The kernel's name.
    pub fn name(self) -> &'static str {
        match self {
            DecodeKernelChoice::Auto => "auto",
            DecodeKernelChoice::Staged => decode::names::STAGED,
            DecodeKernelChoice::Stream => decode::names::STREAM,
        }
    }
}

impl std::str::FromStr for DecodeKernelChoice {
    type Err = Error;

    fn from_str(text: &str) -> Result<DecodeKernelChoice> {
        match text {
            "auto" => Ok(DecodeKernelChoice::Auto),
            n if n == decode::names::STAGED => Ok(DecodeKernelChoice::Staged),
            n if n == decode::names::STREAM => Ok(DecodeKernelChoice::Stream),
            _ => Err(Error::InvalidOption {
                name: "decode kernel",
                value: text.to_string(),
                reason: "must be auto, attention_decode or attention_decode_stream",
            }),
        }
    }
}

impl std::fmt::Display for DecodeKernelChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything an engine is told to run in place of what the planner would
/// pick, as one value: forced kernels (`webattn check --kernel`), the
/// candidates the tuner pins while it times them, and the phases a
/// measurement removes. The planner reads it beside the capabilities and
/// the tuning table; the default overrides nothing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Overrides {
    /// The GEMM kernel every product records (portable kernels, a subgroup width).
    pub gemm: Option<GemmKernel>,
    /// Whether only the kernels that need no subgroups run
    /// ([`Overrides::use_portable_kernels`]).
    pub portable: bool,
    /// The fused kernel forced by name, or `Auto`.
    pub fused: FusedKernelChoice,
    /// The decode kernel forced by name, or `Auto`.
    pub decode: DecodeKernelChoice,
    /// The width the subgroup kernels are compiled for, below the adapter's own.
    pub subgroup_width: Option<u32>,
    /// A fused kernel every call runs (the tuner times each candidate this way).
    pub pinned_fused: Option<crate::tuning::TunedKernel>,
    /// A decode kernel every decode call runs where it can.
    pub pinned_decode: Option<crate::kernels::decode::DecodeKernel>,
    /// Tiles of the matrix-unit kernel that calls at `Fast` take where they fit.
    pub pinned_coop: Option<crate::tuning::TunedCoop>,
    /// A form of the matrix-unit GEMM that calls at `Fast` take where it runs.
    pub pinned_fast_gemm: Option<FastGemm>,
    /// Invocations per row in the matrix-unit kernel's scalar steps, where a
    /// test asks for other than its tiles' default.
    pub coop_lanes_per_row: Option<u32>,
    /// Phases of the key loop the fused and decode kernels run without
    /// (`webattn phases`; none otherwise).
    pub removed_phases: crate::kernels::ablation::Phases,
}

impl Overrides {
    /// Forces the fused kernel `choice` (`Auto` forces nothing). Refused
    /// where `caps`'s adapter cannot run it: the subgroup kernel without
    /// fixed CPU subgroups, the tiled kernel's shuffle form where subgroups
    /// are narrower than a row of its invocations, the matrix-unit kernel
    /// without matrix units.
    pub fn force_fused(&mut self, choice: FusedKernelChoice, caps: &Capabilities) -> Result<()> {
        let refuse = |reason| {
            Err(Error::InvalidOption {
                name: "kernel",
                value: choice.name().to_string(),
                reason,
            })
        };
        if choice == FusedKernelChoice::Subgroup && caps.fixed_cpu_subgroup().is_none() {
            return refuse(
                "needs an adapter with fixed subgroups of 4 or 8 (a CPU adapter such as \
                 lavapipe or SwiftShader); this one has none: use attention_fused or auto",
            );
        }
        if choice == FusedKernelChoice::TiledShuffle
            && !(caps.subgroups
                && caps.subgroup_min_size >= crate::kernels::attention::tiled::SHUFFLE_MIN_TK)
        {
            return refuse(
                "needs subgroups of at least 8 lanes, which hold a row of its invocations \
                 (`webattn info` lists this adapter's); use attention_tiled or auto",
            );
        }
        if choice.is_coop() && caps.f16_matrix_units().is_none() {
            return refuse(
                "needs matrix units: an adapter offering cooperative matrices of 8 or 16 \
                 with f16 inputs and f32 accumulators, and subgroups of one width \
                 (`webattn info` lists what this one has); use auto or attention_tiled",
            );
        }
        if choice != FusedKernelChoice::Auto {
            self.fused = choice;
        }
        Ok(())
    }

    /// Forces the decode kernel `choice` (`Auto` forces nothing). The
    /// streaming kernel is refused where the adapter has no subgroups of 4
    /// lanes or more, or the portable kernels were asked for; where it runs,
    /// calls whose rows its registers cannot hold run the staged kernel.
    pub fn force_decode(&mut self, choice: DecodeKernelChoice, caps: &Capabilities) -> Result<()> {
        if choice == DecodeKernelChoice::Stream
            && (!caps.stream_decode_subgroups() || self.portable)
        {
            return Err(Error::InvalidOption {
                name: "decode kernel",
                value: choice.name().to_string(),
                reason: "needs subgroups of 4 lanes or more (this adapter reports none, or \
                         narrower ones, or portable kernels were asked for): use \
                         attention_decode or auto",
            });
        }
        if choice != DecodeKernelChoice::Auto {
            self.decode = choice;
        }
        Ok(())
    }

    /// The kernels that need no subgroups (tiled GEMM and, for products of
    /// up to 16 rows, the skinny one; portable fused attention; staged
    /// decode), as an adapter without subgroups (GL, some browsers) runs
    /// them: for testing and measuring those kernels anywhere.
    pub fn use_portable_kernels(&mut self) {
        self.portable = true;
        self.gemm = Some(GemmKernel::Tiled);
        self.fused = FusedKernelChoice::Portable;
        self.decode = DecodeKernelChoice::Staged;
    }

    /// The subgroup kernels compiled for subgroups of `width` (4 or 8)
    /// instead of the adapter's own width: a workgroup of 4 on an 8-wide
    /// adapter is a partly filled subgroup, which lets one machine test the
    /// width browsers' CPU adapters (SwiftShader) use. Refused where the
    /// adapter has no fixed CPU subgroups or `width` is not 4 or 8.
    pub fn force_subgroup_width(&mut self, width: u32, caps: &Capabilities) -> Result<()> {
        let own = caps.fixed_cpu_subgroup();
        if own.is_none() || !matches!(width, 4 | 8) || own.is_some_and(|w| width > w) {
            return Err(Error::InvalidOption {
                name: "subgroup width",
                value: width.to_string(),
                reason: "must be 4 or 8, at most the adapter's fixed CPU subgroup width",
            });
        }
        self.gemm = Some(GemmKernel::Subgroup { width });
        self.subgroup_width = Some(width);
        Ok(())
    }
}
