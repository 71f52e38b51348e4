//! `bench alloc`: what accounting a program's heap by group costs, as a
//! ratio of `Accounted<System>` to `System` on the same workloads.
//!
//! Both allocators are measured as a program meets them — as the process's
//! global allocator, reached through `std::alloc` by a `Vec`, a `String` or
//! serde_json — so neither is inlined into a loop where the other is not.
//! A process has one global allocator, so each side runs in a worker
//! process of its own ([`worker`]), and the two are driven slice by slice in
//! the same interleaved rounds, like any two cases of a suite. The
//! workloads are in [`workloads`]; case names are
//! `{workload}-{allocator}`, e.g. `small-accounted`, whose baseline is
//! `small-system`.

pub mod worker;
pub mod workloads;

use super::{Bench, Entry};
use crate::alloc_switch::Allocator;
use crate::timing::{measure, Plan};
use std::cell::RefCell;
use std::path::Path;
use worker::{Request, Worker};
pub use workloads::Workload;

/// The allocator every case is divided by.
pub const BASELINE: Allocator = Allocator::System;

/// `{workload}-{allocator}`.
pub fn case(workload: Workload, allocator: Allocator) -> String {
    format!("{}-{}", workload.name(), allocator.name())
}

/// The baseline of a case: the same workload on the system allocator.
pub fn baseline_of(case: &str) -> Option<String> {
    let workload = case.rsplit_once('-')?.0;
    Some(format!("{workload}-{}", BASELINE.name()))
}

/// Measure every workload on both allocators; the rings at each of
/// `threads`, `cross-thread` at 2 and `json` at 1. `exe` is the lab binary
/// (its `alloc-worker` command runs the workers).
pub fn run(exe: &Path, threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    let workers =
        [Allocator::System, Allocator::Accounted].map(|a| Worker::start(exe, a).map(RefCell::new));
    let [system, accounted] = workers;
    let (system, accounted) = (system?, accounted?);
    let mut entries = Vec::new();
    for workload in Workload::ALL {
        for t in workload.thread_counts(threads) {
            for (allocator, worker) in [
                (Allocator::System, &system),
                (Allocator::Accounted, &accounted),
            ] {
                entries.push(Entry::from_fn(case(workload, allocator), t, move |spec| {
                    worker.borrow_mut().run(Request {
                        workload,
                        threads: t,
                        spec,
                    })
                }));
            }
        }
    }
    let measured = measure("alloc", plan, entries)?;
    Ok(Bench::new(measured, baseline_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_case_is_compared_with_its_workload_on_the_system_allocator() {
        assert_eq!(
            case(Workload::CrossThread, Allocator::Accounted),
            "cross-thread-accounted"
        );
        assert_eq!(
            baseline_of("cross-thread-accounted").unwrap(),
            "cross-thread-system"
        );
        assert_eq!(baseline_of("small-system").unwrap(), "small-system");
    }
}
