//! Behaviour checks: what the engine does with bad input and with values the
//! contract defines specially (non-finite numbers at masked positions, rows
//! with every key masked). Each becomes a [`CaseResult`] beside the numeric cases.

use super::case::{CaseInputs, CaseSpec, MaskForm};
use super::runner::{CaseResult, Oracle};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::options::{AttentionOptions, KernelPath};
use crate::tensor::{HostMask, HostTensor};

/// The names of the behaviour checks, in the order [`run_behaviour`] runs them.
pub const BEHAVIOUR_CHECKS: [&str; 6] = [
    "bad-input-shape-mismatch",
    "bad-input-gqa-heads",
    "bad-input-mask-broadcast",
    "nonfinite-k-at-masked-keys",
    "nonfinite-q-in-empty-rows",
    "every-key-masked",
];

fn result(name: &str, shapes: &str, path: KernelPath, failure: Option<String>) -> CaseResult {
    CaseResult {
        name: name.to_string(),
        shapes: shapes.to_string(),
        path,
        report: None,
        worst_output: "-",
        failure,
        millis: 0.0,
    }
}

/// Runs the call and expects an error accepted by `expected`.
async fn expect_error(
    engine: &Engine,
    name: &str,
    path: KernelPath,
    inputs: Result<CaseInputs>,
    expected: fn(&Error) -> bool,
) -> CaseResult {
    let inputs = match inputs {
        Ok(inputs) => inputs,
        Err(e) => {
            return result(
                name,
                "-",
                path,
                Some(format!("building the inputs failed: {e}")),
            )
        }
    };
    let options = AttentionOptions {
        path,
        ..Default::default()
    };
    let shapes = format!("Q{:?} K{:?}", inputs.q.shape(), inputs.k.shape());
    let failure = match engine.attention_host(&inputs.as_inputs(), &options).await {
        Ok(_) => Some("bad input was accepted".to_string()),
        Err(e) if expected(&e) => None,
        Err(e) => Some(format!("wrong error: {e}")),
    };
    result(name, &shapes, path, failure)
}

fn halves(shape: [usize; 4]) -> Result<HostTensor> {
    HostTensor::new(shape, vec![0.5; shape.iter().product()])
}

fn plain(q: [usize; 4], k: [usize; 4], v: [usize; 4]) -> Result<CaseInputs> {
    Ok(CaseInputs {
        q: halves(q)?,
        k: halves(k)?,
        v: halves(v)?,
        mask: None,
        past: None,
        nonpad: None,
    })
}

/// Checks a case whose inputs were edited after generation: it must match the
/// oracle and produce no NaN anywhere.
async fn numeric(
    engine: &Engine,
    name: &str,
    path: KernelPath,
    case: CaseSpec,
    seed: u64,
    edit: impl FnOnce(&mut CaseInputs),
) -> CaseResult {
    let oracle = case.generate(seed).and_then(|mut inputs| {
        edit(&mut inputs);
        Oracle::from_inputs(&case, inputs)
    });
    let oracle = match oracle {
        Ok(oracle) => oracle,
        Err(e) => return result(name, &case.shape_text(), path, Some(e.to_string())),
    };
    let mut checked = oracle.check(engine, path).await;
    checked.name = name.to_string();
    checked
}

/// Runs every behaviour check on `path`.
pub async fn run_behaviour(engine: &Engine, path: KernelPath, seed: u64) -> Vec<CaseResult> {
    let mut results = Vec::new();
    results.push(
        expect_error(
            engine,
            BEHAVIOUR_CHECKS[0],
            path,
            plain([2, 2, 3, 8], [1, 2, 5, 8], [1, 2, 5, 8]),
            |e| matches!(e, Error::ShapeMismatch { .. }),
        )
        .await,
    );
    results.push(
        expect_error(
            engine,
            BEHAVIOUR_CHECKS[1],
            path,
            plain([1, 3, 3, 8], [1, 2, 5, 8], [1, 2, 5, 8]),
            |e| matches!(e, Error::GqaHeads { .. }),
        )
        .await,
    );
    // A [B, Nq, T] mask: rank 3 means [Hq, Nq, T], so B = 2 does not match Hq = 3.
    let bad_mask = plain([2, 3, 4, 8], [2, 1, 5, 8], [2, 1, 5, 8]).and_then(|mut inputs| {
        inputs.mask = Some(HostMask::bool(vec![2, 4, 5], vec![true; 40])?);
        Ok(inputs)
    });
    results.push(
        expect_error(engine, BEHAVIOUR_CHECKS[2], path, bad_mask, |e| {
            matches!(e, Error::Broadcast { .. })
        })
        .await,
    );

    // Infinite and NaN keys where the mask excludes them take no part.
    let case = CaseSpec::new("nonfinite-k", [1, 2, 1], [5, 9], [8, 8]).mask(MaskForm::Bool(1));
    results.push(
        numeric(engine, BEHAVIOUR_CHECKS[3], path, case, seed, |inputs| {
            if let Some(HostMask::Bool { data, .. }) = &mut inputs.mask {
                data[2] = false;
                data[7] = false;
                data[0] = true;
            }
            let dk = 8;
            inputs.k.data_mut()[2 * dk] = f32::INFINITY;
            inputs.k.data_mut()[7 * dk + 3] = f32::NAN;
        })
        .await,
    );
    // A NaN query row whose keys are all masked gives a zero row, not NaN.
    let case = CaseSpec::new("nonfinite-q", [2, 2, 2], [7, 9], [8, 8]).mask(MaskForm::EmptyRows);
    results.push(
        numeric(engine, BEHAVIOUR_CHECKS[4], path, case, seed, |inputs| {
            // Row 1 of every head is fully masked by MaskForm::EmptyRows.
            let dk = 8;
            for head in 0..4 {
                let row = (head * 7 + 1) * dk;
                inputs.q.data_mut()[row] = f32::NAN;
                inputs.q.data_mut()[row + 1] = f32::NEG_INFINITY;
            }
        })
        .await,
    );
    // Every key of every row masked: zeros and a logsumexp of -inf everywhere.
    let case = CaseSpec::new("all-masked", [2, 2, 1], [4, 6], [8, 8]).nonpad();
    results.push(
        numeric(engine, BEHAVIOUR_CHECKS[5], path, case, seed, |inputs| {
            inputs.nonpad = Some(vec![0, 0]);
        })
        .await,
    );
    results
}
