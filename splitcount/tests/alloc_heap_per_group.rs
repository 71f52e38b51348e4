//! `HeapPerGroup<mimalloc::MiMalloc>` (feature `mimalloc`): no block
//! carries a tag — each account's blocks lie in a mimalloc heap of their
//! own — and a group's usage is still the exact sum of its live blocks'
//! usable sizes, through reallocs, frees on other threads, removals and
//! the reuse of heaps.

#![cfg(all(feature = "mimalloc", not(loom)))]
#![allow(unsafe_code)]

use libmimalloc_sys as mi;
use splitcount::alloc::{drain_thread, HeapPerGroup};
use splitcount::group::{Group, Hierarchy};
use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
use std::sync::{Mutex, MutexGuard, OnceLock};

mod common;
use common::{free_on_another_thread, Rng};
#[macro_use]
mod heap_per_group_tests;

#[global_allocator]
static ALLOC: HeapPerGroup<mimalloc::MiMalloc> = HeapPerGroup::new(mimalloc::MiMalloc);

extern "C" {
    fn mi_heap_of(p: *const std::ffi::c_void) -> *mut mi::mi_heap_t;
    fn mi_heap_main() -> *mut mi::mi_heap_t;
}

/// Whether the block at `p` lies in mimalloc's main heap: made with a
/// header (an account that found no heap), not in a heap of its own.
fn in_main_heap(p: *mut u8) -> bool {
    // SAFETY: any pointer.
    unsafe { mi_heap_of(p.cast()) == mi_heap_main() }
}

/// The footprint of the block at `p` of alignment `align`: mimalloc's
/// usable size of the block itself — or, for a block with a header, of the
/// allocation that starts a header before it.
fn footprint(p: *mut u8, align: usize) -> u64 {
    // SAFETY: `p` is live, from the allocator.
    unsafe {
        // A header block starts 8 bytes before `p`, or at `p` for an
        // alignment above 8 (its tag trails).
        let start = if in_main_heap(p) && align <= 8 {
            p.sub(8)
        } else {
            p
        };
        mi::mi_usable_size(start.cast()) as u64
    }
}

/// mimalloc's usable size of the live block at `p`.
///
/// # Safety
/// `p` is a live block of mimalloc's.
unsafe fn usable(p: *mut u8) -> usize {
    // SAFETY: forwarded contract.
    unsafe { mi::mi_usable_size(p.cast()) }
}

/// mimalloc's class for a block of `layout` from a heap: `mi_good_size` of
/// its size, or, over-aligned, its size rounded up to the alignment (a
/// class every block of which is aligned: `mi_heap_malloc_aligned(100,
/// 4096)` took a 5 KiB block from a larger class).
fn class(layout: Layout) -> usize {
    if layout.align() <= 8 {
        // SAFETY: allocates nothing.
        unsafe { mi::mi_good_size(layout.size()) }
    } else {
        layout.size().next_multiple_of(layout.align())
    }
}

heap_per_group_tests!();

/// A new group given a heap, with a refusing limit of `max` bytes.
fn refusing(name: &str, max: u64) -> Group {
    let g = fresh(name);
    g.set_max(max).unwrap();
    g.set_enforcement(splitcount::Enforcement::Refuse);
    g
}

/// After a refusal, the reporting grace lets 1 MiB of small blocks through
/// charged past the limit — made in the group's heap like any charged
/// block — and then refuses again; a second refusal begins no new grace
/// past that headroom. The group is charged exactly every block it holds.
#[test]
fn the_reporting_grace_lets_a_mebibyte_through_charged_past_the_limit() {
    const GRACE_BLOCKS: usize = (splitcount::alloc::REPORTING_GRACE / 64) as usize;
    let _s = serial();
    let g = refusing("grace", 64 << 10);
    let layout = Layout::from_size_align(64, 8).unwrap();
    // Made outside the group: its growth would be refused too.
    let mut charged = Vec::with_capacity(2_000);
    let mut in_grace = Vec::with_capacity(2 * GRACE_BLOCKS);
    let mut after = 0;
    g.scope(|| {
        // SAFETY (every `alloc`): a non-zero size.
        while charged.len() < 2_000 {
            let p = unsafe { alloc(layout) };
            if p.is_null() {
                break; // the refusal: the grace begins
            }
            charged.push((p, layout));
        }
        while in_grace.len() < 2 * GRACE_BLOCKS {
            let p = unsafe { alloc(layout) };
            if p.is_null() {
                break; // the grace is spent
            }
            in_grace.push((p, layout));
        }
        // Refused again, and again: no grace beyond the headroom.
        for _ in 0..100 {
            let p = unsafe { alloc(layout) };
            if !p.is_null() {
                after += 1;
                in_grace.push((p, layout));
            }
        }
    });
    assert!(
        charged.len() < 2_000,
        "64 KiB holds fewer than 2,000 blocks of 64 B"
    );
    assert!(
        in_grace.len() > GRACE_BLOCKS * 9 / 10 && in_grace.len() <= GRACE_BLOCKS,
        "{} blocks passed in the grace, about {GRACE_BLOCKS} expected",
        in_grace.len()
    );
    assert_eq!(after, 0, "a refusal past the headroom begins no new grace");
    assert!(
        in_grace.iter().all(|&(p, _)| !in_main_heap(p)),
        "charged blocks, in the group's heap"
    );
    assert_eq!(
        settled(&g),
        total(&charged) + total(&in_grace),
        "the grace's blocks charged"
    );
    assert!(settled(&g) <= (64 << 10) + splitcount::alloc::REPORTING_GRACE);
    free_all(in_grace);
    assert_eq!(settled(&g), total(&charged));
    free_all(charged);
    assert_eq!(settled(&g), 0);
}

/// Threads that allocate in a group and exit while their blocks live on:
/// mimalloc's per-thread part of each heap goes with the thread, and the
/// blocks, freed later by another thread, still find their account. A
/// thread-local freed at the thread's exit is uncharged too.
#[test]
fn blocks_outlive_the_threads_that_made_them() {
    thread_local! {
        static KEPT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let _s = serial();
    let g = fresh("short-lived-threads");
    let mut blocks: Vec<(usize, Layout)> = Vec::with_capacity(200 * 16);
    for t in 0..200u64 {
        let g = g.clone();
        let made = std::thread::spawn(move || {
            let mut rng = Rng::new(t + 1);
            let mut mine = Vec::with_capacity(16);
            g.scope(|| {
                KEPT.with(|k| k.borrow_mut().resize(100 + t as usize, 1));
                for _ in 0..16 {
                    let layout = Layout::from_size_align(1 + rng.below(3000) as usize, 8).unwrap();
                    // SAFETY: a non-zero size.
                    let p = unsafe { alloc(layout) };
                    assert!(!p.is_null());
                    mine.push((p as usize, layout));
                }
            });
            mine
        })
        .join()
        .unwrap();
        blocks.extend(made);
    }
    let live: Vec<(*mut u8, Layout)> = blocks.iter().map(|&(p, l)| (p as *mut u8, l)).collect();
    assert_eq!(settled(&g), total(&live));
    free_all(live);
    assert_eq!(settled(&g), 0);
    assert_eq!(g.events().underflow, 0);
}

/// mimalloc rounds a large block by more than `mi_good_size` says (to
/// 64 KiB where `mi_good_size` rounds to 4 KiB): the rest of its footprint
/// is charged within the limit too — a block whose footprint would pass a
/// refusing limit is refused, not forced past it. So is a realloc's.
#[test]
fn a_large_blocks_rounding_does_not_pass_a_refusing_limit() {
    let _s = serial();
    let size = (33 << 20) + 1;
    // SAFETY: a live block of mimalloc's, freed at once.
    let usable = unsafe {
        let p = mi::mi_malloc(size);
        let u = mi::mi_usable_size(p);
        mi::mi_free(p);
        u
    };
    // SAFETY: allocates nothing.
    let good = unsafe { mi::mi_good_size(size) };
    assert!(
        usable > good,
        "mimalloc rounds {size} B to {usable}, as it says: {good}"
    );
    let g = refusing("large-rounding", ((good + usable) / 2) as u64);
    let layout = Layout::from_size_align(size, 8).unwrap();
    // SAFETY: a non-zero size.
    let p = g.scope(|| unsafe { alloc(layout) });
    assert!(
        p.is_null(),
        "a block of {usable} B under a limit of {} B",
        g.max()
    );
    assert_eq!(settled(&g), 0);
    // A realloc to that size: refused the same way, the block kept.
    let small = Layout::from_size_align(100, 8).unwrap();
    // SAFETY: a non-zero size; the block is freed below.
    unsafe {
        let q = g.scope(|| alloc(small));
        assert!(!q.is_null());
        assert!(realloc(q, small, size).is_null());
        assert_eq!(settled(&g), footprint(q, 8));
        dealloc(q, small);
    }
    assert_eq!(settled(&g), 0);
}

/// Heaps are given, not taken: a group's blocks carry headers (in
/// mimalloc's main heap) until it is given a heap, and those made before
/// stay where they are; both kinds are freed exactly. A removed group is
/// given none.
#[test]
fn only_groups_given_a_heap_have_blocks_without_tags() {
    let _s = serial();
    let g = memory().root().child("given-later").unwrap();
    let layout = Layout::from_size_align(48, 8).unwrap();
    let mut blocks = Vec::with_capacity(200);
    g.scope(|| {
        for _ in 0..100 {
            // SAFETY: a non-zero size.
            let p = unsafe { alloc(layout) };
            assert!(in_main_heap(p), "a group given no heap has header blocks");
            blocks.push((p, layout));
        }
    });
    ALLOC.give_heap(&g).unwrap();
    ALLOC.give_heap(&g).unwrap();
    g.scope(|| {
        for _ in 0..100 {
            // SAFETY: a non-zero size.
            let p = unsafe { alloc(layout) };
            assert!(!in_main_heap(p));
            // SAFETY: live.
            assert_eq!(unsafe { mi::mi_usable_size(p.cast()) }, 48);
            blocks.push((p, layout));
        }
    });
    assert_eq!(settled(&g), total(&blocks));
    assert_eq!(
        total(&blocks),
        100 * 64 + 100 * 48,
        "48 B + 8 of header: 64"
    );
    free_all(blocks);
    assert_eq!(settled(&g), 0);
    let removed = memory().root().child("removed").unwrap();
    removed.remove().unwrap();
    assert_eq!(
        ALLOC.give_heap(&removed),
        Err(splitcount::alloc::HeapError::Removed)
    );
}
