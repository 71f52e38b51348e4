//! A drain is exact even while other threads drain: once `drain_all` (or
//! `Hierarchy::drain_stocks`) returns, every unit that was stocked when it
//! began is off the usage counters — including units that another drain
//! took out of a slot first. A monitoring thread that drains and reads,
//! a refusal that drains and retries, and a test that drains and compares
//! with its live bytes all rely on this while some other thread drains.
//!
//! A drain takes a slot's units under the block's lock; they must reach
//! the counter before that lock is released, or a second drain that finds
//! the slot empty returns while they are still on their way (both the
//! stock of the group layer and the allocator's byte stock are drained
//! this way). These tests race a drainer against a thread that stocks,
//! drains and reads; before the units went off the counters under the
//! lock, they failed within a few thousand rounds.

#![cfg(not(loom))]

use splitcount::cpu::Machine;
use splitcount::group::{Hierarchy, HierarchyConfig};
use splitcount::raw::{Stock, UsageCounter};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

const ROUNDS: usize = 100_000;

/// Run `check` `ROUNDS` times while another thread runs `drain` in a loop.
fn while_another_thread_drains(drain: impl Fn() + Send + Sync, mut check: impl FnMut(usize)) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Relaxed) {
                drain();
            }
        });
        // Stop the drainer even if a check fails.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let _stop = Stop(&stop);
        for round in 0..ROUNDS {
            check(round);
        }
    });
}

#[test]
fn a_stock_drain_returns_units_another_drain_took_before_it_returns() {
    for stock in [
        Stock::<Arc<UsageCounter>>::new(2, 7, 64).unwrap(),
        Stock::<Arc<UsageCounter>>::for_host(Machine::host().cpus(), 7, 64).unwrap(),
    ] {
        let counter = UsageCounter::root();
        while_another_thread_drains(
            || {
                stock.drain_all(&|_| true);
            },
            |round| {
                let n = 1 + (round as u64 % 64);
                counter.charge(n);
                let _ = stock.stash(round % 2, &counter, n).uncharge();
                stock.drain_all(&|_| true);
                assert_eq!(
                    counter.usage(),
                    0,
                    "round {round}: units stocked before the drain are still charged after it \
                     (rseq mode: {})",
                    stock.uses_rseq()
                );
            },
        );
    }
}

#[test]
fn drain_stocks_then_usage_is_exact_while_another_thread_drains() {
    for machine in [Machine::simulated(2, 1).unwrap(), Machine::host()] {
        let h = Hierarchy::new(HierarchyConfig {
            machine,
            ..HierarchyConfig::default()
        })
        .unwrap();
        let g = h.root().child("monitored").unwrap();
        while_another_thread_drains(
            || {
                h.drain_stocks();
            },
            |round| {
                let n = 1 + (round as u64 % 200);
                g.charge(n).unwrap();
                g.uncharge(n); // stocked on this CPU
                h.drain_stocks();
                assert_eq!(g.usage(), 0, "round {round}");
                assert_eq!(h.root().usage(), 0, "round {round}");
            },
        );
    }
}
