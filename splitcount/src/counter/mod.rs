//! Layer 3: *split counters behind one trait.*
//!
//! A split counter spreads its value over per-CPU (or per-node) parts so that
//! adds touch memory no other CPU writes, and keeps a cheap *approximate*
//! value whose distance from the *precise* one is bounded by a known,
//! design-specific [`Accuracy`]. Limit decisions use [`SplitCounter::compare`],
//! which is exact yet sums all CPUs only when the cheap value cannot decide.
//!
//! | design | add touches | `approximate()` | accuracy (under, over) |
//! |---|---|---|---|
//! | [`Atomic`] | one shared atomic | exact | (0, 0) |
//! | [`Batched`] (kernel `percpu_counter`) | this CPU's slot; the total every `batch` | the total | `(ncpu·(b−1), ncpu·(b−1))` |
//! | [`PerNode`] | this node's atomic; the global every `batch` | the global | `(m·(b−1), m·(b−1))`, m = node slots |
//! | [`Tree`] (the default) | this CPU's slot; one item per crossed level batch | the root | `(ncpu·(b−1) + Σ nₗ·(Bₗ−Bₗ₋₁), 0)` |
//!
//! **Direction.** For a *settled* counter (no add in flight),
//! `precise − under ≤ approximate ≤ precise + over`: `under` is how far the
//! cheap value may lag below the truth, `over` how far it may run above it.
//! The derivations are in `IMPLEMENTATION.md`; every bound is tight (the
//! design's [`Config::worst_case_schedule`] reaches it exactly).
//!
//! **Arithmetic.** Values are `i64` and wrap on overflow, like the kernel's
//! `s64` counters and Rust's atomics: checking every add for overflow would
//! double the hot path, and a counter of bytes or events does not get near
//! 2⁶³. Comparisons agree with the wrapped value: `compare(v)` is always
//! `precise().cmp(&v)` for a settled counter. They are done in `i128`, and
//! when the accuracy band around `approximate()` reaches past either end of
//! the `i64` range — where the precise value may have wrapped —
//! [`SplitCounter::compare`] sums precisely and
//! [`SplitCounter::approximate_compare`] answers `Unknown`.
//!
//! ```
//! use splitcount::counter::{SplitCounter, Tree};
//! use std::cmp::Ordering;
//!
//! let used = Tree::new();
//! used.add(4096);
//! used.add(-1024);
//! assert_eq!(used.precise(), 3072);
//! // Exact decision; sums the CPUs only if 3072 vs 10_000 is inside the band.
//! assert_eq!(used.compare(10_000), Ordering::Less);
//! let (under, over) = used.accuracy().bounds();
//! assert!(used.approximate() >= used.precise() - under as i64);
//! assert!(used.approximate() <= used.precise() + over as i64);
//! ```

mod atomic;
mod batched;
mod budget;
mod config;
mod pernode;
mod total;
mod tree;
mod tree_shape;

pub use atomic::Atomic;
pub use batched::Batched;
pub use budget::Shape;
pub use config::{Arity, Config, ConfigError, Design, Sharing, MAX_BATCH};
pub use pernode::{PerNode, MAX_NODE_SLOTS};
pub use tree::{InlineAdd, Tree, MAX_ROOT_PARTS};
pub use tree_shape::{fanout_orders_for, TreeShape};

use std::cmp::Ordering;
use std::fmt;

/// The memory one counter uses, in bytes ([`SplitCounter::footprint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Footprint {
    /// In the per-CPU arena: its slots, one copy per CPU plus the arena's
    /// overflow copy.
    pub per_cpu: usize,
    /// Its shared items in the arena (a tree's intermediate items, root
    /// accumulators and bias: 8 bytes each, in the region of the CPUs
    /// that write it).
    pub shared: usize,
    /// Its own heap and inline size (the handle, tables of pointers).
    pub heap: usize,
}

impl Footprint {
    /// Everything.
    pub fn total(&self) -> usize {
        self.per_cpu + self.shared + self.heap
    }

    /// Everything, per CPU of a machine of `cpus` CPUs.
    pub fn per_cpu_bytes(&self, cpus: usize) -> f64 {
        self.total() as f64 / cpus.max(1) as f64
    }
}

/// How far a settled counter's `approximate()` may be from `precise()`:
/// `precise − under ≤ approximate ≤ precise + over`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Accuracy {
    /// How far `approximate()` may lag *below* `precise()`.
    pub under: u64,
    /// How far `approximate()` may run *above* `precise()`.
    pub over: u64,
}

impl Accuracy {
    /// `(under, over)`.
    pub fn bounds(self) -> (u64, u64) {
        (self.under, self.over)
    }

    /// Whether `approximate` is within this accuracy of `precise`.
    pub fn admits(self, approximate: i64, precise: i64) -> bool {
        let (a, p) = (approximate as i128, precise as i128);
        p - self.under as i128 <= a && a <= p + self.over as i128
    }

    /// The range `[lo, hi]` in which `precise` must lie, given `approximate`.
    pub fn precise_range(self, approximate: i64) -> (i128, i128) {
        let a = approximate as i128;
        (a - self.over as i128, a + self.under as i128)
    }
}

/// The answer of [`SplitCounter::approximate_compare`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ApproxOrdering {
    /// The precise value is certainly below the argument.
    Less,
    /// The precise value certainly equals the argument (only an exact
    /// design can say this cheaply).
    Equal,
    /// The precise value is certainly above the argument.
    Greater,
    /// The argument lies inside the accuracy band: only a precise sum can
    /// tell.
    Unknown,
}

/// Which side of its accuracy band a worst-case schedule drives a counter to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Side {
    /// `approximate()` as far *below* `precise()` as the design allows.
    Under,
    /// `approximate()` as far *above* `precise()` as the design allows.
    Over,
}

/// A counter update made "on" a given (simulated) CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Step {
    /// Dense CPU index.
    pub cpu: usize,
    /// The amount added.
    pub delta: i64,
}

/// An operation refused by a counter.
///
/// ```
/// use splitcount::counter::{Config, CounterError, Design};
/// use splitcount::cpu::Machine;
///
/// let c = Config::new(Design::Tree).machine(&Machine::simulated(4, 1).unwrap()).build().unwrap();
/// assert_eq!(c.add_on(4, 1), Err(CounterError::NoSuchCpu { cpu: 4, cpus: 4 }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CounterError {
    /// `add_on` named a CPU the counter's machine does not have.
    NoSuchCpu {
        /// The CPU given.
        cpu: usize,
        /// The machine's CPU count.
        cpus: usize,
    },
}

impl fmt::Display for CounterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CounterError::NoSuchCpu { cpu, cpus } => {
                write!(f, "CPU {cpu} does not exist on a machine of {cpus} CPUs")
            }
        }
    }
}

impl std::error::Error for CounterError {}

/// The operations every split-counter design supports. See the module docs
/// for the designs and their bounds.
///
/// ```
/// use splitcount::counter::{Config, Design, SplitCounter};
///
/// // Every design behind one trait: pick one by name, use it the same way.
/// for design in Design::ALL {
///     let c: Box<dyn SplitCounter> = Config::new(design).build().unwrap();
///     c.add(5);
///     assert_eq!(c.precise(), 5);
///     assert!(c.accuracy().admits(c.approximate(), 5));
/// }
/// ```
pub trait SplitCounter: Send + Sync + fmt::Debug {
    /// Which design this is.
    fn design(&self) -> Design;

    /// Add `delta` (either sign) on the current CPU. The hot path.
    fn add(&self, delta: i64);

    /// Add `delta` as if on CPU `cpu` (a dense index of the counter's
    /// machine). Simulations and tests drive counters this way.
    fn add_on(&self, cpu: usize, delta: i64) -> Result<(), CounterError>;

    /// The cheap value: O(1), within [`SplitCounter::accuracy`] of
    /// [`SplitCounter::precise`] when settled.
    fn approximate(&self) -> i64;

    /// The exact value: sums every CPU's part (O(CPUs)). Every add that
    /// returned before the call is counted exactly once; adds in flight are
    /// counted once or not yet. (For the designs that move whole parts into
    /// a shared total, this waits out the moves in flight.)
    fn precise(&self) -> i64;

    /// The design's accuracy bound for this counter's machine and batch.
    fn accuracy(&self) -> Accuracy;

    /// Reset the value to `v` by adjusting a bias (`bias += v − precise()`)
    /// — never by zeroing parts, which would lose adds racing with the reset.
    ///
    /// What it guarantees: adds that returned before `set` was called are
    /// replaced by `v`; adds that start after it returns count on top of
    /// `v`; an add concurrent with it is either replaced (if `set`'s precise
    /// sum counted it) or counted on top of `v` — never lost and never
    /// counted twice. `set` is not atomic: concurrent calls of `set` itself
    /// are not serialized (each adjusts by what it read), so reset from one
    /// thread at a time.
    fn set(&self, v: i64);

    /// Exact three-way comparison of the precise value with `v` for a
    /// settled counter: decided from `approximate()` when `v` lies outside
    /// the accuracy band, from a precise sum only inside it. With adds in
    /// flight the band is the settled one: a thread preempted inside its
    /// carry to the upper levels ([`Tree`]) holds units that
    /// `approximate()` does not show yet and `precise()` does, so an answer
    /// taken from the band may miss adds that returned on other threads
    /// (a helper saw `Less` with 4 threads on 2 CPUs, up to 42 units past
    /// the band). Decide with `precise()` where such races matter.
    fn compare(&self, v: i64) -> Ordering {
        compare_in_band(self.approximate(), self.accuracy(), v, || self.precise())
    }

    /// Compare with `v` from `approximate()` alone.
    fn approximate_compare(&self, v: i64) -> ApproxOrdering {
        approximate_compare_in_band(self.approximate(), self.accuracy(), v)
    }

    /// The bytes this counter takes: its per-CPU slots, its shared items in
    /// the arena, and its handle and heap (see [`Footprint`]). Computed from
    /// the layout; the lab's `footprint` command prints it for every design.
    fn footprint(&self) -> Footprint;
}

/// The worst case of the designs that spill a whole part once `|part| ≥
/// batch` (`Batched`, `PerNode`): `batch − 1` of the side's sign on one CPU
/// of every part — nothing spills, and every part holds its maximum.
pub(crate) fn spill_worst_case(
    cpus: impl Iterator<Item = usize>,
    batch: i64,
    side: Side,
) -> Vec<Step> {
    let delta = match side {
        Side::Under => batch - 1,
        Side::Over => 1 - batch,
    };
    if delta == 0 {
        return Vec::new();
    }
    cpus.map(|cpu| Step { cpu, delta }).collect()
}

/// Whether a band `[lo, hi]` for the precise value reaches past the `i64`
/// range: the precise value may then have wrapped, and only it can decide.
#[inline]
pub(crate) fn wraps(lo: i128, hi: i128) -> bool {
    lo < i64::MIN as i128 || hi > i64::MAX as i128
}

/// Decide `precise ⋚ v` knowing `precise ∈ [approximate − over,
/// approximate + under]`; call `precise` only when that cannot decide.
pub(crate) fn compare_in_band(
    approximate: i64,
    accuracy: Accuracy,
    v: i64,
    precise: impl FnOnce() -> i64,
) -> Ordering {
    match approximate_compare_in_band(approximate, accuracy, v) {
        ApproxOrdering::Less => Ordering::Less,
        ApproxOrdering::Greater => Ordering::Greater,
        ApproxOrdering::Equal => Ordering::Equal,
        ApproxOrdering::Unknown => precise().cmp(&v),
    }
}

pub(crate) fn approximate_compare_in_band(
    approximate: i64,
    accuracy: Accuracy,
    v: i64,
) -> ApproxOrdering {
    let (lo, hi) = accuracy.precise_range(approximate);
    if wraps(lo, hi) {
        return ApproxOrdering::Unknown;
    }
    let v = v as i128;
    if hi < v {
        ApproxOrdering::Less
    } else if lo > v {
        ApproxOrdering::Greater
    } else if lo == hi {
        ApproxOrdering::Equal
    } else {
        ApproxOrdering::Unknown
    }
}
