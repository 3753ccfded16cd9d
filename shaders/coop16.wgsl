// The matrix-unit kernels' matrices at 16 x 16 (their COOP slot): f16
// operands, f32 accumulators; what GPUs' matrix units take.
alias MatA = coop_mat16x16<f16, A>;
alias MatB = coop_mat16x16<f16, B>;
alias MatC = coop_mat16x16<f32, C>;
const CM: u32 = 16u;
