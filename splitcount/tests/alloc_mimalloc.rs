//! `Accounted<mimalloc::MiMalloc, Footprint>` (feature `mimalloc`): usage
//! is mimalloc's usable size of each block, exactly.

#![cfg(all(feature = "mimalloc", not(loom)))]
#![allow(unsafe_code)]

type Inner = mimalloc::MiMalloc;
const INNER: Inner = mimalloc::MiMalloc;

/// mimalloc's usable size of a block it returned.
///
/// # Safety
/// `block` is live and came from mimalloc.
unsafe fn usable(block: *mut u8) -> usize {
    // SAFETY: forwarded.
    unsafe { mimalloc::MiMalloc.usable_size(block) }
}

mod common;

include!("inner/body.rs");

/// An over-aligned block's tag trails it, and mimalloc is asked for the
/// size with the tag rounded up to the alignment: 64 bytes at 64 take 128
/// (72 bytes asked as such took 160: `mi_malloc_aligned` serves a size whose
/// class is not aligned from a larger class), 100 bytes at 4,096 one page.
#[test]
fn over_aligned_blocks_ask_for_their_size_rounded_to_the_alignment() {
    let g = fresh("aligned");
    // Made outside the scope, large enough: not charged to the group.
    let mut blocks = Vec::with_capacity(300);
    g.scope(|| {
        for (size, align, takes) in [(64, 64, 128), (100, 4096, 4096), (120, 128, 128)] {
            for _ in 0..100 {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size.
                let p = unsafe { alloc(layout) };
                assert_eq!(p as usize % align, 0);
                // SAFETY: live; an over-aligned block starts at `p`.
                assert_eq!(unsafe { usable(p) }, takes, "{size} B at {align}");
                blocks.push((p, layout));
            }
        }
    });
    assert_eq!(
        settled(&g),
        blocks
            .iter()
            .map(|&(p, l)| footprint(p, l.align()))
            .sum::<u64>()
    );
    for (p, l) in blocks {
        // SAFETY: live, allocated with `l`.
        unsafe { dealloc(p, l) };
    }
    assert_eq!(settled(&g), 0);
}

/// `MiMalloc`'s own `alloc` (`mi_malloc_aligned`) sometimes serves a size
/// from a larger class, when its class's page has no free block at hand;
/// the wrapper's word-aligned blocks come from `mi_malloc`, whose class is
/// a function of the size — the one `Footprint` computes from the layout
/// without asking mimalloc. After 300,000 allocations and frees of 1 to
/// 1,024 bytes churning through a ring of 2,000, the group's usage is still
/// the exact sum of its live blocks' usable sizes.
#[test]
fn word_aligned_blocks_have_the_class_their_size_says() {
    let g = fresh("churn");
    let mut seed = 17;
    let mut ring: Vec<(*mut u8, Layout)> = Vec::with_capacity(2_000);
    g.scope(|| {
        for i in 0..300_000 {
            let size = 1 + (next(&mut seed) % 1024) as usize;
            let layout = Layout::from_size_align(size, 1 << (i % 4)).unwrap();
            // SAFETY: a non-zero size.
            let p = unsafe { alloc(layout) };
            assert!(!p.is_null());
            if ring.len() < 2_000 {
                ring.push((p, layout));
            } else {
                let slot = (next(&mut seed) % 2_000) as usize;
                let (old, l) = std::mem::replace(&mut ring[slot], (p, layout));
                // SAFETY: allocated above with this layout.
                unsafe { dealloc(old, l) };
            }
        }
    });
    assert_eq!(settled(&g), total(&ring));
    for (p, l) in ring {
        // SAFETY: live with this layout.
        unsafe { dealloc(p, l) };
    }
    assert_eq!(settled(&g), 0);
}

/// A word-aligned block shrunk by less than half stays in its class under
/// `mi_realloc`; the wrapper moves it to the new size's class instead, so
/// that the layout still tells its footprint: 1,000 bytes to 600 (classes
/// 1,024 and 640), 600 to 560 (the same class: in place), and back up.
#[test]
fn a_shrunk_block_moves_to_its_new_class() {
    let g = fresh("shrink");
    g.scope(|| {
        let l = Layout::from_size_align(1_000, 8).unwrap();
        // SAFETY: a non-zero size; each block is live with the layout it
        // was last given.
        unsafe {
            let p = alloc(l);
            let q = realloc(p, l, 600);
            assert_eq!(footprint(q, 8), 640);
            let r = realloc(q, Layout::from_size_align(600, 8).unwrap(), 560);
            assert_eq!(r, q, "the same class: in place");
            let s = realloc(r, Layout::from_size_align(560, 8).unwrap(), 900);
            assert_eq!(footprint(s, 8), 1_024);
            assert_eq!(settled(&g), 1_024);
            dealloc(s, Layout::from_size_align(900, 8).unwrap());
        }
    });
    assert_eq!(settled(&g), 0);
}
