//! A LongAdder-style striped counter: the JVM's answer to a contended
//! counter (`java.util.concurrent.atomic.LongAdder`, built on `Striped64`),
//! written here as a peer for `bench counters`. It is not a splitcount design:
//! it has no cheap bounded read, only an O(stripes) sum.
//!
//! - **Uncontended**, an add is one compare-and-swap on `base`.
//! - **The first failed CAS** on `base` (another thread changed it between
//!   our load and our CAS) switches the counter to its stripes for good:
//!   a table of cache-padded cells, created once by whichever thread gets
//!   there first.
//! - **Striped**, a thread adds to the cell its *probe* selects; a failed
//!   CAS there means another thread shares the cell, so the thread rehashes
//!   its probe (xorshift) and tries another cell. Threads thus spread over
//!   the cells by themselves, with no notion of CPUs.
//!
//! `LongAdder` grows its table by doubling, from 2 cells up to the CPU count,
//! under a spin lock; this version allocates the final size (the CPU count
//! rounded up to a power of two) at the first contention. That skips the
//! growth phase, which only matters for the first few contended adds.
//!
//! `sum()` is `base + Σ cells`, relaxed loads: exact once no add is in
//! flight, and with no bound on how far it is off while adds are — exactly
//! like `LongAdder.sum()`.

use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::OnceLock;

/// A LongAdder-style counter: `base`, then cache-padded cells under
/// contention. See the module docs.
#[derive(Debug)]
pub struct Striped {
    base: CachePadded<AtomicI64>,
    cells: OnceLock<Box<[CachePadded<AtomicI64>]>>,
    stripes: usize,
}

/// Seeds of the threads' probes: consecutive threads get well-spread
/// starting cells, like `ThreadLocalRandom`'s probe.
static NEXT_PROBE: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's probe; 0 until first used (xorshift never yields 0).
    static PROBE: Cell<u32> = const { Cell::new(0) };
}

fn probe() -> u32 {
    PROBE.with(|p| {
        if p.get() == 0 {
            // Relaxed: a seed, nothing is published with it.
            let seed = NEXT_PROBE.fetch_add(1, Ordering::Relaxed);
            p.set(seed.wrapping_mul(0x9E37_79B9) | 1);
        }
        p.get()
    })
}

/// Marsaglia xorshift, as `Striped64.advanceProbe`.
fn advance(mut h: u32) -> u32 {
    h ^= h << 13;
    h ^= h >> 17;
    h ^= h << 5;
    h
}

impl Striped {
    /// A counter whose table, once contended, has one cell per CPU (the
    /// host's available parallelism rounded up to a power of two).
    pub fn new() -> Striped {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Striped::with_stripes(cpus)
    }

    /// A counter with `stripes` cells under contention (rounded up to a
    /// power of two, at least 1).
    pub fn with_stripes(stripes: usize) -> Striped {
        Striped {
            base: CachePadded::new(AtomicI64::new(0)),
            cells: OnceLock::new(),
            stripes: stripes.max(1).next_power_of_two(),
        }
    }

    /// Add `delta`. Values wrap on overflow, like the atomics they live in.
    #[inline]
    pub fn add(&self, delta: i64) {
        if let Some(cells) = self.cells.get() {
            self.add_striped(cells, delta);
            return;
        }
        // Relaxed everywhere: the cells are pure counters; nothing else is
        // published through them.
        let cur = self.base.load(Ordering::Relaxed);
        if self
            .base
            .compare_exchange(
                cur,
                cur.wrapping_add(delta),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            return;
        }
        // Another thread wrote `base` between our load and our CAS: contended.
        let cells = self.cells.get_or_init(|| {
            (0..self.stripes)
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect()
        });
        self.add_striped(cells, delta);
    }

    fn add_striped(&self, cells: &[CachePadded<AtomicI64>], delta: i64) {
        let mask = cells.len() - 1;
        let mut h = probe();
        let mut moved = false;
        loop {
            let cell = &cells[h as usize & mask];
            let cur = cell.load(Ordering::Relaxed);
            // Weak: a spurious failure only moves us to another cell.
            if cell
                .compare_exchange_weak(
                    cur,
                    cur.wrapping_add(delta),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                if moved {
                    PROBE.with(|p| p.set(h));
                }
                return;
            }
            h = advance(h);
            moved = true;
        }
    }

    /// `base + Σ cells`: exact when no add is in flight, unbounded error
    /// while adds race with it.
    pub fn sum(&self) -> i64 {
        let cells = self.cells.get().map_or(0i64, |cells| {
            cells
                .iter()
                .fold(0i64, |s, c| s.wrapping_add(c.load(Ordering::Relaxed)))
        });
        self.base.load(Ordering::Relaxed).wrapping_add(cells)
    }

    /// Whether contention has switched the counter to its cells.
    pub fn is_striped(&self) -> bool {
        self.cells.get().is_some()
    }
}

impl Default for Striped {
    fn default() -> Striped {
        Striped::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_thread_stays_on_the_base() {
        let c = Striped::with_stripes(4);
        for _ in 0..1000 {
            c.add(3);
        }
        c.add(-1000);
        assert_eq!(c.sum(), 2000);
        assert!(!c.is_striped());
    }

    #[test]
    fn racing_threads_lose_no_update() {
        let c = Striped::with_stripes(3);
        std::thread::scope(|s| {
            for t in 0..8 {
                let c = &c;
                s.spawn(move || {
                    for i in 0..100_000i64 {
                        c.add(if (i + t) % 3 == 0 { -1 } else { 2 });
                    }
                });
            }
        });
        let per_thread: i64 = (0..8i64)
            .map(|t| {
                (0..100_000i64)
                    .map(|i| if (i + t) % 3 == 0 { -1 } else { 2 })
                    .sum::<i64>()
            })
            .sum();
        assert_eq!(c.sum(), per_thread);
    }

    #[test]
    fn stripes_round_up_to_a_power_of_two() {
        assert_eq!(Striped::with_stripes(0).stripes, 1);
        assert_eq!(Striped::with_stripes(3).stripes, 4);
        assert_eq!(Striped::with_stripes(8).stripes, 8);
    }
}
