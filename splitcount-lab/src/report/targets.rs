//! The project's performance targets, in one table ([`TARGETS`]), and the
//! report's verdicts against them.
//!
//! Each target names a figure computed from a suite's interleaved rounds
//! (a ratio between two cases in the same round, a speed-up, or a scaling
//! from one thread to more) and a bound. Its verdict is the figure's
//! median, its range over the rounds, and one of:
//!
//! - `met` / `not met`: the median against the bound, for a stable figure;
//! - `unstable`: the two halves of the rounds disagree by more than 10%,
//!   or too few rounds had the threads running together — do not trust
//!   the median either way;
//! - `not measured`: the machine cannot run one of the cases (no rseq).
//!
//! The README shows the same table: [`readme_table`] generates it, and a
//! test checks the README holds exactly that.

use crate::bench::{charge, counters, fault, groups, noisy, percpu, requests, stats};
use crate::footprint;
use crate::timing::{Figure, Measured};
use serde::Serialize;

/// Which figure a target is about.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Measure {
    /// Time per operation of `case` ÷ `baseline`'s, both at `threads`,
    /// round by round.
    Cost {
        /// The case measured.
        case: &'static str,
        /// What it is divided by.
        baseline: &'static str,
        /// Threads running each.
        threads: usize,
    },
    /// How many times the per-thread throughput of `baseline` `case` has at
    /// `threads`: the inverse of [`Measure::Cost`].
    Speedup {
        /// The case measured.
        case: &'static str,
        /// What it is compared with.
        baseline: &'static str,
        /// Threads running each.
        threads: usize,
    },
    /// Operations per second (wall time) of `case` ÷ `baseline`'s, both at
    /// `threads`, round by round: what a thread got done, time it lost to
    /// interruptions included.
    Rate {
        /// The case (or role) measured.
        case: &'static str,
        /// What it is compared with.
        baseline: &'static str,
        /// Threads running each.
        threads: usize,
    },
    /// Throughput of `case` at `threads` ÷ its throughput at one thread.
    Scaling {
        /// The case measured.
        case: &'static str,
        /// Threads of the scaled run.
        threads: usize,
    },
    /// Time per operation of `case` at `threads`, in ns, round by round: a
    /// budget per operation (the exception to ratios).
    Time {
        /// The case measured.
        case: &'static str,
        /// Threads running it.
        threads: usize,
    },
    /// A figure the suite measures once (see `Measured::scalars`), in the
    /// unit its name ends with.
    Scalar {
        /// Its name.
        name: &'static str,
        /// Threads of the run.
        threads: usize,
        /// What it counts, after the number (`B per group`).
        unit: &'static str,
    },
}

/// The bound a figure must meet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// The figure must not exceed this.
    AtMost(f64),
    /// The figure must reach this.
    AtLeast(f64),
}

impl Bound {
    /// Whether `value` meets the bound.
    pub fn holds(self, value: f64) -> bool {
        match self {
            Bound::AtMost(b) => value <= b,
            Bound::AtLeast(b) => value >= b,
        }
    }

    fn value(self) -> f64 {
        match self {
            Bound::AtMost(b) | Bound::AtLeast(b) => b,
        }
    }

    fn sign(self) -> &'static str {
        match self {
            Bound::AtMost(_) => "≤",
            Bound::AtLeast(_) => "≥",
        }
    }
}

/// One target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// A short name, unique (`verdicts[].name` in `report.json`).
    pub name: &'static str,
    /// The suite whose rounds hold the figure.
    pub suite: &'static str,
    /// The figure.
    pub measure: Measure,
    /// What it must meet.
    pub bound: Bound,
    /// The bound instead when the two CPUs the threads ran on are
    /// hyperthread siblings of one core (they share its execution units,
    /// so two threads cannot double the throughput).
    pub on_siblings: Option<Bound>,
}

const fn cost(
    name: &'static str,
    suite: &'static str,
    case: &'static str,
    baseline: &'static str,
    threads: usize,
    at_most: f64,
) -> Target {
    Target {
        name,
        suite,
        measure: Measure::Cost {
            case,
            baseline,
            threads,
        },
        bound: Bound::AtMost(at_most),
        on_siblings: None,
    }
}

/// A `fault` case's faults per second at `threads` ≥ 0.97× no
/// accounting's: a real fault costs microseconds, so accounting should
/// vanish in it (the seed's stock read 0.85×).
const fn faults(name: &'static str, case: &'static str, threads: usize) -> Target {
    Target {
        name,
        suite: fault::SUITE,
        measure: Measure::Speedup {
            case,
            baseline: fault::BASELINE,
            threads,
        },
        bound: Bound::AtLeast(0.97),
        on_siblings: None,
    }
}

/// Every target, in the order the verdicts are shown.
pub const TARGETS: &[Target] = &[
    cost(
        "charge: stock, 1 thread",
        "charge",
        "stock",
        charge::BASELINE,
        1,
        1.05,
    ),
    cost(
        "charge: stock, 2 threads",
        "charge",
        "stock",
        charge::BASELINE,
        2,
        1.05,
    ),
    cost(
        "charge: stock vs the bare rseq floor, 1 thread",
        "charge",
        "stock",
        charge::BARE_RSEQ,
        1,
        1.05,
    ),
    cost(
        "charge: stock vs the bare rseq floor, 2 threads",
        "charge",
        "stock",
        charge::BARE_RSEQ,
        2,
        1.05,
    ),
    cost(
        "charge: 32 tenants vs one tenant's stock, 1 thread",
        "charge",
        "32-tenants",
        "stock",
        1,
        1.10,
    ),
    cost(
        "charge: 32 tenants vs one tenant's stock, 2 threads",
        "charge",
        "32-tenants",
        "stock",
        2,
        1.10,
    ),
    cost(
        "charge: 8 tenants vs one tenant's stock, 1 thread",
        "charge",
        "8-tenants",
        "stock",
        1,
        1.10,
    ),
    cost(
        "charge: 8 tenants vs one tenant's stock, 2 threads",
        "charge",
        "8-tenants",
        "stock",
        2,
        1.10,
    ),
    cost(
        "charge: 8 tenants over 7 slots vs one tenant's stock, 1 thread",
        "charge",
        "8-tenants-7-slots",
        "stock",
        1,
        1.10,
    ),
    cost(
        "charge: 8 tenants over 7 slots vs one tenant's stock, 2 threads",
        "charge",
        "8-tenants-7-slots",
        "stock",
        2,
        1.10,
    ),
    faults("fault: stock, 1 thread", "stock", 1),
    faults("fault: stock, 2 threads", "stock", 2),
    faults("fault: 32 tenants, 1 thread", "32-tenants", 1),
    faults("fault: 32 tenants, 2 threads", "32-tenants", 2),
    cost(
        "allocator: 16–512 B, 1 thread",
        "alloc",
        "mixed-accounted",
        "mixed-system",
        1,
        1.10,
    ),
    cost(
        "allocator: 16–512 B, 2 threads",
        "alloc",
        "mixed-accounted",
        "mixed-system",
        2,
        1.10,
    ),
    cost(
        "allocator: 17–24 B, 1 thread",
        "alloc",
        "small-accounted",
        "small-system",
        1,
        1.10,
    ),
    cost(
        "allocator: cross-thread frees",
        "alloc",
        "cross-thread-accounted",
        "cross-thread-system",
        2,
        1.10,
    ),
    cost(
        "allocator: serde_json round trip",
        "alloc",
        "json-accounted",
        "json-system",
        1,
        1.10,
    ),
    cost(
        "allocator: BTreeMap build",
        "alloc",
        "btree-accounted",
        "btree-system",
        1,
        1.10,
    ),
    cost(
        "allocator over jemalloc: 16–512 B, 1 thread",
        "alloc",
        "mixed-jemalloc-accounted",
        "mixed-jemalloc",
        1,
        1.25,
    ),
    cost(
        "allocator over jemalloc: 16–512 B, 2 threads",
        "alloc",
        "mixed-jemalloc-accounted",
        "mixed-jemalloc",
        2,
        1.25,
    ),
    cost(
        "allocator over jemalloc: 17–24 B, 1 thread",
        "alloc",
        "small-jemalloc-accounted",
        "small-jemalloc",
        1,
        1.25,
    ),
    cost(
        "allocator over jemalloc: cross-thread frees",
        "alloc",
        "cross-thread-jemalloc-accounted",
        "cross-thread-jemalloc",
        2,
        1.30,
    ),
    cost(
        "allocator over jemalloc: serde_json round trip",
        "alloc",
        "json-jemalloc-accounted",
        "json-jemalloc",
        1,
        1.25,
    ),
    cost(
        "allocator over jemalloc: BTreeMap build",
        "alloc",
        "btree-jemalloc-accounted",
        "btree-jemalloc",
        1,
        1.25,
    ),
    cost(
        "allocator over mimalloc: 16–512 B, 1 thread",
        "alloc",
        "mixed-mimalloc-accounted",
        "mixed-mimalloc",
        1,
        1.25,
    ),
    cost(
        "allocator over mimalloc: 16–512 B, 2 threads",
        "alloc",
        "mixed-mimalloc-accounted",
        "mixed-mimalloc",
        2,
        1.25,
    ),
    cost(
        "allocator over mimalloc: 17–24 B, 1 thread",
        "alloc",
        "small-mimalloc-accounted",
        "small-mimalloc",
        1,
        1.25,
    ),
    cost(
        "allocator over mimalloc: cross-thread frees",
        "alloc",
        "cross-thread-mimalloc-accounted",
        "cross-thread-mimalloc",
        2,
        1.30,
    ),
    cost(
        "allocator over mimalloc: serde_json round trip",
        "alloc",
        "json-mimalloc-accounted",
        "json-mimalloc",
        1,
        1.25,
    ),
    cost(
        "allocator over mimalloc: BTreeMap build",
        "alloc",
        "btree-mimalloc-accounted",
        "btree-mimalloc",
        1,
        1.25,
    ),
    Target {
        name: "allocator: resident memory per block, 8–128 B, mean",
        suite: "alloc",
        measure: Measure::Scalar {
            name: crate::bench::alloc::RSS_ACCOUNTED_MEAN,
            threads: 1,
            unit: "% over glibc alone (accounted)",
        },
        bound: Bound::AtMost(10.0),
        on_siblings: None,
    },
    Target {
        name: "allocator: resident memory per over-aligned block, worst",
        suite: "alloc",
        measure: Measure::Scalar {
            name: crate::bench::alloc::RSS_ACCOUNTED_ALIGNED_WORST,
            threads: 1,
            unit: "% over glibc alone (accounted)",
        },
        bound: Bound::AtMost(10.0),
        on_siblings: None,
    },
    Target {
        name: "allocator over jemalloc: resident memory per block, worst size",
        suite: "alloc",
        measure: Measure::Scalar {
            name: crate::bench::alloc::RSS_JEMALLOC_HEAPS_WORST,
            threads: 1,
            unit: "% over jemalloc alone (a heap per group)",
        },
        bound: Bound::AtMost(5.0),
        on_siblings: None,
    },
    Target {
        name: "allocator over mimalloc: resident memory per block, worst size",
        suite: "alloc",
        measure: Measure::Scalar {
            name: crate::bench::alloc::RSS_MIMALLOC_HEAPS_WORST,
            threads: 1,
            unit: "% over mimalloc alone (a heap per group)",
        },
        bound: Bound::AtMost(5.0),
        on_siblings: None,
    },
    cost(
        "C ABI: counter add, inline",
        "ffi",
        "counter-add-c-inline",
        "counter-add-rust",
        1,
        1.20,
    ),
    cost(
        "C ABI: charge+uncharge 100 B",
        "ffi",
        "charge-100-c",
        "charge-100-rust",
        1,
        1.30,
    ),
    cost(
        "C ABI: charge+uncharge 1000 B",
        "ffi",
        "charge-1000-c",
        "charge-1000-rust",
        1,
        1.30,
    ),
    cost(
        "C ABI: charge+uncharge 4096 B",
        "ffi",
        "charge-4096-c",
        "charge-4096-rust",
        1,
        1.30,
    ),
    cost(
        "preload over glibc: malloc+free, mixed",
        "preload",
        "mixed-preload",
        "mixed-glibc",
        1,
        1.25,
    ),
    cost(
        "preload without tags over glibc: malloc+free, mixed",
        "preload",
        "mixed-preload-untagged",
        "mixed-glibc",
        1,
        1.25,
    ),
    cost(
        "preload over jemalloc: malloc+free, mixed",
        "preload",
        "mixed-preload-jemalloc",
        "mixed-jemalloc",
        1,
        1.25,
    ),
    cost(
        "preload over mimalloc: malloc+free, mixed",
        "preload",
        "mixed-preload-mimalloc",
        "mixed-mimalloc",
        1,
        1.25,
    ),
    cost(
        "preload: redis-benchmark time per request",
        "preload",
        "redis-preload",
        "redis-glibc",
        1,
        1.053,
    ),
    cost(
        "async: instrument, 1 worker",
        "async",
        "instrumented",
        requests::BASELINE,
        1,
        1.05,
    ),
    cost(
        "async: instrument, 2 workers",
        "async",
        "instrumented",
        requests::BASELINE,
        2,
        1.05,
    ),
    Target {
        name: "Tree: 2-thread scaling",
        suite: "counters",
        measure: Measure::Scaling {
            case: "tree",
            threads: 2,
        },
        bound: Bound::AtLeast(1.9),
        on_siblings: None,
    },
    Target {
        name: "Tree vs a shared atomic, 2 threads",
        suite: "counters",
        measure: Measure::Speedup {
            case: "tree",
            baseline: counters::BASELINE,
            threads: 2,
        },
        bound: Bound::AtLeast(10.0),
        on_siblings: Some(Bound::AtLeast(4.0)),
    },
    cost(
        "Tree add vs bare rseq add",
        "counters",
        "tree",
        counters::BARE_RSEQ,
        1,
        1.1,
    ),
    cost(
        "PerCpu::add vs bare rseq add",
        "percpu",
        percpu::RSEQ_ADD,
        counters::BARE_RSEQ,
        1,
        1.2,
    ),
    cost(
        "stats: flush vs full walk",
        "stats",
        "flush-updated",
        stats::BASELINE,
        1,
        1.0 / 80.0,
    ),
    cost(
        "noisy: allocation in a breached cooperative group",
        "noisy",
        "breached-cooperative",
        noisy::UNDER_LIMIT,
        1,
        3.0,
    ),
    cost(
        "noisy: allocation in a breached refusing group",
        "noisy",
        "breached-refuse",
        noisy::UNDER_LIMIT,
        1,
        3.0,
    ),
    Target {
        name: "noisy: healthy group beside a breached cooperative one",
        suite: "noisy",
        measure: Measure::Rate {
            case: "beside-cooperative-healthy",
            baseline: "beside-unlimited-healthy",
            threads: 2,
        },
        bound: Bound::AtLeast(0.95),
        on_siblings: None,
    },
    Target {
        name: "noisy: healthy group beside a breached refusing one",
        suite: "noisy",
        measure: Measure::Rate {
            case: "beside-refuse-healthy",
            baseline: "beside-unlimited-healthy",
            threads: 2,
        },
        bound: Bound::AtLeast(0.95),
        on_siblings: None,
    },
    Target {
        name: "groups: per-request cycle, 1 thread",
        suite: "groups",
        measure: Measure::Time {
            case: groups::CYCLE,
            threads: 1,
        },
        bound: Bound::AtMost(2000.0),
        on_siblings: None,
    },
    Target {
        name: "groups: per-request cycle, 2 threads",
        suite: "groups",
        measure: Measure::Time {
            case: groups::CYCLE,
            threads: 2,
        },
        bound: Bound::AtMost(2000.0),
        on_siblings: None,
    },
    Target {
        name: "footprint: tree at 64 CPUs",
        suite: "footprint",
        measure: Measure::Scalar {
            name: footprint::TREE_64,
            threads: 0,
            unit: "B per CPU",
        },
        bound: Bound::AtMost(footprint::TREE_TARGET),
        on_siblings: None,
    },
    Target {
        name: "footprint: tree at 128 CPUs",
        suite: "footprint",
        measure: Measure::Scalar {
            name: footprint::TREE_128,
            threads: 0,
            unit: "B per CPU",
        },
        bound: Bound::AtMost(footprint::TREE_TARGET),
        on_siblings: None,
    },
    Target {
        name: "footprint: tree at 256 CPUs",
        suite: "footprint",
        measure: Measure::Scalar {
            name: footprint::TREE_256,
            threads: 0,
            unit: "B per CPU",
        },
        bound: Bound::AtMost(footprint::TREE_TARGET),
        on_siblings: None,
    },
    Target {
        name: "footprint: tree at 4096 CPUs",
        suite: "footprint",
        measure: Measure::Scalar {
            name: footprint::TREE_4096,
            threads: 0,
            unit: "B per CPU",
        },
        bound: Bound::AtMost(footprint::TREE_TARGET),
        on_siblings: None,
    },
    Target {
        name: "groups: retained per removed group",
        suite: "groups",
        measure: Measure::Scalar {
            name: groups::RETAINED,
            threads: 1,
            unit: "B per removed group",
        },
        bound: Bound::AtMost(1.0),
        on_siblings: None,
    },
];

/// `1.05`, `1.1`, `10`: a bound as written in a goal.
fn number(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// "1 thread", "2 threads".
fn threads(n: usize) -> String {
    crate::bench::threads(n)
}

impl Target {
    /// The goal in words: the case, the bound, what it is relative to.
    pub fn goal(&self) -> String {
        let b = self.bound;
        match self.measure {
            Measure::Cost {
                case,
                baseline,
                threads: t,
            } => {
                let inverse = 1.0 / b.value();
                let amount = if b.value() < 1.0 && (inverse - inverse.round()).abs() < 1e-9 {
                    format!("1/{}", inverse.round())
                } else {
                    format!("×{:.2}", b.value())
                };
                format!("{case} {} {amount} of {baseline}, {}", b.sign(), threads(t))
            }
            Measure::Speedup {
                case,
                baseline,
                threads: t,
            } => {
                let siblings = self.on_siblings.map_or_else(String::new, |s| {
                    format!(
                        " on distinct cores ({} {}× on hyperthread siblings)",
                        s.sign(),
                        number(s.value())
                    )
                });
                format!(
                    "{case} {} {}× the throughput of {baseline}, {}{siblings}",
                    b.sign(),
                    number(b.value()),
                    threads(t)
                )
            }
            Measure::Rate {
                case,
                baseline,
                threads: t,
            } => format!(
                "{case} {} {}× the operations per second of {baseline} (wall time), {}",
                b.sign(),
                number(b.value()),
                threads(t)
            ),
            Measure::Scaling { case, threads: t } => format!(
                "{case} at {} {} {}× its 1-thread throughput",
                threads(t),
                b.sign(),
                number(b.value())
            ),
            Measure::Time { case, threads: t } => format!(
                "{case} {} {} ns per operation, {}",
                b.sign(),
                number(b.value()),
                threads(t)
            ),
            // Threads 0: a figure computed, not timed (a layout's bytes).
            Measure::Scalar {
                name,
                threads: 0,
                unit,
            } => format!("{name} {} {} {unit}", b.sign(), number(b.value())),
            Measure::Scalar {
                name,
                threads: t,
                unit,
            } => format!(
                "{name} {} {} {unit}, {}",
                b.sign(),
                number(b.value()),
                threads(t)
            ),
        }
    }

    /// The figure, from the suite's rounds (`None`: a case is missing).
    pub fn figure(&self, m: &Measured) -> Option<Figure> {
        match self.measure {
            Measure::Cost {
                case,
                baseline,
                threads,
            } => m.ratio(case, baseline, threads),
            Measure::Speedup {
                case,
                baseline,
                threads,
            } => m.speedup(case, baseline, threads),
            Measure::Rate {
                case,
                baseline,
                threads,
            } => m.rate(case, baseline, threads),
            Measure::Scaling { case, threads } => m.scaling(case, threads),
            Measure::Time { case, threads } => m.time(case, threads),
            Measure::Scalar { name, threads, .. } => m.scalar(name, threads),
        }
    }

    fn threads(&self) -> usize {
        match self.measure {
            Measure::Cost { threads, .. }
            | Measure::Speedup { threads, .. }
            | Measure::Rate { threads, .. }
            | Measure::Scaling { threads, .. }
            | Measure::Time { threads, .. }
            | Measure::Scalar { threads, .. } => threads,
        }
    }

    /// The bound that applies on this machine, and why (empty when there
    /// is no choice to explain).
    fn applicable(&self, m: &Measured) -> (Bound, String) {
        let Some(siblings) = self.on_siblings else {
            return (self.bound, String::new());
        };
        match m.placement(self.threads()) {
            Some(p) if p.shares_core == Some(true) => (
                siblings,
                format!("on {}: the hyperthread-sibling bound applies", p.describe()),
            ),
            Some(p) if p.shares_core == Some(false) => (
                self.bound,
                format!("on {}: the distinct-core bound applies", p.describe()),
            ),
            Some(p) => (
                self.bound,
                format!(
                    "on {}; core sharing unknown: the distinct-core bound applies",
                    p.describe()
                ),
            ),
            None => (
                self.bound,
                "threads not pinned (too few CPUs): the distinct-core bound applies".to_owned(),
            ),
        }
    }

    /// The verdict on this target from `m` (the rounds of [`Target::suite`]).
    pub fn verdict(&self, m: &Measured) -> Verdict {
        let (bound, note) = self.applicable(m);
        let mut notes: Vec<String> = vec![note];
        let figure = self.figure(m);
        let spread = figure.as_ref().map(|f| f.spread);
        let status = match &figure {
            None => Status::NotMeasured,
            Some(f) if !f.stable() => Status::Unstable,
            Some(f) if bound.holds(f.spread.median) => Status::Met,
            Some(_) => Status::NotMet,
        };
        match &figure {
            Some(f) => {
                if f.poor_overlap {
                    notes.push(
                        "too few rounds had the threads running together: all were used".to_owned(),
                    );
                } else if f.left_out > 0 {
                    notes.push(format!("{} poor-overlap round(s) left out", f.left_out));
                }
                if f.once && self.threads() == 0 {
                    notes.push("computed from the layout, not timed".to_owned());
                } else if f.once {
                    notes.push("measured once, outside the rounds".to_owned());
                } else if !f.spread.stable() {
                    notes.push(format!(
                        "halves of the rounds differ by {:.0}%",
                        f.spread.halves_apart() * 100.0
                    ));
                }
            }
            None => notes = vec!["a case of this figure cannot run here".to_owned()],
        }
        notes.retain(|n| !n.is_empty());
        let note = notes.join("; ");
        Verdict {
            name: self.name.to_owned(),
            target: self.goal(),
            median: spread.map(|s| s.median),
            low: spread.map(|s| s.low),
            high: spread.map(|s| s.high),
            status,
            suite: self.suite.to_owned(),
            rounds: spread.map_or(0, |s| s.n),
            note,
            speedup: matches!(
                self.measure,
                Measure::Speedup { .. } | Measure::Rate { .. } | Measure::Scaling { .. }
            ),
            fraction: matches!(self.bound, Bound::AtMost(b) if b < 1.0 && b > 0.0),
            unit: match self.measure {
                Measure::Time { .. } => Some("ns"),
                Measure::Scalar { unit, .. } if unit.starts_with('%') => Some("%"),
                Measure::Scalar { .. } => Some("B"),
                _ => None,
            },
            bound: bound.value(),
        }
    }
}

/// met, not met, unstable or not measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Status {
    /// The median meets the bound, and the figure is stable.
    #[serde(rename = "met")]
    Met,
    /// The median misses the bound, and the figure is stable.
    #[serde(rename = "not met")]
    NotMet,
    /// The figure is not stable: neither verdict can be trusted.
    #[serde(rename = "unstable")]
    Unstable,
    /// A case of the figure cannot run on this machine.
    #[serde(rename = "not measured")]
    NotMeasured,
}

impl Status {
    /// The word, as in `report.json`.
    pub fn name(self) -> &'static str {
        match self {
            Status::Met => "met",
            Status::NotMet => "not met",
            Status::Unstable => "unstable",
            Status::NotMeasured => "not measured",
        }
    }
}

/// A target's verdict, as `report.json`'s `verdicts[]` holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The target's name.
    pub name: String,
    /// Its goal in words.
    pub target: String,
    /// The median of the per-round figures.
    pub median: Option<f64>,
    /// The smallest per-round figure.
    pub low: Option<f64>,
    /// The largest per-round figure.
    pub high: Option<f64>,
    /// met, not met, unstable or not measured.
    pub status: Status,
    /// The suite it comes from.
    pub suite: String,
    /// Rounds in the figure.
    pub rounds: usize,
    /// Where the threads ran, rounds left out, why unstable.
    pub note: String,
    /// Whether the figure is a speed-up (`12×`) rather than a time ratio
    /// (`×1.2`).
    #[serde(skip)]
    pub speedup: bool,
    /// Whether the goal is a fraction (`1/80`), so the figure reads as one.
    #[serde(skip)]
    pub fraction: bool,
    /// An absolute figure's unit (`ns`, `B`), shown after the number.
    #[serde(skip)]
    pub unit: Option<&'static str>,
    /// The bound that applied (to show a median next to it with enough
    /// digits to tell them apart).
    #[serde(skip)]
    pub bound: f64,
}

impl Verdict {
    /// The median as the goal writes it: `×1.21`, `12.4×`, `1/43`.
    pub fn measured(&self) -> String {
        self.median
            .map_or_else(|| "—".to_owned(), |m| self.format(m))
    }

    /// `[low–high]`.
    pub fn range(&self) -> String {
        match (self.low, self.high) {
            (Some(lo), Some(hi)) => format!("[{}–{}]", self.bare(lo), self.bare(hi)),
            _ => String::new(),
        }
    }

    fn format(&self, v: f64) -> String {
        if let Some(unit) = self.unit {
            format!("{} {unit}", self.bare(v))
        } else if self.speedup {
            format!("{}×", self.bare(v))
        } else if self.fraction || v < 0.1 {
            self.bare(v)
        } else {
            format!("×{}", self.bare(v))
        }
    }

    fn bare(&self, v: f64) -> String {
        if self.unit == Some("%") {
            // +4.7 % against ≤ 5 % would read as 5.
            format!("{v:+.1}")
        } else if self.unit.is_some() {
            format!("{v:.0}")
        } else if !self.speedup && (self.fraction || v < 0.1) {
            let inverse = 1.0 / v;
            if inverse >= 10.0 {
                format!("1/{inverse:.0}")
            } else {
                format!("1/{inverse:.1}")
            }
        } else if v >= 10.0 {
            format!("{v:.1}")
        } else if format!("{v:.2}") == format!("{:.2}", self.bound) && v != self.bound {
            // ×1.10 "not met" against ≤ ×1.10 would read as a mistake.
            format!("{v:.3}")
        } else {
            format!("{v:.2}")
        }
    }
}

/// The verdicts of the targets of `suite`, from its rounds.
pub fn verdicts(suite: &str, m: &Measured) -> Vec<Verdict> {
    TARGETS
        .iter()
        .filter(|t| t.suite == suite)
        .map(|t| t.verdict(m))
        .collect()
}

/// The targets as the README's Markdown table.
pub fn readme_table() -> String {
    let mut out = String::from("| target | suite | goal |\n|---|---|---|\n");
    for t in TARGETS {
        out += &format!("| {} | `{}` | {} |\n", t.name, t.suite, t.goal());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::{Plan, Sample, Series};
    use std::time::Duration;

    fn measured(series: &[(&str, usize, &[f64])]) -> Measured {
        let series = series
            .iter()
            .map(|&(case, threads, ns)| Series {
                case: case.into(),
                threads,
                samples: ns
                    .iter()
                    .map(|&ns_per_op| Sample {
                        ns_per_op,
                        ops_per_sec: 1e9 / ns_per_op,
                        overlap: 1.0,
                        overlap_required: false,
                        pinned: true,
                    })
                    .collect(),
            })
            .collect();
        let plan = Plan {
            rounds: 4,
            slice: Duration::from_millis(1),
        };
        Measured::new("charge", plan, series)
    }

    fn target(name: &str) -> &'static Target {
        TARGETS.iter().find(|t| t.name == name).unwrap()
    }

    #[test]
    fn names_are_unique_and_every_goal_states_its_bound() {
        for (i, t) in TARGETS.iter().enumerate() {
            assert!(
                TARGETS[i + 1..].iter().all(|u| u.name != t.name),
                "{}",
                t.name
            );
            let goal = t.goal();
            assert!(goal.contains('≤') || goal.contains('≥'), "{goal}");
        }
        assert_eq!(
            target("stats: flush vs full walk").goal(),
            "flush-updated ≤ 1/80 of full-walk, 1 thread"
        );
        assert_eq!(
            target("charge: stock, 1 thread").goal(),
            "stock ≤ ×1.05 of no-accounting, 1 thread"
        );
    }

    /// The cases each suite measures (where the machine allows).
    fn cases_of(suite: &str) -> Vec<String> {
        use crate::alloc_switch::Allocator;
        use crate::bench::alloc::{case, Workload};
        let names: Vec<String> = match suite {
            "charge" => charge::CASES.iter().map(|c| c.to_string()).collect(),
            "fault" => fault::CASES.iter().map(|c| c.to_string()).collect(),
            "counters" => counters::CASES.iter().map(|c| c.to_string()).collect(),
            "stats" => stats::CASES.iter().map(|c| c.to_string()).collect(),
            "percpu" => percpu::CASES.iter().map(|c| c.to_string()).collect(),
            "alloc" => Workload::ALL
                .iter()
                .flat_map(|&w| Allocator::ALL.map(|a| case(w, a)))
                .chain(
                    [
                        crate::bench::alloc::RSS_ACCOUNTED_MEAN,
                        crate::bench::alloc::RSS_ACCOUNTED_ALIGNED_WORST,
                        crate::bench::alloc::RSS_JEMALLOC_HEAPS_WORST,
                        crate::bench::alloc::RSS_MIMALLOC_HEAPS_WORST,
                    ]
                    .map(str::to_owned),
                )
                .collect(),
            "async" => requests::CASES.iter().map(|c| c.to_string()).collect(),
            "ffi" => crate::bench::ffi::CASES
                .iter()
                .map(|c| c.to_string())
                .collect(),
            "preload" => crate::bench::preload::cases(),
            "groups" => [
                groups::CYCLE,
                groups::NO_ALLOC,
                groups::CROWDED,
                groups::RETAINED,
            ]
            .iter()
            .map(|c| c.to_string())
            .collect(),
            "noisy" => noisy::record_cases(),
            "footprint" => footprint::TREE_FIGURES
                .iter()
                .map(|(name, _)| name.to_string())
                .collect(),
            other => panic!("no targets expected in {other}"),
        };
        names
    }

    #[test]
    fn every_target_names_cases_its_suite_measures() {
        for t in TARGETS {
            let known = cases_of(t.suite);
            let named: Vec<&str> = match t.measure {
                Measure::Cost { case, baseline, .. }
                | Measure::Speedup { case, baseline, .. }
                | Measure::Rate { case, baseline, .. } => vec![case, baseline],
                Measure::Scaling { case, .. } | Measure::Time { case, .. } => vec![case],
                Measure::Scalar { name, .. } => vec![name],
            };
            for c in named {
                assert!(
                    known.iter().any(|k| k == c),
                    "{}: {c} not in {known:?}",
                    t.name
                );
            }
        }
    }

    #[test]
    fn a_stable_median_within_the_bound_is_met_and_beyond_it_not_met() {
        let t = target("charge: stock, 1 thread");
        let ok = measured(&[("no-accounting", 1, &[100.0; 4]), ("stock", 1, &[104.0; 4])]);
        assert_eq!(t.verdict(&ok).status, Status::Met);
        let slow = measured(&[("no-accounting", 1, &[100.0; 4]), ("stock", 1, &[120.0; 4])]);
        let v = t.verdict(&slow);
        assert_eq!(v.status, Status::NotMet);
        assert_eq!(v.measured(), "×1.20");
        let borderline = measured(&[
            ("no-accounting", 1, &[1000.0; 4]),
            ("stock", 1, &[1051.0; 4]),
        ]);
        let v = t.verdict(&borderline);
        assert_eq!(
            (v.status, v.measured()),
            (Status::NotMet, "×1.051".to_owned())
        );
    }

    #[test]
    fn halves_that_disagree_are_unstable_whatever_the_median() {
        let t = target("charge: stock, 1 thread");
        let drift = measured(&[
            ("no-accounting", 1, &[100.0; 4]),
            ("stock", 1, &[100.0, 100.0, 130.0, 130.0]),
        ]);
        assert_eq!(t.verdict(&drift).status, Status::Unstable);
    }

    #[test]
    fn a_fraction_goal_reads_its_figure_as_a_fraction() {
        let t = target("stats: flush vs full walk");
        let m = measured(&[
            ("full-walk", 1, &[1000.0, 1000.0]),
            ("flush-updated", 1, &[112.0, 113.0]),
        ]);
        let v = t.verdict(&m);
        assert_eq!(v.measured(), "1/8.9");
        assert_eq!(v.range(), "[1/8.9–1/8.8]");
        assert_eq!(v.status, Status::NotMet);
    }

    #[test]
    fn a_rate_goal_reads_its_figure_as_a_share_of_the_baseline() {
        let t = target("noisy: healthy group beside a breached cooperative one");
        let harmed = measured(&[
            ("beside-unlimited-healthy", 2, &[40.0; 4]),
            ("beside-cooperative-healthy", 2, &[100.0; 4]),
        ]);
        let v = t.verdict(&harmed);
        assert_eq!(
            (v.status, v.measured()),
            (Status::NotMet, "0.40×".to_owned())
        );
        let unharmed = measured(&[
            ("beside-unlimited-healthy", 2, &[40.0; 4]),
            ("beside-cooperative-healthy", 2, &[41.0; 4]),
        ]);
        assert_eq!(t.verdict(&unharmed).status, Status::Met);
    }

    #[test]
    fn a_fault_goal_reads_faults_per_second_as_a_share_of_no_accounting() {
        let t = target("fault: stock, 1 thread");
        assert_eq!(
            t.goal(),
            "stock ≥ 0.97× the throughput of no-accounting, 1 thread"
        );
        let slower = measured(&[("no-accounting", 1, &[100.0; 4]), ("stock", 1, &[110.0; 4])]);
        let v = t.verdict(&slower);
        assert_eq!(
            (v.status, v.measured()),
            (Status::NotMet, "0.91×".to_owned())
        );
        let close = measured(&[("no-accounting", 1, &[100.0; 4]), ("stock", 1, &[102.0; 4])]);
        assert_eq!(t.verdict(&close).status, Status::Met);
    }

    #[test]
    fn the_stock_floor_is_not_measured_without_rseq() {
        let t = target("charge: stock vs the bare rseq floor, 1 thread");
        assert_eq!(t.goal(), "stock ≤ ×1.05 of bare-rseq, 1 thread");
        let no_rseq = measured(&[("no-accounting", 1, &[100.0; 4]), ("stock", 1, &[104.0; 4])]);
        assert_eq!(t.verdict(&no_rseq).status, Status::NotMeasured);
    }

    #[test]
    fn a_missing_case_is_not_measured() {
        let t = target("charge: stock, 2 threads");
        let v = t.verdict(&measured(&[("stock", 1, &[1.0])]));
        assert_eq!(v.status, Status::NotMeasured);
        assert_eq!(v.median, None);
    }

    #[test]
    fn the_readme_shows_the_target_table() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
            .expect("the README beside the workspace");
        assert!(
            readme.contains(&readme_table()),
            "README.md's target table differs from report::targets; it should read:\n{}",
            readme_table()
        );
    }
}
