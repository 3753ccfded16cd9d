//! The backward pass's conformance: a case's gradients on a path against the
//! oracle's (f64, exact, from the inputs alone), allowed twice the error of
//! the plain f32 backward of the same thing (handed the same f32 Y and
//! logsumexp, its dot products summed in three orders) plus the floor,
//! output by output. The path is given the forward's Y and logsumexp as the
//! oracle rounds them to f32 (any path's forward would do) and a seeded dY.

use web_time::Instant;

use super::case::{CaseInputs, CaseSpec};
use super::compare::{compare_baselines, ErrorReport, DEFAULT_FLOOR, F16_UNIT_ROUNDOFF};
use super::report::SweepReport;
use super::runner::CaseResult;
use super::sweep::{filtered, SweepKind};
use crate::cpu::{self, ExactGradients, RowSource, SumOrder};
use crate::engine::Engine;
use crate::error::Result;
use crate::gradients::{AttentionGradients, BackwardInputs, GradientOptions};
use crate::options::{AttentionOptions, KernelPath, Precision};
use crate::problem::AttentionInputs;
use crate::rng::SplitMix64;
use crate::tensor::{DType, HostTensor};

/// A case's inputs, forward outputs, dY and the oracle's gradients,
/// computed once and checked against any number of paths.
#[derive(Debug)]
pub struct BackwardOracle {
    /// The case.
    pub case: CaseSpec,
    /// Its inputs.
    pub inputs: CaseInputs,
    /// The options run (the case's).
    pub options: AttentionOptions,
    /// The forward's Y, rounded to f32.
    pub y: HostTensor,
    /// The forward's logsumexp, rounded to f32.
    pub lse: HostTensor,
    /// dY, seeded.
    pub dy: HostTensor,
    exact: ExactGradients<f64>,
    plain: Vec<ExactGradients<f32>>,
}

impl BackwardOracle {
    /// Draws the case's inputs and dY from `seed` and computes the oracle's
    /// gradients and the plain f32 baselines.
    pub fn new(case: &CaseSpec, seed: u64) -> Result<BackwardOracle> {
        let inputs = case.generate(seed)?;
        let options = AttentionOptions {
            path: KernelPath::Oracle,
            return_lse: true,
            qk_matmul_output_mode: None,
            ..case.options.clone()
        };
        let forward = cpu::attention(&inputs.as_inputs(), &options)?;
        let lse = forward
            .lse
            .expect("the oracle returns the logsumexp when asked");
        let mut rng = SplitMix64::new(seed ^ 0xd1ce);
        let dy = HostTensor::new(
            forward.y.shape().to_vec(),
            rng.normal_vec(forward.y.len(), 1.0),
        )?;
        let backward = BackwardInputs {
            y: &forward.y,
            lse: &lse,
            dy: &dy,
        };
        let grads = GradientOptions::default();
        let exact = cpu::attention_backward_in::<f64>(
            &inputs.as_inputs(),
            &options,
            &backward,
            grads,
            SumOrder::Sequential,
            RowSource::Recomputed,
        )?;
        let mut plain = Vec::new();
        for order in [SumOrder::Sequential, SumOrder::Quads, SumOrder::Reverse] {
            plain.push(cpu::attention_backward_in::<f32>(
                &inputs.as_inputs(),
                &options,
                &backward,
                grads,
                order,
                RowSource::FromForward,
            )?);
        }
        Ok(BackwardOracle {
            case: case.clone(),
            inputs,
            options: case.options.clone(),
            y: forward.y,
            lse,
            dy,
            exact,
            plain,
        })
    }

    /// Runs the backward on `path` and compares its gradients.
    pub async fn check(&self, engine: &Engine, path: KernelPath) -> CaseResult {
        let options = AttentionOptions {
            path,
            ..self.options.clone()
        };
        let forward = BackwardInputs {
            y: &self.y,
            lse: &self.lse,
            dy: &self.dy,
        };
        let start = Instant::now();
        let out = engine
            .attention_backward_host(
                &self.inputs.as_inputs(),
                &options,
                &forward,
                GradientOptions::default(),
            )
            .await;
        let millis = start.elapsed().as_secs_f64() * 1e3;
        let mut result = CaseResult {
            name: self.case.name.clone(),
            shapes: self.case.shape_text(),
            path,
            report: None,
            worst_output: "-",
            failure: None,
            millis,
        };
        match out
            .map_err(|e| e.to_string())
            .and_then(|out| self.compare(&out))
        {
            Ok((output, report)) => {
                result.worst_output = output;
                result.report = Some(report);
            }
            Err(e) => result.failure = Some(e),
        }
        result
    }

    /// The worst of the gradients' reports, or which one is missing.
    pub fn compare(
        &self,
        out: &AttentionGradients<HostTensor>,
    ) -> std::result::Result<(&'static str, ErrorReport), String> {
        worst_gradient(&self.inputs.as_inputs(), &self.exact, &self.plain, out)
    }
}

/// Checks gradients of any call against the oracle's: the f64 backward from
/// the inputs alone, and the plain f32 backward handed the same `forward`
/// in three orders. The worst output's report, or an error where the oracle
/// rejects the call or an output is missing.
pub fn verify_gradients(
    inputs: &AttentionInputs<'_, HostTensor>,
    options: &AttentionOptions,
    forward: &BackwardInputs<'_, HostTensor>,
    got: &AttentionGradients<HostTensor>,
) -> std::result::Result<(&'static str, ErrorReport), String> {
    let grads = GradientOptions::default();
    let exact = cpu::attention_backward_in::<f64>(
        inputs,
        options,
        forward,
        grads,
        SumOrder::Sequential,
        RowSource::Recomputed,
    )
    .map_err(|e| e.to_string())?;
    let mut plain = Vec::new();
    for order in [SumOrder::Sequential, SumOrder::Quads, SumOrder::Reverse] {
        plain.push(
            cpu::attention_backward_in::<f32>(
                inputs,
                options,
                forward,
                grads,
                order,
                RowSource::FromForward,
            )
            .map_err(|e| e.to_string())?,
        );
    }
    worst_gradient(inputs, &exact, &plain, got)
}

/// The report of the gradient that uses the largest share of its allowance.
fn worst_gradient(
    inputs: &AttentionInputs<'_, HostTensor>,
    exact: &ExactGradients<f64>,
    plain: &[ExactGradients<f32>],
    out: &AttentionGradients<HostTensor>,
) -> std::result::Result<(&'static str, ErrorReport), String> {
    let rounding = |t: &HostTensor| {
        if t.dtype() == DType::F16 {
            F16_UNIT_ROUNDOFF
        } else {
            0.0
        }
    };
    for (name, got, expected) in [
        ("dQ", &out.dq, inputs.q.shape()),
        ("dK", &out.dk, inputs.k.shape()),
        ("dV", &out.dv, inputs.v.shape()),
    ] {
        if got.shape() != expected {
            return Err(format!(
                "{name} came back as {:?}, not {expected:?}",
                got.shape()
            ));
        }
    }
    let (exact_past_k, exact_k) = exact.key_parts();
    let (exact_past_v, exact_v) = exact.value_parts();
    let plain_k: Vec<_> = plain.iter().map(|p| p.key_parts()).collect();
    let plain_v: Vec<_> = plain.iter().map(|p| p.value_parts()).collect();
    let judge = |got: &HostTensor, exact: &[f64], plain: Vec<&[f32]>| {
        compare_baselines(got.data(), exact, &plain, DEFAULT_FLOOR)
            .allow_output_rounding(exact, rounding(got))
    };
    let mut reports = vec![
        (
            "dQ",
            judge(
                &out.dq,
                &exact.dq,
                plain.iter().map(|p| &p.dq[..]).collect(),
            ),
        ),
        (
            "dK",
            judge(
                &out.dk,
                &exact_k,
                plain_k.iter().map(|p| &p.1[..]).collect(),
            ),
        ),
        (
            "dV",
            judge(
                &out.dv,
                &exact_v,
                plain_v.iter().map(|p| &p.1[..]).collect(),
            ),
        ),
    ];
    if let (Some(ek), Some(ev)) = (&exact_past_k, &exact_past_v) {
        let got_k = out
            .d_past_key
            .as_ref()
            .ok_or("dpast_key was not returned")?;
        let got_v = out
            .d_past_value
            .as_ref()
            .ok_or("dpast_value was not returned")?;
        let pk = plain_k.iter().filter_map(|p| p.0.as_deref()).collect();
        let pv = plain_v.iter().filter_map(|p| p.0.as_deref()).collect();
        reports.push(("dpast_key", judge(got_k, ek, pk)));
        reports.push(("dpast_value", judge(got_v, ev, pv)));
    }
    Ok(reports
        .into_iter()
        .max_by(|a, b| a.1.share_of_allowed().total_cmp(&b.1.share_of_allowed()))
        .expect("dQ, dK and dV are always compared"))
}

/// Runs `case`'s backward on each of `paths`, computing the oracle once.
pub async fn run_backward_case(
    engine: &Engine,
    case: &CaseSpec,
    paths: &[KernelPath],
    seed: u64,
) -> Vec<CaseResult> {
    match BackwardOracle::new(case, seed) {
        Ok(oracle) => {
            let mut results = Vec::with_capacity(paths.len());
            for &path in paths {
                results.push(oracle.check(engine, path).await);
            }
            results
        }
        Err(e) => CaseResult::oracle_rejected(case, paths, &e),
    }
}

/// The paths a backward sweep checks on `engine`: the fused kernels and the
/// CPU backend on a GPU engine, the CPU backend on a CPU engine.
pub fn backward_paths(engine: &Engine) -> Vec<KernelPath> {
    if engine.paths().contains(&KernelPath::Fused) {
        vec![KernelPath::Fused, KernelPath::Cpu]
    } else {
        vec![KernelPath::Cpu]
    }
}

/// The sweep of `kind` (the cases whose name contains `filter`) through the
/// backward on every path of [`backward_paths`], reporting each result to
/// `progress` as it comes.
pub async fn run_backward_sweep(
    engine: &Engine,
    kind: SweepKind,
    filter: &str,
    seed: u64,
    mut progress: impl FnMut(&CaseResult),
) -> SweepReport {
    let paths = backward_paths(engine);
    let mut results = Vec::new();
    for case in filtered(kind, filter) {
        for result in run_backward_case(engine, &case, &paths, seed).await {
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
