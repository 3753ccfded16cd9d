//! The sweep's cases through a paged KV cache (`webattn check --paged`):
//! each batch entry's keys and values appended to a sequence of a cache made
//! on the engine (device pages on a GPU engine, read in place by the paged
//! decode kernel), every entry's queries asked in one call, and Y and the
//! logsumexp judged against the case's f64 oracle by the sweep's rule.
//!
//! A cache attends a sequence's last tokens, its causal positions continuing
//! from its length; a case is asked of it where that is the case's meaning:
//! no mask, no past, f32 operands, no scores asked, and either padding
//! lengths (each at least the queries), as many queries as keys, or no rule
//! that reads positions (causal, windows, ALiBi).

use web_time::Instant;

use super::case::{CaseSpec, MaskForm};
use super::report::SweepReport;
use super::runner::{CaseResult, Oracle};
use super::sweep::{filtered, SweepKind};
use crate::engine::Engine;
use crate::error::Result;
use crate::options::{KernelPath, Precision};
use crate::paged::{PagedKvCache, PagedLayout};
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

/// Runs `oracle`'s case through a paged cache on `engine`; `None` where the
/// case cannot be asked of one.
pub async fn check_paged(oracle: &Oracle, engine: &Engine) -> Option<CaseResult> {
    let lengths = paged_lengths(oracle)?;
    let case = &oracle.case;
    let path = match engine.gpu() {
        Some(_) => KernelPath::Fused,
        None => KernelPath::Cpu,
    };
    let mut result = CaseResult {
        name: format!("{} (paged)", case.name),
        shapes: case.shape_text(),
        path,
        report: None,
        worst_output: "Y",
        failure: None,
        millis: 0.0,
    };
    let start = Instant::now();
    match paged_outputs(oracle, engine, &lengths).await {
        Ok(out) => match oracle.compare(&out) {
            Ok((name, report)) => {
                result.worst_output = name;
                result.report = Some(report);
            }
            Err(missing) => result.failure = Some(missing),
        },
        Err(e) => result.failure = Some(e.to_string()),
    }
    result.millis = start.elapsed().as_secs_f64() * 1e3;
    Some(result)
}

/// The case's Y `[B, Hq, Nq, Dv]` and logsumexp through a cache holding each
/// batch entry's first `lengths[b]` keys.
async fn paged_outputs(
    oracle: &Oracle,
    engine: &Engine,
    lengths: &[usize],
) -> Result<AttentionOutputs<HostTensor>> {
    let (case, inputs) = (&oracle.case, &oracle.inputs);
    let layout = PagedLayout {
        kv_heads: case.kv_heads,
        head_dim: case.head_dim,
        v_head_dim: case.v_head_dim,
        page_size: PAGE_SIZE,
    };
    let mut cache = PagedKvCache::on_engine(engine, layout)?;
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

/// The sweep of `kind` (cases whose name contains `filter`) through paged
/// caches on `engine`, calling `progress` after each result; cases a cache
/// cannot be asked are left out.
pub async fn run_paged_sweep(
    engine: &Engine,
    kind: SweepKind,
    filter: &str,
    seed: u64,
    mut progress: impl FnMut(&CaseResult),
) -> SweepReport {
    let mut results = Vec::new();
    for case in filtered(kind, filter).into_iter().filter(pageable) {
        let Ok(oracle) = Oracle::new(&case, seed) else {
            continue;
        };
        if let Some(result) = check_paged(&oracle, engine).await {
            progress(&result);
            results.push(result);
        }
    }
    SweepReport {
        adapter: engine.describe(),
        seed,
        kind,
        precision: Precision::Highest,
        results,
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
