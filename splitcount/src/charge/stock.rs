//! [`Stock`]: the per-CPU pre-charged stock (the kernel's `memcg_stock_pcp`,
//! with several groups per CPU as since Linux 6.16).
//!
//! Each CPU keeps up to [`MAX_STOCK_SLOTS`] slots `(counter, units)`: units
//! already charged to `counter` (and its ancestors) but not yet used. A
//! charge that finds enough units in its CPU's slot for its counter takes
//! them and touches no shared cache line; a miss charges a whole batch to
//! the usage counter and stashes the surplus here.
//!
//! ```text
//!  CPU n, one 128-byte block:
//!  ┌──────┬────────┬──────────────────────────────┬───────────────────────┐
//!  │ lock │ victim │ counter[0..7] (8 B each)     │ units[0..7] (4 B each) │
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
#[derive(Debug, Default)]
#[must_use = "leftover units must be uncharged"]
pub struct Leftovers {
    items: [Option<(Arc<UsageCounter>, u64)>; 2],
}

impl Leftovers {
    fn push(&mut self, counter: Arc<UsageCounter>, units: u64) {
        if units == 0 {
            return;
        }
        let slot = self
            .items
            .iter_mut()
            .find(|i| i.is_none())
            .expect("at most two leftovers");
        *slot = Some((counter, units));
    }

    /// Uncharge every leftover from its counter; returns the units.
    pub fn uncharge(self) -> u64 {
        self.items
            .into_iter()
            .flatten()
            .map(|(c, units)| {
                c.uncharge(units);
                units
            })
            .sum()
    }
}

struct Slots {
    next_victim: u8,
    counters: [Option<Arc<UsageCounter>>; MAX_STOCK_SLOTS],
    units: [u32; MAX_STOCK_SLOTS],
}

struct CpuStock {
    locked: AtomicBool,
    slots: UnsafeCell<Slots>,
}

/// The per-CPU stocks of one hierarchy. See the module docs.
pub struct Stock {
    cpus: Box<[CachePadded<CpuStock>]>,
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
// (acquire/release), so `Stock` may be shared and sent like a `Mutex`.
unsafe impl Sync for Stock {}
// SAFETY: as above; the contents are `Send` (`Arc`s and integers).
unsafe impl Send for Stock {}

// A panic cannot leave a block half-updated: slots change only under their
// CPU's lock, in code that does not panic, and the lock is released by a
// guard. So code that catches an unwind may go on using a stock (and the
// groups and hierarchies that hold one).
impl std::panic::RefUnwindSafe for Stock {}
impl std::panic::UnwindSafe for Stock {}

/// A held CPU lock.
struct Locked<'a> {
    cpu: &'a CpuStock,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Release: publishes this holder's slot changes to the next holder.
        self.cpu.locked.store(false, Release);
    }
}

impl Locked<'_> {
    fn with<R>(&self, f: impl FnOnce(&mut Slots) -> R) -> R {
        // SAFETY: we hold this CPU's lock, so no one else accesses its slots.
        self.cpu.slots.with_mut(|s| f(unsafe { &mut *s }))
    }
}

impl CpuStock {
    fn try_lock(&self) -> Option<Locked<'_>> {
        // Acquire: sees the previous holder's slot changes.
        self.locked
            .compare_exchange(false, true, Acquire, Relaxed)
            .ok()
            .map(|_| Locked { cpu: self })
    }

    fn lock(&self) -> Locked<'_> {
        loop {
            if let Some(l) = self.try_lock() {
                return l;
            }
            crate::sync::thread::yield_now();
        }
    }
}

impl Stock {
    /// Stocks for `cpus` CPUs (≥ 1) of `slots` slots each
    /// (`1..=`[`MAX_STOCK_SLOTS`]), batch `batch` (`1..=`[`MAX_STOCK_BATCH`]).
    pub fn new(cpus: usize, slots: usize, batch: u64) -> Result<Stock, StockError> {
        if cpus == 0 {
            return Err(StockError::NoCpus);
        }
        if !(1..=MAX_STOCK_SLOTS).contains(&slots) {
            return Err(StockError::Slots(slots));
        }
        if !(1..=MAX_STOCK_BATCH).contains(&batch) {
            return Err(StockError::Batch(batch));
        }
        Ok(Stock {
            cpus: (0..cpus)
                .map(|_| {
                    CachePadded::new(CpuStock {
                        locked: AtomicBool::new(false),
                        slots: UnsafeCell::new(Slots {
                            next_victim: 0,
                            counters: Default::default(),
                            units: [0; MAX_STOCK_SLOTS],
                        }),
                    })
                })
                .collect(),
            batch,
            slots,
        })
    }

    /// The batch: a miss charges this many units at once.
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// Slots per CPU.
    pub fn slots(&self) -> usize {
        self.slots
    }

    fn cpu(&self, cpu: usize) -> &CpuStock {
        &self.cpus[cpu % self.cpus.len()]
    }

    /// Take `n` units for `counter` from CPU `cpu`'s stock.
    #[inline]
    pub fn consume(&self, cpu: usize, counter: &Arc<UsageCounter>, n: u64) -> Consumed {
        let Some(locked) = self.cpu(cpu).try_lock() else {
            return Consumed::Busy;
        };
        locked.with(|s| {
            for i in 0..self.slots {
                if let Some(c) = &s.counters[i] {
                    if Arc::ptr_eq(c, counter) {
                        if s.units[i] as u64 >= n {
                            s.units[i] -= n as u32;
                            return Consumed::Hit;
                        }
                        return Consumed::Miss;
                    }
                }
            }
            Consumed::Miss
        })
    }

    /// Keep `n` charged units for `counter` in CPU `cpu`'s stock: added to
    /// its slot, or into an empty slot, or into a victim's (round-robin,
    /// the victim's units returned as leftovers). A slot above the batch
    /// returns its excess. If the lock is busy, all `n` come back.
    pub fn stash(&self, cpu: usize, counter: &Arc<UsageCounter>, n: u64) -> Leftovers {
        let mut left = Leftovers::default();
        if n == 0 {
            return left;
        }
        let Some(locked) = self.cpu(cpu).try_lock() else {
            left.push(counter.clone(), n);
            return left;
        };
        locked.with(|s| {
            let i = match (0..self.slots).find(|&i| {
                s.counters[i]
                    .as_ref()
                    .is_some_and(|c| Arc::ptr_eq(c, counter))
            }) {
                Some(i) => i,
                None => {
                    let i = match (0..self.slots).find(|&i| s.counters[i].is_none()) {
                        Some(i) => i,
                        None => {
                            let v = s.next_victim as usize % self.slots;
                            s.next_victim = ((v + 1) % self.slots) as u8;
                            let victim = s.counters[v]
                                .take()
                                .expect("a full stock has no empty slot");
                            left.push(victim, s.units[v] as u64);
                            v
                        }
                    };
                    s.counters[i] = Some(counter.clone());
                    s.units[i] = 0;
                    i
                }
            };
            let total = (s.units[i] as u64).saturating_add(n);
            let keep = total.min(self.batch);
            s.units[i] = keep as u32;
            if total > keep {
                left.push(counter.clone(), total - keep);
            }
        });
        left
    }

    /// Take one of CPU `cpu`'s slots whose counter satisfies `which`,
    /// waiting for the CPU's lock.
    fn take_one(
        &self,
        cpu: usize,
        which: &dyn Fn(&UsageCounter) -> bool,
    ) -> Option<(Arc<UsageCounter>, u64)> {
        self.cpu(cpu).lock().with(|s| {
            let i = (0..self.slots).find(|&i| s.counters[i].as_deref().is_some_and(which))?;
            let c = s.counters[i].take()?;
            Some((c, std::mem::take(&mut s.units[i]) as u64))
        })
    }

    /// Drain (uncharge) every CPU's slots whose counter satisfies `which`;
    /// returns the units drained. Waits for each CPU's lock in turn (never
    /// for another drain); uncharges, and drops each slot's reference,
    /// outside the lock; allocates nothing — the allocator integration
    /// drains from inside `GlobalAlloc::alloc`.
    ///
    /// Every unit stocked for a matching counter when the call starts is
    /// returned by the time it ends, unless a thread re-stocked it since.
    pub fn drain_all(&self, which: &dyn Fn(&UsageCounter) -> bool) -> u64 {
        let mut drained = 0;
        for cpu in 0..self.cpus.len() {
            while let Some((c, units)) = self.take_one(cpu, which) {
                c.uncharge(units);
                drained += units;
            }
        }
        drained
    }

    /// Units stocked for `counter` on every CPU (waits for each lock; for
    /// tests and reports).
    pub fn stocked(&self, counter: &UsageCounter) -> u64 {
        (0..self.cpus.len())
            .map(|cpu| {
                self.cpu(cpu).lock().with(|s| {
                    (0..self.slots)
                        .filter(|&i| {
                            s.counters[i]
                                .as_deref()
                                .is_some_and(|c| std::ptr::eq(c, counter))
                        })
                        .map(|i| s.units[i] as u64)
                        .sum::<u64>()
                })
            })
            .sum()
    }
}

impl std::fmt::Debug for Stock {
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
        assert_eq!(Stock::new(0, 7, 64).err(), Some(StockError::NoCpus));
        assert_eq!(Stock::new(2, 0, 64).err(), Some(StockError::Slots(0)));
        assert_eq!(Stock::new(2, 8, 64).err(), Some(StockError::Slots(8)));
        assert_eq!(Stock::new(2, 7, 0).err(), Some(StockError::Batch(0)));
        let e = Stock::new(2, 7, 1 << 33).err().unwrap();
        assert_eq!(e, StockError::Batch(1 << 33));
        assert!(e.to_string().contains("between 1 and 4294967295"), "{e}");
    }

    #[test]
    fn the_per_cpu_block_fits_one_padded_line() {
        assert!(std::mem::size_of::<CpuStock>() <= 128);
        assert_eq!(std::mem::align_of::<CachePadded<CpuStock>>() % 64, 0);
    }

    #[test]
    fn a_hit_takes_units_and_a_miss_leaves_them() {
        let s = Stock::new(2, 7, 64).unwrap();
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
        let s = Stock::new(1, 7, 64).unwrap();
        let c = UsageCounter::root();
        c.charge(100);
        assert_eq!(s.stash(0, &c, 100).uncharge(), 36);
        assert_eq!(c.usage(), 64);
        assert_eq!(s.stocked(&c), 64);
    }

    #[test]
    fn a_full_stock_evicts_round_robin() {
        let s = Stock::new(1, 2, 64).unwrap();
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
        let s = Stock::new(1, 7, 64).unwrap();
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
        let s = Stock::new(3, 7, 64).unwrap();
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
