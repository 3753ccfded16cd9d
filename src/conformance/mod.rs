//! The conformance sweep: seeded cases, the f64 oracle, and the tolerance rule.
//!
//! Defined once in the library so that the test suite, `webattn check` and the
//! browser demo all run the same cases and judge them the same way:
//!
//! 1. [`CaseSpec`] describes a problem (sizes, mask form, options) and draws its
//!    inputs from a seed;
//! 2. [`Oracle`] computes the answer in f64 and in plain f32 on the CPU (the
//!    Q·K dot products summed in three orders: first to last, last to first,
//!    and by quads as GPUs read vec4s; with large logits a single order's
//!    error is a matter of luck);
//! 3. [`Oracle::check`] runs a path of an [`crate::Engine`] and compares every
//!    output, allowing twice the worse plain f32 error plus a floor
//!    ([`compare_baselines`]).

mod backward;
mod behaviour;
mod case;
mod compare;
mod paged;
mod report;
mod runner;
mod soak;
mod sweep;

pub use backward::{
    backward_paths, run_backward_case, run_backward_sweep, verify_gradients, BackwardOracle,
};
pub use behaviour::{run_behaviour, BEHAVIOUR_CHECKS};
pub use case::{CaseInputs, CaseSpec, MaskForm};
pub use compare::{compare, compare_baselines, ErrorReport, DEFAULT_FLOOR, F16_UNIT_ROUNDOFF};
pub use paged::{
    check_paged, pageable, paged_lengths, paged_sweep_len, run_paged_sweep, PagedCheck, PagedSweep,
};
pub use report::{path_name, run_sweep, run_sweep_of, sweep_len, SweepReport};
pub use runner::{run_case, CaseResult, Oracle};
pub use soak::{random_case, run_soak, MemoryReading, SoakReport, MEMORY_SLACK_BYTES};
pub use sweep::{filtered, sweep, SweepKind, LARGE_LOGITS, MASK_FORMS};
