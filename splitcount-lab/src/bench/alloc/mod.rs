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

use super::worker::{self, HugePages, Request, Worker};
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
pub const ALLOCATORS: [Allocator; 11] = Allocator::ALL;

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

/// How `bench alloc` measures the resident bytes per block.
#[derive(Debug, Clone, Copy)]
pub struct RssPlan<'a> {
    /// Once with each of these (huge pages off, as the allocators ask).
    pub pages: &'a [HugePages],
    /// Blocks of each size held at once ([`worker::BLOCKS`] in full).
    pub blocks: usize,
}

impl RssPlan<'_> {
    /// Both huge-page settings, [`worker::BLOCKS`] blocks of each size.
    pub const FULL: RssPlan<'static> = RssPlan {
        pages: &HugePages::ALL,
        blocks: worker::BLOCKS,
    };
}

/// Measure every workload on every allocator; the rings at each of
/// `threads`, `cross-thread` at 2 and `json` at 1; and the resident bytes
/// per block as `rss` says. `exe` is the lab binary (its `alloc-worker`
/// command runs the workers).
pub fn run(exe: &Path, threads: &[usize], plan: &Plan, rss: RssPlan) -> Result<Bench, String> {
    // The resident memory per block, each allocator and size in a fresh
    // worker of its own (which measures it first thing, then goes).
    let word: Vec<(usize, usize)> = worker::BLOCK_SIZES.iter().map(|&s| (s, 8)).collect();
    let blocks = rss
        .pages
        .iter()
        .copied()
        .map(|pages| {
            let sized = block_rss(exe, pages, &word, rss.blocks)?;
            let aligned = block_rss(exe, pages, &worker::ALIGNED_BLOCKS, rss.blocks)?;
            Ok((pages, sized, aligned))
        })
        .collect::<Result<Vec<_>, String>>()?;
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
    let mut measured = measure("alloc", plan, entries)?;
    // The resident-memory targets' figures, with huge pages off (what a
    // block takes).
    if let Some((_, sized, aligned)) = blocks.iter().find(|(p, _, _)| *p == HugePages::Off) {
        measured.scalars.extend(rss_figures(sized, aligned));
    }
    let mut bench = Bench::new(measured, baseline_of);
    bench.legend.push(format!(
        "resident memory per 24-byte Box ({} held at once in a group, each allocator's \
         worker): {}",
        worker::BOXES,
        boxes.join(", ")
    ));
    for (pages, sized, aligned) in &blocks {
        bench
            .legend
            .extend(block_rss_legend(sized, *pages, rss.blocks));
        bench
            .legend
            .extend(aligned_rss_legend(aligned, *pages, rss.blocks));
    }
    Ok(bench)
}

/// Each allocator's resident bytes per block of each of `layouts`
/// (`(size, align)`), with huge pages as `pages` says: one fresh worker per
/// allocator and layout (empty where the worker could not tell).
fn block_rss(
    exe: &Path,
    pages: HugePages,
    layouts: &[(usize, usize)],
    blocks: usize,
) -> Result<Vec<(Allocator, Vec<f64>)>, String> {
    let blocks = blocks.to_string();
    ALLOCATORS
        .iter()
        .map(|&a| {
            let mut per_size = Vec::new();
            for &(size, align) in layouts {
                let asked = worker::block_rss_request(size, align);
                let env = [
                    (worker::BLOCK_RSS_ENV, std::ffi::OsStr::new(&asked)),
                    (worker::NO_BOXES_ENV, std::ffi::OsStr::new("1")),
                    (worker::BLOCK_COUNT_ENV, std::ffi::OsStr::new(&blocks)),
                ];
                let w = Worker::start_with(exe, a, &env, pages)?;
                match w.hello.as_ref().and_then(|h| h.block_bytes.first()) {
                    Some(&b) => per_size.push(b),
                    None => return Ok((a, Vec::new())),
                }
            }
            Ok((a, per_size))
        })
        .collect()
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

/// Resident bytes per block over the block kinds `labels` (sizes, or
/// layouts) against the same on the allocator alone: the mean over the
/// kinds of the per-kind growth, and the worst kind (`None` when either has
/// no figures, or the allocator alone grew by less than a byte a block for
/// some kind: memory it had already, a figure not to divide by).
pub fn rss_growth<L: Copy>(ours: &[f64], alone: &[f64], labels: &[L]) -> Option<(f64, f64, L)> {
    if ours.len() != labels.len() || alone.len() != labels.len() || alone.iter().any(|&a| a < 1.0) {
        return None;
    }
    let growth: Vec<f64> = ours.iter().zip(alone).map(|(o, a)| o / a - 1.0).collect();
    let mean = growth.iter().sum::<f64>() / growth.len() as f64;
    let (worst, at) = growth
        .iter()
        .zip(labels)
        .map(|(g, l)| (*g, *l))
        .reduce(|w, x| if x.0 > w.0 { x } else { w })?;
    Some((mean, worst, at))
}

/// Resident memory of `Accounted<System>` over glibc alone, mean growth
/// over the sizes 8, 16, …, 128 B, in % (huge pages off).
pub const RSS_ACCOUNTED_MEAN: &str = "rss-accounted-mean";

/// Resident memory of `Accounted<System>` over glibc alone, worst growth
/// over the over-aligned layouts, in %.
pub const RSS_ACCOUNTED_ALIGNED_WORST: &str = "rss-accounted-aligned-worst";

/// Resident memory of `HeapPerGroup<Jemalloc>` over jemalloc alone, worst
/// growth over the sizes 8, 16, …, 128 B, in %.
pub const RSS_JEMALLOC_HEAPS_WORST: &str = "rss-jemalloc-heaps-worst";

/// Resident memory of `HeapPerGroup<MiMalloc>` over mimalloc alone, worst
/// growth over the sizes 8, 16, …, 128 B, in %.
pub const RSS_MIMALLOC_HEAPS_WORST: &str = "rss-mimalloc-heaps-worst";

/// The resident-memory figures the report's targets read (as
/// `Measured::scalars`, at one thread): growth over the allocator alone in
/// %, from the per-size (`sized`) and over-aligned (`aligned`) figures.
fn rss_figures(
    sized: &[(Allocator, Vec<f64>)],
    aligned: &[(Allocator, Vec<f64>)],
) -> Vec<(String, usize, f64)> {
    let growth = |blocks: &[(Allocator, Vec<f64>)], a: Allocator, worst: bool| {
        let of = |a: Allocator| blocks.iter().find(|(b, _)| *b == a).map(|(_, v)| v);
        let ours = of(a)?;
        let labels: Vec<usize> = (0..ours.len()).collect();
        let (mean, high, _) = rss_growth(ours, of(alone(a))?, &labels)?;
        Some(100.0 * if worst { high } else { mean })
    };
    [
        (RSS_ACCOUNTED_MEAN, sized, Allocator::Accounted, false),
        (
            RSS_ACCOUNTED_ALIGNED_WORST,
            aligned,
            Allocator::Accounted,
            true,
        ),
        (
            RSS_JEMALLOC_HEAPS_WORST,
            sized,
            Allocator::JemallocHeaps,
            true,
        ),
        (
            RSS_MIMALLOC_HEAPS_WORST,
            sized,
            Allocator::MimallocHeaps,
            true,
        ),
    ]
    .into_iter()
    .filter_map(|(name, blocks, a, worst)| Some((name.to_owned(), 1, growth(blocks, a, worst)?)))
    .collect()
}

/// The legend lines of the per-size resident memory measured with huge
/// pages as `pages` says, `count` blocks of each size.
fn block_rss_legend(
    blocks: &[(Allocator, Vec<f64>)],
    pages: HugePages,
    count: usize,
) -> Vec<String> {
    let setting = match pages {
        HugePages::Off => "transparent huge pages off: what each block takes",
        HugePages::AsAsked => {
            "transparent huge pages as each allocator asks for them (mimalloc does, and its \
             resident set then grows 2 MiB at a time: a whole huge page more or less, at \
             random, for the smallest sizes)"
        }
    };
    let sizes = worker::BLOCK_SIZES.map(|s| s.to_string());
    let labels = worker::BLOCK_SIZES.map(|s| format!("{s} B"));
    rss_legend(
        blocks,
        &format!(
            "resident bytes per block of {} B ({count} of each held at once; {setting})",
            sizes.join(", ")
        ),
        &labels,
        &format!("resident memory per block ({})", pages_short(pages)),
    )
}

/// The legend lines of the over-aligned layouts' resident memory
/// ([`worker::ALIGNED_BLOCKS`]), as [`block_rss_legend`] for the sizes.
fn aligned_rss_legend(
    blocks: &[(Allocator, Vec<f64>)],
    pages: HugePages,
    count: usize,
) -> Vec<String> {
    let labels = worker::ALIGNED_BLOCKS.map(|(size, align)| format!("{size} B at {align}"));
    let held: Vec<String> = worker::ALIGNED_BLOCKS
        .iter()
        .zip(&labels)
        .map(|(&(_, align), l)| format!("{l} ({} held)", worker::blocks_at(align, count)))
        .collect();
    rss_legend(
        blocks,
        &format!(
            "resident bytes per over-aligned block, {} ({})",
            held.join(", "),
            pages_short(pages)
        ),
        &labels,
        &format!(
            "resident memory per over-aligned block ({})",
            pages_short(pages)
        ),
    )
}

/// Two legend lines for resident bytes per block of each kind in `labels`:
/// `table`, then each allocator's figures; `growth`, then each accounted
/// allocator's mean and worst growth over the same allocator alone.
fn rss_legend(
    blocks: &[(Allocator, Vec<f64>)],
    table: &str,
    labels: &[String],
    growth: &str,
) -> Vec<String> {
    let of = |a: Allocator| {
        blocks
            .iter()
            .find(|(b, _)| *b == a)
            .map(|(_, v)| v.as_slice())
    };
    let cells: Vec<String> = blocks
        .iter()
        .map(|(a, v)| {
            let cells: Vec<String> = v.iter().map(|b| format!("{b:.1}")).collect();
            format!("{} [{}]", a.name(), cells.join(" "))
        })
        .collect();
    let mut lines = vec![format!("{table}: {}", cells.join("; "))];
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let growths: Vec<String> = blocks
        .iter()
        .filter(|(a, _)| alone(*a) != *a)
        .filter_map(|(a, v)| {
            let (mean, worst, at) = rss_growth(v, of(alone(*a))?, &labels)?;
            Some(format!(
                "{} over {}: mean {:+.1}%, worst {:+.1}% at {at}",
                a.name(),
                alone(*a).name(),
                mean * 100.0,
                worst * 100.0
            ))
        })
        .collect();
    if !growths.is_empty() {
        lines.push(format!("{growth}: {}", growths.join("; ")));
    }
    lines
}

/// How the legend names a huge-page setting in short.
fn pages_short(pages: HugePages) -> &'static str {
    match pages {
        HugePages::Off => "huge pages off",
        HugePages::AsAsked => "huge pages as asked",
    }
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

    #[test]
    fn the_resident_memory_targets_read_the_growth_in_percent() {
        let sized = vec![
            (Allocator::System, vec![32.0, 32.0]),
            (Allocator::Accounted, vec![32.0, 48.0]),
            (Allocator::Jemalloc, vec![16.0, 32.0]),
            (Allocator::JemallocHeaps, vec![16.4, 32.0]),
        ];
        let aligned = vec![
            (Allocator::System, vec![64.0]),
            (Allocator::Accounted, vec![64.0]),
        ];
        let figures = rss_figures(&sized, &aligned);
        let of = |name: &str| figures.iter().find(|(n, _, _)| n == name).map(|f| f.2);
        assert_eq!(of(RSS_ACCOUNTED_MEAN), Some(25.0));
        assert_eq!(of(RSS_ACCOUNTED_ALIGNED_WORST), Some(0.0));
        assert!((of(RSS_JEMALLOC_HEAPS_WORST).unwrap() - 2.5).abs() < 1e-9);
        assert_eq!(of(RSS_MIMALLOC_HEAPS_WORST), None, "no mimalloc figures");
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
