//! The register-tiled fused kernel (`kernels/attention/tiled/generator.rs`: `attention_tiled`): its
//! tile
//! configurations, the workgroup memory each needs, and the choice among them
//! for an adapter's limits and a problem's head dims.

pub(crate) mod generator;

use crate::device::capabilities::{Capabilities, KernelLimits};
use crate::device::pipeline::PipelineKey;
use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;
use generator::TiledForm;

// The capacities of the kernel's registers (its `MAX_*` constants, which
// `kernels::attention_tiled` writes into the kernel from these).
/// The most query rows an invocation holds in `attention_tiled_wide` (RQ).
pub(crate) const MAX_RQ: u32 = 8;
/// The most query rows an invocation holds in the other forms.
pub(crate) const NARROW_MAX_RQ: u32 = 4;
/// The most keys an invocation holds in a key tile (RK).
pub(crate) const MAX_RK: u32 = 4;
/// The most vec4 columns of O an invocation holds (DVT).
pub(crate) const MAX_DVT: u32 = 8;
/// The most scores an invocation holds (RQ × RK).
const MAX_S: u32 = 32;
/// The most vec4s of O an invocation holds (RQ × DVT).
pub(crate) const MAX_O: u32 = 16;
/// The most vec4s of a K or V tile an invocation prefetches.
pub(crate) const MAX_SLOTS: u32 = 8;
/// The most invocations per row (`tk`): the kernels read a row's partials
/// as `tk / 4` vec4s, unrolled up to this many (`tk` a multiple of 4).
pub(crate) const MAX_TK: u32 = 16;
/// vec4 columns per chunk of the chunked form's Q, K, V and P tiles (its `CW`):
/// a chunk holds that many columns of one row and a vec4 of padding.
pub const CHUNK_COLUMNS: u32 = 8;

/// The fewest invocations per row (`tk`) of any shuffle form: the narrowest
/// subgroups that run one.
pub const SHUFFLE_MIN_TK: u32 = 8;

/// One tile configuration of the register-tiled kernel: a workgroup of
/// `tq × tk` invocations owns `query_rows` query rows and streams keys in tiles
/// of `keys_per_tile`; each invocation holds an `rq × rk` block of S and an
/// `rq × dvt` (vec4) block of O in registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiledTiles {
    /// Query rows per workgroup.
    pub query_rows: u32,
    /// Keys per K/V tile.
    pub keys_per_tile: u32,
    /// Invocation rows of the workgroup grid.
    pub tq: u32,
    /// Invocation columns of the workgroup grid.
    pub tk: u32,
    /// vec4s per K row.
    pub dk4: u32,
    /// vec4s per V row.
    pub dv4: u32,
    /// Whether each invocation prefetches its share of the next K or V tile
    /// into registers while the current tile is multiplied (the kernel's
    /// PREFETCH; at most MAX_SLOTS vec4s each).
    pub prefetch: bool,
    /// Whether the rows' maxima and P move between a row's invocations by
    /// subgroup shuffles (`attention_tiled_shuffle`: K and V staged side by
    /// side, two barriers per key tile instead of four); runs only where the
    /// adapter's subgroups hold at least `tk` lanes.
    pub shuffle: bool,
    /// Whether the Q, K, V and P tiles are held in chunks of [`CHUNK_COLUMNS`]
    /// columns of a row (`attention_tiled_chunked`): one index clamp per row
    /// and chunk instead of one per load, for a vec4 of padding per chunk
    /// instead of per row.
    pub chunked: bool,
}

/// The shapes tried, in order: (query rows, keys per tile, tq, tk). Each is
/// a workgroup of 256, 128 or 64 invocations; without a tuned choice the
/// first whose workgroup memory and register blocks fit is taken. The order
/// is an H100's (`webattn tune`, B 1, H 16, seq 2048, BENCHMARKS.md): at head
/// dim 64, 64 x 32 on 16 x 16 (2.32 ms) before 64 x 32 on 16 x 8 (2.55 ms)
/// and 32 x 32 on 8 x 8 (3.32 ms); at 128, where 64-row blocks exceed 48 KiB,
/// 32 x 32 on 16 x 16 (4.35 ms) before 32 x 32 on 8 x 8 (10.0 ms); the
/// smaller shapes ran 4 to 7 times slower and are there for small limits.
/// Keys per tile are a multiple of 4 (P is stored as vec4s).
const CANDIDATES: [(u32, u32, u32, u32); 8] = [
    (64, 32, 16, 16),
    (64, 32, 16, 8),
    (64, 64, 16, 16),
    (32, 32, 16, 16),
    (32, 32, 8, 8),
    (32, 16, 8, 16),
    (16, 16, 8, 16),
    (16, 8, 8, 8),
];

/// Shapes not yet measured on a GPU, which only `webattn tune` tries (after
/// [`CANDIDATES`]): 8 query rows per invocation, as the GEMM's 8 x 8 blocks
/// that reach 44% of an H100's FMA ceiling, so each vec4 read from workgroup
/// memory feeds more multiply-adds (64 x 32 on 8 x 8 invocations: 8 x 4 of S;
/// on 8 x 16: 8 x 2; 32 x 32 on 4 x 16 fits head dim 128 in 48 KiB).
const TUNER_ONLY: [(u32, u32, u32, u32); 3] = [(64, 32, 8, 8), (64, 32, 8, 16), (32, 32, 4, 16)];

impl TiledTiles {
    /// The first measured shape (of `CANDIDATES`, without prefetch) that fits
    /// the adapter's limits at head dims `dk`, `dv` (both at most 256), or
    /// `None` when none does (the portable kernel then runs the problem).
    pub fn for_dims(dk: usize, dv: usize, limits: &KernelLimits) -> Option<TiledTiles> {
        Self::candidates(dk, dv)
            .into_iter()
            .find(|t| t.is_measured() && t.fits(limits))
    }

    /// Whether this is one of the shapes measured on a GPU, in the form
    /// measured (no prefetch, no shuffles, tiles not in chunks): the only
    /// ones an untuned engine takes.
    pub fn is_measured(&self) -> bool {
        !self.prefetch
            && !self.shuffle
            && !self.chunked
            && CANDIDATES.contains(&(self.query_rows, self.keys_per_tile, self.tq, self.tk))
    }

    /// Every candidate whose register blocks fit the kernel at these head dims
    /// (whether their workgroup memory fits an adapter is [`TiledTiles::fits`]):
    /// the measured shapes in their order and the tuner-only ones, then the
    /// same shapes prefetching the next tile into registers where its share
    /// fits them, then the chunked forms and then the shuffle forms of the
    /// shapes of 32 query rows or more with at most 4 per invocation (the
    /// smaller shapes ran 4 to 7 times slower on an H100), each without and
    /// with prefetch (tried by `webattn tune` where they run,
    /// [`TiledTiles::runs_on`]; not yet measured on a GPU, so never the
    /// untuned choice).
    pub fn candidates(dk: usize, dv: usize) -> Vec<TiledTiles> {
        let (dk4, dv4) = (dk.div_ceil(4) as u32, dv.div_ceil(4) as u32);
        let shapes: Vec<TiledTiles> = CANDIDATES
            .iter()
            .chain(TUNER_ONLY.iter())
            .map(|&(query_rows, keys_per_tile, tq, tk)| TiledTiles {
                query_rows,
                keys_per_tile,
                tq,
                tk,
                dk4,
                dv4,
                prefetch: false,
                shuffle: false,
                chunked: false,
            })
            .filter(|t| {
                // Invocations stand in pairs on neighbouring rows (the
                // kernels' `tr`), so the grid has an even number of rows.
                t.tq % 2 == 0
                    && t.tk % 4 == 0
                    && t.tk <= MAX_TK
                    && t.rq() <= MAX_RQ
                    && t.rk() <= MAX_RK
                    && t.dvt() <= MAX_DVT
                    && t.rq() * t.rk() <= MAX_S
                    && t.rq() * t.dvt() <= MAX_O
            })
            .collect();
        let prefetching: Vec<TiledTiles> = shapes
            .iter()
            .map(|t| TiledTiles {
                prefetch: true,
                ..*t
            })
            .filter(|t| t.slots() <= MAX_SLOTS)
            .collect();
        let large_narrow = |t: &&TiledTiles| !t.is_wide() && t.query_rows >= 32;
        let chunking: Vec<TiledTiles> = shapes
            .iter()
            .chain(prefetching.iter())
            .filter(large_narrow)
            .map(|t| TiledTiles {
                chunked: true,
                ..*t
            })
            .collect();
        let shuffling: Vec<TiledTiles> = shapes
            .iter()
            .chain(prefetching.iter())
            .filter(large_narrow)
            .filter(|t| t.tk.is_power_of_two())
            .map(|t| TiledTiles {
                shuffle: true,
                ..*t
            })
            .collect();
        shapes
            .into_iter()
            .chain(prefetching)
            .chain(chunking)
            .chain(shuffling)
            .collect()
    }

    /// Whether the configuration runs on the adapter `caps` describes: it
    /// fits its limits ([`TiledTiles::fits`]) and, for a shuffle form, its
    /// subgroups are never narrower than a row's `tk` invocations.
    pub fn runs_on(&self, caps: &Capabilities) -> bool {
        self.fits(&caps.limits)
            && (!self.shuffle || (caps.subgroups && caps.subgroup_min_size >= self.tk))
    }

    /// Whether the shape holds more query rows per invocation than
    /// `attention_tiled` does, so `attention_tiled_wide` runs it.
    pub fn is_wide(&self) -> bool {
        self.rq() > NARROW_MAX_RQ
    }

    /// vec4s of a K or V tile each invocation stages (the kernel's SLOTS).
    pub fn slots(&self) -> u32 {
        (self.keys_per_tile * self.dk4.max(self.dv4)).div_ceil(self.invocations())
    }

    /// Whether the configuration fits the adapter's workgroup memory and
    /// invocations per workgroup.
    pub fn fits(&self, limits: &KernelLimits) -> bool {
        self.workgroup_bytes() <= limits.max_compute_workgroup_storage_size
            && self.invocations() <= limits.max_compute_invocations_per_workgroup
    }

    /// Invocations per workgroup.
    pub fn invocations(&self) -> u32 {
        self.tq * self.tk
    }

    /// Query rows per invocation.
    pub fn rq(&self) -> u32 {
        self.query_rows / self.tq
    }

    /// Keys per invocation in a tile.
    pub fn rk(&self) -> u32 {
        self.keys_per_tile / self.tk
    }

    /// vec4 columns of O per invocation.
    pub fn dvt(&self) -> u32 {
        self.dv4.div_ceil(self.tk)
    }

    /// Chunks of [`CHUNK_COLUMNS`] columns per row of the Q tile (the
    /// chunked form's QB).
    fn q_chunks(&self) -> u32 {
        self.dk4.div_ceil(CHUNK_COLUMNS)
    }

    /// Chunks per row of the K/V tile (the chunked form's KB).
    fn kv_chunks(&self) -> u32 {
        self.dk4.max(self.dv4).div_ceil(CHUNK_COLUMNS)
    }

    /// vec4s per row of a chunked tile whose rows hold `vec4s` columns: a
    /// vec4 of padding per chunk of [`CHUNK_COLUMNS`].
    fn in_chunks(vec4s: u32) -> u32 {
        vec4s.div_ceil(CHUNK_COLUMNS) * (CHUNK_COLUMNS + 1)
    }

    /// vec4s per row of the Q tile: one of padding per row (which spreads
    /// the banks), or per chunk in the chunked form.
    fn q_stride(&self) -> u32 {
        if self.chunked {
            Self::in_chunks(self.dk4)
        } else {
            self.dk4 + 1
        }
    }

    /// vec4s per row of the K and V tiles.
    fn kv_stride(&self) -> u32 {
        let vec4s = self.dk4.max(self.dv4);
        if self.chunked {
            Self::in_chunks(vec4s)
        } else {
            vec4s + 1
        }
    }

    /// Workgroup memory the kernel uses: the Q block, one K/V tile and P
    /// (the shuffle form: a K tile and a V tile, no P, and a flag for its
    /// subgroup layout), the rows' partial
    /// maxima and sums, their flags, the nonpad length and the V tile's
    /// non-finite flag.
    pub fn workgroup_bytes(&self) -> u32 {
        let (bq, bk) = (self.query_rows, self.keys_per_tile);
        let tiles = if self.shuffle {
            // and the layout flag
            16 * 2 * bk * self.kv_stride() + 4
        } else {
            16 * bk * self.kv_stride() + 16 * bq * self.p_stride()
        };
        16 * bq * self.q_stride() + tiles + 4 * bq * self.tk + 4 * bq + 8
    }

    /// vec4s per row of the P tile: BK / 4 and a vec4 of padding (so that
    /// the two rows a pair of invocations reads fall on different banks),
    /// in chunks of [`CHUNK_COLUMNS`] and a vec4 of padding each in the
    /// chunked form.
    fn p_stride(&self) -> u32 {
        let vec4s = self.keys_per_tile / 4;
        if self.chunked {
            Self::in_chunks(vec4s)
        } else {
            vec4s + 1
        }
    }

    /// Loop iterations one invocation runs per key tile (every loop counted,
    /// with margin), for drivers that cap them.
    pub fn loop_iterations_per_tile(&self) -> u64 {
        let wg = u64::from(self.invocations());
        let (bk, dk4, dv4) = (
            u64::from(self.keys_per_tile),
            u64::from(self.dk4),
            u64::from(self.dv4),
        );
        let (rq, rk, dvt, tk) = (
            u64::from(self.rq()),
            u64::from(self.rk()),
            u64::from(self.dvt()),
            u64::from(self.tk),
        );
        // A quad: its slot, and at head dims that are not multiples of 4
        // (rows off vec4 boundaries) four component reads.
        let staging = 5 * ((bk * dk4).div_ceil(wg) + (bk * dv4).div_ceil(wg)) + 2;
        let scores = rq * rk + dk4 * (1 + rk + rq * (1 + rk)) + rq * (1 + rk);
        let softmax = rq * (1 + tk + rk + dvt);
        let product = bk * (1 + dvt + rq * (1 + dvt));
        staging + scores + softmax + product + 8
    }

    /// Keys per dispatch so that no invocation exceeds `budget` loop
    /// iterations (all keys in one dispatch when there is no budget). Chunks
    /// start on tile boundaries so the kernel's tile grid lines up.
    pub fn keys_per_chunk(&self, keys: usize, budget: Option<u64>) -> usize {
        match budget {
            None => keys.max(1),
            Some(budget) => {
                // The Q block and the final gather run once per dispatch.
                let once = 5 * u64::from(self.query_rows * self.dk4)
                    .div_ceil(u64::from(self.invocations()))
                    + u64::from(self.rq()) * (3 + 2 * u64::from(self.dvt()) + u64::from(self.tk))
                    + 16;
                let tiles = (budget.saturating_sub(once) / self.loop_iterations_per_tile()).max(1);
                tiles as usize * self.keys_per_tile as usize
            }
        }
    }

    /// The pipeline key (every override the kernel takes): of
    /// `attention_tiled`, of `attention_tiled_wide` for more than 4 query
    /// rows per invocation, of `attention_tiled_shuffle` for the shuffle
    /// forms or of `attention_tiled_chunked` for the chunked ones.
    pub fn key(&self) -> PipelineKey {
        let kernel = if self.shuffle {
            crate::kernels::attention::tiled::ATTENTION_TILED_SHUFFLE
        } else if self.chunked {
            crate::kernels::attention::tiled::ATTENTION_TILED_CHUNKED
        } else if self.is_wide() {
            crate::kernels::attention::tiled::ATTENTION_TILED_WIDE
        } else {
            crate::kernels::attention::tiled::ATTENTION_TILED
        };
        let strides = if self.chunked {
            [("QB", self.q_chunks()), ("KB", self.kv_chunks())]
        } else {
            [("QS", self.q_stride()), ("KS", self.kv_stride())]
        };
        PipelineKey::new(kernel)
            .with(strides[0].0, i64::from(strides[0].1))
            .with(strides[1].0, i64::from(strides[1].1))
            .with("BQ", i64::from(self.query_rows))
            .with("BK", i64::from(self.keys_per_tile))
            .with("TQ", i64::from(self.tq))
            .with("TK", i64::from(self.tk))
            .with("WG", i64::from(self.invocations()))
            .with("RQ", i64::from(self.rq()))
            .with("RK", i64::from(self.rk()))
            .with("DK4", i64::from(self.dk4))
            .with("DV4", i64::from(self.dv4))
            .with("DVT", i64::from(self.dvt()))
            .with_flag("PREFETCH", self.prefetch)
            .with("SLOTS", i64::from(self.slots()))
    }

    /// The configuration in words, for `webattn info`.
    pub fn describe(&self) -> String {
        format!(
            "{} query rows x {}-key tiles, {}x{} invocations, {}x{} of S and {}x{} vec4 of O in registers each{}{}{}",
            self.query_rows,
            self.keys_per_tile,
            self.tq,
            self.tk,
            self.rq(),
            self.rk(),
            self.rq(),
            self.dvt(),
            if self.prefetch {
                ", the next tile prefetched into registers"
            } else {
                ""
            },
            if self.shuffle {
                ", row maxima and P by subgroup shuffles"
            } else {
                ""
            },
            if self.chunked {
                ", Q, K, V and P tiles in chunks of columns"
            } else {
                ""
            }
        )
    }
}

/// Register-tiled fused attention for GPUs.
pub const ATTENTION_TILED: Kernel = Kernel::new(&KernelDef {
    name: crate::kernels::attention::names::TILED,
    origin: Origin::Generated("attention_tiled.wgsl", || {
        generator::render(TiledForm::Plain)
    }),
    slots: &[],
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
    needs: Needs::CORE,
    specialised_per_call: true,
});
/// The register-tiled kernel with up to 8 query rows per invocation, for the shapes only the tuner tries.
pub const ATTENTION_TILED_WIDE: Kernel = Kernel::new(&KernelDef {
    name: "attention_tiled_wide",
    origin: Origin::Generated("attention_tiled_wide.wgsl", || {
        generator::render(TiledForm::Wide)
    }),
    slots: &[],
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
    needs: Needs::CORE,
    specialised_per_call: true,
});
/// The register-tiled kernel whose row maxima and probabilities move between a row's invocations by subgroup shuffles.
pub const ATTENTION_TILED_SHUFFLE: Kernel = Kernel::new(&KernelDef {
    name: crate::kernels::attention::names::TILED_SHUFFLE,
    origin: Origin::Generated("attention_tiled_shuffle.wgsl", || {
        generator::render(TiledForm::Shuffle)
    }),
    slots: &[],
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
    needs: Needs::SUBGROUPS,
    specialised_per_call: true,
});
/// The register-tiled kernel with its Q, K, V and P tiles in chunks of columns (one index clamp per row and chunk).
pub const ATTENTION_TILED_CHUNKED: Kernel = Kernel::new(&KernelDef {
    name: crate::kernels::attention::names::TILED_CHUNKED,
    origin: Origin::Generated("attention_tiled_chunked.wgsl", || {
        generator::render(TiledForm::Chunked)
    }),
    slots: &[],
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
    needs: Needs::CORE,
    specialised_per_call: true,
});

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(storage: u32) -> KernelLimits {
        KernelLimits {
            max_compute_workgroup_storage_size: storage,
            ..KernelLimits::WEBGPU_DEFAULTS
        }
    }

    #[test]
    fn chunked_forms_are_tuner_only_and_chunk_as_the_kernel_does() {
        let line = format!("const CW: u32 = {CHUNK_COLUMNS}u;");
        assert!(crate::kernels::attention::tiled::ATTENTION_TILED_CHUNKED
            .source()
            .contains(&line));
        for d in [1, 64, 65, 128, 256] {
            let all = TiledTiles::candidates(d, d);
            let chunked: Vec<_> = all.iter().filter(|t| t.chunked).collect();
            assert!(chunked.iter().any(|t| t.prefetch) && chunked.iter().any(|t| !t.prefetch));
            assert!(chunked
                .iter()
                .all(|t| !t.shuffle && !t.is_wide() && !t.is_measured() && t.query_rows >= 32));
            for storage in [16 << 10, 32 << 10, 48 << 10] {
                if let Some(t) = TiledTiles::for_dims(d, d, &limits(storage)) {
                    assert!(!t.chunked, "{t:?}");
                }
            }
        }
        // A vec4 of padding per 8 columns instead of per row: at head dim 64,
        // rows of 18 vec4s instead of 17; P's rows of 8 vec4s (32 keys) have
        // one in both forms.
        let t = TiledTiles::for_dims(64, 64, &limits(48 << 10)).unwrap();
        assert_eq!(t.keys_per_tile, 32);
        let chunked = TiledTiles { chunked: true, ..t };
        assert_eq!(
            chunked.workgroup_bytes() - t.workgroup_bytes(),
            16 * (t.query_rows + t.keys_per_tile)
        );
        let key = chunked.key();
        assert_eq!(
            key.kernel,
            crate::kernels::attention::tiled::ATTENTION_TILED_CHUNKED
        );
        assert!(key.constants.contains(&("QB", 2)) && key.constants.contains(&("KB", 2)));
    }

    #[test]
    fn common_head_dims_get_large_tiles_on_large_adapters() {
        let t = TiledTiles::for_dims(64, 64, &limits(48 << 10)).unwrap();
        assert_eq!(
            (t.query_rows, t.keys_per_tile, t.invocations()),
            (64, 32, 256)
        );
        assert_eq!((t.rq(), t.rk(), t.dvt()), (4, 2, 1));
        let t = TiledTiles::for_dims(128, 128, &limits(48 << 10)).unwrap();
        assert_eq!((t.query_rows, t.keys_per_tile), (32, 32));
        assert_eq!((t.rq(), t.rk(), t.dvt()), (2, 2, 2));
        assert!(t.workgroup_bytes() <= 48 << 10);
    }

    #[test]
    fn webgpu_defaults_fit_up_to_128_and_larger_dims_fall_back() {
        for d in [1, 7, 64, 65, 128] {
            let t = TiledTiles::for_dims(d, d, &limits(16 << 10)).unwrap();
            assert!(t.workgroup_bytes() <= 16 << 10, "{d}: {t:?}");
        }
        assert!(TiledTiles::for_dims(256, 256, &limits(16 << 10)).is_none());
        assert!(TiledTiles::for_dims(256, 256, &limits(48 << 10)).is_some());
    }

    #[test]
    fn register_blocks_stay_within_the_kernel_arrays() {
        for d in [1, 4, 8, 63, 64, 65, 128, 200, 256] {
            for t in TiledTiles::candidates(d, d) {
                assert!(
                    t.rq() * t.rk() <= MAX_S && t.rq() * t.dvt() <= MAX_O,
                    "{t:?}"
                );
                assert_eq!(t.rq() * t.tq, t.query_rows);
                assert_eq!(t.rk() * t.tk, t.keys_per_tile);
                assert_eq!(t.keys_per_tile % 4, 0, "{t:?}");
                assert!(!t.prefetch || t.slots() <= MAX_SLOTS, "{t:?}");
            }
        }
    }

    #[test]
    fn tuner_only_shapes_are_candidates_but_never_the_default() {
        let all = TiledTiles::candidates(64, 64);
        let eight_rows = all
            .iter()
            .find(|t| (t.query_rows, t.keys_per_tile, t.tq, t.tk) == (64, 32, 8, 8) && !t.prefetch)
            .expect("64 x 32 on 8 x 8 at head dim 64");
        assert_eq!(
            (eight_rows.rq(), eight_rows.rk(), eight_rows.dvt()),
            (8, 4, 2)
        );
        assert!(eight_rows.fits(&limits(48 << 10)) && !eight_rows.is_measured());
        let d128 = TiledTiles::candidates(128, 128);
        assert!(d128
            .iter()
            .any(|t| (t.query_rows, t.tq, t.tk) == (32, 4, 16) && t.fits(&limits(48 << 10))));
        for d in [1, 64, 65, 128, 200, 256] {
            for storage in [16 << 10, 32 << 10, 48 << 10, 64 << 10] {
                if let Some(t) = TiledTiles::for_dims(d, d, &limits(storage)) {
                    assert!(t.is_measured(), "{t:?}");
                }
            }
        }
    }

    #[test]
    fn prefetching_shapes_follow_the_measured_ones_and_are_never_the_default() {
        for d in [64, 128, 256] {
            let all = TiledTiles::candidates(d, d);
            let first_prefetch = all.iter().position(|t| t.prefetch).expect("some prefetch");
            assert!(
                all[first_prefetch..]
                    .iter()
                    .all(|t| t.prefetch || t.chunked || t.shuffle),
                "{all:?}"
            );
            for storage in [16 << 10, 32 << 10, 48 << 10] {
                if let Some(t) = TiledTiles::for_dims(d, d, &limits(storage)) {
                    assert!(!t.prefetch, "{t:?}");
                }
            }
        }
        // An H100's first shapes prefetch two (d 64) and four (d 128) vec4s.
        let t = TiledTiles::for_dims(64, 64, &limits(48 << 10)).unwrap();
        assert_eq!(
            TiledTiles {
                prefetch: true,
                ..t
            }
            .slots(),
            2
        );
        let t = TiledTiles::for_dims(128, 128, &limits(48 << 10)).unwrap();
        assert_eq!(
            TiledTiles {
                prefetch: true,
                ..t
            }
            .slots(),
            4
        );
    }

    #[test]
    fn chunks_under_a_loop_budget_are_whole_tiles() {
        let t = TiledTiles::for_dims(64, 64, &limits(32 << 10)).unwrap();
        let chunk = t.keys_per_chunk(100_000, Some(16_000));
        assert_eq!(chunk % t.keys_per_tile as usize, 0);
        assert!(chunk >= t.keys_per_tile as usize);
        assert_eq!(t.keys_per_chunk(77, None), 77);
    }

    #[test]
    fn shuffle_forms_come_last_need_subgroups_and_are_never_the_default() {
        use crate::device::capabilities::Capabilities;
        for d in [1, 64, 128, 256] {
            let all = TiledTiles::candidates(d, d);
            let first = all
                .iter()
                .position(|t| t.shuffle)
                .expect("some shuffle form");
            assert!(all[first..].iter().all(|t| t.shuffle), "{all:?}");
            assert!(all[first..].iter().all(|t| !t.is_wide()
                && t.tk.is_power_of_two()
                && t.tk >= SHUFFLE_MIN_TK
                && t.query_rows >= 32));
            assert!(
                all[first..].iter().any(|t| t.prefetch) && all[first..].iter().any(|t| !t.prefetch)
            );
            for storage in [16 << 10, 32 << 10, 48 << 10] {
                if let Some(t) = TiledTiles::for_dims(d, d, &limits(storage)) {
                    assert!(!t.shuffle, "{t:?}");
                }
            }
        }
        // A shuffle form holds a K and a V tile and no P (whose rows hold
        // BK / 4 vec4s and one of padding).
        let t = TiledTiles::for_dims(64, 64, &limits(48 << 10)).unwrap();
        let shuffled = TiledTiles { shuffle: true, ..t };
        assert_eq!(
            shuffled.workgroup_bytes() + 16 * t.query_rows * (t.keys_per_tile / 4 + 1),
            t.workgroup_bytes() + 16 * t.keys_per_tile * t.kv_stride() + 4
        );
        assert_eq!(
            shuffled.key().kernel,
            crate::kernels::attention::tiled::ATTENTION_TILED_SHUFFLE
        );
        // It runs only where subgroups hold a row's tk lanes.
        let mut caps = Capabilities::synthetic("DiscreteGpu");
        caps.limits.max_compute_workgroup_storage_size = 48 << 10;
        caps.subgroups = true;
        caps.subgroup_min_size = 32;
        caps.subgroup_max_size = 32;
        assert!(shuffled.runs_on(&caps) && t.runs_on(&caps));
        caps.subgroup_min_size = t.tk / 2;
        assert!(!shuffled.runs_on(&caps) && t.runs_on(&caps));
        caps.subgroups = false;
        caps.subgroup_min_size = 32;
        assert!(!shuffled.runs_on(&caps));
    }
}
