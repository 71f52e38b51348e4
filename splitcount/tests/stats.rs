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
    assert_eq!(g.mod_stat(far, 1), Err(StatError::ForeignItem(4)));
    assert_eq!(g.stat(far), Err(StatError::ForeignItem(4)));
}

#[test]
fn invalid_schemas_are_refused() {
    for items in [
        vec![StatItem::gauge("a"), StatItem::gauge("a")],
        vec![StatItem::gauge("")],
        vec![StatItem::gauge("has space")],
        vec![StatItem::gauge(".")],
        vec![StatItem::event("..")],
        vec![StatItem::gauge("a/b")],
        vec![StatItem::gauge(&"x".repeat(256))],
        // Keys `memory.stat` prints of its own: a second `usage` line, or
        // an item's `local_` line twice.
        vec![StatItem::gauge("usage")],
        vec![StatItem::event("stocked")],
        vec![StatItem::gauge("x"), StatItem::gauge("local_x")],
        vec![StatItem::gauge("local_usage")],
    ] {
        assert!(Hierarchy::new(HierarchyConfig::default().stats(items)).is_err());
    }
    // Names that only contain them are fine.
    let fine = ["usage_bytes", "stocked_units", "nonlocal_x", "x_local_"];
    let items = fine.iter().map(|n| StatItem::gauge(n)).collect();
    assert!(Hierarchy::new(HierarchyConfig::default().stats(items)).is_ok());
    // The message says it once, and cuts a long name.
    let e =
        Hierarchy::new(HierarchyConfig::default().stats(vec![StatItem::gauge(&"y".repeat(299))]))
            .unwrap_err()
            .to_string();
    assert_eq!(e.matches("schema").count(), 1, "{e}");
    assert!(e.len() < 200, "{e}");
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
        "usage 0\nstocked 0\nanon 12288\nfile 0\nfaults 2\nlocal_anon 4096\nlocal_file 0\nlocal_faults 0\n"
    );
    let snap = a.snapshot();
    assert_eq!(snap.root().stats["anon"], 12288);
    assert_eq!(snap.root().max, Some(1 << 20));
    let children: Vec<_> = snap.children(0).collect();
    assert_eq!(children.len(), 1);
    assert_eq!(children[0].local["faults"], 2);
    #[cfg(feature = "serde")]
    {
        let json = serde_json::to_value(&snap).unwrap();
        assert_eq!(json["groups"][1]["path"], "/a/b");
        assert_eq!(json["groups"][1]["parent"], 0);
        assert_eq!(json["groups"][0]["high"], serde_json::Value::Null);
        // And back: what was written reads back as the same snapshot.
        let back: splitcount::group::Snapshot = serde_json::from_value(json).unwrap();
        assert_eq!(back, snap);
    }
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

/// A group works only with the `Stats` that made it: another hierarchy's
/// `Stats` (other schema, other machine) is refused instead of writing into
/// another group's slots or past the end of a chunk.
#[test]
fn a_group_refuses_the_statistics_of_another_hierarchy() {
    use splitcount::stat::Stats;
    let small = Machine::simulated(2, 1).unwrap();
    let big = Machine::simulated(64, 1).unwrap();
    let mine = Stats::new(&small, vec![StatItem::gauge("x")]).unwrap();
    let other = Stats::new(&big, vec![StatItem::gauge("x"), StatItem::gauge("y")]).unwrap();
    let g = mine.group(None).unwrap();
    big.set_current_cpu(63).unwrap();
    assert_eq!(g.mod_stat(&other, 1, 5), Err(StatError::ForeignGroup));
    assert_eq!(g.mod_stat(&other, 0, 5), Err(StatError::ForeignGroup));
    assert!(!other.flush(&g, true), "a foreign group is not flushed");
    assert!(matches!(
        other.group(Some(&g)),
        Err(StatError::ForeignGroup)
    ));
    g.mod_stat(&mine, 0, 5).unwrap();
    assert!(mine.flush(&g, true));
    assert_eq!(g.local_value(0), Some(5));
}

/// The documented staleness bound: a read that does not flush misses at
/// most `2 · 64 · ncpu` units of |delta|. The reviewer's case first: with
/// groups r → x → g and r → s on one CPU, a group over its threshold must
/// not stop its ancestors from counting later updates.
#[test]
fn an_ancestor_below_its_threshold_still_counts_updates_below_a_flushable_group() {
    let m = Machine::simulated(1, 1).unwrap();
    let h = hierarchy(Some(&m));
    let anon = h.stat_id("anon").unwrap();
    let r = h.root();
    let x = r.child("x").unwrap();
    let g = x.child("g").unwrap();
    let s = r.child("s").unwrap();
    g.mod_stat(anon, 60).unwrap();
    s.mod_stat(anon, 4).unwrap();
    g.mod_stat(anon, 10).unwrap();
    for _ in 0..1000 {
        g.mod_stat(anon, 1000).unwrap();
    }
    let truth = 60 + 4 + 10 + 1000 * 1000;
    assert_eq!(g.stat(anon).unwrap(), 60 + 10 + 1_000_000);
    let bound = 2 * 64 * m.cpus() as i64;
    let seen = r.stat(anon).unwrap();
    assert!(
        (truth - seen).abs() <= bound,
        "root reads {seen}, truth {truth}"
    );
}

/// Random walks on random trees over simulated machines of several sizes:
/// after every update, a read of a random group (which flushes only when
/// its threshold says so) is within `2 · 64 · ncpu` of the truth.
#[test]
fn reads_that_skip_the_flush_stay_within_the_staleness_bound() {
    for (cpus, seed) in [(1usize, 1u64), (2, 2), (4, 3), (16, 4)] {
        let m = Machine::simulated(cpus, 1).unwrap();
        let h = hierarchy(Some(&m));
        let anon = h.stat_id("anon").unwrap();
        let mut rng = Rng::new(seed);
        let (groups, parents) = random_tree(&h, 12, &mut rng);
        let mut own = vec![0i64; groups.len()];
        let bound = 2 * 64 * cpus as i64;
        let mut worst = 0;
        for step in 0..40_000 {
            m.set_current_cpu(rng.below(cpus as u64) as usize).unwrap();
            let g = rng.below(groups.len() as u64) as usize;
            let d = match rng.below(10) {
                0 => rng.delta(5_000),
                _ => rng.delta(40),
            };
            groups[g].mod_stat(anon, d).unwrap();
            own[g] += d;
            let hier = subtree_sums(&own, &parents);
            let r = rng.below(groups.len() as u64) as usize;
            let seen = groups[r].stat(anon).unwrap();
            let miss = (hier[r] - seen).abs();
            worst = worst.max(miss);
            assert!(
                miss <= bound,
                "{cpus} CPUs, step {step}: {} reads {seen}, truth {}, bound {bound}",
                groups[r].path(),
                hier[r]
            );
        }
        println!("{cpus} CPUs: worst miss {worst} of bound {bound}");
    }
}

/// A flush racing updates of a group on another thread, round after round:
/// every update is folded by this flush or by the next, never lost. The
/// flusher's clear of a node's on-list mark and the updater's test of it
/// are a Dekker pair (each stores, then loads what the other stored): the
/// clear must be sequentially consistent, or on x86 it may still sit in the
/// store buffer while the flusher reads the value; the updater then sees
/// the mark set and does not push, and its update is never folded. The
/// statistics live on a 64-CPU simulated machine, so every flush opens 64
/// such windows (one per CPU: clear the mark, then fold that CPU's value),
/// and the group has no parent, so no locked instruction closes them.
#[test]
fn a_flush_racing_updates_on_another_thread_never_loses_them() {
    use common::SpinBarrier;
    use splitcount::stat::Stats;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    const CPUS: usize = 64;
    let online = online_cpu_ids();
    if online.len() < 2 {
        println!("skipped: needs two CPUs");
        return;
    }
    let m = Machine::simulated(CPUS, 1).unwrap();
    let stats = Arc::new(Stats::new(&m, vec![StatItem::gauge("x")]).unwrap());
    let g = stats.group(None).unwrap();
    let barrier = Arc::new(SpinBarrier::new(2));
    let stop = Arc::new(AtomicBool::new(false));
    let update_everywhere = {
        let (m, stats, g) = (m.clone(), stats.clone(), g.clone());
        move |rng: &mut Rng, spread: bool| {
            for cpu in 0..CPUS {
                m.set_current_cpu(cpu).unwrap();
                g.mod_stat(&stats, 0, 1).unwrap();
                if spread {
                    for _ in 0..rng.below(8) {
                        std::hint::spin_loop();
                    }
                }
            }
        }
    };
    let updater = {
        let (barrier, stop, cpu) = (barrier.clone(), stop.clone(), online[1]);
        std::thread::spawn(move || {
            pin_to(cpu);
            let mut rng = Rng::new(11);
            loop {
                // The group is on every CPU's list when the round starts.
                update_everywhere(&mut rng, false);
                barrier.wait();
                if stop.load(Relaxed) {
                    return;
                }
                update_everywhere(&mut rng, true);
                barrier.wait();
                barrier.wait(); // the flusher has checked the round
            }
        })
    };
    pin_to(online[0]);
    let (start, mut rounds) = (Instant::now(), 0i64);
    while rounds < 100_000 && start.elapsed() < Duration::from_secs(4) {
        barrier.wait();
        stats.flush(&g, true);
        barrier.wait();
        rounds += 1;
        // Whatever the interleaving, every update of the round is folded
        // by now or pushed for the next flush.
        stats.flush(&g, true);
        assert_eq!(
            g.local_value(0),
            Some(2 * CPUS as i64 * rounds),
            "round {rounds}"
        );
        barrier.wait();
    }
    stop.store(true, Relaxed);
    barrier.wait();
    updater.join().unwrap();
    unpin(&online);
    println!("{rounds} rounds");
}

/// Standalone statistics (one item) on a random tree of `n` groups: each
/// new group's parent is a random earlier one. `kept`: groups made by
/// `Stats::kept_group` (as a hierarchy makes them), else by `Stats::group`.
fn standalone_tree(
    stats: &splitcount::stat::Stats,
    n: usize,
    rng: &mut Rng,
    kept: bool,
) -> (
    Vec<std::sync::Arc<splitcount::stat::StatGroup>>,
    Vec<Option<usize>>,
) {
    let make = |parent: Option<&std::sync::Arc<splitcount::stat::StatGroup>>| {
        if kept {
            stats.kept_group(parent).unwrap()
        } else {
            stats.group(parent).unwrap()
        }
    };
    let mut groups = vec![make(None)];
    let mut parents = vec![None];
    for i in 1..n {
        let p = rng.below(i as u64) as usize;
        groups.push(make(Some(&groups[p])));
        parents.push(Some(p));
    }
    (groups, parents)
}

/// The naive reader: every group's own updates and its subtree's, summed
/// from the updates themselves (what a full walk of every group's per-CPU
/// values adds up to).
fn full_walk(own: &[i64], parents: &[Option<usize>]) -> (Vec<i64>, Vec<i64>) {
    (own.to_vec(), subtree_sums(own, parents))
}

/// 10,000 groups in a random tree; three threads update random groups on
/// random CPUs of an 8-CPU simulated machine while a fourth flushes the
/// root and random subtrees (so groups are carried from one flush to the
/// next, and deltas wait in the pending values of the flushed groups'
/// parents). A last flush of the root leaves every group's local and
/// hierarchical values equal to the full walk's, without any other flush.
#[test]
fn flushes_of_a_ten_thousand_group_tree_equal_the_full_walk() {
    flushes_racing_updates_equal_the_full_walk(10_000, 2, 60_000, false);
}

/// The same with 11 items: three chunks of folded values (4 + 4 + 3) and
/// two lines of pending values, every item updated.
#[test]
fn flushes_of_a_schema_of_many_items_fold_every_item() {
    flushes_racing_updates_equal_the_full_walk(2_000, 11, 40_000, false);
}

/// The same at the edge of the folded values kept inside a group: five
/// items (15 values: the group's own two lines, the last value of the
/// second line unused) and six (18 values: an allocation of three lines).
#[test]
fn flushes_at_the_edge_of_the_inline_folded_values_fold_every_item() {
    flushes_racing_updates_equal_the_full_walk(1_000, 5, 20_000, false);
    flushes_racing_updates_equal_the_full_walk(1_000, 6, 20_000, false);
}

/// The same with groups whose references the flusher keeps from one push
/// to the next (a hierarchy's groups), retired at random while they are
/// updated and flushed: no update is lost, and once every group is retired
/// and the root flushed, no reference is left but the test's and the
/// children's.
#[test]
fn flushes_of_kept_groups_retired_under_updates_equal_the_full_walk() {
    flushes_racing_updates_equal_the_full_walk(3_000, 2, 60_000, true);
}

/// `groups` groups in a random tree with `items` items (even ones gauges,
/// odd ones events); three updater threads of `updates` each and a thread
/// flushing the root and random subtrees; then one flush of the root and
/// every group's values against the full walk. With `kept`, the groups are
/// `Stats::kept_group`s, and the flushing thread also retires a random
/// group after one flush in four.
fn flushes_racing_updates_equal_the_full_walk(
    groups: usize,
    items: usize,
    updates: usize,
    kept: bool,
) {
    use splitcount::stat::Stats;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let m = Machine::simulated(8, 1).unwrap();
    let schema = (0..items)
        .map(|i| {
            if i % 2 == 0 {
                StatItem::gauge(&format!("g{i}"))
            } else {
                StatItem::event(&format!("e{i}"))
            }
        })
        .collect();
    let stats = Stats::new(&m, schema).unwrap();
    let mut rng = Rng::new(groups as u64 + items as u64);
    let (all, parents) = standalone_tree(&stats, groups, &mut rng, kept);
    let stop = AtomicBool::new(false);
    let own: Vec<Vec<Vec<i64>>> = std::thread::scope(|s| {
        let (stats, all, stop, m) = (&stats, &all, &stop, &m);
        s.spawn(move || {
            let mut rng = Rng::new(7);
            let mut flushes = 0u64;
            while !stop.load(Relaxed) || flushes < 50 {
                let g = if rng.below(3) == 0 {
                    &all[0]
                } else {
                    &all[rng.below(groups as u64) as usize]
                };
                stats.flush(g, true);
                if kept && rng.below(4) == 0 {
                    stats.retire(&all[rng.below(groups as u64) as usize]);
                }
                flushes += 1;
            }
        });
        let updaters: Vec<_> = (0..3u64)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = Rng::new(100 + t);
                    let mut own = vec![vec![0i64; groups]; items];
                    for _ in 0..updates {
                        // The simulated CPU is shared by the threads: an
                        // update lands on whichever CPU was set last.
                        m.set_current_cpu(rng.below(8) as usize).unwrap();
                        let g = rng.below(groups as u64) as usize;
                        let item = rng.below(items as u64) as usize;
                        let d = if item % 2 == 0 {
                            rng.delta(1000)
                        } else {
                            rng.below(10) as i64
                        };
                        all[g].mod_stat(stats, item, d).unwrap();
                        own[item][g] += d;
                    }
                    own
                })
            })
            .collect();
        let own = updaters.into_iter().map(|u| u.join().unwrap()).collect();
        stop.store(true, Relaxed);
        own
    });
    assert!(stats.flush(&all[0], true));
    for item in 0..items {
        let own: Vec<i64> = (0..groups)
            .map(|g| own.iter().map(|o| o[item][g]).sum())
            .collect();
        let (local, hier) = full_walk(&own, &parents);
        for (i, g) in all.iter().enumerate() {
            assert_eq!(g.local_value(item), Some(local[i]), "local {item} of {i}");
            assert_eq!(g.value(item), Some(hier[i]), "hierarchical {item} of {i}");
        }
        assert_eq!(all[0].value(items), None, "past the schema");
    }
    if kept {
        for g in &all {
            stats.retire(g);
        }
        assert!(stats.flush(&all[0], true));
        let mut children = vec![0; groups];
        for p in parents.iter().flatten() {
            children[*p] += 1;
        }
        for (i, g) in all.iter().enumerate() {
            assert_eq!(
                std::sync::Arc::strong_count(g),
                1 + children[i],
                "references to group {i} after every group was retired"
            );
        }
    }
}

/// A flush of a subtree folds that subtree and nothing else: its groups
/// read their exact values, the groups above and beside it keep theirs
/// until a flush reaches them, and that later flush neither loses nor
/// counts twice what the first one passed up.
#[test]
fn a_subtree_flush_folds_its_subtree_only() {
    use splitcount::stat::Stats;
    let m = Machine::simulated(2, 1).unwrap();
    let stats = Stats::new(&m, vec![StatItem::gauge("x")]).unwrap();
    // r ─ a ─ b        r ─ d
    //       └ c
    let r = stats.group(None).unwrap();
    let a = stats.group(Some(&r)).unwrap();
    let b = stats.group(Some(&a)).unwrap();
    let c = stats.group(Some(&a)).unwrap();
    let d = stats.group(Some(&r)).unwrap();
    for (cpu, g, delta) in [
        (0, &b, 1),
        (1, &c, 10),
        (0, &a, 100),
        (1, &d, 1000),
        (0, &r, 5),
    ] {
        m.set_current_cpu(cpu).unwrap();
        g.mod_stat(&stats, 0, delta).unwrap();
    }
    assert!(stats.flush(&a, true));
    assert_eq!(
        [b.value(0), c.value(0), a.value(0), a.local_value(0)],
        [Some(1), Some(10), Some(111), Some(100)]
    );
    assert_eq!([r.value(0), d.value(0)], [Some(0), Some(0)], "outside a");
    // Updates after the first flush, inside and outside the subtree.
    m.set_current_cpu(1).unwrap();
    b.mod_stat(&stats, 0, 2).unwrap();
    d.mod_stat(&stats, 0, 2000).unwrap();
    assert!(stats.flush(&r, true));
    assert_eq!(
        [
            b.value(0),
            a.value(0),
            d.value(0),
            r.value(0),
            r.local_value(0)
        ],
        [Some(3), Some(113), Some(3000), Some(3118), Some(5)]
    );
}

/// A group whose last handle is dropped while its updates wait on a CPU's
/// list stays alive until a flush has folded them: a flush of another
/// subtree carries it, a flush of its root folds it and then frees it. The
/// same for a parent holding deltas that a flush of its child passed up.
#[test]
fn a_dropped_group_lives_until_its_updates_are_folded() {
    use splitcount::stat::Stats;
    use std::sync::Arc;
    let m = Machine::simulated(2, 1).unwrap();
    let stats = Stats::new(&m, vec![StatItem::gauge("x")]).unwrap();
    let r = stats.group(None).unwrap();
    let a = stats.group(Some(&r)).unwrap();
    let gone = stats.group(Some(&r)).unwrap();
    m.set_current_cpu(1).unwrap();
    gone.mod_stat(&stats, 0, 7).unwrap();
    a.mod_stat(&stats, 0, 1).unwrap();
    let weak = Arc::downgrade(&gone);
    drop(gone);
    assert!(stats.flush(&a, true));
    assert!(
        weak.upgrade().is_some(),
        "carried: its update is not folded"
    );
    assert!(stats.flush(&r, true));
    assert!(weak.upgrade().is_none(), "folded, then freed");
    assert_eq!(r.value(0), Some(8));

    // r ─ p ─ c: a flush of c passes its delta to p, whose handles are
    // then all dropped (c's included).
    let p = stats.group(Some(&r)).unwrap();
    let c = stats.group(Some(&p)).unwrap();
    c.mod_stat(&stats, 0, 30).unwrap();
    assert!(stats.flush(&c, true));
    let weak = Arc::downgrade(&p);
    drop((p, c));
    assert!(weak.upgrade().is_some(), "p holds a delta not folded");
    assert!(stats.flush(&r, true));
    assert!(weak.upgrade().is_none(), "folded, then freed");
    assert_eq!(r.value(0), Some(38));
}

/// A group made by `Stats::kept_group` keeps one reference per CPU it was
/// updated on, from the first fold to its retirement: later pushes take
/// none. Retired, it gives them back — also the one of a node carried by
/// a flush of another subtree — and pushes take their own again.
#[test]
fn a_kept_group_holds_one_reference_per_cpu_until_it_is_retired() {
    use splitcount::stat::Stats;
    use std::sync::Arc;
    let m = Machine::simulated(2, 1).unwrap();
    let stats = Stats::new(&m, vec![StatItem::gauge("x")]).unwrap();
    let r = stats.kept_group(None).unwrap();
    let (a, b) = (
        stats.kept_group(Some(&r)).unwrap(),
        stats.kept_group(Some(&r)).unwrap(),
    );
    for cpu in [0, 1] {
        m.set_current_cpu(cpu).unwrap();
        a.mod_stat(&stats, 0, 1).unwrap();
    }
    assert_eq!(Arc::strong_count(&a), 3, "ours and a push's per CPU");
    assert!(stats.flush(&r, true));
    assert_eq!(Arc::strong_count(&a), 3, "the pushes' references, kept");
    for round in 0..3 {
        for cpu in [0, 1] {
            m.set_current_cpu(cpu).unwrap();
            a.mod_stat(&stats, 0, 1).unwrap();
        }
        assert_eq!(Arc::strong_count(&a), 3, "round {round}: no push took one");
        assert!(stats.flush(&r, true));
    }
    assert_eq!(a.value(0), Some(8));

    // Carried by a flush of `b`'s subtree when it is retired: the retiring
    // flush folds it and gives its reference back.
    a.mod_stat(&stats, 0, 1).unwrap();
    assert!(stats.flush(&b, true));
    stats.retire(&a);
    assert_eq!(Arc::strong_count(&a), 1, "retired: none kept");
    assert_eq!(a.value(0), Some(9));
    stats.retire(&a); // twice: nothing more to give back
    assert_eq!(Arc::strong_count(&a), 1);

    // Retired, a push takes its own reference and the fold gives it back.
    a.mod_stat(&stats, 0, 1).unwrap();
    assert_eq!(Arc::strong_count(&a), 2);
    let weak = Arc::downgrade(&a);
    drop(a);
    assert!(weak.upgrade().is_some(), "on a list: alive");
    assert!(stats.flush(&r, true));
    assert!(weak.upgrade().is_none(), "folded, then freed");
    assert_eq!(r.value(0), Some(10));

    // Kept references go with the `Stats`.
    b.mod_stat(&stats, 0, 1).unwrap();
    assert!(stats.flush(&r, true));
    assert_eq!(Arc::strong_count(&b), 2);
    drop(stats);
    assert_eq!(Arc::strong_count(&b), 1);
}

/// Groups of two trees share the statistics: a flush of one root folds its
/// tree and leaves the other tree's updates for that tree's flush.
#[test]
fn a_flush_of_one_root_leaves_another_tree_alone() {
    use splitcount::stat::Stats;
    let m = Machine::simulated(2, 1).unwrap();
    let stats = Stats::new(&m, vec![StatItem::gauge("x")]).unwrap();
    let (r1, r2) = (stats.group(None).unwrap(), stats.group(None).unwrap());
    let (g1, g2) = (
        stats.group(Some(&r1)).unwrap(),
        stats.group(Some(&r2)).unwrap(),
    );
    g1.mod_stat(&stats, 0, 1).unwrap();
    g2.mod_stat(&stats, 0, 2).unwrap();
    assert!(stats.flush(&r1, true));
    assert_eq!([r1.value(0), g1.value(0)], [Some(1), Some(1)]);
    assert_eq!([r2.value(0), g2.value(0)], [Some(0), Some(0)]);
    assert!(stats.flush(&r2, true));
    assert_eq!(
        [r1.value(0), r2.value(0), g2.value(0)],
        [Some(1), Some(2), Some(2)]
    );
}

/// A `StatId` of another hierarchy is refused: its index named another
/// item here, of another kind — a negative delta meant for an event count
/// landed on a gauge (a helper's program), past the events' sign check.
#[test]
fn a_stat_id_of_another_hierarchy_is_refused() {
    use splitcount::group::{Hierarchy, HierarchyConfig};
    use splitcount::stat::{StatError, StatItem};
    let a = Hierarchy::new(
        HierarchyConfig::default().stats(vec![StatItem::gauge("anon"), StatItem::event("faults")]),
    )
    .unwrap();
    let b =
        Hierarchy::new(HierarchyConfig::default().stats(vec![StatItem::event("faults")])).unwrap();
    let g = a.root().child("g").unwrap();
    let foreign = b.stat_id("faults").unwrap();
    assert_eq!(g.mod_stat(foreign, -5), Err(StatError::ForeignItem(0)));
    assert_eq!(g.stat(foreign), Err(StatError::ForeignItem(0)));
    let anon = a.stat_id("anon").unwrap();
    assert_eq!(g.stat(anon), Ok(0), "nothing landed on the gauge");
    g.mod_stat(anon, -5).unwrap();
    g.flush(true);
    assert_eq!(g.stat_local(anon), Ok(-5));
}
