//! Property tests: random sequences of adds, sets and comparisons on every
//! design, against a plain `i64` model.

use proptest::prelude::*;
use splitcount::counter::{ApproxOrdering, Config, Design};
use splitcount::cpu::Machine;

#[derive(Debug, Clone)]
enum Op {
    Add { cpu: usize, delta: i64 },
    Set(i64),
    Compare(i64),
}

fn op(cpus: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..cpus, -5000i64..5000).prop_map(|(cpu, delta)| Op::Add { cpu, delta }),
        1 => (-1_000_000i64..1_000_000).prop_map(Op::Set),
        3 => (-100_000i64..100_000).prop_map(Op::Compare),
    ]
}

fn case() -> impl Strategy<Value = (usize, usize, u32, Vec<Op>)> {
    (1usize..=64, 0usize..4, 1u32..=8).prop_flat_map(|(cpus, design, batch_order)| {
        (
            Just(cpus),
            Just(design),
            Just(batch_order),
            prop::collection::vec(op(cpus), 1..300),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_design_agrees_with_an_exact_model((cpus, design, batch_order, ops) in case()) {
        let design = Design::ALL[design];
        let m = Machine::simulated(cpus, cpus.min(3)).unwrap();
        let c = Config::new(design).machine(&m).batch(1 << batch_order).build().unwrap();
        let mut model = 0i64;
        for op in ops {
            match op {
                Op::Add { cpu, delta } => {
                    c.add_on(cpu, delta).unwrap();
                    model += delta;
                }
                Op::Set(v) => {
                    c.set(v);
                    model = v;
                }
                Op::Compare(v) => {
                    prop_assert_eq!(c.compare(v), model.cmp(&v));
                    match c.approximate_compare(v) {
                        ApproxOrdering::Less => prop_assert!(model < v),
                        ApproxOrdering::Greater => prop_assert!(model > v),
                        ApproxOrdering::Equal => prop_assert_eq!(model, v),
                        ApproxOrdering::Unknown => {}
                    }
                }
            }
            prop_assert!(c.accuracy().admits(c.approximate(), model));
        }
        prop_assert_eq!(c.precise(), model);
    }
}
