//! Limits under real concurrency: races that a model checker cannot show
//! (loom 0.7 lets `SeqCst` loads and stores reorder like `Relaxed` ones, so
//! Dekker-style arguments need real hardware), run many times on real
//! threads. Each test names the defect it guards against.

mod common;

use common::{Migrator, Rng, SpinBarrier};
use splitcount::charge::UNLIMITED;
use splitcount::group::Hierarchy;
use splitcount::raw::UsageCounter;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Spin a random short while, so that the two sides of a race start in
/// every order and at every offset over the rounds.
fn jitter(rng: &mut Rng) {
    for _ in 0..rng.below(48) {
        std::hint::spin_loop();
    }
}

/// The races spin a thread per CPU: they take turns, so that one does not
/// starve another of its rounds.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long each race runs at most (they stop earlier once they have run
/// their rounds).
const LIMIT: Duration = Duration::from_secs(3);

/// Two setters refused at once (usage 60; limits 50 and 30) leave the limit
/// they found. Unserialized, a setter's restore could put back the value the
/// other one had just installed, leaving a refused limit in force.
#[test]
fn concurrent_refused_set_max_calls_leave_the_previous_limit() {
    let _turn = one_at_a_time();
    let c = UsageCounter::root();
    c.charge(60);
    c.set_max(100).unwrap();
    let barrier = Arc::new(SpinBarrier::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let other = {
        let (c, barrier, stop) = (c.clone(), barrier.clone(), stop.clone());
        std::thread::spawn(move || loop {
            barrier.wait();
            if stop.load(Relaxed) {
                return;
            }
            assert!(c.set_max(30).is_err(), "usage 60 is above 30");
            barrier.wait();
        })
    };
    let start = Instant::now();
    let mut rounds = 0u64;
    while rounds < 200_000 && start.elapsed() < LIMIT {
        barrier.wait();
        assert!(c.set_max(50).is_err(), "usage 60 is above 50");
        barrier.wait();
        assert_eq!(c.max(), 100, "round {rounds}: a refused limit is in force");
        rounds += 1;
    }
    stop.store(true, Relaxed);
    barrier.wait();
    other.join().unwrap();
    println!("{rounds} rounds");
}

/// A limit that `set_max` accepted holds once the chargers racing it are
/// done: a charger that read the old (higher) limit before the swap and
/// tries to add after the setter read the usage must find the usage word's
/// generation bumped (its compare-and-swap fails) and read the limit again.
/// Without that check the usage stays above an accepted limit.
#[test]
fn a_limit_set_while_charges_race_it_holds_when_they_are_done() {
    let _turn = one_at_a_time();
    let c = UsageCounter::root();
    let barrier = Arc::new(SpinBarrier::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let charged = Arc::new(AtomicU64::new(0));
    let charger = {
        let (c, barrier, stop, charged) =
            (c.clone(), barrier.clone(), stop.clone(), charged.clone());
        std::thread::spawn(move || {
            let mut rng = Rng::new(3);
            loop {
                barrier.wait();
                if stop.load(Relaxed) {
                    return;
                }
                jitter(&mut rng);
                if c.try_charge(10).is_ok() {
                    charged.store(10, Relaxed);
                }
                barrier.wait();
            }
        })
    };
    let start = Instant::now();
    let (mut rounds, mut accepted) = (0u64, 0u64);
    let mut rng = Rng::new(4);
    while rounds < 300_000 && start.elapsed() < LIMIT {
        barrier.wait();
        jitter(&mut rng);
        let set = c.set_max(5);
        barrier.wait();
        if set.is_ok() {
            accepted += 1;
            assert!(
                c.usage() <= 5,
                "round {rounds}: usage {} above the accepted limit 5",
                c.usage()
            );
        }
        c.uncharge(charged.swap(0, Relaxed));
        c.set_max(UNLIMITED).unwrap();
        rounds += 1;
    }
    stop.store(true, Relaxed);
    barrier.wait();
    charger.join().unwrap();
    println!("{rounds} rounds, {accepted} limits accepted");
    assert!(accepted > 0);
}

/// A charge rolled back (here: taken by the parent, then refused by the
/// child's limit of 0 — charges go from the root down) while an
/// over-uncharge of the parent lands between its add and its rollback: the
/// rollback must clamp at zero like `uncharge` does, not wrap the usage to
/// about 2⁶⁴ — after which every limited charge would be refused.
#[test]
fn a_rollback_racing_an_over_uncharge_never_wraps_the_usage() {
    let _turn = one_at_a_time();
    let parent = UsageCounter::root();
    let child = UsageCounter::child_of(&parent);
    child.set_max(0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let uncharger = {
        let (parent, stop) = (parent.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                parent.uncharge(10);
            }
        })
    };
    let start = Instant::now();
    let mut tries = 0u64;
    while tries < 50_000_000 && start.elapsed() < LIMIT {
        assert!(
            child.try_charge(10).is_err(),
            "the child refuses everything"
        );
        let u = parent.usage();
        assert!(u <= 10, "after {tries} tries the usage wrapped to {u}");
        tries += 1;
    }
    stop.store(true, Relaxed);
    uncharger.join().unwrap();
    assert_eq!((child.usage(), parent.usage()), (0, 0));
    println!(
        "{tries} tries, {} underflow events",
        parent.events().underflow
    );
}

/// Charges that fit once the stocks are drained are never refused, even
/// while another thread keeps draining (tightening the limit of an
/// unrelated group): a charge path that gave up draining because another
/// drain was running would refuse them. Several charging threads, each in
/// its own group, with the host's stocks.
#[test]
fn fitting_charges_are_not_refused_while_an_unrelated_drain_runs() {
    let _turn = one_at_a_time();
    let h = Hierarchy::default();
    let unrelated = h.root().child("unrelated").unwrap();
    unrelated.charge(10).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let tightener = {
        let (unrelated, stop) = (unrelated.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut tries = 0u64;
            while !stop.load(Relaxed) {
                // Usage 10 > 5: always drains, then refuses.
                assert!(unrelated.set_max(5).is_err());
                tries += 1;
            }
            tries
        })
    };
    let limit = 1_000;
    let refused: u64 = std::thread::scope(|s| {
        let threads: Vec<_> = (0..3u64)
            .map(|i| {
                let g = h.root().child(&format!("t{i}")).unwrap();
                g.set_max(limit).unwrap();
                s.spawn(move || {
                    let mut rng = Rng::new(i + 5);
                    let (mut refused, start) = (0u64, Instant::now());
                    for _ in 0..2_000 {
                        if start.elapsed() > LIMIT {
                            break;
                        }
                        // Small charges fill the stocks with this group's
                        // units; then one that fits only once they are
                        // drained.
                        let mut used = 0;
                        while used + 64 <= limit - 100 {
                            let n = 1 + rng.below(63);
                            g.charge(n).unwrap();
                            used += n;
                        }
                        if g.charge(100).is_err() {
                            refused += 1;
                        } else {
                            used += 100;
                        }
                        g.uncharge(used);
                    }
                    refused
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    stop.store(true, Relaxed);
    let drains = tightener.join().unwrap();
    println!("{drains} unrelated drains");
    assert_eq!(refused, 0, "charges that fit were refused");
}

/// Six threads charge and uncharge through the stock in three groups under
/// one parent, moved between CPUs by another thread, while a seventh keeps
/// moving the parent's limit up and down (each move drains the stocks). At
/// the end every charge that succeeded has been given back, and after a
/// drain every usage is exactly 0 — nothing lost or counted twice — with no
/// underflow event.
#[test]
fn limits_moved_under_load_lose_nothing() {
    let _turn = one_at_a_time();
    let h = Hierarchy::default();
    let parent = h.root().child("parent").unwrap();
    let groups: Vec<_> = (0..3)
        .map(|i| parent.child(&format!("g{i}")).unwrap())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mover = {
        let (parent, stop) = (parent.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut rng, mut moves) = (Rng::new(99), 0u64);
            while !stop.load(Relaxed) {
                let max = 2_000 + rng.below(20_000);
                if parent.set_max(max).is_ok() {
                    moves += 1;
                }
                std::thread::yield_now();
            }
            parent.set_max(UNLIMITED).unwrap();
            moves
        })
    };
    let migrator = Migrator::start();
    let start = Instant::now();
    let refusals: u64 = std::thread::scope(|s| {
        let threads: Vec<_> = (0..6u64)
            .map(|t| {
                let (g, migrator) = (groups[t as usize % 3].clone(), &migrator);
                s.spawn(move || {
                    let _moved = migrator.register();
                    let mut rng = Rng::new(t + 40);
                    let (mut held, mut refusals) = (Vec::new(), 0u64);
                    while start.elapsed() < Duration::from_millis(1_500) {
                        if held.len() < 16 && rng.below(2) == 0 {
                            let n = 1 + rng.below(300);
                            match g.charge(n) {
                                Ok(()) => held.push(n),
                                Err(_) => refusals += 1,
                            }
                        } else if let Some(n) = held.pop() {
                            g.uncharge(n);
                        }
                    }
                    for n in held {
                        g.uncharge(n);
                    }
                    refusals
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).sum()
    });
    let migrations = migrator.stop();
    stop.store(true, Relaxed);
    let moves = mover.join().unwrap();
    h.drain_stocks();
    for g in groups.iter().chain([&parent, &h.root()]) {
        assert_eq!(g.usage(), 0, "{} after everything was given back", g.path());
        assert_eq!(g.events().underflow, 0, "{}", g.path());
    }
    println!("{moves} limit moves, {migrations} migrations, {refusals} refusals");
}

/// A parent is never below its children, at any instant: one child holds
/// 10,000 units throughout while its sibling's charges race over-uncharges
/// of that sibling (clamped at what it holds). Charged from the child up, a
/// sibling's charge could be taken by the over-uncharge at the child and
/// subtracted from the parent before it had reached the parent: the parent
/// read 9,930 while a child held 10,000. Charges now go from the root down.
/// At the end (quiescence) the parent is exactly the sum of its children.
#[test]
fn a_parent_never_reads_below_a_child_while_a_sibling_over_uncharges() {
    let _turn = one_at_a_time();
    let parent = UsageCounter::root();
    let holder = UsageCounter::child_of(&parent);
    let sibling = UsageCounter::child_of(&parent);
    holder.try_charge(10_000).unwrap();
    let stop = AtomicBool::new(false);
    let (below, charged) = std::thread::scope(|s| {
        let charger = s.spawn(|| {
            let mut charged = 0u64;
            while !stop.load(Relaxed) {
                sibling.try_charge(70).unwrap();
                charged += 1;
            }
            charged
        });
        let (mut below, start) = (0u64, Instant::now());
        for _ in 0..2_000_000 {
            if start.elapsed() > LIMIT {
                break;
            }
            sibling.uncharge(1_000);
            if parent.usage() < 10_000 {
                below += 1;
            }
        }
        stop.store(true, Relaxed);
        (below, charger.join().unwrap())
    });
    assert!(charged > 1_000, "only {charged} charges raced");
    assert_eq!(below, 0, "reads of the parent below the holder's 10,000");
    assert_eq!(parent.usage(), holder.usage() + sibling.usage());
}

/// A charge fails only when it breaks a limit in force. A setter swaps a
/// group's limit between 2²⁰ and 2¹⁹ without pause; one thread holds 2¹⁷
/// and keeps trying 2¹⁹ more (fits the first limit, not the second),
/// another holds about 2¹⁸ and charges up to 4,096 on top — which fits
/// under both limits whatever the first thread holds, so it must never be
/// refused. (With the limit re-read after the add and a rollback, the big
/// charge's add was visible for a moment under the lower limit, and small
/// charges that fit both were refused: thousands in 3 seconds.) Checked on
/// a bare usage counter and on a group (through its stock).
#[test]
fn charges_that_fit_both_limits_of_a_swapping_setter_are_never_refused() {
    let _turn = one_at_a_time();
    let h = Hierarchy::default();
    let g = h.root().child("swapped").unwrap();
    let raw = UsageCounter::root();
    let (high, low) = (1u64 << 20, 1u64 << 19);
    g.set_max(high).unwrap();
    raw.set_max(high).unwrap();
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let (refused_group, refused_raw) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                let max = if n % 2 == 0 { low } else { high };
                // Busy while the big charge is held: then the old limit
                // stays, as it must.
                let _ = g.set_max(max);
                let _ = raw.set_max(max);
                n += 1;
            }
        });
        let big = s.spawn(|| {
            g.charge(1 << 17).unwrap();
            raw.try_charge(1 << 17).unwrap();
            while !stop.load(Relaxed) {
                if g.charge(1 << 19).is_ok() {
                    g.uncharge(1 << 19);
                }
                if raw.try_charge(1 << 19).is_ok() {
                    raw.uncharge(1 << 19);
                }
            }
            g.uncharge(1 << 17);
            raw.uncharge(1 << 17);
        });
        let small = s.spawn(|| {
            let mut rng = Rng::new(3);
            let (mut refused_group, mut refused_raw) = (0u64, 0u64);
            let hold = (1u64 << 18) - 8_192;
            while start.elapsed() < LIMIT {
                let n = 1 + rng.below(4_096);
                for (charge, refused) in [(hold, false), (n, true)] {
                    if g.charge(charge).is_err() {
                        refused_group += 1;
                    } else if refused {
                        g.uncharge(charge);
                    }
                    if raw.try_charge(charge).is_err() {
                        refused_raw += 1;
                    } else if refused {
                        raw.uncharge(charge);
                    }
                }
                g.uncharge(hold);
                raw.uncharge(hold);
            }
            (refused_group, refused_raw)
        });
        let refused = small.join().unwrap();
        stop.store(true, Relaxed);
        big.join().unwrap();
        refused
    });
    assert_eq!(refused_raw, 0, "fitting charges refused by a bare counter");
    assert_eq!(refused_group, 0, "fitting charges refused by a group");
    h.drain_stocks();
    assert_eq!((g.usage(), raw.usage()), (0, 0));
}
