//! Loom models of the per-CPU arena: adds on several CPUs racing a sum, and
//! the reuse of freed slots. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom_percpu`.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use splitcount::cpu::Machine;
use splitcount::raw::percpu::Arena;

#[test]
fn a_sum_racing_adds_sees_a_subset_and_the_final_sum_is_exact() {
    loom::model(|| {
        let arena = Arena::new(&Machine::simulated(2, 1).unwrap());
        let p = Arc::new(arena.alloc(1).unwrap());
        let q = p.clone();
        let t = thread::spawn(move || {
            q.add_on(1, 0, 5).unwrap();
            q.add_on(0, 0, 7).unwrap();
        });
        p.add_on(0, 0, 3).unwrap();
        let mid = p.sum(0).unwrap();
        assert!([3, 8, 10, 15].contains(&mid), "partial sum {mid}");
        t.join().unwrap();
        assert_eq!(p.sum(0), Some(15));
    });
}

#[test]
fn a_slot_freed_on_one_thread_is_zero_when_reallocated_on_another() {
    loom::model(|| {
        let arena = Arena::new(&Machine::simulated(2, 1).unwrap());
        let a = arena.alloc(1).unwrap();
        a.add_on(1, 0, 42).unwrap();
        let other = arena.clone();
        let t = thread::spawn(move || {
            let b = other.alloc(1).unwrap();
            assert_eq!(b.sum(0), Some(0));
            b.add_on(0, 0, 1).unwrap();
            b.sum(0).unwrap()
        });
        drop(a);
        let c = arena.alloc(1).unwrap();
        assert_eq!(c.sum(0), Some(0));
        assert_eq!(t.join().unwrap(), 1);
    });
}
