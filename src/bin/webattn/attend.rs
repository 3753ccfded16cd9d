//! `webattn attend`: one attention call on `.npy` files, named and spelled as in
//! the ONNX `Attention` operator (opset 25), 4D or 3D.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::ValueEnum;
use webattn::layout::{merge_heads, split_heads};
use webattn::{npy, AttentionInputs, AttentionOptions, HostTensor, KernelPath, QkMatmulOutputMode};

use super::files::Staged;

/// Which implementation runs the call.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathArg {
    /// The engine chooses (fused unless the sizes rule it out).
    Auto,
    /// The fused GPU path: one FlashAttention-style kernel, O(N) memory.
    Fused,
    /// The unfused GPU path: QK^T GEMM, mask, softmax, PV GEMM.
    Unfused,
    /// The fast CPU backend (f32, blocked, threaded).
    Cpu,
    /// The f64 CPU oracle (slow; the reference every path is checked against).
    Oracle,
}

/// Arguments of `webattn attend`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Queries: [B, Hq, Sq, Dk] (4D) or [B, Sq, Hq*Dk] (3D, with --q-num-heads). f32 or f16.
    #[arg(long, value_name = "Q.npy")]
    q: PathBuf,
    /// Keys: [B, Hkv, L, Dk] or [B, L, Hkv*Dk].
    #[arg(long, value_name = "K.npy")]
    k: PathBuf,
    /// Values: [B, Hkv, L, Dv] or [B, L, Hkv*Dv].
    #[arg(long, value_name = "V.npy")]
    v: PathBuf,
    /// Mask broadcast to [B, Hq, Sq, T]: bool (true = attend) or f32/f16 (added).
    #[arg(long, value_name = "M.npy")]
    attn_mask: Option<PathBuf>,
    /// Cached keys [B, Hkv, P, Dk], prepended to K.
    #[arg(long, value_name = "PK.npy", requires = "past_value")]
    past_key: Option<PathBuf>,
    /// Cached values [B, Hkv, P, Dv], prepended to V.
    #[arg(long, value_name = "PV.npy", requires = "past_key")]
    past_value: Option<PathBuf>,
    /// Valid keys per batch entry [B], int32 or int64.
    #[arg(long, value_name = "L.npy")]
    nonpad_kv_seqlen: Option<PathBuf>,
    /// Causal masking (key j allowed for query i iff j <= i + offset).
    #[arg(long)]
    is_causal: bool,
    /// Score scale (default 1/sqrt(Dk)).
    #[arg(long, value_name = "S")]
    scale: Option<f32>,
    /// Softcap c: scores become c*tanh(s/c) (0 = off).
    #[arg(long, value_name = "C", default_value_t = 0.0)]
    softcap: f32,
    /// Softmax temperature: probabilities are softmax((s + bias) / T) (1 = plain).
    #[arg(long, value_name = "T", default_value_t = 1.0)]
    temperature: f32,
    /// Add the ALiBi bias -m_h * |position - key| with the standard per-head slopes.
    #[arg(long)]
    alibi: bool,
    /// Query heads, for 3D inputs.
    #[arg(long, value_name = "N")]
    q_num_heads: Option<usize>,
    /// Key/value heads, for 3D inputs.
    #[arg(long, value_name = "N")]
    kv_num_heads: Option<usize>,
    /// Keys further back than this are masked (-1 = unbounded).
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    left_window_size: i64,
    /// Keys further ahead than this are masked (-1 = unbounded).
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    right_window_size: i64,
    /// What --qk-matmul-output holds: 0 scaled QK^T, 1 softcapped, 2 with bias, 3 probabilities.
    #[arg(long, value_name = "0|1|2|3", default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..=3))]
    qk_matmul_output_mode: i64,
    /// Which implementation runs the call.
    #[arg(long, value_enum, default_value_t = PathArg::Auto)]
    path: PathArg,
    /// Output Y: [B, Hq, Sq, Dv] (4D) or [B, Sq, Hq*Dv] (3D). f32.
    #[arg(long, value_name = "Y.npy")]
    y: PathBuf,
    /// Output present_key [B, Hkv, T, Dk].
    #[arg(long, value_name = "F")]
    present_key: Option<PathBuf>,
    /// Output present_value [B, Hkv, T, Dv].
    #[arg(long, value_name = "F")]
    present_value: Option<PathBuf>,
    /// Output qk_matmul_output [B, Hq, Sq, T] in --qk-matmul-output-mode.
    #[arg(long, value_name = "F")]
    qk_matmul_output: Option<PathBuf>,
    /// Output the row logsumexp [B, Hq, Sq] (natural log; -inf for fully masked rows).
    #[arg(long, value_name = "F")]
    lse: Option<PathBuf>,
    /// The gradient of a loss with respect to Y (Y's shape): runs the backward
    /// pass after the forward and writes the gradients asked for below.
    #[arg(long, value_name = "DY.npy", requires = "dq")]
    dy: Option<PathBuf>,
    /// Output dQ (Q's shape), with --dy.
    #[arg(long, value_name = "F", requires_all = ["dy", "dk", "dv"])]
    dq: Option<PathBuf>,
    /// Output dK (K's shape), with --dy.
    #[arg(long, value_name = "F", requires = "dy")]
    dk: Option<PathBuf>,
    /// Output dV (V's shape), with --dy.
    #[arg(long, value_name = "F", requires = "dy")]
    dv: Option<PathBuf>,
    /// Output the past keys' gradient [B, Hkv, P, Dk], with --dy and a past.
    #[arg(long, value_name = "F", requires_all = ["dy", "past_key"])]
    dpast_key: Option<PathBuf>,
    /// Output the past values' gradient [B, Hkv, P, Dv], with --dy and a past.
    #[arg(long, value_name = "F", requires_all = ["dy", "past_value"])]
    dpast_value: Option<PathBuf>,
    /// Ragged (packed) sequences, FlashAttention's varlen form: the query
    /// offsets [batch + 1] (int32 or int64, rising from 0 to Q's rows). Q, K
    /// and V are then [total tokens, heads, head size], Y and the logsumexp
    /// packed as Q, and each sequence attends only its own keys.
    #[arg(
        long,
        value_name = "CQ.npy",
        requires = "cu_seqlens_k",
        conflicts_with_all = [
            "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen", "q_num_heads",
            "kv_num_heads", "qk_matmul_output", "present_key", "present_value", "dy",
        ]
    )]
    cu_seqlens_q: Option<PathBuf>,
    /// The key offsets [batch + 1], rising from 0 to K's rows (with --cu-seqlens-q).
    #[arg(long, value_name = "CK.npy", requires = "cu_seqlens_q")]
    cu_seqlens_k: Option<PathBuf>,
}

impl Args {
    fn outputs(&self) -> Vec<(&'static str, &Path)> {
        let mut out = vec![("Y", self.y.as_path())];
        for (name, p) in [
            ("present_key", &self.present_key),
            ("present_value", &self.present_value),
            ("qk_matmul_output", &self.qk_matmul_output),
            ("lse", &self.lse),
            ("dQ", &self.dq),
            ("dK", &self.dk),
            ("dV", &self.dv),
            ("dpast_key", &self.dpast_key),
            ("dpast_value", &self.dpast_value),
        ] {
            if let Some(p) = p {
                out.push((name, p.as_path()));
            }
        }
        out
    }

    fn inputs(&self) -> Vec<(&'static str, &Path)> {
        let mut out = vec![
            ("Q", self.q.as_path()),
            ("K", self.k.as_path()),
            ("V", self.v.as_path()),
        ];
        for (name, p) in [
            ("attn_mask", &self.attn_mask),
            ("past_key", &self.past_key),
            ("past_value", &self.past_value),
            ("nonpad_kv_seqlen", &self.nonpad_kv_seqlen),
            ("dY", &self.dy),
            ("cu_seqlens_q", &self.cu_seqlens_q),
            ("cu_seqlens_k", &self.cu_seqlens_k),
        ] {
            if let Some(p) = p {
                out.push((name, p.as_path()));
            }
        }
        out
    }
}

/// Q, K, V in the 4D form, and whether they came in the 3D form.
fn load_qkv(args: &Args) -> anyhow::Result<(HostTensor, HostTensor, HostTensor, bool)> {
    let q = npy::read_tensor(&args.q, "Q")?;
    let k = npy::read_tensor(&args.k, "K")?;
    let v = npy::read_tensor(&args.v, "V")?;
    match (q.shape().len(), args.q_num_heads, args.kv_num_heads) {
        (3, Some(hq), Some(hkv)) => Ok((
            split_heads("Q", &q, hq)?,
            split_heads("K", &k, hkv)?,
            split_heads("V", &v, hkv)?,
            true,
        )),
        (3, _, _) => bail!(
            "Q is 3D {:?}: give --q-num-heads and --kv-num-heads to split [B, S, H*D] into heads",
            q.shape()
        ),
        (4, None, None) => Ok((q, k, v, false)),
        (4, _, _) => bail!(
            "Q is 4D {:?}: --q-num-heads/--kv-num-heads apply only to 3D inputs (opset 25 rejects them with 4D)",
            q.shape()
        ),
        _ => bail!("Q must be 3D [B, S, H*D] or 4D [B, H, S, D], got shape {:?}", q.shape()),
    }
}

/// The call's options from the flags.
fn call_options(engine_args: &super::EngineArgs, args: &Args) -> anyhow::Result<AttentionOptions> {
    Ok(AttentionOptions {
        scale: args.scale,
        softcap: args.softcap,
        is_causal: args.is_causal,
        left_window_size: args.left_window_size,
        right_window_size: args.right_window_size,
        qk_matmul_output_mode: match &args.qk_matmul_output {
            Some(_) => Some(QkMatmulOutputMode::from_onnx(args.qk_matmul_output_mode)?),
            None => None,
        },
        // The backward takes the forward's logsumexp.
        return_lse: args.lse.is_some() || args.dy.is_some(),
        return_present: args.present_key.is_some() || args.present_value.is_some(),
        temperature: args.temperature,
        alibi: args.alibi,
        precision: engine_args.precision,
        path: match args.path {
            PathArg::Auto => KernelPath::Auto,
            PathArg::Fused => KernelPath::Fused,
            PathArg::Unfused => KernelPath::Unfused,
            PathArg::Cpu => KernelPath::Cpu,
            PathArg::Oracle => KernelPath::Oracle,
        },
    })
}

/// The engine for `options`' path: the CPU paths need no adapter; every
/// other path takes the --backend engine.
fn call_engine(
    engine_args: &super::EngineArgs,
    options: &AttentionOptions,
) -> anyhow::Result<webattn::Engine> {
    let cpu_path = matches!(options.path, KernelPath::Cpu | KernelPath::Oracle);
    if cpu_path {
        Ok(super::engine(&super::EngineArgs {
            backend: super::Backend::Cpu,
            ..engine_args.clone()
        })?)
    } else {
        Ok(super::engine(engine_args)?)
    }
}

/// `attend` on packed sequences (`--cu-seqlens-q/--cu-seqlens-k`).
fn run_ragged(
    engine_args: &super::EngineArgs,
    args: &Args,
    (cu_q, cu_k): (&Path, &Path),
) -> anyhow::Result<ExitCode> {
    let q = npy::read_tensor(&args.q, "Q")?;
    let k = npy::read_tensor(&args.k, "K")?;
    let v = npy::read_tensor(&args.v, "V")?;
    let cu_seqlens_q = npy::read_lengths(cu_q)?;
    let cu_seqlens_k = npy::read_lengths(cu_k)?;
    let options = call_options(engine_args, args)?;
    let engine = call_engine(engine_args, &options)?;
    let inputs = webattn::RaggedInputs {
        q: &q,
        k: &k,
        v: &v,
        cu_seqlens_q: &cu_seqlens_q,
        cu_seqlens_k: &cu_seqlens_k,
    };
    let start = Instant::now();
    let out = engine.attention_ragged_blocking(&inputs, &options)?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let mut staged = Staged::new();
    staged.stage(&args.y, &out.y)?;
    if let (Some(target), Some(lse)) = (&args.lse, &out.lse) {
        staged.stage(target, lse)?;
    }
    staged.commit()?;
    let path = engine.last_call().map_or(options.path, |c| c.plan.path);
    eprintln!(
        "webattn: ragged, {} sequences ({} queries, {} keys), path {path}; Q {:?} K {:?} V {:?} -> Y {:?}; {millis:.2} ms",
        cu_seqlens_q.len().saturating_sub(1),
        q.shape().first().copied().unwrap_or(0),
        k.shape().first().copied().unwrap_or(0),
        q.shape(),
        k.shape(),
        v.shape(),
        out.y.shape(),
    );
    Ok(ExitCode::SUCCESS)
}

pub fn run(engine_args: &super::EngineArgs, args: &Args) -> anyhow::Result<ExitCode> {
    Staged::check_targets(&args.outputs(), &args.inputs())?;
    if let (Some(cu_q), Some(cu_k)) = (&args.cu_seqlens_q, &args.cu_seqlens_k) {
        return run_ragged(engine_args, args, (cu_q, cu_k));
    }
    let (q, k, v, three_d) = load_qkv(args)?;
    let mask = args.attn_mask.as_ref().map(npy::read_mask).transpose()?;
    let past = match (&args.past_key, &args.past_value) {
        (Some(pk), Some(pv)) => Some((
            npy::read_tensor(pk, "past_key")?,
            npy::read_tensor(pv, "past_value")?,
        )),
        _ => None,
    };
    let nonpad = args
        .nonpad_kv_seqlen
        .as_ref()
        .map(npy::read_lengths)
        .transpose()?;

    let options = call_options(engine_args, args)?;
    let mut inputs = AttentionInputs::new(&q, &k, &v);
    if let Some(m) = &mask {
        inputs = inputs.with_mask(m);
    }
    if let Some((pk, pv)) = &past {
        inputs = inputs.with_past(pk, pv);
    }
    inputs.nonpad_kv_seqlen = nonpad.as_deref();
    webattn::validate(&inputs, &options)?;

    let engine = call_engine(engine_args, &options)?;
    let start = Instant::now();
    let out = engine.attention_host_blocking(&inputs, &options)?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let path = engine.last_call().map_or(options.path, |c| c.plan.path);

    let y = if three_d {
        merge_heads(&out.y)?
    } else {
        out.y.clone()
    };
    let mut staged = Staged::new();
    staged.stage(&args.y, &y)?;
    let pairs = [
        (&args.present_key, &out.present_key, "present_key"),
        (&args.present_value, &out.present_value, "present_value"),
        (
            &args.qk_matmul_output,
            &out.qk_matmul_output,
            "qk_matmul_output",
        ),
        (&args.lse, &out.lse, "lse"),
    ];
    for (target, tensor, name) in pairs {
        if let Some(target) = target {
            let tensor = tensor
                .as_ref()
                .with_context(|| format!("the engine did not return {name}"))?;
            staged.stage(target, tensor)?;
        }
    }
    if let Some(dy_path) = &args.dy {
        let dy = npy::read_tensor(dy_path, "dY")?;
        let dy = if three_d {
            split_heads("dY", &dy, q.shape()[1])?
        } else {
            dy
        };
        let lse = out
            .lse
            .as_ref()
            .context("the engine did not return the logsumexp")?;
        let forward = webattn::BackwardInputs {
            y: &out.y,
            lse,
            dy: &dy,
        };
        let start = Instant::now();
        let grads = pollster::block_on(engine.attention_backward_host(
            &inputs,
            &options,
            &forward,
            webattn::GradientOptions::default(),
        ))?;
        let plan = engine
            .last_backward()
            .map(|p| p.to_string())
            .unwrap_or_default();
        eprintln!(
            "webattn: {plan}; {:.2} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
        let as_given = |t: &HostTensor| {
            if three_d {
                merge_heads(t)
            } else {
                Ok(t.clone())
            }
        };
        // dQ, dK and dV as their inputs were given (3D or 4D); the past's are 4D.
        for (target, tensor, as_input) in [
            (&args.dq, Some(&grads.dq), true),
            (&args.dk, Some(&grads.dk), true),
            (&args.dv, Some(&grads.dv), true),
            (&args.dpast_key, grads.d_past_key.as_ref(), false),
            (&args.dpast_value, grads.d_past_value.as_ref(), false),
        ] {
            if let (Some(target), Some(tensor)) = (target, tensor) {
                let shaped = if as_input {
                    as_given(tensor)?
                } else {
                    tensor.clone()
                };
                staged.stage(target, &shaped)?;
            }
        }
    }
    staged.commit()?;

    let adapter = match (engine.capabilities(), path) {
        (_, KernelPath::Oracle) => "CPU (f64 oracle)".to_string(),
        (Some(caps), KernelPath::Fused | KernelPath::Unfused) => caps.adapter.name.clone(),
        _ => format!("CPU ({})", engine.cpu_backend().describe()),
    };
    eprintln!(
        "webattn: path {path} on {adapter}; Q {:?} K {:?} V {:?}{} -> Y {:?}; {millis:.2} ms",
        q.shape(),
        k.shape(),
        v.shape(),
        past.as_ref()
            .map(|(pk, _)| format!(" past {:?}", pk.shape()))
            .unwrap_or_default(),
        y.shape(),
    );
    Ok(ExitCode::SUCCESS)
}
