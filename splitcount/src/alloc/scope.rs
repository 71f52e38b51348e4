//! The calling thread's current group for allocations: [`Group::enter`] and
//! [`Group::scope`].

use crate::charge::ByteAccount;
use crate::group::Group;
use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    /// The account allocations of this thread are charged to (null: the
    /// attached hierarchy's root). `const`-initialized and without a
    /// destructor, so it is readable at any time — before `main`, and during
    /// thread-local destruction — without allocating.
    static CURRENT: Cell<*const ByteAccount> = const { Cell::new(std::ptr::null()) };
    /// Set while the allocator runs user code (a refusal hook): allocations
    /// then pass through unaccounted instead of recursing.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// The calling thread's current account, or null.
#[inline]
pub(crate) fn current() -> *const ByteAccount {
    CURRENT.with(|c| c.get())
}

#[inline]
pub(crate) fn in_hook() -> bool {
    IN_HOOK.with(|h| h.get())
}

/// Run `f` with allocations unaccounted (re-entrancy guard for hooks). The
/// previous state is restored by a guard, so also when `f` unwinds.
pub(crate) fn without_accounting<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_HOOK.with(|h| h.set(self.0));
        }
    }
    let _restore = Restore(IN_HOOK.with(|h| h.replace(true)));
    f()
}

/// While alive, the thread's allocations are charged to one group; dropping
/// it (also during unwinding) restores the previous group. Not `Send`: it
/// belongs to the thread that entered.
#[must_use = "the scope ends when the guard is dropped"]
pub struct AllocScope {
    previous: *const ByteAccount,
    _not_send: PhantomData<*const ()>,
}

impl Drop for AllocScope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

impl Group {
    /// The allocator's account of this group (created on first use).
    pub(crate) fn byte_account(&self) -> &'static ByteAccount {
        self.alloc_account_cell()
            .get_or_init(|| ByteAccount::leak(self.usage_counter().clone()))
    }

    /// Charge this thread's allocations to this group until the returned
    /// guard is dropped (see [`crate::alloc::Accounted`]). Scopes nest.
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
        let account = self.byte_account();
        let previous = CURRENT.with(|c| c.replace(account));
        AllocScope {
            previous,
            _not_send: PhantomData,
        }
    }

    /// Call `hook` (with allocations unaccounted while it runs) when an
    /// allocation charged to this group is refused by a limit; if it returns
    /// `true` (it freed memory), the allocation is tried once more.
    pub fn on_alloc_refusal(&self, hook: crate::charge::RefusalHook) {
        self.byte_account().set_hook(Some(hook));
    }

    /// Run `f` with this thread's allocations charged to this group.
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let _guard = self.enter();
        f()
    }
}
