//! A thread stopped while it reads a group's hooks must not hide them from
//! the other threads: every refusal runs the reclaim hooks subscribed at
//! the time, whatever another refusal of the same group is doing.
//!
//! The stop is forced: a signal parks a thread that is refused over and
//! over (each refusal reads the group's hooks and runs them) at a random
//! point, and the test thread is refused meanwhile. Its refusal must have
//! run the reclaim hook. When the hooks sat behind a mutex that every
//! reader took, a reader parked inside it made the others give up after a
//! bounded wait and run no hook at all.

#![cfg(target_os = "linux")]

use splitcount::group::Hierarchy;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

mod common;
use common::parker;

#[test]
fn a_refusal_runs_the_hooks_while_another_reader_of_them_is_stopped() {
    const ROUNDS: u64 = 3000;
    parker::install();
    let h = Hierarchy::default();
    let g = h.root().child("g").unwrap();
    g.set_max(10).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    {
        let calls = calls.clone();
        g.on_reclaim(move |_, _| {
            calls.fetch_add(1, SeqCst);
            0
        });
    }
    let done = Arc::new(AtomicBool::new(false));
    let iterations = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let (g, done, iterations) = (g.clone(), done.clone(), iterations.clone());
        std::thread::spawn(move || {
            tx.send(parker::me()).unwrap();
            while !done.load(SeqCst) {
                assert!(g.charge(100).is_err());
                iterations.fetch_add(1, SeqCst);
            }
        })
    };
    let thread = rx.recv().unwrap();
    let mut missed = 0;
    for round in 0..ROUNDS {
        let start = iterations.load(SeqCst);
        while iterations.load(SeqCst) < start + 1 + round % 2 {
            std::hint::spin_loop();
        }
        parker::park(thread);
        // The worker is stopped: only this thread's refusal runs the hook
        // now.
        let before = calls.load(SeqCst);
        assert!(g.charge(100).is_err());
        if calls.load(SeqCst) == before {
            missed += 1;
        }
        parker::release();
    }
    done.store(true, SeqCst);
    worker.join().unwrap();
    assert_eq!(
        missed, 0,
        "{missed} of {ROUNDS} refusals ran no reclaim hook while the other reader was stopped"
    );
    assert_eq!(g.usage(), 0);
}
