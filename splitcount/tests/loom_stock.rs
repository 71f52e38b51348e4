//! Loom models of the stock: one thread stashes into and consumes from its
//! CPU's stock while another drains every CPU's stock, and a stash races a
//! group's removal (retire, then drain). Whatever the interleaving, no
//! unit is lost or counted twice, none stays stocked for a retired counter,
//! and the slots are never accessed by two threads at once (loom checks
//! the `UnsafeCell`). Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom_stock`.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use splitcount::raw::{Consumed, Stock, StockKey, UsageCounter};

#[test]
fn consume_and_refill_racing_a_drain_keep_usage_exact() {
    loom::model(|| {
        let stock = Arc::new(Stock::new(1, 2, 8).unwrap());
        let c = UsageCounter::root();
        let (s, counter) = (stock.clone(), c.clone());
        let user = thread::spawn(move || {
            // A miss: charge a batch of 8, keep 6, use 2.
            counter.charge(8);
            let _ = s.stash(0, &counter, 6).uncharge();
            let mut used = 2;
            // A hit, unless the drain got there first (or holds the lock).
            if s.consume(0, &counter, 3) == Consumed::Hit {
                used += 3;
            } else {
                counter.charge(3);
                used += 3;
            }
            // Give 1 back through the stock.
            let _ = s.stash(0, &counter, 1).uncharge();
            used - 1
        });
        stock.drain_all(&|_| true);
        let in_use = user.join().unwrap();
        stock.drain_all(&|_| true);
        assert_eq!(c.usage(), in_use);
        assert_eq!(c.events().underflow, 0);
    });
}

/// A group's removal retires its counter and then drains the stocks, while
/// another thread returns units of that group through its CPU's stock (a
/// free that found the group still live). Whatever the interleaving, no
/// unit stays in a stock after both are done: either the drain takes it,
/// or the stash sees the counter retired (under the CPU's lock) and hands
/// it back to be uncharged.
#[test]
fn a_stash_racing_a_removal_never_leaves_units_behind() {
    stash_racing_a_removal(|stock, c| stock.drain_all(&|x| std::ptr::eq(x, &**c)));
}

/// The same race with the removal's own drain, `drain_key`, which compares
/// each block's key words *without* the lock and locks only the blocks
/// that hold the key. A stash that installs the key concurrently is a
/// Dekker pattern against that look: the remover stores `retired`, fences,
/// reads the key words; the stasher stores the key word, fences, reads
/// `retired`. With both fences one side sees the other. Without either
/// (the stash's in `stash_locked`, the drain's in `drain_key`) the stash
/// keeps its 5 units and the drain misses them. loom 0.7 models
/// `fence(SeqCst)` (not `SeqCst` loads and stores), so it finds that.
#[test]
fn a_stash_racing_a_removal_by_key_never_leaves_units_behind() {
    stash_racing_a_removal(|stock, c| stock.drain_key(c.as_raw()));
}

/// The removal race with `drain` as the removal's drain (it returns the
/// units it took). After both sides are done, nothing is left for the
/// retired counter: no unit and no slot holding its key (a hit sequence
/// would add to such a slot without looking at the flag), and each of the
/// 5 units was either drained or handed back by the stash, never both.
fn stash_racing_a_removal(drain: fn(&Stock, &Arc<UsageCounter>) -> u64) {
    loom::model(move || {
        let stock = Arc::new(Stock::new(1, 2, 8).unwrap());
        let c = UsageCounter::root();
        c.charge(5);
        let (s, counter) = (stock.clone(), c.clone());
        let freer = thread::spawn(move || s.stash(0, &counter, 5).uncharge());
        c.retire();
        let drained = drain(&stock, &c);
        let handed_back = freer.join().unwrap();
        assert_eq!(stock.stocked(&c), 0, "units left in a stock");
        assert_eq!(c.stock_slots(), 0, "a slot kept the retired key");
        assert_eq!(drained + handed_back, 5, "drained or handed back, once");
        assert_eq!(c.usage(), 0);
    });
}

/// Two charges take the usage above `high` at once, then two uncharges
/// bring it back: whatever the interleaving, one crossing each way is
/// counted (the compare-and-swap on the `high` word elects one reporter).
#[test]
fn two_charges_crossing_high_at_once_count_one_crossing() {
    loom::model(|| {
        let c = UsageCounter::root();
        c.set_high(5);
        let other = c.clone();
        let t = thread::spawn(move || {
            other.charge(10);
        });
        c.charge(10);
        t.join().unwrap();
        assert_eq!(c.events().high, 1, "one crossing up");
        let other = c.clone();
        let t = thread::spawn(move || {
            other.uncharge(10);
        });
        c.uncharge(10);
        t.join().unwrap();
        c.charge(10);
        assert_eq!(
            c.events().high,
            2,
            "back under once, so the next crossing counts"
        );
    });
}

/// Two drains at once: the units stocked before both began are off the
/// counter when *either* returns — also when the other drain took them.
/// The first takes the slot's units off the counter before it empties the
/// slot (under the lock); the second, finding the block without keys
/// (without the lock, `used`, Acquire) or the key gone (`drain_key`), sees
/// that uncharge (the count of keys and the key word are stored Release).
/// With those two stored `Relaxed`, loom finds the second drain returning
/// while the counter still reads 5; with the uncharge after the unlock (as
/// it was), so does a run on the host (`tests/concurrent_drains.rs`).
#[test]
fn a_drain_returns_after_the_units_another_drain_took_are_off_the_counter() {
    for by_key in [false, true] {
        loom::model(move || {
            let stock = Arc::new(Stock::new(1, 2, 8).unwrap());
            let c = UsageCounter::root();
            c.charge(5);
            let _ = stock.stash(0, &c, 5).uncharge();
            let drain = move |s: &Stock, c: &Arc<UsageCounter>| {
                if by_key {
                    s.drain_key(c.as_raw())
                } else {
                    s.drain_all(&|_| true)
                }
            };
            let (s, counter) = (stock.clone(), c.clone());
            let other = thread::spawn(move || drain(&s, &counter));
            let mine = drain(&stock, &c);
            assert_eq!(c.usage(), 0, "after this drain");
            assert_eq!(mine + other.join().unwrap(), 5);
        });
    }
}

/// A one-slot stock whose slot the first of two children of a parent
/// holds (its miss: a batch of 8 charged, 6 kept, 2 used); the second is
/// left out. `(stock, parent, in the slot, left out)`.
fn sibling_in_the_only_slot() -> (
    Arc<Stock>,
    Arc<UsageCounter>,
    Arc<UsageCounter>,
    Arc<UsageCounter>,
) {
    let stock = Arc::new(Stock::new(1, 1, 8).unwrap());
    let p = UsageCounter::root();
    let a = UsageCounter::child_of(&p);
    let b = UsageCounter::child_of(&p);
    a.charge(8);
    let _ = stock.stash(0, &a, 6).uncharge();
    (stock, p, a, b)
}

/// What a user of the left-out child does: charge `n` through its
/// parent's slot, or directly when that does not go through.
fn charge_left_out(stock: &Stock, child: &Arc<UsageCounter>, n: u64) {
    if stock.charge_through_parent(0, child, n).is_none() {
        child.try_charge(n).unwrap();
    }
}

/// A child left out charges through its parent's slot (taking over its
/// sibling's slot for the parent: the units come off the sibling's counter
/// and stay charged at the parent) and gives one back, while another
/// thread drains the stock: whatever the interleaving, the sibling ends
/// with what it used, the parent with both children's units, and no level
/// underflows — the hand-over and the take happen under the block's lock,
/// so a drain takes each unit either before them (the child then charges
/// directly) or after (as the parent's).
#[test]
fn charges_through_the_parents_slot_racing_a_drain_keep_every_level_exact() {
    loom::model(|| {
        let (stock, p, a, b) = sibling_in_the_only_slot();
        let (s, child) = (stock.clone(), b.clone());
        let user = thread::spawn(move || {
            charge_left_out(&s, &child, 3);
            s.return_left_out(0, &child, 1);
        });
        stock.drain_all(&|_| true);
        user.join().unwrap();
        stock.drain_all(&|_| true);
        assert_eq!((a.usage(), b.usage(), p.usage()), (2, 2, 4));
        for c in [&a, &b, &p] {
            assert_eq!(c.events().underflow, 0);
        }
    });
}

/// A promotion racing the parent's removal: a child left out takes over
/// its sibling's slot for the parent (`Stock::promote`, under the block's
/// lock) while the parent is retired and its key drained (`drain_key`,
/// which looks at the key words without the lock). The promotion stores
/// the parent's key word, fences and re-checks `retired` — the same Dekker
/// pattern as a stash installing a new key —, so either the drain sees the
/// parent's slot or the promotion sees the retirement and empties the
/// slot. Without the re-check the parent keeps a slot after its removal
/// (its units stocked for a group that is gone).
#[test]
fn a_promotion_racing_the_parents_removal_leaves_nothing_stocked_for_it() {
    loom::model(|| {
        let (stock, p, d, k) = sibling_in_the_only_slot();
        let (s, child) = (stock.clone(), k.clone());
        let user = thread::spawn(move || charge_left_out(&s, &child, 3));
        p.retire();
        stock.drain_key(p.as_raw());
        user.join().unwrap();
        assert_eq!(stock.stocked(&p), 0, "units stocked for the removed parent");
        stock.drain_all(&|_| true);
        assert_eq!((d.usage(), k.usage(), p.usage()), (2, 3, 5));
        assert_eq!((d.stock_slots(), p.stock_slots()), (0, 0));
        for c in [&d, &k, &p] {
            assert_eq!(c.events().underflow, 0);
        }
    });
}
