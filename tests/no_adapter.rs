//! With no adapter, a GPU request is a typed error and the default engine falls
//! back to the CPU backend and says so. Its own test binary, because it points
//! `WGPU_BACKEND` at a backend this platform lacks.

use webattn::{
    AttentionInputs, AttentionOptions, BackendKind, BackendPreference, Engine, EngineOptions,
    Error, HostTensor,
};

#[test]
fn no_adapter_means_cpu_backend() {
    // Metal does not exist on Linux or Windows, and this build has no Metal on them either;
    // on macOS point at DX12 instead.
    let missing = if cfg!(target_os = "macos") {
        "dx12"
    } else {
        "metal"
    };
    std::env::set_var("WGPU_BACKEND", missing);
    std::env::remove_var("WGPU_ADAPTER_NAME");

    let options = EngineOptions {
        backend: BackendPreference::Gpu,
        ..Default::default()
    };
    let err = Engine::with_options_blocking(options).unwrap_err();
    assert!(matches!(err, Error::NoAdapter(_)), "{err}");
    assert!(err.to_string().contains("CPU backend"), "{err}");

    let engine = Engine::new_blocking();
    assert_eq!(engine.backend(), BackendKind::Cpu);
    assert!(engine.describe().contains("CPU"));
    let q = HostTensor::new([1, 1, 2, 4], vec![0.5; 8]).unwrap();
    let out = engine
        .attention_host_blocking(
            &AttentionInputs::new(&q, &q, &q),
            &AttentionOptions::default(),
        )
        .unwrap();
    assert_eq!(out.y.data(), &[0.5; 8]);
}
