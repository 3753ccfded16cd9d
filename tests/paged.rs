//! The paged KV cache (`webattn::paged`): block tables, forks sharing pages
//! and copying the last on write, pages freed at once, refusals that change
//! nothing, and attention through the pages against the f64 oracle on the
//! same tokens held contiguously.

use std::collections::{BTreeMap, BTreeSet};

use webattn::paged::{Append, PAGE_SIZES};
use webattn::rng::SplitMix64;
use webattn::{
    AttentionInputs, AttentionOptions, Engine, Error, HostTensor, PagedKvCache, PagedLayout,
    SequenceId,
};

const KV_HEADS: usize = 2;
const DK: usize = 8;
const DV: usize = 4;

fn layout(page_size: usize) -> PagedLayout {
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

fn rows(rng: &mut SplitMix64, n: usize) -> (HostTensor, HostTensor) {
    (
        HostTensor::new([KV_HEADS, n, DK], rng.normal_vec(KV_HEADS * n * DK, 1.0)).unwrap(),
        HostTensor::new([KV_HEADS, n, DV], rng.normal_vec(KV_HEADS * n * DV, 1.0)).unwrap(),
    )
}

/// Every live sequence reads back exactly as appended; the pages in use are
/// those the block tables name, each counted once per sequence holding it.
fn check_contents(cache: &PagedKvCache, model: &BTreeMap<SequenceId, Tokens>) {
    let live: BTreeSet<SequenceId> = cache.sequences().into_iter().collect();
    assert_eq!(live, model.keys().copied().collect());
    let mut holders: BTreeMap<u32, u32> = BTreeMap::new();
    for (&seq, tokens) in model {
        let (k, v) = cache.read(seq).unwrap();
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

#[test]
fn sequences_grow_fork_and_free_through_their_block_tables() {
    for page_size in [16, 64, 256] {
        let mut rng = SplitMix64::new(page_size as u64);
        let mut cache = PagedKvCache::new(layout(page_size)).unwrap();
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
                            let (k, v) = rows(&mut rng, n);
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

#[test]
fn a_fork_shares_its_pages_until_one_writes_into_the_last() {
    let mut rng = SplitMix64::new(3);
    let mut cache = PagedKvCache::new(layout(16)).unwrap();
    let parent = cache.add_sequence();
    let (k, v) = rows(&mut rng, 40); // two full pages and 8 tokens of a third
    cache.append(parent, &k, &v).unwrap();
    let child = cache.fork(parent).unwrap();
    assert_eq!(
        cache.block_table(child).unwrap(),
        cache.block_table(parent).unwrap()
    );
    assert_eq!(cache.pages_in_use(), 3);
    let before = cache.read(parent).unwrap();
    let (k1, v1) = rows(&mut rng, 1);
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
    assert_eq!(cache.read(parent).unwrap(), before);
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
fn share_of_allowance(got: &HostTensor, exact: &HostTensor, plain: &[f32]) -> f64 {
    let err = |a: &[f32]| {
        a.iter()
            .zip(exact.data())
            .map(|(&x, &y)| f64::from((x - y).abs()))
            .fold(0.0, f64::max)
    };
    err(got.data()) / (2.0 * err(plain) + 1e-6)
}

#[test]
fn attention_through_the_pages_matches_the_oracle_on_the_tokens_held_contiguously() {
    let engine = Engine::cpu();
    let mut worst: f64 = 0.0;
    for page_size in PAGE_SIZES {
        let mut rng = SplitMix64::new(11 + page_size as u64);
        let mut cache = PagedKvCache::new(layout(page_size)).unwrap();
        let mut model: BTreeMap<SequenceId, Tokens> = BTreeMap::new();
        let shared = cache.add_sequence();
        let (k, v) = rows(&mut rng, 97); // a shared prompt
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
            let (k, v) = rows(&mut rng, n);
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
            AttentionOptions::default(),
        ];
        for options in &option_sets {
            for (&seq, n) in seqs.iter().zip([1, 7, 33]) {
                // Four query heads over two KV heads (GQA): the last n tokens.
                let q = HostTensor::new([1, 4, n, DK], rng.normal_vec(4 * n * DK, 1.0)).unwrap();
                let paged = cache
                    .attention_blocking(&engine, &[(seq, &q)], options)
                    .unwrap();
                let oracle = cache.oracle(seq, &q, options).unwrap();
                let (k, v) = model[&seq].tensors();
                let lengths = [cache.len(seq).unwrap() as i64];
                let mut inputs = AttentionInputs::new(&q, &k, &v);
                inputs.nonpad_kv_seqlen = Some(&lengths);
                let contiguous = webattn::cpu::attention(&inputs, options).unwrap();
                assert_eq!(oracle.y, contiguous.y, "the oracle through the pages");
                assert_eq!(oracle.lse, contiguous.lse);
                let plain = webattn::cpu::attention_plain_f32(&inputs, options).unwrap();
                let share = share_of_allowance(&paged[0].y, &contiguous.y, &plain.y);
                assert!(share <= 1.0, "page {page_size}, {options:?}: {share}");
                worst = worst.max(share);
            }
        }
    }
    println!("CPU backend through the pages: worst {worst:.3} of the allowed error");
}

#[test]
fn refused_calls_leave_every_sequence_as_it_was() {
    for page_size in [0, 8, 100, 512] {
        let err = PagedKvCache::new(layout(page_size)).unwrap_err();
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
    let mut cache = PagedKvCache::new(layout(16)).unwrap().with_page_limit(6);
    let (a, b) = (cache.add_sequence(), cache.add_sequence());
    let mut model = BTreeMap::new();
    for (seq, n) in [(a, 20), (b, 30)] {
        let (k, v) = rows(&mut rng, n);
        cache.append(seq, &k, &v).unwrap();
        let mut t = Tokens::new();
        t.push(&k, &v);
        model.insert(seq, t);
    }
    let freed = cache.add_sequence();
    cache.free(freed).unwrap();
    let (k1, v1) = rows(&mut rng, 1);
    let (big_k, big_v) = rows(&mut rng, 60); // a: 80 tokens, 7 pages in use of 6
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
    let engine = Engine::cpu();
    let long = cache.attention_blocking(&engine, &[(a, &q)], &AttentionOptions::default());
    assert_eq!(long.unwrap_err().kind(), "ShapeMismatch");
    let present = AttentionOptions {
        return_present: true,
        ..Default::default()
    };
    let q1 = HostTensor::new([1, 2, 1, DK], vec![0.0; 2 * DK]).unwrap();
    let err = cache
        .attention_blocking(&engine, &[(a, &q1)], &present)
        .unwrap_err();
    assert_eq!(err.kind(), "Conflict");
    check_contents(&cache, &model);
    // Within the limit the same append goes through.
    cache.append(a, &k1, &v1).unwrap();
    model.get_mut(&a).unwrap().push(&k1, &v1);
    check_contents(&cache, &model);
}

/// Packed `[total, heads, size]` rows of the given sequences' lengths.
fn packed(rng: &mut SplitMix64, lengths: &[usize], heads: usize, size: usize) -> HostTensor {
    let total: usize = lengths.iter().sum();
    HostTensor::new(
        [total, heads, size],
        rng.normal_vec(total * heads * size, 1.0),
    )
    .unwrap()
}

fn offsets(lengths: &[usize]) -> Vec<i64> {
    let mut out = vec![0i64];
    for &n in lengths {
        out.push(out.last().unwrap() + n as i64);
    }
    out
}

/// Rows `start..start + n` of packed `[total, heads, size]` as `[1, heads, n, size]`.
fn unpack(t: &HostTensor, start: usize, n: usize) -> HostTensor {
    let [_, heads, size] = [t.shape()[0], t.shape()[1], t.shape()[2]];
    let mut out = vec![0.0f32; heads * n * size];
    for h in 0..heads {
        for i in 0..n {
            out[(h * n + i) * size..][..size]
                .copy_from_slice(&t.data()[((start + i) * heads + h) * size..][..size]);
        }
    }
    HostTensor::new([1, heads, n, size], out).unwrap()
}

#[test]
fn a_ragged_batch_attends_each_sequence_to_its_own_keys() {
    let engine = Engine::cpu();
    let mut rng = SplitMix64::new(21);
    // Lengths that are not tile multiples, an empty sequence, a decode row
    // against a long prompt, and cross-attention lengths.
    let q_lengths = [1, 7, 97, 0, 33, 1];
    let k_lengths = [1, 7, 97, 0, 40, 257];
    let (q, k, v) = (
        packed(&mut rng, &q_lengths, 4, DK),
        packed(&mut rng, &k_lengths, 2, DK),
        packed(&mut rng, &k_lengths, 2, DV),
    );
    let (cu_q, cu_k) = (offsets(&q_lengths), offsets(&k_lengths));
    let inputs = webattn::RaggedInputs {
        q: &q,
        k: &k,
        v: &v,
        cu_seqlens_q: &cu_q,
        cu_seqlens_k: &cu_k,
    };
    let mut worst: f64 = 0.0;
    for options in [
        AttentionOptions {
            is_causal: true,
            return_lse: true,
            ..Default::default()
        },
        AttentionOptions {
            left_window_size: 8,
            softcap: 10.0,
            return_lse: true,
            ..Default::default()
        },
    ] {
        let out = engine.attention_ragged_blocking(&inputs, &options).unwrap();
        assert_eq!(out.y.shape(), &[q.shape()[0], 4, DV]);
        let lse = out.lse.as_ref().unwrap();
        for (i, (&nq, &nk)) in q_lengths.iter().zip(&k_lengths).enumerate() {
            if nq == 0 {
                continue;
            }
            let (q0, k0) = (cu_q[i] as usize, cu_k[i] as usize);
            let (qs, ks, vs) = (unpack(&q, q0, nq), unpack(&k, k0, nk), unpack(&v, k0, nk));
            let alone = AttentionInputs::new(&qs, &ks, &vs);
            let exact = webattn::cpu::attention(&alone, &options).unwrap();
            let plain = webattn::cpu::attention_plain_f32(&alone, &options).unwrap();
            let got = unpack(&out.y, q0, nq);
            let share = share_of_allowance(&got, &exact.y, &plain.y);
            assert!(share <= 1.0, "sequence {i}, {options:?}: {share}");
            worst = worst.max(share);
            let exact_lse = exact.lse.unwrap();
            for h in 0..4 {
                for t in 0..nq {
                    let (a, b) = (lse.data()[(q0 + t) * 4 + h], exact_lse.data()[h * nq + t]);
                    assert!(
                        (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                        "lse {i} {h} {t}: {a} {b}"
                    );
                }
            }
        }
    }
    println!("ragged batch on the CPU backend: worst {worst:.3} of the allowed error");
}

#[test]
fn ragged_offsets_that_do_not_fit_are_refused_by_name() {
    let engine = Engine::cpu();
    let mut rng = SplitMix64::new(22);
    let lengths = [3, 5];
    let (q, k, v) = (
        packed(&mut rng, &lengths, 2, DK),
        packed(&mut rng, &lengths, 2, DK),
        packed(&mut rng, &lengths, 2, DV),
    );
    let good = offsets(&lengths);
    let flat = HostTensor::new([8, 2 * DK], vec![0.0; 16 * DK]).unwrap();
    let cases: Vec<(&[i64], &[i64], &HostTensor, &str)> = vec![
        (&[1, 3, 8], &good, &q, "cu_seqlens_q"),
        (&[0, 5, 3, 8], &good, &q, "cu_seqlens_q"),
        (&[0, 3, 7], &good, &q, "cu_seqlens_q"),
        (&[0], &good, &q, "cu_seqlens_q"),
        (&good, &[0, 8], &q, "cu_seqlens_k"),
        (&good, &[0, 0, 8], &q, "cu_seqlens_k"),
        (&good, &good, &flat, "Q"),
    ];
    for (cu_q, cu_k, q, named) in cases {
        let inputs = webattn::RaggedInputs {
            q,
            k: &k,
            v: &v,
            cu_seqlens_q: cu_q,
            cu_seqlens_k: cu_k,
        };
        let err = engine
            .attention_ragged_blocking(&inputs, &AttentionOptions::default())
            .unwrap_err();
        assert!(err.to_string().contains(named), "{named}: {err}");
    }
    let inputs = webattn::RaggedInputs {
        q: &q,
        k: &k,
        v: &v,
        cu_seqlens_q: &good,
        cu_seqlens_k: &good,
    };
    let present = AttentionOptions {
        return_present: true,
        ..Default::default()
    };
    assert_eq!(
        engine
            .attention_ragged_blocking(&inputs, &present)
            .unwrap_err()
            .kind(),
        "Conflict"
    );
}
