//! Records dispatches and copies into one command encoder.
//!
//! Consecutive dispatches share one compute pass (WebGPU orders them and makes
//! each one's writes visible to the next); a copy closes the pass. Workgroup
//! counts above the per-dimension limit are folded into a 2D grid, which every
//! kernel numbers linearly as `x + y * num_workgroups.x`.

use crate::device::pipeline::Pipeline;
use crate::device::scope::Run;
use crate::error::{Error, Result};

/// Splits `total` workgroups into an `(x, y)` grid with both sides at most `max_per_dim`.
pub(crate) fn grid(total: u64, max_per_dim: u32) -> Result<(u32, u32)> {
    let max = u64::from(max_per_dim.max(1));
    let x = total.clamp(1, max);
    let y = total.div_ceil(x).max(1);
    if y > max {
        return Err(Error::Limit {
            what: format!("a dispatch of {total} workgroups"),
            needed: total,
            limit: max * max,
            limit_name: "max_compute_workgroups_per_dimension squared",
            hint: "split the batch across calls",
        });
    }
    Ok((x as u32, y as u32))
}

/// What one storage binding binds: a whole buffer, or `size` bytes of one
/// from `offset` (a view of a call's tensor, bound in place instead of copied;
/// see `run/split.rs`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    /// `None`: to the end of the buffer.
    pub size: Option<u64>,
}

/// Offsets of views are multiples of this: the largest storage-buffer offset
/// alignment WebGPU allows, so every adapter accepts them.
pub(crate) const SEGMENT_ALIGNMENT: u64 = 256;

impl<'a> Seg<'a> {
    /// The whole buffer.
    pub(crate) fn whole(buffer: &'a wgpu::Buffer) -> Self {
        Self {
            buffer,
            offset: 0,
            size: None,
        }
    }

    /// Whether this binds the whole buffer.
    pub(crate) fn is_whole(&self) -> bool {
        self.offset == 0 && self.size.is_none()
    }

    fn resource(&self) -> wgpu::BindingResource<'a> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: self.buffer,
            offset: self.offset,
            size: self.size.and_then(wgpu::BufferSize::new),
        })
    }
}

impl<'a> From<&'a wgpu::Buffer> for Seg<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Self {
        Seg::whole(buffer)
    }
}

/// An open command encoder plus the compute pass in progress, if any.
///
/// On a run that captures (`Run::with_capture`: a call recorded
/// into the caller's encoder) the recorder borrows the captured encoder and
/// gives it back on submit or drop, submitting nothing.
pub(crate) struct Recorder<'c> {
    ctx: &'c Run,
    /// `None` only once submitted.
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    profiler: Option<std::sync::Arc<crate::device::profile::Profiler>>,
    captured: bool,
}

impl<'c> Recorder<'c> {
    pub(crate) fn new(ctx: &'c Run, label: &str) -> Self {
        match ctx.take_captured() {
            Some(encoder) => Self {
                ctx,
                encoder: Some(encoder),
                pass: None,
                profiler: None,
                captured: true,
            },
            None => {
                Self {
                    ctx,
                    encoder: Some(ctx.device.create_command_encoder(
                        &wgpu::CommandEncoderDescriptor { label: Some(label) },
                    )),
                    pass: None,
                    profiler: ctx.scope.profiler.clone(),
                    captured: false,
                }
            }
        }
    }

    /// The encoder, with no pass open: for recording a call into it
    /// (`PreparedAttention::record`) between this recorder's own commands.
    pub(crate) fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder
            .as_mut()
            .expect("an open recorder has its encoder")
    }

    /// The run this recorder records for.
    pub(crate) fn ctx(&self) -> &'c Run {
        self.ctx
    }

    /// Binds `buffers` (whole, in binding order) and dispatches `workgroups` workgroups.
    pub(crate) fn dispatch(
        &mut self,
        pipeline: &Pipeline,
        buffers: &[&wgpu::Buffer],
        workgroups: u64,
    ) -> Result<()> {
        let segments: Vec<Seg<'_>> = buffers.iter().map(|b| Seg::whole(b)).collect();
        self.dispatch_segments(pipeline, &segments, workgroups)
    }

    /// Binds `segments` (whole buffers or views, in binding order) and
    /// dispatches `workgroups` workgroups.
    pub(crate) fn dispatch_segments(
        &mut self,
        pipeline: &Pipeline,
        segments: &[Seg<'_>],
        workgroups: u64,
    ) -> Result<()> {
        if workgroups == 0 {
            return Ok(());
        }
        let (x, y) = grid(
            workgroups,
            self.ctx.caps.limits.max_compute_workgroups_per_dimension,
        )?;
        let entries: Vec<wgpu::BindGroupEntry<'_>> = segments
            .iter()
            .enumerate()
            .map(|(i, segment)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: segment.resource(),
            })
            .collect();
        let create = || {
            self.ctx.counters.bind_group_created();
            self.ctx
                .device
                .create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&pipeline.label),
                    layout: &pipeline.bind_group_layout,
                    entries: &entries,
                })
        };
        // A prepared call's runs bind the same buffers: its arena keeps the groups.
        let bind_group = match self.ctx.arena() {
            Some(arena) => {
                let key = segments
                    .iter()
                    .map(|s| (s.buffer.clone(), s.offset, s.size))
                    .collect();
                arena.bind_group((pipeline.bind_group_layout.clone(), key), create)
            }
            None => create(),
        };
        if self.ctx.has_pending_clears() {
            // Reused zero-filled buffers are cleared before anything reads them.
            self.pass = None;
            let ctx = self.ctx;
            ctx.clear_pending(self.encoder());
        }
        let encoder = self
            .encoder
            .as_mut()
            .expect("an open recorder has its encoder");
        let profiler = &self.profiler;
        let pass = self.pass.get_or_insert_with(|| {
            let timestamp_writes = profiler.as_ref().and_then(|p| p.pass_writes());
            encoder
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("webattn"),
                    timestamp_writes,
                })
                .forget_lifetime()
        });
        self.ctx.counters.dispatched();
        pass.set_pipeline(&pipeline.pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(x, y, 1);
        Ok(())
    }

    /// Copies `values` f32 elements between buffers (element offsets).
    pub(crate) fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_offset: usize,
        dst: &wgpu::Buffer,
        dst_offset: usize,
        values: usize,
    ) {
        self.pass = None;
        let ctx = self.ctx;
        ctx.clear_pending(self.encoder());
        ctx.counters.copied();
        self.encoder().copy_buffer_to_buffer(
            src,
            src_offset as u64 * 4,
            dst,
            dst_offset as u64 * 4,
            values as u64 * 4,
        );
    }

    /// Ends the pass and submits everything recorded (on a capturing
    /// context: gives the encoder back, submitting nothing).
    pub(crate) fn submit(mut self) {
        self.pass = None;
        if self.captured {
            return; // Drop gives the encoder back.
        }
        let mut encoder = self.encoder.take().expect("submitted once");
        if let Some(profiler) = &self.profiler {
            profiler.resolve(&mut encoder);
        }
        self.ctx.counters.submitted();
        self.ctx.queue.submit([encoder.finish()]);
    }
}

impl Drop for Recorder<'_> {
    fn drop(&mut self) {
        // The pass ends before its encoder moves on.
        self.pass = None;
        if self.captured {
            if let Some(encoder) = self.encoder.take() {
                self.ctx.give_back_captured(encoder);
            }
        }
    }
}

/// The copies that move the box `extent` at `src_start` of a row-major
/// tensor of `src_shape` to `dst_start` of one of `dst_shape`: (source
/// element, destination element, length), contiguous runs merged.
pub(crate) fn box_runs(
    src_shape: [usize; 4],
    src_start: [usize; 4],
    dst_shape: [usize; 4],
    dst_start: [usize; 4],
    extent: [usize; 4],
) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    if extent.contains(&0) {
        return runs;
    }
    let offset = |shape: [usize; 4], at: [usize; 4]| {
        ((at[0] * shape[1] + at[1]) * shape[2] + at[2]) * shape[3] + at[3]
    };
    for a in 0..extent[0] {
        for h in 0..extent[1] {
            for r in 0..extent[2] {
                let row = |start: [usize; 4]| [start[0] + a, start[1] + h, start[2] + r, start[3]];
                let (s, d) = (
                    offset(src_shape, row(src_start)),
                    offset(dst_shape, row(dst_start)),
                );
                match runs.last_mut() {
                    Some((rs, rd, len)) if *rs + *len == s && *rd + *len == d => *len += extent[3],
                    _ => runs.push((s, d, extent[3])),
                }
            }
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::{box_runs, grid};

    #[test]
    fn grids_fold_large_counts() {
        assert_eq!(grid(1, 65535).unwrap(), (1, 1));
        assert_eq!(grid(65535, 65535).unwrap(), (65535, 1));
        assert_eq!(grid(65536, 65535).unwrap(), (65535, 2));
        assert_eq!(grid(10, 4).unwrap(), (4, 3));
        assert!(grid(17, 4).is_err());
    }

    #[test]
    fn box_copies_merge_contiguous_rows() {
        // Whole heads of one batch: one run.
        let runs = box_runs(
            [2, 4, 10, 8],
            [1, 1, 0, 0],
            [1, 2, 10, 8],
            [0; 4],
            [1, 2, 10, 8],
        );
        assert_eq!(runs, vec![((4 + 1) * 80, 0, 160)]);
        // Query rows 3..5 of every head: one run per head.
        let runs = box_runs(
            [1, 2, 10, 8],
            [0, 0, 3, 0],
            [1, 2, 2, 8],
            [0; 4],
            [1, 2, 2, 8],
        );
        assert_eq!(runs, vec![(24, 0, 16), (104, 16, 16)]);
        // Key columns 4..7 of a [rows, keys] mask: one run per row.
        let runs = box_runs(
            [1, 1, 3, 10],
            [0, 0, 0, 4],
            [1, 1, 3, 3],
            [0; 4],
            [1, 1, 3, 3],
        );
        assert_eq!(runs, vec![(4, 0, 3), (14, 3, 3), (24, 6, 3)]);
        // Scattering a piece back lands at its place; empty boxes copy nothing.
        let runs = box_runs(
            [1, 1, 2, 4],
            [0; 4],
            [2, 3, 5, 4],
            [1, 2, 3, 0],
            [1, 1, 2, 4],
        );
        assert_eq!(runs, vec![(0, ((3 + 2) * 5 + 3) * 4, 8)]);
        assert!(box_runs([1; 4], [0; 4], [1; 4], [0; 4], [0, 1, 1, 1]).is_empty());
    }
}
