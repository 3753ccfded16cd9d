//! The template language of the matrix-unit kernels
//! (`shaders/templates/NAME.wgsl.in`), expanded by Rust: WGSL has no macros,
//! and those kernels' matrices (and the GEMM's staging registers) must be
//! named variables, so a template's blocks are written out over their
//! matrices, up to a count per kernel:
//!
//! ```text
//! //@ ALL d          the block once per matrix (declarations)
//! //@ EACH d DKT     the block per matrix under `if (DKT > d)` (none for 0)
//! //@ CASES cu c DVT `switch cu` (a uniform value) with the block, `@c`
//!                    replaced, as the case of each matrix, under
//!                    `if (DVT > c)` (none for 0)
//! //@ GRID r RM c RN the block once per pair (r, c), `@r` and `@c`
//!                    replaced, under `if (RM > r)` and `if (RN > c)`
//!                    (none for 0; a bound `-` puts no test: declarations)
//! //@ END
//! ```
//!
//! with `@d` (or `@c`) in the block replaced by the matrix's number. Before
//! that, lines between `//# IF NAME` and `//# ELSE` (or `//# ENDIF`) are kept
//! only where NAME is defined, those between `//# ELSE` and `//# ENDIF` only
//! where it is not (not nested): one template makes several forms of a
//! kernel. The families render their kernels with [`render`]; nothing
//! rendered is checked in.

/// A template, `shaders/templates/NAME.wgsl.in`.
pub(crate) struct Template {
    /// NAME: the file's stem.
    pub(crate) name: &'static str,
    /// The file's text.
    pub(crate) text: &'static str,
    /// The module that renders it, named in the output's header.
    pub(crate) renderer: &'static str,
}

/// The output's first lines: where the text comes from, for a reader of a
/// compiled or dumped shader.
fn header(renderer: &str, kernel: &str, name: &str) -> [String; 2] {
    [
        format!("// Made by {renderer} ({kernel}) from shaders/templates/{name}.wgsl.in"),
        "// when the pipeline is built; edit those, there is no file of this text.".to_string(),
    ]
}

/// Where line `number` (from 1) of `template` is, for a panic's message.
fn location(template: &Template, number: usize) -> String {
    format!("shaders/templates/{}.wgsl.in:{number}", template.name)
}

/// `lines` with `@VAR` replaced by `n`.
fn substitute<S: AsRef<str>>(lines: &[S], var: &str, n: usize) -> Vec<String> {
    let pattern = format!("@{var}");
    lines
        .iter()
        .map(|line| line.as_ref().replace(&pattern, &n.to_string()))
        .collect()
}

/// `lines` indented by `levels` of four spaces, empty lines left empty.
fn indent(lines: &[String], levels: usize) -> Vec<String> {
    let pad = "    ".repeat(levels);
    lines
        .iter()
        .map(|line| {
            if line.is_empty() {
                String::new()
            } else {
                format!("{pad}{line}")
            }
        })
        .collect()
}

/// The expansion of a block of kind `kind` (`ALL`, `EACH`, `CASES`, `GRID`)
/// with its directive's arguments `args` over `count` numbers, the lines it
/// adds indented by `pad` (the directive's own indentation). `None` where
/// the kind is unknown or the arguments do not fit it.
fn expand(
    kind: &str,
    args: &[&str],
    block: &[&str],
    pad: &str,
    count: usize,
) -> Option<Vec<String>> {
    let mut out = Vec::new();
    match (kind, args) {
        ("ALL", [var, ..]) => {
            for n in 0..count {
                out.extend(substitute(block, var, n));
            }
        }
        ("EACH", [var, bound, ..]) => {
            for n in 0..count {
                let body = substitute(block, var, n);
                if n == 0 {
                    out.extend(body);
                } else {
                    out.push(format!("{pad}if ({bound} > {n}u) {{"));
                    out.extend(indent(&body, 1));
                    out.push(format!("{pad}}}"));
                }
            }
        }
        ("CASES", [selector, var, bound]) => {
            out.push(format!("{pad}switch {selector} {{"));
            for n in 0..count {
                out.push(format!("{pad}    case {n}u: {{"));
                let mut body = indent(&substitute(block, var, n), 2);
                if n > 0 {
                    // (The guard folds: a compiler keeps only the cases that occur.)
                    let guarded = indent(&body, 1);
                    body = vec![format!("{pad}        if ({bound} > {n}u) {{")];
                    body.extend(guarded);
                    body.push(format!("{pad}        }}"));
                }
                out.extend(body);
                out.push(format!("{pad}    }}"));
            }
            out.push(format!("{pad}    default: {{}}"));
            out.push(format!("{pad}}}"));
        }
        ("GRID", [var_r, bound_r, var_c, bound_c]) => {
            for r in 0..count {
                for c in 0..count {
                    let body = substitute(&substitute(block, var_r, r), var_c, c);
                    let tests: Vec<String> = [(bound_r, r), (bound_c, c)]
                        .into_iter()
                        .filter(|&(bound, n)| n > 0 && *bound != "-")
                        .map(|(bound, n)| format!("{bound} > {n}u"))
                        .collect();
                    // (Nested, not &&: naga lowers a short-circuit condition
                    // through a local variable, which its uniformity analysis
                    // takes as non-uniform.)
                    for (depth, test) in tests.iter().enumerate() {
                        out.push(format!("{pad}{}if ({test}) {{", "    ".repeat(depth)));
                    }
                    out.extend(indent(&body, tests.len()));
                    for depth in (0..tests.len()).rev() {
                        out.push(format!("{pad}{}}}", "    ".repeat(depth)));
                    }
                }
            }
        }
        _ => return None,
    }
    Some(out)
}

/// `text` cut into lines as the templates' first expander (Python's
/// `str.splitlines`) cut it (at `\n`,
/// `\r\n`, `\r` and the other line boundaries it knows), the line breaks
/// left out, with no empty last line after a final break.
fn split_lines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((at, ch)) = chars.next() {
        let boundary = matches!(
            ch,
            '\n' | '\r'
                | '\u{0b}'
                | '\u{0c}'
                | '\u{1c}'
                | '\u{1d}'
                | '\u{1e}'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if !boundary {
            continue;
        }
        lines.push(&text[start..at]);
        start = at + ch.len_utf8();
        if ch == '\r' && chars.next_if(|&(_, next)| next == '\n').is_some() {
            start += 1;
        }
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

/// The `//# IF NAME`, `//# ELSE` or `//# ENDIF` marker on `line`, if any
/// (the line holds nothing else but indentation): its kind and NAME (empty
/// where there is none).
fn section_marker(line: &str) -> Option<(&'static str, &str)> {
    let rest = line.trim_start().strip_prefix("//# ")?;
    ["IF", "ELSE", "ENDIF"].into_iter().find_map(|kind| {
        let name = rest.strip_prefix(kind)?.trim_start();
        name.chars()
            .all(|ch| ch.is_alphanumeric() || ch == '_')
            .then_some((kind, name))
    })
}

/// The lines of `template`, numbered from 1, with the `//# IF` / `//# ELSE` /
/// `//# ENDIF` sections not taken under `defines` (and the markers) left out.
///
/// # Panics
/// Where an `//# IF` opens inside a section, or a section has no `//# ENDIF`.
fn select<'a>(template: &'a Template, defines: &[&str]) -> Vec<(usize, &'a str)> {
    let mut out = Vec::new();
    // Whether the current section's lines are kept; `None` outside a section.
    let mut keep: Option<bool> = None;
    // The line of the current section's last marker.
    let mut opened = 0;
    for (number, line) in (1..).zip(split_lines(template.text)) {
        let Some((kind, name)) = section_marker(line) else {
            if keep != Some(false) {
                out.push((number, line));
            }
            continue;
        };
        match kind {
            "IF" => {
                assert!(
                    keep.is_none(),
                    "{}: //# IF sections do not nest",
                    location(template, number)
                );
                keep = Some(defines.contains(&name));
                opened = number;
            }
            "ELSE" => {
                // An ELSE outside a section keeps what follows.
                keep = Some(!keep.unwrap_or(false));
                opened = number;
            }
            _ => keep = None,
        }
    }
    assert!(
        keep.is_none(),
        "{}: //# IF without //# ENDIF",
        location(template, opened)
    );
    out
}

/// The `//@ ALL`, `//@ EACH`, `//@ CASES` or `//@ GRID` directive on `line`,
/// if any: its indentation, kind and arguments.
fn block_directive(line: &str) -> Option<(&str, &str, Vec<&str>)> {
    let rest = line.trim_start();
    let pad = &line[..line.len() - rest.len()];
    let (kind, args) = rest.strip_prefix("//@ ")?.split_once(' ')?;
    matches!(kind, "ALL" | "EACH" | "CASES" | "GRID")
        .then(|| (pad, kind, args.split_whitespace().collect()))
}

/// The expansion of `template` with `defines`, each block over `count`
/// numbers, headed with the kernel's name `kernel` (the template's by
/// default), its lines joined by newlines (with none after the last).
///
/// # Panics
/// Where the template is malformed, naming the template and line: nested
/// or unclosed `//# IF` sections, a block without `//@ END`, a block's
/// arguments that do not fit its kind. The templates are this repository's
/// files, so that is a bug here, not a caller's error.
pub(crate) fn render(
    template: &Template,
    count: usize,
    defines: &[&str],
    kernel: Option<&str>,
) -> String {
    let lines = select(template, defines);
    let kernel = kernel.unwrap_or(template.name);
    let mut out = Vec::from(header(template.renderer, kernel, template.name));
    let mut i = 0;
    while i < lines.len() {
        let (number, line) = lines[i];
        let Some((pad, kind, args)) = block_directive(line) else {
            out.push(line.to_string());
            i += 1;
            continue;
        };
        let Some(len) = lines[i + 1..]
            .iter()
            .position(|&(_, line)| line.trim() == "//@ END")
        else {
            panic!("{}: //@ {kind} without //@ END", location(template, number));
        };
        let end = i + 1 + len;
        let block: Vec<&str> = lines[i + 1..end].iter().map(|&(_, line)| line).collect();
        let Some(expanded) = expand(kind, &args, &block, pad, count) else {
            panic!(
                "{}: //@ {kind} with arguments {args:?}",
                location(template, number)
            );
        };
        out.extend(expanded);
        i = end + 1;
    }
    out.join("\n")
}
