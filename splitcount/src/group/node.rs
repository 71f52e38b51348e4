//! The state of one group and its memory layout.
//!
//! ```text
//!  UsageCounter (own allocation)        Node
//!  ┌ line: usage, watermark ┐ hot        ┌ line: usage ptr, parent, removed ┐ read-mostly
//!  ├ line: max, high       ┤ read-most. ├ id, path                          ┤ cold
//!  └ line: events          ┘ slow path  └ hooks, account, breach            ┘ cold
//! ```
//!
//! Write-hot fields (usage, watermark), read-mostly fields (limits, parent,
//! the removed flag) and cold ones (name, hooks, events) sit on separate
//! 128-byte-aligned lines (`CachePadded`; 128 on x86_64 because the spatial
//! prefetcher fetches lines in pairs), so a charge on one CPU never
//! invalidates the line another CPU reads a limit from. The lab's `layout`
//! suite shows what the packed alternative costs.

use super::account::{Account, AccountKey};
use super::error::{Consumer, OverLimit};
use super::hierarchy::Shared;
use super::hooks::Hooks;
use crate::charge::UsageCounter;
use crate::stat::StatGroup;
use crate::sync::{
    AtomicBool,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use crossbeam_utils::CachePadded;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// Read-mostly: read by every charge.
pub(crate) struct Hot {
    pub(crate) usage: crate::sync::Arc<UsageCounter>,
    pub(crate) stats: Arc<StatGroup>,
    pub(crate) parent: Option<Arc<Node>>,
    removed: AtomicBool,
}

pub(crate) struct Node {
    read: CachePadded<Hot>,
    pub(crate) name: String,
    pub(crate) path: String,
    /// The subscribers. Readers (every refusal, event and crossing that
    /// runs hooks) clone the `Arc` under the read lock, so a reader stopped
    /// there — preempted, or parked in a signal handler — holds up no other
    /// reader; the write lock is held only for the store of a new `Arc`
    /// (see [`Node::replace_hooks`]).
    hooks: RwLock<Arc<Hooks>>,
    /// Serializes the subscribers' read-copy-update of `hooks`.
    hooks_writer: Mutex<()>,
    /// The allocator's account of this group, made on first `enter()`.
    account: OnceLock<AccountKey>,
    /// A cooperative over-charge happened here (see [`OverLimit`]).
    breached: std::sync::atomic::AtomicBool,
    breach: Mutex<Option<Breach>>,
    /// [`BreachMode`] as its `u8`.
    breach_mode: std::sync::atomic::AtomicU8,
    /// Live children, by name (see `Shared::create_child`, `unlink`).
    /// Read-mostly: lookups and listings take the read lock, creation and
    /// removal the write lock.
    children: RwLock<BTreeMap<String, Arc<Node>>>,
    /// Typed user data ([`super::Extensions`]), dropped at removal.
    pub(crate) extensions: super::extensions::Store,
    /// Units charged through this group's handles after its removal, by
    /// the node they went to (the nearest live ancestor of the time), and
    /// not uncharged yet (see `Group::uncharge`). Touched only through
    /// removed groups' handles.
    pub(crate) redirected: Mutex<Vec<(Arc<Node>, u64)>>,
}

impl std::ops::Deref for Node {
    type Target = Hot;
    fn deref(&self) -> &Hot {
        &self.read
    }
}

impl Node {
    pub(crate) fn new(
        parent: Option<Arc<Node>>,
        name: String,
        path: String,
        usage: crate::sync::Arc<UsageCounter>,
        stats: Arc<StatGroup>,
    ) -> Node {
        Node {
            read: CachePadded::new(Hot {
                usage,
                stats,
                parent,
                removed: AtomicBool::new(false),
            }),
            name,
            path,
            hooks: RwLock::new(Arc::default()),
            hooks_writer: Mutex::new(()),
            account: OnceLock::new(),
            breached: std::sync::atomic::AtomicBool::new(false),
            breach: Mutex::new(None),
            breach_mode: std::sync::atomic::AtomicU8::new(BreachMode::Sticky as u8),
            children: RwLock::new(BTreeMap::new()),
            extensions: Default::default(),
            redirected: Mutex::new(Vec::new()),
        }
    }

    /// The live children, write-locked, to change them (never across a
    /// user callback).
    pub(crate) fn children(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Arc<Node>>> {
        self.children.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The live children, read-locked: readers (lookups, listings) never
    /// wait for each other, only for a creation or removal under this node.
    pub(crate) fn children_read(
        &self,
    ) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<Node>>> {
        self.children.read().unwrap_or_else(|e| e.into_inner())
    }

    #[inline]
    pub(crate) fn is_removed(&self) -> bool {
        // Acquire: pairs with `mark_removed`; a charger that sees the flag
        // also sees the tree change that preceded it.
        self.removed.load(Acquire)
    }

    pub(crate) fn mark_removed(&self) {
        self.removed.store(true, Release);
        // Before the removal drains the stocks (see `UsageCounter::retire`).
        self.usage.retire();
        // SeqCst: an account made concurrently (`account`) is published,
        // then the flag re-read after a fence; we store the flag, fence,
        // then look for the account. One of the two sees the other, so an
        // account is never left unmarked on a removed node.
        crate::sync::fence(SeqCst);
        if let Some(account) = self.account.get() {
            account.mark_removed();
        }
    }

    /// Count `n` units charged through this (removed) group's handles to
    /// `to`, its nearest live ancestor then.
    pub(crate) fn add_redirected(&self, to: Arc<Node>, n: u64) {
        let mut r = self.redirected.lock().unwrap_or_else(|e| e.into_inner());
        match r.iter_mut().find(|(t, _)| Arc::ptr_eq(t, &to)) {
            Some((_, units)) => *units += n,
            None => r.push((to, n)),
        }
    }

    /// Take up to `n` of the units [`Node::redirected`] counts, the latest
    /// target first: where they go back, and how many.
    pub(crate) fn take_redirected(&self, n: u64) -> Vec<(Arc<Node>, u64)> {
        let mut r = self.redirected.lock().unwrap_or_else(|e| e.into_inner());
        let mut left = n;
        let mut taken = Vec::new();
        while left > 0 {
            let Some((to, units)) = r.last_mut() else {
                break;
            };
            let take = left.min(*units);
            taken.push((to.clone(), take));
            *units -= take;
            left -= take;
            if *units == 0 {
                r.pop();
            }
        }
        taken
    }

    /// The nearest live node: this one, or the ancestor its charges go to
    /// after removal.
    #[inline]
    pub(crate) fn live(self: &Arc<Self>) -> &Arc<Node> {
        let mut n = self;
        while n.is_removed() {
            n = n.parent.as_ref().expect("the root is never removed");
        }
        n
    }

    /// The node whose usage counter is `counter`: this one or an ancestor.
    pub(crate) fn find(self: &Arc<Self>, counter: &UsageCounter) -> Arc<Node> {
        let mut n = self.clone();
        loop {
            if std::ptr::eq(&*n.usage, counter) {
                return n;
            }
            n = match n.parent.clone() {
                Some(p) => p,
                None => return self.clone(),
            };
        }
    }

    /// The allocator's account of this group and of every ancestor (made
    /// here, outside the allocator, so that the allocator only ever finds
    /// existing ones).
    ///
    /// One load once it exists; the first time, the missing accounts are
    /// made from the top down, without recursion (a deep chain must not
    /// recurse).
    pub(crate) fn account(self: &Arc<Self>, shared: &Arc<Shared>) -> AccountKey {
        if let Some(a) = self.account.get() {
            return *a;
        }
        let mut missing = vec![self.clone()];
        while let Some(p) = missing.last().and_then(|n| n.parent.clone()) {
            if p.account.get().is_some() {
                break;
            }
            missing.push(p);
        }
        for n in missing.iter().rev() {
            let a = *n.account.get_or_init(|| Account::create(n, shared));
            // SeqCst: the account is published (above); a removal stores
            // its flag and then looks for the account (`mark_removed`).
            // Both fence between, so if the removal missed the account,
            // this re-check sees the flag and marks it itself. (Marking
            // twice is harmless.) A scope that picks the account up in
            // between charges the removed counter for that moment — still
            // hierarchical, so every ancestor is charged as well.
            crate::sync::fence(SeqCst);
            if n.is_removed() {
                a.mark_removed();
            }
        }
        *self.account.get().expect("made above")
    }

    /// The account, if one was made.
    pub(crate) fn existing_account(&self) -> Option<AccountKey> {
        self.account.get().copied()
    }

    /// The `k` live children with the largest usage, largest first (ties by
    /// name). One pass over the children under their read lock, keeping `k`
    /// candidates; nothing if the lock stays busy (see `hooks`).
    pub(crate) fn top(&self, k: usize) -> Vec<Consumer> {
        if k == 0 {
            return Vec::new();
        }
        let Some(children) = try_read_a_while(&self.children) else {
            return Vec::new();
        };
        // Ascending by (usage, then reversed name order): the first is the
        // one to evict.
        // At most one more than the children (a `k` far above them, even
        // `usize::MAX`, asks for all of them, not for that much memory).
        let mut best: Vec<(u64, &Arc<Node>)> =
            Vec::with_capacity(k.min(children.len()).saturating_add(1));
        for child in children.values() {
            let usage = child.usage.usage();
            let worse =
                |a: &(u64, &Arc<Node>)| a.0 < usage || (a.0 == usage && a.1.name > child.name);
            if best.len() == k && !worse(&best[0]) {
                continue;
            }
            let at = best.partition_point(|a| worse(a));
            best.insert(at, (usage, child));
            if best.len() > k {
                best.remove(0);
            }
        }
        best.iter()
            .rev()
            .map(|(usage, n)| Consumer {
                group: n.path.clone(),
                usage: *usage,
            })
            .collect()
    }

    /// The hooks, cloned out of the read lock (never held while a hook
    /// runs). Readers never wait for each other; only a subscriber — its
    /// store of a new set (a pointer, under the write lock), or its wait
    /// for that lock, which turns new readers away — can keep one waiting,
    /// and it waits only a little: it gives up (no hooks) if the lock stays
    /// unavailable — a subscriber preempted for that long inside its store,
    /// or a `fork` that caught one there (the lock then stays held for ever
    /// in the child).
    pub(crate) fn hooks(&self) -> Option<Arc<Hooks>> {
        try_read_a_while(&self.hooks).map(|h| h.clone())
    }

    /// Replace the hooks with `change` applied to a copy of them
    /// (read-copy-update): the copy is made and allocated outside the
    /// write lock, which is held only to store the new `Arc`. Subscribers
    /// take `hooks_writer` first, so none loses another's change.
    ///
    /// Nothing under `hooks_writer` runs a hook: the copy is allocated with
    /// the allocator's accounting off (a charge refused there would run
    /// this group's hooks, and a hook that subscribes — which hooks may do
    /// — would wait for ever for the writer lock its own thread holds),
    /// and the old set, whose closures may own values with a `Drop` of the
    /// user's, is dropped once the lock is released (a reader may still
    /// hold it anyway).
    pub(crate) fn replace_hooks(&self, change: impl FnOnce(&mut Hooks)) {
        let (old, current) = {
            let _writer = self.hooks_writer.lock().unwrap_or_else(|e| e.into_inner());
            let current = self.hooks.read().unwrap_or_else(|e| e.into_inner()).clone();
            let new = crate::alloc::without_accounting(|| {
                let mut new = (*current).clone();
                change(&mut new);
                Arc::new(new)
            });
            let old = std::mem::replace(
                &mut *self.hooks.write().unwrap_or_else(|e| e.into_inner()),
                new,
            );
            (old, current)
        };
        drop((old, current));
    }

    /// Record a cooperative over-charge past `by`'s limit (the first
    /// one's numbers are kept until the breach is cleared). Returns whether
    /// this call made the record (the breach is new). One load when the
    /// breach is recorded already.
    pub(crate) fn record_breach(
        &self,
        by: &crate::sync::Arc<UsageCounter>,
        make: impl FnOnce() -> OverLimit,
    ) -> bool {
        if self.breached.load(Relaxed) {
            return false;
        }
        let Some(mut b) = try_lock_a_while(&self.breach) else {
            return false;
        };
        let new = b.is_none();
        if new {
            *b = Some(Breach {
                over: make(),
                by: by.clone(),
            });
        }
        // Release: a checker that sees the flag sees the record.
        self.breached.store(true, Release);
        new
    }

    /// The breach recorded here, if any and still in force: in
    /// [`BreachMode::Level`] a breach whose limit's usage is back at or
    /// under `max` is cleared here and `None` returned.
    pub(crate) fn breach(&self) -> Option<OverLimit> {
        // Acquire: pairs with `record_breach`.
        if !self.breached.load(Acquire) {
            return None;
        }
        let mut b = self.breach.lock().unwrap_or_else(|e| e.into_inner());
        let rec = b.as_ref()?;
        if self.breach_mode() == BreachMode::Level && rec.by.usage() <= rec.by.max() {
            *b = None;
            self.breached.store(false, Release);
            return None;
        }
        Some(rec.over.clone())
    }

    /// Forget the breach.
    pub(crate) fn clear_breach(&self) {
        *self.breach.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.breached.store(false, Release);
    }

    pub(crate) fn breach_mode(&self) -> BreachMode {
        BreachMode::from_u8(self.breach_mode.load(Relaxed))
    }

    pub(crate) fn set_breach_mode(&self, mode: BreachMode) {
        self.breach_mode.store(mode as u8, Relaxed);
    }
}

/// A recorded breach: its numbers, and the counter whose limit it passed
/// (for [`BreachMode::Level`]).
struct Breach {
    over: OverLimit,
    by: crate::sync::Arc<UsageCounter>,
}

/// How long a group stays *breached* — [`crate::group::Group::check`]
/// failing — after a cooperative over-charge
/// ([`crate::charge::Enforcement::Cooperative`]).
///
/// ```
/// use splitcount::group::{BreachMode, Hierarchy};
///
/// let h = Hierarchy::default();
/// let tenant = h.root().child("tenant").unwrap();
/// tenant.set_max(1_000).unwrap();
/// tenant.set_breach_mode(BreachMode::Level);
/// // (an allocation over the limit would breach it; see `Group::check`)
/// assert!(tenant.check().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum BreachMode {
    /// Until [`crate::group::Group::clear_breach`]: right for a group that
    /// lives as long as one request — once over, the request fails. The
    /// default.
    #[default]
    Sticky,
    /// Until the usage of the group whose limit was passed is back at or
    /// under its `max` (checked by `check`): right for a long-lived
    /// tenant group, which should not fail for ever after one spike. The
    /// usage includes the stocked slack (at most a batch per CPU and a
    /// reserve per thread): [`crate::group::Hierarchy::drain_stocks`]
    /// returns it.
    Level,
}

impl BreachMode {
    fn from_u8(v: u8) -> BreachMode {
        if v == BreachMode::Level as u8 {
            BreachMode::Level
        } else {
            BreachMode::Sticky
        }
    }
}

/// Lock `m`, waiting only a little: the charge paths (which may run inside
/// the global allocator) never block on a lock a user or a `fork` could keep
/// held. `None` if it stayed held.
fn try_lock_a_while<T>(m: &Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    for _ in 0..1_000 {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

/// [`try_lock_a_while`] for a read lock.
fn try_read_a_while<T>(m: &RwLock<T>) -> Option<std::sync::RwLockReadGuard<'_, T>> {
    for _ in 0..1_000 {
        match m.try_read() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

impl Drop for Node {
    /// Give up the account's `LIVE` references (its blocks keep it until
    /// they are freed), then drop the chain of parents this node held the
    /// last reference to one by one, instead of recursively: a chain of
    /// tens of thousands of groups must not overflow the stack when its last
    /// handle goes.
    fn drop(&mut self) {
        if let Some(account) = self.account.take() {
            account.release_live();
        }
        let mut next = self.read.parent.take();
        while let Some(parent) = next {
            match Arc::try_unwrap(parent) {
                Ok(mut node) => next = node.read.parent.take(),
                Err(_) => break, // someone else keeps it (and its parents)
            }
        }
    }
}

/// Mark the groups from `node` up to `refuser` breached, and tell each
/// newly breached one's subscribers. The record is made once, by the first
/// over-charge of a breach; later ones (until the breach is cleared) only
/// load a flag per group. Call it with accounting off (it formats paths):
/// the allocator's cooperative over-charges and `Group::over_charge`.
pub(crate) fn mark_breached(shared: &Arc<Shared>, node: &Arc<Node>, refuser: &Arc<Node>, n: u64) {
    let mut over: Option<OverLimit> = None;
    let mut make = || {
        over.get_or_insert_with(|| OverLimit {
            charged: node.path.clone(),
            group: refuser.path.clone(),
            usage: refuser.usage.usage(),
            max: refuser.usage.refused_limit(),
            request: n,
            top: refuser.top(super::error::TOP_CONSUMERS),
        })
        .clone()
    };
    let mut g = Some(node.clone());
    while let Some(x) = g {
        if x.record_breach(&refuser.usage, &mut make) {
            let (usage, max) = (refuser.usage.usage(), refuser.usage.refused_limit());
            super::emit_event(shared, &x, super::EventKind::Breached, usage, max, None);
        }
        if Arc::ptr_eq(&x, refuser) {
            break;
        }
        g = x.parent.clone();
    }
}
