//! `HeapPerGroup<mimalloc::MiMalloc, Requested>` (feature `mimalloc`):
//! no block carries a tag, and a group's usage is the exact sum of its live
//! blocks' requested sizes — through reallocs in place and moved, and frees
//! on another thread.

#![cfg(all(feature = "mimalloc", not(loom)))]
#![allow(unsafe_code)]

use libmimalloc_sys as mi;
use splitcount::alloc::{drain_thread, HeapPerGroup, Requested};
use splitcount::group::{Group, Hierarchy};
use std::alloc::{alloc, dealloc, realloc, Layout};
use std::sync::OnceLock;

mod common;
use common::{free_on_another_thread, Rng};

#[global_allocator]
static ALLOC: HeapPerGroup<mimalloc::MiMalloc, Requested> =
    HeapPerGroup::with_charging(mimalloc::MiMalloc, Requested);

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

fn settled(g: &Group) -> u64 {
    drain_thread();
    memory().drain_stocks();
    g.usage()
}

fn in_main_heap(p: *mut u8) -> bool {
    // SAFETY: any pointer.
    unsafe { mi_heap_of(p.cast()) == mi_heap_main() }
}

fn requested(blocks: &[(*mut u8, Layout)]) -> u64 {
    blocks.iter().map(|&(_, l)| l.size() as u64).sum()
}

#[test]
fn usage_is_the_requested_sizes_through_reallocs_and_frees_elsewhere() {
    let g = memory().root().child("requested").unwrap();
    ALLOC.give_heap(&g).unwrap();
    let mut rng = Rng::new(9);
    let mut blocks: Vec<(*mut u8, Layout)> = Vec::with_capacity(1_500);
    g.scope(|| {
        for _ in 0..1_500 {
            let size = 1 + rng.below(4096) as usize;
            let layout = Layout::from_size_align(size, 1 << rng.below(13)).unwrap();
            // SAFETY: a non-zero size.
            let p = unsafe { alloc(layout) };
            assert!(!p.is_null() && !in_main_heap(p));
            blocks.push((p, layout));
        }
    });
    assert_eq!(settled(&g), requested(&blocks));
    // Reallocs from outside the group: within the class (in place) and
    // across classes (moved); the block's group pays.
    for (i, (p, l)) in blocks.iter_mut().enumerate() {
        let size = if i % 2 == 0 {
            l.size() + 1
        } else {
            1 + rng.below(9000) as usize
        };
        // SAFETY: live with `l`; a non-zero size.
        let q = unsafe { realloc(*p, *l, size) };
        assert!(!q.is_null() && !in_main_heap(q));
        *p = q;
        *l = Layout::from_size_align(size, l.align()).unwrap();
    }
    assert_eq!(settled(&g), requested(&blocks));
    free_on_another_thread(&blocks);
    assert_eq!(settled(&g), 0);
    assert_eq!(g.events().underflow, 0);
}

/// A 16-byte block takes mimalloc's 16-byte class: no header moved it up.
#[test]
fn a_sixteen_byte_block_takes_sixteen_bytes() {
    let g = memory().root().child("sixteen").unwrap();
    ALLOC.give_heap(&g).unwrap();
    let layout = Layout::from_size_align(16, 8).unwrap();
    // SAFETY: a non-zero size; freed below.
    unsafe {
        let p = g.scope(|| alloc(layout));
        assert_eq!(mi::mi_usable_size(p.cast()), 16);
        assert!(!in_main_heap(p));
        dealloc(p, layout);
    }
}
