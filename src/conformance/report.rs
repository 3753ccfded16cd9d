//! Running a whole sweep, and the report every runner prints the same way: a
//! table of cases and a last line `N passed, N failed`.

use super::behaviour::{run_behaviour, BEHAVIOUR_CHECKS};
use super::case::CaseSpec;
use super::runner::{CaseResult, Oracle};
use super::sweep::{filtered, SweepKind};
use crate::engine::Engine;
use crate::options::{KernelPath, Precision};

/// The results of a sweep on one engine.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepReport {
    /// What the engine runs on ([`Engine::describe`]).
    pub adapter: String,
    /// The seed the inputs were drawn from.
    pub seed: u64,
    /// Which sweep ran.
    pub kind: SweepKind,
    /// The precision the calls allowed.
    pub precision: Precision,
    /// One result per case and path, in the order they ran.
    pub results: Vec<CaseResult>,
}

impl SweepReport {
    /// Cases that passed.
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.passed()).count()
    }

    /// Cases that failed.
    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }

    /// The last line of every report: `N passed, N failed`.
    pub fn summary_line(&self) -> String {
        format!("{} passed, {} failed", self.passed(), self.failed())
    }

    /// The worst error share of the allowance over every numeric case.
    pub fn worst_share_of_allowed(&self) -> f64 {
        self.results
            .iter()
            .filter_map(|r| r.report.map(|rep| rep.share_of_allowed()))
            .fold(0.0, f64::max)
    }

    /// The table: case, shapes, path, worst absolute and relative error, the
    /// allowed error and pass/fail, then the summary line.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<40} {:<30} {:<8} {:>10} {:>10} {:>10} {:>9}  {}\n",
            "case", "shapes", "path", "max abs", "max rel", "allowed", "ms", "result"
        );
        for r in &self.results {
            let (abs, rel, allowed) = match &r.report {
                Some(rep) => (
                    format!("{:.2e}", rep.max_abs),
                    format!("{:.2e}", rep.max_rel),
                    format!("{:.2e}", rep.allowed),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let verdict = match (&r.failure, r.passed()) {
                (Some(why), _) => format!("FAIL: {why}"),
                (None, true) => "pass".to_string(),
                (None, false) => format!("FAIL ({} over the allowance)", r.worst_output),
            };
            out.push_str(&format!(
                "{:<40} {:<30} {:<8} {:>10} {:>10} {:>10} {:>9.1}  {}\n",
                r.name,
                r.shapes,
                path_name(r.path),
                abs,
                rel,
                allowed,
                r.millis,
                verdict
            ));
        }
        out.push_str(&self.summary_line());
        out
    }
}

/// The lowercase name of a path (`auto`, `unfused`, `cpu`), as the CLI spells it.
pub fn path_name(path: KernelPath) -> &'static str {
    path.name()
}

/// The number of results a sweep will produce (for progress bars).
pub fn sweep_len(engine: &Engine, kind: SweepKind, filter: &str) -> usize {
    let paths = engine.paths().len();
    let behaviour = BEHAVIOUR_CHECKS
        .iter()
        .filter(|n| n.contains(filter))
        .count();
    (filtered(kind, filter).len() + behaviour) * paths
}

/// Runs the sweep (cases whose name contains `filter`, plus the behaviour
/// checks) on every path the engine has, at `precision`, calling `progress`
/// after each result. Under [`Precision::Fast`] every case runs on
/// f16-rounded operands and is judged by the f16 rule ([`Oracle::from_inputs`]).
pub async fn run_sweep(
    engine: &Engine,
    kind: SweepKind,
    filter: &str,
    seed: u64,
    precision: Precision,
    progress: impl FnMut(&CaseResult),
) -> SweepReport {
    let cases = filtered(kind, filter);
    run_sweep_of(engine, (kind, cases), filter, seed, precision, progress).await
}

/// [`run_sweep`] over `cases` taken from the sweep of `kind` (e.g. a share
/// of it), with the behaviour cases whose name contains `filter`.
pub async fn run_sweep_of(
    engine: &Engine,
    (kind, cases): (SweepKind, Vec<CaseSpec>),
    filter: &str,
    seed: u64,
    precision: Precision,
    mut progress: impl FnMut(&CaseResult),
) -> SweepReport {
    let paths = engine.paths();
    let mut results = Vec::new();
    for case in cases {
        let case = case.with(|o| o.precision = precision);
        match Oracle::new(&case, seed) {
            Ok(oracle) => {
                for &path in &paths {
                    let result = oracle.check(engine, path).await;
                    progress(&result);
                    results.push(result);
                }
            }
            Err(e) => {
                for &path in &paths {
                    let result = CaseResult {
                        name: case.name.clone(),
                        shapes: case.shape_text(),
                        path,
                        report: None,
                        worst_output: "-",
                        failure: Some(format!("the oracle rejected the case: {e}")),
                        millis: 0.0,
                    };
                    progress(&result);
                    results.push(result);
                }
            }
        }
    }
    for &path in &paths {
        for result in run_behaviour(engine, path, precision, seed).await {
            if result.name.contains(filter) {
                progress(&result);
                results.push(result);
            }
        }
    }
    SweepReport {
        adapter: engine.describe(),
        seed,
        kind,
        precision,
        results,
    }
}
