//! The arena under real threads: more threads than cores, re-pinned across
//! CPUs while they add, some exiting early. After join, every object's sum is
//! exactly what was added to it.

mod common;

use common::{online_cpu_ids, pin_to, unpin, Rng};
use splitcount::cpu::Machine;
use splitcount::raw::percpu::Arena;

const OBJECTS: usize = 10_000;
const THREADS: usize = 8;
const OPS: usize = 400_000;

#[test]
fn no_update_is_lost_while_threads_migrate() {
    let arena = Arena::new(&Machine::host());
    let objects: Vec<_> = (0..OBJECTS).map(|_| arena.alloc(1).unwrap()).collect();
    let online = online_cpu_ids();

    let expected: Vec<Vec<i64>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (objects, online) = (&objects, &online);
                s.spawn(move || {
                    let mut rng = Rng::new(t as u64 + 1);
                    let mut mine = vec![0i64; OBJECTS];
                    // Half the threads exit early: their updates must stay.
                    let ops = if t % 2 == 0 { OPS } else { OPS / 8 };
                    for i in 0..ops {
                        if i % 1000 == 0 {
                            pin_to(online[rng.below(online.len() as u64) as usize]);
                        }
                        let o = rng.below(OBJECTS as u64) as usize;
                        let d = rng.delta(1000);
                        objects[o].add(0, d).unwrap();
                        mine[o] += d;
                    }
                    unpin(online);
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });

    for (o, obj) in objects.iter().enumerate() {
        let want: i64 = expected.iter().map(|m| m[o]).sum();
        assert_eq!(obj.sum(0), Some(want), "object {o}");
    }
}

#[test]
fn concurrent_allocation_and_freeing_hand_out_zeroed_disjoint_slots() {
    let arena = Arena::new(&Machine::host());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let arena = &arena;
            s.spawn(move || {
                let mut rng = Rng::new(100 + t as u64);
                let mut live = Vec::new();
                for _ in 0..5_000 {
                    if live.len() < 64 && rng.below(3) > 0 {
                        let len = 1 + rng.below(8) as usize;
                        let p = arena.alloc(len).unwrap();
                        for i in 0..len {
                            assert_eq!(p.sum(i), Some(0), "a fresh slot is zero");
                            p.add(i, t as i64 + 1).unwrap();
                        }
                        live.push(p);
                    } else if !live.is_empty() {
                        let p = live.swap_remove(rng.below(live.len() as u64) as usize);
                        for i in 0..p.len() {
                            // Nobody else may have touched our slots.
                            assert_eq!(p.sum(i), Some(t as i64 + 1));
                        }
                    }
                }
            });
        }
    });
    assert_eq!(arena.slots_in_use(), 0);
}
