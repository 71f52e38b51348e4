//! The stock's budget: however many groups charge on a CPU, what that CPU
//! stocks in all stays at or below the budget (7 batches by default), and
//! many groups taking turns on one CPU keep hitting the stock — a miss
//! per share of the budget, not a miss per charge.
//!
//! Counted, not timed (the lab's `bench charge` times the `32-tenants`
//! case against `stock`). A refill shows as a rise of the group's usage:
//! a hit leaves the usage alone, a miss charges a batch or a share.

#![cfg(not(loom))]

mod common;

use common::{online_cpu_ids, pin_to, unpin};
use proptest::prelude::*;
use splitcount::cpu::Machine;
use splitcount::group::{Group, Hierarchy, HierarchyConfig};
use splitcount::raw::{ADMIT_EVERY, ADMIT_EVERY_MAX};

fn machine(cpus: usize) -> Machine {
    Machine::simulated(cpus, 1).unwrap()
}

/// `n` tenants, each the one child of a group of its own (`/p{i}/t`): no
/// tenant's parent has another child in the slots, so none can charge
/// through its parent's slot (see `tests/stock_parent_slot.rs`) and the
/// admission filter decides for every tenant left out.
fn tenants(h: &Hierarchy, n: usize) -> Vec<Group> {
    (0..n)
        .map(|i| {
            h.root()
                .child(&format!("p{i}"))
                .unwrap()
                .child("t")
                .unwrap()
        })
        .collect()
}

/// A hierarchy on one simulated CPU whose stock has `slots` slots.
fn one_cpu_with_slots(slots: usize) -> Hierarchy {
    let config = HierarchyConfig::default().machine(&machine(1));
    Hierarchy::new(config.stock_slots(slots)).unwrap()
}

/// Charge one unit to each tenant in turn, `rounds` times, on the current
/// CPU; the number of charges that refilled the stock.
fn take_turns(groups: &[Group], rounds: usize) -> usize {
    turns(groups, rounds, false)
}

/// [`take_turns`], each charge given back at once (a request that
/// allocates and frees).
fn take_and_give_back_turns(groups: &[Group], rounds: usize) -> usize {
    turns(groups, rounds, true)
}

fn turns(groups: &[Group], rounds: usize, give_back: bool) -> usize {
    let mut refills = 0;
    for _ in 0..rounds {
        for g in groups {
            let before = g.usage();
            g.charge(1).unwrap();
            if g.usage() != before {
                refills += 1;
            }
            if give_back {
                g.uncharge(1);
            }
        }
    }
    refills
}

#[test]
fn thirty_two_tenants_on_one_cpu_miss_once_per_share_of_the_budget() {
    let m = machine(1);
    let h = Hierarchy::new(HierarchyConfig::default().machine(&m)).unwrap();
    assert_eq!(h.config().effective_stock_budget(), 7 * 64);
    let groups = tenants(&h, 32);
    // Warm up: every tenant gets a slot and its share (448 / 32 = 14).
    take_turns(&groups, 64);
    let rounds = 1400;
    let refills = take_turns(&groups, rounds);
    let ops = rounds * groups.len();
    // One refill per 14 charges (the share), give or take the rounding.
    assert!(
        refills <= ops / 14 + ops / 100,
        "{refills} refills in {ops} charges"
    );
    assert!(h.stocked_on_cpu(0) <= 7 * 64);
    for g in &groups {
        assert_eq!(g.usage() - g.stocked(), (64 + rounds) as u64);
    }
}

/// 8 tenants take 808 turns on `h`'s stock of 7 slots. Round-robin
/// eviction of this cyclic pattern would miss on every charge; the
/// admission filter keeps 7 in the slots, and the one left out charges
/// directly (a miss per 8 charges) and takes a slot once per
/// `ADMIT_EVERY` of its misses, evicting one that is then left out in its
/// place. Every unit is accounted for after a drain.
fn eight_tenants_take_turns_over_seven_slots(h: &Hierarchy) {
    let groups = tenants(h, 8);
    take_turns(&groups, 8);
    let misses = take_turns(&groups, 800);
    // 800 misses of the tenant left out, plus a refill for each one
    // admitted (one in ADMIT_EVERY of those misses).
    let expected = 800 + 800 / ADMIT_EVERY as usize;
    assert!(misses <= expected, "{misses} misses in 6400 charges");
    for cpu in 0..h.config().machine.cpus() {
        assert!(h.stocked_on_cpu(cpu) <= 7 * 64);
    }
    h.drain_stocks();
    for g in &groups {
        assert_eq!((g.usage(), g.stocked()), (808, 0));
    }
}

#[test]
fn thirty_two_tenants_that_give_back_what_they_take_share_the_budget() {
    // Each charge is given back at once (a request that allocates and
    // frees): a tenant's units never run down, so the budget has to come
    // back from the first tenants' slots as units, not only as quotas.
    let h = one_cpu_with_slots(63);
    let groups = tenants(&h, 32);
    take_and_give_back_turns(&groups, 64);
    let misses = take_and_give_back_turns(&groups, 1000);
    assert!(misses <= 32, "{misses} misses in 32,000 charges");
    assert!(h.stocked_on_cpu(0) <= 7 * 64);
    h.drain_stocks();
    for g in &groups {
        assert_eq!((g.usage(), g.stocked()), (0, 0));
    }
}

#[test]
fn with_one_tenant_more_than_slots_the_others_keep_hitting() {
    let h = one_cpu_with_slots(7);
    eight_tenants_take_turns_over_seven_slots(&h);
}

#[test]
fn a_single_slot_is_not_thrashed_by_tenants_in_turn() {
    // The kernel's stock before 6.16 (one slot per CPU) with 4 tenants in
    // turn: without the filter, every charge evicts; with it, 3 of 4
    // charge directly and the slot changes hands once per ADMIT_EVERY
    // misses.
    let h = one_cpu_with_slots(1);
    let groups = tenants(&h, 4);
    take_turns(&groups, 8);
    let misses = take_turns(&groups, 800);
    assert!(
        misses <= 2400 + 2400 / ADMIT_EVERY as usize,
        "{misses} misses in 3200 charges"
    );
    assert!(misses >= 2400, "one tenant at a time holds the slot");
}

#[test]
fn a_new_working_set_replaces_an_idle_one() {
    // 7 tenants fill the 7 slots and go idle; 7 others take turns: each
    // miss of theirs counts towards admission, and after ADMIT_EVERY
    // misses per slot the new set holds every slot and hits.
    let h = one_cpu_with_slots(7);
    let old = tenants(&h, 7);
    take_turns(&old, 4);
    let rounds = ADMIT_EVERY as usize * 7 + 7;
    let warm_up = seven_new_tenants_take_over(&h, &old, rounds);
    assert!(warm_up <= 7 * rounds);
}

/// 7 new tenants take `rounds` turns on `h`'s 7 slots, which `old` held:
/// then every slot is theirs — none of `old` has units stocked, and the
/// new ones hit (a refill per batch of their charges). The charges of the
/// `rounds` that refilled or charged directly.
fn seven_new_tenants_take_over(h: &Hierarchy, old: &[Group], rounds: usize) -> usize {
    let new: Vec<Group> = (0..7)
        .map(|i| {
            h.root()
                .child(&format!("n{i}"))
                .unwrap()
                .child("t")
                .unwrap()
        })
        .collect();
    let warm_up = take_turns(&new, rounds);
    for g in old {
        assert_eq!(g.stocked(), 0, "the old set was evicted");
    }
    let misses = take_turns(&new, 128);
    assert!(misses <= 7 * 3, "{misses} misses in {} charges", 7 * 128);
    warm_up
}

/// Charge one unit to each tenant in turn, `rounds` times; the number of
/// times a tenant left out took a slot: its charge before was direct (the
/// usage rose by the unit) and this one refilled (by more than the unit).
fn admissions_in_turns(groups: &[Group], rounds: usize) -> usize {
    let mut admitted = 0;
    let mut direct = vec![false; groups.len()];
    for _ in 0..rounds {
        for (g, direct) in groups.iter().zip(&mut direct) {
            let before = g.usage();
            g.charge(1).unwrap();
            let rise = g.usage() - before;
            if rise > 1 && *direct {
                admitted += 1;
            }
            *direct = rise == 1;
        }
    }
    admitted
}

#[test]
fn a_cyclic_pattern_longer_than_the_slots_backs_off_its_evictions() {
    // 8 tenants in turn over 7 slots: each eviction admits the key the one
    // before evicted (it hands the miss on, nothing more), so the CPU's
    // admission period doubles at each — 8, 16, 32, 64, 128 misses — and
    // then stays at ADMIT_EVERY_MAX: a slot changes hands once per 128
    // misses of the key left out instead of once per 8 (100 evictions in
    // 800 rounds, each an uncharge of the victim's units and a refill).
    let h = one_cpu_with_slots(7);
    let groups = tenants(&h, 8);
    take_turns(&groups, 8);
    let rounds = 800;
    let admitted = admissions_in_turns(&groups, rounds);
    let backing_off = 5; // the admissions at 8, 8, 16, 32 and 64 misses
    let at_most = backing_off + rounds / ADMIT_EVERY_MAX as usize;
    assert!(
        admitted <= at_most,
        "{admitted} admissions in {rounds} rounds (at most {at_most})"
    );
    // The slot still changes hands: no tenant is left out for good.
    assert!(admitted >= rounds / ADMIT_EVERY_MAX as usize, "{admitted}");
    h.drain_stocks();
    for g in &groups {
        assert_eq!((g.usage(), g.stocked()), ((8 + rounds) as u64, 0));
    }
}

#[test]
fn after_backing_off_a_new_working_set_still_replaces_the_old_one() {
    // The filter backed off to ADMIT_EVERY_MAX serving 8 tenants over 7
    // slots; 7 new tenants come: the keys they bring in were not evicted
    // lately, so each admission halves the period again — 128, 64, 32,
    // 16, 8, 8, 8 misses, 264 in all — and the new set holds every slot.
    let h = one_cpu_with_slots(7);
    let old = tenants(&h, 8);
    take_turns(&old, 808);
    // 264 misses at 7, 6, … 1 a round take at most 19 + 11 + 7 + 4 + 3 +
    // 4 + 8 rounds (the count left from before only shortens the first).
    seven_new_tenants_take_over(&h, &old, 56);
}

#[test]
fn returns_of_a_tenant_left_out_reach_its_counter_at_once() {
    // A key without a slot whose units come back (an uncharge, a free of a
    // block another CPU allocated) while every slot is taken: they go to
    // the counter directly until the filter admits the key, and nothing
    // is lost.
    let h = one_cpu_with_slots(7);
    let holders = tenants(&h, 7);
    take_turns(&holders, 2);
    let out = h.root().child("out").unwrap();
    out.force_charge(100).unwrap();
    let left_out = ADMIT_EVERY as u64 - 1;
    for i in 1..=left_out {
        out.uncharge(1);
        assert_eq!((out.usage(), out.stocked()), (100 - i, 0), "return {i}");
    }
    // The next miss is admitted: the slot it evicts keeps its units.
    out.uncharge(1);
    assert_eq!(out.stocked(), 1);
    assert_eq!(holders.iter().filter(|g| g.stocked() == 0).count(), 1);
    for _ in left_out + 1..100 {
        out.uncharge(1);
    }
    h.drain_stocks();
    assert_eq!((out.usage(), out.events().underflow), (0, 0));
}

#[test]
fn an_over_uncharge_of_a_tenant_left_out_is_clamped_where_it_is_seen() {
    // A key without a slot, every slot taken, gives back more than its
    // usage: only what the usage accounts for comes off its counters (and
    // its parent's), once, with an underflow event — whether the filter
    // left it out (decided without the block's lock) or not.
    let h = one_cpu_with_slots(7);
    let holders = tenants(&h, 7);
    take_turns(&holders, 2);
    let parent = h.root().child("over-parent").unwrap();
    let out = parent.child("out").unwrap();
    let witness = parent.child("witness").unwrap();
    witness.force_charge(50).unwrap();
    for round in 1..=ADMIT_EVERY as u64 {
        out.force_charge(5).unwrap();
        out.uncharge(8);
        h.drain_stocks();
        assert_eq!(out.usage(), 0, "round {round}");
        assert_eq!(out.events().underflow, round, "round {round}");
        assert_eq!(
            parent.usage(),
            50,
            "round {round}: the sibling's units stay"
        );
    }
}

#[test]
fn one_tenant_alone_still_refills_a_whole_batch() {
    let m = machine(1);
    let h = Hierarchy::new(HierarchyConfig::default().machine(&m)).unwrap();
    let groups = tenants(&h, 1);
    assert_eq!(take_turns(&groups, 640), 10, "one refill per 64 charges");
}

#[test]
fn a_tenant_left_alone_grows_back_to_a_batch() {
    // 32 tenants share the budget; then 31 are removed (their units go
    // back) and the last one's misses grow its quota back to the batch.
    let m = machine(1);
    let h = Hierarchy::new(HierarchyConfig::default().machine(&m)).unwrap();
    let mut groups = tenants(&h, 32);
    take_turns(&groups, 100);
    let last = groups.pop().unwrap();
    for g in groups {
        let held = g.usage() - g.stocked();
        g.uncharge(held);
        g.remove().unwrap();
    }
    let alone = [last];
    take_turns(&alone, 200);
    assert_eq!(take_turns(&alone, 640), 10, "one refill per 64 charges");
}

#[test]
fn more_tenants_than_slots_stay_within_the_budget_and_drain_exactly() {
    // 200 groups over 63 slots: windows overflow, keys evict each other,
    // and nothing is lost.
    let m = machine(2);
    let h = Hierarchy::new(HierarchyConfig::default().machine(&m)).unwrap();
    let groups = tenants(&h, 200);
    for round in 0..20 {
        m.set_current_cpu(round % 2).unwrap();
        take_turns(&groups, 1);
        for cpu in 0..2 {
            assert!(h.stocked_on_cpu(cpu) <= 7 * 64, "cpu {cpu}");
        }
    }
    h.drain_stocks();
    for g in &groups {
        assert_eq!((g.usage(), g.stocked()), (20, 0));
    }
    assert_eq!(h.root().usage(), 200 * 20);
}

/// One step of the model test: on `cpu`, `tenant` charges (or uncharges
/// up to what it holds) `n` units.
#[derive(Debug, Clone)]
struct Step {
    cpu: usize,
    tenant: usize,
    charge: bool,
    n: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0..4usize, 0..32usize, any::<bool>(), 1..200u64).prop_map(|(cpu, tenant, charge, n)| {
            Step {
                cpu,
                tenant,
                charge,
                n,
            }
        }),
        1..300,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The budget holds after every operation, for budgets below, at and
    /// above a batch and for slot counts on either side of the window; the
    /// units held are exact throughout and after a drain.
    #[test]
    fn a_cpu_never_stocks_more_than_its_budget(
        steps in steps(),
        budget in prop::sample::select(vec![1u64, 10, 64, 100, 448, 5000]),
        slots in prop::sample::select(vec![1usize, 7, 16, 17, 63]),
        batch in prop::sample::select(vec![1u64, 16, 64]),
    ) {
        let m = machine(4);
        let h = Hierarchy::new(
            HierarchyConfig::default()
                .machine(&m)
                .stock_budget(budget)
                .stock_slots(slots)
                .stock_batch(batch),
        )
        .unwrap();
        prop_assert_eq!(h.max_slack(), 4 * budget);
        let groups = tenants(&h, 32);
        let mut held = [0u64; 32];
        for s in &steps {
            m.set_current_cpu(s.cpu).unwrap();
            let g = &groups[s.tenant];
            if s.charge {
                g.charge(s.n).unwrap();
                held[s.tenant] += s.n;
            } else {
                let n = s.n.min(held[s.tenant]);
                g.uncharge(n);
                held[s.tenant] -= n;
            }
            for cpu in 0..4 {
                prop_assert!(h.stocked_on_cpu(cpu) <= budget, "cpu {} after {:?}", cpu, s);
            }
            prop_assert_eq!(g.usage() - g.stocked(), held[s.tenant]);
        }
        h.drain_stocks();
        for (g, &held) in groups.iter().zip(&held) {
            prop_assert_eq!((g.usage(), g.stocked()), (held, 0));
        }
        prop_assert_eq!(h.root().usage(), held.iter().sum::<u64>());
    }
}

/// On this host the hits are rseq critical sections (where the platform
/// allows): the same budget, read after every round of 32 tenants taking
/// turns on whatever CPU the thread runs on.
#[test]
fn on_this_host_32_tenants_stay_within_the_budget() {
    let h = Hierarchy::new(HierarchyConfig::default()).unwrap();
    let cpus = h.config().machine.cpus();
    let groups = tenants(&h, 32);
    let mut refills = 0;
    for _ in 0..200 {
        refills += take_turns(&groups, 1);
        for cpu in 0..cpus {
            assert!(h.stocked_on_cpu(cpu) <= 7 * 64, "cpu {cpu}");
        }
    }
    // A miss per share (14) of charges on the CPU the thread stays on;
    // twice that leaves room for migrations, far below a miss per charge.
    assert!(refills <= 6400 / 7, "{refills} refills in 6400 charges");
    h.drain_stocks();
    for g in &groups {
        assert_eq!(g.usage(), 200);
    }
}

/// The admission filter on this host's stock (rseq critical sections where
/// the platform allows: the miss decides under the CPU's lock, taken by a
/// critical section), the thread pinned to one CPU so that its tenants
/// share one block.
#[test]
fn on_this_host_8_tenants_over_7_slots_keep_hitting() {
    let online = online_cpu_ids();
    if !pin_to(online[0]) {
        eprintln!("skipped: this thread may not be pinned");
        return;
    }
    let h = Hierarchy::new(HierarchyConfig::default().stock_slots(7)).unwrap();
    eprintln!("rseq stock: {}", h.uses_rseq_stock());
    eight_tenants_take_turns_over_seven_slots(&h);
    unpin(&online);
}

#[test]
fn returns_to_another_cpu_reach_the_counters_once_per_half_a_batch() {
    // What a consumer thread does with a producer's blocks: units charged
    // on CPU 0, returned one by one on CPU 1. CPU 1's slot fills to its
    // quota (a batch), then each overflow drains it to half: the usage
    // moves once per 32 returns, not on every return past the first 64.
    let m = machine(2);
    let h = Hierarchy::new(HierarchyConfig::default().machine(&m)).unwrap();
    let g = h.root().child("producer").unwrap();
    g.charge(10_000).unwrap();
    m.set_current_cpu(1).unwrap();
    let mut moves = 0;
    for _ in 0..10_000 {
        let before = g.usage();
        g.uncharge(1);
        if g.usage() != before {
            moves += 1;
        }
    }
    assert!(moves <= 10_000 / 32 + 1, "{moves} counter updates");
    assert!(h.stocked_on_cpu(1) <= 64);
    h.drain_stocks();
    assert_eq!((g.usage(), g.events().underflow), (0, 0));
}
