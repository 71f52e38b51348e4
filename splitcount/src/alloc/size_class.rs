//! jemalloc's and mimalloc's size classes, computed inline: what
//! [`Footprint`](super::Footprint) charges for a block of
//! `Accounted<Jemalloc, Footprint>` or `Accounted<MiMalloc, Footprint>`,
//! without a call into the allocator.
//!
//! Both serve a small request from a *size class*, a function of the size
//! alone (for jemalloc, of the size and the alignment flags: `nallocx`
//! answers it without allocating; for mimalloc's `mi_malloc`,
//! `mi_good_size`), and a live block's usable size is that class. Their
//! default builds (jemalloc 5's with its 16-byte quantum, the mimalloc 3
//! the `mimalloc` crate builds) have the same small classes, four per
//! doubling above 128 bytes:
//!
//! ```text
//!  size            class
//!  1 …    8        8
//!  9 …  128        next multiple of 16
//!  2ᵏ+1 … 2ᵏ⁺¹     next multiple of 2ᵏ⁻²
//! ```
//!
//! Asking the allocator instead costs far more: jemalloc's
//! `malloc_usable_size` walks its radix tree to the block's extent (about
//! 55 instructions), and even `nallocx` pays a call, a thread-state fetch
//! and two table reads (about 34); `mi_usable_size` is a call that finds
//! the block's page and reads it. The inline class is one load from a
//! small table that the check fills (all 0 until it has passed: a 0 sends
//! the caller to the allocator, with no flag to read beside the entry).
//!
//! **Never trusted blindly.** A build may be configured otherwise (another
//! quantum, mimalloc's padding in its debug builds), so each scheme is
//! checked once, at its first use, against the allocator (`nallocx`,
//! `mi_good_size`) for every size it serves (no allocation). Until the
//! check has passed, and forever if it fails, a block's footprint is asked
//! of the allocator, which equals the inline class wherever that is used:
//! a block charged one way and freed the other gives back what it took.
//!
//! **mimalloc's class is a function of the size only through `mi_malloc`.**
//! `MiMalloc` (the `mimalloc` crate's `GlobalAlloc`) allocates through
//! `mi_malloc_aligned`, which serves a size from a larger class when its
//! own class's page has no free block at hand and the class is not a
//! power of two (in a ring of 5 million blocks of 1–1,024 bytes at
//! alignment 8, 9,688 blocks had another class than `mi_good_size`'s;
//! through `mi_malloc`, none). So the wrapper allocates a word-aligned
//! block of `Accounted<MiMalloc, Footprint>` with `mi_malloc` itself
//! (every block of it is 8-aligned): see `InnerFootprint::alloc_for_footprint`.

use std::sync::atomic::{
    AtomicU16, AtomicU8,
    Ordering::{Acquire, Relaxed, Release},
};

/// The largest size the inline classes serve; larger blocks ask the
/// allocator (they are rarer and cost far more than the call).
pub(crate) const INLINE_MAX: usize = 1024;

/// The class of `size` (at most [`INLINE_MAX`], not 0) in jemalloc's
/// default build and for mimalloc's `mi_malloc` (the same classes): one
/// read of [`CLASSES`], indexed by the size in 8-byte units (every class
/// is a multiple of 8, so sizes with the same index share a class). A
/// table, not the arithmetic: the arithmetic is a chain of ten dependent
/// instructions on every free.
///
/// The index is `(size + 7) >> 3` (two instructions; `div_ceil` takes
/// five), masked to the table's 256 entries: no bounds check and no panic
/// path, whatever the caller passes (a size above [`INLINE_MAX`] reads 0
/// or a wrong class; callers check the size first).
#[inline(always)]
pub(crate) fn class(size: usize) -> usize {
    debug_assert!((1..=INLINE_MAX).contains(&size));
    CLASSES[(size.wrapping_add(7) >> 3) & (TABLE_LEN - 1)] as usize
}

/// [`class`]'s table: entry `i` is the class of `8·i` bytes, for `i` up to
/// `INLINE_MAX / 8`; 0 above (a power-of-two length, for the mask).
static CLASSES: [u16; TABLE_LEN] = {
    let mut table = [0u16; TABLE_LEN];
    let mut i = 0;
    while i <= INLINE_MAX / 8 {
        table[i] = class_of(i * 8) as u16;
        i += 1;
    }
    table
};

/// The class of `size` (up to the small classes): the smallest class is 8
/// and the quantum 16; above 128 bytes a class is 2^(⌈log₂ size⌉ − 3) from
/// the next.
const fn class_of(size: usize) -> usize {
    /// The spacing of the classes up to 128 bytes.
    const QUANTUM: usize = 16;
    if size <= 8 {
        return 8;
    }
    let ceil_log2 = usize::BITS - (size - 1).leading_zeros();
    let mut delta = 1usize << (ceil_log2 - 3);
    if delta < QUANTUM {
        delta = QUANTUM;
    }
    (size + delta - 1) & !(delta - 1)
}

/// Whether a scheme agreed with its allocator — checked once — and, once
/// it has, the scheme's classes again, for the fast path to read with one
/// load.
pub(crate) struct Checked {
    state: AtomicU8,
    /// [`CLASSES`], copied here when the check passes; all 0 before, and
    /// for ever if it fails. A 0 read sends the caller to the allocator's
    /// own answer, which is the same number: an entry needs no flag read
    /// beside it.
    classes: [AtomicU16; TABLE_LEN],
}

/// The entries of [`CLASSES`] and of a [`Checked`] table.
const TABLE_LEN: usize = (INLINE_MAX / 8 + 1).next_power_of_two();

const UNKNOWN: u8 = 0;
const AGREES: u8 = 1;
const DIFFERS: u8 = 2;

impl Checked {
    pub(crate) const fn new() -> Checked {
        Checked {
            state: AtomicU8::new(UNKNOWN),
            classes: [const { AtomicU16::new(0) }; TABLE_LEN],
        }
    }

    /// Whether the inline class may be used: `agrees(size)` (the scheme
    /// against the allocator for one size) held for every size from 1 to
    /// [`INLINE_MAX`], checked at the first call. Threads that race to the
    /// first call each check; they reach the same answer.
    #[inline(always)]
    pub(crate) fn holds(&self, agrees: impl Fn(usize) -> bool) -> bool {
        // Acquire/Release: nothing is published with the flag but the
        // answer itself; they only keep the check's reads before it.
        match self.state.load(Acquire) {
            AGREES => true,
            DIFFERS => false,
            _ => self.check(agrees),
        }
    }

    /// The class of `size` (at most [`INLINE_MAX`], not 0) if the check
    /// ran and the scheme agreed; `None` otherwise (never runs the check:
    /// a caller that gets `None` goes to a path that calls
    /// [`Checked::holds`]). One load, indexed as [`class`].
    #[inline(always)]
    pub(crate) fn class(&self, size: usize) -> Option<usize> {
        debug_assert!((1..=INLINE_MAX).contains(&size));
        // Relaxed: an entry is 0 or the class, and says nothing else.
        let class = self.classes[(size.wrapping_add(7) >> 3) & (TABLE_LEN - 1)].load(Relaxed);
        (class != 0).then_some(class as usize)
    }

    #[cold]
    #[inline(never)]
    fn check(&self, agrees: impl Fn(usize) -> bool) -> bool {
        let ok = (1..=INLINE_MAX).all(agrees);
        if ok {
            for (entry, &class) in self.classes.iter().zip(CLASSES.iter()) {
                entry.store(class, Relaxed);
            }
        }
        self.state.store(if ok { AGREES } else { DIFFERS }, Release);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_16_apart_to_128_bytes_then_four_per_doubling() {
        let sizes = [
            1, 8, 9, 16, 17, 33, 48, 64, 65, 128, 129, 160, 161, 257, 1000, 1024,
        ];
        let classes: Vec<usize> = sizes.iter().map(|&s| class(s)).collect();
        assert_eq!(
            classes,
            [8, 8, 16, 16, 32, 48, 48, 64, 80, 128, 160, 160, 192, 320, 1024, 1024]
        );
    }

    /// The scheme against the jemalloc this crate builds, for every size it
    /// serves — and the real usable size of blocks of each.
    #[cfg(feature = "jemalloc")]
    #[test]
    fn the_scheme_is_jemallocs_own() {
        use std::alloc::{GlobalAlloc, Layout};
        for size in 1..=INLINE_MAX {
            // SAFETY: `nallocx` allocates nothing; the size is not 0.
            let class = unsafe { tikv_jemalloc_sys::nallocx(size, 0) };
            assert_eq!(super::class(size), class, "size {size}");
            let layout = Layout::from_size_align(size, 8).unwrap();
            let jemalloc = tikv_jemallocator::Jemalloc;
            // SAFETY: a valid layout of non-zero size; freed below with it.
            unsafe {
                let block = jemalloc.alloc(layout);
                assert_eq!(tikv_jemallocator::usable_size(block), class, "size {size}");
                jemalloc.dealloc(block, layout);
            }
        }
    }

    /// The scheme against the mimalloc this crate builds, for every size it
    /// serves — `mi_good_size`, and the real usable size of `mi_malloc`'s
    /// and `mi_zalloc`'s blocks of each.
    #[cfg(feature = "mimalloc")]
    #[test]
    fn the_scheme_is_mimallocs_own() {
        use libmimalloc_sys as mi;
        for size in 1..=INLINE_MAX {
            // SAFETY: `mi_good_size` allocates nothing; the blocks are
            // freed at once.
            unsafe {
                assert_eq!(class(size), mi::mi_good_size(size), "size {size}");
                for block in [mi::mi_malloc(size), mi::mi_zalloc(size)] {
                    assert_eq!(mi::mi_usable_size(block), class(size), "size {size}");
                    mi::mi_free(block);
                }
            }
        }
    }

    #[test]
    fn a_scheme_that_differs_once_is_never_used() {
        let c = Checked::new();
        assert_eq!(c.class(24), None, "not checked yet");
        assert!(!c.holds(|s| s != 700));
        assert_eq!(c.class(24), None);
        // Answered once: a later check that would pass is not run.
        assert!(!c.holds(|_| true));
        assert_eq!(c.class(24), None);
        let c = Checked::new();
        assert!(c.holds(|_| true));
        // Every size, to the last: the scheme's class, from one load.
        for size in 1..=INLINE_MAX {
            assert_eq!(c.class(size), Some(class(size)), "size {size}");
        }
        assert!(c.holds(|_| false));
    }
}
