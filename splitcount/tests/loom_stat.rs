//! Loom model of the update-list push racing a flush drain: two updaters of
//! one group on one CPU (so both can find the mark clear and race for the
//! push) against a concurrent flush. The final flush must be exact. With
//! the winner decided by a load and a store instead of a compare-and-swap,
//! both updaters push the same node, the list loops, and the model fails.
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom_stat`.

#![cfg(loom)]

use loom::thread;
use splitcount::cpu::Machine;
use splitcount::stat::{StatItem, Stats};
use std::sync::Arc;

#[test]
fn an_update_racing_a_flush_is_never_lost() {
    loom::model(|| {
        let m = Machine::simulated(1, 1).unwrap();
        let stats = Arc::new(Stats::new(&m, vec![StatItem::gauge("x")]).unwrap());
        let g = stats.group(None).unwrap();
        let updaters: Vec<_> = [1i64, 2]
            .into_iter()
            .map(|d| {
                let (stats, g) = (stats.clone(), g.clone());
                thread::spawn(move || g.mod_stat(&stats, 0, d).unwrap())
            })
            .collect();
        stats.flush(&g, true);
        let seen = g.value(0).unwrap();
        assert!([0, 1, 2, 3].contains(&seen));
        for u in updaters {
            u.join().unwrap();
        }
        stats.flush(&g, true);
        assert_eq!(g.value(0), Some(3));
    });
}

/// A group updated again while the flusher walks the list it is on: the
/// rest of the chain must not be lost. The list is `a → b`; the flusher
/// drains it while another thread updates `a` once more. A node's mark
/// stays set until its group is folded, so `a` cannot be pushed again
/// while the walk reads `a.next`. Clearing the mark during the walk, before
/// `next` is read, lets the updater push `a` again (`a.next` = the new,
/// empty head): the walk then ends at `a`, `b` is dropped with its mark
/// still set, its update is never folded, and loom reports its leaked
/// reference.
#[test]
fn a_node_pushed_again_during_the_drain_keeps_the_rest_of_its_list() {
    loom::model(|| {
        let m = Machine::simulated(1, 1).unwrap();
        let stats = Arc::new(Stats::new(&m, vec![StatItem::gauge("x")]).unwrap());
        let a = stats.group(None).unwrap();
        let b = stats.group(None).unwrap();
        b.mod_stat(&stats, 0, 1).unwrap();
        a.mod_stat(&stats, 0, 1).unwrap(); // the list is now a → b
        let again = {
            let (stats, a) = (stats.clone(), a.clone());
            thread::spawn(move || a.mod_stat(&stats, 0, 1).unwrap())
        };
        stats.flush(&b, true);
        again.join().unwrap();
        stats.flush(&a, true);
        stats.flush(&b, true);
        assert_eq!(a.local_value(0), Some(2));
        assert_eq!(b.local_value(0), Some(1));
    });
}

/// A group folded by a flush is updated again while the flush walks the
/// list it is on (`a → b`): the walk clears a node's mark (letting its
/// group be pushed again) only after it has read the node's `next`.
/// Clearing the mark first lets the updater push `a` again, rewriting
/// `a.next` before the walk reads it: `b` is dropped from the walk with its
/// mark set, and its update is never folded. (The last update of `a`
/// pushes it again whatever the race did: loom models SeqCst as acquire and
/// release only, so it also lets the racing update slip past both the mark
/// and the flush — see `tests/stats.rs` for that race on hardware.)
#[test]
fn a_folded_node_pushed_again_during_the_drain_keeps_the_rest_of_its_list() {
    loom::model(|| {
        let m = Machine::simulated(1, 1).unwrap();
        let stats = Arc::new(Stats::new(&m, vec![StatItem::gauge("x")]).unwrap());
        let r = stats.group(None).unwrap();
        let a = stats.group(Some(&r)).unwrap();
        let b = stats.group(Some(&r)).unwrap();
        b.mod_stat(&stats, 0, 1).unwrap();
        a.mod_stat(&stats, 0, 10).unwrap(); // the list is now a → b
        let again = {
            let (stats, a) = (stats.clone(), a.clone());
            thread::spawn(move || a.mod_stat(&stats, 0, 100).unwrap())
        };
        stats.flush(&r, true);
        again.join().unwrap();
        a.mod_stat(&stats, 0, 1000).unwrap();
        b.mod_stat(&stats, 0, 10_000).unwrap();
        stats.flush(&r, true);
        assert_eq!(a.local_value(0), Some(1110));
        assert_eq!(b.local_value(0), Some(10_001));
        assert_eq!(r.value(0), Some(11_111));
    });
}

/// A flush of one subtree racing an update of a group beside it: the flush
/// drains that group and carries it (its mark stays set, so the racing
/// update cannot push it a second time), passes the subtree's delta to the
/// parent, and the next flush of the root folds both exactly once. Clearing
/// the mark of a carried group, or folding it without clearing its mark,
/// loses the racing update or counts it twice.
#[test]
fn a_group_beside_the_flushed_subtree_is_carried_and_folded_once() {
    loom::model(|| {
        let m = Machine::simulated(1, 1).unwrap();
        let stats = Arc::new(Stats::new(&m, vec![StatItem::gauge("x")]).unwrap());
        let r = stats.group(None).unwrap();
        let a = stats.group(Some(&r)).unwrap();
        let b = stats.group(Some(&r)).unwrap();
        a.mod_stat(&stats, 0, 1).unwrap();
        b.mod_stat(&stats, 0, 10).unwrap(); // the list is now b → a
        let racing = {
            let (stats, b) = (stats.clone(), b.clone());
            thread::spawn(move || b.mod_stat(&stats, 0, 100).unwrap())
        };
        stats.flush(&a, true);
        assert_eq!(a.value(0), Some(1));
        assert_eq!(r.value(0), Some(0), "r is outside a's subtree");
        racing.join().unwrap();
        stats.flush(&r, true);
        b.mod_stat(&stats, 0, 1000).unwrap(); // pushed again after the fold
        stats.flush(&r, true);
        assert_eq!(b.local_value(0), Some(1110));
        assert_eq!(r.value(0), Some(1111));
    });
}

/// A kept group (`Stats::kept_group`, as a hierarchy makes them) folded
/// once, then updated by another thread while a flush runs: the flusher
/// wrote `kept_at` (the reference is kept for the next push) before the
/// `Release` store that cleared the mark, and the push's CAS reads that
/// store, so the push takes no reference of its own. At the end one
/// reference is kept, whatever the interleaving; retired, none. With the
/// mark cleared `Relaxed`, the pusher may read `kept_at` from before the
/// fold and take a second reference, which nothing ever gives back.
#[test]
fn a_push_after_a_fold_of_a_kept_group_takes_no_reference() {
    loom::model(|| {
        let m = Machine::simulated(1, 1).unwrap();
        let stats = Arc::new(Stats::new(&m, vec![StatItem::gauge("x")]).unwrap());
        let g = stats.kept_group(None).unwrap();
        let updater = {
            let (stats, g) = (stats.clone(), g.clone());
            thread::spawn(move || {
                g.mod_stat(&stats, 0, 1).unwrap();
                g.mod_stat(&stats, 0, 10).unwrap();
            })
        };
        stats.flush(&g, true);
        updater.join().unwrap();
        stats.flush(&g, true);
        assert_eq!(g.value(0), Some(11));
        assert_eq!(Arc::strong_count(&g), 2, "ours and the kept one");
        stats.retire(&g);
        assert_eq!(Arc::strong_count(&g), 1, "retired");
    });
}
