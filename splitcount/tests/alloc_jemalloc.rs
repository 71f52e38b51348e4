//! `Accounted<tikv_jemallocator::Jemalloc, Footprint>` (feature
//! `jemalloc`): usage is jemalloc's usable size of each block, exactly.

#![cfg(all(feature = "jemalloc", not(loom)))]
#![allow(unsafe_code)]

type Inner = tikv_jemallocator::Jemalloc;
const INNER: Inner = tikv_jemallocator::Jemalloc;

/// jemalloc's usable size of a block it returned.
///
/// # Safety
/// `block` is live and came from jemalloc.
unsafe fn usable(block: *mut u8) -> usize {
    // SAFETY: forwarded.
    unsafe { tikv_jemallocator::usable_size(block) }
}

mod common;

include!("inner/body.rs");
