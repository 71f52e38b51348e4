//! [`Stats`]: a hierarchy's statistics machinery — the schema, the per-CPU
//! update lists, and the flush.

use super::group::{StatGroup, UpdateNode, STAT_BATCH};
use super::schema::{validate, StatError, StatItem};
use crate::cpu::Machine;
use crate::percpu::{AddPath, Arena, ArenaOptions};
use crate::sync::{
    fence, lock, AtomicPtr, AtomicU64, Mutex,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use crossbeam_utils::CachePadded;
use std::sync::Arc;
use std::time::Instant;

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
    /// One flusher at a time; per CPU, the groups drained from its list and
    /// not yet flushed, with their ancestors (each once: `queued`).
    flush: Mutex<Vec<Vec<Arc<StatGroup>>>>,
    flushes: AtomicU64,
    next_id: AtomicU64,
    epoch: Instant,
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
            flush: Mutex::new((0..cpus).map(|_| Vec::new()).collect()),
            flushes: AtomicU64::new(0),
            next_id: AtomicU64::new(1 << 32),
            epoch: Instant::now(),
            last_flush_ns: AtomicU64::new(0),
        })
    }

    /// A new group's statistics under `parent` (standalone use; a
    /// [`crate::group::Hierarchy`] makes one for each of its groups).
    /// `parent` must have been made by this `Stats`
    /// ([`StatError::ForeignGroup`] otherwise).
    pub fn group(&self, parent: Option<&Arc<StatGroup>>) -> Result<Arc<StatGroup>, StatError> {
        let id = self.next_id.fetch_add(1, Relaxed);
        StatGroup::new(self, id, parent.cloned())
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
    pub fn last_flush(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.last_flush_ns.load(Relaxed))
    }

    pub(crate) fn since_epoch(&self) -> std::time::Duration {
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

    /// Take CPU `cpu`'s list and record its groups (and their ancestors) as
    /// updated on that CPU. Flusher only (under the flush lock).
    fn drain(&self, cpu: usize, updated: &mut Vec<Arc<StatGroup>>) {
        // Speculative: an empty list is skipped without a locked instruction.
        if self.lists[cpu].load(Relaxed).is_null() {
            return;
        }
        // Acquire: pairs with the pushers' Release.
        let mut p = self.lists[cpu].swap(std::ptr::null_mut(), Acquire);
        while !p.is_null() {
            // SAFETY: a node on the list belongs to a group the list holds a
            // strong reference to (taken by the pusher with `into_raw`).
            let node = unsafe { &*p };
            // The node's mark stays set until its group is folded (`flush`
            // clears it just before), so no updater can push the node again
            // while this chain is walked: `next` cannot change under us.
            let next = node.next.load(Relaxed);
            // SAFETY: the reference leaked by the pusher, taken back once.
            let group = unsafe { Arc::from_raw(node.owner) };
            // Its own deltas on this CPU must be read; its ancestors' only if
            // they were drained themselves (else they only fold `pending`).
            node.own.store(true, Relaxed);
            let mut g = Some(group);
            while let Some(x) = g {
                // Plain load and store: `queued` is only touched under the
                // flush lock.
                if x.nodes[cpu].queued.load(Relaxed) {
                    break; // its ancestors are recorded too
                }
                x.nodes[cpu].queued.store(true, Relaxed);
                g = x.parent.clone();
                updated.push(x);
            }
            p = next;
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
        let mut updated = lock(&self.flush);
        let seen = group.updates_before_flush();
        for (cpu, set) in updated.iter_mut().enumerate() {
            self.drain(cpu, set);
            if set.is_empty() {
                continue;
            }
            let (mut visit, rest): (Vec<_>, Vec<_>) = std::mem::take(set)
                .into_iter()
                .partition(|g| g.is_within(group));
            *set = rest;
            // Children before parents: a parent folds what its children
            // passed up on this CPU.
            visit.sort_unstable_by_key(|g| std::cmp::Reverse(g.depth));
            // Clear the marks of the drained groups about to be folded, then
            // one SeqCst fence, then read their values (in `fold`). Against
            // an updater's SeqCst add-then-read-mark this is Dekker's
            // pattern: either the updater sees its mark cleared (and pushes
            // again), or its add precedes the fence and `fold` reads it. A
            // group drained but not folded here keeps its mark set and its
            // entry in `set`: it is folded, mark cleared, by a later flush.
            for g in &visit {
                let node = &g.nodes[cpu];
                if node.own.load(Relaxed) {
                    node.on_list.store(false, Relaxed);
                }
            }
            fence(SeqCst);
            for g in visit {
                g.fold(cpu);
                g.nodes[cpu].queued.store(false, Relaxed);
            }
        }
        group.forget_updates(seen);
        self.flushes.fetch_add(1, Relaxed);
        self.last_flush_ns
            .store(self.since_epoch().as_nanos() as u64, Relaxed);
        true
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
        // Give back the references the lists hold.
        let mut sets = lock(&self.flush);
        for (cpu, set) in sets.iter_mut().enumerate() {
            self.drain(cpu, set);
            set.clear();
        }
    }
}
