//! Phases of a fused kernel's key loop that a measurement can remove, to
//! learn where its time goes (`webattn phases`).
//!
//! The register-tiled kernels, the matrix-unit kernel and the streaming
//! decode kernel take an override constant, `ABLATE` (`shaders/ablate.wgsl`),
//! whose bits remove one phase of the key loop each: K and V read from
//! memory, S = Q K^T (in decode, the dot products and their butterflies), the
//! softmax (the contract's rules, the maxima, P, the sums), O += P V. A call
//! planned by an engine made with [`crate::Engine::without_phases`] compiles its fused or decode
//! pipeline with those bits set; every other pipeline, and every call of an engine
//! without them, is the kernel as it always runs (the constant is 0
//! and its guards fold away). The barriers, the staging stores, Q's block and
//! the final writes stay, so removing all four phases times the loop's
//! skeleton (in decode, which stages nothing, little more than the loop).
//! Where a removed phase was the only reader of a value (the scores in the
//! tiled kernels without their softmax, K and V's registers in decode
//! without their products), a cheap stand-in reads it instead, so that a
//! compiler does not drop the phases before it as dead code; and zeros that
//! stand in for values are ones a compiler cannot see (`p.keys >> 31`) where
//! it could otherwise fold the arithmetic on them. **A call without a phase
//! computes garbage**: this is for timing only, and nothing in the engine
//! makes such an engine but the measurement.

use crate::device::pipeline::PipelineKey;
use crate::error::{Error, Result};
use crate::shader::kernel::Kernel;

/// A set of phases of a fused kernel's key loop (the bits of its `ABLATE`
/// override constant).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Phases(u32);

impl Phases {
    /// No phase: the kernel as calls run it.
    pub const NONE: Phases = Phases(0);
    /// K and V read from storage (zeros instead: staged as such by the fused
    /// kernels; in decode, zeros the compiler cannot fold).
    pub const KV_LOADS: Phases = Phases(1);
    /// The scores S = Q K^T.
    pub const SCORES: Phases = Phases(2);
    /// The rules (scale, softcap, masks, ALiBi, temperature, key ranges), the
    /// row maxima, the probabilities P and the row sums.
    pub const SOFTMAX: Phases = Phases(4);
    /// O += P V.
    pub const PRODUCT: Phases = Phases(8);
    /// Every phase above.
    pub const ALL: Phases = Phases(15);
    /// Each phase alone, in the order the key loop runs them.
    pub const EACH: [Phases; 4] = [
        Phases::KV_LOADS,
        Phases::SCORES,
        Phases::SOFTMAX,
        Phases::PRODUCT,
    ];

    /// The bits (the kernels' `ABLATE_*` constants).
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether no phase is in the set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The phases in words: `K/V loads`, `S = QK^T`, `softmax`, `O += PV`,
    /// joined by ` + `; `none` for the empty set.
    pub fn name(self) -> String {
        if self.is_empty() {
            return "none".into();
        }
        let names = [
            (Phases::KV_LOADS, "K/V loads"),
            (Phases::SCORES, "S = QK^T"),
            (Phases::SOFTMAX, "softmax"),
            (Phases::PRODUCT, "O += PV"),
        ];
        names
            .iter()
            .filter(|(p, _)| self.0 & p.0 != 0)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// The key of the pipeline that runs `key`'s kernel without these
    /// phases: `key` itself for no phase; an error for a kernel that has no
    /// phase switches (the portable and subgroup fused kernels, the staged
    /// decode kernel).
    pub fn key(self, key: PipelineKey) -> Result<PipelineKey> {
        if self.is_empty() {
            return Ok(key);
        }
        if !has_phase_switches(key.kernel) {
            return Err(Error::Conflict(
                "only the register-tiled and matrix-unit fused kernels and the streaming decode \
                 kernel can run without a phase (pass --kernel attention_tiled, say)",
            ));
        }
        Ok(key.with("ABLATE", i64::from(self.0)))
    }
}

impl std::ops::BitOr for Phases {
    type Output = Phases;
    fn bitor(self, other: Phases) -> Phases {
        Phases(self.0 | other.0)
    }
}

/// Whether `kernel` takes the `ABLATE` override (it includes
/// `shaders/ablate.wgsl`): the kernels compiled per call
/// ([`Kernel::is_specialised_per_call`]: register-tiled, matrix-unit,
/// streaming decode) but the subgroup kernel, which has no switches.
pub fn has_phase_switches(kernel: Kernel) -> bool {
    kernel.is_specialised_per_call() && kernel != crate::kernels::attention::subgroup::ATTENTION_SG
}
