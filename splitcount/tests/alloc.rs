//! The allocator integration, installed as this test binary's global
//! allocator: allocations in a group's scope are charged to it, frees
//! uncharge the allocating group wherever they happen, limits refuse
//! `try_reserve`, scopes nest and unwind.

#![cfg(not(loom))]

mod common;

use common::Rng;
use splitcount::alloc::{take_last_refusal, Accounted};
use splitcount::group::{Group, Hierarchy};
use std::alloc::System;
use std::sync::OnceLock;

#[global_allocator]
static ALLOC: Accounted<System> = Accounted::new(System);

fn memory() -> &'static Hierarchy {
    static H: OnceLock<Hierarchy> = OnceLock::new();
    H.get_or_init(|| {
        let h = Hierarchy::default();
        ALLOC.attach(&h, None).unwrap();
        h
    })
}

fn fresh(name: &str) -> Group {
    memory().root().child(name).unwrap()
}

/// Usage once the allocator's stocked bytes are returned.
fn live_bytes(g: &Group) -> u64 {
    ALLOC.drain();
    g.usage()
}

#[test]
fn allocations_in_a_scope_are_charged_and_frees_give_them_back() {
    let g = fresh("scoped");
    let v: Vec<u8> = g.scope(|| Vec::with_capacity(100_000));
    assert!(live_bytes(&g) >= 100_000, "at least the requested bytes");
    drop(v);
    assert_eq!(live_bytes(&g), 0, "back to the pre-scope value");
}

#[test]
fn a_free_on_another_thread_uncharges_the_allocating_group() {
    let a = fresh("allocator-side");
    let b = fresh("freer-side");
    let v: Vec<u64> = a.scope(|| (0..50_000).collect());
    assert!(live_bytes(&a) >= 400_000);
    let b2 = b.clone();
    std::thread::spawn(move || b2.scope(move || drop(v)))
        .join()
        .unwrap();
    assert_eq!(live_bytes(&a), 0);
    assert_eq!(
        live_bytes(&b),
        0,
        "the freeing thread's group was not charged"
    );
}

#[test]
fn a_limit_refuses_try_reserve_past_it_while_smaller_allocations_work() {
    let g = fresh("limited");
    g.set_max(1 << 20).unwrap();
    g.scope(|| {
        let mut big: Vec<u8> = Vec::new();
        assert!(
            big.try_reserve(2 << 20).is_err(),
            "2 MiB does not fit 1 MiB"
        );
        let r = take_last_refusal().expect("the refusal is recorded");
        assert_eq!((r.request, r.limit), (2 << 20, 1 << 20));
        let small: Vec<u8> = vec![7; 100_000];
        assert_eq!(small.len(), 100_000);
    });
    assert!(g.events().max >= 1);
    assert_eq!(live_bytes(&g), 0);
}

#[test]
fn scopes_nest_and_are_restored_on_unwind() {
    let outer = fresh("outer");
    let inner = fresh("inner");
    let _o = outer.enter();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _i = inner.enter();
        panic!("unwind through the inner scope");
    }));
    assert!(caught.is_err());
    // (The panic machinery may keep memory charged to `inner`, e.g. a
    // backtrace symbol cache: compare before and after, not with zero.)
    let (outer_before, inner_before) = (live_bytes(&outer), live_bytes(&inner));
    // Back in `outer`: this allocation is charged there.
    let v: Vec<u8> = Vec::with_capacity(300_000);
    assert!(live_bytes(&outer) >= outer_before + 300_000);
    assert_eq!(
        live_bytes(&inner),
        inner_before,
        "not charged to the inner scope"
    );
    drop(v);
    drop(_o);
    assert_eq!(live_bytes(&outer), outer_before);
}

#[test]
fn frees_during_thread_teardown_are_accounted() {
    struct Holder(std::cell::RefCell<Vec<u8>>);
    impl Drop for Holder {
        fn drop(&mut self) {
            // Runs during thread-local destruction.
            self.0.borrow_mut().clear();
            self.0.borrow_mut().shrink_to_fit();
        }
    }
    thread_local!(static HELD: Holder = const { Holder(std::cell::RefCell::new(Vec::new())) });
    let g = fresh("teardown");
    let g2 = g.clone();
    std::thread::spawn(move || {
        g2.scope(|| HELD.with(|h| h.0.borrow_mut().resize(200_000, 1)));
    })
    .join()
    .unwrap();
    assert_eq!(live_bytes(&g), 0);
}

#[test]
fn many_threads_allocating_across_limited_groups_return_to_baseline() {
    let parent = fresh("stress");
    parent.set_max(64 << 20).unwrap();
    let groups: Vec<Group> = (0..4)
        .map(|i| {
            let g = parent.child(&format!("g{i}")).unwrap();
            g.set_max(8 << 20).unwrap();
            g
        })
        .collect();
    // Plain threads, joined: `join` returns after the thread's thread-local
    // destructors ran (which give its reserve back); a scoped thread counts
    // as finished before that.
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let groups = groups.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t + 1);
                let mut live: Vec<Vec<u8>> = Vec::new();
                for _ in 0..20_000 {
                    let g = &groups[rng.below(4) as usize];
                    if live.len() > 100 || (rng.below(3) == 0 && !live.is_empty()) {
                        let i = rng.below(live.len() as u64) as usize;
                        drop(live.swap_remove(i)); // often freed in another group's scope
                    } else {
                        let n = 1 + rng.below(64 << 10) as usize;
                        let v = g.scope(|| {
                            let mut v: Vec<u8> = Vec::new();
                            v.try_reserve_exact(n).ok().map(|_| v)
                        });
                        if let Some(v) = v {
                            live.push(v);
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    for g in &groups {
        assert_eq!(live_bytes(g), 0, "{}", g.path());
        assert!(g.peak() <= 8 << 20);
    }
    assert_eq!(live_bytes(&parent), 0);
}

static HOOK_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn count_and_decline(r: &splitcount::alloc::Refusal) -> bool {
    // Runs with allocations unaccounted: allocating here must not recurse.
    let note = format!("refused {} bytes", r.request);
    assert!(!note.is_empty());
    HOOK_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    false
}

#[test]
fn a_groups_refusal_hook_runs_before_the_allocation_fails() {
    let g = fresh("hooked");
    g.set_max(1 << 20).unwrap();
    g.on_alloc_refusal(count_and_decline);
    g.scope(|| {
        let mut v: Vec<u8> = Vec::new();
        assert!(v.try_reserve(4 << 20).is_err());
    });
    assert_eq!(HOOK_CALLS.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(
        live_bytes(&g),
        0,
        "the hook's own allocation was not charged"
    );
}

#[test]
fn every_alignment_is_honoured_and_accounted() {
    use std::alloc::{GlobalAlloc, Layout};
    let g = fresh("aligned");
    g.scope(|| {
        for align in [1usize, 2, 8, 16, 32, 64, 4096] {
            for size in [1usize, 7, 8, 24, 100, 5000] {
                let l = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero size; freed below with the same layout.
                let p = unsafe { ALLOC.alloc(l) };
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "align {align}");
                // SAFETY: `size` bytes were allocated at `p`.
                unsafe { std::ptr::write_bytes(p, 0xAB, size) };
                // SAFETY: grown with the same alignment, freed below.
                let q = unsafe { ALLOC.realloc(p, l, size * 3) };
                assert_eq!(q as usize % align, 0, "realloc keeps align {align}");
                // SAFETY: the first `size` bytes were copied.
                assert_eq!(unsafe { *q.add(size - 1) }, 0xAB);
                // SAFETY: allocated above with this layout and new size.
                unsafe { ALLOC.dealloc(q, Layout::from_size_align(size * 3, align).unwrap()) };
            }
        }
    });
    assert_eq!(live_bytes(&g), 0);
}
