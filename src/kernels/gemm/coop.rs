//! The GEMM on the matrix units, staged (`gemm_coop`: f16 operands staged
//! through workgroup memory slice by slice) and its text, expanded from
//! `shaders/templates/gemm_coop.wgsl.in` (and the packed GEMM's,
//! `gemm_coop_packed.wgsl.in`, which `packed.rs` records).

use crate::kernels::matrix_units::CoopSize;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::template::{self, Template};
use crate::shader::uniform::ParamsText;

/// The vec4 slots an invocation of the staged GEMM may stage per slice: its
/// next slice's registers are named variables.
const MAXV: usize = 16;

/// The matrices of op(A) and of op(B) a subgroup of the packed GEMM may hold
/// per step: its matrices and accumulators are named variables.
const MAXR: usize = 4;

/// The staged GEMM's template.
const GEMM_COOP: Template = Template {
    name: "gemm_coop",
    text: include_str!("../../../shaders/templates/gemm_coop.wgsl.in"),
    renderer: "src/kernels/gemm/coop.rs",
};

/// The packed GEMM's template.
const GEMM_COOP_PACKED: Template = Template {
    name: "gemm_coop_packed",
    text: include_str!("../../../shaders/templates/gemm_coop_packed.wgsl.in"),
    renderer: "src/kernels/gemm/coop.rs",
};

/// The GEMM on the matrix units: `gemm_coop`, or with `packed`
/// `gemm_coop_packed` (from packed f16 operands), the whole file's text,
/// ending in one newline.
///
/// # Panics
/// Only where the template is malformed: a bug in this repository, not in
/// the caller.
pub(crate) fn render(packed: bool) -> String {
    let text = if packed {
        template::render(&GEMM_COOP_PACKED, MAXR, &[], None)
    } else {
        template::render(&GEMM_COOP, MAXV, &[], None)
    };
    text + "\n"
}

/// The staged GEMM for matrices of `size`.
pub fn staged(size: CoopSize) -> Kernel {
    match size {
        CoopSize::Sixteen => GEMM_COOP16,
        CoopSize::Eight => GEMM_COOP8,
    }
}

/// GEMM on 16x16 matrix units: f16 operands staged through workgroup memory, f32 accumulators.
pub const GEMM_COOP16: Kernel = Kernel::new(&KernelDef {
    name: "gemm_coop16",
    origin: Origin::Generated("gemm_coop.wgsl", || render(false)),
    slots: &[("COOP", "coop16.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<crate::kernels::gemm::Params>(),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: false,
});
/// GEMM on 8x8 matrix units, as [`GEMM_COOP16`].
pub const GEMM_COOP8: Kernel = Kernel::new(&KernelDef {
    name: "gemm_coop8",
    origin: Origin::Generated("gemm_coop.wgsl", || render(false)),
    slots: &[("COOP", "coop8.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<crate::kernels::gemm::Params>(),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: false,
});
