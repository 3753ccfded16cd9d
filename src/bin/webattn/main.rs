//! `webattn`: adapter info, attention on `.npy` files, and the conformance runner.
//!
//! Errors go to stderr with exit code 1; usage errors exit with 2 (clap's
//! convention). Input files are never modified; output files are written whole
//! or not at all.

// The bench report is one json! literal whose rows pass the macro's default depth.
#![recursion_limit = "256"]

mod attend;
mod bench;
mod check;
mod files;
mod info;
mod phases;
mod plot;
mod progress;
mod soak;
mod tune;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use webattn::tuning::TuningCache;
use webattn::{
    BackendPreference, DecodeKernelChoice, DeviceLimits, Engine, EngineOptions, FusedKernelChoice,
    LimitOverride, LimitsPreset, MatrixUnits, Precision, RuntimeChecks,
};

/// GPU attention (ONNX Attention, opset 25) on WebGPU compute shaders, checked
/// against an f64 CPU oracle.
#[derive(Parser, Debug)]
#[command(name = "webattn", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    engine: EngineArgs,
    #[command(subcommand)]
    command: Command,
}

/// How to create the engine: which backend, and under which device limits.
#[derive(clap::Args, Debug, Clone)]
pub struct EngineArgs {
    /// Which backend to run on: a GPU if one exists (else the CPU, with a
    /// warning), a GPU or fail, or the fast CPU backend.
    #[arg(long, value_enum, default_value_t = Backend::Auto, global = true)]
    backend: Backend,
    /// Threads of the fast CPU backend (default: one per core).
    #[arg(long, value_name = "N", global = true, value_parser = clap::value_parser!(u16).range(1..))]
    cpu_threads: Option<u16>,
    /// The device limits to start from: the adapter's own, WebGPU's defaults
    /// (what every browser guarantees: 128 MiB bindings, 16 KiB workgroup
    /// memory, 256 invocations), or wgpu's downlevel set.
    #[arg(long, value_name = "PRESET", default_value = "adapter", global = true,
          value_parser = |s: &str| s.parse::<LimitsPreset>())]
    limits: LimitsPreset,
    /// Lowers one device limit, by wgpu's name (repeatable), e.g.
    /// `--limit max_storage_buffer_binding_size=4MiB`.
    #[arg(long = "limit", value_name = "NAME=VALUE", global = true,
          value_parser = |s: &str| s.parse::<LimitOverride>())]
    limit: Vec<LimitOverride>,
    /// The fused kernel to use, by the name `webattn info` lists:
    /// attention_tiled (register-tiled, GPUs), attention_tiled_shuffle (its
    /// form whose row maxima and probabilities move by subgroup shuffles;
    /// adapters with subgroups of 8 lanes or more), attention_tiled_chunked
    /// (its form with the Q, K, V and P tiles in chunks of columns: fewer index
    /// clamps), attention_fused (portable, any adapter),
    /// attention_sg (subgroup shuffles, CPU adapters), attention_coop
    /// (matrix units, with --precision fast; K and V packed ahead where they
    /// fit a binding), attention_coop_staged (the same with K and V staged
    /// through workgroup memory) or attention_coop_shared (K and V packed,
    /// each tile copied once into workgroup memory for all its subgroups);
    /// auto lets the adapter's profile decide.
    #[arg(long, value_name = "NAME", default_value = "auto", global = true,
          value_parser = |s: &str| s.parse::<FusedKernelChoice>())]
    kernel: FusedKernelChoice,
    /// The decode kernel for calls of a few query rows (up to 16) over many
    /// keys: attention_decode_stream (teams of subgroup lanes stream K and V,
    /// no barrier in the key loop; adapters with subgroups of 4 or more),
    /// attention_decode (K staged through workgroup memory; any adapter); auto
    /// lets the adapter's profile and the tuning cache decide.
    #[arg(long, value_name = "NAME", default_value = "auto", global = true,
          value_parser = |s: &str| s.parse::<DecodeKernelChoice>())]
    decode_kernel: DecodeKernelChoice,
    /// How exact the GPU's products must be: highest (f32, the default) or
    /// fast (f16 products with f32 accumulation on the matrix units, where the
    /// adapter has them: `webattn info` lists them; elsewhere the f32 kernels
    /// run). `check` then judges by the f16 rule, on f16-rounded inputs.
    #[arg(long, value_name = "PRECISION", default_value = "highest", global = true,
          value_parser = |s: &str| s.parse::<Precision>())]
    precision: Precision,
    /// The adapter's matrix units: auto (used by --precision fast where the
    /// adapter offers them), off (the device is created without wgpu's
    /// experimental cooperative-matrix feature), or emulated16, a testing aid
    /// for Mesa 26's lavapipe (.ci/lavapipe-coop): it lists only 8x8x8 f16
    /// matrices but runs the 16x16x16 kernels that GPUs get; or naga-spirv, a
    /// measuring aid: auto, with wgpu's SPIR-V for the matrix-unit kernels on
    /// Vulkan instead of the engine's (faster loads from workgroup memory,
    /// without the memory-model operands naga omits).
    #[arg(long, value_name = "auto|off|emulated16|naga-spirv", default_value = "auto", global = true,
          value_parser = |s: &str| s.parse::<MatrixUnits>())]
    matrix_units: MatrixUnits,
    /// Whether the kernels keep naga's runtime checks (index clamps on array
    /// accesses, a counter in every loop): on (the default); bounds, the
    /// clamps without the counters; or off, without either. bounds and off
    /// are measuring aids (natively; the sweep runs both ways in the tests).
    #[arg(long, value_name = "on|bounds|off", default_value = "on", global = true,
          value_parser = |s: &str| s.parse::<RuntimeChecks>())]
    runtime_checks: RuntimeChecks,
    /// The tuning cache (`webattn tune`'s measured kernel choices) to read and
    /// write: a file, or `none` for none. Default: $WEBATTN_TUNING_CACHE, else
    /// ~/.cache/webattn/tuning.tsv.
    #[arg(long, value_name = "PATH|none", global = true)]
    tuning_cache: Option<std::path::PathBuf>,
    /// The clock guard of measurements (bench, phases, tune): auto (on for
    /// GPUs that are not CPU adapters and have timestamp queries), on or off.
    /// With it on, a short FMA probe runs before and after each timed run,
    /// and a run beside a probe under 3/4 of the fastest is retaken: its
    /// GPU's clocks were down.
    #[arg(long, value_enum, default_value_t = ClockGuard::Auto, global = true)]
    clock_guard: ClockGuard,
}

/// `--clock-guard`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ClockGuard {
    Auto,
    On,
    Off,
}

impl EngineArgs {
    /// The device limits these arguments ask for.
    pub fn device_limits(&self) -> DeviceLimits {
        DeviceLimits {
            preset: self.limits.clone(),
            overrides: self.limit.clone(),
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The adapter, its limits and features, and the kernel paths and tiles used on it.
    Info(info::Args),
    /// Time every fused kernel and tile that fits this adapter, and the
    /// unfused path, per head dims; remember the fastest in the tuning cache.
    Tune(tune::Args),
    /// One attention call on NumPy `.npy` files, named as in ONNX `Attention`.
    Attend(Box<attend::Args>),
    /// The conformance sweep on this adapter against the f64 CPU oracle.
    Check(check::Args),
    /// Measure the FMA ceiling, GEMM, attention per path and decode, side by side.
    Bench(bench::Args),
    /// Where the fused and decode kernels' time goes: timed whole and without
    /// each phase of their key loop in turn (a measuring aid; the variants'
    /// results are discarded).
    Phases(phases::Args),
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Auto,
    Gpu,
    Cpu,
}

/// Creates the engine the `--backend`, `--cpu-threads`, `--limits` and
/// `--limit` options ask for.
/// The engine for a user's work (`attend`): `--backend auto` takes the
/// fastest, the CPU backend where the only adapter is a CPU implementation.
fn engine(args: &EngineArgs) -> webattn::Result<Engine> {
    engine_as(args, false)
}

/// The engine of the tools that certify or measure the adapter (`check`,
/// `bench`, `tune`, `phases`, `info`): `--backend auto` takes the adapter,
/// lavapipe and SwiftShader included, and the CPU backend only where there
/// is none.
fn adapter_engine(args: &EngineArgs) -> webattn::Result<Engine> {
    engine_as(args, true)
}

fn engine_as(args: &EngineArgs, adapter_first: bool) -> webattn::Result<Engine> {
    if args.kernel.is_coop() && args.precision != Precision::Fast {
        return Err(webattn::Error::InvalidOption {
            name: "kernel",
            value: args.kernel.name().to_string(),
            reason:
                "attention_coop, attention_coop_staged and attention_coop_shared multiply f16 operands on the matrix units: add --precision fast",
        });
    }
    let backend = match args.backend {
        Backend::Auto if adapter_first => BackendPreference::Gpu,
        Backend::Auto => BackendPreference::Auto,
        Backend::Gpu => BackendPreference::Gpu,
        Backend::Cpu => BackendPreference::Cpu,
    };
    let options = |backend| EngineOptions {
        backend,
        cpu_threads: args.cpu_threads.map(usize::from),
        limits: args.device_limits(),
        fused_kernel: args.kernel,
        decode_kernel: args.decode_kernel,
        matrix_units: args.matrix_units,
        runtime_checks: args.runtime_checks,
        tuning_cache: match &args.tuning_cache {
            None => TuningCache::Default,
            Some(path) if path.as_os_str() == "none" => TuningCache::Memory,
            Some(path) => TuningCache::File(path.clone()),
        },
        ..Default::default()
    };
    let engine = match Engine::with_options_blocking(options(backend)) {
        // No adapter at all: the tools run on the CPU backend, as auto does.
        Err(webattn::Error::NoAdapter(why)) if args.backend == Backend::Auto => {
            log::warn!("webattn: {why}; using the CPU backend");
            Engine::with_options_blocking(options(BackendPreference::Cpu))?
        }
        made => made?,
    };
    if let Some(ctx) = engine.gpu() {
        ctx.set_clock_guard(match args.clock_guard {
            ClockGuard::Auto => None,
            ClockGuard::On => Some(true),
            ClockGuard::Off => Some(false),
        });
    }
    Ok(engine)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .init();
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Info(args) => info::run(&cli.engine, &args),
        Command::Tune(args) => tune::run(&cli.engine, &args),
        Command::Attend(args) => attend::run(&cli.engine, &args),
        Command::Check(args) => check::run(&cli.engine, &args),
        Command::Bench(args) => bench::run(&cli.engine, &args),
        Command::Phases(args) => phases::run(&cli.engine, &args),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
