//! The workspace of a prepared call: every buffer its first run created, kept
//! and handed out again, in the same order, to the runs after it.
//!
//! A prepared call runs on a clone of the device's context that carries its
//! arena; `device/buffer.rs` asks the arena before it creates a buffer. The
//! n-th buffer a run asks for is the n-th one the arena holds when its size
//! and kind match (the same plan asks for the same buffers in the same
//! order): a parameter block or an upload gets its new contents written in
//! place (not at all where a parameter block or a call's rule data holds the
//! same bytes as in the last run: [`Arena::take_remembered`]), a zero-filled
//! buffer is cleared by the next command the run records
//! ([`Arena::clear_pending`]). Where a run asks for something else (another
//! size), the arena creates it and keeps it in that place from then on, so a
//! plan that changed costs allocations, never a wrong result.
//!
//! Buffers a run hands to its caller (Y) are the arena's too: they hold that
//! run's values until the next run of the same prepared call, unless the run
//! gives them away ([`Arena::release`]: `Engine::attention`'s cached calls,
//! whose outputs belong to the caller), so the next run makes new ones.
//!
//! Bind groups are kept the same way: the n-th one a run records is the one
//! the run before made where it binds the same layout to the same buffer
//! ranges (the usual case, since the buffers are the same), else a new one.

use std::sync::{Mutex, PoisonError};

/// What a buffer is for; only a buffer of the same kind and size is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Storage that starts zero-filled.
    Zeroed,
    /// Storage whose contents the caller writes at once.
    Filled,
    /// A uniform parameter block.
    Uniform,
    /// A `MAP_READ` staging buffer.
    Staging,
}

/// What a bind group binds: its layout and each entry's buffer range.
pub(crate) type GroupKey = (wgpu::BindGroupLayout, Vec<(wgpu::Buffer, u64, Option<u64>)>);

/// A place in the arena: empty once its buffer or group was given away.
type Slot<T> = Option<T>;

/// A buffer the arena keeps.
#[derive(Debug)]
struct Held {
    kind: Kind,
    size: u64,
    buffer: wgpu::Buffer,
    /// What a parameter block holds (as last written), so that a run whose
    /// parameters are the same as the last one's writes nothing: a queue
    /// write stages its bytes through a new buffer of wgpu's own each time.
    contents: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    held: Vec<Slot<Held>>,
    next: usize,
    to_clear: Vec<wgpu::Buffer>,
    groups: Vec<Slot<(GroupKey, wgpu::BindGroup)>>,
    next_group: usize,
}

/// The entry in place `at` of `slots` where `fits` takes it (and `true`),
/// else the one `create` makes, kept in that place from now on (and `false`).
fn reuse<T>(
    slots: &mut Vec<Slot<T>>,
    at: usize,
    fits: impl Fn(&T) -> bool,
    create: impl FnOnce() -> T,
) -> (&mut T, bool) {
    if at >= slots.len() {
        slots.resize_with(at + 1, || None);
    }
    let slot = &mut slots[at];
    let reused = slot.as_ref().is_some_and(&fits);
    if !reused {
        *slot = None;
    }
    (slot.get_or_insert_with(create), reused)
}

/// Buffers kept for the runs of one prepared call.
#[derive(Debug, Default)]
pub(crate) struct Arena {
    state: Mutex<State>,
}

impl State {
    /// The buffer in the next place when it is of `kind` and `size` (and
    /// `true`), else the one `create` makes, kept there from now on.
    fn next_held(
        &mut self,
        kind: Kind,
        size: u64,
        create: impl FnOnce() -> wgpu::Buffer,
    ) -> (&mut Held, bool) {
        let at = self.next;
        self.next += 1;
        let fits = |h: &Held| h.kind == kind && h.size == size;
        let create = || Held {
            kind,
            size,
            buffer: create(),
            contents: Vec::new(),
        };
        reuse(&mut self.held, at, fits, create)
    }
}

impl Arena {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a run: buffers are handed out from the first again.
    pub(crate) fn begin_run(&self) {
        let mut state = self.state();
        state.next = 0;
        state.next_group = 0;
        state.to_clear.clear();
    }

    /// Forgets every buffer (they belonged to a device that was lost).
    pub(crate) fn reset(&self) {
        *self.state() = State::default();
    }

    /// The buffer in the next place when it is of `kind` and `size`, else the
    /// one `create` makes (kept in that place from now on).
    pub(crate) fn take(
        &self,
        kind: Kind,
        size: u64,
        create: impl FnOnce() -> wgpu::Buffer,
    ) -> wgpu::Buffer {
        let mut state = self.state();
        let (held, reused) = state.next_held(kind, size, create);
        // Whatever the caller puts in it now is not remembered.
        held.contents.clear();
        let buffer = held.buffer.clone();
        if reused && kind == Kind::Zeroed {
            state.to_clear.push(buffer.clone());
        }
        buffer
    }

    /// The buffer in the next place when it is of `kind` and `size`, else the
    /// one `create` makes; and whether it already holds `contents` (the
    /// bytes the caller writes into it, remembered from now on): a kept
    /// parameter block or small upload whose values did not change since the
    /// last run needs no write.
    pub(crate) fn take_remembered(
        &self,
        kind: Kind,
        size: u64,
        contents: &[u8],
        create: impl FnOnce() -> wgpu::Buffer,
    ) -> (wgpu::Buffer, bool) {
        let mut state = self.state();
        let (held, reused) = state.next_held(kind, size, create);
        let holds = reused && held.contents == contents;
        if !holds {
            held.contents = contents.to_vec();
        }
        (held.buffer.clone(), holds)
    }

    /// The bind group in the next place when it binds `key`, else the one
    /// `create` makes (kept in that place from now on).
    pub(crate) fn bind_group(
        &self,
        key: GroupKey,
        create: impl FnOnce() -> wgpu::BindGroup,
    ) -> wgpu::BindGroup {
        let mut state = self.state();
        let at = state.next_group;
        state.next_group += 1;
        let fits = |(held, _): &(GroupKey, wgpu::BindGroup)| *held == key;
        let ((_, group), _) = reuse(&mut state.groups, at, fits, || (key.clone(), create()));
        let group: &wgpu::BindGroup = group;
        group.clone()
    }

    /// Gives `buffer` away (to the caller of the run): the arena forgets it
    /// and every bind group that binds it, so the next run makes new ones and
    /// the buffer lives exactly as long as the caller keeps it.
    pub(crate) fn release(&self, buffer: &wgpu::Buffer) {
        let mut state = self.state();
        for slot in &mut state.held {
            if slot.as_ref().is_some_and(|h| h.buffer == *buffer) {
                *slot = None;
            }
        }
        for slot in &mut state.groups {
            if slot
                .as_ref()
                .is_some_and(|((_, entries), _)| entries.iter().any(|(b, _, _)| b == buffer))
            {
                *slot = None;
            }
        }
    }

    /// Records the clearing of the reused zero-filled buffers into `encoder`:
    /// called before any command that could read one.
    pub(crate) fn clear_pending(&self, encoder: &mut wgpu::CommandEncoder) {
        let pending = std::mem::take(&mut self.state().to_clear);
        for buffer in pending {
            encoder.clear_buffer(&buffer, 0, None);
        }
    }

    /// Whether clears are waiting (a command must be recorded before them).
    pub(crate) fn has_pending(&self) -> bool {
        !self.state().to_clear.is_empty()
    }

    /// Buffers held, and bytes in them.
    pub(crate) fn held(&self) -> (usize, u64) {
        let state = self.state();
        let held = || state.held.iter().flatten();
        (held().count(), held().map(|h| h.size).sum())
    }
}
