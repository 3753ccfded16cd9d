//! The fast CPU backend (`KernelPath::Cpu`) against the f64 oracle: the whole
//! conformance sweep, block and tile boundaries, every thread count giving the
//! same bits, and non-finite values in Q, K, V and the mask, attended and not,
//! which must come out exactly as the oracle's rule says (NaN where the oracle
//! is NaN, the same infinities, numbers within tolerance elsewhere).
//! No GPU is needed.

mod common;

use webattn::conformance::{run_sweep, CaseInputs, CaseSpec, MaskForm, Oracle, SweepKind};
use webattn::cpu::fast::{Isa, ISA_VARIABLE};
use webattn::{
    AttentionInputs, AttentionOptions, BackendKind, BackendPreference, Engine, EngineOptions,
    HostMask, HostTensor, KernelPath, QkMatmulOutputMode,
};

fn cpu_engine(threads: Option<usize>) -> Engine {
    Engine::with_options_blocking(EngineOptions {
        backend: BackendPreference::Cpu,
        cpu_threads: threads,
        ..Default::default()
    })
    .expect("a CPU engine")
}

#[test]
fn the_full_sweep_passes_on_the_cpu_backend() {
    let engine = cpu_engine(None);
    assert_eq!(engine.backend(), BackendKind::Cpu);
    assert_eq!(engine.paths(), vec![KernelPath::Cpu]);
    println!("{}", engine.describe());
    let report = pollster::block_on(run_sweep(
        &engine,
        SweepKind::Full,
        "",
        common::seed(),
        webattn::Precision::Highest,
        |_| {},
    ));
    println!("{}", report.table());
    println!(
        "worst share of the allowance: {:.3}",
        report.worst_share_of_allowed()
    );
    assert!(report.results.iter().all(|r| r.path == KernelPath::Cpu));
    assert_eq!(report.failed(), 0, "{}", report.summary_line());
}

#[test]
fn block_and_tile_boundaries() {
    // Lengths around the block sizes (48 query rows and 48 keys with AVX2,
    // 64 and 128 with AVX-512, 32 and 48 otherwise), head dims that are not
    // multiples of the panel width, odd ones, and the options that change
    // the tile loop.
    let mut cases = Vec::new();
    for (nq, nk) in [
        (1, 1),
        (5, 3),
        (47, 129),
        (48, 128),
        (65, 127),
        (95, 257),
        (200, 64),
    ] {
        for (dk, dv) in [(3, 5), (16, 16), (17, 33), (64, 8)] {
            cases.push(
                CaseSpec::new(
                    format!("q{nq}-k{nk}-d{dk}x{dv}"),
                    [2, 2, 1],
                    [nq, nk],
                    [dk, dv],
                )
                .mask(MaskForm::Float(2)),
            );
            cases.push(
                CaseSpec::new(
                    format!("q{nq}-k{nk}-d{dk}x{dv}-causal-window"),
                    [1, 3, 3],
                    [nq, nk],
                    [dk, dv],
                )
                .with(|o| {
                    o.is_causal = true;
                    o.left_window_size = 70;
                    o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
                }),
            );
        }
    }
    cases.push(
        CaseSpec::new("past-300-window", [1, 4, 2], [60, 40], [24, 40])
            .past(300)
            .with(|o| {
                o.is_causal = true;
                o.left_window_size = 150;
                o.right_window_size = 3;
                o.alibi = true;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased);
            }),
    );
    cases.push(
        CaseSpec::new("nonpad-long", [3, 2, 2], [130, 700], [32, 32])
            .nonpad()
            .with(|o| o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Scaled)),
    );
    cases.push(
        CaseSpec::new("softcap-mode1-temperature", [1, 2, 1], [100, 300], [64, 64])
            .logits(30.0)
            .with(|o| {
                o.softcap = 7.0;
                o.temperature = 1.7;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Softcapped);
            }),
    );
    cases.push(CaseSpec::new(
        "decode-20000",
        [1, 4, 1],
        [1, 20000],
        [128, 128],
    ));
    let engine = cpu_engine(None);
    println!("{}", engine.describe());
    common::run_cases(&engine, &cases, KernelPath::Cpu);
}

/// The other tests run in the best instruction set this CPU has; this one
/// runs the boundary cases again in each lesser one it has (this test binary,
/// capped by `WEBATTN_CPU_ISA`), so AVX2 stays tested on an AVX-512 machine.
#[test]
fn every_instruction_set_this_cpu_has_meets_the_oracle() {
    if std::env::var_os(ISA_VARIABLE).is_some() {
        return; // a run this test started
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    // x86-64's lesser sets; elsewhere (NEON, tested under qemu where this
    // binary could not start itself) there is one set besides the baseline.
    let lesser: &[Isa] = if cfg!(target_arch = "x86_64") {
        &[Isa::Avx2Fma, Isa::Baseline]
    } else {
        &[]
    };
    for &isa in lesser {
        if isa == Isa::detect() || !isa.runs_here() {
            continue;
        }
        let run = std::process::Command::new(&exe)
            .args(["--exact", "--nocapture", "block_and_tile_boundaries"])
            .env(ISA_VARIABLE, isa.name())
            .output()
            .expect("the test binary runs");
        let out = String::from_utf8_lossy(&run.stdout);
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "under {}:\n{out}\n{err}", isa.name());
        assert!(out.contains(isa.name()), "{out}");
        assert!(out.contains("1 passed"), "{out}");
    }
}

#[test]
fn every_thread_count_gives_the_same_bits() {
    let case = CaseSpec::new("threads", [2, 6, 2], [131, 517], [40, 24])
        .mask(MaskForm::Bool(4))
        .with(|o| {
            o.is_causal = true;
            o.return_lse = true;
            o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
        });
    let inputs = case.generate(common::seed()).unwrap();
    let run = |threads| {
        let engine = cpu_engine(Some(threads));
        assert_eq!(engine.cpu_backend().threads(), threads);
        engine
            .attention_host_blocking(&inputs.as_inputs(), &case.options)
            .unwrap()
    };
    let one = run(1);
    for threads in [2, 3, 8] {
        assert_eq!(run(threads), one, "{threads} threads");
    }
}

#[test]
fn the_oracle_path_is_reachable_and_named() {
    let engine = cpu_engine(Some(2));
    let case = CaseSpec::new("oracle", [1, 2, 2], [9, 17], [8, 8]);
    let inputs = case.generate(1).unwrap();
    for path in [KernelPath::Oracle, KernelPath::Cpu, KernelPath::Auto] {
        let options = AttentionOptions {
            path,
            ..Default::default()
        };
        engine
            .attention_host_blocking(&inputs.as_inputs(), &options)
            .unwrap();
        let expected = if path == KernelPath::Oracle {
            KernelPath::Oracle
        } else {
            KernelPath::Cpu
        };
        assert_eq!(engine.last_call().unwrap().plan.path, expected);
    }
    assert_eq!(KernelPath::Oracle.name(), "oracle");
    // The oracle's outputs are those of webattn::cpu::attention.
    let options = AttentionOptions {
        path: KernelPath::Oracle,
        ..Default::default()
    };
    let via_engine = engine
        .attention_host_blocking(&inputs.as_inputs(), &options)
        .unwrap();
    assert_eq!(
        via_engine,
        webattn::cpu::attention(&inputs.as_inputs(), &options).unwrap()
    );
    // GPU paths on a CPU engine are a typed error, not a silent fallback.
    for path in [KernelPath::Fused, KernelPath::Unfused] {
        let options = AttentionOptions {
            path,
            ..Default::default()
        };
        assert!(matches!(
            engine.attention_host_blocking(&inputs.as_inputs(), &options),
            Err(webattn::Error::Conflict(_))
        ));
    }
}

/// Checks `case` with edited inputs on the CPU path against the oracle, and
/// that the oracle does have NaN rows when `expect_nan` (so the edit mattered).
fn check_edited(name: &str, case: CaseSpec, expect_nan: bool, edit: impl FnOnce(&mut CaseInputs)) {
    let mut inputs = case.generate(common::seed()).unwrap();
    edit(&mut inputs);
    let oracle = Oracle::from_inputs(&case, inputs).unwrap();
    let engine = cpu_engine(Some(2));
    for path in [KernelPath::Cpu, KernelPath::Oracle] {
        let mut result = pollster::block_on(oracle.check(&engine, path));
        result.name = format!("{name} ({path})");
        common::print_result(&result);
        assert!(result.passed(), "{name} on {path}: {result:?}");
    }
    let exact = webattn::cpu::attention_exact(&oracle.inputs.as_inputs(), &oracle.options).unwrap();
    let dv = exact.dims.v_head_dim;
    let nan_rows = exact
        .y
        .chunks(dv)
        .filter(|row| row.iter().any(|x| x.is_nan()))
        .count();
    println!(
        "      {nan_rows} rows of Y with NaN, of {}",
        exact.lse.len()
    );
    assert_eq!(nan_rows > 0, expect_nan, "{name}: NaN rows in the oracle");
}

fn kv_index(inputs: &CaseInputs, head: usize, key: usize, d: usize, v: bool) -> usize {
    let t = if v { &inputs.v } else { &inputs.k };
    let [_, heads, keys, width] = t.shape().try_into().unwrap();
    assert!(head < heads);
    (head * keys + key) * width + d
}

/// Cases long enough to span several key tiles and query blocks.
fn long(name: &str) -> CaseSpec {
    CaseSpec::new(name, [1, 2, 1], [100, 300], [16, 16])
}

#[test]
fn nan_in_v_reaches_every_row_that_attends_its_key() {
    // Key 150: causal rows from 150 attend it (NaN), earlier ones do not.
    let case = long("nan-v-causal").with(|o| {
        o.is_causal = true;
        o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
    });
    let case = CaseSpec { q_len: 300, ..case };
    check_edited("nan-v-causal", case, true, |inputs| {
        let i = kv_index(inputs, 0, 150, 3, true);
        inputs.v.data_mut()[i] = f32::NAN;
    });
    // A NaN value at a key every row masks (bool mask, rank 1) takes no part.
    let case = long("nan-v-masked").mask(MaskForm::Bool(1));
    check_edited("nan-v-masked", case, false, |inputs| {
        if let Some(HostMask::Bool { data, .. }) = &mut inputs.mask {
            data[10] = false;
            data[200] = false;
        }
        for key in [10, 200] {
            let i = kv_index(inputs, 0, key, 0, true);
            inputs.v.data_mut()[i] = f32::NAN;
        }
    });
    // ... nor beyond a row's padding length, or outside its window.
    let case = long("nan-v-padding")
        .nonpad()
        .with(|o| o.left_window_size = 20);
    check_edited("nan-v-padding-window", case, false, |inputs| {
        inputs.nonpad = Some(vec![290]);
        for key in [295, 299] {
            let i = kv_index(inputs, 0, key, 7, true);
            inputs.v.data_mut()[i] = f32::NAN;
        }
        // Rows 0..=20 see key 0..20 only under the window... key 0 is outside
        // the window of rows past 20, and inside for the first ones.
    });
    // Decoding steps (1, 2 and 5 queries read K and V in place; one or two
    // rows a unit check their sums after each tile): a NaN or infinite value
    // at a masked key takes no part, at an attended one it reaches every row.
    for (q_len, kv_heads) in [(1, 4), (1, 2), (2, 2), (5, 2)] {
        let case = CaseSpec::new("nan-v-decode", [2, 4, kv_heads], [q_len, 300], [16, 16])
            .mask(MaskForm::Bool(1));
        check_edited(
            &format!("nan-v-decode-masked-{q_len}-of-{kv_heads}"),
            case.clone(),
            false,
            |inputs| {
                if let Some(HostMask::Bool { data, .. }) = &mut inputs.mask {
                    data[10] = false;
                    data[11] = false;
                }
                let i = kv_index(inputs, 1, 10, 5, true);
                inputs.v.data_mut()[i] = f32::NAN;
                let i = kv_index(inputs, 1, 11, 2, true);
                inputs.v.data_mut()[i] = f32::INFINITY;
            },
        );
        check_edited(
            &format!("nan-v-decode-attended-{q_len}-of-{kv_heads}"),
            case,
            true,
            |inputs| {
                if let Some(HostMask::Bool { data, .. }) = &mut inputs.mask {
                    data[200] = true;
                }
                let i = kv_index(inputs, 1, 200, 5, true);
                inputs.v.data_mut()[i] = f32::NAN;
            },
        );
    }
    // Infinite values at attended keys with real probability: inf (or NaN
    // where +inf meets -inf), as the oracle says.
    let case = long("inf-v").with(|o| o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased));
    check_edited("inf-v", case, false, |inputs| {
        let i = kv_index(inputs, 0, 5, 2, true);
        inputs.v.data_mut()[i] = f32::INFINITY;
        let i = kv_index(inputs, 0, 6, 3, true);
        inputs.v.data_mut()[i] = f32::NEG_INFINITY;
    });
}

#[test]
fn non_finite_keys_and_queries() {
    // A NaN in K poisons every row that attends the key; masked, it is ignored.
    let case = long("nan-k").mask(MaskForm::Bool(2)).with(|o| {
        o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
    });
    check_edited("nan-k", case, true, |inputs| {
        let i = kv_index(inputs, 0, 77, 1, false);
        inputs.k.data_mut()[i] = f32::NAN;
    });
    // +inf in a key gives +inf scores (poisoned rows) for queries positive in
    // that component and -inf scores (probability 0, value still multiplied)
    // for negative ones.
    let case = long("inf-k").with(|o| o.is_causal = true);
    let case = CaseSpec { q_len: 300, ..case };
    check_edited("inf-k", case, true, |inputs| {
        let i = kv_index(inputs, 0, 40, 0, false);
        inputs.k.data_mut()[i] = f32::INFINITY;
    });
    // Every attended score -inf: a NaN row. Query row 3 of head 0 is
    // (-inf, 0, ...) and every key's first component is positive.
    let case = long("all-neg-inf").with(|o| {
        o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
    });
    check_edited("all-scores-neg-inf", case, true, |inputs| {
        let dk = 16;
        for key in 0..300 {
            let i = kv_index(inputs, 0, key, 0, false);
            inputs.k.data_mut()[i] = inputs.k.data()[i].abs() + 0.5;
        }
        let row = &mut inputs.q.data_mut()[3 * dk..4 * dk];
        row.fill(0.0);
        row[0] = f32::NEG_INFINITY;
    });
    // -inf scores at some attended keys only: probability 0 there, a NaN
    // value at such a key still poisons the row (0 · NaN).
    let case = long("neg-inf-score-nan-v");
    check_edited("neg-inf-score-nan-v", case, true, |inputs| {
        let dk = 16;
        let q = &mut inputs.q.data_mut()[7 * dk..8 * dk];
        q[0] = 1.0;
        for key in [0, 200] {
            let i = kv_index(inputs, 0, key, 0, false);
            inputs.k.data_mut()[i] = f32::NEG_INFINITY;
        }
        let i = kv_index(inputs, 0, 200, 4, true);
        inputs.v.data_mut()[i] = f32::NAN;
    });
    // NaN and inf queries in rows the mask empties: zero rows.
    let case =
        CaseSpec::new("nan-q-empty", [2, 2, 2], [70, 150], [16, 8]).mask(MaskForm::EmptyRows);
    check_edited("nan-q-in-empty-rows", case, false, |inputs| {
        for head in 0..4 {
            for row in [1, 4, 67] {
                let i = (head * 70 + row) * 16;
                inputs.q.data_mut()[i] = f32::NAN;
                inputs.q.data_mut()[i + 3] = f32::INFINITY;
            }
        }
    });
}

#[test]
fn non_finite_mask_values() {
    // Float mask: -inf and -f32::MAX mask, NaN and +inf are added (poison).
    let case = long("float-mask").mask(MaskForm::Float(2)).with(|o| {
        o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased);
        o.softcap = 3.0;
        o.alibi = true;
    });
    check_edited("float-mask-nan-inf", case, true, |inputs| {
        if let Some(HostMask::Float(t)) = &mut inputs.mask {
            let t_len = 300;
            let d = t.data_mut();
            d[2 * t_len + 17] = f32::NAN;
            d[50 * t_len + 260] = f32::INFINITY;
            d[60 * t_len..61 * t_len].fill(-f32::MAX);
            d[61 * t_len..62 * t_len].fill(f32::NEG_INFINITY);
            d[62 * t_len + 5] = f32::MAX;
        }
    });
    // A row whose only kept mask values are -f32::MAX and -inf is empty: zeros.
    let case = long("max-mask").mask(MaskForm::Float(1));
    check_edited("mask-all-neg-max", case, false, |inputs| {
        if let Some(HostMask::Float(t)) = &mut inputs.mask {
            for (j, x) in t.data_mut().iter_mut().enumerate() {
                *x = if j % 2 == 0 {
                    -f32::MAX
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
    });
}

#[test]
fn bad_input_is_a_typed_error() {
    let engine = cpu_engine(None);
    let q = HostTensor::zeros([1, 3, 4, 8]).unwrap();
    let k = HostTensor::zeros([1, 2, 5, 8]).unwrap();
    let v = HostTensor::zeros([1, 2, 5, 8]).unwrap();
    let err = engine
        .attention_host_blocking(&AttentionInputs::new(&q, &k, &v), &Default::default())
        .unwrap_err();
    assert!(matches!(err, webattn::Error::GqaHeads { .. }), "{err}");
    let k = HostTensor::zeros([1, 3, 5, 8]).unwrap();
    let v = HostTensor::zeros([1, 3, 5, 8]).unwrap();
    let mask = HostMask::bool([9], vec![true; 9]).unwrap();
    let err = engine
        .attention_host_blocking(
            &AttentionInputs::new(&q, &k, &v).with_mask(&mask),
            &Default::default(),
        )
        .unwrap_err();
    assert!(matches!(err, webattn::Error::Broadcast { .. }), "{err}");
    let options = AttentionOptions {
        temperature: 0.0,
        ..Default::default()
    };
    let err = engine
        .attention_host_blocking(&AttentionInputs::new(&q, &k, &v), &options)
        .unwrap_err();
    assert!(matches!(err, webattn::Error::InvalidOption { .. }), "{err}");
}
