//! The paged KV cache on a GPU's pages: the cases of `tests/common/paged.rs`
//! with the pages in device memory and attention through the paged decode
//! kernel (`kernels/decode/paged.rs`), at page sizes 16, 64 and 256.

#[path = "../common/paged.rs"]
mod cases;

use cases::Where;
use webattn::PageStorage;

fn device(run: impl FnOnce(&Where)) {
    device_storing(PageStorage::F32, run);
}

fn device_storing(storage: PageStorage, run: impl FnOnce(&Where)) {
    let Some(engine) = crate::common::gpu() else {
        return;
    };
    run(&Where {
        engine,
        device: true,
        page_sizes: &[16, 64, 256],
        storage,
    });
}

#[test]
fn sequences_grow_fork_and_free_in_device_pages() {
    device(cases::sequences_grow_fork_and_free_through_their_block_tables);
}

#[test]
fn a_fork_shares_its_device_pages_until_one_writes_into_the_last() {
    device(cases::a_fork_shares_its_pages_until_one_writes_into_the_last);
}

#[test]
fn the_paged_decode_kernel_matches_the_oracle_on_the_tokens_held_contiguously() {
    device(cases::attention_through_the_pages_matches_the_oracle_on_the_tokens_held_contiguously);
}

#[test]
fn refused_calls_leave_every_device_sequence_as_it_was() {
    device(cases::refused_calls_leave_every_sequence_as_it_was);
}

#[test]
fn f16_device_pages_read_in_place_match_the_oracle_on_their_values() {
    device_storing(PageStorage::F16, |at| {
        cases::a_fork_shares_its_pages_until_one_writes_into_the_last(at);
        cases::attention_through_the_pages_matches_the_oracle_on_the_tokens_held_contiguously(at);
    });
}

#[test]
fn int8_device_pages_read_in_place_match_the_oracle_on_their_values() {
    device_storing(PageStorage::Int8, |at| {
        cases::a_fork_shares_its_pages_until_one_writes_into_the_last(at);
        cases::attention_through_the_pages_matches_the_oracle_on_the_tokens_held_contiguously(at);
    });
}

#[test]
fn a_call_on_device_pages_is_planned_as_batches_of_blocks() {
    let Some(engine) = crate::common::gpu() else {
        return;
    };
    let mut cache = webattn::PagedKvCache::on_engine(engine, cases::layout(16))
        .unwrap()
        .with_storage(PageStorage::Int8)
        .unwrap();
    let (a, b) = (cache.add_sequence(), cache.add_sequence());
    let rows = |n: usize, d: usize| {
        webattn::HostTensor::new([cases::KV_HEADS, n, d], vec![0.25; cases::KV_HEADS * n * d])
            .unwrap()
    };
    cache
        .append(a, &rows(40, cases::DK), &rows(40, cases::DV))
        .unwrap();
    cache
        .append(b, &rows(70, cases::DK), &rows(70, cases::DV))
        .unwrap();
    let q = |n: usize| {
        webattn::HostTensor::new([1, 4, n, cases::DK], vec![0.1; 4 * n * cases::DK]).unwrap()
    };
    let (qa, qb) = (q(1), q(33));
    let call = [(a, &qa), (b, &qb)];
    let options = webattn::AttentionOptions::default();
    let plan = cache.plan(engine, &call, &options).unwrap();
    let webattn::PagedPlan::DeviceKernel { element, batches } = &plan else {
        panic!("{plan}");
    };
    assert_eq!(element.name(), "int8");
    assert_eq!(batches.len(), 2, "{plan}");
    assert_eq!(batches[0].members, [0]);
    assert_eq!(batches[1].members, [1]);
    // 33 rows of int8 pages: decode blocks of 16, 16 and 1; keys padded to
    // whole pages.
    let webattn::plan::paged::PagedKernel::DecodeBlocks(blocks) = &batches[1].kernel else {
        panic!("{plan}");
    };
    let blocks: Vec<(usize, usize)> = blocks.iter().map(|b| (b.first, b.rows)).collect();
    assert_eq!(blocks, [(0, 16), (16, 16), (32, 1)]);
    assert_eq!(batches[1].dims.kv_len, 80);
    println!("{plan}");
    // The same prefill on f32 pages: the fused kernel, every row at once.
    let mut f32_cache = webattn::PagedKvCache::on_engine(engine, cases::layout(16)).unwrap();
    let c = f32_cache.add_sequence();
    f32_cache
        .append(c, &rows(70, cases::DK), &rows(70, cases::DV))
        .unwrap();
    let plan = f32_cache.plan(engine, &[(c, &qb)], &options).unwrap();
    println!("{plan}");
    assert!(
        matches!(&plan, webattn::PagedPlan::DeviceKernel { batches, .. }
            if matches!(batches[0].kernel, webattn::plan::paged::PagedKernel::Fused(_))),
        "{plan}"
    );
    // Scores asked: the kernel does not keep them, the plan says so.
    let scores = webattn::AttentionOptions {
        qk_matmul_output_mode: Some(webattn::QkMatmulOutputMode::Scaled),
        ..Default::default()
    };
    let plan = cache.plan(engine, &call, &scores).unwrap();
    assert!(
        matches!(&plan, webattn::PagedPlan::ReadBack { reason } if reason.contains("scores")),
        "{plan}"
    );
    // And the call runs what the plan names: both sequences answer.
    let out = cache.attention_blocking(engine, &call, &options).unwrap();
    assert_eq!(out[1].y.shape(), &[1, 4, 33, cases::DV]);
}

#[test]
fn a_layer_step_over_device_pages_matches_each_sequence_alone() {
    let Some(engine) = crate::common::gpu() else {
        return;
    };
    cases::a_layer_step_over_pages_matches_each_sequence_alone(&Where {
        engine,
        device: true,
        page_sizes: &[16],
        storage: PageStorage::F32,
    });
}
