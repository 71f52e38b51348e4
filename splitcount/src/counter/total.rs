//! The shared total of the designs that spill whole parts into it
//! ([`super::Batched`], [`super::PerNode`]), with the spill counts that make
//! `precise()` consistent.
//!
//! A spill takes a part (leaving 0) and adds it to the total in two steps;
//! in between, its units are in neither place. A reader that summed the
//! total before the add and the part after the take would miss adds that
//! had already returned (the review saw `precise()` go *down* by up to 34
//! while another CPU spilled). The kernel holds `fbc->lock` across both
//! steps and across `__percpu_counter_sum`. Here a spill is announced
//! instead — `begun` is incremented before the part is taken, `ended` after
//! the total's add — and `precise()` retries until it read the total and the
//! parts with no spill in flight and none begun meanwhile:
//!
//! ```text
//!  spiller:  begun += 1 ─▶ take part (Release) ─▶ total += taken (Release) ─▶ ended += 1
//!  reader:   b = begun; e = ended; b == e? ─▶ total, Σ parts (Acquire) ─▶ begun == b? done
//! ```
//!
//! *Why it is exact.* `ended ≤ begun` at all times. If `b == e` and `begun`
//! still reads `b` at the end, the spills that ended before the reader read
//! `ended` are exactly the ones begun before it read `begun`: all of them
//! have added to the total, which the reader's later load sees (Release on
//! `ended`, Acquire on its load), and their parts were taken before that.
//! A spill begun later cannot have been half-seen: a reader whose load of a
//! part sees it taken, or whose load of the total sees its add (Acquire,
//! pairing with the take's and the add's Release), also sees its `begun`
//! increment, so its final check fails and it reads again. (The second
//! pairing is not optional: loom found the reader that saw the total's new
//! value early but a part's old one, and went down on its next read.) Adds
//! that do not spill touch only a part and are counted once or not yet,
//! like any add in flight. On x86 every one of these orderings is free.
//!
//! Spills happen once per `batch` units per CPU, and the counts share the
//! total's cache line, so a spill still moves one line. A reader may retry
//! while spills keep coming; it yields between tries.

use crate::percpu::SpillTarget;
use crate::sync::{
    AtomicI64, AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

/// A shared total with announced spills. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Total {
    value: AtomicI64,
    begun: AtomicU64,
    ended: AtomicU64,
}

impl Total {
    /// The total alone (the designs' `approximate()`).
    #[inline]
    pub(crate) fn get(&self) -> i64 {
        self.value.load(Relaxed)
    }

    /// Add to the total directly (not a spill: nothing is in transit).
    #[inline]
    pub(crate) fn add(&self, delta: i64) {
        self.value.fetch_add(delta, Relaxed);
    }

    /// `total + parts()`, read with no spill in flight: every add that
    /// returned before the call is counted exactly once. `parts` must load
    /// the parts with Acquire.
    pub(crate) fn consistent_sum(&self, parts: impl Fn() -> i64) -> i64 {
        let mut tries = 0u32;
        loop {
            // SeqCst: the three counter loads and the spillers' increments
            // are in one total order (see the module docs).
            let begun = self.begun.load(SeqCst);
            if self.ended.load(SeqCst) == begun {
                // Acquire: a total that already holds the add of a spill
                // announced after `begun` was read comes with that
                // announcement, so the check below sees it and retries.
                let sum = self.value.load(Acquire).wrapping_add(parts());
                if self.begun.load(SeqCst) == begun {
                    return sum;
                }
            }
            tries += 1;
            // (Under loom every try yields: a model must see the spin give
            // way to the spiller.)
            if cfg!(loom) || tries % 16 == 0 {
                crate::sync::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl SpillTarget for Total {
    #[inline]
    fn begin(&self) {
        // SeqCst: ordered before the take and in the readers' total order.
        self.begun.fetch_add(1, SeqCst);
    }

    #[inline]
    fn end(&self, taken: i64) {
        if taken != 0 {
            // Release: pairs with the readers' Acquire load of the total.
            self.value.fetch_add(taken, Release);
        }
        // Release (as part of SeqCst): publishes the total's add to readers
        // that see this count.
        self.ended.fetch_add(1, SeqCst);
    }

    #[inline]
    fn direct(&self, delta: i64) {
        self.add(delta);
    }
}
