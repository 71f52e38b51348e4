//! `splitcount-lab footprint`: the bytes one counter of each design takes,
//! against the number of CPUs, on simulated machines.
//!
//! The figures come from [`splitcount::counter::SplitCounter::footprint`], computed from each
//! counter's layout (and checked against the arena's own counts by the
//! library's tests): the per-CPU slots, the shared items in the arena, and
//! the handle with its heap. One more row, `tree-padded`, is the tree as it
//! was laid out before its items moved into stripes — each intermediate
//! item, root accumulator and the bias on a 128-byte line of its own —
//! computed from the same counter: the per-CPU slots and handle plus 128
//! bytes per shared item.

use crate::report::table::{thousands, Table};
use serde::Serialize;
use splitcount::counter::{Config, Design, Footprint};
use splitcount::cpu::Machine;

/// The CPU counts `footprint` prints by default.
pub const DEFAULT_CPUS: &str = "2,64,256,1024,4096";

/// The target: bytes per CPU per tree counter, everything included.
pub const TREE_TARGET: f64 = 12.0;

/// The report's figures for the target: a tree's bytes per CPU at 64, 128,
/// 256 and 4096 CPUs (the names of `Measured::scalars`).
pub const TREE_64: &str = "tree_bytes_per_cpu_at_64";
/// See [`TREE_64`].
pub const TREE_128: &str = "tree_bytes_per_cpu_at_128";
/// See [`TREE_64`].
pub const TREE_256: &str = "tree_bytes_per_cpu_at_256";
/// See [`TREE_64`].
pub const TREE_4096: &str = "tree_bytes_per_cpu_at_4096";

/// The target's figures and the CPU count each is measured at.
pub const TREE_FIGURES: [(&str, usize); 4] = [
    (TREE_64, 64),
    (TREE_128, 128),
    (TREE_256, 256),
    (TREE_4096, 4096),
];

/// The target's figures from `rows`, as `(name, bytes per CPU)`.
pub fn tree_figures(rows: &[Row]) -> Vec<(&'static str, f64)> {
    TREE_FIGURES
        .into_iter()
        .filter_map(|(name, cpus)| {
            rows.iter()
                .find(|r| r.design == "tree" && r.cpus == cpus)
                .map(|r| (name, r.bytes_per_cpu))
        })
        .collect()
}

/// The cache line a padded item took.
const PADDED_LINE: usize = 128;

/// One design on one machine.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `atomic`, `batched`, `pernode`, `tree` or `tree-padded`.
    pub design: String,
    /// Simulated CPUs.
    pub cpus: usize,
    /// Everything one counter takes.
    pub bytes_per_counter: usize,
    /// `bytes_per_counter / cpus`.
    pub bytes_per_cpu: f64,
    /// Its per-CPU slots (the arena's overflow copy included).
    pub per_cpu: usize,
    /// Its shared items in the arena.
    pub shared: usize,
    /// Its handle and heap.
    pub heap: usize,
}

impl Row {
    fn new(design: &str, cpus: usize, f: Footprint) -> Row {
        Row {
            design: design.to_owned(),
            cpus,
            bytes_per_counter: f.total(),
            bytes_per_cpu: f.per_cpu_bytes(cpus),
            per_cpu: f.per_cpu,
            shared: f.shared,
            heap: f.heap,
        }
    }
}

/// The designs in print order.
const DESIGNS: [(&str, Design); 4] = [
    ("atomic", Design::Atomic),
    ("batched", Design::Batched),
    ("pernode", Design::PerNode),
    ("tree", Design::Tree),
];

/// Every design (and `tree-padded`) on a simulated machine of each of
/// `cpus` CPUs (one NUMA node per 64 CPUs), default batches and fan-outs.
pub fn run(cpus: &[usize]) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for &n in cpus {
        let machine = Machine::simulated(n, n.div_ceil(64))
            .map_err(|e| format!("a simulated machine of {n} CPUs: {e}"))?;
        for (name, design) in DESIGNS {
            let counter = Config::new(design)
                .machine(&machine)
                .build()
                .map_err(|e| format!("a {name} counter on {n} CPUs: {e}"))?;
            let f = counter.footprint();
            rows.push(Row::new(name, n, f));
            if design == Design::Tree {
                let mut padded = f;
                padded.shared = f.shared / std::mem::size_of::<i64>() * PADDED_LINE;
                rows.push(Row::new("tree-padded", n, padded));
            }
        }
    }
    Ok(rows)
}

/// The table: bytes per counter and per CPU, design by CPU count.
pub fn table(rows: &[Row]) -> Table {
    let mut cpus: Vec<usize> = rows.iter().map(|r| r.cpus).collect();
    cpus.dedup();
    let mut t = Table::new("footprint: bytes per counter (bytes per CPU) on simulated machines")
        .text("design");
    for n in &cpus {
        t = t.number(&format!("{n} CPUs"));
    }
    let mut designs: Vec<&str> = rows.iter().map(|r| r.design.as_str()).collect();
    designs.dedup();
    designs.sort_by_key(|d| rows.iter().position(|r| r.design == *d));
    designs.dedup();
    for d in designs {
        let mut cells = vec![d.to_owned()];
        for &n in &cpus {
            cells.push(match rows.iter().find(|r| r.design == d && r.cpus == n) {
                Some(r) => format!(
                    "{} ({:.2})",
                    thousands(r.bytes_per_counter as u64),
                    r.bytes_per_cpu
                ),
                None => "—".to_owned(),
            });
        }
        t.row(cells);
    }
    t.note(
        "everything one counter takes: its per-CPU slots (and the arena's overflow copy), \
         its shared items in the arena, its handle and heap; tree-padded: the tree with each \
         shared item on a 128-byte line of its own, as the tree was laid out before",
    );
    t.note(format!(
        "target: a tree counter takes ≤ {TREE_TARGET} bytes per CPU at 64…4096 CPUs"
    ));
    t
}

/// `footprint`'s terminal output.
pub fn print_table(rows: &[Row]) {
    outln!("{}", table(rows).to_text().trim_end());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_design_and_the_padded_tree_on_every_machine() {
        let rows = run(&[2, 64]).unwrap();
        assert_eq!(rows.len(), 2 * 5);
        let tree = rows
            .iter()
            .find(|r| r.design == "tree" && r.cpus == 64)
            .unwrap();
        let padded = rows
            .iter()
            .find(|r| r.design == "tree-padded" && r.cpus == 64)
            .unwrap();
        assert_eq!(padded.shared, tree.shared * 16);
        assert_eq!(
            tree.bytes_per_counter,
            tree.per_cpu + tree.shared + tree.heap
        );
        let text = table(&rows).to_text();
        assert!(text.contains("tree-padded"), "{text}");
    }
}
