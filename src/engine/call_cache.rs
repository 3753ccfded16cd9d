//! The workspaces of `Engine::attention`'s recent calls, kept by their plan:
//! a call repeated at one shape (a loop over batches, a decoder without
//! prepared calls) takes the parameter blocks, scratch buffers and bind
//! groups its previous run made (`device/arena.rs`) instead of creating them
//! again. Its outputs are the caller's: they are given away after each run,
//! so only they are new.
//!
//! A call takes its workspace out of the cache while it runs and puts it
//! back after, so concurrent calls of one shape never share one; a failed
//! run's workspace is dropped. Only small workspaces are kept: a large call's
//! buffers cost little beside its kernels, and would hold memory nobody uses.

use std::sync::{Arc, Mutex, PoisonError};

use crate::device::arena::Arena;
use crate::device_tensor::{Storage, Tensor};
use crate::options::AttentionOptions;
use crate::plan::CallPlan;
use crate::problem::{AttentionDims, AttentionOutputs};

/// Most calls whose workspaces are kept.
const CALLS: usize = 8;

/// Most device bytes one kept workspace may hold.
const WORKSPACE_BYTES: u64 = 32 << 20;

/// What a workspace is kept by: the call's shapes, options and plan (a new
/// tuning entry or override makes a new plan, and so a new workspace), and
/// the device it lives on.
#[derive(Debug)]
struct Entry {
    dims: AttentionDims,
    options: AttentionOptions,
    plan: CallPlan,
    generation: u64,
    arena: Arc<Arena>,
}

/// Workspaces of recent calls, most recent last.
#[derive(Debug, Default)]
pub(crate) struct CallCache {
    entries: Mutex<Vec<Entry>>,
}

/// A workspace taken for one call; [`CallCache::put_back`] returns it.
#[derive(Debug)]
pub(crate) struct Taken {
    entry: Entry,
}

impl Taken {
    /// The workspace the call runs in.
    pub(crate) fn arena(&self) -> &Arc<Arena> {
        &self.entry.arena
    }
}

impl CallCache {
    /// The kept workspace of a call like this one (taken out while it runs),
    /// or a new, empty one.
    pub(crate) fn take(
        &self,
        dims: &AttentionDims,
        options: &AttentionOptions,
        plan: &CallPlan,
        generation: u64,
    ) -> Taken {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        // Workspaces of a lost device are gone with it.
        entries.retain(|e| e.generation == generation);
        let found = entries
            .iter()
            .position(|e| e.dims == *dims && e.options == *options && e.plan == *plan);
        let entry = match found {
            Some(at) => entries.remove(at),
            None => Entry {
                dims: *dims,
                options: options.clone(),
                plan: plan.clone(),
                generation,
                arena: Arc::default(),
            },
        };
        entry.arena.begin_run();
        Taken { entry }
    }

    /// Gives the run's outputs to the caller and keeps the workspace for the
    /// next call like it (when it is small enough).
    pub(crate) fn put_back(&self, taken: Taken, outputs: &AttentionOutputs<Tensor>) {
        let Taken { entry } = taken;
        let given = [Some(&outputs.y), outputs.present_key.as_ref()]
            .into_iter()
            .chain([
                outputs.present_value.as_ref(),
                outputs.qk_matmul_output.as_ref(),
                outputs.lse.as_ref(),
            ])
            .flatten();
        for tensor in given {
            match &tensor.storage {
                Storage::Gpu(buffer) => entry.arena.release(buffer),
                Storage::GpuChunks(chunks) => {
                    chunks.buffers().iter().for_each(|b| entry.arena.release(b))
                }
                // The caller's own buffer.
                Storage::GpuAt(..) | Storage::Host(_) => {}
            }
        }
        if entry.arena.held().1 > WORKSPACE_BYTES {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.push(entry);
        if entries.len() > CALLS {
            entries.remove(0);
        }
    }

    /// Workspaces kept, and the device bytes they hold.
    pub(crate) fn held(&self) -> (usize, u64) {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes = entries.iter().map(|e| e.arena.held().1).sum();
        (entries.len(), bytes)
    }

    /// Drops every kept workspace.
    pub(crate) fn clear(&self) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}
