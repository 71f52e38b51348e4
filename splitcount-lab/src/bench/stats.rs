//! `bench stats`: what a statistics read costs in a large tree when little
//! changed, against the naive reader that sums every group's per-CPU slots,
//! and what an update costs against a plain per-CPU add.
//!
//! The tree has 10,000 groups four levels deep (fan-out 10); between two
//! reads, 10 random groups are updated.
//!
//! - `flush-updated`: a forced flush of the root after those 10 updates
//!   (only the flush is timed);
//! - `full-walk`: the naive reader — sum every group's per-CPU slots (a
//!   `percpu` allocation per group, like the stat slots);
//! - `flush-idle`: a forced flush of the root with nothing updated since the
//!   last one (every CPU's list is empty: no locked instruction);
//! - `mod-stat` vs `percpu-add`: one stat update against one add to a
//!   per-CPU slot.

use super::Record;
use splitcount::cpu::Machine;
use splitcount::group::{Group, Hierarchy, HierarchyConfig};
use splitcount::percpu::Arena;
use splitcount::stat::StatItem;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// The baseline of the read cases.
pub const BASELINE: &str = "full-walk";

const ITEMS: usize = 4;

fn record(case: &str, ns: f64, baseline: Option<(&str, f64)>) -> Record {
    Record {
        suite: "stats".into(),
        case: case.into(),
        threads: 1,
        ns_per_op: ns,
        ops_per_sec: 1e9 / ns.max(1e-9),
        ratio: baseline.map(|(_, b)| ns / b),
        baseline: baseline.map(|(name, _)| name.to_owned()),
    }
}

/// Time `op` repeatedly for about `duration`; `prepare` runs untimed before
/// each call. Returns ns per call.
fn time(duration: Duration, mut prepare: impl FnMut(), mut op: impl FnMut()) -> f64 {
    let (mut spent, mut n) = (Duration::ZERO, 0u64);
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline || n == 0 {
        prepare();
        let t = Instant::now();
        op();
        spent += t.elapsed();
        n += 1;
    }
    spent.as_nanos() as f64 / n as f64
}

/// Build the tree: `groups` groups, fan-out 10, depth 4 (root excluded).
fn tree(h: &Hierarchy, groups: usize) -> Vec<Group> {
    let mut all = Vec::with_capacity(groups);
    let mut level = vec![h.root()];
    'build: for _depth in 0..4 {
        let mut next = Vec::new();
        for parent in &level {
            for i in 0..10 {
                if all.len() == groups {
                    break 'build;
                }
                let g = parent.child(&format!("g{i}")).expect("fresh names");
                next.push(g.clone());
                all.push(g);
            }
        }
        level = next;
    }
    all
}

/// Run the suite with a tree of `groups` groups (10,000 in the lab).
pub fn run(groups: usize, duration: Duration) -> Vec<Record> {
    let items = (0..ITEMS)
        .map(|i| StatItem::gauge(&format!("item{i}")))
        .collect();
    let h = Hierarchy::new(HierarchyConfig::default().stats(items)).expect("valid schema");
    let all = tree(&h, groups);
    let ids: Vec<_> = (0..ITEMS)
        .map(|i| h.stat_id(&format!("item{i}")).expect("in schema"))
        .collect();
    let root = h.root();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };

    let flush_updated = time(
        duration,
        || {
            for _ in 0..10 {
                let g = &all[(rand() % all.len() as u64) as usize];
                g.mod_stat(ids[0], 1).expect("in schema");
            }
        },
        || {
            root.flush(true);
        },
    );
    root.flush(true);
    let flush_idle = time(
        duration,
        || {},
        || {
            root.flush(true);
        },
    );

    // The naive reader's data: one per-CPU allocation per group.
    let arena = Arena::new(&Machine::host());
    let slots: Vec<_> = (0..all.len())
        .map(|_| arena.alloc(ITEMS).expect("arena memory"))
        .collect();
    for (i, s) in slots.iter().enumerate() {
        s.add(0, i as i64).expect("slot 0");
    }
    let full_walk = time(
        duration,
        || {},
        || {
            let mut sum = 0i64;
            for s in &slots {
                for item in 0..ITEMS {
                    sum = sum.wrapping_add(s.sum(item).expect("in range"));
                }
            }
            black_box(sum);
        },
    );

    let g = &all[all.len() / 2];
    let per_call = |f: &mut dyn FnMut()| {
        time(
            duration,
            || {},
            || {
                for _ in 0..1000 {
                    f();
                }
            },
        ) / 1000.0
    };
    let mod_stat = per_call(&mut || g.mod_stat(ids[1], black_box(1)).expect("in schema"));
    let one = arena.alloc(1).expect("arena memory");
    let percpu_add = per_call(&mut || {
        one.add(0, black_box(1)).expect("slot 0");
    });
    root.flush(true);

    vec![
        record("flush-updated", flush_updated, Some((BASELINE, full_walk))),
        record(BASELINE, full_walk, Some((BASELINE, full_walk))),
        record("flush-idle", flush_idle, Some((BASELINE, full_walk))),
        record("percpu-add", percpu_add, Some(("percpu-add", percpu_add))),
        record("mod-stat", mod_stat, Some(("percpu-add", percpu_add))),
    ]
}
