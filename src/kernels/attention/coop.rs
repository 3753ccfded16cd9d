//! The fused kernel on the matrix units (`attention_coop`, rendered here from
//! `shaders/templates/attention_coop.wgsl.in`): its
//! tile configurations, the workgroup memory each needs, and the choice among
//! them for an adapter's matrix units, limits and a problem's head dims.

use crate::device::capabilities::KernelLimits;
use crate::device::pipeline::PipelineKey;
use crate::kernels::matrix_units::CoopShape;
use crate::kernels::matrix_units::CoopSize;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::template::{self, Template};
use crate::shader::uniform::ParamsText;

/// The most (row, part) pairs one invocation owns in the scalar steps (the
/// kernel's `MAX_RPI`).
const MAX_ROWS_PER_INVOCATION: u32 = 4;
/// The most lanes a row's scalar steps take: the kernel's shuffles combine
/// up to 32.
const MAX_LANES_PER_ROW: u32 = 32;
/// The largest head dim the kernel takes (256 at 16x16: its Q and O
/// matrices number at most [`MAX_MATRICES`] each).
pub const MAX_HEAD_DIM: usize = 256;
/// The most matrices of Q's and of O's columns the kernel holds (its
/// generator's `MAX_DT`): head dims up to 16 times the matrix size (128 at
/// 8x8, where larger head dims run the f32 kernels).
pub const MAX_MATRICES: u32 = MAX_DT as u32;

/// Where the matrix-unit kernel's K and V come from, tile by tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CoopForm {
    /// Converted to f16 into workgroup memory as each tile starts
    /// (`attention_coop`): no packing pass, no scratch.
    Staged,
    /// Packed as f16 ahead of the kernel; each subgroup's products load
    /// their matrices straight from storage (`attention_coop_packed`).
    Packed,
    /// Packed as f16 ahead of the kernel; each tile copied once into
    /// workgroup memory, where every subgroup's products read it, the next
    /// tile's copy in flight behind this one's work
    /// (`attention_coop_shared`, FlashAttention-2's way).
    Shared,
}

impl CoopForm {
    /// Every form, the default first.
    pub const ALL: [CoopForm; 3] = [CoopForm::Packed, CoopForm::Staged, CoopForm::Shared];

    /// Whether K and V are packed ahead of the kernel (a pass and scratch).
    pub fn packs_ahead(self) -> bool {
        self != CoopForm::Staged
    }

    /// What a tuned tile's name ends with in this form ([`TunedCoop`]'s
    /// text): nothing for the default.
    ///
    /// [`TunedCoop`]: crate::tuning::TunedCoop
    pub fn suffix(self) -> &'static str {
        match self {
            CoopForm::Packed => "",
            CoopForm::Staged => "-staged",
            CoopForm::Shared => "-shared",
        }
    }
}

/// One tile configuration: `subgroups` subgroups each own a strip of
/// `shape.size` query rows (so a workgroup owns `subgroups × size` rows) and
/// the keys stream in tiles of `keys_per_tile`; head dims are padded to the
/// matrix size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoopTiles {
    /// The matrix units' configuration.
    pub shape: CoopShape,
    /// Subgroups per workgroup.
    pub subgroups: u32,
    /// Keys per K/V tile (a multiple of the matrix size).
    pub keys_per_tile: u32,
    /// Dk rounded up to the matrix size.
    pub dk_padded: u32,
    /// Dv rounded up to the matrix size.
    pub dv_padded: u32,
    /// Invocations that share a row in the scalar steps (the rules, the
    /// maxima, P), each a part of `keys_per_tile / lanes_per_row` keys
    /// (every `lanes_per_row`-th quad of 4 keys): a power of two, by default as many as leave no
    /// invocation idle (`invocations / query_rows`, at least 1), at most a
    /// quad each.
    pub lanes_per_row: u32,
    /// Where K and V come from. Packed by default; a call whose packed K
    /// and V would not fit one binding runs staged ([`CoopTiles::packs`]).
    pub form: CoopForm,
}

/// The shapes tried, largest first: (subgroups, keys per tile in matrices).
const CANDIDATES: [(u32, u32); 6] = [(4, 4), (4, 2), (2, 4), (2, 2), (4, 1), (2, 1)];

impl CoopTiles {
    /// The largest candidate that fits `limits` at head dims `dk`, `dv`, or
    /// `None` (head dims above 256, or no tile fits: the f32 kernels run).
    pub fn for_dims(
        shape: CoopShape,
        dk: usize,
        dv: usize,
        limits: &KernelLimits,
    ) -> Option<CoopTiles> {
        Self::candidates(shape, dk, dv)
            .into_iter()
            .find(|t| t.fits(limits))
    }

    /// Every candidate at these head dims (whether it fits an adapter is
    /// [`CoopTiles::fits`]); none above 256, or 16 matrices.
    pub fn candidates(shape: CoopShape, dk: usize, dv: usize) -> Vec<CoopTiles> {
        if dk > MAX_HEAD_DIM || dv > MAX_HEAD_DIM || dk == 0 || dv == 0 {
            return Vec::new();
        }
        let n = shape.size.dim();
        if dk.max(dv) as u32 > MAX_MATRICES * n {
            return Vec::new();
        }
        let pad = |d: usize| (d as u32).div_ceil(n) * n;
        CANDIDATES
            .iter()
            .map(|&(subgroups, key_matrices)| {
                let tiles = CoopTiles {
                    shape,
                    subgroups,
                    keys_per_tile: key_matrices * n,
                    dk_padded: pad(dk),
                    dv_padded: pad(dv),
                    lanes_per_row: 1,
                    form: CoopForm::Packed,
                };
                // As many as leave no invocation idle, at most a quad of
                // keys each (an 8-key tile on 32-lane subgroups: 2).
                let lanes = (tiles.invocations() / tiles.query_rows())
                    .min(tiles.keys_per_tile / 4)
                    .max(1);
                tiles.with_lanes_per_row(lanes)
            })
            .filter(|t| t.is_valid())
            .collect()
    }

    /// The same tiles with `lanes` invocations per row in the scalar steps
    /// (a power of two whose parts are whole quads of keys; more than the default
    /// gives an invocation several pairs, as tests do on adapters where the
    /// default is 1). Whether the result is runnable is [`CoopTiles::is_valid`].
    pub fn with_lanes_per_row(self, lanes: u32) -> CoopTiles {
        CoopTiles {
            lanes_per_row: lanes,
            ..self
        }
    }

    /// The same tiles in the staged form (`attention_coop`: K and V
    /// through workgroup memory, no packing pass).
    pub fn staged(self) -> CoopTiles {
        self.in_form(CoopForm::Staged)
    }

    /// The same tiles in `form`. Whether the result is runnable is
    /// [`CoopTiles::is_valid`] (the shared form's copies have a register
    /// budget).
    pub fn in_form(self, form: CoopForm) -> CoopTiles {
        CoopTiles { form, ..self }
    }

    /// Keys per (batch, KV head) in the packed K and V: `keys` padded to
    /// whole tiles.
    pub fn packed_keys(&self, keys: usize) -> usize {
        keys.max(1).next_multiple_of(self.keys_per_tile as usize)
    }

    /// Bytes of packed K and of packed V for `kv_heads` (batch × KV heads)
    /// matrices of `keys` keys.
    pub fn packed_bytes(&self, kv_heads: usize, keys: usize) -> (u64, u64) {
        let rows = (kv_heads * self.packed_keys(keys)) as u64;
        (
            rows * u64::from(self.dk_padded) * 2,
            rows * u64::from(self.dv_padded) * 2,
        )
    }

    /// Whether these tiles, if packed, run packed for `kv_heads` (batch ×
    /// KV heads) matrices of `keys` keys: both packed tensors fit one
    /// binding and the largest buffer, and their indices 32 bits. Else the
    /// call runs the staged form.
    pub fn packs(&self, kv_heads: usize, keys: usize, limits: &KernelLimits) -> bool {
        let (k, v) = self.packed_bytes(kv_heads, keys);
        self.form.packs_ahead()
            && [k, v].iter().all(|&bytes| {
                bytes <= limits.max_storage_buffer_binding_size
                    && bytes <= limits.max_buffer_size
                    && bytes / 2 <= u64::from(u32::MAX)
            })
    }

    /// Whether the kernel takes these tiles: lanes per row a power of two
    /// whose parts of a tile's keys are whole quads (the scalar steps take
    /// keys four at a time), within one subgroup (a row's maximum
    /// is taken from its parts by shuffles; with matrices of 8 or more rows
    /// the limit on pairs already implies it), and at most `MAX_RPI` pairs
    /// per invocation; in the shared form, at most [`MAX_MATRICES`] slots of
    /// a tile's copy per invocation (its named registers).
    pub fn is_valid(&self) -> bool {
        self.lanes_per_row.is_power_of_two()
            && self.keys_per_tile.is_multiple_of(4 * self.lanes_per_row)
            && self.lanes_per_row <= self.shape.subgroup.min(MAX_LANES_PER_ROW)
            && self.rows_per_invocation() <= MAX_ROWS_PER_INVOCATION
            && (self.form != CoopForm::Shared || self.copy_slots() <= MAX_MATRICES)
    }

    /// The shared form's slots: 16-byte words of a K or V tile (8 f16 each)
    /// each invocation copies, the larger of the two (the kernel's KSL,
    /// VSL).
    pub fn copy_slots(&self) -> u32 {
        let words = self.keys_per_tile * self.dk_padded.max(self.dv_padded) / 8;
        words.div_ceil(self.invocations())
    }

    /// Whether the configuration fits the adapter's workgroup memory and
    /// invocations per workgroup.
    pub fn fits(&self, limits: &KernelLimits) -> bool {
        self.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
            && self.invocations() <= limits.max_compute_invocations_per_workgroup
    }

    /// The matrices' size.
    fn n(&self) -> u32 {
        self.shape.size.dim()
    }

    /// Query rows per workgroup.
    pub fn query_rows(&self) -> u32 {
        self.subgroups * self.n()
    }

    /// Invocations per workgroup.
    pub fn invocations(&self) -> u32 {
        self.subgroups * self.shape.subgroup
    }

    /// (Row, part) pairs per invocation in the scalar steps.
    pub fn rows_per_invocation(&self) -> u32 {
        (self.query_rows() * self.lanes_per_row).div_ceil(self.invocations())
    }

    /// Keys per part of a row in the scalar steps.
    fn keys_per_part(&self) -> u32 {
        self.keys_per_tile / self.lanes_per_row
    }

    /// Words of attended-key bits per part.
    fn words_per_part(&self) -> u32 {
        self.keys_per_part().div_ceil(32)
    }

    /// Row strides (elements), each padded by 16 bytes: Q's tile and the K/V
    /// tile (f16), S (f32: see [`CoopTiles::s_stride`]), P (f16), an O block
    /// (f32).
    fn strides(&self) -> [u32; 5] {
        let n = self.n();
        [
            self.dk_padded + 8,
            self.dk_padded.max(self.dv_padded) + 8,
            self.s_stride(),
            self.keys_per_tile + 8,
            n + 4,
        ]
    }

    /// S's row stride (f32 elements): the keys padded by 1 to 8 vec4s so that
    /// the stride is `lanes_per_row` vec4s modulo 8 (where fewer than 8 lanes
    /// share a row). In the scalar steps the 8 lanes a GPU serves together
    /// (8/LPR rows, LPR parts each) each read a quad of keys at the same step,
    /// part k's at vec4 k of its row: at that stride their 8 quads lie in 8
    /// different groups of 4 banks. (With 8 or more lanes a row, the 8 are
    /// parts of one row and any stride does.)
    pub fn s_stride(&self) -> u32 {
        let quads = self.keys_per_tile / 4;
        let pad = if self.lanes_per_row < 8 {
            (self.lanes_per_row + 8 - quads % 8 - 1) % 8 + 1
        } else {
            1
        };
        self.keys_per_tile + 4 * pad
    }

    /// Words of the f32 scratch that holds S, or one block of O.
    fn scratch_words(&self) -> u32 {
        let [_, _, ss, _, os] = self.strides();
        self.query_rows() * ss.max(os)
    }

    /// Words of attended-key bits per row.
    fn bit_words(&self) -> u32 {
        self.lanes_per_row * self.words_per_part()
    }

    /// f16 values of the shared form's one array for Q's block, then K's
    /// and V's tiles (the kernel's HS): more than Q's block and one tile
    /// where two tiles outgrow Q's block.
    fn shared_halves(&self) -> u32 {
        let [qs, ks, _, _, _] = self.strides();
        (self.query_rows() * qs).max(2 * self.keys_per_tile * ks)
    }

    /// Workgroup memory the kernel uses: Q's block and the K/V tile (f16),
    /// the scratch (f32), P (f16), the attended and positive-probability
    /// bits, the rows' rescaling factors, the pairs' partial maxima (later
    /// sums), the workgroup's flags and nonpad length and the zero matrix the
    /// accumulators start from (f32).
    pub fn workgroup_bytes(&self) -> u32 {
        let [qs, ks, _, ps, _] = self.strides();
        let bq = self.query_rows();
        // Staged: Q's block and one K/V tile. Packed: no K/V tile, but a
        // zero block of f16 for its phase switch. Shared: K's and V's
        // tiles in one array with Q's block (which they replace).
        let tiles = match self.form {
            CoopForm::Staged => 2 * bq * qs + 2 * self.keys_per_tile * ks,
            CoopForm::Packed => 2 * bq * qs + 2 * self.n() * self.n(),
            CoopForm::Shared => 2 * self.shared_halves(),
        };
        tiles
            + 4 * self.scratch_words()
            + 2 * bq * ps
            + 2 * 4 * bq * self.bit_words()
            + 4 * bq
            + 4 * bq * self.lanes_per_row
            + 16
            + 4 * self.n() * self.n()
    }

    /// Loop iterations one invocation runs per key tile, the worst case (a V
    /// tile holding a non-finite value, multiplied in scalar code, and the O
    /// matrices rescaled), for drivers that cap them.
    pub fn loop_iterations_per_tile(&self) -> u64 {
        let n = u64::from(self.n());
        let wg = u64::from(self.invocations());
        let bq = u64::from(self.query_rows());
        let bk = u64::from(self.keys_per_tile);
        let (dkp, dvp) = (u64::from(self.dk_padded), u64::from(self.dv_padded));
        let (dkt, dvt, bkt) = (dkp / n, dvp / n, bk / n);
        let rpi = u64::from(self.rows_per_invocation());
        let (kpi, lpr) = (
            u64::from(self.keys_per_part()),
            u64::from(self.lanes_per_row),
        );
        let block = (bq * n).div_ceil(wg);
        // (The shared form's copies are unrolled: no loop.)
        let staging = match self.form {
            CoopForm::Staged => staging_iterations(bk * dkp, wg) + staging_iterations(bk * dvp, wg),
            CoopForm::Packed | CoopForm::Shared => 0,
        };
        let scores = bkt * (1 + dkt);
        let softmax = rpi * (2 * (kpi / 4) + lpr + 4);
        let rescale = dvt * (block + 1);
        let product = dvt * (block * (bk + 1) + 1) + dvt * (bkt + 1);
        staging + scores + softmax + rescale + product + 8
    }

    /// Keys per dispatch so that no invocation exceeds `budget` loop
    /// iterations (all keys in one dispatch without a budget). Chunks start
    /// on tile boundaries so the kernel's tile grid lines up.
    pub fn keys_per_chunk(&self, keys: usize, budget: Option<u64>) -> usize {
        match budget {
            None => keys.max(1),
            Some(budget) => {
                // Q's block and its matrices, the O matrices zeroed or
                // resumed, and the final stores, once per dispatch.
                let n = u64::from(self.n());
                let wg = u64::from(self.invocations());
                let bq = u64::from(self.query_rows());
                let (dkt, dvt) = (u64::from(self.dk_padded) / n, u64::from(self.dv_padded) / n);
                let rpi = u64::from(self.rows_per_invocation());
                let lpr = u64::from(self.lanes_per_row);
                let once = staging_iterations(bq * u64::from(self.dk_padded), wg)
                    + dkt
                    + dvt
                    + dvt * ((bq * n).div_ceil(wg) + 1)
                    + dvt * (rpi * (n + 1) + 1)
                    + rpi * (lpr + 4)
                    + 16;
                let tiles = (budget.saturating_sub(once) / self.loop_iterations_per_tile()).max(1);
                tiles as usize * self.keys_per_tile as usize
            }
        }
    }

    /// The pipeline key (every override the kernel takes but BQ and WG,
    /// which it derives from NSG, SG and the matrix size, and the shared
    /// form's VT, KW, VW, KSL and VSL, which it derives from these; HS only
    /// in the shared form).
    pub fn key(&self) -> PipelineKey {
        let n = self.n();
        let [qs, ks, ss, ps, os] = self.strides();
        let kernel = kernel(self.form, self.shape.size);
        let key = PipelineKey::new(kernel)
            .with("SG", i64::from(self.shape.subgroup))
            .with("NSG", i64::from(self.subgroups))
            .with("BK", i64::from(self.keys_per_tile))
            .with("BKT", i64::from(self.keys_per_tile / n))
            .with("DKP", i64::from(self.dk_padded))
            .with("DVP", i64::from(self.dv_padded))
            .with("DKT", i64::from(self.dk_padded / n))
            .with("DVT", i64::from(self.dv_padded / n))
            .with("LPR", i64::from(self.lanes_per_row))
            .with("KPI", i64::from(self.keys_per_part()))
            .with("WPP", i64::from(self.words_per_part()))
            .with("RPI", i64::from(self.rows_per_invocation()))
            .with("QS", i64::from(qs))
            .with("KS", i64::from(ks))
            .with("SS", i64::from(ss))
            .with("PS", i64::from(ps))
            .with("OS", i64::from(os))
            .with("FS", i64::from(self.scratch_words()))
            .with("BW", i64::from(self.bit_words()));
        match self.form {
            CoopForm::Shared => key.with("HS", i64::from(self.shared_halves())),
            CoopForm::Staged | CoopForm::Packed => key,
        }
    }

    /// The configuration in words, for `webattn info`.
    pub fn describe(&self) -> String {
        let n = self.n();
        format!(
            "{} query rows x {}-key tiles, {} subgroups of {}, each a strip of {n} rows: S {n}x{} and O {n}x{} \
             as {n}x{n} f32 matrices, Q, K, V and P as f16, K and V {}; softmax {} invocation(s) per row",
            self.query_rows(),
            self.keys_per_tile,
            self.subgroups,
            self.shape.subgroup,
            self.keys_per_tile,
            self.dv_padded,
            match self.form {
                CoopForm::Packed => "packed ahead (loaded from storage)",
                CoopForm::Staged => "staged through workgroup memory",
                CoopForm::Shared =>
                    "packed ahead, each tile shared through workgroup memory (copied ahead)",
            },
            self.lanes_per_row
        )
    }
}

/// Loop iterations an invocation runs staging `values` values as f16 quads
/// across `wg` invocations: per quad its slot, the four stores and, where
/// the quad is not one aligned vec4 (a row's end, head dims that are not
/// multiples of 4), four element reads.
fn staging_iterations(values: u64, wg: u64) -> u64 {
    9 * values.div_ceil(4).div_ceil(wg)
}

/// The most matrices of a head dim the kernel holds, Q's and O's each: head
/// dims up to 256 at 16x16 and 128 at 8x8 (`MAX_MATRICES`).
pub(crate) const MAX_DT: usize = 16;

/// The kernel's template (its three forms, `//# IF STAGED`, `PACKED`,
/// `DIRECT`, `SHARED`).
const TEMPLATE: Template = Template {
    name: "attention_coop",
    text: include_str!("../../../shaders/templates/attention_coop.wgsl.in"),
    renderer: "src/kernels/attention/coop.rs",
};

/// The kernel in `form`: `attention_coop` (staged), `attention_coop_packed`
/// (K and V packed as f16 ahead of it, loaded from storage) or
/// `attention_coop_shared` (packed, each tile shared through workgroup
/// memory), the whole file's text, ending in one newline.
///
/// # Panics
/// Only where the template is malformed: a bug in this repository.
pub(crate) fn render(form: CoopForm) -> String {
    let (defines, kernel): (&[&str], _) = match form {
        CoopForm::Staged => (&["STAGED"], None),
        CoopForm::Packed => (&["PACKED", "DIRECT"], Some("attention_coop_packed")),
        CoopForm::Shared => (&["PACKED", "SHARED"], Some("attention_coop_shared")),
    };
    template::render(&TEMPLATE, MAX_DT, defines, kernel) + "\n"
}

/// The kernel in `form` for matrices of `size`.
pub fn kernel(form: CoopForm, size: CoopSize) -> Kernel {
    match (form, size) {
        (CoopForm::Staged, CoopSize::Sixteen) => ATTENTION_COOP16,
        (CoopForm::Staged, CoopSize::Eight) => ATTENTION_COOP8,
        (CoopForm::Packed, CoopSize::Sixteen) => ATTENTION_COOP_PACKED16,
        (CoopForm::Packed, CoopSize::Eight) => ATTENTION_COOP_PACKED8,
        (CoopForm::Shared, CoopSize::Sixteen) => ATTENTION_COOP_SHARED16,
        (CoopForm::Shared, CoopSize::Eight) => ATTENTION_COOP_SHARED8,
    }
}

/// Fused attention on the matrix units: S and O as f32 accumulator matrices, Q, K, V and P as f16, K and V staged tile by tile (16x16 matrices).
pub const ATTENTION_COOP16: Kernel = Kernel::new(&KernelDef {
    name: "attention_coop16",
    origin: Origin::Generated("attention_coop.wgsl", || render(CoopForm::Staged)),
    slots: &[("COOP", "coop16.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<crate::kernels::attention::ChunkParams>()
        .named(crate::kernels::attention::FUSED_NAMES),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: true,
});
/// The matrix-unit kernel from K and V packed as f16 ahead of it (`COOP_PACK`), loaded straight from storage (16x16 matrices).
pub const ATTENTION_COOP_PACKED16: Kernel = Kernel::new(&KernelDef {
    name: "attention_coop_packed16",
    origin: Origin::Generated("attention_coop_packed.wgsl", || render(CoopForm::Packed)),
    slots: &[("COOP", "coop16.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
        Binding::Read,
    ],
    params: ParamsText::of::<crate::kernels::attention::ChunkParams>()
        .named(crate::kernels::attention::FUSED_NAMES),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: true,
});
/// The matrix-unit kernel from packed K and V, each tile copied once into workgroup memory for every subgroup (16x16 matrices).
pub const ATTENTION_COOP_SHARED16: Kernel = Kernel::new(&KernelDef {
    name: "attention_coop_shared16",
    origin: Origin::Generated("attention_coop_shared.wgsl", || render(CoopForm::Shared)),
    slots: &[("COOP", "coop16.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
        Binding::Read,
    ],
    params: ParamsText::of::<crate::kernels::attention::ChunkParams>()
        .named(crate::kernels::attention::FUSED_NAMES),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: true,
});
/// Fused attention on the matrix units: S and O as f32 accumulator matrices, Q, K, V and P as f16, K and V staged tile by tile (8x8 matrices).
pub const ATTENTION_COOP8: Kernel = Kernel::new(&KernelDef {
    name: "attention_coop8",
    origin: Origin::Generated("attention_coop.wgsl", || render(CoopForm::Staged)),
    slots: &[("COOP", "coop8.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<crate::kernels::attention::ChunkParams>()
        .named(crate::kernels::attention::FUSED_NAMES),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: true,
});
/// The matrix-unit kernel from K and V packed as f16 ahead of it (`COOP_PACK`), loaded straight from storage (8x8 matrices).
pub const ATTENTION_COOP_PACKED8: Kernel = Kernel::new(&KernelDef {
    name: "attention_coop_packed8",
    origin: Origin::Generated("attention_coop_packed.wgsl", || render(CoopForm::Packed)),
    slots: &[("COOP", "coop8.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
        Binding::Read,
    ],
    params: ParamsText::of::<crate::kernels::attention::ChunkParams>()
        .named(crate::kernels::attention::FUSED_NAMES),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: true,
});
/// The matrix-unit kernel from packed K and V, each tile copied once into workgroup memory for every subgroup (8x8 matrices).
pub const ATTENTION_COOP_SHARED8: Kernel = Kernel::new(&KernelDef {
    name: "attention_coop_shared8",
    origin: Origin::Generated("attention_coop_shared.wgsl", || render(CoopForm::Shared)),
    slots: &[("COOP", "coop8.wgsl")],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
        Binding::ReadWrite,
        Binding::Read,
    ],
    params: ParamsText::of::<crate::kernels::attention::ChunkParams>()
        .named(crate::kernels::attention::FUSED_NAMES),
    needs: Needs::MATRIX_UNITS,
    specialised_per_call: true,
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matrix_units::CoopSize;

    const H100: CoopShape = CoopShape {
        size: CoopSize::Sixteen,
        subgroup: 32,
    };
    const LAVAPIPE: CoopShape = CoopShape {
        size: CoopSize::Eight,
        subgroup: 8,
    };

    fn limits(storage: u32) -> KernelLimits {
        KernelLimits {
            max_compute_workgroup_storage_size: storage,
            max_compute_invocations_per_workgroup: 1024,
            ..KernelLimits::WEBGPU_DEFAULTS
        }
    }

    #[test]
    fn common_head_dims_fit_a_48_kib_gpu_with_64_query_rows() {
        let t = CoopTiles::for_dims(H100, 64, 64, &limits(48 << 10)).unwrap();
        assert_eq!(
            (t.query_rows(), t.keys_per_tile, t.invocations()),
            (64, 64, 128)
        );
        // Packed (no K/V tile in workgroup memory), 64 keys fit at 128;
        // staged, 32.
        let t = CoopTiles::for_dims(H100, 128, 128, &limits(48 << 10)).unwrap();
        assert_eq!((t.query_rows(), t.keys_per_tile), (64, 64));
        assert!(t.workgroup_bytes() <= 48 << 10);
        let staged = CoopTiles::candidates(H100, 128, 128)
            .into_iter()
            .map(CoopTiles::staged)
            .find(|t| t.fits(&limits(48 << 10)))
            .unwrap();
        assert_eq!((staged.query_rows(), staged.keys_per_tile), (64, 32));
        assert!(CoopTiles::for_dims(H100, 257, 64, &limits(48 << 10)).is_none());
    }

    #[test]
    fn every_invocation_takes_part_in_the_scalar_steps_by_default() {
        // An H100's 4 subgroups of 32 over 64 rows: 2 invocations per row,
        // one (row, part) pair each, 32 keys of 64 per part (one bit word).
        let t = CoopTiles::for_dims(H100, 64, 64, &limits(48 << 10)).unwrap();
        assert_eq!((t.lanes_per_row, t.rows_per_invocation()), (2, 1));
        assert_eq!((t.keys_per_part(), t.bit_words()), (32, 2));
        // Lavapipe's 8 lanes over 8-row strips: 1, as before.
        let t = CoopTiles::for_dims(LAVAPIPE, 64, 64, &limits(32 << 10)).unwrap();
        assert_eq!((t.lanes_per_row, t.rows_per_invocation()), (1, 1));
        // More lanes than the default: several pairs per invocation, up to 4.
        assert_eq!(t.with_lanes_per_row(4).rows_per_invocation(), 4);
        assert!(t.with_lanes_per_row(4).is_valid());
        assert!(!t.with_lanes_per_row(8).is_valid());
        assert!(!t.with_lanes_per_row(3).is_valid());
        // Parts of more than 32 keys take several bit words each.
        let wide = CoopTiles {
            keys_per_tile: 64,
            ..t
        };
        assert_eq!((wide.words_per_part(), wide.bit_words()), (2, 2));
        assert_eq!(wide.with_lanes_per_row(4).bit_words(), 4);
    }

    #[test]
    fn small_tiles_on_wide_subgroups_share_rows_among_fewer_lanes() {
        // 8x8 matrices on subgroups of 32 and 64: 4 and 8 invocations per
        // row would leave 8- and 16-key tiles parts of fewer than 4 keys;
        // they take a quad a part instead, and every shape stays.
        for subgroup in [32, 64] {
            let shape = CoopShape {
                size: CoopSize::Eight,
                subgroup,
            };
            let tiles = CoopTiles::candidates(shape, 64, 64);
            assert_eq!(tiles.len(), CANDIDATES.len(), "{subgroup}");
            for t in tiles {
                assert!(t.is_valid() && t.keys_per_part() >= 4, "{t:?}");
            }
        }
    }

    #[test]
    fn the_quads_eight_lanes_read_at_a_step_fall_on_eight_bank_groups() {
        for shape in [H100, LAVAPIPE] {
            for t in CoopTiles::candidates(shape, 64, 64) {
                for lanes in [1, 2, 4, 8, 16] {
                    let t = t.with_lanes_per_row(lanes);
                    if !t.is_valid() {
                        // Only where a part would hold no whole quads (or
                        // too many pairs an invocation).
                        assert!(
                            t.keys_per_part() % 4 != 0
                                || t.rows_per_invocation() > MAX_ROWS_PER_INVOCATION
                                || lanes > shape.subgroup,
                            "{t:?}"
                        );
                        continue;
                    }
                    let stride = t.s_stride();
                    assert!(stride % 4 == 0 && stride > t.keys_per_tile, "{t:?}");
                    // Lanes 0..8: row n / LPR, part n % LPR, each at its
                    // part's first quad (vec4 index row * stride / 4 + part).
                    let groups: std::collections::BTreeSet<u32> = (0..8)
                        .map(|n| ((n / lanes) * stride / 4 + n % lanes) % 8)
                        .collect();
                    assert_eq!(groups.len(), 8, "{t:?}: stride {stride}");
                }
            }
        }
    }

    #[test]
    fn lavapipe_fits_every_head_dim_in_32_kib() {
        // (Up to 16 matrices of 8: head dim 128; the f32 kernels run larger.)
        assert!(CoopTiles::for_dims(LAVAPIPE, 129, 64, &limits(32 << 10)).is_none());
        for d in [1, 7, 8, 40, 64, 65, 128] {
            let t = CoopTiles::for_dims(LAVAPIPE, d, d, &limits(32 << 10)).unwrap();
            assert!(t.workgroup_bytes() <= 32 << 10, "{d}: {t:?}");
            assert_eq!(t.dk_padded % 8, 0);
            assert!(t.dk_padded as usize >= d);
        }
    }

    #[test]
    fn packed_tiles_leave_the_kv_tile_out_of_workgroup_memory() {
        let t = CoopTiles::for_dims(H100, 128, 128, &limits(48 << 10)).unwrap();
        assert_eq!(t.form, CoopForm::Packed);
        let staged = t.staged();
        assert_eq!(staged.form, CoopForm::Staged);
        // The staged form's K/V tile: keys x (128 + 8) f16; the packed
        // form's zero block: 16 x 16 f16.
        assert_eq!(
            staged.workgroup_bytes() - t.workgroup_bytes(),
            2 * t.keys_per_tile * 136 - 2 * 16 * 16
        );
        assert_ne!(t.key().kernel, staged.key().kernel);
        assert_eq!(
            staged.key().kernel,
            crate::kernels::attention::coop::kernel(
                crate::kernels::attention::coop::CoopForm::Staged,
                H100.size
            )
        );
        assert_eq!(
            t.key().kernel,
            crate::kernels::attention::coop::kernel(
                crate::kernels::attention::coop::CoopForm::Packed,
                H100.size
            )
        );
        // The packing pass: no staging iterations per tile.
        assert!(t.loop_iterations_per_tile() < staged.loop_iterations_per_tile());
    }

    #[test]
    fn the_shared_form_puts_k_and_v_tiles_in_q_blocks_array() {
        let gpu = limits(48 << 10);
        let shared = |d: usize| {
            CoopTiles::candidates(H100, d, d)
                .into_iter()
                .map(|t| t.in_form(CoopForm::Shared))
                .find(|t| t.is_valid() && t.fits(&gpu))
                .unwrap()
        };
        // d 64: 64 query rows and 64-key tiles, as packed; Q's block (64 x
        // 72 f16) and the two tiles (2 x 64 x 72) share one array.
        let t = shared(64);
        assert_eq!((t.query_rows(), t.keys_per_tile), (64, 64));
        assert_eq!(t.shared_halves(), 2 * 64 * 72);
        // d 128 at 48 KiB: 32-key tiles (two of 64 keys and S's scratch
        // would not fit); the copies take 4 and 4 slots of 16 bytes.
        let t = shared(128);
        assert_eq!((t.query_rows(), t.keys_per_tile), (64, 32));
        assert_eq!(t.shared_halves(), 64 * 136);
        assert_eq!(t.copy_slots(), 4);
        assert_eq!(
            t.key().kernel,
            crate::kernels::attention::coop::kernel(
                crate::kernels::attention::coop::CoopForm::Shared,
                H100.size
            )
        );
        assert!(t.key().to_string().contains("HS=8704"));
        // The packed form at the same tiles needs Q's block and a zero
        // block: 256 f16 more.
        let packed = t.in_form(CoopForm::Packed);
        assert_eq!(packed.workgroup_bytes() - t.workgroup_bytes(), 2 * 16 * 16);
        // It packs as the packed form does, and falls back alike.
        assert!(t.packs(4, 1000, &gpu));
        // More slots than the kernel's 16 named registers: not runnable.
        let narrow = CoopShape {
            size: CoopSize::Sixteen,
            subgroup: 8,
        };
        let wide = CoopTiles::candidates(narrow, 256, 256)[0].in_form(CoopForm::Shared);
        assert!(wide.copy_slots() > MAX_MATRICES && !wide.is_valid());
        assert!(CoopTiles::candidates(narrow, 256, 256)[0].is_valid());
    }

    #[test]
    fn packing_needs_both_packed_tensors_within_one_binding() {
        let t = CoopTiles::for_dims(H100, 64, 128, &limits(48 << 10)).unwrap();
        // 1000 keys pad to whole tiles; K has 64 columns, V 128, f16.
        let keys = t.packed_keys(1000);
        assert_eq!(keys % t.keys_per_tile as usize, 0);
        assert!(keys >= 1000 && keys < 1000 + t.keys_per_tile as usize);
        let (k, v) = t.packed_bytes(4, 1000);
        assert_eq!(
            (k, v),
            (4 * keys as u64 * 64 * 2, 4 * keys as u64 * 128 * 2)
        );
        let mut small = limits(48 << 10);
        assert!(t.packs(4, 1000, &small));
        small.max_storage_buffer_binding_size = v - 1;
        assert!(!t.packs(4, 1000, &small), "V exceeds the binding");
        small.max_storage_buffer_binding_size = v;
        assert!(t.packs(4, 1000, &small));
        assert!(
            !t.staged().packs(4, 1000, &small),
            "the staged form packs nothing"
        );
    }

    #[test]
    fn chunks_under_a_loop_budget_are_whole_tiles() {
        let t = CoopTiles::for_dims(LAVAPIPE, 64, 64, &limits(32 << 10)).unwrap();
        let chunk = t.keys_per_chunk(100_000, Some(16_000));
        assert_eq!(chunk % t.keys_per_tile as usize, 0);
        assert!(chunk >= t.keys_per_tile as usize);
        assert_eq!(t.keys_per_chunk(77, None), 77);
    }
}
