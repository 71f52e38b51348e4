//! The charge path of [`Accounted`] for allocators that keep headers of
//! their own — the C heap's `LD_PRELOAD` library (`splitcount-preload`),
//! whose `free` gets no size and whose blocks carry more than an account.
//! Hidden from the docs: for that library, not for applications.
//!
//! The semantics are those of [`Accounted`]'s `GlobalAlloc` methods: a
//! charge goes through the thread's reserve, the byte stock and the slow
//! path (reclaim, drains, enforcement, refusal hooks, reporting grace); an
//! account is named by its address, which the caller stores in its block's
//! header and hands back when the block is freed or grown.

use super::{current, in_hook, Accounted, RESERVE};
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
    /// account, or to `fallback` (from [`raw_account`], null for the root)
    /// when the thread entered no group. `Some` with the account to store in
    /// the block's header (null: nothing was charged — not attached, inside
    /// a hook, or in the reporting grace), `None` when refused.
    ///
    /// # Safety
    /// `fallback` is null or from [`raw_account`] of a group that a handle
    /// still holds.
    #[doc(hidden)]
    #[inline]
    pub unsafe fn charge_raw(&self, n: u64, fallback: *const u8) -> Option<*const u8> {
        let Some(st) = self.attached() else {
            return Some(std::ptr::null());
        };
        if in_hook() {
            return Some(std::ptr::null());
        }
        // SAFETY: the caller's contract: kept alive by a handle.
        let fallback = unsafe { AccountKey::from_ptr(fallback) };
        let acc = current().or(fallback).unwrap_or(st.root);
        if RESERVE.try_with(|r| r.take(acc, n)) == Ok(true) {
            return Some(acc.as_ptr());
        }
        self.charge_slow(st, acc, n, true)
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
        let Some(st) = self.attached() else {
            return false;
        };
        if in_hook() {
            self.charge_bytes(st, key, n).is_ok()
        } else {
            self.charge_slow(st, key, n, false) == Ok(Some(key))
        }
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
