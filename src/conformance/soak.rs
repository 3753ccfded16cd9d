//! The soak: many random valid cases, one after another, on every path of
//! one engine, each checked against the oracle, with the device memory the
//! engine holds measured before, after a warm-up, and at the end. Memory must
//! stay flat: every call's buffers are freed or reused, whatever it ran.

use super::case::{CaseSpec, MaskForm};
use super::runner::{CaseResult, Oracle};
use crate::engine::Engine;
use crate::options::{Precision, QkMatmulOutputMode};
use crate::rng::SplitMix64;

pub use crate::device::counters::MemoryReading;

/// What a soak found.
#[derive(Debug, Clone, PartialEq)]
pub struct SoakReport {
    /// Cases run (each on one path).
    pub cases: usize,
    /// Cases per path, in the order of [`Engine::paths`].
    pub per_path: Vec<(crate::options::KernelPath, usize)>,
    /// Every case that did not pass.
    pub failures: Vec<CaseResult>,
    /// The passing case that used the largest share of its allowed error.
    pub worst: Option<CaseResult>,
    /// Memory before the first case (`None` where the backend cannot say: the
    /// CPU backend, or the browser).
    pub memory_start: Option<MemoryReading>,
    /// Memory after the warm-up (the first tenth of the cases): pipelines and
    /// pools have reached their size.
    pub memory_warm: Option<MemoryReading>,
    /// Memory after the last case.
    pub memory_end: Option<MemoryReading>,
    /// Wall time of the whole soak, in milliseconds.
    pub millis: f64,
}

/// How much buffer memory may differ between the warm-up and the end before
/// the soak calls it growth: allocator rounding, not a leak.
pub const MEMORY_SLACK_BYTES: u64 = 1 << 20;

impl SoakReport {
    /// Whether memory stayed flat after the warm-up (true where it cannot be measured).
    pub fn memory_flat(&self) -> bool {
        match (self.memory_warm, self.memory_end) {
            (Some(warm), Some(end)) => {
                end.buffer_bytes <= warm.buffer_bytes + MEMORY_SLACK_BYTES
                    && end.buffers <= warm.buffers
            }
            _ => true,
        }
    }

    /// Whether every case passed and memory stayed flat.
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.memory_flat()
    }
}

/// One random valid case: sizes that are rarely tile multiples, every mask
/// form, GQA ratios, past or padding, windows, softcap, ALiBi, temperature,
/// logits up to about 20 and the optional outputs.
pub fn random_case(index: usize, rng: &mut SplitMix64) -> CaseSpec {
    let lengths = [1, 2, 7, 16, 33, 64, 97, 128, 200, 257];
    let dims = [4, 8, 16, 24, 32, 40, 64, 80, 128];
    let kv_heads = 1 + rng.below(3);
    let group = 1 + rng.below(3);
    let q_len = lengths[rng.below(lengths.len())];
    let kv_len = lengths[rng.below(lengths.len())];
    let head_dim = dims[rng.below(dims.len())];
    let v_head_dim = if rng.chance(0.7) {
        head_dim
    } else {
        dims[rng.below(dims.len())]
    };
    let mut case = CaseSpec::new(
        format!("soak{index}"),
        [1 + rng.below(2), kv_heads * group, kv_heads],
        [q_len, kv_len],
        [head_dim, v_head_dim],
    );
    case.mask = match rng.below(8) {
        0 => MaskForm::Bool(1 + rng.below(4) as u8),
        1 => MaskForm::Float(1 + rng.below(4) as u8),
        2 => MaskForm::ShortBool,
        3 => MaskForm::EmptyRows,
        _ => MaskForm::None,
    };
    match rng.below(6) {
        0 => case.past_len = 1 + rng.below(40),
        1 => case.nonpad = true,
        _ => {}
    }
    // Logits up to about 20, all factors (logit scale, scale, temperature)
    // together. Beyond ~30 the f32 error is the rounding of a few scores, and
    // the 2x-plain-f32 rule turns noisy: with random seeds 0.1% of cases at
    // logits of 50 to 100, and 1 to 5% at 1e2 to 1e4, land between 2x and 6x of
    // the baseline on every path alike. The sweep keeps its large-logit cases
    // at fixed seeds.
    case.logit_scale = [1.0, 1.0, 1.0, 2.0, 4.0, 8.0][rng.below(6)];
    let o = &mut case.options;
    o.is_causal = rng.chance(0.4);
    if rng.chance(0.2) {
        o.left_window_size = rng.below(40) as i64;
    }
    if rng.chance(0.15) {
        o.right_window_size = rng.below(40) as i64;
    }
    if rng.chance(0.2) {
        o.softcap = rng.uniform(1.0, 30.0);
    }
    if rng.chance(0.15) {
        // The generator sizes logits for the default 1/sqrt(Dk); stay near it.
        o.scale = Some(rng.uniform(0.1, 1.5) / (head_dim as f32).sqrt());
    }
    if rng.chance(0.1) {
        o.alibi = true;
    }
    if rng.chance(0.1) {
        o.temperature = rng.uniform(0.4, 3.0);
    }
    if rng.chance(0.2) {
        let modes = [
            QkMatmulOutputMode::Scaled,
            QkMatmulOutputMode::Softcapped,
            QkMatmulOutputMode::Biased,
            QkMatmulOutputMode::Probabilities,
        ];
        o.qk_matmul_output_mode = Some(modes[rng.below(4)]);
    }
    case
}

/// Runs `cases` random cases from `seed`, spread over the engine's paths, at
/// `precision` (under [`Precision::Fast`] on f16-rounded operands, with the
/// f16 rule, as the sweep does), and calls `progress(done, total, &result)`
/// after each.
pub async fn run_soak(
    engine: &Engine,
    cases: usize,
    seed: u64,
    precision: Precision,
    mut progress: impl FnMut(usize, usize, &CaseResult),
) -> SoakReport {
    let start = web_time::Instant::now();
    let paths = engine.paths();
    let mut per_path: Vec<_> = paths.iter().map(|&p| (p, 0)).collect();
    let memory_start = memory(engine).await;
    let mut memory_warm = memory_start;
    let warm_up = cases.div_ceil(10);
    let mut rng = SplitMix64::new(seed);
    let mut failures = Vec::new();
    let mut worst: Option<CaseResult> = None;
    for index in 0..cases {
        let mut case = random_case(index, &mut rng);
        case.options.precision = precision;
        let path_index = index % paths.len();
        let result = match Oracle::new(&case, seed ^ index as u64) {
            Ok(oracle) => oracle.check(engine, paths[path_index]).await,
            Err(e) => CaseResult {
                name: case.name.clone(),
                shapes: case.shape_text(),
                path: paths[path_index],
                report: None,
                worst_output: "-",
                failure: Some(format!("the oracle rejected the case: {e}")),
                millis: 0.0,
            },
        };
        per_path[path_index].1 += 1;
        progress(index + 1, cases, &result);
        if !result.passed() {
            failures.push(result);
        } else if result.report.is_some_and(|r| {
            worst
                .as_ref()
                .and_then(|w| w.report)
                .is_none_or(|w| r.share_of_allowed() > w.share_of_allowed())
        }) {
            worst = Some(result);
        }
        if index + 1 == warm_up {
            memory_warm = memory(engine).await;
        }
    }
    SoakReport {
        cases,
        per_path,
        failures,
        worst,
        memory_start,
        memory_warm,
        memory_end: memory(engine).await,
        millis: start.elapsed().as_secs_f64() * 1e3,
    }
}

/// The engine's device memory once its queue is idle.
async fn memory(engine: &Engine) -> Option<MemoryReading> {
    let ctx = engine.gpu()?;
    // The workspaces `Engine::attention` keeps are bounded and by design:
    // what must stay flat is everything else.
    engine.free_kept_workspaces();
    ctx.finish().await.ok()?;
    ctx.memory_in_use()
}
