//! Loom model: two concurrent `Tree` adds whose carries climb through a
//! shared intermediate item, racing a `precise()` read. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom_counter`.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use splitcount::counter::{Config, Design, SplitCounter, Tree};
use splitcount::cpu::Machine;

#[test]
fn concurrent_tree_adds_with_carries_lose_nothing() {
    loom::model(|| {
        // 4 CPUs, binary: slots (B₀ = 2) → 2 items (B₁ = 4) → root.
        let m = Machine::simulated(4, 1).unwrap();
        let t =
            Arc::new(Tree::with_config(&Config::new(Design::Tree).machine(&m).batch(2)).unwrap());
        t.add_on(0, 1).unwrap(); // slot 0 one below its batch
        let a = t.clone();
        let th = thread::spawn(move || {
            a.add_on(0, 1).unwrap(); // carry 2 into item 0
        });
        let b = t.clone();
        let th2 = thread::spawn(move || {
            b.add_on(1, 2).unwrap(); // carry 2 into item 0
        });
        let mid = t.precise();
        assert!([1, 2, 3, 4].contains(&mid), "precise {mid}");
        th.join().unwrap();
        th2.join().unwrap();
        assert_eq!(t.precise(), 4);
        // Item 0 reached 4 = B₁ exactly once, whatever the order: the root
        // holds 4 and nothing is held back.
        assert_eq!(t.approximate(), 4);
    });
}

#[test]
fn concurrent_tree_adds_of_opposite_sign_settle_inside_the_bound() {
    loom::model(|| {
        let m = Machine::simulated(2, 1).unwrap();
        let t =
            Arc::new(Tree::with_config(&Config::new(Design::Tree).machine(&m).batch(2)).unwrap());
        let a = t.clone();
        let th = thread::spawn(move || {
            a.add_on(0, 3).unwrap();
            a.add_on(0, -1).unwrap();
        });
        t.add_on(1, -3).unwrap();
        th.join().unwrap();
        assert_eq!(t.precise(), -1);
        assert!(t.accuracy().admits(t.approximate(), -1));
    });
}
