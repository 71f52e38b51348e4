//! `bench counters`: add throughput of every design, the thread-local floor,
//! a single shared atomic, and two peers that are not splitcount designs: a
//! LongAdder-style striped counter ([`super::striped`]) and the crates.io
//! crate `fast-counter` (cells indexed by a per-thread id), at each thread
//! count. Every case is measured in the same run, so the ratios to the
//! shared atomic compare like with like.

use super::striped::Striped;
use super::{measure, set_ratios, Record};
use splitcount::counter::{Atomic, Batched, Config, Design, PerNode, SplitCounter, Tree};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// The baseline every case is divided by.
pub const BASELINE: &str = "shared-atomic";

/// The cases, in table order.
pub const CASES: [&str; 8] = [
    "thread-local",
    BASELINE,
    "atomic",
    "batched",
    "pernode",
    "tree",
    "striped",
    "fast-counter",
];

fn bench_counter<C: SplitCounter>(c: &C, threads: usize, duration: Duration) -> Record {
    measure("counters", c.design().name(), threads, duration, |_| {
        move || c.add(black_box(1))
    })
}

/// Measure every case at each thread count (designs with their defaults on
/// the host).
pub fn run(threads: &[usize], duration: Duration) -> Vec<Record> {
    thread_local!(static LOCAL: Cell<i64> = const { Cell::new(0) });
    let mut records = Vec::new();
    for &t in threads {
        records.push(measure("counters", "thread-local", t, duration, |_| {
            || LOCAL.with(|l| l.set(l.get() + black_box(1)))
        }));
        let shared = crossbeam_utils::CachePadded::new(AtomicI64::new(0));
        records.push(measure("counters", BASELINE, t, duration, |_| {
            let shared = &shared;
            move || {
                shared.fetch_add(black_box(1), Ordering::Relaxed);
            }
        }));
        let cfg = Config::new;
        records.push(bench_counter(
            &Atomic::with_config(&cfg(Design::Atomic)).expect("host"),
            t,
            duration,
        ));
        records.push(bench_counter(
            &Batched::with_config(&cfg(Design::Batched)).expect("host"),
            t,
            duration,
        ));
        records.push(bench_counter(
            &PerNode::with_config(&cfg(Design::PerNode)).expect("host"),
            t,
            duration,
        ));
        records.push(bench_counter(
            &Tree::with_config(&cfg(Design::Tree)).expect("host"),
            t,
            duration,
        ));
        let striped = Striped::new();
        records.push(measure("counters", "striped", t, duration, |_| {
            let striped = &striped;
            move || striped.add(black_box(1))
        }));
        // Sized as its documentation advises: at least one cell per thread
        // (it picks the cell from a per-thread id, not from the CPU).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let peer = fast_counter::ConcurrentCounter::new(t.max(cores));
        records.push(measure("counters", "fast-counter", t, duration, |_| {
            let peer = &peer;
            move || peer.add(black_box(1))
        }));
    }
    set_ratios(&mut records, BASELINE);
    records
}
