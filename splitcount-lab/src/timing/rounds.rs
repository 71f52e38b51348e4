//! Interleaved rounds: every entry of a suite runs once per round, for a
//! short slice, and the rounds alternate their order.
//!
//! ```text
//!  warm-up   A B C D      (untimed: caches, page faults, batch calibration)
//!  round 0   A B C D
//!  round 1   D C B A      every other round runs backwards, so no entry
//!  round 2   A B C D      always follows the same neighbour
//!  …
//! ```
//!
//! Each entry's warm-up slice sets how many operations its threads run
//! between two looks at the stop flag (about 20 µs of them) and, for slow
//! operations, a slice long enough for [`MIN_OPS_PER_SLICE`] of them (up to
//! [`MAX_STRETCH`] plan slices).
//!
//! A ratio is then computed **per round**, between two entries measured a
//! few slices apart, and the reported figure is the median of those
//! per-round ratios ([`super::Measured`]). Whatever disturbs the host for a
//! while (another process compiling, a CPU clocking down) disturbs both
//! sides of most ratios, and a disturbance that hits one side lands in one
//! round's ratio, which the median drops.

use super::measured::{Measured, Sample, Series};
use super::pin;
use super::slice::{self, SliceRun, SliceSpec};
use std::cell::RefCell;
use std::time::Duration;

/// How many rounds, and how long each entry runs in one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Rounds per entry (≥ 1).
    pub rounds: usize,
    /// Wall time of one entry in one round.
    pub slice: Duration,
}

impl Plan {
    /// The untimed first slice of each entry: half a slice.
    pub fn warmup(&self) -> Duration {
        (self.slice / 2).max(Duration::from_millis(1))
    }

    /// `total` of measuring per entry split into `rounds` slices.
    pub fn split(total: Duration, rounds: usize) -> Plan {
        let rounds = rounds.max(1);
        Plan {
            rounds,
            slice: total / rounds as u32,
        }
    }
}

/// Wall time a thread runs between two looks at the stop flag, once the
/// warm-up has shown what an operation costs.
const BATCH_TIME_NS: f64 = 20_000.0;

/// The most operations between two looks at the stop flag.
const MAX_BATCH: u64 = 1 << 16;

/// Operations a thread should complete per slice: an entry whose operation
/// is slow (serde_json over a 2 MB document) gets slices long enough for
/// this many, so that one odd operation does not make a round — up to
/// [`MAX_STRETCH`] times the plan's slice.
pub const MIN_OPS_PER_SLICE: u32 = 8;

/// How many times the plan's slice a slow operation's slice may last.
pub const MAX_STRETCH: u32 = 6;

/// The slice length of an entry whose operation costs `ns_per_op`: the
/// plan's, or enough for [`MIN_OPS_PER_SLICE`] operations, at most
/// [`MAX_STRETCH`] times the plan's.
pub fn slice_for(plan: &Plan, ns_per_op: f64) -> Duration {
    let needed = if ns_per_op.is_finite() && ns_per_op > 0.0 {
        Duration::from_secs_f64((ns_per_op * 1e-9 * MIN_OPS_PER_SLICE as f64).min(60.0))
    } else {
        Duration::ZERO
    };
    plan.slice.max(needed.min(plan.slice * MAX_STRETCH))
}

/// Operations per batch for an operation that costs `ns_per_op`.
pub fn batch_for(ns_per_op: f64) -> u64 {
    if ns_per_op.is_finite() && ns_per_op > 0.0 {
        ((BATCH_TIME_NS / ns_per_op).round() as u64).clamp(1, MAX_BATCH)
    } else {
        1
    }
}

type SliceFn<'a> = Box<dyn FnMut(SliceSpec) -> Result<SliceRun, String> + 'a>;

/// One thing to time: a case at a thread count, and how to run one slice
/// of it.
pub struct Entry<'a> {
    /// The case (the record's `case`).
    pub case: String,
    /// Threads running it at once.
    pub threads: usize,
    /// One name per thread when the threads play different roles (a
    /// writer and a reader): each role is then reported on its own, as
    /// `{case}-{role}`.
    pub roles: Vec<String>,
    run: SliceFn<'a>,
}

impl std::fmt::Debug for Entry<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("case", &self.case)
            .field("threads", &self.threads)
            .field("roles", &self.roles)
            .finish_non_exhaustive()
    }
}

impl<'a> Entry<'a> {
    /// `make(t)` builds thread `t`'s operation, which the timed loop calls
    /// over and over (inlined into it: no dynamic call per operation).
    pub fn new<M, F>(case: impl Into<String>, threads: usize, make: M) -> Entry<'a>
    where
        M: Fn(usize) -> F + Sync + 'a,
        F: FnMut(),
    {
        Entry::from_fn(case, threads, move |spec| {
            Ok(slice::run(threads, spec, &make))
        })
    }

    /// `make(t)` returns the thread's looped operation: `f(n)` runs `n`
    /// operations itself (a loop written in C), so that no call per
    /// operation is measured that the loop's own language would not make.
    pub fn looped<M, F>(case: impl Into<String>, threads: usize, make: M) -> Entry<'a>
    where
        M: Fn(usize) -> F + Sync + 'a,
        F: FnMut(u64),
    {
        Entry::from_fn(case, threads, move |spec| {
            Ok(slice::run_looped(threads, spec, &make))
        })
    }

    /// `make(t)` returns `(prepare, op)`: `prepare` runs untimed before
    /// every call of `op`, and only the calls are timed.
    pub fn prepared<M, P, F>(case: impl Into<String>, threads: usize, make: M) -> Entry<'a>
    where
        M: Fn(usize) -> (P, F) + Sync + 'a,
        P: FnMut(),
        F: FnMut(),
    {
        Entry::from_fn(case, threads, move |spec| {
            Ok(slice::run_prepared(threads, spec, &make))
        })
    }

    /// An entry that runs its slices itself (in another process, for the
    /// allocator suite), returning what [`slice::run`] would.
    pub fn from_fn(
        case: impl Into<String>,
        threads: usize,
        run: impl FnMut(SliceSpec) -> Result<SliceRun, String> + 'a,
    ) -> Entry<'a> {
        Entry {
            case: case.into(),
            threads: threads.max(1),
            roles: Vec::new(),
            run: Box::new(run),
        }
    }

    /// Report each thread as its own role (`roles[t]` for thread `t`).
    pub fn roles(mut self, roles: &[&str]) -> Entry<'a> {
        self.roles = roles.iter().map(|r| (*r).to_owned()).collect();
        self
    }

    fn slice(&mut self, spec: SliceSpec) -> Result<SliceRun, String> {
        let run = (self.run)(spec)?;
        if run.threads.len() != self.threads {
            return Err(format!(
                "{} ran {} threads, not {}",
                self.case,
                run.threads.len(),
                self.threads
            ));
        }
        notify(Progress::SliceDone);
        Ok(run)
    }
}

/// Time `entries` in `plan.rounds` interleaved rounds after one warm-up
/// slice each, and return every round's samples.
pub fn measure(suite: &str, plan: &Plan, mut entries: Vec<Entry>) -> Result<Measured, String> {
    notify(Progress::Planned(entries.len() * (plan.rounds + 1)));
    let mut specs = Vec::with_capacity(entries.len());
    for e in &mut entries {
        let warm = e.slice(SliceSpec {
            length: plan.warmup(),
            batch: 1,
        })?;
        specs.push(SliceSpec {
            length: slice_for(plan, warm.ns_per_op()),
            batch: batch_for(warm.ns_per_op()),
        });
    }
    let mut runs: Vec<Vec<SliceRun>> = entries.iter().map(|_| Vec::new()).collect();
    for round in 0..plan.rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..entries.len()).collect()
        } else {
            (0..entries.len()).rev().collect()
        };
        for i in order {
            runs[i].push(entries[i].slice(specs[i])?);
        }
    }
    let mut series = Vec::new();
    for (e, runs) in entries.iter().zip(&runs) {
        let overlap_required = e.threads >= 2 && pin::placement(e.threads).is_some();
        let sample = |r: &SliceRun, ns_per_op: f64, ops_per_sec: f64| Sample {
            ns_per_op,
            ops_per_sec,
            overlap: r.overlap(),
            overlap_required,
            pinned: r.pinned.is_some(),
        };
        if e.roles.is_empty() {
            series.push(Series {
                case: e.case.clone(),
                threads: e.threads,
                samples: runs
                    .iter()
                    .map(|r| sample(r, r.ns_per_op(), r.ops_per_sec()))
                    .collect(),
            });
        } else {
            for (t, role) in e.roles.iter().enumerate() {
                series.push(Series {
                    case: format!("{}-{role}", e.case),
                    threads: e.threads,
                    samples: runs
                        .iter()
                        .map(|r| sample(r, r.thread_ns_per_op(t), r.thread_ops_per_sec(t)))
                        .collect(),
                });
            }
        }
    }
    Ok(Measured::new(suite, *plan, series))
}

/// What the timing core tells an observer (the report's progress bars).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// This many more slices will run.
    Planned(usize),
    /// One slice ran.
    SliceDone,
}

type Observer = Box<dyn Fn(Progress)>;

thread_local! {
    static OBSERVER: RefCell<Option<Observer>> = const { RefCell::new(None) };
}

/// Run `f`, calling `observer` as [`measure`] plans and runs slices on this
/// thread meanwhile (the report advances its progress bars this way,
/// without a parameter through every suite).
pub fn observed<R>(observer: impl Fn(Progress) + 'static, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Observer>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            OBSERVER.with(|o| *o.borrow_mut() = previous);
        }
    }
    let previous = OBSERVER.with(|o| o.borrow_mut().replace(Box::new(observer)));
    let _restore = Restore(previous);
    f()
}

fn notify(p: Progress) {
    OBSERVER.with(|o| {
        if let Some(observer) = o.borrow().as_ref() {
            observer(p);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[test]
    fn slow_operations_get_slices_long_enough_for_a_few_of_them() {
        let plan = Plan {
            rounds: 3,
            slice: Duration::from_millis(80),
        };
        assert_eq!(slice_for(&plan, 100.0), plan.slice);
        assert_eq!(slice_for(&plan, 50e6), Duration::from_millis(400));
        assert_eq!(slice_for(&plan, 1e9), Duration::from_millis(480));
        assert_eq!(slice_for(&plan, f64::NAN), plan.slice);
    }

    #[test]
    fn batches_last_about_twenty_microseconds() {
        assert_eq!(batch_for(1.0), 20_000);
        assert_eq!(batch_for(0.1), MAX_BATCH);
        assert_eq!(batch_for(1e6), 1);
        assert_eq!(batch_for(f64::NAN), 1);
    }

    #[test]
    fn rounds_alternate_their_order_after_a_warm_up() {
        let log = RefCell::new(Vec::new());
        let entries = ["a", "b", "c"]
            .into_iter()
            .map(|name| {
                let log = &log;
                Entry::from_fn(name, 1, move |spec| {
                    log.borrow_mut().push(name);
                    Ok(SliceRun {
                        threads: vec![slice::ThreadRun {
                            ops: spec.batch,
                            start_ns: 0,
                            stop_ns: 1000,
                            cpu_ns: Some(1000),
                            timed_ns: None,
                        }],
                        pinned: None,
                    })
                })
            })
            .collect();
        let plan = Plan {
            rounds: 3,
            slice: Duration::from_millis(1),
        };
        let m = measure("test", &plan, entries).unwrap();
        assert_eq!(
            *log.borrow(),
            ["a", "b", "c", "a", "b", "c", "c", "b", "a", "a", "b", "c"]
        );
        assert_eq!(m.series.len(), 3);
        assert!(m.series.iter().all(|s| s.samples.len() == 3));
    }

    #[test]
    fn the_observer_hears_every_planned_and_finished_slice() {
        let (planned, done) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
        let (p, d) = (planned.clone(), done.clone());
        let plan = Plan {
            rounds: 2,
            slice: Duration::from_millis(2),
        };
        observed(
            move |e| match e {
                Progress::Planned(n) => p.set(p.get() + n),
                Progress::SliceDone => d.set(d.get() + 1),
            },
            || {
                let e = Entry::new("spin", 1, |_| || std::hint::spin_loop());
                measure("test", &plan, vec![e]).unwrap()
            },
        );
        assert_eq!((planned.get(), done.get()), (3, 3));
    }

    #[test]
    fn roles_are_reported_one_series_per_thread() {
        let plan = Plan {
            rounds: 2,
            slice: Duration::from_millis(5),
        };
        let e = Entry::new("pair", 2, |_| || std::hint::spin_loop()).roles(&["left", "right"]);
        let m = measure("test", &plan, vec![e]).unwrap();
        let names: Vec<&str> = m.series.iter().map(|s| s.case.as_str()).collect();
        assert_eq!(names, ["pair-left", "pair-right"]);
    }
}
