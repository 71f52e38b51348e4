//! [`Stock`]: the per-CPU pre-charged stock (the kernel's `memcg_stock_pcp`,
//! with several groups per CPU as since Linux 6.16).
//!
//! Each CPU keeps up to [`MAX_STOCK_SLOTS`] slots `(key, units)`: units
//! already charged to the key's usage counter (and its ancestors) but not
//! yet used. A charge that finds enough units in its CPU's slot for its key
//! takes them and touches no shared cache line; a miss charges a whole batch
//! to the usage counter and stashes the surplus here.
//!
//! The key ([`StockKey`]) is what units are charged through: a group's
//! usage counter for [`crate::group::Group::charge`], the allocator's
//! account of a group for the byte stock (whose units keep that account
//! alive: see `alloc/account.rs`).
//!
//! ```text
//!  CPU n, one 128-byte block:
//!  ┌──────┬────────┬──────────────────────────────┬───────────────────────┐
//!  │ lock │ victim │ key[0..7] (8 B each)         │ units[0..7] (4 B each) │
//!  └──────┴────────┴──────────────────────────────┴───────────────────────┘
//! ```
//!
//! **Locking.** Threads that share a CPU can preempt each other, so each
//! CPU's block has a try-lock. The hot path never waits: if the lock is
//! held, the caller bypasses the stock and charges the usage counter
//! directly. Drainers (which may empty other CPUs' blocks) wait for each
//! block's lock in turn; several drains may run at once, each holding one
//! block at a time. A drain never gives up because another one is running:
//! a charge that is refused after draining was refused with every stocked
//! unit of the refusing subtree returned (the kernel's `drain_all_stock`
//! skips when another drain runs, and its refusals are then inexact).
//!
//! **Slack.** Stocked units are charged, so usage never exceeds a limit
//! because of the stock; it may *over*-report real use by at most
//! `batch · slots · ncpu` units across the machine.
//!
//! **`fork`.** A child process has only the thread that forked; a block
//! lock held by any other thread at that moment would never be released
//! there, and the child's next drain (a refused allocation, say) would wait
//! for ever. `pthread_atfork` handlers take every stock's block locks before
//! the fork — so no block is mid-update — and release them in the parent
//! and in the child (the `fork` module below).

use super::usage::UsageCounter;
use crate::sync::{
    Arc, AtomicBool,
    Ordering::{Acquire, Relaxed, Release},
    UnsafeCell,
};
use crossbeam_utils::CachePadded;

/// Most slots a CPU's stock can have (one 128-byte block).
pub const MAX_STOCK_SLOTS: usize = 7;

/// The largest batch: units are kept as `u32`.
pub const MAX_STOCK_BATCH: u64 = u32::MAX as u64;

/// What units in a [`Stock`] are charged through: a pointer-sized handle
/// naming a usage counter.
pub trait StockKey: Clone {
    /// The usage counter the units are charged to.
    fn counter(&self) -> &UsageCounter;
    /// Whether two keys are the same (by identity).
    fn same(&self, other: &Self) -> bool;
    /// Give `units` back to the counter (called outside the stock's lock).
    fn return_units(self, units: u64);
    /// Whether a slot keeps its key when its units run out. A key whose
    /// validity depends on the units it stands for (an allocator account)
    /// must not stay behind with none.
    const KEEP_EMPTY: bool;
}

impl StockKey for Arc<UsageCounter> {
    fn counter(&self) -> &UsageCounter {
        self
    }
    fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(self, other)
    }
    fn return_units(self, units: u64) {
        self.uncharge(units);
    }
    // Keeping the key saves an `Arc` drop and clone per refill.
    const KEEP_EMPTY: bool = true;
}

/// The answer of [`Stock::consume`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumed {
    /// The units were taken from this CPU's stock.
    Hit,
    /// This CPU's stock has too few units for the counter.
    Miss,
    /// Another thread on this CPU holds the stock: charge directly.
    Busy,
}

/// Units a stock operation could not keep, to be uncharged by the caller
/// (after the stock's lock is released): an evicted slot, the excess above
/// the batch, or everything when the lock was busy.
#[derive(Debug)]
#[must_use = "leftover units must be uncharged"]
pub struct Leftovers<K: StockKey = Arc<UsageCounter>> {
    items: [Option<(K, u64)>; 2],
}

impl<K: StockKey> Default for Leftovers<K> {
    fn default() -> Self {
        Leftovers {
            items: [None, None],
        }
    }
}

impl<K: StockKey> Leftovers<K> {
    fn push(&mut self, key: K, units: u64) {
        if units == 0 {
            return;
        }
        if let Some(slot) = self.items.iter_mut().find(|i| i.is_none()) {
            *slot = Some((key, units));
        } else {
            // Both places are taken (never by the stock's own operations,
            // which leave at most two): give these back at once.
            key.return_units(units);
        }
    }

    /// Uncharge every leftover from its counter; returns the units.
    pub fn uncharge(self) -> u64 {
        self.items
            .into_iter()
            .flatten()
            .map(|(k, units)| {
                k.return_units(units);
                units
            })
            .sum()
    }
}

struct Slots<K> {
    next_victim: u8,
    keys: [Option<K>; MAX_STOCK_SLOTS],
    units: [u32; MAX_STOCK_SLOTS],
}

/// One CPU's block. `repr(C)` with the lock first: the fork handlers reach
/// the lock of every block of every stock without knowing the key type.
#[repr(C)]
struct CpuStock<K> {
    locked: AtomicBool,
    slots: UnsafeCell<Slots<K>>,
}

/// The per-CPU stocks of one hierarchy (or of the allocator's bytes). See
/// the module docs.
pub struct Stock<K: StockKey = Arc<UsageCounter>> {
    /// Boxed, so the blocks stay where the fork registry saw them while
    /// the `Stock` itself moves.
    cpus: Box<[CachePadded<CpuStock<K>>]>,
    batch: u64,
    slots: usize,
}

/// A stock that cannot be built: each variant names the valid range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StockError {
    /// A stock for no CPU at all.
    NoCpus,
    /// Slots per CPU outside `1..=`[`MAX_STOCK_SLOTS`].
    Slots(usize),
    /// A batch outside `1..=`[`MAX_STOCK_BATCH`] (units are kept as `u32`).
    Batch(u64),
}

impl std::fmt::Display for StockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StockError::NoCpus => write!(f, "a stock needs at least one CPU"),
            StockError::Slots(s) => write!(
                f,
                "a CPU's stock holds 1 to {MAX_STOCK_SLOTS} groups, not {s}"
            ),
            StockError::Batch(b) => write!(
                f,
                "the stock batch must be between 1 and {MAX_STOCK_BATCH}, not {b}"
            ),
        }
    }
}

impl std::error::Error for StockError {}

// SAFETY: each `Slots` is only accessed by the holder of its CPU's lock
// (acquire/release), so `Stock` may be shared and sent like a `Mutex` of
// its keys.
unsafe impl<K: StockKey + Send> Sync for Stock<K> {}
// SAFETY: as above.
unsafe impl<K: StockKey + Send> Send for Stock<K> {}

// A panic cannot leave a block half-updated: slots change only under their
// CPU's lock, in code that does not panic, and the lock is released by a
// guard. So code that catches an unwind may go on using a stock (and the
// groups and hierarchies that hold one).
impl<K: StockKey> std::panic::RefUnwindSafe for Stock<K> {}
impl<K: StockKey> std::panic::UnwindSafe for Stock<K> {}

/// A held CPU lock.
struct Locked<'a, K> {
    cpu: &'a CpuStock<K>,
}

impl<K> Drop for Locked<'_, K> {
    fn drop(&mut self) {
        // Release: publishes this holder's slot changes to the next holder.
        self.cpu.locked.store(false, Release);
    }
}

impl<K> Locked<'_, K> {
    fn with<R>(&self, f: impl FnOnce(&mut Slots<K>) -> R) -> R {
        // SAFETY: we hold this CPU's lock, so no one else accesses its slots.
        self.cpu.slots.with_mut(|s| f(unsafe { &mut *s }))
    }
}

impl<K> CpuStock<K> {
    fn try_lock(&self) -> Option<Locked<'_, K>> {
        // Acquire: sees the previous holder's slot changes.
        self.locked
            .compare_exchange(false, true, Acquire, Relaxed)
            .ok()
            .map(|_| Locked { cpu: self })
    }

    fn lock(&self) -> Locked<'_, K> {
        loop {
            if let Some(l) = self.try_lock() {
                return l;
            }
            crate::sync::thread::yield_now();
        }
    }
}

impl<K: StockKey> Slots<K> {
    fn find(&self, slots: usize, key: &K) -> Option<usize> {
        (0..slots).find(|&i| self.keys[i].as_ref().is_some_and(|k| k.same(key)))
    }
}

impl<K: StockKey> Stock<K> {
    /// Stocks for `cpus` CPUs (≥ 1) of `slots` slots each
    /// (`1..=`[`MAX_STOCK_SLOTS`]), batch `batch` (`1..=`[`MAX_STOCK_BATCH`]).
    pub fn new(cpus: usize, slots: usize, batch: u64) -> Result<Stock<K>, StockError> {
        if cpus == 0 {
            return Err(StockError::NoCpus);
        }
        if !(1..=MAX_STOCK_SLOTS).contains(&slots) {
            return Err(StockError::Slots(slots));
        }
        if !(1..=MAX_STOCK_BATCH).contains(&batch) {
            return Err(StockError::Batch(batch));
        }
        let stock = Stock {
            cpus: (0..cpus)
                .map(|_| {
                    CachePadded::new(CpuStock {
                        locked: AtomicBool::new(false),
                        slots: UnsafeCell::new(Slots {
                            next_victim: 0,
                            keys: Default::default(),
                            units: [0; MAX_STOCK_SLOTS],
                        }),
                    })
                })
                .collect(),
            batch,
            slots,
        };
        #[cfg(all(unix, not(loom)))]
        fork::register(&stock.cpus);
        Ok(stock)
    }

    /// The batch: a miss charges this many units at once.
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// Slots per CPU.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// CPUs (blocks).
    pub fn cpus(&self) -> usize {
        self.cpus.len()
    }

    fn cpu(&self, cpu: usize) -> &CpuStock<K> {
        &self.cpus[cpu % self.cpus.len()]
    }

    /// Take `n` units for `key` from CPU `cpu`'s stock.
    #[inline]
    pub fn consume(&self, cpu: usize, key: &K, n: u64) -> Consumed {
        let Some(locked) = self.cpu(cpu).try_lock() else {
            return Consumed::Busy;
        };
        locked.with(|s| match s.find(self.slots, key) {
            Some(i) if s.units[i] as u64 >= n => {
                s.units[i] -= n as u32;
                if !K::KEEP_EMPTY && s.units[i] == 0 {
                    s.keys[i] = None;
                }
                Consumed::Hit
            }
            _ => Consumed::Miss,
        })
    }

    /// Keep `n` charged units for `key` in CPU `cpu`'s stock: added to its
    /// slot, or into an empty slot, or into a victim's (round-robin, the
    /// victim's units returned as leftovers). A slot above the batch
    /// returns its excess. If the lock is busy, all `n` come back.
    pub fn stash(&self, cpu: usize, key: &K, n: u64) -> Leftovers<K> {
        let mut left = Leftovers::default();
        if n == 0 {
            return left;
        }
        let Some(locked) = self.cpu(cpu).try_lock() else {
            left.push(key.clone(), n);
            return left;
        };
        locked.with(|s| self.stash_locked(s, key, n, &mut left));
        left
    }

    fn stash_locked(&self, s: &mut Slots<K>, key: &K, n: u64, left: &mut Leftovers<K>) {
        // Under the lock: a drain that followed `retire` has either passed
        // this CPU (and released the lock we now hold: we see the flag) or
        // has yet to come (and will take what we stock).
        if key.counter().is_retired() {
            left.push(key.clone(), n);
            return;
        }
        let i = match s.find(self.slots, key) {
            Some(i) => i,
            None => {
                let i = match (0..self.slots).find(|&i| s.keys[i].is_none()) {
                    Some(i) => i,
                    None => {
                        let v = s.next_victim as usize % self.slots;
                        s.next_victim = ((v + 1) % self.slots) as u8;
                        if let Some(victim) = s.keys[v].take() {
                            left.push(victim, s.units[v] as u64);
                        }
                        v
                    }
                };
                s.keys[i] = Some(key.clone());
                s.units[i] = 0;
                i
            }
        };
        let total = (s.units[i] as u64).saturating_add(n);
        let keep = total.min(self.batch);
        s.units[i] = keep as u32;
        if total > keep {
            left.push(key.clone(), total - keep);
        }
    }

    /// Return `n` units the caller had charged through `key` (an uncharge)
    /// through CPU `cpu`'s stock, like [`Stock::stash`] — unless the
    /// counter's usage cannot account for them: units in a stock are
    /// charged, so a slot may never hold more than the counter's usage. An
    /// uncharge larger than the usage minus what this slot already holds is
    /// a caller's over-uncharge: stocking it would let later charges take
    /// units no one paid for (a limit of 100 let 164 units through), and
    /// taking it all from the counter would take units that back this slot.
    /// It is clamped instead — only what the usage can account for comes back
    /// (to be uncharged from the counter directly) — and the counter records
    /// an `underflow` event.
    pub fn give_back(&self, cpu: usize, key: &K, n: u64) -> Leftovers<K> {
        let mut left = Leftovers::default();
        if n == 0 {
            return left;
        }
        let Some(locked) = self.cpu(cpu).try_lock() else {
            left.push(key.clone(), n);
            return left;
        };
        locked.with(|s| {
            let held = s.find(self.slots, key).map_or(0, |i| s.units[i] as u64);
            // Relaxed: a bound check. Correct callers always pass it (usage
            // ≥ their own units + every stocked unit); concurrent charges
            // only raise the usage, and concurrent uncharges and drains on
            // other CPUs lower it by units that were not this caller's.
            let free = key.counter().usage().saturating_sub(held);
            if free < n {
                key.counter().record_underflow();
                left.push(key.clone(), free);
            } else {
                self.stash_locked(s, key, n, &mut left);
            }
        });
        left
    }

    /// Take one of CPU `cpu`'s slots whose counter satisfies `which`,
    /// waiting for the CPU's lock.
    fn take_one(&self, cpu: usize, which: &dyn Fn(&UsageCounter) -> bool) -> Option<(K, u64)> {
        self.cpu(cpu).lock().with(|s| {
            let i = (0..self.slots)
                .find(|&i| s.keys[i].as_ref().is_some_and(|k| which(k.counter())))?;
            let k = s.keys[i].take()?;
            Some((k, std::mem::take(&mut s.units[i]) as u64))
        })
    }

    /// Drain (uncharge) every CPU's slots whose counter satisfies `which`;
    /// returns the units drained. Waits for each CPU's lock in turn (never
    /// for another drain); uncharges, and drops each slot's key, outside
    /// the lock; allocates nothing — the allocator integration drains from
    /// inside `GlobalAlloc::alloc`.
    ///
    /// Every unit stocked for a matching counter when the call starts is
    /// returned by the time it ends, unless a thread re-stocked it since.
    pub fn drain_all(&self, which: &dyn Fn(&UsageCounter) -> bool) -> u64 {
        let mut drained = 0;
        for cpu in 0..self.cpus.len() {
            while let Some((k, units)) = self.take_one(cpu, which) {
                k.return_units(units);
                drained += units;
            }
        }
        drained
    }

    /// Units stocked for `counter` on every CPU (waits for each lock; for
    /// tests and reports).
    pub fn stocked(&self, counter: &UsageCounter) -> u64 {
        self.stocked_where(&|c| std::ptr::eq(c, counter))
    }

    /// Units stocked for `counter` or any counter below it, on every CPU:
    /// the part of `counter`'s usage that sits in stocks.
    pub fn stocked_within(&self, counter: &UsageCounter) -> u64 {
        self.stocked_where(&|c| c.is_within(counter))
    }

    fn stocked_where(&self, which: &dyn Fn(&UsageCounter) -> bool) -> u64 {
        (0..self.cpus.len())
            .map(|cpu| {
                self.cpu(cpu).lock().with(|s| {
                    (0..self.slots)
                        .filter(|&i| s.keys[i].as_ref().is_some_and(|k| which(k.counter())))
                        .map(|i| s.units[i] as u64)
                        .sum::<u64>()
                })
            })
            .sum()
    }
}

#[cfg(all(unix, not(loom)))]
impl<K: StockKey> Drop for Stock<K> {
    fn drop(&mut self) {
        fork::unregister(&self.cpus);
    }
}

/// Every live stock's blocks, so that `fork` can quiesce them.
#[cfg(all(unix, not(loom)))]
mod fork {
    use super::CpuStock;
    use crossbeam_utils::CachePadded;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Once;

    /// A registered run of blocks: address of the first, count, stride.
    /// Each block starts with its lock word (`CpuStock` is `repr(C)`, and
    /// `CachePadded` puts its contents first).
    type Run = (usize, usize, usize);

    /// The registry, guarded by a spin lock of our own: the prepare handler
    /// keeps it locked across the fork, and the handlers in parent and
    /// child release it (a `Mutex` guard cannot be carried from one
    /// handler to the other).
    struct Registry {
        locked: AtomicBool,
        runs: std::cell::UnsafeCell<Vec<Run>>,
    }

    // SAFETY: `runs` is only accessed while `locked` is held.
    unsafe impl Sync for Registry {}

    static REGISTRY: Registry = Registry {
        locked: AtomicBool::new(false),
        runs: std::cell::UnsafeCell::new(Vec::new()),
    };

    fn lock() {
        // Acquire/Release: the flag guards `runs`.
        while REGISTRY
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
    }

    fn unlock() {
        REGISTRY.locked.store(false, Ordering::Release);
    }

    /// Run `f` on the registered runs, with the registry locked.
    fn with_runs<R>(f: impl FnOnce(&mut Vec<Run>) -> R) -> R {
        lock();
        // SAFETY: the registry lock is held.
        let r = f(unsafe { &mut *REGISTRY.runs.get() });
        unlock();
        r
    }

    fn run_of<K>(blocks: &[CachePadded<CpuStock<K>>]) -> Run {
        (
            blocks.as_ptr() as usize,
            blocks.len(),
            std::mem::size_of::<CachePadded<CpuStock<K>>>(),
        )
    }

    pub(super) fn register<K>(blocks: &[CachePadded<CpuStock<K>>]) {
        static HANDLERS: Once = Once::new();
        HANDLERS.call_once(|| {
            // SAFETY: the handlers are `extern "C"` functions without
            // arguments that never unwind.
            unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(release)) };
        });
        let run = run_of(blocks);
        with_runs(|r| r.push(run));
    }

    pub(super) fn unregister<K>(blocks: &[CachePadded<CpuStock<K>>]) {
        let run = run_of(blocks);
        with_runs(|r| r.retain(|&e| e != run));
    }

    fn each_lock(f: impl Fn(&AtomicBool)) {
        // SAFETY: called with the registry lock held (between `prepare`
        // and `release`); every registered run belongs to a live stock
        // (unregistered in `Drop` before it is freed, which needs this
        // lock); each block begins with its lock word.
        for &(base, len, stride) in unsafe { &*REGISTRY.runs.get() }.iter() {
            for i in 0..len {
                f(unsafe { &*((base + i * stride) as *const AtomicBool) });
            }
        }
    }

    /// Before `fork`: hold the registry (no stock comes or goes) and every
    /// block lock (no block is mid-update). Each critical section is a few
    /// instructions, so this waits very little.
    extern "C" fn prepare() {
        lock();
        each_lock(|l| {
            // Acquire: the holder's slot changes are complete.
            while l
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::thread::yield_now();
            }
        });
    }

    /// After `fork`, in the parent and in the child (whose only thread is
    /// this one): release what `prepare` took.
    extern "C" fn release() {
        each_lock(|l| l.store(false, Ordering::Release));
        unlock();
    }
}

impl<K: StockKey> std::fmt::Debug for Stock<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stock")
            .field("cpus", &self.cpus.len())
            .field("slots", &self.slots)
            .field("batch", &self.batch)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bad_shapes_are_refused_with_the_valid_range() {
        assert_eq!(
            Stock::<Arc<UsageCounter>>::new(0, 7, 64).err(),
            Some(StockError::NoCpus)
        );
        assert_eq!(
            Stock::<Arc<UsageCounter>>::new(2, 0, 64).err(),
            Some(StockError::Slots(0))
        );
        assert_eq!(
            Stock::<Arc<UsageCounter>>::new(2, 8, 64).err(),
            Some(StockError::Slots(8))
        );
        assert_eq!(
            Stock::<Arc<UsageCounter>>::new(2, 7, 0).err(),
            Some(StockError::Batch(0))
        );
        let e = Stock::<Arc<UsageCounter>>::new(2, 7, 1 << 33)
            .err()
            .unwrap();
        assert_eq!(e, StockError::Batch(1 << 33));
        assert!(e.to_string().contains("between 1 and 4294967295"), "{e}");
    }

    #[test]
    fn the_per_cpu_block_fits_one_padded_line() {
        assert!(std::mem::size_of::<CpuStock<Arc<UsageCounter>>>() <= 128);
        assert_eq!(
            std::mem::align_of::<CachePadded<CpuStock<Arc<UsageCounter>>>>() % 64,
            0
        );
    }

    #[test]
    fn a_hit_takes_units_and_a_miss_leaves_them() {
        let s = Stock::<Arc<UsageCounter>>::new(2, 7, 64).unwrap();
        let c = UsageCounter::root();
        c.charge(64);
        assert!(s.stash(0, &c, 60).uncharge() == 0);
        assert_eq!(s.consume(0, &c, 50), Consumed::Hit);
        assert_eq!(s.consume(0, &c, 11), Consumed::Miss, "only 10 left");
        assert_eq!(s.consume(1, &c, 1), Consumed::Miss, "another CPU's stock");
        assert_eq!(s.stocked(&c), 10);
    }

    #[test]
    fn a_slot_above_the_batch_returns_its_excess() {
        let s = Stock::<Arc<UsageCounter>>::new(1, 7, 64).unwrap();
        let c = UsageCounter::root();
        c.charge(100);
        assert_eq!(s.stash(0, &c, 100).uncharge(), 36);
        assert_eq!(c.usage(), 64);
        assert_eq!(s.stocked(&c), 64);
    }

    #[test]
    fn a_full_stock_evicts_round_robin() {
        let s = Stock::<Arc<UsageCounter>>::new(1, 2, 64).unwrap();
        let (a, b, x) = (
            UsageCounter::root(),
            UsageCounter::root(),
            UsageCounter::root(),
        );
        for c in [&a, &b, &x] {
            c.charge(10);
        }
        assert_eq!(s.stash(0, &a, 10).uncharge(), 0);
        assert_eq!(s.stash(0, &b, 10).uncharge(), 0);
        assert_eq!(s.stash(0, &x, 10).uncharge(), 10, "a was evicted");
        assert_eq!((a.usage(), b.usage(), x.usage()), (0, 10, 10));
        assert_eq!(s.stocked(&a), 0);
    }

    #[test]
    fn a_busy_stock_is_bypassed_never_waited_for() {
        let s = Stock::<Arc<UsageCounter>>::new(1, 7, 64).unwrap();
        let c = UsageCounter::root();
        let held = s.cpu(0).try_lock().unwrap();
        assert_eq!(s.consume(0, &c, 1), Consumed::Busy);
        c.charge(5);
        assert_eq!(s.stash(0, &c, 5).uncharge(), 5, "everything comes back");
        drop(held);
        assert_eq!(c.usage(), 0);
    }

    #[test]
    fn drain_all_empties_only_the_chosen_counters() {
        let s = Stock::<Arc<UsageCounter>>::new(3, 7, 64).unwrap();
        let (a, b) = (UsageCounter::root(), UsageCounter::root());
        for cpu in 0..3 {
            a.charge(20);
            b.charge(20);
            let _ = s.stash(cpu, &a, 20).uncharge();
            let _ = s.stash(cpu, &b, 20).uncharge();
        }
        assert_eq!(s.drain_all(&|c| std::ptr::eq(c, &*a)), 60);
        assert_eq!((a.usage(), b.usage()), (0, 60));
        assert_eq!(s.stocked(&b), 60);
    }
}
