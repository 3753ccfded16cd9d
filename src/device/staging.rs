//! Readback staging buffers kept for reuse: a download of a size read
//! before takes a `MAP_READ` buffer from here instead of creating one, so a
//! decoder that reads its hidden state back every token allocates nothing on
//! the device after the first.

use std::sync::Mutex;

/// Buffers kept at most; a readback that finds none free creates one.
const KEPT: usize = 4;
/// The largest buffer kept: a bigger readback costs far more than its
/// allocation, and holding its memory would cost more still.
const LARGEST_KEPT: u64 = 16 << 20;

/// The free readback buffers of one device, shared by its contexts' clones.
#[derive(Debug, Default)]
pub(crate) struct StagingPool {
    free: Mutex<Vec<wgpu::Buffer>>,
}

impl StagingPool {
    /// The size to create a buffer of for a readback of `bytes`: the next
    /// power of two (at least 256 bytes) where it may be kept, so that
    /// readbacks of nearby sizes share it; else `bytes`.
    pub(crate) fn size_for(bytes: u64) -> u64 {
        if bytes <= LARGEST_KEPT {
            bytes.max(256).next_power_of_two()
        } else {
            bytes
        }
    }

    /// The smallest free buffer that holds `bytes`, taken out of the pool.
    pub(crate) fn take(&self, bytes: u64) -> Option<wgpu::Buffer> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.size() >= bytes)
            .min_by_key(|(_, b)| b.size())
            .map(|(i, _)| i)?;
        Some(free.swap_remove(best))
    }

    /// Gives back an unmapped buffer after a readback: kept if it is small
    /// enough and the pool has room, or if it is larger than the smallest
    /// kept one, which then gives way.
    pub(crate) fn give(&self, buffer: wgpu::Buffer) {
        if buffer.size() > LARGEST_KEPT {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() >= KEPT {
            let smallest = free
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.size())
                .map(|(i, b)| (i, b.size()));
            match smallest {
                Some((i, size)) if size < buffer.size() => {
                    free.swap_remove(i);
                }
                _ => return,
            }
        }
        free.push(buffer);
    }

    /// Drops every kept buffer.
    pub(crate) fn clear(&self) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_shared_classes_below_the_largest_kept() {
        assert_eq!(StagingPool::size_for(4), 256);
        assert_eq!(StagingPool::size_for(16384), 16384);
        assert_eq!(StagingPool::size_for(16388), 32768);
        assert_eq!(StagingPool::size_for(LARGEST_KEPT + 4), LARGEST_KEPT + 4);
    }
}
