//! `bench counters`: add throughput of every design, the thread-local floor,
//! a single shared atomic, a bare rseq per-CPU add ([`super::bare_rseq`]),
//! and two peers that are not splitcount designs: a LongAdder-style striped
//! counter ([`super::striped`]) and the crates.io crate `fast-counter`
//! (cells indexed by a per-thread id), at each thread count.
//!
//! Every case is called the same way: its delta goes through `black_box`,
//! its result (if any) is dropped.

use super::bare_rseq::BareRseq;
use super::striped::Striped;
use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use splitcount::counter::{Atomic, Batched, Config, Design, PerNode, SplitCounter, Tree};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};

/// The baseline every case is divided by.
pub const BASELINE: &str = "shared-atomic";

/// The bare rseq add: the floor of a per-CPU add.
pub const BARE_RSEQ: &str = "bare-rseq-add";

/// The cases, in table order (`bare-rseq-add` only where glibc registered
/// rseq).
pub const CASES: [&str; 9] = [
    "thread-local",
    BASELINE,
    BARE_RSEQ,
    "atomic",
    "batched",
    "pernode",
    "tree",
    "striped",
    "fast-counter",
];

fn counter<'a, C: SplitCounter>(c: &'a C, threads: usize) -> Entry<'a> {
    Entry::new(c.design().name(), threads, move |_| {
        move || c.add(black_box(1))
    })
}

/// Measure every case at each thread count (designs with their defaults on
/// the host).
pub fn run(threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    thread_local!(static LOCAL: Cell<i64> = const { Cell::new(0) });
    let cfg = Config::new;
    let host = |e: splitcount::counter::ConfigError| e.to_string();
    let atomic = Atomic::with_config(&cfg(Design::Atomic)).map_err(host)?;
    let batched = Batched::with_config(&cfg(Design::Batched)).map_err(host)?;
    let pernode = PerNode::with_config(&cfg(Design::PerNode)).map_err(host)?;
    let tree = Tree::with_config(&cfg(Design::Tree)).map_err(host)?;
    let shared = crossbeam_utils::CachePadded::new(AtomicI64::new(0));
    let bare = BareRseq::new();
    let striped = Striped::new();
    // Sized as its documentation advises: at least one cell per thread (it
    // picks the cell from a per-thread id, not from the CPU).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let peers: Vec<fast_counter::ConcurrentCounter> = threads
        .iter()
        .map(|&t| fast_counter::ConcurrentCounter::new(t.max(cores)))
        .collect();

    let mut entries = Vec::new();
    for (&t, peer) in threads.iter().zip(&peers) {
        entries.push(Entry::new("thread-local", t, |_| {
            || LOCAL.with(|l| l.set(l.get() + black_box(1)))
        }));
        let shared = &shared;
        entries.push(Entry::new(BASELINE, t, move |_| {
            move || {
                shared.fetch_add(black_box(1), Ordering::Relaxed);
            }
        }));
        if let Some(bare) = &bare {
            entries.push(Entry::new(BARE_RSEQ, t, move |_| {
                move || bare.add(black_box(1))
            }));
        }
        entries.push(counter(&atomic, t));
        entries.push(counter(&batched, t));
        entries.push(counter(&pernode, t));
        entries.push(counter(&tree, t));
        let striped = &striped;
        entries.push(Entry::new("striped", t, move |_| {
            move || striped.add(black_box(1))
        }));
        entries.push(Entry::new("fast-counter", t, move |_| {
            move || peer.add(black_box(1))
        }));
    }
    let measured = measure("counters", plan, entries)?;
    Ok(Bench::new(measured, |_| Some(BASELINE.to_owned())))
}
