//! Batched, strided GEMM (`shaders/gemm.wgsl`).

pub mod attention;
pub mod coop;
pub mod packed;
pub(crate) mod subgroup;

use crate::device::buffer;
use crate::device::capabilities::Capabilities;
use crate::device::pipeline::PipelineKey;
use crate::device::recorder::Recorder;
use crate::error::{Error, Result};
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Rows and columns of C computed by one workgroup.
pub const TILE: usize = 64;
/// Invocations per workgroup (8 x 8); matches the WGSL.
pub const INVOCATIONS: u32 = 64;
/// Workgroup memory: two 16-deep slices of 64 vec4 columns.
pub const WORKGROUP_BYTES: u32 = 2 * 256 * 16;
/// The register blocking, in words.
pub const TILE_TEXT: &str =
    "64x64 of C, 8x8 per invocation (16 vec4 accumulators), K in slices of 16";

/// One batched GEMM: `C[z] = alpha · op(A[z]) · op(B[z]) + beta · C[z]` for `z` in `0..batch`.
///
/// `op(A)` is `m × k`, `op(B)` is `k × n`, C is `m × n`; all row-major with the
/// given leading dimensions. `trans_a` means A is stored `k × m`; `trans_b`
/// means B is stored `n × k`. Offsets and strides are in elements. Batch `z`
/// reads B at `b_offset + ((b_batch_base + z) / b_batch_div) · b_stride`, which
/// lets `b_batch_div` query heads share a key/value head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmSpec {
    /// Number of matrices.
    pub batch: usize,
    /// Rows of op(A) and C.
    pub m: usize,
    /// Columns of op(B) and C.
    pub n: usize,
    /// Columns of op(A), rows of op(B).
    pub k: usize,
    /// A is stored transposed (`k × m`).
    pub trans_a: bool,
    /// B is stored transposed (`n × k`).
    pub trans_b: bool,
    /// Leading dimension of A as stored.
    pub lda: usize,
    /// Leading dimension of B as stored.
    pub ldb: usize,
    /// Leading dimension of C.
    pub ldc: usize,
    /// First element of A.
    pub a_offset: usize,
    /// First element of B.
    pub b_offset: usize,
    /// First element of C.
    pub c_offset: usize,
    /// Elements between consecutive A matrices.
    pub a_stride: usize,
    /// Elements between consecutive B matrices.
    pub b_stride: usize,
    /// Elements between consecutive C matrices.
    pub c_stride: usize,
    /// Added to `z` before dividing by `b_batch_div`.
    pub b_batch_base: usize,
    /// Batch entries per B matrix (1 for an ordinary batched GEMM).
    pub b_batch_div: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the existing C (0 ignores C's contents, even NaN).
    pub beta: f32,
}

impl GemmSpec {
    /// A contiguous batched GEMM: every matrix packed, no offsets, `beta = 0`.
    pub fn contiguous(
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
        trans_a: bool,
        trans_b: bool,
    ) -> Self {
        Self {
            batch,
            m,
            n,
            k,
            trans_a,
            trans_b,
            lda: if trans_a { m } else { k },
            ldb: if trans_b { k } else { n },
            ldc: n,
            a_offset: 0,
            b_offset: 0,
            c_offset: 0,
            a_stride: m * k,
            b_stride: k * n,
            c_stride: m * n,
            b_batch_base: 0,
            b_batch_div: 1,
            alpha: 1.0,
            beta: 0.0,
        }
    }

    /// Elements of A, B and C the spec touches (one past the last index).
    pub fn extents(&self) -> (usize, usize, usize) {
        let last = self.batch.saturating_sub(1);
        let (a_rows, a_cols) = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (b_rows, b_cols) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        let a = self.a_offset + last * self.a_stride + (a_rows - 1) * self.lda + a_cols;
        let b_last = (self.b_batch_base + last) / self.b_batch_div.max(1);
        let b = self.b_offset + b_last * self.b_stride + (b_rows - 1) * self.ldb + b_cols;
        let c = self.c_offset + last * self.c_stride + (self.m - 1) * self.ldc + self.n;
        (a, b, c)
    }

    /// Checks sizes, leading dimensions and that every index fits in 32 bits.
    pub fn check(&self) -> Result<()> {
        let bad = |reason: &'static str| Error::InvalidOption {
            name: "gemm",
            value: format!("{self:?}"),
            reason,
        };
        if self.batch == 0 || self.m == 0 || self.n == 0 || self.k == 0 || self.b_batch_div == 0 {
            return Err(bad("batch, m, n, k and b_batch_div must be at least 1"));
        }
        let (a_rows_len, b_rows_len) = (
            if self.trans_a { self.m } else { self.k },
            if self.trans_b { self.k } else { self.n },
        );
        if self.lda < a_rows_len || self.ldb < b_rows_len || self.ldc < self.n {
            return Err(bad("a leading dimension is shorter than its rows"));
        }
        let (a, b, c) = self.extents();
        if a.max(b).max(c) > u32::MAX as usize {
            return Err(bad("an index exceeds 32 bits"));
        }
        Ok(())
    }
}

crate::shader::uniform::uniform_block! {
    pub(crate) struct Params {
        m: u32,
        n: u32,
        k: u32,
        batch: u32,
        lda: u32,
        ldb: u32,
        ldc: u32,
        tiles_n: u32,
        tiles_m: u32,
        a_offset: u32,
        b_offset: u32,
        c_offset: u32,
        a_stride: u32,
        b_stride: u32,
        c_stride: u32,
        b_batch_base: u32,
        b_batch_div: u32,
        alpha: f32,
        beta: f32,
        /// `gemm_coop`: 1 where A may be read as vec4s, 2 where B may
        /// (leading dimension, offset and batch stride multiples of 4); the other
        /// kernels ignore it.
        vec_ab: u32,
    }
}

pub use super::matrix_units::CoopShape;

/// Rows of C per invocation of `gemm_sg` (its generator's ROWS).
pub const SUBGROUP_ROWS_PER_LANE: usize = crate::kernels::gemm::subgroup::ROWS as usize;
/// Columns of C per workgroup of `gemm_sg` (4 x its generator's GROUPS).
pub const SUBGROUP_COLS: usize = 4 * crate::kernels::gemm::subgroup::GROUPS as usize;

/// The most rows of op(A) `gemm_skinny.wgsl` takes (its MAX_ROWS).
pub const SKINNY_MAX_ROWS: usize = 16;
/// Invocations per workgroup of `gemm_skinny.wgsl`.
pub const SKINNY_INVOCATIONS: u32 = 128;
/// Workgroup memory of `gemm_skinny.wgsl`: a sum per row and invocation.
pub const SKINNY_WORKGROUP_BYTES: u32 = SKINNY_MAX_ROWS as u32 * SKINNY_INVOCATIONS * 4;

/// Invocations of `gemm_skinny.wgsl` that share one column of C (its
/// `split()`): along a stored row of B where B is transposed, down its rows
/// otherwise.
pub fn skinny_split(trans_b: bool) -> usize {
    if trans_b {
        16
    } else {
        8
    }
}

/// Columns of C per workgroup of `gemm_skinny.wgsl`.
pub fn skinny_cols(trans_b: bool) -> usize {
    SKINNY_INVOCATIONS as usize / skinny_split(trans_b)
}

/// The rows of sums a `gemm_skinny.wgsl` pipeline holds for `m` rows: the
/// next power of two (1 to 16), so that five pipelines serve every height.
pub fn skinny_rows(m: usize) -> usize {
    m.clamp(1, SKINNY_MAX_ROWS).next_power_of_two()
}

/// The tile the skinny kernel's plan describes.
pub const SKINNY_TEXT: &str = "up to 16 rows x 8 columns (B transposed) or 16 columns of C per \
     workgroup of 128, K split 16 or 8 ways, each B value read once";

/// K per staged slice of `gemm_coop` (its BKK).
pub const COOP_SLICE: usize = 32;

/// Rows and columns of C per workgroup of `gemm_coop`: 4 subgroups in a
/// 2 x 2 grid, each 2 x 2 matrices of `size`.
pub fn coop_tile(shape: CoopShape) -> usize {
    4 * shape.size.dim() as usize
}

/// Invocations per workgroup of `gemm_coop`: 4 subgroups.
pub fn coop_invocations(shape: CoopShape) -> u32 {
    4 * shape.subgroup
}

/// Workgroup memory of `gemm_coop`: op(A)'s and op(B)'s f16 slices and
/// the f32 C tile, rows padded by 16 bytes (as the WGSL declares them), a
/// flag and the f32 zero matrix the accumulators start from.
pub fn coop_workgroup_bytes(shape: CoopShape) -> u32 {
    let (tile, slice) = (coop_tile(shape) as u32, COOP_SLICE as u32);
    let matrix = tile / 4;
    tile * (slice + 8) * 2
        + slice * (tile + 8) * 2
        + tile * (tile + 4) * 4
        + 4
        + 4 * matrix * matrix
}

/// vec4s of each operand's K slice an invocation of `gemm_coop` stages
/// (its V): a slice's `tile x COOP_SLICE` values over the workgroup.
pub fn coop_vec4s_per_invocation(shape: CoopShape) -> usize {
    (coop_tile(shape) * COOP_SLICE / 4).div_ceil(coop_invocations(shape) as usize)
}

/// Whether `gemm_coop` at `shape` fits `limits` (workgroup memory and
/// invocations) and its staging (1 to 16 vec4s of each operand per
/// invocation, which a subgroup of half a matrix's side to eight times it
/// gives).
pub fn coop_fits(shape: CoopShape, limits: &crate::device::capabilities::KernelLimits) -> bool {
    let (cm, sg) = (shape.size.dim(), shape.subgroup);
    coop_workgroup_bytes(shape) <= limits.max_compute_workgroup_storage_size
        && coop_invocations(shape) <= limits.max_compute_invocations_per_workgroup
        && cm <= 2 * sg
        && sg <= 8 * cm
        && (8 * cm) % sg == 0
}

/// The pipeline key for a transpose combination of the tiled kernel.
pub fn key(trans_a: bool, trans_b: bool) -> PipelineKey {
    PipelineKey::new(crate::kernels::gemm::GEMM)
        .with_flag("TRANS_A", trans_a)
        .with_flag("TRANS_B", trans_b)
}

/// Whether A (as op(A) rows) and B can be read as 16-byte aligned vec4s.
fn vec_flags(spec: &GemmSpec) -> (bool, bool) {
    let aligned = |x: usize| x.is_multiple_of(4);
    let strided = |stride: usize, used: bool| !used || aligned(stride);
    let vec_a = !spec.trans_a
        && aligned(spec.lda)
        && aligned(spec.a_offset)
        && strided(spec.a_stride, spec.batch > 1);
    let b_matrices = (spec.b_batch_base + spec.batch - 1) / spec.b_batch_div.max(1) > 0;
    let vec_b = aligned(spec.ldb) && aligned(spec.b_offset) && strided(spec.b_stride, b_matrices);
    (vec_a, vec_b)
}

/// The pipeline key of `kernel` for `spec`.
pub fn kernel_key(kernel: GemmKernel, spec: &GemmSpec) -> PipelineKey {
    match kernel {
        GemmKernel::Tiled => key(spec.trans_a, spec.trans_b),
        GemmKernel::Subgroup { width } => {
            let (vec_a, vec_b) = vec_flags(spec);
            PipelineKey::new(crate::kernels::gemm::subgroup::GEMM_SG)
                .with("SG", i64::from(width))
                .with_flag("TRANS_A", spec.trans_a)
                .with_flag("TRANS_B", spec.trans_b)
                .with_flag("VEC_A", vec_a)
                .with_flag("VEC_B", vec_b)
        }
        GemmKernel::Coop(shape) => PipelineKey::new(crate::kernels::gemm::coop::staged(shape.size))
            .with("SG", i64::from(shape.subgroup))
            .with_flag("TRANS_A", spec.trans_a)
            .with_flag("TRANS_B", spec.trans_b),
        GemmKernel::CoopPacked { shape, tile } => crate::kernels::gemm::packed::key(shape, tile),
        GemmKernel::Skinny => PipelineKey::new(crate::kernels::gemm::GEMM_SKINNY)
            .with_flag("TRANS_A", spec.trans_a)
            .with_flag("TRANS_B", spec.trans_b)
            .with("ROWS", skinny_rows(spec.m) as i64),
    }
}

/// How products outside an attention call (the attention family's layers)
/// choose their f32 kernel: the one the engine forces, else the adapter's,
/// the skinny kernel for products of at most [`SKINNY_MAX_ROWS`] rows where
/// the adapter (or the forced portable kernel) takes it. A plan's value,
/// carried by the layers from their engine (`Engine::gemm_choice`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GemmChoice {
    /// The kernel the engine forces (portable kernels, a subgroup width).
    pub forced: Option<GemmKernel>,
}

impl GemmChoice {
    /// Whether a product of `rows` rows takes the skinny kernel: on adapters
    /// without fixed CPU subgroups (whose shuffling kernel spares the
    /// per-lane loads of the skinny kernel's split K), or where the tiled or
    /// skinny kernel is forced.
    pub fn takes_skinny(self, caps: &Capabilities, rows: usize) -> bool {
        let skinny = match self.forced {
            None => caps.fixed_cpu_subgroup().is_none(),
            Some(forced) => matches!(forced, GemmKernel::Tiled | GemmKernel::Skinny),
        };
        skinny && rows <= SKINNY_MAX_ROWS
    }

    /// The kernel the product `spec` (A holding any values) records.
    pub fn for_product(self, caps: &Capabilities, spec: &GemmSpec) -> GemmKernel {
        let kernel = if self.takes_skinny(caps, spec.m) {
            GemmKernel::Skinny
        } else {
            self.forced.unwrap_or_else(|| gemm_kernel_for(caps))
        };
        kernel_for(caps, kernel, spec, AValues::Any)
    }
}

/// Records the GEMM with the planned `kernel` (A holding any values). The
/// caller guarantees the buffers hold [`GemmSpec::extents`] elements.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    kernel: GemmKernel,
    spec: &GemmSpec,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    c: &wgpu::Buffer,
) -> Result<()> {
    record_variant(rec, kernel, spec, AValues::Any, [a, b, c])
}

/// What the A operand holds, beyond plain numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AValues {
    /// Any values.
    Any,
    /// Any values, and a term whose A is `-0` (the mark, compared as bits)
    /// adds nothing, whatever B holds (so `-0 · NaN` and `-0 · inf` add
    /// nothing); `+0` multiplies as any other value.
    MarksSkipped,
    /// Attention's probabilities: values in `[0, 1]`, `-0` marks skipped. The
    /// matrix-unit kernel stages them times 2¹⁴ in f16 (undone exactly in its
    /// epilogue), so that small probabilities keep f16's 11 bits instead of
    /// becoming subnormal; the other kernels treat them as `MarksSkipped`.
    Probabilities,
}

impl AValues {
    /// Whether terms whose A is the mark `-0` are skipped.
    pub fn skips_marks(self) -> bool {
        self != AValues::Any
    }
}

/// The pipeline key of `kernel` for `spec` with A holding `a`.
pub fn variant_key(kernel: GemmKernel, spec: &GemmSpec, a: AValues) -> PipelineKey {
    let kernel = marks_to_staged(kernel, a);
    let key = kernel_key(kernel, spec);
    let key = if a.skips_marks() {
        key.with_flag("SKIP_MARKED_A", true)
    } else {
        key
    };
    match (kernel, a) {
        (GemmKernel::Coop(_), AValues::Probabilities) => key.with_flag("PROBABILITIES", true),
        _ => key,
    }
}

/// `kernel`, except that the packed matrix-unit GEMM hands products whose A
/// carries marks to skip to the staged one (which tests B for non-finite
/// values slice by slice).
pub fn marks_to_staged(kernel: GemmKernel, a_values: AValues) -> GemmKernel {
    match kernel {
        GemmKernel::CoopPacked { shape, .. } if a_values.skips_marks() => GemmKernel::Coop(shape),
        other => other,
    }
}

/// The kernel that records `spec` with A holding `a_values` when `kernel`
/// is asked for: the packed matrix-unit GEMM hands products with marks to
/// skip, and those it cannot hold (a packed operand past one binding, a K
/// loop past the driver's budget), to the staged one.
pub fn kernel_for(
    caps: &Capabilities,
    kernel: GemmKernel,
    spec: &GemmSpec,
    a_values: AValues,
) -> GemmKernel {
    match marks_to_staged(kernel, a_values) {
        GemmKernel::CoopPacked { shape, tile } if !packed::runs(caps, shape, tile, spec) => {
            GemmKernel::Coop(shape)
        }
        GemmKernel::Subgroup { .. } if spec.trans_a => GemmKernel::Tiled,
        // Taller products run the adapter's own kernel.
        GemmKernel::Skinny if spec.m > SKINNY_MAX_ROWS => {
            kernel_for(caps, gemm_kernel_for(caps), spec, a_values)
        }
        other => other,
    }
}

/// Records the GEMM with the planned `kernel`, A holding `a_values`: one
/// [`kernel_for`] keeps for this product (the plan asks it), and, for the
/// matrix units, one the adapter runs (`Capabilities::f16_matrix_units`);
/// else a typed error.
pub(crate) fn record_variant(
    rec: &mut Recorder<'_>,
    kernel: GemmKernel,
    spec: &GemmSpec,
    a_values: AValues,
    [a, b, c]: [&wgpu::Buffer; 3],
) -> Result<()> {
    spec.check()?;
    if let GemmKernel::CoopPacked { shape, tile } = kernel {
        let limits = &rec.ctx().caps.limits;
        if !crate::kernels::gemm::packed::fits(shape, tile, limits) {
            return Err(Error::InvalidOption {
                name: "gemm kernel",
                value: format!("{kernel:?}"),
                reason: "the packed matrix-unit GEMM takes 1 to 4 matrices each way per \
                         subgroup, in a workgroup this adapter allows",
            });
        }
    }
    if kernel_for(&rec.ctx().caps, kernel, spec, a_values) != kernel {
        return Err(Error::InvalidOption {
            name: "gemm kernel",
            value: kernel.label(),
            reason: "does not record this product (a transposed A on the subgroup kernel, \
                     more than 16 rows on the skinny one, marks or operands past a binding on \
                     the packed matrix-unit one): plan it with kernels::gemm::kernel_for",
        });
    }
    // A matrix-unit kernel only at the configuration the adapter offers (and
    // the staged one only where its workgroup fits).
    let caps = &rec.ctx().caps;
    let offered =
        |shape: CoopShape| caps.f16_matrix_units() == Some((shape.size.dim(), shape.subgroup));
    let runs = match kernel {
        GemmKernel::Coop(shape) => offered(shape) && coop_fits(shape, &caps.limits),
        GemmKernel::CoopPacked { shape, .. } => offered(shape),
        GemmKernel::Tiled | GemmKernel::Subgroup { .. } | GemmKernel::Skinny => true,
    };
    if !runs {
        return Err(Error::InvalidOption {
            name: "gemm kernel",
            value: format!("{kernel:?}"),
            reason: "this adapter offers no matrix-unit configuration of that size and \
                     subgroup width, or not a workgroup that large (webattn info lists what it \
                     has)",
        });
    }
    // On drivers that cap an invocation's loop iterations, split K into
    // passes that accumulate into C (beta = 1 after the first).
    let max_k = rec
        .ctx()
        .caps
        .loop_budget()
        .map(|budget| max_k_per_pass(kernel, spec, budget, a_values.skips_marks()));
    if let Some(max_k) = max_k.filter(|&max_k| spec.k > max_k) {
        let mut k0 = 0;
        while k0 < spec.k {
            let len = max_k.min(spec.k - k0);
            let (a_step, b_step) = (
                if spec.trans_a { k0 * spec.lda } else { k0 },
                if spec.trans_b { k0 } else { k0 * spec.ldb },
            );
            let pass = GemmSpec {
                k: len,
                a_offset: spec.a_offset + a_step,
                b_offset: spec.b_offset + b_step,
                beta: if k0 == 0 { spec.beta } else { 1.0 },
                ..*spec
            };
            record_pass(rec, kernel, &pass, a_values, [a, b, c])?;
            k0 += len;
        }
        return Ok(());
    }
    record_pass(rec, kernel, spec, a_values, [a, b, c])
}

/// The largest K one pass may take under a loop budget: the tiled kernel runs
/// about 21 loop iterations per 16 values of K, the subgroup kernel one per 4;
/// the matrix-unit kernel its staging loops and matrix steps per slice, and
/// with `skip_marked_a` the scalar product of a slice (taken when B holds a
/// non-finite value there), after its epilogue's loop; the skinny kernel
/// one per K step of its share and one per row in each, then its sums.
fn max_k_per_pass(kernel: GemmKernel, spec: &GemmSpec, budget: u64, skip_marked_a: bool) -> usize {
    let budget = budget.saturating_sub(256) as usize;
    match kernel {
        GemmKernel::Skinny => {
            let split = skinny_split(spec.trans_b);
            (budget / (skinny_rows(spec.m) + 1) * split).max(split)
        }
        GemmKernel::Tiled => (budget / 21 * 16).max(16),
        GemmKernel::Subgroup { .. } => (budget * 4).max(4),
        GemmKernel::Coop(shape) => {
            let (tile, wg) = (coop_tile(shape), coop_invocations(shape) as usize);
            let cm = shape.size.dim() as usize;
            let tile_loop = (tile * tile).div_ceil(wg);
            // Staging: V vec4s of each operand read (one loop) and put (a
            // loop of four values each, for A and for B).
            let mut per_slice = 10 * coop_vec4s_per_invocation(shape) + COOP_SLICE / cm + 4;
            if skip_marked_a {
                per_slice += tile_loop * (COOP_SLICE + 1);
            }
            (budget.saturating_sub(tile_loop) / per_slice * COOP_SLICE).max(COOP_SLICE)
        }
        // (Recorded whole or not at all: `kernel_for` checks its budget.)
        GemmKernel::CoopPacked { .. } => usize::MAX,
    }
}

fn record_pass(
    rec: &mut Recorder<'_>,
    kernel: GemmKernel,
    spec: &GemmSpec,
    a_values: AValues,
    [a, b, c]: [&wgpu::Buffer; 3],
) -> Result<()> {
    if let GemmKernel::CoopPacked { shape, tile } = kernel {
        return crate::kernels::gemm::packed::record(rec, shape, tile, spec, [a, b, c]);
    }
    let (tile_m, tile_n) = match kernel {
        GemmKernel::Tiled => (TILE, TILE),
        GemmKernel::Skinny => (SKINNY_MAX_ROWS, skinny_cols(spec.trans_b)),
        GemmKernel::Subgroup { width } => (SUBGROUP_ROWS_PER_LANE * width as usize, SUBGROUP_COLS),
        GemmKernel::Coop(shape) => (coop_tile(shape), coop_tile(shape)),
        GemmKernel::CoopPacked { shape, tile } => {
            crate::kernels::gemm::packed::tile_dims(shape, tile)
        }
    };
    let tiles_m = spec.m.div_ceil(tile_m);
    let tiles_n = spec.n.div_ceil(tile_n);
    let u = |x: usize| x as u32;
    let params = Params {
        m: u(spec.m),
        n: u(spec.n),
        k: u(spec.k),
        batch: u(spec.batch),
        lda: u(spec.lda),
        ldb: u(spec.ldb),
        ldc: u(spec.ldc),
        tiles_n: u(tiles_n),
        tiles_m: u(tiles_m),
        a_offset: u(spec.a_offset),
        b_offset: u(spec.b_offset),
        c_offset: u(spec.c_offset),
        a_stride: u(spec.a_stride),
        b_stride: u(spec.b_stride),
        c_stride: u(spec.c_stride),
        b_batch_base: u(spec.b_batch_base),
        b_batch_div: u(spec.b_batch_div),
        alpha: spec.alpha,
        beta: spec.beta,
        vec_ab: match kernel {
            GemmKernel::Coop(_) => {
                // A batch stride matters only where an entry past the first is read.
                let fours = |ld: usize, offset: usize, stride: usize, strided: bool| {
                    ld.is_multiple_of(4)
                        && offset.is_multiple_of(4)
                        && (!strided || stride.is_multiple_of(4))
                };
                let last_b =
                    (spec.b_batch_base + spec.batch.saturating_sub(1)) / spec.b_batch_div.max(1);
                let (vec_a, vec_b) = (
                    fours(spec.lda, spec.a_offset, spec.a_stride, spec.batch > 1),
                    fours(spec.ldb, spec.b_offset, spec.b_stride, last_b > 0),
                );
                u32::from(vec_a) | (u32::from(vec_b) << 1)
            }
            _ => 0,
        },
    };
    let ctx = rec.ctx();
    let pipeline = ctx.pipelines.get(&variant_key(kernel, spec, a_values));
    let uniform = buffer::uniform(ctx, "gemm params", &params);
    let workgroups = (tiles_m * tiles_n) as u64 * spec.batch as u64;
    match kernel {
        GemmKernel::Tiled | GemmKernel::Skinny => {
            rec.dispatch(&pipeline, &[&uniform, a, b, c], workgroups)
        }
        // A and B twice each: an f32 view and a vec4 view.
        GemmKernel::Subgroup { .. } | GemmKernel::Coop(_) => {
            rec.dispatch(&pipeline, &[&uniform, a, a, b, b, c], workgroups)
        }
        // (Recorded by gemm_packed::record above; its bindings are these.)
        GemmKernel::CoopPacked { .. } => rec.dispatch(&pipeline, &[&uniform, a, b, c], workgroups),
    }
}

/// The accumulators each subgroup of `gemm_coop_packed` owns: `rows`
/// by `cols` matrices of C (1 to 4 each), so a workgroup of 2 x 2 subgroups
/// computes `2 * rows` by `2 * cols` matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PackedTile {
    /// Matrices down C.
    pub rows: u8,
    /// Matrices across C.
    pub cols: u8,
}

impl PackedTile {
    /// The tile calls at `Precision::Fast` take: 2 x 2 matrices a subgroup,
    /// the staged kernel's geometry.
    pub const DEFAULT: PackedTile = PackedTile { rows: 2, cols: 2 };

    /// The tiles `webattn bench` measures side by side: the default, then
    /// twice and four times the products per matrix loaded (more registers).
    pub const CANDIDATES: [PackedTile; 3] = [
        PackedTile::DEFAULT,
        PackedTile { rows: 4, cols: 2 },
        PackedTile { rows: 4, cols: 4 },
    ];
}

/// The form of the matrix-unit GEMM that calls at `Precision::Fast` take,
/// as `webattn tune` measures and remembers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FastGemm {
    /// `gemm_coop_packed` at a tile.
    Packed(PackedTile),
    /// `gemm_coop`, operands staged through workgroup memory.
    Staged,
}

impl FastGemm {
    /// Every form the tuner times: the packed tiles, then the staged kernel.
    pub const ALL: [FastGemm; 4] = [
        FastGemm::Packed(PackedTile::CANDIDATES[0]),
        FastGemm::Packed(PackedTile::CANDIDATES[1]),
        FastGemm::Packed(PackedTile::CANDIDATES[2]),
        FastGemm::Staged,
    ];

    /// The form's name in the tuning table: `packed2x2`, `staged`.
    pub fn name(self) -> String {
        match self {
            FastGemm::Packed(tile) => format!("packed{}x{}", tile.rows, tile.cols),
            FastGemm::Staged => "staged".to_string(),
        }
    }

    /// The form named `name` ([`FastGemm::name`]), if it is one of [`FastGemm::ALL`].
    pub fn from_name(name: &str) -> Option<FastGemm> {
        FastGemm::ALL.into_iter().find(|form| form.name() == name)
    }

    /// The kernel of this form for matrix units of `shape`.
    pub fn kernel(self, shape: CoopShape) -> GemmKernel {
        match self {
            FastGemm::Packed(tile) => GemmKernel::CoopPacked { shape, tile },
            FastGemm::Staged => GemmKernel::Coop(shape),
        }
    }
}

/// Which GEMM kernel records a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmKernel {
    /// `gemm.wgsl`: 64x64 tiles through workgroup memory, 8x8 per invocation.
    /// Runs on every adapter.
    Tiled,
    /// `gemm_sg`: one subgroup of `width` invocations per workgroup
    /// computes `4 * width` rows by 64 columns, sharing B through shuffles.
    /// For CPU-backed adapters with fixed subgroups of 4 or 8; products with a
    /// transposed A go to the tiled kernel.
    Subgroup {
        /// The subgroup (and workgroup) width: 4 or 8.
        width: u32,
    },
    /// `gemm_coop`: f16 operands on the matrix units, f32 accumulators,
    /// 4 subgroups per workgroup each owning 2 x 2 matrices of C. Only where
    /// the caller allows f16 products (`Precision::Fast`).
    Coop(CoopShape),
    /// `gemm_coop_packed`: op(A) and op(B) packed as f16 first
    /// (`coop_pack.wgsl`, zero-padded to whole tiles), then matrix loads
    /// from storage and products with no workgroup memory in the K loop.
    /// Products whose A carries marks to skip (attention's `P V`), or whose
    /// packed operands exceed a binding or a loop budget, run as `Coop`.
    CoopPacked {
        /// The matrix-unit configuration.
        shape: CoopShape,
        /// The accumulators per subgroup.
        tile: PackedTile,
    },
    /// `gemm_skinny.wgsl`: products of at most 16 rows (a decoder step's
    /// `Q Kᵀ` and `P V`), each value of B read once by invocations that
    /// split K, where the 64 x 64 tiles would compute rows no one asked
    /// for. Taller products run the adapter's tiled kernel.
    Skinny,
}

impl GemmKernel {
    /// The kernel's name, with the configuration it is compiled for
    /// (`gemm_coop_packed16 4x2`: 16x16 matrices, 4 x 2 per subgroup).
    pub fn label(self) -> String {
        match self {
            GemmKernel::Tiled => "gemm".to_string(),
            GemmKernel::Skinny => "gemm_skinny".to_string(),
            GemmKernel::Subgroup { width } => format!("gemm_sg (subgroups of {width})"),
            GemmKernel::Coop(shape) => format!("gemm_coop{}", shape.size.dim()),
            GemmKernel::CoopPacked { shape, tile } => format!(
                "gemm_coop_packed{} {}x{}",
                shape.size.dim(),
                tile.rows,
                tile.cols
            ),
        }
    }
}

/// The GEMM kernel for an adapter: the subgroup-shuffle kernel on CPU-backed
/// adapters with fixed subgroups of 4 or 8 lanes (where a storage load costs a
/// loop over the lanes and a shuffle one permute), the tiled workgroup-memory
/// kernel everywhere else.
pub fn gemm_kernel_for(caps: &crate::device::capabilities::Capabilities) -> GemmKernel {
    match caps.fixed_cpu_subgroup() {
        Some(width) => GemmKernel::Subgroup { width },
        None => GemmKernel::Tiled,
    }
}

/// Batched, strided GEMM with transpose flags and alpha/beta (`shaders/gemm.wgsl`): 64x64 tiles through workgroup memory.
pub const GEMM: Kernel = Kernel::new(&KernelDef {
    name: "gemm",
    origin: Origin::File("gemm.wgsl", include_str!("../../../shaders/gemm.wgsl")),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});
/// GEMM for products of at most 16 rows: each value of B read once, K split among invocations (`shaders/gemm_skinny.wgsl`).
pub const GEMM_SKINNY: Kernel = Kernel::new(&KernelDef {
    name: "gemm_skinny",
    origin: Origin::File(
        "gemm_skinny.wgsl",
        include_str!("../../../shaders/gemm_skinny.wgsl"),
    ),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<Params>(),
    needs: Needs::CORE,
    specialised_per_call: false,
});

/// The family's kernels, every form and size.
pub const KERNELS: [Kernel; 8] = [
    GEMM,
    GEMM_SKINNY,
    subgroup::GEMM_SG,
    coop::GEMM_COOP16,
    coop::GEMM_COOP8,
    packed::GEMM_COOP_PACKED16,
    packed::GEMM_COOP_PACKED8,
    packed::COOP_PACK,
];

/// Representative pipelines of the family (what the browser test hands to
/// the browser's own shader compiler): every transpose of the tiled kernel,
/// its P V with marks skipped, the skinny kernel at each height, the
/// subgroup kernel at the widths CPU adapters have.
pub fn variants() -> Vec<PipelineKey> {
    let mut keys = Vec::new();
    for trans_a in [false, true] {
        for trans_b in [false, true] {
            keys.push(key(trans_a, trans_b));
        }
    }
    // The P V product of the unfused path skips masked keys.
    keys.push(key(false, false).with_flag("SKIP_MARKED_A", true));
    // The skinny kernel at each height it compiles: decoding's Q Kᵀ and P V,
    // then a plain product and a transposed A.
    for m in [1, 2, 4, 8, 16] {
        let scores = GemmSpec::contiguous(1, m, 64, 64, false, true);
        keys.push(variant_key(GemmKernel::Skinny, &scores, AValues::Any));
        let output = GemmSpec::contiguous(1, m, 64, 64, false, false);
        keys.push(variant_key(
            GemmKernel::Skinny,
            &output,
            AValues::Probabilities,
        ));
    }
    for trans_a in [false, true] {
        let spec = GemmSpec::contiguous(1, 16, 64, 64, trans_a, false);
        keys.push(kernel_key(GemmKernel::Skinny, &spec));
    }
    for width in [4, 8] {
        for trans_b in [false, true] {
            for (k, ld) in [(64, 64), (63, 63)] {
                let spec = GemmSpec {
                    lda: ld,
                    ldb: ld,
                    ..GemmSpec::contiguous(1, 64, 64, k, false, trans_b)
                };
                let kernel = GemmKernel::Subgroup { width };
                keys.push(kernel_key(kernel, &spec));
                if !trans_b {
                    keys.push(variant_key(kernel, &spec, AValues::Probabilities));
                }
            }
        }
    }
    keys
}

/// Every pipeline of the family the planner can choose on some adapter:
/// the subgroup kernel with every flag, the tiled kernel with marks
/// skipped, the matrix-unit GEMMs at both sizes, every transpose and the
/// subgroup widths adapters report, each packed tile, and the packing pass.
pub fn planned() -> Vec<PipelineKey> {
    let flags = [false, true];
    let mut keys = Vec::new();
    for trans_a in flags {
        for trans_b in flags {
            for vec_a in flags {
                for vec_b in flags {
                    for width in [4, 8] {
                        let key = PipelineKey::new(subgroup::GEMM_SG)
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
            keys.push(key(trans_a, trans_b));
            keys.push(key(trans_a, trans_b).with_flag("SKIP_MARKED_A", true));
        }
    }
    for size in [
        crate::kernels::matrix_units::CoopSize::Eight,
        crate::kernels::matrix_units::CoopSize::Sixteen,
    ] {
        for subgroup in [8, 32, 64] {
            let shape = CoopShape { size, subgroup };
            for trans_a in flags {
                for trans_b in flags {
                    let spec = GemmSpec::contiguous(1, 64, 64, 64, trans_a, trans_b);
                    for a_values in [AValues::Any, AValues::MarksSkipped, AValues::Probabilities] {
                        keys.push(variant_key(GemmKernel::Coop(shape), &spec, a_values));
                    }
                    for tile in PackedTile::CANDIDATES {
                        keys.push(packed::key(shape, tile));
                    }
                }
            }
        }
    }
    keys.push(packed::pack_key());
    keys
}

/// The family's kernel and tile for an adapter at `precision`, from its
/// capabilities alone (the tuning cache and the overrides take precedence:
/// `plan::planner`): under [`crate::Precision::Fast`] the matrix-unit kernel
/// where [`coop_shape`](crate::kernels::matrix_units::coop_shape) finds a
/// configuration and the staged kernel's tile fits the limits (the packed
/// kernel at its default tile where that fits too: it hands the staged one
/// what it cannot hold); else (and always under `Highest`)
/// [`gemm_kernel_for`] the adapter.
pub fn tiles_for(caps: &Capabilities, precision: crate::Precision) -> GemmKernel {
    match (precision, crate::kernels::matrix_units::coop_shape(caps)) {
        (crate::Precision::Fast, Some(shape)) if coop_fits(shape, &caps.limits) => {
            let tile = PackedTile::DEFAULT;
            if packed::fits(shape, tile, &caps.limits) {
                GemmKernel::CoopPacked { shape, tile }
            } else {
                GemmKernel::Coop(shape)
            }
        }
        _ => gemm_kernel_for(caps),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The skinny kernel's rows, workgroup and K split are the shader's.
    #[test]
    fn skinny_sizes_match_the_shader() {
        let src = crate::kernels::gemm::GEMM_SKINNY.source();
        assert!(src.contains(&format!("const MAX_ROWS: u32 = {SKINNY_MAX_ROWS}u;")));
        assert!(src.contains(&format!("const INVOCATIONS: u32 = {SKINNY_INVOCATIONS}u;")));
        let (plain, transposed) = (skinny_split(false), skinny_split(true));
        assert!(src.contains(&format!("select({plain}u, {transposed}u, TRANS_B)")));
        assert!(src.contains(&format!("array<f32, {}>", SKINNY_WORKGROUP_BYTES / 4)));
    }

    /// The host's tile sizes must be the generated shader's.
    #[test]
    fn subgroup_tile_matches_the_shader() {
        let src = crate::kernels::gemm::subgroup::GEMM_SG.source();
        assert!(src.contains(&format!("const ROWS: u32 = {SUBGROUP_ROWS_PER_LANE}u;")));
        assert!(src.contains(&format!("const COLS: u32 = {SUBGROUP_COLS}u;")));
    }
}
