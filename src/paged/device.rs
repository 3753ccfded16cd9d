//! Where the pages' keys and values live on a GPU: one storage buffer of
//! keys and one of values, page `p` at `p * page bytes`, so the paged decode
//! kernel binds each whole and finds a page by its number. Growing makes
//! larger buffers and copies the pages over on the device (queue order keeps
//! every submitted read of the old ones valid); a page keeps its number, which
//! is what the block tables hold, for as long as a sequence holds it.

use super::store::HostPages;
use super::{PageStorage, PagedLayout};
use crate::device::buffer;
use crate::device::context::GpuContext;
use crate::device::scope::Run;
use crate::error::Result;

/// Usages of the page buffers: bound by the kernel, written by the queue,
/// copied when the pool grows and read back by [`DevicePages::read`].
const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// The keys and values of every page, on one device.
#[derive(Debug, Clone)]
pub(super) struct DevicePages {
    pub(super) ctx: GpuContext,
    layout: PagedLayout,
    /// Pages the buffers hold.
    capacity: usize,
    /// How values are stored: f32, f16 two to a 32-bit word, or int8 four to
    /// a word with the row's scale after them.
    pub(super) storage: PageStorage,
    pub(super) keys: wgpu::Buffer,
    pub(super) values: wgpu::Buffer,
}

impl DevicePages {
    /// An empty pool of f32 pages on `ctx`'s device.
    pub(super) fn new(ctx: &GpuContext, layout: PagedLayout) -> Self {
        Self {
            ctx: ctx.clone(),
            layout,
            capacity: 0,
            storage: PageStorage::F32,
            keys: Self::buffer(ctx, "paged keys", 16),
            values: Self::buffer(ctx, "paged values", 16),
        }
    }

    /// An empty pool storing `storage` (f16 and int8: head sizes in
    /// multiples of 4, so a row is whole 32-bit words as the kernel reads it).
    pub(super) fn with_storage(
        ctx: &GpuContext,
        layout: PagedLayout,
        storage: PageStorage,
    ) -> Result<Self> {
        let whole_words = layout.head_dim.is_multiple_of(4) && layout.v_head_dim.is_multiple_of(4);
        if storage != PageStorage::F32 && !whole_words {
            return Err(crate::error::Error::InvalidOption {
                name: "storage",
                value: storage.name().into(),
                reason: "f16 and int8 pages on a GPU need head sizes in multiples of 4",
            });
        }
        Ok(Self {
            storage,
            ..Self::new(ctx, layout)
        })
    }

    /// The paged kernel's form for these pages.
    pub(super) fn element(&self) -> crate::kernels::decode::paged::PagedElement {
        use crate::kernels::decode::paged::PagedElement;
        match self.storage {
            PageStorage::F32 => PagedElement::F32,
            PageStorage::F16 => PagedElement::F16,
            PageStorage::Int8 => PagedElement::I8,
        }
    }

    /// Bytes of a stored row of `dim` values.
    fn row_bytes(&self, dim: usize) -> u64 {
        self.storage.row_bytes(dim)
    }

    fn buffer(ctx: &GpuContext, label: &str, size: u64) -> wgpu::Buffer {
        ctx.counters.buffer_created();
        ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: USAGE,
            mapped_at_creation: false,
        })
    }

    /// Bytes of one page of keys and of values.
    fn page_bytes(&self) -> (u64, u64) {
        let l = self.layout;
        let rows = (l.kv_heads * l.page_size) as u64;
        (
            rows * self.row_bytes(l.head_dim),
            rows * self.row_bytes(l.v_head_dim),
        )
    }

    /// Makes room for `pages` pages, copying the ones held over. Refuses
    /// (changing nothing) where a buffer of that size cannot be bound whole.
    pub(super) fn grow_to(&mut self, pages: usize) -> Result<()> {
        if pages <= self.capacity {
            return Ok(());
        }
        let (kb, vb) = self.page_bytes();
        let (k_size, v_size) = (kb * pages as u64, vb * pages as u64);
        buffer::check_bindable(&self.ctx, "the paged cache's keys", k_size)?;
        buffer::check_bindable(&self.ctx, "the paged cache's values", v_size)?;
        let keys = Self::buffer(&self.ctx, "paged keys", k_size);
        let values = Self::buffer(&self.ctx, "paged values", v_size);
        if self.capacity > 0 {
            let mut encoder = self.ctx.device.create_command_encoder(&Default::default());
            let held = self.capacity as u64;
            encoder.copy_buffer_to_buffer(&self.keys, 0, &keys, 0, kb * held);
            encoder.copy_buffer_to_buffer(&self.values, 0, &values, 0, vb * held);
            self.ctx.queue.submit([encoder.finish()]);
        }
        (self.keys, self.values, self.capacity) = (keys, values, pages);
        Ok(())
    }

    /// Copies page `from` onto page `to`, keys and values (through a
    /// scratch buffer: WebGPU copies between two different buffers only).
    pub(super) fn copy_page(&self, from: u32, to: u32) {
        let (kb, vb) = self.page_bytes();
        let scratch = Self::buffer(&self.ctx, "paged copy", kb.max(vb));
        let mut encoder = self.ctx.device.create_command_encoder(&Default::default());
        for (buffer, bytes) in [(&self.keys, kb), (&self.values, vb)] {
            encoder.copy_buffer_to_buffer(buffer, from as u64 * bytes, &scratch, 0, bytes);
            encoder.copy_buffer_to_buffer(&scratch, 0, buffer, to as u64 * bytes, bytes);
        }
        self.ctx.queue.submit([encoder.finish()]);
    }

    /// Writes `rows` (`[kv_heads, n, dim]`, keys where `keys`, else values)
    /// as tokens `start..start + n` of a sequence whose pages are `pages`:
    /// one queue write per head and page.
    pub(super) fn write(&self, keys: bool, pages: &[u32], start: usize, rows: &[f32]) {
        let l = self.layout;
        let (buffer, dim) = if keys {
            (&self.keys, l.head_dim)
        } else {
            (&self.values, l.v_head_dim)
        };
        let n = rows.len() / dim / l.kv_heads;
        for h in 0..l.kv_heads {
            let mut i = 0;
            while i < n {
                let t = start + i;
                let (page, row) = (pages[t / l.page_size] as usize, t % l.page_size);
                let run = (l.page_size - row).min(n - i);
                let at = ((page * l.kv_heads + h) * l.page_size + row) as u64 * self.row_bytes(dim);
                let from = (h * n + i) * dim;
                let values = &rows[from..from + run * dim];
                let bytes = self.stored_bytes(values, dim);
                buffer::write_bytes(&self.ctx, buffer, at, &bytes);
                i += run;
            }
        }
    }

    /// Rows of `dim` values as the pages store them.
    fn stored_bytes(&self, values: &[f32], dim: usize) -> Vec<u8> {
        match self.storage {
            PageStorage::F32 => bytemuck::cast_slice(values).to_vec(),
            PageStorage::F16 => values
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            PageStorage::Int8 => {
                let mut words = Vec::with_capacity(values.len() / 4 + values.len() / dim);
                let mut q = vec![0i8; dim];
                for row in values.chunks_exact(dim) {
                    let scale = crate::int8::quantize(row, &mut q);
                    crate::int8::pack_words(&q, scale, &mut words);
                }
                bytemuck::cast_slice(&words).to_vec()
            }
        }
    }

    /// Stored rows of `dim` values read back as f32.
    fn widen(&self, words: Vec<f32>, dim: usize) -> Vec<f32> {
        match self.storage {
            PageStorage::F32 => words,
            PageStorage::F16 => {
                let halves: &[u16] = bytemuck::cast_slice(&words);
                halves
                    .iter()
                    .map(|&b| half::f16::from_bits(b).to_f32())
                    .collect()
            }
            PageStorage::Int8 => {
                let words: &[u32] = bytemuck::cast_slice(&words);
                let mut out = vec![0.0f32; words.len() / (dim / 4 + 1) * dim];
                let mut q = vec![0i8; dim];
                for (row, o) in words
                    .chunks_exact(dim / 4 + 1)
                    .zip(out.chunks_exact_mut(dim))
                {
                    for (four, w) in q.chunks_exact_mut(4).zip(row) {
                        for (x, b) in four.iter_mut().zip(w.to_le_bytes()) {
                            *x = b as i8;
                        }
                    }
                    crate::int8::dequantize(&q, f32::from_bits(row[dim / 4]), o);
                }
                out
            }
        }
    }

    /// The first `len` tokens of a sequence whose pages are `pages`, keys
    /// `[kv_heads, len, head_dim]` and values `[kv_heads, len, v_head_dim]`,
    /// read back from the device: its pages alone, gathered on the device
    /// into one buffer in table order.
    pub(super) async fn read(&self, pages: &[u32], len: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let l = self.layout;
        let run = Run::new(&self.ctx);
        let (kb, vb) = self.page_bytes();
        let in_order: Vec<u32> = (0..pages.len() as u32).collect();
        let mut out = Vec::with_capacity(2);
        for (buffer, dim, bytes) in [
            (&self.keys, l.head_dim, kb),
            (&self.values, l.v_head_dim, vb),
        ] {
            let size = bytes * pages.len() as u64;
            let gathered = Self::buffer(&self.ctx, "paged read", size.max(16));
            let mut encoder = self.ctx.device.create_command_encoder(&Default::default());
            for (i, &page) in pages.iter().enumerate() {
                let (from, to) = (page as u64 * bytes, i as u64 * bytes);
                encoder.copy_buffer_to_buffer(buffer, from, &gathered, to, bytes);
            }
            self.ctx.queue.submit([encoder.finish()]);
            let words = buffer::read_f32(&run, &gathered, 0, (size / 4) as usize).await?;
            let data = self.widen(words, dim);
            let host = HostPages::holding(l.kv_heads, l.page_size, dim, data);
            out.push(host.read(&in_order, len));
        }
        let values = out.pop().expect("two reads");
        Ok((out.pop().expect("two reads"), values))
    }

    /// Bytes the page buffers hold.
    pub(super) fn bytes(&self) -> u64 {
        let (kb, vb) = self.page_bytes();
        (kb + vb) * self.capacity as u64
    }
}
