//! The bench's table on stdout: the adapter and ceilings, then one section
//! per kind of row that ran.

use webattn::measure as bench;
use webattn::{KernelPath, Precision};

use super::report::{kv_gbs, Report};
use super::{gemm_at, heads_label, precision_name, precisions, STACK_LAYERS};

/// `text`, or "-" where `x` is not finite: GPU ceilings and shares on the CPU
/// rows.
fn or_dash(x: f64, text: String) -> String {
    if x.is_finite() {
        text
    } else {
        "-".to_string()
    }
}

impl Report<'_> {
    /// Prints the whole table.
    pub(super) fn print_table(&self) {
        self.print_setting();
        self.print_ceilings();
        self.print_gemm();
        self.print_attention();
        self.print_decode();
        self.print_tokens();
        self.print_overhead();
        self.print_backward();
        self.print_paged();
    }

    /// The paged decoding rows: each storage's step, its bytes per token and
    /// its share of the copy ceiling of the memory its pages are in.
    fn print_paged(&self) {
        let rows = &self.rows.paged;
        if rows.is_empty() && self.rows.paged_skipped.is_empty() {
            return;
        }
        println!("\npaged decode (one sequence, one query row per head, 16-token pages)");
        println!(
            "{:<6} {:>6} {:>5} {:>7} {:>8} {:>9} {:>10} {:>8} {:>7} {:>9}",
            "path", "heads", "d", "cached", "storage", "ms", "B/token", "GB/s", "share", "vs f32"
        );
        for (shape, storage, path, m) in rows {
            let gbs = m.gbs(shape.cached);
            let f32_ms = rows
                .iter()
                .find(|(s, st, p, _)| s == shape && *st == webattn::PageStorage::F32 && p == path)
                .map(|(_, _, _, f)| f.measurement.median_ms());
            let share = self.bandwidth_share(*path, gbs);
            println!(
                "{:<6} {:>6} {:>5} {:>7} {:>8} {:>9.3} {:>10} {:>8.1} {:>7} {:>9}",
                path.name(),
                format!("{}/{}", shape.heads, shape.kv_heads),
                shape.head_dim,
                shape.cached,
                storage.name(),
                m.measurement.median_ms(),
                m.bytes_per_token,
                gbs,
                or_dash(share, format!("{:.0}%", 100.0 * share)),
                f32_ms.map_or("-".into(), |f| format!(
                    "{:.2}x",
                    f / m.measurement.median_ms()
                )),
            );
        }
        for (shape, path, why) in &self.rows.paged_skipped {
            println!("  skipped: {path}, {} tokens: {why}", shape.cached);
        }
        println!(
            "  share: of the copy ceiling of the pages' memory (the GPU's for fused rows, the \
             host's for cpu rows); vs f32: f32 pages' time over this row's"
        );
    }

    /// The backward rows: each beside its forward, with the workspace that
    /// shows the memory growing linearly with the sequence.
    fn print_backward(&self) {
        let rows = &self.rows.backward;
        if rows.is_empty() {
            return;
        }
        println!("\nbackward (FlashAttention-2's: dQ, dK, dV from Y, lse and dY; d 64)");
        println!(
            "{:<6} {:>5} {:>5} {:>6} {:>11} {:>12} {:>7} {:>9} {:>9} {:>7} {:>13}",
            "path",
            "heads",
            "seq",
            "causal",
            "forward ms",
            "backward ms",
            "ratio",
            "GFLOP/s",
            "ceiling*",
            "share",
            "workspace KiB"
        );
        for (shape, path, m, near) in rows {
            let gflops = m.backward.gflops(shape.backward_flops());
            println!(
                "{:<6} {:>5} {:>5} {:>5} {:>6} {:>11.2} {:>12.2} {:>7.2} {:>9.1} {:>9} {:>7} {:>13}",
                path.name(),
                shape.batch,
                shape.heads,
                shape.seq_q,
                if shape.causal { "yes" } else { "no" },
                m.forward.median_ms(),
                m.backward.median_ms(),
                m.backward.median_ms() / m.forward.median_ms(),
                gflops,
                or_dash(*near, format!("{near:.1}")),
                or_dash(*near, format!("{:.0}%", 100.0 * gflops / near)),
                m.workspace_bytes / 1024
            );
        }
        println!("  GFLOP/s count the backward's five products (2.5 times the forward's flops)");
    }

    /// The adapter, the timing, the CPU backend, and the kernels calls take.
    fn print_setting(&self) {
        let (engine, ctx) = (self.setting.engine, self.setting.ctx);
        let clock = self.ceilings.clock();
        match ctx.map(|c| &c.capabilities().adapter) {
            Some(a) => println!(
                "adapter: {} ({}, {})   timing: {clock}, median of runs after warm-up{}",
                a.name,
                a.backend,
                a.device_type,
                match ctx.map(|c| c.runtime_checks()) {
                    Some(webattn::RuntimeChecks::Off) => "   kernels without runtime checks",
                    Some(webattn::RuntimeChecks::Bounds) => "   kernels without loop counters",
                    _ => "",
                }
            ),
            None => println!(
                "adapter: none (CPU engine)   timing: wall clock, median of runs after warm-up"
            ),
        }
        println!(
            "CPU backend: {}; the f64 oracle timed once (one run) for reference",
            self.cpu
        );
        if ctx.is_some() {
            let (fused, forced) = crate::info::fused_kernel(engine);
            // The f16 rows' kernel where the adapter has matrix units.
            let fast = match engine
                .planner(64, 64)
                .map(|p| p.fused_kernel_at(Precision::Fast))
            {
                Some(Ok(kernel)) if kernel.name() != fused => {
                    format!(", at precision fast {}", kernel.name())
                }
                _ => String::new(),
            };
            println!(
                "fused kernel: {fused}{}{fast}; GEMM: {:?}",
                if forced { " (forced by --kernel)" } else { "" },
                gemm_at(engine, Precision::Highest)
            );
        }
    }

    /// The FMA ceiling, the clock guard's tally, and the copy ceiling.
    fn print_ceilings(&self) {
        let ceiling = self.ceilings.fma;
        let bandwidth = self.ceilings.bandwidth;
        let guarded = &self.rows.guarded;
        if let Some((first, last)) = self.ceilings.ends() {
            println!(
                "FMA ceiling: {ceiling:.1} GFLOP/s, median of the run's start and end (start {:.1}, end {:.1})",
                first.gflops(bench::fma_ceiling_flops()),
                last.gflops(bench::fma_ceiling_flops())
            );
        }
        if let Some(ctx) = self.setting.ctx {
            println!(
                "clock guard: {}",
                match (ctx.clock_guard_on(), guarded.retaken, guarded.throttled) {
                    (false, ..) if !ctx.capabilities().timestamp_query => {
                        "off (the adapter has no timestamp queries to time a probe)".to_string()
                    }
                    (false, ..) => "off (--clock-guard on to probe the clocks around each run)".to_string(),
                    (true, 0, 0) => "on; every timed run had a fast clock probe on either side".to_string(),
                    (true, r, 0) => format!("on; {r} run(s) retaken beside a slow clock probe"),
                    (true, r, t) => format!(
                        "on; {r} run(s) retaken beside a slow clock probe, {t} kept with the clocks down (rows marked in the log)"
                    ),
                }
            );
        }
        if let Some((first, last)) = self.ceilings.copy_ends() {
            if first.bytes_moved / 2 < 64 << 20 {
                println!(
                    "note: the copy is only {} MiB (the binding limit): caches may hold it, so the \
                     bandwidth ceiling may be a cache's",
                    (first.bytes_moved / 2) >> 20
                );
            }
            println!(
                "bandwidth ceiling: {bandwidth:.1} GB/s, a {} MiB vec4 copy (read + write), median of the run's start and end (start {:.1}, end {:.1})",
                (first.bytes_moved / 2) >> 20,
                first.gbs,
                last.gbs
            );
        }
    }

    /// The GEMM rows, one section per precision (GPU engines).
    fn print_gemm(&self) {
        let (engine, matrix_units) = (self.setting.engine, self.setting.matrix_units);
        let gemm = &self.rows.gemm;
        if self.setting.ctx.is_none() {
            return;
        }
        for &precision in precisions(matrix_units) {
            if !gemm.iter().any(|row| row.1 == precision) {
                continue;
            }
            println!(
                "\nGEMM ({}; calls take {})",
                match precision {
                    Precision::Highest => "f32",
                    Precision::Fast => "f16 products, f32 sums, on the matrix units",
                },
                gemm_at(engine, precision).label()
            );
            println!(
                "{:>6} {:<24} {:>10} {:>10} {:>9} {:>8}",
                "n", "kernel", "ms", "GFLOP/s", "ceiling*", "share"
            );
            for (n, p, kernel, g, m, near) in gemm {
                if *p == precision {
                    println!(
                        "{n:>6} {:<24} {:>10.2} {g:>10.1} {near:>9.1} {:>7.0}%",
                        kernel.label(),
                        m.median_ms(),
                        100.0 * g / near
                    );
                }
            }
        }
        if matrix_units && !gemm.is_empty() {
            println!("(the share of the matrix-unit rows is of the f32 FMA ceiling: above 100% is what matrix units are for)");
        }
    }

    /// The attention rows, each beside the unfused row of its shape.
    fn print_attention(&self) {
        let attention = &self.rows.attention;
        if attention.is_empty() {
            return;
        }
        println!("\nattention (B x H = tokens / seq x width / head dim)");
        println!(
            "{:<8} {:>4} {:>5} {:>4} {:>5} {:>4} {:>6} {:>10} {:>9} {:>9} {:>7} {:>10} {:>10}",
            "path",
            "prec",
            "batch",
            "head",
            "seq",
            "d",
            "causal",
            "ms",
            "GFLOP/s",
            "ceiling*",
            "share",
            "peak MiB",
            "vs unfused"
        );
        for (shape, path, precision, m, near) in attention {
            let unfused = attention
                .iter()
                .find(|(s, p, q, _, _)| s == shape && *p == KernelPath::Unfused && q == precision)
                .map(|(_, _, _, u, _)| u.measurement.median_ms());
            let speedup = unfused
                .map(|u| format!("{:.2}x", u / m.measurement.median_ms()))
                .unwrap_or_default();
            println!(
                "{:<8} {:>4} {:>5} {:>4} {:>5} {:>4} {:>6} {:>10.1} {:>9.1} {:>9} {:>7} {:>10.1} {:>10}",
                path.name(),
                precision_name(*precision),
                shape.batch,
                shape.heads,
                shape.seq_q,
                shape.head_dim,
                if shape.causal { "yes" } else { "no" },
                m.measurement.median_ms(),
                m.gflops,
                or_dash(*near, format!("{near:.1}")),
                or_dash(*near, format!("{:.0}%", 100.0 * m.gflops / near)),
                m.peak_bytes as f64 / f64::from(1 << 20),
                speedup
            );
        }
        println!(
            "* ceiling: the f32 FMA ceiling measured just before the row, the GPU's (the host's for cpu and oracle rows, in the CPU backend's instruction set on its threads; the machine's speed may drift)"
        );
        if self.setting.matrix_units {
            println!("  prec f16: Precision::Fast, f16 products on the matrix units, f32 sums; vs unfused compares within a precision");
        }
    }

    /// The decode rows and those skipped. Decode is bound by reading K and V:
    /// GB/s of K + V, and the share of the copy's bandwidth (GPU rows only).
    fn print_decode(&self) {
        let (decode, decode_skipped) = (&self.rows.decode, &self.rows.decode_skipped);
        if !decode.is_empty() || !decode_skipped.is_empty() {
            println!(
                "\ndecode (Nq = 1, d = 128; K and V stored as the dtype; H: query heads, /KV heads where grouped)"
            );
            println!(
                "{:<8} {:<35} {:>9} {:>7} {:>8} {:>10} {:>9} {:>10} {:>9} {:>11}",
                "path",
                "kernel",
                "B x H",
                "dtype",
                "keys",
                "ms",
                "GFLOP/s",
                "K+V GB/s",
                "share**",
                "peak MiB"
            );
            for (shape, path, dtype, kernel, m) in decode {
                let gbs = kv_gbs(shape, *dtype, m);
                let share = self.bandwidth_share(*path, gbs);
                println!(
                    "{:<8} {:<35} {:>9} {:>7} {:>8} {:>10.2} {:>9.2} {:>10.1} {:>9} {:>11.2}",
                    path.name(),
                    kernel.map_or_else(|| "-".to_string(), |k| k.label()),
                    format!("{}x{}", shape.batch, heads_label(shape)),
                    dtype.to_string(),
                    shape.seq_k,
                    m.measurement.median_ms(),
                    m.gflops,
                    gbs,
                    or_dash(share, format!("{:.0}%", 100.0 * share)),
                    m.peak_bytes as f64 / f64::from(1 << 20)
                );
            }
            for (shape, path, dtype, label, why) in decode_skipped {
                println!(
                    "{:<8} {:<35} {:>9} {:>7} {:>8} skipped: {why}",
                    path.name(),
                    label,
                    format!("{}x{}", shape.batch, heads_label(shape)),
                    dtype.to_string(),
                    shape.seq_k,
                );
            }
        }
        if !decode.is_empty() {
            println!("** share: K + V bytes read per second, over the copy ceiling measured in this run (the GPU's for GPU rows, the host's for cpu rows)");
            if bench::can_flush_caches(self.setting.engine) {
                let copied = self
                    .ceilings
                    .copy_first
                    .as_ref()
                    .map_or(bench::COPY_BYTES, |b| b.bytes_moved / 2);
                println!("   each GPU run follows a {} MiB copy, so K and V are read from memory, not from the cache", copied >> 20);
            }
        }
    }

    /// The token steps and stacks, their cache appends, and those skipped.
    fn print_tokens(&self) {
        let (token_steps, token_skipped) = (&self.rows.token_steps, &self.rows.token_skipped);
        let layer = self.setting.layer;
        if token_steps.is_empty() && token_skipped.is_empty() {
            return;
        }
        println!(
            "\ntoken step: one decoder layer (d_model {}, {} heads / {} KV heads of {}, RoPE), \
             projections + cache append + attention + output projection, per token (wall clock)",
            layer.d_model(),
            layer.heads,
            layer.kv_heads,
            layer.head_dim
        );
        println!(
            "{:>6} {:>6} {:>8} {:>7} {:>10} {:>9} {:>6} {:>6} {:>6} {:>6} {:>9} {:>8} {:>8} {:>10}",
            "engine",
            "layers",
            "cached",
            "weights",
            "ms/token",
            "tokens/s",
            "disp",
            "copies",
            "bufs",
            "subm",
            "MB/token",
            "GB/s",
            "of copy",
            "append ms"
        );
        for (label, layers, cached, storage, m, append) in token_steps {
            let ms = m.measurement.median_ms();
            let share = m.gbs() / self.token_ceiling(label);
            println!(
                "{label:>6} {layers:>6} {cached:>8} {:>7} {ms:>10.3} {:>9.1} {:>6} {:>6} {:>6} {:>6} {:>9.2} {:>8.1} {:>8} {:>10}",
                format!("{storage:?}").to_lowercase(),
                1e3 / ms,
                m.counts.dispatches,
                m.counts.copies,
                m.counts.buffers,
                m.counts.submissions,
                (m.weight_bytes + m.kv_bytes) as f64 / 1e6,
                m.gbs(),
                if share.is_finite() { format!("{:.1}%", 100.0 * share) } else { "-".into() },
                append.as_ref().map_or("-".into(), |a| format!("{:.3}", a.median_ms()))
            );
        }
        println!("layers: one layer, or a stack of {STACK_LAYERS} whose hidden state stays on the device (the token written into its input tensor, every layer's step in one submission, one readback; its counts, MB and share are the whole stack's)");
        println!("disp/copies/bufs/subm: dispatches, buffer-to-buffer copies, buffers created and submissions of the last timed token; MB/token: weights (as stored) + the cached K and V the step reads; of copy: share of the copy ceiling measured in this run (the GPU's for gpu rows, the host's for cpu rows)");
        if let Some(copy) = &self.rows.host_copy {
            println!(
                "host copy ceiling: {:.1} GB/s, a {} MiB copy (read + write) on {} threads",
                copy.gbs,
                copy.bytes_moved >> 21,
                self.rows
                    .cpu_engine
                    .as_ref()
                    .unwrap_or(self.setting.engine)
                    .cpu_backend()
                    .threads()
            );
        }
        println!("cache append: one token's keys and values copied into the preallocated cache, until the device is done (wall clock)");
        for (cached, why) in token_skipped {
            println!("{cached:>8} skipped: {why}");
        }
    }

    /// The per-call host overhead of each kind of call.
    fn print_overhead(&self) {
        let Some(o) = &self.rows.overhead else {
            return;
        };
        println!(
            "\nper-call host overhead at B1 H1 N16 d16 (host time to issue a call, inputs on \
             the device, no readback; median of {} samples of 20 calls, the kinds taking turns)",
            o.plain.samples_ms.len()
        );
        println!("{:<50} {:>9} {:>21}", "call", "ms", "of Engine::attention");
        let rows = [
            ("Engine::attention", Some(&o.plain)),
            (
                "PreparedAttention::run (one submission a call)",
                Some(&o.prepared),
            ),
            (
                "record, 20 calls into one encoder, submitted once",
                o.recorded.as_ref(),
            ),
            ("record alone (the caller submits)", o.record_only.as_ref()),
            (
                "an empty submission (the adapter's floor)",
                o.empty_submit.as_ref(),
            ),
        ];
        for (name, m) in rows {
            if let Some(m) = m {
                let ms = m.median_ms();
                let share = 100.0 * ms / o.plain.median_ms();
                println!("{name:<50} {ms:>9.4} {share:>20.0}%");
            }
        }
    }
}
