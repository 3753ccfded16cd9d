//! The fast CPU backend: attention in f32, blocked the way FlashAttention is,
//! for machines (and browsers) without a GPU. The f64 oracle in [`crate::cpu`]
//! stays the reference it is checked against.
//!
//! - `pack`: K as panels of `NR` keys and V as padded rows, once per
//!   (batch, KV head), shared by the query heads of a GQA group;
//! - `block`: one block of query rows against its key tiles, with the online
//!   softmax, tile skipping, every option of the contract and the oracle's
//!   non-finite rule;
//! - `dots`: a decoding step's scores with the keys in the vector lanes;
//! - `kernel`: the `MR × NR` register-tiled micro-kernel both products run on;
//! - `math`: `exp`, `tanh` and reductions the compiler vectorises;
//! - `isa`: the instruction set the kernels are compiled for, picked at run
//!   time (AVX-512 or AVX2 + FMA where the CPU has them);
//! - `avx512`: the micro-kernels written by hand for AVX-512;
//! - `peak`: the core's FMA ceiling, for the bench's shares;
//! - `threads`: work items (batch × query head × query block) over scoped threads;
//! - `gemm`: general products on the same micro-kernel, for the attention
//!   family's projections on a CPU engine.

#[cfg(target_arch = "x86_64")]
mod avx512;
mod backward;
mod block;
mod dots;
pub(crate) mod gemm;
pub(crate) mod isa;
mod kernel;
pub(crate) mod math;
mod pack;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod peak;
#[cfg(not(target_arch = "wasm32"))]
mod pool;
#[cfg(all(target_arch = "wasm32", feature = "relaxed-simd"))]
mod relaxed;
mod rules;
pub mod stored;
pub(crate) mod threads;

pub use isa::{Isa, ISA_VARIABLE};

use std::cmp::Reverse;

use crate::error::Result;
use crate::options::{alibi_slopes, AttentionOptions};
use crate::problem::{validate, AttentionDims, AttentionInputs, AttentionOutputs};
use crate::tensor::{checked_numel, try_filled, HostTensor};
use block::{Scratch, Shared, Unit, UnitJob};
use rules::MaskBias;

/// The fast CPU backend with its thread count and instruction set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuBackend {
    threads: usize,
    isa: Isa,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new(None)
    }
}

impl CpuBackend {
    /// A backend on `threads` threads (`None`: one per available core; always
    /// one on wasm32), in the best instruction set this CPU has.
    pub fn new(threads: Option<usize>) -> CpuBackend {
        let threads = match threads {
            _ if cfg!(target_arch = "wasm32") => 1,
            Some(n) => n.max(1),
            None => default_threads(),
        };
        CpuBackend {
            threads,
            isa: Isa::detect(),
        }
    }

    /// The number of threads a call uses at most.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The instruction set the kernels run in.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// One line: precision, threads and instruction set.
    pub fn describe(&self) -> String {
        format!(
            "f32, {} thread{}, {}",
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.isa.name()
        )
    }

    /// Attention on the host in f32: the whole contract of
    /// [`AttentionOptions`], every output, checked against the f64 oracle by
    /// the tests and the conformance sweep.
    pub fn attention(
        &self,
        inputs: &AttentionInputs<'_, HostTensor>,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<HostTensor>> {
        let dims = validate(inputs, options)?;
        let src = pack::KvSource {
            dims,
            rows: pack::KvRows::Tensors {
                k: inputs.k,
                v: inputs.v,
                past_key: inputs.past_key,
                past_value: inputs.past_value,
            },
        };
        let mask = match (inputs.attn_mask, dims.mask) {
            (Some(m), Some(layout)) => Some(MaskBias::new(m, layout)),
            _ => None,
        };
        let mut out = self.attend(inputs.q.data(), src, mask, inputs.nonpad_kv_seqlen, options)?;
        if options.return_present {
            let (k, v) = super::present(inputs, &dims)?;
            (out.present_key, out.present_value) = (Some(k), Some(v));
        }
        Ok(out)
    }

    /// Attention of `q` (`[B, Hq, Nq, Dk]` of `dims`, a validated call) on
    /// keys and values a store keeps (`bkv` = `b · Hkv + kv head`, rows
    /// `0 .. dims.total_len()`), read where they are: f32 rows in place, f16
    /// and int8 rows widened a tile at a time. No mask and no presents.
    pub fn attention_stored(
        &self,
        dims: AttentionDims,
        q: &[f32],
        store: &dyn stored::RowStore,
        nonpad: Option<&[i64]>,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<HostTensor>> {
        let src = pack::KvSource {
            dims,
            rows: pack::KvRows::Stored(store),
        };
        self.attend(q, src, None, nonpad, options)
    }

    /// The blocked kernel over every unit of a call: Y, the logsumexp and the
    /// scores asked for (presents are the caller's).
    fn attend(
        &self,
        q: &[f32],
        src: pack::KvSource<'_>,
        mask: Option<MaskBias<'_>>,
        nonpad: Option<&[i64]>,
        options: &AttentionOptions,
    ) -> Result<AttentionOutputs<HostTensor>> {
        let dims = src.dims;
        let (nq, dv, t_len) = (dims.q_len, dims.v_head_dim, dims.total_len());
        let heads = dims.batch * dims.q_heads;
        // Blocks of query rows and key tiles sized for the caches: the Q block,
        // a score tile, a value panel and the output accumulators stay in L1.
        // Query blocks are a multiple of both tile sizes; a few queries (a
        // decoding step) take the narrow tiles, so the blocks pad less.
        let narrow = nq <= 24;
        let (mr, nr) = self.isa.tiles(narrow);
        let step = lcm(mr, nr);
        // A decoding step's units hold a GQA group's query heads: they read
        // one K and V, and their rows fill the vector lanes one head's would
        // mostly pad. (Not with ALiBi, whose bias differs per head.)
        let heads_per_unit = if narrow && !options.alibi {
            dims.group()
        } else {
            1
        };
        let unit_rows = heads_per_unit * nq;
        let bq = (48usize.div_ceil(step) * step).min(unit_rows.div_ceil(step) * step);
        let bk = if narrow {
            64
        } else {
            self.isa.key_tile().div_ceil(mr) * mr
        };
        let shape = pack::TileShape {
            mr,
            nr,
            bk,
            ldv: dv.div_ceil(nr) * nr,
        };

        let mut y = try_filled("Y", checked_numel("Y", &dims.y_shape())?, 0.0f32)?;
        let mut lse = try_filled("the logsumexp", heads * nq, 0.0f32)?;
        let mut qk = match options.qk_matmul_output_mode {
            Some(_) => try_filled(
                "qk_matmul_output",
                checked_numel("qk_matmul_output", &dims.scores_shape())?,
                0.0f32,
            )?,
            None => Vec::new(),
        };

        // K and V packed once up front when several query blocks of a head
        // read them; a decoding step packs each tile as it reaches it.
        let packed = (unit_rows > bq).then(|| {
            threads::map(
                (0..dims.batch * dims.kv_heads).collect(),
                self.threads,
                |bkv| pack::PackedKv::new(&src, &shape, bkv),
            )
        });
        let slopes = if options.alibi {
            alibi_slopes(dims.q_heads)
                .into_iter()
                .map(|s| s as f32)
                .collect()
        } else {
            Vec::new()
        };
        let shared = Shared {
            dims,
            options,
            q,
            src,
            packed,
            shape,
            in_place: narrow && dv % nr == 0,
            mask,
            nonpad,
            slopes,
            scale: options.effective_scale(dims.head_dim),
            bq,
        };

        // Work items, the most expensive first so the last ones to finish are short.
        let qk_row = if qk.is_empty() { 0 } else { t_len };
        let mut units = Vec::with_capacity(heads * nq.div_ceil(bq));
        debug_assert_eq!(dims.q_heads % heads_per_unit, 0);
        let mut y_rest = y.as_mut_slice();
        let mut lse_rest = lse.as_mut_slice();
        let mut qk_rest = qk.as_mut_slice();
        for z in (0..heads).step_by(heads_per_unit) {
            let (b, h) = (z / dims.q_heads, z % dims.q_heads);
            let rules = shared.rules(b, h);
            for i0 in (0..unit_rows).step_by(bq) {
                let rows = bq.min(unit_rows - i0);
                let (y_u, y_next) = std::mem::take(&mut y_rest).split_at_mut(rows * dv);
                let (lse_u, lse_next) = std::mem::take(&mut lse_rest).split_at_mut(rows);
                let (qk_u, qk_next) = std::mem::take(&mut qk_rest).split_at_mut(rows * qk_row);
                (y_rest, lse_rest, qk_rest) = (y_next, lse_next, qk_next);
                let (lo, hi) = shared.block_keys(&rules, i0, rows);
                let cost = rows * (hi - lo + qk_row);
                let unit = Unit {
                    b,
                    h,
                    i0,
                    rows,
                    q_len: nq,
                    y: y_u,
                    lse: lse_u,
                    qk: qk_u,
                };
                units.push((cost, unit));
            }
        }
        units.sort_by_key(|(cost, _)| Reverse(*cost));
        let units: Vec<Unit<'_>> = units.into_iter().map(|(_, u)| u).collect();
        threads::for_each(units, self.threads, Scratch::default, |unit, scratch| {
            isa::dispatch_tiles(
                self.isa,
                narrow,
                UnitJob {
                    shared: &shared,
                    unit,
                    scratch,
                },
            )
        });
        drop(shared);

        let y = HostTensor::new(dims.y_shape(), y)?;
        let lse = options
            .return_lse
            .then(|| HostTensor::new(dims.lse_shape(), lse))
            .transpose()?;
        let qk_matmul_output = options
            .qk_matmul_output_mode
            .map(|_| HostTensor::new(dims.scores_shape(), qk))
            .transpose()?;
        Ok(AttentionOutputs {
            y,
            present_key: None,
            present_value: None,
            qk_matmul_output,
            lse,
        })
    }
}

/// The least common multiple of two tile sizes.
fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

/// Softmax of each `row_len`-long row of `rows` in place, as the attention
/// family's oracles define it: the row's largest score (NaN skipped) is
/// subtracted, scores that are `-inf` or NaN weigh 0, and a row with no finite
/// maximum becomes zeros. Returns which rows had no finite maximum.
pub(crate) fn softmax_rows(rows: &mut [f32], row_len: usize) -> Vec<bool> {
    isa::dispatch(Isa::detect(), SoftmaxRows { rows, row_len })
}

/// [`softmax_rows`] in the instruction set it is dispatched in.
struct SoftmaxRows<'a> {
    rows: &'a mut [f32],
    row_len: usize,
}

impl isa::Job for SoftmaxRows<'_> {
    type Output = Vec<bool>;

    #[inline(always)]
    fn run<const MR: usize, const NR: usize, const FMA: bool>(self) -> Vec<bool> {
        let mut empty = Vec::with_capacity(self.rows.len() / self.row_len.max(1));
        for row in self.rows.chunks_exact_mut(self.row_len.max(1)) {
            let max = row
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
            empty.push(max == f32::NEG_INFINITY);
            if max == f32::NEG_INFINITY {
                row.fill(0.0);
                continue;
            }
            for x in row.iter_mut() {
                *x = if *x > f32::NEG_INFINITY {
                    math::exp::<FMA>(*x - max)
                } else {
                    0.0
                };
            }
            let mut sum = 0.0f32;
            for &x in row.iter() {
                sum += x;
            }
            for x in row.iter_mut() {
                *x /= sum;
            }
        }
        empty
    }
}

/// The threads to use when the caller does not say: the cores available.
pub(crate) fn default_threads() -> usize {
    if cfg!(target_arch = "wasm32") {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
