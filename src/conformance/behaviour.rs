//! Behaviour checks: what the engine does with bad input and with values the
//! contract defines specially: non-finite numbers where a row attends them
//! (they propagate as in PyTorch's `scaled_dot_product_attention`) and where
//! it does not (they are ignored), and rows with every key masked. Each becomes
//! a [`CaseResult`] beside the numeric cases; the oracle says which outputs are
//! NaN, and every path must agree element by element.

use super::case::{CaseInputs, CaseSpec, MaskForm};
use super::runner::{CaseResult, Oracle};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::options::{AttentionOptions, KernelPath, Precision};
use crate::tensor::{HostMask, HostTensor};

/// The names of the behaviour checks, in the order [`run_behaviour`] runs them.
pub const BEHAVIOUR_CHECKS: [&str; 20] = [
    "bad-input-shape-mismatch",
    "bad-input-gqa-heads",
    "bad-input-mask-broadcast",
    "nonfinite-k-at-masked-keys",
    "nonfinite-q-in-empty-rows",
    "every-key-masked",
    "nan-q-attended",
    "inf-q-attended",
    "neg-inf-scores-everywhere",
    "nan-k-attended-causal",
    "inf-k-attended-probabilities",
    "inf-k-with-softcap",
    "nan-v-attended-causal",
    "inf-v-attended",
    "inf-v-tiny-probability",
    "nonfinite-v-at-masked-keys",
    "nan-in-float-mask",
    "nonfinite-decode",
    "huge-bias-temperature",
    "huge-bias-temperature-decode",
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
    precision: Precision,
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
        precision,
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

/// Checks a case whose inputs were edited after generation against the oracle
/// on the same inputs: finite values within tolerance, and NaN and infinities
/// exactly where the oracle has them.
async fn numeric(
    engine: &Engine,
    name: &str,
    path: KernelPath,
    precision: Precision,
    case: CaseSpec,
    seed: u64,
    edit: impl FnOnce(&mut CaseInputs),
) -> CaseResult {
    let case = case.with(|o| o.precision = precision);
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

/// Runs every behaviour check on `path` at `precision` (under
/// [`Precision::Fast`] the numeric ones on f16-rounded operands, with the f16
/// rule, and through the matrix-unit kernels where the adapter has them).
pub async fn run_behaviour(
    engine: &Engine,
    path: KernelPath,
    precision: Precision,
    seed: u64,
) -> Vec<CaseResult> {
    let mut results = Vec::new();
    results.push(
        expect_error(
            engine,
            BEHAVIOUR_CHECKS[0],
            path,
            precision,
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
            precision,
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
        expect_error(
            engine,
            BEHAVIOUR_CHECKS[2],
            path,
            precision,
            bad_mask,
            |e| matches!(e, Error::Broadcast { .. }),
        )
        .await,
    );

    // Infinite and NaN keys where the mask excludes them take no part.
    let case = CaseSpec::new("nonfinite-k", [1, 2, 1], [5, 9], [8, 8]).mask(MaskForm::Bool(1));
    results.push(
        numeric(
            engine,
            BEHAVIOUR_CHECKS[3],
            path,
            precision,
            case,
            seed,
            |inputs| {
                if let Some(HostMask::Bool { data, .. }) = &mut inputs.mask {
                    data[2] = false;
                    data[7] = false;
                    data[0] = true;
                }
                let dk = 8;
                inputs.k.data_mut()[2 * dk] = f32::INFINITY;
                inputs.k.data_mut()[7 * dk + 3] = f32::NAN;
            },
        )
        .await,
    );
    // A NaN query row whose keys are all masked gives a zero row, not NaN.
    let case = CaseSpec::new("nonfinite-q", [2, 2, 2], [7, 9], [8, 8]).mask(MaskForm::EmptyRows);
    results.push(
        numeric(
            engine,
            BEHAVIOUR_CHECKS[4],
            path,
            precision,
            case,
            seed,
            |inputs| {
                // Row 1 of every head is fully masked by MaskForm::EmptyRows.
                let dk = 8;
                for head in 0..4 {
                    let row = (head * 7 + 1) * dk;
                    inputs.q.data_mut()[row] = f32::NAN;
                    inputs.q.data_mut()[row + 1] = f32::NEG_INFINITY;
                }
            },
        )
        .await,
    );
    // Every key of every row masked: zeros and a logsumexp of -inf everywhere.
    let case = CaseSpec::new("all-masked", [2, 2, 1], [4, 6], [8, 8]).nonpad();
    results.push(
        numeric(
            engine,
            BEHAVIOUR_CHECKS[5],
            path,
            precision,
            case,
            seed,
            |inputs| {
                inputs.nonpad = Some(vec![0, 0]);
            },
        )
        .await,
    );
    results.extend(run_non_finite(engine, path, precision, seed).await);
    results
}

/// Index of element `d` of row `row` of head `head` in a `[1, H, N, D]` tensor.
fn at(head: usize, rows: usize, row: usize, width: usize, d: usize) -> usize {
    (head * rows + row) * width + d
}

/// Non-finite values where rows attend them, and where they do not.
async fn run_non_finite(
    engine: &Engine,
    path: KernelPath,
    precision: Precision,
    seed: u64,
) -> Vec<CaseResult> {
    let name = |i: usize| BEHAVIOUR_CHECKS[6 + i];
    let mut results = Vec::new();
    // A NaN in one query row: that row (Y and logsumexp) is NaN, the others not.
    let case = CaseSpec::new("nan-q", [1, 2, 1], [5, 9], [8, 8]);
    results.push(
        numeric(engine, name(0), path, precision, case, seed, |inputs| {
            inputs.q.data_mut()[at(1, 5, 2, 8, 3)] = f32::NAN;
        })
        .await,
    );
    // +inf in a query: scores of +inf (a NaN row) or -inf, by the keys' signs.
    let case = CaseSpec::new("inf-q", [1, 2, 1], [5, 9], [8, 8]);
    results.push(
        numeric(engine, name(1), path, precision, case, seed, |inputs| {
            inputs.q.data_mut()[at(0, 5, 1, 8, 0)] = f32::INFINITY;
            inputs.q.data_mut()[at(1, 5, 4, 8, 2)] = f32::NEG_INFINITY;
        })
        .await,
    );
    // -inf against keys that are all positive there: every attended score is
    // -inf, and softmax of nothing but -inf is NaN (as in PyTorch), while a
    // fully masked row stays 0.
    let case = CaseSpec::new("neg-inf", [1, 1, 1], [4, 6], [8, 8]);
    results.push(
        numeric(engine, name(2), path, precision, case, seed, |inputs| {
            for key in 0..6 {
                inputs.k.data_mut()[key * 8] = 0.5 + key as f32;
            }
            inputs.q.data_mut()[at(0, 4, 2, 8, 0)] = f32::NEG_INFINITY;
        })
        .await,
    );
    // A NaN key under causal masking: rows that reach it are NaN, earlier rows
    // are not; the probabilities (mode 3) agree.
    let case = CaseSpec::new("nan-k-causal", [1, 2, 1], [7, 7], [8, 8]).with(|o| {
        o.is_causal = true;
        o.qk_matmul_output_mode = Some(crate::options::QkMatmulOutputMode::Probabilities);
    });
    results.push(
        numeric(engine, name(3), path, precision, case, seed, |inputs| {
            inputs.k.data_mut()[at(0, 7, 4, 8, 5)] = f32::NAN;
        })
        .await,
    );
    // +inf in a key, with the biased scores returned (mode 2).
    let case = CaseSpec::new("inf-k", [1, 2, 1], [6, 10], [8, 8]).with(|o| {
        o.qk_matmul_output_mode = Some(crate::options::QkMatmulOutputMode::Biased);
    });
    results.push(
        numeric(engine, name(4), path, precision, case, seed, |inputs| {
            inputs.k.data_mut()[at(0, 10, 3, 8, 1)] = f32::INFINITY;
            inputs.k.data_mut()[at(0, 10, 8, 8, 6)] = f32::NEG_INFINITY;
        })
        .await,
    );
    // Softcap turns +-inf scores into +-c: nothing is NaN.
    let case = CaseSpec::new("inf-k-softcap", [1, 2, 1], [6, 10], [8, 8]).with(|o| o.softcap = 5.0);
    results.push(
        numeric(engine, name(5), path, precision, case, seed, |inputs| {
            inputs.k.data_mut()[at(0, 10, 3, 8, 1)] = f32::INFINITY;
            inputs.k.data_mut()[at(0, 10, 7, 8, 0)] = f32::NEG_INFINITY;
        })
        .await,
    );
    // A NaN in V reaches that column of every row that attends its key, and
    // only those (causal: the rows from the key on).
    let case =
        CaseSpec::new("nan-v-causal", [1, 2, 1], [9, 9], [8, 8]).with(|o| o.is_causal = true);
    results.push(
        numeric(engine, name(6), path, precision, case, seed, |inputs| {
            inputs.v.data_mut()[at(0, 9, 5, 8, 2)] = f32::NAN;
        })
        .await,
    );
    // +inf in V: an infinite column in every row that attends the key.
    let case = CaseSpec::new("inf-v", [1, 2, 1], [5, 9], [8, 8]);
    results.push(
        numeric(engine, name(7), path, precision, case, seed, |inputs| {
            inputs.v.data_mut()[at(0, 9, 4, 8, 7)] = f32::INFINITY;
        })
        .await,
    );
    // +inf in V at a key one row attends with a probability of about 1e-14
    // (its score some 32 below the row's best): that row's column is +inf
    // too, however small the weight (f16 would round it to 0, and 0 * inf is NaN).
    let case = CaseSpec::new("inf-v-tiny-p", [1, 1, 1], [3, 9], [8, 8]);
    results.push(
        numeric(engine, name(8), path, precision, case, seed, |inputs| {
            let q = inputs.q.data_mut();
            q[at(0, 3, 1, 8, 0)..at(0, 3, 1, 8, 8)].fill(0.0);
            q[at(0, 3, 1, 8, 0)] = 10.0;
            let k = inputs.k.data_mut();
            for key in 0..9 {
                k[at(0, 9, key, 8, 0)] = if key == 4 { -8.0 } else { 1.0 };
            }
            inputs.v.data_mut()[at(0, 9, 4, 8, 2)] = f32::INFINITY;
        })
        .await,
    );
    // NaN and infinities in V at keys no row attends change nothing.
    let case = CaseSpec::new("masked-v", [1, 2, 1], [5, 9], [8, 8]).mask(MaskForm::Bool(1));
    results.push(
        numeric(engine, name(9), path, precision, case, seed, |inputs| {
            if let Some(HostMask::Bool { data, .. }) = &mut inputs.mask {
                data.fill(true);
                data[2] = false;
                data[6] = false;
            }
            inputs.v.data_mut()[at(0, 9, 2, 8, 0)] = f32::NAN;
            inputs.v.data_mut()[at(0, 9, 6, 8, 4)] = f32::INFINITY;
            inputs.v.data_mut()[at(0, 9, 6, 8, 5)] = f32::NEG_INFINITY;
        })
        .await,
    );
    // A NaN in a float mask is added like any value: that row is NaN.
    let case = CaseSpec::new("nan-mask", [1, 2, 1], [5, 9], [8, 8]).mask(MaskForm::Float(2));
    results.push(
        numeric(engine, name(10), path, precision, case, seed, |inputs| {
            if let Some(HostMask::Float(mask)) = &mut inputs.mask {
                mask.data_mut()[9 + 4] = f32::NAN;
                mask.data_mut()[3 * 9 + 1] = f32::NEG_INFINITY;
            }
        })
        .await,
    );
    // The split-K decode kernel (few rows, many keys): a NaN key one row
    // attends and the other does not, a NaN value both attend, and NaN values
    // at keys neither attends.
    let case =
        CaseSpec::new("decode-nonfinite", [1, 1, 1], [2, 600], [8, 8]).mask(MaskForm::Bool(2));
    results.push(
        numeric(engine, name(11), path, precision, case, seed, |inputs| {
            if let Some(HostMask::Bool { data, .. }) = &mut inputs.mask {
                data.fill(true);
                data[9] = false; // row 0 does not attend key 9; row 1 does
                data[400] = false;
                data[600 + 400] = false; // neither row attends key 400
            }
            inputs.k.data_mut()[9 * 8 + 2] = f32::NAN;
            inputs.v.data_mut()[5 * 8 + 3] = f32::NAN;
            inputs.v.data_mut()[400 * 8 + 1] = f32::NAN;
            inputs.v.data_mut()[400 * 8 + 6] = f32::INFINITY;
        })
        .await,
    );
    results.extend(run_huge_bias(engine, path, precision, seed).await);
    results
}

/// Float-mask biases near `f32::MAX` under a temperature below 1: each
/// biased score is finite, though dividing it by the temperature is not, so
/// the kernels must take the row maximum out before they divide (the row
/// then gives the key all its weight, not NaN). Through the prefill kernels
/// with the probabilities returned (mode 3), and through the decode kernels.
async fn run_huge_bias(
    engine: &Engine,
    path: KernelPath,
    precision: Precision,
    seed: u64,
) -> Vec<CaseResult> {
    let name = |i: usize| BEHAVIOUR_CHECKS[18 + i];
    // Row r's bias at key (3 r) % T: +3e38, +1e38 or -3e38 (attended: only
    // -inf and -f32::MAX mask a key), the other keys' biases small; and, in
    // a fourth row, -3.3e38 at every key (its maximum is below -3e38: every
    // key attended, the weights as the scores' differences give them).
    let huge = |inputs: &mut CaseInputs, rows: usize, keys: usize| {
        if let Some(HostMask::Float(mask)) = &mut inputs.mask {
            for row in 0..rows {
                let at = row * keys;
                if row == 3 {
                    mask.data_mut()[at..at + keys].fill(-3.3e38);
                } else {
                    let bias = [3e38, 1e38, -3e38][row % 3];
                    mask.data_mut()[at + (3 * row) % keys] = bias;
                }
            }
        }
    };
    let mut results = Vec::new();
    let case = CaseSpec::new("huge-bias", [1, 2, 1], [5, 9], [8, 8])
        .mask(MaskForm::Float(2))
        .with(|o| {
            o.temperature = 0.5;
            o.qk_matmul_output_mode = Some(crate::options::QkMatmulOutputMode::Probabilities);
        });
    results.push(
        numeric(engine, name(0), path, precision, case, seed, |inputs| {
            huge(inputs, 5, 9)
        })
        .await,
    );
    let case = CaseSpec::new("huge-bias-decode", [1, 2, 1], [4, 600], [8, 8])
        .mask(MaskForm::Float(2))
        .with(|o| o.temperature = 0.25);
    results.push(
        numeric(engine, name(1), path, precision, case, seed, |inputs| {
            huge(inputs, 4, 600)
        })
        .await,
    );
    results
}
