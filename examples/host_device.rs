//! Attention inside a wgpu program of your own: the program opens its device,
//! fills Q, K and V with a compute pass of its own, and records the engine's
//! attention after that pass in the same command encoder, into a Y buffer of
//! the program's own: one submission, no copy of the inputs, and the program
//! reads Y back itself. The result is checked against the f64 oracle.
//!
//! ```sh
//! cargo run --release --example host_device
//! ```

use webattn::conformance::compare;
use webattn::{AttentionInputs, AttentionOptions, DType, Engine, HostTensor};

/// The program's own kernel: value i of a buffer from an integer hash, so the
/// host can make the same f32 values bit for bit.
const FILL: &str = r#"
struct Fill { len: u32, seed: u32 }
@group(0) @binding(0) var<uniform> fill: Fill;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

fn hash(x: u32) -> u32 {
    var h = x * 747796405u + 2891336453u;
    h = ((h >> ((h >> 28u) + 4u)) ^ h) * 277803737u;
    return (h >> 22u) ^ h;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < fill.len) {
        out[id.x] = f32(hash(id.x ^ fill.seed) >> 8u) / 16777216.0 * 2.0 - 1.0;
    }
}
"#;

fn hash(x: u32) -> u32 {
    let h = x.wrapping_mul(747796405).wrapping_add(2891336453);
    let h = ((h >> ((h >> 28) + 4)) ^ h).wrapping_mul(277803737);
    (h >> 22) ^ h
}

fn host_fill(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| (hash(i ^ seed) >> 8) as f32 / 16777216.0 * 2.0 - 1.0)
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The program's device, made as any wgpu program makes one.
    let instance = wgpu::Instance::default();
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))?;
    let (device, queue) = pollster::block_on(adapter.request_device(&Default::default()))?;
    println!("adapter: {}", adapter.get_info().name);

    let (batch, heads, kv_heads, seq, dim) = (1usize, 8usize, 2usize, 97usize, 64usize);
    let q_shape = [batch, heads, seq, dim];
    let kv_shape = [batch, kv_heads, seq, dim];
    let buffer = |label: &str, len: usize| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (len * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    };
    let lens = [
        q_shape.iter().product(),
        kv_shape.iter().product(),
        kv_shape.iter().product(),
    ];
    let buffers = [
        buffer("Q", lens[0]),
        buffer("K", lens[1]),
        buffer("V", lens[2]),
    ];

    // The program's own compute pass fills them.
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("fill"),
        source: wgpu::ShaderSource::Wgsl(FILL.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("fill"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    let mut params = Vec::new();
    for (i, (b, &len)) in buffers.iter().zip(&lens).enumerate() {
        let words = [len as u32, 1000 * (i as u32 + 1)];
        let uniform = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("fill params"),
            size: 8,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        queue.write_buffer(&uniform, 0, bytemuck::cast_slice(&words));
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("fill"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: uniform.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: b.as_entire_binding(),
                },
            ],
        });
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(len.div_ceil(64) as u32, 1, 1);
        drop(pass);
        params.push(uniform);
    }

    // The engine on the same device, reading the program's buffers in place,
    // recorded after the fill in the same encoder.
    let engine = Engine::from_wgpu(&adapter, device.clone(), queue.clone())?;
    let [q, k, v] = [
        engine.wrap_buffer(buffers[0].clone(), &q_shape, DType::F32)?,
        engine.wrap_buffer(buffers[1].clone(), &kv_shape, DType::F32)?,
        engine.wrap_buffer(buffers[2].clone(), &kv_shape, DType::F32)?,
    ];
    let options = AttentionOptions {
        is_causal: true,
        ..Default::default()
    };
    let inputs = AttentionInputs::new(&q, &k, &v);
    let prepared = engine.prepare(&webattn::validate(&inputs, &options)?, &options)?;
    // Y goes into the program's own buffer, which it reads back itself.
    let y_buffer = buffer("Y", lens[0]);
    let readback = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("Y readback"),
        size: y_buffer.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let outputs = webattn::AttentionOutputs {
        y: engine.wrap_buffer(y_buffer.clone(), &q_shape, DType::F32)?,
        present_key: None,
        present_value: None,
        qk_matmul_output: None,
        lse: None,
    };
    prepared.record_into_blocking(&engine, &mut encoder, &inputs, &outputs)?;
    encoder.copy_buffer_to_buffer(&y_buffer, 0, &readback, 0, y_buffer.size());
    queue.submit([encoder.finish()]);
    readback
        .slice(..)
        .map_async(wgpu::MapMode::Read, |mapped| mapped.expect("Y maps"));
    device.poll(wgpu::PollType::wait_indefinitely())?;
    let y: Vec<f32> = bytemuck::cast_slice(&readback.slice(..).get_mapped_range()?).to_vec();

    // The same values on the host, and the oracle.
    let host = |shape: [usize; 4], i: u32| {
        HostTensor::new(shape, host_fill(shape.iter().product(), 1000 * (i + 1)))
    };
    let (qh, kh, vh) = (host(q_shape, 0)?, host(kv_shape, 1)?, host(kv_shape, 2)?);
    let host_inputs = AttentionInputs::new(&qh, &kh, &vh);
    let exact = webattn::cpu::attention_exact(&host_inputs, &options)?;
    let plain = webattn::cpu::attention_plain_f32(&host_inputs, &options)?;
    let report = compare(&y, &exact.y, &plain.y, 1e-6);
    println!(
        "shapes:  Q {q_shape:?}, K/V {kv_shape:?}, causal; filled by the program's own pass, \
         attention recorded after it in one encoder into the program's Y, one submission"
    );
    println!(
        "error:   worst |GPU - f64 oracle| = {:.3e} in Y (allowed {:.3e}): {}",
        report.max_abs,
        report.allowed,
        if report.passed() { "PASS" } else { "FAIL" }
    );
    if !report.passed() {
        return Err("the recorded call missed the oracle".into());
    }
    Ok(())
}
