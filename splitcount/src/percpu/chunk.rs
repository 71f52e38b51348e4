//! One chunk of per-CPU memory: `regions + 1` regions of [`REGION_BYTES`]
//! each — one per CPU (or concurrency id), the region of CPU `c` starting at
//! `c · REGION_BYTES`, and a last, shared *overflow* region for updates that
//! cannot be made on a CPU's own copy (see `arena.rs`).
//!
//! Regions are page-sized and page-aligned, so two CPUs never write the same
//! cache line (nor the same page, which is what lets `mbind` place each
//! region on its CPU's NUMA node). The memory comes from an anonymous `mmap`:
//! untouched regions — CPUs that never run the program, slots never written —
//! cost no physical memory, and everything starts zeroed.
//!
//! Under `--cfg loom` a chunk is a boxed slice of loom atomics instead, with
//! tiny regions, so that models stay small.

#![allow(unsafe_code)]

use crate::cpu::Machine;
use crate::sync::AtomicI64;

/// Bytes of one CPU's region in one chunk.
#[cfg(not(loom))]
pub const REGION_BYTES: usize = 4096;
/// Bytes of one CPU's region in one chunk (tiny under loom).
#[cfg(loom)]
pub const REGION_BYTES: usize = 32;

/// Slots (`i64`) in one CPU's region of one chunk: the largest allocation.
pub const REGION_SLOTS: usize = REGION_BYTES / std::mem::size_of::<i64>();

/// The memory of one chunk. See the module docs.
pub(crate) struct Chunk {
    /// Regions including the overflow region.
    regions: usize,
    #[cfg(all(unix, not(loom)))]
    base: std::ptr::NonNull<AtomicI64>,
    #[cfg(any(not(unix), loom))]
    slots: Box<[AtomicI64]>,
}

// SAFETY: a chunk is only atomics (in memory it owns); sharing it across
// threads is as safe as sharing a slice of atomics.
unsafe impl Send for Chunk {}
// SAFETY: as above.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// Map a zeroed chunk of `regions` regions plus the overflow region;
    /// with `place`, region `c` prefers the NUMA node of `machine`'s CPU `c`.
    /// `None` when the memory cannot be had.
    #[cfg(all(unix, not(loom)))]
    pub(crate) fn new(regions: usize, machine: &Machine, place: bool) -> Option<Chunk> {
        let regions = regions.checked_add(1)?;
        let bytes = regions.checked_mul(REGION_BYTES)?;
        // `MAP_NORESERVE`: untouched regions are not counted against the
        // commit limit either. Miri emulates only `MAP_PRIVATE |
        // MAP_ANONYMOUS`; the flag changes nothing it could check.
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        #[cfg(not(miri))]
        let flags = flags | libc::MAP_NORESERVE;
        // SAFETY: an anonymous private mapping has no preconditions; the
        // result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        if place && !machine.is_simulated() && machine.topology().nodes() > 1 {
            place_regions_on_nodes(ptr.cast(), machine);
        }
        Some(Chunk {
            regions,
            base: std::ptr::NonNull::new(ptr.cast())?,
        })
    }

    /// Allocate a zeroed chunk (loom models and non-Unix systems).
    #[cfg(any(not(unix), loom))]
    pub(crate) fn new(regions: usize, _machine: &Machine, _place: bool) -> Option<Chunk> {
        let regions = regions.checked_add(1)?;
        let n = regions.checked_mul(REGION_SLOTS)?;
        Some(Chunk {
            regions,
            slots: (0..n).map(|_| AtomicI64::new(0)).collect(),
        })
    }

    /// A pointer to slot `index` of region `region` that may reach every
    /// slot of the chunk (its provenance is the chunk's, not one slot's):
    /// what a [`super::Row`] or a stripe keeps and offsets by regions.
    ///
    /// # Safety
    /// As for [`Chunk::slot`].
    #[inline(always)]
    pub(crate) unsafe fn slot_ptr(
        &self,
        region: usize,
        index: usize,
    ) -> std::ptr::NonNull<AtomicI64> {
        debug_assert!(region < self.regions && index < REGION_SLOTS);
        let at = region * REGION_SLOTS + index;
        #[cfg(all(unix, not(loom)))]
        {
            // SAFETY: `at` is inside the mapping (the caller's bounds); no
            // reference is made, so the pointer keeps the mapping's
            // provenance.
            unsafe { self.base.add(at) }
        }
        #[cfg(any(not(unix), loom))]
        {
            // SAFETY: `at` is inside the slice (the caller's bounds); the
            // slice's pointer covers all of it.
            unsafe { std::ptr::NonNull::new_unchecked(self.slots.as_ptr().add(at).cast_mut()) }
        }
    }

    /// The slot `index` of region `region`.
    ///
    /// # Safety
    /// `region` must be below the chunk's regions (the overflow region
    /// included) and `index` below [`REGION_SLOTS`]. Only the arena's
    /// handles call this, with indices they own; the bounds are checked in
    /// debug builds.
    #[inline(always)]
    pub(crate) unsafe fn slot(&self, region: usize, index: usize) -> &AtomicI64 {
        debug_assert!(region < self.regions && index < REGION_SLOTS);
        let at = region * REGION_SLOTS + index;
        #[cfg(all(unix, not(loom)))]
        {
            // SAFETY: `at` is inside the mapping (the caller's bounds); the
            // mapping lives as long as `self`; zeroed memory is a valid
            // `AtomicI64`.
            unsafe { &*self.base.as_ptr().add(at) }
        }
        #[cfg(any(not(unix), loom))]
        {
            &self.slots[at]
        }
    }
}

#[cfg(all(unix, not(loom)))]
impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`; no reference
        // into it outlives the chunk (handles keep the arena, and so the
        // chunk, alive).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.regions * REGION_BYTES);
        }
    }
}

/// Ask the kernel to back each CPU's region with memory of that CPU's node
/// (`MPOL_PREFERRED`, so an exhausted node still falls back elsewhere).
/// Best effort: a kernel without NUMA support leaves first-touch placement.
#[cfg(all(unix, not(loom)))]
fn place_regions_on_nodes(base: *mut u8, machine: &Machine) {
    #[cfg(target_os = "linux")]
    {
        let topo = machine.topology();
        for cpu in 0..machine.cpus() {
            let Some(node) = topo.node_id(topo.node_of(cpu)) else {
                continue;
            };
            let node = node as usize;
            let mut mask = vec![0u64; node / 64 + 1];
            mask[node / 64] |= 1 << (node % 64);
            // SAFETY: the range is one page of our own fresh mapping; mbind
            // only changes its placement policy.
            unsafe {
                libc::syscall(
                    libc::SYS_mbind,
                    base.add(cpu * REGION_BYTES),
                    REGION_BYTES,
                    libc::MPOL_PREFERRED,
                    mask.as_ptr(),
                    mask.len() * 64 + 1,
                    0u32,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (base, machine);
}
