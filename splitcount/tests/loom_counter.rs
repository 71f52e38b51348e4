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

/// A `Batched` spill (the slot taken, then added to the total) racing a
/// `precise()` reader: an add that returned before the read — signalled
/// through a flag — is always counted, once; the reads never go down; and
/// `set` replaces exactly what the precise sum saw. Without the spill's
/// announcement a reader can sum the total before the spill's add and the
/// slot after its take, and miss the add.
#[test]
fn a_batched_spill_racing_precise_is_seen_once() {
    use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use splitcount::counter::Batched;
    loom::model(|| {
        // batch 2: the second +1 on CPU 0 spills the slot into the total.
        let m = Machine::simulated(2, 1).unwrap();
        let c = Arc::new(
            Batched::with_config(&Config::new(Design::Batched).machine(&m).batch(2)).unwrap(),
        );
        c.add_on(0, 1).unwrap();
        let returned = Arc::new(AtomicBool::new(false));
        let adder = {
            let (c, returned) = (c.clone(), returned.clone());
            thread::spawn(move || {
                c.add_on(0, 1).unwrap(); // spills 2 into the total
                returned.store(true, SeqCst);
                c.add_on(1, 1).unwrap();
            })
        };
        let seen_return = returned.load(SeqCst);
        let first = c.precise();
        if seen_return {
            assert!(first >= 2, "an add that returned was missed: {first}");
        }
        assert!((1..=3).contains(&first), "precise {first}");
        let second = c.precise();
        assert!(second >= first, "precise went down: {first} then {second}");
        adder.join().unwrap();
        assert_eq!(c.precise(), 3);
        assert_eq!(c.approximate(), 2, "the spill landed in the total");
    });
}
