//! Groups: limits, events, hooks, removal and bad input, one behaviour per
//! test; and real threads under limits with a watcher.

mod common;

use common::{finishes_within, online_cpu_ids, pin_to, unpin, Rng};
use splitcount::charge::UNLIMITED;
use splitcount::cpu::Machine;
use splitcount::group::{ChargeErrorKind, Group, GroupError, Hierarchy, HierarchyConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

fn sim(cpus: usize, batch: u64) -> (Machine, Hierarchy) {
    let m = Machine::simulated(cpus, 1).unwrap();
    let h = Hierarchy::new(HierarchyConfig::default().machine(&m).stock_batch(batch)).unwrap();
    (m, h)
}

/// The number of times `g`'s pressure hooks ran, as they run.
fn pressure_calls(g: &Group) -> Arc<AtomicU64> {
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    g.on_pressure(move |_, _| {
        counted.fetch_add(1, Relaxed);
    });
    calls
}

#[test]
fn a_charge_hits_the_stock_after_one_batch_is_charged() {
    let (_m, h) = sim(2, 64);
    let g = h.root().child("a").unwrap();
    g.charge(1).unwrap();
    assert_eq!(g.usage(), 64, "a whole batch was charged");
    assert_eq!(g.stocked(), 63);
    for _ in 0..63 {
        g.charge(1).unwrap();
    }
    assert_eq!(g.usage(), 64, "63 charges touched no counter");
    assert_eq!(g.stocked(), 0);
}

#[test]
fn uncharges_refill_the_stock_and_drain_back_to_exact_usage() {
    let (_m, h) = sim(2, 64);
    let g = h.root().child("a").unwrap();
    g.charge(10).unwrap();
    g.uncharge(10);
    assert_eq!(g.stocked(), 64);
    h.drain_stocks();
    assert_eq!((g.usage(), h.root().usage()), (0, 0));
}

#[test]
fn a_limit_refuses_with_the_numbers_of_the_refusing_group() {
    let (_m, h) = sim(4, 16);
    let a = h.root().child("a").unwrap();
    let b = a.child("b").unwrap();
    a.set_max(100).unwrap();
    b.charge(90).unwrap();
    let e = b.charge(20).unwrap_err();
    assert_eq!(e.kind(), ChargeErrorKind::Limit);
    assert_eq!((e.charged(), e.group()), ("/a/b", "/a"));
    assert_eq!((e.limit(), e.usage(), e.request()), (100, 90, 20));
    assert_eq!(a.events().max, 1);
    assert_eq!(a.events().oom, 1);
    b.charge(10).unwrap();
    assert_eq!(a.usage(), 100, "charges fit exactly up to the limit");
}

#[test]
fn stocked_units_of_other_cpus_are_drained_before_a_refusal() {
    let (m, h) = sim(4, 64);
    let g = h.root().child("g").unwrap();
    g.set_max(128).unwrap();
    for cpu in 0..2 {
        m.set_current_cpu(cpu).unwrap();
        g.charge(1).unwrap(); // 63 stocked on each of CPUs 0 and 1
    }
    assert_eq!(g.usage(), 128);
    m.set_current_cpu(3).unwrap();
    g.charge(100).unwrap(); // fits only once CPUs 0 and 1 give their stock back
    assert_eq!(g.usage(), 102);
}

#[test]
fn the_reclaim_hook_can_make_room() {
    let (_m, h) = sim(1, 1);
    let g = h.root().child("cache").unwrap();
    g.set_max(100).unwrap();
    g.charge(100).unwrap();
    let asked = Arc::new(AtomicU64::new(0));
    let seen = asked.clone();
    g.on_reclaim(move |grp, short| {
        seen.store(short, Relaxed);
        grp.uncharge(short); // "free" exactly what is missing
        short
    });
    g.charge(30).unwrap();
    assert_eq!(asked.load(Relaxed), 30);
    assert_eq!(g.usage(), 100);
}

#[test]
fn the_oom_hook_runs_last_and_may_allow_one_more_try() {
    let (_m, h) = sim(1, 1);
    let g = h.root().child("q").unwrap();
    g.set_max(10).unwrap();
    g.charge(10).unwrap();
    assert!(g.charge(1).is_err());
    assert_eq!(g.events().oom, 1);
    g.on_oom(|grp, _| {
        grp.uncharge(5);
        true
    });
    g.charge(3).unwrap();
    h.drain_stocks();
    assert_eq!(g.usage(), 8);
}

#[test]
fn crossing_high_counts_events_and_calls_the_pressure_hook_but_never_refuses() {
    let (_m, h) = sim(1, 1);
    let g = h.root().child("p").unwrap();
    g.set_high(50);
    let over = Arc::new(AtomicU64::new(0));
    let o = over.clone();
    g.on_pressure(move |_, by| o.store(by, Relaxed));
    g.charge(50).unwrap();
    assert_eq!(g.events().high, 0);
    g.charge(20).unwrap();
    assert_eq!(g.events().high, 1);
    assert_eq!(over.load(Relaxed), 20);
    assert_eq!(g.usage(), 70);
}

#[test]
fn a_limit_below_usage_is_busy_after_draining() {
    let (_m, h) = sim(2, 64);
    let g = h.root().child("g").unwrap();
    g.charge(10).unwrap(); // 54 more are stocked
    g.set_max(20).unwrap(); // fits once the stock is drained
    assert_eq!(g.usage(), 10);
    let e = g.set_max(5).unwrap_err();
    assert_eq!(
        e,
        GroupError::Busy {
            path: "/g".into(),
            usage: 10,
            max: 5
        }
    );
    assert_eq!(g.max(), 20, "the old limit stays");
}

#[test]
fn uncharging_more_than_charged_clamps_at_zero_with_an_event() {
    let (_m, h) = sim(1, 4);
    let g = h.root().child("g").unwrap();
    let sibling = h.root().child("s").unwrap();
    sibling.force_charge(100).unwrap();
    g.charge(3).unwrap();
    g.uncharge(50);
    h.drain_stocks();
    assert_eq!(g.usage(), 0);
    // Counted each time bogus units reach the counter: here the excess over
    // the stock's batch, then the stocked rest when drained.
    assert!(g.events().underflow >= 1);
    assert_eq!(h.root().usage(), 100, "the sibling's usage is untouched");
    assert_eq!(h.root().events().underflow, 0);
}

#[test]
fn names_are_validated_and_unique_among_live_siblings() {
    let h = Hierarchy::default();
    let r = h.root();
    for bad in [
        "",
        "a/b",
        ".",
        "..",
        &"n".repeat(256),
        "a\nb",
        "\t",
        "del\u{7f}",
    ] {
        assert!(
            matches!(r.child(bad), Err(GroupError::InvalidName { .. })),
            "{bad:?}"
        );
    }
    r.child("with spaces").unwrap().remove().unwrap();
    // A lookup's error repeats a bounded part of the path asked for.
    let long = "p/".repeat(1 << 19);
    let e = h.lookup(&long).unwrap_err().to_string();
    assert!(
        e.len() < 4200 && e.ends_with("(1048576 bytes in all)"),
        "{}",
        &e[e.len() - 40..]
    );
    let a = r.child("a").unwrap();
    assert_eq!(
        r.child("a").unwrap_err(),
        GroupError::NameTaken { path: "/a".into() }
    );
    a.remove().unwrap();
    r.child("a").unwrap(); // a removed group's name is free again
    assert!(matches!(a.child("x"), Err(GroupError::Removed { .. })));
}

#[test]
fn lookup_and_children() {
    let h = Hierarchy::default();
    let a = h.root().child("a").unwrap();
    a.child("y").unwrap();
    a.child("x").unwrap();
    assert_eq!(h.lookup("/a/x").unwrap().path(), "/a/x");
    assert_eq!(h.lookup("a/y/").unwrap().name(), "y");
    assert_eq!(h.lookup("").unwrap().path(), "/");
    assert_eq!(
        h.lookup("a/z").unwrap_err(),
        GroupError::NotFound { path: "a/z".into() }
    );
    let names: Vec<_> = a.children().iter().map(|g| g.name().to_owned()).collect();
    assert_eq!(names, ["x", "y"]);
    assert_eq!(h.lookup("a/x").unwrap().parent().unwrap().path(), "/a");
}

#[test]
fn removal_rules() {
    let h = Hierarchy::default();
    assert_eq!(h.root().remove(), Err(GroupError::RootCannotBeRemoved));
    let a = h.root().child("a").unwrap();
    let b = a.child("b").unwrap();
    assert_eq!(
        a.remove(),
        Err(GroupError::HasChildren {
            path: "/a".into(),
            children: 1
        })
    );
    b.remove().unwrap();
    assert_eq!(
        b.remove(),
        Err(GroupError::Removed {
            path: "/a/b".into()
        })
    );
    a.remove().unwrap();
    assert!(h.lookup("a").is_err());
}

#[test]
fn a_removed_groups_handles_act_on_the_nearest_live_ancestor() {
    let (_m, h) = sim(2, 8);
    let a = h.root().child("a").unwrap();
    let b = a.child("b").unwrap();
    b.charge(5).unwrap();
    b.remove().unwrap();
    assert_eq!(
        a.usage(),
        5,
        "b's usage stays counted at a (stocks drained)"
    );
    b.charge(7).unwrap();
    b.uncharge(12);
    h.drain_stocks();
    assert_eq!((a.usage(), h.root().usage()), (0, 0));
    assert_eq!(a.events().underflow, 0);
}

/// An uncharge through a removed group's handle takes back what its
/// charges since the removal put on the nearest live ancestor, then what
/// the removed group still holds, clamped there: an excess is the removed
/// group's `underflow` and takes nothing of a sibling's usage. It used to
/// go to the ancestor whole: 20 units of `/a`'s came off the root, and `/a`
/// could then charge past the root's limit (found by a helper, from C).
#[test]
fn an_uncharge_through_a_removed_groups_handle_never_takes_a_siblings_units() {
    let (_m, h) = sim(2, 8);
    let root = h.root();
    root.set_max(150).unwrap();
    let a = root.child("a").unwrap();
    let b = root.child("b").unwrap();
    a.force_charge(100).unwrap();
    b.force_charge(20).unwrap();
    let stale = b.clone();
    b.remove().unwrap();
    stale.uncharge(40);
    h.drain_stocks();
    assert_eq!(
        (a.usage(), stale.usage(), root.usage()),
        (100, 0, 100),
        "only b's 20 came off"
    );
    assert_eq!((stale.events().underflow, root.events().underflow), (1, 0));
    assert!(a.charge(70).is_err(), "the root's limit holds");
    a.charge(50).unwrap();
    assert_eq!(root.usage(), 150);

    // Units charged through the stale handle since the removal (to the
    // root) come back from the root; then b's own, then nothing.
    let (c, d) = (root.child("c").unwrap(), root.child("d").unwrap());
    root.set_max(UNLIMITED).unwrap();
    d.force_charge(1000).unwrap();
    c.force_charge(30).unwrap();
    let stale = c.clone();
    c.remove().unwrap();
    stale.force_charge(5).unwrap();
    stale.charge(5).unwrap();
    h.drain_stocks();
    assert_eq!((stale.usage(), root.usage()), (30, 1000 + 150 + 40));
    stale.uncharge(10); // what went to the root
    assert_eq!((stale.usage(), root.usage()), (30, 1000 + 150 + 30));
    stale.uncharge(30); // its own
    assert_eq!((stale.usage(), root.usage()), (0, 1000 + 150));
    stale.uncharge(1);
    h.drain_stocks();
    assert_eq!(
        (d.usage(), root.usage(), stale.events().underflow),
        (1000, 1000 + 150, 1)
    );
}

/// Forced charges that would take a usage past the most a counter holds
/// (2^56 − 1) are refused, where the counters saturated and lost the
/// excess: the third of three charges of 2^55 vanished, an unlimited root
/// then refused and reported a breach with self-contradicting numbers, and
/// returning the charges counted underflows (found by a helper, from C).
#[test]
fn forced_charges_past_the_counters_ceiling_are_refused_not_lost() {
    use splitcount::charge::{MAX_REQUEST, MAX_USAGE};
    use splitcount::group::ChargeErrorKind;
    let (_m, h) = sim(2, 8);
    let a = h.root().child("a").unwrap();
    a.force_charge(MAX_REQUEST).unwrap();
    a.over_charge(MAX_REQUEST - 1).unwrap();
    let e = a.force_charge(MAX_REQUEST).unwrap_err();
    assert_eq!(e.kind(), ChargeErrorKind::Saturated);
    assert_eq!((e.group(), e.limit()), ("/", MAX_USAGE));
    assert!(
        e.to_string()
            .contains("would pass the most a counter holds"),
        "{e}"
    );
    assert_eq!(
        a.over_charge(2).unwrap_err().kind(),
        ChargeErrorKind::Saturated
    );
    let e = a.charge(2).unwrap_err();
    assert_eq!(e.kind(), ChargeErrorKind::Saturated, "{e}");
    assert_eq!(h.root().usage(), 2 * MAX_REQUEST - 1, "nothing lost");
    assert!(
        h.root().check().is_ok(),
        "an unlimited root is not breached"
    );
    assert_eq!(h.root().events().breaches, 0);
    assert_eq!(h.root().events().max, 0, "no `max` to hit");
    a.uncharge(2 * MAX_REQUEST - 1);
    h.drain_stocks();
    assert_eq!((a.usage(), a.events().underflow), (0, 0));
}

/// The same at the usage counter's own API: a `try_charge` refused at the
/// ceiling of an unlimited counter is not a `max` event (it counted one —
/// a limit hit at a counter without a limit); one refused by a limit is.
#[test]
fn a_raw_refusal_at_the_ceiling_is_not_a_max_event() {
    use splitcount::charge::MAX_USAGE;
    use splitcount::raw::UsageCounter;
    let c = UsageCounter::root();
    c.charge(MAX_USAGE);
    assert!(c.try_charge(1).is_err());
    assert_eq!(c.events().max, 0);
    let d = UsageCounter::root();
    d.set_max(5).unwrap();
    assert!(d.try_charge(6).is_err());
    assert_eq!(d.events().max, 1);
}

/// A limit set through a removed group's handle would hold nowhere (its
/// charges go to the nearest live ancestor): refused with `Removed`, where
/// it answered `Ok` and the removed group's `max()` read the new limit.
#[test]
fn a_limit_on_a_removed_group_is_refused() {
    let (_m, h) = sim(2, 8);
    let a = h.root().child("a").unwrap();
    let b = a.child("b").unwrap();
    b.remove().unwrap();
    assert!(matches!(b.set_max(10), Err(GroupError::Removed { .. })));
    assert_eq!(
        (b.max(), a.max()),
        (UNLIMITED, UNLIMITED),
        "nothing changed"
    );
    b.force_charge(1000).unwrap();
    assert_eq!(a.usage(), 1000, "charged at the nearest live ancestor");
}

#[test]
fn bad_configuration_and_requests() {
    assert!(Hierarchy::new(HierarchyConfig::default().stock_batch(0)).is_err());
    assert!(Hierarchy::new(HierarchyConfig::default().stock_slots(0)).is_err());
    assert!(Hierarchy::new(HierarchyConfig::default().stock_slots(64)).is_err());
    let h = Hierarchy::default();
    let g = h.root().child("g").unwrap();
    let e = g.charge(u64::MAX).unwrap_err();
    assert_eq!(e.kind(), ChargeErrorKind::TooLarge);
    let e = g.force_charge(u64::MAX).unwrap_err();
    assert_eq!(e.kind(), ChargeErrorKind::TooLarge);
    assert_eq!(g.usage(), 0);
    g.charge(0).unwrap();
    assert_eq!(g.max(), UNLIMITED);
}

#[test]
fn the_peak_is_kept_and_reset() {
    let (_m, h) = sim(1, 1);
    let g = h.root().child("g").unwrap();
    g.charge(40).unwrap();
    g.uncharge(30);
    h.drain_stocks();
    assert_eq!(g.peak(), 40);
    g.reset_peak();
    assert_eq!(g.peak(), 10);
}

/// 8 threads charge and uncharge random amounts across a three-level tree
/// with limits, while a watcher checks that no usage ever exceeds its limit.
#[test]
fn threads_under_limits_never_exceed_them_and_nothing_is_lost() {
    let h = Hierarchy::default();
    let root = h.root();
    let mut groups: Vec<Group> = Vec::new();
    for (i, max) in [(0, 20_000u64), (1, 5_000)] {
        let mid = root.child(&format!("m{i}")).unwrap();
        mid.set_max(max).unwrap();
        for j in 0..3 {
            let leaf = mid.child(&format!("l{j}")).unwrap();
            leaf.set_max(3_000).unwrap();
            groups.push(leaf);
        }
        groups.push(mid);
    }
    let all: Vec<Group> = std::iter::once(root.clone())
        .chain(groups.iter().cloned())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (all, stop) = (all.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut checks = 0u64;
            while !stop.load(Relaxed) {
                for g in &all {
                    let (u, m) = (g.usage(), g.max());
                    assert!(u <= m, "{} at {u} above its limit {m}", g.path());
                }
                checks += 1;
            }
            checks
        })
    };
    let outstanding: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|t| {
                let groups = &groups;
                s.spawn(move || {
                    let mut rng = Rng::new(t + 1);
                    let mut mine = vec![0u64; groups.len()];
                    let online = online_cpu_ids();
                    for op in 0..50_000 {
                        if op % 2_000 == 0 {
                            // Migrate: stocks of the CPU left behind keep units.
                            pin_to(online[rng.below(online.len() as u64) as usize]);
                        }
                        let i = rng.below(groups.len() as u64) as usize;
                        if rng.below(3) == 0 && mine[i] > 0 {
                            let n = 1 + rng.below(mine[i]);
                            groups[i].uncharge(n);
                            mine[i] -= n;
                        } else {
                            let n = 1 + rng.below(100);
                            if groups[i].charge(n).is_ok() {
                                mine[i] += n;
                            }
                        }
                    }
                    unpin(&online);
                    mine
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    stop.store(true, Relaxed);
    assert!(watcher.join().unwrap() > 0);
    h.drain_stocks();
    let own: Vec<u64> = (0..groups.len())
        .map(|i| outstanding.iter().map(|m| m[i]).sum())
        .collect();
    for (i, g) in groups.iter().enumerate() {
        let subtree: u64 = groups
            .iter()
            .enumerate()
            .filter(|(_, x)| {
                x.path() == g.path() || x.path().starts_with(&format!("{}/", g.path()))
            })
            .map(|(j, _)| own[j])
            .sum();
        assert_eq!(g.usage(), subtree, "{}", g.path());
        let _ = i;
    }
    assert_eq!(root.usage(), own.iter().sum::<u64>());
}

#[test]
fn removal_while_threads_charge_into_the_subtree_loses_nothing() {
    let h = Hierarchy::default();
    let p = h.root().child("p").unwrap();
    p.set_max(1 << 40).unwrap();
    let leaves: Vec<Group> = (0..4).map(|i| p.child(&format!("l{i}")).unwrap()).collect();
    let go = Arc::new(AtomicBool::new(true));
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (leaves, go) = (&leaves, go.clone());
            s.spawn(move || {
                let mut rng = Rng::new(t + 50);
                let mut mine = vec![0u64; leaves.len()];
                let mut rounds = 0;
                while go.load(Relaxed) || rounds < 20_000 {
                    rounds += 1;
                    let i = rng.below(leaves.len() as u64) as usize;
                    let n = 1 + rng.below(50);
                    leaves[i].charge(n).unwrap();
                    mine[i] += n;
                    if rng.below(2) == 0 {
                        let back = rng.below(mine[i] + 1);
                        leaves[i].uncharge(back);
                        mine[i] -= back;
                    }
                }
                for (i, n) in mine.into_iter().enumerate() {
                    leaves[i].uncharge(n);
                }
            });
        }
        for l in &leaves[..3] {
            std::thread::sleep(std::time::Duration::from_millis(5));
            l.remove().unwrap();
        }
        go.store(false, Relaxed);
    });
    h.drain_stocks();
    assert_eq!(p.usage(), 0);
    assert_eq!(h.root().usage(), 0);
    assert_eq!(p.events().underflow, 0);
}

#[test]
fn an_absurd_uncharge_clamps_without_overflow() {
    let (_m, h) = sim(2, 64);
    let g = h.root().child("g").unwrap();
    g.charge(5).unwrap();
    g.uncharge(u64::MAX);
    h.drain_stocks();
    assert_eq!(g.usage(), 0);
    assert!(g.events().underflow >= 1);
    assert_eq!(h.root().usage(), 0);
}

#[test]
fn handles_and_counters_are_send_and_sync() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Group>();
    shareable::<Hierarchy>();
    shareable::<splitcount::counter::Tree>();
    shareable::<splitcount::counter::Batched>();
    shareable::<splitcount::counter::PerNode>();
    shareable::<splitcount::counter::Atomic>();
    shareable::<splitcount::raw::percpu::PerCpu>();
    shareable::<splitcount::stat::Stats>();
}

/// Hooks run after the group's hook mutex is released: a pressure hook may
/// charge its own group (re-entering the charge path, which looks up the
/// hooks again) without deadlocking.
#[test]
fn a_pressure_hook_may_charge_its_own_group() {
    let charged = finishes_within(std::time::Duration::from_secs(20), || {
        let (_m, h) = sim(2, 8);
        let g = h.root().child("g").unwrap();
        g.set_high(10);
        let once = AtomicBool::new(false);
        g.on_pressure(move |g, _over| {
            if !once.swap(true, Relaxed) {
                g.charge(5).unwrap();
            }
        });
        g.charge(20).unwrap();
        g.usage()
    });
    assert!(charged >= 25);
}

/// A refusal reports and counts the limit that refused it, not the one in
/// force by the time it is reported: here a reclaim hook lifts the limit
/// during the refusal (a `set_max` of another thread does the same). The
/// error said "limit 18446744073709551615" and no `max` event was counted
/// (the limit read afterwards was none), though `max ≥ refused` is
/// documented.
#[test]
fn a_refusal_reports_the_limit_that_refused_it_though_a_hook_lifts_it() {
    let h = Hierarchy::default();
    let g = h.root().child("g").unwrap();
    g.set_max(100).unwrap();
    g.on_reclaim(|g, _| {
        g.set_max(UNLIMITED).unwrap();
        0
    });
    let e = g.charge(1000).unwrap_err();
    assert_eq!((e.kind(), e.limit()), (ChargeErrorKind::Limit, 100));
    let events = g.events();
    assert_eq!((events.max, events.refused), (1, 1));
    g.charge(1000).unwrap(); // the lifted limit holds from now on
}

/// A reclaim hook may install hooks on its own group (the mutex is not held
/// while it runs).
#[test]
fn a_reclaim_hook_may_replace_the_groups_hooks() {
    let refused = finishes_within(std::time::Duration::from_secs(20), || {
        let (_m, h) = sim(2, 8);
        let g = h.root().child("g").unwrap();
        g.set_max(10).unwrap();
        g.on_reclaim(|g, _short| {
            g.on_reclaim(|_, _| 0);
            g.on_oom(|_, _| false);
            0
        });
        g.charge(20).is_err()
    });
    assert!(refused);
}

/// A hook that panics has declined: the panic does not unwind out of the
/// charge (which may run inside the global allocator), the charge is refused
/// with the usual error, and the group keeps working.
#[test]
fn a_panicking_hook_declines_instead_of_unwinding_through_the_charge() {
    let (_m, h) = sim(2, 8);
    let g = h.root().child("g").unwrap();
    g.set_max(10).unwrap();
    g.set_high(4);
    g.on_reclaim(|_, _| panic!("reclaim hook failed"));
    g.on_oom(|_, _| panic!("oom hook failed"));
    g.on_pressure(|_, _| panic!("pressure hook failed"));
    let e = g.charge(20).unwrap_err();
    assert_eq!((e.group(), e.limit(), e.request()), ("/g", 10, 20));
    g.charge(6).unwrap();
    assert_eq!(
        (g.usage(), g.events().high),
        (6, 1),
        "charged exactly (a batch of 8 would have crossed high by its surplus), \
         over high; the pressure hook's panic was caught"
    );
    assert_eq!(g.events().oom, 1);
}

/// Nothing recurses with the depth of the tree: a 5,000-deep chain is
/// created, charged and updated at the bottom, flushed, snapshotted,
/// serialized and dropped on a thread with a 256 KiB stack (recursion
/// through 5,000 levels needs several times that).
#[test]
fn a_very_deep_chain_needs_no_deep_stack() {
    use splitcount::stat::StatItem;
    const DEPTH: usize = 5_000;
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(|| {
            let h = Hierarchy::new(HierarchyConfig::default().stats(vec![StatItem::gauge("anon")]))
                .unwrap();
            let anon = h.stat_id("anon").unwrap();
            let mut bottom = h.root();
            for _ in 0..DEPTH {
                bottom = bottom.child("g").unwrap();
            }
            bottom.set_max(100).unwrap();
            bottom.charge(5).unwrap();
            bottom.mod_stat(anon, 7).unwrap();
            let snap = h.root().snapshot();
            assert_eq!(snap.groups.len(), DEPTH + 1);
            assert_eq!(snap.groups[DEPTH].parent, Some(DEPTH - 1));
            assert_eq!(snap.root().stats["anon"], 7);
            assert!(snap.root().usage >= 5);
            #[cfg(feature = "serde")]
            {
                let json = serde_json::to_string(&snap).unwrap();
                assert!(json.len() > DEPTH);
            }
            drop(snap);
            drop(h);
            // The last handle: the whole chain goes with it.
            drop(bottom);
        })
        .unwrap()
        .join()
        .unwrap();
}

/// The reviewer's sequence: batch 64, a parent limited to 100. An
/// uncharge of more than the group holds must not be stocked — later
/// charges would take units no one paid for — but clamped and counted.
#[test]
fn an_over_uncharge_is_never_stocked_for_later_charges() {
    let (_m, h) = sim(2, 64);
    let parent = h.root().child("p").unwrap();
    parent.set_max(100).unwrap();
    let a = parent.child("a").unwrap();
    let b = parent.child("b").unwrap();
    a.charge(100).unwrap();
    a.uncharge(164);
    assert_eq!(a.events().underflow, 1, "the over-uncharge is counted");
    assert_eq!((a.usage(), parent.usage()), (0, 0));
    a.charge(64).unwrap();
    let e = b.charge(100).unwrap_err();
    assert_eq!((e.group(), e.usage()), ("/p", 64));
    h.drain_stocks();
    assert_eq!(parent.usage(), 64, "exactly what is held");
}

/// A small over-uncharge, within the stock's batch, is clamped where it is
/// seen: nothing is stocked that the usage cannot account for, and nothing
/// is taken from the units that back this CPU's stock — so the limit holds
/// at once, without waiting for a drain.
#[test]
fn a_small_over_uncharge_is_clamped_not_stocked() {
    let (_m, h) = sim(1, 64);
    let g = h.root().child("g").unwrap();
    g.set_max(64).unwrap();
    g.charge(1).unwrap(); // 64 charged: 1 in use, 63 stocked
    g.uncharge(10); // 9 more than in use
    assert_eq!(g.events().underflow, 1, "counted when it happens");
    let mut granted = 0;
    while g.charge(1).is_ok() {
        granted += 1;
        assert!(granted <= 64, "the limit of 64 no longer holds");
    }
    assert_eq!(granted, 64, "exactly the limit, nothing more, nothing less");
    h.drain_stocks();
    assert_eq!(g.usage(), 64);
}

/// A group `g` (max 64) that charged 1 unit on CPU 0 — a batch of 64, 63
/// of them stocked there — then returns 10 on CPU 1. With `crowded`, 64
/// other groups hold CPU 1's slots and budget first: as the hash of `g`'s
/// window falls, its return is left out (to the counter) or stocked in a
/// small slot that keeps 1 unit and gives the rest to the counter.
fn over_uncharged_on_another_cpu(crowded: bool) -> (Machine, Hierarchy, Group, Vec<Group>) {
    let (m, h) = sim(2, 64);
    let g = h.root().child("g").unwrap();
    g.set_max(64).unwrap();
    m.set_current_cpu(1).unwrap();
    let others: Vec<_> = (0..if crowded { 64 } else { 0 })
        .map(|i| {
            let o = h.root().child(&format!("o{i}")).unwrap();
            o.charge(1).unwrap();
            o
        })
        .collect();
    m.set_current_cpu(0).unwrap();
    g.charge(1).unwrap();
    m.set_current_cpu(1).unwrap();
    g.uncharge(10); // 9 more than in use
    (m, h, g, others)
}

/// An over-uncharge on another CPU than the one whose stock holds the
/// group's units is covered by them (the uncharge reads its own CPU's stock
/// only): nothing reads below zero yet. When the stocks drain, the excess
/// is clamped and counted (once per clamped return: twice when `g` kept a
/// unit on CPU 1 too, drained after CPU 0's).
#[test]
fn an_over_uncharge_on_another_cpu_is_caught_when_the_stocks_drain() {
    for crowded in [false, true] {
        let (_m, h, g, _others) = over_uncharged_on_another_cpu(crowded);
        assert_eq!(
            g.events().underflow,
            0,
            "covered by CPU 0's stock ({crowded})"
        );
        h.drain_stocks();
        assert_eq!(g.usage(), 0, "1 charged, 10 returned: clamped ({crowded})");
        assert!(
            g.events().underflow >= 1,
            "counted at the drain ({crowded})"
        );
    }
}

/// If charges take the covering units before a drain, the usage stays the
/// exact sum of the group's charges and uncharges, and the limit grants the
/// excess again: the caller holds at most that much beyond its limit (the
/// documented outcome; on one CPU the excess is refused at once, see
/// `a_small_over_uncharge_is_clamped_not_stocked`).
#[test]
fn an_over_uncharge_covered_by_another_cpu_passes_the_limit_by_at_most_the_excess() {
    for crowded in [false, true] {
        let (_m, h, g, _others) = over_uncharged_on_another_cpu(crowded);
        let mut granted = 0;
        while g.charge(1).is_ok() {
            granted += 1;
            assert!(granted <= 64 + 9, "more than the excess ({crowded})");
        }
        assert_eq!(granted, 64 + 9, "the limit and the excess ({crowded})");
        h.drain_stocks();
        assert_eq!(
            g.usage(),
            64,
            "charges less uncharges: 1 − 10 + 73 ({crowded})"
        );
        assert_eq!(g.events().underflow, 0, "never read below zero ({crowded})");
    }
}

/// A refused charge was never held: it raises no group's peak (a child under
/// a refusing parent used to show the refused amount as its peak).
#[test]
fn a_refused_charge_never_raises_a_peak() {
    let (_m, h) = sim(2, 8);
    let parent = h.root().child("p").unwrap();
    parent.set_max(64).unwrap();
    let child = parent.child("c").unwrap();
    child.force_charge(10).unwrap();
    assert!(child.charge(76).is_err());
    assert_eq!((child.peak(), parent.peak()), (10, 10));
    child.charge(50).unwrap();
    assert!(child.peak() >= 60);
}

/// The pressure hook runs once per crossing of `high` — not on every charge
/// above it — and again after usage came back under it.
#[test]
fn pressure_fires_once_per_crossing_of_high() {
    let (_m, h) = sim(1, 1);
    let g = h.root().child("g").unwrap();
    g.set_high(10);
    let calls = pressure_calls(&g);
    for _ in 0..20 {
        g.charge(1).unwrap(); // above high from the 11th on
    }
    assert_eq!(calls.load(Relaxed), 1);
    assert_eq!(g.events().high, 1, "one crossing");
    g.uncharge(15);
    h.drain_stocks();
    for _ in 0..10 {
        g.charge(1).unwrap();
    }
    assert_eq!(calls.load(Relaxed), 2, "back under, then over again");
}

/// A refill's surplus does not cross `high`: below its `high`, a group
/// takes a batch only if the batch stays under it, else just what the
/// charge asks. Two CPUs' refills of 64 used to take a `high` of 100 to
/// 128 with 8 units in use — a `high` event, and pressure hooks told of
/// 28 units over that nothing used. Once above `high` (a crossing by
/// what is in use), refills take batches again.
#[test]
fn stocked_units_alone_do_not_cross_high() {
    let (m, h) = sim(2, 64);
    let g = h.root().child("g").unwrap();
    g.set_high(100);
    let calls = pressure_calls(&g);
    m.set_current_cpu(0).unwrap();
    g.charge(4).unwrap();
    m.set_current_cpu(1).unwrap();
    g.charge(4).unwrap();
    assert_eq!(
        (g.usage(), g.stocked()),
        (68, 60),
        "CPU 1 charged its 4 exactly"
    );
    assert_eq!((g.events().high, calls.load(Relaxed)), (0, 0));
    // In use past `high` (4 + 4 + 93 = 101, with 60 stocked on CPU 0): a
    // crossing; then CPU 1 stocks again.
    g.charge(93).unwrap();
    assert_eq!((g.events().high, calls.load(Relaxed)), (1, 1));
    g.charge(1).unwrap();
    assert_eq!(g.stocked(), 60 + 63, "above high, a batch again");
    h.drain_stocks();
    assert_eq!(g.usage(), 102);
}

/// `over_charge`: never refused, and reported when it passes a limit — a
/// `max` event at the limit in the way, a breach (once per episode) at
/// every group from the charged one up to it, which `check` sees.
#[test]
fn an_over_charge_past_max_is_charged_and_recorded_as_a_breach() {
    let (_m, h) = sim(2, 64);
    let parent = h.root().child("parent").unwrap();
    let g = parent.child("g").unwrap();
    let sibling = parent.child("sibling").unwrap();
    parent.set_max(1000).unwrap();
    parent.set_ceiling(1100);

    // Within the limits: a forced charge, nothing reported.
    g.over_charge(900).unwrap();
    assert!(g.check().is_ok() && parent.check().is_ok());
    assert_eq!(parent.events().max, 0);

    // Past the parent's max (and its ceiling: it does not stop this).
    g.over_charge(300).unwrap();
    assert_eq!(g.usage(), 1200);
    let e = g.check().unwrap_err();
    assert_eq!(
        (e.group.as_str(), e.charged.as_str()),
        ("/parent", "/parent/g")
    );
    assert_eq!((e.max, e.request), (1000, 300));
    assert!(parent.check().is_err(), "the limit's own group is breached");
    assert!(
        sibling.check().is_ok(),
        "not a group the charge went through"
    );
    assert_eq!((parent.events().max, parent.events().breaches), (1, 1));

    // More of the same episode: counted, no new breach.
    g.over_charge(10).unwrap();
    assert_eq!((parent.events().max, parent.events().breaches), (2, 1));

    // Cleared, then back under max: the next one begins a new episode.
    g.clear_breach();
    parent.clear_breach();
    g.uncharge(1210);
    h.drain_stocks();
    g.over_charge(1001).unwrap();
    assert!(g.check().is_err());
    assert_eq!(parent.events().breaches, 2);

    // Too large to be anything but a bug.
    let err = g.over_charge(u64::MAX).unwrap_err();
    assert_eq!(err.kind(), ChargeErrorKind::TooLarge);
}

/// Units stocked for the limit's subtree are drained before an over-charge
/// decides: a limit that only the stocks fill is not passed.
#[test]
fn an_over_charge_that_fits_once_the_stocks_are_drained_is_not_a_breach() {
    let (m, h) = sim(2, 64);
    let g = h.root().child("g").unwrap();
    g.set_max(100).unwrap();
    m.set_current_cpu(0).unwrap();
    g.charge(1).unwrap(); // 64 charged, 63 stocked on CPU 0
    m.set_current_cpu(1).unwrap();
    g.charge(1).unwrap(); // a batch would not fit: exactly 1
    assert_eq!(g.usage(), 65);
    g.over_charge(90).unwrap(); // 155 > 100, but 2 + 90 in use
    assert!(g.check().is_ok(), "92 in use under a max of 100");
    assert_eq!((g.events().max, g.events().breaches), (0, 0));
    assert_eq!(g.usage(), 92);
}

/// Read back with serde, a topology is whole again (the index of kernel
/// ids was not serialized: a round trip compared unequal and knew no CPU by
/// its id), and one that cannot describe a machine is an error, as is a
/// snapshot without its root — both used to deserialize and panic later
/// (found by a helper).
#[cfg(feature = "serde")]
#[test]
fn deserialized_topologies_and_snapshots_are_whole_or_refused() {
    use splitcount::cpu::Topology;
    use splitcount::group::Snapshot;
    for t in [Topology::simulated(8, 2).unwrap(), Topology::host().clone()] {
        let back: Topology = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
        let last = t.cpu_id(t.cpus() - 1).unwrap();
        assert_eq!(back.dense_index(last), Some(t.cpus() - 1));
    }
    let good = serde_json::to_value(Topology::simulated(4, 2).unwrap()).unwrap();
    let broken = |field: &str, v: serde_json::Value| {
        let mut t = good.clone();
        t[field] = v;
        serde_json::from_value::<Topology>(t)
            .unwrap_err()
            .to_string()
    };
    assert!(broken("nodes", 0.into()).contains("nodes"));
    assert!(broken("node_of", serde_json::json!([])).contains("node_of"));
    assert!(broken("node_of", serde_json::json!([0, 0, 1, 7])).contains("node 7"));
    assert!(broken("possible", serde_json::json!([])).contains("possible"));
    assert!(broken("possible", serde_json::json!([0, 2, 1, 3])).contains("ascending"));
    assert!(broken("possible", serde_json::json!([0, 1, 2, 4_000_000_000u32])).contains("CPU id"));
    assert!(broken("online", serde_json::json!([9])).contains("beyond"));

    let e = serde_json::from_str::<Snapshot>(r#"{"groups":[]}"#).unwrap_err();
    assert!(e.to_string().contains("root"), "{e}");
    let h = Hierarchy::default();
    h.root().child("a").unwrap().child("b").unwrap();
    let mut snap = serde_json::to_value(h.root().snapshot()).unwrap();
    let back: Snapshot = serde_json::from_value(snap.clone()).unwrap();
    assert_eq!(back.root().path, "/");
    snap["groups"][2]["parent"] = 5.into();
    assert!(serde_json::from_value::<Snapshot>(snap).is_err());
}

/// Units charged through a removed group's handle go back to the group
/// they were charged to, also once that group is removed in turn (they went
/// to the live ancestor of the time, and came off the next one up: `/a`
/// kept 20 for good, and an over-uncharge through `/a`'s handle then took a
/// sibling's units off the root — found by a review).
#[test]
fn redirected_units_go_back_where_they_were_charged() {
    let (_m, h) = sim(2, 8);
    let root = h.root();
    root.set_max(150).unwrap();
    let a = root.child("a").unwrap();
    let b = a.child("b").unwrap();
    let c = root.child("c").unwrap();
    let (stale_a, stale_b) = (a.clone(), b.clone());
    b.remove().unwrap();
    stale_b.force_charge(20).unwrap();
    h.drain_stocks();
    assert_eq!((a.usage(), root.usage()), (20, 20), "charged at /a");
    a.remove().unwrap();
    stale_b.uncharge(20);
    h.drain_stocks();
    assert_eq!((stale_a.usage(), root.usage()), (0, 0), "given back at /a");
    c.force_charge(100).unwrap();
    stale_a.uncharge(20); // /a holds nothing: an over-uncharge
    h.drain_stocks();
    assert_eq!((root.usage(), stale_a.events().underflow), (100, 1));
    assert!(c.charge(70).is_err(), "the root's limit holds");
}
