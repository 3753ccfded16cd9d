//! `webattn`: adapter info, attention on `.npy` files, and the conformance runner.
//!
//! Errors go to stderr with exit code 1; usage errors exit with 2 (clap's
//! convention). Input files are never modified; output files are written whole
//! or not at all.

mod attend;
mod bench;
mod check;
mod files;
mod info;
mod plot;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use webattn::{BackendPreference, Engine, EngineOptions};

/// GPU attention (ONNX Attention, opset 25) on WebGPU compute shaders, checked
/// against an f64 CPU oracle.
#[derive(Parser, Debug)]
#[command(name = "webattn", version, about, propagate_version = true)]
struct Cli {
    /// Which backend to run on: a GPU if one exists (else the CPU, with a
    /// warning), a GPU or fail, or the fast CPU backend.
    #[arg(long, value_enum, default_value_t = Backend::Auto, global = true)]
    backend: Backend,
    /// Threads of the fast CPU backend (default: one per core).
    #[arg(long, value_name = "N", global = true, value_parser = clap::value_parser!(u16).range(1..))]
    cpu_threads: Option<u16>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The adapter, its limits and features, and the kernel paths and tiles used on it.
    Info(info::Args),
    /// One attention call on NumPy `.npy` files, named as in ONNX `Attention`.
    Attend(Box<attend::Args>),
    /// The conformance sweep on this adapter against the f64 CPU oracle.
    Check(check::Args),
    /// Measure the FMA ceiling, GEMM, attention per path and decode, side by side.
    Bench(bench::Args),
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Auto,
    Gpu,
    Cpu,
}

/// `--cpu-threads`, set once from the command line before any engine is made.
static CPU_THREADS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();

/// Creates the engine the `--backend` option asks for.
fn engine(backend: Backend) -> webattn::Result<Engine> {
    let backend = match backend {
        Backend::Auto => BackendPreference::Auto,
        Backend::Gpu => BackendPreference::Gpu,
        Backend::Cpu => BackendPreference::Cpu,
    };
    Engine::with_options_blocking(EngineOptions {
        backend,
        cpu_threads: CPU_THREADS.get().copied().flatten(),
        ..Default::default()
    })
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .init();
    let cli = Cli::parse();
    let _ = CPU_THREADS.set(cli.cpu_threads.map(usize::from));
    let outcome = match cli.command {
        Command::Info(args) => info::run(cli.backend, &args),
        Command::Attend(args) => attend::run(cli.backend, &args),
        Command::Check(args) => check::run(cli.backend, &args),
        Command::Bench(args) => bench::run(cli.backend, &args),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
