//! The GEMM on the matrix units from packed operands: `coop_pack.wgsl`
//! writes op(A) and op(B)ᵀ as f16, zero-padded to whole tiles, in blocks of
//! one matrix each (so K is contiguous and every matrix load one run), then
//! `gemm_coop_packed` multiplies them with nothing but matrix loads from
//! storage and products in its K loop (no workgroup memory, no barrier, no
//! bounds test there: what held `gemm_coop`'s staging back).

use crate::device::buffer;
use crate::device::capabilities::Capabilities;
use crate::device::capabilities::KernelLimits;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::{Recorder, Seg};
use crate::error::Result;
use crate::kernels::gemm::PackedTile;
use crate::kernels::gemm::{CoopShape, GemmSpec};
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Invocations per workgroup of `coop_pack.wgsl`.
pub const PACK_INVOCATIONS: u32 = 256;
/// f16 values one invocation of `coop_pack.wgsl` writes.
const PACK_VALUES: usize = 8;

/// Rows and columns of C per workgroup at `tile`: 2 x 2 subgroups of
/// `tile.rows` x `tile.cols` matrices.
pub fn tile_dims(shape: CoopShape, tile: PackedTile) -> (usize, usize) {
    let cm = shape.size.dim() as usize;
    (2 * tile.rows as usize * cm, 2 * tile.cols as usize * cm)
}

/// Invocations per workgroup: 4 subgroups.
pub fn invocations(shape: CoopShape) -> u32 {
    4 * shape.subgroup
}

/// Workgroup memory: one f32 matrix per subgroup (the accumulators' zeros,
/// then the epilogue's blocks).
pub fn workgroup_bytes(shape: CoopShape) -> u32 {
    let cm = shape.size.dim();
    4 * cm * cm * 4
}

/// Whether `tile` is one the kernel is written for (1 to 4 matrices each
/// way) and the workgroup fits `limits`.
pub fn fits(shape: CoopShape, tile: PackedTile, limits: &KernelLimits) -> bool {
    (1..=4).contains(&tile.rows)
        && (1..=4).contains(&tile.cols)
        && workgroup_bytes(shape) <= limits.max_compute_workgroup_storage_size
        && invocations(shape) <= limits.max_compute_invocations_per_workgroup
}

/// The pipeline key of the packed GEMM (the packing resolves the
/// transposes: one pipeline serves them all).
pub fn key(shape: CoopShape, tile: PackedTile) -> PipelineKey {
    PipelineKey::new(crate::kernels::gemm::packed::kernel(shape.size))
        .with("SG", i64::from(shape.subgroup))
        .with("RM", i64::from(tile.rows))
        .with("RN", i64::from(tile.cols))
}

/// The pipeline key of the packing pass.
pub fn pack_key() -> PipelineKey {
    PipelineKey::new(crate::kernels::gemm::packed::COOP_PACK)
}

/// One operand's packing: its matrices as stored, and the padded shape they
/// take as f16 (element (r, c) stored at `r * ld + c`, or at `c * ld + r`
/// where `transposed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Operand {
    pub rows: usize,
    pub cols: usize,
    pub transposed: bool,
    pub ld: usize,
    pub offset: usize,
    pub stride: usize,
    pub batches: usize,
    pub rows_p: usize,
    pub cols_p: usize,
}

impl Operand {
    /// f16 values of one packed matrix.
    fn matrix(&self) -> usize {
        self.rows_p * self.cols_p
    }

    /// Bytes of the packed buffer.
    fn bytes(&self) -> u64 {
        (self.batches * self.matrix()) as u64 * 2
    }
}

/// How a product is packed: both operands and the padded sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packing {
    a: Operand,
    b: Operand,
    mp: usize,
    np: usize,
    kp: usize,
    /// The first B matrix the batch reads (the packed B starts there).
    b_first: usize,
}

fn packing(shape: CoopShape, tile: PackedTile, spec: &GemmSpec) -> Packing {
    let (tile_m, tile_n) = tile_dims(shape, tile);
    let cm = shape.size.dim() as usize;
    let (mp, np) = (
        spec.m.next_multiple_of(tile_m),
        spec.n.next_multiple_of(tile_n),
    );
    let kp = spec.k.next_multiple_of(cm);
    let div = spec.b_batch_div.max(1);
    let b_first = spec.b_batch_base / div;
    let b_last = (spec.b_batch_base + spec.batch - 1) / div;
    Packing {
        // op(A), m x k: A as stored, or its transpose.
        a: Operand {
            rows: spec.m,
            cols: spec.k,
            transposed: spec.trans_a,
            ld: spec.lda,
            offset: spec.a_offset,
            stride: spec.a_stride,
            batches: spec.batch,
            rows_p: mp,
            cols_p: kp,
        },
        // op(B)ᵀ, n x k: B stored transposed as is, else its transpose.
        b: Operand {
            rows: spec.n,
            cols: spec.k,
            transposed: !spec.trans_b,
            ld: spec.ldb,
            offset: spec.b_offset + b_first * spec.b_stride,
            stride: spec.b_stride,
            batches: b_last - b_first + 1,
            rows_p: np,
            cols_p: kp,
        },
        mp,
        np,
        kp,
        b_first,
    }
}

/// Loop iterations an invocation of the packed GEMM runs: the K steps, the
/// zeroing and the epilogue's blocks.
fn loop_iterations(shape: CoopShape, tile: PackedTile, kp: usize) -> u64 {
    let cm = shape.size.dim() as u64;
    let sg = u64::from(shape.subgroup);
    let block = (cm * cm).div_ceil(sg);
    kp as u64 / cm + (cm * cm).div_ceil(4 * sg) + u64::from(tile.rows * tile.cols) * block
}

/// Whether the packed GEMM runs `spec` on `ctx`: both packed operands fit one
/// binding, every index fits in 32 bits, and a driver that caps an
/// invocation's loop iterations allows its K loop (`gemm_coop`, which
/// splits K, runs the rest).
pub fn runs(caps: &Capabilities, shape: CoopShape, tile: PackedTile, spec: &GemmSpec) -> bool {
    let limits = &caps.limits;
    let plan = packing(shape, tile, spec);
    let bindable = |bytes: u64| {
        bytes <= limits.max_storage_buffer_binding_size
            && bytes <= limits.max_buffer_size
            && bytes / 2 <= u64::from(u32::MAX)
    };
    let within_budget = caps
        .loop_budget()
        .is_none_or(|budget| loop_iterations(shape, tile, plan.kp) + 256 <= budget);
    fits(shape, tile, limits)
        && bindable(plan.a.bytes())
        && bindable(plan.b.bytes())
        && within_budget
}

/// Bytes of the two packed operands of `spec` (allocated per product,
/// freed when its commands have run).
pub fn scratch_bytes(shape: CoopShape, tile: PackedTile, spec: &GemmSpec) -> u64 {
    let plan = packing(shape, tile, spec);
    plan.a.bytes() + plan.b.bytes()
}

crate::shader::uniform::uniform_block! {
    pub(crate) struct PackParams {
        rows: u32,
        cols: u32,
        ld: u32,
        offset: u32,
        stride: u32,
        batches: u32,
        rows_p: u32,
        cols_p: u32,
        /// The matrix units' size (8 or 16).
        block: u32,
        /// 1: element (r, c) is stored at c * ld + r.
        transposed: u32,
        /// Rows per flag word (0: no flags).
        flag_rows: u32,
        _pad1: u32,
    }
}

crate::shader::uniform::uniform_block! {
    pub(crate) struct Params {
        m: u32,
        n: u32,
        /// K padded to a multiple of CM: the packed matrices' inner length.
        kp: u32,
        batch: u32,
        /// M and N padded to whole tiles.
        mp: u32,
        np: u32,
        tiles_n: u32,
        tiles_m: u32,
        ldc: u32,
        c_offset: u32,
        c_stride: u32,
        /// f16 values per packed matrix of A (mp * kp) and of B (kp * np).
        a_matrix: u32,
        b_matrix: u32,
        /// Batch z multiplies packed B matrix (b_batch_base + z) / b_batch_div - b_first
        /// (b_first: the first one packed).
        b_batch_base: u32,
        b_batch_div: u32,
        b_first: u32,
        alpha: f32,
        beta: f32,
        /// 1 where C's leading dimension, offset and batch stride are multiples of 4: a
        /// matrix store to C is 16-byte aligned, as Vulkan requires.
        c_aligned: u32,
        _pad1: u32,
    }
}

/// Records the packing of one operand from `src` into a new buffer; with
/// `flag_rows` > 0 also which runs of that many packed rows hold a value
/// that is not finite once rounded (one word each, in the second buffer;
/// else that is a placeholder).
pub(crate) fn record_pack(
    rec: &mut Recorder<'_>,
    label: &str,
    shape: CoopShape,
    operand: &Operand,
    src: Seg<'_>,
    flag_rows: usize,
) -> Result<(wgpu::Buffer, wgpu::Buffer)> {
    let ctx = rec.ctx();
    let values = operand.batches * operand.matrix();
    // (f16 values two to a word: the buffer is sized in f32 words.)
    let packed = buffer::storage(ctx, label, values.div_ceil(2))?;
    let flag_words = match flag_rows {
        0 => 1,
        rows => operand.batches * operand.rows_p.div_ceil(rows),
    };
    let flags = buffer::storage(ctx, "non-finite flags", flag_words)?;
    let u = |x: usize| x as u32;
    let params = PackParams {
        rows: u(operand.rows),
        cols: u(operand.cols),
        ld: u(operand.ld),
        offset: u(operand.offset),
        stride: u(operand.stride),
        batches: u(operand.batches),
        rows_p: u(operand.rows_p),
        cols_p: u(operand.cols_p),
        block: shape.size.dim(),
        transposed: u32::from(operand.transposed),
        flag_rows: flag_rows as u32,
        _pad1: 0,
    };
    let uniform = buffer::uniform(ctx, "coop pack params", &params);
    let pipeline = ctx.pipelines.get(&pack_key());
    let workgroups = (values / PACK_VALUES) as u64;
    rec.dispatch_segments(
        &pipeline,
        &[(&uniform).into(), src, (&packed).into(), (&flags).into()],
        workgroups.div_ceil(u64::from(PACK_INVOCATIONS)),
    )?;
    Ok((packed, flags))
}

/// Whether C's rows all start 16-byte aligned (leading dimension, offset
/// and, where a second matrix is written, batch stride multiples of 4), as a
/// matrix store to storage requires (Vulkan: the pointer and the stride
/// aligned to 16 bytes or a row, whichever is less).
fn c_aligned(spec: &GemmSpec) -> bool {
    spec.ldc.is_multiple_of(4)
        && spec.c_offset.is_multiple_of(4)
        && (spec.batch == 1 || spec.c_stride.is_multiple_of(4))
}

/// Records `spec` on the packed GEMM: both packings, then the product. The
/// caller has checked [`runs`] and [`GemmSpec::check`].
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    shape: CoopShape,
    tile: PackedTile,
    spec: &GemmSpec,
    [a, b, c]: [&wgpu::Buffer; 3],
) -> Result<()> {
    let plan = packing(shape, tile, spec);
    let (packed_a, _) = record_pack(rec, "A as f16", shape, &plan.a, a.into(), 0)?;
    let (packed_b, _) = record_pack(rec, "B as f16", shape, &plan.b, b.into(), 0)?;
    let (tile_m, tile_n) = tile_dims(shape, tile);
    let (tiles_m, tiles_n) = (plan.mp / tile_m, plan.np / tile_n);
    let u = |x: usize| x as u32;
    let params = Params {
        m: u(spec.m),
        n: u(spec.n),
        kp: u(plan.kp),
        batch: u(spec.batch),
        mp: u(plan.mp),
        np: u(plan.np),
        tiles_n: u(tiles_n),
        tiles_m: u(tiles_m),
        ldc: u(spec.ldc),
        c_offset: u(spec.c_offset),
        c_stride: u(spec.c_stride),
        a_matrix: u(plan.a.matrix()),
        b_matrix: u(plan.b.matrix()),
        b_batch_base: u(spec.b_batch_base),
        b_batch_div: u(spec.b_batch_div.max(1)),
        b_first: u(plan.b_first),
        alpha: spec.alpha,
        beta: spec.beta,
        c_aligned: u32::from(c_aligned(spec)),
        _pad1: 0,
    };
    let ctx = rec.ctx();
    let pipeline = ctx.pipelines.get(&key(shape, tile));
    let uniform = buffer::uniform(ctx, "packed gemm params", &params);
    let workgroups = (tiles_m * tiles_n) as u64 * spec.batch as u64;
    rec.dispatch(&pipeline, &[&uniform, &packed_a, &packed_b, c], workgroups)
}

/// GEMM on 16x16 matrix units from operands packed as f16 by [`COOP_PACK`]: no workgroup memory in the K loop.
pub const GEMM_COOP_PACKED16: Kernel = Kernel::new(&KernelDef {
    name: "gemm_coop_packed16",
    origin: Origin::Generated("gemm_coop_packed.wgsl", || {
        crate::kernels::gemm::coop::render(true)
    }),
    slots: &[("COOP", "coop16.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<Params>(),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: false,
});
/// The packed GEMM on 8x8 matrix units, as [`GEMM_COOP_PACKED16`].
pub const GEMM_COOP_PACKED8: Kernel = Kernel::new(&KernelDef {
    name: "gemm_coop_packed8",
    origin: Origin::Generated("gemm_coop_packed.wgsl", || {
        crate::kernels::gemm::coop::render(true)
    }),
    slots: &[("COOP", "coop8.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<Params>(),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: false,
});
/// Packs a GEMM operand as f16, zero-padded to whole tiles (`shaders/coop_pack.wgsl`).
pub const COOP_PACK: Kernel = Kernel::new(&KernelDef {
    name: "coop_pack",
    origin: Origin::File(
        "coop_pack.wgsl",
        include_str!("../../../shaders/coop_pack.wgsl"),
    ),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<PackParams>(),
    needs: Needs {
        beside_matrix_units: true,
        ..Needs::CORE
    },
    specialised_per_call: false,
});

/// The packed GEMM for matrices of `size`.
pub fn kernel(size: crate::kernels::matrix_units::CoopSize) -> Kernel {
    match size {
        crate::kernels::matrix_units::CoopSize::Sixteen => GEMM_COOP_PACKED16,
        crate::kernels::matrix_units::CoopSize::Eight => GEMM_COOP_PACKED8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matrix_units::CoopSize;

    const H100: CoopShape = CoopShape {
        size: CoopSize::Sixteen,
        subgroup: 32,
    };

    #[test]
    fn operands_pack_as_stored_padded_to_whole_tiles() {
        let spec = GemmSpec {
            b_batch_base: 2,
            b_batch_div: 2,
            ..GemmSpec::contiguous(6, 33, 7, 40, true, true)
        };
        let plan = packing(H100, PackedTile { rows: 4, cols: 2 }, &spec);
        // op(A) 33 x 40 -> 128 x 48 (A stored k x m: read transposed);
        // op(B)ᵀ 7 x 40 -> 64 x 48 (B stored n x k: read as is).
        assert_eq!((plan.mp, plan.np, plan.kp), (128, 64, 48));
        assert_eq!(
            (plan.a.rows, plan.a.cols, plan.a.rows_p, plan.a.cols_p),
            (33, 40, 128, 48)
        );
        assert_eq!(
            (plan.b.rows, plan.b.cols, plan.b.rows_p, plan.b.cols_p),
            (7, 40, 64, 48)
        );
        assert!(plan.a.transposed && !plan.b.transposed);
        let plain = packing(
            H100,
            PackedTile::DEFAULT,
            &GemmSpec::contiguous(1, 5, 6, 7, false, false),
        );
        assert!(!plain.a.transposed && plain.b.transposed);
        assert_eq!(plan.a.batches, 6);
        // Batches 0..6 read B matrices (2 + z) / 2 = 1..=3.
        assert_eq!((plan.b_first, plan.b.batches), (1, 3));
        assert_eq!(plan.b.offset, spec.b_stride);
    }

    #[test]
    fn stores_to_c_need_rows_aligned_to_16_bytes() {
        let spec = GemmSpec::contiguous(3, 8, 8, 8, false, false);
        assert!(c_aligned(&spec));
        assert!(!c_aligned(&GemmSpec { ldc: 77, ..spec }));
        assert!(!c_aligned(&GemmSpec {
            c_offset: 2,
            ..spec
        }));
        assert!(!c_aligned(&GemmSpec {
            c_stride: 66,
            ..spec
        }));
        assert!(c_aligned(&GemmSpec {
            c_stride: 66,
            batch: 1,
            ..spec
        }));
    }

    #[test]
    fn packed_rows_hold_whole_writes_of_the_packing_pass() {
        for size in [CoopSize::Eight, CoopSize::Sixteen] {
            for tile in PackedTile::CANDIDATES {
                let shape = CoopShape { size, subgroup: 8 };
                for (m, n, k) in [(1, 1, 1), (97, 257, 7), (7, 1025, 33)] {
                    let spec = GemmSpec::contiguous(2, m, n, k, false, true);
                    let plan = packing(shape, tile, &spec);
                    let cm = size.dim() as usize;
                    for operand in [plan.a, plan.b] {
                        assert_eq!(operand.cols_p % PACK_VALUES, 0);
                        // Whole blocks of matrices.
                        assert_eq!(operand.cols_p % cm, 0);
                        assert_eq!(operand.rows_p % cm, 0);
                    }
                }
            }
        }
    }

    #[test]
    fn the_loop_budget_counts_k_steps() {
        let tile = PackedTile::DEFAULT;
        // 100000 / 16 steps, 256 / 128 zeroing, 4 blocks of 256 / 32.
        assert_eq!(loop_iterations(H100, tile, 100_000), 6250 + 2 + 32);
    }
}
