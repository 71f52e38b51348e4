//! `Accounted::reconcile` on a controlled workload, alone in its process
//! (the figures are process-wide: no other test may allocate meanwhile).

#![cfg(not(loom))]

#[macro_use]
mod common;

use splitcount::alloc::{drain_thread, MAX_THREAD_RESERVE};

accounted_heap!();

/// The reconciliation adds up on a controlled workload: 20,000 blocks of
/// 100 bytes held in a group raise the requested range by 2,000,000 bytes
/// (exactly, within the reserves' bound), the headers by 8 bytes a block,
/// and what glibc has in use by at least both.
#[test]
fn the_reconciliation_adds_up_on_a_controlled_workload() {
    const BLOCKS: usize = 20_000;
    let g = memory().root().child("reconciled").unwrap();
    g.scope(|| ()); // its allocator account, made once
    drain_thread();
    let before = ALLOC.reconcile().unwrap();
    let held: Vec<Vec<u8>> = g.scope(|| (0..BLOCKS).map(|_| vec![7u8; 100]).collect());
    drain_thread();
    let after = ALLOC.reconcile().unwrap();
    let requested = (BLOCKS * 100 + BLOCKS * std::mem::size_of::<Vec<u8>>()) as u64;
    let reserves = after.reserve_holders.max(before.reserve_holders) * MAX_THREAD_RESERVE;
    let grew_lo = after.requested_at_least as i64 - before.requested_at_most as i64;
    let grew_hi = after.requested_at_most as i64 - before.requested_at_least as i64;
    assert!(
        grew_lo <= requested as i64 && requested as i64 <= grew_hi,
        "requested grew by {grew_lo}…{grew_hi}, the workload holds {requested}"
    );
    assert!(grew_hi - grew_lo <= 2 * reserves as i64);
    let headers = after.headers as i64 - before.headers as i64;
    assert!(
        (headers - 8 * (BLOCKS as i64 + 1)).abs() <= 8 * 64,
        "headers grew by {headers}"
    );
    let malloc = after.malloc_in_use.unwrap() as i64 - before.malloc_in_use.unwrap() as i64;
    assert!(
        malloc >= requested as i64 + headers,
        "glibc grew by {malloc}: at least the bytes and their headers"
    );
    assert!(after.resident.unwrap() > 0);
    println!("{after}");
    drop(held);
}
