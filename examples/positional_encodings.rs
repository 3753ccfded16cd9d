//! Positional encodings on the GPU: the sinusoidal table, RoPE in both
//! layouts, and why RoPE works: after rotation q·k depends only on the
//! distance between positions.
//!
//! ```sh
//! cargo run --example positional_encodings
//! ```

use webattn::conformance::{compare, DEFAULT_FLOOR};
use webattn::family::format_matrix;
use webattn::family::position::{rope_oracle, Rope, RopeLayout, Sinusoidal, DEFAULT_BASE};
use webattn::rng::SplitMix64;
use webattn::{Engine, HostTensor};

fn main() -> webattn::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let engine = Engine::new_blocking();
    println!("adapter: {}", engine.describe());

    // Sinusoidal: adding the encoding to zeros shows the table itself.
    let zeros = HostTensor::zeros([1, 6, 8])?;
    let table = Sinusoidal::default().add_to_blocking(&engine, &zeros)?;
    println!("\nsinusoidal encoding, positions 0-5, 8 features (sin, cos pairs):");
    println!("{}", format_matrix(table.data(), 8, 3));

    // RoPE at a KV-cache offset, both layouts, against the oracle.
    let x = HostTensor::new([1, 2, 5, 16], SplitMix64::new(1).normal_vec(160, 1.0))?;
    for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
        let rope = Rope {
            base: DEFAULT_BASE,
            layout,
            offset: 1000,
        };
        let got = rope.apply_blocking(&engine, &x)?;
        let report = compare(
            got.data(),
            &rope_oracle::<f64>(&x, &rope)?,
            &rope_oracle::<f32>(&x, &rope)?,
            DEFAULT_FLOOR,
        );
        println!(
            "\nRoPE {layout:?} at positions 1000-1004: worst error {:.2e} (allowed {:.2e})",
            report.max_abs, report.allowed
        );
    }

    // Relative positions: the same q and k placed at (m, n) and (m + 100, n + 100).
    let q = HostTensor::new([1, 1, 1, 16], SplitMix64::new(2).normal_vec(16, 1.0))?;
    let k = HostTensor::new([1, 1, 1, 16], SplitMix64::new(3).normal_vec(16, 1.0))?;
    let dot = |qpos: usize, kpos: usize| -> webattn::Result<f32> {
        let rq = Rope {
            offset: qpos,
            ..Default::default()
        }
        .apply_blocking(&engine, &q)?;
        let rk = Rope {
            offset: kpos,
            ..Default::default()
        }
        .apply_blocking(&engine, &k)?;
        Ok(rq.data().iter().zip(rk.data()).map(|(a, b)| a * b).sum())
    };
    println!("\nq·k after RoPE depends on the distance only:");
    for (m, n) in [(5, 2), (105, 102), (505, 502), (5, 4)] {
        println!(
            "  q at {m:<3}, k at {n:<3} (distance {}): {:.5}",
            m - n,
            dot(m, n)?
        );
    }
    Ok(())
}
