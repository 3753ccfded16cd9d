//! The attention explorer: one call from the page's settings, checked against
//! the oracle, with a head's probabilities for the heatmap; and the timing chart.

use serde_json::{json, Value};
use web_time::Instant;
use webattn::bench::{self, AttentionShape, Repeats};
use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::rng::SplitMix64;
use webattn::{
    AttentionInputs, AttentionOptions, Engine, Error, HostTensor, KernelPath, QkMatmulOutputMode,
    Result,
};

/// The largest sequence the explorer draws (the heatmap has one cell per pair).
pub const MAX_SEQ: usize = 512;

fn number(settings: &Value, key: &str, default: usize, max: usize) -> usize {
    settings[key]
        .as_u64()
        .map_or(default, |v| v as usize)
        .clamp(1, max)
}

fn path(name: &str) -> KernelPath {
    match name {
        "unfused" => KernelPath::Unfused,
        "cpu" => KernelPath::Cpu,
        "oracle" => KernelPath::Oracle,
        _ => KernelPath::Fused,
    }
}

/// Runs the explorer's call: returns errors, times and the chosen head's probabilities.
pub async fn run(engine: &Engine, settings: &Value) -> Result<Value> {
    let nq = number(settings, "seq_q", 64, MAX_SEQ);
    let nk = number(settings, "seq_k", 64, MAX_SEQ);
    let heads = number(settings, "heads", 4, 64);
    let kv_heads = number(settings, "kv_heads", heads, heads);
    let dk = number(settings, "head_dim", 64, 256);
    let dv = number(settings, "v_head_dim", dk, 256);
    let head = number(settings, "head", 1, heads) - 1;
    let seed = settings["seed"].as_u64().unwrap_or(1);
    let mask_kind = settings["mask"].as_str().unwrap_or("none");
    let path = path(settings["path"].as_str().unwrap_or("fused"));

    let mut rng = SplitMix64::new(seed);
    let q = HostTensor::named(
        "Q",
        [1, heads, nq, dk],
        rng.normal_vec(heads * nq * dk, 1.0),
    )?;
    let k = HostTensor::named(
        "K",
        [1, kv_heads, nk, dk],
        rng.normal_vec(kv_heads * nk * dk, 1.0),
    )?;
    let v = HostTensor::named(
        "V",
        [1, kv_heads, nk, dv],
        rng.normal_vec(kv_heads * nk * dv, 1.0),
    )?;
    let mut options = AttentionOptions {
        softcap: settings["softcap"].as_f64().unwrap_or(0.0) as f32,
        temperature: settings["temperature"]
            .as_f64()
            .filter(|t| t.is_finite() && *t > 0.0)
            .unwrap_or(1.0) as f32,
        qk_matmul_output_mode: Some(QkMatmulOutputMode::Probabilities),
        return_lse: true,
        path,
        ..Default::default()
    };
    let mut lengths = None;
    match mask_kind {
        "causal" => options.is_causal = true,
        "window" => {
            options.is_causal = true;
            options.left_window_size = number(settings, "window", 8, 1 << 20) as i64;
        }
        "padding" => {
            lengths = Some(vec![
                nk.saturating_sub(number(settings, "padding", 8, nk)) as i64
            ])
        }
        // In-kernel ALiBi: -m_h |i - j| per head, no bias matrix uploaded.
        "alibi" => options.alibi = true,
        _ => {}
    }
    let mut inputs = AttentionInputs::new(&q, &k, &v);
    inputs.nonpad_kv_seqlen = lengths.as_deref();

    // The call on the chosen path, timed on the GPU where it can be.
    let start = Instant::now();
    let (out, gpu_ms) = match (engine.gpu(), path) {
        (Some(ctx), KernelPath::Fused | KernelPath::Unfused) => {
            let timed = ctx.set_profiling(true);
            let result = engine.attention_host(&inputs, &options).await;
            let gpu_ms = if timed {
                ctx.last_gpu_ms().await?
            } else {
                None
            };
            ctx.set_profiling(false);
            (result?, gpu_ms)
        }
        (None, KernelPath::Fused | KernelPath::Unfused) => {
            return Err(Error::Conflict(
                "no GPU adapter: choose the CPU path (or the f64 oracle)",
            ));
        }
        _ => (engine.attention_host(&inputs, &options).await?, None),
    };
    let wall_ms = start.elapsed().as_secs_f64() * 1e3;
    let taken = engine.last_call().map_or(path, |c| c.path);

    // The oracle, in f64, and the plain f32 baseline that sets the tolerance.
    let start = Instant::now();
    let exact = webattn::cpu::attention_exact(&inputs, &options)?;
    let oracle_ms = start.elapsed().as_secs_f64() * 1e3;
    let plain = webattn::cpu::attention_plain_f32(&inputs, &options)?;
    let y = compare(out.y.data(), &exact.y, &plain.y, DEFAULT_FLOOR);
    let probs = out
        .qk_matmul_output
        .as_ref()
        .ok_or(Error::Conflict("the probabilities were not returned"))?;
    let p = compare(probs.data(), &exact.qk, &plain.qk, DEFAULT_FLOOR);
    let head_probs = &probs.data()[head * nq * nk..(head + 1) * nq * nk];

    Ok(json!({
        "path": taken.name(),
        "seq_q": nq,
        "seq_k": nk,
        "head": head + 1,
        "y": {"max_abs": y.max_abs, "allowed": y.allowed, "passed": y.passed()},
        "probs": {"max_abs": p.max_abs, "allowed": p.allowed, "passed": p.passed()},
        "passed": y.passed() && p.passed(),
        "gpu_ms": gpu_ms,
        "wall_ms": wall_ms,
        "oracle_ms": oracle_ms,
        "heatmap": head_probs,
    }))
}

/// Fused, unfused, CPU-backend and f64-oracle milliseconds at each sequence
/// length (B = 1, H = 4, d = 64); the CPU backend is the median of 3 runs
/// after one, the oracle one run.
pub async fn timing(engine: &Engine, seqs: &[usize]) -> Result<Value> {
    let mut rows = Vec::new();
    for &seq in seqs {
        let shape = AttentionShape {
            batch: 1,
            heads: 4,
            seq_q: seq.clamp(16, 2048),
            seq_k: seq.clamp(16, 2048),
            head_dim: 64,
            causal: false,
        };
        let mut row = json!({"seq": shape.seq_q, "gflop": shape.flops() / 1e9});
        if engine.gpu().is_some() {
            for path in [KernelPath::Fused, KernelPath::Unfused] {
                let m = bench::attention(
                    engine,
                    shape,
                    path,
                    Repeats {
                        warmup: 1,
                        timed: 3,
                    },
                )
                .await?;
                row[path.name()] = json!(m.measurement.median_ms());
            }
        }
        for (path, repeats) in [
            (
                KernelPath::Cpu,
                Repeats {
                    warmup: 1,
                    timed: 3,
                },
            ),
            (
                KernelPath::Oracle,
                Repeats {
                    warmup: 0,
                    timed: 1,
                },
            ),
        ] {
            let m = bench::attention(engine, shape, path, repeats).await?;
            row[path.name()] = json!(m.measurement.median_ms());
        }
        rows.push(row);
    }
    Ok(Value::Array(rows))
}
