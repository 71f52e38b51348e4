//! Each thread's reserve: pre-charged bytes for the group it allocates in,
//! used without any atomic instruction.
//!
//! The per-CPU stock needs a lock (threads sharing a CPU preempt each
//! other); a malloc-heavy program pays for it twice per allocation-free
//! pair. In front of it, each thread keeps up to [`MAX_THREAD_RESERVE`]
//! bytes charged to one group's account: an allocation in that group takes
//! from them, a free of that group's memory returns to them, with plain
//! thread-local loads and stores. The reserve is refilled
//! [`RESERVE_BATCH`] bytes at a time (only for allocations smaller than
//! that: larger ones are charged exactly), never holds more than
//! `MAX_THREAD_RESERVE`, and is returned when the thread exits (by a guard
//! the first slow path arms), calls [`drain_thread`], or allocates in
//! another group.
//!
//! The bytes it holds keep their account alive (they are counted in its
//! references); its account pointer is only dereferenced while it holds
//! bytes.

use super::thread::STATE;
use crate::group::AccountKey;
use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::Relaxed};

/// Header bytes of the blocks alive (flushed from each thread's
/// header count (`ThreadState::headers`) at its slow paths and exit): for [`super::Reconciliation`].
///
/// On a line of its own, as is [`RESERVE_HOLDERS`]: both are written by
/// every thread's slow paths — a thread allocating in a group over its
/// limit writes this one on every allocation — and a static the linker
/// happened to put beside it would be invalidated as often. It happened:
/// in the lab's binary this counter shared a line with the static its
/// switchable allocator reads on every allocation, and a healthy thread
/// beside a refusing one lost a quarter of its allocations per second
/// (0.66–0.79× where it reads 0.98–1.05× with this line to itself).
pub(crate) static HEADER_BYTES: CachePadded<AtomicI64> = CachePadded::new(AtomicI64::new(0));

/// Threads whose reserve names an account (and may hold bytes). On a line
/// of its own (see [`HEADER_BYTES`]).
pub(crate) static RESERVE_HOLDERS: CachePadded<AtomicUsize> = CachePadded::new(AtomicUsize::new(0));

/// Add this thread's header count (`STATE.headers`: a plain add per
/// allocation and per free) to [`HEADER_BYTES`]. Slow paths and thread
/// exit only.
pub(crate) fn flush_headers() {
    let delta = STATE.try_with(|t| t.headers.replace(0)).unwrap_or(0);
    if delta != 0 {
        // Relaxed: a statistic.
        HEADER_BYTES.fetch_add(delta, Relaxed);
    }
}

/// Bytes a thread's reserve is refilled with.
pub const RESERVE_BATCH: u64 = 16 << 10;

/// The most a thread's reserve ever holds: the per-thread part of the
/// allocator's slack.
pub const MAX_THREAD_RESERVE: u64 = 2 * RESERVE_BATCH;

/// A thread's reserve (a field of its allocator state; see `thread.rs`).
pub(crate) struct Reserve {
    pub(crate) account: Cell<*const u8>,
    pub(crate) bytes: Cell<u64>,
}

impl Reserve {
    /// No account, no bytes (a thread-local's initial value, copied once).
    #[allow(clippy::declare_interior_mutable_const)]
    pub(crate) const EMPTY: Reserve = Reserve {
        account: Cell::new(std::ptr::null()),
        bytes: Cell::new(0),
    };

    /// Take `n` bytes for `acc` if the reserve holds them.
    #[inline]
    pub(crate) fn take(&self, acc: AccountKey, n: u64) -> bool {
        let b = self.bytes.get();
        if self.account.get() == acc.as_ptr() && b >= n {
            self.bytes.set(b - n);
            true
        } else {
            false
        }
    }

    /// Add `refill` bytes (just charged) for `acc`. Returns bytes to be
    /// uncharged by the caller: what the reserve held for another account,
    /// or what would take it above [`MAX_THREAD_RESERVE`].
    pub(crate) fn refill(&self, acc: AccountKey, refill: u64) -> Option<(AccountKey, u64)> {
        let (old, held) = (self.account.get(), self.bytes.get());
        if old == acc.as_ptr() {
            let total = held + refill;
            let keep = total.min(MAX_THREAD_RESERVE);
            self.bytes.set(keep);
            return (total > keep).then_some((acc, total - keep));
        }
        if old.is_null() {
            // Relaxed: a statistic.
            RESERVE_HOLDERS.fetch_add(1, Relaxed);
        }
        self.account.set(acc.as_ptr());
        self.bytes.set(refill.min(MAX_THREAD_RESERVE));
        let excess = refill.saturating_sub(MAX_THREAD_RESERVE);
        // SAFETY: `old` is only read while the reserve held bytes for it,
        // which keep that account alive.
        let old = if held > 0 {
            unsafe { AccountKey::from_ptr(old) }
        } else {
            None
        };
        match (old, excess) {
            (Some(old), _) => Some((old, held)),
            (None, 0) => None,
            (None, excess) => Some((acc, excess)),
        }
    }

    /// Return `n` bytes of `acc`; `Some(excess)` (possibly 0) if they were
    /// kept — the excess above [`MAX_THREAD_RESERVE`], down to
    /// [`RESERVE_BATCH`], to be uncharged by the caller; `None` if the
    /// reserve is for another account.
    #[inline]
    pub(crate) fn give(&self, acc: AccountKey, n: u64) -> Option<u64> {
        if self.account.get() != acc.as_ptr() {
            return None;
        }
        let b = self.bytes.get() + n;
        if b > MAX_THREAD_RESERVE {
            self.bytes.set(RESERVE_BATCH);
            Some(b - RESERVE_BATCH)
        } else {
            self.bytes.set(b);
            Some(0)
        }
    }

    /// Empty the reserve: `(account, bytes)` to be uncharged.
    pub(crate) fn take_all(&self) -> Option<(AccountKey, u64)> {
        let acc = self.account.replace(std::ptr::null());
        if !acc.is_null() {
            // Relaxed: a statistic.
            RESERVE_HOLDERS.fetch_sub(1, Relaxed);
        }
        let bytes = self.bytes.replace(0);
        if bytes == 0 {
            return None;
        }
        // SAFETY: the bytes held keep the account alive.
        unsafe { AccountKey::from_ptr(acc) }.map(|a| (a, bytes))
    }
}

/// Return the calling thread's reserve to its group's usage counter: call
/// it where a thread goes idle (a runtime's worker parking, a pool thread
/// waiting for work), so that idle threads hold nothing charged. Returns the
/// bytes returned. Cheap when the reserve is empty.
///
/// ```
/// // With an `Accounted` global allocator attached, after the work of a
/// // request: nothing stays charged to its group on this thread.
/// splitcount::alloc::drain_thread();
/// ```
pub fn drain_thread() -> u64 {
    flush_headers();
    match STATE.try_with(|t| t.reserve.take_all()) {
        Ok(Some((acc, bytes))) => {
            acc.uncharge_bytes(bytes);
            bytes
        }
        _ => 0,
    }
}
