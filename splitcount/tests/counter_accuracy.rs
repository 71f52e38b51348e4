//! Every design against an oracle on simulated machines of many sizes:
//! random walks never leave the bound, the worst-case schedule reaches it
//! exactly, `precise()` equals the oracle, and comparisons at the edges of
//! the band are decided correctly.

mod common;

use common::Rng;
use splitcount::counter::{ApproxOrdering, Config, Design, Side, SplitCounter};
use splitcount::cpu::Machine;
use std::cmp::Ordering;

const SIZES: [usize; 7] = [1, 2, 3, 8, 64, 256, 1024];

fn config(design: Design, cpus: usize) -> Config {
    let m = Machine::simulated(cpus, cpus.min(4)).unwrap();
    Config::new(design).machine(&m)
}

fn counter(design: Design, cpus: usize) -> Box<dyn SplitCounter> {
    config(design, cpus).build().unwrap()
}

/// The worst-case schedule of the counter `counter(design, cpus)` builds.
fn schedule(design: Design, cpus: usize, side: Side) -> Vec<splitcount::counter::Step> {
    config(design, cpus).worst_case_schedule(side).unwrap()
}

fn cpus_of(c: &dyn SplitCounter, fallback: usize) -> usize {
    // Every design refuses the first CPU past the machine.
    (1..=fallback + 1)
        .find(|&n| c.add_on(n, 0).is_err())
        .unwrap_or(fallback)
}

#[test]
fn random_walks_stay_inside_the_bound_and_precise_matches_the_oracle() {
    for design in Design::ALL {
        for cpus in SIZES {
            let c = counter(design, cpus);
            assert_eq!(cpus_of(&*c, cpus), cpus);
            let acc = c.accuracy();
            let mut rng = Rng::new(cpus as u64 * 31 + design as u64);
            let mut oracle = 0i64;
            let batch = 64i64;
            for step in 0..20_000 {
                let cpu = rng.below(cpus as u64) as usize;
                let delta = rng.delta(3 * batch);
                c.add_on(cpu, delta).unwrap();
                oracle += delta;
                assert!(
                    acc.admits(c.approximate(), oracle),
                    "{design} on {cpus} CPUs, step {step}: approximate {} vs precise {oracle}, accuracy {acc:?}",
                    c.approximate()
                );
                if step % 1000 == 0 {
                    assert_eq!(c.precise(), oracle, "{design} on {cpus} CPUs");
                }
            }
            assert_eq!(c.precise(), oracle, "{design} on {cpus} CPUs");
        }
    }
}

#[test]
fn the_worst_case_schedule_reaches_the_bound_exactly() {
    for design in Design::ALL {
        for cpus in SIZES {
            for side in [Side::Under, Side::Over] {
                let c = counter(design, cpus);
                let acc = c.accuracy();
                let mut oracle = 0i64;
                for s in schedule(design, cpus, side) {
                    c.add_on(s.cpu, s.delta).unwrap();
                    oracle += s.delta;
                    assert!(
                        acc.admits(c.approximate(), oracle),
                        "{design}/{cpus}: bound exceeded on the way"
                    );
                }
                assert_eq!(c.precise(), oracle);
                let reached = match side {
                    Side::Under => oracle - c.approximate(),
                    Side::Over => c.approximate() - oracle,
                };
                let bound = match side {
                    Side::Under => acc.under,
                    Side::Over => acc.over,
                };
                assert_eq!(
                    reached, bound as i64,
                    "{design} on {cpus} CPUs, side {side:?}"
                );
            }
        }
    }
}

#[test]
fn documented_bounds_for_batch_32() {
    let under = |design, cpus, batch: Option<u64>| {
        let m = Machine::simulated(cpus, 1).unwrap();
        let mut cfg = Config::new(design).machine(&m);
        if let Some(b) = batch {
            cfg = cfg.batch(b);
        }
        cfg.build().unwrap().accuracy()
    };
    // Batched with its default batch max(32, 2·ncpu): ncpu·(batch−1).
    assert_eq!(under(Design::Batched, 8, None).under, 8 * 31);
    assert_eq!(under(Design::Batched, 256, None).under, 256 * 511);
    assert_eq!(under(Design::Batched, 4096, None).under, 4096 * 8191);
    // Tree, batch 32, fan-outs from the table.
    assert_eq!(
        under(Design::Tree, 8, Some(32)).under,
        8 * 31 + 4 * 32 + 2 * 64
    );
    assert_eq!(under(Design::Tree, 8, Some(32)).over, 0);
    // 256 = 4·8·8: 256·31 + 64·(128−32) + 8·(1024−128)
    assert_eq!(under(Design::Tree, 256, Some(32)).under, 7936 + 6144 + 7168);
    // 4096 = 16·16·16: 4096·31 + 256·(512−32) + 16·(8192−512)
    assert_eq!(
        under(Design::Tree, 4096, Some(32)).under,
        126_976 + 122_880 + 122_880
    );
}

/// Drive a counter to the edge of one side, then check both comparisons at
/// the edge and one unit beyond.
#[test]
fn comparisons_at_the_edges_of_the_band() {
    for design in Design::ALL {
        for cpus in [1, 3, 64] {
            for side in [Side::Under, Side::Over] {
                let c = counter(design, cpus);
                for s in schedule(design, cpus, side) {
                    c.add_on(s.cpu, s.delta).unwrap();
                }
                let (a, p) = (c.approximate(), c.precise());
                let acc = c.accuracy();
                let hi = a + acc.under as i64; // largest value precise may have
                let lo = a - acc.over as i64; // smallest
                assert!(lo <= p && p <= hi);
                // Inside the band (edges included): approximate_compare can't tell…
                for v in [lo, hi] {
                    let want = if lo == hi {
                        ApproxOrdering::Equal
                    } else {
                        ApproxOrdering::Unknown
                    };
                    assert_eq!(c.approximate_compare(v), want, "{design}/{cpus} at {v}");
                }
                // …one unit beyond, it can.
                assert_eq!(c.approximate_compare(hi + 1), ApproxOrdering::Less);
                assert_eq!(c.approximate_compare(lo - 1), ApproxOrdering::Greater);
                // compare is exact everywhere.
                for v in [lo - 1, lo, p - 1, p, p + 1, hi, hi + 1] {
                    assert_eq!(c.compare(v), p.cmp(&v), "{design}/{cpus}/{side:?} v={v}");
                }
            }
        }
    }
}

#[test]
fn set_moves_the_value_through_a_bias_for_large_values_of_either_sign() {
    for design in Design::ALL {
        let c = counter(design, 8);
        for cpu in 0..8 {
            c.add_on(cpu, 17 * cpu as i64 - 40).unwrap();
        }
        for v in [i64::MAX / 4, -(1 << 50), 0, 12345, i64::MIN / 4] {
            c.set(v);
            assert_eq!(c.precise(), v, "{design} set({v})");
            assert!(c.accuracy().admits(c.approximate(), v));
            c.add_on(5, 99).unwrap();
            assert_eq!(c.precise(), v + 99);
            assert_eq!(c.compare(v + 99), Ordering::Equal);
            assert!(c.accuracy().admits(c.approximate(), v + 99));
        }
    }
}

#[test]
fn a_cpu_beyond_the_machine_is_an_error_not_a_panic() {
    for design in Design::ALL {
        let c = counter(design, 4);
        assert!(c.add_on(4, 1).is_err());
        assert!(c.add_on(usize::MAX, 1).is_err());
        assert_eq!(c.precise(), 0);
    }
}

#[test]
fn values_near_the_ends_of_the_range_compare_without_overflow() {
    for design in Design::ALL {
        let c = counter(design, 4);
        c.set(i64::MAX - 10);
        assert_eq!(c.compare(i64::MIN), Ordering::Greater);
        assert_eq!(c.compare(i64::MAX), Ordering::Less);
        c.set(i64::MIN + 10);
        assert_eq!(c.compare(i64::MAX), Ordering::Less);
        assert_eq!(c.compare(i64::MIN), Ordering::Greater);
    }
}

/// After an add pushes the value past `i64::MAX`, the documented wrapping
/// holds for comparisons too: `compare(v)` agrees with `precise().cmp(&v)`
/// and `approximate_compare` never contradicts it.
#[test]
fn comparisons_agree_with_the_wrapped_value_after_an_overflow() {
    for design in Design::ALL {
        for (first, second) in [(i64::MAX, 10i64), (i64::MIN, -10), (i64::MAX - 3, 7)] {
            let c = counter(design, 4);
            c.add_on(0, first).unwrap();
            c.add_on(1, second).unwrap();
            let p = c.precise();
            for v in [
                0,
                -1,
                1,
                p,
                p.wrapping_add(1),
                p.wrapping_sub(1),
                i64::MIN,
                i64::MAX,
            ] {
                assert_eq!(c.compare(v), p.cmp(&v), "{design}: precise {p} vs {v}");
                let a = c.approximate_compare(v);
                let contradicts = match p.cmp(&v) {
                    Ordering::Less => a == ApproxOrdering::Greater || a == ApproxOrdering::Equal,
                    Ordering::Greater => a == ApproxOrdering::Less || a == ApproxOrdering::Equal,
                    Ordering::Equal => a == ApproxOrdering::Less || a == ApproxOrdering::Greater,
                };
                assert!(
                    !contradicts,
                    "{design}: approximate {a:?} vs precise {p} for {v}"
                );
            }
        }
    }
}

/// `PerNode` keeps slots only for nodes with CPUs, so its bound is reached
/// on every shape (4 CPUs over 3 nodes: 3 slots).
#[test]
fn pernode_bound_is_tight_on_uneven_node_shapes() {
    for (cpus, nodes) in [(4usize, 3usize), (5, 4), (7, 3), (64, 64), (100, 33)] {
        let m = Machine::simulated(cpus, nodes).unwrap();
        let cfg = Config::new(Design::PerNode).machine(&m).batch(32);
        let c = cfg.build().unwrap();
        let (under, _) = c.accuracy().bounds();
        for step in cfg.worst_case_schedule(Side::Under).unwrap() {
            c.add_on(step.cpu, step.delta).unwrap();
        }
        assert_eq!(
            (c.precise() - c.approximate()) as u64,
            under,
            "{cpus} CPUs, {nodes} nodes"
        );
        assert_eq!(under, nodes.min(32) as u64 * 31);
    }
}
