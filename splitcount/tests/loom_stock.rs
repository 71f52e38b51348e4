//! Loom model: one thread stashes into and consumes from its CPU's stock
//! while another drains every CPU's stock. Whatever the interleaving, no
//! unit is lost or counted twice, and the slots are never accessed by two
//! threads at once (loom checks the `UnsafeCell`). Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom_stock`.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use splitcount::charge::{Consumed, Stock, UsageCounter};

#[test]
fn consume_and_refill_racing_a_drain_keep_usage_exact() {
    loom::model(|| {
        let stock = Arc::new(Stock::new(1, 2, 8).unwrap());
        let c = UsageCounter::root();
        let (s, counter) = (stock.clone(), c.clone());
        let user = thread::spawn(move || {
            // A miss: charge a batch of 8, keep 6, use 2.
            counter.charge(8);
            let _ = s.stash(0, &counter, 6).uncharge();
            let mut used = 2;
            // A hit, unless the drain got there first (or holds the lock).
            if s.consume(0, &counter, 3) == Consumed::Hit {
                used += 3;
            } else {
                counter.charge(3);
                used += 3;
            }
            // Give 1 back through the stock.
            let _ = s.stash(0, &counter, 1).uncharge();
            used - 1
        });
        stock.drain_all(&|_| true);
        let in_use = user.join().unwrap();
        stock.drain_all(&|_| true);
        assert_eq!(c.usage(), in_use);
        assert_eq!(c.events().underflow, 0);
    });
}
