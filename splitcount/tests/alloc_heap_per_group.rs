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

#[global_allocator]
static ALLOC: HeapPerGroup<mimalloc::MiMalloc> = HeapPerGroup::new(mimalloc::MiMalloc);

extern "C" {
    fn mi_heap_of(p: *const std::ffi::c_void) -> *mut mi::mi_heap_t;
    fn mi_heap_main() -> *mut mi::mi_heap_t;
}

fn memory() -> &'static Hierarchy {
    static H: OnceLock<Hierarchy> = OnceLock::new();
    H.get_or_init(|| {
        let h = Hierarchy::default();
        ALLOC.attach(&h).unwrap();
        h
    })
}

/// The tests count heaps: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new group given a heap, with nothing charged.
fn fresh(name: &str) -> Group {
    let g = memory().root().child(name).unwrap();
    ALLOC.give_heap(&g).unwrap();
    g.scope(|| ());
    assert_eq!(settled(&g), 0);
    g
}

/// The group's usage with nothing pre-charged.
fn settled(g: &Group) -> u64 {
    drain_thread();
    memory().drain_stocks();
    g.usage()
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

fn total(blocks: &[(*mut u8, Layout)]) -> u64 {
    blocks.iter().map(|&(p, l)| footprint(p, l.align())).sum()
}

/// `n` blocks of 1 to 4096 bytes at alignments 1 to 4096 (a third of them
/// zeroed), allocated in `g`, with their layouts.
fn assorted(g: &Group, n: usize, seed: u64) -> Vec<(*mut u8, Layout)> {
    let mut blocks = Vec::with_capacity(n);
    let mut rng = Rng::new(seed);
    g.scope(|| {
        for i in 0..n {
            let size = 1 + rng.below(4096) as usize;
            let align = 1 << rng.below(13);
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: a non-zero size.
            let p = unsafe {
                if i % 3 == 0 {
                    alloc_zeroed(layout)
                } else {
                    alloc(layout)
                }
            };
            assert!(!p.is_null());
            if i % 3 == 0 {
                // SAFETY: `size` bytes, just allocated.
                assert!(unsafe { std::slice::from_raw_parts(p, size) }
                    .iter()
                    .all(|&b| b == 0));
            }
            blocks.push((p, layout));
        }
    });
    blocks
}

fn free_all(blocks: Vec<(*mut u8, Layout)>) {
    for (p, l) in blocks {
        // SAFETY: allocated with this layout, live.
        unsafe { dealloc(p, l) };
    }
}

/// The point of the design: a block of every size from 8 to 128 bytes
/// takes mimalloc's own class for its size — a multiple of 16 takes that
/// size, where an 8-byte header moves it up a class — and lies in a heap of
/// its own, not mimalloc's main heap.
#[test]
fn blocks_carry_no_tag_and_take_the_allocators_own_class() {
    let _s = serial();
    let g = fresh("untagged");
    let mut blocks = Vec::with_capacity(1030);
    g.scope(|| {
        for size in (1..=1024).chain([5000, 70_000]) {
            let layout = Layout::from_size_align(size, 8).unwrap();
            // SAFETY: a non-zero size.
            let p = unsafe { alloc(layout) };
            assert!(!in_main_heap(p), "{size} B: made with a header");
            // SAFETY: live.
            let usable = unsafe { mi::mi_usable_size(p.cast()) };
            // SAFETY: allocates nothing.
            assert_eq!(usable, unsafe { mi::mi_good_size(size) }, "{size} B");
            blocks.push((p, layout));
        }
    });
    assert_eq!(settled(&g), total(&blocks));
    free_all(blocks);
    assert_eq!(settled(&g), 0);
}

/// An over-aligned block in a heap asks mimalloc for its size rounded up
/// to the alignment, a class every block of which is aligned: a 100-byte
/// block at 4,096 takes one page (`mi_heap_malloc_aligned(100, 4096)` took
/// a 5 KiB block from a larger class), 64 bytes at 64 take 64.
#[test]
fn over_aligned_blocks_take_the_class_of_their_size_rounded_to_the_alignment() {
    let _s = serial();
    let g = fresh("aligned-heap");
    // Made outside the scope, large enough: not charged to the group.
    let mut blocks = Vec::with_capacity(400);
    g.scope(|| {
        for (size, align) in [(100, 4096), (64, 64), (16, 16), (200, 64)] {
            for _ in 0..100 {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size.
                let p = unsafe { alloc(layout) };
                assert!(!in_main_heap(p) && p as usize % align == 0);
                // SAFETY: live.
                let usable = unsafe { mi::mi_usable_size(p.cast()) };
                assert_eq!(usable, size.next_multiple_of(align), "{size} B at {align}");
                blocks.push((p, layout));
            }
        }
    });
    assert_eq!(settled(&g), total(&blocks));
    free_all(blocks);
    assert_eq!(settled(&g), 0);
}

#[test]
fn a_groups_usage_is_the_usable_size_of_its_blocks() {
    let _s = serial();
    let g = fresh("assorted");
    let blocks = assorted(&g, 2_000, 7);
    assert!(blocks.iter().all(|&(p, _)| !in_main_heap(p)));
    assert_eq!(settled(&g), total(&blocks));
    free_all(blocks);
    assert_eq!(settled(&g), 0);
}

/// Reallocs keep the block in its account's heap — from a thread in
/// another group, too — and move the usage by the change in usable size.
#[test]
fn reallocs_move_the_usage_by_the_change_in_usable_size() {
    let _s = serial();
    let g = fresh("reallocs");
    let other = fresh("reallocs-elsewhere");
    let mut blocks = assorted(&g, 600, 11);
    let mut rng = Rng::new(3);
    other.scope(|| {
        for (i, (p, l)) in blocks.iter_mut().enumerate() {
            let size = match i % 3 {
                0 => 1 + rng.below(8192) as usize,
                // Within the class, and across the table's edge.
                1 => l.size().div_ceil(2).max(1),
                _ => 1000 + rng.below(100) as usize,
            };
            let keep = l.size().min(size);
            // SAFETY: live; fill what must survive.
            unsafe { std::ptr::write_bytes(*p, (i % 251) as u8, keep) };
            // SAFETY: `p` is live with layout `l`; a non-zero size.
            let q = unsafe { realloc(*p, *l, size) };
            assert!(!q.is_null());
            // SAFETY: `keep` bytes survive the move.
            assert!(unsafe { std::slice::from_raw_parts(q, keep) }
                .iter()
                .all(|&b| b == (i % 251) as u8));
            assert!(!in_main_heap(q));
            // SAFETY: live.
            let usable = unsafe { mi::mi_usable_size(q.cast()) };
            assert!(usable >= size, "{size} B in a block of {usable}");
            // SAFETY: the block has `size` bytes.
            unsafe { std::ptr::write_bytes(q, 7, size) };
            *p = q;
            *l = Layout::from_size_align(size, l.align()).unwrap();
        }
    });
    assert_eq!(settled(&other), 0, "the blocks' account pays their growth");
    assert_eq!(settled(&g), total(&blocks));
    free_all(blocks);
    assert_eq!(settled(&g), 0);
}

#[test]
fn blocks_freed_on_another_thread_are_given_back_exactly() {
    let _s = serial();
    let g = fresh("cross-thread");
    let blocks = assorted(&g, 2_000, 13);
    assert_eq!(settled(&g), total(&blocks));
    free_on_another_thread(&blocks);
    assert_eq!(settled(&g), 0);
    assert_eq!(g.events().underflow, 0);
}

/// A removed group keeps its heap while its blocks live (their frees
/// uncharge it and its ancestors); once the last is freed its account
/// ends and the heap goes to the next group — a stream of short-lived
/// groups runs on the same few heaps.
#[test]
fn a_removed_groups_heap_goes_to_the_next_group() {
    let _s = serial();
    let parent = fresh("tenants");
    let first = parent.child("first").unwrap();
    ALLOC.give_heap(&first).unwrap();
    let blocks = assorted(&first, 300, 5);
    let owned = ALLOC.heaps().owned;
    first.remove().unwrap();
    drop(first);
    assert_eq!(settled(&parent), total(&blocks));
    assert_eq!(ALLOC.heaps().owned, owned, "held while its blocks live");
    free_all(blocks);
    assert_eq!(settled(&parent), 0);
    assert_eq!(
        ALLOC.heaps().owned,
        owned - 1,
        "given up with the last block"
    );

    let made = ALLOC.heaps().made;
    for i in 0..500 {
        let g = parent.child(&format!("request-{i}")).unwrap();
        ALLOC.give_heap(&g).unwrap();
        let blocks = assorted(&g, 20, i);
        assert_eq!(settled(&g), total(&blocks), "request {i}");
        free_all(blocks);
        g.remove().unwrap();
    }
    assert_eq!(settled(&parent), 0);
    assert!(
        ALLOC.heaps().made <= made + 1,
        "500 groups in turn made {} heaps",
        ALLOC.heaps().made - made
    );
}

/// A new group given a heap, with a refusing limit of `max` bytes.
fn refusing(name: &str, max: u64) -> Group {
    let g = fresh(name);
    g.set_max(max).unwrap();
    g.set_enforcement(splitcount::Enforcement::Refuse);
    g
}

/// Under a refusing limit allocations are refused (null) and usage still
/// counts every block handed out, exactly.
#[test]
fn a_refusing_limit_refuses_and_counts_every_block() {
    let _s = serial();
    let g = refusing("limited", 256 << 10);
    let layout = Layout::from_size_align(96, 8).unwrap();
    // Made outside the group: its growth would be refused too.
    let mut live = Vec::with_capacity(10_000);
    let refused = g.scope(|| {
        for _ in 0..10_000 {
            // SAFETY: a non-zero size.
            let p = unsafe { alloc(layout) };
            if p.is_null() {
                return true;
            }
            live.push((p, layout));
        }
        false
    });
    assert!(refused, "256 KiB holds fewer than 10,000 blocks of 96 B");
    assert!(live.len() * 96 <= 256 << 10);
    assert_eq!(settled(&g), total(&live));
    free_all(live);
    assert_eq!(settled(&g), 0);
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

/// Groups made and removed on four threads at once, each allocating in
/// its own group and handing half of its blocks to the next thread to
/// free: heaps pass from ended accounts to new ones while other threads
/// free blocks of other heaps. Afterwards nothing stays charged, and no
/// group was charged a block of another's (every group's usage is exactly
/// zero once its blocks are freed).
#[test]
fn heaps_pass_between_groups_while_threads_free_each_others_blocks() {
    let _s = serial();
    let parent = fresh("churn");
    const THREADS: usize = 4;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| std::sync::mpsc::channel::<Vec<(usize, Layout)>>())
        .unzip();
    std::thread::scope(|s| {
        for (t, rx) in receivers.into_iter().enumerate() {
            let next = senders[(t + 1) % THREADS].clone();
            let parent = &parent;
            s.spawn(move || {
                let mut rng = Rng::new(t as u64 + 1);
                for round in 0..300 {
                    let g = parent.child(&format!("t{t}-{round}")).unwrap();
                    // All taken when the threads run far apart: headers.
                    let _ = ALLOC.give_heap(&g);
                    let mut mine = Vec::with_capacity(64);
                    g.scope(|| {
                        for _ in 0..64 {
                            let size = 1 + rng.below(700) as usize;
                            let layout = Layout::from_size_align(size, 8).unwrap();
                            // SAFETY: a non-zero size.
                            let p = unsafe { alloc(layout) };
                            assert!(!p.is_null());
                            mine.push((p as usize, layout));
                        }
                    });
                    let theirs = mine.split_off(32);
                    next.send(theirs).unwrap();
                    for (p, l) in mine {
                        // SAFETY: live, with this layout.
                        unsafe { dealloc(p as *mut u8, l) };
                    }
                    while let Ok(blocks) = rx.try_recv() {
                        for (p, l) in blocks {
                            // SAFETY: handed over whole by their maker.
                            unsafe { dealloc(p as *mut u8, l) };
                        }
                    }
                    g.remove().unwrap();
                }
                drop(next);
                for blocks in rx {
                    for (p, l) in blocks {
                        // SAFETY: as above.
                        unsafe { dealloc(p as *mut u8, l) };
                    }
                }
                drain_thread();
            });
        }
        drop(senders);
    });
    // The threads' exit guards may run after `scope` returns: each drained
    // its reserve above.
    assert_eq!(settled(&parent), 0);
    assert_eq!(parent.events().underflow, 0);
    // 1,200 groups, at most `MAX_HEAPS`: those whose blocks were all freed
    // passed theirs on (how many were alive at once depends on how far the
    // threads ran apart; past the last, the rest had headers).
    assert!(ALLOC.heaps().made <= splitcount::alloc::MAX_HEAPS);
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
