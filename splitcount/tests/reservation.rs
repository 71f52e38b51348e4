//! `Reservation`: an RAII hold on a group whose `size()` is exact, against
//! exact models — sequential (proptest: every refusal predicted) and
//! concurrent (seeded random walks on several threads: sizes and usage
//! exact after joining, the limit never exceeded).

mod common;

use common::Rng;
use proptest::prelude::*;
use splitcount::charge::{MAX_REQUEST, MAX_USAGE, UNLIMITED};
use splitcount::group::{ChargeErrorKind, Group, Hierarchy, Reservation, ReservationMode};
use std::sync::Arc;

fn pool(max: u64) -> (Hierarchy, Group) {
    let h = Hierarchy::default();
    let pool = h.root().child("pool").unwrap();
    pool.set_max(max).unwrap();
    (h, pool)
}

#[test]
fn size_is_exact_after_try_grow_and_so_is_usage_in_exact_mode() {
    let (_h, pool) = pool(1000);
    let r = Reservation::new(&pool);
    r.try_grow(10).unwrap();
    assert_eq!(r.size(), 10);
    assert_eq!(pool.usage(), 10, "no stock batch shows through");
    assert_eq!(pool.stocked(), 0);
}

#[test]
fn stocked_mode_size_is_exact_and_usage_is_exact_after_a_drain() {
    let (h, pool) = pool(1000);
    let r = Reservation::with_mode(&pool, ReservationMode::Stocked);
    r.try_grow(10).unwrap();
    assert_eq!(r.size(), 10);
    let usage = pool.usage();
    assert!(
        (10..=10 + h.config().stock_batch).contains(&usage),
        "{usage}"
    );
    h.drain_stocks();
    assert_eq!(pool.usage(), 10);
}

#[test]
fn try_grow_over_the_limit_is_refused_with_the_numbers_and_changes_nothing() {
    let (_h, pool) = pool(100);
    let big = pool.child("big").unwrap();
    let small = pool.child("small").unwrap();
    let a = big.reserve(70).unwrap();
    let b = small.reserve(20).unwrap();
    let e = b.try_grow(11).unwrap_err();
    assert_eq!(e.kind(), ChargeErrorKind::Limit);
    assert_eq!(e.charged(), "/pool/small");
    assert_eq!(e.group(), "/pool");
    assert_eq!((e.limit(), e.usage(), e.request()), (100, 90, 11));
    let top: Vec<_> = e
        .top()
        .iter()
        .map(|c| (c.group.as_str(), c.usage))
        .collect();
    assert_eq!(top, [("/pool/big", 70), ("/pool/small", 20)]);
    assert!(e.to_string().contains("largest under /pool: /pool/big 70"));
    assert_eq!((a.size(), b.size(), pool.usage()), (70, 20, 90));
    b.try_grow(10).unwrap(); // exactly up to the limit
    assert_eq!(pool.usage(), 100);
}

#[test]
fn grow_is_forced_past_the_limit_and_then_try_grow_is_refused() {
    let (_h, pool) = pool(100);
    let r = pool.reserve(90).unwrap();
    r.grow(50);
    assert_eq!((r.size(), pool.usage()), (140, 140));
    assert!(r.try_grow(1).is_err());
    assert!(pool.check().is_ok(), "a forced grow records no breach");
    r.shrink(60);
    r.try_grow(20).unwrap();
    assert_eq!(pool.usage(), 100);
}

#[test]
fn a_request_above_max_request_is_refused_by_try_grow_and_forced_by_grow() {
    let (_h, pool) = pool(UNLIMITED);
    let r = Reservation::new(&pool);
    let e = r.try_grow(u64::MAX).unwrap_err();
    assert_eq!(e.kind(), ChargeErrorKind::TooLarge);
    assert_eq!(r.size(), 0);
    // Forced in steps of `MAX_REQUEST` until the root's usage would pass
    // `MAX_USAGE` (2^56 - 1): the second step is refused, and the
    // reservation counts what was charged.
    assert_eq!(r.grow(u64::MAX), MAX_REQUEST);
    assert_eq!((r.size(), pool.usage()), (MAX_REQUEST, MAX_REQUEST));
    assert_eq!(r.free(), MAX_REQUEST);
    assert_eq!(pool.usage(), 0);
}

#[test]
fn drop_releases_everything() {
    let (h, pool) = pool(1000);
    for mode in [ReservationMode::Exact, ReservationMode::Stocked] {
        let r = Reservation::with_mode(&pool, mode);
        r.try_grow(123).unwrap();
        r.grow(7);
        drop(r);
        h.drain_stocks();
        assert_eq!(pool.usage(), 0, "{mode:?}");
    }
}

#[test]
fn free_releases_everything_and_the_reservation_stays_usable() {
    let (_h, pool) = pool(1000);
    let r = pool.reserve(300).unwrap();
    assert_eq!(r.free(), 300);
    assert_eq!((r.size(), pool.usage()), (0, 0));
    assert_eq!(r.free(), 0);
    r.try_grow(5).unwrap();
    assert_eq!(pool.usage(), 5);
}

#[test]
fn over_shrink_saturates_at_what_the_reservation_holds() {
    let (_h, pool) = pool(1000);
    let other = pool.reserve(50).unwrap();
    let r = pool.reserve(30).unwrap();
    assert_eq!(r.shrink(20), 20);
    assert_eq!(r.shrink(1_000), 10, "only what it held");
    assert_eq!(r.shrink(1), 0);
    assert_eq!(
        (r.size(), pool.usage()),
        (0, 50),
        "the other reservation is untouched"
    );
    assert_eq!(pool.events().underflow, 0, "the group never underflows");
    drop(other);
}

#[test]
fn zero_size_operations_change_nothing() {
    let (h, pool) = pool(0); // not even one unit fits
    let r = Reservation::new(&pool);
    r.try_grow(0).unwrap();
    r.grow(0);
    assert_eq!(r.shrink(0), 0);
    r.try_resize(0).unwrap();
    r.resize(0);
    assert_eq!(r.free(), 0);
    let s = Reservation::with_mode(&pool, ReservationMode::Stocked);
    s.try_grow(0).unwrap();
    assert_eq!(pool.reserve(0).unwrap().size(), 0);
    h.drain_stocks();
    assert_eq!((r.size(), s.size(), pool.usage()), (0, 0, 0));
    assert_eq!(pool.events().max, 0, "nothing was refused");
}

#[test]
fn resize_and_try_resize_reach_the_target_exactly() {
    let (_h, pool) = pool(100);
    let r = Reservation::new(&pool);
    r.try_resize(60).unwrap();
    assert_eq!((r.size(), pool.usage()), (60, 60));
    r.try_resize(25).unwrap();
    assert_eq!((r.size(), pool.usage()), (25, 25));
    let e = r.try_resize(101).unwrap_err();
    assert_eq!((e.usage(), e.request()), (25, 76));
    assert_eq!(
        (r.size(), pool.usage()),
        (25, 25),
        "a refused resize changes nothing"
    );
    r.resize(150);
    assert_eq!((r.size(), pool.usage()), (150, 150));
    r.resize(0);
    assert_eq!((r.size(), pool.usage()), (0, 0));
}

#[test]
fn a_removed_groups_reservation_acts_on_the_nearest_live_ancestor() {
    let (h, pool) = pool(100);
    let op = pool.child("op").unwrap();
    let r = op.reserve(40).unwrap();
    op.remove().unwrap();
    assert_eq!(pool.usage(), 40, "reparented");
    r.try_grow(50).unwrap(); // charged to /pool, under its limit
    assert_eq!((r.size(), pool.usage()), (90, 90));
    let e = r.try_grow(20).unwrap_err();
    assert_eq!((e.charged(), e.group()), ("/pool", "/pool"));
    assert_eq!(r.shrink(30), 30);
    assert_eq!(pool.usage(), 60);
    drop(r);
    h.drain_stocks();
    assert_eq!(pool.usage(), 0);
    assert_eq!(h.root().usage(), 0);
}

#[test]
fn reservations_are_send_sync_and_debug() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Reservation>();
    let (_h, pool) = pool(100);
    let r = pool.reserve(3).unwrap();
    assert_eq!(
        format!("{r:?}"),
        r#"Reservation { group: "/pool", size: 3, mode: Exact }"#
    );
}

/// One step of the sequential model.
#[derive(Debug, Clone)]
enum Op {
    TryGrow(usize, u64),
    Grow(usize, u64),
    Shrink(usize, u64),
    TryResize(usize, u64),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let r = 0..3usize;
    let n = prop_oneof![Just(0u64), 1..40u64, 40..200u64];
    prop_oneof![
        4 => (r.clone(), n.clone()).prop_map(|(r, n)| Op::TryGrow(r, n)),
        1 => (r.clone(), n.clone()).prop_map(|(r, n)| Op::Grow(r, n)),
        3 => (r.clone(), n.clone()).prop_map(|(r, n)| Op::Shrink(r, n)),
        2 => (r.clone(), n).prop_map(|(r, n)| Op::TryResize(r, n)),
        1 => r.prop_map(Op::Free),
    ]
}

proptest! {
    /// Reservations 0 and 1 on `/pool/a` (limit 150), 2 on `/pool/b`, under
    /// `/pool` (limit 200), exact mode: every refusal is the model's, every
    /// size and usage the model's after every step.
    #[test]
    fn sequences_match_an_exact_model(ops in proptest::collection::vec(op(), 1..60)) {
        let (_h, pool) = pool(200);
        let a = pool.child("a").unwrap();
        let b = pool.child("b").unwrap();
        a.set_max(150).unwrap();
        let rs = [Reservation::new(&a), Reservation::new(&a), Reservation::new(&b)];
        let mut size = [0u64; 3];
        let group_of = [0usize, 0, 1];
        for op in ops {
            let usage_a = size[0] + size[1];
            let total: u64 = size.iter().sum();
            // Zero always fits, also over a limit (after a forced grow).
            let fits = |r: usize, n: u64| {
                n == 0 || (total + n <= 200 && (group_of[r] == 1 || usage_a + n <= 150))
            };
            match op {
                Op::TryGrow(r, n) => {
                    let ok = rs[r].try_grow(n).is_ok();
                    prop_assert_eq!(ok, fits(r, n));
                    if ok { size[r] += n; }
                }
                Op::Grow(r, n) => { rs[r].grow(n); size[r] += n; }
                Op::Shrink(r, n) => {
                    prop_assert_eq!(rs[r].shrink(n), n.min(size[r]));
                    size[r] -= n.min(size[r]);
                }
                Op::TryResize(r, t) => {
                    let ok = rs[r].try_resize(t).is_ok();
                    prop_assert_eq!(ok, t <= size[r] || fits(r, t - size[r]));
                    if ok { size[r] = t; }
                }
                Op::Free(r) => { prop_assert_eq!(rs[r].free(), size[r]); size[r] = 0; }
            }
            for (r, s) in rs.iter().zip(size) {
                prop_assert_eq!(r.size(), s);
            }
            prop_assert_eq!(a.usage(), size[0] + size[1]);
            prop_assert_eq!(b.usage(), size[2]);
            prop_assert_eq!(pool.usage(), size.iter().sum::<u64>());
        }
        drop(rs);
        prop_assert_eq!(pool.usage(), 0);
    }
}

const THREADS: usize = 4;
const STEPS: usize = 20_000;

/// Each thread walks its own two reservations (one per child group) and a
/// reservation shared by all threads, with `try_grow`, `shrink`,
/// `try_resize` (and `grow` when `forced`), keeping an exact model of its own
/// reservations and of what it added to and took from the shared one.
/// Returns the hierarchy, the groups and the reservations after joining,
/// checking the model on the way.
fn walk(mode: ReservationMode, max: u64, forced: bool, seed: u64) {
    let (h, pool) = pool(max);
    let groups: Vec<Group> = (0..2)
        .map(|i| pool.child(&format!("op-{i}")).unwrap())
        .collect();
    let shared = Arc::new(Reservation::with_mode(&groups[0], mode));
    let results: Vec<([Reservation; 2], [u64; 2], i128)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (groups, shared, pool) = (&groups, shared.clone(), pool.clone());
                s.spawn(move || {
                    let mut rng = Rng::new(seed * 100 + t as u64);
                    let own = [
                        Reservation::with_mode(&groups[0], mode),
                        Reservation::with_mode(&groups[1], mode),
                    ];
                    let mut size = [0u64; 2];
                    let mut shared_net: i128 = 0;
                    for step in 0..STEPS {
                        let n = rng.below(100);
                        let pick = rng.below(3) as usize;
                        let what = rng.below(10);
                        if pick == 2 {
                            match what {
                                0..=4 => {
                                    if shared.try_grow(n).is_ok() {
                                        shared_net += n as i128;
                                    }
                                }
                                5 if forced => {
                                    shared.grow(n);
                                    shared_net += n as i128;
                                }
                                _ => {
                                    let taken = shared.shrink(n);
                                    assert!(taken <= n);
                                    shared_net -= taken as i128;
                                }
                            }
                        } else {
                            let r = &own[pick];
                            match what {
                                0..=3 => {
                                    if r.try_grow(n).is_ok() {
                                        size[pick] += n;
                                    }
                                }
                                4 if forced => {
                                    r.grow(n);
                                    size[pick] += n;
                                }
                                5 => {
                                    let t = rng.below(200);
                                    if r.try_resize(t).is_ok() {
                                        size[pick] = t;
                                    }
                                }
                                _ => {
                                    assert_eq!(r.shrink(n), n.min(size[pick]));
                                    size[pick] -= n.min(size[pick]);
                                }
                            }
                            assert_eq!(r.size(), size[pick], "thread {t} step {step}");
                        }
                        if !forced && step % 64 == 0 {
                            assert!(pool.usage() <= max, "usage {} > {max}", pool.usage());
                        }
                    }
                    (own, size, shared_net)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let shared_net: i128 = results.iter().map(|r| r.2).sum();
    assert_eq!(shared.size() as i128, shared_net, "the shared reservation");
    let mut per_group = [shared.size(), 0];
    for (own, size, _) in &results {
        for g in 0..2 {
            assert_eq!(own[g].size(), size[g]);
            per_group[g] += size[g];
        }
    }
    h.drain_stocks();
    assert_eq!(groups[0].usage(), per_group[0], "{mode:?}");
    assert_eq!(groups[1].usage(), per_group[1], "{mode:?}");
    assert_eq!(pool.usage(), per_group[0] + per_group[1]);
    if !forced {
        assert!(
            pool.peak() <= max,
            "peak {} above the limit {max}",
            pool.peak()
        );
    }
    drop(results);
    drop(shared);
    h.drain_stocks();
    assert_eq!(pool.usage(), 0, "every reservation dropped");
    assert_eq!(pool.events().underflow + groups[0].events().underflow, 0);
}

#[test]
fn concurrent_walks_match_the_model_exactly_in_exact_mode() {
    walk(ReservationMode::Exact, 2_000, false, 1);
    walk(ReservationMode::Exact, UNLIMITED, true, 2);
}

#[test]
fn concurrent_walks_match_the_model_exactly_in_stocked_mode() {
    walk(ReservationMode::Stocked, 2_000, false, 3);
    walk(ReservationMode::Stocked, UNLIMITED, true, 4);
}

#[test]
fn try_grow_never_takes_a_contended_limit_past_its_max() {
    // A tight limit: most tries near it are refused.
    walk(ReservationMode::Exact, 300, false, 5);
    walk(ReservationMode::Stocked, 300, false, 6);
}

#[test]
fn concurrent_resizes_of_one_reservation_leave_the_group_holding_its_size() {
    for (mode, seed) in [(ReservationMode::Exact, 7), (ReservationMode::Stocked, 8)] {
        let (h, pool) = pool(5_000);
        let r = Reservation::with_mode(&pool, mode);
        let start = std::sync::Barrier::new(THREADS);
        std::thread::scope(|s| {
            for t in 0..THREADS as u64 {
                let (r, start) = (&r, &start);
                s.spawn(move || {
                    let mut rng = Rng::new(seed * 10 + t);
                    start.wait();
                    for _ in 0..5 * STEPS {
                        let n = rng.below(2_000);
                        match rng.below(4) {
                            0 => r.resize(n),
                            1 => {
                                let _ = r.try_resize(n);
                            }
                            2 => {
                                let _ = r.try_grow(n / 10);
                            }
                            _ => {
                                r.shrink(n / 10);
                            }
                        }
                    }
                });
            }
        });
        h.drain_stocks();
        assert_eq!(pool.usage(), r.size(), "{mode:?}");
        drop(r);
        h.drain_stocks();
        assert_eq!(pool.usage(), 0, "{mode:?}");
    }
}

/// A forced grow past the most the counters hold (the root's usage past
/// `MAX_USAGE`) grows by what was charged only, and `resize` leaves the
/// reservation unchanged: a drop never gives back units another
/// reservation holds (it counted the refused units in `size`, and its drop
/// took the other reservation's 10 units off the group — found by a helper).
#[test]
fn a_grow_past_the_counters_ceiling_counts_only_what_was_charged() {
    for mode in [ReservationMode::Exact, ReservationMode::Stocked] {
        let (h, g) = pool(UNLIMITED);
        let a = Reservation::with_mode(&g, mode);
        a.try_grow(10).unwrap();
        let b = Reservation::with_mode(&g, mode);
        let grown = b.grow(MAX_USAGE);
        assert!(grown < MAX_USAGE, "{grown}");
        assert_eq!(b.size(), grown);
        h.drain_stocks();
        assert_eq!(g.usage(), 10 + grown);
        drop(b);
        h.drain_stocks();
        assert_eq!((g.usage(), g.events().underflow), (10, 0), "a's units kept");
        let c = Reservation::with_mode(&g, mode);
        c.resize(MAX_USAGE);
        assert_eq!(c.size(), 0, "refused: unchanged");
        h.drain_stocks();
        assert_eq!(g.usage(), 10);
        drop((a, c));
        h.drain_stocks();
        assert_eq!((g.usage(), g.events().underflow), (0, 0));
    }
}
