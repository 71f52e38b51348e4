//! `bench percpu`: the cost of one add to this CPU's copy of a per-CPU slot,
//! as an rseq critical section and as a relaxed `fetch_add`, against a
//! single shared atomic and a plain thread-local add (the floor).

use super::{measure, set_ratios, Record};
use splitcount::cpu::Machine;
use splitcount::percpu::{AddPath, Arena, ArenaOptions};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// The baseline every case is divided by.
pub const BASELINE: &str = "atomic-add";

fn arena(add_path: AddPath) -> Arena {
    Arena::with_options(
        &Machine::host(),
        &ArenaOptions {
            add_path,
            ..Default::default()
        },
    )
    .expect("default regions are valid")
}

/// Measure every case at each thread count. `rseq-add` is left out where
/// rseq is unavailable (its arena would silently use the atomic path).
pub fn run(threads: &[usize], duration: Duration) -> Vec<Record> {
    thread_local!(static LOCAL: Cell<i64> = const { Cell::new(0) });
    let rseq = arena(AddPath::Rseq);
    let atomic = arena(AddPath::Atomic);
    let rseq_slot = rseq.alloc(1).expect("one slot");
    let atomic_slot = atomic.alloc(1).expect("one slot");
    let shared = crossbeam_utils::CachePadded::new(AtomicI64::new(0));
    let mut records = Vec::new();
    for &t in threads {
        if rseq.add_path() == AddPath::Rseq {
            records.push(measure("percpu", "rseq-add", t, duration, |_| {
                let s = &rseq_slot;
                move || {
                    let _ = black_box(s.add(0, black_box(1)));
                }
            }));
        }
        records.push(measure("percpu", BASELINE, t, duration, |_| {
            let s = &atomic_slot;
            move || {
                let _ = black_box(s.add(0, black_box(1)));
            }
        }));
        records.push(measure("percpu", "shared-atomic", t, duration, |_| {
            let shared = &shared;
            move || {
                shared.fetch_add(black_box(1), Ordering::Relaxed);
            }
        }));
        records.push(measure("percpu", "thread-local", t, duration, |_| {
            || LOCAL.with(|l| l.set(l.get() + black_box(1)))
        }));
    }
    set_ratios(&mut records, BASELINE);
    records
}
