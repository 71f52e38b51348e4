//! Observability without features: events once per crossing, the largest
//! consumers, stall time, and the cgroup v2 files.

#![cfg(not(loom))]

mod common;

use common::Rng;
use splitcount::group::{cgroup, EventKind, GroupEvent, Hierarchy, HierarchyConfig};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn collect(g: &splitcount::group::Group) -> Arc<Mutex<Vec<GroupEvent>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    g.on_event(move |e| sink.lock().unwrap().push(e.clone()));
    seen
}

fn kinds(seen: &Mutex<Vec<GroupEvent>>, kind: EventKind) -> usize {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind == kind)
        .count()
}

/// Threads charge and uncharge around `high` at once: every crossing is
/// delivered exactly once (as many `HighCrossed` as `high` events counted),
/// each way back once, and the two alternate in sequence order.
#[test]
fn crossings_of_high_are_delivered_once_each_under_concurrent_charges() {
    // A small stock batch, so that charges reach the counter often.
    let h = Hierarchy::new(HierarchyConfig::default().stock_batch(4)).unwrap();
    let g = h.root().child("g").unwrap();
    g.set_high(300);
    let seen = collect(&g);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let g = g.clone();
            s.spawn(move || {
                let mut rng = Rng::new(t + 1);
                for _ in 0..20_000 {
                    let n = 1 + rng.below(400);
                    g.charge(n).unwrap();
                    g.uncharge(n);
                }
            });
        }
    });
    h.drain_stocks();
    let crossed = kinds(&seen, EventKind::HighCrossed);
    let back = kinds(&seen, EventKind::BackUnderHigh);
    assert!(crossed > 10, "the workload crossed high {crossed} times");
    assert_eq!(
        crossed as u64,
        g.events().high,
        "one event per counted crossing"
    );
    assert_eq!(crossed, back, "every crossing came back (usage is 0 now)");
    let mut events = seen.lock().unwrap().clone();
    events.sort_by_key(|e| e.seq);
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "no gaps");
    for pair in events.windows(2) {
        assert_ne!(pair[0].kind, pair[1].kind, "up and down alternate");
    }
    assert!(events.iter().all(|e| e.limit == 300 && e.group == g));
}

/// A group hammered at its limit from several threads reports one refusal
/// and one OOM stage per episode, not one per refused charge; an uncharge
/// below the limit starts the next episode.
#[test]
fn refusals_at_the_limit_are_reported_once_per_episode() {
    let h = Hierarchy::default();
    let g = h.root().child("g").unwrap();
    g.set_max(100).unwrap();
    let seen = collect(&g);
    let refused = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..2_000 {
                    if g.charge(1_000).is_err() {
                        refused.fetch_add(1, Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(refused.load(Relaxed), 8_000);
    assert_eq!(g.events().max, 8_000, "every refusal is counted …");
    assert_eq!(kinds(&seen, EventKind::MaxRefused), 1, "… one is reported");
    assert_eq!(kinds(&seen, EventKind::Oom), 1);
    // Below the limit again: the next refusal is a new episode.
    g.charge(90).unwrap();
    g.uncharge(90);
    h.drain_stocks();
    assert!(g.charge(1_000).is_err());
    assert_eq!(kinds(&seen, EventKind::MaxRefused), 2);
}

/// A channel delivers to another thread, and counts what it had to drop.
#[test]
fn a_full_event_channel_drops_and_counts() {
    let h = Hierarchy::new(HierarchyConfig::default().stock_batch(1)).unwrap();
    let g = h.root().child("g").unwrap();
    g.set_high(10);
    let rx = g.event_channel(2).unwrap();
    for _ in 0..5 {
        g.charge(20).unwrap();
        g.uncharge(20);
        h.drain_stocks();
    }
    let got: Vec<EventKind> = rx.try_iter().map(|e| e.kind).collect();
    assert_eq!(got, [EventKind::HighCrossed, EventKind::BackUnderHigh]);
    assert_eq!(rx.dropped(), 8);
    assert!(g.event_channel(0).is_err());
}

/// A panicking subscriber is skipped; the others still hear.
#[test]
fn a_panicking_subscriber_does_not_stop_the_others() {
    let h = Hierarchy::default();
    let g = h.root().child("g").unwrap();
    g.set_max(10).unwrap();
    g.on_event(|_| panic!("a bad subscriber"));
    let seen = collect(&g);
    assert!(g.charge(100).is_err());
    assert_eq!(kinds(&seen, EventKind::MaxRefused), 1);
}

/// `top(k)` against a model: children with random usages, the `k` largest
/// in order (ties by name), for every `k`.
#[test]
fn the_largest_consumers_match_a_model() {
    let mut rng = Rng::new(7);
    for round in 0..20 {
        let h = Hierarchy::default();
        let parent = h.root().child("p").unwrap();
        let mut model: Vec<(u64, String)> = Vec::new();
        for c in 0..rng.below(40) {
            let name = format!("c{c:02}");
            let child = parent.child(&name).unwrap();
            // Few distinct values: ties happen.
            let usage = rng.below(6) * 100;
            child.force_charge(usage).unwrap();
            if rng.below(3) == 0 {
                child.child("grandchild").unwrap().force_charge(50).unwrap();
                model.push((usage + 50, format!("/p/{name}")));
            } else {
                model.push((usage, format!("/p/{name}")));
            }
        }
        model.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for k in 0..=model.len() + 1 {
            let top: Vec<(u64, String)> = parent
                .top(k)
                .into_iter()
                .map(|c| (c.usage, c.group))
                .collect();
            let want: Vec<(u64, String)> = model.iter().take(k).cloned().collect();
            assert_eq!(top, want, "round {round}, k = {k}");
        }
    }
}

/// A refusal names who is using the memory under the refusing group.
#[test]
fn a_refusal_names_the_largest_consumers_under_the_limit() {
    let h = Hierarchy::default();
    let tenants = h.root().child("tenants").unwrap();
    tenants.set_max(1_000).unwrap();
    for (name, units) in [("a", 300), ("b", 500), ("c", 100), ("d", 50)] {
        tenants.child(name).unwrap().force_charge(units).unwrap();
    }
    let e = tenants.child("e").unwrap().charge(200).unwrap_err();
    let top: Vec<(&str, u64)> = e
        .top()
        .iter()
        .map(|c| (c.group.as_str(), c.usage))
        .collect();
    assert_eq!(
        top,
        [
            ("/tenants/b", 500),
            ("/tenants/a", 300),
            ("/tenants/c", 100)
        ]
    );
    assert!(
        e.to_string()
            .ends_with("; largest under /tenants: /tenants/b 500, /tenants/a 300, /tenants/c 100"),
        "{e}"
    );
}

/// Time in a slow reclaim hook is stall time of the charged group and its
/// ancestors, not of its siblings.
#[test]
fn time_spent_reclaiming_is_stall_time_up_the_tree() {
    let h = Hierarchy::default();
    let parent = h.root().child("parent").unwrap();
    let (a, b) = (parent.child("a").unwrap(), parent.child("b").unwrap());
    parent.set_max(100).unwrap();
    parent.on_reclaim(|_, _| {
        std::thread::sleep(Duration::from_millis(20));
        0
    });
    assert_eq!(a.stall(), Duration::ZERO);
    assert!(a.charge(1_000).is_err());
    assert!(a.stall() >= Duration::from_millis(20), "{:?}", a.stall());
    assert!(parent.stall() >= a.stall());
    assert!(h.root().stall() >= a.stall());
    assert_eq!(b.stall(), Duration::ZERO);
    // A charge that fits at once does not stall.
    let before = b.stall();
    b.charge(10).unwrap();
    assert_eq!(b.stall(), before);
}

/// The cgroup v2 files, byte for byte.
#[test]
fn cgroup_files_are_in_the_kernels_format() {
    let h = Hierarchy::default();
    let t = h.root().child("tenant").unwrap();
    let q = t.child("query").unwrap();
    t.set_max(1_000).unwrap();
    t.set_high(500);
    q.force_charge(600).unwrap(); // crosses high at the tenant
    assert!(q.charge(1_000).is_err()); // refused by the tenant
    let file = |g: &splitcount::group::Group, f: &str| g.cgroup_file(f).unwrap();
    assert_eq!(file(&t, "memory.current"), "600\n");
    assert_eq!(file(&t, "memory.max"), "1000\n");
    assert_eq!(file(&t, "memory.high"), "500\n");
    assert_eq!(file(&q, "memory.max"), "max\n");
    assert_eq!(file(&t, "memory.peak"), "600\n");
    assert_eq!(
        file(&t, "memory.events.local"),
        "low 0\nhigh 1\nmax 1\noom 1\noom_kill 0\noom_group_kill 0\n"
    );
    assert_eq!(
        file(&q, "memory.events.local"),
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"
    );
    assert_eq!(
        file(&h.root(), "memory.events"),
        "low 0\nhigh 1\nmax 1\noom 1\noom_kill 0\noom_group_kill 0\n",
        "the root's subtree holds the tenant's events"
    );
    assert_eq!(file(&q, "memory.stat"), "usage 600\nstocked 0\n");
    let err = t.cgroup_file("memory.swap.max").unwrap_err().to_string();
    assert!(err.contains("memory.current"), "{err}");
}

/// A subtree written as a directory tree reads back with `cat`, as scripts
/// read `/sys/fs/cgroup`.
#[test]
fn a_subtree_written_as_files_reads_back_with_cat() {
    let h = Hierarchy::default();
    let t = h.root().child("tenant").unwrap();
    t.child("q1").unwrap().force_charge(7).unwrap();
    t.child("q2").unwrap().set_max(4096).unwrap();
    let dir = std::env::temp_dir().join(format!("splitcount-cgroup-{}", std::process::id()));
    assert_eq!(cgroup::write_tree(&t, &dir).unwrap(), 3);
    let cat = |rel: &str| {
        let out = std::process::Command::new("cat")
            .arg(dir.join(rel))
            .output()
            .unwrap();
        assert!(out.status.success(), "cat {rel}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(cat("memory.current"), "7\n");
    assert_eq!(cat("q1/memory.current"), "7\n");
    assert_eq!(cat("q2/memory.max"), "4096\n");
    assert_eq!(cat("q1/memory.max"), "max\n");
    let files: BTreeMap<String, ()> = std::fs::read_dir(dir.join("q1"))
        .unwrap()
        .map(|e| (e.unwrap().file_name().into_string().unwrap(), ()))
        .collect();
    assert_eq!(files.len(), cgroup::FILES.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Written again into the same directory, the tree is the subtree as it is
/// now: a removed group's directory goes (it stayed, and a script saw the
/// group long after it was gone), while what the user keeps there stays.
#[test]
fn a_tree_written_again_drops_the_removed_groups_and_keeps_the_users_files() {
    let h = Hierarchy::default();
    let t = h.root().child("tenant").unwrap();
    let (q1, q2) = (t.child("q1").unwrap(), t.child("q2").unwrap());
    let deep = q2.child("deep").unwrap();
    let dir = std::env::temp_dir().join(format!("splitcount-cgroup-again-{}", std::process::id()));
    assert_eq!(cgroup::write_tree(&t, &dir).unwrap(), 4);
    std::fs::create_dir_all(dir.join("notes")).unwrap();
    std::fs::write(dir.join("notes/todo"), "keep").unwrap();
    std::fs::write(dir.join("README"), "keep").unwrap();
    deep.remove().unwrap();
    q2.remove().unwrap();
    assert_eq!(cgroup::write_tree(&t, &dir).unwrap(), 2);
    assert!(
        !dir.join("q2").exists(),
        "the removed group's directory went"
    );
    assert!(dir.join("q1/memory.current").is_file());
    assert!(dir.join("notes/todo").is_file() && dir.join("README").is_file());
    drop(q1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A group named like a cgroup file cannot be a directory beside it: the
/// tree is refused before anything is written, with the group named.
#[test]
fn a_group_named_like_a_cgroup_file_is_refused_before_anything_is_written() {
    let h = Hierarchy::default();
    let t = h.root().child("tenants").unwrap();
    t.child("acme").unwrap().force_charge(10).unwrap();
    t.child("memory.max").unwrap().force_charge(5).unwrap();
    let dir = std::env::temp_dir().join(format!("splitcount-cgroup-name-{}", std::process::id()));
    let e = cgroup::write_tree(&h.root(), &dir).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("/tenants/memory.max"), "{e}");
    assert!(!dir.exists(), "nothing written");
}
