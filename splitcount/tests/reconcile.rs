//! `Accounted::reconcile` on controlled workloads, and the trim, alone in
//! their process (the figures are process-wide: the tests take turns).

#![cfg(not(loom))]

#[macro_use]
mod common;

use splitcount::alloc::{drain_thread, ResidentPart, TrimPolicy, MAX_THREAD_RESERVE};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

accounted_heap!();

/// One test at a time: each measures the whole process.
fn alone() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The reconciliation adds up on a controlled workload: 20,000 blocks of
/// 100 bytes held in a group raise the requested range by 2,000,000 bytes
/// (exactly, within the reserves' bound), the headers by 8 bytes a block,
/// and what glibc has in use by at least both.
#[test]
fn the_reconciliation_adds_up_on_a_controlled_workload() {
    const BLOCKS: usize = 20_000;
    let _alone = alone();
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

/// Every part of the resident set has a figure of its own, the stacks,
/// code and tracked bytes are not empty, and the remainder is the resident
/// set less the parts, exactly.
#[test]
fn every_part_is_measured_and_the_remainder_is_what_they_leave() {
    let _alone = alone();
    memory();
    let r = ALLOC.reconcile().unwrap();
    println!("{r}");
    for part in ResidentPart::ALL {
        assert!(r.part(part).is_some(), "{} is measured", part.name());
    }
    assert!(
        r.tracked > 0 && r.stacks.unwrap() > 0 && r.files.unwrap() > 0,
        "{r}"
    );
    assert!(r.malloc_mappings.unwrap() > 0 && r.malloc_chunk_overhead.unwrap() > 0);
    let sum: i64 = ResidentPart::ALL
        .iter()
        .map(|&p| {
            let v = r.part(p).unwrap() as i64;
            if p == ResidentPart::Untouched {
                -v
            } else {
                v
            }
        })
        .sum();
    assert_eq!(r.explained(), Some(sum));
    assert_eq!(r.unexplained, Some(r.resident_mapped.unwrap() as i64 - sum));
}

/// A thread's stack is counted as a stack (its guard page below it tells
/// it from other anonymous mappings), not as anything else.
#[test]
fn a_threads_stack_counts_as_stacks() {
    const DEPTH: usize = 768 << 10;
    let _alone = alone();
    memory();
    let before = ALLOC.reconcile().unwrap();
    let (touched, done) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    let during = std::thread::scope(|s| {
        s.spawn(|| {
            let deep = [7u8; DEPTH];
            std::hint::black_box(&deep);
            touched.wait();
            done.wait();
        });
        touched.wait();
        let during = ALLOC.reconcile().unwrap();
        done.wait();
        during
    });
    let grew = |f: fn(&splitcount::alloc::Reconciliation) -> Option<u64>| {
        f(&during).unwrap() as i64 - f(&before).unwrap() as i64
    };
    let stacks = grew(|r| r.stacks);
    let other = grew(|r| r.other_mappings);
    println!("stacks grew by {stacks}, other mappings by {other}");
    // glibc may reuse a cached stack that an earlier thread had touched:
    // then it was resident, and counted as a stack, before.
    assert!(during.stacks.unwrap() >= DEPTH as u64, "{during}");
    assert!(other < (DEPTH / 4) as i64, "other mappings grew by {other}");
}

/// A block glibc maps on its own is tracked, is among glibc's mappings,
/// and is not counted again as another mapping. 80 MiB: above any mmap
/// threshold glibc sets itself (32 MiB at most), and larger than a thread
/// arena's heap (64 MiB), so that no free chunk can serve it.
#[test]
fn a_block_glibc_maps_on_its_own_counts_once() {
    const BYTES: usize = 80 << 20;
    let _alone = alone();
    let g = memory().root().child("mapped").unwrap();
    drain_thread();
    let before = ALLOC.reconcile().unwrap();
    let block = g.scope(|| vec![3u8; BYTES]);
    drain_thread();
    let during = ALLOC.reconcile().unwrap();
    let tracked = during.tracked as i64 - before.tracked as i64;
    let malloc = during.malloc_mappings.unwrap() as i64 - before.malloc_mappings.unwrap() as i64;
    let other = during.other_mappings.unwrap() as i64 - before.other_mappings.unwrap() as i64;
    println!("{during}");
    assert!(
        (tracked - BYTES as i64).abs() <= MAX_THREAD_RESERVE as i64,
        "tracked grew by {tracked}"
    );
    assert!(malloc >= BYTES as i64, "glibc's mappings grew by {malloc}");
    assert!(other.abs() < (1 << 20), "other mappings grew by {other}");
    drop(block);
    g.remove().unwrap();
}

/// A zeroed block glibc maps on its own is tracked before it is touched:
/// its untouched pages are measured and subtracted, so the remainder does
/// not move; writing it makes them resident.
#[test]
fn untouched_pages_of_a_mapped_block_are_subtracted() {
    const BYTES: usize = 80 << 20; // mapped: see the test above
    let _alone = alone();
    let g = memory().root().child("zeroed").unwrap();
    drain_thread();
    let before = ALLOC.reconcile().unwrap();
    let mut block = g.scope(|| vec![0u8; BYTES]); // calloc: mapped, nothing written
    drain_thread();
    let fresh = ALLOC.reconcile().unwrap();
    block.iter_mut().step_by(4096).for_each(|b| *b = 1);
    let written = ALLOC.reconcile().unwrap();
    let grew = |a: &splitcount::alloc::Reconciliation,
                f: fn(&splitcount::alloc::Reconciliation) -> Option<u64>| {
        f(a).unwrap() as i64 - f(&before).unwrap() as i64
    };
    let untouched = grew(&fresh, |r| r.untouched);
    println!(
        "untouched grew by {untouched}; remainder {:?} → {:?} → {:?}",
        before.unexplained, fresh.unexplained, written.unexplained
    );
    assert!(
        untouched >= BYTES as i64 - (64 << 10),
        "untouched grew by {untouched}"
    );
    assert!(grew(&written, |r| r.untouched).abs() < (64 << 10));
    for r in [&fresh, &written] {
        let drift = r.unexplained.unwrap() - before.unexplained.unwrap();
        assert!(drift.abs() < (1 << 20), "the remainder moved by {drift}");
    }
    drop(block);
    g.remove().unwrap();
}

/// Memory freed below a live block stays with glibc: tracked drops, the
/// resident free bytes grow by about as much, and the remainder does not.
#[test]
fn freed_memory_glibc_keeps_is_free_and_resident() {
    const BLOCKS: usize = 20_000;
    let _alone = alone();
    let g = memory().root().child("freed").unwrap();
    drain_thread();
    let held: Vec<Vec<u8>> = g.scope(|| (0..BLOCKS).map(|_| vec![5u8; 1000]).collect());
    let pin = g.scope(|| vec![1u8; 1000]); // above them: glibc cannot shrink its heap
    drain_thread();
    let before = ALLOC.reconcile().unwrap();
    drop(held);
    drain_thread();
    let after = ALLOC.reconcile().unwrap();
    println!("{before}\n--\n{after}");
    let freed = before.tracked as i64 - after.tracked as i64;
    let free =
        after.malloc_free_resident.unwrap() as i64 - before.malloc_free_resident.unwrap() as i64;
    assert!(
        freed >= (BLOCKS * 1000) as i64,
        "tracked dropped by {freed}"
    );
    assert!(
        free >= freed * 9 / 10,
        "glibc's resident free bytes grew by {free}, {freed} were freed"
    );
    drop(pin);
    g.remove().unwrap();
}

/// The trims done so far, once they reach `at_least` (the policy's trims
/// run on a background thread) or 5 s have passed.
fn trims_reaching(at_least: u64) -> u64 {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let trims = ALLOC.reconcile().unwrap().trims;
        if trims >= at_least || std::time::Instant::now() > until {
            return trims;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A server removing thousands of groups a second trims once per
/// interval, not once per removal.
#[test]
fn the_trim_policy_trims_once_per_interval() {
    let _alone = alone();
    let root = memory().root();
    let before = ALLOC.reconcile().unwrap().trims;
    ALLOC.set_trim(TrimPolicy::on_remove().min_interval(Duration::from_secs(3600)));
    for i in 0..1000 {
        root.child(&format!("req-{i}")).unwrap().remove().unwrap();
    }
    assert_eq!(
        trims_reaching(before + 1),
        before + 1,
        "the first removal's"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        ALLOC.reconcile().unwrap().trims,
        before + 1,
        "one per interval"
    );
    ALLOC.set_trim(TrimPolicy::OFF);
}

/// With `min_free`, a removal trims only once enough was freed since the
/// last trim.
#[test]
fn the_trim_policy_waits_for_enough_freed_memory() {
    let _alone = alone();
    let root = memory().root();
    ALLOC.trim();
    ALLOC.set_trim(
        TrimPolicy::on_remove()
            .min_interval(Duration::from_millis(1))
            .min_free(64 << 20),
    );
    let start = ALLOC.reconcile().unwrap().trims;
    root.child("quiet").unwrap().remove().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ALLOC.reconcile().unwrap().trims, start, "nothing freed yet");
    let g = root.child("busy").unwrap();
    let pin;
    {
        let blocks: Vec<Vec<u8>> = g.scope(|| (0..100_000).map(|_| vec![1u8; 1000]).collect());
        pin = g.scope(|| vec![1u8; 1000]);
        drop(blocks);
    }
    g.remove().unwrap();
    assert_eq!(
        trims_reaching(start + 1),
        start + 1,
        "100 MB freed: trimmed"
    );
    ALLOC.set_trim(TrimPolicy::OFF);
    drop(pin);
}
