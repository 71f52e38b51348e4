//! `bench percpu`: the cost of one add to this CPU's copy of a per-CPU slot
//! through the library ([`PerCpu::add`](splitcount::raw::percpu::PerCpu::add)),
//! as an rseq critical section (`rseq-add`) and as a relaxed `fetch_add`
//! (`atomic-add`, the baseline), against the bare rseq add written in the
//! lab (`bare-rseq-add`, [`super::bare_rseq`]), a single shared atomic and a
//! plain thread-local add (the floor).
//!
//! Every case is called the same way: its delta goes through `black_box`,
//! its result is dropped.

use super::bare_rseq::BareRseq;
use super::counters::BARE_RSEQ;
use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use splitcount::cpu::Machine;
use splitcount::raw::percpu::{AddPath, Arena, ArenaOptions, PerCpu};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};

/// The baseline every case is divided by.
pub const BASELINE: &str = "atomic-add";

/// The library's rseq path.
pub const RSEQ_ADD: &str = "rseq-add";

/// The cases, in table order (`rseq-add` and `bare-rseq-add` only where
/// rseq is available).
pub const CASES: [&str; 5] = [
    RSEQ_ADD,
    BASELINE,
    BARE_RSEQ,
    "shared-atomic",
    "thread-local",
];

fn arena(add_path: AddPath) -> Result<Arena, String> {
    Arena::with_options(
        &Machine::host(),
        &ArenaOptions {
            add_path,
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())
}

fn slot_add<'a>(case: &str, slot: &'a PerCpu, threads: usize) -> Entry<'a> {
    Entry::new(case, threads, move |_| {
        move || {
            let _ = slot.add(0, black_box(1));
        }
    })
}

/// Measure every case at each thread count. `rseq-add` is left out where
/// rseq is unavailable (its arena would silently use the atomic path), and
/// `bare-rseq-add` where glibc did not register rseq.
pub fn run(threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    thread_local!(static LOCAL: Cell<i64> = const { Cell::new(0) });
    let rseq = arena(AddPath::Rseq)?;
    let atomic = arena(AddPath::Atomic)?;
    let rseq_slot = rseq.alloc(1).map_err(|e| e.to_string())?;
    let atomic_slot = atomic.alloc(1).map_err(|e| e.to_string())?;
    let shared = crossbeam_utils::CachePadded::new(AtomicI64::new(0));
    let bare = BareRseq::new();
    let mut entries = Vec::new();
    for &t in threads {
        if rseq.add_path() == AddPath::Rseq {
            entries.push(slot_add(RSEQ_ADD, &rseq_slot, t));
        }
        entries.push(slot_add(BASELINE, &atomic_slot, t));
        if let Some(bare) = &bare {
            entries.push(Entry::new(BARE_RSEQ, t, move |_| {
                move || bare.add(black_box(1))
            }));
        }
        let shared = &shared;
        entries.push(Entry::new("shared-atomic", t, move |_| {
            move || {
                shared.fetch_add(black_box(1), Ordering::Relaxed);
            }
        }));
        entries.push(Entry::new("thread-local", t, |_| {
            || LOCAL.with(|l| l.set(l.get() + black_box(1)))
        }));
    }
    let measured = measure("percpu", plan, entries)?;
    Ok(Bench::new(measured, |_| Some(BASELINE.to_owned())))
}
