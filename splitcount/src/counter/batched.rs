//! [`Batched`]: the Linux kernel's `percpu_counter` (lib/percpu_counter.c).
//!
//! Each CPU has a slot in the per-CPU arena; a shared `total` holds what the
//! slots moved up. An add goes to this CPU's slot; when the slot's new value
//! reaches `|v| ≥ batch`, the *whole* slot is taken (left at 0) and added to
//! the total. With rseq adds, the add and the take are one critical section
//! whose single commit stores either the new value or 0; on the atomic path
//! they are a `fetch_add` and, on spill, a swap with 0.
//!
//! **Bound.** When settled, every slot satisfies `|slot| ≤ batch − 1`: the
//! last update of a slot either left 0 (a take) or a value below `batch` in
//! magnitude (an add reaching `batch` is followed by its take — in the same
//! critical section with rseq). `approximate = total` and `precise = total + Σ slots`,
//! so `|precise − approximate| ≤ ncpu·(batch − 1)` on each side. With the
//! default `batch = max(32, 2·ncpu)` that is about `2·ncpu²`: 1.15 GiB of
//! 4 KiB pages at 384 CPUs.
//!
//! **Races.** Between the take and the total's add the moved amount is in
//! neither place. Spills are announced to readers before the take, and
//! `precise()` waits until none is in flight, so it counts every add that
//! returned before it was called exactly once (see `total.rs`); adds in
//! flight are counted once or not yet. Nothing is lost once an add returns.

use super::total::Total;
use super::{
    Accuracy, Config, ConfigError, CounterError, Design, Footprint, Side, SplitCounter, Step,
};
use crate::percpu::PerCpu;
use crossbeam_utils::CachePadded;
use std::cmp::Ordering;

/// The kernel's `percpu_counter`. See the module docs.
///
/// ```
/// use splitcount::counter::{Batched, Config, Design, SplitCounter};
/// use splitcount::cpu::Machine;
///
/// let m = Machine::simulated(4, 1).unwrap();
/// let c = Batched::with_config(&Config::new(Design::Batched).machine(&m).batch(8)).unwrap();
/// c.add_on(0, 7).unwrap();          // stays in CPU 0's slot
/// assert_eq!((c.approximate(), c.precise()), (0, 7));
/// c.add_on(0, 1).unwrap();          // |8| ≥ batch: the whole slot moves
/// assert_eq!((c.approximate(), c.precise()), (8, 8));
/// ```
pub struct Batched {
    slots: PerCpu,
    total: CachePadded<Total>,
    batch: i64,
}

impl Batched {
    /// A zero counter on the host with the default batch.
    pub fn new() -> Batched {
        Batched::with_config(&Config::new(Design::Batched))
            .expect("the host defaults are valid unless memory is exhausted")
    }

    /// A zero counter as `config` says (an error budget is resolved first:
    /// see [`Config::max_error`]).
    pub fn with_config(config: &Config) -> Result<Batched, ConfigError> {
        let config = &*config.resolved()?;
        let batch = config.validated_batch()? as i64;
        Ok(Batched {
            slots: config.arena_for()?.alloc(1)?,
            total: CachePadded::new(Total::default()),
            batch,
        })
    }

    /// The batch.
    pub fn batch(&self) -> u64 {
        self.batch as u64
    }
}

impl Default for Batched {
    fn default() -> Self {
        Batched::new()
    }
}

impl std::fmt::Debug for Batched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batched")
            .field("cpus", &self.slots.cpus())
            .field("batch", &self.batch)
            .field("approximate", &self.approximate())
            .finish()
    }
}

impl SplitCounter for Batched {
    /// A slot per CPU (and the arena's overflow copy); the total, on its
    /// own line, in the handle.
    fn footprint(&self) -> Footprint {
        Footprint {
            per_cpu: std::mem::size_of::<i64>() * (self.slots.cpus() + 1),
            shared: 0,
            heap: std::mem::size_of::<Batched>(),
        }
    }

    fn design(&self) -> Design {
        Design::Batched
    }

    /// One rseq critical section (or a `fetch_add`, and a swap on spill) on
    /// this CPU's slot; a spill is announced to `precise()` readers first. A
    /// thread that cannot update its CPU's slot adds to the total directly:
    /// exact, and the bound is unchanged.
    #[inline]
    fn add(&self, delta: i64) {
        // SAFETY: slot 0 of a one-slot allocation.
        unsafe {
            self.slots
                .add_spill_current(0, delta, self.batch as u64, &*self.total)
        }
    }

    /// On a simulated machine, CPU `cpu`'s slot; on the host with rseq
    /// adds, where another CPU's slot may only be written by critical
    /// sections running there, the total.
    fn add_on(&self, cpu: usize, delta: i64) -> Result<(), CounterError> {
        let cpus = self.slots.cpus();
        if cpu >= cpus {
            return Err(CounterError::NoSuchCpu { cpu, cpus });
        }
        if self.slots.remote_writes_allowed() {
            // SAFETY: `cpu < cpus` checked above; slot 0 of a one-slot
            // allocation.
            unsafe {
                self.slots
                    .atomic_add_spill(cpu, 0, delta, self.batch as u64, &*self.total)
            }
        } else {
            self.total.add(delta);
        }
        Ok(())
    }

    fn approximate(&self) -> i64 {
        self.total.get()
    }

    /// The total and every slot, read with no spill in flight: every add
    /// that returned before the call is counted once.
    fn precise(&self) -> i64 {
        // SAFETY: slot 0 of a one-slot allocation.
        self.total
            .consistent_sum(|| unsafe { self.slots.sum_acquire(0) })
    }

    /// `ncpu·(batch − 1)` on each side.
    fn accuracy(&self) -> Accuracy {
        let b = self.slots.cpus() as u64 * (self.batch as u64 - 1);
        Accuracy { under: b, over: b }
    }

    fn set(&self, v: i64) {
        self.total.add(v.wrapping_sub(self.precise()));
    }

    /// Like the kernel's `__percpu_counter_compare`: decide from the total
    /// when `v` is more than `batch·ncpu` away, else sum.
    fn compare(&self, v: i64) -> Ordering {
        let band = self.batch as i128 * self.slots.cpus() as i128;
        let a = self.approximate() as i128;
        let v128 = v as i128;
        if super::wraps(a - band, a + band) {
            self.precise().cmp(&v)
        } else if a - v128 > band {
            Ordering::Greater
        } else if v128 - a > band {
            Ordering::Less
        } else {
            self.precise().cmp(&v)
        }
    }
}

/// The test and lab tool [`Config::worst_case_schedule`] builds on.
impl Batched {
    /// `batch − 1` (of the side's sign) on every CPU: no slot spills, and
    /// the total stays 0.
    pub(crate) fn worst_case_schedule(&self, side: Side) -> Vec<Step> {
        super::spill_worst_case(0..self.slots.cpus(), self.batch, side)
    }
}
