//! The engine under faults: a lost device (the call in flight fails with a
//! typed error, the next call runs on a fresh device, tensors of the lost
//! device say they are gone), an allocation beyond the device's memory (a
//! typed out-of-memory error, the engine stays usable), and one engine shared
//! by eight threads, every result checked against the oracle.

mod common;

use webattn::conformance::{CaseSpec, MaskForm, Oracle};
use webattn::family::mha::{MhaWeights, MultiHeadAttention};
use webattn::{
    AttentionInputs, AttentionOptions, BackendPreference, Engine, EngineOptions, Error, HostTensor,
    KernelPath,
};

fn gpu_engine() -> Option<Engine> {
    common::gpu()?;
    Some(
        Engine::with_options_blocking(EngineOptions {
            backend: BackendPreference::Gpu,
            ..Default::default()
        })
        .expect("a second GPU engine"),
    )
}

/// Runs `oracle`'s case on `engine` and fails unless it is within tolerance.
fn check(engine: &Engine, oracle: &Oracle, path: KernelPath) {
    let result = pollster::block_on(oracle.check(engine, path));
    common::print_result(&result);
    assert!(result.passed(), "{}: {:?}", result.name, result.failure);
}

#[test]
fn a_lost_device_fails_the_call_in_flight_and_the_next_call_recovers() {
    let Some(engine) = gpu_engine() else { return };
    let case = CaseSpec::new("after-loss", [1, 2, 1], [33, 33], [16, 16]).mask(MaskForm::Bool(2));
    let oracle = Oracle::new(&case, common::seed()).unwrap();
    check(&engine, &oracle, KernelPath::Fused);
    assert_eq!(engine.device_generation(), Some(0));

    // Work in flight when the device goes: its readback fails with DeviceLost.
    let inputs = &oracle.inputs;
    let (q, k, v) = (
        engine.upload(&inputs.q).unwrap(),
        engine.upload(&inputs.k).unwrap(),
        engine.upload(&inputs.v).unwrap(),
    );
    let out = engine
        .attention_blocking(
            &AttentionInputs::new(&q, &k, &v),
            &AttentionOptions::default(),
        )
        .unwrap();
    // The clock guard's setting is the device's; the fresh one keeps it.
    engine.gpu().expect("gpu").set_clock_guard(Some(false));
    engine.gpu().expect("gpu").destroy_device();
    let lost = engine.download_blocking(&out.y).unwrap_err();
    assert!(matches!(lost, Error::DeviceLost(_)), "{lost}");
    assert!(
        lost.to_string().contains("continues on a fresh device"),
        "{lost}"
    );
    // A synchronous upload cannot make a device; it says what happened.
    assert!(matches!(
        engine.upload(&inputs.q),
        Err(Error::DeviceLost(_))
    ));

    // The next call runs on a fresh device, within tolerance of the oracle.
    check(&engine, &oracle, KernelPath::Fused);
    check(&engine, &oracle, KernelPath::Unfused);
    assert_eq!(engine.device_generation(), Some(1));
    assert_eq!(
        engine.gpu().expect("gpu").clock_guard_setting(),
        Some(false)
    );

    // Tensors of the lost device report that they are gone, by name.
    let gone = engine.download_blocking(&q).unwrap_err();
    assert_eq!(gone, Error::TensorLost { tensor: "tensor" });
    let gone = engine
        .attention_blocking(
            &AttentionInputs::new(&q, &k, &v),
            &AttentionOptions::default(),
        )
        .unwrap_err();
    assert_eq!(gone, Error::TensorLost { tensor: "Q" });
    assert!(gone.to_string().contains("upload it again"), "{gone}");
    // Tensors uploaded now work.
    let q2 = engine.upload(&inputs.q).unwrap();
    let y = engine
        .attention_blocking(
            &AttentionInputs::new(&q2, &q2, &q2),
            &AttentionOptions::default(),
        )
        .and_then(|out| engine.download_blocking(&out.y))
        .unwrap();
    assert!(y.data().iter().all(|x| x.is_finite()));
}

#[test]
fn the_family_recovers_too() {
    let Some(engine) = gpu_engine() else { return };
    let mha =
        MultiHeadAttention::new(MhaWeights::random(32, 32, 4, 2, 8, 7).unwrap(), 4, 2).unwrap();
    let x = HostTensor::new(
        [1, 5, 32],
        (0..160).map(|i| (i as f32 * 0.37).sin()).collect(),
    )
    .unwrap();
    let options = AttentionOptions::default();
    let before = mha
        .forward_blocking(&engine, &x, None, &options, false)
        .unwrap();
    engine.gpu().expect("gpu").destroy_device();
    // The weights were uploaded to the lost device: they go up again.
    let after = mha
        .forward_blocking(&engine, &x, None, &options, false)
        .unwrap();
    assert_eq!(engine.device_generation(), Some(1));
    let worst = before
        .output
        .data()
        .iter()
        .zip(after.output.data())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("MHA before and after the loss: max |diff| = {worst:.2e}");
    assert!(worst <= 1e-6, "{worst}");
}

#[test]
fn an_engine_on_a_callers_context_says_it_cannot_recover() {
    let Some(shared) = common::gpu() else { return };
    let ctx = pollster::block_on(webattn::GpuContext::request(Default::default())).unwrap();
    let engine = Engine::from_context(ctx);
    let q = HostTensor::zeros([1, 1, 4, 8]).unwrap();
    engine.gpu().expect("gpu").destroy_device();
    let err = engine
        .attention_host_blocking(
            &AttentionInputs::new(&q, &q, &q),
            &AttentionOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::DeviceLost(_)), "{err}");
    assert!(
        err.to_string().contains("cannot make another device"),
        "{err}"
    );
    // Other engines are not affected.
    assert!(shared
        .attention_host_blocking(
            &AttentionInputs::new(&q, &q, &q),
            &AttentionOptions::default()
        )
        .is_ok());
}

#[test]
fn one_engine_serves_eight_threads() {
    fn shared<T: Send + Sync>(_: &T) {}
    let Some(engine) = common::gpu() else { return };
    shared(engine);
    let cases: Vec<CaseSpec> = (0..8)
        .map(|t| {
            let n = [1, 7, 33, 97, 64, 129, 5, 200][t];
            let case = CaseSpec::new(
                format!("thread{t}"),
                [1 + t % 2, 2 * (1 + t % 3), 1 + t % 3 / 2],
                [n, n + t],
                [8 * (1 + t % 4), 8],
            )
            .with(|o| o.is_causal = t % 2 == 0);
            match t % 4 {
                1 => case.mask(MaskForm::Bool(2)),
                2 => case.mask(MaskForm::Float(4)),
                _ => case,
            }
        })
        .collect();
    let oracles: Vec<Oracle> = cases
        .iter()
        .enumerate()
        .map(|(t, c)| Oracle::new(c, common::seed() + t as u64).unwrap())
        .collect();
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = oracles
            .iter()
            .enumerate()
            .map(|(t, oracle)| {
                scope.spawn(move || {
                    let path = [KernelPath::Fused, KernelPath::Unfused][t % 2];
                    (0..3)
                        .map(|_| pollster::block_on(oracle.check(engine, path)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("no thread panics"))
            .collect::<Vec<_>>()
    });
    for r in &results {
        common::print_result(r);
    }
    assert_eq!(results.len(), 24);
    let failed: Vec<_> = results
        .iter()
        .filter(|r| !r.passed())
        .map(|r| &r.name)
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
}

/// Out of memory, in a child process whose address space is limited: on a
/// CPU adapter (lavapipe) device memory is host memory, so the limit makes a
/// large allocation fail as a real device would when its memory is full.
#[test]
#[cfg(target_os = "linux")]
fn an_allocation_beyond_memory_is_a_typed_error_and_the_engine_stays_usable() {
    if common::gpu().is_none() {
        return;
    }
    if std::env::var_os("WEBATTN_OOM_CHILD").is_some() {
        return oom_child();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "an_allocation_beyond_memory_is_a_typed_error_and_the_engine_stays_usable",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("WEBATTN_OOM_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the child failed");
    assert!(
        stdout.contains("out of memory: ") || stdout.contains("not a CPU adapter"),
        "{stdout}"
    );
}

#[cfg(target_os = "linux")]
fn oom_child() {
    let engine = common::gpu().unwrap();
    let caps = engine.capabilities().unwrap();
    if caps.adapter.device_type != "Cpu" {
        println!("not a CPU adapter: an address-space limit does not bound its memory");
        return;
    }
    // Warm up (pipelines compiled) and check a small call before the limit.
    let case = CaseSpec::new("small", [1, 2, 1], [17, 17], [8, 8]).with(|o| o.is_causal = true);
    let oracle = Oracle::new(&case, common::seed()).unwrap();
    check(engine, &oracle, KernelPath::Fused);

    // 112 MiB of values, prepared before the limit.
    let elems = (112 << 20) / 4;
    let big = HostTensor::new([1, 1, elems / 64, 64], vec![0.5; elems]).unwrap();
    let used = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u64>().ok())
        })
        .expect("/proc/self/statm")
        * 4096;
    let limit = used + (96 << 20);
    let rlimit = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid rlimit struct; it changes only this process.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rlimit) }, 0);

    match engine.upload(&big) {
        Err(e @ Error::OutOfMemory(_)) => println!("out of memory: {e}"),
        other => panic!(
            "expected OutOfMemory, got {:?}",
            other.map(|t| t.shape().to_vec())
        ),
    }
    drop(big);
    // The engine stays usable.
    check(engine, &oracle, KernelPath::Fused);
    check(engine, &oracle, KernelPath::Unfused);
}
