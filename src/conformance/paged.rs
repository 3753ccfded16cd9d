//! The sweep's cases through a paged KV cache (`webattn check --paged`):
//! each batch entry's keys and values appended to a sequence of a cache made
//! on the engine (device pages on a GPU engine, read in place by the paged
//! decode kernel), every entry's queries asked in one call, and Y and the
//! logsumexp judged against the case's f64 oracle by the sweep's rule.
//!
//! With f16 or int8 pages each case is judged against the oracle on the
//! values the pages hold (K and V rounded, or quantized and dequantized, row
//! by row, as appended), and its distance from the oracle on the f32 keys and
//! values (the storage's own error) is reported beside.
//!
//! A cache attends a sequence's last tokens, its causal positions continuing
//! from its length; a case is asked of it where that is the case's meaning:
//! no mask, no past, f32 operands, no scores asked, and either padding
//! lengths (each at least the queries), as many queries as keys, or no rule
//! that reads positions (causal, windows, ALiBi).

use web_time::Instant;

use super::case::{CaseInputs, CaseSpec, MaskForm};
use super::report::SweepReport;
use super::runner::{CaseResult, Oracle};
use super::sweep::{filtered, SweepKind};
use crate::engine::Engine;
use crate::error::Result;
use crate::options::{KernelPath, Precision};
use crate::paged::{PageStorage, PagedKvCache, PagedLayout};
use crate::problem::AttentionOutputs;
use crate::tensor::HostTensor;

/// Tokens per page of the sweep's caches: many pages even for short cases.
const PAGE_SIZE: usize = 16;

/// Whether a case of `case`'s form can be asked of a paged cache, its
/// padding lengths aside (see the module's docs).
pub fn pageable(case: &CaseSpec) -> bool {
    let o = &case.options;
    let positional = o.is_causal || o.left_window_size >= 0 || o.right_window_size >= 0 || o.alibi;
    case.mask == MaskForm::None
        && case.past_len == 0
        && !case.f16
        && o.qk_matmul_output_mode.is_none()
        && o.precision == Precision::Highest
        && (case.nonpad || !positional || case.q_len == case.kv_len)
}

/// Each batch entry's key count where `oracle`'s case can be asked of a
/// paged cache (every length at least the queries), else `None`.
pub fn paged_lengths(oracle: &Oracle) -> Option<Vec<usize>> {
    let case = &oracle.case;
    if !pageable(case) {
        return None;
    }
    let lengths: Vec<usize> = match &oracle.inputs.nonpad {
        Some(lengths) => lengths.iter().map(|&l| l as usize).collect(),
        None => vec![case.kv_len; case.batch],
    };
    lengths.iter().all(|&l| l >= case.q_len).then_some(lengths)
}

/// Batch entry `b` of a `[B, H, N, D]` tensor, its first `n` rows, as
/// `[1, H, n, D]` (keys and values: `[H, n, D]`, as a cache appends them).
fn entry(t: &HostTensor, b: usize, n: usize, keep_batch: bool) -> Result<HostTensor> {
    let [_, h, rows, d] = [t.shape()[0], t.shape()[1], t.shape()[2], t.shape()[3]];
    let mut out = Vec::with_capacity(h * n * d);
    for head in 0..h {
        let at = ((b * h + head) * rows) * d;
        out.extend_from_slice(&t.data()[at..at + n * d]);
    }
    match keep_batch {
        true => HostTensor::new([1, h, n, d], out),
        false => HostTensor::new([h, n, d], out),
    }
}

/// One case through a paged cache: its result, and (f16 and int8 pages) the
/// distance from the oracle on the f32 keys and values.
#[derive(Debug, Clone)]
pub struct PagedCheck {
    /// Judged by the sweep's rule against the oracle on the stored values.
    pub result: CaseResult,
    /// Normwise relative error (the worse of Y and the logsumexp) against
    /// the oracle on the f32 keys and values; `None` for f32 pages.
    pub against_f32: Option<f64>,
}

/// `inputs` with K and V as `storage` holds them, row by row.
fn stored(inputs: &CaseInputs, storage: PageStorage) -> Result<CaseInputs> {
    let mut out = inputs.clone();
    for t in [&mut out.k, &mut out.v] {
        let d = t.shape()[3];
        for row in t.data_mut().chunks_exact_mut(d) {
            storage.round_trip(row);
        }
    }
    Ok(out)
}

/// Runs `oracle`'s case through a paged cache of `storage` pages on
/// `engine`; `None` where the case cannot be asked of one.
pub async fn check_paged(
    oracle: &Oracle,
    engine: &Engine,
    storage: PageStorage,
) -> Option<PagedCheck> {
    let lengths = paged_lengths(oracle)?;
    let case = &oracle.case;
    let path = match engine.gpu() {
        Some(_) => KernelPath::Fused,
        None => KernelPath::Cpu,
    };
    let mut result = CaseResult {
        name: match storage {
            PageStorage::F32 => format!("{} (paged)", case.name),
            other => format!("{} (paged, {})", case.name, other.name()),
        },
        shapes: case.shape_text(),
        path,
        report: None,
        worst_output: "Y",
        failure: None,
        millis: 0.0,
    };
    let start = Instant::now();
    // The oracle on the values the pages hold.
    let held = match storage {
        PageStorage::F32 => None,
        _ => match stored(&oracle.inputs, storage).and_then(|i| Oracle::from_inputs(case, i)) {
            Ok(held) => Some(held),
            Err(e) => {
                result.failure = Some(e.to_string());
                return Some(PagedCheck {
                    result,
                    against_f32: None,
                });
            }
        },
    };
    let judge = held.as_ref().unwrap_or(oracle);
    let mut against_f32 = None;
    match paged_outputs(judge, engine, &lengths, storage).await {
        Ok(out) => {
            match judge.compare(&out) {
                Ok((name, report)) => {
                    result.worst_output = name;
                    result.report = Some(report);
                }
                Err(missing) => result.failure = Some(missing),
            }
            if held.is_some() {
                against_f32 = oracle.compare(&out).ok().map(|(_, r)| r.max_rel);
            }
        }
        Err(e) => result.failure = Some(e.to_string()),
    }
    result.millis = start.elapsed().as_secs_f64() * 1e3;
    Some(PagedCheck {
        result,
        against_f32,
    })
}

/// The case's Y `[B, Hq, Nq, Dv]` and logsumexp through a cache holding each
/// batch entry's first `lengths[b]` keys.
async fn paged_outputs(
    oracle: &Oracle,
    engine: &Engine,
    lengths: &[usize],
    storage: PageStorage,
) -> Result<AttentionOutputs<HostTensor>> {
    let (case, inputs) = (&oracle.case, &oracle.inputs);
    let layout = PagedLayout {
        kv_heads: case.kv_heads,
        head_dim: case.head_dim,
        v_head_dim: case.v_head_dim,
        page_size: PAGE_SIZE,
    };
    let mut cache = PagedKvCache::on_engine(engine, layout)?.with_storage(storage)?;
    let mut queries = Vec::with_capacity(case.batch);
    for (b, &len) in lengths.iter().enumerate() {
        let seq = cache.add_sequence();
        let (k, v) = (
            entry(&inputs.k, b, len, false)?,
            entry(&inputs.v, b, len, false)?,
        );
        cache.append(seq, &k, &v)?;
        queries.push((seq, entry(&inputs.q, b, case.q_len, true)?));
    }
    let asked: Vec<_> = queries.iter().map(|(s, q)| (*s, q)).collect();
    let mut options = oracle.options.clone();
    options.return_present = false;
    let outs = cache.attention(engine, &asked, &options).await?;
    let (mut y, mut lse) = (Vec::new(), Vec::new());
    for out in &outs {
        y.extend_from_slice(out.y.data());
        if let Some(l) = &out.lse {
            lse.extend_from_slice(l.data());
        }
    }
    let rows = [case.batch, case.q_heads, case.q_len];
    Ok(AttentionOutputs {
        y: HostTensor::new([rows[0], rows[1], rows[2], case.v_head_dim], y)?,
        present_key: None,
        present_value: None,
        qk_matmul_output: None,
        lse: Some(HostTensor::new(rows, lse)?),
    })
}

/// A paged sweep: its report, and for f16 and int8 pages the worst distance
/// from the oracle on f32 keys and values with the case it was met in.
#[derive(Debug, Clone)]
pub struct PagedSweep {
    /// The cases, judged against the oracle on the stored values.
    pub report: SweepReport,
    /// How the pages stored keys and values.
    pub storage: PageStorage,
    /// The worst [`PagedCheck::against_f32`] and its case's name.
    pub against_f32: Option<(f64, String)>,
}

/// The sweep of `kind` (cases whose name contains `filter`) through paged
/// caches of `storage` pages on `engine`, calling `progress` after each
/// result; cases a cache cannot be asked are left out.
pub async fn run_paged_sweep(
    engine: &Engine,
    kind: SweepKind,
    filter: &str,
    seed: u64,
    storage: PageStorage,
    mut progress: impl FnMut(&CaseResult),
) -> PagedSweep {
    let mut results = Vec::new();
    let mut against_f32: Option<(f64, String)> = None;
    for case in filtered(kind, filter).into_iter().filter(pageable) {
        let Ok(oracle) = Oracle::new(&case, seed) else {
            continue;
        };
        if let Some(check) = check_paged(&oracle, engine, storage).await {
            progress(&check.result);
            if let Some(e) = check.against_f32 {
                if against_f32.as_ref().is_none_or(|(worst, _)| e > *worst) {
                    against_f32 = Some((e, case.name.clone()));
                }
            }
            results.push(check.result);
        }
    }
    PagedSweep {
        report: SweepReport {
            adapter: engine.describe(),
            seed,
            kind,
            precision: Precision::Highest,
            results,
        },
        storage,
        against_f32,
    }
}

/// How many of the sweep's cases (of `kind`, named with `filter`) are of a
/// form a paged cache is asked (those whose padding lengths fall short of
/// their queries are then left out): a progress bar's length.
pub fn paged_sweep_len(kind: SweepKind, filter: &str) -> usize {
    filtered(kind, filter)
        .iter()
        .filter(|c| pageable(c))
        .count()
}
