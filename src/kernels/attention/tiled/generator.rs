//! The WGSL of the register-tiled fused attention kernel for GPUs
//! (`attention_tiled` and its forms), with its register loops written out.
//!
//! WGSL has no macros, and a private array indexed by a loop variable is slow
//! on GPUs: an NVIDIA H100 ran the looped kernel at 3% of its FMA ceiling, its
//! arrays in local memory (BENCHMARKS.md). So every register here is a named
//! variable: the loops over an invocation's query rows (up to `MAX_RQ`), keys
//! (up to `MAX_RK`) and vec4 columns of O (up to `MAX_DVT`) are unrolled,
//! each step guarded by `if (RQ > i)` and the like. RQ, RK and DVT are
//! override constants, so the guards fold when the pipeline is made and the
//! unused registers vanish.
//!
//! [`render`] returns one form's WGSL; the engine makes it when it builds the
//! form's pipeline, so no copy of it is kept in the repository.

use crate::kernels::attention::tiled;

/// Lines of WGSL from string literals and `format!`s alike (the generator's
/// lists of lines, as the kernel's text reads).
macro_rules! lines {
    ($($line:expr),* $(,)?) => {
        vec![$(String::from($line)),*]
    };
}

/// The most keys an invocation holds in a key tile (RK).
const MAX_RK: usize = tiled::MAX_RK as usize;
/// The most vec4 columns of O an invocation holds (DVT).
const MAX_DVT: usize = tiled::MAX_DVT as usize;
/// RQ * DVT at most: O's registers.
const MAX_O: usize = tiled::MAX_O as usize;
/// vec4s of a K or V tile an invocation prefetches.
const MAX_SLOTS: usize = tiled::MAX_SLOTS as usize;
/// Invocations per row (a multiple of 4, the host checks).
const MAX_TK: usize = tiled::MAX_TK as usize;
/// vec4 columns per chunk of the chunked form's tiles: a chunk holds CW
/// columns of one row and a vec4 of padding.
const CW: usize = tiled::CHUNK_COLUMNS as usize;

/// The kernel's forms, one kernel in the registry each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum TiledForm {
    /// The common kernel: up to 4 query rows per invocation (MAX_RQ = 4).
    Plain,
    /// Up to 8 query rows per invocation, for the tuner's 8-row shapes; kept
    /// apart since lavapipe compiled the quick sweep's tiled pipelines 4 times
    /// slower from the 8-row source, though the overrides fold the same.
    Wide,
    /// The row maxima and P move between the invocations of a row by subgroup
    /// shuffles (for adapters with subgroups of at least TK lanes), so K and
    /// V are staged side by side and a key tile takes two barriers instead of
    /// four.
    Shuffle,
    /// The Q, K and V tiles held in chunks of CW columns of a row (tuner-only):
    /// one index clamp per row and chunk instead of one per load. Of the 4-row
    /// kernel only (neither wide nor shuffle).
    Chunked,
}

/// The comment that opens each form's WGSL: where the text comes from, for a
/// reader of a compiled or dumped shader.
fn header(form: TiledForm) -> &'static str {
    match form {
        TiledForm::Chunked => {
            "// Made by src/kernels/attention/tiled/generator.rs (the chunked form: tiles in chunks of\n\
             // columns) when the pipeline is built; edit the generator."
        }
        TiledForm::Wide => {
            "// Made by src/kernels/attention/tiled/generator.rs (the wide form: 8 rows per invocation)\n\
             // when the pipeline is built; edit the generator."
        }
        TiledForm::Shuffle => {
            "// Made by src/kernels/attention/tiled/generator.rs (the shuffle form: subgroup shuffles)\n\
             // when the pipeline is built; edit the generator."
        }
        TiledForm::Plain => {
            "// Made by src/kernels/attention/tiled/generator.rs when the pipeline is built; edit the generator."
        }
    }
}

/// Whether an invocation can hold O's block (i, c): RQ > i and DVT > c with
/// RQ * DVT within MAX_O.
fn has_o(i: usize, c: usize) -> bool {
    (i + 1) * (c + 1) <= MAX_O
}

/// `pad` before each line, an empty line left empty (no trailing spaces).
fn indent<S: AsRef<str>>(pad: &str, lines: &[S]) -> Vec<String> {
    lines
        .iter()
        .map(|line| {
            let line = line.as_ref();
            if line.is_empty() {
                String::new()
            } else {
                format!("{pad}{line}")
            }
        })
        .collect()
}

/// `pad` before every line, empty ones too (where the generator's lines are
/// never empty).
fn prefix<S: AsRef<str>>(pad: &str, lines: &[S]) -> Vec<String> {
    lines
        .iter()
        .map(|line| format!("{pad}{}", line.as_ref()))
        .collect()
}

/// `body` (lines) under `if (a && b)` of the conditions that are not
/// trivially true (empty); the conditions are override comparisons that fold.
fn guard<C: AsRef<str>>(conds: &[C], body: Vec<String>, indent_by: usize) -> Vec<String> {
    let conds: Vec<&str> = conds
        .iter()
        .map(AsRef::as_ref)
        .filter(|c| !c.is_empty())
        .collect();
    let pad = " ".repeat(indent_by);
    if conds.is_empty() {
        return indent(&pad, &body);
    }
    let mut lines = vec![format!("{pad}if ({}) {{", conds.join(" && "))];
    lines.extend(indent(&format!("{pad}    "), &body));
    lines.push(format!("{pad}}}"));
    lines
}

/// The guard of query row `i` (none for row 0, which every invocation has).
fn rq(i: usize) -> String {
    if i > 0 {
        format!("RQ > {i}u")
    } else {
        String::new()
    }
}

/// The guard of key `j` of a key tile (none for key 0).
fn rk(j: usize) -> String {
    if j > 0 {
        format!("RK > {j}u")
    } else {
        String::new()
    }
}

/// The guard of vec4 column `c` of O (none for column 0).
fn dvt(c: usize) -> String {
    if c > 0 {
        format!("DVT > {c}u")
    } else {
        String::new()
    }
}

/// The guard of prefetch slot `sl` (none for slot 0).
fn slots(sl: usize) -> String {
    if sl > 0 {
        format!("SLOTS > {sl}u")
    } else {
        String::new()
    }
}

/// A tile the prefetch registers take: the registers' name (`pf`, `pv`),
/// and `slot_load`'s source (1: K, 2: V), vec4s per row and row length.
struct Prefetched {
    regs: &'static str,
    src: u32,
    d4s: &'static str,
    len: &'static str,
}

/// K's tile into the `pf` registers.
const K_INTO_PF: Prefetched = Prefetched {
    regs: "pf",
    src: 1,
    d4s: "DK4",
    len: "p.dk",
};
/// V's tile into the `pf` registers (K's are stored by then).
const V_INTO_PF: Prefetched = Prefetched {
    regs: "pf",
    src: 2,
    d4s: "DV4",
    len: "p.dv",
};
/// V's tile into the `pv` registers (the shuffle form's, beside K's).
const V_INTO_PV: Prefetched = Prefetched {
    regs: "pv",
    src: 2,
    d4s: "DV4",
    len: "p.dv",
};

/// The loads of `tiles` from the tile whose first key is the expression
/// `j0` into each slot's registers, under PREFETCH, at `indent`.
fn prefetch_loads(tiles: &[Prefetched], j0: &str, indent_by: usize) -> Vec<String> {
    let loads: Vec<String> = (0..MAX_SLOTS)
        .flat_map(|sl| {
            let body = tiles
                .iter()
                .map(|t| {
                    format!(
                        "{}{sl} = slot_load({}u, kv_base, {j0}, li + {sl}u * WG, {}, {});",
                        t.regs, t.src, t.d4s, t.len
                    )
                })
                .collect();
            guard(&[slots(sl)], body, 0)
        })
        .collect();
    guard(&["PREFETCH"], loads, indent_by)
}

/// Row i's online-softmax step for a key tile whose row maximum is the
/// expression `tile_max`: the new maximum, each key's P (`keep_p(j)` gives
/// the lines that keep key j's P, `pt`), the rescaled partial sum and O.
fn online_softmax(i: usize, tile_max: &str, keep_p: impl Fn(usize) -> Vec<String>) -> Vec<String> {
    let mut lines = lines![
        format!("let m_new = max(m{i}, {tile_max});"),
        "// exp(0) = 1 while no attended score has been finite yet.",
        format!("let alpha = exp(tempered(m{i} - m_new, p.inv_temperature));"),
        "var sum = 0.0;",
    ];
    for j in 0..MAX_RK {
        let mut body = lines![
            "// -0 for a key the row does not attend (it adds nothing to",
            "// the sum, nor, times a finite V, to O); an attended key's P",
            "// is +0 or more, even where its score is -inf.",
            format!(
                "let pt = select(not_attended(), exp(tempered(s{i}_{j} - m_new, p.inv_temperature)), s{i}_{j} != MASKED);"
            ),
        ];
        body.extend(keep_p(j));
        body.push("sum += pt;".into());
        lines.extend(guard(&[rk(j)], body, 0));
    }
    lines.push(format!("l{i} = l{i} * alpha + sum;"));
    for c in (0..MAX_DVT).filter(|&c| has_o(i, c)) {
        lines.extend(guard(&[dvt(c)], lines![format!("o{i}_{c} *= alpha;")], 0));
    }
    lines.push(format!("m{i} = m_new;"));
    lines
}

/// Row rr's TK partials read from `row_parts` a vec4 `v` at a time, in order,
/// each step under `body` (unrolled: naga's loop counters would keep a GPU
/// compiler from unrolling a loop over TK, and this runs per key tile).
fn row_parts_read(body: &[&str]) -> Vec<String> {
    let mut lines = Vec::new();
    for t4 in 0..MAX_TK / 4 {
        let cond = if t4 > 0 {
            format!("TK > {}u", 4 * t4)
        } else {
            String::new()
        };
        let mut step = lines![
            "{",
            format!("    let v = row_parts[rr * (TK / 4u) + {t4}u];")
        ];
        step.extend(prefix("    ", body));
        step.push("}".into());
        lines.extend(guard(&[cond], step, 0));
    }
    lines
}

/// The shuffle form's step 3 for row i, in the block of its rules: the tile's
/// row maximum by a butterfly over the row's TK lanes, then the online-softmax
/// step, P kept in place of the scores.
fn shuffle_softmax(i: usize) -> Vec<String> {
    let mut lines = lines!["// The row's tile maximum: a butterfly over its TK lanes."];
    for off in [1, 2, 4, 8, 16, 32, 64] {
        lines.extend(guard(
            &[format!("TK > {off}u")],
            lines![format!(
                "part = max(part, subgroupShuffleXor(part, {off}u));"
            )],
            0,
        ));
    }
    lines.extend(online_softmax(i, "part", |j| {
        lines![format!("s{i}_{j} = pt;")]
    }));
    lines
}

/// The WGSL being written for one form: its entries (each one or more lines,
/// joined by newlines at the end) and what of the form the helpers need.
struct Gen {
    /// The text so far; an entry may hold several lines.
    out: Vec<String>,
    /// Whether this is the chunked form.
    chunked: bool,
    /// Whether this is the shuffle form.
    shuffle: bool,
    /// The most query rows an invocation holds (8 in the wide form, else 4).
    max_rq: usize,
    /// The tile S = Q K^T reads K from (K and V have a tile each in the
    /// shuffle form, one between them otherwise).
    k_tile: &'static str,
}

impl Gen {
    /// The generator of `form`'s WGSL, nothing written yet.
    fn new(form: TiledForm) -> Self {
        let shuffle = form == TiledForm::Shuffle;
        let max_rq = if form == TiledForm::Wide {
            tiled::MAX_RQ
        } else {
            tiled::NARROW_MAX_RQ
        } as usize;
        Gen {
            out: Vec::new(),
            chunked: form == TiledForm::Chunked,
            shuffle,
            max_rq,
            k_tile: if shuffle { "k_tile" } else { "kv_tile" },
        }
    }

    /// Appends one entry (one or more lines).
    fn w(&mut self, text: impl Into<String>) {
        self.out.push(text.into());
    }

    /// Appends lines.
    fn emit(&mut self, lines: Vec<String>) {
        self.out.extend(lines);
    }

    /// Puts the lines written since `out[start]` under `if` the phase
    /// `ABLATE_<phase>` of the key loop is kept (shaders/ablate.wgsl: always,
    /// but where `webattn phases` measures the kernel without it); `otherwise`
    /// are lines for the kernel without it.
    fn keep_phase(&mut self, start: usize, phase: &str, indent_by: usize, otherwise: &[String]) {
        let body: Vec<String> = self
            .out
            .drain(start..)
            .flat_map(|chunk| chunk.split('\n').map(String::from).collect::<Vec<_>>())
            .collect();
        let pad = " ".repeat(indent_by);
        self.w(format!("{pad}if ((ABLATE & ABLATE_{phase}) == 0u) {{"));
        self.emit(indent("    ", &body));
        if !otherwise.is_empty() {
            self.w(format!("{pad}}} else {{"));
            self.emit(indent(&format!("{pad}    "), otherwise));
        }
        self.w(format!("{pad}}}"));
    }

    /// WGSL lines that stage a tile of K (src 1) or V (src 2) into `tile`,
    /// zeros past the last key and past the row; `on_value` are lines run on
    /// each loaded vec4 `val`.
    fn staging_loop(
        &self,
        src: u32,
        tile: &str,
        d4s: &str,
        length: &str,
        on_value: &[&str],
    ) -> Vec<String> {
        let mut lines = lines![
            format!("for (var slot = li; slot < BK * {d4s}; slot += WG) {{"),
            format!("    let t = slot / {d4s};"),
            format!("    let d4 = slot % {d4s};"),
            "    let key = u32(j0) + t;",
            "    var val = vec4<f32>(0.0);",
            "    if (key < p.keys) {",
            format!("        val = quad({src}u, (kv_base + key) * {length}, d4 * 4u, {length});"),
        ];
        lines.extend(prefix("        ", on_value));
        lines.push("    }".into());
        lines.push(if self.chunked {
            format!("    {tile}[(d4 / CW) * BK + t][d4 % CW] = val;")
        } else {
            format!("    {tile}[t * KS + d4] = val;")
        });
        lines.push("}".into());
        lines
    }

    /// One vec4 column `d4` (an expression) of S = Q K^T: the invocation's K
    /// rows and Q rows at that column, and their fma chains (the chunked form:
    /// column `d4` of the chunks that begin at `qc` and `kc`). Rows and keys
    /// past RQ and RK are never read (their guards fold away).
    fn s_step(&self, d4: &str) -> Vec<String> {
        let k_tile = self.k_tile;
        let mut lines = Vec::new();
        for j in 0..MAX_RK {
            lines.push(format!("var k{j} = vec4<f32>(0.0);"));
            let load = if self.chunked {
                format!("{k_tile}[kc + {j}u * TK][{d4}]")
            } else {
                format!("{k_tile}[k_at + {j}u * TK * KS + {d4}]")
            };
            lines.extend(guard(&[rk(j)], lines![format!("k{j} = {load};")], 0));
        }
        for i in 0..self.max_rq {
            let load = if self.chunked {
                format!("q_tile[qc + {i}u * TQ][{d4}]")
            } else {
                format!("q_tile[q_at + {i}u * TQ * QS + {d4}]")
            };
            let mut body = lines![format!("let q{i} = {load};")];
            for j in 0..MAX_RK {
                body.extend(guard(
                    &[rk(j)],
                    lines![format!(
                        "s{i}_{j} = fma(q{i}.w, k{j}.w, fma(q{i}.z, k{j}.z, \
                         fma(q{i}.y, k{j}.y, fma(q{i}.x, k{j}.x, s{i}_{j}))));"
                    )],
                    0,
                ));
            }
            lines.extend(guard(&[rq(i)], body, 0));
        }
        let mut step = lines!["{"];
        step.extend(indent("    ", &lines));
        step.push("}".into());
        step
    }

    /// O += P V: four keys a step (one vec4 of P per row). The careful form
    /// (V's tile holds a non-finite value) adds a key's P V only where the row
    /// attends the key (P's sign bit clear): -0 x inf would be NaN where a key
    /// not attended must add nothing, and an attended key whose P is 0 must
    /// still add 0 x V.
    fn product(&self, careful: bool) -> Vec<String> {
        let mut lines = lines!["for (var t4 = 0u; t4 < bk4; t4++) {"];
        for i in 0..self.max_rq {
            lines.push(format!("    var p{i} = vec4<f32>(0.0);"));
            let load = if self.chunked {
                format!("p_tile[(t4 / CW) * BQ + tr + {i}u * TQ][t4 % CW]")
            } else {
                format!("p_tile[p_at + {i}u * TQ * ps + t4]")
            };
            lines.extend(guard(&[rq(i)], lines![format!("p{i} = {load};")], 4));
        }
        for (u, comp) in ['x', 'y', 'z', 'w'].into_iter().enumerate() {
            lines.push("    {".into());
            for c in 0..MAX_DVT {
                if self.chunked {
                    lines.push(format!(
                        "        let v{c} = kv_tile[v_chunk{c} + t4 * 4u + {u}u][v_col{c}];"
                    ));
                } else {
                    lines.push(format!(
                        "        let v{c} = kv_tile[(t4 * 4u + {u}u) * KS + v_at{c}];"
                    ));
                }
            }
            for i in 0..self.max_rq {
                for c in (0..MAX_DVT).filter(|&c| has_o(i, c)) {
                    let stmt = if careful {
                        format!(
                            "o{i}_{c} += select(vec4<f32>(0.0), p{i}.{comp} * v{c}, \
                             attended_p(p{i}.{comp}));"
                        )
                    } else {
                        format!("o{i}_{c} = fma(vec4<f32>(p{i}.{comp}), v{c}, o{i}_{c});")
                    };
                    lines.extend(guard(&[rq(i), dvt(c)], lines![stmt], 8));
                }
            }
            lines.push("    }".into());
        }
        lines.push("}".into());
        lines
    }

    /// O += P V in the shuffle form: key t + TK * j of the tile has its P in
    /// register s{i}_{j} of lane t of the row's TK lanes. The careful form as
    /// in [`Gen::product`].
    fn product_shuffle(&self, careful: bool) -> Vec<String> {
        let mut lines = lines![
            "for (var t = 0u; t < TK; t++) {",
            "    let src = lane0 + t;"
        ];
        for j in 0..MAX_RK {
            let mut body = Vec::new();
            for c in 0..MAX_DVT {
                body.push(format!(
                    "let v{c} = v_tile[(t + TK * {j}u) * KS + v_at{c}];"
                ));
            }
            for i in 0..self.max_rq {
                let mut p_lines = lines![format!("let p{i} = subgroupShuffle(s{i}_{j}, src);")];
                for c in (0..MAX_DVT).filter(|&c| has_o(i, c)) {
                    let stmt = if careful {
                        format!(
                            "o{i}_{c} += select(vec4<f32>(0.0), p{i} * v{c}, attended_p(p{i}));"
                        )
                    } else {
                        format!("o{i}_{c} = fma(vec4<f32>(p{i}), v{c}, o{i}_{c});")
                    };
                    p_lines.extend(guard(&[dvt(c)], lines![stmt], 0));
                }
                body.extend(guard(&[rq(i)], p_lines, 0));
            }
            let mut block = lines!["{"];
            block.extend(prefix("    ", &body));
            block.push("}".into());
            lines.extend(guard(&[rk(j)], block, 4));
        }
        lines.push("}".into());
        lines
    }
}

/// The kernel's sections, in the order [`render`] writes them. Each writes
/// whole lines (its own entries), so no section's text runs on into the next.
impl Gen {
    /// The comment that explains the kernel (after the header): its grid, its
    /// steps and its contract, and a paragraph for each form that differs.
    fn overview(&mut self) {
        let mut text = String::from(
            "//
// Fused attention (FlashAttention-2 forward), register-tiled for GPUs.
//
// A workgroup owns BQ consecutive query rows of one (batch, query head) and
// streams the keys in tiles of BK. Its WG = TQ x TK invocations form a grid:
// invocation (tr, tc) owns the RQ = BQ / TQ query rows tr, tr + TQ, ... and,
// in each key tile, the RK = BK / TK keys tc, tc + TK, ...; in O it owns the
// same rows and the DVT vec4 columns tc, tc + TK, ... of the head dim.
",
        );
        if !self.shuffle {
            text.push_str(
                "//
// Invocations are numbered in pairs: invocations 2n and 2n + 1 share their
// column tc (so their reads of K and of V are of one address) and stand on
// neighbouring rows; 2n and 2n + 2 share their row (so do their reads of Q
// and of P). NVIDIA's workgroup memory returns 128 bytes a cycle to a whole
// SM, so a subgroup's 16-byte read takes 4 cycles, and 2 where lanes 2n and
// 2n + 1 (or 2n and 2n + 2) read one address (as NVIDIA describes its Volta
// and Turing GPUs): every read of the hot loops is then such a read, where
// K's and V's took 4 cycles with rows of consecutive invocations. The
// padding of the tiles' rows keeps a pair's two rows on different banks.
",
            );
        }
        text.push_str(
            "//
// Per workgroup: Q's block is staged once in workgroup memory (vec4s, rows
// padded to QS to spread the banks). Per key tile:
//   1. K's tile is staged in workgroup memory (coalesced: consecutive
//      invocations read consecutive vec4s of a row).
//   2. S = Q K^T as an RQ x RK register micro-tile per invocation (fma
//      chains); the contract's rules (scale, softcap, mask, ALiBi, ranges)
//      applied in registers; each invocation's partial row maxima go to
//      workgroup memory.
//   3. Each invocation reads its rows' TK partial maxima, rescales its O
//      registers and its partial row sums by exp((m_old - m_new) / τ) and
//      writes its probabilities P = exp((s - m_new) / τ) to workgroup memory
//      (vec4s of four keys); V's tile replaces K's, noting whether it holds a
//      non-finite value. (τ is the temperature; the maxima are of the biased
//      scores before it: see tempered() in attention_rules.wgsl.)
//   4. O += P V as an RQ x DVT (vec4) register micro-tile per invocation, four
//      keys per step (one vec4 of P per row).
// O stays in registers for the whole key loop and is written once, with the
// logsumexp, at the end. The row sums are kept as per-invocation partials (the
// same rescaling applies to each) and added up once at the end.
//
// Every register is a named variable (the generator unrolls the loops over
// rows, keys and columns up to MAX_RQ, MAX_RK, MAX_DVT); RQ, RK and DVT are
// overrides, so the `if (RQ > i)` guards fold when the pipeline is made.
//
// The contract is attention_fused.wgsl's, and so are the uniforms, the
// bindings, the non-finite rules (ROW_ATTENDED / ROW_POISONED, NaN rows, an
// attended -inf score still multiplies its V row, a key not attended never
// does: P is -0 for a key not attended and +0 or more for an attended one, a
// tile whose V is all finite multiplies by P as it is (-0 times a finite V
// adds nothing), and one that holds a non-finite value multiplies only where
// P's sign bit is clear), the workgroup's key range that skips
// tiles no row can see, and the resumable key chunks (O in Y, row state in
// `lse` between chunks; chunks start on tile boundaries).
",
        );
        if self.chunked {
            text.push_str(
                "//
// This form (attention_tiled_chunked) holds the Q, K, V and P tiles in chunks
// of CW vec4 columns of one row and a vec4 of padding (which spreads a
// column's rows over the banks): row r's columns CW c .. CW c + CW - 1 are
// chunk c * (rows of the tile) + r. S = Q K^T takes a chunk of columns a
// step, the columns within it constants: naga's runtime checks then clamp
// an invocation's row once per chunk, not every load's index, and a
// compiler folds the column into the load's offset (so too for P's vec4s in
// O += P V, once the compiler unrolls that loop). The padding costs
// workgroup memory (a vec4 per CW columns instead of one per row), and a
// compiler may keep more of a chunk's loads in flight (more registers); only
// `webattn tune` tries it.
",
            );
        }
        if self.shuffle {
            text.push_str(
                "//
// This form (attention_tiled_shuffle) runs where the adapter has subgroups of
// at least TK lanes: the TK invocations of a row are lanes of one subgroup
// (consecutive invocation indices, aligned to TK). The rows' tile maxima are
// reduced by a butterfly of subgroupShuffleXor instead of through workgroup
// memory, and O += P V takes each key's P from the lane that computed it by
// subgroupShuffle instead of from a P tile. K and V are staged side by side
// at the start of a tile, so a tile takes two barriers (K and V staged; K and
// V read) instead of four. The V tile's non-finite flag holds the number of
// the last tile that had one (tiles count from 1), so it is never reset.
// WGSL does not promise how invocations map to subgroup lanes: the kernel
// checks the layout it relies on and makes the rows NaN where it does not
// hold, as attention_decode_stream does.
",
            );
        }
        self.w(text);
    }

    /// The override constants: the tile and grid shapes the host picks when it
    /// makes the pipeline (the chunked form's chunk counts in place of strides).
    fn overrides(&mut self) {
        let mut text = String::from(
            "// Query rows per workgroup, keys per tile (a multiple of 4).
override BQ: u32 = 64u;
override BK: u32 = 32u;
// The invocation grid: TQ rows x TK columns, WG = TQ * TK invocations.
override TQ: u32 = 16u;
override TK: u32 = 8u;
override WG: u32 = 128u;
// Query rows (BQ / TQ) and keys (BK / TK) per invocation.
override RQ: u32 = 4u;
override RK: u32 = 4u;
// vec4s per K row and per V row (head dims rounded up to 4).
override DK4: u32 = 16u;
override DV4: u32 = 16u;
// vec4 columns of O per invocation: ceil(DV4 / TK).
override DVT: u32 = 2u;
",
        );
        text.push_str(if self.chunked {
            "// Chunks of CW columns per row of the Q tile (ceil(DK4 / CW)) and of the
// K/V tile (ceil(max(DK4, DV4) / CW)).
override QB: u32 = 2u;
override KB: u32 = 2u;
"
        } else {
            "// Row strides of the Q tile and of the K/V tile, in vec4s.
override QS: u32 = 17u;
override KS: u32 = 17u;
"
        });
        text.push_str(
            "// Prefetch: each invocation loads its SLOTS vec4s of the next tile (V's
// during S = Q K^T, the next K's during O += P V) into registers, so their
// latency overlaps the arithmetic, and stores them to workgroup memory after
// the barrier (SLOTS = ceil(BK * max(DK4, DV4) / WG), at most MAX_SLOTS).
// Without it, each tile is loaded from storage between two barriers.
override PREFETCH: bool = false;
override SLOTS: u32 = 2u;
",
        );
        self.w(text);
    }

    /// The plain constants: the chunked form's chunk width and the most rows,
    /// keys and columns an invocation holds (the generator's unrolling bounds).
    fn constants(&mut self) {
        if self.chunked {
            self.w(format!(
                "// vec4 columns per chunk of the Q and K/V tiles.
const CW: u32 = {CW}u;"
            ));
        }
        let max_rq = self.max_rq;
        self.w(format!(
            "// The most rows, keys and columns an invocation holds (the host keeps RQ, RK
// and DVT within them, and RQ * RK, RQ * DVT within MAX_S, MAX_O).
const MAX_RQ: u32 = {max_rq}u;
const MAX_RK: u32 = {MAX_RK}u;
const MAX_DVT: u32 = {MAX_DVT}u;
"
        ));
    }

    /// The includes and the bindings past Q, K and V (the mask, the lengths,
    /// Y and the row state), the same in every form.
    fn bindings(&mut self) {
        self.w("// #include attention_call.wgsl

// #include attention_qkv4.wgsl
@group(0) @binding(4) var<storage, read> mask: array<f32>;
@group(0) @binding(5) var<storage, read> nonpad: array<i32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
// [lse (as bits) | row max m | row sum l], one entry each per row.
@group(0) @binding(7) var<storage, read_write> lse: array<u32>;
");
    }

    /// The workgroup memory: Q's block, the K and V tiles (a tile each in the
    /// shuffle form, one between them and P's tile otherwise), the row partials.
    fn workgroup_memory(&mut self) {
        let mut text = String::from(if self.chunked {
            "// Q's block: BQ rows in QB chunks each.
var<workgroup> q_tile: array<array<vec4<f32>, CW + 1u>, BQ * QB>;
"
        } else {
            "// Q's block, BQ rows of QS vec4s.
var<workgroup> q_tile: array<vec4<f32>, BQ * QS>;
"
        });
        if self.shuffle {
            text.push_str(
                "// K's tile and V's: BK rows of KS vec4s each.
var<workgroup> k_tile: array<vec4<f32>, BK * KS>;
var<workgroup> v_tile: array<vec4<f32>, BK * KS>;
// Per row: the TK invocations' partial sums at the end (TK / 4 vec4s); the
// row's flags.
var<workgroup> row_parts: array<vec4<f32>, BQ * TK / 4u>;
var<workgroup> row_flags: array<atomic<u32>, BQ>;
var<workgroup> batch_nonpad: i32;
// The last tile (counted from 1) whose V held a non-finite value (P V then
// tests each key).
var<workgroup> v_nonfinite: atomic<u32>;
// Whether some invocation's subgroup lanes are not laid out as the shuffles
// need (then every row is NaN).
var<workgroup> layout_bad: atomic<u32>;
",
            );
        } else {
            text.push_str(if self.chunked {
                "// K's tile, then V's: BK rows in KB chunks.
var<workgroup> kv_tile: array<array<vec4<f32>, CW + 1u>, BK * KB>;
"
            } else {
                "// K's tile, then V's: BK rows of KS vec4s.
var<workgroup> kv_tile: array<vec4<f32>, BK * KS>;
"
            });
            text.push_str(if self.chunked {
                "// P, BQ rows of BK / 4 vec4s (keys 4t .. 4t + 3) in chunks of CW; -0 for
// a key the row does not attend.
var<workgroup> p_tile: array<array<vec4<f32>, CW + 1u>, BQ * ((BK / 4u + CW - 1u) / CW)>;"
            } else {
                "// P, BQ rows of BK / 4 vec4s (keys 4t .. 4t + 3) and a vec4 of padding
// (so that the two rows a pair of lanes reads fall on different banks); -0
// for a key the row does not attend.
var<workgroup> p_tile: array<vec4<f32>, BQ * (BK / 4u + 1u)>;"
            });
            text.push_str(
                "
// Per row: the TK invocations' partial maxima, later their partial sums,
// as TK / 4 vec4s (invocation tc's in component tc % 4 of vec4 tc / 4); the
// row's flags.
var<workgroup> row_parts: array<vec4<f32>, BQ * TK / 4u>;
var<workgroup> row_flags: array<atomic<u32>, BQ>;
var<workgroup> batch_nonpad: i32;
// Whether V's tile holds a non-finite value (P V then tests each key).
var<workgroup> v_nonfinite: atomic<u32>;
",
            );
        }
        self.w(text);
    }

    /// The functions main calls: Y's vec4 reads and writes, the prefetch
    /// slots' loads and stores (per tile layout), the non-finite test and P's
    /// sign.
    fn helper_functions(&mut self) {
        let mut text = String::from(
            "fn y_quad(base: u32, d: u32) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (d + c < p.dv) {
            out[c] = y[base + d + c];
        }
    }
    return out;
}

fn store_y_quad(base: u32, d: u32, val: vec4<f32>) {
    for (var c = 0u; c < 4u; c++) {
        if (d + c < p.dv) {
            y[base + d + c] = val[c];
        }
    }
}

// Prefetch slot `slot` of the tile at key j0 of K (src 1, rows of d4s vec4s,
// len values) or V (src 2): zeros past the tile, the last key and the row.
fn slot_load(src: u32, kv_base: u32, j0: i32, slot: u32, d4s: u32, len: u32) -> vec4<f32> {
    let key = u32(j0) + slot / d4s;
    if (slot >= BK * d4s || key >= p.keys) {
        return vec4<f32>(0.0);
    }
    return quad(src, (kv_base + key) * len, (slot % d4s) * 4u, len);
}

",
        );
        if self.shuffle {
            text.push_str(
                "// Stores a prefetched slot into K's tile.
fn slot_store(slot: u32, d4s: u32, val: vec4<f32>) {
    if (slot < BK * d4s) {
        k_tile[(slot / d4s) * KS + slot % d4s] = val;
    }
}

// Stores a prefetched slot into V's tile.
fn slot_store_v(slot: u32, d4s: u32, val: vec4<f32>) {
    if (slot < BK * d4s) {
        v_tile[(slot / d4s) * KS + slot % d4s] = val;
    }
}
",
            );
        } else {
            text.push_str(
                "// Stores a prefetched slot into the K/V tile.
fn slot_store(slot: u32, d4s: u32, val: vec4<f32>) {
    if (slot < BK * d4s) {
        ",
            );
            text.push_str(if self.chunked {
                "kv_tile[(slot % d4s / CW) * BK + slot / d4s][slot % d4s % CW] = val;"
            } else {
                "kv_tile[(slot / d4s) * KS + slot % d4s] = val;"
            });
            text.push_str(
                "
    }
}
",
            );
        }
        text.push_str(
            "
// Whether any of four values is infinite or NaN (a bit test: WGSL
// comparisons need not see NaN).
fn nonfinite4(x: vec4<f32>) -> bool {
    let exponent = vec4<u32>(0x7f800000u);
    return any((bitcast<vec4<u32>>(x) & exponent) == exponent);
}

// P of a key a row does not attend: -0, as bits (a sign bit no arithmetic
// makes: exp never returns -0). Times a finite V it adds nothing; the
// careful product, for a V tile with a non-finite value, skips it.
fn not_attended() -> f32 {
    return bitcast<f32>(0x80000000u);
}

// Whether P belongs to a key the row attends: its sign bit is clear.
fn attended_p(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x80000000u) == 0u;
}
",
        );
        self.w(text);
    }

    /// main's signature (the shuffle form takes the subgroup lane too) and the
    /// workgroup's block of query rows and its (batch, head), as every
    /// invocation of it sees them.
    fn main_opening(&mut self) {
        let mut text = String::from(
            "@compute @workgroup_size(WG, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,",
        );
        if self.shuffle {
            text.push_str(
                "
    @builtin(subgroup_invocation_id) sg_lane: u32,",
            );
        }
        text.push_str(
            "
) {
    // Workgroups beyond the last block still reach every barrier below.
    let block = wid.x + wid.y * nwg.x;
    let head_index = min(block / p.q_blocks, p.batch * p.q_heads - 1u);
    let live_block = block < p.q_blocks * p.batch * p.q_heads;
    let b = head_index / p.q_heads;
    let h = head_index % p.q_heads;
    let kvh = h / p.group;
    let row0 = (block % p.q_blocks) * BQ;",
        );
        self.w(text);
    }

    /// The invocation's cell (tr, tc) of the grid (numbered in pairs, but in
    /// the shuffle form, whose rows are subgroup lanes and whose layout is
    /// checked here) and where its partials go.
    fn invocation_cell(&mut self) {
        let mut text = String::from("    let tr = ");
        text.push_str(if self.shuffle {
            "li / TK;"
        } else {
            "(li & 1u) | ((li / (2u * TK)) << 1u);"
        });
        text.push_str(
            "
    let tc = ",
        );
        text.push_str(if self.shuffle {
            "li % TK;"
        } else {
            "(li >> 1u) % TK;"
        });
        text.push_str(
            "
    // Where this invocation's partials go in `row_parts` (its first row's;
    // its other rows are TQ rows on).
    let part_at = tr * (TK / 4u) + tc / 4u;",
        );
        if self.shuffle {
            text.push_str(
                "
    // A row's TK invocations must be TK consecutive lanes of one subgroup,
    // aligned to TK, for the shuffles below: checked here (a lane whose place
    // is not so, or whose row's first lane holds another invocation), and a
    // layout that is not makes every row of the workgroup NaN at the end,
    // never silently wrong.
    let lane0 = sg_lane - sg_lane % TK;
    let first_of_row = subgroupShuffle(li, lane0);
    let layout_ok = sg_lane % TK == tc && first_of_row == li - tc;",
            );
        }
        text.push_str(
            "
    let rows_total = p.batch * p.q_heads * p.q_len;
    let bk4 = BK / 4u;",
        );
        if !(self.shuffle || self.chunked) {
            text.push_str(
                "
    // vec4s per row of the P tile.
    let ps = bk4 + 1u;",
            );
        }
        self.w(text);
    }

    /// The workgroup variables' first values: the batch's key count (set by
    /// invocation 0, with the shuffle form's flags) and the rows' flags.
    fn workgroup_state_init(&mut self) {
        let mut text = String::from(
            "
    if (li == 0u) {
        let lengths = batch_lengths(b);
        batch_nonpad = lengths;",
        );
        if self.shuffle {
            text.push_str(
                "
        atomicStore(&v_nonfinite, 0u);
        atomicStore(&layout_bad, 0u);",
            );
        }
        text.push_str(
            "
    }
    for (var r = li; r < BQ; r += WG) {
        atomicStore(&row_flags[r], 0u);
    }",
        );
        self.w(text);
    }

    /// Q's block staged in workgroup memory once, for every key tile.
    fn q_block_staging(&mut self) {
        let mut text = String::from(
            "    // Q's block, zeros past the last row and past Dk.
    for (var slot = li; slot < BQ * DK4; slot += WG) {
        let rr = slot / DK4;
        let d4 = slot % DK4;
        let row = row0 + rr;
        var val = vec4<f32>(0.0);
        if (live_block && row < p.q_len) {
            val = quad(0u, (head_index * p.q_len + row) * p.dk, d4 * 4u, p.dk);
        }
        ",
        );
        text.push_str(if self.chunked {
            "q_tile[(d4 / CW) * BQ + rr][d4 % CW] = val;"
        } else {
            "q_tile[rr * QS + d4] = val;"
        });
        text.push_str(
            "
    }",
        );
        self.w(text);
    }

    /// The rows' key offset and the workgroup's key range (the tiles that some
    /// row of its block can see, within the chunk).
    fn key_range(&mut self) {
        self.w("    let lengths = workgroupUniformLoad(&batch_nonpad);
    let offset = position_offset(lengths);
    // The workgroup's key range: rows' ranges grow with the row index.
    let last_row = min(row0 + BQ - 1u, p.q_len - 1u);
    let first = key_range(row0, offset, lengths);
    let last = key_range(last_row, offset, lengths);
    let wg_lo = max(first.x, i32(p.chunk_start));
    let wg_hi = select(min(last.y, i32(p.chunk_end) - 1), -1, !live_block);");
    }

    /// The per-row state, a named variable per row (and per block of O),
    /// declared at main's scope so that the guarded blocks below share them.
    fn row_state(&mut self) {
        self.w("
    // This invocation's rows: their ranges (within the chunk), positions and
    // online-softmax state; its block of O.");
        for i in 0..self.max_rq {
            self.w(format!("    var live{i} = false;"));
            self.w(format!("    var qrow{i} = 0u;"));
            self.w(format!("    var lo{i} = 0;"));
            self.w(format!("    var hi{i} = -1;"));
            self.w(format!("    var m{i} = MASKED;"));
            self.w(format!("    var l{i} = 0.0;"));
            self.w(format!("    var fl{i} = 0u;"));
            for c in (0..MAX_DVT).filter(|&c| has_o(i, c)) {
                self.w(format!("    var o{i}_{c} = vec4<f32>(0.0);"));
            }
        }
    }

    /// Each row's key range and, past the first chunk, its state resumed.
    fn row_ranges_and_resume(&mut self) {
        for i in 0..self.max_rq {
            self.emit(guard(&[rq(i)], row_setup(i), 4));
        }
    }

    /// Where the invocation reads: K's and V's rows in storage, the ALiBi
    /// slope, its first Q row, P row and key in the tiles, and its vec4
    /// columns of V (in the chunked form, their chunk and place in it).
    fn tile_offsets(&mut self) {
        let mut text = String::from(
            "    let kv_base = (b * p.kv_heads + kvh) * p.keys;
    let slope = head_slope(h);
    ",
        );
        if self.chunked {
            text.push_str(
                "// Its vec4 columns of V: their chunk's first row and their place in it
    // (a column past Dv, where TK does not divide DV4, reads the row's last
    // vec4 and is never stored).",
            );
        } else {
            text.push_str("// Where the invocation's first query row starts in the Q tile");
            if !self.shuffle {
                text.push_str(" and in\n    // P's");
            }
            text.push_str(
                ", and its
    // first key in the K tile: its other rows are TQ rows on, its keys TK
    // keys on (constant offsets from these). Its vec4 columns of V: a column
    // past Dv (where TK does not divide DV4) reads the row's last vec4 and is
    // never stored.
    let q_at = tr * QS;
    let k_at = tc * KS;",
            );
            if !self.shuffle {
                text.push_str(
                    "
    let p_at = tr * ps;",
                );
            }
        }
        self.w(text);
        for c in 0..MAX_DVT {
            self.w(format!("    let v_at{c} = min(tc + TK * {c}u, DV4 - 1u);"));
            if self.chunked {
                self.w(format!("    let v_chunk{c} = (v_at{c} / CW) * BK;"));
                self.w(format!("    let v_col{c} = v_at{c} % CW;"));
            }
        }
    }

    /// The first key tile, and the prefetch registers with its K (and in the
    /// shuffle form its V) loaded, before the key loop.
    fn first_prefetch(&mut self) {
        self.w("
    var j0 = wg_lo - wg_lo % i32(BK);");
        if self.shuffle {
            self.w("    // The prefetch registers: the first K and V tiles.");
            for sl in 0..MAX_SLOTS {
                self.w(format!("    var pf{sl} = vec4<f32>(0.0);"));
                self.w(format!("    var pv{sl} = vec4<f32>(0.0);"));
            }
            self.emit(prefetch_loads(&[K_INTO_PF, V_INTO_PV], "j0", 4));
        } else {
            self.w("    // The prefetch registers: the first K tile.");
            for sl in 0..MAX_SLOTS {
                self.w(format!("    var pf{sl} = vec4<f32>(0.0);"));
            }
            self.emit(prefetch_loads(&[K_INTO_PF], "j0", 4));
        }
    }

    /// The shuffle form's key loop opening and step 1: K's and V's tiles from
    /// the prefetch registers or from storage, the tile's non-finite V noted.
    fn stage_k_and_v(&mut self) {
        self.w("    var tile_no = 0u;
    for (; j0 <= wg_hi; j0 += i32(BK)) {
        // 1. K's and V's tiles (zeros past the last key and past the head
        // dim); a non-finite value in V's is noted under the tile's number.
        tile_no += 1u;
        var bad = false;
        if (PREFETCH) {");
        for sl in 0..MAX_SLOTS {
            self.emit(guard(
                &[slots(sl)],
                lines![
                    format!("slot_store(li + {sl}u * WG, DK4, pf{sl});"),
                    format!("slot_store_v(li + {sl}u * WG, DV4, pv{sl});"),
                    format!("bad = bad || nonfinite4(pv{sl});"),
                ],
                12,
            ));
        }
        self.w("        } else {");
        self.emit(prefix(
            "            ",
            &self.staging_loop(1, "k_tile", "DK4", "p.dk", &[]),
        ));
        self.emit(prefix(
            "            ",
            &self.staging_loop(
                2,
                "v_tile",
                "DV4",
                "p.dv",
                &["bad = bad || nonfinite4(val);"],
            ),
        ));
        self.w("        }
        if (bad) {
            atomicMax(&v_nonfinite, tile_no);
        }
        workgroupBarrier();
        let careful = atomicLoad(&v_nonfinite) == tile_no;");
    }

    /// The shuffle form's loads of the next K and V tiles into the prefetch
    /// registers, in flight while this tile is multiplied.
    fn prefetch_next_k_and_v(&mut self) {
        self.w("        // The next tiles in flight while this one is multiplied.");
        self.emit(prefetch_loads(&[K_INTO_PF, V_INTO_PV], "j0 + i32(BK)", 8));
    }

    /// The key loop opening and step 1 (not the shuffle form): K's tile from
    /// the prefetch registers or from storage.
    fn stage_k(&mut self) {
        self.w("    for (; j0 <= wg_hi; j0 += i32(BK)) {
        // 1. K's tile (zeros past the last key and past Dk).
        if (li == 0u) {
            atomicStore(&v_nonfinite, 0u);
        }
        if (PREFETCH) {");
        for sl in 0..MAX_SLOTS {
            self.emit(guard(
                &[slots(sl)],
                lines![format!("slot_store(li + {sl}u * WG, DK4, pf{sl});")],
                12,
            ));
        }
        self.w("        } else {");
        self.emit(prefix(
            "            ",
            &self.staging_loop(1, "kv_tile", "DK4", "p.dk", &[]),
        ));
        self.w("        }
        workgroupBarrier();");
    }

    /// The loads of V's tile into the prefetch registers (not the shuffle
    /// form), in flight while S is computed.
    fn prefetch_v(&mut self) {
        self.w("        // V's tile in flight while S is computed.");
        self.emit(prefetch_loads(&[V_INTO_PF], "j0", 8));
    }

    /// Step 2: the score registers and S = Q K^T into them, under phase SCORES
    /// (whose stand-in gives scores the compiler cannot fold).
    fn scores(&mut self) {
        self.w("
        // 2. S = Q K^T, RQ x RK per invocation.");
        for i in 0..self.max_rq {
            for j in 0..MAX_RK {
                self.w(format!("        var s{i}_{j} = 0.0;"));
            }
        }
        let scores_start = self.out.len();
        if self.chunked {
            self.scores_by_chunk();
        } else {
            self.scores_by_column_pair();
        }
        let unseen = self.unseen_scores();
        self.keep_phase(scores_start, "SCORES", 8, &unseen);
    }

    /// The chunked form's S = Q K^T: a chunk of CW columns a step (constant
    /// columns: one clamp per row and chunk), then the last DK4 % CW columns
    /// one a step; the chains add in column order.
    fn scores_by_chunk(&mut self) {
        self.w("        for (var chunk = 0u; chunk < DK4 / CW; chunk++) {
            let qc = chunk * BQ + tr;
            let kc = chunk * BK + tc;");
        for col in 0..CW {
            self.emit(indent("            ", &self.s_step(&format!("{col}u"))));
        }
        self.w("        }
        for (var col = 0u; col < DK4 % CW; col++) {
            let qc = (DK4 / CW) * BQ + tr;
            let kc = (DK4 / CW) * BK + tc;");
        self.emit(indent("            ", &self.s_step("col")));
        self.w("        }");
    }

    /// S = Q K^T two columns a step (so each step's loads can be issued
    /// together), and the last column of an odd DK4 after the loop; the chains
    /// add in column order.
    fn scores_by_column_pair(&mut self) {
        self.w("        for (var d4 = 0u; d4 + 1u < DK4; d4 += 2u) {");
        let mut steps = self.s_step("d4");
        steps.extend(self.s_step("d4 + 1u"));
        self.emit(indent("            ", &steps));
        self.w("        }");
        self.emit(guard(&["DK4 % 2u == 1u"], self.s_step("DK4 - 1u"), 8));
    }

    /// Without S = Q K^T the scores are zeros the compiler cannot see (a key
    /// count is below 2^31), so that the rules on them are not folded away.
    fn unseen_scores(&self) -> Vec<String> {
        let mut unseen = lines!["let unseen = f32(p.keys >> 31u);"];
        for i in 0..self.max_rq {
            for j in 0..MAX_RK {
                unseen.extend(guard(
                    &[rq(i), rk(j)],
                    lines![format!("s{i}_{j} = unseen;")],
                    0,
                ));
            }
        }
        unseen
    }

    /// Step 2's rules on each row's scores and the row's tile maximum: to
    /// `row_parts`, or in the shuffle form through step 3 in the same block.
    /// Under phase SOFTMAX.
    fn rules(&mut self) {
        self.w(
            "        // Scale, softcap, mask, ALiBi (the temperature divides the online
        // softmax's exponents). Keys a row does not attend become MASKED; a
        // NaN or +inf score poisons the row and counts as -inf from here on.",
        );
        let rules_start = self.out.len();
        for i in 0..self.max_rq {
            let mut lines = row_rules(i);
            if self.shuffle {
                lines.extend(shuffle_softmax(i));
            } else {
                lines.push(format!(
                    "row_parts[part_at + {i}u * TQ * (TK / 4u)][tc % 4u] = part;"
                ));
            }
            let mut block = lines!["{"];
            block.extend(prefix("    ", &lines));
            block.push("}".into());
            self.emit(guard(&[rq(i)], block, 8));
        }
        self.keep_phase(rules_start, "SOFTMAX", 8, &[]);
    }

    /// Step 3 (not the shuffle form): the rows' new maxima from their
    /// partials, O and the partial sums rescaled and P into P's tile, under
    /// phase SOFTMAX.
    fn softmax_and_p(&mut self) {
        self.w("        workgroupBarrier();

        // 3. The rows' new maxima; O and the partial sums rescaled; P.");
        let softmax_start = self.out.len();
        // Without the softmax, the raw scores stand in for P, so that S = Q K^T
        // (read by nothing else here) is not dead code the compiler drops.
        let mut raw_p = Vec::new();
        for i in 0..self.max_rq {
            self.emit(self.softmax_row(i));
            raw_p.extend(self.raw_p_row(i));
        }
        self.keep_phase(softmax_start, "SOFTMAX", 8, &raw_p);
    }

    /// Row i's step 3: its tile maximum from the TK partials, then the online
    /// softmax with P kept in P's tile.
    fn softmax_row(&self, i: usize) -> Vec<String> {
        let mut lines = lines![
            "{",
            format!("    let rr = tr + TQ * {i}u;"),
            "    var tile_max = MASKED;",
        ];
        lines.extend(prefix(
            "    ",
            &row_parts_read(&["tile_max = max(tile_max, max(max(v.x, v.y), max(v.z, v.w)));"]),
        ));
        let keep = |j: usize| self.keep_p(i, j);
        lines.extend(indent("    ", &online_softmax(i, "tile_max", keep)));
        lines.push("}".into());
        guard(&[rq(i)], lines, 8)
    }

    /// Row i's stand-in for step 3 where the softmax is ablated: its raw
    /// scores kept in P's tile.
    fn raw_p_row(&self, i: usize) -> Vec<String> {
        let mut raw = Vec::new();
        for j in 0..MAX_RK {
            let mut body = lines!["{", format!("    let pt = s{i}_{j};")];
            body.extend(prefix("    ", &self.keep_p(i, j)));
            body.push("}".into());
            raw.extend(guard(&[rk(j)], body, 0));
        }
        let mut body = lines!["{", format!("    let rr = tr + TQ * {i}u;")];
        body.extend(prefix("    ", &raw));
        body.push("}".into());
        guard(&[rq(i)], body, 0)
    }

    /// The lines that keep row i's P of key j (`pt`) in P's tile. Key tc + TK j
    /// of the tile is in vec4 (tc + TK j) / 4 = tc / 4 + j TK / 4 of the row
    /// (TK a multiple of 4), component tc % 4.
    fn keep_p(&self, i: usize, j: usize) -> Vec<String> {
        if self.chunked {
            lines![
                format!("let t4 = tc / 4u + {j}u * (TK / 4u);"),
                "p_tile[(t4 / CW) * BQ + rr][t4 % CW][tc % 4u] = pt;",
            ]
        } else {
            lines![format!(
                "p_tile[p_at + {i}u * TQ * ps + tc / 4u + {j}u * (TK / 4u)][tc % 4u] = pt;"
            )]
        }
    }

    /// The rest of step 3 (not the shuffle form): V's tile in place of K's,
    /// from the prefetch registers or from storage, a non-finite value noted.
    fn stage_v(&mut self) {
        self.w(
            "        // V's tile replaces K's (every read of K ended at the barrier above).
        if (PREFETCH) {
            var bad = false;",
        );
        for sl in 0..MAX_SLOTS {
            self.emit(guard(
                &[slots(sl)],
                lines![
                    format!("slot_store(li + {sl}u * WG, DV4, pf{sl});"),
                    format!("bad = bad || nonfinite4(pf{sl});"),
                ],
                12,
            ));
        }
        self.w("            if (bad) {
                atomicStore(&v_nonfinite, 1u);
            }
        } else {");
        self.emit(prefix(
            "            ",
            &self.staging_loop(
                2,
                "kv_tile",
                "DV4",
                "p.dv",
                &[
                    "if (nonfinite4(val)) {",
                    "    atomicStore(&v_nonfinite, 1u);",
                    "}",
                ],
            ),
        ));
        self.w("        }
        workgroupBarrier();");
    }

    /// The loads of the next K tile into the prefetch registers (not the
    /// shuffle form), in flight while O += P V is computed.
    fn prefetch_next_k(&mut self) {
        self.w("        // The next K tile in flight while O += P V is computed.");
        self.emit(prefetch_loads(&[K_INTO_PF], "j0 + i32(BK)", 8));
    }

    /// O += P V (step 4; step 3 in the shuffle form), careful where V's tile
    /// holds a non-finite value, under phase PRODUCT.
    fn product_step(&mut self) {
        if self.shuffle {
            self.w("
        // 3. O += P V, RQ x DVT vec4s per invocation, a key a step, its P
        // shuffled from the lane that holds it. Columns past Dv read some
        // vec4 of the tile and are never stored.");
        } else {
            self.w("

        // 4. O += P V, RQ x DVT vec4s per invocation, four keys a step.
        // Columns past Dv read some vec4 of the tile and are never stored.
        let careful = atomicLoad(&v_nonfinite) != 0u;");
        }
        let product_start = self.out.len();
        self.w("        if (careful) {");
        let careful = if self.shuffle {
            self.product_shuffle(true)
        } else {
            self.product(true)
        };
        self.emit(indent("            ", &careful));
        self.w("        } else {");
        let plain = if self.shuffle {
            self.product_shuffle(false)
        } else {
            self.product(false)
        };
        self.emit(indent("            ", &plain));
        self.w("        }");
        self.keep_phase(product_start, "PRODUCT", 8, &[]);
    }

    /// The key loop's end: the last barrier of a tile, before the next
    /// tile's K overwrites this one's V.
    fn end_key_loop(&mut self) {
        self.w("        workgroupBarrier();
    }");
    }

    /// The rows' partial sums and flags gathered in workgroup memory (in the
    /// shuffle form, a bad lane layout noted too), then the barriers before
    /// the epilogue reads them.
    fn gather_row_sums(&mut self) {
        let mut text = String::from(
            "
    // The rows' sums and flags, gathered from their TK invocations.",
        );
        if self.shuffle {
            text.push_str(
                "
    if (!layout_ok) {
        atomicOr(&layout_bad, 1u);
    }",
            );
        }
        self.w(text);
        for i in 0..self.max_rq {
            self.emit(guard(
                &[rq(i)],
                lines![
                    format!("row_parts[part_at + {i}u * TQ * (TK / 4u)][tc % 4u] = l{i};"),
                    format!("atomicOr(&row_flags[tr + TQ * {i}u], fl{i});"),
                ],
                4,
            ));
        }
        self.w("    workgroupBarrier();
    // Every invocation's resume reads of `lse` (the row state) come before
    // column 0 overwrites it below: a storage barrier orders those too.
    storageBarrier();");
    }

    /// The epilogue, row by row: each row's sum, then Y and `lse`.
    fn epilogue(&mut self) {
        for i in 0..self.max_rq {
            self.emit(guard(&[rq(i)], self.row_epilogue(i), 4));
        }
    }

    /// Row i's epilogue: its sum from the TK partials and its flags, then its
    /// writes for the next chunk or, at the last chunk, its results.
    fn row_epilogue(&self, i: usize) -> Vec<String> {
        let mut lines = lines![
            format!("if (live{i}) {{"),
            format!("    let rr = tr + TQ * {i}u;"),
            "    var total = 0.0;",
        ];
        lines.extend(prefix(
            "    ",
            &row_parts_read(&[
                "total += v.x;",
                "total += v.y;",
                "total += v.z;",
                "total += v.w;",
            ]),
        ));
        lines.extend(lines![
            if self.shuffle {
                "    let flags = atomicLoad(&row_flags[rr]) | select(0u, ROW_ATTENDED | ROW_POISONED, atomicLoad(&layout_bad) != 0u);"
            } else {
                "    let flags = atomicLoad(&row_flags[rr]);"
            },
            format!("    let r = head_index * p.q_len + qrow{i};"),
            "    let y_base = r * p.dv;",
            "    if ((p.chunk_flags & LAST_CHUNK) == 0u) {",
        ]);
        lines.extend(next_chunk_writes(i));
        lines.push("    } else {".into());
        lines.extend(last_chunk_writes(i));
        lines.extend(lines!["    }", "}"]);
        lines
    }

    /// Closes main; the whole file, ending in one newline.
    fn finish(mut self) -> String {
        self.w("}");
        format!("{}\n", self.out.join("\n"))
    }
}

/// Row i's key range and, past the first chunk, its state from the previous
/// chunk: m, its flags, its sum (column 0's) and its O from Y.
fn row_setup(i: usize) -> Vec<String> {
    let mut body = lines![
        "{",
        format!("    let row = row0 + tr + TQ * {i}u;"),
        format!("    live{i} = live_block && row < p.q_len;"),
        format!("    qrow{i} = min(row, p.q_len - 1u);"),
        format!("    let range = key_range(qrow{i}, offset, lengths);"),
        format!("    lo{i} = max(range.x, i32(p.chunk_start));"),
        format!("    hi{i} = min(range.y, i32(p.chunk_end) - 1);"),
        format!("    if ((p.chunk_flags & FIRST_CHUNK) == 0u && live{i}) {{"),
        "        // Resume: the row's state from the previous chunk. Its sum is",
        "        // taken by column 0 only (the partial sums add up at the end).",
        format!("        let r = head_index * p.q_len + qrow{i};"),
        format!("        fl{i} = lse[r];"),
        format!("        m{i} = bitcast<f32>(lse[rows_total + r]);"),
        "        if (tc == 0u) {",
        format!("            l{i} = bitcast<f32>(lse[2u * rows_total + r]);"),
        "        }",
        format!("        if ((fl{i} & ROW_ATTENDED) != 0u) {{"),
    ];
    for c in (0..MAX_DVT).filter(|&c| has_o(i, c)) {
        body.extend(guard(
            &[dvt(c)],
            lines![
                format!("if (tc + TK * {c}u < DV4) {{"),
                format!("    o{i}_{c} = y_quad(r * p.dv, (tc + TK * {c}u) * 4u);"),
                "}",
            ],
            12,
        ));
    }
    body.extend(lines!["        }", "    }", "}"]);
    body
}

/// Row i's rules on its scores (its keys, each under the key's guard), and
/// its tile maximum as `part`.
fn row_rules(i: usize) -> Vec<String> {
    let mut lines = lines![
        "let mask_base = b * p.mask_batch_stride + h * p.mask_head_stride",
        format!("    + qrow{i} * p.mask_row_stride;"),
        format!("let span = vec4<i32>(lo{i}, select(lo{i} - 1, hi{i}, live{i}), bitcast<i32>(mask_base), offset + i32(qrow{i}));"),
        "var part = MASKED;",
    ];
    for j in 0..MAX_RK {
        lines.extend(guard(&[rk(j)], score_rules(i, j), 0));
    }
    lines
}

/// The rules on score s{i}_{j} (`scored`, attention_score.wgsl): MASKED
/// where the row does not attend the key, its flags noted.
fn score_rules(i: usize, j: usize) -> Vec<String> {
    lines![
        format!("let sc{j} = scored(s{i}_{j}, j0 + i32(tc + TK * {j}u), span, slope);"),
        format!("fl{i} |= sc{j}.flags;"),
        format!("part = max(part, sc{j}.s);"),
        format!("s{i}_{j} = sc{j}.s;"),
    ]
}

/// Row i's writes where another chunk follows: O as it is into Y, and the
/// row's flags, maximum and sum into `lse` (by column 0).
fn next_chunk_writes(i: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for c in (0..MAX_DVT).filter(|&c| has_o(i, c)) {
        lines.extend(guard(
            &[dvt(c)],
            lines![
                format!("if (tc + TK * {c}u < DV4) {{"),
                format!("    store_y_quad(y_base, (tc + TK * {c}u) * 4u, o{i}_{c});"),
                "}",
            ],
            8,
        ));
    }
    lines.extend(lines![
        "        if (tc == 0u) {",
        "            lse[r] = flags;",
        format!("            lse[rows_total + r] = bitcast<u32>(m{i});"),
        "            lse[2u * rows_total + r] = bitcast<u32>(total);",
        "        }",
    ]);
    lines
}

/// Row i's writes at the last chunk: O normalised into Y and the logsumexp
/// into `lse` (zeros and -inf for a row that attends nothing, NaN for a
/// poisoned one).
fn last_chunk_writes(i: usize) -> Vec<String> {
    let mut lines = lines![
        "        // Normalise. A row with no attended key gets zeros and -inf; a",
        "        // poisoned row, or one whose attended scores were all -inf (sum 0), NaN.",
        "        let attended = (flags & ROW_ATTENDED) != 0u;",
        "        let nan_row = attended && ((flags & ROW_POISONED) != 0u || !(total > 0.0));",
        "        let inv = select(0.0, 1.0 / total, total > 0.0);",
    ];
    for c in (0..MAX_DVT).filter(|&c| has_o(i, c)) {
        lines.extend(guard(
            &[dvt(c)],
            lines![
                format!("if (tc + TK * {c}u < DV4) {{"),
                "    var val = vec4<f32>(0.0);",
                "    if (nan_row) {",
                "        val = vec4<f32>(nan());",
                "    } else if (attended) {",
                format!("        val = o{i}_{c} * inv;"),
                "    }",
                format!("    store_y_quad(y_base, (tc + TK * {c}u) * 4u, val);"),
                "}",
            ],
            8,
        ));
    }
    lines.extend(lines![
        "        if (tc == 0u) {",
        "            var bits = NEG_INF_BITS;",
        "            if (nan_row) {",
        "                bits = NAN_BITS;",
        "            } else if (attended) {",
        format!(
            "                bits = bitcast<u32>(tempered(m{i}, p.inv_temperature) + log(total));"
        ),
        "            }",
        "            lse[r] = bits;",
        format!("            lse[rows_total + r] = bitcast<u32>(m{i});"),
        "            lse[2u * rows_total + r] = bitcast<u32>(select(total, nan(), nan_row));",
        "        }",
    ]);
    lines
}

/// The WGSL of `form`: the whole file, ending in one newline.
pub(crate) fn render(form: TiledForm) -> String {
    let mut g = Gen::new(form);
    g.w(header(form));
    g.overview();
    g.overrides();
    g.constants();
    g.bindings();
    g.workgroup_memory();
    g.helper_functions();
    g.main_opening();
    g.invocation_cell();
    g.workgroup_state_init();
    g.q_block_staging();
    g.key_range();
    g.row_state();
    g.row_ranges_and_resume();
    g.tile_offsets();
    g.first_prefetch();
    if g.shuffle {
        g.stage_k_and_v();
        g.prefetch_next_k_and_v();
    } else {
        g.stage_k();
        g.prefetch_v();
    }
    g.scores();
    g.rules();
    if !g.shuffle {
        g.softmax_and_p();
        g.stage_v();
        g.prefetch_next_k();
    }
    g.product_step();
    g.end_key_loop();
    g.gather_row_sums();
    g.epilogue();
    g.finish()
}
