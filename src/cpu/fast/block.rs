//! One query block of one (batch, query head) against its keys: FlashAttention
//! on the CPU. For each key tile the micro-kernel computes the scores
//! transposed, `Sᵀ = K Qᵀ` (keys × queries), so that every step after it runs
//! across the block's queries in vector lanes: the bias and mask, the running
//! maximum, the exponentials and the running sums (online softmax) are all
//! element-wise over a row of `Sᵀ`, with no horizontal reduction, and `Pᵀ`
//! is already in the layout the `O += P V` micro-kernel reads. Key tiles
//! outside every row's interval are skipped.
//!
//! Non-finite values follow the oracle's rule (`cpu::head::attend_row`): a row
//! that attends a NaN or `+inf` score, or whose attended scores are all `-inf`,
//! is NaN; a row that attends nothing is zero (logsumexp `-inf`); attended keys
//! with a `-inf` score get probability 0 but still multiply their value row;
//! keys the row does not attend take no part. Masked keys get probability 0,
//! which is the same as skipping them while their values are finite; tiles
//! holding a non-finite value are accumulated key by key, attended keys only.

use super::dots::dots;
use super::isa::Job;
use super::kernel::{load, outer, outer_a_rows, outer_b_rows, pack_panel, store};
use super::math::{all_finite, exp, madd, tanh};
use super::pack::{pack_tile, KvSource, PackedKv, TileShape};
use super::rules::{masks, HeadRules, MaskBias};
use super::stored::StoredRows;
use crate::options::{AttentionOptions, QkMatmulOutputMode};
use crate::problem::AttentionDims;

/// The most query rows of a block read in place whose scores put the keys
/// in the vector lanes (and whose values are added row by row).
const KEYS_IN_LANES_ROWS: usize = 2;

/// Everything the blocks of one call share, read-only.
#[derive(Debug)]
pub(crate) struct Shared<'a> {
    pub dims: AttentionDims,
    pub options: &'a AttentionOptions,
    /// Q `[B, Hq, Nq, Dk]`.
    pub q: &'a [f32],
    /// Where K and V come from.
    pub src: KvSource<'a>,
    /// K and V per `b · Hkv + kv head`, packed once when several work items
    /// read them; `None` packs each tile as a block reaches it.
    pub packed: Option<Vec<PackedKv>>,
    /// The tile geometry (`mr`, `nr` match the kernels' `MR`, `NR`).
    pub shape: TileShape,
    /// Read K and V rows in place instead of packing tiles (a decoding step:
    /// each key and value is read once; needs `Dv` a multiple of `nr`).
    pub in_place: bool,
    pub mask: Option<MaskBias<'a>>,
    pub nonpad: Option<&'a [i64]>,
    /// ALiBi slopes per query head (empty without ALiBi).
    pub slopes: Vec<f32>,
    pub scale: f32,
    /// Query rows per block (a multiple of `mr` and `nr`).
    pub bq: usize,
}

impl Shared<'_> {
    /// The rules of batch `b`, query head `h`.
    pub(crate) fn rules(&self, b: usize, h: usize) -> HeadRules {
        HeadRules::new(&self.dims, self.options, self.nonpad, &self.slopes, b, h)
    }

    /// Tile `tile` (keys `j0 .. j0 + nk`) of batch-and-KV-head `bkv`: its
    /// packed keys and values and whether the values are all finite; packed
    /// into `keys` and `values` now unless the call packed every tile up front.
    pub(crate) fn tile<'s>(
        &'s self,
        bkv: usize,
        tile: usize,
        keys: &'s mut Vec<f32>,
        values: &'s mut Vec<f32>,
    ) -> (&'s [f32], &'s [f32], bool) {
        let dk = self.dims.head_dim;
        match &self.packed {
            Some(packed) => packed[bkv].tile(tile, &self.shape, dk),
            None => {
                let j0 = tile * self.shape.bk;
                let nk = self.shape.bk.min(self.dims.total_len() - j0);
                keys.resize(self.shape.key_len(dk), 0.0);
                values.resize(self.shape.value_len(), 0.0);
                let finite = pack_tile(&self.src, &self.shape, bkv, j0, nk, keys, values);
                (keys, values, finite)
            }
        }
    }

    /// The keys `[lo, hi)` some row of the block starting at row `i0` of its
    /// unit attends (row `i` is query `i % Nq`: see [`Unit`]).
    pub(crate) fn block_keys(&self, rules: &HeadRules, i0: usize, rows: usize) -> (usize, usize) {
        let (mut lo, mut hi) = (usize::MAX, 0);
        for i in i0..i0 + rows {
            let (a, b) = rules.interval(i % self.dims.q_len);
            if a < b {
                lo = lo.min(a);
                hi = hi.max(b);
            }
        }
        if lo < hi {
            (lo, hi)
        } else {
            (0, 0)
        }
    }
}

/// One work item: a block of query rows of one batch entry, with the slices
/// of the outputs it writes. Its rows are rows `i0 ..` of the `Nq` rows of
/// query head `h` and of the heads after it (a decoding step's unit holds the
/// query heads of a GQA group, which read one K and V and fill the vector
/// lanes together): row `i0 + r` is query `(i0 + r) % Nq` of head
/// `h + (i0 + r) / Nq`, and Q and the outputs hold them one after another.
#[derive(Debug)]
pub(crate) struct Unit<'o> {
    pub b: usize,
    pub h: usize,
    pub i0: usize,
    pub rows: usize,
    /// `Nq`: rows per head.
    pub q_len: usize,
    /// `[rows, Dv]`.
    pub y: &'o mut [f32],
    /// `[rows]`.
    pub lse: &'o mut [f32],
    /// `[rows, T]`, or empty when `qk_matmul_output` is not asked for.
    pub qk: &'o mut [f32],
}

/// One thread's working memory, reused across units. Per-query vectors have
/// `bq` entries (queries past the block are padding that attends nothing).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// The Q block packed in panels of `nr` queries: `[bq / nr][Dk][nr]`.
    q: Vec<f32>,
    /// Scores, then probabilities, of a tile, transposed: `[bk][bq]`.
    st: Vec<f32>,
    /// The mask of a tile, transposed like `st` (only with a mask).
    mt: Vec<f32>,
    /// The output accumulators `[bq][ldv]`.
    o: Vec<f32>,
    /// Per query: the keys `[lo, hi)` the position rules allow, and its position.
    lo: Vec<i32>,
    hi: Vec<i32>,
    pos: Vec<i32>,
    /// Per query: the running maximum and sum, the tile's maximum.
    max: Vec<f32>,
    sum: Vec<f32>,
    tile_max: Vec<f32>,
    /// Per query: attended keys so far, and NaN/+inf scores among them.
    kept: Vec<u32>,
    bad: Vec<u32>,
    /// A tile's scores for one query ([`scores_keys_in_lanes`]).
    dots: Vec<f32>,
    /// The output rows before a tile, to put back (see [`accumulate_values`]).
    saved: Vec<f32>,
    /// A tile's keys and values, when the block packs them itself.
    keys: Vec<f32>,
    values: Vec<f32>,
}

/// Runs one unit in the instruction set the job is instantiated for.
pub(crate) struct UnitJob<'s, 'a, 'o> {
    pub shared: &'s Shared<'a>,
    pub unit: Unit<'o>,
    pub scratch: &'s mut Scratch,
}

impl Job for UnitJob<'_, '_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<const MR: usize, const NR: usize, const FMA: bool>(self) {
        // Reading K and V in place is a narrow-tile mode: wide instantiations
        // never contain that code (with it, the compiler kept the P·V
        // accumulators in memory, several times slower).
        if MR == 4 && self.shared.in_place {
            attend_block::<MR, NR, FMA, true>(self.shared, self.unit, self.scratch);
        } else {
            attend_block::<MR, NR, FMA, false>(self.shared, self.unit, self.scratch);
        }
    }
}

/// Sets `v` to `n` copies of `x`.
fn reset<T: Copy>(v: &mut Vec<T>, n: usize, x: T) {
    v.clear();
    v.resize(n, x);
}

/// The mask values of keys `j0 .. j0 + nk` for the block's queries,
/// transposed like the score tile (`[bk][bq]`; `-inf` past a mask row's end
/// and for padding queries).
fn mask_tile(
    mask: &MaskBias<'_>,
    unit: &Unit<'_>,
    (j0, nk): (usize, usize),
    (bq, bk): (usize, usize),
    mt: &mut Vec<f32>,
) {
    mt.resize(bk * bq, 0.0);
    for q in 0..bq {
        let (nq, i) = (unit.q_len, unit.i0 + q);
        let row = (q < unit.rows).then(|| mask.row(unit.b, unit.h + i / nq, i % nq));
        for k in 0..nk {
            mt[k * bq + q] = match row {
                Some(r) if j0 + k < r.len() => r[j0 + k],
                _ => f32::NEG_INFINITY,
            };
        }
    }
}

/// Resets `s` for `unit`: its Q rows packed in panels of `NR` queries (zeros
/// past the last), empty accumulators, and each query's key interval,
/// position and softmax state.
#[inline(always)]
fn start_block<const NR: usize>(
    sh: &Shared<'_>,
    unit: &Unit<'_>,
    rules: &HeadRules,
    s: &mut Scratch,
) {
    let d = &sh.dims;
    let (dk, bq, rows) = (d.head_dim, sh.bq, unit.rows);
    let (bk, ldv) = (sh.shape.bk, sh.shape.ldv);
    // The Q block in panels of NR queries (zero queries after the last).
    s.q.resize(bq * dk, 0.0);
    let q_start = ((unit.b * d.q_heads + unit.h) * d.q_len + unit.i0) * dk;
    for p in 0..bq / NR {
        let first = p * NR;
        pack_panel::<NR>(
            &sh.q[q_start + first.min(rows) * dk..],
            dk,
            rows.saturating_sub(first).min(NR),
            dk,
            &mut s.q[p * NR * dk..],
        );
    }
    s.st.resize(bk * bq, 0.0);
    reset(&mut s.o, bq * ldv, 0.0);
    reset(&mut s.lo, bq, 0);
    reset(&mut s.hi, bq, 0);
    reset(&mut s.pos, bq, 0);
    for r in 0..rows {
        // The position rules are the batch entry's, the same for every head.
        let i = (unit.i0 + r) % d.q_len;
        let (lo, hi) = rules.interval(i);
        s.lo[r] = lo as i32;
        s.hi[r] = hi as i32;
        s.pos[r] = rules.position(i) as i32;
    }
    reset(&mut s.max, bq, f32::NEG_INFINITY);
    reset(&mut s.sum, bq, 0.0);
    reset(&mut s.kept, bq, 0);
    reset(&mut s.bad, bq, 0);
}

#[inline(always)]
fn attend_block<const MR: usize, const NR: usize, const FMA: bool, const IN_PLACE: bool>(
    sh: &Shared<'_>,
    unit: Unit<'_>,
    scratch: &mut Scratch,
) {
    debug_assert_eq!((MR, NR), (sh.shape.mr, sh.shape.nr));
    let d = &sh.dims;
    let (dk, t_len) = (d.head_dim, d.total_len());
    let (bq, bk, ldv) = (sh.bq, sh.shape.bk, sh.shape.ldv);
    let bkv = unit.b * d.kv_heads + unit.h / d.group();
    let (mut tile_keys, mut tile_values) = (
        std::mem::take(&mut scratch.keys),
        std::mem::take(&mut scratch.values),
    );
    let rules = sh.rules(unit.b, unit.h);
    let rows = unit.rows;
    let opts = sh.options;

    start_block::<NR>(sh, &unit, &rules, scratch);

    let mode = opts.qk_matmul_output_mode;
    let capture = matches!(
        mode,
        Some(QkMatmulOutputMode::Biased | QkMatmulOutputMode::Probabilities)
    );
    match mode {
        Some(QkMatmulOutputMode::Scaled | QkMatmulOutputMode::Softcapped) => {
            raw_scores::<MR, NR, FMA>(
                sh,
                bkv,
                &scratch.q,
                &mut scratch.st,
                (&mut tile_keys, &mut tile_values),
                unit.qk,
            );
        }
        Some(_) => unit.qk.fill(f32::NEG_INFINITY),
        None => {}
    }

    let (klo, khi) = sh.block_keys(&rules, unit.i0, rows);
    let tiles = if klo < khi {
        klo / bk..khi.div_ceil(bk)
    } else {
        0..0
    };
    let zero_key = vec![0.0f32; if IN_PLACE { dk } else { 0 }];
    // Rows a store keeps as f16 or int8, widened a tile at a time.
    let (mut widened_keys, mut widened_values) = (Vec::new(), Vec::new());
    // One or two queries read in place take the keys into the lanes instead.
    let keys_in_lanes = IN_PLACE && rows <= KEYS_IN_LANES_ROWS;
    for tile in tiles {
        let j0 = tile * bk;
        let nk = bk.min(t_len - j0);
        let value_rows: Vec<&[f32]>;
        let (values, finite) = if IN_PLACE {
            // The next tile's keys and values on their way while this one is
            // computed: a step reads each once, and the hardware prefetchers
            // alone left a core at a quarter of its read bandwidth.
            prefetch_rows(&sh.src, bkv, (j0 + nk, bk.min(t_len - j0 - nk)));
            value_rows = tile_rows(&sh.src, true, bkv, (j0, nk), &mut widened_values);
            let key_rows = tile_rows(&sh.src, false, bkv, (j0, nk), &mut widened_keys);
            if keys_in_lanes {
                scores_keys_in_lanes(sh, &unit, &key_rows, scratch);
            } else {
                scores_in_place::<MR, NR>(sh, &key_rows, &zero_key, &scratch.q, &mut scratch.st);
            }
            // One or two queries check their sums instead, after the fact.
            let finite = (!keys_in_lanes).then(|| value_rows.iter().all(|r| all_finite(r)));
            (&[][..], finite)
        } else {
            value_rows = Vec::new();
            let (keys, values, finite) = sh.tile(bkv, tile, &mut tile_keys, &mut tile_values);
            scores_t::<MR, NR>(sh, keys, nk, &scratch.q, &mut scratch.st);
            (values, Some(finite))
        };
        if opts.softcap > 0.0 {
            let c = opts.softcap;
            for x in &mut scratch.st[..nk * bq] {
                *x = c * tanh::<FMA>(*x / c);
            }
        }
        if let Some(mask) = &sh.mask {
            mask_tile(mask, &unit, (j0, nk), (bq, bk), &mut scratch.mt);
        }
        apply_bias(j0, nk, bq, sh.mask.is_some(), rules.slope, scratch);
        if capture {
            for (q, out) in unit.qk.chunks_exact_mut(t_len).enumerate() {
                for (k, o) in out[j0..j0 + nk].iter_mut().enumerate() {
                    *o = scratch.st[k * bq + q];
                }
            }
        }
        online_softmax::<FMA>(nk, bq, ldv, opts.temperature, scratch);

        accumulate_values::<MR, NR, FMA, IN_PLACE>(
            sh,
            (values, &value_rows),
            finite,
            (j0, nk, rows),
            scratch,
        );
    }
    (scratch.keys, scratch.values) = (tile_keys, tile_values);
    finish::<FMA>(sh, unit, scratch, capture);
}

/// `O += P V` for one tile: `Pᵀ` in `s.st`, the values as packed panels or,
/// when `IN_PLACE`, as rows read in place. Masked keys have probability 0,
/// which adds nothing while the tile's values are all finite; a tile with a
/// non-finite value adds its attended keys only, one by one. `finite: None`
/// (one or two queries, values in place) has the sums say it: a non-finite
/// value makes every sum it enters non-finite for good, so a tile whose sums
/// stay finite had finite values; otherwise the sums are put back and the
/// tile is added key by key.
#[inline(always)]
fn accumulate_values<const MR: usize, const NR: usize, const FMA: bool, const IN_PLACE: bool>(
    sh: &Shared<'_>,
    (values, value_rows): (&[f32], &[&[f32]]),
    finite: Option<bool>,
    (j0, nk, rows): (usize, usize, usize),
    scratch: &mut Scratch,
) {
    let (bq, bk, ldv) = (sh.bq, sh.shape.bk, sh.shape.ldv);
    // Groups of MR queries past the last real one are skipped.
    let groups = rows.div_ceil(MR);
    let check_after = finite.is_none();
    let finite = finite.unwrap_or(true);
    if finite && IN_PLACE && rows <= KEYS_IN_LANES_ROWS {
        // One or two queries (a decoding step): each output row adds its
        // value rows one by one, the same sums in the same order as the
        // micro-kernel, without its padding rows.
        let sums = rows * ldv;
        if check_after {
            scratch.saved.clear();
            scratch.saved.extend_from_slice(&scratch.o[..sums]);
        }
        for q in 0..rows {
            let o_row = &mut scratch.o[q * ldv..(q + 1) * ldv];
            for (k, v) in value_rows.iter().enumerate() {
                let p = scratch.st[k * bq + q];
                for (acc, &x) in o_row.iter_mut().zip(v.iter()) {
                    *acc = madd::<FMA>(p, x, *acc);
                }
            }
        }
        if !check_after || all_finite(&scratch.o[..sums]) {
            return;
        }
        scratch.o[..sums].copy_from_slice(&scratch.saved);
        return attended_keys_only::<NR, FMA, IN_PLACE>(
            sh,
            (values, value_rows),
            (j0, nk, rows),
            scratch,
        );
    }
    let st = &scratch.st;
    if finite && IN_PLACE {
        for c in 0..ldv / NR {
            for g in 0..groups {
                let out = &mut scratch.o[g * MR * ldv + c * NR..];
                let mut acc = load::<MR, NR>(out, ldv, MR);
                outer_b_rows::<MR, NR, FMA>(&st[g * MR..], bq, value_rows, c * NR, &mut acc);
                store(&acc, out, ldv, MR, NR);
            }
        }
    } else if finite {
        // Value panels outside, so a panel of the tile stays in L1 while
        // every group of queries passes over it.
        for c in 0..ldv / NR {
            let panel = &values[c * bk * NR..(c + 1) * bk * NR];
            for g in 0..groups {
                let out = &mut scratch.o[g * MR * ldv + c * NR..];
                let mut acc = load::<MR, NR>(out, ldv, MR);
                outer::<MR, NR, FMA>(nk, &st[g * MR..], bq, panel, &mut acc);
                store(&acc, out, ldv, MR, NR);
            }
        }
    } else {
        attended_keys_only::<NR, FMA, IN_PLACE>(sh, (values, value_rows), (j0, nk, rows), scratch);
    }
}

/// [`accumulate_values`] for a tile holding a non-finite value: each row adds
/// the keys it attends, one by one.
#[inline(always)]
fn attended_keys_only<const NR: usize, const FMA: bool, const IN_PLACE: bool>(
    sh: &Shared<'_>,
    (values, value_rows): (&[f32], &[&[f32]]),
    (j0, nk, rows): (usize, usize, usize),
    scratch: &mut Scratch,
) {
    let (bq, bk, ldv) = (sh.bq, sh.shape.bk, sh.shape.ldv);
    let st = &scratch.st;
    for q in 0..rows {
        let (lo, hi) = (scratch.lo[q], scratch.hi[q]);
        let o_row = &mut scratch.o[q * ldv..(q + 1) * ldv];
        for k in 0..nk {
            let j = (j0 + k) as i32;
            let masked = sh.mask.is_some() && masks(scratch.mt[k * bq + q]);
            if j < lo || j >= hi || masked {
                continue;
            }
            let p = st[k * bq + q];
            for (c, out) in o_row.chunks_exact_mut(NR).enumerate() {
                let v = if IN_PLACE {
                    &value_rows[k][c * NR..(c + 1) * NR]
                } else {
                    &values[(c * bk + k) * NR..(c * bk + k + 1) * NR]
                };
                for (acc, &x) in out.iter_mut().zip(v) {
                    *acc = madd::<FMA>(p, x, *acc);
                }
            }
        }
    }
}

/// `Sᵀ[k][q] = scale · K[k] · Q[q]` for the tile's `nk` keys (`keys`, packed
/// by [`pack_tile`]) and every query of the block, into `st` (`[bk][bq]`). Each dot product is summed in
/// order of d with a rounded product and a rounded sum per step: the same
/// numbers as the plain f32 computation whose error sets the tolerance.
/// (Fused multiply-adds round differently, and with large logits that cancel
/// they were seen to exceed twice its error.)
#[inline(always)]
pub(crate) fn scores_t<const MR: usize, const NR: usize>(
    sh: &Shared<'_>,
    keys: &[f32],
    nk: usize,
    q: &[f32],
    st: &mut [f32],
) {
    let (dk, bq) = (sh.dims.head_dim, sh.bq);
    for g in 0..nk.div_ceil(MR) {
        let keys = &keys[g * dk * MR..(g + 1) * dk * MR];
        for p in 0..bq / NR {
            let mut acc = [[0.0f32; NR]; MR];
            outer::<MR, NR, false>(dk, keys, MR, &q[p * NR * dk..], &mut acc);
            let out = &mut st[g * MR * bq + p * NR..];
            for (r, row) in acc.iter().enumerate() {
                let dst = &mut out[r * bq..r * bq + NR];
                for j in 0..NR {
                    dst[j] = row[j] * sh.scale;
                }
            }
        }
    }
}

/// The run of stored rows holding row `j0 + k` of `bkv`'s keys (or values)
/// and how many of its rows fall before `j0 + nk` (a page's rows where a
/// paged cache holds them).
#[inline(always)]
fn run_at<'r>(
    src: &KvSource<'r>,
    value: bool,
    bkv: usize,
    (j0, nk): (usize, usize),
    k: usize,
) -> (StoredRows<'r>, usize) {
    let run = src.rows(value, bkv, j0 + k);
    let n = run.len(src.width(value)).min(nk - k);
    (run, n)
}

/// Asks the CPU to bring rows `j0 .. j0 + nk` of `bkv`'s keys and values
/// into its caches.
#[inline(always)]
fn prefetch_rows(src: &KvSource<'_>, bkv: usize, (j0, nk): (usize, usize)) {
    for value in [false, true] {
        let mut k = 0;
        while k < nk {
            let (run, n) = run_at(src, value, bkv, (j0, nk), k);
            run.prefetch(n, src.width(value));
            k += n;
        }
    }
}

/// The rows of keys (or values, where `value`) `j0 .. j0 + nk` of `bkv` as
/// f32: in place where stored as f32, else widened into `widened`.
#[inline(always)]
fn tile_rows<'r>(
    src: &KvSource<'r>,
    value: bool,
    bkv: usize,
    (j0, nk): (usize, usize),
    widened: &'r mut Vec<f32>,
) -> Vec<&'r [f32]> {
    let width = src.width(value);
    let mut rows = Vec::with_capacity(nk);
    let mut k = 0;
    while k < nk {
        let (run, n) = run_at(src, value, bkv, (j0, nk), k);
        let StoredRows::F32(r) = run else {
            break;
        };
        rows.extend(r[..n * width].chunks_exact(width));
        k += n;
    }
    if k == nk {
        return rows;
    }
    rows.clear();
    widened.resize(nk * width, 0.0);
    let mut k = 0;
    while k < nk {
        let (run, n) = run_at(src, value, bkv, (j0, nk), k);
        run.widen_rows(n, width, &mut widened[k * width..]);
        k += n;
    }
    rows.extend(widened.chunks_exact(width));
    rows
}

/// [`scores_t`] reading the tile's key rows in place (`zero_key` stands for
/// the keys past the last).
#[inline(always)]
fn scores_in_place<const MR: usize, const NR: usize>(
    sh: &Shared<'_>,
    key_rows: &[&[f32]],
    zero_key: &[f32],
    q: &[f32],
    st: &mut [f32],
) {
    let (dk, bq, nk) = (sh.dims.head_dim, sh.bq, key_rows.len());
    for g in 0..nk.div_ceil(MR) {
        let keys: [&[f32]; MR] = std::array::from_fn(|r| {
            let k = g * MR + r;
            if k < nk {
                key_rows[k]
            } else {
                zero_key
            }
        });
        for p in 0..bq / NR {
            let mut acc = [[0.0f32; NR]; MR];
            outer_a_rows::<MR, NR, false>(dk, &keys, &q[p * NR * dk..], &mut acc);
            let out = &mut st[g * MR * bq + p * NR..];
            for (r, row) in acc.iter().enumerate() {
                let dst = &mut out[r * bq..r * bq + NR];
                for j in 0..NR {
                    dst[j] = row[j] * sh.scale;
                }
            }
        }
    }
}

/// [`scores_t`] for the block's one or two queries, with the tile's key rows
/// in the vector lanes ([`dots`]; the same sums): queries past the block's
/// rows score 0 (they attend nothing).
fn scores_keys_in_lanes(sh: &Shared<'_>, unit: &Unit<'_>, keys: &[&[f32]], s: &mut Scratch) {
    let (d, bq, nk) = (&sh.dims, sh.bq, keys.len());
    let dk = d.head_dim;
    let q_start = ((unit.b * d.q_heads + unit.h) * d.q_len + unit.i0) * dk;
    s.dots.resize(nk, 0.0);
    for k in 0..nk {
        s.st[k * bq..(k + 1) * bq].fill(0.0);
    }
    for r in 0..unit.rows {
        dots(keys, &sh.q[q_start + r * dk..][..dk], &mut s.dots);
        for (k, &x) in s.dots.iter().enumerate() {
            s.st[k * bq + r] = x * sh.scale;
        }
    }
}

/// Turns a tile's scaled (and softcapped) scores into its biased scores:
/// keys outside a query's interval and masked keys become `-inf`; the others
/// get the mask value (`s.mt`, when `mask`) and `-slope · |p − j|` added.
/// Counts the attended keys per query, flags NaN/`+inf` scores among them,
/// and leaves each query's largest score of the tile in `tile_max`.
#[inline(always)]
fn apply_bias(j0: usize, nk: usize, bq: usize, mask: bool, slope: f32, s: &mut Scratch) {
    match (mask, slope != 0.0) {
        (false, false) => biased_rows::<false, false>(j0, nk, bq, slope, s),
        (false, true) => biased_rows::<false, true>(j0, nk, bq, slope, s),
        (true, false) => biased_rows::<true, false>(j0, nk, bq, slope, s),
        (true, true) => biased_rows::<true, true>(j0, nk, bq, slope, s),
    }
}

/// [`apply_bias`] for one combination of mask and ALiBi.
#[inline(always)]
fn biased_rows<const MASK: bool, const ALIBI: bool>(
    j0: usize,
    nk: usize,
    bq: usize,
    slope: f32,
    s: &mut Scratch,
) {
    reset(&mut s.tile_max, bq, f32::NEG_INFINITY);
    let (lo, hi, pos) = (&s.lo[..bq], &s.hi[..bq], &s.pos[..bq]);
    let (kept, bad, tile_max) = (&mut s.kept[..bq], &mut s.bad[..bq], &mut s.tile_max[..bq]);
    let mask = if MASK { &s.mt[..nk * bq] } else { &[][..] };
    for (k, row) in s.st[..nk * bq].chunks_exact_mut(bq).enumerate() {
        let j = (j0 + k) as i32;
        let mrow = if MASK {
            &mask[k * bq..(k + 1) * bq]
        } else {
            &[][..]
        };
        for q in 0..bq {
            let mut x = row[q];
            let mut keep = lo[q] <= j && j < hi[q];
            if MASK {
                let m = mrow[q];
                keep &= !masks(m);
                x += m;
            }
            if ALIBI {
                x -= slope * pos[q].wrapping_sub(j).wrapping_abs() as f32;
            }
            let x = if keep { x } else { f32::NEG_INFINITY };
            row[q] = x;
            kept[q] += u32::from(keep);
            bad[q] |= u32::from(x.is_nan() || x == f32::INFINITY);
            // `max` (NaN-ignoring, as the comparison was) and an unconditional
            // store: LLVM made `if x > m { m = x }` a masked store under AVX2,
            // which AMD cores run as microcode (a tenth of the whole kernel).
            tile_max[q] = tile_max[q].max(x);
        }
    }
}

/// Folds a tile's biased scores (`st`, `[nk][bq]`) into the running maxima
/// and sums, rescales the output rows whose maximum grew, and replaces the
/// scores with their probabilities relative to the running maximum.
#[inline(always)]
fn online_softmax<const FMA: bool>(nk: usize, bq: usize, ldv: usize, tau: f32, s: &mut Scratch) {
    let inv = tau != 1.0;
    for q in 0..bq {
        let (old, new) = (s.max[q], s.tile_max[q]);
        if new > old {
            // With no finite maximum before, the sum and output are Σ 0 (or
            // 0·NaN): nothing to rescale.
            if old > f32::NEG_INFINITY {
                let delta = old - new;
                let factor = exp::<FMA>(if inv { delta / tau } else { delta });
                s.sum[q] *= factor;
                for x in &mut s.o[q * ldv..(q + 1) * ldv] {
                    *x *= factor;
                }
            }
            s.max[q] = new;
        }
    }
    // The reference each query's scores are taken from: its running maximum,
    // or 0 while it has no finite one (every score is then -inf: 0 after exp).
    let reference = &mut s.tile_max[..bq];
    for (r, &m) in reference.iter_mut().zip(&s.max) {
        *r = if m.is_finite() { m } else { 0.0 };
    }
    let sum = &mut s.sum[..bq];
    for row in s.st[..nk * bq].chunks_exact_mut(bq) {
        for q in 0..bq {
            let x = row[q] - reference[q];
            let p = exp::<FMA>(if inv { x / tau } else { x });
            row[q] = p;
            sum[q] += p;
        }
    }
}

/// Y, the logsumexp, and mode 3's probabilities, from the block's state.
#[inline(always)]
fn finish<const FMA: bool>(sh: &Shared<'_>, unit: Unit<'_>, s: &Scratch, capture: bool) {
    let (dv, t_len) = (sh.dims.v_head_dim, sh.dims.total_len());
    let ldv = s.o.len() / sh.bq;
    let tau = sh.options.temperature;
    let mode3 = sh.options.qk_matmul_output_mode == Some(QkMatmulOutputMode::Probabilities);
    for r in 0..unit.rows {
        let (max, sum, any) = (s.max[r], s.sum[r], s.kept[r] > 0);
        let poisoned = s.bad[r] != 0 || (any && max == f32::NEG_INFINITY);
        let y = &mut unit.y[r * dv..(r + 1) * dv];
        if poisoned {
            y.fill(f32::NAN);
            unit.lse[r] = f32::NAN;
        } else if !any {
            y.fill(0.0);
            unit.lse[r] = f32::NEG_INFINITY;
        } else {
            for (out, &acc) in y.iter_mut().zip(&s.o[r * ldv..]) {
                *out = acc / sum;
            }
            unit.lse[r] = max / tau + sum.ln();
        }
        if capture && mode3 {
            let row = &mut unit.qk[r * t_len..(r + 1) * t_len];
            if poisoned {
                row.fill(f32::NAN);
            } else if !any {
                row.fill(0.0);
            } else if tau == 1.0 {
                for p in row.iter_mut() {
                    *p = exp::<FMA>(*p - max) / sum;
                }
            } else {
                for p in row.iter_mut() {
                    *p = exp::<FMA>((*p - max) / tau) / sum;
                }
            }
        }
    }
}

/// `qk_matmul_output` modes 0 and 1: the scaled scores (and their softcapped
/// form) of every key, masked or not, for one query block. Modes 2 and 3 are
/// captured by the block kernel itself as it goes.
///
/// Writes `scale · Q Kᵀ` (mode 0) or its softcapped form (mode 1) for the
/// block's queries (`q`, packed as the block kernel packs them) into `out`
/// (`[rows, T]`), using `st` (`[bk][bq]`) as the tile buffer and `tile` for
/// tiles packed on the way ([`Shared::tile`]).
#[inline(always)]
pub(crate) fn raw_scores<const MR: usize, const NR: usize, const FMA: bool>(
    sh: &Shared<'_>,
    bkv: usize,
    q: &[f32],
    st: &mut [f32],
    (keys, values): (&mut Vec<f32>, &mut Vec<f32>),
    out: &mut [f32],
) {
    let (t_len, bk, bq) = (sh.dims.total_len(), sh.shape.bk, sh.bq);
    let softcap = match sh.options.qk_matmul_output_mode {
        Some(QkMatmulOutputMode::Softcapped) if sh.options.softcap > 0.0 => sh.options.softcap,
        _ => 0.0,
    };
    for (tile, j0) in (0..t_len).step_by(bk).enumerate() {
        let nk = bk.min(t_len - j0);
        let (tile_keys, _, _) = sh.tile(bkv, tile, keys, values);
        scores_t::<MR, NR>(sh, tile_keys, nk, q, st);
        for (r, row) in out.chunks_exact_mut(t_len).enumerate() {
            for (k, o) in row[j0..j0 + nk].iter_mut().enumerate() {
                let x = st[k * bq + r];
                *o = if softcap > 0.0 {
                    softcap * tanh::<FMA>(x / softcap)
                } else {
                    x
                };
            }
        }
    }
}
