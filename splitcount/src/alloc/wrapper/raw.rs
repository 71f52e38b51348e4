//! The charge path of [`Accounted`] for allocators that keep headers of
//! their own — the C heap's `LD_PRELOAD` library (`splitcount-preload`),
//! whose `free` gets no size and whose blocks carry more than an account.
//! Hidden from the docs: for that library, not for applications.
//!
//! The semantics are those of [`Accounted`]'s `GlobalAlloc` methods — a
//! charge goes through the thread's reserve, the byte stock and the slow
//! path (reclaim, drains, enforcement, refusal hooks, and the reporting
//! grace unless the allocator is built `without_reporting_grace`, as the
//! preload's is) —
//! except that a thread in no group charges a group of the caller's choice
//! (the preload's `/preload`) instead of the root. An account is named by
//! its address, which the caller stores in its block's header and hands
//! back when the block is freed or grown. (Header bytes are the caller's:
//! they are not counted in [`Accounted::reconcile`]'s headers.)

use super::Accounted;
use crate::alloc::thread::STATE;
use crate::alloc::{current, enter_held, without_accounting};
use crate::group::{AccountKey, Group};

/// A group's account address, to store as a thread's default
/// (`fallback` of [`Accounted::charge_raw`]). Valid while a handle on the
/// group (or a block charged to it) exists.
#[doc(hidden)]
pub fn raw_account(group: &Group) -> *const u8 {
    group.account().as_ptr()
}

impl<A> Accounted<A> {
    /// Charge `n` bytes as an allocation would: to the thread's current
    /// account. A thread that entered no group charges `fallback` (from
    /// [`raw_account`]; null: the root): the first time, the fallback
    /// becomes the thread's base scope for good, and scopes entered later
    /// nest on top of it. `Some` with the account to store in the block's
    /// header (null: nothing was charged — not attached, inside a hook, or
    /// in the reporting grace), `None` when refused.
    ///
    /// # Safety
    /// `fallback` is null or from [`raw_account`] of a group that a handle
    /// holds for the rest of the process.
    #[doc(hidden)]
    #[inline]
    pub unsafe fn charge_raw(&self, n: u64, fallback: *const u8) -> Option<*const u8> {
        // SAFETY: the caller's contract: kept alive by a handle.
        if let Some(base) = unsafe { AccountKey::from_ptr(fallback) } {
            if current().is_none() {
                // Never left: the handle holds the account, no reference
                // is taken for the scope.
                std::mem::forget(enter_held(base));
            }
        }
        self.charge(n)
            .ok()
            .map(|a| a.map_or(std::ptr::null(), AccountKey::as_ptr))
    }

    /// Charge the growth of a block by `n` bytes to the block's own
    /// `account` (as `GlobalAlloc::realloc` does); whether it may grow. A
    /// block charged to nothing (null) grows uncharged.
    ///
    /// # Safety
    /// `account` is null or was returned by [`Accounted::charge_raw`] for a
    /// block that is still allocated.
    #[doc(hidden)]
    pub unsafe fn grow_raw(&self, account: *const u8, n: u64) -> bool {
        // SAFETY: the block's bytes keep its account alive.
        let Some(key) = (unsafe { AccountKey::from_ptr(account) }) else {
            return true;
        };
        self.charge_growth(key, n)
    }

    /// Charge `n` bytes to `account` that must not be refused: a block
    /// already handed out that [`Accounted::charge_raw`] charged nothing
    /// (inside a hook), for a caller whose blocks carry no account and are
    /// all uncharged from `account` when freed. Through the thread's reserve
    /// or the byte stock when they hold `account`'s bytes, else forced
    /// onto the usage counters (a limit may be passed by that much).
    ///
    /// # Safety
    /// `account` is null (nothing happens), or from [`raw_account`] of a
    /// group a handle holds for the rest of the process, or the account of
    /// a block that is still allocated (its bytes keep the account alive).
    #[doc(hidden)]
    pub unsafe fn force_raw(&self, account: *const u8, n: u64) {
        // SAFETY: the caller's contract.
        if let Some(key) = unsafe { AccountKey::from_ptr(account) } {
            self.charge_unrefused(key, n);
        }
    }

    /// Run `f` with this thread's charges unaccounted: [`Accounted::charge_raw`]
    /// answers null (nothing charged) meanwhile, as it does inside a hook —
    /// the same re-entrancy guard. For a caller's own code that may
    /// allocate through its `malloc` (the preload's exit report).
    #[doc(hidden)]
    pub fn unaccounted<R>(&self, f: impl FnOnce() -> R) -> R {
        without_accounting(f)
    }

    /// [`Accounted::charge_raw`]'s common case alone, for a caller's own
    /// fast path: take `n` bytes from the thread's reserve when the thread
    /// is in a scope of this allocator (the fallback entered by an earlier
    /// `charge_raw` counts) whose account the reserve holds `n` bytes of,
    /// not inside a hook. The account charged, or null, having changed
    /// nothing: then call [`Accounted::charge_raw`]. Five loads from the
    /// thread's state, their compares and a store; no call.
    ///
    /// The thread's state is reached through the thread pointer with no
    /// fallback (no call: a caller's fast path that makes none saves no
    /// registers).
    ///
    /// # Safety
    /// In a build with the feature `static-tls`, a call of
    /// [`use_static_tls`](crate::alloc::use_static_tls) happens before
    /// this one (through the caller's own synchronisation: the offset is
    /// not tested). The account returned is kept alive by the bytes
    /// charged to it.
    #[doc(hidden)]
    #[inline(always)]
    pub unsafe fn take_reserved_raw(&self, n: u64) -> *const u8 {
        // SAFETY: forwarded.
        match unsafe { self.take_reserved_where(n, None) } {
            (true, acc) => acc,
            (false, _) => std::ptr::null(),
        }
    }

    /// [`Accounted::take_reserved_raw`] for one account only, `account`:
    /// whether `n` bytes of it were taken. The thread charges `account`
    /// only from a scope (it is not the root), so the scope needs no test
    /// of its own: four loads, their compares and a store.
    ///
    /// # Safety
    /// As [`Accounted::take_reserved_raw`]; `account` is not null, from
    /// [`raw_account`] of a group that is not a root.
    #[doc(hidden)]
    #[inline(always)]
    pub unsafe fn take_reserved_raw_for(&self, n: u64, account: *const u8) -> bool {
        // SAFETY: forwarded.
        unsafe { self.take_reserved_where(n, Some(account)) }.0
    }

    /// The two above: with `account`, the charged account must be it (and
    /// is then a scope's: `account` is not the root); without, the charged
    /// account must be the scope's. Whether `n` bytes were taken, and the
    /// account charged.
    ///
    /// # Safety
    /// As [`Accounted::take_reserved_raw`], `account` as for
    /// [`Accounted::take_reserved_raw_for`].
    #[inline(always)]
    unsafe fn take_reserved_where(&self, n: u64, account: Option<*const u8>) -> (bool, *const u8) {
        let me = self as *const Self as usize;
        // SAFETY: the caller's contract.
        unsafe {
            STATE.with_learned(|t| {
                let acc = t.charge.get();
                let bytes = t.reserve.bytes.get();
                // `charge` is null inside a hook, past the thread's exit and
                // before its first slow path (a reserve holding bytes never
                // names null). `scope` equal to it means a scope is entered
                // (the thread does not charge the root, which `charge_raw`
                // would not charge either); so does `charge` equal to an
                // account that is not the root.
                let in_scope = match account {
                    Some(account) => acc == account,
                    None => t.scope.get() == acc,
                };
                let hit =
                    t.owner.get() == me && in_scope && t.reserve.account.get() == acc && bytes >= n;
                if hit {
                    t.reserve.bytes.set(bytes - n);
                }
                (hit, acc)
            })
        }
    }

    /// [`Accounted::uncharge_raw`]'s common case alone: give `n` bytes of
    /// `account` back to the thread's reserve when it holds that account
    /// and has room. Whether it did; if not, nothing changed: call
    /// [`Accounted::uncharge_raw`].
    ///
    /// # Safety
    /// As [`Accounted::uncharge_raw`], and as for
    /// [`Accounted::take_reserved_raw`] (the state through the thread
    /// pointer, without a fallback).
    #[doc(hidden)]
    #[inline(always)]
    pub unsafe fn give_reserved_raw(&self, account: *const u8, n: u64) -> bool {
        // SAFETY: the caller's contract.
        unsafe { STATE.with_learned(|t| super::uncharge_hit_in(t, account, n)) }
    }

    /// Uncharge `n` bytes of a block charged to `account` (freed, or
    /// shrunk), as `GlobalAlloc::dealloc` does.
    ///
    /// # Safety
    /// `account` is null or was returned by [`Accounted::charge_raw`] for a
    /// block still holding at least `n` charged bytes.
    #[doc(hidden)]
    #[inline]
    pub unsafe fn uncharge_raw(&self, account: *const u8, n: u64) {
        self.uncharge(account, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::Hierarchy;
    use std::alloc::System;

    /// The one-account take hits only while the thread charges that very
    /// account — not while its reserve holds the root's bytes, nor another
    /// scope's — and the general take hits only inside a scope.
    #[test]
    fn a_take_for_one_account_hits_only_while_the_thread_charges_it() {
        static ALLOC: Accounted<System> = Accounted::new(System);
        // SAFETY: a test executable's TLS is in the static block.
        unsafe { crate::alloc::use_static_tls() };
        // A thread of its own: its state starts fresh and goes with it.
        std::thread::spawn(|| {
            let memory = Hierarchy::default();
            ALLOC.attach(&memory).unwrap();
            let preload = memory.root().child("preload").unwrap();
            let other = memory.root().child("other").unwrap();
            let (mine, theirs) = (raw_account(&preload), raw_account(&other));
            // SAFETY (all): static TLS claimed above; the groups' handles
            // live to the end; `mine` is a child's account.
            unsafe {
                // No scope: the reserve fills with the root's bytes.
                assert!(ALLOC.charge_raw(100, std::ptr::null()).is_some());
                assert!(!ALLOC.take_reserved_raw_for(10, mine), "the root's bytes");
                assert!(ALLOC.take_reserved_raw(10).is_null(), "not in a scope");
                other.scope(|| {
                    assert_eq!(ALLOC.charge_raw(100, std::ptr::null()), Some(theirs));
                    assert!(!ALLOC.take_reserved_raw_for(10, mine), "another's bytes");
                    assert_eq!(ALLOC.take_reserved_raw(10), theirs);
                });
                preload.scope(|| {
                    assert_eq!(ALLOC.charge_raw(100, std::ptr::null()), Some(mine));
                    assert!(ALLOC.take_reserved_raw_for(10, mine));
                    assert_eq!(ALLOC.take_reserved_raw(10), mine);
                });
            }
        })
        .join()
        .unwrap();
    }
}
