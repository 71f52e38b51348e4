//! Names are unique among *live* siblings, also while groups are removed
//! under the callers, and `child_or_create_with` configures a group before
//! anyone can see it. (That `child_or_create` and `lookup` skip a group
//! marked removed but not yet out of its parent's map — a window too short
//! to hit from outside — is checked where the window can be opened by hand:
//! the unit tests of `group/hierarchy.rs`.)

#![cfg(not(loom))]

use splitcount::charge::UNLIMITED;
use splitcount::group::{Group, GroupError, Hierarchy};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Groups removed so far, in order: a caller that read `len` before its
/// call must not get any of the first `len`.
#[derive(Default)]
struct Removed(Mutex<Vec<Group>>);

impl Removed {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn was_removed_before(&self, g: &Group, len: usize) -> bool {
        self.0.lock().unwrap()[..len].contains(g)
    }
    fn push(&self, g: Group) {
        self.0.lock().unwrap().push(g);
    }
}

#[test]
fn racing_removals_never_hand_out_a_group_removed_before_the_call() {
    let h = Hierarchy::default();
    let tenants = h.root().child("tenants").unwrap();
    let removed = Arc::new(Removed::default());
    let stop = Arc::new(AtomicBool::new(false));
    let remover = {
        let (t, removed, stop) = (tenants.clone(), removed.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let g = t.child_or_create("t").unwrap();
                if g.remove().is_ok() {
                    removed.push(g);
                    n += 1;
                }
            }
            n
        })
    };
    let callers: Vec<_> = (0..3)
        .map(|i| {
            let (h, t, removed) = (h.clone(), tenants.clone(), removed.clone());
            std::thread::spawn(move || {
                let mut stale = 0u64;
                let start = std::time::Instant::now();
                while start.elapsed() < std::time::Duration::from_millis(2000) {
                    let len = removed.len();
                    let g = if i == 0 {
                        match h.lookup("tenants/t") {
                            Ok(g) => g,
                            Err(GroupError::NotFound { .. }) => continue,
                            Err(e) => panic!("{e}"),
                        }
                    } else {
                        t.child_or_create("t").unwrap()
                    };
                    if removed.was_removed_before(&g, len) {
                        stale += 1;
                    }
                    // Charging through what we got reaches its own limit
                    // while it is live (a removed one charges the parent).
                    g.force_charge(1).unwrap();
                    g.uncharge(1);
                }
                stale
            })
        })
        .collect();
    let stale: u64 = callers.into_iter().map(|c| c.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    let removals = remover.join().unwrap();
    assert!(removals > 100, "the race ran: {removals} removals");
    println!("{removals} removals, {stale} stale");
    assert_eq!(stale, 0, "groups removed before the call was made");
    h.drain_stocks();
    assert_eq!(h.root().usage(), 0, "every unit charged came back");
}

#[test]
fn child_or_create_with_configures_the_group_before_anyone_sees_it() {
    let h = Hierarchy::default();
    let tenants = h.root().child("tenants").unwrap();
    let inits = Arc::new(Mutex::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (t, inits) = (tenants.clone(), inits.clone());
            std::thread::spawn(move || {
                (0..500)
                    .map(|i| {
                        let g = t
                            .child_or_create_with(&format!("t{i}"), |g| {
                                *inits.lock().unwrap() += 1;
                                g.set_max(1_000)
                            })
                            .unwrap();
                        // Whoever gets it, created or found, sees the limit.
                        g.max()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap().iter().all(|&m| m == 1_000));
    }
    assert_eq!(tenants.children().len(), 500, "one group per name");
    assert!(*inits.lock().unwrap() >= 500);
}

#[test]
fn child_or_create_with_never_undoes_a_later_change() {
    let h = Hierarchy::default();
    let make = || h.root().child_or_create_with("t", |g| g.set_max(64));
    let t = make().unwrap();
    t.set_max(UNLIMITED).unwrap();
    assert_eq!(
        make().unwrap().max(),
        UNLIMITED,
        "init runs at creation only"
    );
}

#[test]
fn a_failing_init_creates_nothing() {
    let h = Hierarchy::default();
    let e = h
        .root()
        .child_or_create_with("t", |g| {
            g.force_charge(10).unwrap();
            g.set_max(5) // below its usage: Busy
        })
        .unwrap_err();
    assert!(matches!(e, GroupError::Busy { .. }), "{e}");
    assert!(h.lookup("t").is_err());
    assert!(h
        .root()
        .child_or_create_with("bad/name", |_| Ok(()))
        .is_err());
}

/// Many threads create, look up and remove the same few names while
/// charging through whatever group they get — the life of a per-tenant
/// limit in a server. Whatever the interleaving: no call panics or
/// deadlocks; a group handed out by `child_or_create_with` or `lookup`
/// carries the limit its creator set; no live group's usage ever passes
/// its limit (its peak stays at or below it); every charge that succeeded
/// is given back, so after a drain the parent and the root are exactly 0,
/// with no underflow anywhere (a removed group's charges land on its
/// parent, and its uncharges follow them there).
#[test]
fn creating_looking_up_and_removing_the_same_names_while_charging_loses_nothing() {
    const LIMIT: u64 = 1_000;
    let h = Hierarchy::default();
    let tenants = h.root().child("tenants").unwrap();
    let seen: Mutex<Vec<Group>> = Mutex::default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(1_500);
    let ops: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4u64)
            .map(|t| {
                let (h, tenants, seen) = (&h, &tenants, &seen);
                s.spawn(move || {
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                    let mut next = move |n: u64| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x % n
                    };
                    let mut ops = 0u64;
                    while std::time::Instant::now() < deadline {
                        let name = format!("t{}", next(4));
                        let got = match next(3) {
                            0 => tenants
                                .child_or_create_with(&name, |g| g.set_max(LIMIT))
                                .ok(),
                            1 => h.lookup(&format!("/tenants/{name}")).ok(),
                            _ => {
                                if let Ok(g) = h.lookup(&format!("/tenants/{name}")) {
                                    match g.remove() {
                                        Ok(()) | Err(GroupError::Removed { .. }) => {}
                                        Err(e) => panic!("removing {name}: {e}"),
                                    }
                                }
                                None
                            }
                        };
                        if let Some(g) = got {
                            assert_eq!(g.max(), LIMIT, "{} without its limit", g.path());
                            let n = 1 + next(400);
                            if g.charge(n).is_ok() {
                                g.uncharge(n);
                            }
                            if next(64) == 0 {
                                seen.lock().unwrap().push(g);
                            }
                        }
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    h.drain_stocks();
    for g in seen.lock().unwrap().iter() {
        assert!(
            g.peak() <= LIMIT,
            "{}: peak {} over {LIMIT}",
            g.path(),
            g.peak()
        );
        assert_eq!(g.events().underflow, 0, "{}", g.path());
    }
    assert_eq!(tenants.usage(), 0, "charges not given back");
    assert_eq!(h.root().usage(), 0);
    assert_eq!(tenants.subtree_events().underflow, 0);
    assert!(ops > 1_000, "only {ops} operations");
}
