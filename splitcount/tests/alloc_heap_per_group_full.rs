//! `HeapPerGroup`: more groups given a heap at once than there are heaps.
//! The groups past the last are refused one and keep blocks with a header
//! in mimalloc's main heap, and every group's usage is still exact. (A test binary of its
//! own: it takes every heap.)

#![cfg(all(feature = "mimalloc", not(loom)))]
#![allow(unsafe_code)]

use libmimalloc_sys as mi;
use splitcount::alloc::{drain_thread, HeapPerGroup, MAX_HEAPS};
use splitcount::group::Hierarchy;
use std::alloc::{alloc, dealloc, Layout};

#[global_allocator]
static ALLOC: HeapPerGroup<mimalloc::MiMalloc> = HeapPerGroup::new(mimalloc::MiMalloc);

extern "C" {
    fn mi_heap_of(p: *const std::ffi::c_void) -> *mut mi::mi_heap_t;
    fn mi_heap_main() -> *mut mi::mi_heap_t;
}

#[test]
fn accounts_past_the_last_heap_get_headers_and_exact_usage() {
    let memory = Hierarchy::default();
    ALLOC.attach(&memory).unwrap();
    let groups: Vec<_> = (0..MAX_HEAPS + 16)
        .map(|i| memory.root().child(&format!("tenant-{i}")).unwrap())
        .collect();
    let given: Vec<bool> = groups.iter().map(|g| ALLOC.give_heap(g).is_ok()).collect();
    assert!(given[..MAX_HEAPS].iter().all(|&g| g));
    assert!(
        given[MAX_HEAPS..].iter().all(|&g| !g),
        "past the last heap: {}",
        splitcount::alloc::HeapError::AllTaken
    );
    let mut seed = 1u64;
    let mut blocks = Vec::new();
    for g in &groups {
        // Made outside the group: only the blocks are charged to it.
        let mut mine: Vec<(usize, Layout)> = Vec::with_capacity(50);
        g.scope(|| {
            for _ in 0..50 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                let size = 1 + (seed >> 33) as usize % 2000;
                let align = 1 << ((seed >> 20) % 8);
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size.
                let p = unsafe { alloc(layout) };
                assert!(!p.is_null());
                mine.push((p as usize, layout));
            }
        });
        blocks.push(mine);
    }
    assert_eq!(ALLOC.heaps().made, MAX_HEAPS);
    drain_thread();
    memory.drain_stocks();
    let mut with_headers = 0;
    for (g, mine) in groups.iter().zip(&blocks) {
        let expected: u64 = mine
            .iter()
            .map(|&(p, l)| {
                let p = p as *mut u8;
                // SAFETY: live blocks of the allocator.
                unsafe {
                    if mi_heap_of(p.cast()) == mi_heap_main() {
                        with_headers += 1;
                        let front = if l.align() <= 8 { 8 } else { 0 };
                        mi::mi_usable_size(p.sub(front).cast()) as u64
                    } else {
                        mi::mi_usable_size(p.cast()) as u64
                    }
                }
            })
            .sum();
        assert_eq!(g.usage(), expected, "{}", g.name());
    }
    // The first MAX_HEAPS groups took the heaps; the rest (16 groups, 50
    // blocks each) have headers.
    assert_eq!(with_headers, 16 * 50);
    for (g, mine) in groups.iter().zip(blocks) {
        for (p, l) in mine {
            // SAFETY: live, with this layout.
            unsafe { dealloc(p as *mut u8, l) };
        }
        memory.drain_stocks();
        assert_eq!(g.usage(), 0, "{}", g.name());
        g.remove().unwrap();
    }
    assert_eq!(ALLOC.heaps().made, MAX_HEAPS);
}
