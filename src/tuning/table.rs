//! The tuning table: which fused kernel and tiles won on an adapter for a
//! head-dim class, and how the paths compared, as measured by the tuner; and
//! its cache file (natively; the browser keeps it in memory).
//!
//! The file is plain text, one tab-separated entry per line under a versioned
//! header, so that it is easy to read and to diff. One format is read: a file
//! of another (an older webattn's) is set aside beside it with one warning
//! and measured again by the next `webattn tune`; a file that is unreadable,
//! or lines that do not parse, are ignored with a warning likewise; an
//! entry whose tiles the kernel no longer offers, or that no longer fit the
//! adapter's limits, is ignored when looked up, and so is an entry measured
//! on other kernels (another webattn version: the key's fingerprint of the
//! kernels' WGSL differs, [`crate::kernels::fingerprint`]).

use std::collections::BTreeMap;
#[cfg(not(target_arch = "wasm32"))]
use std::path::{Path, PathBuf};

use crate::device::capabilities::Capabilities;
use crate::kernels::attention::coop::CoopForm;
use crate::kernels::attention::names;
use crate::kernels::decode::{DecodeKernel, StreamShape, GROUPED_ROWS};
use crate::options::RuntimeChecks;

/// The first line of a cache file of this format.
pub const HEADER: &str = "# webattn tuning cache, format 10";
/// The warning for a file of another format.
const OTHER_FORMAT: &str = "not a tuning cache of this format";
const COLUMNS: &str = "# adapter\tbackend\tdriver\tworkgroup_bytes\tdk4\tdv4\tkernel\tBQ\tBK\tTQ\tTK\tfused_ms\tunfused_ms\tdecode_kernel\tL\tKB\tdecode_ms\tprefetch\tcoop_ms\tunfused_coop_ms\tdecode_prefetch\truntime_checks\tfast_gemm\tfast_gemm_ms\tcoop_tiles\tgrouped_decode\tkernels";

/// What a measurement is about: one adapter and driver under one
/// workgroup-memory limit, at one head-dim class (head dims rounded up to 4),
/// with the kernels compiled with or without naga's runtime checks (their
/// instruction counts differ, and so can the fastest tiles).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TuningKey {
    /// The adapter's name.
    pub adapter: String,
    /// The backend (`Vulkan`, `Metal`, ...).
    pub backend: String,
    /// The driver's name and version.
    pub driver: String,
    /// The device's workgroup-memory limit, in bytes (the tiles depend on it).
    pub workgroup_bytes: u32,
    /// vec4s per K row (Dk rounded up to 4, over 4).
    pub dk4: u32,
    /// vec4s per V row.
    pub dv4: u32,
    /// Whether the kernels timed kept naga's runtime checks.
    pub runtime_checks: RuntimeChecks,
    /// The fingerprint of the kernels timed
    /// ([`crate::kernels::fingerprint`]; `-` in the file when
    /// unknown: such an entry is never looked up).
    pub kernels: String,
}

impl TuningKey {
    /// The key for head dims `dk`, `dv` on the adapter `caps` describes, with
    /// runtime checks on (the default; see [`TuningKey::with_runtime_checks`]).
    pub fn new(caps: &Capabilities, dk: usize, dv: usize) -> TuningKey {
        TuningKey {
            adapter: caps.adapter.name.clone(),
            backend: caps.adapter.backend.clone(),
            driver: format!("{} {}", caps.adapter.driver, caps.adapter.driver_info)
                .trim()
                .to_string(),
            workgroup_bytes: caps.limits.max_compute_workgroup_storage_size,
            dk4: dk.div_ceil(4) as u32,
            dv4: dv.div_ceil(4) as u32,
            runtime_checks: RuntimeChecks::On,
            kernels: crate::kernels::fingerprint().to_string(),
        }
    }

    /// Whether the entry under this key was measured on the kernels of this
    /// build.
    pub fn is_current(&self) -> bool {
        self.kernels == crate::kernels::fingerprint()
    }

    /// This key for kernels compiled with `runtime_checks`.
    pub fn with_runtime_checks(mut self, runtime_checks: RuntimeChecks) -> TuningKey {
        self.runtime_checks = runtime_checks;
        self
    }
}

/// The fused kernel that won, in a form the file can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunedKernel {
    /// `attention_tiled` (or its shuffle form) with these (query rows, keys
    /// per tile, tq, tk).
    Tiled {
        /// Query rows per workgroup.
        query_rows: u32,
        /// Keys per tile.
        keys_per_tile: u32,
        /// Invocation rows.
        tq: u32,
        /// Invocation columns.
        tk: u32,
        /// Whether the next tile is prefetched into registers.
        prefetch: bool,
        /// Whether it is the shuffle form (`attention_tiled_shuffle`: row
        /// maxima and P by subgroup shuffles).
        shuffle: bool,
        /// Whether it is the chunked form (`attention_tiled_chunked`: the Q,
        /// K and V tiles in chunks of columns).
        chunked: bool,
    },
    /// `attention_fused` (its tiles follow from the limits).
    Portable,
    /// `attention_sg` (its width follows from the adapter).
    Subgroup,
}

impl TunedKernel {
    /// The kernel's name.
    pub fn name(&self) -> &'static str {
        match self {
            TunedKernel::Tiled { shuffle: true, .. } => names::TILED_SHUFFLE,
            TunedKernel::Tiled { chunked: true, .. } => names::TILED_CHUNKED,
            TunedKernel::Tiled { .. } => names::TILED,
            TunedKernel::Portable => names::PORTABLE,
            TunedKernel::Subgroup => names::SUBGROUP,
        }
    }
}

/// One measurement's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TunedEntry {
    /// The fastest fused kernel.
    pub kernel: TunedKernel,
    /// Its median time on the tuning problem, in ms.
    pub fused_ms: f64,
    /// The unfused path's median time on the same problem, in ms.
    pub unfused_ms: f64,
    /// The fastest decode kernel on the decode problem (one query row per
    /// workgroup), where measured.
    pub decode: Option<TunedDecode>,
    /// The fastest decode kernel on the grouped decode problem (the query
    /// heads of a GQA group of [`GROUPED_ROWS`] per workgroup, one row each),
    /// where measured: calls with several rows per workgroup take it where
    /// it suits them.
    pub grouped_decode: Option<TunedDecode>,
    /// The matrix-unit fused kernel's median time on the prefill problem at
    /// `Precision::Fast`, where the adapter has one: calls at `Fast` take it
    /// only where it is not measured slower than `fused_ms`.
    pub coop_ms: Option<f64>,
    /// The unfused path's median time at `Precision::Fast` (its GEMMs on the
    /// matrix units), where the adapter has them: unfused calls at `Fast`
    /// keep their GEMMs in f32 where this is measured slower than
    /// `unfused_ms`.
    pub unfused_coop_ms: Option<f64>,
    /// The form of the matrix-unit GEMM with which the unfused path at
    /// `Fast` ran fastest, where the adapter has matrix units: its products
    /// at `Fast` take it (`unfused_coop_ms` is that run's time).
    pub fast_gemm: Option<TunedGemm>,
    /// The matrix-unit fused kernel's tiles that ran fastest at `Fast`
    /// (`coop_ms` is their time), where the tuner timed several: calls at
    /// `Fast` take them where they fit.
    pub coop_tiles: Option<TunedCoop>,
}

impl TunedEntry {
    /// The fused and the unfused path's measured times (ms), each path's
    /// time at `Precision::Fast` (its matrix-unit run, where measured) where
    /// `[fused, unfused]` says it runs on the matrix units, else its f32 time.
    pub fn path_ms(&self, [fused_units, unfused_units]: [bool; 2]) -> (f64, f64) {
        let pick = |units: bool, fast: Option<f64>, f32_ms: f64| match (units, fast) {
            (true, Some(ms)) => ms,
            _ => f32_ms,
        };
        (
            pick(fused_units, self.coop_ms, self.fused_ms),
            pick(unfused_units, self.unfused_coop_ms, self.unfused_ms),
        )
    }

    /// [`TunedEntry::path_ms`] for a call at `Precision::Fast` on the adapter
    /// as it was measured: each path on the matrix units where they measured
    /// no slower than its f32 form (the planner's rule).
    pub fn fast_path_ms(&self) -> (f64, f64) {
        self.path_ms([
            self.coop_ms.is_some_and(|c| c <= self.fused_ms),
            self.unfused_coop_ms.is_some_and(|c| c <= self.unfused_ms),
        ])
    }
}

/// Tiles of the matrix-unit fused kernel (`attention_coop`): the rest of its
/// configuration follows from the adapter's matrix units and the head dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunedCoop {
    /// Subgroups per workgroup (each a strip of query rows).
    pub subgroups: u32,
    /// Keys per K/V tile.
    pub keys_per_tile: u32,
    /// Where K and V come from: packed ahead of the kernel and loaded
    /// from storage (`attention_coop_packed`), staged through workgroup
    /// memory (`attention_coop`), or packed and shared through workgroup
    /// memory (`attention_coop_shared`).
    pub form: CoopForm,
}

impl TunedCoop {
    /// The text form: `4x64` (subgroups x keys per tile, packed),
    /// `4x64-staged` or `4x64-shared`.
    pub fn name(&self) -> String {
        let form = self.form.suffix();
        format!("{}x{}{form}", self.subgroups, self.keys_per_tile)
    }

    /// Reads [`TunedCoop::name`]'s form.
    pub fn from_name(name: &str) -> Option<TunedCoop> {
        let (tiles, form) = [CoopForm::Staged, CoopForm::Shared]
            .into_iter()
            .find_map(|form| Some((name.strip_suffix(form.suffix())?, form)))
            .unwrap_or((name, CoopForm::Packed));
        let (subgroups, keys) = tiles.split_once('x')?;
        Some(TunedCoop {
            subgroups: subgroups.parse().ok().filter(|&n| n > 0)?,
            keys_per_tile: keys.parse().ok().filter(|&n| n > 0)?,
            form,
        })
    }
}

/// The matrix-unit GEMM form with which the unfused path at
/// `Precision::Fast` ran fastest on the tuning problem.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TunedGemm {
    /// The form.
    pub form: crate::kernels::gemm::FastGemm,
    /// The unfused path's median time at `Fast` with it, in ms.
    pub unfused_ms: f64,
}

/// The decode kernel that won on the tuner's decode problem.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TunedDecode {
    /// The kernel and its shape.
    pub kernel: DecodeKernel,
    /// Its median time, in ms.
    pub decode_ms: f64,
}

impl TunedDecode {
    /// The grouped decode column's text: the kernel (`staged`, or the
    /// streaming kernel's `L{lanes}xKB{keys per step}`, `-prefetch` where it
    /// prefetches), the rows per workgroup it was measured at and its time:
    /// `L16xKB2/4/0.412000`.
    pub fn grouped_text(&self) -> String {
        let kernel = match self.kernel {
            DecodeKernel::Staged => "staged".to_string(),
            DecodeKernel::Stream(shape) => format!(
                "L{}xKB{}{}",
                shape.lanes,
                shape.keys_per_step,
                if shape.prefetch { "-prefetch" } else { "" }
            ),
        };
        format!("{kernel}/{GROUPED_ROWS}/{:.6}", self.decode_ms)
    }

    /// Reads [`TunedDecode::grouped_text`]'s form: `None` where it was
    /// measured at other rows per workgroup than the tuner's now (a stale
    /// measurement, which the one-row winner stands in for).
    fn from_grouped_text(text: &str) -> std::result::Result<Option<TunedDecode>, String> {
        let bad = || format!("grouped decode {text:?} is not KERNEL/ROWS/MS");
        let mut parts = text.split('/');
        let (Some(kernel), Some(rows), Some(ms), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let kernel = match kernel {
            "staged" => DecodeKernel::Staged,
            shape => {
                let (shape, prefetch) = match shape.strip_suffix("-prefetch") {
                    Some(shape) => (shape, true),
                    None => (shape, false),
                };
                let (lanes, keys) = shape
                    .strip_prefix('L')
                    .and_then(|s| s.split_once("xKB"))
                    .ok_or_else(bad)?;
                DecodeKernel::Stream(StreamShape {
                    lanes: lanes.parse().map_err(|_| bad())?,
                    keys_per_step: keys.parse().map_err(|_| bad())?,
                    prefetch,
                })
            }
        };
        let rows: usize = rows.parse().map_err(|_| bad())?;
        let decode_ms = ms
            .parse::<f64>()
            .ok()
            .filter(|t| t.is_finite() && *t >= 0.0)
            .ok_or_else(bad)?;
        Ok((rows == GROUPED_ROWS).then_some(TunedDecode { kernel, decode_ms }))
    }
}

/// Where an engine's tuning table comes from ([`crate::EngineOptions::tuning_cache`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TuningCache {
    /// Natively the cache file at [`TuningTable::default_path`], if there is
    /// one; in the browser, memory only.
    #[default]
    Default,
    /// This cache file (natively; memory in the browser).
    File(std::path::PathBuf),
    /// An empty table; no file is read.
    Memory,
}

impl TuningCache {
    /// The cache file this names, natively.
    pub fn path(&self) -> Option<std::path::PathBuf> {
        #[cfg(not(target_arch = "wasm32"))]
        match self {
            TuningCache::Default => TuningTable::default_path(),
            TuningCache::File(path) => Some(path.clone()),
            TuningCache::Memory => None,
        }
        #[cfg(target_arch = "wasm32")]
        None
    }

    /// The table to start from: the file's entries (what cannot be used is
    /// ignored with a warning), or an empty table.
    pub fn load(&self) -> TuningTable {
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(path) = self.path() {
            return TuningTable::load(&path);
        }
        TuningTable::new()
    }
}

/// Measured choices per adapter and head-dim class.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TuningTable {
    entries: BTreeMap<TuningKey, TunedEntry>,
}

impl TuningTable {
    /// An empty table.
    pub fn new() -> TuningTable {
        TuningTable::default()
    }

    /// The entry for `key`, if measured.
    pub fn get(&self, key: &TuningKey) -> Option<&TunedEntry> {
        self.entries.get(key)
    }

    /// Records (or replaces) a measurement.
    pub fn insert(&mut self, key: TuningKey, entry: TunedEntry) {
        self.entries.insert(key, entry);
    }

    /// Removes the entry for `key`.
    pub fn remove(&mut self, key: &TuningKey) -> Option<TunedEntry> {
        self.entries.remove(key)
    }

    /// The entries, in key order.
    pub fn entries(&self) -> impl Iterator<Item = (&TuningKey, &TunedEntry)> {
        self.entries.iter()
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Parses a cache file's text: the table and a warning per line (or for
    /// the whole text) that was ignored.
    pub fn parse(text: &str) -> (TuningTable, Vec<String>) {
        let mut table = TuningTable::new();
        let mut warnings = Vec::new();
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, first)) if first.trim_end() == HEADER => {}
            Some((_, first)) => {
                warnings.push(format!(
                    "{OTHER_FORMAT} (first line {:?}, this webattn writes {HEADER:?})",
                    first.chars().take(60).collect::<String>()
                ));
                return (table, warnings);
            }
            None => return (table, warnings),
        }
        for (number, line) in lines {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            match parse_line(line) {
                Ok((key, entry)) => table.insert(key, entry),
                Err(why) => warnings.push(format!("line {}: {why}: ignored", number + 1)),
            }
        }
        (table, warnings)
    }

    /// The table as a cache file's text.
    pub fn to_text(&self) -> String {
        let mut out = format!("{HEADER}\n{COLUMNS}\n");
        for (key, entry) in &self.entries {
            let (bq, bk, tq, tk, prefetch) = match entry.kernel {
                TunedKernel::Tiled {
                    query_rows,
                    keys_per_tile,
                    tq,
                    tk,
                    prefetch,
                    ..
                } => (query_rows, keys_per_tile, tq, tk, u32::from(prefetch)),
                _ => (0, 0, 0, 0, 0),
            };
            let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
            let decode = match entry.decode {
                None => "-\t0\t0\t0".to_string(),
                Some(tuned) => {
                    let (lanes, keys) = match tuned.kernel {
                        DecodeKernel::Staged => (0, 0),
                        DecodeKernel::Stream(shape) => (shape.lanes, shape.keys_per_step),
                    };
                    format!(
                        "{}\t{lanes}\t{keys}\t{:.6}",
                        tuned.kernel.name(),
                        tuned.decode_ms
                    )
                }
            };
            let optional =
                |ms: Option<f64>| ms.map_or_else(|| "-".to_string(), |ms| format!("{ms:.6}"));
            let (coop, unfused_coop) = (optional(entry.coop_ms), optional(entry.unfused_coop_ms));
            let decode_prefetch = match entry.decode.map(|d| d.kernel) {
                Some(DecodeKernel::Stream(shape)) => u32::from(shape.prefetch),
                _ => 0,
            };
            let fast_gemm = match entry.fast_gemm {
                None => "-\t-".to_string(),
                Some(tuned) => format!("{}\t{:.6}", tuned.form.name(), tuned.unfused_ms),
            };
            let coop_tiles = entry
                .coop_tiles
                .map_or_else(|| "-".to_string(), |t| t.name());
            let grouped = entry
                .grouped_decode
                .map_or_else(|| "-".to_string(), |d| d.grouped_text());
            out.push_str(&format!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{bq}\t{bk}\t{tq}\t{tk}\t{:.6}\t{:.6}\t{decode}\t{prefetch}\t{coop}\t{unfused_coop}\t{decode_prefetch}\t{}\t{fast_gemm}\t{coop_tiles}\t{grouped}\t{}\n",
                clean(&key.adapter),
                clean(&key.backend),
                clean(&key.driver),
                key.workgroup_bytes,
                key.dk4,
                key.dv4,
                entry.kernel.name(),
                entry.fused_ms,
                entry.unfused_ms,
                key.runtime_checks.name(),
                if key.kernels.is_empty() { "-".to_string() } else { clean(&key.kernels) },
            ));
        }
        out
    }

    /// Where the cache file lives: `$WEBATTN_TUNING_CACHE`, else
    /// `$XDG_CACHE_HOME/webattn/tuning.tsv`, else `~/.cache/webattn/tuning.tsv`.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn default_path() -> Option<PathBuf> {
        let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(path) = set("WEBATTN_TUNING_CACHE") {
            return Some(PathBuf::from(path));
        }
        let base = set("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
        Some(base.join("webattn").join("tuning.tsv"))
    }

    /// Reads the cache file at `path`: empty when there is none; what cannot
    /// be used is ignored with a logged warning.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(path: &Path) -> TuningTable {
        let text = match std::fs::read(path) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(_) => {
                    log::warn!(
                        "webattn: tuning cache {} is not text: ignored (`webattn tune` rebuilds it)",
                        path.display()
                    );
                    return TuningTable::new();
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return TuningTable::new(),
            Err(e) => {
                log::warn!(
                    "webattn: tuning cache {} cannot be read ({e}): ignored",
                    path.display()
                );
                return TuningTable::new();
            }
        };
        let (table, warnings) = TuningTable::parse(&text);
        if warnings.iter().any(|w| w.starts_with(OTHER_FORMAT)) {
            // Another webattn's file: kept beside for its owner, not read.
            let aside = PathBuf::from(format!("{}.old", path.display()));
            let moved = std::fs::rename(path, &aside).map_or_else(
                |e| format!("could not be set aside ({e})"),
                |()| format!("set aside as {}", aside.display()),
            );
            log::warn!(
                "webattn: tuning cache {}: {}; {moved}: `webattn tune` measures this adapter again",
                path.display(),
                warnings[0]
            );
            return table;
        }
        for warning in warnings {
            log::warn!(
                "webattn: tuning cache {}: {warning} (`webattn tune` rebuilds it)",
                path.display()
            );
        }
        let stale = table.entries().filter(|(k, _)| !k.is_current()).count();
        if stale > 0 {
            log::info!(
                "webattn: tuning cache {}: {stale} entries measured on other kernels (another \
                 webattn version): ignored (`webattn tune` measures these kernels)",
                path.display()
            );
        }
        table
    }

    /// Writes the table to `path` (through a temporary file beside it, so a
    /// reader never sees half a file), creating the directory.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn save(&self, path: &Path) -> crate::Result<()> {
        let io = |e: std::io::Error| crate::Error::File {
            path: path.display().to_string(),
            reason: format!("cannot write the tuning cache: {e}"),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        // A name of its own per save: two engines of one process may save at once.
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let save = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let temp = path.with_extension(format!("tmp{}.{save}", std::process::id()));
        std::fs::write(&temp, self.to_text()).map_err(io)?;
        std::fs::rename(&temp, path).map_err(io)
    }
}

fn parse_line(line: &str) -> std::result::Result<(TuningKey, TunedEntry), String> {
    let fields: Vec<&str> = line.split('\t').collect();
    if fields.len() != 27 {
        return Err(format!("{} fields, expected 27", fields.len()));
    }
    let number = |i: usize, what: &str| -> std::result::Result<u32, String> {
        fields[i]
            .trim()
            .parse()
            .map_err(|_| format!("{what} {:?} is not a number", fields[i]))
    };
    let time = |i: usize, what: &str| -> std::result::Result<f64, String> {
        fields[i]
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|t| t.is_finite() && *t >= 0.0)
            .ok_or_else(|| format!("{what} {:?} is not a time", fields[i]))
    };
    let key = TuningKey {
        adapter: fields[0].to_string(),
        backend: fields[1].to_string(),
        driver: fields[2].to_string(),
        workgroup_bytes: number(3, "workgroup_bytes")?,
        dk4: number(4, "dk4")?,
        dv4: number(5, "dv4")?,
        runtime_checks: match fields.get(21).map(|f| f.trim()) {
            None | Some("on") => RuntimeChecks::On,
            Some("bounds") => RuntimeChecks::Bounds,
            Some("off") => RuntimeChecks::Off,
            Some(other) => {
                return Err(format!("runtime_checks {other:?} is not on, bounds or off"))
            }
        },
        kernels: match fields.get(26).map(|f| f.trim()) {
            None | Some("-") => String::new(),
            Some(print) => print.to_string(),
        },
    };
    if key.dk4 == 0 || key.dv4 == 0 || key.dk4 > 64 || key.dv4 > 64 {
        return Err(format!(
            "head-dim class {}/{} out of range",
            key.dk4, key.dv4
        ));
    }
    let kernel = match fields[6] {
        tiled if [names::TILED, names::TILED_SHUFFLE, names::TILED_CHUNKED].contains(&tiled) => {
            TunedKernel::Tiled {
                query_rows: number(7, "BQ")?,
                keys_per_tile: number(8, "BK")?,
                tq: number(9, "TQ")?,
                tk: number(10, "TK")?,
                prefetch: match fields.get(17).map(|f| f.trim()) {
                    None | Some("0") => false,
                    Some("1") => true,
                    Some(other) => return Err(format!("prefetch {other:?} is not 0 or 1")),
                },
                shuffle: tiled == names::TILED_SHUFFLE,
                chunked: tiled == names::TILED_CHUNKED,
            }
        }
        n if n == names::PORTABLE => TunedKernel::Portable,
        n if n == names::SUBGROUP => TunedKernel::Subgroup,
        other => return Err(format!("unknown kernel {other:?}")),
    };
    let decode = match fields.get(13).copied() {
        None | Some("-") => None,
        Some(name) => {
            let kernel = match name {
                n if n == crate::kernels::decode::names::STAGED => DecodeKernel::Staged,
                n if n == crate::kernels::decode::names::STREAM => {
                    DecodeKernel::Stream(StreamShape {
                        lanes: number(14, "L")?,
                        keys_per_step: number(15, "KB")?,
                        prefetch: match fields.get(20).map(|f| f.trim()) {
                            None | Some("0") => false,
                            Some("1") => true,
                            Some(other) => {
                                return Err(format!("decode_prefetch {other:?} is not 0 or 1"))
                            }
                        },
                    })
                }
                other => return Err(format!("unknown decode kernel {other:?}")),
            };
            Some(TunedDecode {
                kernel,
                decode_ms: time(16, "decode_ms")?,
            })
        }
    };
    let optional = |i: usize, what: &str| match fields.get(i).map(|f| f.trim()) {
        None | Some("-") => Ok(None),
        Some(_) => time(i, what).map(Some),
    };
    let coop_ms = optional(18, "coop_ms")?;
    let unfused_coop_ms = optional(19, "unfused_coop_ms")?;
    let fast_gemm = match fields.get(22).map(|f| f.trim()) {
        None | Some("-") => None,
        Some(name) => Some(TunedGemm {
            form: crate::kernels::gemm::FastGemm::from_name(name)
                .ok_or_else(|| format!("unknown matrix-unit GEMM form {name:?}"))?,
            unfused_ms: time(23, "fast_gemm_ms")?,
        }),
    };
    let coop_tiles = match fields.get(24).map(|f| f.trim()) {
        None | Some("-") => None,
        Some(name) => Some(
            TunedCoop::from_name(name)
                .ok_or_else(|| format!("matrix-unit tiles {name:?} are not SUBGROUPSxKEYS"))?,
        ),
    };
    let grouped_decode = match fields.get(25).map(|f| f.trim()) {
        None | Some("-") => None,
        Some(text) => TunedDecode::from_grouped_text(text)?,
    };
    let entry = TunedEntry {
        kernel,
        grouped_decode,
        fused_ms: time(11, "fused_ms")?,
        unfused_ms: time(12, "unfused_ms")?,
        decode,
        coop_ms,
        unfused_coop_ms,
        fast_gemm,
        coop_tiles,
    };
    Ok((key, entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(dk4: u32) -> TuningKey {
        TuningKey {
            adapter: "NVIDIA H100 80GB HBM3".into(),
            backend: "Vulkan".into(),
            driver: "NVIDIA 580.95".into(),
            workgroup_bytes: 49152,
            dk4,
            dv4: dk4,
            runtime_checks: RuntimeChecks::On,
            kernels: crate::kernels::fingerprint().to_string(),
        }
    }

    fn sample() -> TuningTable {
        let mut table = TuningTable::new();
        table.insert(
            key(16),
            TunedEntry {
                kernel: TunedKernel::Tiled {
                    query_rows: 64,
                    keys_per_tile: 32,
                    tq: 16,
                    tk: 16,
                    prefetch: true,
                    shuffle: false,
                    chunked: false,
                },
                grouped_decode: Some(TunedDecode {
                    kernel: DecodeKernel::Stream(StreamShape {
                        lanes: 16,
                        keys_per_step: 4,
                        prefetch: true,
                    }),
                    decode_ms: 0.25,
                }),
                fused_ms: 1.5,
                unfused_ms: 4.25,
                decode: Some(TunedDecode {
                    kernel: DecodeKernel::Stream(StreamShape {
                        lanes: 8,
                        keys_per_step: 2,
                        prefetch: true,
                    }),
                    decode_ms: 0.5,
                }),
                coop_ms: Some(3.75),
                unfused_coop_ms: Some(5.5),
                fast_gemm: Some(TunedGemm {
                    form: crate::kernels::gemm::FastGemm::Packed(
                        crate::kernels::gemm::PackedTile { rows: 4, cols: 2 },
                    ),
                    unfused_ms: 0.75,
                }),
                coop_tiles: Some(TunedCoop {
                    subgroups: 2,
                    keys_per_tile: 32,
                    form: CoopForm::Packed,
                }),
            },
        );
        table.insert(
            key(32),
            TunedEntry {
                kernel: TunedKernel::Portable,
                grouped_decode: None,
                fused_ms: 3.0,
                unfused_ms: 2.0,
                decode: None,
                coop_ms: None,
                unfused_coop_ms: None,
                fast_gemm: None,
                coop_tiles: None,
            },
        );
        table
    }

    #[test]
    fn the_text_form_reads_back_as_written() {
        let table = sample();
        let (back, warnings) = TuningTable::parse(&table.to_text());
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(back, table);
    }

    #[test]
    fn matrix_unit_tiles_keep_their_form_in_text() {
        for (form, name) in [
            (CoopForm::Packed, "4x64"),
            (CoopForm::Staged, "4x64-staged"),
            (CoopForm::Shared, "4x64-shared"),
        ] {
            let tiles = TunedCoop {
                subgroups: 4,
                keys_per_tile: 64,
                form,
            };
            assert_eq!(tiles.name(), name);
            assert_eq!(TunedCoop::from_name(name), Some(tiles));
        }
        assert_eq!(TunedCoop::from_name("4x64-fused"), None);
    }

    #[test]
    fn shuffle_and_chunked_forms_are_written_under_their_own_kernel_names_and_read_back() {
        for (shuffle, chunked, name) in [
            (true, false, "attention_tiled_shuffle"),
            (false, true, "attention_tiled_chunked"),
        ] {
            let mut table = TuningTable::new();
            let kernel = TunedKernel::Tiled {
                query_rows: 64,
                keys_per_tile: 32,
                tq: 16,
                tk: 8,
                prefetch: true,
                shuffle,
                chunked,
            };
            table.insert(
                key(16),
                TunedEntry {
                    kernel,
                    grouped_decode: None,
                    fused_ms: 1.0,
                    unfused_ms: 2.0,
                    decode: None,
                    coop_ms: None,
                    unfused_coop_ms: None,
                    fast_gemm: None,
                    coop_tiles: None,
                },
            );
            let text = table.to_text();
            assert!(
                text.contains(&format!("\t{name}\t64\t32\t16\t8\t")),
                "{text}"
            );
            let (back, warnings) = TuningTable::parse(&text);
            assert!(warnings.is_empty(), "{warnings:?}");
            assert_eq!(back, table);
            assert_eq!(kernel.name(), name);
        }
    }

    #[test]
    fn corrupt_lines_are_ignored_with_a_warning_and_the_rest_kept() {
        let mut text = sample().to_text();
        text.push_str("garbage without tabs\n");
        text.push_str(&"x\t".repeat(17));
        text.push_str("x\n");
        let (table, warnings) = TuningTable::parse(&text);
        assert_eq!(table, sample());
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("line 5"), "{warnings:?}");
    }

    #[test]
    fn malformed_columns_refuse_their_line_and_a_stale_grouped_decode_is_dropped() {
        let text = sample().to_text();
        assert!(
            text.contains("\tpacked4x2\t0.750000\t2x32\tL16xKB4-prefetch/4/0.250000\t"),
            "{text}"
        );
        // Measured at other rows per workgroup: dropped, the entry kept.
        let stale = text.replace("L16xKB4-prefetch/4/", "L16xKB4-prefetch/8/");
        let (table, warnings) = TuningTable::parse(&stale);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(table.len(), 2);
        assert!(table.entries().all(|(_, e)| e.grouped_decode.is_none()));
        let staged = TunedDecode {
            kernel: DecodeKernel::Staged,
            decode_ms: 1.5,
        };
        assert_eq!(staged.grouped_text(), "staged/4/1.500000");
        assert_eq!(
            TunedDecode::from_grouped_text(&staged.grouped_text()),
            Ok(Some(staged))
        );
        for (from, to, why) in [
            ("L16xKB4-prefetch/4/", "L16xKB/4/", "grouped decode"),
            (
                "attention_decode_stream",
                "attention_decode_fast",
                "unknown decode kernel",
            ),
            ("packed4x2", "packed9x9", "unknown matrix-unit GEMM form"),
            ("\t2x32\t", "\t2x\t", "matrix-unit tiles"),
            ("\t2x32\t", "\t0x32\t", "matrix-unit tiles"),
            ("\t2x32\t", "\ttwox32\t", "matrix-unit tiles"),
        ] {
            let (table, warnings) = TuningTable::parse(&text.replacen(from, to, 1));
            assert_eq!(table.len(), 1, "{to}");
            assert!(warnings[0].contains(why), "{to}: {warnings:?}");
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn a_file_of_another_format_is_set_aside_with_one_warning() {
        let dir = std::env::temp_dir().join(format!("webattn-tuning-old-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tuning.tsv");
        let old = sample()
            .to_text()
            .replacen(HEADER, "# webattn tuning cache, format 9", 1);
        std::fs::write(&path, &old).unwrap();
        let (table, warnings) = TuningTable::parse(&old);
        assert!(table.is_empty() && warnings.len() == 1, "{warnings:?}");
        assert!(TuningTable::load(&path).is_empty());
        assert!(!path.exists(), "the old file stayed in place");
        let aside = dir.join("tuning.tsv.old");
        assert_eq!(std::fs::read_to_string(&aside).unwrap(), old);
        // Lines of another width are refused one by one.
        let (table, warnings) = TuningTable::parse(&format!("{HEADER}\na\tb\tc\n"));
        assert!(table.is_empty());
        assert!(
            warnings[0].contains("3 fields, expected 27"),
            "{warnings:?}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn another_format_or_binary_noise_is_ignored_whole() {
        let (table, warnings) = TuningTable::parse("# webattn tuning cache, format 0\n");
        assert!(table.is_empty());
        assert_eq!(warnings.len(), 1);
        let (table, warnings) = TuningTable::parse("\u{0}\u{1}PK\u{3}");
        assert!(table.is_empty() && warnings.len() == 1);
        let (table, warnings) = TuningTable::parse("");
        assert!(table.is_empty() && warnings.is_empty());
    }

    #[test]
    fn names_with_tabs_cannot_break_the_columns() {
        let mut table = TuningTable::new();
        let mut k = key(16);
        k.adapter = "odd\tname\n".into();
        table.insert(
            k,
            TunedEntry {
                kernel: TunedKernel::Subgroup,
                grouped_decode: None,
                fused_ms: 1.0,
                unfused_ms: 1.0,
                decode: Some(TunedDecode {
                    kernel: DecodeKernel::Staged,
                    decode_ms: 2.0,
                }),
                coop_ms: None,
                unfused_coop_ms: None,
                fast_gemm: None,
                coop_tiles: None,
            },
        );
        let (back, warnings) = TuningTable::parse(&table.to_text());
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(back.len(), 1);
    }

    #[test]
    fn runtime_checks_keep_their_own_entries() {
        let mut table = sample();
        let unchecked = key(16).with_runtime_checks(RuntimeChecks::Off);
        let entry = TunedEntry {
            kernel: TunedKernel::Portable,
            grouped_decode: None,
            fused_ms: 0.5,
            unfused_ms: 1.0,
            decode: None,
            coop_ms: None,
            unfused_coop_ms: None,
            fast_gemm: None,
            coop_tiles: None,
        };
        table.insert(unchecked.clone(), entry);
        assert_eq!(table.len(), 3);
        let text = table.to_text();
        let (back, warnings) = TuningTable::parse(&text);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(back, table);
        assert_eq!(back.get(&unchecked), Some(&entry));
        assert_ne!(back.get(&key(16)), Some(&entry));
        let (bad, warnings) =
            TuningTable::parse(&text.replace("\toff\t-\t-\t-\t-\t", "\tmaybe\t-\t-\t-\t-\t"));
        assert_eq!(bad.len(), 2);
        assert!(warnings[0].contains("runtime_checks"), "{warnings:?}");
    }

    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn files_are_written_whole_and_read_back() {
        let dir = std::env::temp_dir().join(format!("webattn-tuning-{}", std::process::id()));
        let path = dir.join("nested").join("tuning.tsv");
        sample().save(&path).unwrap();
        assert_eq!(TuningTable::load(&path), sample());
        std::fs::write(&path, [0xff, 0xfe, 0x00]).unwrap();
        assert!(TuningTable::load(&path).is_empty());
        assert!(TuningTable::load(&dir.join("missing.tsv")).is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }
}
