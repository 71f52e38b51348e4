//! The allocator's account of a group (the kernel's `obj_cgroup`): what an
//! allocation's header points at, so that a free — on any thread, after any
//! scope, after the group's removal — uncharges the counters its bytes were
//! charged to.
//!
//! **Lifetime: bytes are the reference count.** An account counts
//!
//! ```text
//!  refs = bytes charged through it and not yet uncharged   (in blocks, thread reserves, byte-stock slots)
//!       + 1 per allocation scope entered on it               (a thread's current account)
//!       + LIVE                                               (while its group's node exists)
//! ```
//!
//! and frees itself when `refs` reaches 0. Every holder of a pointer to an
//! account is covered: a block has at least one byte, a reserve or stock
//! slot holds bytes (a slot gives up its key when its units run out), a
//! scope holds a reference, and the node holds `LIVE`. No atomic is added
//! per allocation: `refs` changes where the usage counter is charged or
//! uncharged — in batches (a thread's reserve refill, a stock batch) — and
//! at scope entry and exit. (The alternatives — an atomic per block, or a
//! per-CPU `percpu_ref` switched to atomic mode at removal with a grace
//! period — cost more on the hot path or need RCU; the bytes are counted
//! anyway.)
//!
//! **Removal needs no reparenting.** Counters are hierarchical: an uncharge
//! at a removed group's counter subtracts from every ancestor, the nearest
//! live one included. So blocks keep naming their account after removal,
//! and the last one freed frees it (and with it the group's counter). New
//! charges never go to a removed group's account: a thread whose scope is
//! on one charges the nearest live ancestor's account instead (its reserve
//! may still hand out the few bytes already charged).

use super::hierarchy::Shared;
use super::node::Node;
use crate::charge::{StockKey, UsageCounter};
use crate::sync::{
    AtomicBool, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::ptr::NonNull;
use std::sync::{Arc, Weak};

/// The references of a live group (held by its node until it drops).
const LIVE: u64 = 1 << 62;

pub(crate) struct Account {
    counter: crate::sync::Arc<UsageCounter>,
    node: Weak<Node>,
    /// The hierarchy, to hand out `Group`s (`Group::current`).
    shared: Weak<Shared>,
    /// The group's parent (none for the root): where charges go once this
    /// group is removed. A strong reference — the parent cannot go while a
    /// child's account lives, and its account lives as long as it does.
    parent: Option<Arc<Node>>,
    refs: AtomicU64,
    removed: AtomicBool,
    /// The inner allocator's heap this account's blocks are placed in
    /// (`HeapPerGroup`): null while it has none.
    /// std's atomics: the table it pairs with is a `static`.
    heap: std::sync::atomic::AtomicPtr<u8>,
    /// The table entry that names this account as its heap's owner
    /// (null: none); cleared when the account goes, which frees the heap
    /// for another account.
    heap_owner: std::sync::atomic::AtomicPtr<std::sync::atomic::AtomicPtr<u8>>,
}

/// A pointer to an [`Account`], valid while its holder's references (bytes,
/// a scope, the node's `LIVE`) are counted in it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AccountKey(NonNull<Account>);

// SAFETY: an account is shared by design; its fields are atomics and
// thread-safe reference-counted pointers.
unsafe impl Send for AccountKey {}
// SAFETY: as above.
unsafe impl Sync for AccountKey {}

impl Account {
    /// A new account for `node`, holding `LIVE` for it.
    pub(crate) fn create(node: &Arc<Node>, shared: &Arc<Shared>) -> AccountKey {
        let account = Box::new(Account {
            counter: node.usage.clone(),
            node: Arc::downgrade(node),
            shared: Arc::downgrade(shared),
            parent: node.parent.clone(),
            refs: AtomicU64::new(LIVE),
            removed: AtomicBool::new(false),
            heap: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            heap_owner: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
        });
        AccountKey(NonNull::from(Box::leak(account)))
    }
}

impl AccountKey {
    #[inline]
    fn get(&self) -> &Account {
        // SAFETY: the caller holds a reference counted in `refs` (see the
        // type's docs), so the account has not been freed.
        unsafe { self.0.as_ref() }
    }

    /// The address, for a block's header.
    #[inline]
    pub(crate) fn as_ptr(self) -> *const u8 {
        self.0.as_ptr() as *const u8
    }

    /// The account whose address a header holds.
    ///
    /// # Safety
    /// `p` came from [`AccountKey::as_ptr`] of an account that the caller's
    /// bytes keep alive.
    #[inline]
    pub(crate) unsafe fn from_ptr(p: *const u8) -> Option<AccountKey> {
        NonNull::new(p as *mut Account).map(AccountKey)
    }

    /// The group's usage counter.
    #[inline]
    pub(crate) fn usage(&self) -> &UsageCounter {
        &self.get().counter
    }

    /// The group, while its node exists.
    pub(crate) fn node(&self) -> Option<Arc<Node>> {
        self.get().node.upgrade()
    }

    /// A handle on the group, while it and its hierarchy exist.
    pub(crate) fn group(&self) -> Option<super::Group> {
        Some(super::Group::new(
            self.get().shared.upgrade()?,
            self.node()?,
        ))
    }

    /// Whether the group was removed: new charges go elsewhere.
    #[inline]
    pub(crate) fn is_removed(&self) -> bool {
        self.get().removed.load(Relaxed)
    }

    /// The nearest live group to charge in this account's stead: its own
    /// node while not removed, else the nearest live ancestor.
    pub(crate) fn live_node(&self) -> Option<Arc<Node>> {
        match self.node() {
            Some(n) if !n.is_removed() => Some(n),
            Some(n) => Some(n.live().clone()),
            None => self.get().parent.as_ref().map(|p| p.live().clone()),
        }
    }

    /// Add `n` references (bytes now charged through it, or a scope).
    #[inline]
    pub(crate) fn retain(self, n: u64) {
        // Relaxed: the caller already holds a reference (as for `Arc`).
        self.get().refs.fetch_add(n, Relaxed);
    }

    /// Drop `n` references; the last one frees the account.
    #[inline]
    pub(crate) fn release(self, n: u64) {
        // AcqRel: the thread that frees sees every other holder's uses.
        if self.get().refs.fetch_sub(n, AcqRel) == n {
            let owner = self
                .get()
                .heap_owner
                .load(std::sync::atomic::Ordering::Acquire);
            if !owner.is_null() {
                // Release: every use of the heap for this account (its
                // blocks' frees included: each uncharged its bytes before
                // this) happens before another account can claim it.
                // SAFETY: `owner` is an entry of a `static` table.
                unsafe {
                    (*owner).store(std::ptr::null_mut(), std::sync::atomic::Ordering::Release)
                };
            }
            // SAFETY: that was the last reference; the account came from
            // `Box::leak` in `create`. Dropping it may free the group's
            // counter and parent link, and may run inside the allocator
            // (their frees take the allocator's pass-through path).
            drop(unsafe { Box::from_raw(self.0.as_ptr()) });
        }
    }

    /// Charge `n` bytes to the usage counter through this account, within
    /// the limits; on success they are counted in `refs`.
    #[inline]
    pub(crate) fn try_charge(&self, n: u64) -> Result<bool, &UsageCounter> {
        let crossed = self.get().counter.try_charge_quiet(n)?;
        self.retain(n);
        Ok(crossed)
    }

    /// [`AccountKey::try_charge`] of a refill (a batch whose surplus is
    /// stocked): bounded by `high` too below it
    /// ([`UsageCounter::try_charge_refill`]).
    #[inline]
    pub(crate) fn try_charge_refill(&self, n: u64) -> Result<bool, &UsageCounter> {
        let crossed = self.get().counter.try_charge_refill(n)?;
        self.retain(n);
        Ok(crossed)
    }

    /// Charge `n` bytes within `grace` above every level's `max` (and
    /// within its ceiling): the allocator's reporting grace.
    pub(crate) fn try_charge_within_grace(&self, n: u64, grace: u64) -> Result<bool, ()> {
        let crossed = self
            .get()
            .counter
            .try_charge_within_grace(n, grace)
            .map_err(|_| ())?;
        self.retain(n);
        Ok(crossed)
    }

    /// Charge `n` bytes regardless of limits (a cooperative over-charge).
    pub(crate) fn force_charge(self, n: u64) -> bool {
        let crossed = self.get().counter.charge(n);
        self.retain(n);
        crossed
    }

    /// Give `n` bytes back to the usage counter; may free the account.
    #[inline]
    pub(crate) fn uncharge_bytes(self, n: u64) {
        self.get().counter.uncharge(n);
        self.release(n);
    }

    /// Mark the group removed (new charges go to the nearest live
    /// ancestor).
    pub(crate) fn mark_removed(self) {
        self.get().removed.store(true, Release);
    }

    /// The node's `LIVE` references, dropped when the node goes.
    pub(crate) fn release_live(self) {
        self.release(LIVE);
    }

    #[cfg_attr(not(any(feature = "jemalloc", feature = "mimalloc")), allow(dead_code))]
    /// The heap this account's blocks go to: null until
    /// [`AccountKey::bind_heap`].
    #[inline(always)]
    pub(crate) fn heap(self) -> *mut u8 {
        // Acquire: pairs with `bind_heap`'s release, so the table entry
        // naming this account is seen by the thread placing a block.
        self.get().heap.load(std::sync::atomic::Ordering::Acquire)
    }

    #[cfg_attr(not(any(feature = "jemalloc", feature = "mimalloc")), allow(dead_code))]
    /// Bind `heap` to this account, `owner` being the table entry that
    /// names the account and that its end clears. Callers serialise binds;
    /// an account is bound once.
    pub(crate) fn bind_heap(self, heap: *mut u8, owner: &'static std::sync::atomic::AtomicPtr<u8>) {
        let a = self.get();
        a.heap_owner.store(
            owner as *const _ as *mut _,
            std::sync::atomic::Ordering::Relaxed,
        );
        // Release: the owner entry (written before by the caller) and the
        // field above are visible to whoever reads the heap.
        a.heap.store(heap, std::sync::atomic::Ordering::Release);
    }

    /// References held (for tests of the lifetime).
    #[allow(dead_code)]
    pub(crate) fn refs(self) -> u64 {
        self.get().refs.load(Acquire)
    }
}

impl StockKey for AccountKey {
    fn counter(&self) -> &UsageCounter {
        self.usage()
    }
    fn return_units(self, units: u64) {
        self.uncharge_bytes(units);
    }
    fn release_units(self, units: u64) {
        // The stock took the bytes off the counter; the references they
        // held go now (maybe the account with them).
        self.release(units);
    }
    // A slot's units keep its account alive: an empty slot must let go.
    const KEEP_EMPTY: bool = false;
    fn as_raw(&self) -> usize {
        self.0.as_ptr() as usize
    }
    fn into_raw(self) -> usize {
        self.0.as_ptr() as usize
    }
    unsafe fn from_raw(raw: usize) -> Self {
        // SAFETY: `raw` is an account's address (`into_raw`), non-null.
        AccountKey(unsafe { NonNull::new_unchecked(raw as *mut Account) })
    }
}
