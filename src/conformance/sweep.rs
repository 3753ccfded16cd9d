//! The conformance sweeps: which cases `webattn check`, the test suite and the
//! browser demo run. Defined once here so every runner checks the same thing.

use super::case::{CaseSpec, MaskForm};
use crate::options::QkMatmulOutputMode;

/// How much of the sweep to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SweepKind {
    /// Every contract feature once at small, awkward sizes (well under a minute on lavapipe).
    Quick,
    /// The quick cases plus every mask form × GQA ratio × head dims × awkward sizes up to 1025.
    Full,
}

/// Scores of unit-normal inputs have a standard deviation of about 1; this
/// logit scale makes them reach about ±1e4.
pub const LARGE_LOGITS: f32 = 3.0e3;

/// Every mask form the contract defines.
pub const MASK_FORMS: [MaskForm; 10] = [
    MaskForm::Bool(1),
    MaskForm::Bool(2),
    MaskForm::Bool(3),
    MaskForm::Bool(4),
    MaskForm::Float(1),
    MaskForm::Float(2),
    MaskForm::Float(3),
    MaskForm::Float(4),
    MaskForm::ShortBool,
    MaskForm::EmptyRows,
];

/// The cases of a sweep, in a fixed order.
pub fn sweep(kind: SweepKind) -> Vec<CaseSpec> {
    let mut cases = quick();
    if kind == SweepKind::Full {
        cases.extend(full_extra());
    }
    cases
}

/// The cases whose name contains `filter` (all when it is empty).
pub fn filtered(kind: SweepKind, filter: &str) -> Vec<CaseSpec> {
    sweep(kind)
        .into_iter()
        .filter(|c| c.name.contains(filter))
        .collect()
}

fn quick() -> Vec<CaseSpec> {
    use MaskForm::*;
    let mut cases = vec![
        CaseSpec::new("single-key", [1, 1, 1], [1, 1], [8, 8]),
        CaseSpec::new("gqa3-dk40-dv8", [2, 6, 2], [7, 33], [40, 8]),
        CaseSpec::new("gqa4-causal", [1, 4, 1], [97, 97], [64, 64]).with(|o| o.is_causal = true),
        CaseSpec::new("dk80-dv40", [1, 2, 2], [33, 97], [80, 40]),
        CaseSpec::new("dk256-dv256", [1, 2, 1], [7, 33], [256, 256]),
        CaseSpec::new("seq257-dk128-causal", [1, 2, 2], [257, 257], [128, 128])
            .with(|o| o.is_causal = true),
        CaseSpec::new("causal-nq-gt-nk", [1, 2, 2], [33, 7], [8, 8]).with(|o| o.is_causal = true),
        CaseSpec::new("causal-past", [1, 4, 2], [7, 7], [40, 40])
            .past(33)
            .with(|o| o.is_causal = true),
        CaseSpec::new("past-no-mask", [2, 3, 3], [1, 1], [64, 8]).past(97),
        CaseSpec::new("nonpad-causal", [3, 2, 2], [7, 33], [8, 40])
            .nonpad()
            .with(|o| o.is_causal = true),
        CaseSpec::new("nonpad-bool2d", [3, 2, 1], [7, 33], [64, 64])
            .nonpad()
            .mask(Bool(2)),
        CaseSpec::new("window-left", [1, 2, 2], [33, 33], [8, 8]).with(|o| o.left_window_size = 4),
        CaseSpec::new("window-both", [1, 2, 2], [33, 97], [40, 40]).with(|o| {
            o.left_window_size = 8;
            o.right_window_size = 3;
        }),
        CaseSpec::new("window-causal-past", [1, 3, 1], [7, 7], [8, 8])
            .past(7)
            .with(|o| {
                o.is_causal = true;
                o.left_window_size = 5;
            }),
        CaseSpec::new("scale", [1, 2, 2], [7, 33], [40, 40]).with(|o| o.scale = Some(0.3)),
        CaseSpec::new("softcap", [1, 2, 2], [33, 33], [64, 64])
            .logits(20.0)
            .with(|o| {
                o.softcap = 5.0;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Softcapped);
            }),
        CaseSpec::new("qk-mode0-softcap", [1, 3, 1], [7, 33], [8, 8])
            .logits(10.0)
            .with(|o| {
                o.softcap = 2.0;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Scaled);
            }),
        CaseSpec::new("qk-mode2-float4d-causal", [2, 2, 2], [33, 33], [8, 8])
            .mask(Float(4))
            .with(|o| {
                o.is_causal = true;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased);
            }),
        CaseSpec::new("qk-mode3-empty-rows", [2, 2, 1], [33, 7], [8, 8])
            .mask(EmptyRows)
            .with(|o| o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities)),
        CaseSpec::new("logits-1e4", [1, 2, 2], [33, 97], [64, 64]).logits(LARGE_LOGITS),
        CaseSpec::new("logits-1e4-causal-bool4d", [2, 2, 1], [97, 33], [64, 8])
            .logits(LARGE_LOGITS)
            .mask(Bool(4))
            .with(|o| o.is_causal = true),
        CaseSpec::new("everything", [2, 6, 2], [7, 33], [40, 8])
            .past(7)
            .mask(Float(4))
            .logits(8.0)
            .with(|o| {
                o.is_causal = true;
                o.left_window_size = 9;
                o.right_window_size = 2;
                o.softcap = 4.0;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased);
            }),
        // Extensions beyond ONNX: softmax temperature and in-kernel ALiBi.
        CaseSpec::new("temperature-sharp", [1, 2, 2], [33, 97], [40, 40]).with(|o| {
            o.temperature = 0.5;
            o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
        }),
        CaseSpec::new("temperature-flat-causal", [1, 2, 1], [33, 33], [8, 8])
            .logits(8.0)
            .with(|o| {
                o.temperature = 3.0;
                o.is_causal = true;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased);
            }),
        CaseSpec::new("logits-1e4-temperature", [1, 2, 2], [33, 97], [64, 64])
            .logits(LARGE_LOGITS)
            .with(|o| o.temperature = 0.7),
        CaseSpec::new("alibi-causal", [1, 8, 2], [97, 97], [64, 64]).with(|o| {
            o.alibi = true;
            o.is_causal = true;
        }),
        CaseSpec::new("alibi-12-heads-past", [1, 12, 4], [7, 7], [64, 64])
            .past(33)
            .with(|o| {
                o.alibi = true;
                o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased);
            }),
        CaseSpec::new(
            "alibi-temperature-nonpad-window",
            [2, 3, 3],
            [33, 33],
            [8, 8],
        )
        .nonpad()
        .mask(Float(2))
        .with(|o| {
            o.alibi = true;
            o.temperature = 0.7;
            o.left_window_size = 8;
            o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Probabilities);
        }),
        CaseSpec::new("alibi-temperature-decode", [2, 4, 2], [1, 1025], [64, 64]).with(|o| {
            o.alibi = true;
            o.temperature = 0.5;
        }),
        // Decoding with GQA: one workgroup serves the 4 query heads of a KV
        // head, 4 rows each (16 rows), against a cache and new keys.
        CaseSpec::new("decode-gqa4-nq4-causal-past", [1, 8, 2], [4, 4], [64, 64])
            .past(600)
            .mask(Float(4))
            .with(|o| o.is_causal = true),
        // 16 query rows (speculative decoding), softcap, a 2-D bool mask.
        CaseSpec::new("decode-nq16-softcap-bool2d", [2, 2, 2], [16, 700], [32, 48])
            .mask(Bool(2))
            .with(|o| o.softcap = 20.0),
        // A GQA group of 8 at 3 rows: workgroups of 4 heads (12 rows), with
        // padding, a window and ALiBi.
        CaseSpec::new(
            "decode-gqa8-nq3-nonpad-window",
            [2, 8, 1],
            [3, 777],
            [128, 64],
        )
        .nonpad()
        .with(|o| {
            o.left_window_size = 300;
            o.alibi = true;
        }),
    ];
    for form in MASK_FORMS {
        cases.push(CaseSpec::new(format!("mask-{form}"), [2, 3, 1], [7, 33], [8, 16]).mask(form));
    }
    cases.extend(f16_quick());
    cases
}

/// f16 storage on every path: decode reads f16 keys and values in place,
/// the rest widens them; Y, the scores and the presents come back as f16.
fn f16_quick() -> Vec<CaseSpec> {
    use MaskForm::*;
    vec![
        CaseSpec::new("f16-decode-gqa4-nonpad", [2, 8, 2], [1, 1025], [64, 64])
            .nonpad()
            .f16(),
        CaseSpec::new(
            "f16-decode-nq4-causal-alibi",
            [1, 4, 4],
            [4, 700],
            [128, 128],
        )
        .f16()
        .with(|o| {
            o.is_causal = true;
            o.alibi = true;
        }),
        CaseSpec::new("f16-causal-past", [1, 4, 2], [33, 33], [64, 40])
            .past(33)
            .f16()
            .with(|o| o.is_causal = true),
        CaseSpec::new("f16-qk-mode2-bool4d", [2, 2, 1], [33, 97], [40, 40])
            .mask(Bool(4))
            .f16()
            .with(|o| o.qk_matmul_output_mode = Some(QkMatmulOutputMode::Biased)),
        CaseSpec::new("f16-logits-1e4-dk7", [1, 2, 2], [33, 97], [7, 7])
            .logits(LARGE_LOGITS)
            .f16(),
        CaseSpec::new("f16-empty-rows", [2, 3, 1], [7, 33], [8, 16])
            .mask(EmptyRows)
            .f16(),
    ]
}

fn full_extra() -> Vec<CaseSpec> {
    let mut cases = Vec::new();
    // Awkward sizes against head dims, with and without causal masking.
    let lengths = [
        (1, 1025),
        (1025, 1),
        (97, 257),
        (257, 97),
        (1025, 1025),
        (7, 33),
    ];
    let dims = [(8, 256), (256, 8), (40, 80), (64, 64), (128, 128), (80, 40)];
    for (i, &(nq, nk)) in lengths.iter().enumerate() {
        for (j, &(dk, dv)) in dims.iter().enumerate() {
            let causal = (i + j) % 2 == 1;
            let heads = if nq * nk > 100_000 {
                [1, 1, 1]
            } else {
                [1, 3, 1]
            };
            cases.push(
                CaseSpec::new(
                    format!(
                        "size-q{nq}-k{nk}-d{dk}x{dv}{}",
                        if causal { "-causal" } else { "" }
                    ),
                    heads,
                    [nq, nk],
                    [dk, dv],
                )
                .with(|o| o.is_causal = causal),
            );
        }
    }
    // Every mask form against every GQA ratio, alone and with causal + past.
    for form in MASK_FORMS {
        for (hq, hkv) in [(4, 4), (6, 2), (8, 2)] {
            let ratio = hq / hkv;
            cases.push(
                CaseSpec::new(
                    format!("grid-{form}-gqa{ratio}"),
                    [2, hq, hkv],
                    [97, 257],
                    [64, 40],
                )
                .mask(form),
            );
            cases.push(
                CaseSpec::new(
                    format!("grid-{form}-gqa{ratio}-causal-past"),
                    [1, hq, hkv],
                    [33, 64],
                    [40, 64],
                )
                .mask(form)
                .past(33)
                .with(|o| o.is_causal = true),
            );
        }
    }
    // Every qk output mode with large logits and combined masks.
    for (mode, tag) in [
        (QkMatmulOutputMode::Scaled, 0),
        (QkMatmulOutputMode::Softcapped, 1),
        (QkMatmulOutputMode::Biased, 2),
        (QkMatmulOutputMode::Probabilities, 3),
    ] {
        cases.push(
            CaseSpec::new(
                format!("mode{tag}-logits-1e4-nonpad-window"),
                [3, 4, 2],
                [97, 97],
                [64, 64],
            )
            .logits(LARGE_LOGITS)
            .nonpad()
            .mask(MaskForm::Float(2))
            .with(|o| {
                o.qk_matmul_output_mode = Some(mode);
                o.is_causal = true;
                o.left_window_size = 40;
                o.softcap = if tag == 1 { 50.0 } else { 0.0 };
            }),
        );
    }
    cases.push(
        CaseSpec::new(
            "alibi-1025-causal-softcap",
            [1, 4, 4],
            [1025, 1025],
            [64, 64],
        )
        .logits(8.0)
        .with(|o| {
            o.alibi = true;
            o.is_causal = true;
            o.softcap = 6.0;
            o.temperature = 0.8;
        }),
    );
    cases.push(
        CaseSpec::new("long-2048-causal", [1, 2, 1], [2048, 2048], [64, 64])
            .with(|o| o.is_causal = true),
    );
    // f16 at the awkward sizes and the long decode.
    for (nq, nk, causal) in [(1025, 1025, true), (257, 97, false), (1, 4097, false)] {
        cases.push(
            CaseSpec::new(
                format!(
                    "f16-size-q{nq}-k{nk}{}",
                    if causal { "-causal" } else { "" }
                ),
                [1, 2, 1],
                [nq, nk],
                [128, 128],
            )
            .f16()
            .with(|o| o.is_causal = causal),
        );
    }
    cases.push(
        CaseSpec::new(
            "f16-decode-gqa8-nq3-window-softcap-past",
            [2, 8, 1],
            [3, 1025],
            [128, 64],
        )
        .past(600)
        .f16()
        .with(|o| {
            o.left_window_size = 700;
            o.softcap = 30.0;
        }),
    );
    cases
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique() {
        let cases = sweep(SweepKind::Full);
        let names: HashSet<_> = cases.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.len(), cases.len());
        assert!(filtered(SweepKind::Quick, "mask-").len() == MASK_FORMS.len());
        // Every f16 case says so in its name (`--filter f16`), and only those.
        for case in &cases {
            assert_eq!(case.f16, case.name.contains("f16"), "{}", case.name);
        }
    }
}
