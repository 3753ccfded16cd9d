//! Runs a case on one path and compares every output with the f64 oracle.

use web_time::Instant;

use super::case::{CaseInputs, CaseSpec};
use super::compare::{compare_baselines, ErrorReport, DEFAULT_FLOOR, F16_UNIT_ROUNDOFF};
use crate::cpu::{self, ExactOutputs};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::options::{AttentionOptions, KernelPath, Precision};
use crate::problem::AttentionOutputs;
use crate::tensor::{DType, HostTensor};

/// The outcome of one case on one path.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// Its sizes, as [`CaseSpec::shape_text`] writes them.
    pub shapes: String,
    /// The path that ran it.
    pub path: KernelPath,
    /// The worst output's error report (`None` when the call itself failed).
    pub report: Option<ErrorReport>,
    /// Which output the report describes (`Y`, `lse`, `qk_matmul_output`, ...).
    pub worst_output: &'static str,
    /// The error, when the call failed or a behaviour check did not hold.
    pub failure: Option<String>,
    /// Milliseconds the engine took, readback included.
    pub millis: f64,
}

impl CaseResult {
    /// Whether the case passed.
    pub fn passed(&self) -> bool {
        self.failure.is_none() && self.report.is_none_or(|r| r.passed())
    }

    /// `case` failed on each of `paths` before it ran: its oracle refused it.
    pub(crate) fn oracle_rejected(
        case: &CaseSpec,
        paths: &[KernelPath],
        error: &Error,
    ) -> Vec<CaseResult> {
        paths
            .iter()
            .map(|&path| CaseResult {
                name: case.name.clone(),
                shapes: case.shape_text(),
                path,
                report: None,
                worst_output: "-",
                failure: Some(format!("the oracle rejected the case: {error}")),
                millis: 0.0,
            })
            .collect()
    }
}

/// A case with its inputs and the oracle's answers, computed once and checked
/// against any number of paths.
#[derive(Debug)]
pub struct Oracle {
    /// The case.
    pub case: CaseSpec,
    /// Its inputs.
    pub inputs: CaseInputs,
    /// The options actually run (the case's, asking for the logsumexp and the presents).
    pub options: AttentionOptions,
    exact: ExactOutputs<f64>,
    plain: ExactOutputs<f32>,
    /// The plain f32 computation with its dot products summed by quads.
    plain_quads: ExactOutputs<f32>,
    /// The plain f32 computation with its dot products summed from the last term.
    plain_reverse: ExactOutputs<f32>,
    present: Option<(HostTensor, HostTensor)>,
}

impl Oracle {
    /// Generates the case's inputs from `seed` and computes the oracle (f64)
    /// and the plain f32 baseline.
    pub fn new(case: &CaseSpec, seed: u64) -> Result<Oracle> {
        Self::from_inputs(case, case.generate(seed)?)
    }

    /// The oracle for `case` on given inputs (e.g. generated ones with some
    /// values edited to probe a behaviour). Under [`Precision::Fast`] Q, K, V
    /// and the past are rounded to f16 values first (they stay f32 tensors):
    /// the oracle, the baselines and the engine then all see the operands the
    /// matrix units multiply.
    pub fn from_inputs(case: &CaseSpec, mut inputs: CaseInputs) -> Result<Oracle> {
        if case.options.precision == Precision::Fast {
            inputs.round_operands_to_f16();
        }
        let mut options = case.options.clone();
        options.return_lse = true;
        options.return_present = inputs.past.is_some();
        let host = inputs.as_inputs();
        let exact = cpu::attention_exact(&host, &options)?;
        let plain = cpu::attention_plain_f32(&host, &options)?;
        let plain_quads = cpu::attention_plain_f32_in(&host, &options, cpu::SumOrder::Quads)?;
        let plain_reverse = cpu::attention_plain_f32_in(&host, &options, cpu::SumOrder::Reverse)?;
        let present = if options.return_present {
            Some(cpu::present(&host, &exact.dims)?)
        } else {
            None
        };
        Ok(Oracle {
            case: case.clone(),
            inputs,
            options,
            exact,
            plain,
            plain_quads,
            plain_reverse,
            present,
        })
    }

    /// Runs the case on `engine` through `path` and compares every output.
    pub async fn check(&self, engine: &Engine, path: KernelPath) -> CaseResult {
        let mut result = CaseResult {
            name: self.case.name.clone(),
            shapes: self.case.shape_text(),
            path,
            report: None,
            worst_output: "Y",
            failure: None,
            millis: 0.0,
        };
        let options = AttentionOptions {
            path,
            ..self.options.clone()
        };
        let start = Instant::now();
        let outputs = engine
            .attention_host(&self.inputs.as_inputs(), &options)
            .await;
        result.millis = start.elapsed().as_secs_f64() * 1e3;
        match outputs {
            Ok(out) => match self.compare(&out) {
                Ok((name, report)) => {
                    result.worst_output = name;
                    result.report = Some(report);
                }
                Err(missing) => result.failure = Some(missing),
            },
            Err(e) => result.failure = Some(e.to_string()),
        }
        result
    }

    /// The worst of the outputs' reports, or which requested output is missing.
    pub fn compare(
        &self,
        out: &AttentionOutputs<HostTensor>,
    ) -> std::result::Result<(&'static str, ErrorReport), String> {
        let (exact, plain, quads, rev) = (
            &self.exact,
            &self.plain,
            &self.plain_quads,
            &self.plain_reverse,
        );
        // f16 outputs (Y and the scores of f16 Q) are also allowed their rounding.
        let rounding = if self.inputs.q.dtype() == DType::F16 {
            F16_UNIT_ROUNDOFF
        } else {
            0.0
        };
        let compare = |got: &[f32], exact: &[f64], plain: &[f32], quads: &[f32], rev: &[f32]| {
            compare_baselines(got, exact, &[plain, quads, rev], DEFAULT_FLOOR)
                .allow_output_rounding(exact, rounding)
        };
        // Under Fast the probabilities are rounded to f16 for their product
        // with V: each weight within 2⁻¹¹ of itself, so Y within 2⁻¹¹ of the
        // largest |V| (the row sum stays f32).
        let probability_rounding = if self.options.precision == Precision::Fast {
            F16_UNIT_ROUNDOFF * self.inputs.largest_finite_value()
        } else {
            0.0
        };
        let lse = out.lse.as_ref().ok_or("the logsumexp was not returned")?;
        if out.y.dtype() != self.inputs.q.dtype() {
            return Err(format!(
                "Y came back as {} for {} queries",
                out.y.dtype(),
                self.inputs.q.dtype()
            ));
        }
        let mut reports = vec![
            (
                "Y",
                compare(out.y.data(), &exact.y, &plain.y, &quads.y, &rev.y)
                    .allow_more(probability_rounding),
            ),
            (
                "lse",
                compare_baselines(
                    lse.data(),
                    &exact.lse,
                    &[&plain.lse, &quads.lse, &rev.lse],
                    DEFAULT_FLOOR,
                ),
            ),
        ];
        if self.options.qk_matmul_output_mode.is_some() {
            let qk = out
                .qk_matmul_output
                .as_ref()
                .ok_or("qk_matmul_output was not returned")?;
            reports.push((
                "qk_matmul_output",
                compare(qk.data(), &exact.qk, &plain.qk, &quads.qk, &rev.qk),
            ));
        }
        if let Some((key, value)) = &self.present {
            let got_key = out
                .present_key
                .as_ref()
                .ok_or("present_key was not returned")?;
            let got_value = out
                .present_value
                .as_ref()
                .ok_or("present_value was not returned")?;
            reports.push((
                "present_key",
                ErrorReport::exact(got_key.data(), key.data()),
            ));
            reports.push((
                "present_value",
                ErrorReport::exact(got_value.data(), value.data()),
            ));
        }
        // Report the output that uses the largest share of its allowance.
        let worst = reports
            .into_iter()
            .max_by(|a, b| a.1.share_of_allowed().total_cmp(&b.1.share_of_allowed()))
            .unwrap_or(("Y", ErrorReport::exact(&[], &[])));
        Ok(worst)
    }
}

/// Runs `case` on each of `paths`, computing the oracle once.
pub async fn run_case(
    engine: &Engine,
    case: &CaseSpec,
    paths: &[KernelPath],
    seed: u64,
) -> Vec<CaseResult> {
    match Oracle::new(case, seed) {
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
