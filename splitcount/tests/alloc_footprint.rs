//! `Accounted<System, Footprint>` on glibc: a group's usage is the sum of
//! its live blocks' footprints — `malloc_usable_size` of each block's chunk
//! plus its 8-byte size field — exactly, once the stocks and reserves are
//! drained; frees, reallocs and frees on other threads give back exactly
//! what was charged.
//!
//! The expected figures are computed here from glibc, with the layout the
//! docs give: the chunk starts an 8-byte header before the user pointer, or
//! at the user pointer for an alignment above 8 (whose tag trails).

#![cfg(all(not(loom), target_os = "linux", target_env = "gnu"))]
#![allow(unsafe_code)]

use splitcount::alloc::{drain_thread, take_last_refusal, Accounted, Footprint};
use splitcount::charge::Enforcement;
use splitcount::group::{Group, Hierarchy};
use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout, System};

#[global_allocator]
static ALLOC: Accounted<System, Footprint> = Accounted::with_charging(System, Footprint);

fn memory() -> &'static Hierarchy {
    static H: std::sync::OnceLock<Hierarchy> = std::sync::OnceLock::new();
    H.get_or_init(|| {
        let h = Hierarchy::default();
        ALLOC.attach(&h).unwrap();
        h
    })
}

/// A new group with its allocator account made and nothing charged.
fn fresh(name: &str) -> Group {
    let g = memory().root().child(name).unwrap();
    g.scope(|| ());
    assert_eq!(settled(&g), 0);
    g
}

/// The group's usage with nothing pre-charged: both stocks and this
/// thread's reserve returned.
fn settled(g: &Group) -> u64 {
    memory().drain_stocks();
    g.usage()
}

/// The footprint of the block at `user`, allocated at `align`, as the docs
/// define it: `malloc_usable_size(chunk) + 8`.
fn footprint(user: *mut u8, align: usize) -> u64 {
    // SAFETY: `user` is live, from the wrapper: its chunk starts a header
    // (8 bytes) before it, or at it for an alignment above 8 (whose tag
    // trails).
    let usable = unsafe { libc::malloc_usable_size(user.sub(front(align)).cast()) };
    (usable + 8) as u64
}

/// The bytes of a block in front of the user pointer: the 8-byte header
/// up to alignment 8; none above (the tag trails the caller's bytes).
fn front(align: usize) -> usize {
    if align <= 8 {
        8
    } else {
        0
    }
}

/// A small deterministic generator (xorshift64*).
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Alignments from 1 to a page, the small ones below the size.
const ALIGNS: [usize; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 512, 4096];

/// `n` blocks of 1..=4096 bytes at assorted alignments, half of them
/// zeroed (calloc), allocated in `g`; their layouts kept in a vector
/// charged elsewhere.
fn assorted(g: &Group, n: usize, seed: u64) -> Vec<(*mut u8, Layout)> {
    let mut blocks = Vec::with_capacity(n);
    let mut seed = seed;
    g.scope(|| {
        for i in 0..n {
            let size = 1 + (next(&mut seed) % 4096) as usize;
            let align = ALIGNS[(next(&mut seed) % ALIGNS.len() as u64) as usize];
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: a non-zero size.
            let p = unsafe {
                if i % 2 == 0 {
                    alloc(layout)
                } else {
                    alloc_zeroed(layout)
                }
            };
            assert!(!p.is_null());
            assert_eq!(p as usize % align, 0);
            blocks.push((p, layout));
        }
    });
    blocks
}

fn footprints(blocks: &[(*mut u8, Layout)]) -> u64 {
    blocks.iter().map(|&(p, l)| footprint(p, l.align())).sum()
}

fn free_all(blocks: Vec<(*mut u8, Layout)>) {
    for (p, l) in blocks {
        // SAFETY: allocated above with `l`, freed once.
        unsafe { dealloc(p, l) };
    }
}

#[test]
fn usage_is_the_sum_of_the_blocks_footprints_and_frees_return_it_exactly() {
    let g = fresh("assorted");
    let blocks = assorted(&g, 3_000, 0x9e37_79b9_7f4a_7c15);
    let expected = footprints(&blocks);
    let requested: u64 = blocks.iter().map(|&(_, l)| l.size() as u64).sum();
    assert_eq!(settled(&g), expected);
    assert!(expected > requested, "footprints include the headers");
    free_all(blocks);
    assert_eq!(settled(&g), 0);
}

#[test]
fn a_24_byte_box_charges_at_least_its_48_byte_chunk() {
    let g = fresh("box24");
    let boxes: Vec<Box<[u8; 24]>> = {
        let mut v = Vec::with_capacity(1_000);
        g.scope(|| (0..1_000).for_each(|_| v.push(Box::new([7u8; 24]))));
        v
    };
    // 24 + the 8-byte header = 32 bytes asked of glibc: a 48-byte chunk
    // (usable 40, plus the size field) — or a larger free chunk glibc did
    // not split.
    let each: Vec<u64> = boxes
        .iter()
        .map(|b| footprint(b.as_ptr() as *mut u8, 1))
        .collect();
    assert!(each.iter().all(|&f| f >= 48), "{each:?}");
    assert_eq!(settled(&g), each.iter().sum::<u64>());
    drop(boxes);
    assert_eq!(settled(&g), 0);
}

#[test]
fn reallocs_growing_and_shrinking_keep_usage_at_the_blocks_footprint() {
    let g = fresh("realloc");
    // Through glibc's heap and its own mappings (from 128 KiB), and at an
    // alignment System reallocates by copying.
    const SIZES: [usize; 16] = [
        1, 17, 24, 25, 100, 1_000, 4_096, 5_000, 200_000, 1_000_000, 1_000_001, 300_000, 3_000, 40,
        10, 1,
    ];
    for align in [1, 8, 64] {
        let mut layout = Layout::from_size_align(SIZES[0], align).unwrap();
        // SAFETY: a non-zero size.
        let mut p = g.scope(|| unsafe { alloc(layout) });
        assert_eq!(settled(&g), footprint(p, align));
        for (i, &size) in SIZES.iter().enumerate().skip(1) {
            // Inside the group's scope or not: the block's own account.
            let resize = move || {
                // SAFETY: `p` is live with `layout`; a non-zero size.
                unsafe { realloc(p, layout, size) }
            };
            p = if i % 2 == 0 {
                g.scope(resize)
            } else {
                resize()
            };
            assert!(!p.is_null());
            layout = Layout::from_size_align(size, align).unwrap();
            assert_eq!(
                settled(&g),
                footprint(p, align),
                "after realloc to {size} at alignment {align}"
            );
        }
        // SAFETY: live with `layout`.
        unsafe { dealloc(p, layout) };
        assert_eq!(settled(&g), 0);
    }
}

#[test]
fn vectors_growing_by_push_keep_usage_exact() {
    let g = fresh("vec-push");
    let v: Vec<u64> = g.scope(|| (0..100_000u64).collect::<Vec<_>>());
    let mut s = String::new();
    g.scope(|| (0..5_000).for_each(|i| s.push_str(&i.to_string())));
    let expected = footprint(v.as_ptr() as *mut u8, 8) + footprint(s.as_ptr() as *mut u8, 1);
    assert_eq!(settled(&g), expected);
    drop((v, s));
    assert_eq!(settled(&g), 0);
}

/// Raw pointers handed between threads.
struct Blocks(Vec<(*mut u8, Layout)>);
// SAFETY: the blocks are plain memory owned by whoever holds the vector.
unsafe impl Send for Blocks {}

#[test]
fn frees_on_another_thread_return_exactly_what_was_charged() {
    let g = fresh("cross-thread");
    let mine = Blocks(assorted(&g, 1_000, 7));
    let g2 = g.clone();
    let (mine_sum, theirs) = std::thread::spawn(move || {
        let mine = mine; // the whole `Blocks`, which is `Send`
        let theirs = Blocks(assorted(&g2, 1_000, 11));
        drain_thread();
        // Free the other thread's blocks here.
        let sum = footprints(&mine.0);
        free_all(mine.0);
        drain_thread();
        (sum, theirs)
    })
    .join()
    .unwrap();
    assert!(mine_sum > 0);
    assert_eq!(settled(&g), footprints(&theirs.0));
    free_all(theirs.0);
    assert_eq!(settled(&g), 0);
}

#[test]
fn a_limit_counts_footprints() {
    let g = fresh("limited");
    g.set_max(10_000).unwrap();
    g.set_enforcement(Enforcement::Refuse);
    let mut held: Vec<Vec<u8>> = Vec::with_capacity(1_000);
    g.scope(|| loop {
        let mut v = Vec::new();
        if v.try_reserve_exact(24).is_err() {
            break;
        }
        held.push(v);
    });
    let charged: u64 = held
        .iter()
        .map(|v| footprint(v.as_ptr() as *mut u8, 1))
        .sum();
    assert_eq!(settled(&g), charged);
    // Refused at the edge: the held footprints fit, one more did not.
    let refused = take_last_refusal().unwrap();
    assert!(refused.request >= 48);
    assert!(charged <= 10_000 && charged + refused.request > 10_000);
    // At least 48 bytes each: at most 208 fit; charging requested sizes,
    // 416 would.
    assert!(held.len() <= 208, "{} blocks", held.len());
    drop(held);
    assert_eq!(settled(&g), 0);
}

#[test]
fn a_refused_allocation_leaves_no_charge() {
    let g = fresh("refused");
    g.set_max(1 << 20).unwrap();
    g.set_enforcement(Enforcement::Refuse);
    let r = g.scope(|| {
        let mut v = Vec::<u8>::new();
        let r = v.try_reserve_exact(4 << 20);
        std::hint::black_box(&v);
        r
    });
    assert!(r.is_err());
    assert_eq!(settled(&g), 0);
}

#[test]
fn the_reconciliation_says_it_counts_footprints() {
    memory();
    let r = ALLOC.reconcile().unwrap();
    assert!(r.footprint);
    assert!(r.to_string().contains("footprints"));
}
