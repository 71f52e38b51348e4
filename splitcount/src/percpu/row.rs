//! A row: where an allocation's slots lie in every region of its chunk, and
//! what the hot path needs to reach the current CPU's copy — 16 bytes.
//!
//! Every per-CPU allocation is a row: the address of its first slot in
//! region 0 (region `r`'s copy is `r · REGION_BYTES` on), the regions it has
//! besides the overflow region, and — on x86_64 Linux — glibc's
//! `__rseq_offset` when the straight-line rseq add applies. [`super::PerCpu`]
//! wraps one with its arena and its place in the chunk; a
//! [`crate::counter::Tree`] keeps the bare row (its arena is in the layout it
//! shares with the trees of its shape), which is what lets a tree's handle
//! stay at 40 bytes.
//!
//! A row does not own its slots: its owner gives them back
//! ([`super::Arena::free_row`] or `PerCpu`'s drop) and keeps the arena alive
//! while it uses them. Everything that is not the common case — concurrency
//! ids, an area splitcount registered, atomic arenas, simulated machines —
//! takes the arena as an argument, on a path out of line.

#![allow(unsafe_code)]

use super::chunk::REGION_SLOTS;
use super::path::SlotIndex;
use super::Arena;
use crate::cpu;
use crate::sync::{
    AtomicI64,
    Ordering::{Acquire, Relaxed},
};
use std::ptr::NonNull;

/// See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Row {
    /// The allocation's first slot in region 0.
    slot0: NonNull<AtomicI64>,
    /// Per-CPU regions; region `regions` is the overflow copy.
    regions: u32,
    /// glibc's `__rseq_offset` in an rseq arena indexed by CPU id — the
    /// common case, decided by this one field — else [`NO_FS_OFFSET`].
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    fast_fs_offset: i32,
}

/// [`Row::fast_fs_offset`] when the straight-line add does not apply.
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
const NO_FS_OFFSET: i32 = i32::MIN;

// SAFETY: a row points to atomics in memory its arena owns; it is as
// shareable as references to them (its owner keeps the arena alive).
unsafe impl Send for Row {}
// SAFETY: as above.
unsafe impl Sync for Row {}

impl Row {
    /// The row whose region-0 slot is `slot0`, in `arena`; `slot0` must
    /// reach the whole chunk (`Chunk::slot_ptr`), not the one slot.
    pub(super) fn new(slot0: NonNull<AtomicI64>, arena: &Arena) -> Row {
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        let fast_fs_offset = match (arena.add_path(), arena.slot_index()) {
            (super::AddPath::Rseq, SlotIndex::CpuId) => cpu::glibc_fs_offset()
                .and_then(|o| i32::try_from(o).ok())
                .filter(|&o| o != NO_FS_OFFSET)
                .unwrap_or(NO_FS_OFFSET),
            _ => NO_FS_OFFSET,
        };
        Row {
            slot0,
            // `Arena::with_options` keeps the regions within the machine's
            // CPUs, which `Machine` keeps below 2³².
            regions: arena.regions() as u32,
            #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
            fast_fs_offset,
        }
    }

    /// Per-CPU copies, not counting the overflow copy.
    #[inline(always)]
    pub(crate) fn regions(&self) -> usize {
        self.regions as usize
    }

    /// The allocation's first slot in region 0 (where `Arena` finds its
    /// chunk when it is given back).
    pub(super) fn slot0(&self) -> *const AtomicI64 {
        self.slot0.as_ptr()
    }

    /// Slot `index`'s region-0 address, for a critical section (region `r`
    /// is `r · REGION_BYTES` on).
    #[inline(always)]
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    pub(crate) fn ptr(&self, index: usize) -> *mut i64 {
        self.slot0.as_ptr().wrapping_add(index).cast()
    }

    /// Slot `index` of region `region` (`region == regions()` is the
    /// overflow copy).
    ///
    /// # Safety
    /// The arena is alive and the row not given back; `region <=
    /// regions()` and `index` is below the allocation's length.
    #[inline(always)]
    pub(crate) unsafe fn slot(&self, region: usize, index: usize) -> &AtomicI64 {
        // SAFETY: `slot_ptr`'s pointer is to a live atomic of the chunk (the
        // caller's bounds), which lives as long as the arena.
        unsafe { &*self.slot_ptr(region, index) }
    }

    /// [`Row::slot`] as a raw pointer that may reach the allocation's other
    /// slots in that region (its provenance is the chunk's, not one slot's):
    /// what a caller reading a run of slots as one slice needs.
    ///
    /// # Safety
    /// As for [`Row::slot`].
    #[inline(always)]
    pub(crate) unsafe fn slot_ptr(&self, region: usize, index: usize) -> *const AtomicI64 {
        debug_assert!(region <= self.regions());
        // SAFETY: regions of a chunk are `REGION_SLOTS` atomics apart in one
        // allocation, and the allocation's slots are contiguous in each
        // (the caller's bounds); no reference is made.
        unsafe { self.slot0.as_ptr().add(region * REGION_SLOTS + index) }
    }

    /// Relaxed `fetch_add` on one region's copy; returns the new value.
    ///
    /// # Safety
    /// As for [`Row::slot`].
    #[inline(always)]
    pub(crate) unsafe fn atomic_add(&self, region: usize, index: usize, delta: i64) -> i64 {
        // Relaxed: a slot is a pure counter; readers sum slots and need no
        // ordering with other memory.
        // SAFETY: forwarded from the caller.
        unsafe { self.slot(region, index) }
            .fetch_add(delta, Relaxed)
            .wrapping_add(delta)
    }

    /// Add `delta` to slot `index` of the current CPU's own copy and return
    /// `(cpu, new value)`; `None` when this thread cannot update its CPU's
    /// copy (no registered rseq area in an rseq arena, or an id beyond the
    /// regions) — the caller then accounts the delta elsewhere. `arena` is
    /// asked for only off the common case.
    ///
    /// # Safety
    /// As for [`Row::slot`]; `arena` returns the row's arena.
    #[inline(always)]
    pub(crate) unsafe fn add_current<'a>(
        &self,
        index: usize,
        delta: i64,
        arena: impl FnOnce() -> &'a Arena,
    ) -> Option<(usize, i64)> {
        // The common case first, straight-line: glibc's area, indexed by
        // CPU id, addressed through the thread pointer.
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        if self.fast_fs_offset != NO_FS_OFFSET {
            // SAFETY: `fast_fs_offset` is glibc's `__rseq_offset` in an
            // arena indexed by CPU id; the slot's region-0 address (`index`
            // from the caller) and `regions` describe this chunk; in an
            // rseq arena every write to a CPU's own copy is such a
            // sequence.
            let (cpu, new) = unsafe {
                super::rseq_ops::add_return_fs::<false>(
                    self.fast_fs_offset as isize,
                    self.ptr(index),
                    self.regions(),
                    delta,
                )
            };
            return (cpu < self.regions()).then_some((cpu, new));
        }
        // SAFETY: forwarded.
        unsafe { self.add_current_slow(arena(), index, delta) }
    }

    /// [`Row::add_current`] outside its common case, out of line so that
    /// callers inline only the common case (a caller's frame then saves no
    /// registers for paths it rarely takes).
    ///
    /// # Safety
    /// As for [`Row::add_current`].
    #[cold]
    #[inline(never)]
    unsafe fn add_current_slow(
        &self,
        arena: &Arena,
        index: usize,
        delta: i64,
    ) -> Option<(usize, i64)> {
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        if let Some(field) = arena.rseq_field() {
            let slot0 = self.ptr(index);
            let regions = self.regions();
            let (cpu, new) = match cpu::glibc_fs_offset() {
                // SAFETY: `offset` is glibc's `__rseq_offset`; the rest as
                // in `add_current`.
                Some(offset) if field == cpu::MM_CID_OFFSET => unsafe {
                    super::rseq_ops::add_return_fs::<true>(offset, slot0, regions, delta)
                },
                // SAFETY: as above.
                Some(offset) => unsafe {
                    super::rseq_ops::add_return_fs::<false>(offset, slot0, regions, delta)
                },
                None => {
                    let area = cpu::rseq_area()?;
                    // SAFETY: `area` is this thread's area (the sequence
                    // checks that it is registered); the slot's region-0
                    // address and `regions` describe this chunk; in an rseq
                    // arena every write to a CPU's own copy is such a
                    // sequence.
                    unsafe { super::rseq_ops::add_return(area, field, slot0, regions, delta) }
                }
            };
            return (cpu < regions).then_some((cpu, new));
        }
        let region = self.current_region(arena)?;
        // SAFETY: `current_region` is below the regions; `index` from the
        // caller.
        Some((region, unsafe { self.atomic_add(region, index, delta) }))
    }

    /// The region "this CPU" owns for the atomic path, if it has one.
    #[inline(always)]
    pub(super) fn current_region(&self, arena: &Arena) -> Option<usize> {
        let machine = arena.machine();
        let region = match arena.slot_index() {
            SlotIndex::MmCid if !machine.is_simulated() => match cpu::mm_cid() {
                Some(cid) => cid as usize,
                None => machine.current_cpu(),
            },
            _ => machine.current_cpu(),
        };
        (region < self.regions()).then_some(region)
    }

    /// Where slot `index`'s copies lie for a critical section written
    /// outside Rust (the C ABI's inline add): `(address of the copy of
    /// CPU 0, CPUs, glibc's __rseq_offset)` — CPU `c`'s copy is `c · 4096`
    /// bytes on — when every write to this arena's copies is an rseq
    /// sequence on glibc's area indexed by CPU id, the case the hot path
    /// itself takes straight-line (see `add_current`); else `None`.
    pub(crate) fn inline_add_layout(&self, index: usize) -> Option<(*mut i64, usize, isize)> {
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        if self.fast_fs_offset != NO_FS_OFFSET {
            return Some((
                self.ptr(index),
                self.regions(),
                self.fast_fs_offset as isize,
            ));
        }
        let _ = index;
        None
    }

    /// Sum of slot `index` over every copy, the overflow copy included
    /// (wrapping), with `load`'s ordering.
    ///
    /// # Safety
    /// As for [`Row::slot`] (every region up to the overflow one).
    #[inline]
    unsafe fn sum_with(&self, index: usize, order: crate::sync::Ordering) -> i64 {
        (0..=self.regions()).fold(0i64, |acc, region| {
            // SAFETY: every region up to the overflow one; `index` from the
            // caller.
            acc.wrapping_add(unsafe { self.slot(region, index) }.load(order))
        })
    }

    /// Sum of slot `index` over every copy (relaxed loads).
    ///
    /// # Safety
    /// As for [`Row::slot`].
    #[inline]
    pub(crate) unsafe fn sum(&self, index: usize) -> i64 {
        // SAFETY: forwarded.
        unsafe { self.sum_with(index, Relaxed) }
    }

    /// [`Row::sum`] with Acquire loads: a copy taken by a spill is only seen
    /// together with the spill's announcement.
    ///
    /// # Safety
    /// As for [`Row::slot`].
    #[inline]
    pub(crate) unsafe fn sum_acquire(&self, index: usize) -> i64 {
        // SAFETY: forwarded.
        unsafe { self.sum_with(index, Acquire) }
    }

    /// Zero the first `len` slots in every region, the overflow copy
    /// included, before they go back to the arena. Only non-zero slots are
    /// written: reading a page no CPU ever touched maps the shared zero
    /// page, while writing it would back it with memory (a tree on 65,536
    /// simulated CPUs cost 254 MiB to drop).
    ///
    /// # Safety
    /// As for [`Row::slot`] for every index below `len`; nothing else uses
    /// the slots now (the arena's lock, taken next, orders these stores
    /// before the next owner's first access).
    pub(super) unsafe fn zero(&self, len: usize) {
        for region in 0..=self.regions() {
            for i in 0..len {
                // SAFETY: every region and every slot of this allocation.
                let slot = unsafe { self.slot(region, i) };
                // Relaxed: see the contract.
                if slot.load(Relaxed) != 0 {
                    slot.store(0, Relaxed);
                }
            }
        }
    }
}
