//! The subgroup-shuffle GEMM's WGSL ([`crate::kernels::gemm::subgroup::GEMM_SG`]), unrolled.
//!
//! WGSL has no macros, and a private array indexed by a loop variable is slow
//! (PERFORMANCE.md), so the accumulators (rows x groups vec4s: 64 at
//! [`ROWS`] x [`GROUPS`]) are named and the loops over rows, column groups
//! and slots are written out here. The engine makes the text when the
//! pipeline is built, from [`render`] at [`ROWS`] x [`GROUPS`].

use crate::shader::kernel::{Binding, Kernel, KernelDef, Needs, Origin};
use crate::shader::uniform::ParamsText;

/// Rows of C per invocation that the engine's kernel uses.
pub(crate) const ROWS: u32 = 4;
/// Column groups of 4 per subgroup that the engine's kernel uses.
pub(crate) const GROUPS: u32 = 16;

/// Where the `pick` function goes in the text, filled in once the slots are
/// known (the text before it is written first).
const PICK_PLACEHOLDER: &str = "PICK_PLACEHOLDER";

/// The vec4 components in order, as indexed by a k offset within a step.
const XYZW: [char; 4] = ['x', 'y', 'z', 'w'];

// The slots hold the columns in groups of 4: at least one slot.
const _: () = assert!(GROUPS >= 4 && GROUPS.is_multiple_of(4));

/// The text's first line: where it comes from, for a reader of a compiled or
/// dumped shader.
const HEADER: &str =
    "// Made by src/kernels/gemm/subgroup.rs when the pipeline is built; edit the generator.";

/// The kernel with `rows` rows of C per invocation and `groups` column groups
/// of 4 per subgroup (`groups` a multiple of 4, at least 4); the whole text,
/// ending in one newline.
///
/// Measured on lavapipe (2 cores, same-run ratios to the FMA ceiling,
/// 1024^3): 8 x 16 reached 50-53% but took 20 s to compile per pipeline
/// variant; 4 x 16 reaches 44-48% and compiles in about 5 s; 8 x 8 reached
/// 30%.
pub(crate) fn render(rows: u32, groups: u32) -> String {
    let mut g = Gen::new(rows, groups);
    g.w(HEADER);
    g.overview();
    g.overrides_and_constants();
    g.params_block();
    g.bindings();
    g.load_functions();
    g.pick_function();
    g.store_functions();
    g.main_opening();
    g.lane_setup();
    g.registers();
    g.k_loop();
    g.epilogue();
    g.finish()
}

/// The WGSL being written for one shape: its entries (each one or more
/// lines, joined by newlines at the end) and the shape the sections need.
struct Gen {
    /// The text so far; an entry may hold several lines.
    out: Vec<String>,
    /// Rows of C per invocation.
    rows: u32,
    /// Column groups of 4 per subgroup.
    groups: u32,
    /// Slots per lane at the smallest subgroup width (4): `groups / 4`.
    max_slots: u32,
}

impl Gen {
    /// The generator of the `rows` x `groups` kernel, nothing written yet.
    fn new(rows: u32, groups: u32) -> Self {
        Gen {
            out: Vec::new(),
            rows,
            groups,
            // groups / the smallest subgroup width (4)
            max_slots: groups / 4,
        }
    }

    /// Appends one entry (one or more lines).
    fn w(&mut self, text: impl Into<String>) {
        self.out.push(text.into());
    }

    /// The comment that explains the kernel: why shuffles, its layout and how
    /// it handles any M, N and K.
    fn overview(&mut self) {
        let (rows, groups) = (self.rows, self.groups);
        let cols = groups * 4;
        let accumulators = rows * groups;
        self.w(format!(
            r"//
// Subgroup-shuffle GEMM for CPU-backed adapters (lavapipe, SwiftShader):
// C[z] = alpha * op(A[z]) * op(B[z]) + beta * C[z], with gemm.wgsl's Params and
// batching rules (b_batch_div lets several query heads share one KV head).
//
// Why: these drivers run a subgroup as SIMD lanes, and a storage load costs a
// loop over the lanes with a bounds check per component, while a subgroup
// shuffle is one permute. So loads are made few and wide (vec4 where the rows
// are 16-byte aligned) and shared through shuffles instead of workgroup memory.
//
// Layout: a workgroup is one subgroup of SG invocations (4 or 8) and computes
// {rows} * SG rows by {cols} columns of C. Invocation `lane` owns rows
// {rows} * lane .. +{rows} ({rows} rows x {groups} groups of 4 columns = {accumulators}
// named vec4 accumulators). Per step of 4 k values it loads its own rows of
// op(A) (one vec4 each) and SLOTS = {groups} / SG vec4 column groups of op(B) per k;
// column group g then comes from lane g % SG, slot g / SG, by shuffle.
//
// Any M, N, K works: rows and columns past the matrix are clamped for loading
// and skipped when storing; a K that is not a multiple of 4 ends with a masked
// step, so values past K never enter a sum (not even as 0 * inf).
"
        ));
    }

    /// The override constants (transposes, vec4 views, the marked-A switch,
    /// the subgroup width and slots) and the tile's rows and columns.
    fn overrides_and_constants(&mut self) {
        let (rows, groups) = (self.rows, self.groups);
        let cols = groups * 4;
        self.w(format!(
            r"override TRANS_A: bool = false;
override TRANS_B: bool = false;
// op(A) rows (resp. op(B) rows, or B's stored rows when transposed) start on
// 16-byte boundaries, so they are read through the vec4 views.
override VEC_A: bool = false;
override VEC_B: bool = false;
// Skip every term whose A value is -0 (the mark of a key not attended, as
// bits), so that -0 * NaN or -0 * inf in B adds nothing: attention's P V,
// where such a key's V row may hold anything, while an attended key whose
// probability is +0 still multiplies its row (gemm.wgsl has the same switch).
override SKIP_MARKED_A: bool = false;
override SG: u32 = 8u;
override SLOTS: u32 = {groups}u / SG;

const ROWS: u32 = {rows}u;
const COLS: u32 = {cols}u;
"
        ));
    }

    /// The parameter block: GEMM's, written from its Rust definition
    /// (`kernels::gemm::Params`) where the text is made into a kernel.
    fn params_block(&mut self) {
        self.w("// #include PARAMS\n");
    }

    /// The bindings: the uniforms, A and B (each as f32 and as vec4 views)
    /// and C.
    fn bindings(&mut self) {
        self.w(r"@group(0) @binding(0) var<uniform> p: Params;
// A and B are each bound twice, as f32 and as vec4 views of one buffer.
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> c: array<f32>;
");
    }

    /// The marked-A test and the loads of op(A) and op(B) quads.
    fn load_functions(&mut self) {
        self.w(r"// Whether an A value is the mark -0 (SKIP_MARKED_A).
fn marked(x: f32) -> bool {
    return bitcast<u32>(x) == 0x80000000u;
}

// op(A)[row][k0 .. k0 + 4], where `line` is the row's first element (the
// column's, when A is stored transposed).
fn a_quad(line: u32, k0: u32) -> vec4<f32> {
    if (VEC_A) {
        return a4[(line + k0) / 4u];
    }
    if (TRANS_A) {
        return vec4<f32>(a[k0 * p.lda + line], a[(k0 + 1u) * p.lda + line],
                         a[(k0 + 2u) * p.lda + line], a[(k0 + 3u) * p.lda + line]);
    }
    return vec4<f32>(a[line + k0], a[line + k0 + 1u], a[line + k0 + 2u], a[line + k0 + 3u]);
}

// Four consecutive elements of B from element `start` (16-byte aligned when VEC_B).
fn b_quad(start: u32) -> vec4<f32> {
    if (VEC_B) {
        return b4[start / 4u];
    }
    return vec4<f32>(b[start], b[start + 1u], b[start + 2u], b[start + 3u]);
}

// op(B)[k][col .. col + 4] for non-transposed B (col clamped to the last full group).
fn b_row(base: u32, k: u32, col: u32) -> vec4<f32> {
    return b_quad(base + k * p.ldb + col);
}
");
    }

    /// Where the `pick` function goes ([`Gen::finish`] fills it in).
    fn pick_function(&mut self) {
        self.w(PICK_PLACEHOLDER);
    }

    /// The stores of C (alpha and beta applied), one value and one quad.
    fn store_functions(&mut self) {
        self.w(r"fn store(index: u32, value: f32) {
    if (p.beta == 0.0) {
        c[index] = p.alpha * value;
    } else {
        c[index] = p.alpha * value + p.beta * c[index];
    }
}

fn store_quad(c_base: u32, row: u32, col: u32, v: vec4<f32>) {
    if (row >= p.m) {
        return;
    }
    let start = c_base + row * p.ldc + col;
    if (col < p.n) { store(start, v.x); }
    if (col + 1u < p.n) { store(start + 1u, v.y); }
    if (col + 2u < p.n) { store(start + 2u, v.z); }
    if (col + 3u < p.n) { store(start + 3u, v.w); }
}
");
    }

    /// Main's signature and the workgroup's tile: its batch entry, first row
    /// and column, the matrices' bases and the last row and columns.
    fn main_opening(&mut self) {
        self.w(r"@compute @workgroup_size(SG, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let flat = wid.x + wid.y * nwg.x;
    let tiles = p.tiles_m * p.tiles_n;
    let z = flat / tiles;
    if (z >= p.batch) {
        return;
    }
    let tile = flat % tiles;
    let row0 = (tile / p.tiles_n) * ROWS * SG + ROWS * lane;
    let col0 = (tile % p.tiles_n) * COLS;
    let a_base = p.a_offset + z * p.a_stride;
    let b_base = p.b_offset + ((p.b_batch_base + z) / p.b_batch_div) * p.b_stride;
    let c_base = p.c_offset + z * p.c_stride;
    let last_row = p.m - 1u;
    let last_col = p.n - 1u;
    // The last column group that starts inside the matrix.
    let last_group_col = last_col & ~3u;
");
    }

    /// The start of each of the lane's rows of op(A), and each slot's first
    /// column of op(B) (clamped).
    fn lane_setup(&mut self) {
        for r in 0..self.rows {
            self.w(format!(
                "    let line{r} = a_base + select(min(row0 + {r}u, last_row) * p.lda, min(row0 + {r}u, last_row), TRANS_A);"
            ));
        }
        // Per slot: the first column of this lane's group (clamped).
        for s in 0..self.max_slots {
            self.w(format!(
                "    let scol{s} = min(col0 + 4u * ({s}u * SG + lane), last_group_col);"
            ));
        }
    }

    /// The named registers: the accumulators and the slots of op(B).
    fn registers(&mut self) {
        for r in 0..self.rows {
            for g in 0..self.groups {
                self.w(format!("    var acc{r}_{g} = vec4<f32>(0.0);"));
            }
        }
        for s in 0..self.max_slots {
            for kk in 0..4 {
                self.w(format!("    var b{s}_{kk} = vec4<f32>(0.0);"));
            }
        }
    }

    /// The loop over k, 4 values a step (every step masked).
    fn k_loop(&mut self) {
        self.w("    for (var k0 = 0u; k0 < p.k; k0 += 4u) {");
        let step = self.step(true);
        self.out.extend(step);
        self.w("    }");
    }

    /// One step of 4 k values (`masked`: the values past K are zeroed, so the
    /// loop needs no separate tail), at the loop body's indent.
    fn step(&self, masked: bool) -> Vec<String> {
        let ind = "        ";
        let mut lines: Vec<String> = Vec::new();
        if masked {
            lines.push(format!(
                "{ind}let keep = vec4<u32>(k0, k0 + 1u, k0 + 2u, k0 + 3u) < vec4<u32>(p.k);"
            ));
            lines.push(format!("{ind}let zero = vec4<f32>(0.0);"));
        }
        for r in 0..self.rows {
            if masked {
                lines.push(format!(
                    "{ind}let q{r} = select(zero, a_quad(line{r}, k0), keep);"
                ));
            } else {
                lines.push(format!("{ind}let q{r} = a_quad(line{r}, k0);"));
            }
        }
        for s in 0..self.max_slots {
            lines.extend(slot_loads(masked, s));
        }
        for g in 0..self.groups {
            lines.extend(self.group_products(g));
        }
        lines
    }

    /// Column group g's four rows of op(B) shuffled from the lane that holds
    /// them, and each row's products added to its accumulator (skipping
    /// marked A values under SKIP_MARKED_A).
    fn group_products(&self, g: u32) -> Vec<String> {
        let ind = "        ";
        let mut lines: Vec<String> = Vec::new();
        for kk in 0..4 {
            let slots = (0..self.max_slots)
                .map(|s| format!("b{s}_{kk}"))
                .collect::<Vec<_>>()
                .join(", ");
            lines.push(format!(
                "{ind}let s{kk}_{g} = subgroupShuffle(pick({g}u / SG, {slots}), {g}u % SG);"
            ));
        }
        lines.push(format!("{ind}if (SKIP_MARKED_A) {{"));
        for r in 0..self.rows {
            let terms = XYZW
                .iter()
                .enumerate()
                .map(|(kk, c)| {
                    format!("select(q{r}.{c} * s{kk}_{g}, vec4<f32>(0.0), marked(q{r}.{c}))")
                })
                .collect::<Vec<_>>()
                .join(" + ");
            lines.push(format!("{ind}    acc{r}_{g} += {terms};"));
        }
        lines.push(format!("{ind}}} else {{"));
        for r in 0..self.rows {
            lines.push(format!(
                "{ind}    acc{r}_{g} += q{r}.x * s0_{g} + q{r}.y * s1_{g} + q{r}.z * s2_{g} + q{r}.w * s3_{g};"
            ));
        }
        lines.push(format!("{ind}}}"));
        lines
    }

    /// The stores of C: the accumulators through a private array, so the
    /// store code exists once.
    fn epilogue(&mut self) {
        let (rows, groups) = (self.rows, self.groups);
        // The epilogue goes through a private array so the store code exists once.
        self.w(format!(
            "    var tile_out: array<array<vec4<f32>, {groups}>, {rows}>;"
        ));
        for r in 0..rows {
            for g in 0..groups {
                self.w(format!("    tile_out[{r}][{g}] = acc{r}_{g};"));
            }
        }
        self.w("    for (var r = 0u; r < ROWS; r++) {");
        self.w("        for (var g = 0u; g < COLS / 4u; g++) {");
        self.w("            store_quad(c_base, row0 + r, col0 + 4u * g, tile_out[r][g]);");
        self.w("        }");
        self.w("    }");
    }

    /// Closes main and fills in the `pick` function; the whole text, ending
    /// in one newline.
    fn finish(mut self) -> String {
        self.w("}");
        let max_slots = self.max_slots;
        let params = (0..max_slots)
            .map(|s| format!("v{s}: vec4<f32>"))
            .collect::<Vec<_>>()
            .join(", ");
        let cases = (0..max_slots.saturating_sub(1))
            .map(|s| format!("        case {s}u: {{ return v{s}; }}"))
            .collect::<Vec<_>>()
            .join("\n");
        // `groups` is at least 4 (the engine takes GROUPS): fewer leaves no slot.
        let last = i64::from(max_slots) - 1;
        let pick = format!(
            r"// One of the slot values, by a slot index that is constant once SG is known.
fn pick(slot: u32, {params}) -> vec4<f32> {{
    switch slot {{
{cases}
        default: {{ return v{last}; }}
    }}
}}
"
        );
        self.out.join("\n").replace(PICK_PLACEHOLDER, &pick) + "\n"
    }
}

/// Slot s's column group of op(B) for one step: four rows (read from B's
/// columns and transposed where TRANS_B), zeroed past K when `masked`.
fn slot_loads(masked: bool, s: u32) -> Vec<String> {
    let ind = "        ";
    let mut lines: Vec<String> = Vec::new();
    lines.push(format!("{ind}if (SLOTS > {s}u) {{"));
    lines.push(format!("{ind}    if (TRANS_B) {{"));
    // Four columns, each a vec4 along k; transposed into rows of op(B).
    for cc in 0..4 {
        lines.push(format!(
            "{ind}        let t{cc} = b_quad(b_base + min(scol{s} + {cc}u, last_col) * p.ldb + k0);"
        ));
    }
    for (kk, comp) in XYZW.iter().enumerate() {
        lines.push(format!(
            "{ind}        b{s}_{kk} = vec4<f32>(t0.{comp}, t1.{comp}, t2.{comp}, t3.{comp});"
        ));
    }
    lines.push(format!("{ind}    }} else {{"));
    for kk in 0..4 {
        let row = if masked {
            format!("min(k0 + {kk}u, p.k - 1u)")
        } else {
            format!("k0 + {kk}u")
        };
        lines.push(format!(
            "{ind}        b{s}_{kk} = b_row(b_base, {row}, scol{s});"
        ));
    }
    lines.push(format!("{ind}    }}"));
    if masked {
        for (kk, comp) in XYZW.iter().enumerate() {
            lines.push(format!(
                "{ind}    b{s}_{kk} = select(zero, b{s}_{kk}, vec4<bool>(keep.{comp}));"
            ));
        }
    }
    lines.push(format!("{ind}}}"));
    lines
}

/// Subgroup-shuffle GEMM for CPU-backed adapters, written by [`render`].
pub const GEMM_SG: Kernel = Kernel::new(&KernelDef {
    name: "gemm_sg",
    origin: Origin::Generated("gemm_sg.wgsl", || render(ROWS, GROUPS)),
    slots: &[],
    bindings: &[
        Binding::Uniform,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::Read,
        Binding::ReadWrite,
    ],
    params: ParamsText::of::<crate::kernels::gemm::Params>(),
    needs: Needs::SUBGROUPS,
    specialised_per_call: false,
});
