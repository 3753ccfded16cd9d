//! Wall-clock timing of the fast CPU backend (or the f64 oracle) on one
//! attention shape, the way BENCHMARKS.md's decode and thread figures were
//! taken: `B = 1`, `H` heads (`Hq = Hkv`), `Nq` queries against `N` keys,
//! causal and not, the median and the best of `runs` calls after one warm-up.
//!
//! ```sh
//! cargo run --release --example cpu_timing -- 2048 8 64 5 1,2          # N H d runs threads
//! cargo run --release --example cpu_timing -- 4096 8 128 7 2 1         # decode: Nq = 1
//! cargo run --release --example cpu_timing -- 4096 8 128 5 2 1 oracle  # the f64 oracle instead
//! ```

use web_time::Instant;
use webattn::conformance::CaseSpec;
use webattn::cpu::fast::CpuBackend;
use webattn::AttentionOptions;

fn main() -> webattn::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let number =
        |i: usize, default: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let (keys, heads, d, runs) = (number(1, 2048), number(2, 8), number(3, 64), number(4, 5));
    let threads: Vec<usize> = args.get(5).map_or(vec![1, 2], |s| {
        s.split(',').filter_map(|x| x.parse().ok()).collect()
    });
    let queries = number(6, keys);
    let oracle = args.get(7).is_some_and(|s| s == "oracle");
    let inputs = CaseSpec::new("timing", [1, heads, heads], [queries, keys], [d, d]).generate(1)?;
    for &t in &threads {
        let backend = CpuBackend::new(Some(t));
        for causal in [false, true] {
            let options = AttentionOptions {
                is_causal: causal,
                ..Default::default()
            };
            let mut ms = Vec::new();
            for _ in 0..=runs.max(1) {
                let start = Instant::now();
                if oracle {
                    webattn::cpu::attention(&inputs.as_inputs(), &options)?;
                } else {
                    backend.attention(&inputs.as_inputs(), &options)?;
                }
                ms.push(start.elapsed().as_secs_f64() * 1e3);
            }
            ms.remove(0);
            ms.sort_by(f64::total_cmp);
            let full = 4.0 * (heads * queries * keys * d) as f64;
            let flops = if causal && queries == keys {
                full / 2.0
            } else {
                full
            };
            println!(
                "{} {t} thread{} causal={causal}: median {:.2} ms ({:.1} GFLOP/s), best {:.2} ms",
                if oracle { "oracle" } else { "cpu" },
                if t == 1 { "" } else { "s" },
                ms[ms.len() / 2],
                flops / ms[ms.len() / 2] / 1e6,
                ms[0]
            );
        }
    }
    Ok(())
}
