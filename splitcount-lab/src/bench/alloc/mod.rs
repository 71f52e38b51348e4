//! `bench alloc`: what accounting a program's heap by group costs, as a
//! ratio of `Accounted<System>` to `System` on the same workloads — and
//! what charging footprints adds, as a ratio of `Accounted<System,
//! Footprint>` to `Accounted<System>`.
//!
//! Both allocators are measured as a program meets them — as the process's
//! global allocator, reached through `std::alloc` by a `Vec`, a `String` or
//! serde_json — so neither is inlined into a loop where the other is not.
//! A process has one global allocator, so each allocator runs in a worker
//! process of its own ([`super::worker`]), and the three are driven slice by slice
//! in the same interleaved rounds, like any cases of a suite. The
//! workloads are in [`workloads`]; case names are
//! `{workload}-{allocator}`, e.g. `small-accounted`, whose baseline is
//! `small-system`, and `small-footprint`, whose baseline is
//! `small-accounted` (the same wrapper charging requested sizes: the ratio
//! is what asking glibc for each block's usable size costs).
//!
//! **A fresh worker every round.** Each allocator's worker is replaced once
//! it has run its cases of a round (`Rotating`). A process can be slow
//! for its whole life — where its heap's pages landed, a huge page or not —
//! and a worker kept for the whole run would carry that into every round
//! of its cases (one run read jemalloc alone at 25.9 ns a pair where every
//! other run read 12–19). With a fresh pair of processes per round it is
//! one round's noise, which the median of the rounds' ratios discounts.

pub mod workloads;

use super::worker::{self, Request, Worker};
use super::{Bench, Entry};
use crate::alloc_switch::Allocator;
use crate::timing::slice::SliceRun;
use crate::timing::{measure, Plan};
use std::cell::RefCell;
use std::path::Path;
pub use workloads::Workload;

/// The allocator every case is divided by (but the footprint cases).
pub const BASELINE: Allocator = Allocator::System;

/// The allocators measured, each in a worker process of its own: glibc's,
/// jemalloc and mimalloc, each alone and under `Accounted` charging
/// requested sizes and footprints, and `HeapPerGroup` over mimalloc.
pub const ALLOCATORS: [Allocator; 10] = Allocator::ALL;

/// `{workload}-{allocator}`.
pub fn case(workload: Workload, allocator: Allocator) -> String {
    format!("{}-{}", workload.name(), allocator.name())
}

/// The baseline of a case: the same workload on [`Allocator::baseline`] —
/// an accounted case on its inner allocator alone, a footprint case on the
/// same wrapper charging requested sizes, an inner allocator on glibc's.
pub fn baseline_of(case: &str) -> Option<String> {
    // The longest allocator name that ends the case (`jemalloc-accounted`
    // rather than `accounted`).
    let (workload, allocator) = Allocator::ALL
        .into_iter()
        .filter_map(|a| {
            let workload = case.strip_suffix(a.name())?.strip_suffix('-')?;
            Some((workload, a))
        })
        .max_by_key(|(_, a)| a.name().len())?;
    Some(format!("{workload}-{}", allocator.baseline().name()))
}

/// Measure every workload on every allocator; the rings at each of
/// `threads`, `cross-thread` at 2 and `json` at 1. `exe` is the lab binary
/// (its `alloc-worker` command runs the workers).
pub fn run(exe: &Path, threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    // The resident memory per block, each allocator and size in a fresh
    // worker of its own (which measures it first thing, then goes).
    let blocks = ALLOCATORS
        .iter()
        .map(|&a| {
            let mut per_size = Vec::new();
            for size in worker::BLOCK_SIZES {
                let size = size.to_string();
                let ask_rss = [(worker::BLOCK_RSS_ENV, std::ffi::OsStr::new(&size))];
                let w = Worker::start_with_env(exe, a, &ask_rss)?;
                match w.hello.as_ref().and_then(|h| h.block_bytes.first()) {
                    Some(&b) => per_size.push(b),
                    None => return Ok((a, Vec::new())),
                }
            }
            Ok((a, per_size))
        })
        .collect::<Result<Vec<(Allocator, Vec<f64>)>, String>>()?;
    // The cases each worker runs in a round: after that many slices, a
    // new round begins (the warm-up included: each case runs once in it).
    let per_round: usize = Workload::ALL
        .iter()
        .map(|w| w.thread_counts(threads).len())
        .sum();
    let workers = ALLOCATORS
        .iter()
        .map(|&a| Ok((a, RefCell::new(Rotating::start(exe, a, per_round)?))))
        .collect::<Result<Vec<_>, String>>()?;
    let mut entries = Vec::new();
    for workload in Workload::ALL {
        for t in workload.thread_counts(threads) {
            for (allocator, worker) in &workers {
                let allocator = *allocator;
                entries.push(Entry::from_fn(case(workload, allocator), t, move |spec| {
                    worker
                        .borrow_mut()
                        .run(&Request::new(workloads::SUITE, &workload, t, spec)?)
                }));
            }
        }
    }
    let boxes: Vec<String> = workers
        .iter()
        .map(|(a, w)| {
            let bytes = w.borrow().first.as_ref().and_then(|h| h.box_bytes);
            match bytes {
                Some(b) => format!("{} {b:.1} B", a.name()),
                None => format!("{} unknown", a.name()),
            }
        })
        .collect();
    let measured = measure("alloc", plan, entries)?;
    let mut bench = Bench::new(measured, baseline_of);
    bench.legend.push(format!(
        "resident memory per 24-byte Box ({} held at once in a group, each allocator's \
         worker): {}",
        worker::BOXES,
        boxes.join(", ")
    ));
    bench.legend.extend(block_rss_legend(&blocks));
    Ok(bench)
}

/// An allocator's worker, replaced by a fresh one every `per_round`
/// slices: one round of its cases per process (see the module docs).
struct Rotating<'a> {
    exe: &'a Path,
    allocator: Allocator,
    /// `None` between a round's end and the next slice (or a failed start).
    worker: Option<Worker>,
    /// What the first worker said (its box figure; later ones skip it).
    first: Option<worker::Hello>,
    rounds: RoundCounter,
}

/// Counts one worker's slices: every `per_round` of them, a round of its
/// cases is over and the next slice wants a fresh worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RoundCounter {
    per_round: usize,
    /// Slices the current worker has run.
    ran: usize,
}

impl RoundCounter {
    fn new(per_round: usize) -> RoundCounter {
        RoundCounter {
            per_round: per_round.max(1),
            ran: 0,
        }
    }

    /// Count a slice about to run; whether it starts a new round (and so
    /// needs a fresh worker).
    fn next_starts_a_round(&mut self) -> bool {
        let fresh = self.ran == self.per_round;
        if fresh {
            self.ran = 0;
        }
        self.ran += 1;
        fresh
    }
}

impl<'a> Rotating<'a> {
    fn start(exe: &'a Path, allocator: Allocator, per_round: usize) -> Result<Self, String> {
        let mut worker = Worker::start(exe, allocator)?;
        Ok(Rotating {
            exe,
            allocator,
            first: worker.hello.take(),
            worker: Some(worker),
            rounds: RoundCounter::new(per_round),
        })
    }

    fn run(&mut self, request: &Request) -> Result<SliceRun, String> {
        if self.rounds.next_starts_a_round() {
            // The old worker goes (its `Drop` reaps it) before the new one
            // starts: never two of them at once.
            self.worker = None;
        }
        let worker = match &mut self.worker {
            Some(w) => w,
            slot @ None => {
                let skip = [(worker::NO_BOXES_ENV, std::ffi::OsStr::new("1"))];
                slot.insert(Worker::start_with_env(self.exe, self.allocator, &skip)?)
            }
        };
        worker.run(request)
    }
}

/// The allocator an accounted one wraps (itself for one alone).
pub fn alone(a: Allocator) -> Allocator {
    match a.name().split('-').next() {
        Some("jemalloc") => Allocator::Jemalloc,
        Some("mimalloc") => Allocator::Mimalloc,
        _ => Allocator::System,
    }
}

/// Resident bytes per block over `sizes` against the same on the
/// allocator alone: the mean over the sizes of the per-size growth, and
/// the worst size (`None` when either has no figures, or the allocator
/// alone grew by less than a byte a block at some size: memory it had
/// already, a figure not to divide by).
pub fn rss_growth(ours: &[f64], alone: &[f64], sizes: &[usize]) -> Option<(f64, f64, usize)> {
    if ours.len() != sizes.len() || alone.len() != sizes.len() || alone.iter().any(|&a| a < 1.0) {
        return None;
    }
    let growth: Vec<f64> = ours.iter().zip(alone).map(|(o, a)| o / a - 1.0).collect();
    let mean = growth.iter().sum::<f64>() / growth.len() as f64;
    let (worst, at) =
        growth.iter().zip(sizes).fold(
            (f64::MIN, 0),
            |(w, s), (g, size)| if *g > w { (*g, *size) } else { (w, s) },
        );
    Some((mean, worst, at))
}

/// The legend lines of the per-size resident memory: each allocator's
/// bytes per block, and each accounted one's growth over its allocator
/// alone.
fn block_rss_legend(blocks: &[(Allocator, Vec<f64>)]) -> Vec<String> {
    let sizes = worker::BLOCK_SIZES;
    let of = |a: Allocator| {
        blocks
            .iter()
            .find(|(b, _)| *b == a)
            .map(|(_, v)| v.as_slice())
    };
    let mut lines = vec![format!(
        "resident bytes per block of {} B ({} of each held at once): {}",
        sizes.map(|s| s.to_string()).join(", "),
        worker::BLOCKS,
        blocks
            .iter()
            .map(|(a, v)| {
                let cells: Vec<String> = v.iter().map(|b| format!("{b:.1}")).collect();
                format!("{} [{}]", a.name(), cells.join(" "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    )];
    let growth: Vec<String> = blocks
        .iter()
        .filter(|(a, _)| alone(*a) != *a)
        .filter_map(|(a, v)| {
            let (mean, worst, at) = rss_growth(v, of(alone(*a))?, &sizes)?;
            Some(format!(
                "{} over {}: mean {:+.1}%, worst {:+.1}% at {at} B",
                a.name(),
                alone(*a).name(),
                mean * 100.0,
                worst * 100.0
            ))
        })
        .collect();
    if !growth.is_empty() {
        lines.push(format!("resident memory per block: {}", growth.join("; ")));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_growth_is_the_mean_and_the_worst_size_over_the_allocator_alone() {
        assert_eq!(alone(Allocator::JemallocFootprint), Allocator::Jemalloc);
        assert_eq!(alone(Allocator::Accounted), Allocator::System);
        assert_eq!(alone(Allocator::Mimalloc), Allocator::Mimalloc);
        let (mean, worst, at) = rss_growth(&[16.0, 48.0], &[16.0, 32.0], &[8, 24]).unwrap();
        assert!((mean - 0.25).abs() < 1e-9 && (worst - 0.5).abs() < 1e-9 && at == 24);
        assert!(rss_growth(&[1.0], &[], &[8]).is_none());
        assert!(rss_growth(&[1.0], &[0.0], &[8]).is_none());
    }

    /// With 3 cases per round (the warm-up is a round too), slices 4, 7,
    /// 10 … start on a fresh worker, and no other does.
    #[test]
    fn a_worker_is_replaced_once_it_ran_its_cases_of_a_round() {
        let mut rounds = RoundCounter::new(3);
        let fresh: Vec<bool> = (0..10).map(|_| rounds.next_starts_a_round()).collect();
        assert_eq!(
            fresh,
            [false, false, false, true, false, false, true, false, false, true]
        );
        let mut one = RoundCounter::new(0);
        let fresh: Vec<bool> = (0..3).map(|_| one.next_starts_a_round()).collect();
        assert_eq!(fresh, [false, true, true], "at least one case per round");
    }

    #[test]
    fn each_case_is_compared_with_its_workload_on_its_baseline_allocator() {
        assert_eq!(
            case(Workload::CrossThread, Allocator::Accounted),
            "cross-thread-accounted"
        );
        assert_eq!(
            baseline_of("cross-thread-accounted").unwrap(),
            "cross-thread-system"
        );
        assert_eq!(baseline_of("small-system").unwrap(), "small-system");
        assert_eq!(
            baseline_of("cross-thread-jemalloc-accounted").unwrap(),
            "cross-thread-jemalloc"
        );
        assert_eq!(
            baseline_of("small-mimalloc-footprint").unwrap(),
            "small-mimalloc-accounted"
        );
        assert_eq!(baseline_of("json-jemalloc").unwrap(), "json-system");
        assert_eq!(
            baseline_of(&case(Workload::CrossThread, Allocator::Footprint)).unwrap(),
            "cross-thread-accounted"
        );
    }
}
