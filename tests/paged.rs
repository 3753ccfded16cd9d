//! The paged KV cache on host pages and the CPU backend (the cases are
//! `tests/common/paged.rs`'s, which `tests/gpu/paged.rs` also runs on a GPU's
//! pages), and ragged batches without a cache.

#[path = "common/paged.rs"]
mod cases;

use cases::{layout, share_of_allowance, Where, DK, DV};
use webattn::paged::{PageStorage, PAGE_SIZES};
use webattn::rng::SplitMix64;
use webattn::{AttentionInputs, AttentionOptions, Engine, HostTensor, PagedKvCache};

fn host(run: impl Fn(&Where)) {
    let engine = Engine::cpu();
    for storage in [PageStorage::F32, PageStorage::F16, PageStorage::Int8] {
        run(&Where {
            engine: &engine,
            device: false,
            page_sizes: &PAGE_SIZES,
            storage,
        });
    }
}

#[test]
fn sequences_grow_fork_and_free_through_their_block_tables() {
    host(cases::sequences_grow_fork_and_free_through_their_block_tables);
}

#[test]
fn a_fork_shares_its_pages_until_one_writes_into_the_last() {
    host(cases::a_fork_shares_its_pages_until_one_writes_into_the_last);
}

#[test]
fn attention_through_the_pages_matches_the_oracle_on_the_tokens_held_contiguously() {
    host(cases::attention_through_the_pages_matches_the_oracle_on_the_tokens_held_contiguously);
}

#[test]
fn refused_calls_leave_every_sequence_as_it_was() {
    host(cases::refused_calls_leave_every_sequence_as_it_was);
}

#[test]
fn a_cpu_engine_keeps_its_pages_on_the_host() {
    let engine = Engine::cpu();
    let cache = PagedKvCache::on_engine(&engine, layout(16)).unwrap();
    assert!(!cache.on_device());
    let f32_bytes = |storage| {
        let mut cache = PagedKvCache::new(layout(16))
            .unwrap()
            .with_storage(storage)
            .unwrap();
        let seq = cache.add_sequence();
        let k = HostTensor::new([2, 3, DK], vec![0.1; 2 * 3 * DK]).unwrap();
        let v = HostTensor::new([2, 3, DV], vec![0.1; 2 * 3 * DV]).unwrap();
        cache.append(seq, &k, &v).unwrap();
        // Storage is chosen before the first page.
        let err = cache.clone().with_storage(PageStorage::F32).unwrap_err();
        assert_eq!(err.kind(), "Conflict");
        cache.bytes()
    };
    assert_eq!(f32_bytes(PageStorage::F16) * 2, f32_bytes(PageStorage::F32));
    // int8: a byte a value and a 4-byte scale a row (keys of 8, values of 4).
    let rows = f32_bytes(PageStorage::F32) / 4 / (DK + DV) as u64;
    assert_eq!(f32_bytes(PageStorage::Int8), rows * (DK + DV + 8) as u64);
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

#[test]
fn the_cpu_backend_reads_host_pages_in_place_and_the_oracle_path_reads_them_back() {
    let engine = Engine::cpu();
    let mut rng = SplitMix64::new(5);
    for storage in [PageStorage::F32, PageStorage::F16, PageStorage::Int8] {
        let mut cache = PagedKvCache::new(layout(16))
            .unwrap()
            .with_storage(storage)
            .unwrap();
        let seq = cache.add_sequence();
        let k = HostTensor::new([2, 41, DK], rng.normal_vec(2 * 41 * DK, 1.0)).unwrap();
        let v = HostTensor::new([2, 41, DV], rng.normal_vec(2 * 41 * DV, 1.0)).unwrap();
        cache.append(seq, &k, &v).unwrap();
        let q = HostTensor::new([1, 4, 3, DK], rng.normal_vec(4 * 3 * DK, 1.0)).unwrap();
        let options = AttentionOptions {
            is_causal: true,
            ..Default::default()
        };
        let fast = cache
            .attention_blocking(&engine, &[(seq, &q)], &options)
            .unwrap();
        // The call was planned, and the plan named the CPU backend.
        let plan = engine.last_call().unwrap().plan;
        assert_eq!(plan.path, webattn::KernelPath::Cpu, "{}", storage.name());
        let forced = AttentionOptions {
            path: webattn::KernelPath::Oracle,
            ..options.clone()
        };
        let oracle = cache
            .attention_blocking(&engine, &[(seq, &q)], &forced)
            .unwrap();
        assert_eq!(
            engine.last_call().unwrap().plan.path,
            webattn::KernelPath::Oracle
        );
        let worst = fast[0]
            .y
            .data()
            .iter()
            .zip(oracle[0].y.data())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{}: {worst}", storage.name());
    }
}

/// Normwise relative error of `got` against `want`.
fn relative(got: &[f32], want: &[f32]) -> f64 {
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max);
    let scale = want.iter().map(|x| f64::from(x.abs())).fold(0.0, f64::max);
    worst / scale
}

#[test]
fn int8_pages_hold_each_value_within_half_a_step_and_attend_close_to_f32() {
    let engine = Engine::cpu();
    let mut rng = SplitMix64::new(8);
    let n = 300;
    let (k, v) = (
        HostTensor::new([2, n, DK], rng.normal_vec(2 * n * DK, 1.0)).unwrap(),
        HostTensor::new([2, n, DV], rng.normal_vec(2 * n * DV, 1.0)).unwrap(),
    );
    let q = HostTensor::new([1, 4, 1, DK], rng.normal_vec(4 * DK, 1.0)).unwrap();
    let mut errors = Vec::new();
    for storage in [PageStorage::F16, PageStorage::Int8] {
        let mut cache = PagedKvCache::new(layout(64))
            .unwrap()
            .with_storage(storage)
            .unwrap();
        let seq = cache.add_sequence();
        cache.append(seq, &k, &v).unwrap();
        let (back_k, back_v) = cache.read_blocking(seq).unwrap();
        for (appended, back, dim) in [(&k, &back_k, DK), (&v, &back_v, DV)] {
            for (row, got) in appended
                .data()
                .chunks_exact(dim)
                .zip(back.data().chunks_exact(dim))
            {
                let step = row.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
                for (a, b) in row.iter().zip(got) {
                    let allowed = match storage {
                        PageStorage::Int8 => step * 0.5 * (1.0 + 1e-6),
                        _ => a.abs() * 2f32.powi(-11),
                    };
                    assert!((a - b).abs() <= allowed, "{a} read back as {b}");
                }
            }
        }
        // Attention against f32 K and V: the storage's own error.
        let paged = cache
            .attention_blocking(&engine, &[(seq, &q)], &AttentionOptions::default())
            .unwrap();
        let kk = HostTensor::new([1, 2, n, DK], k.data().to_vec()).unwrap();
        let vv = HostTensor::new([1, 2, n, DV], v.data().to_vec()).unwrap();
        let exact = webattn::cpu::attention(
            &AttentionInputs::new(&q, &kk, &vv),
            &AttentionOptions::default(),
        )
        .unwrap();
        errors.push((storage, relative(paged[0].y.data(), exact.y.data())));
    }
    println!("Y against f32 K and V (normwise): {errors:?}");
    let [(_, f16), (_, int8)] = [errors[0], errors[1]];
    assert!(f16 < 2e-3 && int8 < 2e-2, "{errors:?}");
}

#[test]
fn a_paged_call_is_planned_once_and_the_plan_names_its_route() {
    let engine = Engine::cpu();
    let mut cache = PagedKvCache::new(layout(16)).unwrap();
    let seq = cache.add_sequence();
    let k = HostTensor::new([2, 20, DK], vec![0.5; 2 * 20 * DK]).unwrap();
    let v = HostTensor::new([2, 20, DV], vec![0.5; 2 * 20 * DV]).unwrap();
    cache.append(seq, &k, &v).unwrap();
    let q = HostTensor::new([1, 4, 2, DK], vec![0.1; 4 * 2 * DK]).unwrap();
    let options = AttentionOptions::default();
    let plan = cache.plan(&engine, &[(seq, &q)], &options).unwrap();
    match &plan {
        webattn::PagedPlan::HostInPlace { calls } => {
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].path, webattn::KernelPath::Cpu);
        }
        other => panic!("{other}"),
    }
    assert!(
        plan.to_string()
            .contains("read in place by the CPU backend"),
        "{plan}"
    );
    let oracle = AttentionOptions {
        path: webattn::KernelPath::Oracle,
        ..Default::default()
    };
    let plan = cache.plan(&engine, &[(seq, &q)], &oracle).unwrap();
    assert!(
        matches!(&plan, webattn::PagedPlan::ReadBack { reason } if reason.contains("oracle")),
        "{plan}"
    );
    // A query the sequence cannot hold is refused by the plan, before anything runs.
    let long = HostTensor::new([1, 4, 21, DK], vec![0.1; 4 * 21 * DK]).unwrap();
    let err = cache.plan(&engine, &[(seq, &long)], &options).unwrap_err();
    assert_eq!(err.kind(), "ShapeMismatch");
}

#[test]
fn a_layer_step_over_host_pages_matches_each_sequence_alone() {
    let engine = Engine::cpu();
    cases::a_layer_step_over_pages_matches_each_sequence_alone(&Where {
        engine: &engine,
        device: false,
        page_sizes: &[16],
        storage: PageStorage::F32,
    });
}
