//! Footprint: what a counter says it takes (`SplitCounter::footprint`,
//! computed from its layout) is what its arena hands out, everything goes
//! back when it is dropped, and a tree stays within 12 bytes per CPU from 64
//! CPUs up.

use splitcount::counter::{Config, Design, SplitCounter, Tree};
use splitcount::cpu::Machine;
use splitcount::raw::percpu::Arena;

/// Simulated machines of many sizes (one node per 64 CPUs).
const SIZES: [usize; 12] = [1, 2, 3, 7, 16, 64, 100, 128, 256, 1000, 1024, 4096];

fn machine(cpus: usize) -> Machine {
    Machine::simulated(cpus, cpus.div_ceil(64)).unwrap()
}

fn tree_on(arena: &Arena, machine: &Machine) -> Tree {
    Tree::with_config(&Config::new(Design::Tree).machine(machine).arena(arena)).unwrap()
}

#[test]
fn a_trees_footprint_is_what_its_arena_hands_out() {
    for cpus in SIZES {
        let m = machine(cpus);
        let arena = Arena::new(&m);
        let trees: Vec<Tree> = (0..40).map(|_| tree_on(&arena, &m)).collect();
        let f = trees[0].footprint();
        assert!(trees.iter().all(|t| t.footprint() == f), "{cpus} CPUs");
        // Per-CPU: one slot on every CPU and in the overflow region.
        assert_eq!(arena.slots_in_use(), trees.len(), "{cpus} CPUs");
        assert_eq!(f.per_cpu, 8 * (arena.regions() + 1), "{cpus} CPUs");
        // Shared: one 8-byte slot per intermediate item, root accumulator
        // and the bias.
        let shape = trees[0].shape();
        let items: usize = (1..shape.levels()).map(|l| shape.items_at(l)).sum();
        assert!(f.shared >= 8 * (items + 2), "{cpus} CPUs: {f:?}");
        assert!(f.shared <= 8 * (items + 1 + 16), "{cpus} CPUs: {f:?}");
        assert_eq!(
            arena.stripe_slots_in_use() * 8,
            trees.len() * f.shared,
            "{cpus} CPUs"
        );
        assert_eq!(f.total(), f.per_cpu + f.shared + f.heap);
        drop(trees);
        assert_eq!(arena.slots_in_use(), 0, "{cpus} CPUs");
        assert_eq!(arena.stripe_slots_in_use(), 0, "{cpus} CPUs");
    }
}

#[test]
fn a_tree_takes_at_most_12_bytes_per_cpu_from_64_cpus() {
    for cpus in [64, 128, 256, 512, 1024, 2048, 4096] {
        let f = Config::new(Design::Tree)
            .machine(&machine(cpus))
            .build()
            .unwrap()
            .footprint();
        assert!(f.per_cpu_bytes(cpus) <= 12.0, "{cpus} CPUs: {f:?}");
    }
}

#[test]
fn a_trees_handle_is_40_bytes_and_owns_no_heap() {
    assert_eq!(std::mem::size_of::<Tree>(), 40);
    for cpus in SIZES {
        let m = machine(cpus);
        let t = tree_on(&Arena::new(&m), &m);
        assert_eq!(t.footprint().heap, 40, "{cpus} CPUs");
    }
}

/// What depends only on the shape and the arena is one layout, shared by
/// every tree built alike — and by no tree of another arena or shape.
#[test]
fn trees_built_alike_share_one_layout_and_others_do_not() {
    let m = machine(64);
    let (a, b) = (Arena::new(&m), Arena::new(&m));
    let in_a: Vec<Tree> = (0..3).map(|_| tree_on(&a, &m)).collect();
    let in_b = tree_on(&b, &m);
    let other_batch =
        Tree::with_config(&Config::new(Design::Tree).machine(&m).arena(&a).batch(8)).unwrap();
    assert!(in_a[0].shares_layout_with(&in_a[1]) && in_a[2].shares_layout_with(&in_a[0]));
    assert!(!in_a[0].shares_layout_with(&in_b), "another arena");
    assert!(!in_a[0].shares_layout_with(&other_batch), "another shape");
    let layout = in_a[0].shared_layout_bytes();
    assert!(layout > 0 && layout < 400, "{layout} bytes at 64 CPUs");
    // Each tree's slot and items come from its own arena, and go back there.
    assert_eq!((a.slots_in_use(), b.slots_in_use()), (4, 1));
    let shared = in_a[0].footprint().shared;
    assert_eq!(b.stripe_slots_in_use() * 8, shared);
    // The other arena's tree and the other shape's tree count alone.
    for cpu in 0..64 {
        in_b.add_on(cpu, 31).unwrap();
        other_batch.add_on(cpu, 7).unwrap();
    }
    assert_eq!(in_b.precise(), 64 * 31);
    assert_eq!(other_batch.precise(), 64 * 7);
    assert_eq!(other_batch.accuracy(), {
        let alone = Config::new(Design::Tree)
            .machine(&m)
            .batch(8)
            .build()
            .unwrap();
        alone.accuracy()
    });
    assert!(in_a
        .iter()
        .all(|t| t.precise() == 0 && t.approximate() == 0));
    drop(in_b);
    assert_eq!((b.slots_in_use(), b.stripe_slots_in_use()), (0, 0));
    drop(other_batch);
    drop(in_a);
    assert_eq!((a.slots_in_use(), a.stripe_slots_in_use()), (0, 0));
}

/// Rows go back to the chunk they came from, whichever it is: trees on
/// many chunks, dropped out of order, leave nothing behind and their slots
/// are reused.
#[test]
fn trees_on_many_chunks_give_back_every_slot() {
    let m = machine(4);
    let arena = Arena::new(&m);
    let mut trees: Vec<Tree> = (0..1300).map(|_| tree_on(&arena, &m)).collect();
    assert!(arena.chunks() >= 3);
    for (i, t) in trees.iter().enumerate() {
        t.add_on(i % 4, i as i64).unwrap();
    }
    // Drop every other tree, then the rest in reverse.
    let mut i = 0;
    trees.retain(|_| {
        i += 1;
        i % 2 == 0
    });
    assert_eq!(arena.slots_in_use(), 650);
    let chunks = arena.chunks();
    let again: Vec<Tree> = (0..650).map(|_| tree_on(&arena, &m)).collect();
    assert_eq!(arena.chunks(), chunks, "freed rows are reused");
    assert!(again
        .iter()
        .all(|t| t.precise() == 0 && t.approximate() == 0));
    // Every slot is one tree's alone: the new trees' adds show in their own
    // value only, and the survivors kept theirs.
    for (j, t) in again.iter().enumerate() {
        t.add_on(j % 4, j as i64 + 1).unwrap();
    }
    for (j, t) in again.iter().enumerate() {
        assert_eq!(t.precise(), j as i64 + 1, "new tree {j}");
    }
    for (k, t) in trees.iter().enumerate() {
        assert_eq!(t.precise(), 2 * k as i64 + 1, "surviving tree {k}");
    }
    drop(again);
    while trees.pop().is_some() {}
    assert_eq!((arena.slots_in_use(), arena.stripe_slots_in_use()), (0, 0));
}

#[test]
fn every_design_reports_its_per_cpu_slots() {
    for cpus in SIZES {
        let m = machine(cpus);
        for d in Design::ALL {
            let arena = Arena::new(&m);
            let c = Config::new(d).machine(&m).arena(&arena).build().unwrap();
            let f = c.footprint();
            assert_eq!(
                f.per_cpu,
                arena.slots_in_use() * 8 * (cpus + 1),
                "{d:?} {cpus}"
            );
            assert_eq!(f.shared, arena.stripe_slots_in_use() * 8, "{d:?} {cpus}");
            assert!(f.heap >= std::mem::size_of::<usize>(), "{d:?} {cpus}");
        }
    }
}

/// Trees share stripe lines; one tree's carries never show in another's
/// items, and a tree built on stripes another one freed starts at zero.
#[test]
fn trees_sharing_stripes_stay_apart_and_reused_stripes_start_at_zero() {
    for cpus in [4, 64, 256] {
        let m = machine(cpus);
        let arena = Arena::new(&m);
        let a = tree_on(&arena, &m);
        let b = tree_on(&arena, &m);
        for round in 0..50 {
            for cpu in 0..cpus {
                a.add_on(cpu, 1 + (round % 7) as i64).unwrap();
            }
        }
        assert_eq!(b.approximate(), 0, "{cpus} CPUs");
        assert_eq!(b.precise(), 0, "{cpus} CPUs");
        assert!(a.approximate() > 0, "{cpus} CPUs");
        drop(a);
        let c = tree_on(&arena, &m);
        assert_eq!((c.approximate(), c.precise()), (0, 0), "{cpus} CPUs");
        // The reused items start empty: the worst case reaches the bound
        // exactly, no more.
        let cfg = Config::new(Design::Tree).machine(&m).arena(&arena);
        for step in cfg
            .worst_case_schedule(splitcount::counter::Side::Under)
            .unwrap()
        {
            c.add_on(step.cpu, step.delta).unwrap();
        }
        assert_eq!(
            c.precise() - c.approximate(),
            c.accuracy().under as i64,
            "{cpus} CPUs"
        );
        assert_eq!(b.approximate(), 0, "{cpus} CPUs");
    }
}
