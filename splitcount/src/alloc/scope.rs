//! The calling thread's current group for allocations: [`Group::enter`] and
//! [`Group::scope`].

use super::thread::STATE;
use crate::group::{AccountKey, Group};
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

/// A [`crate::group::HookRunner`] that runs hooks with accounting off.
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
    HeldScope {
        previous: swap_scope(account.as_ptr()),
    }
}

/// See [`enter_held`].
pub(crate) struct HeldScope {
    previous: *const u8,
}

impl Drop for HeldScope {
    fn drop(&mut self) {
        swap_scope(self.previous);
    }
}

/// While alive, the thread's allocations are charged to one group; dropping
/// it (also during unwinding) restores the previous group. Not `Send`: it
/// belongs to the thread that entered.
#[must_use = "the scope ends when the guard is dropped"]
pub struct AllocScope {
    previous: *const u8,
    account: AccountKey,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for AllocScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocScope").finish_non_exhaustive()
    }
}

impl Drop for AllocScope {
    fn drop(&mut self) {
        swap_scope(self.previous);
        set_grace(0);
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
        AllocScope {
            previous,
            account,
            _not_send: PhantomData,
        }
    }

    /// Run `f` with this thread's allocations charged to this group.
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let _guard = self.enter();
        f()
    }
}
