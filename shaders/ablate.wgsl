// Phases of a kernel's key loop a measurement removes (`webattn phases`,
// src/plan/ablation.rs): ABLATE is 0 in every pipeline a call runs, so the
// guards on it fold away. With a bit set the kernel's results are wrong by
// design; only its time is of interest. KV_LOADS: K and V read as zeros,
// never from memory. SCORES: no S = Q K^T. SOFTMAX: no rules, maxima,
// probabilities or sums. PRODUCT: no O += P V.
override ABLATE: u32 = 0u;
const ABLATE_KV_LOADS: u32 = 1u;
const ABLATE_SCORES: u32 = 2u;
const ABLATE_SOFTMAX: u32 = 4u;
const ABLATE_PRODUCT: u32 = 8u;
