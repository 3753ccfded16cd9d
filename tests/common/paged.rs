//! The paged KV cache's cases, run by `tests/paged.rs` on host pages and the
//! CPU backend and by `tests/gpu/paged.rs` on a GPU's pages and its paged
//! decode kernel: block tables, forks sharing pages and copying the last on
//! write, pages freed at once, refusals that change nothing, and attention
//! through the pages against the f64 oracle on the same tokens held
//! contiguously.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use webattn::paged::{Append, PageStorage};
use webattn::rng::SplitMix64;
use webattn::{
    AttentionInputs, AttentionOptions, Engine, Error, HostTensor, PagedKvCache, PagedLayout,
    SequenceId,
};

/// Where a case's caches live and which engine attends through them.
pub struct Where<'a> {
    /// The engine.
    pub engine: &'a Engine,
    /// Pages in the engine's device memory (`PagedKvCache::on_engine`), or on
    /// the host (`PagedKvCache::new`).
    pub device: bool,
    /// The page sizes the cases try.
    pub page_sizes: &'a [usize],
    /// How the pages store values (the cases' keys and values are then
    /// values f16, or int8 with its row scale, holds exactly, so the tokens
    /// read back as appended).
    pub storage: PageStorage,
}

impl Where<'_> {
    fn cache(&self, layout: PagedLayout) -> PagedKvCache {
        let cache = if self.device {
            PagedKvCache::on_engine(self.engine, layout).unwrap()
        } else {
            PagedKvCache::new(layout).unwrap()
        };
        assert_eq!(
            cache.on_device(),
            self.device && self.engine.gpu().is_some()
        );
        cache.with_storage(self.storage).unwrap()
    }
}

pub const KV_HEADS: usize = 2;
pub const DK: usize = 8;
pub const DV: usize = 4;

pub fn layout(page_size: usize) -> PagedLayout {
    PagedLayout {
        kv_heads: KV_HEADS,
        head_dim: DK,
        v_head_dim: DV,
        page_size,
    }
}

/// A sequence's tokens as the test appended them: per head, rows in order.
#[derive(Clone, Default)]
struct Tokens {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl Tokens {
    fn new() -> Self {
        Self {
            keys: vec![Vec::new(); KV_HEADS],
            values: vec![Vec::new(); KV_HEADS],
        }
    }

    fn push(&mut self, key: &HostTensor, value: &HostTensor) {
        let n = key.shape()[1];
        for h in 0..KV_HEADS {
            self.keys[h].extend_from_slice(&key.data()[h * n * DK..][..n * DK]);
            self.values[h].extend_from_slice(&value.data()[h * n * DV..][..n * DV]);
        }
    }

    fn tensors(&self) -> (HostTensor, HostTensor) {
        let len = self.keys[0].len() / DK;
        (
            HostTensor::new([1, KV_HEADS, len, DK], self.keys.concat()).unwrap(),
            HostTensor::new([1, KV_HEADS, len, DV], self.values.concat()).unwrap(),
        )
    }
}

/// Keys and values of `n` tokens that `storage` holds exactly: normal
/// values (rounded to f16 for f16 pages); for int8 pages, whole multiples
/// of a power of two per row with one of ±127 steps, so the row's scale is
/// that power of two and every value is a whole step.
fn rows(rng: &mut SplitMix64, n: usize, storage: PageStorage) -> (HostTensor, HostTensor) {
    let mut values = |d: usize| {
        let mut v = rng.normal_vec(KV_HEADS * n * d, 1.0);
        match storage {
            PageStorage::F16 => v
                .iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
            PageStorage::Int8 => {
                for row in v.chunks_exact_mut(d) {
                    let step = 2f32.powi(-(rng.below(4) as i32) - 5);
                    let top = rng.below(d);
                    for (i, x) in row.iter_mut().enumerate() {
                        let q = if i == top {
                            127.0f32.copysign(*x)
                        } else {
                            (*x * 40.0).round().clamp(-127.0, 127.0)
                        };
                        *x = q * step;
                    }
                }
            }
            _ => {}
        }
        HostTensor::new([KV_HEADS, n, d], v).unwrap()
    };
    (values(DK), values(DV))
}

/// Every live sequence reads back exactly as appended; the pages in use are
/// those the block tables name, each counted once per sequence holding it.
fn check_contents(cache: &PagedKvCache, model: &BTreeMap<SequenceId, Tokens>) {
    let live: BTreeSet<SequenceId> = cache.sequences().into_iter().collect();
    assert_eq!(live, model.keys().copied().collect());
    let mut holders: BTreeMap<u32, u32> = BTreeMap::new();
    for (&seq, tokens) in model {
        let (k, v) = cache.read_blocking(seq).unwrap();
        let (want_k, want_v) = tokens.tensors();
        assert_eq!(k, want_k, "keys of {seq:?}");
        assert_eq!(v, want_v, "values of {seq:?}");
        let table = cache.block_table(seq).unwrap();
        let len = cache.len(seq).unwrap();
        assert_eq!(table.len(), len.div_ceil(cache.layout().page_size));
        for &p in table {
            *holders.entry(p).or_default() += 1;
        }
    }
    assert_eq!(cache.pages_in_use(), holders.len());
    for (&page, &count) in &holders {
        assert_eq!(cache.page_references(page).unwrap(), count, "page {page}");
    }
}

pub fn sequences_grow_fork_and_free_through_their_block_tables(at: &Where) {
    for &page_size in at.page_sizes {
        let mut rng = SplitMix64::new(page_size as u64);
        let mut cache = at.cache(layout(page_size));
        let mut model: BTreeMap<SequenceId, Tokens> = BTreeMap::new();
        for step in 0..120 {
            let live: Vec<SequenceId> = model.keys().copied().collect();
            match rng.below(10) {
                0 | 1 if model.len() < 12 => {
                    model.insert(cache.add_sequence(), Tokens::new());
                }
                2 if !live.is_empty() => {
                    let parent = live[rng.below(live.len())];
                    let child = cache.fork(parent).unwrap();
                    model.insert(child, model[&parent].clone());
                }
                3 if live.len() > 1 => {
                    let seq = live[rng.below(live.len())];
                    cache.free(seq).unwrap();
                    model.remove(&seq);
                }
                _ if !live.is_empty() => {
                    // Several sequences in one call, each its own length:
                    // single tokens (decode) and prompts past a page.
                    let picked: Vec<SequenceId> =
                        live.iter().copied().filter(|_| rng.below(2) == 0).collect();
                    let appended: Vec<(SequenceId, HostTensor, HostTensor)> = picked
                        .iter()
                        .map(|&seq| {
                            let n = [1, 1, 3, page_size - 1, page_size + 5][rng.below(5)];
                            let (k, v) = rows(&mut rng, n, at.storage);
                            (seq, k, v)
                        })
                        .collect();
                    let items: Vec<_> = appended.iter().map(|(s, k, v)| (*s, k, v)).collect();
                    cache.append_many(&items).unwrap();
                    for (seq, k, v) in &appended {
                        model.get_mut(seq).unwrap().push(k, v);
                    }
                }
                _ => {}
            }
            check_contents(&cache, &model);
            assert!(cache.pages_in_use() <= cache.pages(), "step {step}");
        }
        println!(
            "page size {page_size}: {} sequences, {} pages in use of {}, {} KiB",
            model.len(),
            cache.pages_in_use(),
            cache.pages(),
            cache.bytes() / 1024
        );
    }
}

pub fn a_fork_shares_its_pages_until_one_writes_into_the_last(at: &Where) {
    let mut rng = SplitMix64::new(3);
    let mut cache = at.cache(layout(16));
    let parent = cache.add_sequence();
    let (k, v) = rows(&mut rng, 40, at.storage); // two full pages and 8 tokens of a third
    cache.append(parent, &k, &v).unwrap();
    let child = cache.fork(parent).unwrap();
    assert_eq!(
        cache.block_table(child).unwrap(),
        cache.block_table(parent).unwrap()
    );
    assert_eq!(cache.pages_in_use(), 3);
    let before = cache.read_blocking(parent).unwrap();
    let (k1, v1) = rows(&mut rng, 1, at.storage);
    cache.append(child, &k1, &v1).unwrap();
    // The child copied the shared third page and wrote its token there; the
    // full pages stay shared; the parent reads as before.
    let (p, c) = (
        cache.block_table(parent).unwrap().to_vec(),
        cache.block_table(child).unwrap().to_vec(),
    );
    assert_eq!(p[..2], c[..2]);
    assert_ne!(p[2], c[2]);
    assert_eq!(cache.page_references(p[0]).unwrap(), 2);
    assert_eq!(cache.page_references(p[2]).unwrap(), 1);
    assert_eq!(cache.read_blocking(parent).unwrap(), before);
    assert_eq!(cache.len(child).unwrap(), 41);
    // Freeing the parent frees only its own third page.
    cache.free(parent).unwrap();
    assert_eq!(cache.pages_in_use(), 3);
    assert_eq!(cache.page_references(p[2]).unwrap(), 0);
    cache.free(child).unwrap();
    assert_eq!(cache.pages_in_use(), 0);
}

/// The worst error against the oracle over its allowance: twice the plain
/// f32 computation's error plus a floor.
pub fn share_of_allowance(got: &HostTensor, exact: &HostTensor, plain: &[f32]) -> f64 {
    let err = |a: &[f32]| {
        a.iter()
            .zip(exact.data())
            .map(|(&x, &y)| f64::from((x - y).abs()))
            .fold(0.0, f64::max)
    };
    err(got.data()) / (2.0 * err(plain) + 1e-6)
}

pub fn attention_through_the_pages_matches_the_oracle_on_the_tokens_held_contiguously(at: &Where) {
    let engine = at.engine;
    let mut worst: f64 = 0.0;
    for &page_size in at.page_sizes {
        let mut rng = SplitMix64::new(11 + page_size as u64);
        let mut cache = at.cache(layout(page_size));
        let mut model: BTreeMap<SequenceId, Tokens> = BTreeMap::new();
        let shared = cache.add_sequence();
        let (k, v) = rows(&mut rng, 97, at.storage); // a shared prompt
        cache.append(shared, &k, &v).unwrap();
        model.insert(shared, Tokens::new());
        model.get_mut(&shared).unwrap().push(&k, &v);
        // A ragged batch: forks of the prompt and a sequence of its own, each
        // then given its own tokens (1, 7 and 257 new ones).
        let seqs = [
            cache.fork(shared).unwrap(),
            cache.fork(shared).unwrap(),
            cache.add_sequence(),
        ];
        for (&seq, n) in seqs.iter().zip([1, 7, 257]) {
            let mut tokens = if seq == seqs[2] {
                Tokens::new()
            } else {
                model[&shared].clone()
            };
            let (k, v) = rows(&mut rng, n, at.storage);
            cache.append(seq, &k, &v).unwrap();
            tokens.push(&k, &v);
            model.insert(seq, tokens);
        }
        let option_sets = [
            AttentionOptions {
                is_causal: true,
                return_lse: true,
                ..Default::default()
            },
            AttentionOptions {
                is_causal: true,
                left_window_size: 16,
                softcap: 20.0,
                scale: Some(0.3),
                ..Default::default()
            },
            AttentionOptions {
                is_causal: true,
                alibi: true,
                temperature: 0.7,
                return_lse: true,
                ..Default::default()
            },
            AttentionOptions::default(),
        ];
        for options in &option_sets {
            // One call for four sequences: two decode rows (one batch), a
            // few rows, and a prefill of 33 (blocks of 16, 16 and 1 rows on
            // the GPU). Four query heads over two KV heads (GQA); the
            // queries are each sequence's last n tokens.
            let asked = [(seqs[0], 1), (seqs[1], 7), (seqs[2], 33), (shared, 1)];
            let queries: Vec<HostTensor> = asked
                .iter()
                .map(|&(_, n)| {
                    HostTensor::new([1, 4, n, DK], rng.normal_vec(4 * n * DK, 1.0)).unwrap()
                })
                .collect();
            let call: Vec<_> = asked.iter().map(|&(s, _)| s).zip(&queries).collect();
            let paged = cache.attention_blocking(engine, &call, options).unwrap();
            for ((&seq, q), paged) in asked.iter().map(|(s, _)| s).zip(&queries).zip(&paged) {
                let oracle = cache.oracle_blocking(seq, q, options).unwrap();
                let (k, v) = model[&seq].tensors();
                let lengths = [cache.len(seq).unwrap() as i64];
                let mut inputs = AttentionInputs::new(q, &k, &v);
                inputs.nonpad_kv_seqlen = Some(&lengths);
                let contiguous = webattn::cpu::attention(&inputs, options).unwrap();
                assert_eq!(oracle.y, contiguous.y, "the oracle through the pages");
                assert_eq!(oracle.lse, contiguous.lse);
                let plain = webattn::cpu::attention_plain_f32(&inputs, options).unwrap();
                let share = share_of_allowance(&paged.y, &contiguous.y, &plain.y);
                assert!(share <= 1.0, "page {page_size}, {options:?}: {share}");
                worst = worst.max(share);
                assert_eq!(paged.lse.is_some(), options.return_lse);
                if let (Some(got), Some(exact)) = (&paged.lse, &contiguous.lse) {
                    for (a, b) in got.data().iter().zip(exact.data()) {
                        assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "lse {a} {b}");
                    }
                }
            }
        }
    }
    let path = if at.device {
        "the GPU's pages (paged decode kernel)"
    } else {
        "host pages (CPU backend)"
    };
    println!("attention through {path}: worst {worst:.3} of the allowed error");
}

pub fn refused_calls_leave_every_sequence_as_it_was(at: &Where) {
    for page_size in [0, 8, 100, 512] {
        let err = PagedKvCache::on_engine(at.engine, layout(page_size)).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidOption {
                    name: "page_size",
                    ..
                }
            ),
            "{err}"
        );
    }
    let mut rng = SplitMix64::new(5);
    let mut cache = at.cache(layout(16)).with_page_limit(6);
    let (a, b) = (cache.add_sequence(), cache.add_sequence());
    let mut model = BTreeMap::new();
    for (seq, n) in [(a, 20), (b, 30)] {
        let (k, v) = rows(&mut rng, n, at.storage);
        cache.append(seq, &k, &v).unwrap();
        let mut t = Tokens::new();
        t.push(&k, &v);
        model.insert(seq, t);
    }
    let freed = cache.add_sequence();
    cache.free(freed).unwrap();
    let (k1, v1) = rows(&mut rng, 1, at.storage);
    let (big_k, big_v) = rows(&mut rng, 60, at.storage); // a: 80 tokens, 7 pages in use of 6
    let wrong_heads = HostTensor::new([3, 1, DK], vec![0.0; 3 * DK]).unwrap();
    let wrong_dim = HostTensor::new([KV_HEADS, 1, DV], vec![0.0; KV_HEADS * DV]).unwrap();
    let flat = HostTensor::new([KV_HEADS * DK], vec![0.0; KV_HEADS * DK]).unwrap();
    let refusals: Vec<(Vec<Append<'_>>, &str)> = vec![
        (vec![(a, &k1, &v1), (freed, &k1, &v1)], "Paged"),
        (vec![(a, &k1, &v1), (a, &k1, &v1)], "Conflict"),
        (vec![(a, &wrong_heads, &v1)], "ShapeMismatch"),
        (vec![(b, &k1, &v1), (a, &wrong_dim, &v1)], "ShapeMismatch"),
        (vec![(a, &flat, &v1)], "Rank"),
        (vec![(b, &k1, &v1), (a, &big_k, &big_v)], "OutOfMemory"),
    ];
    for (items, kind) in refusals {
        let err = cache.append_many(&items).unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
        check_contents(&cache, &model);
    }
    assert_eq!(cache.fork(freed).unwrap_err().kind(), "Paged");
    assert_eq!(cache.free(freed).unwrap_err().kind(), "Paged");
    assert_eq!(cache.page_references(10_000).unwrap_err().kind(), "Paged");
    let q = HostTensor::new([1, 2, 25, DK], vec![0.0; 2 * 25 * DK]).unwrap();
    let engine = at.engine;
    let long = cache.attention_blocking(engine, &[(a, &q)], &AttentionOptions::default());
    assert_eq!(long.unwrap_err().kind(), "ShapeMismatch");
    let present = AttentionOptions {
        return_present: true,
        ..Default::default()
    };
    let q1 = HostTensor::new([1, 2, 1, DK], vec![0.0; 2 * DK]).unwrap();
    let err = cache
        .attention_blocking(engine, &[(a, &q1)], &present)
        .unwrap_err();
    assert_eq!(err.kind(), "Conflict");
    check_contents(&cache, &model);
    // Within the limit the same append goes through.
    cache.append(a, &k1, &v1).unwrap();
    model.get_mut(&a).unwrap().push(&k1, &v1);
    check_contents(&cache, &model);
}

/// A multi-head layer's serving step over the pages
/// (`MultiHeadAttention::forward_paged`): three sequences with prompts of
/// different lengths, then single tokens and a few, each step's outputs
/// against each sequence run alone through `forward_cached` on a cache of
/// its own. Returns the worst normwise difference.
pub fn a_layer_step_over_pages_matches_each_sequence_alone(at: &Where) -> f64 {
    use webattn::family::mha::{KvCache, MhaWeights, MultiHeadAttention};
    use webattn::family::position::Rope;
    let (d_model, heads, kv_heads, head_dim) = (32, 4, 2, 8);
    let weights = MhaWeights::random(d_model, d_model, heads, kv_heads, head_dim, 7).unwrap();
    let mha = MultiHeadAttention::new(weights, heads, kv_heads)
        .unwrap()
        .with_rope(Rope::default())
        .unwrap();
    let layout = PagedLayout {
        kv_heads,
        head_dim,
        v_head_dim: head_dim,
        page_size: at.page_sizes[0],
    };
    let mut cache = at.cache(layout);
    let seqs = [
        cache.add_sequence(),
        cache.add_sequence(),
        cache.add_sequence(),
    ];
    let mut alone: Vec<KvCache> = (0..3).map(|_| KvCache::with_capacity(64)).collect();
    let mut rng = SplitMix64::new(31);
    let options = AttentionOptions::default();
    let mut worst: f64 = 0.0;
    for tokens in [[5, 1, 12], [1, 1, 1], [3, 1, 2]] {
        let xs: Vec<HostTensor> = tokens
            .iter()
            .map(|&n| HostTensor::new([1, n, d_model], rng.normal_vec(n * d_model, 1.0)).unwrap())
            .collect();
        let step: Vec<_> = seqs.iter().copied().zip(&xs).collect();
        let paged = mha
            .forward_paged_blocking(at.engine, &mut cache, &step, &options)
            .unwrap();
        for (i, x) in xs.iter().enumerate() {
            let want = mha
                .forward_cached_blocking(at.engine, x, &mut alone[i], &options, false)
                .unwrap()
                .output;
            assert_eq!(paged[i].shape(), want.shape());
            let diff = paged[i]
                .data()
                .iter()
                .zip(want.data())
                .map(|(a, b)| f64::from((a - b).abs()))
                .fold(0.0, f64::max);
            let scale = want
                .data()
                .iter()
                .map(|x| f64::from(x.abs()))
                .fold(1e-30, f64::max);
            worst = worst.max(diff / scale);
        }
    }
    for (&seq, n) in seqs.iter().zip([9, 3, 15]) {
        assert_eq!(cache.len(seq).unwrap(), n);
    }
    // A refused step changes nothing: a sequence named twice, a wrong width.
    let x = HostTensor::new([1, 1, d_model], vec![0.5; d_model]).unwrap();
    let twice = [(seqs[0], &x), (seqs[0], &x)];
    assert!(mha
        .forward_paged_blocking(at.engine, &mut cache, &twice, &options)
        .is_err());
    let narrow = HostTensor::new([1, 1, d_model - 1], vec![0.5; d_model - 1]).unwrap();
    let err = mha
        .forward_paged_blocking(at.engine, &mut cache, &[(seqs[1], &narrow)], &options)
        .unwrap_err();
    assert_eq!(err.kind(), "ShapeMismatch");
    assert_eq!(cache.len(seqs[0]).unwrap(), 9);
    assert_eq!(cache.len(seqs[1]).unwrap(), 3);
    println!("a layer's paged step against each sequence alone: worst {worst:.2e} (normwise)");
    assert!(worst < 1e-5, "{worst}");
    worst
}
