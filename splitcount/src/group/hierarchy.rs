//! [`Hierarchy`]: the tree of groups, its configuration and its stocks.

use super::account::AccountKey;
use super::flusher::Flusher;
use super::name::{child_path, components, validate_name};
use super::node::Node;
use super::{Group, GroupError};
use crate::charge::{
    Stock, StockActivity, UsageCounter, DEFAULT_BUDGET_BATCHES, MAX_STOCK_BATCH, MAX_STOCK_SLOTS,
};
use crate::cpu::Machine;
use crate::stat::{StatError, StatGroup, StatId, StatItem, Stats};
use std::sync::Arc;

/// How to build a [`Hierarchy`].
///
/// ```
/// use splitcount::group::{Hierarchy, HierarchyConfig};
/// let h = Hierarchy::new(HierarchyConfig::default().stock_batch(32).stock_slots(3)).unwrap();
/// assert_eq!(h.config().stock_batch, 32);
/// assert!(Hierarchy::new(HierarchyConfig::default().stock_batch(0)).is_err());
/// ```
#[derive(Debug, Clone)]
pub struct HierarchyConfig {
    /// The machine whose CPUs have stocks (the host by default).
    pub machine: Machine,
    /// Units a stock miss charges at once (default 64).
    pub stock_batch: u64,
    /// Groups each CPU's stock can hold at once (1..=63, default 63).
    pub stock_slots: usize,
    /// The most units each CPU's stock holds in all, whatever the number of
    /// groups it serves (`None`: 7 batches, 448 units by default). With
    /// more groups charging on a CPU than the budget has batches for, each
    /// is granted a share of it (and its misses charge that share). See
    /// [`Hierarchy::max_slack`].
    pub stock_budget: Option<u64>,
    /// The stat items every group carries (none by default).
    pub stats: Vec<StatItem>,
}

impl Default for HierarchyConfig {
    fn default() -> Self {
        HierarchyConfig {
            machine: Machine::host(),
            stock_batch: 64,
            stock_slots: MAX_STOCK_SLOTS,
            stock_budget: None,
            stats: Vec::new(),
        }
    }
}

impl HierarchyConfig {
    /// Use `machine` (a simulated one for tests and the lab).
    pub fn machine(mut self, machine: &Machine) -> Self {
        self.machine = machine.clone();
        self
    }

    /// Units charged per stock miss.
    pub fn stock_batch(mut self, batch: u64) -> Self {
        self.stock_batch = batch;
        self
    }

    /// Groups per CPU stock (1 to [`crate::raw::MAX_STOCK_SLOTS`], the
    /// default). When more groups than that charge on one CPU, a group
    /// without a slot charges through its parent's slot there — units its
    /// parent and every level above count already, so only the group's own
    /// counter moves — and a parent without a slot takes over the slot of
    /// one of its descendants for that. A group whose parent has no slot
    /// and no descendant in one charges the usage counters directly, and
    /// one of those misses in [`crate::raw::ADMIT_EVERY`] takes a slot
    /// from another group (one in up to [`crate::raw::ADMIT_EVERY_MAX`] on
    /// a CPU whose evictions keep bringing back keys it evicted shortly
    /// before): the groups in the slots keep hitting rather than evicting
    /// each other on every charge.
    pub fn stock_slots(mut self, slots: usize) -> Self {
        self.stock_slots = slots;
        self
    }

    /// The most units each CPU's stock holds in all (≥ 1).
    pub fn stock_budget(mut self, units: u64) -> Self {
        self.stock_budget = Some(units);
        self
    }

    /// The budget in force: [`HierarchyConfig::stock_budget`], or 7 batches.
    pub fn effective_stock_budget(&self) -> u64 {
        self.stock_budget
            .unwrap_or(self.stock_batch.saturating_mul(DEFAULT_BUDGET_BATCHES))
    }

    /// The stat items every group carries.
    pub fn stats(mut self, items: Vec<StatItem>) -> Self {
        self.stats = items;
        self
    }

    fn validate(&self) -> Result<(), GroupError> {
        if !(1..=MAX_STOCK_BATCH).contains(&self.stock_batch) {
            return Err(GroupError::Config(format!(
                "the stock batch must be between 1 and {MAX_STOCK_BATCH}, not {}",
                self.stock_batch
            )));
        }
        if !(1..=MAX_STOCK_SLOTS).contains(&self.stock_slots) {
            return Err(GroupError::Config(format!(
                "a CPU's stock holds 1 to {MAX_STOCK_SLOTS} groups, not {}",
                self.stock_slots
            )));
        }
        if self.stock_budget == Some(0) {
            return Err(GroupError::Config(
                "a CPU's stock budget must be at least 1 unit, not 0".to_owned(),
            ));
        }
        Ok(())
    }
}

/// What the allocator integration keeps in the hierarchy it is attached
/// to, so that the hierarchy's drains reach it too.
pub(crate) struct Bytes {
    /// The per-CPU byte stock, keyed by account.
    pub(crate) stock: Stock<AccountKey>,
    /// Returns the calling thread's reserve (the allocator's).
    pub(crate) drain_thread: fn() -> u64,
}

/// What every handle of one hierarchy shares.
pub(crate) struct Shared {
    pub(crate) config: HierarchyConfig,
    pub(crate) stock: Stock,
    /// Set when an allocator is attached.
    pub(crate) bytes: std::sync::OnceLock<Bytes>,
    pub(crate) stats: Stats,
    pub(crate) root: Arc<Node>,
    /// The next group's id.
    next_id: std::sync::atomic::AtomicU64,
    flusher: std::sync::Mutex<Option<Flusher>>,
    /// The period ratelimited reads trust a flush for, in nanoseconds:
    /// read on every such read, so kept outside the flusher's mutex.
    flush_period_ns: std::sync::atomic::AtomicU64,
}

/// How long a ratelimited read trusts a flush, and the background flusher's
/// default period.
pub const DEFAULT_FLUSH_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// The shortest period [`Hierarchy::start_flusher`] accepts: a flush walks
/// the whole hierarchy's update lists, so a shorter period (zero above all)
/// would only spin the flusher thread on a CPU.
pub const MIN_FLUSH_PERIOD: std::time::Duration = std::time::Duration::from_millis(1);

/// A tree of named groups sharing per-CPU stocks. Cheap to clone.
///
/// ```
/// use splitcount::group::Hierarchy;
///
/// let h = Hierarchy::default();
/// let tenant = h.root().child("tenant-a").unwrap();
/// let query = tenant.child("query-17").unwrap();
/// tenant.set_max(1 << 20).unwrap();
/// query.charge(64 << 10).unwrap();
/// assert_eq!(h.lookup("tenant-a/query-17").unwrap().path(), "/tenant-a/query-17");
/// ```
#[derive(Clone)]
pub struct Hierarchy {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Hierarchy {
    /// The configuration, whether an allocator is attached, and the root's
    /// usage (stocked units included).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.shared.config;
        f.debug_struct("Hierarchy")
            .field("cpus", &c.machine.cpus())
            .field("stock_batch", &c.stock_batch)
            .field("stock_slots", &c.stock_slots)
            .field("stats", &c.stats.len())
            .field("allocator_attached", &self.shared.bytes.get().is_some())
            .field("root_usage", &self.root().usage())
            .finish()
    }
}

impl Default for Hierarchy {
    fn default() -> Self {
        Hierarchy::new(HierarchyConfig::default()).expect("the default configuration is valid")
    }
}

impl Hierarchy {
    /// A hierarchy with only a root group.
    pub fn new(config: HierarchyConfig) -> Result<Hierarchy, GroupError> {
        config.validate()?;
        // On the host, hits are rseq critical sections where the platform
        // allows; a simulated machine's CPUs are the caller's choice.
        let make = if config.machine.is_simulated() {
            Stock::new
        } else {
            Stock::for_host
        };
        let stock = make(
            config.machine.cpus(),
            config.stock_slots,
            config.stock_batch,
        )
        .and_then(|s| s.with_budget(config.effective_stock_budget()))
        .map_err(GroupError::Stock)?;
        let stats = Stats::new(&config.machine, config.stats.clone()).map_err(stat_error)?;
        let root_stats = StatGroup::new(&stats, 0, None, true).map_err(stat_error)?;
        let root = Arc::new(Node::new(
            None,
            "/".to_owned(),
            "/".to_owned(),
            UsageCounter::root(),
            root_stats,
        ));
        Ok(Hierarchy {
            shared: Arc::new(Shared {
                config,
                stock,
                bytes: std::sync::OnceLock::new(),
                stats,
                root,
                next_id: std::sync::atomic::AtomicU64::new(1),
                flusher: std::sync::Mutex::new(None),
                flush_period_ns: std::sync::atomic::AtomicU64::new(
                    DEFAULT_FLUSH_PERIOD.as_nanos() as u64
                ),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &HierarchyConfig {
        &self.shared.config
    }

    /// Whether an [`crate::alloc::Accounted`] allocator is attached to this
    /// hierarchy (its usage then counts bytes).
    pub fn counts_bytes(&self) -> bool {
        self.shared.bytes.get().is_some()
    }

    /// The stat items of this hierarchy, in [`crate::stat::StatId`] order.
    pub fn stat_items(&self) -> &[crate::stat::StatItem] {
        self.shared.stats.items()
    }

    /// The root group.
    pub fn root(&self) -> Group {
        Group::new(self.shared.clone(), self.shared.root.clone())
    }

    /// The live group at `path` (`"a/b"`, `"/a/b"`; `""` or `"/"` is the
    /// root). Walks the path one group at a time and takes each parent's
    /// child-map *read* lock only while it finds the next name (`O(log
    /// siblings)`); there is no global lock. Lookups never wait for each
    /// other, even through the root; one waits only for a creation or
    /// removal of a child of a group on its path, which holds that group's
    /// write lock for an insertion or removal in its map.
    pub fn lookup(&self, path: &str) -> Result<Group, GroupError> {
        let mut node = self.shared.root.clone();
        for name in components(path) {
            // A removed group can still be in its parent's map for a moment
            // (`Shared::unlink` marks it, then takes it out): it is not
            // found.
            let next = node
                .children_read()
                .get(name)
                .filter(|n| !n.is_removed())
                .cloned();
            node = next.ok_or_else(|| GroupError::NotFound {
                path: super::name::shown_path(path),
            })?;
        }
        Ok(Group::new(self.shared.clone(), node))
    }

    /// Return every stocked unit of every group to the usage counters: the
    /// per-CPU stock of charges and, with an allocator attached, its
    /// per-CPU byte stock and the calling thread's reserve. (Other threads'
    /// reserves come back when they call [`crate::alloc::drain_thread`] —
    /// e.g. when a runtime's worker parks — allocate in another group, or
    /// exit.) Returns the units returned. Exact while other threads drain
    /// too: when it returns, what was stocked when it began is off the
    /// usage counters, whichever drain took it.
    pub fn drain_stocks(&self) -> u64 {
        self.shared.drain(&|_| true)
    }

    /// What draining the per-CPU stocks (the charge stock and, with an
    /// allocator attached, the byte stock) has cost the CPUs so far:
    /// drains, other CPUs' blocks locked, and CPUs interrupted. A group
    /// hammered over its limit must leave these still: a cooperative
    /// over-charge never drains, and a refusal drains only when the
    /// stocked units of the refusing subtree could make room.
    ///
    /// ```
    /// use splitcount::group::Hierarchy;
    /// let h = Hierarchy::default();
    /// let g = h.root().child("g").unwrap();
    /// g.set_max(100).unwrap();
    /// let before = h.stock_activity();
    /// for _ in 0..1_000 {
    ///     assert!(g.charge(200).is_err()); // nothing stocked could help
    /// }
    /// assert_eq!(h.stock_activity().fences, before.fences);
    /// assert_eq!(h.stock_activity().drains, before.drains);
    /// ```
    pub fn stock_activity(&self) -> StockActivity {
        self.shared.stock_activity()
    }

    /// Whether the hierarchy's stock takes hits as rseq critical sections
    /// (x86_64 Linux with glibc's rseq and `membarrier`), rather than a
    /// lock per operation. It leaves rseq mode for good if `membarrier`
    /// starts failing — a seccomp sandbox entered after the hierarchy was
    /// made — see [`StockActivity::sealed`].
    pub fn uses_rseq_stock(&self) -> bool {
        self.shared.stock.uses_rseq()
    }

    /// Units stocked on CPU `cpu` (of the hierarchy's machine) for all its
    /// groups, not counting the allocator's bytes: at most the stock budget
    /// ([`HierarchyConfig::stock_budget`]). Waits for that CPU's stock
    /// lock; for tests and reports.
    pub fn stocked_on_cpu(&self, cpu: usize) -> u64 {
        self.shared.stock.stocked_on(cpu)
    }

    /// The most that the usage of the root (or of any group, counting its
    /// subtree) can run ahead of the units its callers hold: every CPU's
    /// stock at its budget ([`HierarchyConfig::stock_budget`]), whatever
    /// the number of groups. Stocked units are charged, so no limit is
    /// passed because of them; a refusal drains the refusing subtree's
    /// stocked units before it is final. The allocator's bytes have their
    /// own bound ([`crate::alloc::Accounted::max_slack`]).
    ///
    /// ```
    /// use splitcount::cpu::Machine;
    /// use splitcount::group::{Hierarchy, HierarchyConfig};
    /// let m = Machine::simulated(4, 1).unwrap();
    /// let h = Hierarchy::new(HierarchyConfig::default().machine(&m)).unwrap();
    /// assert_eq!(h.max_slack(), 4 * 7 * 64);
    /// ```
    pub fn max_slack(&self) -> u64 {
        let stock = &self.shared.stock;
        (stock.cpus() as u64).saturating_mul(stock.budget())
    }

    /// The state every handle of this hierarchy shares.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The id of the stat item named `name`, if the schema has it.
    pub fn stat_id(&self, name: &str) -> Option<StatId> {
        self.shared
            .stats
            .items()
            .iter()
            .position(|i| i.name == name)
            .map(|i| StatId(i, self.shared.stats.identity()))
    }

    /// The statistics machinery (schema, flush counts).
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Start (or restart with a new period) a background thread that
    /// forces a flush of the whole hierarchy every `period`. It stops with
    /// [`Hierarchy::stop_flusher`] or when the last handle of the hierarchy
    /// is dropped.
    ///
    /// A period below [`MIN_FLUSH_PERIOD`] is refused (`GroupError::Config`,
    /// naming the minimum) and leaves a running flusher as it was.
    ///
    /// ```
    /// use splitcount::group::{Hierarchy, MIN_FLUSH_PERIOD};
    /// use std::time::Duration;
    /// let h = Hierarchy::default();
    /// let e = h.start_flusher(Duration::ZERO).unwrap_err();
    /// assert!(e.to_string().contains("at least 1ms"));
    /// h.start_flusher(MIN_FLUSH_PERIOD).unwrap();
    /// h.stop_flusher();
    /// ```
    pub fn start_flusher(&self, period: std::time::Duration) -> Result<(), GroupError> {
        if period < MIN_FLUSH_PERIOD {
            return Err(GroupError::Config(format!(
                "the flusher's period must be at least {MIN_FLUSH_PERIOD:?} (MIN_FLUSH_PERIOD), not {period:?}"
            )));
        }
        let f = Flusher::start(Arc::downgrade(&self.shared), period)
            .map_err(|e| GroupError::Thread(super::error::ThreadError(std::sync::Arc::new(e))))?;
        let old = self
            .shared
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(f);
        self.shared.set_flush_period(period);
        drop(old);
        Ok(())
    }

    /// Stop the background flusher, waiting for a flush in progress.
    pub fn stop_flusher(&self) {
        let old = self
            .shared
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.shared.set_flush_period(DEFAULT_FLUSH_PERIOD);
        drop(old);
    }
}

fn stat_error(e: StatError) -> GroupError {
    GroupError::Stat(e)
}

impl Shared {
    /// The period reads trust a flush for: the flusher's, or
    /// [`DEFAULT_FLUSH_PERIOD`].
    pub(crate) fn flush_period(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(
            self.flush_period_ns
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Drain a removed node's units from both stocks, by key (see
    /// `Stock::drain_key`: only the CPUs that stock it are locked), and the
    /// calling thread's reserve.
    pub(crate) fn drain_node(&self, node: &Node) -> u64 {
        use crate::charge::StockKey;
        let mut drained = self.stock.drain_key(node.usage.as_raw());
        if let Some(bytes) = self.bytes.get() {
            drained += (bytes.drain_thread)();
            if let Some(account) = node.existing_account() {
                drained += bytes.stock.drain_key(account.as_raw());
            }
        }
        drained
    }

    /// Drain both stocks' slots whose counter satisfies `which`, and the
    /// calling thread's allocator reserve; the units returned.
    pub(crate) fn drain(&self, which: &dyn Fn(&UsageCounter) -> bool) -> u64 {
        let mut drained = self.stock.drain_all(which);
        if let Some(bytes) = self.bytes.get() {
            drained += (bytes.drain_thread)();
            drained += bytes.stock.drain_all(which);
        }
        drained
    }

    /// The drain of a refusal: `refuser`'s limit is `short` units short of
    /// a charge. The calling thread's reserve comes back (it is local);
    /// the stocks are drained of `refuser`'s subtree only when what they
    /// can hold of it could make up the shortfall: no slot holds a key of
    /// the subtree, or fewer than `short / batch` do, and no other CPU is
    /// touched — a drain that cannot change the decision is not made.
    /// Otherwise as [`Shared::drain`] (each other CPU's block is fenced only
    /// if it holds units of the subtree). The units returned, and whether
    /// the stocks were drained.
    pub(crate) fn drain_for_refusal(&self, refuser: &UsageCounter, short: u64) -> (u64, bool) {
        let bytes = self.bytes.get();
        let mut drained = bytes.map_or(0, |b| (b.drain_thread)());
        // Each slot holds at most its stock's batch.
        let batch = bytes.map_or(0, |b| b.stock.batch()).max(self.stock.batch());
        let slots = refuser.stock_slots();
        if slots == 0 || slots.saturating_mul(batch) < short.saturating_sub(drained) {
            return (drained, false);
        }
        let within = |c: &UsageCounter| c.is_within(refuser);
        drained += self.stock.drain_all(&within);
        if let Some(b) = bytes {
            drained += b.stock.drain_all(&within);
        }
        (drained, true)
    }

    /// Both stocks' [`StockActivity`], added up.
    pub(crate) fn stock_activity(&self) -> StockActivity {
        let mut a = self.stock.activity();
        if let Some(b) = self.bytes.get() {
            let b = b.stock.activity();
            a.drains += b.drains;
            a.remote_locks += b.remote_locks;
            a.fences += b.fences;
            a.sealed += b.sealed;
            a.yields += b.yields;
        }
        a
    }

    fn set_flush_period(&self, period: std::time::Duration) {
        let ns = period.as_nanos().min(u64::MAX as u128) as u64;
        self.flush_period_ns
            .store(ns, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn create_child(
        self: &Arc<Self>,
        parent: &Arc<Node>,
        name: &str,
    ) -> Result<Arc<Node>, GroupError> {
        let node = self.new_child(parent, name)?;
        self.publish_child(parent, node)
    }

    /// The live child of `parent` named `name`; if there is none, a new one,
    /// given to `init` before it is published (see
    /// `Group::child_or_create_with`).
    pub(crate) fn child_or_create(
        self: &Arc<Self>,
        parent: &Arc<Node>,
        name: &str,
        init: impl FnOnce(&Arc<Node>) -> Result<(), GroupError>,
    ) -> Result<Arc<Node>, GroupError> {
        let live = |parent: &Node| {
            parent
                .children_read()
                .get(name)
                .filter(|n| !n.is_removed())
                .cloned()
        };
        if let Some(n) = live(parent) {
            return Ok(n);
        }
        let node = self.new_child(parent, name)?;
        init(&node)?;
        loop {
            match self.publish_child(parent, node.clone()) {
                // Published by a racing caller meanwhile: theirs, if it is
                // still live (ours is dropped unseen); if it was removed
                // since, ours takes its place.
                Err(GroupError::NameTaken { .. }) => {
                    if let Some(n) = live(parent) {
                        return Ok(n);
                    }
                }
                other => return other,
            }
        }
    }

    /// A child of `parent` named `name`, not yet in the tree.
    fn new_child(
        self: &Arc<Self>,
        parent: &Arc<Node>,
        name: &str,
    ) -> Result<Arc<Node>, GroupError> {
        validate_name(name)?;
        // Everything that allocates happens before the parent's lock: the
        // lock covers only the checks and the insertion.
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stats = StatGroup::new(&self.stats, id, Some(parent.stats.clone()), true)
            .map_err(stat_error)?;
        let node = Arc::new(Node::new(
            Some(parent.clone()),
            name.to_owned(),
            child_path(&parent.path, name),
            UsageCounter::child_of(&parent.usage),
            stats,
        ));
        Ok(node)
    }

    /// Put `node` (from `new_child`) in its parent's map, unless the parent
    /// was removed or a live sibling has its name.
    fn publish_child(&self, parent: &Arc<Node>, node: Arc<Node>) -> Result<Arc<Node>, GroupError> {
        let key = node.name.clone();
        let mut siblings = parent.children();
        // Under the parent's lock: `unlink` marks a node removed under its
        // own lock, so a removed parent gets no new child.
        if parent.is_removed() {
            return Err(GroupError::Removed {
                path: parent.path.clone(),
            });
        }
        // A removed sibling may still hold the name for a moment (`unlink`
        // marks it, then takes it out, only if it is still the one there):
        // names are unique among *live* siblings, so it gives way.
        if siblings.get(&key).is_some_and(|n| !n.is_removed()) {
            return Err(GroupError::NameTaken {
                path: node.path.clone(),
            });
        }
        siblings.insert(key, node.clone());
        Ok(node)
    }

    pub(crate) fn children_of(&self, node: &Node) -> Vec<Arc<Node>> {
        node.children_read().values().cloned().collect()
    }

    /// Unlink `node` (which must have no live children) from the tree and
    /// mark it removed. Its stocks are drained by the caller. With an
    /// allocator attached, its trim policy is told (`TrimPolicy::on_remove`).
    ///
    /// Locks the node's own child map (to check it is empty and mark it
    /// removed, so that no child can be created after), then its parent's
    /// (to take it out, by name: `O(log siblings)`). Creation takes only
    /// the parent's lock; locks are always taken child before parent.
    pub(crate) fn unlink(&self, node: &Arc<Node>) -> Result<(), GroupError> {
        let Some(parent) = node.parent.as_ref() else {
            return Err(GroupError::RootCannotBeRemoved);
        };
        {
            let children = node.children();
            if node.is_removed() {
                return Err(GroupError::Removed {
                    path: node.path.clone(),
                });
            }
            if !children.is_empty() {
                return Err(GroupError::HasChildren {
                    path: node.path.clone(),
                    children: children.len(),
                });
            }
            node.mark_removed();
        }
        {
            let mut siblings = parent.children();
            if siblings
                .get(node.name.as_str())
                .is_some_and(|n| Arc::ptr_eq(n, node))
            {
                siblings.remove(node.name.as_str());
            }
        }
        // Outside the locks: the allocator's trim policy may trim now.
        if self.bytes.get().is_some() {
            crate::alloc::group_removed();
        }
        Ok(())
    }
}

impl Drop for Shared {
    /// Parents hold their children and children their parents: break the
    /// tree's links, iteratively (a deep tree must not recurse), so that
    /// every group no handle keeps goes with the hierarchy.
    fn drop(&mut self) {
        let mut stack = vec![self.root.clone()];
        while let Some(n) = stack.pop() {
            let children = std::mem::take(&mut *n.children());
            stack.extend(children.into_values());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `unlink` marks a group removed, then takes it out of its parent's
    /// map: between the two, its name must already hand out nothing of it.
    /// The window, opened by hand.
    fn half_removed() -> (Hierarchy, Group, Arc<Node>) {
        let h = Hierarchy::default();
        let tenants = h.root().child("tenants").unwrap();
        let t = tenants.child("t").unwrap();
        t.node().mark_removed(); // still in `tenants`' map
        let node = t.node().clone();
        (h, tenants, node)
    }

    #[test]
    fn a_group_marked_removed_is_not_found_by_lookup() {
        let (h, _tenants, _node) = half_removed();
        assert!(matches!(
            h.lookup("tenants/t"),
            Err(GroupError::NotFound { .. })
        ));
    }

    #[test]
    fn child_or_create_replaces_a_group_marked_removed() {
        let (_h, tenants, node) = half_removed();
        let fresh = tenants.child_or_create("t").unwrap();
        assert!(!fresh.is_removed());
        assert!(
            !Arc::ptr_eq(fresh.node(), &node),
            "a new group, not the removed one"
        );
        assert_eq!(
            tenants.children(),
            vec![fresh],
            "the name is the new group's"
        );
    }

    #[test]
    fn child_takes_the_name_of_a_group_marked_removed() {
        let (_h, tenants, node) = half_removed();
        let fresh = tenants.child("t").unwrap();
        assert!(!Arc::ptr_eq(fresh.node(), &node));
    }
}
