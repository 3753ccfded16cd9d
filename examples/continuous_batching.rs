//! Continuous batching over a paged KV cache: requests arrive over time, each
//! a fork of a shared system prompt, is prefilled with its own prompt, then
//! decodes one token a step until it has its new tokens, and is freed. Every
//! step is one append of all sequences' new keys and values and one attention
//! call for all of them (prefills and decode rows together, one submission
//! on a GPU engine, whose cache keeps its pages in device memory).
//!
//! Attention only: keys, values and queries are random, as a layer's
//! projections would give them; the multi-head layer's step over a paged
//! cache is still to come. Each few steps one sequence's output is checked
//! against the f64 oracle on the same pages. At the end: tokens per second,
//! pages in use against the bytes of the live tokens, and what a padded cache
//! (every slot holding the longest request's room) would have held.
//!
//! ```sh
//! cargo run --release --example continuous_batching                 # 64 requests, prompts 16-2048, 16-256 new tokens
//! cargo run --release --example continuous_batching -- --quick      # 12 small requests
//! ```
//! Options: `--requests N`, `--max-prompt N`, `--max-new N`, `--system N`
//! (the shared prompt's tokens), `--page-size N`, `--seed N`, `--quick`,
//! `--backend auto|gpu|cpu` (auto: the engine's choice, which on a CPU
//! adapter such as lavapipe is the CPU backend and host pages),
//! `--storage f32|f16|int8` (how the pages hold keys and values).

use std::io::{IsTerminal, Write};
use std::time::Instant;

use webattn::rng::SplitMix64;
use webattn::{
    AttentionInputs, AttentionOptions, BackendPreference, Engine, EngineOptions, HostTensor,
    PageStorage, PagedKvCache, PagedLayout, SequenceId,
};

const Q_HEADS: usize = 8;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;

struct Args {
    requests: usize,
    max_prompt: usize,
    max_new: usize,
    system: usize,
    page_size: usize,
    seed: u64,
    backend: BackendPreference,
    storage: PageStorage,
}

impl Args {
    fn parse() -> Args {
        let mut args = Args {
            requests: 64,
            max_prompt: 2048,
            max_new: 256,
            system: 100,
            page_size: 16,
            seed: 1,
            backend: BackendPreference::Auto,
            storage: PageStorage::F32,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            if flag == "--quick" {
                (args.requests, args.max_prompt, args.max_new) = (12, 96, 24);
                continue;
            }
            if flag == "--backend" {
                args.backend = match it.next().as_deref() {
                    Some("auto") => BackendPreference::Auto,
                    Some("gpu") => BackendPreference::Gpu,
                    Some("cpu") => BackendPreference::Cpu,
                    other => panic!("--backend takes auto, gpu or cpu, not {other:?}"),
                };
                continue;
            }
            if flag == "--storage" {
                let name = it.next().unwrap_or_default();
                args.storage =
                    PageStorage::parse(&name).unwrap_or_else(|e| panic!("--storage: {e}"));
                continue;
            }
            let value: u64 = it
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{flag} takes a number"));
            let n = value as usize;
            match flag.as_str() {
                "--requests" => args.requests = n,
                "--max-prompt" => args.max_prompt = n,
                "--max-new" => args.max_new = n,
                "--system" => args.system = n,
                "--page-size" => args.page_size = n,
                "--seed" => args.seed = value,
                _ => panic!("unknown option {flag}"),
            }
        }
        args
    }
}

/// A request: when it arrives, its prompt and how many tokens it makes.
struct Request {
    arrival: usize,
    prompt: usize,
    new_tokens: usize,
    made: usize,
    seq: Option<SequenceId>,
}

/// A length drawn log-uniformly from `lo..=hi` (serving's many short prompts
/// and few long ones).
fn log_uniform(rng: &mut SplitMix64, lo: usize, hi: usize) -> usize {
    let (a, b) = ((lo as f64).ln(), (hi.max(lo) as f64).ln());
    let u = rng.below(1 << 20) as f64 / f64::from(1 << 20);
    ((a + u * (b - a)).exp().round() as usize).clamp(lo, hi.max(lo))
}

fn rows(rng: &mut SplitMix64, n: usize) -> (HostTensor, HostTensor) {
    let data = |rng: &mut SplitMix64| rng.normal_vec(KV_HEADS * n * HEAD_DIM, 1.0);
    (
        HostTensor::new([KV_HEADS, n, HEAD_DIM], data(rng)).expect("shape"),
        HostTensor::new([KV_HEADS, n, HEAD_DIM], data(rng)).expect("shape"),
    )
}

/// The worst error of `y` against the f64 oracle on `seq`'s pages, over its
/// allowance (twice a plain f32 computation's error plus a floor).
fn oracle_share(
    cache: &PagedKvCache,
    seq: SequenceId,
    q: &HostTensor,
    y: &HostTensor,
    options: &AttentionOptions,
) -> webattn::Result<f64> {
    let exact = cache.oracle_blocking(seq, q, options)?;
    let (k, v) = cache.read_blocking(seq)?;
    let lengths = [cache.len(seq)? as i64];
    let mut inputs = AttentionInputs::new(q, &k, &v);
    inputs.nonpad_kv_seqlen = Some(&lengths);
    let plain = webattn::cpu::attention_plain_f32(&inputs, options)?;
    let err = |a: &[f32]| {
        a.iter()
            .zip(exact.y.data())
            .map(|(&x, &e)| f64::from((x - e).abs()))
            .fold(0.0, f64::max)
    };
    Ok(err(y.data()) / (2.0 * err(&plain.y) + 1e-6))
}

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = Args::parse();
    let engine = Engine::with_options_blocking(EngineOptions {
        backend: args.backend,
        ..Default::default()
    })?;
    println!("engine: {}", engine.describe());
    let layout = PagedLayout {
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        v_head_dim: HEAD_DIM,
        page_size: args.page_size,
    };
    let mut cache = PagedKvCache::on_engine(&engine, layout)?.with_storage(args.storage)?;
    println!(
        "cache: {} pages of {} tokens in {} memory; {} query heads over {} KV heads of {}",
        args.storage.name(),
        args.page_size,
        if cache.on_device() { "device" } else { "host" },
        Q_HEADS,
        KV_HEADS,
        HEAD_DIM
    );
    let mut rng = SplitMix64::new(args.seed);
    let system = cache.add_sequence();
    let (k, v) = rows(&mut rng, args.system);
    cache.append(system, &k, &v)?;
    // Requests arrive two steps apart on average.
    let mut requests: Vec<Request> = (0..args.requests)
        .map(|i| Request {
            arrival: i * 2 + rng.below(2),
            prompt: log_uniform(&mut rng, 16, args.max_prompt),
            new_tokens: log_uniform(&mut rng, 16, args.max_new),
            made: 0,
            seq: None,
        })
        .collect();
    let longest = requests
        .iter()
        .map(|r| args.system + r.prompt + r.new_tokens)
        .max()
        .unwrap_or(0);
    // A token's keys and values as the pages store them.
    let token_bytes = cache.token_bytes();
    let page_bytes = token_bytes * args.page_size as u64;
    let causal = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let (mut prefill_tokens, mut decode_tokens, mut step) = (0usize, 0usize, 0usize);
    let (mut peak_pages, mut peak_live, mut peak_slots, mut worst) = (0usize, 0u64, 0usize, 0f64);
    // Pages over live tokens at the step the pages peak.
    let mut peak_ratio: f64 = 0.0;
    // A progress line where a person watches; none into a log.
    let show_progress = std::io::stderr().is_terminal();
    // The appends and attention calls alone (not the oracle's checks).
    let mut serving = std::time::Duration::ZERO;
    while requests.iter().any(|r| r.made < r.new_tokens) {
        // This step's new tokens: a prompt for each request arriving, one
        // token for each running one.
        let mut asked: Vec<(usize, usize)> = Vec::new();
        for (i, r) in requests.iter_mut().enumerate() {
            if r.made >= r.new_tokens || r.arrival > step {
                continue;
            }
            match r.seq {
                None => {
                    r.seq = Some(cache.fork(system)?);
                    asked.push((i, r.prompt));
                }
                Some(_) => asked.push((i, 1)),
            }
        }
        let appended: Vec<(SequenceId, HostTensor, HostTensor)> = asked
            .iter()
            .map(|&(i, n)| {
                let (k, v) = rows(&mut rng, n);
                (requests[i].seq.expect("admitted"), k, v)
            })
            .collect();
        let items: Vec<_> = appended.iter().map(|(s, k, v)| (*s, k, v)).collect();
        let served = Instant::now();
        cache.append_many(&items)?;
        let queries: Vec<HostTensor> = asked
            .iter()
            .map(|&(_, n)| {
                HostTensor::new(
                    [1, Q_HEADS, n, HEAD_DIM],
                    rng.normal_vec(Q_HEADS * n * HEAD_DIM, 1.0),
                )
            })
            .collect::<webattn::Result<_>>()?;
        let call: Vec<_> = asked
            .iter()
            .map(|&(i, _)| requests[i].seq.expect("admitted"))
            .zip(&queries)
            .collect();
        let outputs = cache.attention_blocking(&engine, &call, &causal)?;
        serving += served.elapsed();
        if step % 8 == 0 && !call.is_empty() {
            let pick = rng.below(call.len());
            let share = oracle_share(
                &cache,
                call[pick].0,
                call[pick].1,
                &outputs[pick].y,
                &causal,
            )?;
            worst = worst.max(share);
        }
        // What the step holds: distinct tokens (the shared prompt once).
        let live: u64 = args.system as u64
            + requests
                .iter()
                .filter(|r| r.seq.is_some() && r.made < r.new_tokens)
                .map(|r| (r.prompt + r.made + 1) as u64)
                .sum::<u64>();
        let slots = asked.len();
        if cache.pages_in_use() > peak_pages {
            peak_pages = cache.pages_in_use();
            peak_live = live * token_bytes;
            peak_ratio = (peak_pages as u64 * page_bytes) as f64 / peak_live as f64;
        }
        peak_slots = peak_slots.max(slots);
        for &(i, n) in &asked {
            let r = &mut requests[i];
            if n > 1 || r.made == 0 {
                prefill_tokens += n;
            } else {
                decode_tokens += 1;
            }
            r.made += 1;
            if r.made == r.new_tokens {
                cache.free(r.seq.expect("admitted"))?;
            }
        }
        let done = requests.iter().filter(|r| r.made >= r.new_tokens).count();
        if show_progress {
            eprint!(
            "\rstep {step:>5}: {slots:>3} sequences in the call, {done:>3}/{} requests done, {:>6} pages in use",
            requests.len(),
                cache.pages_in_use()
            );
            let _ = std::io::stderr().flush();
        }
        step += 1;
    }
    if show_progress {
        eprintln!();
    }
    let seconds = serving.as_secs_f64();
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    println!(
        "{} requests in {step} steps, {seconds:.2} s appending and attending: {prefill_tokens} \
         prompt tokens and {decode_tokens} decoded, {:.0} tokens/s",
        requests.len(),
        (prefill_tokens + decode_tokens) as f64 / seconds
    );
    println!(
        "memory at its peak: {peak_pages} pages ({:.2} MiB) for {:.2} MiB of live tokens: \
         {peak_ratio:.3}x (target 1.1x)",
        mib(peak_pages as u64 * page_bytes),
        mib(peak_live)
    );
    println!(
        "a padded cache: {peak_slots} slots x {longest} tokens = {:.2} MiB ({:.1}x the pages); \
         the shared prompt of {} tokens stored once",
        mib(peak_slots as u64 * longest as u64 * token_bytes),
        (peak_slots * longest) as f64 / (peak_pages * args.page_size) as f64,
        args.system
    );
    println!("checked against the f64 oracle every 8 steps: worst {worst:.3} of the allowed error");
    if worst > 1.0 {
        eprintln!("continuous batching: an output outside the tolerance ({worst:.3})");
        std::process::exit(1);
    }
    Ok(())
}
