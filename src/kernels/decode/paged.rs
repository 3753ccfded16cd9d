//! The staged decode kernel reading K and V where a paged cache keeps them:
//! `shaders/attention_decode.wgsl` with its KV_ROWS slot filled by
//! `shaders/kv_rows_paged.wgsl`, which finds each key's page in the
//! sequence's block table (`src/paged`). Everything else (the rules, the
//! splits, the merge) is the decode kernel's own.

use super::{DecodeKernel, DecodeLayout, DECODE_NAMES, MAX_WORKGROUP_ROWS};
use crate::device::pipeline::PipelineKey;
use crate::problem::AttentionDims;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// The page sizes the kernel takes (its `PAGE` override): powers of two
/// from 16 to 256 tokens.
pub const PAGE_SIZES: [usize; 5] = [16, 32, 64, 128, 256];

/// How the pages store keys and values: the kernel's ELEMENT slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagedElement {
    /// f32 values.
    F32,
    /// Two f16 values a word.
    F16,
    /// Four int8 values a word, the row's f32 scale after them.
    I8,
}

impl PagedElement {
    /// Its name: `f32`, `f16` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            PagedElement::F32 => "f32",
            PagedElement::F16 => "f16",
            PagedElement::I8 => "int8",
        }
    }
}

/// The pages of a batch of sequences: `pages` holds, for each sequence of
/// the batch, `keys / page_size` page numbers (u32), its block table padded
/// with page 0 to the batch's longest sequence.
pub(crate) struct BlockTable<'a> {
    /// The padded block tables, one row per sequence.
    pub pages: &'a wgpu::Buffer,
    /// Tokens per page.
    pub page_size: usize,
    /// How the pages store keys and values.
    pub element: PagedElement,
}

impl BlockTable<'_> {
    /// The paged kernel's pipeline for `plan`'s rows per workgroup.
    pub(crate) fn key(&self, plan: &DecodeLayout, dims: &AttentionDims) -> PipelineKey {
        debug_assert_eq!(plan.kernel, DecodeKernel::Staged);
        key(
            (plan.heads_per_workgroup * dims.q_len) as i64,
            self.page_size,
            self.element,
        )
    }
}

/// The paged kernel at `rows` rows per workgroup and `page_size` tokens a
/// page, K and V stored as `element`.
pub(crate) fn key(rows: i64, page_size: usize, element: PagedElement) -> PipelineKey {
    let kernel = match element {
        PagedElement::F32 => ATTENTION_DECODE_PAGED,
        PagedElement::F16 => ATTENTION_DECODE_PAGED_F16,
        PagedElement::I8 => ATTENTION_DECODE_PAGED_I8,
    };
    PipelineKey::new(kernel)
        .with("ROWS", rows)
        .with("PAGE", page_size as i64)
}

/// Representative pipelines: one row and a GQA group of 4 at 16-token
/// pages, the most rows at 256, f16 and int8 pages at one row.
pub fn variants() -> Vec<PipelineKey> {
    vec![
        key(1, 16, PagedElement::F32),
        key(4, 16, PagedElement::F32),
        key(MAX_WORKGROUP_ROWS as i64, 256, PagedElement::F32),
        key(1, 64, PagedElement::F16),
        key(4, 64, PagedElement::I8),
    ]
}

/// Every paged pipeline a call can ask for: rows per workgroup 1 to 16 in
/// powers of two, at every page size, f32, f16 and int8 pages.
pub fn planned() -> Vec<PipelineKey> {
    let mut keys = Vec::new();
    for rows in [1, 2, 4, 8, 16] {
        for page_size in PAGE_SIZES {
            for element in [PagedElement::F32, PagedElement::F16, PagedElement::I8] {
                keys.push(key(rows, page_size, element));
            }
        }
    }
    keys
}

/// The staged decode kernel over a paged cache's f32 pages.
pub const ATTENTION_DECODE_PAGED: Kernel = Kernel::new(&KernelDef {
    name: "attention_decode_paged",
    origin: Origin::File(
        "attention_decode.wgsl",
        include_str!("../../../shaders/attention_decode.wgsl"),
    ),
    slots: &[
        ("ELEMENT", "element_f32.wgsl"),
        ("KV_ROWS", "kv_rows_paged.wgsl"),
    ],
    bindings: &BINDINGS,
    params: ParamsText::of::<crate::kernels::attention::Params>().named(DECODE_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The staged decode kernel over a paged cache's f16 pages.
pub const ATTENTION_DECODE_PAGED_F16: Kernel = Kernel::new(&KernelDef {
    name: "attention_decode_paged_f16",
    origin: Origin::File(
        "attention_decode.wgsl",
        include_str!("../../../shaders/attention_decode.wgsl"),
    ),
    slots: &[
        ("ELEMENT", "element_f16.wgsl"),
        ("KV_ROWS", "kv_rows_paged.wgsl"),
    ],
    bindings: &BINDINGS,
    params: ParamsText::of::<crate::kernels::attention::Params>().named(DECODE_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The staged decode kernel over a paged cache's int8 pages.
pub const ATTENTION_DECODE_PAGED_I8: Kernel = Kernel::new(&KernelDef {
    name: "attention_decode_paged_i8",
    origin: Origin::File(
        "attention_decode.wgsl",
        include_str!("../../../shaders/attention_decode.wgsl"),
    ),
    slots: &[
        ("ELEMENT", "element_i8.wgsl"),
        ("KV_ROWS", "kv_rows_paged.wgsl"),
    ],
    bindings: &BINDINGS,
    params: ParamsText::of::<crate::kernels::attention::Params>().named(DECODE_NAMES),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The decode kernel's bindings and the block table after them.
const BINDINGS: [Binding; 9] = [
    Binding::Uniform,
    Binding::Read,
    Binding::Read,
    Binding::Read,
    Binding::Read,
    Binding::Read,
    Binding::ReadWrite,
    Binding::ReadWrite,
    Binding::Read,
];
