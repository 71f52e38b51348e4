//! The per-CPU arena and its allocations. See the module docs of
//! [`crate::percpu`] and the diagram in `IMPLEMENTATION.md`.

#![allow(unsafe_code)]

use super::chunk::{Chunk, REGION_SLOTS};
use super::path::{self, AddPath, ArenaOptions, SlotIndex};
use super::row::Row;
use super::stripe::{Stripe, StripeAlloc, StripeKind};
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
use crate::cpu;
use crate::cpu::Machine;
use crate::sync::{
    lock, Arc, AtomicI64, Mutex,
    Ordering::{AcqRel, Relaxed},
};
use std::fmt;

/// Why an arena operation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArenaError {
    /// An allocation of zero slots.
    ZeroLength,
    /// An allocation larger than one chunk's region.
    TooLarge {
        /// Slots requested.
        len: usize,
        /// Largest allocation, [`REGION_SLOTS`].
        max: usize,
    },
    /// The operating system refused the memory for a new chunk.
    OutOfMemory {
        /// Bytes of the chunk that could not be mapped.
        bytes: usize,
    },
    /// A CPU index at or beyond the machine's CPU count.
    NoSuchCpu {
        /// The index given.
        cpu: usize,
        /// The machine's CPU count.
        cpus: usize,
    },
    /// A region count that does not fit the index: `MmCid` arenas take
    /// `1..=cpus` regions, `CpuId` arenas exactly `cpus`.
    BadRegions {
        /// The regions asked for.
        regions: usize,
        /// The machine's CPU count.
        cpus: usize,
    },
    /// A slot index at or beyond the allocation's length.
    NoSuchSlot {
        /// The index given.
        index: usize,
        /// The allocation's length.
        len: usize,
    },
}

impl fmt::Display for ArenaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArenaError::ZeroLength => write!(f, "a per-CPU allocation needs at least one slot"),
            ArenaError::TooLarge { len, max } => write!(
                f,
                "a per-CPU allocation of {len} slots exceeds the largest possible ({max})"
            ),
            ArenaError::OutOfMemory { bytes } => {
                write!(f, "could not map a per-CPU chunk of {bytes} bytes")
            }
            ArenaError::NoSuchCpu { cpu, cpus } => {
                write!(f, "CPU {cpu} does not exist on a machine of {cpus} CPUs")
            }
            ArenaError::BadRegions { regions, cpus } => write!(
                f,
                "{regions} regions do not fit a machine of {cpus} CPUs (CPU-id arenas take {cpus}, concurrency-id arenas 1 to {cpus})"
            ),
            ArenaError::NoSuchSlot { index, len } => {
                write!(
                    f,
                    "slot {index} is outside a per-CPU allocation of {len} slots"
                )
            }
        }
    }
}

impl std::error::Error for ArenaError {}

/// Where a spilling per-CPU step ([`PerCpu::add_spill_current`]) moves
/// what it takes: the shared total of a `percpu_counter`-like counter, or a
/// threshold count.
pub(crate) trait SpillTarget {
    /// A copy is about to be taken: from now until `end`, its units are in
    /// neither the copy nor the total.
    fn begin(&self);
    /// The spill took `taken` (possibly 0): add it to the total.
    fn end(&self, taken: i64);
    /// `delta` could not be added to this CPU's own copy: add it to the
    /// total instead.
    fn direct(&self, delta: i64);
}

/// Memory with one copy per CPU, handed out in [`PerCpu`] allocations.
///
/// Cheap to clone (all clones are the same arena). Allocation and freeing
/// take a lock; reading and updating slots never do.
///
/// ```
/// use splitcount::cpu::Machine;
/// use splitcount::raw::percpu::Arena;
///
/// let arena = Arena::new(&Machine::simulated(4, 1).unwrap());
/// let counter = arena.alloc(1).unwrap();
/// counter.add_on(2, 0, 5).unwrap();
/// counter.add_on(3, 0, -2).unwrap();
/// assert_eq!(counter.get(2, 0), Some(5));
/// assert_eq!(counter.sum(0), Some(3));
/// ```
#[derive(Clone)]
pub struct Arena {
    inner: Arc<Inner>,
}

struct Inner {
    machine: Machine,
    alloc: Mutex<Allocator>,
    /// Stripes for counters' shared items (see `stripe.rs`).
    stripes: Mutex<StripeAlloc>,
    /// Per-CPU (or per-concurrency-id) regions, the overflow region excluded.
    regions: usize,
    index: SlotIndex,
    /// Current-CPU adds are rseq critical sections (else relaxed atomics).
    rseq: bool,
}

/// A free range of slots inside one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Free {
    chunk: usize,
    start: usize,
    len: usize,
}

#[derive(Default)]
struct Allocator {
    /// Chunks never move nor go away before the arena does: allocations
    /// point straight at them (the box keeps a chunk still while the `Vec`
    /// grows).
    #[allow(clippy::vec_box)]
    chunks: Vec<Box<Chunk>>,
    /// Free ranges, sorted and coalesced.
    free: Vec<Free>,
    /// Slots currently allocated.
    used: usize,
}

impl Arena {
    /// An empty arena for `machine`'s CPUs with the default options
    /// (indexed by CPU id; rseq adds where available). Memory is mapped on
    /// the first allocation, one chunk at a time.
    pub fn new(machine: &Machine) -> Arena {
        Arena::with_options(machine, &ArenaOptions::default())
            .expect("the default options are valid for every machine")
    }

    /// An empty arena with explicit options: how current-CPU adds are made
    /// and which id picks "this CPU's" copy. See [`ArenaOptions`].
    pub fn with_options(machine: &Machine, options: &ArenaOptions) -> Result<Arena, ArenaError> {
        let cpus = machine.cpus();
        let regions = match (options.index, options.regions) {
            (_, Some(0)) => return Err(ArenaError::BadRegions { regions: 0, cpus }),
            (SlotIndex::MmCid, Some(r)) if r <= cpus => r,
            (_, Some(r)) if r != cpus => return Err(ArenaError::BadRegions { regions: r, cpus }),
            _ => cpus,
        };
        Ok(Arena {
            inner: Arc::new(Inner {
                machine: machine.clone(),
                alloc: Mutex::new(Allocator::default()),
                stripes: Mutex::new(StripeAlloc::default()),
                regions,
                index: options.index,
                rseq: path::resolve(machine, options),
            }),
        })
    }

    /// Whether current-CPU adds are rseq critical sections here (otherwise
    /// relaxed atomic read-modify-writes).
    pub fn add_path(&self) -> AddPath {
        if self.inner.rseq {
            AddPath::Rseq
        } else {
            AddPath::Atomic
        }
    }

    /// Which id picks the current CPU's copy.
    pub fn slot_index(&self) -> SlotIndex {
        self.inner.index
    }

    /// Number of per-CPU (or per-concurrency-id) copies of each slot, not
    /// counting the shared overflow copy.
    pub fn regions(&self) -> usize {
        self.inner.regions
    }

    /// The process-wide arena for the host machine, shared by every per-CPU
    /// structure that is not given an arena of its own.
    #[cfg(not(loom))]
    pub fn host() -> &'static Arena {
        static HOST: std::sync::OnceLock<Arena> = std::sync::OnceLock::new();
        HOST.get_or_init(|| Arena::new(&Machine::host()))
    }

    /// The machine whose CPUs this arena covers.
    pub fn machine(&self) -> &Machine {
        &self.inner.machine
    }

    /// Reserve `len` contiguous slots at the same offset in every CPU's
    /// region, all zero. Freed slots are reused before new chunks are mapped.
    pub fn alloc(&self, len: usize) -> Result<PerCpu, ArenaError> {
        let (at, row) = self.alloc_range(len)?;
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        let rseq_field = self.rseq_field().unwrap_or(0);
        Ok(PerCpu {
            arena: self.clone(),
            row,
            chunk_index: at.chunk,
            start: at.start,
            len,
            #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
            rseq_field,
        })
    }

    /// One slot in every CPU's region, all zero, as a bare [`Row`]: the
    /// owner keeps this arena alive while it uses the row and gives it back
    /// with [`Arena::free_row`].
    pub(crate) fn alloc_row(&self) -> Result<Row, ArenaError> {
        Ok(self.alloc_range(1)?.1)
    }

    /// Give back a row from [`Arena::alloc_row`], zeroed where written.
    ///
    /// # Safety
    /// `row` came from this arena's `alloc_row`, is given back once, and no
    /// reference into it remains.
    pub(crate) unsafe fn free_row(&self, row: Row) {
        // SAFETY: the row's one slot, in every region (the caller's
        // contract).
        unsafe { row.zero(1) };
        let mut a = lock(&self.inner.alloc);
        let at = row.slot0() as usize;
        let size = std::mem::size_of::<AtomicI64>();
        let found = a.chunks.iter().enumerate().find_map(|(chunk, c)| {
            // SAFETY: region 0, slot 0 of a live chunk.
            let base = unsafe { c.slot(0, 0) } as *const AtomicI64 as usize;
            (base..base + REGION_SLOTS * size)
                .contains(&at)
                .then(|| (chunk, (at - base) / size))
        });
        match found {
            Some((chunk, start)) => a.release(Free {
                chunk,
                start,
                len: 1,
            }),
            None => debug_assert!(false, "a row of another arena"),
        }
    }

    /// The byte offset of the id field (`cpu_id` or `mm_cid`) in an rseq
    /// area, for an rseq arena; `None` for an atomic one.
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    pub(crate) fn rseq_field(&self) -> Option<usize> {
        match (self.inner.rseq, self.inner.index) {
            (false, _) => None,
            (true, SlotIndex::CpuId) => Some(cpu::CPU_ID_OFFSET),
            (true, SlotIndex::MmCid) => Some(cpu::MM_CID_OFFSET),
        }
    }

    /// Whether updates may name a CPU other than the caller's: false in
    /// rseq arenas, whose per-CPU copies belong to critical sections
    /// running on their CPU.
    #[inline]
    pub(crate) fn remote_writes_allowed(&self) -> bool {
        !self.inner.rseq
    }

    /// Whether `other` is this arena (a clone of it).
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn same(&self, other: &Arena) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// `len` contiguous free slots, zero in every region, and their row.
    fn alloc_range(&self, len: usize) -> Result<(Free, Row), ArenaError> {
        if len == 0 {
            return Err(ArenaError::ZeroLength);
        }
        if len > REGION_SLOTS {
            return Err(ArenaError::TooLarge {
                len,
                max: REGION_SLOTS,
            });
        }
        let mut a = lock(&self.inner.alloc);
        let at = match a.free.iter().position(|f| f.len >= len) {
            Some(i) => {
                let f = a.free[i];
                if f.len == len {
                    a.free.remove(i);
                } else {
                    a.free[i] = Free {
                        start: f.start + len,
                        len: f.len - len,
                        ..f
                    };
                }
                Free { len, ..f }
            }
            None => {
                let inner = &self.inner;
                let place = inner.index == SlotIndex::CpuId;
                let chunk = Chunk::new(inner.regions, &inner.machine, place).ok_or(
                    ArenaError::OutOfMemory {
                        bytes: (inner.regions + 1).saturating_mul(super::REGION_BYTES),
                    },
                )?;
                a.chunks.push(Box::new(chunk));
                let chunk = a.chunks.len() - 1;
                if len < REGION_SLOTS {
                    a.free.push(Free {
                        chunk,
                        start: len,
                        len: REGION_SLOTS - len,
                    });
                }
                Free {
                    chunk,
                    start: 0,
                    len,
                }
            }
        };
        a.used += len;
        // SAFETY: the chunk is alive (the arena owns it and never moves
        // it); region 0 exists and `at.start < REGION_SLOTS`.
        let slot0 = unsafe { a.chunks[at.chunk].slot_ptr(0, at.start) };
        Ok((at, Row::new(slot0, self)))
    }

    /// A zeroed set of stripes, one of each of `kinds`: one slot at the
    /// same index in regions `0, 2^s, 2·2^s, …` of each member's part of a
    /// chunk of sets of those kinds, for the shared items of a counter (see
    /// `stripe.rs`). The set is one pointer: member `m`'s region `r` is
    /// [`Stripe::member`]`(m, regions, r)`. Freed with
    /// [`Arena::free_stripes`] (same kinds) by its owner, which must keep
    /// the arena alive while it uses the set.
    pub(crate) fn alloc_stripes(&self, kinds: &[StripeKind]) -> Result<Stripe, ArenaError> {
        let inner = &self.inner;
        lock(&inner.stripes)
            .alloc(inner.regions, &inner.machine, kinds)
            .ok_or(ArenaError::OutOfMemory {
                bytes: (inner.regions * kinds.len().max(1) + 1).saturating_mul(super::REGION_BYTES),
            })
    }

    /// Free a set of stripes.
    ///
    /// # Safety
    /// `stripe` came from this arena's [`Arena::alloc_stripes`] with
    /// `kinds`, is freed once, and no reference into it remains.
    pub(crate) unsafe fn free_stripes(&self, stripe: Stripe, kinds: &[StripeKind]) {
        // SAFETY: forwarded.
        unsafe { lock(&self.inner.stripes).free(self.inner.regions, stripe, kinds) }
    }

    /// Slots that counters' shared items (tree items, root accumulators)
    /// hold, 8 bytes each: a stripe counts one per region it uses.
    pub fn stripe_slots_in_use(&self) -> usize {
        lock(&self.inner.stripes).slots
    }

    /// Slots currently allocated (per CPU).
    pub fn slots_in_use(&self) -> usize {
        lock(&self.inner.alloc).used
    }

    /// Chunks mapped so far.
    pub fn chunks(&self) -> usize {
        lock(&self.inner.alloc).chunks.len()
    }
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("machine", &self.inner.machine)
            .field("chunks", &self.chunks())
            .field("slots_in_use", &self.slots_in_use())
            .finish()
    }
}

impl Allocator {
    /// Return a range to the free list, merging it with its neighbours.
    fn release(&mut self, r: Free) {
        self.used -= r.len;
        let i = self.free.partition_point(|f| *f < r);
        self.free.insert(i, r);
        if i + 1 < self.free.len() {
            let (a, b) = (self.free[i], self.free[i + 1]);
            if a.chunk == b.chunk && a.start + a.len == b.start {
                self.free[i].len += b.len;
                self.free.remove(i + 1);
            }
        }
        if i > 0 {
            let (a, b) = (self.free[i - 1], self.free[i]);
            if a.chunk == b.chunk && a.start + a.len == b.start {
                self.free[i - 1].len += b.len;
                self.free.remove(i);
            }
        }
    }
}

/// `len` slots with one copy per CPU, allocated from an [`Arena`]; freed
/// (zeroed and returned to the arena) on drop.
///
/// Current-CPU adds are rseq critical sections where the arena uses them,
/// otherwise relaxed atomic read-modify-writes on *some* CPU's copy: a thread
/// that migrates between reading its CPU id and updating merely updates the
/// copy of the CPU it left. Either way the sum over all copies — the value
/// every reader uses — never loses an update.
///
/// Besides one copy per CPU there is a shared *overflow* copy, updated only
/// atomically and included in every sum. It takes the updates that cannot be
/// made on a CPU's own copy: in an rseq arena, updates named for another CPU
/// ([`PerCpu::add_on`]) and adds from threads without an rseq area; in a
/// concurrency-id arena, ids beyond its regions. Sums wrap on `i64`
/// overflow; the layers above bound their values.
pub struct PerCpu {
    arena: Arena,
    /// Where the slots lie, and the hot path's data.
    row: Row,
    chunk_index: usize,
    start: usize,
    len: usize,
    /// For rseq arenas, the byte offset of the id field (`cpu_id` or
    /// `mm_cid`) in the rseq area; 0 for atomic arenas. Kept here, beside
    /// `row`, so the spilling step reads only this handle.
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    rseq_field: usize,
}

// SAFETY: `row` points to atomics owned by the arena that `self.arena`
// keeps alive; all access through it is atomic.
unsafe impl Send for PerCpu {}
// SAFETY: as above; `&PerCpu` only exposes atomic operations.
unsafe impl Sync for PerCpu {}

impl PerCpu {
    /// Number of slots (per CPU).
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: allocations have at least one slot.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of per-CPU copies of each slot (the CPU count, or the regions
    /// of a concurrency-id arena), not counting the overflow copy.
    #[inline]
    pub fn cpus(&self) -> usize {
        self.row.regions()
    }

    /// The machine whose CPUs the copies belong to.
    #[inline]
    pub fn machine(&self) -> &Machine {
        &self.arena.inner.machine
    }

    /// The arena this allocation came from.
    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// Slot `index` of region `region` (`region == cpus()` is the overflow
    /// copy), unchecked except in debug builds.
    ///
    /// # Safety
    /// `region <= self.cpus()` and `index < self.len()`. Out of range, the
    /// address is another allocation's slot or outside the chunk: every
    /// in-crate caller either validated both or derives them from this
    /// handle (`self.cpus()`, a CPU id checked against it).
    #[inline(always)]
    pub(crate) unsafe fn slot(&self, region: usize, index: usize) -> &AtomicI64 {
        // SAFETY: the arena (kept alive by `self.arena`) owns the chunk;
        // `region` and `index` within this allocation (the caller's bounds).
        unsafe { &*self.slot_ptr(region, index) }
    }

    /// [`PerCpu::slot`] as a raw pointer whose provenance covers the whole
    /// allocation in that region: slots `index..len` of `region` may be
    /// read through it as one slice.
    ///
    /// # Safety
    /// As for [`PerCpu::slot`].
    #[inline(always)]
    pub(crate) unsafe fn slot_ptr(&self, region: usize, index: usize) -> *const AtomicI64 {
        debug_assert!(index < self.len);
        // SAFETY: as in `slot`.
        unsafe { self.row.slot_ptr(region, index) }
    }

    /// Slot `index` of region `region`, or `None` out of range.
    #[inline]
    fn slot_checked(&self, region: usize, index: usize) -> Option<&AtomicI64> {
        // SAFETY: both bounds checked just before.
        (region <= self.cpus() && index < self.len).then(|| unsafe { self.slot(region, index) })
    }

    fn check(&self, cpu: usize, index: usize) -> Result<(), ArenaError> {
        if cpu >= self.cpus() {
            return Err(ArenaError::NoSuchCpu {
                cpu,
                cpus: self.cpus(),
            });
        }
        if index >= self.len {
            return Err(ArenaError::NoSuchSlot {
                index,
                len: self.len,
            });
        }
        Ok(())
    }

    /// Whether updates may name a CPU other than the caller's
    /// ([`PerCpu::atomic_add`] on a CPU's own copy). False in rseq arenas,
    /// whose per-CPU copies belong to critical sections running on their CPU.
    #[inline]
    pub(crate) fn remote_writes_allowed(&self) -> bool {
        self.arena.remote_writes_allowed()
    }

    /// Add `delta` to slot `index` of the current CPU's copy and return the
    /// new value of the copy that was updated (the overflow copy's when this
    /// thread cannot update its CPU's own).
    #[inline(always)]
    pub fn add(&self, index: usize, delta: i64) -> Result<i64, ArenaError> {
        self.check(0, index)?;
        // SAFETY: `index` checked just above.
        Ok(match unsafe { self.add_current(index, delta) } {
            Some((_, new)) => new,
            // SAFETY: the overflow region, and `index` checked above.
            None => unsafe { self.atomic_add(self.cpus(), index, delta) },
        })
    }

    /// Add `delta` to slot `index` "on" CPU `cpu` and return the new value of
    /// the copy that was updated: CPU `cpu`'s own copy, or — in an rseq
    /// arena, where only critical sections running on `cpu` may write it —
    /// the overflow copy. Either way every sum sees the update.
    #[inline]
    pub fn add_on(&self, cpu: usize, index: usize, delta: i64) -> Result<i64, ArenaError> {
        self.check(cpu, index)?;
        let region = if self.remote_writes_allowed() {
            cpu
        } else {
            self.cpus()
        };
        // SAFETY: `cpu < regions` and `index < len` checked above.
        Ok(unsafe { self.atomic_add(region, index, delta) })
    }

    /// Relaxed `fetch_add` on one region's copy; returns the new value.
    ///
    /// # Safety
    /// As for [`PerCpu::slot`]: `region <= self.cpus()`, `index < self.len()`.
    #[inline(always)]
    pub(crate) unsafe fn atomic_add(&self, region: usize, index: usize, delta: i64) -> i64 {
        debug_assert!(index < self.len);
        // SAFETY: forwarded from the caller.
        unsafe { self.row.atomic_add(region, index, delta) }
    }

    /// Add `delta` to slot `index` of the current CPU's own copy and return
    /// `(cpu, new value)`; `None` when this thread cannot update its CPU's
    /// copy (no registered rseq area in an rseq arena, or an id beyond the
    /// regions) — the caller then accounts the delta elsewhere.
    ///
    /// # Safety
    /// `index < self.len()`.
    #[inline(always)]
    pub(crate) unsafe fn add_current(&self, index: usize, delta: i64) -> Option<(usize, i64)> {
        // SAFETY: `index` from the caller; the row is this arena's.
        unsafe { self.row.add_current(index, delta, || &self.arena) }
    }

    /// The kernel's `percpu_counter` step on the current CPU's copy: add
    /// `delta`; if the new value reaches `|v| ≥ batch`, take the whole copy
    /// (leaving 0) and hand it to `target` — announcing the spill with
    /// [`SpillTarget::begin`] *before* the copy is taken, so that readers
    /// summing the copies and the total can wait for it to land. A thread
    /// that cannot update its CPU's own copy hands `delta` to
    /// [`SpillTarget::direct`].
    ///
    /// With rseq, the add that would spill is first left uncommitted; the
    /// spill is announced and the step run again, armed, on whatever CPU
    /// the thread runs on by then (nothing was written on the first try, so
    /// a migration in between leaves no copy at or above the batch).
    ///
    /// # Safety
    /// `index < self.len()`.
    #[inline(always)]
    pub(crate) unsafe fn add_spill_current(
        &self,
        index: usize,
        delta: i64,
        batch: u64,
        target: &impl SpillTarget,
    ) {
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        if self.rseq_field != 0 {
            use super::rseq_ops::{add_spill, SpillStep};
            let Some(area) = cpu::rseq_area() else {
                return target.direct(delta);
            };
            // SAFETY: as in `add_current` (both calls).
            let step = |armed| unsafe {
                add_spill(
                    area,
                    self.rseq_field,
                    self.row.ptr(index),
                    self.cpus(),
                    delta,
                    batch,
                    armed,
                )
            };
            match step(false) {
                SpillStep::Added => {}
                SpillStep::Unavailable => target.direct(delta),
                SpillStep::Taken(_) => unreachable!("an unarmed step never takes"),
                SpillStep::MustArm => {
                    target.begin();
                    match step(true) {
                        SpillStep::Taken(taken) => target.end(taken),
                        SpillStep::Added => target.end(0),
                        // Moved to a region this thread cannot write: the
                        // delta goes to the total, inside the announced spill.
                        _ => target.end(delta),
                    }
                }
            }
            return;
        }
        match self.row.current_region(&self.arena) {
            // SAFETY: `current_region` is below the regions; `index` from the
            // caller.
            Some(region) => unsafe { self.atomic_add_spill(region, index, delta, batch, target) },
            None => target.direct(delta),
        }
    }

    /// The atomic form of the spill step on one region's copy: `fetch_add`,
    /// and when the result reaches `|v| ≥ batch`, announce the spill and
    /// swap the copy with 0. The swap takes whatever is there — adds that
    /// raced in since included — so each unit moves exactly once.
    ///
    /// # Safety
    /// As for [`PerCpu::slot`].
    #[inline(always)]
    pub(crate) unsafe fn atomic_add_spill(
        &self,
        region: usize,
        index: usize,
        delta: i64,
        batch: u64,
        target: &impl SpillTarget,
    ) {
        // SAFETY: forwarded from the caller (both calls).
        let new = unsafe { self.atomic_add(region, index, delta) };
        if new.unsigned_abs() >= batch {
            target.begin();
            // Release: a reader that sees the copy taken (Acquire) also sees
            // the spill announced, and so waits for it (see `Spills`).
            let taken = unsafe { self.slot(region, index) }.swap(0, AcqRel);
            target.end(taken);
        }
    }

    /// [`PerCpu::sum_unchecked`] with Acquire loads: a copy taken by a spill
    /// is only seen together with the spill's announcement.
    ///
    /// # Safety
    /// `index < self.len()`.
    #[inline]
    pub(crate) unsafe fn sum_acquire(&self, index: usize) -> i64 {
        // SAFETY: forwarded.
        unsafe { self.row.sum_acquire(index) }
    }

    /// Slot `index` of CPU `cpu`'s own copy, or `None` if either is out of
    /// range.
    pub fn get(&self, cpu: usize, index: usize) -> Option<i64> {
        self.check(cpu, index).ok()?;
        Some(self.slot_checked(cpu, index)?.load(Relaxed))
    }

    /// Slot `index` of the shared overflow copy, or `None` if out of range.
    pub fn overflow(&self, index: usize) -> Option<i64> {
        Some(self.slot_checked(self.cpus(), index)?.load(Relaxed))
    }

    /// Sum of slot `index` over every copy, the overflow copy included
    /// (wrapping), or `None` if `index` is out of range. Exact when no add is
    /// in flight; otherwise some in-flight adds may or may not be counted,
    /// none is counted twice.
    pub fn sum(&self, index: usize) -> Option<i64> {
        // SAFETY: `index` checked first.
        (index < self.len).then(|| unsafe { self.sum_unchecked(index) })
    }

    /// [`PerCpu::sum`] without the range check.
    ///
    /// # Safety
    /// `index < self.len()`.
    #[inline]
    pub(crate) unsafe fn sum_unchecked(&self, index: usize) -> i64 {
        // SAFETY: forwarded.
        unsafe { self.row.sum(index) }
    }
}

impl Drop for PerCpu {
    fn drop(&mut self) {
        // SAFETY: every slot of this allocation; nobody else can hold
        // `&self` now, so no add races with the zeroing, and the lock orders
        // it before the next owner's first access.
        unsafe { self.row.zero(self.len) };
        lock(&self.arena.inner.alloc).release(Free {
            chunk: self.chunk_index,
            start: self.start,
            len: self.len,
        });
    }
}

impl fmt::Debug for PerCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PerCpu")
            .field("chunk", &self.chunk_index)
            .field("start", &self.start)
            .field("len", &self.len)
            .field("regions", &self.cpus())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sim(cpus: usize) -> Arena {
        Arena::new(&Machine::simulated(cpus, 1).unwrap())
    }

    #[test]
    fn every_cpu_gets_its_own_copy() {
        let a = sim(8);
        let p = a.alloc(2).unwrap();
        for cpu in 0..8 {
            p.add_on(cpu, 1, cpu as i64 + 1).unwrap();
        }
        assert_eq!(p.sum(0), Some(0));
        assert_eq!(p.sum(1), Some(36));
        assert_eq!(p.get(7, 1), Some(8));
    }

    #[test]
    fn copies_of_different_cpus_never_share_a_cache_line() {
        let a = sim(4);
        let p = a.alloc(REGION_SLOTS).unwrap();
        let addr = |cpu, i| p.slot_checked(cpu, i).unwrap() as *const _ as usize;
        for cpu in 0..3 {
            let last_of_this = addr(cpu, REGION_SLOTS - 1);
            let first_of_next = addr(cpu + 1, 0);
            assert!(first_of_next / 128 > last_of_this / 128);
        }
        assert_eq!(addr(0, 0) % 4096, 0, "regions are page-aligned");
    }

    #[test]
    fn allocations_reserve_the_same_offset_on_every_cpu() {
        let a = sim(3);
        let p = a.alloc(3).unwrap();
        let q = a.alloc(5).unwrap();
        let base = |x: &PerCpu, cpu| x.slot_checked(cpu, 0).unwrap() as *const _ as usize;
        for cpu in 0..3 {
            assert_eq!(base(&q, cpu) - base(&p, cpu), 3 * 8);
        }
    }

    #[test]
    fn freed_slots_are_reused_zeroed() {
        let a = sim(4);
        let p = a.alloc(4).unwrap();
        for cpu in 0..4 {
            for i in 0..4 {
                p.add_on(cpu, i, 99).unwrap();
            }
        }
        let where_p = p.slot_checked(0, 0).unwrap() as *const _ as usize;
        drop(p);
        let q = a.alloc(4).unwrap();
        assert_eq!(
            q.slot_checked(0, 0).unwrap() as *const _ as usize,
            where_p,
            "reused"
        );
        for i in 0..4 {
            assert_eq!(q.sum(i), Some(0));
        }
        assert_eq!(a.slots_in_use(), 4);
    }

    #[test]
    fn free_ranges_coalesce_so_a_large_allocation_fits_again() {
        let a = sim(2);
        let parts: Vec<_> = (0..REGION_SLOTS / 8).map(|_| a.alloc(8).unwrap()).collect();
        assert_eq!(a.chunks(), 1);
        drop(parts);
        let whole = a.alloc(REGION_SLOTS).unwrap();
        assert_eq!(a.chunks(), 1, "the freed pieces merged back into one range");
        assert_eq!(whole.len(), REGION_SLOTS);
    }

    #[test]
    fn the_arena_grows_by_chunks_without_moving_live_slots() {
        let a = sim(2);
        let first = a.alloc(1).unwrap();
        first.add_on(1, 0, 7).unwrap();
        let before = first.slot_checked(1, 0).unwrap() as *const _ as usize;
        let many: Vec<_> = (0..3 * REGION_SLOTS).map(|_| a.alloc(1).unwrap()).collect();
        assert!(a.chunks() >= 4);
        assert_eq!(
            first.slot_checked(1, 0).unwrap() as *const _ as usize,
            before
        );
        assert_eq!(first.get(1, 0), Some(7));
        assert_eq!(a.slots_in_use(), many.len() + 1);
    }

    #[test]
    fn bad_requests_are_errors() {
        let a = sim(2);
        assert_eq!(a.alloc(0).unwrap_err(), ArenaError::ZeroLength);
        assert!(matches!(
            a.alloc(REGION_SLOTS + 1),
            Err(ArenaError::TooLarge { .. })
        ));
        let p = a.alloc(2).unwrap();
        assert_eq!(
            p.add_on(2, 0, 1),
            Err(ArenaError::NoSuchCpu { cpu: 2, cpus: 2 })
        );
        assert_eq!(
            p.add_on(0, 2, 1),
            Err(ArenaError::NoSuchSlot { index: 2, len: 2 })
        );
        assert_eq!(p.get(5, 0), None);
        assert_eq!(p.sum(9), None);
    }

    #[test]
    fn add_on_the_current_cpu_of_a_simulated_machine() {
        let m = Machine::simulated(16, 2).unwrap();
        let a = Arena::new(&m);
        let p = a.alloc(1).unwrap();
        m.set_current_cpu(11).unwrap();
        assert_eq!(p.add(0, 4).unwrap(), 4);
        assert_eq!(p.get(11, 0), Some(4));
    }

    /// A tree's parts: a bare row and a stripe set, reached from one
    /// pointer each across regions and members (run under Miri, which
    /// checks the pointers may reach that far), given back zeroed.
    #[test]
    fn a_row_and_a_stripe_set_reach_every_region_and_go_back_zeroed() {
        let a = sim(4);
        let row = a.alloc_row().unwrap();
        for region in 0..=4 {
            // SAFETY: every region of a live one-slot row.
            unsafe { row.atomic_add(region, 0, region as i64 + 1) };
        }
        // SAFETY: as above.
        assert_eq!(unsafe { row.sum(0) }, 15);
        let kinds = [
            StripeKind {
                stride: 1,
                order: 0,
            },
            StripeKind {
                stride: u32::MAX,
                order: 2,
            },
        ];
        let set = a.alloc_stripes(&kinds).unwrap();
        // SAFETY (both): regions the members' kinds use, of a live set.
        unsafe { set.at(Stripe::member(0, 4, 2)) }.fetch_add(5, Relaxed);
        unsafe { set.at(Stripe::member(1, 4, 0)) }.fetch_add(7, Relaxed);
        assert_eq!(a.stripe_slots_in_use(), 2 + 1);
        // SAFETY: allocated here with these kinds, freed once, unused after.
        unsafe {
            a.free_stripes(set, &kinds);
            a.free_row(row);
        }
        assert_eq!((a.slots_in_use(), a.stripe_slots_in_use()), (0, 0));
        let (row, again) = (a.alloc_row().unwrap(), a.alloc_stripes(&kinds).unwrap());
        assert_eq!(again, set, "reused");
        // SAFETY: as above.
        unsafe {
            assert_eq!(row.sum(0), 0);
            assert_eq!(again.at(Stripe::member(0, 4, 2)).load(Relaxed), 0);
            assert_eq!(again.at(Stripe::member(1, 4, 0)).load(Relaxed), 0);
            a.free_stripes(again, &kinds);
            a.free_row(row);
        }
    }

    #[test]
    fn sums_wrap_instead_of_panicking() {
        let a = sim(2);
        let p = a.alloc(1).unwrap();
        p.add_on(0, 0, i64::MAX).unwrap();
        p.add_on(1, 0, 1).unwrap();
        assert_eq!(p.sum(0), Some(i64::MIN));
    }
}
