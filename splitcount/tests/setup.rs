//! Setting a hierarchy up: attaching an allocator (idempotent for the same
//! hierarchy), the background flusher's minimum period, and lookups that
//! never wait for each other.

use splitcount::alloc::{Accounted, AttachError};
use splitcount::group::{GroupError, Hierarchy, MIN_FLUSH_PERIOD};
use std::alloc::System;
use std::sync::OnceLock;
use std::time::Duration;

// Not the global allocator: attaching works the same, nothing is charged.
static ALLOC: Accounted<System> = Accounted::new(System);
static OTHER_ALLOC: Accounted<System> = Accounted::new(System);
static MEMORY: OnceLock<Hierarchy> = OnceLock::new();

/// The pattern for test suites: one hierarchy in a `static`, attached from
/// every test.
fn memory() -> &'static Hierarchy {
    let h = MEMORY.get_or_init(Hierarchy::default);
    ALLOC.attach(h).unwrap();
    h
}

#[test]
fn attaching_the_same_hierarchy_again_is_ok() {
    assert!(memory().counts_bytes());
    ALLOC.attach(memory()).unwrap();
    ALLOC.attach(&memory().clone()).unwrap(); // a clone is the same hierarchy
}

#[test]
fn racing_attaches_of_the_same_hierarchy_all_succeed() {
    let h = Hierarchy::default();
    static RACED: Accounted<System> = Accounted::new(System);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| RACED.attach(&h).unwrap());
        }
    });
    assert!(h.counts_bytes());
}

#[test]
fn attaching_another_hierarchy_is_refused() {
    let _ = memory();
    assert_eq!(
        ALLOC.attach(&Hierarchy::default()),
        Err(AttachError::AlreadyAttached)
    );
}

#[test]
fn a_hierarchy_another_allocator_has_is_refused() {
    assert_eq!(
        OTHER_ALLOC.attach(memory()),
        Err(AttachError::AlreadyAttached)
    );
}

#[test]
fn a_flusher_period_below_the_minimum_is_refused_with_the_minimum() {
    let h = Hierarchy::default();
    for period in [Duration::ZERO, MIN_FLUSH_PERIOD - Duration::from_nanos(1)] {
        match h.start_flusher(period) {
            Err(GroupError::Config(why)) => {
                assert!(why.contains("at least 1ms"), "{why}");
                assert!(why.contains("MIN_FLUSH_PERIOD"), "{why}");
            }
            other => panic!("{period:?}: {other:?}"),
        }
    }
}

#[test]
fn the_minimum_flusher_period_is_accepted() {
    let h = Hierarchy::default();
    h.start_flusher(MIN_FLUSH_PERIOD).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    h.stop_flusher();
}

#[test]
fn a_refused_period_leaves_the_running_flusher_alone() {
    let h = Hierarchy::default();
    h.start_flusher(Duration::from_millis(50)).unwrap();
    assert!(h.start_flusher(Duration::ZERO).is_err());
    h.stop_flusher();
}

#[test]
fn lookups_find_live_groups_while_siblings_come_and_go() {
    // Many threads resolve paths through the root while others create and
    // remove siblings: every lookup of a live group finds it.
    let h = Hierarchy::default();
    for t in 0..4 {
        h.root()
            .child(&format!("t{t}"))
            .unwrap()
            .child("q")
            .unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..4 {
            let h = &h;
            s.spawn(move || {
                for _ in 0..20_000 {
                    assert_eq!(
                        h.lookup(&format!("t{t}/q")).unwrap().path(),
                        format!("/t{t}/q")
                    );
                }
            });
        }
        s.spawn(|| {
            for i in 0..2_000 {
                let g = h.root().child(&format!("churn-{}", i % 7)).unwrap();
                g.remove().unwrap();
            }
        });
    });
    assert!(matches!(
        h.lookup("churn-0"),
        Err(GroupError::NotFound { .. })
    ));
}

/// `SPLITCOUNT_PERCPU_ADD` is read trimmed by the arenas and by the stock
/// alike (the lab checks it trimmed): a padded `" atomic"` put the arenas
/// on atomic adds and left the stock on rseq sequences (a reviewer's
/// probe). Run in a child process of this test binary, whose environment
/// the variable is read from once.
#[test]
fn a_padded_add_path_puts_arenas_and_stock_on_the_same_path() {
    use splitcount::raw::percpu::{AddPath, Arena};
    if std::env::var_os("SPLITCOUNT_SETUP_CHILD").is_some() {
        let (arena, stock) = (
            Arena::host().add_path(),
            Hierarchy::default().uses_rseq_stock(),
        );
        println!("child: arena={arena:?} rseq_stock={stock}");
        assert_eq!(arena, AddPath::Atomic);
        assert!(!stock, "the stock on rseq, the arenas on atomics");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_padded_add_path_puts_arenas_and_stock_on_the_same_path",
            "--nocapture",
        ])
        .env("SPLITCOUNT_SETUP_CHILD", "1")
        .env("SPLITCOUNT_PERCPU_ADD", " atomic")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("child: arena=Atomic rseq_stock=false"),
        "{text}"
    );
}
