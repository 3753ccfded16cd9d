//! Kernel tuning: the table of measured choices per adapter and head-dim
//! class, its cache file, and the tuner that fills it (`webattn tune`).

mod table;
mod tuner;

pub use table::{
    TunedCoop, TunedDecode, TunedEntry, TunedGemm, TunedKernel, TuningCache, TuningKey,
    TuningTable, HEADER,
};
pub use tuner::{
    coop_candidates, decode_candidates, fast_gemm_candidates, fused_candidates, tune, Timed,
    TuneReport, TuningProblem,
};
