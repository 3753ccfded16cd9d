//! The fused path's memory is O(N): at the shortest N from 16384 on (B = 1,
//! H = 8, D = 64) whose unfused score matrix (8.6 GB at 16384) cannot be
//! allocated on the adapter, the fused path allocates only Y and per-row
//! statistics, and agrees with the f64 oracle on a sample of rows.

mod common;

use webattn::conformance::{compare, CaseSpec, DEFAULT_FLOOR};
use webattn::{AttentionInputs, AttentionOptions, KernelPath};

#[test]
fn fused_attention_past_the_score_matrixs_buffer_in_linear_memory() {
    let Some(engine) = common::gpu() else { return };
    let max_buffer = engine
        .capabilities()
        .expect("a GPU engine")
        .limits
        .max_buffer_size;
    let (b, h, d) = (1, 8, 64);
    let mut n: usize = 16384;
    while (b * h * n * n * 4) as u64 <= max_buffer {
        n *= 2;
    }
    let case = CaseSpec::new("long", [b, h, h], [n, n], [d, d]).with(|o| o.is_causal = true);
    let inputs = case.generate(common::seed()).expect("inputs");
    let limits = &engine.capabilities().expect("a GPU engine").limits;

    let score_bytes = (b * h * n * n * 4) as u64;
    println!(
        "unfused score matrix: {} MiB; largest buffer on this adapter: {} MiB",
        score_bytes >> 20,
        limits.max_buffer_size >> 20
    );
    assert!(
        score_bytes > limits.max_buffer_size,
        "the score matrix would fit; pick a longer N"
    );

    let (q, k, v) = (
        engine.upload(&inputs.q).unwrap(),
        engine.upload(&inputs.k).unwrap(),
        engine.upload(&inputs.v).unwrap(),
    );
    let options = AttentionOptions {
        is_causal: true,
        return_lse: true,
        path: KernelPath::Fused,
        ..Default::default()
    };
    let start = std::time::Instant::now();
    let out = engine
        .attention_blocking(&AttentionInputs::new(&q, &k, &v), &options)
        .expect("the fused path runs");
    let y = engine.download_blocking(&out.y).unwrap();
    let lse = engine.download_blocking(out.lse.as_ref().unwrap()).unwrap();
    println!(
        "fused attention at N = {n}: {:.1} s",
        start.elapsed().as_secs_f64()
    );

    let stats = engine.last_call().expect("a call was made");
    let y_bytes = (b * h * n * d * 4) as u64;
    let row_bytes = (b * h * n * 4) as u64;
    println!(
        "fused path allocated {} MiB (Y {} MiB + row statistics {} MiB); inputs {} MiB",
        stats.allocated_bytes >> 20,
        y_bytes >> 20,
        (3 * row_bytes) >> 20,
        (3 * y_bytes) >> 20
    );
    assert_eq!(stats.plan.path, KernelPath::Fused);
    assert!(
        stats.allocated_bytes <= y_bytes + 3 * row_bytes,
        "{stats:?}"
    );

    // A sample of rows: the first and last of every head, and some in between.
    let mut rows = Vec::new();
    for head in 0..h {
        for i in [0, 1, 63, 64, 4095, n / 2 + 17, n - 2, n - 1] {
            rows.push((0, head, i));
        }
    }
    let host = inputs.as_inputs();
    let exact = webattn::cpu::attention_rows::<f64>(&host, &options, &rows).unwrap();
    let plain = webattn::cpu::attention_rows::<f32>(&host, &options, &rows).unwrap();
    let mut worst = 0.0f64;
    for ((&(_, head, i), (ey, else_exact)), (py, plse)) in rows.iter().zip(&exact).zip(&plain) {
        let base = (head * n + i) * d;
        let report = compare(&y.data()[base..base + d], ey, py, DEFAULT_FLOOR);
        let lse_report = compare(
            &[lse.data()[head * n + i]],
            &[*else_exact],
            &[*plse],
            DEFAULT_FLOOR,
        );
        assert!(
            report.passed() && lse_report.passed(),
            "row ({head}, {i}): {report:?} {lse_report:?}"
        );
        worst = worst.max(report.max_abs).max(lse_report.max_abs);
    }
    println!(
        "{} sampled rows agree with the oracle; worst error {worst:.2e}",
        rows.len()
    );
}
