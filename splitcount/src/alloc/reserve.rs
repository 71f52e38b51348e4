//! Each thread's reserve: pre-charged bytes for the group it allocates in,
//! used without any atomic instruction.
//!
//! The per-CPU stock needs a lock (threads sharing a CPU preempt each
//! other); a malloc-heavy program pays for it twice per allocation-free
//! pair. In front of it, each thread keeps up to `2 · RESERVE_BATCH` bytes
//! charged to one group: an allocation in that group takes from them, a free
//! of that group's memory returns to them, with plain thread-local loads and
//! stores. The reserve is refilled from (and overflows into) the per-CPU
//! stock, and is returned when the thread exits or calls
//! [`super::Accounted::drain`].

use crate::charge::ByteAccount;
use std::cell::Cell;

/// Bytes a thread's reserve is refilled with; it holds at most twice that.
pub const RESERVE_BATCH: u64 = 16 << 10;

pub(crate) struct Reserve {
    account: Cell<*const ByteAccount>,
    bytes: Cell<u64>,
}

impl Reserve {
    /// Take `n` bytes for `acc` if the reserve holds them.
    #[inline]
    pub(crate) fn take(&self, acc: *const ByteAccount, n: u64) -> bool {
        let b = self.bytes.get();
        if self.account.get() == acc && b >= n {
            self.bytes.set(b - n);
            true
        } else {
            false
        }
    }

    /// Add `refill` bytes for `acc`, returning the bytes the reserve held
    /// for another account (to be uncharged by the caller).
    pub(crate) fn refill(&self, acc: *const ByteAccount, refill: u64) -> (*const ByteAccount, u64) {
        let old = (self.account.get(), self.bytes.get());
        if old.0 == acc {
            self.bytes.set(old.1 + refill);
            (std::ptr::null(), 0)
        } else {
            self.account.set(acc);
            self.bytes.set(refill);
            old
        }
    }

    /// Return `n` bytes of `acc`; `Some(excess)` (possibly 0) if they were
    /// kept, the excess above `2 · RESERVE_BATCH` to be uncharged by the
    /// caller; `None` if the reserve is for another account.
    #[inline]
    pub(crate) fn give(&self, acc: *const ByteAccount, n: u64) -> Option<u64> {
        if self.account.get() != acc {
            return None;
        }
        let b = self.bytes.get() + n;
        if b > 2 * RESERVE_BATCH {
            self.bytes.set(RESERVE_BATCH);
            Some(b - RESERVE_BATCH)
        } else {
            self.bytes.set(b);
            Some(0)
        }
    }

    /// Empty the reserve: `(account, bytes)` to be uncharged.
    pub(crate) fn take_all(&self) -> (*const ByteAccount, u64) {
        (
            self.account.replace(std::ptr::null()),
            self.bytes.replace(0),
        )
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        let (acc, bytes) = self.take_all();
        if !acc.is_null() && bytes > 0 {
            // SAFETY: accounts are leaked: valid forever.
            unsafe { &*acc }.counter.uncharge(bytes);
        }
    }
}

thread_local! {
    /// `const`-initialized; its destructor returns the bytes at thread exit.
    /// Accessed with `try_with`: during and after thread-local destruction
    /// the charge path goes straight to the per-CPU stock.
    pub(crate) static RESERVE: Reserve = const {
        Reserve {
            account: Cell::new(std::ptr::null()),
            bytes: Cell::new(0),
        }
    };
}
