//! Positional encodings on the GPU and on the CPU engine against their f64
//! oracle twins: the sinusoidal encoding and RoPE in both layouts, at awkward
//! sizes, large positions (angles of thousands of radians) and KV-cache offsets.

use crate::common;

use webattn::conformance::compare;
use webattn::family::position::{
    rope_oracle, sinusoidal_oracle, Rope, RopeLayout, Sinusoidal, DEFAULT_BASE,
};
use webattn::rng::SplitMix64;
use webattn::{Engine, Error, HostTensor};

/// The engines each case runs on: the CPU engine always, the GPU when there is one.
fn engines() -> Vec<&'static Engine> {
    static CPU: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    let mut engines = vec![CPU.get_or_init(Engine::cpu)];
    engines.extend(common::gpu());
    engines
}

fn random(shape: &[usize], seed: u64) -> HostTensor {
    let mut rng = SplitMix64::new(seed);
    let len = shape.iter().product();
    HostTensor::new(shape.to_vec(), rng.normal_vec(len, 1.0)).unwrap()
}

#[test]
fn sinusoidal_matches_the_oracle() {
    let mut worst = 0.0f64;
    for (engine, (n, d, offset)) in engines().into_iter().flat_map(|e| {
        [
            (1, 6, 0),
            (7, 7, 0),
            (97, 64, 300),
            (1025, 66, 0),
            (257, 1, 5000),
        ]
        .map(|c| (e, c))
    }) {
        let x = random(&[2, n, d], common::seed() ^ (n * 31 + d) as u64);
        let encoding = Sinusoidal {
            offset,
            ..Default::default()
        };
        let got = encoding.add_to_blocking(engine, &x).unwrap();
        let exact = sinusoidal_oracle::<f64>(&x, DEFAULT_BASE, offset).unwrap();
        let plain = sinusoidal_oracle::<f32>(&x, DEFAULT_BASE, offset).unwrap();
        let report = compare(got.data(), &exact, &plain, 1e-6);
        println!(
            "sinusoidal {} n={n:<5} d={d:<3} offset={offset:<5} max_abs {:.3e} allowed {:.3e}",
            if engine.gpu().is_some() { "gpu" } else { "cpu" },
            report.max_abs,
            report.allowed
        );
        assert!(report.passed(), "{report:?}");
        worst = worst.max(report.max_abs);
    }
    println!("worst sinusoidal error {worst:.3e}");
}

#[test]
fn rope_matches_the_oracle() {
    for (engine, layout) in engines()
        .into_iter()
        .flat_map(|e| [RopeLayout::Interleaved, RopeLayout::HalfSplit].map(|l| (e, l)))
    {
        for (n, d, base, offset) in [
            (1, 2, DEFAULT_BASE, 0),
            (7, 8, DEFAULT_BASE, 4096),
            (97, 64, 500_000.0, 0),
            (1025, 66, DEFAULT_BASE, 0),
            (257, 128, DEFAULT_BASE, 1000),
        ] {
            let x = random(&[2, 3, n, d], common::seed() ^ (n * 17 + d) as u64);
            let rope = Rope {
                base,
                layout,
                offset,
            };
            let got = rope.apply_blocking(engine, &x).unwrap();
            let exact = rope_oracle::<f64>(&x, &rope).unwrap();
            let plain = rope_oracle::<f32>(&x, &rope).unwrap();
            let report = compare(got.data(), &exact, &plain, 1e-6);
            println!(
                "rope {} {layout:?} n={n:<5} d={d:<3} base={base:<8} offset={offset:<5} max_abs {:.3e} allowed {:.3e}",
                if engine.gpu().is_some() { "gpu" } else { "cpu" },
                report.max_abs,
                report.allowed
            );
            assert!(report.passed(), "{report:?}");
        }
    }
}

#[test]
fn the_cpu_engine_rotates_with_exact_angles() {
    let engine = Engine::cpu();
    // Pure rotations of (1, 0) pairs: the f32 result is the f64 cosine and
    // sine rounded once, even at position 5000.
    let x = HostTensor::new([1, 1, 2, 4], vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]).unwrap();
    let rope = Rope {
        offset: 5000,
        ..Default::default()
    };
    let got = rope.apply_blocking(&engine, &x).unwrap();
    let exact = rope_oracle::<f64>(&x, &rope).unwrap();
    for (g, e) in got.data().iter().zip(&exact) {
        assert_eq!(*g, *e as f32);
    }
    let table = Sinusoidal::default().table(2, 4).unwrap();
    // Position 0: sin 0 = 0, cos 0 = 1; position 1, pair 0: sin 1, cos 1.
    assert_eq!(&table.data()[..4], &[0.0, 1.0, 0.0, 1.0]);
    assert_eq!(table.data()[4], 1f64.sin() as f32);
    assert_eq!(table.data()[5], 1f64.cos() as f32);
    // Pair 1 of a 4-wide row turns at 10000^(-1/2) = 0.01 radians per position.
    assert_eq!(table.data()[6], 0.01f64.sin() as f32);
}

/// RoPE's point: after rotation, q·k depends only on the distance between
/// the positions, so shifting both by the same offset changes nothing.
#[test]
fn rope_scores_depend_only_on_relative_position() {
    let q = random(&[1, 1, 1, 16], 1);
    let k = random(&[1, 1, 1, 16], 2);
    let dot_at = |qpos: usize, kpos: usize| -> f64 {
        let rq = Rope {
            offset: qpos,
            ..Default::default()
        };
        let rk = Rope {
            offset: kpos,
            ..Default::default()
        };
        let a = rope_oracle::<f64>(&q, &rq).unwrap();
        let b = rope_oracle::<f64>(&k, &rk).unwrap();
        a.iter().zip(&b).map(|(x, y)| x * y).sum()
    };
    let near = dot_at(10, 7);
    assert!((near - dot_at(110, 107)).abs() < 1e-9);
    assert!((near - dot_at(3, 0)).abs() < 1e-9);
    assert!(
        (near - dot_at(10, 9)).abs() > 1e-6,
        "a different distance changes the score"
    );
}

#[test]
fn bad_inputs_are_typed_errors() {
    let cpu = Engine::cpu();
    let engine = common::gpu().unwrap_or(&cpu);
    let odd = random(&[1, 1, 3, 5], 3);
    assert!(matches!(
        Rope::default().apply_blocking(engine, &odd),
        Err(Error::InvalidOption { .. })
    ));
    let flat = random(&[8], 3);
    assert!(matches!(
        Sinusoidal::default().add_to_blocking(engine, &flat),
        Err(Error::Rank { .. })
    ));
    let bad_base = Rope {
        base: 1.0,
        ..Default::default()
    };
    assert!(matches!(
        bad_base.apply_blocking(engine, &random(&[2, 4], 1)),
        Err(Error::InvalidOption { .. })
    ));
    let far = Sinusoidal {
        offset: 1 << 25,
        ..Default::default()
    };
    assert!(matches!(
        far.add_to_blocking(engine, &random(&[2, 4], 1)),
        Err(Error::Limit { .. })
    ));
}
