//! One WGSL kernel as the engine knows it: its name, where its text comes
//! from, the fragments it puts in its file's slots, the layout of its
//! bindings, its parameter block and what it needs of an adapter. Each
//! kernel family (`crate::kernels`) defines its kernels as [`Kernel`]
//! constants beside their recording; `crate::kernels::all` lists them.
//!
//! Bind-group layouts are declared explicitly from [`Kernel::bindings`]
//! rather than derived from the shader, so a binding that drifts out of step
//! with the Rust side is a validation error at pipeline creation, not a
//! silent mismatch.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use crate::shader::text::{with_slots, INCLUDE};
use crate::shader::uniform::{ParamsText, Word};

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

/// Where a kernel's WGSL comes from.
#[derive(Clone, Copy)]
pub enum Origin {
    /// A file in `shaders/`, embedded: its name and text.
    File(&'static str, &'static str),
    /// A generator in its family's module, run once per process (the
    /// kernels whose register loops are unrolled): the name its text goes
    /// by, and the generator.
    Generated(&'static str, fn() -> String),
}

/// What a kernel needs of an adapter beyond WebGPU's core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// Subgroup operations (chosen only on adapters that have them).
    pub subgroups: bool,
    /// The matrix units: wgpu's experimental cooperative matrices (native
    /// Vulkan and Metal only; chosen only on adapters that report a
    /// configuration the kernel is written for).
    pub matrix_units: bool,
    /// Runs only beside the matrix-unit kernels (packs their operands as
    /// f16, so it needs shader-f16, which every adapter with matrix units has).
    pub beside_matrix_units: bool,
}

impl Needs {
    /// Nothing beyond WebGPU's core.
    pub const CORE: Needs = Needs {
        subgroups: false,
        matrix_units: false,
        beside_matrix_units: false,
    };
    /// Subgroup operations.
    pub const SUBGROUPS: Needs = Needs {
        subgroups: true,
        ..Needs::CORE
    };
    /// The matrix units (which run at subgroup scope).
    pub const MATRIX_UNITS: Needs = Needs {
        subgroups: true,
        matrix_units: true,
        beside_matrix_units: true,
    };
}

/// A kernel's definition: what its family module says of it.
pub struct KernelDef {
    /// A short lowercase name, unique: pipeline labels, `webattn info --wgsl`.
    pub name: &'static str,
    /// Where its text comes from.
    pub origin: Origin,
    /// The fragments it puts in its file's slots (`// #include SLOT`,
    /// [`crate::shader::text::SLOTS`]): its variant of a file several
    /// kernels share.
    pub slots: &'static [(&'static str, &'static str)],
    /// The bindings of group 0, in binding order.
    pub bindings: &'static [Binding],
    /// Its parameter block (`// #include PARAMS` in its text), with the
    /// names this kernel gives the block's shared words.
    pub params: ParamsText,
    /// What it needs of an adapter.
    pub needs: Needs,
    /// Whether its key loop is made for each call: it tests the `RULES`
    /// override (`shaders/attention_rules.wgsl`) and includes
    /// `shaders/ablate.wgsl` (`ABLATE`, the phases a measurement removes).
    pub specialised_per_call: bool,
}

/// One WGSL kernel of the engine: a handle on its family's definition,
/// compared and hashed by name.
#[derive(Clone, Copy)]
pub struct Kernel(&'static KernelDef);

impl Kernel {
    /// The kernel `def` defines.
    pub const fn new(def: &'static KernelDef) -> Kernel {
        Kernel(def)
    }

    /// Its definition.
    pub fn def(self) -> &'static KernelDef {
        self.0
    }

    /// A short lowercase name, used in pipeline labels.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// The file in `shaders/` that holds the kernel; for a generated kernel
    /// ([`Kernel::is_generated`]), the name its text goes by.
    pub fn file(self) -> &'static str {
        match self.0.origin {
            Origin::File(name, _) | Origin::Generated(name, _) => name,
        }
    }

    /// Whether a generator in its family's module writes the kernel's WGSL
    /// (its register loops unrolled), rather than a file in `shaders/`.
    pub fn is_generated(self) -> bool {
        matches!(self.0.origin, Origin::Generated(..))
    }

    /// The fragments this kernel puts in its file's slots.
    pub fn slots(self) -> &'static [(&'static str, &'static str)] {
        self.0.slots
    }

    /// The bindings of group 0, in binding order.
    pub fn bindings(self) -> &'static [Binding] {
        self.0.bindings
    }

    /// The 4-byte words of its parameter block, as the kernel names them.
    pub fn params_words(self) -> Vec<Word> {
        self.0.params.words()
    }

    /// Whether the kernel uses subgroup operations.
    pub fn uses_subgroups(self) -> bool {
        self.0.needs.subgroups
    }

    /// Whether the kernel multiplies on the matrix units.
    pub fn uses_coop(self) -> bool {
        self.0.needs.matrix_units
    }

    /// Whether the kernel runs only beside the matrix-unit kernels: those,
    /// and the packing of their operands.
    pub fn runs_with_matrix_units(self) -> bool {
        self.0.needs.beside_matrix_units
    }

    /// Whether the kernel's key loop is made for each call ([`KernelDef::specialised_per_call`]).
    pub fn is_specialised_per_call(self) -> bool {
        self.0.specialised_per_call
    }

    /// The kernel's text as written, before the fragments it includes and
    /// puts in its slots are spliced in: a generated kernel's is written the
    /// first time it is asked for and kept for the life of the process (one
    /// per kernel, so no two kernels a generator serves can be mixed up).
    fn written(self) -> &'static str {
        static MADE: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
        match self.0.origin {
            Origin::File(_, text) => text,
            Origin::Generated(_, generate) => MADE
                .get_or_init(Default::default)
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(self.0.name)
                .or_insert_with(|| Box::leak(generate().into_boxed_str())),
        }
    }

    /// The WGSL source: its text with its parameter block, the fragments it
    /// includes (`// #include NAME.wgsl` lines) and its slots spliced in.
    pub fn source(self) -> &'static str {
        static EXPANDED: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
        let text = self.written();
        if !text.contains(INCLUDE) && self.slots().is_empty() {
            return text;
        }
        EXPANDED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(self.0.name)
            .or_insert_with(|| {
                let params = self.0.params.wgsl();
                Box::leak(with_slots(text, self.slots(), &params).into_boxed_str())
            })
    }

    /// The WGSL handed to the device. Browsers require `enable subgroups;`
    /// before subgroup builtins (and check their uniformity more strictly
    /// than these kernels need), while naga rejects the directive, so it is
    /// added on the web only.
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

impl PartialEq for Kernel {
    fn eq(&self, other: &Kernel) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Kernel {}

impl std::hash::Hash for Kernel {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.hash(state);
    }
}

impl PartialOrd for Kernel {
    fn partial_cmp(&self, other: &Kernel) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Kernel {
    fn cmp(&self, other: &Kernel) -> std::cmp::Ordering {
        self.0.name.cmp(other.0.name)
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name)
    }
}

/// Parses and validates a kernel with naga, as wgpu would, without a GPU.
#[cfg(not(target_arch = "wasm32"))]
pub fn validate_kernel(kernel: Kernel) -> crate::error::Result<naga::Module> {
    crate::shader::text::validate_wgsl(kernel.name(), kernel.source())
}
