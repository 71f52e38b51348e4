//! The calling thread's current group for allocations: [`Group::enter`] and
//! [`Group::scope`].

use super::thread::STATE;
use crate::group::{AccountKey, Group};
use std::cell::Cell;
use std::marker::PhantomData;

/// The calling thread's current account, if it entered a scope.
#[inline]
pub(crate) fn current() -> Option<AccountKey> {
    STATE.with(|t| t.scope_account())
}

#[inline]
pub(crate) fn in_hook() -> bool {
    STATE.with(|t| t.in_hook.get())
}

/// Run `f` with allocations unaccounted (re-entrancy guard for hooks). The
/// previous state is restored by a guard, so also when `f` unwinds.
pub(crate) fn without_accounting<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            STATE.with(|t| {
                t.in_hook.set(self.0);
                t.refresh();
            });
        }
    }
    let _restore = Restore(STATE.with(|t| {
        let was = t.in_hook.replace(true);
        t.refresh();
        was
    }));
    f()
}

/// A hook runner (`group::reclaim::HookRunner`) that runs hooks with accounting off.
pub(crate) fn run_unaccounted(f: &mut dyn FnMut()) {
    without_accounting(f)
}

/// Grant (or with 0, end) the reporting grace.
pub(crate) fn set_grace(bytes: u64) {
    STATE.with(|t| t.grace.set(bytes));
}

/// Make `account` the thread's scope; the previous one.
#[inline]
fn swap_scope(account: *const u8) -> *const u8 {
    STATE.with(|t| {
        let previous = t.scope.replace(account);
        t.refresh();
        previous
    })
}

/// Make `account` current until the guard drops, without touching its
/// reference count: for a caller that holds a reference of its own for
/// longer (an instrumented future, per poll). Restores the previous account
/// also on unwind.
pub(crate) fn enter_held(account: AccountKey) -> HeldScope {
    let previous = swap_scope(account.as_ptr());
    HeldScope {
        previous,
        account,
        depth: NESTING.with(|n| n.begin(previous)),
    }
}

/// See [`enter_held`]. Counted in the thread's [`Nesting`] like an
/// [`AllocScope`].
pub(crate) struct HeldScope {
    previous: *const u8,
    account: AccountKey,
    depth: u32,
}

impl Drop for HeldScope {
    fn drop(&mut self) {
        // Its account is the caller's, who holds it for longer: nothing to
        // release — except past the tracked depths, where an out-of-order
        // end cannot be remembered and a scope inside will make this
        // account current again: then the thread needs a reference of its
        // own, leaked as an `AllocScope`'s is. (Without it an instrumented
        // future polled 63 scopes deep, whose inner future kept a scope
        // across a `Pending`, left its account current after the future
        // — its only holder — was dropped: a use after free, found in
        // review.)
        match NESTING.with(|n| n.end(self.depth, self.previous)) {
            Ending::Restore(previous) => {
                swap_scope(previous);
            }
            Ending::Inside => {}
            Ending::Untracked => self.account.retain(1),
        }
    }
}

/// While alive, the thread's allocations are charged to one group; dropping
/// it (also during unwinding) restores the previous group. Not `Send`: it
/// belongs to the thread that entered.
///
/// Guards dropped out of order (`drop(outer)` while `inner` lives) end
/// where they began: the innermost live scope stays current, and when it
/// ends the thread goes back past every scope that ended before it, to
/// what was current before them. (Tracked for the first 63 nested scopes
/// of a thread. A deeper one that ends out of order keeps its group —
/// current again when the scopes inside it end, and alive — until every
/// scope of the thread has ended; then the thread is back at what was
/// current before its first scope, and the group's account stays
/// allocated for good, a few hundred bytes.)
#[must_use = "the scope ends when the guard is dropped"]
pub struct AllocScope {
    previous: *const u8,
    account: AccountKey,
    /// 1 for a thread's outermost scope, and so on.
    depth: u32,
    _not_send: PhantomData<*const ()>,
}

/// Depths below this have their out-of-order end tracked (see
/// [`AllocScope`]).
const TRACKED_DEPTH: usize = 64;

/// A thread's nesting of scopes — [`AllocScope`]s and the per-poll
/// [`HeldScope`]s: how deep it is, and which scopes ended while a scope
/// inside them lived — with what each had found current, which is what
/// the thread returns to past it. Touched only when a scope begins or
/// ends, never by an allocation.
///
/// Every scope that makes an account current is counted here, so the
/// account current when the scope at depth `d + 1` began is the one the
/// scope at depth `d` made current (or the thread's own, at depth 0): a
/// walk back that stops at a live depth restores that live scope's
/// account, and an account is never made current after the scope that
/// holds it ended. (A scope kept in a future across an `.await` ends in
/// a later poll, out of order; with the held scopes counted, the walk
/// passes the ended poll too.)
struct Nesting {
    depth: Cell<u32>,
    /// Scopes begun and not ended. At 0 every scope has ended, whatever
    /// the order and the depth: the thread is back at `base`.
    live: Cell<u32>,
    /// What was current when the thread's outermost live scope began.
    base: Cell<*const u8>,
    /// Bit `d`: the scope at depth `d` (`1..TRACKED_DEPTH`) ended out of
    /// order.
    ended: Cell<u64>,
    /// For such a scope, the account it had found current.
    previous: [Cell<*const u8>; TRACKED_DEPTH],
}

thread_local! {
    static NESTING: Nesting = const {
        Nesting {
            depth: Cell::new(0),
            live: Cell::new(0),
            base: Cell::new(std::ptr::null()),
            ended: Cell::new(0),
            previous: [const { Cell::new(std::ptr::null()) }; TRACKED_DEPTH],
        }
    };
}

impl Nesting {
    /// A scope begins, having found `previous` current: its depth.
    fn begin(&self, previous: *const u8) -> u32 {
        if self.live.get() == 0 {
            self.base.set(previous);
        }
        self.live.set(self.live.get().saturating_add(1));
        let depth = self.depth.get().saturating_add(1);
        self.depth.set(depth);
        depth
    }

    /// The scope at `depth`, which found `previous` current, ends: what to
    /// do with the thread's current account.
    fn end(&self, depth: u32, previous: *const u8) -> Ending {
        let live = self.live.get().saturating_sub(1);
        self.live.set(live);
        if live == 0 {
            // The last scope: back to what preceded them all — also past
            // a scope deeper than the tracked depths that ended out of
            // order, which the walk below cannot pass (the thread charged
            // its group for good: a helper's 65 scopes, ended outermost
            // first). In every other case the walk ends there too.
            self.depth.set(0);
            self.ended.set(0);
            return Ending::Restore(self.base.get());
        }
        let tracked = |d: u32| (d as usize) < TRACKED_DEPTH;
        if depth < self.depth.get() {
            if !tracked(depth) {
                return Ending::Untracked;
            }
            self.ended.set(self.ended.get() | 1 << depth);
            self.previous[depth as usize].set(previous);
            return Ending::Inside;
        }
        // The innermost: back past every scope below it that already
        // ended.
        let mut restore = previous;
        let mut d = depth.saturating_sub(1);
        while d > 0 && tracked(d) && self.ended.get() & (1 << d) != 0 {
            self.ended.set(self.ended.get() & !(1 << d));
            restore = self.previous[d as usize].get();
            d -= 1;
        }
        self.depth.set(d);
        Ending::Restore(restore)
    }
}

/// What the end of a scope does to the thread's current account.
enum Ending {
    /// Make this account current (the scope was the innermost).
    Restore(*const u8),
    /// Nothing: a scope inside it lives on and stays current; this one's
    /// end is remembered for when that one ends.
    Inside,
    /// Nothing, and the scope's reference is kept for good: it ended out
    /// of order deeper than [`TRACKED_DEPTH`], where its end cannot be
    /// remembered, and a scope inside it will restore its account.
    Untracked,
}

impl std::fmt::Debug for AllocScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocScope").finish_non_exhaustive()
    }
}

impl Drop for AllocScope {
    fn drop(&mut self) {
        // `NESTING` has no destructor: reachable for as long as the thread
        // runs, in its exit too.
        match NESTING.with(|n| n.end(self.depth, self.previous)) {
            Ending::Restore(previous) => {
                swap_scope(previous);
                set_grace(0);
            }
            Ending::Inside => {}
            // Leaked: the account stays alive for the scope inside, which
            // makes it current again when it ends.
            Ending::Untracked => return,
        }
        self.account.release(1);
    }
}

impl Group {
    /// Charge this thread's allocations to this group until the returned
    /// guard is dropped (see [`crate::alloc::Accounted`]). Scopes nest. A
    /// scope on a group that is removed meanwhile charges the nearest live
    /// ancestor.
    ///
    /// ```
    /// use splitcount::group::Hierarchy;
    /// let h = Hierarchy::default();
    /// let q = h.root().child("query").unwrap();
    /// {
    ///     let _in_q = q.enter();
    ///     // allocations here are charged to /query (with `Accounted` installed)
    /// }
    /// ```
    pub fn enter(&self) -> AllocScope {
        let account = self.account();
        account.retain(1);
        let previous = swap_scope(account.as_ptr());
        let depth = NESTING.with(|n| n.begin(previous));
        AllocScope {
            previous,
            account,
            depth,
            _not_send: PhantomData,
        }
    }

    /// Run `f` with this thread's allocations charged to this group.
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let _guard = self.enter();
        f()
    }
}
