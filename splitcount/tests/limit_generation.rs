//! A charge preempted between its read of the limit and its compare-and-
//! swap, while `set_max` runs 256 times (a multiple of the usage word's
//! 8-bit generation), must not commit against the stale limit.
//!
//! The preemption is forced: a signal parks the charging thread at a
//! random point of its loop while the main thread sets the limit to the
//! current usage 256 times, then lets it go. Before the fix, about 1 round
//! in 150 committed a charge past `max`.

#![cfg(target_os = "linux")]

use splitcount::group::{Hierarchy, Reservation};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

mod common;
use common::parker;

#[test]
fn a_charge_preempted_through_256_limit_changes_never_commits_past_the_limit() {
    const ROUNDS: u64 = 3000;
    const SETTERS: usize = 256;
    parker::install();
    let h = Hierarchy::default();
    let g = h.root().child("g").unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let iterations = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let charger = {
        let (g, done, iterations, violations) = (
            g.clone(),
            done.clone(),
            iterations.clone(),
            violations.clone(),
        );
        std::thread::spawn(move || {
            tx.send(parker::me()).unwrap();
            // Exact: every grow charges the usage counter itself.
            let r = Reservation::new(&g);
            while !done.load(SeqCst) {
                if r.try_grow(10).is_ok() {
                    if g.usage() > g.max() {
                        violations.fetch_add(1, SeqCst);
                    }
                    r.shrink(10);
                }
                iterations.fetch_add(1, SeqCst);
            }
        })
    };
    let thread = rx.recv().unwrap();
    let wait_for = |n: u64| {
        let start = iterations.load(SeqCst);
        while iterations.load(SeqCst) < start + n {
            std::hint::spin_loop();
        }
    };
    for round in 0..ROUNDS {
        g.set_max(u64::MAX).unwrap();
        wait_for(1 + round % 3);
        parker::park(thread);
        // The limit becomes the usage now, 256 times over: a charge that
        // read the old limit and commits after this would pass it.
        let usage = g.usage();
        for _ in 0..SETTERS {
            g.set_max(usage).unwrap();
        }
        parker::release();
        wait_for(2);
    }
    done.store(true, SeqCst);
    charger.join().unwrap();
    assert_eq!(
        violations.load(SeqCst),
        0,
        "charges committed past a limit in force"
    );
    assert_eq!(g.usage(), 0, "every unit back");
}
