//! [`Stats`]: a hierarchy's statistics machinery — the schema, the per-CPU
//! update lists, and the flush.

use super::flush::Flusher;
use super::group::{StatGroup, UpdateNode, NOT_KEPT, STAT_BATCH};
use super::schema::{validate, StatError, StatItem};
use crate::cpu::Machine;
use crate::percpu::{AddPath, Arena, ArenaOptions};
use crate::sync::{
    lock, AtomicPtr, AtomicU64, Mutex,
    Ordering::{Relaxed, Release, SeqCst},
};
use crossbeam_utils::CachePadded;
use std::sync::Arc;
use std::time::Duration;

/// The statistics of one hierarchy. See the module docs of [`crate::stat`].
pub struct Stats {
    /// Process-unique: the groups this `Stats` made carry it, so a group is
    /// never used with another `Stats`' slots and lists.
    identity: u64,
    items: Vec<StatItem>,
    machine: Machine,
    /// Per-CPU values: updated with SeqCst `fetch_add` (see `StatGroup`).
    values: Arena,
    /// Per-CPU threshold counts: plain per-CPU counters (rseq where possible).
    counts: Arena,
    /// Per CPU: the head of the lock-free list of groups updated there.
    lists: Box<[CachePadded<AtomicPtr<UpdateNode>>]>,
    /// One flusher at a time; its state: per CPU, the groups recorded
    /// there and not folded yet, and buffers reused from flush to flush.
    flush: Mutex<Flusher>,
    flushes: AtomicU64,
    next_id: AtomicU64,
    epoch: CoarseClock,
    last_flush_ns: AtomicU64,
}

impl Stats {
    /// Statistics with `items` for `machine`'s CPUs.
    pub fn new(machine: &Machine, items: Vec<StatItem>) -> Result<Stats, StatError> {
        validate(&items)?;
        let values = Arena::with_options(
            machine,
            &ArenaOptions {
                add_path: AddPath::Atomic,
                ..Default::default()
            },
        )
        .map_err(|e| StatError::Schema(e.to_string()))?;
        let cpus = machine.cpus();
        static NEXT_IDENTITY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Stats {
            identity: NEXT_IDENTITY.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            items,
            machine: machine.clone(),
            values,
            counts: Arena::new(machine),
            lists: (0..cpus)
                .map(|_| CachePadded::new(AtomicPtr::new(std::ptr::null_mut())))
                .collect(),
            flush: Mutex::new(Flusher::new(cpus)),
            flushes: AtomicU64::new(0),
            next_id: AtomicU64::new(1 << 32),
            epoch: CoarseClock::new(),
            last_flush_ns: AtomicU64::new(0),
        })
    }

    /// A new group's statistics under `parent` (standalone use; a
    /// [`crate::group::Hierarchy`] makes one for each of its groups).
    /// `parent` must have been made by this `Stats`
    /// ([`StatError::ForeignGroup`] otherwise).
    pub fn group(&self, parent: Option<&Arc<StatGroup>>) -> Result<Arc<StatGroup>, StatError> {
        let id = self.next_id.fetch_add(1, Relaxed);
        StatGroup::new(self, id, parent.cloned(), false)
    }

    /// Like [`Stats::group`], for a group whose end the caller announces
    /// with [`Stats::retire`] (a [`crate::group::Hierarchy`]'s groups are
    /// made so, and retired by [`crate::group::Group::remove`]).
    ///
    /// A group on a CPU's update list is kept alive by a strong reference
    /// the list holds; for a group made by [`Stats::group`] each push takes
    /// one and each flush gives it back (two locked instructions per group
    /// updated between two flushes). Here the flusher keeps the reference
    /// of a folded group for its next push instead, until the group is
    /// retired or this `Stats` is dropped: a group dropped without
    /// [`Stats::retire`] stays allocated until then.
    ///
    /// ```
    /// use splitcount::cpu::Machine;
    /// use splitcount::stat::{StatItem, Stats};
    /// use std::sync::Arc;
    ///
    /// let stats = Stats::new(&Machine::simulated(2, 1)?, vec![StatItem::gauge("x")])?;
    /// let g = stats.kept_group(None)?;
    /// g.mod_stat(&stats, 0, 5)?;
    /// stats.flush(&g, true);
    /// assert_eq!(g.value(0), Some(5));
    /// assert_eq!(Arc::strong_count(&g), 2); // ours, and the one kept for the next push
    /// stats.retire(&g);
    /// assert_eq!(Arc::strong_count(&g), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn kept_group(&self, parent: Option<&Arc<StatGroup>>) -> Result<Arc<StatGroup>, StatError> {
        let id = self.next_id.fetch_add(1, Relaxed);
        StatGroup::new(self, id, parent.cloned(), true)
    }

    /// The end of a group's statistics: fold what it has not folded yet
    /// (its values stay in its ancestors'), and give back the references
    /// kept for its pushes (see [`Stats::kept_group`]). Updates after this
    /// are still folded by later flushes, each push taking a reference of
    /// its own again. Does nothing for a group another `Stats` made, or
    /// one retired before.
    pub fn retire(&self, group: &StatGroup) {
        if !self.owns(group) {
            return;
        }
        // SeqCst, with the SeqCst loads of the marks below and the
        // flusher's SeqCst load of `retired` in its fold: if this thread
        // finds every mark clear, a push that sets one later comes after
        // this store in the single order, and so does the fold of that
        // push, which then sees the group retired and gives the push's
        // reference back instead of keeping it. So a group never pushed,
        // or folded with nothing kept, retires without the flush lock.
        if group.retired.swap(true, SeqCst) {
            return;
        }
        // A mark read clear (SeqCst, so Acquire) was cleared by the
        // flusher's Release store, after it wrote `kept_at`: read here.
        let idle = group.nodes.iter().all(|n| {
            !n.on_list.load(SeqCst)
                && n.kept_at.load(Relaxed) == NOT_KEPT
                && !n.queued.load(Relaxed)
        });
        if idle {
            return;
        }
        let mut flusher = lock(&self.flush);
        // A node whose reference the flusher keeps is pushed once more,
        // as an updater would (no reference taken: the kept one goes with
        // it), so the flush below folds it and, the group being retired,
        // gives the kept reference back. An update racing this finds the
        // mark set and relies on the flush to see its value: the usual
        // argument of `StatGroup::mark_updated`. A node whose mark is set
        // already is on a list (or about to be): a flush folds it and
        // gives its reference back, this one or a later one.
        for (cpu, node) in group.nodes.iter().enumerate() {
            if node.kept_at.load(Relaxed) != NOT_KEPT
                && node
                    .on_list
                    .compare_exchange(false, true, SeqCst, Relaxed)
                    .is_ok()
            {
                self.push(cpu, node as *const UpdateNode as *mut UpdateNode);
            }
        }
        if group.has_unfolded() {
            self.flush_locked(&mut flusher, group);
        }
    }

    /// Whether `group` was made by this `Stats`.
    pub fn owns(&self, group: &StatGroup) -> bool {
        group.owner_stats == self.identity
    }

    pub(crate) fn identity(&self) -> u64 {
        self.identity
    }

    /// The schema.
    pub fn items(&self) -> &[StatItem] {
        &self.items
    }

    pub(crate) fn machine(&self) -> &Machine {
        &self.machine
    }

    pub(crate) fn cpus(&self) -> usize {
        self.lists.len()
    }

    pub(crate) fn values_arena(&self) -> &Arena {
        &self.values
    }

    pub(crate) fn count_arena(&self) -> &Arena {
        &self.counts
    }

    /// A group needs a flush once more than `STAT_BATCH · ncpu` updates
    /// were counted in its subtree since its last flush.
    pub fn threshold(&self) -> u64 {
        STAT_BATCH * self.cpus() as u64
    }

    /// Flushes done so far (a read that finds nothing worth flushing does
    /// not count, and writes nothing shared).
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Relaxed)
    }

    /// Time of the last flush, since this `Stats` was made.
    /// On Linux it is read from the coarse clock: exact to one timer tick
    /// (1 to 4 ms), which is what rate-limited reads need.
    pub fn last_flush(&self) -> Duration {
        Duration::from_nanos(self.last_flush_ns.load(Relaxed))
    }

    pub(crate) fn since_epoch(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Push `node` (whose `on_list` this thread just won) onto CPU `cpu`'s
    /// list.
    pub(crate) fn push(&self, cpu: usize, node: *mut UpdateNode) {
        let head = &self.lists[cpu];
        let mut first = head.load(Relaxed);
        loop {
            // SAFETY: `node` belongs to a live group (the list now holds a
            // strong reference to it) and only the CAS winner writes `next`
            // until the flusher takes the node off the list.
            unsafe { (*node).next.store(first, Relaxed) };
            // Release: the flusher's Acquire swap sees `next`.
            match head.compare_exchange_weak(first, node, Release, Relaxed) {
                Ok(_) => return,
                Err(seen) => first = seen,
            }
        }
    }

    /// Flush `group`'s subtree unless neither forced nor needed. Returns
    /// whether it flushed (never for a group another `Stats` made).
    ///
    /// A flush folds every update counted in `group`'s threshold count when
    /// it starts, and forgets only those: updates that arrive while it runs
    /// stay counted (some land on CPUs it already drained), so a read that
    /// skips the next flush still misses at most the documented bound.
    /// Groups below `group` keep their counts (the flush cannot know which
    /// of their updates it saw); their next read may flush once more,
    /// cheaply, and forget them.
    pub fn flush(&self, group: &StatGroup, force: bool) -> bool {
        if !self.owns(group) || (!force && group.stats_updates() <= self.threshold()) {
            return false;
        }
        let mut flusher = lock(&self.flush);
        self.flush_locked(&mut flusher, group);
        true
    }

    /// [`Stats::flush`] of `group`, forced, under the flush lock.
    fn flush_locked(&self, flusher: &mut Flusher, group: &StatGroup) {
        let seen = group.updates_before_flush();
        let k = self.items.len();
        for (cpu, list) in self.lists.iter().enumerate() {
            flusher.pass(cpu, list, group, k);
        }
        group.forget_updates(seen);
        // Only flushers (one at a time, under the lock) write the count.
        self.flushes
            .store(self.flushes.load(Relaxed).wrapping_add(1), Relaxed);
        self.last_flush_ns
            .store(self.since_epoch().as_nanos() as u64, Relaxed);
    }
}

/// The clock that stamps flushes: elapsed time since it was made.
///
/// On Linux, `CLOCK_MONOTONIC_COARSE`: the time of the last timer tick,
/// read from the vDSO without reading the clock source — about 5 ns where
/// a precise read costs 25 to 35 ns in a virtual machine, a sixth of what
/// a small flush costs — at a resolution of one tick (1 to 4 ms), plenty
/// for rate limits of seconds (the kernel stamps its last flush in
/// jiffies). Elsewhere, [`std::time::Instant`].
struct CoarseClock {
    #[cfg(target_os = "linux")]
    origin: Duration,
    #[cfg(not(target_os = "linux"))]
    origin: std::time::Instant,
}

impl CoarseClock {
    fn new() -> CoarseClock {
        #[cfg(target_os = "linux")]
        return CoarseClock {
            origin: CoarseClock::now(),
        };
        #[cfg(not(target_os = "linux"))]
        return CoarseClock {
            origin: std::time::Instant::now(),
        };
    }

    #[cfg(target_os = "linux")]
    fn now() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the clock exists
        // since Linux 2.6.32 (Rust's std needs 3.2), so the call cannot
        // fail, and a failure would leave `ts` at zero: a stale stamp,
        // never unsafety.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        debug_assert_eq!(rc, 0);
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// Time since the clock was made (never negative).
    fn elapsed(&self) -> Duration {
        #[cfg(target_os = "linux")]
        return CoarseClock::now().saturating_sub(self.origin);
        #[cfg(not(target_os = "linux"))]
        return self.origin.elapsed();
    }
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats")
            .field("items", &self.items.len())
            .field("cpus", &self.cpus())
            .field("flushes", &self.flushes())
            .finish()
    }
}

impl Drop for Stats {
    fn drop(&mut self) {
        // Give back the references the lists and the flusher's sets hold.
        lock(&self.flush).release_all(&self.lists);
    }
}
