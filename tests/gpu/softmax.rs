//! The row softmax kernel against an f64 oracle: masked entries, fully masked
//! rows (zeros and a logsumexp of -inf), logits up to ±1e4, wide rows and
//! more rows than one dispatch dimension holds.

use crate::common;

use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::kernels::softmax::MASKED;
use webattn::rng::SplitMix64;
use webattn::run::single::softmax_host;

/// Softmax and logsumexp of each row, in `f64` or `f32`, skipping masked entries.
fn reference(rows: usize, cols: usize, s: &[f32], wide: bool) -> (Vec<f64>, Vec<f64>) {
    let round = |x: f64| if wide { x } else { x as f32 as f64 };
    let mut probs = vec![0.0; rows * cols];
    let mut lse = vec![f64::NEG_INFINITY; rows];
    for r in 0..rows {
        let row = &s[r * cols..(r + 1) * cols];
        let max = row
            .iter()
            .filter(|&&x| x > MASKED)
            .fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
        if max == f64::NEG_INFINITY {
            continue;
        }
        let mut sum = 0.0;
        for (j, &x) in row.iter().enumerate() {
            if x > MASKED {
                let e = round(round(x as f64 - max).exp());
                probs[r * cols + j] = e;
                sum = round(sum + e);
            }
        }
        for j in 0..cols {
            probs[r * cols + j] = round(probs[r * cols + j] / sum);
        }
        lse[r] = round(max + sum.ln());
    }
    (probs, lse)
}

fn check(name: &str, rows: usize, cols: usize, scale: f32, masked_share: f64, seed: u64) {
    let Some(engine) = common::gpu() else { return };
    let ctx = engine.gpu().expect("a GPU engine");
    let mut rng = SplitMix64::new(seed);
    let scores: Vec<f32> = (0..rows * cols)
        .map(|i| {
            // Every fifth row is fully masked when masking is on.
            if masked_share > 0.0 && ((i / cols) % 5 == 4 || rng.chance(masked_share)) {
                if rng.chance(0.5) {
                    f32::NEG_INFINITY
                } else {
                    MASKED
                }
            } else {
                rng.normal() * scale
            }
        })
        .collect();
    let (probs, lse) =
        pollster::block_on(softmax_host(ctx, rows, cols, &scores)).expect("softmax runs");
    let (exact_p, exact_lse) = reference(rows, cols, &scores, true);
    let (plain_p, plain_lse) = reference(rows, cols, &scores, false);
    let narrow = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<_>>();
    let rp = compare(&probs, &exact_p, &narrow(plain_p), DEFAULT_FLOOR);
    let rl = compare(&lse, &exact_lse, &narrow(plain_lse), DEFAULT_FLOOR);
    println!(
        "{name:<28} probs max_abs {:.3e} (allowed {:.3e}), lse max_abs {:.3e} (allowed {:.3e})",
        rp.max_abs, rp.allowed, rl.max_abs, rl.allowed
    );
    assert!(rp.passed(), "{name} probabilities: {rp:?}");
    assert!(rl.passed(), "{name} logsumexp: {rl:?}");
    assert!(
        probs.iter().all(|p| p.is_finite()),
        "{name}: a probability is not finite"
    );
}

#[test]
fn awkward_widths() {
    for (i, cols) in [1usize, 7, 33, 97, 257, 1025, 4099].into_iter().enumerate() {
        check(&format!("cols {cols}"), 9, cols, 1.0, 0.0, i as u64);
    }
}

#[test]
fn masked_entries_and_fully_masked_rows() {
    for (i, cols) in [1usize, 7, 97, 1025].into_iter().enumerate() {
        check(
            &format!("masked cols {cols}"),
            15,
            cols,
            2.0,
            0.3,
            10 + i as u64,
        );
    }
}

#[test]
fn logits_up_to_1e4() {
    check("logits 1e4", 17, 257, 3.0e3, 0.1, 20);
}

#[test]
fn more_rows_than_one_dispatch_dimension() {
    check("70000 rows", 70_000, 3, 1.0, 0.2, 30);
}
