//! A decoding step from a paged KV cache (`webattn bench --only paged`):
//! one sequence of `cached` tokens in a cache made on the engine (device
//! pages on a GPU engine, host pages on a CPU engine), its pages stored as
//! f32, f16 or int8, and one query row per head attending all of it. The
//! step reads every stored byte of the sequence once, so its time against
//! the bytes per token is the cache's read bandwidth.

use web_time::Instant;

use super::{Measurement, Repeats};
use crate::error::Result;
use crate::paged::{PageStorage, PagedKvCache, PagedLayout};
use crate::rng::SplitMix64;
use crate::{AttentionOptions, HostTensor};

/// The shape of a paged decoding step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedDecodeShape {
    /// Query heads.
    pub heads: usize,
    /// KV heads (a divisor of `heads`).
    pub kv_heads: usize,
    /// Dk = Dv.
    pub head_dim: usize,
    /// Tokens the sequence holds.
    pub cached: usize,
    /// Tokens per page.
    pub page_size: usize,
}

/// A paged decoding step's time and the bytes it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct PagedDecode {
    /// The steps, by the wall clock (the call, its one submission on a GPU,
    /// the readback of Y).
    pub measurement: Measurement,
    /// Stored bytes of one token's keys and values, every KV head.
    pub bytes_per_token: u64,
    /// Bytes the pool holds.
    pub pool_bytes: u64,
}

impl PagedDecode {
    /// GB/s of the sequence's stored keys and values at the median time.
    pub fn gbs(&self, cached: usize) -> f64 {
        (self.bytes_per_token * cached as u64) as f64 / (self.measurement.median_ms() * 1e6)
    }
}

/// Tokens appended per call while filling the cache: bounds the host memory
/// the fill takes.
const FILL_CHUNK: usize = 1024;

/// Times a decoding step of `shape` from a cache on `engine` for each of
/// `storages`, interleaved (each round steps every cache once, so a slow
/// spell of a shared machine falls on all of them): a measurement per
/// storage, in order.
pub async fn paged_decode(
    engine: &crate::Engine,
    shape: PagedDecodeShape,
    storages: &[PageStorage],
    repeats: Repeats,
) -> Result<Vec<PagedDecode>> {
    let (h, d) = (shape.kv_heads, shape.head_dim);
    let layout = PagedLayout {
        kv_heads: h,
        head_dim: d,
        v_head_dim: d,
        page_size: shape.page_size,
    };
    let mut caches = Vec::with_capacity(storages.len());
    for &storage in storages {
        let mut cache = PagedKvCache::on_engine(engine, layout)?.with_storage(storage)?;
        let seq = cache.add_sequence();
        caches.push((cache, seq));
    }
    // The same tokens in every cache.
    let mut rng = SplitMix64::new(0x9a9ed ^ shape.cached as u64);
    let mut filled = 0;
    while filled < shape.cached {
        let n = FILL_CHUNK.min(shape.cached - filled);
        let k = HostTensor::new([h, n, d], rng.normal_vec(h * n * d, 1.0))?;
        let v = HostTensor::new([h, n, d], rng.normal_vec(h * n * d, 1.0))?;
        for (cache, seq) in &mut caches {
            cache.append(*seq, &k, &v)?;
        }
        filled += n;
    }
    let q = HostTensor::new([1, shape.heads, 1, d], rng.normal_vec(shape.heads * d, 1.0))?;
    let options = AttentionOptions::default();
    let mut samples = vec![Vec::with_capacity(repeats.timed); caches.len()];
    for run in 0..repeats.warmup + repeats.timed {
        for ((cache, seq), samples) in caches.iter().zip(&mut samples) {
            let start = Instant::now();
            cache.attention(engine, &[(*seq, &q)], &options).await?;
            if run >= repeats.warmup {
                samples.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    Ok(caches
        .iter()
        .zip(samples)
        .map(|((cache, _), samples)| PagedDecode {
            measurement: Measurement::wall(samples),
            bytes_per_token: cache.token_bytes(),
            pool_bytes: cache.bytes(),
        })
        .collect())
}
