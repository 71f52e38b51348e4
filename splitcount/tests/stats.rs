//! Per-group statistics: an oracle over random trees and threads, flushes
//! racing updates, the threshold, the background flusher, removal, dumps.

mod common;

use common::{online_cpu_ids, pin_to, unpin, Rng};
use splitcount::cpu::Machine;
use splitcount::group::{Group, Hierarchy, HierarchyConfig};
use splitcount::stat::{StatError, StatItem};
use std::time::{Duration, Instant};

fn hierarchy(machine: Option<&Machine>) -> Hierarchy {
    let mut cfg = HierarchyConfig::default().stats(vec![
        StatItem::gauge("anon"),
        StatItem::gauge("file"),
        StatItem::event("faults"),
    ]);
    if let Some(m) = machine {
        cfg = cfg.machine(m);
    }
    Hierarchy::new(cfg).unwrap()
}

/// A random tree: each new group's parent is a random earlier group.
fn random_tree(h: &Hierarchy, n: usize, rng: &mut Rng) -> (Vec<Group>, Vec<Option<usize>>) {
    let mut groups = vec![h.root()];
    let mut parents = vec![None];
    for i in 1..n {
        let p = rng.below(i as u64) as usize;
        groups.push(groups[p].child(&format!("g{i}")).unwrap());
        parents.push(Some(p));
    }
    (groups, parents)
}

fn subtree_sums(own: &[i64], parents: &[Option<usize>]) -> Vec<i64> {
    let mut hier = own.to_vec();
    for i in (1..own.len()).rev() {
        // parents are earlier than children, so a reverse pass is postorder
        let p = parents[i].unwrap();
        hier[p] += hier[i];
    }
    hier
}

#[test]
fn after_a_forced_flush_every_group_matches_the_oracle() {
    for seed in 1..6u64 {
        let h = hierarchy(None);
        let mut rng = Rng::new(seed);
        let (groups, parents) = random_tree(&h, 40, &mut rng);
        let anon = h.stat_id("anon").unwrap();
        let own: Vec<Vec<i64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u64)
                .map(|t| {
                    let groups = &groups;
                    s.spawn(move || {
                        let mut rng = Rng::new(seed * 100 + t);
                        let mut own = vec![0i64; groups.len()];
                        for _ in 0..20_000 {
                            let g = rng.below(groups.len() as u64) as usize;
                            let d = rng.delta(100);
                            groups[g].mod_stat(anon, d).unwrap();
                            own[g] += d;
                        }
                        own
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let own: Vec<i64> = (0..groups.len())
            .map(|g| own.iter().map(|o| o[g]).sum())
            .collect();
        let hier = subtree_sums(&own, &parents);
        assert!(h.root().flush(true));
        for (i, g) in groups.iter().enumerate() {
            assert_eq!(g.stat_local(anon).unwrap(), own[i], "local of {}", g.path());
            assert_eq!(
                g.stat(anon).unwrap(),
                hier[i],
                "hierarchical of {}",
                g.path()
            );
        }
    }
}

#[test]
fn flushes_racing_updates_end_exact() {
    let h = hierarchy(None);
    let mut rng = Rng::new(9);
    let (groups, parents) = random_tree(&h, 30, &mut rng);
    let file = h.stat_id("file").unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let own: Vec<Vec<i64>> = std::thread::scope(|s| {
        // 2 readers/flushers...
        for r in 0..2u64 {
            let (groups, stop) = (&groups, &stop);
            s.spawn(move || {
                let mut rng = Rng::new(77 + r);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let g = &groups[rng.below(groups.len() as u64) as usize];
                    if rng.below(4) == 0 {
                        g.flush(true);
                    } else {
                        let _ = g.stat(file).unwrap();
                    }
                }
            });
        }
        // ...and 6 updaters: 8 threads on 2 cores.
        let hs: Vec<_> = (0..6u64)
            .map(|t| {
                let groups = &groups;
                s.spawn(move || {
                    let mut rng = Rng::new(500 + t);
                    let mut own = vec![0i64; groups.len()];
                    let online = online_cpu_ids();
                    for op in 0..30_000 {
                        if op % 1_000 == 0 {
                            pin_to(online[rng.below(online.len() as u64) as usize]);
                        }
                        let g = rng.below(groups.len() as u64) as usize;
                        let d = rng.delta(20);
                        groups[g].mod_stat(file, d).unwrap();
                        own[g] += d;
                    }
                    unpin(&online);
                    own
                })
            })
            .collect();
        let own = hs.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        own
    });
    let own: Vec<i64> = (0..groups.len())
        .map(|g| own.iter().map(|o| o[g]).sum())
        .collect();
    let hier = subtree_sums(&own, &parents);
    h.root().flush(true);
    for (i, g) in groups.iter().enumerate() {
        assert_eq!(g.stat(file).unwrap(), hier[i], "{}", g.path());
        assert_eq!(g.stat_local(file).unwrap(), own[i], "{}", g.path());
    }
}

#[test]
fn below_the_threshold_a_read_does_not_flush_and_above_it_does() {
    let m = Machine::simulated(4, 1).unwrap();
    let h = hierarchy(Some(&m));
    let g = h.root().child("g").unwrap();
    let anon = h.stat_id("anon").unwrap();
    let threshold = h.stats().threshold(); // 64 · 4 CPUs
    assert_eq!(threshold, 256);
    // 200 units, spread so that every CPU moves its batches: still ≤ 256.
    for i in 0..200 {
        m.set_current_cpu(i % 4).unwrap();
        g.mod_stat(anon, 1).unwrap();
    }
    let before = h.stats().flushes();
    assert_eq!(g.stat(anon).unwrap(), 0, "not flushed: the old value");
    assert_eq!(h.stats().flushes(), before);
    // 400 more: 150 per CPU, two batches of 64 each moved: 512 > 256.
    for i in 0..400 {
        m.set_current_cpu(i % 4).unwrap();
        g.mod_stat(anon, 1).unwrap();
    }
    assert_eq!(g.stat(anon).unwrap(), 600, "flushed");
    assert_eq!(h.stats().flushes(), before + 1);
    assert_eq!(
        h.root().stat(anon).unwrap(),
        600,
        "the root counted the same updates"
    );
}

#[test]
fn the_background_flusher_bounds_staleness() {
    let h = hierarchy(None);
    let g = h.root().child("g").unwrap();
    let anon = h.stat_id("anon").unwrap();
    let period = Duration::from_millis(200);
    h.start_flusher(period).unwrap();
    g.mod_stat(anon, 5).unwrap(); // far below the threshold: reads do not flush
    let start = Instant::now();
    while g.stat(anon).unwrap() != 5 {
        assert!(
            start.elapsed() <= 2 * period,
            "not visible within two periods"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    h.stop_flusher();
    g.mod_stat(anon, 1).unwrap();
    std::thread::sleep(2 * period);
    assert_eq!(
        g.stat(anon).unwrap(),
        5,
        "stopped: nothing flushes any more"
    );
}

#[test]
fn dropping_the_hierarchy_stops_its_flusher() {
    let h = hierarchy(None);
    h.start_flusher(Duration::from_millis(10)).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    drop(h); // joins the flusher; the test would hang otherwise
}

#[test]
fn a_removed_groups_statistics_stay_in_its_ancestors() {
    let h = hierarchy(None);
    let a = h.root().child("a").unwrap();
    let b = a.child("b").unwrap();
    let anon = h.stat_id("anon").unwrap();
    b.mod_stat(anon, 7).unwrap();
    a.mod_stat(anon, 1).unwrap();
    b.remove().unwrap();
    b.mod_stat(anon, 2).unwrap(); // goes to a now
    a.flush(true);
    assert_eq!(a.stat(anon).unwrap(), 10);
    assert_eq!(a.stat_local(anon).unwrap(), 3);
    h.root().flush(true); // a's flush left the root's share pending
    assert_eq!(h.root().stat(anon).unwrap(), 10);
}

#[test]
fn events_refuse_negative_deltas_and_unknown_items_are_errors() {
    let h = hierarchy(None);
    let g = h.root().child("g").unwrap();
    let faults = h.stat_id("faults").unwrap();
    assert!(matches!(
        g.mod_stat(faults, -1),
        Err(StatError::NegativeEvent { .. })
    ));
    g.mod_stat(faults, 3).unwrap();
    assert!(h.stat_id("nope").is_none());
    let other = Hierarchy::new(
        HierarchyConfig::default()
            .stats((0..5).map(|i| StatItem::gauge(&format!("s{i}"))).collect()),
    )
    .unwrap();
    let far = other.stat_id("s4").unwrap();
    assert_eq!(g.mod_stat(far, 1), Err(StatError::NoSuchItem(4)));
    assert_eq!(g.stat(far), Err(StatError::NoSuchItem(4)));
}

#[test]
fn invalid_schemas_are_refused() {
    for items in [
        vec![StatItem::gauge("a"), StatItem::gauge("a")],
        vec![StatItem::gauge("")],
        vec![StatItem::gauge("has space")],
    ] {
        assert!(Hierarchy::new(HierarchyConfig::default().stats(items)).is_err());
    }
}

#[test]
fn the_text_dump_and_the_snapshot() {
    let h = hierarchy(None);
    let a = h.root().child("a").unwrap();
    let b = a.child("b").unwrap();
    let anon = h.stat_id("anon").unwrap();
    let faults = h.stat_id("faults").unwrap();
    a.mod_stat(anon, 4096).unwrap();
    b.mod_stat(anon, 8192).unwrap();
    b.mod_stat(faults, 2).unwrap();
    a.set_max(1 << 20).unwrap();
    a.flush(true);
    assert_eq!(
        a.memory_stat(),
        "anon 12288\nfile 0\nfaults 2\nlocal_anon 4096\nlocal_file 0\nlocal_faults 0\n"
    );
    let snap = a.snapshot();
    assert_eq!(snap.stats["anon"], 12288);
    assert_eq!(snap.max, Some(1 << 20));
    assert_eq!(snap.children.len(), 1);
    assert_eq!(snap.children[0].local["faults"], 2);
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(json["children"][0]["path"], "/a/b");
    assert_eq!(json["high"], serde_json::Value::Null);
}

#[test]
fn a_ratelimited_read_trusts_a_recent_flush() {
    let m = Machine::simulated(2, 1).unwrap();
    let h = hierarchy(Some(&m));
    let g = h.root().child("g").unwrap();
    let anon = h.stat_id("anon").unwrap();
    h.start_flusher(Duration::from_secs(3600)).unwrap(); // sets the period, never fires here
    h.root().flush(true);
    for i in 0..1000 {
        m.set_current_cpu(i % 2).unwrap();
        g.mod_stat(anon, 1).unwrap(); // far above the 128-unit threshold
    }
    let flushes = h.stats().flushes();
    assert_eq!(
        g.stat_ratelimited(anon).unwrap(),
        0,
        "a flush happened within the period"
    );
    assert_eq!(h.stats().flushes(), flushes);
    assert_eq!(g.stat(anon).unwrap(), 1000, "the plain read flushes");
    h.stop_flusher();
}
