//! Trains a small attention model from scratch on associative recall (see
//! `webattn::train`): eight (key, value) pairs, then a key; the model must
//! answer its value. The attention's forward and backward run on the default
//! engine (fused kernels on a GPU), the rest on the host. Prints the loss and
//! accuracy as it trains and writes a picture of both curves and of the
//! learned attention (which pair the question looks at) to an SVG.
//!
//!   cargo run --release --example train_recall [-- STEPS [PLOT.svg]]

use webattn::rng::SplitMix64;
use webattn::train::{Adam, RecallModel, RecallTask, StepStats};
use webattn::Engine;

fn main() -> webattn::Result<()> {
    let mut args = std::env::args().skip(1);
    let steps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(300);
    let plot = args
        .next()
        .unwrap_or_else(|| "target/train-recall.svg".into());
    let engine = Engine::new_blocking();
    println!("engine: {}", engine.describe());
    let task = RecallTask::default();
    let mut model = RecallModel::new(task, 32, 2, 7)?;
    let adam = Adam::default();
    let mut rng = SplitMix64::new(11);
    let held_out = task.batch(&mut SplitMix64::new(99), 256)?;
    let mut curve: Vec<(usize, StepStats)> = Vec::new();
    let started = std::time::Instant::now();
    for step in 1..=steps {
        let batch = task.batch(&mut rng, 64)?;
        let stats = model.train_step_blocking(&engine, &batch, &adam)?;
        curve.push((step, stats));
        if step % 25 == 0 || step == steps {
            let eval = model.evaluate_blocking(&engine, &held_out)?;
            println!(
                "step {step:>4}  loss {:.3}  accuracy {:>5.1}%  held out: loss {:.3} accuracy {:>5.1}%  ({:.1} s)",
                stats.loss,
                100.0 * stats.accuracy,
                eval.loss,
                100.0 * eval.accuracy,
                started.elapsed().as_secs_f32()
            );
        }
    }
    let map = model.attention_map(&held_out, 0)?;
    let svg = picture(&curve, &map, &held_out, task);
    if let Some(dir) = std::path::Path::new(&plot).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&plot, svg).map_err(|e| webattn::Error::File {
        path: plot.clone(),
        reason: e.to_string(),
    })?;
    println!("loss, accuracy and the learned attention: {plot}");
    Ok(())
}

/// The loss and accuracy curves beside the question's attention over the
/// pairs, one row per head, the asked pair marked.
fn picture(
    curve: &[(usize, StepStats)],
    map: &webattn::HostTensor,
    batch: &webattn::train::RecallBatch,
    task: RecallTask,
) -> String {
    let (w, h) = (420.0, 220.0);
    let steps = curve.last().map_or(1, |c| c.0) as f64;
    let max_loss = curve.iter().fold(0.1f64, |m, c| m.max(f64::from(c.1.loss)));
    let line = |f: &dyn Fn(&StepStats) -> f64, color: &str| {
        let points: Vec<String> = curve
            .iter()
            .map(|(s, st)| {
                format!(
                    "{:.1},{:.1}",
                    40.0 + (*s as f64 / steps) * w,
                    20.0 + (1.0 - f(st)) * h
                )
            })
            .collect();
        format!(
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            points.join(" ")
        )
    };
    let mut svg = String::new();
    svg.push_str(r#"<svg xmlns="http://www.w3.org/2000/svg" width="820" height="300" font-family="sans-serif" font-size="12">"#);
    svg.push_str(r#"<rect width="820" height="300" fill="white"/>"#);
    svg.push_str(&format!(
        r##"<rect x="40" y="20" width="{w}" height="{h}" fill="none" stroke="#999"/>"##
    ));
    svg.push_str(&line(&|s| f64::from(s.loss) / max_loss, "#c0392b"));
    svg.push_str(&line(&|s| f64::from(s.accuracy), "#2471a3"));
    svg.push_str(&format!(
        r##"<text x="40" y="14">loss (red, 0 to {max_loss:.2}) and accuracy (blue, 0 to 100%) over {steps} steps</text><text x="40" y="{}">step</text>"##,
        h + 38.0
    ));
    // The question's row of each head: which pair it looks at.
    let (heads, n) = (map.shape()[0], map.shape()[1]);
    let cell = 28.0;
    let (x0, y0) = (500.0, 60.0);
    svg.push_str(&format!(
        r#"<text x="{x0}" y="40">attention of the question, per head (asked pair boxed)</text>"#
    ));
    for head in 0..heads {
        for t in 0..n {
            let p = map.data()[(head * n + (n - 1)) * n + t];
            let shade = (255.0 * (1.0 - p)).round() as u8;
            svg.push_str(&format!(
                r#"<rect x="{:.0}" y="{:.0}" width="{cell}" height="{cell}" fill="rgb({shade},{shade},255)"/>"#,
                x0 + t as f64 * cell,
                y0 + head as f64 * cell
            ));
        }
    }
    let asked = batch.asked[0] as f64;
    svg.push_str(&format!(
        r#"<rect x="{:.0}" y="{y0}" width="{cell}" height="{:.0}" fill="none" stroke="black" stroke-width="2"/>"#,
        x0 + asked * cell,
        heads as f64 * cell
    ));
    for t in 0..n {
        let label = if t < task.pairs {
            format!("{}:{}", batch.keys[t], batch.values[t])
        } else {
            "?".into()
        };
        svg.push_str(&format!(
            r#"<text x="{:.0}" y="{:.0}" font-size="9">{label}</text>"#,
            x0 + t as f64 * cell + 2.0,
            y0 + heads as f64 * cell + 14.0
        ));
    }
    svg.push_str("</svg>");
    svg
}
