//! `Accounted<A, Footprint>` over an inner allocator that cannot say what
//! its blocks occupy (`InnerFootprint` with no body): a block charges the
//! size the wrapper asked for — the caller's size plus the 8-byte tag (for an
//! alignment above 8, the size rounded up to 8 first: the tag trails).

#![cfg(not(loom))]
#![allow(unsafe_code)]

use splitcount::alloc::{Accounted, Footprint, InnerFootprint};
use splitcount::group::Hierarchy;
use std::alloc::{alloc, dealloc, realloc, GlobalAlloc, Layout, System};
use std::hint::black_box;

/// `System` under another name, without its glibc figure.
struct Plain;

// SAFETY: forwards to `System`.
unsafe impl GlobalAlloc for Plain {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

// SAFETY: the default, `layout.size()`, depends on the layout alone.
unsafe impl InnerFootprint for Plain {}

#[global_allocator]
static ALLOC: Accounted<Plain, Footprint> = Accounted::with_charging(Plain, Footprint);

#[test]
fn without_a_figure_from_the_inner_allocator_a_block_charges_its_size_and_header() {
    let memory = Hierarchy::default();
    ALLOC.attach(&memory).unwrap();
    let g = memory.root().child("plain").unwrap();
    let settled = || {
        memory.drain_stocks();
        g.usage()
    };
    let layouts = [
        (1, 1),
        (24, 8),
        (100, 4),
        (4_000, 64),
        (5_000, 4_096),
        (100, 16),
    ]
    .map(|(size, align)| Layout::from_size_align(size, align).unwrap());
    // `black_box`: the compiler may otherwise drop an allocation whose
    // memory is never used, and with it the charge.
    // SAFETY: non-zero sizes.
    let blocks = g.scope(|| layouts.map(|l| black_box(unsafe { alloc(l) })));
    // The size asked of the inner allocator: the 8-byte tag in front, or
    // trailing the size rounded up to 8 for an alignment above 8.
    let expected: usize = layouts
        .iter()
        .map(|l| {
            if l.align() <= 8 {
                l.size() + 8
            } else {
                l.size().next_multiple_of(8) + 8
            }
        })
        .sum();
    assert_eq!(settled(), expected as u64);
    // A realloc charges the new size and header in place of the old.
    // SAFETY: live with `layouts[1]`.
    let grown = black_box(unsafe { realloc(blocks[1], layouts[1], 1_000) });
    assert!(!grown.is_null());
    assert_eq!(settled(), (expected + 1_000 - 24) as u64);
    // SAFETY: live, each with its layout (the second one grown).
    unsafe {
        dealloc(grown, Layout::from_size_align(1_000, 8).unwrap());
        for i in [0, 2, 3, 4, 5] {
            dealloc(blocks[i], layouts[i]);
        }
    }
    assert_eq!(settled(), 0);
}
