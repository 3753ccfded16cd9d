//! What the bench reports from: the run's setting, rows and ceilings, the
//! shares taken against them, and the JSON `--json` writes (and `--plot`
//! draws from).

use serde_json::{json, Value};
use webattn::measure as bench;
use webattn::measure::AttentionShape;
use webattn::{DType, KernelPath, Precision};

use super::ceilings::Ceilings;
use super::rows::Measured;
use super::{gemm_at, Setting};

/// A finished run: what the table and the JSON are made from.
pub(super) struct Report<'a> {
    pub(super) setting: &'a Setting<'a>,
    pub(super) rows: &'a Measured,
    pub(super) ceilings: &'a Ceilings,
    /// The CPU backend, described.
    pub(super) cpu: String,
}

/// GB/s of K + V a decode row read.
pub(super) fn kv_gbs(shape: &AttentionShape, dtype: DType, m: &bench::AttentionMeasurement) -> f64 {
    shape.kv_bytes_as(dtype) as f64 / (m.measurement.median_ms() * 1e6)
}

/// `x` where it is finite (JSON has no NaN: null otherwise).
pub(super) fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

impl Report<'_> {
    /// A decode row's `gbs` as a share of the copy ceiling of its path: the
    /// GPU's for GPU rows, the host's for CPU rows (NaN where there is none).
    pub(super) fn bandwidth_share(&self, path: KernelPath, gbs: f64) -> f64 {
        let bandwidth = self.ceilings.bandwidth;
        match path {
            KernelPath::Fused | KernelPath::Unfused if bandwidth.is_finite() => gbs / bandwidth,
            KernelPath::Cpu => self
                .rows
                .host_copy
                .as_ref()
                .map_or(f64::NAN, |c| gbs / c.gbs),
            _ => f64::NAN,
        }
    }

    /// The copy ceiling a token row's share is of: its own engine's memory,
    /// the GPU's copy ceiling or the host's.
    pub(super) fn token_ceiling(&self, label: &str) -> f64 {
        match label {
            "cpu" => self.rows.host_copy.as_ref().map_or(f64::NAN, |c| c.gbs),
            _ => self.ceilings.bandwidth,
        }
    }

    /// The run as JSON: the setting and ceilings, then every row.
    pub(super) fn json(&self) -> Value {
        let Setting {
            engine,
            ctx,
            args,
            layer,
            ..
        } = *self.setting;
        let Measured {
            gemm,
            attention,
            decode,
            decode_skipped,
            token_steps,
            token_skipped,
            host_copy,
            overhead,
            backward,
            paged,
            paged_skipped,
            guarded,
            ..
        } = self.rows;
        let Ceilings {
            first,
            last,
            copy_first,
            copy_last,
            fma: ceiling,
            bandwidth,
        } = self.ceilings;
        let (ceiling, bandwidth) = (*ceiling, *bandwidth);
        let caps = ctx.map(|c| c.capabilities());
        json!({
            "adapter": caps.map(|c| &c.adapter).map(|a| json!({"name": a.name, "backend": a.backend, "device_type": a.device_type, "driver": a.driver, "driver_info": a.driver_info})),
            "cpu_backend": self.cpu,
            "clock": self.ceilings.clock(),
            "quick": args.quick,
            "tokens": args.tokens,
            "width": args.width,
            "fma_ceiling_gflops": finite(ceiling),
            "fma_ceiling_start_gflops": first.as_ref().map(|m| m.gflops(bench::fma_ceiling_flops())),
            "fma_ceiling_end_gflops": last.as_ref().map(|m| m.gflops(bench::fma_ceiling_flops())),
            "bandwidth_ceiling_gbs": finite(bandwidth),
            "bandwidth_ceiling_start_gbs": copy_first.as_ref().map(|b| b.gbs),
            "bandwidth_ceiling_end_gbs": copy_last.as_ref().map(|b| b.gbs),
            "bandwidth_copy_bytes": copy_first.as_ref().map(|b| b.bytes_moved / 2),
            "gemm_kernel": ctx.map(|_| format!("{:?}", gemm_at(engine, Precision::Highest))),
            "fused_kernel": ctx.map(|_| crate::info::fused_kernel(engine).0),
            "fused_kernel_forced": ctx.map(|_| crate::info::fused_kernel(engine).1),
            "runtime_checks": ctx.map(|c| c.runtime_checks().name()),
            "clock_guard": ctx.map(|c| c.clock_guard_on()),
            "retaken_runs": guarded.retaken,
            "throttled_runs": guarded.throttled,
            "matrix_units": ctx.and_then(|c| webattn::kernels::matrix_units::coop_shape(c.capabilities())).map(|s| format!("{n}x{n}x{n} f16 -> f32, subgroups of {}", s.subgroup, n = s.size.dim())),
            "gemm": gemm.iter().map(|(n, p, kernel, g, m, near)| json!({"m": n, "n": n, "k": n, "precision": p.name(), "kernel": format!("{kernel:?}"), "kernel_name": kernel.label(), "default_kernel": ctx.is_some() && gemm_at(engine, *p) == *kernel, "ms": m.median_ms(), "min_ms": m.min_ms(), "samples_ms": m.samples_ms, "retaken": m.retaken, "throttled": m.throttled, "gflops": g, "share_of_ceiling": g / near, "adjacent_ceiling_gflops": near})).collect::<Vec<_>>(),
            "attention": attention.iter().map(|(s, p, q, m, near)| json!({
                "path": p.name(), "precision": q.name(), "batch": s.batch, "heads": s.heads, "seq_q": s.seq_q, "seq_k": s.seq_k,
                "head_dim": s.head_dim, "causal": s.causal, "ms": m.measurement.median_ms(),
                "samples_ms": m.measurement.samples_ms, "min_ms": m.measurement.min_ms(),
                "retaken": m.measurement.retaken, "throttled": m.measurement.throttled, "gflops": m.gflops,
                "share_of_ceiling": finite(m.gflops / near), "adjacent_ceiling_gflops": finite(*near), "peak_bytes": m.peak_bytes,
                "plan": (!m.plan.is_empty()).then_some(&m.plan),
            })).collect::<Vec<_>>(),
            "decode": decode.iter().map(|(s, p, d, k, m)| json!({
                "path": p.name(), "kernel": k.map(|k| k.label()), "batch": s.batch, "seq_k": s.seq_k, "head_dim": s.head_dim,
                "heads": s.heads, "kv_heads": s.kv_heads, "dtype": d.to_string(),
                "ms": m.measurement.median_ms(), "min_ms": m.measurement.min_ms(),
                "samples_ms": m.measurement.samples_ms, "retaken": m.measurement.retaken,
                "throttled": m.measurement.throttled, "gflops": m.gflops, "peak_bytes": m.peak_bytes,
                "kv_bytes": s.kv_bytes_as(*d), "kv_gbs": kv_gbs(s, *d, m),
                "share_of_bandwidth": finite(self.bandwidth_share(*p, kv_gbs(s, *d, m))),
                "cold_cache": bench::can_flush_caches(engine) && *p != KernelPath::Cpu,
            })).collect::<Vec<_>>(),
            "host_copy_gbs": host_copy.as_ref().map(|c| c.gbs),
            "token_step": token_steps.iter().map(|(label, layers, cached, storage, m, append)| json!({
                "engine": label, "layers": layers, "d_model": layer.d_model(), "heads": layer.heads, "kv_heads": layer.kv_heads,
                "head_dim": layer.head_dim, "cached": cached, "weights": format!("{storage:?}").to_lowercase(),
                "ms": m.measurement.median_ms(), "samples_ms": m.measurement.samples_ms,
                "dispatches": m.counts.dispatches, "copies": m.counts.copies, "buffers_created": m.counts.buffers,
                "submissions": m.counts.submissions, "queue_writes": m.counts.writes, "weight_bytes": m.weight_bytes, "kv_bytes": m.kv_bytes,
                "gbs": m.gbs(), "share_of_bandwidth": finite(m.gbs() / self.token_ceiling(label)),
                "append_ms": append.as_ref().map(|a| a.median_ms()),
                "append_samples_ms": append.as_ref().map(|a| &a.samples_ms),
            })).collect::<Vec<_>>(),
            "call_overhead": overhead.as_ref().map(|o| json!({
                "shape": [1, 1, 16, 16], "attention_ms": o.plain.median_ms(), "prepared_ms": o.prepared.median_ms(),
                "recorded_ms": o.recorded.as_ref().map(|m| m.median_ms()),
                "record_only_ms": o.record_only.as_ref().map(|m| m.median_ms()),
                "empty_submit_ms": o.empty_submit.as_ref().map(|m| m.median_ms()),
                "attention_samples_ms": o.plain.samples_ms, "prepared_samples_ms": o.prepared.samples_ms,
                "recorded_samples_ms": o.recorded.as_ref().map(|m| &m.samples_ms),
                "record_only_samples_ms": o.record_only.as_ref().map(|m| &m.samples_ms),
                "empty_submit_samples_ms": o.empty_submit.as_ref().map(|m| &m.samples_ms),
            })),
            "backward": backward.iter().map(|(s, p, m, near)| json!({
                "path": p.name(), "batch": s.batch, "heads": s.heads, "seq": s.seq_q, "head_dim": s.head_dim,
                "causal": s.causal, "forward_ms": m.forward.median_ms(), "backward_ms": m.backward.median_ms(),
                "forward_samples_ms": m.forward.samples_ms, "backward_samples_ms": m.backward.samples_ms,
                "backward_flops": s.backward_flops(), "gflops": m.backward.gflops(s.backward_flops()),
                "share_of_ceiling": finite(m.backward.gflops(s.backward_flops()) / near),
                "adjacent_ceiling_gflops": finite(*near), "workspace_bytes": m.workspace_bytes,
            })).collect::<Vec<_>>(),
            "paged_decode": paged.iter().map(|(s, st, p, m)| json!({
                "path": p.name(), "heads": s.heads, "kv_heads": s.kv_heads, "head_dim": s.head_dim,
                "cached": s.cached, "page_size": s.page_size, "storage": st.name(),
                "ms": m.measurement.median_ms(), "samples_ms": m.measurement.samples_ms,
                "bytes_per_token": m.bytes_per_token, "pool_bytes": m.pool_bytes,
                "gbs": m.gbs(s.cached), "share_of_copy_ceiling": finite(self.bandwidth_share(*p, m.gbs(s.cached))),
            })).collect::<Vec<_>>(),
            "paged_skipped": paged_skipped.iter().map(|(s, p, why)| json!({
                "cached": s.cached, "path": p.name(), "reason": why,
            })).collect::<Vec<_>>(),
            "decode_skipped": decode_skipped.iter().map(|(s, p, d, label, why)| json!({
                "path": p.name(), "kernel": label, "batch": s.batch, "heads": s.heads, "kv_heads": s.kv_heads, "seq_k": s.seq_k,
                "head_dim": s.head_dim, "dtype": d.to_string(), "reason": why,
            })).collect::<Vec<_>>(),
            "token_step_skipped": token_skipped.iter().map(|(cached, why)| json!({
                "cached": cached, "reason": why,
            })).collect::<Vec<_>>(),
        })
    }
}
