//! Single kernels on host data: upload, dispatch one kernel, read back.
//!
//! These exist so each kernel can be tested and benchmarked on its own; the
//! attention path records the same kernels without any readback in between.

use crate::device::buffer;
use crate::device::context::GpuContext;
use crate::device::recorder::Recorder;
use crate::device::scope::Run;
use crate::error::{Error, Result};
use crate::kernels::{gemm, softmax};

fn check_len(tensor: &'static str, got: usize, needed: usize) -> Result<()> {
    if got < needed {
        return Err(Error::DataLength {
            tensor,
            shape: vec![needed],
            expected: needed,
            got,
        });
    }
    Ok(())
}

/// Runs one GEMM on host slices with the context's GEMM kernel and returns
/// the new C (same length as `c`).
pub async fn gemm_host(
    ctx: &GpuContext,
    spec: &gemm::GemmSpec,
    a: &[f32],
    b: &[f32],
    c: &[f32],
) -> Result<Vec<f32>> {
    let kernel = gemm::kernel_for(
        ctx.capabilities(),
        gemm::gemm_kernel_for(ctx.capabilities()),
        spec,
        gemm::AValues::Any,
    );
    gemm_host_with(ctx, kernel, spec, a, b, c).await
}

/// [`gemm_host`] with a given GEMM kernel.
pub async fn gemm_host_with(
    ctx: &GpuContext,
    kernel: gemm::GemmKernel,
    spec: &gemm::GemmSpec,
    a: &[f32],
    b: &[f32],
    c: &[f32],
) -> Result<Vec<f32>> {
    gemm_host_variant(ctx, kernel, spec, gemm::AValues::Any, a, b, c).await
}

/// [`gemm_host_with`] with A holding `a_values` (`-0` marks skipped, so
/// `-0 · NaN` adds nothing, or attention's probabilities).
pub async fn gemm_host_variant(
    ctx: &GpuContext,
    kernel: gemm::GemmKernel,
    spec: &gemm::GemmSpec,
    a_values: gemm::AValues,
    a: &[f32],
    b: &[f32],
    c: &[f32],
) -> Result<Vec<f32>> {
    spec.check()?;
    // This helper is a call of its own: it plans the product's kernel.
    let kernel = gemm::kernel_for(ctx.capabilities(), kernel, spec, a_values);
    let run = Run::new(ctx);
    let ctx = &run;
    let (a_len, b_len, c_len) = spec.extents();
    check_len("A", a.len(), a_len)?;
    check_len("B", b.len(), b_len)?;
    check_len("C", c.len(), c_len)?;
    let c_buf = ctx
        .scoped("gemm", || {
            let a_buf = buffer::upload(ctx, "A", a)?;
            let b_buf = buffer::upload(ctx, "B", b)?;
            let c_buf = buffer::upload(ctx, "C", c)?;
            let mut rec = Recorder::new(ctx, "gemm");
            gemm::record_variant(&mut rec, kernel, spec, a_values, [&a_buf, &b_buf, &c_buf])?;
            rec.submit();
            Ok(c_buf)
        })
        .await?;
    buffer::read_f32(ctx, &c_buf, 0, c.len()).await
}

/// Softmax of each of `rows` rows of `cols` scores (masked entries are
/// `-f32::MAX` or below). Returns the probabilities and each row's logsumexp.
pub async fn softmax_host(
    ctx: &GpuContext,
    rows: usize,
    cols: usize,
    scores: &[f32],
) -> Result<(Vec<f32>, Vec<f32>)> {
    if rows == 0 || cols == 0 {
        return Err(Error::EmptyTensor {
            tensor: "scores",
            shape: vec![rows, cols],
        });
    }
    if scores.len() != rows * cols {
        return Err(Error::DataLength {
            tensor: "scores",
            shape: vec![rows, cols],
            expected: rows * cols,
            got: scores.len(),
        });
    }
    let clean: Vec<f32> = scores
        .iter()
        .map(|&s| {
            if s <= softmax::MASKED {
                softmax::MASKED
            } else {
                s
            }
        })
        .collect();
    let run = Run::new(ctx);
    let ctx = &run;
    let (s_buf, lse_buf) = ctx
        .scoped("softmax", || {
            let s_buf = buffer::upload(ctx, "scores", &clean)?;
            let lse_buf = buffer::storage(ctx, "lse", rows)?;
            let mut rec = Recorder::new(ctx, "softmax");
            softmax::record(
                &mut rec,
                rows,
                cols,
                &s_buf,
                &lse_buf,
                0,
                softmax::NotAttended::Zero,
                1.0,
            )?;
            rec.submit();
            Ok((s_buf, lse_buf))
        })
        .await?;
    let probs = buffer::read_f32(ctx, &s_buf, 0, rows * cols).await?;
    let lse = buffer::read_f32(ctx, &lse_buf, 0, rows).await?;
    Ok((probs, lse))
}
