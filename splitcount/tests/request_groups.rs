//! Per-request groups the way a server uses them, with `Accounted` as this
//! binary's global allocator: a group per request, work in its scope,
//! removal afterwards — and what happens at and over the limits.

#![cfg(not(loom))]

#[macro_use]
mod common;

use splitcount::alloc::{drain_thread, take_last_refusal, MAX_THREAD_RESERVE};
use splitcount::charge::Enforcement;
use splitcount::group::Group;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

accounted_heap!();

/// Usage once the stocks and this thread's reserve are returned.
fn settled(g: &Group) -> u64 {
    memory().drain_stocks();
    g.usage()
}

/// Blocks allocated in a group, freed on other threads while the group is
/// removed: the frees land on the nearest live ancestor (through the
/// removed group's counter), exactly, and nothing underflows.
#[test]
fn blocks_freed_on_other_threads_while_their_group_is_removed_uncharge_exactly() {
    let parent = fresh("removal-race");
    let g = parent.child("request").unwrap();
    let blocks: Vec<Vec<u8>> = g.scope(|| (0..400).map(|i| vec![i as u8; 3_000 + i]).collect());
    let held: u64 = blocks.iter().map(|b| b.len() as u64).sum();
    assert!(settled(&parent) >= held);
    let blocks = Arc::new(Mutex::new(blocks));
    let freers: Vec<_> = (0..3)
        .map(|_| {
            let blocks = blocks.clone();
            std::thread::spawn(move || loop {
                let b = blocks.lock().unwrap().pop();
                match b {
                    Some(b) => drop(b),
                    None => break,
                }
            })
        })
        .collect();
    g.remove().unwrap();
    drop(g);
    for f in freers {
        f.join().unwrap();
    }
    drop(blocks); // the list itself was allocated in the group too
    assert_eq!(settled(&parent), 0, "every byte came back to the ancestor");
    assert_eq!(parent.events().underflow, 0);
}

/// After removal, a free on another thread uncharges the ancestors by
/// exactly the block's size.
#[test]
fn a_free_after_removal_uncharges_the_ancestor_exactly() {
    let parent = fresh("after-removal");
    let g = parent.child("request").unwrap();
    let block = g.scope(|| vec![7u8; 123_456]);
    let before = settled(&parent);
    g.remove().unwrap();
    std::thread::spawn(move || drop(block)).join().unwrap();
    assert_eq!(settled(&parent), before - 123_456);
    assert_eq!(parent.events().underflow, 0);
}

/// A scope entered on a group that is then removed charges the nearest live
/// ancestor from its next charge on; the removed group's counter gets
/// nothing new.
#[test]
fn a_scope_on_a_removed_group_charges_the_nearest_live_ancestor() {
    let parent = fresh("scope-after-removal");
    let g = parent.child("request").unwrap();
    let scope = g.enter();
    g.remove().unwrap();
    memory().drain_stocks();
    let (g_before, p_before) = (g.usage(), parent.usage());
    let block = vec![1u8; 1 << 20];
    drop(scope);
    assert_eq!(
        g.usage(),
        g_before,
        "the removed group takes no new charges"
    );
    assert!(parent.usage() >= p_before + (1 << 20));
    drop(block);
    assert_eq!(settled(&parent), 0);
}

/// The default (`Cooperative`): an ordinary allocation over the limit
/// succeeds, is counted, and the group reports the breach at its next
/// checkpoint with the numbers — the process and other requests carry on.
#[test]
fn an_allocation_over_a_cooperative_limit_succeeds_and_is_reported() {
    let g = fresh("cooperative");
    g.set_max(1 << 20).unwrap();
    assert_eq!(g.enforcement(), Enforcement::Cooperative);
    let big = g.scope(|| "x".repeat(4 << 20)); // would abort under Refuse
    assert_eq!(big.len(), 4 << 20);
    let e = g.check().unwrap_err();
    assert_eq!(
        (e.group.as_str(), e.charged.as_str(), e.max),
        ("/cooperative", "/cooperative", 1 << 20)
    );
    assert!(e.usage > 1 << 20 && e.request >= 4 << 20, "{e}");
    assert!(g.events().max >= 1);
    assert!(
        e.to_string()
            .contains("went over the limit of /cooperative"),
        "{e}"
    );
    drop(big);
    g.clear_breach();
    assert!(g.check().is_ok());
    assert_eq!(settled(&g), 0);
}

/// A request that keeps running over its limit, and one that checks after
/// each step and stops at the first breach: the second stops within a step.
#[test]
fn a_worker_that_checks_stops_at_the_first_breach_while_another_carries_on() {
    let parent = fresh("two-workers");
    let step = 256 << 10;
    let run = |name: &str, checks: bool| {
        let g = parent.child(name).unwrap();
        g.set_max(2 << 20).unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            let mut steps = 0;
            for _ in 0..40 {
                held.push(g.scope(|| vec![0u8; step]));
                steps += 1;
                if checks && g.check().is_err() {
                    break;
                }
            }
            (steps, g.check().is_err())
        })
    };
    let stubborn = run("stubborn", false);
    let careful = run("careful", true);
    let (stubborn, careful) = (stubborn.join().unwrap(), careful.join().unwrap());
    assert_eq!(stubborn, (40, true), "ran every step, over the limit");
    assert!(careful.1, "the careful worker saw the breach");
    assert!(
        careful.0 <= (2 << 20) / step + 1,
        "and stopped right after it: {careful:?}"
    );
    assert_eq!(settled(&parent), 0);
}

/// A ceiling bounds even cooperative over-charges: past it, allocations are
/// refused (with the ceiling as the limit in the refusal).
#[test]
fn a_ceiling_refuses_what_cooperation_would_let_through() {
    let g = fresh("ceiling");
    g.set_max(1 << 20).unwrap();
    g.set_ceiling(3 << 20);
    g.scope(|| {
        let mut v: Vec<u8> = Vec::new();
        assert!(
            v.try_reserve_exact(2 << 20).is_ok(),
            "over max, under the ceiling"
        );
        let mut w: Vec<u8> = Vec::new();
        assert!(w.try_reserve_exact(2 << 20).is_err(), "past the ceiling");
        let r = take_last_refusal().unwrap();
        assert_eq!((r.group.as_str(), r.limit), ("/ceiling", 3 << 20));
    });
    assert!(g.peak() <= 3 << 20);
    assert_eq!(settled(&g), 0);
}

/// One call drains everything: the charge stock, the allocator's byte stock
/// and this thread's reserve (`Accounted::drain` was needed as well).
#[test]
fn the_hierarchys_drain_also_returns_the_allocators_bytes() {
    let g = fresh("one-drain");
    let small: Vec<Vec<u8>> = g.scope(|| (0..50).map(|_| vec![0u8; 100]).collect());
    drop(small);
    assert!(g.usage() > 0, "reserve and stock still hold bytes");
    memory().drain_stocks();
    assert_eq!(g.usage(), 0);
}

/// A thread's reserve never holds more than its documented cap, whatever
/// the sizes allocated (six 90,000-byte allocations pushed it to 98,304 B).
#[test]
fn a_threads_reserve_stays_within_its_cap() {
    let g = fresh("reserve-cap");
    std::thread::spawn(move || {
        for _ in 0..6 {
            let v = g.scope(|| vec![0u8; 90_000]);
            drop(v);
            let small = g.scope(|| vec![0u8; 100]);
            drop(small);
        }
        let held = drain_thread();
        assert!(held <= MAX_THREAD_RESERVE, "reserve held {held} bytes");
    })
    .join()
    .unwrap();
}

/// `set_max` drains the allocator's byte stock too before it says `Busy`:
/// with 1,000 live bytes, a limit of 2,000 is accepted.
#[test]
fn set_max_drains_the_allocators_stocked_bytes() {
    let g = fresh("set-max");
    let live = g.scope(|| vec![0u8; 1_000]);
    assert!(g.usage() > 2_000, "stocked bytes inflate the usage");
    g.set_max(2_000).unwrap();
    assert!(g.usage() <= 2_000);
    drop(live);
}

static FREED: AtomicU64 = AtomicU64::new(0);
static CACHE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Allocator charges run the group's hooks too (with accounting off): a
/// reclaim hook that frees a cache makes room for an allocation that would
/// be refused; the pressure hook fires once per crossing of `high`.
#[test]
fn allocator_charges_run_the_groups_reclaim_and_pressure_hooks() {
    let g = fresh("hooks");
    g.set_max(4 << 20).unwrap();
    g.set_enforcement(Enforcement::Refuse);
    g.set_high(1 << 20);
    let crossings = Arc::new(AtomicU64::new(0));
    let c = crossings.clone();
    g.on_pressure(move |_, _| {
        c.fetch_add(1, Relaxed);
    });
    g.on_reclaim(|_, _short| {
        let mut cache = CACHE.lock().unwrap();
        let freed: u64 = cache.iter().map(|b| b.len() as u64).sum();
        cache.clear();
        FREED.fetch_add(freed, Relaxed);
        freed
    });
    g.scope(|| CACHE.lock().unwrap().push(vec![1u8; 3 << 20]));
    let v = g.scope(|| {
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(2 << 20).map(|_| v)
    });
    assert!(v.is_ok(), "the reclaim hook freed the cache");
    assert_eq!(FREED.load(Relaxed), 3 << 20);
    // The cache took usage above high (1), the reclaim hook's free brought
    // it back under, the allocation above again (2).
    assert_eq!(crossings.load(Relaxed), 2);
    drop(v);
    memory().drain_stocks();
    let again = g.scope(|| vec![0u8; 2 << 20]);
    assert_eq!(crossings.load(Relaxed), 3, "below high, then above again");
    drop(again);
    *CACHE.lock().unwrap() = Vec::new(); // its buffer was charged to the group
    assert_eq!(settled(&g), 0);
}

/// Several subscribers: each runs, in order.
#[test]
fn a_group_takes_several_refusal_subscribers() {
    let g = fresh("subscribers");
    g.set_max(1 << 20).unwrap();
    g.set_enforcement(Enforcement::Refuse);
    let seen = Arc::new(Mutex::new(Vec::new()));
    for name in ["first", "second"] {
        let seen = seen.clone();
        g.on_alloc_refusal(move |r| {
            seen.lock().unwrap().push(format!("{name}: {}", r.group));
            false
        });
    }
    g.scope(|| {
        let mut v: Vec<u8> = Vec::new();
        assert!(v.try_reserve(8 << 20).is_err());
    });
    assert_eq!(
        *seen.lock().unwrap(),
        ["first: /subscribers", "second: /subscribers"]
    );
}

/// Refused in `Refuse` mode, an ordinary allocation aborts the process —
/// and Rust's message prints: nothing on the refusal path allocates in the
/// full group. (Checked in a child process.)
#[test]
fn a_refused_ordinary_allocation_aborts_with_its_message() {
    if std::env::var_os("SPLITCOUNT_ABORT_CHILD").is_some() {
        let g = fresh("abort");
        g.set_max(8 << 20).unwrap();
        g.set_enforcement(Enforcement::Refuse);
        let s = g.scope(|| "x".repeat(16 << 20));
        println!("not refused: {}", s.len());
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_refused_ordinary_allocation_aborts_with_its_message",
            "--nocapture",
        ])
        .env("SPLITCOUNT_ABORT_CHILD", "1")
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("memory allocation of 16777216 bytes failed"),
        "{stderr}"
    );
}

/// The race the previous test cannot see (it drains the stocks before
/// looking): a free that found its group live stocks the bytes just after
/// the removal drained the stocks. They must not stay there, charged to the
/// parent, until some other group happens to evict them: after each
/// request the parent is back to exactly 0 with no drain but the threads'
/// own reserves.
#[test]
fn bytes_freed_while_their_group_is_removed_never_stay_in_a_stock() {
    const BLOCKS: usize = 2_000;
    let parent = fresh("removal-stock-race");
    let mut raced = 0;
    for round in 0..300 {
        let g = parent.child(&format!("request-{round}")).unwrap();
        let blocks: Vec<Vec<u8>> =
            g.scope(|| (0..BLOCKS).map(|i| vec![1u8; 64 + i % 200]).collect());
        drain_thread();
        let blocks = Arc::new(Mutex::new(blocks));
        let freed = Arc::new(AtomicU64::new(0));
        let removing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let freers: Vec<_> = (0..2)
            .map(|_| {
                let (blocks, freed, removing) = (blocks.clone(), freed.clone(), removing.clone());
                std::thread::spawn(move || {
                    loop {
                        // A third freed, wait for the removal to start: the
                        // rest of the frees race it.
                        while freed.load(Relaxed) >= (BLOCKS / 3) as u64 && !removing.load(Relaxed)
                        {
                            std::hint::spin_loop();
                        }
                        let b = blocks.lock().unwrap().pop();
                        match b {
                            Some(b) => drop(b),
                            None => break,
                        }
                        freed.fetch_add(1, Relaxed);
                    }
                    drain_thread();
                })
            })
            .collect();
        while freed.load(Relaxed) < (BLOCKS / 3) as u64 {
            std::hint::spin_loop();
        }
        removing.store(true, Relaxed);
        g.remove().unwrap();
        if freed.load(Relaxed) < BLOCKS as u64 {
            raced += 1;
        }
        for f in freers {
            f.join().unwrap();
        }
        drop(blocks);
        drain_thread();
        assert_eq!(parent.usage(), 0, "round {round}: bytes left charged");
    }
    assert!(
        raced > 100,
        "the removals raced the frees in {raced} rounds only"
    );
}
