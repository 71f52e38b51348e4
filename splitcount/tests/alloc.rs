//! The allocator integration, installed as this test binary's global
//! allocator: allocations in a group's scope are charged to it, frees
//! uncharge the allocating group wherever they happen, limits refuse
//! `try_reserve`, scopes nest and unwind.

#![cfg(not(loom))]

#[macro_use]
mod common;

use common::Rng;
use splitcount::alloc::{take_last_refusal, Accounted};
use splitcount::charge::Enforcement;
use splitcount::group::Group;
use std::alloc::System;

accounted_heap!();

/// A fresh group with a hard limit that refuses (the allocator returns
/// null over it) instead of the default cooperative over-charge.
fn refusing(name: &str, max: u64) -> Group {
    let g = fresh(name);
    g.set_max(max).unwrap();
    g.set_enforcement(Enforcement::Refuse);
    g
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
    let g = refusing("limited", 1 << 20);
    g.scope(|| {
        let mut big: Vec<u8> = Vec::new();
        assert!(
            big.try_reserve(2 << 20).is_err(),
            "2 MiB does not fit 1 MiB"
        );
        let r = take_last_refusal().expect("the refusal is recorded");
        assert_eq!((r.request, r.limit), (2 << 20, 1 << 20));
        assert_eq!(r.group, "/limited", "the refusal names the refusing group");
        let small: Vec<u8> = vec![7; 100_000];
        assert_eq!(small.len(), 100_000);
    });
    assert!(g.events().max >= 1);
    assert_eq!(live_bytes(&g), 0);
}

/// A group that cooperative enforcement let past `max` keeps what it
/// charged past it in the thread's reserve; switching it to `Refuse` drains
/// that reserve (as `set_max` does), so the next allocation is refused.
/// (It was served from the reserve: 100 allocations of 100 bytes went
/// through under a `max` of 0; found by a helper.)
#[test]
fn switching_to_refuse_over_the_limit_refuses_the_next_allocation() {
    let g = fresh("cooperative-then-refusing");
    g.set_max(0).unwrap();
    // The first allocation over `max` begins the breach episode (charged
    // exactly); the second is charged with a reserve's worth more, which
    // the thread's reserve keeps — where no other test's drain reaches (the
    // first one's bytes alone may sit in a per-CPU stock that a concurrent
    // test drains).
    drop(g.scope(|| (vec![0u8; 1000], vec![0u8; 1000])));
    assert!(g.usage() > 0, "charged past max, kept in the reserve");
    g.clear_breach();
    g.set_enforcement(Enforcement::Refuse);
    g.scope(|| {
        let mut v: Vec<u8> = Vec::new();
        assert!(v.try_reserve(100).is_err(), "refused at once");
    });
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

/// Scopes dropped out of order — the outer guard before the inner one —
/// still end with the thread back where it was before both: the inner
/// scope stays current while it lives, and its end restores what was
/// current before the outer one (it restored the outer group, whose scope
/// had ended and whose reference was gone: every later allocation of the
/// thread went to it).
#[test]
fn scopes_dropped_out_of_order_end_where_they_began() {
    let a = fresh("out-of-order-a");
    let b = fresh("out-of-order-b");
    let before = Group::current().map(|g| g.path().to_string());
    let in_a = a.enter();
    let in_b = b.enter();
    drop(in_a);
    assert_eq!(
        Group::current().unwrap().path(),
        "/out-of-order-b",
        "the inner scope lives on"
    );
    let v: Vec<u8> = Vec::with_capacity(100_000);
    assert!(live_bytes(&b) >= 100_000);
    drop(v);
    drop(in_b);
    assert_eq!(Group::current().map(|g| g.path().to_string()), before);
    let (a_before, b_before) = (live_bytes(&a), live_bytes(&b));
    let v: Vec<u8> = Vec::with_capacity(100_000);
    assert_eq!((live_bytes(&a), live_bytes(&b)), (a_before, b_before));
    drop(v);
    // Three deep, the middle one first, then the outer, then the inner.
    let (x, y, z) = (fresh("ooo-x"), fresh("ooo-y"), fresh("ooo-z"));
    let gx = x.enter();
    let gy = y.enter();
    let gz = z.enter();
    drop(gy);
    assert_eq!(Group::current().unwrap().path(), "/ooo-z");
    drop(gx);
    assert_eq!(Group::current().unwrap().path(), "/ooo-z");
    drop(gz);
    assert_eq!(Group::current().map(|g| g.path().to_string()), before);
    // In order after that, as always.
    let gx = x.enter();
    let gy = y.enter();
    drop(gy);
    assert_eq!(Group::current().unwrap().path(), "/ooo-x");
    drop(gx);
    assert_eq!(Group::current().map(|g| g.path().to_string()), before);
}

/// Deeper than the tracked depths (63), a scope that ends out of order
/// cannot be remembered; once every scope of the thread has ended, the
/// thread is back where it was before the first, whatever the depth and
/// the order. With 65 scopes on one group ended outermost first, the
/// thread charged that group for good (a helper's program: 50,000 bytes
/// allocated after the last guard went were the group's).
#[test]
fn scopes_deeper_than_tracked_dropped_out_of_order_end_where_they_began() {
    let before = Group::current().map(|g| g.path().to_string());
    for depth in [63, 64, 65, 100] {
        let a = fresh(&format!("deep-out-of-order-{depth}"));
        let mut guards: Vec<_> = (0..depth).map(|_| a.enter()).collect();
        while !guards.is_empty() {
            drop(guards.remove(0)); // the outermost first
        }
        assert_eq!(
            Group::current().map(|g| g.path().to_string()),
            before,
            "{depth} deep"
        );
        let held = live_bytes(&a);
        let v: Vec<u8> = Vec::with_capacity(100_000);
        assert_eq!(live_bytes(&a), held, "{depth} deep");
        drop(v);
        // And scopes work as before afterwards.
        a.scope(|| {
            let v: Vec<u8> = Vec::with_capacity(100_000);
            assert!(live_bytes(&a) >= held + 100_000);
            drop(v);
        });
        assert_eq!(Group::current().map(|g| g.path().to_string()), before);
    }
}

/// A scope kept in a future across an `.await` ends in a later poll, out
/// of order with the scopes around that poll — the instrumented future's
/// per-poll scope and one the caller entered between the polls. When all
/// have ended the thread is back where it began, charging none of their
/// groups (the walk back used to stop at the first poll's group, which no
/// scope held any more).
#[test]
fn a_scope_kept_across_polls_ends_where_it_began() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};
    struct HoldsScope {
        g: Group,
        scope: Option<splitcount::alloc::AllocScope>,
    }
    impl Future for HoldsScope {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if self.scope.is_none() {
                let s = self.g.enter();
                self.scope = Some(s);
                Poll::Pending
            } else {
                self.scope = None;
                Poll::Ready(())
            }
        }
    }
    let (x, y, g) = (fresh("held-x"), fresh("held-y"), fresh("held-g"));
    let before = Group::current().map(|g| g.path().to_string());
    let mut f = Box::pin(x.instrument(HoldsScope {
        g: y.clone(),
        scope: None,
    }));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(f.as_mut().poll(&mut cx).is_pending());
    let outer = g.enter();
    assert!(f.as_mut().poll(&mut cx).is_ready());
    drop(f);
    drop(outer);
    assert_eq!(Group::current().map(|g| g.path().to_string()), before);
    let x_before = live_bytes(&x);
    let v: Vec<u8> = Vec::with_capacity(1 << 20);
    assert_eq!(
        live_bytes(&x),
        x_before,
        "nothing charged to the first poll's group"
    );
    drop(v);
}

/// An instrumented future polled past the tracked depths (63 scopes deep),
/// whose inner future keeps a scope across a `Pending`: the per-poll scope
/// ends out of order where it cannot be remembered, and the kept scope,
/// when it ends, makes the future's account current again. That account
/// must still be alive after the future — its only other holder, its
/// group removed — is dropped: it was freed, and the thread's next reads
/// of its current group walked freed memory (found in review).
#[test]
fn a_future_polled_deeper_than_tracked_leaves_no_freed_account_current() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};
    struct PendOnce(bool);
    impl Future for PendOnce {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if self.0 {
                Poll::Ready(())
            } else {
                self.0 = true;
                Poll::Pending
            }
        }
    }
    let before = Group::current().map(|g| g.path().to_string());
    let outer = fresh("deep-poll-outer");
    let kept = fresh("deep-poll-kept");
    let guards: Vec<_> = (0..63).map(|_| outer.enter()).collect();
    let polled = fresh("deep-poll-a");
    let k = kept.clone();
    let f = polled.instrument(async move {
        let _kept = k.enter();
        PendOnce(false).await;
    });
    polled.remove().unwrap();
    drop(polled);
    let mut f = Box::pin(f);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(f.as_mut().poll(&mut cx).is_pending());
    drop(f);
    // Past the untracked end the removed group's account is current (as
    // documented), alive; its group is gone (no `Group` to hand out), and
    // allocations go on, charged above it.
    for _ in 0..3 {
        assert!(Group::current().is_none());
        let v: Vec<u8> = Vec::with_capacity(1 << 16);
        drop(v);
    }
    drop(guards);
    assert_eq!(Group::current().map(|g| g.path().to_string()), before);
}

/// A block grown while a new one would pass unaccounted — in the reporting
/// grace after a refusal, or while the thread panics — grows: charged to
/// its group (whose usage returns to zero once everything is freed). It
/// was refused: a `Vec` that grew while a panic printed its message failed,
/// and with `RUST_BACKTRACE=1` the process hung in the allocation-failure
/// hook, waiting for the backtrace lock the panicking thread held.
#[test]
fn blocks_grow_in_the_reporting_grace_and_while_panicking() {
    let g = refusing("grow-in-grace", 64 << 10);
    let g2 = g.clone();
    // What the thread saw, checked once it is out of the group: a failed
    // check inside, at the limit, would itself need memory to report.
    let (in_grace, while_panicking) = std::thread::spawn(move || {
        // Room for the blocks before the scope: a refused growth of this
        // list would abort the test binary.
        let mut held = Vec::with_capacity(1024);
        let _in = g2.enter();
        let mut existing: Vec<u8> = Vec::with_capacity(8);
        while held.len() < held.capacity() {
            let mut v: Vec<u8> = Vec::new();
            if v.try_reserve_exact(1024).is_err() {
                break;
            }
            held.push(v);
        }
        let in_grace = existing.try_reserve_exact(4096).is_ok();
        struct GrowOnDrop(Vec<u8>, std::rc::Rc<std::cell::Cell<bool>>);
        impl Drop for GrowOnDrop {
            fn drop(&mut self) {
                // More than the reporting grace lets through (64 KiB):
                // only the panicking thread's pass grows it.
                let grown = self.0.try_reserve_exact(1 << 17).is_ok();
                // And a size no limit can refuse is refused, not forced.
                let huge = self.0.try_reserve_exact(1 << 60).is_err();
                self.1.set(grown && huge);
            }
        }
        let grew = std::rc::Rc::new(std::cell::Cell::new(false));
        let to_drop = GrowOnDrop(std::mem::take(&mut existing), grew.clone());
        // Unwinding without the panic hook (no message to print).
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _grow = to_drop;
            std::panic::resume_unwind(Box::new("over the limit"));
        }));
        drop(held);
        (in_grace, caught.is_err() && grew.get())
    })
    .join()
    .unwrap();
    assert!(in_grace, "a block grows in the reporting grace");
    assert!(while_panicking, "a block grows while its thread panics");
    assert_eq!(live_bytes(&g), 0);
    assert_eq!(g.events().underflow, 0);
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

/// Allocations after the thread's exit guard ran must not refill the
/// thread's reserve: nothing would return it. A pthread key's destructor
/// runs after every Rust thread-local destructor (glibc calls the
/// `thread_local` destructors, the exit guard's among them, before the
/// keys'), so it allocates in a scope after the guard — each allocation is
/// charged exactly and given back, and the group ends at 0. (Without the
/// guard's `exiting` flag, 16,484 bytes stayed charged: the refill.)
#[test]
fn allocations_after_the_exit_guard_leave_nothing_charged() {
    unsafe extern "C" fn late(p: *mut libc::c_void) {
        // SAFETY: `p` is the `Box<Group>` leaked below, given back once.
        let g = unsafe { Box::from_raw(p as *mut Group) };
        g.scope(|| {
            let v: Vec<u8> = Vec::with_capacity(100);
            drop(std::hint::black_box(v));
        });
    }
    let g = fresh("after-exit-guard");
    let g2 = g.clone();
    std::thread::spawn(move || {
        // Allocate first: the exit guard is armed by the first slow path.
        g2.scope(|| drop(std::hint::black_box(vec![0u8; 1000])));
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `late` has the signature of a key destructor; the value
        // is a leaked box that it takes back.
        unsafe {
            assert_eq!(libc::pthread_key_create(&mut key, Some(late)), 0);
            let held = Box::into_raw(Box::new(g2)) as *mut libc::c_void;
            assert_eq!(libc::pthread_setspecific(key, held), 0);
        }
    })
    .join()
    .unwrap();
    assert_eq!(live_bytes(&g), 0);
}

/// A thread whose only allocation call is a `realloc` that grows a block
/// (made by another thread) fills its reserve on the slow path of the
/// growth: the exit guard must be armed there too, or the reserve stays
/// charged after the thread is gone. (It was armed only by an allocation's
/// miss: under the C heap's preload a program whose threads only `realloc`
/// left 16 KiB charged per thread, until a limit refused everything while
/// it held nothing.)
#[test]
fn a_thread_that_only_grows_a_block_returns_its_reserve_at_exit() {
    let g = fresh("grown-elsewhere");
    for _ in 0..20 {
        let v: Vec<u8> = g.scope(|| Vec::with_capacity(100));
        let v = std::thread::spawn(move || {
            let mut v = v;
            v.reserve_exact(200);
            v
        })
        .join()
        .unwrap();
        assert!(v.capacity() >= 200);
        drop(v);
    }
    assert_eq!(live_bytes(&g), 0);
}

#[test]
fn many_threads_allocating_across_limited_groups_return_to_baseline() {
    let parent = fresh("stress");
    parent.set_max(64 << 20).unwrap();
    // Half refuse over their limit; half over-charge cooperatively, up to
    // a ceiling.
    let groups: Vec<Group> = (0..4)
        .map(|i| {
            let g = parent.child(&format!("g{i}")).unwrap();
            g.set_max(8 << 20).unwrap();
            if i % 2 == 0 {
                g.set_enforcement(Enforcement::Refuse);
            } else {
                g.set_ceiling(12 << 20);
            }
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
        match g.enforcement() {
            Enforcement::Refuse => assert!(g.peak() <= 8 << 20, "{}", g.path()),
            _ => assert!(g.peak() <= 12 << 20, "{}: the ceiling holds", g.path()),
        }
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
    let g = refusing("hooked", 1 << 20);
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

/// An over-aligned block's tag trails its bytes, at its size rounded up to
/// 8: every realloc — in place or moved, smaller or larger — writes it again
/// where the new size puts it, so the group is charged exactly the live
/// size after each step, the bytes come along, and nothing is left once
/// the block is freed.
#[test]
fn an_over_aligned_block_keeps_its_account_through_every_realloc() {
    use std::alloc::{GlobalAlloc, Layout};
    let g = fresh("trailer");
    for align in [16usize, 64, 4096] {
        g.scope(|| {
            let mut l = Layout::from_size_align(5_000, align).unwrap();
            // SAFETY: non-zero size; freed below with its last layout.
            let mut p = unsafe { ALLOC.alloc(l) };
            assert!(!p.is_null());
            for new in [10usize, 20_000, 100, 4_097, 1, 33] {
                let kept = l.size().min(new);
                // SAFETY: `l.size()` bytes live at `p`.
                unsafe { p.write_bytes(0xCD, l.size()) };
                // SAFETY: allocated with `l`; a non-zero new size.
                p = unsafe { ALLOC.realloc(p, l, new) };
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "align {align}");
                // SAFETY: the first `kept` bytes were copied.
                assert!(unsafe { std::slice::from_raw_parts(p, kept) }
                    .iter()
                    .all(|&b| b == 0xCD));
                l = Layout::from_size_align(new, align).unwrap();
                assert_eq!(live_bytes(&g), new as u64, "align {align}, size {new}");
            }
            // SAFETY: allocated with `l`, freed once.
            unsafe { ALLOC.dealloc(p, l) };
        });
        assert_eq!(live_bytes(&g), 0, "align {align}");
    }
}

fn panic_in_hook(_: &splitcount::alloc::Refusal) -> bool {
    panic!("this refusal hook fails");
}

/// A refusal hook that panics must not unwind out of `GlobalAlloc::alloc`
/// (undefined behaviour): it counts as having declined, the allocation is
/// refused, and the thread is accounted afterwards as before (the "inside
/// a hook" flag was restored).
#[test]
fn a_panicking_refusal_hook_refuses_the_allocation_and_accounting_goes_on() {
    let g = refusing("panicky-hook", 1 << 20);
    g.on_alloc_refusal(panic_in_hook);
    let refused = std::panic::catch_unwind(|| {
        g.scope(|| {
            let mut v: Vec<u8> = Vec::new();
            v.try_reserve(4 << 20).is_err()
        })
    });
    assert_eq!(refused.ok(), Some(true), "refused, without unwinding");
    let held = g.scope(|| vec![1u8; 100_000]);
    assert!(live_bytes(&g) >= 100_000, "still accounted after the panic");
    drop(held);
    assert_eq!(live_bytes(&g), 0);
}

thread_local! {
    static KEPT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
static GREW_IN_HOOK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn grow_kept(_: &splitcount::alloc::Refusal) -> bool {
    KEPT.with(|k| {
        let grew = k.borrow_mut().try_reserve_exact(3 << 20).is_ok();
        GREW_IN_HOOK.store(grew, std::sync::atomic::Ordering::Relaxed);
    });
    false
}

/// Inside a refusal hook, growing a block that was charged to a group is
/// still charged to that group (its header names it, and its free will
/// uncharge the new size): over the limit it is refused. Passing it through
/// uncharged would let the hook exceed the limit and make the final free
/// uncharge bytes that were never charged.
#[test]
fn a_realloc_inside_a_refusal_hook_is_charged_to_its_block_and_may_be_refused() {
    let g = refusing("realloc-in-hook", 1 << 20);
    g.on_alloc_refusal(grow_kept);
    g.scope(|| KEPT.with(|k| k.borrow_mut().extend_from_slice(&[7u8; 1000])));
    g.scope(|| {
        let mut v: Vec<u8> = Vec::new();
        assert!(v.try_reserve(4 << 20).is_err());
    });
    assert!(
        !GREW_IN_HOOK.load(std::sync::atomic::Ordering::Relaxed),
        "3 MiB in a group limited to 1 MiB"
    );
    KEPT.with(|k| *k.borrow_mut() = Vec::new());
    assert_eq!(live_bytes(&g), 0);
    assert_eq!(
        g.events().underflow,
        0,
        "nothing uncharged that was not charged"
    );
}

/// An inner allocator that records requests whose layout is invalid.
struct LayoutChecking;
static INVALID_REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// SAFETY: forwards to `System`, after checking what it is asked for.
unsafe impl std::alloc::GlobalAlloc for LayoutChecking {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if std::alloc::Layout::from_size_align(new_size, layout.align()).is_err() {
            INVALID_REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded contract, the new layout checked valid.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// A `realloc` to a size the caller may ask for (≤ `isize::MAX` once
/// rounded to the alignment) but that the header pushes past it returns
/// null, without passing an invalid layout to the inner allocator.
#[test]
fn a_realloc_whose_header_passes_isize_max_is_refused_before_the_inner_allocator() {
    use std::alloc::{GlobalAlloc, Layout};
    let a = Accounted::new(LayoutChecking);
    let l = Layout::from_size_align(16, 8).unwrap();
    // SAFETY: non-zero size; freed below with the same layout.
    let p = unsafe { a.alloc(l) };
    assert!(!p.is_null());
    let huge = isize::MAX as usize - 7; // a multiple of 8: valid for the caller
                                        // SAFETY: `p` came from `a` with `l`; `huge` rounded to 8 is ≤ isize::MAX.
    let q = unsafe { a.realloc(p, l, huge) };
    assert!(q.is_null());
    assert_eq!(
        INVALID_REQUESTS.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // SAFETY: the failed realloc left `p` allocated with `l`.
    unsafe { a.dealloc(p, l) };
}

/// `fork` while threads allocate at a limit (so stock locks are taken and
/// drains run all the time): every child can allocate, be refused (which
/// drains the stocks) and drain, and exits — none hangs on a lock a parent
/// thread held at the fork.
#[test]
fn forked_children_start_with_usable_stocks() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    let g = refusing("forking", 256 << 10);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (g, stop) = (g.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(t + 1);
                // Room for every block it holds, allocated outside the
                // group: growing it in the scope at the limit would be a
                // plain allocation refused (and Rust aborts on that).
                let mut held: Vec<Vec<u8>> = Vec::with_capacity(8);
                while !stop.load(Relaxed) {
                    g.scope(|| {
                        let mut v = Vec::new();
                        if v.try_reserve(1 + rng.below(96 << 10) as usize).is_ok() {
                            held.push(v);
                        }
                        if held.len() > 4 {
                            held.remove(0);
                        }
                    });
                    if rng.below(16) == 0 {
                        ALLOC.drain();
                    }
                }
            })
        })
        .collect();
    let mut hung = 0;
    for _ in 0..40 {
        std::thread::sleep(std::time::Duration::from_millis(5));
        // SAFETY: the child only allocates, uses splitcount and `_exit`s.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // (`try_reserve` only: at the limit a plain allocation would be
            // refused, and Rust aborts on that.)
            let refused = g.scope(|| {
                let mut small: Vec<u8> = Vec::new();
                let _ = small.try_reserve(1000);
                let mut big: Vec<u8> = Vec::new();
                big.try_reserve(1 << 20).is_err()
            });
            ALLOC.drain();
            // SAFETY: leaving the child without running the parent's
            // destructors or test harness.
            unsafe { libc::_exit(if refused { 0 } else { 3 }) };
        }
        assert!(pid > 0, "fork failed");
        let start = std::time::Instant::now();
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child without blocking.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                assert!(libc::WIFEXITED(status), "child died: {status:#x}");
                assert_eq!(libc::WEXITSTATUS(status), 0, "the child was not refused");
                break;
            }
            if start.elapsed() > std::time::Duration::from_secs(10) {
                // SAFETY: killing and reaping our own hung child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                hung += 1;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(hung, 0, "children hung after fork");
}
