//! Footprint: what a counter says it takes (`SplitCounter::footprint`,
//! computed from its layout) is what its arena hands out, everything goes
//! back when it is dropped, and a tree stays within 12 bytes per CPU.

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
fn a_tree_takes_at_most_12_bytes_per_cpu_from_256_cpus() {
    for cpus in [256, 512, 1024, 2048, 4096] {
        let f = Config::new(Design::Tree)
            .machine(&machine(cpus))
            .build()
            .unwrap()
            .footprint();
        assert!(f.per_cpu_bytes(cpus) <= 12.0, "{cpus} CPUs: {f:?}");
    }
    // Below 256 CPUs the handle (a few hundred bytes, whatever the CPUs)
    // weighs more: what grows with the CPUs still stays under 12 bytes each.
    for cpus in [64, 128] {
        let f = Config::new(Design::Tree)
            .machine(&machine(cpus))
            .build()
            .unwrap()
            .footprint();
        assert!(
            ((f.per_cpu + f.shared) as f64) <= 12.0 * cpus as f64,
            "{cpus} CPUs: {f:?}"
        );
    }
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
