//! `bench stats`: what a statistics read costs in a large tree when little
//! changed, against the naive reader that sums every group's per-CPU
//! values, and what an update costs against a plain per-CPU add.
//!
//! The tree has 10,000 groups four levels deep (fan-out 10; `--groups`
//! changes the count, and the depth follows), 4 stat items each; between two reads, 10 random groups are updated. All five cases
//! run in the same interleaved rounds, one thread:
//!
//! - `flush-updated`: a forced flush of the root after those 10 updates
//!   (only the flush is timed; the updates are its untimed preparation;
//!   every slice starts with one untimed update of every group and a
//!   flush, as the baseline's starts with its data written afresh: see
//!   `warm`);
//! - `full-walk` (the baseline of the reads): the naive reader at its
//!   fastest — every CPU's values of every group and item laid out
//!   contiguously per CPU (as a per-CPU arena lays them out), summed into
//!   one total per group and item with plain iterators (no bounds check per
//!   value, vectorized), and without even folding children into parents;
//! - `flush-idle`: a forced flush of the root with nothing updated since the
//!   last one (every CPU's list is empty: no locked instruction);
//! - `mod-stat` vs `percpu-add` (its baseline): one stat update against one
//!   add to a per-CPU slot through the library.

use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use splitcount::cpu::Machine;
use splitcount::group::{Group, Hierarchy, HierarchyConfig};
use splitcount::raw::percpu::Arena;
use splitcount::stat::{StatId, StatItem};
use std::hint::black_box;

/// The baseline of the read cases.
pub const BASELINE: &str = "full-walk";

/// The baseline of the update case.
pub const UPDATE_BASELINE: &str = "percpu-add";

/// The cases, in table order.
pub const CASES: [&str; 5] = [
    "flush-updated",
    BASELINE,
    "flush-idle",
    UPDATE_BASELINE,
    "mod-stat",
];

/// Stat items per group.
const ITEMS: usize = 4;

/// Groups updated between two reads.
const UPDATED: usize = 10;

/// The baseline of `case`.
pub fn baseline_of(case: &str) -> Option<String> {
    Some(if case == "mod-stat" || case == UPDATE_BASELINE {
        UPDATE_BASELINE.to_owned()
    } else {
        BASELINE.to_owned()
    })
}

/// A hierarchy with [`ITEMS`] gauges and its item ids.
fn hierarchy() -> Result<(Hierarchy, Vec<StatId>), String> {
    let items = (0..ITEMS)
        .map(|i| StatItem::gauge(&format!("item{i}")))
        .collect();
    let h = Hierarchy::new(HierarchyConfig::default().stats(items)).map_err(|e| e.to_string())?;
    let ids = (0..ITEMS)
        .map(|i| h.stat_id(&format!("item{i}")).ok_or("item in schema"))
        .collect::<Result<_, _>>()?;
    Ok((h, ids))
}

/// Build the tree: `groups` groups, fan-out 10, level by level, as deep as
/// `groups` needs (root excluded: 4 levels for 10,000, 6 for 1,000,000).
fn tree(h: &Hierarchy, groups: usize) -> Result<Vec<Group>, String> {
    let mut all = Vec::with_capacity(groups);
    let mut level = vec![h.root()];
    'build: loop {
        let mut next = Vec::new();
        for parent in &level {
            for i in 0..10 {
                if all.len() == groups {
                    break 'build;
                }
                let g = parent.child(&format!("g{i}")).map_err(|e| e.to_string())?;
                next.push(g.clone());
                all.push(g);
            }
        }
        level = next;
    }
    Ok(all)
}

/// Touch every group of the tree the way the timed cases do — one update
/// of `item` each, then a forced flush of `root` (so nothing is left to
/// fold) — before a slice of `flush-updated`.
///
/// The baseline's data is made afresh for each of its slices (every page
/// written just before its loop), while the tree was last touched a slice
/// or more before. On the virtual machines the lab runs on, memory left
/// untouched for tens of milliseconds costs microseconds a page on its next
/// touch (the host's doing, not the cache's: 0.3 µs a random page right
/// after a pass, 2 µs after 50 ms spent elsewhere, 25–50 µs after one to
/// three seconds, here), so without this the first tens of milliseconds of
/// a slice measured the host: `flush-updated` read ×0.012 of the walk in
/// rounds that followed itself and up to ×2 in rounds that followed
/// another case. Warming both sides alike leaves the algorithms.
fn warm(all: &[Group], root: &Group, item: StatId) {
    for g in all {
        let _ = g.mod_stat(item, 1);
    }
    root.flush(true);
}

/// The naive reader's data: per CPU, every group's items side by side.
struct Walk {
    per_cpu: Vec<Vec<i64>>,
    totals: Vec<i64>,
}

impl Walk {
    fn new(cpus: usize, groups: usize) -> Walk {
        let values = groups * ITEMS;
        Walk {
            per_cpu: (0..cpus)
                .map(|c| (0..values).map(|v| (v + c) as i64).collect())
                .collect(),
            totals: vec![0; values],
        }
    }

    /// Every group's total of every item, over every CPU.
    #[inline]
    fn read(&mut self) {
        self.totals.fill(0);
        for cpu in &self.per_cpu {
            for (total, v) in self.totals.iter_mut().zip(cpu) {
                *total += v;
            }
        }
        black_box(&self.totals);
    }
}

/// Run the suite with a tree of `groups` groups (10,000 in the lab).
pub fn run(groups: usize, plan: &Plan) -> Result<Bench, String> {
    let (h, ids) = hierarchy()?;
    let all = tree(&h, groups.max(1))?;
    let root = h.root();
    let cpus = Machine::host().cpus();
    // Updates get a hierarchy of their own, so they leave nothing for the
    // flush cases to fold.
    let (updates, update_ids) = hierarchy()?;
    let updated = updates.root().child("g").map_err(|e| e.to_string())?;
    let one = Arena::new(&Machine::host())
        .alloc(1)
        .map_err(|e| e.to_string())?;

    let (all, root, ids) = (&all, &root, &ids);
    let (updated, update_ids, one) = (&updated, &update_ids, &one);
    let entries = vec![
        Entry::prepared("flush-updated", 1, move |_| {
            warm(all, root, ids[1]);
            let mut seed = 0x9E37_79B9_7F4A_7C15u64;
            let prepare = move || {
                for _ in 0..UPDATED {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let g = &all[(seed % all.len() as u64) as usize];
                    let _ = g.mod_stat(ids[0], 1);
                }
            };
            let flush = move || {
                root.flush(true);
            };
            (prepare, flush)
        }),
        Entry::new(BASELINE, 1, move |_| {
            let mut walk = Walk::new(cpus, all.len());
            move || walk.read()
        }),
        Entry::new("flush-idle", 1, move |_| {
            root.flush(true);
            move || {
                root.flush(true);
            }
        }),
        Entry::new(UPDATE_BASELINE, 1, move |_| {
            move || {
                let _ = one.add(0, black_box(1));
            }
        }),
        Entry::new("mod-stat", 1, move |_| {
            move || {
                let _ = updated.mod_stat(update_ids[1], black_box(1));
            }
        }),
    ];
    let measured = measure("stats", plan, entries)?;
    root.flush(true);
    Ok(Bench::new(measured, baseline_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_sums_every_cpu_of_every_group_and_item() {
        let mut w = Walk::new(3, 2);
        w.read();
        // Value v on CPU c is v + c: the total of v over 3 CPUs is 3v + 3.
        let expected: Vec<i64> = (0..2 * ITEMS as i64).map(|v| 3 * v + 3).collect();
        assert_eq!(w.totals, expected);
    }

    #[test]
    fn the_tree_has_the_asked_size_four_levels_deep() {
        let (h, _) = hierarchy().unwrap();
        let all = tree(&h, 1111).unwrap();
        assert_eq!(all.len(), 1111);
        assert_eq!(all.last().unwrap().path().matches('/').count(), 4);
    }

    #[test]
    fn a_tree_past_four_levels_gets_deeper_not_smaller() {
        let (h, _) = hierarchy().unwrap();
        let all = tree(&h, 11_111).unwrap();
        assert_eq!(all.len(), 11_111);
        assert_eq!(all.last().unwrap().path().matches('/').count(), 5);
    }
}
