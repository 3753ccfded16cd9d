//! The paged cache's bookkeeping, apart from where the pages live: which
//! pages are free, how many sequences share each, and each sequence's block
//! table and length. Every change is planned first and checked whole, then
//! applied, so a refused call leaves the pool as it was.

use crate::error::{Error, Result};

/// A sequence's handle: its slot and the slot's generation, so a handle
/// kept past [`PagePool::free`] is refused rather than naming the slot's
/// next sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SequenceId {
    slot: u32,
    generation: u32,
}

impl SequenceId {
    /// The number errors and logs name the sequence by.
    pub fn number(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.slot)
    }
}

/// One live sequence: its pages in order and the tokens it holds.
#[derive(Debug, Clone, Default)]
pub(super) struct Sequence {
    pub(super) pages: Vec<u32>,
    pub(super) len: usize,
}

#[derive(Debug, Clone, Default)]
struct Slot {
    generation: u32,
    sequence: Option<Sequence>,
}

/// What one sequence's append needs: a private copy of its last page where
/// that page is shared and partly filled (copy on write), and new pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct AppendNeeds {
    pub(super) copy_last: bool,
    pub(super) new_pages: usize,
}

/// Free pages, reference counts and block tables.
#[derive(Debug, Clone)]
pub(super) struct PagePool {
    page_size: usize,
    refs: Vec<u32>,
    free: Vec<u32>,
    slots: Vec<Slot>,
}

impl PagePool {
    pub(super) fn new(page_size: usize) -> Self {
        Self {
            page_size,
            refs: Vec::new(),
            free: Vec::new(),
            slots: Vec::new(),
        }
    }

    /// Pages the pool holds, free or not.
    pub(super) fn pages(&self) -> usize {
        self.refs.len()
    }

    /// Pages some sequence holds.
    pub(super) fn pages_in_use(&self) -> usize {
        self.refs.len() - self.free.len()
    }

    /// Pages free to take without growing.
    pub(super) fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// Sequences a page is shared by (0: free).
    pub(super) fn references(&self, page: u32) -> Result<u32> {
        self.refs.get(page as usize).copied().ok_or(Error::Paged {
            what: "page",
            id: u64::from(page),
            reason: "is outside the pool",
        })
    }

    /// Adds `pages` free pages (the storage grew by as many).
    pub(super) fn grow(&mut self, pages: usize) {
        let first = self.refs.len() as u32;
        self.refs.resize(self.refs.len() + pages, 0);
        // Lowest first: taken from the end of the free list.
        self.free.extend((first..first + pages as u32).rev());
    }

    /// A new empty sequence.
    pub(super) fn add(&mut self) -> SequenceId {
        if let Some(slot) = self.slots.iter().position(|s| s.sequence.is_none()) {
            let entry = &mut self.slots[slot];
            entry.sequence = Some(Sequence::default());
            return SequenceId {
                slot: slot as u32,
                generation: entry.generation,
            };
        }
        self.slots.push(Slot {
            generation: 0,
            sequence: Some(Sequence::default()),
        });
        SequenceId {
            slot: self.slots.len() as u32 - 1,
            generation: 0,
        }
    }

    /// The live sequence `id` names.
    pub(super) fn sequence(&self, id: SequenceId) -> Result<&Sequence> {
        self.slots
            .get(id.slot as usize)
            .filter(|s| s.generation == id.generation)
            .and_then(|s| s.sequence.as_ref())
            .ok_or(Error::Paged {
                what: "sequence",
                id: id.number(),
                reason: "is not in the cache (never added, or freed)",
            })
    }

    fn sequence_mut(&mut self, id: SequenceId) -> Result<&mut Sequence> {
        self.sequence(id)?;
        Ok(self.slots[id.slot as usize]
            .sequence
            .as_mut()
            .expect("checked above"))
    }

    /// The live sequences, oldest slot first.
    pub(super) fn ids(&self) -> Vec<SequenceId> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.sequence.is_some())
            .map(|(slot, s)| SequenceId {
                slot: slot as u32,
                generation: s.generation,
            })
            .collect()
    }

    /// What appending `n` tokens to `id` needs.
    pub(super) fn needs(&self, id: SequenceId, n: usize) -> Result<AppendNeeds> {
        let seq = self.sequence(id)?;
        let partial = seq.len % self.page_size != 0;
        let shared_last = match seq.pages.last() {
            Some(&p) => self.refs[p as usize] > 1,
            None => false,
        };
        let have = seq.pages.len();
        let want = (seq.len + n).div_ceil(self.page_size);
        Ok(AppendNeeds {
            copy_last: n > 0 && partial && shared_last,
            new_pages: want - have,
        })
    }

    /// Takes a free page for `id`'s shared last page and returns
    /// `(old, new)` for the storage to copy; the caller checked
    /// [`PagePool::needs`] and the free pages.
    pub(super) fn copy_last_page(&mut self, id: SequenceId) -> Result<(u32, u32)> {
        let new = self.take()?;
        let seq = self.sequence_mut(id)?;
        let last = seq.pages.last_mut().expect("a partial page");
        let old = std::mem::replace(last, new);
        self.refs[old as usize] -= 1;
        Ok((old, new))
    }

    /// Gives `id` `pages` more free pages.
    pub(super) fn extend(&mut self, id: SequenceId, pages: usize) -> Result<()> {
        let taken = (0..pages)
            .map(|_| self.take())
            .collect::<Result<Vec<_>>>()?;
        self.sequence_mut(id)?.pages.extend(taken);
        Ok(())
    }

    /// Records `n` more tokens in `id` (its pages are in place).
    pub(super) fn advance(&mut self, id: SequenceId, n: usize) -> Result<()> {
        let page_size = self.page_size;
        let seq = self.sequence_mut(id)?;
        debug_assert!(seq.len + n <= seq.pages.len() * page_size);
        seq.len += n;
        Ok(())
    }

    fn take(&mut self) -> Result<u32> {
        let page = self.free.pop().ok_or(Error::OutOfMemory(
            "the paged cache has no free page".into(),
        ))?;
        self.refs[page as usize] = 1;
        Ok(page)
    }

    /// A new sequence sharing every page of `id` (each page's count rises).
    pub(super) fn fork(&mut self, id: SequenceId) -> Result<SequenceId> {
        let copy = self.sequence(id)?.clone();
        for &p in &copy.pages {
            self.refs[p as usize] += 1;
        }
        let child = self.add();
        *self.sequence_mut(child)? = copy;
        Ok(child)
    }

    /// Ends `id`: pages no other sequence shares are free at once.
    pub(super) fn free(&mut self, id: SequenceId) -> Result<()> {
        self.sequence(id)?;
        let slot = &mut self.slots[id.slot as usize];
        let seq = slot.sequence.take().expect("checked above");
        slot.generation = slot.generation.wrapping_add(1);
        for p in seq.pages {
            self.refs[p as usize] -= 1;
            if self.refs[p as usize] == 0 {
                self.free.push(p);
            }
        }
        Ok(())
    }
}
