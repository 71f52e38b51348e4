//! [`Group`]: a cheap handle on one group, and the charge path.

use super::events::{self, EventHook, EventKind, EventReceiver, GroupEvent};
use super::hierarchy::Shared;
use super::hooks::{AllocRefusalHook, Hooks, OomHook, PressureHook, ReclaimHook};
use super::node::{BreachMode, Node};
use super::reclaim;
use super::snapshot::{limit, GroupSnapshot, Snapshot, SnapshotOptions};
use super::{
    ChargeError, ChargeErrorKind, Consumer, GroupError, OverLimit, Refusal, TOP_CONSUMERS,
};
use crate::charge::usage::EPISODE_REFUSED;
use crate::charge::{Consumed, Enforcement, Events, UsageCounter, MAX_REQUEST};
use crate::stat::{StatError, StatId};
use std::fmt;
use std::sync::Arc;

/// A handle on a group. Cheap to clone, `Send + Sync`. A handle that
/// outlives its group's removal keeps working: charges act on the nearest
/// live ancestor (the kernel's reparenting), and uncharges give back what
/// they charged there, then what the removed group still holds (see
/// [`Group::remove`]).
///
/// ```
/// use splitcount::Hierarchy;
///
/// let h = Hierarchy::default();
/// let a = h.root().child("a").unwrap();
/// assert_eq!(a, h.lookup("a").unwrap());          // identity: the same group
/// assert_eq!(a.path(), "/a");
/// a.charge(10).unwrap();                          // through this CPU's stock
/// h.drain_stocks();                               // stocked units back to the counters
/// assert_eq!(h.root().usage(), 10);               // charges reach every ancestor
/// a.uncharge(10);
/// a.remove().unwrap();
/// ```
#[derive(Clone)]
pub struct Group {
    shared: Arc<Shared>,
    node: Arc<Node>,
}

impl Group {
    pub(crate) fn new(shared: Arc<Shared>, node: Arc<Node>) -> Group {
        Group { shared, node }
    }

    /// The nearest live group: this one, or the ancestor its charges go to
    /// after removal.
    #[inline]
    fn live(&self) -> &Arc<Node> {
        self.node.live()
    }

    /// The allocator's account of this group (made on first use, with its
    /// ancestors').
    pub(crate) fn account(&self) -> super::AccountKey {
        self.node.account(&self.shared)
    }

    /// The stat items of the group's hierarchy.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn stat_items(&self) -> &[crate::stat::StatItem] {
        self.shared.stats.items()
    }

    /// Whether the group's hierarchy counts bytes (an allocator is
    /// attached).
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn counts_bytes(&self) -> bool {
        self.shared.bytes.get().is_some()
    }

    /// The group's path, `"/"` for the root.
    pub fn path(&self) -> &str {
        &self.node.path
    }

    /// The group's name (its last path component; `"/"` for the root).
    pub fn name(&self) -> &str {
        self.node
            .path
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or("/")
    }

    /// The parent group, `None` for the root.
    pub fn parent(&self) -> Option<Group> {
        self.node
            .parent
            .clone()
            .map(|p| Group::new(self.shared.clone(), p))
    }

    /// Whether the group was removed.
    pub fn is_removed(&self) -> bool {
        self.node.is_removed()
    }

    /// Create a child group named `name` (validated; unique among live
    /// siblings).
    pub fn child(&self, name: &str) -> Result<Group, GroupError> {
        let node = self.shared.create_child(&self.node, name)?;
        Ok(Group::new(self.shared.clone(), node))
    }

    /// The live child named `name`, created if there is none: the
    /// get-or-create a server wants for a tenant's group (names are unique
    /// among live siblings, so racing callers get the same group).
    ///
    /// ```
    /// use splitcount::group::Hierarchy;
    /// let h = Hierarchy::default();
    /// let a = h.root().child_or_create("tenant-a").unwrap();
    /// let again = h.root().child_or_create("tenant-a").unwrap();
    /// assert_eq!(a, again);
    /// ```
    pub fn child_or_create(&self, name: &str) -> Result<Group, GroupError> {
        self.child_or_create_with(name, |_| Ok(()))
    }

    /// [`Group::child_or_create`], with `init` run on the group when this
    /// call creates it — *before* it is published under its name: racing
    /// callers get the same group, and none of them sees it before `init`
    /// is done. The way to give a tenant its limit once, at creation, so
    /// that a limit changed later (or a deliberate "unlimited") is never
    /// undone by a check-then-set.
    ///
    /// If `init` fails, nothing is created and its error is returned. A
    /// group that already exists is returned as it is (`init` does not
    /// run). Two callers that both find no group may both run `init`, each
    /// on a group of its own; one group is published and the other is
    /// dropped unseen, so `init` should only configure its group. `init` must not create children of the new group (it is not
    /// in the tree yet: `Removed` is returned for them).
    ///
    /// ```
    /// use splitcount::{Enforcement, Hierarchy};
    /// use splitcount::group::BreachMode;
    ///
    /// let h = Hierarchy::default();
    /// let tenants = h.root().child("tenants").unwrap();
    /// let tenant = |name: &str| {
    ///     tenants.child_or_create_with(name, |g| {
    ///         g.set_enforcement(Enforcement::Cooperative);
    ///         g.set_breach_mode(BreachMode::Level);
    ///         g.set_max(64 << 20)
    ///     })
    /// };
    /// let a = tenant("a").unwrap();
    /// assert_eq!(a.max(), 64 << 20);
    /// a.set_max(splitcount::charge::UNLIMITED).unwrap(); // an operator's decision…
    /// assert_eq!(tenant("a").unwrap().max(), splitcount::charge::UNLIMITED); // …stays
    /// ```
    pub fn child_or_create_with(
        &self,
        name: &str,
        init: impl FnOnce(&Group) -> Result<(), GroupError>,
    ) -> Result<Group, GroupError> {
        let node = self.shared.child_or_create(&self.node, name, |node| {
            init(&Group::new(self.shared.clone(), node.clone()))
        })?;
        Ok(Group::new(self.shared.clone(), node))
    }

    /// The live children, by name.
    pub fn children(&self) -> Vec<Group> {
        self.shared
            .children_of(&self.node)
            .into_iter()
            .map(|n| Group::new(self.shared.clone(), n))
            .collect()
    }

    /// The group's usage counter (limits, usage, events): public as
    /// [`crate::raw::usage_counter`], for benchmarks that charge around the
    /// stock.
    pub(crate) fn usage_counter(&self) -> &crate::sync::Arc<UsageCounter> {
        &self.node.usage
    }

    /// Usage: what was charged here and below, stocked units included.
    pub fn usage(&self) -> u64 {
        self.node.usage.usage()
    }

    /// The hard limit ([`crate::charge::UNLIMITED`] when none).
    pub fn max(&self) -> u64 {
        self.node.usage.max()
    }

    /// The soft limit.
    pub fn high(&self) -> u64 {
        self.node.usage.high()
    }

    /// The peak usage since creation or [`Group::reset_peak`].
    pub fn peak(&self) -> u64 {
        self.node.usage.peak()
    }

    /// Restart the peak from the current usage.
    pub fn reset_peak(&self) {
        self.node.usage.reset_peak()
    }

    /// This group's own event counts (max refusals at this group, high,
    /// oom, underflow): the kernel's `memory.events.local`.
    pub fn events(&self) -> Events {
        self.node.usage.events()
    }

    /// Event counts of this group and every group below it: the kernel's
    /// `memory.events`.
    pub fn subtree_events(&self) -> Events {
        self.node.usage.subtree_events()
    }

    /// Time charges to this group or below it spent stalled after a
    /// refusal — in reclaim hooks, drains, retries and OOM hooks — summed
    /// over the charges (the kernel's pressure-stall "some" total).
    pub fn stall(&self) -> std::time::Duration {
        self.node.usage.stall()
    }

    /// Units pre-charged to this group and held in the per-CPU stocks (the
    /// charge stock's and, with an allocator attached, the byte stock's) on
    /// all CPUs: part of [`Group::usage`] that nothing uses yet. Takes each
    /// CPU's lock.
    pub fn stocked(&self) -> u64 {
        let bytes = self
            .shared
            .bytes
            .get()
            .map_or(0, |b| b.stock.stocked(&self.node.usage));
        self.shared.stock.stocked(&self.node.usage) + bytes
    }

    /// Units pre-charged to this group or any group below it and held in
    /// the per-CPU stocks: the part of [`Group::usage`] (a subtree's) that
    /// nothing uses yet — what is in use lies in `[usage − this, usage]`
    /// (with an allocator attached, thread reserves add at most
    /// [`crate::alloc::MAX_THREAD_RESERVE`] per thread). Takes each CPU's
    /// lock.
    pub fn stocked_subtree(&self) -> u64 {
        let u = &self.node.usage;
        let bytes = self
            .shared
            .bytes
            .get()
            .map_or(0, |b| b.stock.stocked_within(u));
        self.shared.stock.stocked_within(u) + bytes
    }

    /// Set the hard limit. If the usage is above it, this group's subtree's
    /// stocked units (the charge stock's, and the allocator's byte stock
    /// and the calling thread's reserve) are drained and the limit tried
    /// again; `Busy` if still above. `Removed` for a removed group: charges
    /// through its handles go to its nearest live ancestor, so a limit set
    /// on it would hold nowhere (it used to answer `Ok`).
    pub fn set_max(&self, max: u64) -> Result<(), GroupError> {
        if self.node.is_removed() {
            return Err(GroupError::Removed {
                path: self.node.path.clone(),
            });
        }
        let usage = &self.node.usage;
        if usage.set_max(max).is_ok() {
            return Ok(());
        }
        self.shared.drain(&|c| c.is_within(usage));
        usage.set_max(max).map_err(|b| GroupError::Busy {
            path: self.node.path.clone(),
            usage: b.usage,
            max,
        })
    }

    /// What an allocation over this group's hard limit does (see
    /// [`Enforcement`]; [`Enforcement::Cooperative`] by default).
    pub fn enforcement(&self) -> Enforcement {
        self.node.usage.enforcement()
    }

    /// Choose what an allocation over this group's hard limit does.
    ///
    /// Switching to [`Enforcement::Refuse`] while the usage is above `max`
    /// (cooperative enforcement let the group past it) drains what
    /// [`Group::set_max`] drains — this subtree's stocked units and the
    /// calling thread's allocator reserve — so that the next allocation
    /// charged here from this thread is refused, not served from bytes
    /// charged past the limit. Other threads' reserves (at most
    /// [`crate::alloc::MAX_THREAD_RESERVE`] each) are spent before their
    /// next allocation is refused.
    pub fn set_enforcement(&self, e: Enforcement) {
        let usage = &self.node.usage;
        usage.set_enforcement(e);
        if e == Enforcement::Refuse && usage.usage() > usage.max() {
            self.shared.drain(&|c| c.is_within(usage));
        }
    }

    /// The usage past which even a cooperative over-charge is refused
    /// ([`crate::charge::UNLIMITED`] — none — by default).
    pub fn ceiling(&self) -> u64 {
        self.node.usage.ceiling()
    }

    /// Refuse allocations (null) that would take this group's usage past
    /// `ceiling`, even in [`Enforcement::Cooperative`] mode: a runaway
    /// request cannot take the machine. Off by default.
    ///
    /// It bounds how far past `max` cooperative enforcement lets an
    /// allocation go ([`crate::alloc::Accounted`], the preload's `malloc`)
    /// and is read only then: it is not a limit of its own. A ceiling at or
    /// below `max` changes nothing (allocations are refused at `max`
    /// before it matters), [`Group::charge`] refuses at `max` whatever the
    /// ceiling, [`Group::over_charge`] and [`Group::force_charge`] pass it,
    /// and a ceiling below the usage is accepted (it refuses the next
    /// allocation over `max`).
    pub fn set_ceiling(&self, ceiling: u64) {
        self.node.usage.set_ceiling(ceiling)
    }

    /// The checkpoint of cooperative enforcement: `Err` with the numbers if
    /// an allocation charged to this group (or below it) went over a limit
    /// and was let through ([`Enforcement::Cooperative`]) — until
    /// [`Group::clear_breach`] ([`BreachMode::Sticky`], the default), or
    /// until the usage of the group whose limit was passed is back at or
    /// under its `max` ([`BreachMode::Level`]). Costs one load when nothing
    /// happened.
    ///
    /// ```
    /// use splitcount::group::Hierarchy;
    /// let h = Hierarchy::default();
    /// let request = h.root().child("request").unwrap();
    /// assert!(request.check().is_ok());
    /// ```
    ///
    /// A removed group's handle also reports the group its charges now go
    /// to (the nearest live ancestor) being over a limit, its own or an
    /// ancestor's: work that outlives its group (a request's sub-task still
    /// running after the request's group was removed) charges that group,
    /// and is stopped by its limit as it would have been by the removed
    /// group's breach.
    #[inline]
    pub fn check(&self) -> Result<(), OverLimit> {
        match self.node.breach() {
            None if self.node.is_removed() => self.check_removed(),
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// [`Group::check`] of a removed group without a breach of its own:
    /// the first group from the nearest live one up whose usage is over
    /// its `max` (an over-charge let it through).
    #[cold]
    fn check_removed(&self) -> Result<(), OverLimit> {
        let live = self.live();
        let mut at = Some(live);
        while let Some(node) = at {
            let (usage, max) = (node.usage.usage(), node.usage.max());
            if usage > max {
                return Err(OverLimit {
                    charged: live.path.clone(),
                    group: node.path.clone(),
                    usage,
                    max,
                    request: 0,
                    top: node.top(super::TOP_CONSUMERS),
                });
            }
            at = node.parent.as_ref();
        }
        Ok(())
    }

    /// Forget a recorded breach (see [`Group::check`]).
    pub fn clear_breach(&self) {
        self.node.clear_breach()
    }

    /// How long a breach of this group lasts ([`BreachMode::Sticky`] by
    /// default).
    pub fn breach_mode(&self) -> BreachMode {
        self.node.breach_mode()
    }

    /// Choose how long a breach of this group lasts: until
    /// [`Group::clear_breach`] (`Sticky`, for per-request groups) or until
    /// the usage is back under the limit (`Level`, for long-lived tenant
    /// groups). Applies to the breach recorded now too.
    pub fn set_breach_mode(&self, mode: BreachMode) {
        self.node.set_breach_mode(mode)
    }

    /// Set the soft limit: crossing it records `high` events and calls the
    /// pressure hook, never refuses.
    ///
    /// The usage it is compared with counts the units stocked on CPUs
    /// (see [`Group::stocked`]). A refill — a batch taken to stock its
    /// surplus, or an allocating thread's reserve — is taken only if it
    /// leaves the group at or below `high` (else the charge takes just what
    /// it asks for), so a refill's surplus does not cross `high` — except
    /// after the group has been above `high` and come back, until a refill
    /// fits under it again (hysteresis: the group does not flap across
    /// `high` on every stock miss). Units
    /// already stocked still count — stocked before the usage came near
    /// `high`, or stashed by uncharges on their CPU —, so a crossing can
    /// come early by up to a batch per CPU that charged the group (what is
    /// in use is `usage() − stocked_subtree()`, [`Group::stocked_subtree`],
    /// less thread reserves).
    pub fn set_high(&self, high: u64) {
        self.node.usage.set_high(high)
    }

    /// Add a subscriber called when this group's limit refuses a charge
    /// (see [`ReclaimHook`]); subscribers run in order, their units summed.
    pub fn on_reclaim(&self, f: impl Fn(&Group, u64) -> u64 + Send + Sync + 'static) {
        self.node
            .replace_hooks(|h| h.reclaim.push(Arc::new(f) as ReclaimHook));
    }

    /// Add a subscriber called when nothing else made room (see
    /// [`OomHook`]); subscribers run in order until one asks for a retry.
    pub fn on_oom(&self, f: impl Fn(&Group, u64) -> bool + Send + Sync + 'static) {
        self.node
            .replace_hooks(|h| h.oom.push(Arc::new(f) as OomHook));
    }

    /// Add a subscriber called once each time a charge takes this group
    /// above `high` (see [`PressureHook`]).
    pub fn on_pressure(&self, f: impl Fn(&Group, u64) + Send + Sync + 'static) {
        self.node
            .replace_hooks(|h| h.pressure.push(Arc::new(f) as PressureHook));
    }

    /// Add a subscriber called (with accounting off) when the allocator is
    /// about to refuse an allocation charged to this group or below it
    /// (see [`AllocRefusalHook`]). The charged group's subscribers run
    /// first, then its ancestors'; one that returns `true` (it freed
    /// memory) earns the allocation one more try. Subscribe on the root for
    /// a process-wide hook.
    pub fn on_alloc_refusal(&self, f: impl Fn(&Refusal) -> bool + Send + Sync + 'static) {
        self.node
            .replace_hooks(|h| h.alloc_refusal.push(Arc::new(f) as AllocRefusalHook));
    }

    /// Add a subscriber to this group's events (see [`GroupEvent`]): called
    /// once per crossing, with accounting off, on the thread that made it.
    ///
    /// ```
    /// use splitcount::group::{EventKind, Hierarchy};
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    ///
    /// let h = Hierarchy::default();
    /// let q = h.root().child("query").unwrap();
    /// q.set_max(100).unwrap();
    /// let refusals = Arc::new(AtomicU64::new(0));
    /// let seen = refusals.clone();
    /// q.on_event(move |e| {
    ///     if e.kind == EventKind::MaxRefused {
    ///         seen.fetch_add(1, Ordering::Relaxed);
    ///     }
    /// });
    /// for _ in 0..10 {
    ///     assert!(q.charge(1000).is_err());   // one episode at the limit …
    /// }
    /// assert_eq!(refusals.load(Ordering::Relaxed), 1); // … one event
    /// ```
    pub fn on_event(&self, f: impl Fn(&GroupEvent) + Send + Sync + 'static) {
        self.node
            .replace_hooks(|h| h.events.push(Arc::new(f) as EventHook));
        events::listen(&self.shared, &self.node);
    }

    /// Subscribe to this group's events through a bounded queue of
    /// `capacity` events (at least 1): read it from any thread; when it is
    /// full, new events are dropped and counted
    /// ([`EventReceiver::dropped`]).
    pub fn event_channel(&self, capacity: usize) -> Result<EventReceiver, GroupError> {
        if capacity == 0 {
            return Err(GroupError::Config(
                "an event channel needs a capacity of at least 1".into(),
            ));
        }
        let (hook, rx) = events::channel(capacity);
        self.node.replace_hooks(|h| h.events.push(hook));
        events::listen(&self.shared, &self.node);
        Ok(rx)
    }

    /// Remove every hook of this group.
    pub fn clear_hooks(&self) {
        self.node.replace_hooks(|h| *h = Hooks::default());
    }

    /// Charge `n` units regardless of limits (the kernel's forced charge),
    /// without the stock.
    ///
    /// A request above [`MAX_REQUEST`] is refused (`TooLarge`): it can only
    /// be a caller's bug, and would saturate every ancestor's usage. One
    /// that would take the root's usage past
    /// [`MAX_USAGE`](crate::charge::MAX_USAGE) is refused (`Saturated`),
    /// not lost.
    pub fn force_charge(&self, n: u64) -> Result<(), ChargeError> {
        if self.node.is_removed() {
            return self.redirect(n, |to| self.force_charge_on(to, n));
        }
        self.force_charge_on(&self.node, n)
    }

    fn force_charge_on(&self, node: &Arc<Node>, n: u64) -> Result<(), ChargeError> {
        if n > MAX_REQUEST {
            return Err(self.error(ChargeErrorKind::TooLarge, node, n));
        }
        self.refuse_saturation(node, n)?;
        if node.usage.charge(n) {
            self.shared.pressure(node, reclaim::direct);
        }
        Ok(())
    }

    /// Charge `n` units that must not fail, and say so when they pass a
    /// limit: what the allocator does for a cooperative over-charge,
    /// whatever the enforcement. Within every limit it is
    /// [`Group::force_charge`]. Past a `max` (the nearest one in the way,
    /// here or above), the units are charged all the same, and that limit
    /// counts a `max` event and — the first time in an episode over it — a
    /// breach (`Events::breaches`); every group from this one up to it is
    /// marked breached, which [`Group::check`] reports and a
    /// [`EventKind::Breached`] event announces, until
    /// [`Group::clear_breach`] (or, in [`BreachMode::Level`], until the
    /// usage is back under `max`). The kernel counts its forced charges
    /// past `memory.max` the same way (a `max` event). Units stocked for
    /// the limit's subtree are drained first when they could make room (a
    /// limit only the stocks fill is not passed); no reclaim hooks, no
    /// refusal: a ceiling does not stop it either.
    ///
    /// A request above [`MAX_REQUEST`] is refused (`TooLarge`).
    ///
    /// ```
    /// use splitcount::group::Hierarchy;
    /// let h = Hierarchy::default();
    /// let g = h.root().child("must-run").unwrap();
    /// g.set_max(100).unwrap();
    /// g.over_charge(60).unwrap();
    /// assert!(g.check().is_ok());              // within the limit
    /// g.over_charge(60).unwrap();              // past it: charged, and reported
    /// assert_eq!(g.usage(), 120);
    /// let over = g.check().unwrap_err();
    /// assert_eq!(over.to_string(), "/must-run went over the limit of /must-run: usage 120 of 100 after a charge of 60");
    /// assert_eq!((g.events().max, g.events().breaches), (1, 1));
    /// ```
    pub fn over_charge(&self, n: u64) -> Result<(), ChargeError> {
        if self.node.is_removed() {
            return self.redirect(n, |to| self.over_charge_on(to, n));
        }
        self.over_charge_on(&self.node, n)
    }

    fn over_charge_on(&self, node: &Arc<Node>, n: u64) -> Result<(), ChargeError> {
        if n > MAX_REQUEST {
            return Err(self.error(ChargeErrorKind::TooLarge, node, n));
        }
        self.refuse_saturation(node, n)?;
        // Stocked units count in the usage: a limit that only they fill is
        // not passed — drain them first when they could make room (as a
        // refusal does), then decide.
        let fits = node.usage.try_charge_quiet(n).or_else(|limit| {
            let short = limit.usage().saturating_add(n).saturating_sub(limit.max());
            match self.shared.drain_for_refusal(limit, short) {
                (_, true) => node.usage.try_charge_quiet(n),
                (_, false) => Err(limit),
            }
        });
        let crossed = match fits {
            Ok(crossed) => crossed,
            Err(limit) => {
                let crossed = node.usage.charge(n);
                limit.record_over_charge();
                let refuser = node.find(limit);
                crate::alloc::without_accounting(|| {
                    super::mark_breached(&self.shared, node, &refuser, n)
                });
                crossed
            }
        };
        if crossed {
            self.shared.pressure(node, reclaim::direct);
        }
        Ok(())
    }

    /// Charge `n` units, or say why not.
    ///
    /// 1. This CPU's stock: if it holds `n` units for the group, take them.
    /// 2. Charge a batch (or, with more groups on the CPU than its budget
    ///    has batches for, the group's share of the budget) to the usage
    ///    counters if `n` is smaller, and keep the surplus in the stock.
    /// 3. Refused: charge exactly `n`; call the refusing group's reclaim
    ///    hook; drain all CPUs' stocks of its subtree (once per refusing
    ///    group); retry up to [`super::MAX_RECLAIM_RETRIES`] times while progress
    ///    is made; then the out-of-memory hook; then fail with the limit,
    ///    usage and request of the refusing group.
    ///
    /// ```
    /// use splitcount::group::Hierarchy;
    /// let h = Hierarchy::default();
    /// let g = h.root().child("q").unwrap();
    /// g.set_max(100).unwrap();
    /// g.charge(60).unwrap();
    /// let e = g.charge(60).unwrap_err();
    /// assert_eq!((e.limit(), e.usage(), e.request()), (100, 60, 60));
    /// assert_eq!(e.to_string(), "charge of 60 units to /q refused by the limit of /q: limit 100, usage 60, request 60");
    /// ```
    #[inline]
    pub fn charge(&self, n: u64) -> Result<(), ChargeError> {
        if n == 0 {
            return Ok(());
        }
        if self.node.is_removed() {
            return self.redirect(n, |to| self.charge_on(to, n));
        }
        self.charge_on(&self.node, n)
    }

    /// [`Group::charge`] of `node` (this group's, or its nearest live
    /// ancestor's after removal).
    #[inline(always)]
    fn charge_on(&self, node: &Arc<Node>, n: u64) -> Result<(), ChargeError> {
        let stock = &self.shared.stock;
        let machine = &self.shared.config.machine;
        let (taken, mut refill) = stock.take_if_held(|| machine.current_cpu(), &node.usage, n);
        if taken == Consumed::Hit {
            return Ok(());
        }
        if refill == 0 {
            // No slot here. With the window full, through the parent's
            // slot (lock-free on a hit; see `Stock::charge_through_parent`);
            // else the admission filter decides.
            let cpu = machine.current_cpu();
            if let Some(crossed) = stock.charge_through_parent(cpu, &node.usage, n) {
                if crossed {
                    self.shared.pressure(node, reclaim::direct);
                }
                return Ok(());
            }
            refill = stock.admit_absent(cpu, &node.usage);
        }
        // A batch, or the group's share of this CPU's budget.
        if n < refill {
            if let Ok(crossed) = node.usage.try_charge_refill(refill) {
                let _ = stock
                    .stash_surplus(|| machine.current_cpu(), &node.usage, refill - n, refill)
                    .uncharge();
                if crossed {
                    self.shared.pressure(node, reclaim::direct);
                }
                return Ok(());
            }
        }
        // Nothing to stock — the stock left the group out (every slot of
        // this CPU is another group's, and its admission filter kept them)
        // — or the refill was refused, by a `max` or by a `high` the batch
        // would cross (in the band of a batch below `high` every miss comes
        // here): just `n`, on the counters, with no `Arc` traffic; the slow
        // path if refused.
        if (refill == 0 || n < refill) && n <= MAX_REQUEST {
            if let Ok(crossed) = node.usage.try_charge_quiet(n) {
                if crossed {
                    self.shared.pressure(node, reclaim::direct);
                }
                return Ok(());
            }
        }
        self.charge_slow(node.clone(), n)
    }

    /// Charge exactly `n` units, without the stock, through the slow path
    /// (reclaim hooks, drains, OOM hooks): the group's usage moves by `n`
    /// and nothing is left stocked ([`super::Reservation`]'s exact mode).
    pub(crate) fn charge_unstocked(&self, n: u64) -> Result<(), ChargeError> {
        if n == 0 {
            return Ok(());
        }
        if self.node.is_removed() {
            return self.redirect(n, |to| self.charge_slow(to.clone(), n));
        }
        self.charge_slow(self.node.clone(), n)
    }

    /// Return `n` units straight to the usage counters (no stock): the
    /// inverse of [`Group::charge_unstocked`].
    pub(crate) fn uncharge_unstocked(&self, n: u64) {
        if n == 0 {
            return;
        }
        if self.node.is_removed() {
            self.uncharge_removed(n);
        } else {
            self.node.usage.uncharge(n);
        }
    }

    /// A charge through the handle of a removed group: `charge` charges
    /// its nearest live ancestor (the node it is given), and the units are
    /// counted as redirected *to that node*, so that uncharges through the
    /// handle give them back there — also once that node is removed in
    /// turn and the handle's charges go higher.
    ///
    /// Counted once charged: an uncharge only ever gives back units that
    /// were charged (counting first and taking back what was left after a
    /// refusal let a racing uncharge read a refused charge as given, and
    /// take the removed group's own units for it).
    #[cold]
    fn redirect(
        &self,
        n: u64,
        charge: impl FnOnce(&Arc<Node>) -> Result<(), ChargeError>,
    ) -> Result<(), ChargeError> {
        let to = self.live().clone();
        charge(&to)?;
        self.node.add_redirected(to, n);
        Ok(())
    }

    /// An uncharge through the handle of a removed group. Units charged
    /// through its handles after the removal went to a live ancestor of
    /// the time: they go back there, the latest first. The rest were
    /// charged before: they come off the removed group's own counter, and
    /// so off every ancestor's — clamped at what it still holds, the excess
    /// counted as an `underflow` there, so the ancestors never lose units
    /// their other descendants hold.
    #[cold]
    fn uncharge_removed(&self, n: u64) {
        let mut left = n;
        for (to, units) in self.node.take_redirected(n) {
            to.usage.uncharge(units);
            left -= units;
        }
        if left > 0 {
            self.node.usage.uncharge(left);
        }
    }

    /// The group's node, for the group module's other files.
    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    #[cold]
    fn charge_slow(&self, node: Arc<Node>, n: u64) -> Result<(), ChargeError> {
        if n > MAX_REQUEST {
            return Err(self.error(ChargeErrorKind::TooLarge, &node, n));
        }
        let counter = node.usage.clone();
        let mut try_charge = || {
            counter
                .try_charge_quiet(n)
                .map_err(|r| r as *const UsageCounter)
        };
        match self
            .shared
            .charge_with_reclaim(&node, n, &mut try_charge, reclaim::direct)
        {
            Ok(crossed) => {
                if crossed {
                    self.shared.pressure(&node, reclaim::direct);
                }
                Ok(())
            }
            Err(refuser) => {
                if refuser.usage.begin_episode(EPISODE_REFUSED) {
                    let (usage, max) = (refuser.usage.usage(), refuser.usage.refused_limit());
                    events::emit(
                        &self.shared,
                        &refuser,
                        EventKind::MaxRefused,
                        usage,
                        max,
                        None,
                    );
                }
                // A limit no higher than the counters hold refuses as a
                // limit; one above it only at the counters' ceiling.
                let saturated = refuser.usage.refused_limit() > crate::charge::MAX_USAGE
                    && refuser.usage.usage().saturating_add(n) > crate::charge::MAX_USAGE;
                if saturated {
                    return Err(ChargeError {
                        limit: crate::charge::MAX_USAGE,
                        ..self.error(ChargeErrorKind::Saturated, &refuser, n)
                    });
                }
                Err(self.error(ChargeErrorKind::Limit, &refuser, n))
            }
        }
    }

    /// A forced charge of `n` to `node` that would take the root's usage
    /// (the largest of its chain) past [`crate::charge::MAX_USAGE`]:
    /// refused, where the counters would saturate and lose the excess (an
    /// unlimited root then read as over its limit, and later uncharges as
    /// underflows). Charges racing this one can still meet the ceiling
    /// together; the counters then saturate.
    fn refuse_saturation(&self, node: &Arc<Node>, n: u64) -> Result<(), ChargeError> {
        let mut top = node;
        while let Some(p) = top.parent.as_ref() {
            top = p;
        }
        if top.usage.usage().saturating_add(n) <= crate::charge::MAX_USAGE {
            return Ok(());
        }
        Err(ChargeError {
            limit: crate::charge::MAX_USAGE,
            ..self.error(ChargeErrorKind::Saturated, top, n)
        })
    }

    fn error(&self, kind: ChargeErrorKind, refuser: &Node, n: u64) -> ChargeError {
        ChargeError {
            kind,
            charged: self.live().path.clone(),
            group: refuser.path.clone(),
            // The limit that refused, not one raised since.
            limit: match kind {
                ChargeErrorKind::Limit => refuser.usage.refused_limit(),
                ChargeErrorKind::TooLarge | ChargeErrorKind::Saturated => refuser.usage.max(),
            },
            usage: refuser.usage.usage(),
            request: n,
            top: match kind {
                ChargeErrorKind::Limit => refuser.top(TOP_CONSUMERS),
                ChargeErrorKind::TooLarge | ChargeErrorKind::Saturated => Vec::new(),
            },
        }
    }

    /// The `k` children with the largest usage, largest first (ties by
    /// name): who is using the memory under this group. One pass over the
    /// children, keeping `k` candidates.
    ///
    /// ```
    /// use splitcount::group::Hierarchy;
    /// let h = Hierarchy::default();
    /// let tenants = h.root().child("tenants").unwrap();
    /// for (name, units) in [("a", 300), ("b", 100), ("c", 200)] {
    ///     tenants.child(name).unwrap().force_charge(units).unwrap();
    /// }
    /// let top: Vec<_> = tenants.top(2).into_iter().map(|c| (c.group, c.usage)).collect();
    /// assert_eq!(top, [("/tenants/a".to_string(), 300), ("/tenants/c".to_string(), 200)]);
    /// assert_eq!(tenants.top(usize::MAX).len(), 3); // every child, whatever `k`
    /// ```
    pub fn top(&self, k: usize) -> Vec<Consumer> {
        self.node.top(k)
    }

    /// Return `n` units: into this CPU's stock (whose excess above the batch
    /// goes back to the usage counters), or straight to the counters when
    /// the stock is busy.
    ///
    /// Uncharging more than was charged is a caller's bug with a defined
    /// outcome: the usage is clamped at zero and an `underflow` event is
    /// recorded. Only what the group held is subtracted from its ancestors,
    /// so siblings are never harmed. *Where* it is seen:
    ///
    /// - An uncharge larger than the usage less what this CPU's stock holds
    ///   of the group is never stocked (stocked units are charged ones:
    ///   keeping it would let later charges take units no one paid for);
    ///   only what the usage can account for goes back, and the event is
    ///   recorded at once. With the group's stocked units all on this CPU
    ///   (one thread, or one CPU at a time) that is every over-uncharge.
    /// - Units the group's stocks hold on *other* CPUs are in its usage too,
    ///   and no CPU reads another's stock on an uncharge: they can cover an
    ///   excess. It is clamped and counted when those stocks drain
    ///   ([`Hierarchy::drain_stocks`](crate::group::Hierarchy::drain_stocks), a
    ///   limit's refusal, removal). If
    ///   charges take those units first, nothing ever reads below zero: the
    ///   usage stays exactly what the group's charges and uncharges add up
    ///   to, so a caller that returned `x` units it did not hold holds up to
    ///   `x` beyond its limit — never more than the other CPUs stocked of
    ///   the group (at most `(CPUs − 1) · batch` units in each stock).
    ///
    /// ```
    /// use splitcount::cpu::Machine;
    /// use splitcount::group::{Hierarchy, HierarchyConfig};
    /// let m = Machine::simulated(2, 1).unwrap();
    /// let h = Hierarchy::new(HierarchyConfig::default().machine(&m).stock_batch(64)).unwrap();
    /// let g = h.root().child("g").unwrap();
    /// m.set_current_cpu(0).unwrap();
    /// g.charge(1).unwrap(); // a batch of 64 charged: 63 stocked on CPU 0
    /// m.set_current_cpu(1).unwrap();
    /// g.uncharge(10); // 9 more than held, covered by CPU 0's stock
    /// assert_eq!(g.events().underflow, 0);
    /// h.drain_stocks();
    /// assert_eq!((g.usage(), g.events().underflow), (0, 1));
    /// ```
    #[inline]
    pub fn uncharge(&self, n: u64) {
        if n == 0 {
            return;
        }
        let node = &self.node;
        if node.is_removed() {
            return self.uncharge_removed(n);
        }
        let stock = &self.shared.stock;
        // The hit first (nothing to drop on it); the cap is `give_back`'s
        // bound: a slot never holds more than the usage accounts for.
        if stock.stash_hit(&node.usage, n, node.usage.usage().min(stock.batch())) {
            return;
        }
        let machine = &self.shared.config.machine;
        stock.return_after_miss(machine.current_cpu(), &node.usage, n);
    }

    /// Remove the group: refused for the root and for a group with live
    /// children. Stocks holding it are drained; its usage stays counted at
    /// its ancestors; handles that outlive it charge and update statistics
    /// on the nearest live ancestor. Their uncharges give back, first, what
    /// their charges since the removal put there, then what the removed
    /// group still holds — off its own counter and so off every ancestor's,
    /// clamped there: more than both is an `underflow` of the removed group
    /// and takes nothing its ancestors' other descendants hold. Their reads (`usage`,
    /// `max`, `events` …) are the removed group's own counter — what it
    /// still holds, which frees of its blocks bring to zero —, `set_max`
    /// answers [`GroupError::Removed`], and the other settings change the
    /// removed group only, which nothing is charged to any more.
    pub fn remove(&self) -> Result<(), GroupError> {
        self.shared.unlink(&self.node)?;
        self.shared.drain_node(&self.node);
        // The group's user data goes with it (dropped here, outside locks).
        self.node.extensions.close();
        // Fold its statistics now (they stay in its ancestors' values), if
        // it has any that were not folded yet, and give back the references
        // the flusher kept for its pushes (it is freed with its last
        // handle).
        self.shared.stats.retire(&self.node.stats);
        Ok(())
    }

    /// Add `delta` to stat item `item` of this group (of the nearest live
    /// ancestor after removal) on the current CPU. Refuses an item outside
    /// the schema, an item of another hierarchy's schema (its index may name
    /// another item here, of another kind) and a negative delta for an
    /// event count.
    #[inline]
    pub fn mod_stat(&self, item: StatId, delta: i64) -> Result<(), StatError> {
        self.of_this_schema(item)?;
        self.live()
            .stats
            .mod_stat(&self.shared.stats, item.0, delta)
    }

    /// `item` is of this hierarchy's schema (else its index may name
    /// another item here, of another kind).
    #[inline]
    fn of_this_schema(&self, item: StatId) -> Result<(), StatError> {
        if item.1 == self.shared.stats.identity() {
            Ok(())
        } else {
            Err(StatError::ForeignItem(item.0))
        }
    }

    fn item(&self, item: StatId) -> Result<usize, StatError> {
        self.of_this_schema(item)?;
        (item.0 < self.shared.stats.items().len())
            .then_some(item.0)
            .ok_or(StatError::NoSuchItem(item.0))
    }

    /// Flush this group's subtree if forced or if enough changed since its
    /// last flush. Returns whether it flushed.
    pub fn flush(&self, force: bool) -> bool {
        self.shared.stats.flush(&self.node.stats, force)
    }

    /// The hierarchical value of `item` (this group's subtree), flushing
    /// first if enough changed.
    pub fn stat(&self, item: StatId) -> Result<i64, StatError> {
        let i = self.item(item)?;
        self.flush(false);
        Ok(self.node.stats.hier(i))
    }

    /// This group's own value of `item`, flushing first if enough changed.
    pub fn stat_local(&self, item: StatId) -> Result<i64, StatError> {
        let i = self.item(item)?;
        self.flush(false);
        Ok(self.node.stats.local(i))
    }

    /// Like [`Group::stat`], but without flushing if any flush happened in
    /// the last flush period (the background flusher's, or 2 s).
    pub fn stat_ratelimited(&self, item: StatId) -> Result<i64, StatError> {
        let i = self.item(item)?;
        let stats = &self.shared.stats;
        if stats.since_epoch().saturating_sub(stats.last_flush()) >= self.shared.flush_period() {
            self.flush(false);
        }
        Ok(self.node.stats.hier(i))
    }

    /// A `memory.stat`-like dump, `name value` lines: first `usage` and
    /// `stocked` (always there, also without stat items), then one line per
    /// stat item (hierarchical values), then `local_name value` lines (this
    /// group's own), after a flush if enough changed.
    ///
    /// ```
    /// use splitcount::group::Hierarchy;
    /// let h = Hierarchy::default();
    /// let g = h.root().child("g").unwrap();
    /// g.force_charge(10).unwrap();
    /// assert_eq!(g.memory_stat(), "usage 10\nstocked 0\n");
    /// ```
    pub fn memory_stat(&self) -> String {
        self.flush(false);
        let items = self.shared.stats.items();
        let mut out = format!("usage {}\nstocked {}\n", self.usage(), self.stocked());
        for (i, item) in items.iter().enumerate() {
            out.push_str(&format!("{} {}\n", item.name, self.node.stats.hier(i)));
        }
        for (i, item) in items.iter().enumerate() {
            out.push_str(&format!(
                "local_{} {}\n",
                item.name,
                self.node.stats.local(i)
            ));
        }
        out
    }

    /// A structured snapshot of this group's subtree (live groups), after
    /// forcing a flush: flat, in pre-order (see [`Snapshot`]). Taken
    /// without recursion, whatever the tree's depth.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_with(&SnapshotOptions::default())
    }

    /// A snapshot of at most `options.max_groups` groups at most
    /// `options.max_depth` levels below this one: the levels closest to
    /// this group first (a whole level before any group of the next), so
    /// that a cap keeps the tenants and drops the requests. Still in
    /// pre-order. For exporters that must bound their cardinality.
    ///
    /// ```
    /// use splitcount::group::{Hierarchy, SnapshotOptions};
    /// let h = Hierarchy::default();
    /// for t in ["a", "b"] {
    ///     let tenant = h.root().child(t).unwrap();
    ///     for r in 0..3 {
    ///         tenant.child(&format!("req-{r}")).unwrap();
    ///     }
    /// }
    /// let tenants_only = h.root().snapshot_with(&SnapshotOptions::default().max_depth(1));
    /// let paths: Vec<_> = tenants_only.groups.iter().map(|g| g.path.as_str()).collect();
    /// assert_eq!(paths, ["/", "/a", "/b"]);
    /// let capped = h.root().snapshot_with(&SnapshotOptions::default().max_groups(4));
    /// assert_eq!(capped.groups.len(), 4); // the root, both tenants, one request
    /// ```
    pub fn snapshot_with(&self, options: &SnapshotOptions) -> Snapshot {
        self.flush(true);
        let max_groups = options.max_groups.max(1);
        // Breadth first, to choose the groups: (group, depth, parent's
        // index in `chosen`), children by name.
        let mut chosen: Vec<(Group, Option<usize>)> = vec![(self.clone(), None)];
        let mut depth_of = vec![0usize];
        let mut next = 0;
        while next < chosen.len() && chosen.len() < max_groups {
            let depth = depth_of[next];
            if depth < options.max_depth {
                for c in chosen[next].0.children() {
                    if chosen.len() == max_groups {
                        break;
                    }
                    chosen.push((c, Some(next)));
                    depth_of.push(depth + 1);
                }
            }
            next += 1;
        }
        // Then pre-order over the chosen ones, with an explicit stack
        // (children pushed in reverse so that they come out by name).
        let mut kids: Vec<Vec<usize>> = vec![Vec::new(); chosen.len()];
        for (i, (_, parent)) in chosen.iter().enumerate() {
            if let Some(p) = parent {
                kids[*p].push(i);
            }
        }
        let mut groups = Vec::with_capacity(chosen.len());
        let mut stack = vec![(0usize, None)];
        while let Some((i, parent)) = stack.pop() {
            let at = groups.len();
            groups.push(chosen[i].0.group_snapshot(parent));
            stack.extend(kids[i].iter().rev().map(|&c| (c, Some(at))));
        }
        Snapshot { groups }
    }

    fn group_snapshot(&self, parent: Option<usize>) -> GroupSnapshot {
        let items = self.shared.stats.items();
        let named = |f: &dyn Fn(usize) -> i64| {
            items
                .iter()
                .enumerate()
                .map(|(i, it)| (it.name.clone(), f(i)))
                .collect()
        };
        GroupSnapshot {
            path: self.path().to_owned(),
            parent,
            usage: self.usage(),
            max: limit(self.max()),
            high: limit(self.high()),
            peak: self.peak(),
            stocked: self.stocked_subtree(),
            events: self.events(),
            subtree_events: self.subtree_events(),
            stall_ns: self.stall().as_nanos() as u64,
            stats: named(&|i| self.node.stats.hier(i)),
            local: named(&|i| self.node.stats.local(i)),
        }
    }
}

/// Groups are equal when they are the same group (identity, not contents):
/// two handles on one group compare equal, two groups with equal numbers do
/// not.
impl PartialEq for Group {
    fn eq(&self, other: &Group) -> bool {
        Arc::ptr_eq(&self.node, &other.node)
    }
}

impl Eq for Group {}

impl std::hash::Hash for Group {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.node).hash(state);
    }
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("path", &self.node.path)
            .field("usage", &self.usage())
            .field("max", &self.max())
            .field("removed", &self.is_removed())
            .finish()
    }
}
