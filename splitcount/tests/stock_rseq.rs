//! The stock's rseq hit paths on real hardware.
//!
//! Against drains from other CPUs: workers charge and uncharge one group
//! (its slot on every CPU), moved between CPUs from another thread, while a
//! drainer empties every CPU's stock without pause. Each drained block is
//! locked and its CPU fenced (`membarrier`), so no sequence that saw the
//! slot before the drain commits after it: at the end the usage is exactly
//! what the workers hold (zero), and no uncharge ever found too little.
//!
//! Alone: a hit that takes a slot's last unit of a key that must not stay
//! behind empty leaves no slot holding that key.
//!
//! Both hold where the host has no rseq too (the stock then takes its lock
//! on every operation; `GLIBC_TUNABLES=glibc.pthread.rseq=0`).

#![cfg(all(not(loom), target_os = "linux", target_arch = "x86_64"))]

mod common;

use common::{online_cpu_ids, pin_to, unpin, Migrator, Rng};
use splitcount::cpu::Topology;
use splitcount::group::{Group, Hierarchy, HierarchyConfig};
use splitcount::raw::{Consumed, Stock, StockKey, UsageCounter};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Enough moves that sequences are cut everywhere; bounded in time.
const MOVES: u64 = 3_000;
const LIMIT: Duration = Duration::from_secs(8);

/// Three workers charge and uncharge `g` (and now and then one of
/// `others`, so slots turn over) while moved between CPUs from another
/// thread and a drainer empties every CPU's stock without pause; `check`
/// runs after every drain. At the end `g` and every other key are exactly
/// at 0, with no underflow.
fn race_drains(h: &Hierarchy, g: &Group, others: &[Group], check: impl Fn() + Sync) {
    let migrator = Migrator::start();
    let done = AtomicBool::new(false);
    let drains = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Relaxed) {
                h.drain_stocks();
                check();
                drains.fetch_add(1, Relaxed);
            }
        });
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let migrator = &migrator;
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
                                let o = &others[rng.below(others.len() as u64) as usize];
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
    for o in others {
        assert_eq!((o.usage(), o.events().underflow), (0, 0), "{}", o.path());
    }
    assert!(moves > 100, "only {moves} moves");
    assert!(
        drains.load(Relaxed) > 100,
        "only {} drains",
        drains.load(Relaxed)
    );
}

#[test]
fn charges_racing_drains_of_every_cpu_stay_exact() {
    // A small batch and two slots: hits, misses, stashes and evictions.
    let h = Hierarchy::new(HierarchyConfig::default().stock_batch(16).stock_slots(2)).unwrap();
    let parent = h.root().child("parent").unwrap();
    let g = parent.child("g").unwrap();
    let others: Vec<_> = (0..3)
        .map(|i| parent.child(&format!("other-{i}")).unwrap())
        .collect();
    race_drains(&h, &g, &others, || {});
    assert_eq!(parent.usage(), 0);
}

#[test]
fn many_tenants_racing_drains_stay_exact_and_within_the_budget() {
    // 63 slots (keys in hashed windows) and a budget of 40 units shared by
    // 41 keys: quotas are granted, taken back and refilled by shares while
    // the sequences run, and no CPU ever stocks more than the budget.
    let h = Hierarchy::new(HierarchyConfig::default().stock_batch(16).stock_budget(40)).unwrap();
    let cpus = h.config().machine.cpus();
    let g = h.root().child("g").unwrap();
    let others: Vec<_> = (0..40)
        .map(|i| h.root().child(&format!("other-{i}")).unwrap())
        .collect();
    race_drains(&h, &g, &others, || {
        for cpu in 0..cpus {
            let stocked = h.stocked_on_cpu(cpu);
            assert!(stocked <= 40, "cpu {cpu} stocks {stocked} units");
        }
    });
    assert_eq!(h.root().usage(), 0);
}

/// A key that must not stay in a slot without units (`KEEP_EMPTY = false`,
/// as the allocator's accounts, which their units keep alive): a strong
/// reference to a usage counter, so a slot that keeps the key shows in the
/// counter's reference count.
#[derive(Clone)]
struct LetGoWhenEmpty(Arc<UsageCounter>);

#[allow(unsafe_code)]
impl StockKey for LetGoWhenEmpty {
    fn counter(&self) -> &UsageCounter {
        &self.0
    }
    fn return_units(self, units: u64) {
        self.0.uncharge(units);
    }
    const KEEP_EMPTY: bool = false;
    fn as_raw(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }
    fn into_raw(self) -> usize {
        Arc::into_raw(self.0) as usize
    }
    unsafe fn from_raw(raw: usize) -> Self {
        // SAFETY: `raw` came from `into_raw` and is taken back once.
        LetGoWhenEmpty(unsafe { Arc::from_raw(raw as *const UsageCounter) })
    }
}

/// No emptied slot keeps its key. For a key whose validity rests on the
/// units it stands for (an allocator account: freed once its last unit
/// is uncharged), the consume that takes a slot's last unit must give the
/// key up — a key left behind would be dereferenced by the next drain
/// after its account was freed. An rseq hit cannot drop a key (it commits
/// one unit count), so it must leave such a slot to the locked path.
/// Checked by what holds the key, not by where it sits: the counter's
/// `stock_slots` and the key's reference count. Holds with or without
/// rseq (`Stock::uses_rseq`); the thread is pinned so that both consumes
/// find the stash's CPU.
#[test]
fn a_consume_that_empties_a_slot_gives_up_a_key_that_must_not_stay_empty() {
    let online = online_cpu_ids();
    assert!(
        online.iter().any(|&cpu| pin_to(cpu)),
        "cannot pin to any of {online:?}"
    );
    let stock = Stock::<LetGoWhenEmpty>::for_host(Topology::host().cpus(), 2, 16).unwrap();
    eprintln!("uses_rseq = {}", stock.uses_rseq());
    let c = UsageCounter::root();
    let key = LetGoWhenEmpty(c.clone());
    c.charge(16);
    assert_eq!(stock.stash(0, &key, 16).uncharge(), 0);
    assert_eq!(stock.consume(0, &key, 10), Consumed::Hit);
    assert_eq!(c.stock_slots(), 1, "6 units left: the slot keeps its key");
    assert_eq!(stock.consume(0, &key, 6), Consumed::Hit);
    assert_eq!(stock.stocked(&c), 0);
    assert_eq!(c.stock_slots(), 0, "an emptied slot kept its key");
    assert_eq!(
        Arc::strong_count(&c),
        2,
        "the stock still holds the key (the caller's two handles aside)"
    );
    assert_eq!(c.usage(), 16, "every unit is the caller's");
    unpin(&online);
}
