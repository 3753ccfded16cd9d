// The matrix-unit kernels' matrices at 8 x 8 (their COOP slot): f16 operands,
// f32 accumulators; what Mesa's lavapipe and Apple GPUs list.
alias MatA = coop_mat8x8<f16, A>;
alias MatB = coop_mat8x8<f16, B>;
alias MatC = coop_mat8x8<f32, C>;
const CM: u32 = 8u;
