//! The bench's measurements, one kind of row at a time: GEMM, attention,
//! decode, the token steps and stacks, and the per-call overhead. Each row's
//! figures are said as soon as it is measured.

use anyhow::Context;
use webattn::kernels::decode::DecodeKernel;
use webattn::kernels::gemm::GemmKernel;
use webattn::measure as bench;
use webattn::measure::AttentionShape;
use webattn::{DType, KernelPath, Precision};

use super::ceilings::{adjacent, CEILING_REPEATS};
use super::{
    gemm_alternatives, gemm_at, guard_note, heads_label, precision_name, repeats, GuardTally, Job,
    Setting, STACK_LAYERS,
};

/// A GEMM row: n (m = n = k), the precision, the kernel, GFLOP/s, the
/// timings, and the FMA ceiling measured just before it.
pub(super) type GemmRow = (usize, Precision, GemmKernel, f64, bench::Measurement, f64);

/// An attention row: the shape, the path, the precision, the measurement,
/// and the FMA ceiling measured just before it.
pub(super) type AttentionRow = (
    AttentionShape,
    KernelPath,
    Precision,
    bench::AttentionMeasurement,
    f64,
);

/// A decode row: the shape, the path, K and V's storage type, the decode
/// kernel (GPU rows), and the measurement.
pub(super) type DecodeRow = (
    AttentionShape,
    KernelPath,
    DType,
    Option<DecodeKernel>,
    bench::AttentionMeasurement,
);

/// A decode row past the device's limits: the shape, the path, K and V's
/// storage type, the kernel's label, and why it was skipped.
pub(super) type DecodeSkipped = (AttentionShape, KernelPath, DType, String, String);

/// A token row: the engine ("gpu" or "cpu"), the layers, the tokens cached,
/// the weights' storage, the step, and (one layer) the cache append's timings.
pub(super) type TokenRow = (
    &'static str,
    usize,
    usize,
    webattn::WeightStorage,
    bench::TokenStep,
    Option<bench::Measurement>,
);

/// A backward row: the shape, the path, the forward and backward timings,
/// and the FMA ceiling measured just before it.
pub(super) type BackwardRow = (AttentionShape, KernelPath, bench::BackwardMeasurement, f64);

/// A paged decoding row: the shape, the pages' storage, the path (`Fused`:
/// the engine's device pages; `Cpu`: host pages on the CPU backend), and
/// the measurement.
pub(super) type PagedRow = (
    bench::paged::PagedDecodeShape,
    webattn::PageStorage,
    KernelPath,
    bench::paged::PagedDecode,
);

/// Every row a run measured, and what the rows were measured with.
pub(super) struct Measured {
    pub(super) gemm: Vec<GemmRow>,
    pub(super) attention: Vec<AttentionRow>,
    pub(super) decode: Vec<DecodeRow>,
    pub(super) decode_skipped: Vec<DecodeSkipped>,
    pub(super) token_steps: Vec<TokenRow>,
    /// Token rows past the device's limits: the tokens cached, and why.
    pub(super) token_skipped: Vec<(usize, String)>,
    /// The CPU engine of the CPU token rows, and the host's copy ceiling they
    /// are shared against (measured before the first of them).
    pub(super) cpu_engine: Option<webattn::Engine>,
    pub(super) host_copy: Option<bench::Bandwidth>,
    pub(super) overhead: Option<bench::CallOverhead>,
    pub(super) backward: Vec<BackwardRow>,
    pub(super) paged: Vec<PagedRow>,
    /// Paged rows past the device's limits: the shape, the path, and why.
    pub(super) paged_skipped: Vec<(bench::paged::PagedDecodeShape, KernelPath, String)>,
    /// Every measurement's retakes, the ceilings' too.
    pub(super) guarded: GuardTally,
    /// One stack of layers per weight storage, kept for every cache length.
    stacks: Vec<(
        webattn::WeightStorage,
        Vec<webattn::family::mha::MultiHeadAttention>,
    )>,
}

/// Measures `jobs` in turn, `guarded` holding the start's ceilings' retakes.
pub(super) fn measure(
    setting: &Setting,
    jobs: &[Job],
    guarded: GuardTally,
) -> anyhow::Result<Measured> {
    let mut rows = Measured {
        gemm: Vec::new(),
        attention: Vec::new(),
        decode: Vec::new(),
        decode_skipped: Vec::new(),
        token_steps: Vec::new(),
        token_skipped: Vec::new(),
        cpu_engine: None,
        host_copy: None,
        overhead: None,
        backward: Vec::new(),
        paged: Vec::new(),
        paged_skipped: Vec::new(),
        guarded,
        stacks: Vec::new(),
    };
    for job in jobs {
        match *job {
            Job::Gemm(n, precision) => rows.gemm(setting, n, precision)?,
            Job::Attention(shape, path, precision) => {
                rows.attention(setting, shape, path, precision)?
            }
            Job::Decode(shape, path, dtype) => rows.decode(setting, shape, path, dtype)?,
            Job::TokenStep(cached, storage) => rows.token_step(setting, cached, Some(storage))?,
            Job::CpuTokenStep(cached) => rows.token_step(setting, cached, None)?,
            Job::TokenStack(cached, storage) => rows.token_stack(setting, cached, storage)?,
            Job::Overhead => rows.overhead(setting)?,
            Job::Backward(shape, path) => rows.backward(setting, shape, path)?,
            Job::Paged(shape, path) => rows.paged(setting, shape, path)?,
        }
    }
    Ok(rows)
}

/// Measures the host's copy ceiling into `host_copy` unless it holds it:
/// the CPU rows' shares are of it.
fn host_copy_once(host_copy: &mut Option<bench::Bandwidth>, setting: &Setting, threads: usize) {
    if host_copy.is_none() {
        setting.progress.note("host copy ceiling".into());
        *host_copy = Some(bench::host_bandwidth_ceiling(threads, CEILING_REPEATS));
    }
}

/// Whether an error is a device's limit (a buffer past its size, memory
/// running out): the row is skipped, not the run lost.
fn past_limits(e: &webattn::Error) -> bool {
    matches!(
        e,
        webattn::Error::Limit { .. } | webattn::Error::OutOfMemory(_)
    )
}

impl Measured {
    /// The n³ GEMM rows at `precision` (GPU engines only): the kernel calls
    /// take and, from 1024³ on, its other forms.
    fn gemm(&mut self, setting: &Setting, n: usize, precision: Precision) -> anyhow::Result<()> {
        let Some(ctx) = setting.ctx else {
            return Ok(());
        };
        setting
            .progress
            .note(format!("GEMM {n}^3 {}", precision_name(precision)));
        let r = repeats(KernelPath::Fused, setting.args.quick);
        let near = adjacent(setting, KernelPath::Fused, &mut self.guarded)?;
        let kernel = gemm_at(setting.engine, precision);
        // From 1024³ on, the matrix-unit GEMM's other forms beside
        // the one calls take: the packed kernel's other tiles and
        // the staged kernel.
        let mut kernels = vec![kernel];
        if n >= 1024 {
            kernels.extend(gemm_alternatives(ctx, kernel));
        }
        for kernel in kernels {
            let (gflops, m) = pollster::block_on(bench::gemm_with(ctx, kernel, n, n, n, r))?;
            setting.progress.said(format!(
                "  {}: {:.3} ms, {gflops:.0} GFLOP/s, {:.1}% of the FMA ceiling ({near:.0}){}",
                kernel.label(),
                m.median_ms(),
                100.0 * gflops / near,
                guard_note(&m)
            ));
            self.guarded.note(&m);
            self.gemm.push((n, precision, kernel, gflops, m, near));
        }
        Ok(())
    }

    /// The attention row of `shape` on `path` at `precision`.
    fn attention(
        &mut self,
        setting: &Setting,
        shape: AttentionShape,
        path: KernelPath,
        precision: Precision,
    ) -> anyhow::Result<()> {
        setting.progress.note(format!(
            "attention {path} seq {} d{}{} {}",
            shape.seq_q,
            shape.head_dim,
            if shape.causal { " causal" } else { "" },
            precision_name(precision)
        ));
        let near = adjacent(setting, path, &mut self.guarded)?;
        let run = bench::AttentionRun {
            path,
            precision,
            cold_cache: false,
            dtype: DType::F32,
        };
        let m = pollster::block_on(bench::attention_run(
            setting.engine,
            shape,
            run,
            repeats(path, setting.args.quick),
        ))
        .with_context(|| format!("attention on the {path} path ({precision})"))?;
        setting.progress.said(format!(
            "  {:.3} ms, {:.0} GFLOP/s, {:.1}% of the FMA ceiling ({near:.0}){}",
            m.measurement.median_ms(),
            m.gflops,
            100.0 * m.gflops / near,
            guard_note(&m.measurement)
        ));
        self.guarded.note(&m.measurement);
        self.attention.push((shape, path, precision, m, near));
        Ok(())
    }

    /// The decode rows of `shape` on `path` with K and V as `dtype`: the
    /// kernel the engine runs, and the staged one beside the streaming one.
    fn decode(
        &mut self,
        setting: &Setting,
        shape: AttentionShape,
        path: KernelPath,
        dtype: DType,
    ) -> anyhow::Result<()> {
        let engine = setting.engine;
        // CPU rows are shared against the host's copy ceiling.
        if path == KernelPath::Cpu {
            host_copy_once(&mut self.host_copy, setting, engine.cpu_backend().threads());
        }
        for (kernel, pinned) in decode_runs(engine, shape, path) {
            let label = kernel.map_or_else(|| path.name().to_string(), |k| k.label());
            setting.progress.note(format!(
                "decode {path} B{} H{} {} keys {dtype} ({label})",
                shape.batch,
                heads_label(&shape),
                shape.seq_k
            ));
            // K and V come from memory, not from the cache the previous
            // run left them in (GPUs with timestamps; see BENCHMARKS.md).
            let m = match pollster::block_on(bench::attention_as(
                pinned.as_ref().unwrap_or(engine),
                shape,
                path,
                repeats(path, setting.args.quick),
                true,
                dtype,
            )) {
                Ok(m) => m,
                // K and V beyond this device's limits (a buffer past
                // max_buffer_size at 64k keys of 8 x 32 heads) are a
                // skipped row, not a lost run.
                Err(e) if past_limits(&e) => {
                    setting.progress.said(format!("  skipped: {e}"));
                    self.decode_skipped
                        .push((shape, path, dtype, label, e.to_string()));
                    continue;
                }
                Err(e) => {
                    return Err(anyhow::Error::from(e)
                        .context(format!("decode on the {path} path ({dtype}, {label})")))
                }
            };
            let ms = m.measurement.median_ms();
            setting.progress.said(format!(
                "  {ms:.3} ms, K and V at {:.0} GB/s{}",
                shape.kv_bytes_as(dtype) as f64 / (ms * 1e6),
                guard_note(&m.measurement)
            ));
            self.guarded.note(&m.measurement);
            self.decode.push((shape, path, dtype, kernel, m));
        }
        Ok(())
    }

    /// One decoder layer's token step with `cached` tokens cached, and its
    /// cache append: on the run's engine with the weights as `storage`, or
    /// (`None`) on a CPU engine with f32 weights.
    fn token_step(
        &mut self,
        setting: &Setting,
        cached: usize,
        storage: Option<webattn::WeightStorage>,
    ) -> anyhow::Result<()> {
        let (on, storage) = match storage {
            Some(storage) => (setting.engine, storage),
            None => (
                &*self.cpu_engine.get_or_insert_with(webattn::Engine::cpu),
                webattn::WeightStorage::F32,
            ),
        };
        let label = match on.backend() {
            webattn::BackendKind::Gpu => "gpu",
            webattn::BackendKind::Cpu => "cpu",
        };
        if label == "cpu" {
            host_copy_once(&mut self.host_copy, setting, on.cpu_backend().threads());
        }
        setting.progress.note(format!(
            "token step, {cached} tokens cached, {storage:?} weights, {label} engine"
        ));
        let layer = setting.layer;
        let r = repeats(KernelPath::Fused, setting.args.quick);
        let step =
            pollster::block_on(bench::token_step(on, layer, cached, storage, r)).and_then(|m| {
                let append = pollster::block_on(bench::kv_append(on, layer, cached, r))?;
                Ok((m, append))
            });
        match step {
            Ok((m, append)) => {
                setting.progress.said(format!(
                    "  token step {:.3} ms ({} dispatches, {} buffers), append {:.3} ms",
                    m.measurement.median_ms(),
                    m.counts.dispatches,
                    m.counts.buffers,
                    append.median_ms()
                ));
                self.token_steps
                    .push((label, 1, cached, storage, m, Some(append)))
            }
            // A cache beyond this device's limits (e.g. under
            // --limits webgpu-default) is a skipped row, not a lost run.
            Err(e) if past_limits(&e) => self.token_skipped.push((cached, e.to_string())),
            Err(e) => {
                return Err(anyhow::Error::from(e)
                    .context(format!("a token step with {cached} tokens cached")))
            }
        }
        Ok(())
    }

    /// A token through a stack of [`STACK_LAYERS`] layers whose hidden state
    /// stays on the device, `cached` tokens cached, the weights as `storage`.
    fn token_stack(
        &mut self,
        setting: &Setting,
        cached: usize,
        storage: webattn::WeightStorage,
    ) -> anyhow::Result<()> {
        setting.progress.note(format!(
            "stack of {STACK_LAYERS} layers, {cached} tokens cached, {storage:?} weights"
        ));
        // One stack per weight storage, kept for every cache length.
        let stack = match self.stacks.iter().position(|(s, _)| *s == storage) {
            Some(i) => &self.stacks[i].1,
            None => {
                let stack = bench::decoder_stack(setting.layer, STACK_LAYERS, storage)?;
                self.stacks.push((storage, stack));
                &self.stacks.last().expect("just pushed").1
            }
        };
        match pollster::block_on(bench::token_stack(
            setting.engine,
            stack,
            setting.layer,
            cached,
            repeats(KernelPath::Fused, setting.args.quick),
        )) {
            Ok(m) => {
                setting.progress.said(format!(
                    "  {:.3} ms a token ({} dispatches, {} buffers, {} submissions)",
                    m.measurement.median_ms(),
                    m.counts.dispatches,
                    m.counts.buffers,
                    m.counts.submissions
                ));
                self.token_steps
                    .push(("gpu", STACK_LAYERS, cached, storage, m, None));
            }
            Err(e) if past_limits(&e) => self
                .token_skipped
                .push((cached, format!("stack of {STACK_LAYERS}: {e}"))),
            Err(e) => {
                return Err(anyhow::Error::from(e).context(format!(
                    "a stack of {STACK_LAYERS} layers with {cached} tokens cached"
                )))
            }
        }
        Ok(())
    }

    /// The forward and the backward of `shape` on `path`, interleaved.
    fn backward(
        &mut self,
        setting: &Setting,
        shape: AttentionShape,
        path: KernelPath,
    ) -> anyhow::Result<()> {
        setting.progress.note(format!(
            "backward {path} seq {} d{}{}",
            shape.seq_q,
            shape.head_dim,
            if shape.causal { " causal" } else { "" }
        ));
        let near = adjacent(setting, path, &mut self.guarded)?;
        let m = pollster::block_on(bench::backward(
            setting.engine,
            shape,
            path,
            repeats(path, setting.args.quick),
        ))
        .with_context(|| format!("the backward on the {path} path"))?;
        let gflops = m.backward.gflops(shape.backward_flops());
        setting.progress.said(format!(
            "  forward {:.3} ms, backward {:.3} ms ({:.2}x), {gflops:.0} GFLOP/s, {:.1}% of the FMA ceiling, {} KiB of workspace{}",
            m.forward.median_ms(),
            m.backward.median_ms(),
            m.backward.median_ms() / m.forward.median_ms(),
            100.0 * gflops / near,
            m.workspace_bytes / 1024,
            guard_note(&m.backward)
        ));
        self.guarded.note(&m.forward);
        self.guarded.note(&m.backward);
        self.backward.push((shape, path, m, near));
        Ok(())
    }

    /// Decoding steps from paged caches of f32, f16 and int8 pages,
    /// interleaved: on the run's engine (`Fused`) or the CPU engine (`Cpu`).
    fn paged(
        &mut self,
        setting: &Setting,
        shape: bench::paged::PagedDecodeShape,
        path: KernelPath,
    ) -> anyhow::Result<()> {
        use webattn::PageStorage;
        let on = match path {
            KernelPath::Cpu if setting.engine.gpu().is_some() => {
                &*self.cpu_engine.get_or_insert_with(webattn::Engine::cpu)
            }
            _ => setting.engine,
        };
        if path == KernelPath::Cpu {
            host_copy_once(&mut self.host_copy, setting, on.cpu_backend().threads());
        }
        setting.progress.note(format!(
            "paged decode {path} H{}/{} d{} {} tokens cached, f32, f16 and int8 pages",
            shape.heads, shape.kv_heads, shape.head_dim, shape.cached,
        ));
        let storages = [PageStorage::F32, PageStorage::F16, PageStorage::Int8];
        let measured = match pollster::block_on(bench::paged::paged_decode(
            on,
            shape,
            &storages,
            repeats(path, setting.args.quick),
        )) {
            Ok(m) => m,
            Err(e) if past_limits(&e) => {
                setting.progress.said(format!("  skipped: {e}"));
                self.paged_skipped.push((shape, path, e.to_string()));
                return Ok(());
            }
            Err(e) => return Err(anyhow::Error::from(e).context("paged decode")),
        };
        for (storage, m) in storages.into_iter().zip(measured) {
            setting.progress.said(format!(
                "  {}: {:.3} ms, {} bytes a token, {:.1} GB/s",
                storage.name(),
                m.measurement.median_ms(),
                m.bytes_per_token,
                m.gbs(shape.cached)
            ));
            self.paged.push((shape, storage, path, m));
        }
        Ok(())
    }

    /// The host cost of a plain, a prepared and a recorded call at a tiny shape.
    fn overhead(&mut self, setting: &Setting) -> anyhow::Result<()> {
        setting
            .progress
            .note("per-call overhead, B1 H1 N16 d16".into());
        let measured = pollster::block_on(bench::call_overhead(
            setting.engine,
            repeats(KernelPath::Fused, setting.args.quick),
        ))?;
        let of_plain = |m: &Option<bench::Measurement>| {
            m.as_ref().map_or("-".to_string(), |m| {
                format!("{:.0}%", 100.0 * m.median_ms() / measured.plain.median_ms())
            })
        };
        setting.progress.said(format!(
            "  Engine::attention {:.3} ms, prepared run {:.3} ms, recorded {} and \
             record alone {} of Engine::attention",
            measured.plain.median_ms(),
            measured.prepared.median_ms(),
            of_plain(&measured.recorded),
            of_plain(&measured.record_only),
        ));
        self.overhead = Some(measured);
        Ok(())
    }
}

/// The decode kernel the engine runs for `shape` on `path` (none off the
/// fused path), and on a GPU whose choice is the streaming kernel the staged
/// one beside it (pinned, on an engine of its own), measured the same way.
fn decode_runs(
    engine: &webattn::Engine,
    shape: AttentionShape,
    path: KernelPath,
) -> Vec<(Option<DecodeKernel>, Option<webattn::Engine>)> {
    let dims = webattn::AttentionDims::plain(
        shape.batch,
        [shape.heads, shape.kv_heads],
        [1, shape.seq_k],
        [shape.head_dim, shape.head_dim],
    );
    let chosen = match path {
        KernelPath::Fused => engine
            .planner(dims.head_dim, dims.v_head_dim)
            .and_then(|p| p.decode_layout(&dims))
            .map(|plan| plan.kernel),
        _ => None,
    };
    let mut runs = vec![(chosen, None)];
    if let (Some(DecodeKernel::Stream(_)), Some(shared)) = (chosen, engine.sharing_device()) {
        let staged = shared.with_overrides(webattn::plan::overrides::Overrides {
            pinned_decode: Some(DecodeKernel::Staged),
            ..*engine.overrides()
        });
        runs.push((Some(DecodeKernel::Staged), Some(staged)));
    }
    runs
}
