//! `Config::max_error`: on simulated machines of 1…4096 CPUs, the chosen
//! shape's bound is within the budget (and the worst-case schedule reaches
//! exactly that bound), every cheaper shape exceeds the budget, a budget
//! equal to a bound picks that shape, and budgets no shape meets are refused
//! with the numbers.
//!
//! The oracle enumerates shapes through explicit configurations (a batch and
//! `Arity::Orders`, no budget), in the cost order `Config::max_error`
//! documents: the table's fan-outs first, then with the top intermediate
//! levels folded into the root one at a time; within one fan-out list, the
//! largest batch first.

use splitcount::counter::{
    fanout_orders_for, Arity, Batched, Config, ConfigError, Design, Shape, Side, SplitCounter,
    Tree, MAX_BATCH,
};
use splitcount::cpu::Machine;

const CPUS: [usize; 22] = [
    1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 64, 100, 255, 256, 384, 512, 1000, 1024, 2048, 3000, 4096,
];

fn machines() -> Vec<Machine> {
    let mut out = Vec::new();
    for cpus in CPUS {
        for nodes in [1, 3, cpus.div_ceil(64), 40] {
            let nodes = nodes.clamp(1, cpus);
            if out
                .iter()
                .any(|m: &Machine| m.cpus() == cpus && m.topology().nodes() == nodes)
            {
                continue;
            }
            out.push(Machine::simulated(cpus, nodes).unwrap());
        }
    }
    out
}

fn budget(design: Design, m: &Machine, units: u64) -> Result<Shape, ConfigError> {
    Config::new(design).machine(m).max_error(units).chosen()
}

/// A tree shape the search may choose, with its bound from an explicit
/// configuration (the tree's own formula, not the search's).
#[derive(Debug, Clone)]
struct Candidate {
    orders: Vec<u32>,
    batch: u64,
    bound: u64,
}

/// Every tree shape the search may choose on `m`, cheapest first.
fn tree_candidates(m: &Machine) -> Vec<Candidate> {
    let table = fanout_orders_for(m.cpus());
    let mut lists = vec![table.clone()];
    for levels in (1..table.len()).rev() {
        let mut folded = table[..levels - 1].to_vec();
        folded.push(table[levels - 1..].iter().sum());
        lists.push(folded);
    }
    let mut out = Vec::new();
    for orders in lists {
        for shift in (1..=32).rev() {
            let batch = 1u64 << shift;
            let acc = Config::new(Design::Tree)
                .machine(m)
                .batch(batch)
                .arity(Arity::Orders(orders.clone()))
                .accuracy()
                .unwrap();
            assert_eq!(acc.over, 0);
            out.push(Candidate {
                orders: orders.clone(),
                batch,
                bound: acc.under,
            });
        }
    }
    out
}

/// The rank of `shape` among the candidates (lower is cheaper).
fn rank(candidates: &[Candidate], shape: &Shape) -> usize {
    candidates
        .iter()
        .position(|c| c.batch == shape.batch() && c.orders == shape.fanout_orders())
        .unwrap_or_else(|| panic!("{shape} is not a candidate"))
}

/// Budgets around every candidate's bound, and the usual suspects.
fn tree_budgets(m: &Machine, candidates: &[Candidate]) -> Vec<u64> {
    let n = m.cpus() as u64;
    let mut out = vec![0, 1, n - 1, n, n + 1, 1000, 50_000, u64::MAX];
    for c in candidates {
        out.extend([
            c.bound.saturating_sub(1),
            c.bound,
            c.bound.saturating_add(1),
        ]);
    }
    out
}

/// `Batched`'s or `PerNode`'s bound at `batch`, from an explicit config.
fn spill_bound(design: Design, m: &Machine, batch: u64) -> u64 {
    let acc = Config::new(design)
        .machine(m)
        .batch(batch)
        .accuracy()
        .unwrap();
    assert_eq!(acc.under, acc.over);
    acc.under
}

#[test]
fn the_tree_takes_the_cheapest_candidate_within_the_budget() {
    for m in machines() {
        let candidates = tree_candidates(&m);
        for units in tree_budgets(&m, &candidates) {
            let expected = candidates.iter().find(|c| c.bound <= units);
            match (budget(Design::Tree, &m, units), expected) {
                (Ok(shape), Some(c)) => {
                    assert_eq!(
                        (shape.batch(), shape.fanout_orders()),
                        (c.batch, &c.orders[..]),
                        "{} CPUs, budget {units}: chose {shape}, expected {c:?}",
                        m.cpus()
                    );
                    assert_eq!(shape.bound(), c.bound);
                    assert!(shape.bound() <= units);
                }
                (
                    Err(ConfigError::MaxErrorUnreachable {
                        requested,
                        smallest,
                    }),
                    None,
                ) => {
                    assert_eq!(requested, units);
                    let least = candidates.iter().map(|c| c.bound).min().unwrap();
                    assert_eq!(smallest.bound(), least);
                    assert!(least > units);
                }
                (got, want) => panic!(
                    "{} CPUs, budget {units}: {got:?}, expected {want:?}",
                    m.cpus()
                ),
            }
        }
    }
}

#[test]
fn the_next_cheaper_tree_shape_exceeds_the_budget() {
    for m in machines() {
        let candidates = tree_candidates(&m);
        for units in tree_budgets(&m, &candidates) {
            let Ok(shape) = budget(Design::Tree, &m, units) else {
                continue;
            };
            let r = rank(&candidates, &shape);
            for cheaper in &candidates[..r] {
                assert!(
                    cheaper.bound > units,
                    "{} CPUs, budget {units}: {cheaper:?} is cheaper than {shape} and fits",
                    m.cpus()
                );
            }
            if shape.batch() < MAX_BATCH {
                let doubled = &candidates[r - 1];
                assert_eq!(doubled.batch, 2 * shape.batch());
                assert!(doubled.bound > units, "batch doubled still fits");
            }
        }
    }
}

#[test]
fn a_budget_equal_to_a_tree_bound_picks_that_shape_and_one_less_a_dearer_one() {
    for m in machines() {
        let candidates = tree_candidates(&m);
        // With the table's fan-outs every batch is the cheapest shape of
        // its bound.
        for c in candidates.iter().take(32) {
            let shape = budget(Design::Tree, &m, c.bound).unwrap();
            assert_eq!(
                (shape.batch(), shape.fanout_orders()),
                (c.batch, &c.orders[..])
            );
        }
        // Whatever was chosen at a budget, one unit less never picks it or
        // anything cheaper.
        for units in tree_budgets(&m, &candidates) {
            let Ok(shape) = budget(Design::Tree, &m, units) else {
                continue;
            };
            let Some(less) = shape.bound().checked_sub(1) else {
                continue;
            };
            match budget(Design::Tree, &m, less) {
                Ok(dearer) => assert!(
                    rank(&candidates, &dearer) > rank(&candidates, &shape),
                    "{} CPUs: budget {less} chose {dearer}, budget {} chose {shape}",
                    m.cpus(),
                    shape.bound()
                ),
                Err(ConfigError::MaxErrorUnreachable { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
    }
}

#[test]
fn batched_and_pernode_take_the_largest_batch_within_the_budget() {
    for m in machines() {
        for design in [Design::Batched, Design::PerNode] {
            let parts = match design {
                Design::PerNode => spill_bound(design, &m, 2),
                _ => m.cpus() as u64,
            };
            let mut budgets = vec![0, 1, parts - 1, parts, parts + 1, 1000, u64::MAX];
            for b in [2, 3, 32, 1000, 1 << 20, MAX_BATCH] {
                let bound = spill_bound(design, &m, b);
                budgets.extend([bound - 1, bound, bound + 1]);
            }
            for units in budgets {
                let shape = budget(design, &m, units).unwrap();
                let b = shape.batch();
                assert_eq!(shape.bound(), spill_bound(design, &m, b));
                assert!(shape.bound() <= units, "{shape} over {units}");
                if b < MAX_BATCH {
                    assert!(
                        spill_bound(design, &m, b + 1) > units,
                        "{design} on {} CPUs, budget {units}: batch {} also fits",
                        m.cpus(),
                        b + 1
                    );
                }
            }
            // A budget equal to a batch's bound picks it; one less, the batch below.
            for b in [2, 5, 64, 4097] {
                let bound = spill_bound(design, &m, b);
                assert_eq!(budget(design, &m, bound).unwrap().batch(), b);
                assert_eq!(budget(design, &m, bound - 1).unwrap().batch(), b - 1);
            }
        }
    }
}

#[test]
fn the_worst_case_schedule_reaches_the_chosen_bound_and_no_further() {
    for cpus in [1, 3, 8, 64, 384, 1000, 4096] {
        let m = Machine::simulated(cpus, cpus.div_ceil(64)).unwrap();
        for design in Design::ALL {
            for units in [0, 1, cpus as u64, 1000, 50_000, 1 << 24, u64::MAX] {
                let cfg = Config::new(design).machine(&m).max_error(units);
                let Ok(shape) = cfg.chosen() else {
                    assert_eq!(design, Design::Tree);
                    assert!(units < cpus as u64);
                    continue;
                };
                for side in [Side::Under, Side::Over] {
                    let c = cfg.build().unwrap();
                    assert_eq!(c.accuracy(), shape.accuracy(), "{shape}");
                    let mut oracle = 0i128;
                    for s in cfg.worst_case_schedule(side).unwrap() {
                        c.add_on(s.cpu, s.delta).unwrap();
                        oracle += s.delta as i128;
                    }
                    assert_eq!(c.precise() as i128, oracle);
                    let reached = match side {
                        Side::Under => oracle - c.approximate() as i128,
                        Side::Over => c.approximate() as i128 - oracle,
                    } as u64;
                    let bound = match side {
                        Side::Under => shape.accuracy().under,
                        Side::Over => shape.accuracy().over,
                    };
                    assert_eq!(reached, bound, "{shape}: the schedule reaches the bound");
                    assert!(
                        reached <= units,
                        "{shape}: {reached} over the budget {units}"
                    );
                }
            }
        }
    }
}

#[test]
fn budgets_below_one_unit_per_cpu_are_refused_with_the_numbers() {
    for m in machines() {
        let n = m.cpus() as u64;
        let err = budget(Design::Tree, &m, n - 1).unwrap_err();
        match &err {
            ConfigError::MaxErrorUnreachable {
                requested,
                smallest,
            } => {
                assert_eq!(*requested, n - 1);
                assert_eq!((smallest.bound(), smallest.batch()), (n, 2));
            }
            e => panic!("{e}"),
        }
        assert!(err
            .to_string()
            .contains("the smallest the configuration allows is"));
        assert_eq!(budget(Design::Tree, &m, n).unwrap().bound(), n);
    }
    let m = Machine::simulated(4096, 64).unwrap();
    assert_eq!(
        budget(Design::Tree, &m, 1000).unwrap_err().to_string(),
        "no tree shape on 4,096 CPUs has an error bound within 1,000 units: the smallest the \
         configuration allows is 4,096 (tree batch 2, fan-outs 2^12, bound 4,096 under)"
    );
    let one = Machine::simulated(1, 1).unwrap();
    assert_eq!(
        budget(Design::Tree, &one, 0).unwrap_err().to_string(),
        "no tree shape on 1 CPUs has an error bound within 0 units: the smallest the \
         configuration allows is 1 (tree batch 2, bound 1 under)"
    );
}

#[test]
fn a_configured_batch_or_arity_is_kept_and_checked() {
    let m = Machine::simulated(8, 2).unwrap();
    // Batched at batch 64 on 8 CPUs holds back 8·63 = 504 per side.
    let batched = Config::new(Design::Batched).machine(&m).batch(64);
    assert_eq!(batched.clone().max_error(504).chosen().unwrap().batch(), 64);
    assert_eq!(
        batched
            .clone()
            .max_error(503)
            .build()
            .unwrap_err()
            .to_string(),
        "no batched shape on 8 CPUs has an error bound within 503 units: the smallest the \
         configuration allows is 504 (batched batch 64, bound 504 each side)"
    );
    // A binary tree on 8 CPUs: only the batch is searched.
    let binary = Config::new(Design::Tree).machine(&m).arity(Arity::Binary);
    // 8·(b − 1) + 4·b + 2·2b = 16b − 8: 56 at batch 4, 120 at batch 8.
    let shape = binary.clone().max_error(100).chosen().unwrap();
    assert_eq!(
        shape.to_string(),
        "tree batch 4, fan-outs 2^1·2^1·2^1, bound 56 under"
    );
    assert!(matches!(
        binary.clone().max_error(23).chosen(),
        Err(ConfigError::MaxErrorUnreachable { smallest, .. }) if smallest.bound() == 24
    ));
    // A tree batch: only the fan-outs are searched. At batch 4, 2·2·2
    // holds back 56, 2·4 holds back 8·3 + 4·4 = 40, 8 holds back 24.
    let batch4 = Config::new(Design::Tree).machine(&m).batch(4);
    let orders = |units| {
        batch4
            .clone()
            .max_error(units)
            .chosen()
            .map(|s| s.fanout_orders().to_vec())
    };
    assert_eq!(orders(56), Ok(vec![1, 1, 1]));
    assert_eq!(orders(55), Ok(vec![1, 2]));
    assert_eq!(orders(40), Ok(vec![1, 2]));
    assert_eq!(orders(39), Ok(vec![3]));
    assert!(orders(23).is_err());
    // Invalid settings are the errors they always were, budget or not.
    assert_eq!(
        Config::new(Design::Tree)
            .machine(&m)
            .batch(24)
            .max_error(1 << 20)
            .build()
            .err(),
        Some(ConfigError::BatchNotPowerOfTwo(24))
    );
    assert!(matches!(
        Config::new(Design::Tree)
            .machine(&m)
            .arity(Arity::Orders(vec![1, 1]))
            .max_error(1 << 20)
            .build()
            .err(),
        Some(ConfigError::ArityMismatch { .. })
    ));
    assert_eq!(
        batched.batch(0).max_error(0).chosen().err(),
        Some(ConfigError::ZeroBatch)
    );
}

#[test]
fn extreme_budgets_do_not_panic() {
    let huge = Machine::simulated(1 << 20, 1 << 10).unwrap();
    for m in [
        Machine::simulated(1, 1).unwrap(),
        Machine::simulated(4096, 64).unwrap(),
        huge,
    ] {
        for design in Design::ALL {
            for units in [
                0,
                1,
                u32::MAX as u64,
                MAX_BATCH,
                i64::MAX as u64,
                u64::MAX - 1,
                u64::MAX,
            ] {
                match budget(design, &m, units) {
                    Ok(shape) => assert!(shape.bound() <= units),
                    Err(ConfigError::MaxErrorUnreachable { smallest, .. }) => {
                        assert!(smallest.bound() > units)
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let most = budget(design, &m, u64::MAX).unwrap();
            if design != Design::Atomic {
                assert_eq!(most.batch(), MAX_BATCH, "{most}");
            }
        }
        assert_eq!(budget(Design::Batched, &m, 0).unwrap().batch(), 1);
    }
}

#[test]
fn build_and_with_config_follow_the_choice() {
    let m = Machine::simulated(256, 4).unwrap();
    let cfg = Config::new(Design::Tree).machine(&m).max_error(1000);
    let shape = cfg.chosen().unwrap();
    // The table's 4·8·8 holds back 1,088 at batch 2; 4·64 holds back 640.
    assert_eq!(
        shape.to_string(),
        "tree batch 2, fan-outs 2^2·2^6, bound 640 under"
    );
    assert_eq!(cfg.effective_batch(), 2);
    assert_eq!(cfg.accuracy().unwrap(), shape.accuracy());
    let t = Tree::with_config(&cfg).unwrap();
    assert_eq!(t.shape().fanouts(), [4, 64]);
    assert_eq!(t.accuracy().under, 640);

    let cfg = Config::new(Design::Batched).machine(&m).max_error(1000);
    assert_eq!(cfg.effective_batch(), 4, "256·3 = 768 ≤ 1000 < 256·4");
    let b = Batched::with_config(&cfg).unwrap();
    assert_eq!(b.accuracy().under, 768);
    assert_eq!(cfg.build().unwrap().accuracy(), b.accuracy());

    let cfg = Config::new(Design::PerNode).machine(&m).max_error(1000);
    assert_eq!(
        cfg.chosen().unwrap().to_string(),
        "pernode batch 251, 4 node slots, bound 1,000 each side"
    );
    let cfg = Config::new(Design::Atomic).machine(&m).max_error(0);
    assert_eq!(cfg.chosen().unwrap().to_string(), "atomic, bound 0");
    assert_eq!(cfg.build().unwrap().accuracy().bounds(), (0, 0));
}

#[test]
fn without_a_budget_chosen_describes_the_configured_shape() {
    let m = Machine::simulated(512, 4).unwrap();
    let shape = Config::new(Design::Tree).machine(&m).chosen().unwrap();
    assert_eq!(
        shape.to_string(),
        "tree batch 32, fan-outs 2^3·2^3·2^3, bound 44,544 under"
    );
    let built = Config::new(Design::Tree).machine(&m).build().unwrap();
    assert_eq!(built.accuracy(), shape.accuracy());
    assert_eq!(
        Config::new(Design::Batched)
            .machine(&m)
            .chosen()
            .unwrap()
            .to_string(),
        "batched batch 1,024, bound 523,776 each side"
    );
}

#[test]
fn the_table_fanouts_win_over_a_larger_batch_with_fewer_levels() {
    // 512 at batch 64 holds back 32,256 too, but the table's 8·8·8 ranks
    // first at any batch (IMPLEMENTATION.md, "Error budgets").
    let m = Machine::simulated(512, 4).unwrap();
    let shape = budget(Design::Tree, &m, 32_256).unwrap();
    assert_eq!(
        shape.to_string(),
        "tree batch 16, fan-outs 2^3·2^3·2^3, bound 22,016 under"
    );
}
