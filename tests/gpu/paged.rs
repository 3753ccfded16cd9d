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
