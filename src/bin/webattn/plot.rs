//! A small SVG line chart: attention GFLOP/s against sequence length, one line
//! per path (and causal or not), with the FMA ceiling as a rule.

use serde_json::Value;

const W: f64 = 760.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;

fn colour(path: &str) -> &'static str {
    match path {
        "fused" => "#1b7837",
        "unfused" => "#2166ac",
        "fused f16" => "#5aae61",
        "unfused f16" => "#67a9cf",
        _ => "#b2182b",
    }
}

/// A row's line: its path, with ` f16` for rows at `Precision::Fast`.
fn line_name(row: &Value) -> Option<String> {
    let path = row["path"].as_str()?;
    Some(match row["precision"].as_str() {
        Some("fast") => format!("{path} f16"),
        _ => path.to_string(),
    })
}

/// The chart for the report's attention entries at the smallest head dim.
pub fn attention_svg(report: &Value, ceiling: f64) -> String {
    let rows = entries(report, "attention");
    let head_dim = rows
        .iter()
        .filter_map(|r| r["head_dim"].as_u64())
        .min()
        .unwrap_or(64);
    let points: Vec<(String, bool, f64, f64)> = rows
        .iter()
        .filter(|r| r["head_dim"].as_u64() == Some(head_dim))
        .filter_map(|r| {
            Some((
                line_name(r)?,
                r["causal"].as_bool()?,
                r["seq_q"].as_f64()?,
                r["gflops"].as_f64()?,
            ))
        })
        .collect();
    let (xmin, xmax) = points.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        (lo.min(p.2), hi.max(p.2))
    });
    let (xmin, xmax) = if xmin < xmax {
        (xmin.log2(), xmax.log2())
    } else {
        (xmin.log2() - 1.0, xmin.log2() + 1.0)
    };
    let ymax = points.iter().map(|p| p.3).fold(ceiling, f64::max) * 1.1;
    let x = |seq: f64| LEFT + (seq.log2() - xmin) / (xmax - xmin) * (W - LEFT - RIGHT);
    let y = |g: f64| H - BOTTOM - g / ymax * (H - TOP - BOTTOM);

    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="22" font-size="15">Attention GFLOP/s by sequence length, head dim {head_dim} — {}</text>
"#,
        report["adapter"]["name"].as_str().unwrap_or("adapter")
    );
    // Axes and grid.
    svg += &format!(
        r#"<line x1="{LEFT}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{}" stroke="black"/>
"#,
        H - BOTTOM,
        W - RIGHT,
        H - BOTTOM,
        H - BOTTOM
    );
    for i in 0..=5 {
        let g = ymax * f64::from(i) / 5.0;
        svg += &format!(
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#ddd"/><text x="{2}" y="{3:.1}" text-anchor="end">{4:.0}</text>
"##,
            y(g),
            W - RIGHT,
            LEFT - 6.0,
            y(g) + 4.0,
            g
        );
    }
    let mut seqs: Vec<f64> = points.iter().map(|p| p.2).collect();
    seqs.sort_by(f64::total_cmp);
    seqs.dedup();
    for &s in &seqs {
        svg += &format!(
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{s}</text>
"#,
            x(s),
            H - BOTTOM + 18.0
        );
    }
    svg += &format!(
        r#"<text x="{:.1}" y="{}" text-anchor="middle">sequence length (log scale)</text>
<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">GFLOP/s</text>
"#,
        (LEFT + W - RIGHT) / 2.0,
        H - 14.0,
        (TOP + H - BOTTOM) / 2.0
    );
    // The ceiling (none on a CPU engine).
    if ceiling > 0.0 {
        svg += &format!(
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#777" stroke-dasharray="2,3"/><text x="{2}" y="{3:.1}" fill="#555">FMA ceiling {4:.0}</text>
"##,
            y(ceiling),
            W - RIGHT,
            W - RIGHT + 6.0,
            y(ceiling) + 4.0,
            ceiling
        );
    }
    // One line per (path, causal).
    let mut legend_y = TOP + 70.0;
    for path in ["fused", "unfused", "fused f16", "unfused f16", "cpu"] {
        for causal in [false, true] {
            let mut line: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.0 == path && p.1 == causal)
                .map(|p| (p.2, p.3))
                .collect();
            if line.is_empty() {
                continue;
            }
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let dash = if causal {
                r#" stroke-dasharray="6,4""#
            } else {
                ""
            };
            let coords: Vec<String> = line
                .iter()
                .map(|&(s, g)| format!("{:.1},{:.1}", x(s), y(g)))
                .collect();
            svg += &format!(
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>
"#,
                coords.join(" "),
                colour(path)
            );
            for &(s, g) in &line {
                svg += &format!(
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>
"#,
                    x(s),
                    y(g),
                    colour(path)
                );
            }
            svg += &format!(
                r#"<line x1="{0}" y1="{1:.1}" x2="{2}" y2="{1:.1}" stroke="{3}" stroke-width="2"{dash}/><text x="{4}" y="{5:.1}">{path}{6}</text>
"#,
                W - RIGHT + 10.0,
                legend_y,
                W - RIGHT + 40.0,
                colour(path),
                W - RIGHT + 46.0,
                legend_y + 4.0,
                if causal { ", causal" } else { "" }
            );
            legend_y += 20.0;
        }
    }
    svg += "</svg>\n";
    svg
}

/// The entries of `key` in the report.
fn entries<'a>(report: &'a Value, key: &str) -> &'a [Value] {
    report[key].as_array().map_or(&[], Vec::as_slice)
}
