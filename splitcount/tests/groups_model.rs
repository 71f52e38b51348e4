//! Property test: random sequences of create, charge (limited and forced),
//! uncharge, set_max and remove on a simulated machine, against an exact
//! model. Usage of every live group equals the model after draining the
//! stocks; a charge is refused exactly when the model says it cannot fit.

use proptest::prelude::*;
use splitcount::cpu::Machine;
use splitcount::group::{Group, GroupError, Hierarchy, HierarchyConfig};

#[derive(Debug, Clone)]
enum Op {
    Create { parent: usize, name: u8 },
    Charge { group: usize, n: u64 },
    Force { group: usize, n: u64 },
    Uncharge { group: usize, n: u64 },
    SetMax { group: usize, max: u64 },
    Remove { group: usize },
    MoveCpu(usize),
    Check,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0usize..8, 0u8..3).prop_map(|(parent, name)| Op::Create { parent, name }),
        8 => (0usize..8, 1u64..40).prop_map(|(group, n)| Op::Charge { group, n }),
        1 => (0usize..8, 1u64..40).prop_map(|(group, n)| Op::Force { group, n }),
        5 => (0usize..8, 1u64..60).prop_map(|(group, n)| Op::Uncharge { group, n }),
        2 => (0usize..8, 0u64..200).prop_map(|(group, max)| Op::SetMax { group, max }),
        1 => (1usize..8).prop_map(|group| Op::Remove { group }),
        3 => (0usize..4).prop_map(Op::MoveCpu),
        1 => Just(Op::Check),
    ]
}

struct ModelGroup {
    parent: Option<usize>,
    own: i64,
    max: u64,
    removed: bool,
}

struct Model {
    groups: Vec<ModelGroup>,
}

impl Model {
    fn chain(&self, mut g: usize) -> Vec<usize> {
        let mut c = vec![g];
        while let Some(p) = self.groups[g].parent {
            c.push(p);
            g = p;
        }
        c
    }
    fn live(&self, mut g: usize) -> usize {
        while self.groups[g].removed {
            g = self.groups[g].parent.unwrap();
        }
        g
    }
    fn usage(&self, g: usize) -> i64 {
        (0..self.groups.len())
            .filter(|&x| self.chain(x).contains(&g))
            .map(|x| self.groups[x].own)
            .sum()
    }
    fn live_children(&self, g: usize) -> usize {
        self.groups
            .iter()
            .filter(|x| x.parent == Some(g) && !x.removed)
            .count()
    }
}

fn check(h: &Hierarchy, handles: &[Group], model: &Model) -> Result<(), TestCaseError> {
    h.drain_stocks();
    for (i, g) in handles.iter().enumerate() {
        if !model.groups[i].removed {
            prop_assert_eq!(g.usage() as i64, model.usage(i), "usage of {}", g.path());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 150, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn groups_agree_with_an_exact_model(ops in prop::collection::vec(op(), 1..120), batch in 1u64..20) {
        let m = Machine::simulated(4, 1).unwrap();
        let h = Hierarchy::new(HierarchyConfig::default().machine(&m).stock_batch(batch).stock_slots(3)).unwrap();
        let mut handles = vec![h.root()];
        let mut model = Model { groups: vec![ModelGroup { parent: None, own: 0, max: u64::MAX, removed: false }] };
        for op in ops {
            match op {
                Op::Create { parent, name } => {
                    let p = parent % handles.len();
                    let name = format!("g{name}");
                    let r = handles[p].child(&name);
                    let taken = (0..handles.len()).any(|x| model.groups[x].parent == Some(p) && !model.groups[x].removed && handles[x].name() == name);
                    if model.groups[p].removed {
                        prop_assert!(matches!(r, Err(GroupError::Removed { .. })), "removed parent");
                    } else if taken {
                        prop_assert!(matches!(r, Err(GroupError::NameTaken { .. })), "name taken");
                    } else {
                        handles.push(r.unwrap());
                        model.groups.push(ModelGroup { parent: Some(p), own: 0, max: u64::MAX, removed: false });
                    }
                }
                Op::Charge { group, n } => {
                    let g = group % handles.len();
                    let t = model.live(g);
                    let fits = model.chain(t).iter().all(|&a| model.usage(a) as i128 + n as i128 <= model.groups[a].max as i128);
                    let r = handles[g].charge(n);
                    prop_assert_eq!(r.is_ok(), fits, "charge {} to {}: {:?}", n, handles[g].path(), r);
                    if fits {
                        model.groups[t].own += n as i64;
                    }
                }
                Op::Force { group, n } => {
                    let g = group % handles.len();
                    let t = model.live(g);
                    // Stocked units charged before a forced charge pushed a
                    // level over its limit would still be usable; start
                    // from empty stocks so the model stays exact.
                    h.drain_stocks();
                    handles[g].force_charge(n).unwrap();
                    model.groups[t].own += n as i64;
                    // A forced charge may exceed a limit: keep the model's
                    // limits meaningful by raising them like the kernel's
                    // usage would sit above them.
                    for a in model.chain(t) {
                        let u = model.usage(a) as u64;
                        if u > model.groups[a].max {
                            model.groups[a].max = u;
                            handles[a].usage_counter().set_max(u64::MAX).unwrap();
                            h.drain_stocks();
                            handles[a].set_max(u).unwrap();
                        }
                    }
                }
                Op::Uncharge { group, n } => {
                    let g = group % handles.len();
                    let t = model.live(g);
                    // Only what was charged through this group (or through
                    // removed groups whose charges now land here) may come
                    // back: more would be a caller bug, tested elsewhere.
                    let avail: i64 = (0..model.groups.len()).filter(|&x| model.live(x) == t).map(|x| model.groups[x].own).sum();
                    let n = n.min(avail.max(0) as u64);
                    handles[g].uncharge(n);
                    model.groups[t].own -= n as i64;
                }
                Op::SetMax { group, max } => {
                    let g = group % handles.len();
                    if model.groups[g].removed {
                        continue;
                    }
                    let r = handles[g].set_max(max);
                    let busy = model.usage(g) as i128 > max as i128;
                    prop_assert_eq!(r.is_err(), busy, "set_max({}) on {}: {:?}", max, handles[g].path(), r);
                    if !busy {
                        model.groups[g].max = max;
                    }
                }
                Op::Remove { group } => {
                    let g = group % handles.len();
                    let r = handles[g].remove();
                    if g == 0 {
                        prop_assert_eq!(r, Err(GroupError::RootCannotBeRemoved));
                    } else if model.groups[g].removed {
                        prop_assert!(matches!(r, Err(GroupError::Removed { .. })), "already removed");
                    } else if model.live_children(g) > 0 {
                        prop_assert!(matches!(r, Err(GroupError::HasChildren { .. })), "has children");
                    } else {
                        prop_assert!(r.is_ok());
                        model.groups[g].removed = true;
                    }
                }
                Op::MoveCpu(c) => m.set_current_cpu(c).unwrap(),
                Op::Check => check(&h, &handles, &model)?,
            }
        }
        check(&h, &handles, &model)?;
    }
}
