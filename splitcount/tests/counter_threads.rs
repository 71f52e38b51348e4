//! Real threads: 8 threads (more than the cores) re-pinned across CPUs while
//! they add 10⁶ mixed-sign deltas each; after join, `precise()` is the exact
//! sum and the settled `approximate()` is inside the bound, for every design.

mod common;

use common::{online_cpu_ids, pin_to, unpin, Migrator, Rng};
use splitcount::counter::{Config, Design, SplitCounter};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

const THREADS: usize = 8;
const ADDS: usize = 1_000_000;

#[test]
fn no_update_is_lost_under_migration_for_any_design() {
    let online = Arc::new(online_cpu_ids());
    for design in Design::ALL {
        // A small batch so that carries and spills happen all the time.
        let batch = if design == Design::Atomic { 1 } else { 8 };
        let c: Arc<dyn SplitCounter> = Config::new(design).batch(batch).build().unwrap().into();
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (c, online) = (c.clone(), online.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(7 + t as u64);
                    let mut sum = 0i64;
                    for i in 0..ADDS {
                        if i % 10_000 == 0 {
                            pin_to(online[rng.below(online.len() as u64) as usize]);
                        }
                        let d = rng.delta(100);
                        c.add(d);
                        sum += d;
                    }
                    unpin(&online);
                    sum
                })
            })
            .collect();
        let want: i64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(c.precise(), want, "{design}");
        assert!(c.accuracy().admits(c.approximate(), want), "{design}");
    }
}

/// Writers that only add +1, moved between CPUs from outside, while another
/// thread reads `precise()` over and over: every add that returned before a
/// read is in it, so the reads never go down — also while other CPUs move
/// whole parts into the shared total (`Batched`, `PerNode`), which a reader
/// summing the total and then the parts used to miss.
#[test]
fn precise_never_goes_down_while_other_threads_add_and_spill() {
    for design in Design::ALL {
        let batch = if design == Design::Atomic { 1 } else { 4 };
        let c: Arc<dyn SplitCounter> = Config::new(design).batch(batch).build().unwrap().into();
        let stop = Arc::new(AtomicBool::new(false));
        let migrator = Arc::new(Migrator::start());
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let (c, stop, migrator) = (c.clone(), stop.clone(), migrator.clone());
                std::thread::spawn(move || {
                    let _moved = migrator.register();
                    let mut adds = 0i64;
                    while !stop.load(SeqCst) {
                        c.add(1);
                        adds += 1;
                    }
                    adds
                })
            })
            .collect();
        let (start, mut last, mut reads) = (Instant::now(), 0i64, 0u64);
        while start.elapsed() < Duration::from_millis(700) {
            let now = c.precise();
            assert!(
                now >= last,
                "{design}: precise went from {last} down to {now}"
            );
            last = now;
            reads += 1;
        }
        stop.store(true, SeqCst);
        let adds: i64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(c.precise(), adds, "{design}");
        println!("{design}: {reads} reads, {adds} adds");
    }
}

/// `set(v)` while writers add +1: adds that returned before `set` was called
/// are replaced by `v`, adds that started after it returned count on top of
/// it, and each add in between is one or the other. With `done` counting
/// returned adds: `total − done_after − writers ≤ final − v ≤ total −
/// done_before`.
#[test]
fn set_replaces_what_returned_before_it_and_keeps_what_came_after() {
    const WRITERS: i64 = 2;
    for design in Design::ALL {
        let batch = if design == Design::Atomic { 1 } else { 4 };
        for round in 0..40 {
            let c: Arc<dyn SplitCounter> = Config::new(design).batch(batch).build().unwrap().into();
            let done = Arc::new(AtomicI64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let writers: Vec<_> = (0..WRITERS)
                .map(|_| {
                    let (c, done, stop) = (c.clone(), done.clone(), stop.clone());
                    std::thread::spawn(move || {
                        while !stop.load(SeqCst) {
                            c.add(1);
                            done.fetch_add(1, SeqCst);
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(2));
            let before = done.load(SeqCst);
            c.set(1_000_000);
            let after = done.load(SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            stop.store(true, SeqCst);
            for w in writers {
                w.join().unwrap();
            }
            let total = done.load(SeqCst);
            let kept = c.precise() - 1_000_000;
            assert!(
                total - after - WRITERS <= kept && kept <= total - before,
                "{design}, round {round}: {kept} adds kept of {total} (set between {before} and {after})"
            );
        }
    }
}
