//! Probes an adapter's cooperative matrices (wgpu's experimental feature)
//! with the operations the matrix-unit kernels are built from, one at a time:
//! loads and stores between storage, workgroup memory and 16x16 matrices,
//! products against the identity, zero accumulators, strided layouts, two
//! subgroups. Each probe runs twice, as WGSL compiled by wgpu and as the
//! engine's own SPIR-V (`webattn::device::spirv`, through wgpu's passthrough),
//! and prints its worst error against what it should give.
//!
//! `cargo run --release --example coop_probe [throughput]` (Vulkan adapters
//! with 16x16x16 f16 -> f32 matrices; `.ci/lavapipe-coop run` offers only
//! 8x8). With `throughput`, only the throughput kernels run.

use wgpu::util::DeviceExt;

const HEADER: &str = "enable f16;
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> inp: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
alias MatA = coop_mat16x16<f16, A>;
alias MatB = coop_mat16x16<f16, B>;
alias MatC = coop_mat16x16<f32, C>;
";

/// One probe: its WGSL body, its workgroup's invocations, and what `out`
/// must hold given `inp`.
struct Probe {
    name: &'static str,
    body: &'static str,
    expected: fn(&[f32]) -> Vec<f32>,
}

fn f16r(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

fn first(inp: &[f32], n: usize) -> Vec<f32> {
    inp[..n].to_vec()
}

/// C = A B for row-major 16x16 f16-rounded A = inp[0..256], B = inp[256..512].
fn product(inp: &[f32]) -> Vec<f32> {
    let mut c = vec![0.0f32; 256];
    for r in 0..16 {
        for col in 0..16 {
            let mut s = 0.0f64;
            for k in 0..16 {
                s += f16r(inp[r * 16 + k]) as f64 * f16r(inp[256 + k * 16 + col]) as f64;
            }
            c[r * 16 + col] = s as f32;
        }
    }
    c
}

fn probes() -> Vec<Probe> {
    vec![
        Probe {
            name: "storage C load, storage store",
            body: "@compute @workgroup_size(32)
fn main() {
    let m = coopLoadT<MatC>(&inp[0], 16u);
    coopStoreT(m, &out[0], 16u);
}",
            expected: |i| first(i, 256),
        },
        Probe {
            name: "workgroup C load",
            body: "var<workgroup> w: array<f32, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) { w[i] = inp[i]; }
    workgroupBarrier();
    let m = coopLoadT<MatC>(&w[0], 16u);
    coopStoreT(m, &out[0], 16u);
}",
            expected: |i| first(i, 256),
        },
        Probe {
            name: "workgroup C load after a u32 variable",
            body: "var<workgroup> flag: u32;
var<workgroup> w: array<f32, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    if (li == 0u) { flag = 7u; }
    for (var i = li; i < 256u; i += 32u) { w[i] = inp[i]; }
    workgroupBarrier();
    let m = coopLoadT<MatC>(&w[0], 16u);
    coopStoreT(m, &out[0], 16u);
    if (li == 0u) { out[256] = f32(workgroupUniformLoad(&flag)); }
}",
            expected: |i| {
                let mut v = first(i, 256);
                v.push(7.0);
                v
            },
        },
        Probe {
            name: "workgroup C store, scalar read",
            body: "var<workgroup> w: array<f32, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    let m = coopLoadT<MatC>(&inp[0], 16u);
    coopStoreT(m, &w[0], 16u);
    workgroupBarrier();
    for (var i = li; i < 256u; i += 32u) { out[i] = w[i]; }
}",
            expected: |i| first(i, 256),
        },
        Probe {
            name: "A (workgroup f16) x identity, zero C constructed",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = select(f16(0.0), f16(1.0), i / 16u == i % 16u);
    }
    workgroupBarrier();
    let c = coopMultiplyAdd(coopLoadT<MatA>(&a[0], 16u), coopLoadT<MatB>(&b[0], 16u), MatC());
    coopStoreT(c, &out[0], 16u);
}",
            expected: |i| i[..256].iter().map(|&x| f16r(x)).collect(),
        },
        Probe {
            name: "A (workgroup f16) x identity, zero C loaded from workgroup",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
var<workgroup> z: array<f32, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = select(f16(0.0), f16(1.0), i / 16u == i % 16u);
        z[i] = 0.0;
    }
    workgroupBarrier();
    let c = coopMultiplyAdd(coopLoadT<MatA>(&a[0], 16u), coopLoadT<MatB>(&b[0], 16u), coopLoadT<MatC>(&z[0], 16u));
    coopStoreT(c, &out[0], 16u);
}",
            expected: |i| i[..256].iter().map(|&x| f16r(x)).collect(),
        },
        Probe {
            name: "A x B, both workgroup f16, row strides 40 and 72 (gemm_coop's)",
            body: "var<workgroup> a: array<f16, 640>;
var<workgroup> b: array<f16, 1152>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) {
        a[(i / 16u) * 40u + 16u + i % 16u] = f16(inp[i]);
        b[(i / 16u) * 72u + 32u + i % 16u] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    let c = coopMultiplyAdd(coopLoadT<MatA>(&a[16], 40u), coopLoadT<MatB>(&b[32], 72u), MatC());
    coopStoreT(c, &out[0], 16u);
}",
            expected: product,
        },
        Probe {
            name: "A x B from storage f32 via f16 workgroup, 4 subgroups each its own copy",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
@compute @workgroup_size(128)
fn main(@builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32) {
    for (var i = li; i < 256u; i += 128u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    let c = coopMultiplyAdd(coopLoadT<MatA>(&a[0], 16u), coopLoadT<MatB>(&b[0], 16u), MatC());
    coopStoreT(c, &out[sg * 256u], 16u);
}",
            expected: |i| {
                let p = product(i);
                let mut v = Vec::new();
                for _ in 0..4 {
                    v.extend_from_slice(&p);
                }
                v
            },
        },
        Probe {
            name: "loop-carried accumulator (var, constant bound 2)",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    var acc = MatC();
    for (var s = 0u; s < 2u; s++) {
        acc = coopMultiplyAdd(coopLoadT<MatA>(&a[0], 16u), coopLoadT<MatB>(&b[0], 16u), acc);
    }
    coopStoreT(acc, &out[0], 16u);
}",
            expected: |i| product(i).iter().map(|x| 2.0 * x).collect(),
        },
        Probe {
            name: "two accumulators copied from one, bound from workgroupUniformLoad, restaged each step",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
var<workgroup> count: u32;
var<workgroup> z: array<f32, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    if (li == 0u) { count = u32(inp[2u] + 12.0) - 4u; }
    for (var i = li; i < 256u; i += 32u) { z[i] = 0.0; }
    workgroupBarrier();
    var acc0 = coopLoadT<MatC>(&z[0], 16u);
    var acc1 = acc0;
    let n = workgroupUniformLoad(&count);
    for (var s = 0u; s < n; s++) {
        for (var i = li; i < 256u; i += 32u) {
            a[i] = f16(inp[i]);
            b[i] = f16(inp[256u + i]);
        }
        workgroupBarrier();
        let x = coopLoadT<MatA>(&a[0], 16u);
        acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
        acc1 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc1);
        workgroupBarrier();
    }
    coopStoreT(acc0, &out[0], 16u);
    coopStoreT(acc1, &out[256], 16u);
}",
            // inp[2] = 6.5: n = 18 - 4 = 14 steps
            expected: |i| {
                let n = (i[2] + 12.0) as u32 - 4;
                let p: Vec<f32> = product(i).iter().map(|x| n as f32 * x).collect();
                [p.clone(), p].concat()
            },
        },
        Probe {
            name: "V8 one MatC() accumulator, constant bound 14",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    var acc0 = MatC();
    for (var s = 0u; s < 14u; s++) {
        let x = coopLoadT<MatA>(&a[0], 16u);
        acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
    }
    coopStoreT(acc0, &out[0], 16u);
}",
            expected: |i| { let p: Vec<f32> = product(i).iter().map(|x| 14.0 * x).collect(); [p.clone()].concat() },
        },
        Probe {
            name: "V1 two MatC() accumulators, constant bound 14, A reused",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    var acc0 = MatC();
    var acc1 = MatC();
    for (var s = 0u; s < 14u; s++) {
        let x = coopLoadT<MatA>(&a[0], 16u);
        acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
        acc1 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc1);
    }
    coopStoreT(acc0, &out[0], 16u);
    coopStoreT(acc1, &out[256], 16u);
}",
            expected: |i| { let p: Vec<f32> = product(i).iter().map(|x| 14.0 * x).collect(); [p.clone(), p.clone()].concat() },
        },
        Probe {
            name: "V2 acc1 copied from acc0, constant bound 14",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    var acc0 = MatC();
    var acc1 = acc0;
    for (var s = 0u; s < 14u; s++) {
        let x = coopLoadT<MatA>(&a[0], 16u);
        acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
        acc1 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc1);
    }
    coopStoreT(acc0, &out[0], 16u);
    coopStoreT(acc1, &out[256], 16u);
}",
            expected: |i| { let p: Vec<f32> = product(i).iter().map(|x| 14.0 * x).collect(); [p.clone(), p.clone()].concat() },
        },
        Probe {
            name: "V3 one accumulator, bound from workgroupUniformLoad",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
var<workgroup> count: u32;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    if (li == 0u) { count = 14u; }
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    var acc0 = MatC();
    let n = workgroupUniformLoad(&count);
    for (var s = 0u; s < n; s++) {
        let x = coopLoadT<MatA>(&a[0], 16u);
        acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
    }
    coopStoreT(acc0, &out[0], 16u);
}",
            expected: |i| { let p: Vec<f32> = product(i).iter().map(|x| 14.0 * x).collect(); [p.clone()].concat() },
        },
        Probe {
            name: "V3b as V3, the u32 in a 16-byte array",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
var<workgroup> count: array<u32, 4>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    if (li == 0u) { count[0] = 14u; }
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    var acc0 = MatC();
    let n = workgroupUniformLoad(&count[0]);
    for (var s = 0u; s < n; s++) {
        let x = coopLoadT<MatA>(&a[0], 16u);
        acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
    }
    coopStoreT(acc0, &out[0], 16u);
}",
            expected: |i| { let p: Vec<f32> = product(i).iter().map(|x| 14.0 * x).collect(); [p.clone()].concat() },
        },
        Probe {
            name: "V6 one accumulator, bound from arrayLength",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    var acc0 = MatC();
    let n = arrayLength(&inp) / 512u * 14u;
    for (var s = 0u; s < n; s++) {
        let x = coopLoadT<MatA>(&a[0], 16u);
        acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
    }
    coopStoreT(acc0, &out[0], 16u);
}",
            expected: |i| { let p: Vec<f32> = product(i).iter().map(|x| 14.0 * x).collect(); [p.clone()].concat() },
        },
        Probe {
            name: "V4 one accumulator, constant bound 14, restaged with barriers",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    var acc0 = MatC();
    for (var s = 0u; s < 14u; s++) {
        for (var i = li; i < 256u; i += 32u) {
            a[i] = f16(inp[i]);
            b[i] = f16(inp[256u + i]);
        }
        workgroupBarrier();
        let x = coopLoadT<MatA>(&a[0], 16u);
        acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
        workgroupBarrier();
    }
    coopStoreT(acc0, &out[0], 16u);
}",
            expected: |i| { let p: Vec<f32> = product(i).iter().map(|x| 14.0 * x).collect(); [p.clone()].concat() },
        },
        Probe {
            name: "V5 one accumulator loaded from workgroup zeros, constant bound 14",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
var<workgroup> z: array<f32, 256>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 256u; i += 32u) { z[i] = 0.0; }
    workgroupBarrier();
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
    }
    workgroupBarrier();
    var acc0 = coopLoadT<MatC>(&z[0], 16u);
    for (var s = 0u; s < 14u; s++) {
        let x = coopLoadT<MatA>(&a[0], 16u);
        acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
    }
    coopStoreT(acc0, &out[0], 16u);
}",
            expected: |i| { let p: Vec<f32> = product(i).iter().map(|x| 14.0 * x).collect(); [p.clone()].concat() },
        },
        Probe {
            name: "V9 one accumulator, product in the else branch of a workgroupUniformLoad flag, constant bound 14",
            body: "var<workgroup> a: array<f16, 256>;
var<workgroup> b: array<f16, 256>;
var<workgroup> z: array<f32, 256>;
var<workgroup> flag: u32;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    if (li == 0u) { flag = 0u; }
    for (var i = li; i < 256u; i += 32u) {
        a[i] = f16(inp[i]);
        b[i] = f16(inp[256u + i]);
        z[i] = 1.0;
    }
    workgroupBarrier();
    var acc0 = MatC();
    for (var s = 0u; s < 14u; s++) {
        let bad = workgroupUniformLoad(&flag) != 0u;
        if (select(false, bad, true)) {
            acc0 = acc0 + coopLoadT<MatC>(&z[0], 16u);
        } else {
            for (var kk = 0u; kk < 32u; kk += 16u) {
                let x = coopLoadT<MatA>(&a[0], 16u);
                acc0 = coopMultiplyAdd(x, coopLoadT<MatB>(&b[0], 16u), acc0);
            }
        }
        workgroupBarrier();
    }
    coopStoreT(acc0, &out[0], 16u);
}",
            expected: |i| product(i).iter().map(|x| 28.0 * x).collect(),
        },
    ]
}

/// Throughput kernels: `REGISTERS` multiplies matrices held in registers, the
/// other loads its operands from workgroup memory for each 2 x 2 block of
/// products, as gemm_coop does.
const THROUGHPUT_REGISTERS: &str = "var<workgroup> a: array<f16, 1024>;
var<workgroup> b: array<f16, 1024>;
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32) {
    for (var i = li; i < 1024u; i += 128u) {
        a[i] = f16(inp[i % 512u] * 0.001);
        b[i] = f16(inp[(i + 7u) % 512u] * 0.001);
    }
    workgroupBarrier();
    let x = coopLoadT<MatA>(&a[sg * 256u], 16u);
    let y = coopLoadT<MatB>(&b[sg * 256u], 16u);
    var c0 = MatC();
    var c1 = MatC();
    var c2 = MatC();
    var c3 = MatC();
    for (var i = 0u; i < 2048u; i++) {
        c0 = coopMultiplyAdd(x, y, c0);
        c1 = coopMultiplyAdd(x, y, c1);
        c2 = coopMultiplyAdd(x, y, c2);
        c3 = coopMultiplyAdd(x, y, c3);
    }
    coopStoreT(c0 + c1 + c2 + c3, &out[(wid.x * 4u + sg) * 256u], 16u);
}";

const THROUGHPUT_SHARED: &str = "var<workgroup> a: array<f16, 4096>;
var<workgroup> b: array<f16, 4096>;
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32) {
    for (var i = li; i < 4096u; i += 128u) {
        a[i] = f16(inp[i % 512u] * 0.001);
        b[i] = f16(inp[(i + 7u) % 512u] * 0.001);
    }
    workgroupBarrier();
    var c0 = MatC();
    var c1 = MatC();
    var c2 = MatC();
    var c3 = MatC();
    for (var i = 0u; i < 2048u; i++) {
        let at = ((i + sg) % 8u) * 512u;
        let x0 = coopLoadT<MatA>(&a[at], 32u);
        let x1 = coopLoadT<MatA>(&a[at + 16u], 32u);
        let y0 = coopLoadT<MatB>(&b[at], 32u);
        let y1 = coopLoadT<MatB>(&b[at + 16u], 32u);
        c0 = coopMultiplyAdd(x0, y0, c0);
        c1 = coopMultiplyAdd(x0, y1, c1);
        c2 = coopMultiplyAdd(x1, y0, c2);
        c3 = coopMultiplyAdd(x1, y1, c3);
    }
    coopStoreT(c0 + c1 + c2 + c3, &out[(wid.x * 4u + sg) * 256u], 16u);
}";

/// THROUGHPUT_SHARED with a workgroup barrier after each step's products.
const THROUGHPUT_SHARED_BARRIER: &str = "var<workgroup> a: array<f16, 4096>;
var<workgroup> b: array<f16, 4096>;
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32) {
    for (var i = li; i < 4096u; i += 128u) {
        a[i] = f16(inp[i % 512u] * 0.001);
        b[i] = f16(inp[(i + 7u) % 512u] * 0.001);
    }
    workgroupBarrier();
    var c0 = MatC();
    var c1 = MatC();
    var c2 = MatC();
    var c3 = MatC();
    for (var i = 0u; i < 2048u; i++) {
        let at = ((i + sg) % 8u) * 512u;
        let x0 = coopLoadT<MatA>(&a[at], 32u);
        let x1 = coopLoadT<MatA>(&a[at + 16u], 32u);
        let y0 = coopLoadT<MatB>(&b[at], 32u);
        let y1 = coopLoadT<MatB>(&b[at + 16u], 32u);
        c0 = coopMultiplyAdd(x0, y0, c0);
        c1 = coopMultiplyAdd(x0, y1, c1);
        c2 = coopMultiplyAdd(x1, y0, c2);
        c3 = coopMultiplyAdd(x1, y1, c3);
        workgroupBarrier();
    }
    coopStoreT(c0 + c1 + c2 + c3, &out[(wid.x * 4u + sg) * 256u], 16u);
}";

/// gemm_coop's K loop, step by step: per step a 64 x 32 slice of A and a
/// 32 x 64 slice of B are staged as f16 in workgroup memory (rows padded to
/// 40 and 72, 16 values of each per invocation), a barrier, each subgroup's
/// 2 x 2 blocks of C take two 16-deep products each (8 products), a barrier.
/// `@VALUE` is where the staged values come from (an expression of `e`, the
/// value's index in the slice, and `i`, the step); `@GATE` what precedes the
/// products. 512 steps.
const THROUGHPUT_STAGED: &str = "var<workgroup> a: array<f16, 2560>;
var<workgroup> b: array<f16, 2304>;
var<workgroup> flag: array<u32, 4>;
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32, @builtin(subgroup_id) sg: u32) {
    if (li == 0u) { flag[0] = 0u; }
    let r0 = (sg / 2u) * 32u;
    let c0 = (sg % 2u) * 32u;
    var acc0 = MatC();
    var acc1 = MatC();
    var acc2 = MatC();
    var acc3 = MatC();
    for (var i = 0u; i < 512u; i++) {
        for (var j = 0u; j < 16u; j++) {
            let e = li * 16u + j;
            a[(e / 32u) * 40u + e % 32u] = f16(@VALUE);
            b[(e / 64u) * 72u + e % 64u] = f16(@VALUE * 0.5);
        }
        workgroupBarrier();
        @GATE {
            for (var kk = 0u; kk < 32u; kk += 16u) {
                let x0 = coopLoadT<MatA>(&a[r0 * 40u + kk], 40u);
                let x1 = coopLoadT<MatA>(&a[(r0 + 16u) * 40u + kk], 40u);
                let y0 = coopLoadT<MatB>(&b[kk * 72u + c0], 72u);
                let y1 = coopLoadT<MatB>(&b[kk * 72u + c0 + 16u], 72u);
                acc0 = coopMultiplyAdd(x0, y0, acc0);
                acc1 = coopMultiplyAdd(x0, y1, acc1);
                acc2 = coopMultiplyAdd(x1, y0, acc2);
                acc3 = coopMultiplyAdd(x1, y1, acc3);
            }
        }
        workgroupBarrier();
    }
    coopStoreT(acc0 + acc1 + acc2 + acc3, &out[(wid.x * 4u + sg) * 256u], 16u);
}";

/// The staged step's forms, each one change from the one before, so that the
/// one which costs the most shows: values from registers; from storage (the
/// 512-value input: always in cache), converted to f16; and the products
/// behind a workgroup-uniform flag (gemm_coop's test for a non-finite B).
fn staged_forms() -> Vec<(&'static str, String)> {
    let form = |value: &str, gate: &str| {
        THROUGHPUT_STAGED
            .replace("@VALUE", value)
            .replace("@GATE", gate)
    };
    vec![
        (
            "staged from registers, 2 barriers a step",
            form("f32((e + i) % 7u) * 0.01", "if (true)"),
        ),
        (
            "staged from storage (cached)",
            form("inp[(e + i * 7u) % 512u] * 0.001", "if (true)"),
        ),
        (
            "staged from storage, products behind a uniform flag",
            form(
                "inp[(e + i * 7u) % 512u] * 0.001",
                "if (workgroupUniformLoad(&flag[0]) == 0u)",
            ),
        ),
    ]
}

/// Times the throughput kernels: 16x16x16 products per second, as TFLOP/s.
/// From the products on registers to gemm_coop's staged K loop, one change
/// at a time (each as wgpu's SPIR-V and as the engine's): where the matrix
/// units' throughput goes between the probe and the kernels. Like the probes
/// above, they assume subgroups of 32 lanes (4 per workgroup of 128), as
/// NVIDIA's are; elsewhere only that they run is meaningful.
fn throughput(device: &wgpu::Device, queue: &wgpu::Queue, workgroups: usize) {
    let input: Vec<f32> = (0..512)
        .map(|i| ((i * 37) % 97) as f32 * 0.25 - 12.0)
        .collect();
    let mut kernels: Vec<(&str, String, f64)> = vec![
        ("registers", THROUGHPUT_REGISTERS.to_string(), 2048.0 * 4.0),
        (
            "workgroup loads",
            THROUGHPUT_SHARED.to_string(),
            2048.0 * 4.0,
        ),
        (
            "workgroup loads, a barrier a step",
            THROUGHPUT_SHARED_BARRIER.to_string(),
            2048.0 * 4.0,
        ),
    ];
    kernels.extend(
        staged_forms()
            .into_iter()
            .map(|(name, body)| (name, body, 512.0 * 8.0)),
    );
    for (name, body, per_subgroup) in kernels {
        let products = workgroups as f64 * 4.0 * per_subgroup;
        let flops = products * 2.0 * 16.0 * 16.0 * 16.0;
        let source = format!("{HEADER}{body}");
        for own in [false, true] {
            let how = if own { "own SPIR-V" } else { "wgpu WGSL " };
            match time_kernel(
                device,
                queue,
                &source,
                own,
                &input,
                workgroups * 4 * 256,
                workgroups as u32,
            ) {
                Ok(seconds) => println!(
                    "throughput {how} {name}: {:.3} ms per dispatch, {:.1} TFLOP/s f16 -> f32",
                    seconds * 1e3,
                    flops / seconds / 1e12
                ),
                Err(e) => println!("ERR throughput {how} {name}: {e}"),
            }
        }
    }
}

/// The engine's matrix-unit GEMM (`gemm_coop`) and its f32 GEMM on a few
/// shapes, each against an f64 product of the f16-rounded operands.
fn engine_gemms() {
    use webattn::kernels::gemm::{AValues, GemmKernel, GemmSpec};
    use webattn::run::single::gemm_host_variant;
    let engine = webattn::Engine::new_blocking();
    let Some(ctx) = engine.gpu() else {
        println!("engine: no GPU");
        return;
    };
    let Some(shape) = webattn::kernels::matrix_units::coop_shape(ctx.capabilities()) else {
        println!("engine: no matrix units planned on {}", engine.describe());
        return;
    };
    let cases = [
        (16, 16, 16, false, false),
        (16, 16, 16, false, true),
        (64, 64, 32, false, false),
        (1, 1, 8, false, true),
        (97, 33, 65, false, true),
        (130, 65, 97, true, false),
    ];
    for (m, n, k, ta, tb) in cases {
        let spec = GemmSpec::contiguous(1, m, n, k, ta, tb);
        let (a_len, b_len, c_len) = spec.extents();
        let a: Vec<f32> = (0..a_len)
            .map(|i| f16r(((i * 37) % 97) as f32 / 32.0 - 1.5))
            .collect();
        let b: Vec<f32> = (0..b_len)
            .map(|i| f16r(((i * 53) % 89) as f32 / 32.0 - 1.4))
            .collect();
        let c = vec![0.0f32; c_len];
        let at = |r: usize, kk: usize| if ta { a[kk * m + r] } else { a[r * k + kk] };
        let bt = |kk: usize, col: usize| if tb { b[col * k + kk] } else { b[kk * n + col] };
        let mut want = vec![0.0f32; m * n];
        for r in 0..m {
            for col in 0..n {
                want[r * n + col] = (0..k)
                    .map(|kk| at(r, kk) as f64 * bt(kk, col) as f64)
                    .sum::<f64>() as f32;
            }
        }
        for kernel in [GemmKernel::Coop(shape), GemmKernel::Tiled] {
            let got = pollster::block_on(gemm_host_variant(
                ctx,
                kernel,
                &spec,
                AValues::Any,
                &a,
                &b,
                &c,
            ));
            match got {
                Ok(got) => {
                    let worst = got
                        .iter()
                        .zip(&want)
                        .map(|(g, e)| {
                            if g.is_nan() {
                                f32::INFINITY
                            } else {
                                (g - e).abs()
                            }
                        })
                        .fold(0.0f32, f32::max);
                    let verdict = if worst <= 1e-2 { "ok  " } else { "BAD " };
                    println!("{verdict}engine {kernel:?} m{m} n{n} k{k} ta{} tb{}: worst error {worst:.3e}", ta as u8, tb as u8);
                    if worst > 1e-2 {
                        let bad: Vec<String> = got
                            .iter()
                            .zip(&want)
                            .enumerate()
                            .filter(|(_, (g, e))| {
                                (*g - *e).abs().is_nan() || (*g - *e).abs() > 1e-2
                            })
                            .take(10)
                            .map(|(i, (g, e))| format!("[{},{}] {g} vs {e}", i / n, i % n))
                            .collect();
                        println!("      {}", bad.join("; "));
                    }
                }
                Err(e) => println!("ERR engine {kernel:?} m{m} n{n} k{k}: {e}"),
            }
        }
    }
}

fn run(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    source: &str,
    own_spirv: bool,
    input: &[f32],
    out_len: usize,
) -> Result<Vec<f32>, String> {
    dispatch(device, queue, source, own_spirv, input, out_len, 1, 1).map(|(out, _)| out)
}

/// Seconds per dispatch of `workgroups` workgroups, the median of 5 runs of
/// 5 dispatches after a warm-up run.
fn time_kernel(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    source: &str,
    own_spirv: bool,
    input: &[f32],
    out_len: usize,
    workgroups: u32,
) -> Result<f64, String> {
    dispatch(
        device, queue, source, own_spirv, input, out_len, workgroups, 1,
    )?;
    let mut times = Vec::new();
    for _ in 0..5 {
        let (_, seconds) = dispatch(
            device, queue, source, own_spirv, input, out_len, workgroups, 5,
        )?;
        times.push(seconds / 5.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[2])
}

/// Runs `source` over `workgroups` workgroups `repeats` times in one
/// submission: `out`, and the seconds from submission to completion.
#[allow(clippy::too_many_arguments)]
fn dispatch(
    device: &wgpu::Device,
    queue: &wgpu::Queue,
    source: &str,
    own_spirv: bool,
    input: &[f32],
    out_len: usize,
    workgroups: u32,
    repeats: u32,
) -> Result<(Vec<f32>, f64), String> {
    let module = if own_spirv {
        let words = webattn::device::spirv::compile_wgsl(
            source,
            "main",
            &[],
            true,
            webattn::RuntimeChecks::On,
        )?;
        let entry = [wgpu::PassthroughShaderEntryPoint {
            name: "main".into(),
            workgroup_size: (0, 0, 0),
        }];
        // SAFETY: naga's validated translation, made stricter (device::spirv).
        unsafe {
            device.create_shader_module_passthrough(wgpu::ShaderModuleDescriptorPassthrough {
                label: Some("probe"),
                entry_points: entry[..].into(),
                spirv: Some(words.into()),
                ..Default::default()
            })
        }
    } else {
        device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("probe"),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        })
    };
    let entry = |binding, read_only| wgpu::BindGroupLayoutEntry {
        binding,
        visibility: wgpu::ShaderStages::COMPUTE,
        ty: wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        },
        count: None,
    };
    let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: None,
        entries: &[entry(0, true), entry(1, false)],
    });
    let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: None,
        bind_group_layouts: &[Some(&bgl)],
        immediate_size: 0,
    });
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("probe"),
        layout: Some(&layout),
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(e.to_string());
    }
    let inp = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(input),
        usage: wgpu::BufferUsages::STORAGE,
    });
    let size = (out_len * 4) as u64;
    let sentinel = vec![f32::NAN; out_len];
    let out = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&sentinel),
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &bgl,
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: inp.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: out.as_entire_binding(),
            },
        ],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        for _ in 0..repeats {
            pass.dispatch_workgroups(workgroups, 1, 1);
        }
    }
    encoder.copy_buffer_to_buffer(&out, 0, &read, 0, size);
    let start = std::time::Instant::now();
    queue.submit([encoder.finish()]);
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    read.slice(..).map_async(wgpu::MapMode::Read, |_| {});
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| e.to_string())?;
    let data = read
        .slice(..)
        .get_mapped_range()
        .map_err(|e| e.to_string())?;
    Ok((bytemuck::cast_slice(&data).to_vec(), seconds))
}

fn main() {
    // `--spirv IN.wgsl OUT.spv`: write the engine's SPIR-V for a shader.
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--spirv" {
        let source = std::fs::read_to_string(&args[2]).expect("the WGSL file");
        let words = webattn::device::spirv::compile_wgsl(
            &source,
            "main",
            &[],
            false,
            webattn::RuntimeChecks::On,
        )
        .expect("SPIR-V");
        std::fs::write(&args[3], bytemuck::cast_slice::<u32, u8>(&words)).expect("written");
        return;
    }
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
        .expect("a Vulkan adapter");
    let info = adapter.get_info();
    println!(
        "adapter: {} ({:?}, driver {})",
        info.name, info.device_type, info.driver_info
    );
    for c in adapter.cooperative_matrix_properties() {
        println!("  listed: {c:?}");
    }
    let wanted = wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        | wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
        | wgpu::Features::PASSTHROUGH_SHADERS;
    assert!(
        adapter.features().contains(wanted),
        "the adapter lacks {:?}",
        wanted - adapter.features()
    );
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: wanted,
        required_limits: adapter.limits(),
        // SAFETY: a diagnostic of the experimental feature itself.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        ..Default::default()
    }))
    .expect("a device");
    let input: Vec<f32> = (0..512)
        .map(|i| ((i * 37) % 97) as f32 * 0.25 - 12.0)
        .collect();
    // `throughput`: the throughput kernels only.
    let only_throughput = args.get(1).is_some_and(|a| a == "throughput");
    for probe in probes().into_iter().filter(|_| !only_throughput) {
        let expected = (probe.expected)(&input);
        let source = format!("{HEADER}{}", probe.body);
        for own in [false, true] {
            let how = if own { "own SPIR-V" } else { "wgpu WGSL " };
            match run(&device, &queue, &source, own, &input, expected.len()) {
                Ok(got) => {
                    let worst = got
                        .iter()
                        .zip(&expected)
                        .map(|(g, e)| {
                            if g.is_nan() {
                                f32::INFINITY
                            } else {
                                (g - e).abs()
                            }
                        })
                        .fold(0.0f32, f32::max);
                    let verdict = if worst <= 1e-3 { "ok  " } else { "BAD " };
                    println!("{verdict}{how} {}: worst error {worst:.3e}", probe.name);
                    if worst > 1e-3 {
                        println!("      got      {:?}", &got[..8.min(got.len())]);
                        println!("      expected {:?}", &expected[..8.min(expected.len())]);
                        let bad: Vec<usize> = got
                            .iter()
                            .zip(&expected)
                            .enumerate()
                            .filter(|(_, (g, e))| {
                                (*g - *e).abs().is_nan() || (*g - *e).abs() > 1e-3
                            })
                            .map(|(i, _)| i)
                            .take(12)
                            .collect();
                        println!("      first wrong indices {bad:?}");
                    }
                }
                Err(e) => println!("ERR {how} {}: {e}", probe.name),
            }
        }
    }
    // Enough workgroups to fill an H100 or H200 (132 units, 8 each); one on
    // a CPU, where only that the kernels run matters.
    let cpu = info.device_type == wgpu::DeviceType::Cpu;
    throughput(&device, &queue, if cpu { 1 } else { 132 * 8 });
    drop((device, queue));
    if !only_throughput {
        engine_gemms();
    }
}
