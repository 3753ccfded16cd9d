//! Writes the SPIR-V a Vulkan driver is handed for the engine's hot kernels,
//! one file per pipeline (overrides applied, as wgpu applies them), with
//! naga's runtime checks, without its loop counters and without either, for a
//! GPU compiler to read offline:
//! `.ci/shader-stats` compiles them with Mesa's RADV on a null device (no GPU
//! needed) and prints each pipeline's registers, spills and instruction
//! counts.
//!
//! `cargo run --release --example spirv_dump -- OUT_DIR`
//!
//! The pipelines: every register-tiled candidate at head dims 64 and 128 (the
//! tuner's list: measured shapes, 8-row shapes, prefetching, chunked and shuffle
//! forms) and the streaming decode kernel's shapes at head dim 128, each as a
//! plain call runs it (`RULES` = 0: no mask, softcap, ALiBi or temperature;
//! the first tiled and decode shapes also with every rule compiled, "all
//! rules"), the GEMM
//! kernels the unfused path runs, the FMA ceiling's kernel, and the
//! matrix-unit attention kernel's scalar code ("coop scalar": the packed
//! kernel at an H100's tiles for head dims 64 and 128, its matrices stood in
//! by f32 scalars, [`without_matrices`], since RADV 22.3 has no cooperative
//! matrices). Files are named after the pipeline key (`attention_tiled[BK=32,...]`
//! becomes `attention_tiled.BK32...`) with `.checked.spv`, `.bounds.spv` or
//! `.unchecked.spv`; `index.tsv` lists them with their bindings (group 0, in
//! order: `u` uniform, `r` read-only storage, `w` read-write storage) and
//! their keys.

use std::fmt::Write as _;
use std::path::PathBuf;

use webattn::device::capabilities::KernelLimits;
use webattn::device::pipeline::PipelineKey;
use webattn::device::spirv::compile_wgsl;
use webattn::kernels::attention::coop::CoopTiles;
use webattn::kernels::attention::tiled::TiledTiles;
use webattn::kernels::decode::{stream_key, StreamShape};
use webattn::kernels::matrix_units::CoopShape;
use webattn::kernels::matrix_units::CoopSize;
use webattn::shader::kernel::Binding;
use webattn::{AttentionDims, RuntimeChecks};

/// The pipelines written: (what it is, its key).
fn pipelines() -> Vec<(String, PipelineKey)> {
    let mut out = Vec::new();
    for d in [64usize, 128] {
        for tiles in TiledTiles::candidates(d, d) {
            let what = format!(
                "d{d} {}x{} on {}x{}{}{}{}",
                tiles.query_rows,
                tiles.keys_per_tile,
                tiles.tq,
                tiles.tk,
                if tiles.prefetch { " prefetch" } else { "" },
                if tiles.shuffle { " shuffle" } else { "" },
                if tiles.chunked { " chunked" } else { "" },
            );
            // A plain call's pipeline: no per-score rule beyond the scale
            // (`RULES` = 0: no mask, softcap, ALiBi or temperature).
            out.push((what.clone(), tiles.key().with("RULES", 0)));
            if tiles == TiledTiles::candidates(d, d)[0] {
                // The first shape also with every rule compiled (the default).
                out.push((format!("{what} all rules"), tiles.key()));
            }
        }
    }
    // The streaming decode kernel at head dim 128: one query row per
    // workgroup (8 heads over 8 KV heads) and four (32 over 8), K and V in
    // f32 and in f16, every shape whose registers hold them.
    for (heads, rows) in [([8, 8], 1usize), ([32, 8], 4)] {
        let dims = AttentionDims::plain(1, heads, [1, 4096], [128, 128]);
        for kv_f16 in [false, true] {
            for shape in StreamShape::all()
                .into_iter()
                .filter(|s| s.holds(&dims, rows))
            {
                let what = format!(
                    "decode {} {} row{} L={} KB={}{}",
                    if kv_f16 { "f16" } else { "f32" },
                    rows,
                    if rows == 1 { "" } else { "s" },
                    shape.lanes,
                    shape.keys_per_step,
                    if shape.prefetch { " prefetch" } else { "" },
                );
                let key = stream_key(shape, &dims, rows as i64, kv_f16);
                out.push((what.clone(), key.clone().with("RULES", 0)));
                if shape == StreamShape::all()[0] {
                    out.push((format!("{what} all rules"), key));
                }
            }
        }
    }
    for (trans_b, skip_marked_a, what) in [(1, 0, "S = Q K^T"), (0, 1, "Y = P V")] {
        let key = PipelineKey::new(webattn::kernels::gemm::GEMM)
            .with("TRANS_A", 0)
            .with("TRANS_B", trans_b)
            .with("SKIP_MARKED_A", skip_marked_a);
        out.push((format!("gemm {what}"), key));
    }
    out.push((
        "fma ceiling".to_string(),
        PipelineKey::new(webattn::kernels::ceilings::FMA_PEAK),
    ));
    // The matrix-unit kernel as an H100 runs it untuned (16x16 matrices,
    // subgroups of 32, 48 KiB), for a plain call.
    let h100 = CoopShape {
        size: CoopSize::Sixteen,
        subgroup: 32,
    };
    let limits = KernelLimits {
        max_compute_workgroup_storage_size: 48 << 10,
        ..KernelLimits::WEBGPU_DEFAULTS
    };
    for d in [64usize, 128] {
        if let Some(tiles) = CoopTiles::for_dims(h100, d, d, &limits) {
            let what = format!(
                "coop scalar d{d} {}x{} LPR {}",
                tiles.query_rows(),
                tiles.keys_per_tile,
                tiles.lanes_per_row
            );
            out.push((what, tiles.key().with("RULES", 0)));
        }
    }
    out
}

/// A matrix-unit kernel's source with its matrices stood in by f32 scalars:
/// the matrix types become `f32`, a load the element it starts at, a
/// product an `fma`, a store a store of the scalar. What a compiler without
/// matrix units makes of the rest (the scalar code between the products) is
/// what it makes of the kernel's own; the products and their operands'
/// traffic are not the kernel's.
fn without_matrices(source: &str) -> String {
    const F16_ARRAYS: [&str; 4] = ["q_s", "kv_s", "p_s", "zero_h"];
    let mut src: String = source
        .lines()
        .map(|line| match line.trim_start().strip_prefix("alias ") {
            Some(rest) if line.contains("coop_mat") => {
                let name = rest.split(" =").next().unwrap_or(rest);
                format!("alias {name} = f32;")
            }
            _ if line.trim() == "enable wgpu_cooperative_matrix;" => String::new(),
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let names = [
        "coopLoadT",
        "coopLoad",
        "coopMultiplyAdd",
        "coopStoreT",
        "coopStore",
    ];
    while let Some((start, name)) = names
        .iter()
        .filter_map(|n| {
            src.match_indices(n)
                .find(|(i, _)| {
                    let after = src[i + n.len()..].chars().next();
                    matches!(after, Some('(' | '<'))
                })
                .map(|(i, _)| (i, *n))
        })
        .min()
    {
        let open = start + src[start..].find('(').expect("a call");
        let (mut depth, mut end) = (0i32, open);
        for (i, c) in src[open..].char_indices() {
            depth += match c {
                '(' | '[' => 1,
                ')' | ']' => -1,
                _ => 0,
            };
            if depth == 0 {
                end = open + i;
                break;
            }
        }
        let (mut args, mut depth, mut arg) = (Vec::new(), 0i32, String::new());
        for c in src[open + 1..end].chars() {
            depth += match c {
                '(' | '[' => 1,
                ')' | ']' => -1,
                _ => 0,
            };
            if c == ',' && depth == 0 {
                args.push(std::mem::take(&mut arg).trim().to_string());
            } else {
                arg.push(c);
            }
        }
        args.push(arg.trim().to_string());
        let replacement = if name.starts_with("coopLoad") {
            format!("f32({})", args[0].trim_start_matches('&'))
        } else if name == "coopMultiplyAdd" {
            format!("fma({}, {}, {})", args[0], args[1], args[2])
        } else {
            let place = args[1].trim_start_matches('&');
            let half = F16_ARRAYS
                .iter()
                .any(|a| place.starts_with(&format!("{a}[")));
            format!(
                "{place} = {}({})",
                if half { "f16" } else { "f32" },
                args[0]
            )
        };
        src.replace_range(start..=end, &replacement);
    }
    src
}

/// A file name for `key`: its text form with brackets, commas and `=` gone.
fn file_stem(key: &PipelineKey) -> String {
    key.to_string()
        .chars()
        .filter_map(|c| match c {
            '[' | ',' => Some('.'),
            ']' | '=' => None,
            c => Some(c),
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).ok_or("usage: spirv_dump OUT_DIR")?);
    std::fs::create_dir_all(&dir)?;
    let mut index = String::from("file\tchecks\tbindings\twhat\tkey\n");
    for (what, key) in pipelines() {
        let constants: Vec<(String, f64)> = key
            .constants
            .iter()
            .map(|&(name, value)| (name.to_string(), value as f64))
            .collect();
        let zero = !key.kernel.writes_workgroup_memory_first();
        // Group 0's bindings in order: u(niform), r(ead) or w(rite) storage.
        let bindings: String = key
            .kernel
            .bindings()
            .iter()
            .map(|b| match b {
                Binding::Uniform => 'u',
                Binding::Read => 'r',
                Binding::ReadWrite => 'w',
            })
            .collect();
        for checks in [RuntimeChecks::On, RuntimeChecks::Bounds, RuntimeChecks::Off] {
            let source = if what.starts_with("coop scalar") {
                without_matrices(&key.kernel.device_source()).into()
            } else {
                key.kernel.device_source()
            };
            let words = compile_wgsl(&source, key.kernel.entry_point(), &constants, zero, checks)
                .map_err(|e| format!("{key}: {e}"))?;
            let suffix = match checks {
                RuntimeChecks::On => "checked",
                RuntimeChecks::Bounds => "bounds",
                RuntimeChecks::Off => "unchecked",
            };
            let name = format!("{}.{suffix}.spv", file_stem(&key));
            std::fs::write(dir.join(&name), bytemuck::cast_slice::<u32, u8>(&words))?;
            writeln!(index, "{name}\t{checks}\t{bindings}\t{what}\t{key}")?;
        }
    }
    std::fs::write(dir.join("index.tsv"), &index)?;
    println!(
        "{} SPIR-V modules in {}",
        index.lines().count() - 1,
        dir.display()
    );
    Ok(())
}
