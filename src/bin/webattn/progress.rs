//! Progress on long runs (a bar on a terminal, a line per case elsewhere)
//! and the matrix-unit line the sweeps end with.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use webattn::conformance::CaseResult;

/// One line of progress for a case (printed for every case without a terminal,
/// and for failures with one).
pub fn progress_line(done: usize, total: usize, r: &CaseResult) -> String {
    format!(
        "[{done}/{total}] {} {} ({}) {}",
        if r.passed() { "pass" } else { "FAIL" },
        r.name,
        r.path,
        r.report
            .map(|rep| format!("max abs {:.2e} of {:.2e}", rep.max_abs, rep.allowed))
            .unwrap_or_default()
    )
}

/// Which matrix-unit pipelines the run compiled (those calls multiplied on
/// the matrix units), or why none ran.
pub fn matrix_unit_line(engine: &webattn::Engine) -> String {
    let Some(ctx) = engine.gpu() else {
        return "matrix units: none (CPU engine)".to_string();
    };
    let used: Vec<String> = ctx
        .pipelines()
        .compiled_keys()
        .into_iter()
        .filter(|key| key.kernel.uses_coop())
        .map(|key| key.to_string())
        .collect();
    if used.is_empty() {
        "matrix units: none used (this adapter offers no configuration the kernels run on; \
         the f32 kernels ran)"
            .to_string()
    } else {
        format!("matrix units: {}", used.join(", "))
    }
}

/// A progress bar on a terminal; `None` otherwise (then each case gets a line).
pub fn progress_bar(total: usize) -> Option<ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(total as u64);
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar
    })
}
