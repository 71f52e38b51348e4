//! Stripes: one 8-byte slot at the same place in every `2^s`-th region of a
//! chunk, for the shared items of split counters.
//!
//! A tree counter's intermediate items and root accumulators are each
//! written by the CPUs of one part of the machine — item `i` of a level
//! whose items cover `2^s` positions by the CPUs at positions `i·2^s ..
//! (i+1)·2^s`. Padding each item to a cache line of its own costs 128
//! bytes per item per counter (8.5 KB per tree counter at 256 CPUs);
//! packing one counter's items into one array makes unrelated CPUs share
//! lines. A *stripe of stride `s`* instead gives a counter one slot index
//! `k` in a chunk of its own kind, and the counter keeps item `i` in region
//! `i·2^s` at index `k`. Stripes of the same stride (and the same order of
//! CPUs) share chunks, so the line at region `r` holds the items of sixteen
//! counters that the **same** CPUs write. An item costs 8 bytes.
//!
//! A counter takes its stripes together, as a **set** of several kinds (a
//! tree: one per level, the root's, the bias's): a chunk of sets of one list
//! of kinds has `members × regions` regions, member `m` in regions
//! `m·regions …`, and the set is one pointer — member `m`'s region `r` is
//! region [`Stripe::member`]`(m, regions, r)` from it. Sets of the same list
//! of kinds share chunks, sixteen counters to a line as above.
//!
//! ```text
//!  a chunk of stride 2 (items covering 4 positions), 3 trees A B C:
//!
//!   region 0      region 1   region 2   region 3   region 4      …
//!  ┌─────────────┬──────────┬──────────┬──────────┬─────────────┐
//!  │A0 B0 C0 … ← │ (never   │ (never   │ (never   │A1 B1 C1 … ← │
//!  │ written by  │ touched: │ touched: │ touched: │ written by  │
//!  │ CPUs 0–3    │ no page) │ no page) │ no page) │ CPUs 4–7    │
//!  └─────────────┴──────────┴──────────┴──────────┴─────────────┘
//!   index 0 = A, index 1 = B, index 2 = C (the same in every region)
//! ```
//!
//! Stripe chunks are ordinary chunks (anonymous mappings: regions a stride
//! skips are never touched and cost no memory), kept apart from the arena's
//! uniform allocations and never bound to NUMA nodes region by region: the
//! kernel places a page where it is first written, by the CPUs of its
//! items. Freed sets are zeroed where written and reused first.

use super::chunk::{Chunk, REGION_SLOTS};
use crate::cpu::Machine;
use crate::sync::{AtomicI64, Ordering::Relaxed};
use std::collections::BTreeMap;
use std::ptr::NonNull;

/// Which stripes may share a chunk: those whose items the same CPUs write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct StripeKind {
    /// `s`: the stripe uses regions `0, 2^s, 2·2^s, …` (and only region 0
    /// when `2^s` is at least the regions).
    pub(crate) stride: u32,
    /// Which order of CPUs a region index stands for (a tree's sharing):
    /// 0 for CPU ids, 1 for the cache order, 2 for slots any CPU writes.
    pub(crate) order: u8,
}

impl StripeKind {
    /// Regions `0, 2^s, …` below `regions`.
    fn used(self, regions: usize) -> impl Iterator<Item = usize> {
        let step = 1usize.checked_shl(self.stride).unwrap_or(usize::MAX);
        (0..regions.max(1)).step_by(step)
    }

    /// How many regions the stripe uses.
    pub(crate) fn regions_used(self, regions: usize) -> usize {
        let step = 1usize.checked_shl(self.stride).unwrap_or(usize::MAX);
        regions.max(1).div_ceil(step)
    }
}

/// A stripe: the address of its slot in region 0. Plain data: the owner
/// frees it ([`super::Arena::free_stripes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stripe(NonNull<AtomicI64>);

// SAFETY: a stripe points to atomics in memory its arena owns; it is as
// shareable as references to them.
unsafe impl Send for Stripe {}
// SAFETY: as above.
unsafe impl Sync for Stripe {}

impl Stripe {
    /// The slot in region `region` (of the set's chunk: member `m`'s
    /// region `r` is region `m · regions + r`, see [`Stripe::member`]).
    ///
    /// # Safety
    /// The arena that allocated the stripe is alive, the stripe was not
    /// freed, and `region` is one its kind uses (below the arena's regions).
    #[inline(always)]
    pub(crate) unsafe fn at(&self, region: usize) -> &AtomicI64 {
        // SAFETY: regions of a chunk are `REGION_SLOTS` atomics apart in
        // one allocation; `region` is inside it (the caller's contract).
        unsafe { &*self.0.as_ptr().add(region * REGION_SLOTS) }
    }

    /// The region of the set's chunk where member `member`'s region
    /// `region` lies, on an arena of `regions` regions.
    #[inline(always)]
    pub(crate) fn member(member: usize, regions: usize, region: usize) -> usize {
        member * regions.max(1) + region
    }
}

/// The stripe sets of one list of kinds.
#[derive(Default)]
struct Kind {
    /// Indices (into [`StripeAlloc::chunks`]) of these sets' chunks.
    chunks: Vec<usize>,
    /// Sets ever given out: the next new one is at `(next / REGION_SLOTS,
    /// next % REGION_SLOTS)` of these chunks.
    next: usize,
    /// Freed sets (chunk index, slot index), reused first.
    free: Vec<(usize, usize)>,
}

/// The stripes of one arena (under its lock).
#[derive(Default)]
pub(crate) struct StripeAlloc {
    /// Stripe chunks; a chunk never moves nor goes before the arena does.
    #[allow(clippy::vec_box)]
    chunks: Vec<Box<Chunk>>,
    kinds: BTreeMap<Box<[StripeKind]>, Kind>,
    /// Slots in use: each live stripe counts the regions its kind uses.
    pub(crate) slots: usize,
}

/// The slots a set of `kinds` uses, on `regions` regions.
fn set_slots(regions: usize, kinds: &[StripeKind]) -> usize {
    kinds.iter().map(|k| k.regions_used(regions)).sum()
}

impl StripeAlloc {
    /// A zeroed set of stripes, one of each of `kinds` (see
    /// [`Stripe::member`]); `None` if no chunk can be mapped.
    pub(crate) fn alloc(
        &mut self,
        regions: usize,
        machine: &Machine,
        kinds: &[StripeKind],
    ) -> Option<Stripe> {
        let regions = regions.max(1);
        let entry = match self.kinds.get_mut(kinds) {
            Some(entry) => entry,
            None => self.kinds.entry(kinds.into()).or_default(),
        };
        let (chunk, index) = match entry.free.pop() {
            Some(at) => at,
            None => {
                let (nth, index) = (entry.next / REGION_SLOTS, entry.next % REGION_SLOTS);
                if nth == entry.chunks.len() {
                    let members = regions.checked_mul(kinds.len().max(1))?;
                    self.chunks
                        .push(Box::new(Chunk::new(members, machine, false)?));
                    entry.chunks.push(self.chunks.len() - 1);
                }
                entry.next += 1;
                (entry.chunks[nth], index)
            }
        };
        self.slots += set_slots(regions, kinds);
        // SAFETY: region 0 and `index` below `REGION_SLOTS` of a live chunk.
        // The pointer keeps the chunk's provenance: the set's members and
        // regions are reached from it.
        Some(Stripe(unsafe { self.chunks[chunk].slot_ptr(0, index) }))
    }

    /// Free a set of stripes of `kinds`, zeroing the slots it wrote (an
    /// untouched page stays unbacked).
    ///
    /// # Safety
    /// `stripe` came from [`StripeAlloc::alloc`] with `regions` and `kinds`,
    /// is freed once, and no reference into it remains.
    pub(crate) unsafe fn free(&mut self, regions: usize, stripe: Stripe, kinds: &[StripeKind]) {
        let regions = regions.max(1);
        for (m, kind) in kinds.iter().enumerate() {
            for region in kind.used(regions) {
                // SAFETY: the set is ours until it is on a free list, and
                // member `m`'s kind uses `region`.
                let slot = unsafe { stripe.at(m * regions + region) };
                // Relaxed: no one else holds the stripe now; the arena's
                // lock orders this store before its next owner's first
                // access.
                if slot.load(Relaxed) != 0 {
                    slot.store(0, Relaxed);
                }
            }
        }
        let addr = stripe.0.as_ptr() as usize;
        let size = std::mem::size_of::<AtomicI64>();
        let Some(entry) = self.kinds.get_mut(kinds) else {
            debug_assert!(false, "a stripe set of kinds never allocated");
            return;
        };
        for &c in &entry.chunks {
            // SAFETY: region 0, slot 0 of a live chunk.
            let base = unsafe { self.chunks[c].slot(0, 0) } as *const AtomicI64 as usize;
            if (base..base + REGION_SLOTS * size).contains(&addr) {
                entry.free.push((c, (addr - base) / size));
                self.slots -= set_slots(regions, kinds);
                return;
            }
        }
        debug_assert!(false, "a stripe of another arena or kind");
    }
}
