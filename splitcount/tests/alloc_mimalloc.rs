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

include!("inner/body.rs");
