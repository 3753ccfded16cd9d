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
//! kernels the unfused path runs, and the FMA ceiling's kernel. Files are named after the pipeline key (`attention_tiled[BK=32,...]`
//! becomes `attention_tiled.BK32...`) with `.checked.spv`, `.bounds.spv` or
//! `.unchecked.spv`; `index.tsv` lists them with their bindings (group 0, in
//! order: `u` uniform, `r` read-only storage, `w` read-write storage) and
//! their keys.

use std::fmt::Write as _;
use std::path::PathBuf;

use webattn::gpu::ops::decode::{stream_key, StreamShape};
use webattn::gpu::ops::tiled::TiledTiles;
use webattn::gpu::pipeline::PipelineKey;
use webattn::gpu::registry::{Binding, Kernel};
use webattn::gpu::spirv::compile_wgsl;
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
        let key = PipelineKey::new(Kernel::Gemm)
            .with("TRANS_A", 0)
            .with("TRANS_B", trans_b)
            .with("SKIP_MARKED_A", skip_marked_a);
        out.push((format!("gemm {what}"), key));
    }
    out.push(("fma ceiling".to_string(), PipelineKey::new(Kernel::FmaPeak)));
    out
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
            let words = compile_wgsl(
                &key.kernel.device_source(),
                key.kernel.entry_point(),
                &constants,
                zero,
                checks,
            )
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
