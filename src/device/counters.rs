//! Counts of the work a device was given: buffers and bind groups created,
//! dispatches and copies recorded, submissions. Tests and the bench read them around a call to show
//! what it costs beyond its arithmetic (a prepared decoder step allocates
//! nothing and dispatches a handful of kernels).

use std::sync::atomic::{AtomicU64, Ordering};

/// Running totals for one device (shared by the clones of its context).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    buffers: AtomicU64,
    bind_groups: AtomicU64,
    dispatches: AtomicU64,
    copies: AtomicU64,
    writes: AtomicU64,
    submissions: AtomicU64,
}

impl Counters {
    pub(crate) fn buffer_created(&self) {
        self.buffers.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn bind_group_created(&self) {
        self.bind_groups.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn dispatched(&self) {
        self.dispatches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn copied(&self) {
        self.copies.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn written(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn submitted(&self) {
        self.submissions.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WorkCounts {
        WorkCounts {
            buffers: self.buffers.load(Ordering::Relaxed),
            bind_groups: self.bind_groups.load(Ordering::Relaxed),
            dispatches: self.dispatches.load(Ordering::Relaxed),
            copies: self.copies.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            submissions: self.submissions.load(Ordering::Relaxed),
        }
    }
}

/// Totals of the work given to a device since it was created; the difference
/// of two readings is what happened between them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkCounts {
    /// Buffers created (storage, uniform, staging).
    pub buffers: u64,
    /// Bind groups created (a prepared call's runs reuse theirs).
    pub bind_groups: u64,
    /// Compute dispatches recorded.
    pub dispatches: u64,
    /// Buffer-to-buffer copies recorded.
    pub copies: u64,
    /// Queue writes (host bytes staged into a buffer: uploads, parameter
    /// blocks that changed; a prepared call's repeated runs make none).
    pub writes: u64,
    /// Command buffers submitted to the queue.
    pub submissions: u64,
}

impl std::ops::Sub for WorkCounts {
    type Output = WorkCounts;

    fn sub(self, earlier: WorkCounts) -> WorkCounts {
        WorkCounts {
            buffers: self.buffers - earlier.buffers,
            bind_groups: self.bind_groups - earlier.bind_groups,
            dispatches: self.dispatches - earlier.dispatches,
            copies: self.copies - earlier.copies,
            writes: self.writes - earlier.writes,
            submissions: self.submissions - earlier.submissions,
        }
    }
}

/// Device memory in use, as wgpu's own counters see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryReading {
    /// Bytes of buffer memory allocated on the device.
    pub buffer_bytes: u64,
    /// Buffers alive on the device.
    pub buffers: u64,
}
