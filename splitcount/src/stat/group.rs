//! [`StatGroup`]: one group's statistics — per-CPU deltas, the per-CPU
//! "updated" marks, the flush threshold, and the folded values.

use super::schema::{StatError, StatKind};
use super::stats::Stats;
use crate::percpu::PerCpu;
use crate::sync::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::sync::Arc;

/// Per-CPU deltas a CPU accumulates before they count towards its group's
/// (and ancestors') `stats_updates` (the kernel's `MEMCG_CHARGE_BATCH`).
pub const STAT_BATCH: u64 = 64;

/// A group's entry in one CPU's lock-free update list.
pub(crate) struct UpdateNode {
    pub(crate) next: AtomicPtr<UpdateNode>,
    /// On this CPU's list (or being pushed). Set only by the CAS winner,
    /// cleared only by the flusher.
    pub(crate) on_list: AtomicBool,
    /// The group owning this node (a strong reference is held for it while
    /// the node is on a list: the push's, or the one the flusher keeps).
    pub(crate) owner: *const StatGroup,
    /// Where the flusher's kept set for this CPU holds this node's strong
    /// reference ([`NOT_KEPT`]: nowhere, so a push takes one). Written by
    /// the flusher only, under the flush lock; set or cleared only while
    /// the list holds the mark (before the flusher clears `on_list` with
    /// `Release`), an index changed for another at any time; read by the
    /// push's CAS winner (after its `Acquire` on `on_list`). See
    /// `flush.rs`, *Kept references*.
    pub(crate) kept_at: AtomicUsize,
    /// Carried on this CPU to a later flush for its `pending` (a flush of
    /// a child passed deltas up to it): it holds a fold not done yet.
    /// Written by the flusher only, on that rare path; read by
    /// [`StatGroup::has_unfolded`].
    pub(crate) queued: AtomicBool,
}

/// [`UpdateNode::kept_at`] of a node whose reference is not kept.
pub(crate) const NOT_KEPT: usize = usize::MAX;

/// One cache line of folded values (see `StatGroup::folded_inline`).
#[repr(align(64))]
pub(crate) struct FoldedLine(
    // Read as part of one run of atomics (`StatGroup::folded_values`).
    #[allow(dead_code)] [AtomicI64; FOLDED_PER_LINE],
);

/// Folded values per [`FoldedLine`].
pub(crate) const FOLDED_PER_LINE: usize = 8;

/// Lines of folded values kept inside the [`StatGroup`] itself: enough for
/// five items (`3k ≤ 16`). A schema with more items keeps them all in an
/// allocation of their own instead.
pub(crate) const INLINE_FOLDED_LINES: usize = 2;

/// A counter on a cache line of its own: 64 bytes, the line, where
/// `CachePadded` rounds to the pair of lines x86-64's spatial prefetcher
/// fetches together (the counter is written once per 64 updates of a CPU,
/// the line beside it by the flusher alone: a pair shared by prefetches is
/// not worth a line per group); 128 bytes where lines may be that long
/// (aarch64, powerpc64), 256 on s390x.
#[cfg_attr(
    not(any(
        target_arch = "aarch64",
        target_arch = "powerpc64",
        target_arch = "s390x"
    )),
    repr(align(64))
)]
#[cfg_attr(
    any(target_arch = "aarch64", target_arch = "powerpc64"),
    repr(align(128))
)]
#[cfg_attr(target_arch = "s390x", repr(align(256)))]
pub(crate) struct OwnLine<T>(pub(crate) T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Where a full per-CPU batch of update counts goes: the group's shared
/// `stats_updates` (a count, so nothing needs announcing).
struct UpdateCount<'a>(&'a AtomicU64);

impl crate::percpu::SpillTarget for UpdateCount<'_> {
    fn begin(&self) {}

    #[inline]
    fn end(&self, moved: i64) {
        self.direct(moved);
    }

    #[inline]
    fn direct(&self, units: i64) {
        if units != 0 {
            // Release: a flusher whose Acquire snapshot of the count includes
            // these units also sees the value update made before them (and
            // so folds it): see `Stats::flush`.
            self.0.fetch_add(units.unsigned_abs(), Release);
        }
    }
}

/// One group's statistics. See the module docs of [`crate::stat`].
///
/// A group belongs to the [`Stats`] that made it: its per-CPU slots come
/// from that `Stats`' arenas and it is pushed onto that `Stats`' update
/// lists. Every operation that takes a `Stats` checks it is that one and
/// refuses another with [`StatError::ForeignGroup`].
///
/// Layout (`repr(C)`, six 64-byte lines): the first line holds the
/// read-only fields both an update and a flush read — `parent` (an update's
/// threshold climb, the flush's climb), `depth`, `items`, `root`,
/// `folded_more`, `nodes`, `owner_stats` — so a flush that climbs from a
/// recently updated group finds its ancestors' first lines cached. The
/// per-CPU handles follow; the write-shared `stats_updates` is on a line of
/// its own, and the folded values (written by the flusher) are the last two
/// lines for up to five items: a flush then writes in the allocation (and,
/// mostly, the 4 KiB page) that the updates it folds just read, not in a
/// second one somewhere else in the heap: a fifth off a warm flush of ten groups, and
/// more than half off one that finds its pages cold (see
/// `IMPLEMENTATION.md`, "Where a flush's time goes").
#[repr(C)]
pub struct StatGroup {
    pub(crate) parent: Option<Arc<StatGroup>>,
    pub(crate) depth: u32,
    /// Number of items (at most [`super::MAX_STAT_ITEMS`]).
    items: u32,
    /// The root of this group's tree (itself for a root): the tree's
    /// groups are all within it, which a flush of a root tests without a
    /// climb. Kept alive by the chain of parents.
    pub(crate) root: *const StatGroup,
    /// The folded values when there are more than `folded_inline` holds
    /// (empty otherwise: no allocation). See `folded_inline`.
    folded_more: Box<[FoldedLine]>,
    pub(crate) nodes: Box<[UpdateNode]>,
    /// The identity of the [`Stats`] this group belongs to.
    pub(crate) owner_stats: u64,
    /// Per CPU: |delta| not yet moved to `stats_updates` (rseq arena).
    pub(crate) unflushed: Option<PerCpu>,
    /// Per CPU: slots `0..k` hold the running total of each item's updates
    /// on that CPU; slots `k..2k` the same as of the last flush (written by
    /// the flusher only). Side by side, so a fold reads one line per CPU.
    pub(crate) values: Option<PerCpu>,
    pub(crate) id: u64,
    /// Made with [`Stats::kept_group`]: the flusher keeps the reference
    /// of a folded node for the next push, until [`Stats::retire`].
    pub(crate) keep: bool,
    /// [`Stats::retire`] was called: no reference is kept any more.
    /// Set once by `retire` (SeqCst), read by the flusher's fold (SeqCst).
    /// See `Stats::retire`.
    pub(crate) retired: AtomicBool,
    /// Updates (|delta|) in this subtree since its last flush, moved here in
    /// batches of [`STAT_BATCH`] per CPU.
    pub(crate) stats_updates: OwnLine<AtomicU64>,
    /// Folded values, `3k` of them on whole lines — here for up to five
    /// items, else in `folded_more`: `0..k` this group's own updates
    /// (local), `k..2k` its subtree's (hierarchical), `2k..3k` deltas a
    /// flush of a child passed up and no flush folded here yet (pending).
    /// Written by the flusher only. Local and hierarchical come first, so a
    /// fold writes one line for up to four items; pending is touched only
    /// after flushes below a root.
    folded_inline: [FoldedLine; INLINE_FOLDED_LINES],
}

// The fields listed first in `StatGroup` (the flush's climb and an update
// read them) fill its first cache line and no more.
const _: () = assert!(std::mem::offset_of!(StatGroup, unflushed) == 64);

// Six lines in all: the size the struct had when the folded values were an
// allocation of their own (`stats_updates` was then padded to a pair of
// lines, `CachePadded` on x86-64, which also aligned the struct to 128: its
// `Arc` took 512 bytes, now 448), and that allocation is gone for up to
// five items (with more, the two inline lines go unused).
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
const _: () = assert!(std::mem::size_of::<StatGroup>() == 6 * 64);

// A line of folded values is its atomics and nothing else, so the lines
// of a group are contiguous atomics (`StatGroup::folded_values` relies on
// it).
const _: () = assert!(
    std::mem::size_of::<FoldedLine>() == FOLDED_PER_LINE * std::mem::size_of::<AtomicI64>()
);

/// `a += d` with a plain load and store: for values only the flusher (one
/// at a time, under the flush lock) writes.
#[inline(always)]
fn add_folded(a: &AtomicI64, d: i64) {
    a.store(a.load(Relaxed).wrapping_add(d), Relaxed);
}

// SAFETY: `owner` points to the group itself (kept alive by whoever holds
// the group); everything else is atomics and allocations that are Send+Sync.
unsafe impl Send for StatGroup {}
// SAFETY: as above; shared access only goes through atomics.
unsafe impl Sync for StatGroup {}

impl StatGroup {
    pub(crate) fn new(
        stats: &Stats,
        id: u64,
        parent: Option<Arc<StatGroup>>,
        keep: bool,
    ) -> Result<Arc<StatGroup>, StatError> {
        let k = stats.items().len();
        let cpus = stats.cpus();
        let alloc = |arena: &crate::percpu::Arena, n: usize| {
            arena
                .alloc(n.max(1))
                .map_err(|e| StatError::Schema(e.to_string()))
        };
        if parent.as_ref().is_some_and(|p| !stats.owns(p)) {
            return Err(StatError::ForeignGroup);
        }
        // A schema without items needs no per-CPU state at all (no arena
        // lock, no memory): such a group is never updated nor flushed.
        let (values, unflushed, cpus) = if k == 0 {
            (None, None, 0)
        } else {
            (
                Some(alloc(stats.values_arena(), 2 * k)?),
                Some(alloc(stats.count_arena(), 1)?),
                cpus,
            )
        };
        let lines = (3 * k).div_ceil(FOLDED_PER_LINE);
        let line = || FoldedLine(std::array::from_fn(|_| AtomicI64::new(0)));
        let folded_more = if lines > INLINE_FOLDED_LINES {
            (0..lines).map(|_| line()).collect()
        } else {
            Box::default()
        };
        let depth = parent.as_ref().map_or(0, |p| p.depth + 1);
        let parents_root = parent.as_ref().map(|p| p.root);
        Ok(Arc::new_cyclic(|me: &std::sync::Weak<StatGroup>| {
            StatGroup {
                parent,
                depth,
                items: k as u32,
                root: parents_root.unwrap_or(me.as_ptr()),
                folded_more,
                nodes: (0..cpus)
                    .map(|_| UpdateNode {
                        next: AtomicPtr::new(std::ptr::null_mut()),
                        on_list: AtomicBool::new(false),
                        owner: me.as_ptr(),
                        kept_at: AtomicUsize::new(NOT_KEPT),
                        queued: AtomicBool::new(false),
                    })
                    .collect(),
                owner_stats: stats.identity(),
                unflushed,
                values,
                id,
                keep,
                retired: AtomicBool::new(false),
                stats_updates: OwnLine(AtomicU64::new(0)),
                folded_inline: std::array::from_fn(|_| line()),
            }
        }))
    }

    /// Add `delta` to item `item` on the current CPU and mark the group
    /// updated there. `stats` must be the [`Stats`] that made this group
    /// ([`StatError::ForeignGroup`] otherwise).
    #[inline]
    pub fn mod_stat(
        self: &Arc<Self>,
        stats: &Stats,
        item: usize,
        delta: i64,
    ) -> Result<(), StatError> {
        if !stats.owns(self) {
            return Err(StatError::ForeignGroup);
        }
        let kind = stats
            .items()
            .get(item)
            .ok_or(StatError::NoSuchItem(item))?
            .kind;
        if kind == StatKind::Event && delta < 0 {
            return Err(StatError::NegativeEvent {
                item: stats.items()[item].name.clone(),
                delta,
            });
        }
        if delta == 0 {
            return Ok(());
        }
        let cpu = stats.machine().current_cpu();
        // SAFETY: `stats` owns this group (checked above), whose machine's
        // current CPU is below its CPU count; `item` is in the schema.
        unsafe { self.mod_stat_on(stats, cpu, item, delta) };
        Ok(())
    }

    /// The update itself, on CPU `cpu`.
    ///
    /// # Safety
    /// `stats` owns this group, `cpu < stats.cpus()` and `item` is in the
    /// schema: the slot's address is computed from them unchecked.
    #[inline]
    pub(crate) unsafe fn mod_stat_on(
        self: &Arc<Self>,
        stats: &Stats,
        cpu: usize,
        item: usize,
        delta: i64,
    ) {
        // SeqCst read-modify-write, then a SeqCst load of the mark: with the
        // flusher's SeqCst clear-then-read, one of the two always sees the
        // other (see `mark_updated`). On x86 both are the same instructions
        // as their relaxed forms (`lock xadd`, `mov`).
        let Some(values) = &self.values else {
            return; // no items: nothing to update (the caller checked)
        };
        // SAFETY: this group's values have `stats.cpus()` regions and
        // `2·items` slots (the caller's bounds).
        unsafe { values.slot(cpu, item) }.fetch_add(delta, SeqCst);
        self.mark_updated(stats, cpu);
        self.count_update(delta.unsigned_abs());
    }

    /// Put this group on CPU `cpu`'s update list unless it is there.
    ///
    /// 1. Speculative test: a plain load of `on_list` — the common case,
    ///    no locked instruction.
    /// 2. Otherwise a compare-and-swap decides the one winner (two threads —
    ///    or a thread and a signal handler — on the same CPU can both find
    ///    the mark clear; a plain store would let both push, and pushing one
    ///    node twice corrupts the list and loses every update of this group
    ///    on this CPU).
    /// 3. The winner pushes the node (Treiber stack) with a strong reference
    ///    that the flusher takes back — unless the flusher kept the one of
    ///    an earlier push (a group made by [`Stats::kept_group`]): then the
    ///    push takes none, and a folded group's next push makes no locked
    ///    instruction besides the CAS.
    ///
    /// Why the speculative test is safe: the updater writes its delta, then
    /// reads `on_list`; the flusher clears `on_list`, then reads the delta
    /// (all SeqCst). If the updater saw the mark still set, its read came
    /// before the clear in the single SeqCst order, so the flusher's later
    /// read of the delta sees it. Otherwise the updater pushes again.
    #[inline]
    fn mark_updated(self: &Arc<Self>, stats: &Stats, cpu: usize) {
        let node = &self.nodes[cpu];
        if node.on_list.load(SeqCst) {
            return;
        }
        if node
            .on_list
            .compare_exchange(false, true, SeqCst, Relaxed)
            .is_err()
        {
            return;
        }
        // The list owns one strong reference per node on it: this push's,
        // or the one the flusher kept. Relaxed: the flusher wrote `kept_at`
        // before its Release store that cleared the mark, which the CAS
        // above (SeqCst, so Acquire) read.
        if node.kept_at.load(Relaxed) == NOT_KEPT {
            let _ = Arc::into_raw(self.clone());
        }
        stats.push(cpu, node as *const UpdateNode as *mut UpdateNode);
    }

    /// The per-group flush threshold: count `abs` towards `stats_updates` of
    /// this group and *every* ancestor, in per-CPU batches of
    /// [`STAT_BATCH`].
    ///
    /// The climb never stops early: an ancestor that was skipped because a
    /// group below it already needed a flush would never learn of the
    /// update, and a read of that ancestor could then miss it for ever (a
    /// flush of the group below resets only that group). Every level costs
    /// one per-CPU add, and one shared atomic add per batch.
    #[inline]
    fn count_update(&self, abs: u64) {
        let abs = abs.min(i64::MAX as u64) as i64;
        let mut g = Some(self);
        while let Some(x) = g {
            if let Some(unflushed) = &x.unflushed {
                // SAFETY: slot 0 of a one-slot allocation.
                unsafe {
                    unflushed.add_spill_current(0, abs, STAT_BATCH, &UpdateCount(&x.stats_updates))
                };
            }
            g = x.parent.as_deref();
        }
    }

    /// Number of items.
    #[inline(always)]
    pub(crate) fn k(&self) -> usize {
        self.items as usize
    }

    /// Whether some CPU may hold updates of this group not folded yet (it
    /// is on a CPU's update list, or drained and waiting for its fold).
    /// False for a group never updated: removing it needs no flush.
    pub(crate) fn has_unfolded(&self) -> bool {
        self.k() > 0
            && self
                .nodes
                .iter()
                .any(|n| n.on_list.load(SeqCst) || n.queued.load(Relaxed))
    }

    /// Updates counted towards the flush threshold so far.
    pub fn stats_updates(&self) -> u64 {
        self.stats_updates.load(Relaxed)
    }

    /// Take CPU `cpu`'s deltas since the last flush: move `prev` up to the
    /// current values and append the nonzero deltas to `deltas`. Flusher
    /// only (plain loads and stores: no locked instruction per item).
    ///
    /// # Safety
    /// `cpu` is a CPU of the `Stats` that made this group and `k` its item
    /// count (the slots' addresses are computed from them unchecked).
    #[inline]
    pub(crate) unsafe fn take_own_deltas(
        &self,
        cpu: usize,
        k: usize,
        deltas: &mut Vec<(usize, i64)>,
    ) {
        let Some(values) = &self.values else {
            return; // no items: never pushed
        };
        // SAFETY: the caller's bounds (`cpu < regions`, `2k` slots); an
        // allocation's slots on one CPU are contiguous in that CPU's region
        // (the arena's layout), so they are one run of `2k` atomics, and
        // `slot_ptr`'s pointer may reach all of them (a reference to slot 0
        // would cover that slot only).
        let row: &[AtomicI64] =
            unsafe { std::slice::from_raw_parts(values.slot_ptr(cpu, 0), 2 * k) };
        let (current, prev) = row.split_at(k);
        for (item, (now, prev)) in current.iter().zip(prev).enumerate() {
            let now = now.load(SeqCst);
            let delta = now.wrapping_sub(prev.load(Relaxed));
            if delta != 0 {
                prev.store(now, Relaxed);
                deltas.push((item, delta));
            }
        }
    }

    /// Take the deltas flushes of children passed up (`pending`),
    /// appending the nonzero ones to `deltas`. Flusher only.
    pub(crate) fn take_pending(&self, deltas: &mut Vec<(usize, i64)>) {
        for item in 0..self.k() {
            let pending = self.folded(2 * self.k() + item);
            let delta = pending.load(Relaxed);
            if delta != 0 {
                pending.store(0, Relaxed);
                deltas.push((item, delta));
            }
        }
    }

    /// Add `sums` (one delta per item) to the hierarchical values.
    /// Flusher only.
    pub(crate) fn add_hier_sums(&self, sums: &[i64]) {
        let hier = &self.folded_values()[self.k()..2 * self.k()];
        for (value, &delta) in hier.iter().zip(sums) {
            if delta != 0 {
                add_folded(value, delta);
            }
        }
    }

    /// Add `sums` (one delta per item) to the pending values. Flusher only.
    pub(crate) fn add_pending(&self, sums: &[i64]) {
        let pending = &self.folded_values()[2 * self.k()..];
        for (value, &delta) in pending.iter().zip(sums) {
            add_folded(value, delta);
        }
    }

    /// Add `deltas` to the local values. Flusher only.
    #[inline(always)]
    pub(crate) fn add_local(&self, deltas: &[(usize, i64)]) {
        let local = &self.folded_values()[..self.k()];
        for &(item, delta) in deltas {
            add_folded(&local[item], delta);
        }
    }

    /// Add `deltas` to the hierarchical values. Flusher only.
    #[inline(always)]
    pub(crate) fn add_hier(&self, deltas: &[(usize, i64)]) {
        let hier = &self.folded_values()[self.k()..];
        for &(item, delta) in deltas {
            add_folded(&hier[item], delta);
        }
    }

    /// The first line of the folded values (local and hierarchical for up
    /// to four items): what a fold writes.
    #[inline(always)]
    pub(crate) fn folded_line(&self) -> *const FoldedLine {
        self.folded_lines()
    }

    /// Where the folded values are: inside the group for up to five items,
    /// else in their own allocation.
    #[inline(always)]
    fn folded_lines(&self) -> *const FoldedLine {
        if self.folded_more.is_empty() {
            self.folded_inline.as_ptr()
        } else {
            self.folded_more.as_ptr()
        }
    }

    /// All `3k` folded values: `0..k` local, `k..2k` hierarchical,
    /// `2k..3k` pending.
    #[inline(always)]
    fn folded_values(&self) -> &[AtomicI64] {
        // SAFETY: the lines are one array of arrays without padding
        // (asserted at compile time above) — the inline array or the
        // boxed slice — so they are contiguous atomics, at least `3k` of
        // them (`new` puts `ceil(3k / 8)` lines in the boxed slice, or uses
        // the inline array only when it has that many).
        unsafe { std::slice::from_raw_parts(self.folded_lines().cast(), 3 * self.k()) }
    }

    /// Folded value `i` (`0..k` local, `k..2k` hierarchical, `2k..3k`
    /// pending).
    #[inline(always)]
    fn folded(&self, i: usize) -> &AtomicI64 {
        &self.folded_values()[i]
    }

    /// The threshold count as a flush starts: every update it includes was
    /// made before this load and is folded by the flush.
    pub(crate) fn updates_before_flush(&self) -> u64 {
        // Acquire: pairs with `count_update`'s Release.
        self.stats_updates.load(Acquire)
    }

    /// After a flush of this group's subtree: forget the `seen` updates the
    /// flush started with (they are folded). Updates counted since — which
    /// may have landed on a CPU the flush had already drained — stay
    /// counted, so the staleness bound holds while flushes run.
    pub(crate) fn forget_updates(&self, seen: u64) {
        if seen != 0 {
            // Relaxed: a counter; the count only grows between the snapshot
            // and here except through this flusher (one at a time).
            self.stats_updates.fetch_sub(seen, Relaxed);
        }
    }

    /// The folded hierarchical value of item `item` (this group's subtree,
    /// as of the last flush that reached it), or `None` outside the schema.
    pub fn value(&self, item: usize) -> Option<i64> {
        (item < self.k()).then(|| self.hier(item))
    }

    /// The folded value of item `item` for this group's own updates, or
    /// `None` outside the schema.
    pub fn local_value(&self, item: usize) -> Option<i64> {
        (item < self.k()).then(|| self.local(item))
    }

    /// The folded hierarchical value of `item` (no flush).
    pub(crate) fn hier(&self, item: usize) -> i64 {
        self.folded(self.k() + item).load(Relaxed)
    }

    /// The folded local value of `item` (no flush).
    pub(crate) fn local(&self, item: usize) -> i64 {
        self.folded(item).load(Relaxed)
    }
}

impl Drop for StatGroup {
    /// Drop the chain of parents this group held the last reference to one
    /// by one, not recursively (deep chains must not overflow the stack).
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(parent) = next {
            match Arc::try_unwrap(parent) {
                Ok(mut group) => next = group.parent.take(),
                Err(_) => break,
            }
        }
    }
}

impl std::fmt::Debug for StatGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatGroup")
            .field("id", &self.id)
            .field("depth", &self.depth)
            .field("stats_updates", &self.stats_updates())
            .finish()
    }
}
