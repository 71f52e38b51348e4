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

pub mod workloads;

use super::worker::{self, Request, Worker};
use super::{Bench, Entry};
use crate::alloc_switch::Allocator;
use crate::timing::{measure, Plan};
use std::cell::RefCell;
use std::path::Path;
pub use workloads::Workload;

/// The allocator every case is divided by (but the footprint cases).
pub const BASELINE: Allocator = Allocator::System;

/// The allocators measured, each in a worker process of its own: glibc's,
/// jemalloc and mimalloc, each alone and under `Accounted` charging
/// requested sizes and footprints.
pub const ALLOCATORS: [Allocator; 9] = Allocator::ALL;

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
    let workers = ALLOCATORS
        .iter()
        .map(|&a| Ok((a, RefCell::new(Worker::start(exe, a)?))))
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
            let bytes = w.borrow().hello.as_ref().and_then(|h| h.box_bytes);
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
    Ok(bench)
}

#[cfg(test)]
mod tests {
    use super::*;

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
