//! The stock's rseq hit paths against drains from other CPUs: workers
//! charge and uncharge one group (its slot on every CPU), moved between
//! CPUs from another thread, while a drainer empties every CPU's stock
//! without pause. Each drained block is locked and its CPU fenced
//! (`membarrier`), so no sequence that saw the slot before the drain
//! commits after it: at the end the usage is exactly what the workers
//! hold (zero), and no uncharge ever found too little.

#![cfg(all(not(loom), target_os = "linux", target_arch = "x86_64"))]

mod common;

use common::{Migrator, Rng};
use splitcount::group::{Hierarchy, HierarchyConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Enough moves that sequences are cut everywhere; bounded in time.
const MOVES: u64 = 3_000;
const LIMIT: Duration = Duration::from_secs(8);

#[test]
fn charges_racing_drains_of_every_cpu_stay_exact() {
    // A small batch and two slots: hits, misses, stashes and evictions.
    let h = Hierarchy::new(HierarchyConfig::default().stock_batch(16).stock_slots(2)).unwrap();
    let parent = h.root().child("parent").unwrap();
    let g = parent.child("g").unwrap();
    let others: Vec<_> = (0..3)
        .map(|i| parent.child(&format!("other-{i}")).unwrap())
        .collect();
    let migrator = Migrator::start();
    let done = AtomicBool::new(false);
    let drains = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Relaxed) {
                h.drain_stocks();
                drains.fetch_add(1, Relaxed);
            }
        });
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let (g, others, migrator) = (&g, &others, &migrator);
                s.spawn(move || {
                    let _moved = migrator.register();
                    let mut rng = Rng::new(t + 1);
                    let mut held = 0u64;
                    while migrator.keep_going(MOVES, start, LIMIT) {
                        for _ in 0..64 {
                            let n = 1 + rng.below(9);
                            if held < 200 && rng.below(2) == 0 {
                                g.charge(n).unwrap();
                                held += n;
                            } else if held >= n {
                                g.uncharge(n);
                                held -= n;
                            }
                            // Another key now and then: the slots turn over.
                            if rng.below(16) == 0 {
                                let o = &others[rng.below(3) as usize];
                                o.charge(1).unwrap();
                                o.uncharge(1);
                            }
                        }
                    }
                    g.uncharge(held);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Relaxed);
    });
    let moves = migrator.stop();
    h.drain_stocks();
    assert_eq!(g.events().underflow, 0, "an uncharge found too little");
    assert_eq!(g.usage(), 0, "units were lost or counted twice");
    assert_eq!(parent.usage(), 0);
    assert!(moves > 100, "only {moves} moves");
    assert!(
        drains.load(Relaxed) > 100,
        "only {} drains",
        drains.load(Relaxed)
    );
}
