//! Giving freed memory back to the system, on request or by a policy.
//!
//! glibc keeps what a program frees for its next allocations: in its bins,
//! and at the top of each arena up to a threshold (128 KiB, raised to twice
//! the largest block it mapped on its own and freed, up to 64 MiB), and it
//! does not merge small freed blocks (its fast bins) until asked. After a
//! spike the resident set stays where the spike took it while the groups'
//! usage is back down. `malloc_trim(0)` merges every arena's free chunks
//! and returns the whole pages inside them to the system
//! (`madvise(MADV_DONTNEED)`), and shrinks the main arena's heap; it leaves
//! the top chunk of the other arenas (the threads' own), which glibc
//! shrinks only when a large chunk is freed there and the top is above the
//! threshold. glibc still counts the released pages as free (`mallinfo2`'s
//! `fordblks`) until it hands them out again; the next allocations there
//! fault them back in. Measured (`tests/trim.rs`, `IMPLEMENTATION.md` §7,
//! *Reconciliation*): 2,000,000 blocks of 100 bytes freed left 277 MiB
//! resident; a trim took it back to the 2.2 MiB before the spike on the
//! main thread, and to 21 MiB on another thread (its arena's top).
//!
//! **The policy** ([`TrimPolicy`]) runs trims on a background thread,
//! `splitcount-trim`, started by [`Accounted::set_trim`] and ended when the
//! policy is turned off:
//!
//! ```text
//!  Group::remove ──► pending = true ──(first since the last trim: wake)──► splitcount-trim
//!   (a load and a store; a lock                                            waits until due:
//!    and a wake once per trim)                                             last trim + min_interval
//!                                                                          glibc's free bytes grew
//!                                                                          by min_free? → malloc_trim(0)
//! ```
//!
//! So a server removing thousands of request groups per second pays a load
//! per removal, never runs a trim on a request's path, trims at most once
//! per `min_interval`, and the memory of the last requests of a burst is
//! given back too (the trim the interval held back runs when it is due).
//! Elsewhere than glibc (`linux-gnu`) every trim is a no-op.

use super::charging::Charging;
use super::wrapper::Accounted;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// When the allocator gives freed memory back to the system by itself
/// ([`crate::alloc::Accounted::set_trim`]): `malloc_trim(0)` on a
/// background thread, `splitcount-trim`, after group removals or when
/// glibc's free bytes grew, at most once per interval. Off by default. The
/// heap is the process's, so the policy is too: one for all allocators.
///
/// A trim returns the free pages inside glibc's free chunks and shrinks
/// its main arena; it leaves each thread arena's top chunk (up to 64 MiB:
/// what lies above the last block still in use there). glibc shrinks that
/// top itself when a chunk of 64 KiB or more is freed in the arena and the
/// top is above its trim threshold; a lower threshold
/// (`GLIBC_TUNABLES=glibc.malloc.trim_threshold=N`, or `mallopt`, which
/// also turns off glibc's dynamic mmap threshold) bounds what stays.
///
/// ```
/// use splitcount::alloc::TrimPolicy;
/// use std::time::Duration;
///
/// // After group removals, at most every 2 s, once 32 MiB more were freed.
/// let policy = TrimPolicy::on_remove()
///     .min_interval(Duration::from_secs(2))
///     .min_free(32 << 20);
/// assert!(policy.on_remove);
/// // Without removals: whenever 64 MiB more were freed (checked each second).
/// let pressure = TrimPolicy::when_freed(64 << 20);
/// assert!(!pressure.on_remove);
/// assert_eq!(TrimPolicy::default(), TrimPolicy::OFF);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrimPolicy {
    /// A removal of a group ([`crate::group::Group::remove`], of the
    /// hierarchy the allocator is attached to) asks for a trim; it runs
    /// when the limits below allow, on the background thread.
    pub on_remove: bool,
    /// At most one trim per this interval. Without `on_remove`, how often
    /// `min_free` is checked.
    pub min_interval: Duration,
    /// Only once glibc's free bytes (`mallinfo2`'s `fordblks`) grew by at
    /// least this since the last trim (or since they were lowest): the
    /// pages a trim released stay counted as free until they are reused,
    /// so the growth is what was freed since. 0: no condition (then
    /// `on_remove` is the only trigger).
    pub min_free: u64,
}

/// [`TrimPolicy::min_interval`] unless set: one trim per second at most.
pub const DEFAULT_TRIM_INTERVAL: Duration = Duration::from_secs(1);

impl TrimPolicy {
    /// No trim but the ones asked for ([`crate::alloc::Accounted::trim`]).
    pub const OFF: TrimPolicy = TrimPolicy {
        on_remove: false,
        min_interval: DEFAULT_TRIM_INTERVAL,
        min_free: 0,
    };

    /// Trim after group removals, at most once per
    /// [`DEFAULT_TRIM_INTERVAL`].
    pub const fn on_remove() -> TrimPolicy {
        TrimPolicy {
            on_remove: true,
            ..TrimPolicy::OFF
        }
    }

    /// Trim whenever glibc's free bytes grew by `bytes` since the last
    /// trim, checked once per [`DEFAULT_TRIM_INTERVAL`]: memory pressure
    /// from the heap itself, without removals.
    pub const fn when_freed(bytes: u64) -> TrimPolicy {
        TrimPolicy {
            min_free: bytes,
            ..TrimPolicy::OFF
        }
    }

    /// At most one trim per `interval`.
    pub const fn min_interval(mut self, interval: Duration) -> TrimPolicy {
        self.min_interval = interval;
        self
    }

    /// Only once glibc's free bytes grew by `bytes` since the last trim.
    pub const fn min_free(mut self, bytes: u64) -> TrimPolicy {
        self.min_free = bytes;
        self
    }

    fn active(&self) -> bool {
        self.on_remove || self.min_free > 0
    }
}

impl Default for TrimPolicy {
    fn default() -> Self {
        TrimPolicy::OFF
    }
}

/// What one trim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Trimmed {
    /// glibc said it returned memory to the system (`malloc_trim`'s result);
    /// `false` elsewhere.
    pub released: bool,
    /// How long the trim took.
    pub took: Duration,
}

// The policy, field by field: `ON_REMOVE` is read on every removal,
// without a lock. Relaxed throughout: independent settings and statistics;
// the trimmer re-reads them after every wake-up, under `TRIMMER`.
static ON_REMOVE: AtomicBool = AtomicBool::new(false);
static MIN_INTERVAL_NS: AtomicU64 = AtomicU64::new(1_000_000_000);
static MIN_FREE: AtomicU64 = AtomicU64::new(0);
/// A removal asked for a trim that has not run yet.
static PENDING: AtomicBool = AtomicBool::new(false);
/// The monotonic time before which no policy trim runs.
static NEXT_DUE_NS: AtomicU64 = AtomicU64::new(0);
/// glibc's free bytes after the last trim, lowered when they drop.
static FREE_BASE: AtomicU64 = AtomicU64::new(0);

/// Whether the trimmer thread runs; it waits on `WAKE` with this held.
static TRIMMER: Mutex<bool> = Mutex::new(false);
static WAKE: Condvar = Condvar::new();

/// Trims done (asked for or by the policy) and their total time: for
/// [`super::Reconciliation`].
pub(crate) static TRIMS: AtomicU64 = AtomicU64::new(0);
pub(crate) static TRIM_NANOS: AtomicU64 = AtomicU64::new(0);

fn policy() -> TrimPolicy {
    TrimPolicy {
        on_remove: ON_REMOVE.load(Relaxed),
        min_interval: Duration::from_nanos(MIN_INTERVAL_NS.load(Relaxed)),
        min_free: MIN_FREE.load(Relaxed),
    }
}

/// Set the policy; start the trimmer if it is needed and not running, and
/// wake it to read the new policy (it ends itself when the policy is off).
fn set_policy(p: TrimPolicy) {
    let ns = p.min_interval.as_nanos().min(u64::MAX as u128) as u64;
    MIN_INTERVAL_NS.store(ns, Relaxed);
    MIN_FREE.store(p.min_free, Relaxed);
    NEXT_DUE_NS.store(0, Relaxed);
    FREE_BASE.store(free_bytes().unwrap_or(0), Relaxed);
    PENDING.store(false, Relaxed);
    ON_REMOVE.store(p.on_remove, Relaxed);
    let start = {
        let mut running = TRIMMER.lock().unwrap_or_else(|e| e.into_inner());
        WAKE.notify_all();
        let start = p.active() && !*running;
        *running |= start;
        start
    };
    // Spawned outside the lock: spawning allocates, and an allocation's
    // hook may remove a group, which takes the lock.
    if start
        && std::thread::Builder::new()
            .name("splitcount-trim".into())
            .spawn(trimmer)
            .is_err()
    {
        // Without its thread the policy does nothing; the next `set_trim`
        // tries again.
        *TRIMMER.lock().unwrap_or_else(|e| e.into_inner()) = false;
    }
}

/// A group of a hierarchy with an allocator attached was removed: a load,
/// and once per trim a store, a lock and a wake-up.
#[inline]
pub(crate) fn group_removed() {
    if ON_REMOVE.load(Relaxed) && !PENDING.load(Relaxed) && !PENDING.swap(true, Relaxed) {
        // The lock orders the wake-up after the trimmer's look at
        // `PENDING`, or before its wait: it cannot be lost.
        let _guard = TRIMMER.lock().unwrap_or_else(|e| e.into_inner());
        WAKE.notify_all();
    }
}

/// The background thread: waits for a trim to be asked for (or, with
/// `min_free` alone, for each interval) and due, runs it, and ends when the
/// policy is off.
fn trimmer() {
    let mut running = TRIMMER.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let p = policy();
        if !p.active() {
            *running = false;
            return;
        }
        let asked = !p.on_remove || PENDING.load(Relaxed);
        let (now, due) = (now_ns(), NEXT_DUE_NS.load(Relaxed));
        let wait = if !asked {
            // Woken by the removal that asks; the timeout only bounds a
            // policy change missed.
            Duration::from_secs(1)
        } else if now < due {
            Duration::from_nanos(due - now)
        } else {
            drop(running);
            run_due(&p, now);
            running = TRIMMER.lock().unwrap_or_else(|e| e.into_inner());
            continue;
        };
        running = WAKE
            .wait_timeout(running, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// A due trim: the next one waits `min_interval`; with `min_free`, only if
/// enough was freed since the last (else the request is dropped: the next
/// removal asks again).
fn run_due(p: &TrimPolicy, now: u64) {
    let interval = p.min_interval.as_nanos().min(u64::MAX as u128) as u64;
    NEXT_DUE_NS.store(now.saturating_add(interval), Relaxed);
    if p.min_free > 0 {
        let Some(free) = free_bytes() else {
            PENDING.store(false, Relaxed);
            return;
        };
        let base = FREE_BASE.fetch_min(free, Relaxed).min(free);
        if free - base < p.min_free {
            PENDING.store(false, Relaxed);
            return;
        }
    }
    trim_now();
}

/// `malloc_trim(0)`, timed and counted. A no-op but for glibc.
fn trim_now() -> Trimmed {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // What is removed from here on asks again.
        PENDING.store(false, Relaxed);
        let start = now_ns();
        // SAFETY: malloc_trim has no preconditions.
        let released = unsafe { libc::malloc_trim(0) } != 0;
        let took = now_ns().saturating_sub(start);
        TRIMS.fetch_add(1, Relaxed);
        TRIM_NANOS.fetch_add(took, Relaxed);
        FREE_BASE.store(free_bytes().unwrap_or(0), Relaxed);
        Trimmed {
            released,
            took: Duration::from_nanos(took),
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        Trimmed {
            released: false,
            took: Duration::ZERO,
        }
    }
}

/// glibc's free bytes (`fordblks`: bins, fast bins and the arenas' tops).
fn free_bytes() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 has no preconditions; it returns a plain struct.
        Some(unsafe { libc::mallinfo2() }.fordblks as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Nanoseconds of the monotonic clock.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the time into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl<A, C: Charging> Accounted<A, C> {
    /// Give freed memory back to the system now: glibc's `malloc_trim(0)`,
    /// on the calling thread. It returns the whole free pages inside every
    /// arena's free chunks and shrinks the main arena's heap; a thread
    /// arena's top chunk stays (see [`TrimPolicy`]). A no-op elsewhere than
    /// glibc. The next allocations there fault their pages in again.
    ///
    /// ```
    /// use splitcount::alloc::Accounted;
    /// use std::alloc::System;
    ///
    /// static ALLOC: Accounted<System> = Accounted::new(System);
    /// let spike: Vec<Vec<u8>> = (0..10_000).map(|_| vec![1u8; 200]).collect();
    /// drop(spike);
    /// let t = ALLOC.trim();
    /// println!("released: {} in {:?}", t.released, t.took);
    /// ```
    pub fn trim(&self) -> Trimmed {
        trim_now()
    }

    /// Set the process's trim policy (off by default), for example
    /// `ALLOC.set_trim(TrimPolicy::on_remove())`: trims after group
    /// removals, at most once a second, on a background thread
    /// (`splitcount-trim`, started here and ended by
    /// `set_trim(TrimPolicy::OFF)`). glibc has one heap per process, so the
    /// policy is the process's, whichever allocator sets it.
    pub fn set_trim(&self, policy: TrimPolicy) {
        set_policy(policy)
    }

    /// The trim policy in force.
    pub fn trim_policy(&self) -> TrimPolicy {
        policy()
    }
}
