//! [`PerNode`]: the per-NUMA-node atomics proposal.
//!
//! One atomic per node (at most [`MAX_NODE_SLOTS`]; more nodes fold modulo)
//! plus a global. An add is an atomic on its node's line — shared by that
//! node's CPUs, never by other nodes'; when the node's new value reaches
//! `|v| ≥ batch` the node's whole value is swapped out into the global.
//! No per-CPU memory at all.
//!
//! **Bound.** As for [`super::Batched`], per node slot: settled,
//! `|node| ≤ batch − 1`, so `|precise − approximate| ≤ m·(batch − 1)` on each
//! side, with `m = min(nodes with CPUs, MAX_NODE_SLOTS)` node slots — every
//! slot has a CPU, so the bound is reached.

use super::total::Total;
use super::{
    Accuracy, Config, ConfigError, CounterError, Design, Footprint, Side, SplitCounter, Step,
};
use crate::cpu::{Machine, Topology};
use crate::percpu::SpillTarget;
use crate::sync::{
    AtomicI64,
    Ordering::{AcqRel, Acquire, Relaxed},
};
use crossbeam_utils::CachePadded;

/// Most node slots a [`PerNode`] counter keeps.
pub const MAX_NODE_SLOTS: usize = 32;

/// One atomic per NUMA node and a global. See the module docs.
pub struct PerNode {
    nodes: Box<[CachePadded<AtomicI64>]>,
    global: CachePadded<Total>,
    /// Node slot of each CPU (`node_of(cpu) % nodes.len()`).
    slot_of: Box<[u8]>,
    batch: i64,
    machine: Machine,
}

impl PerNode {
    /// A zero counter on the host with the default batch.
    pub fn new() -> PerNode {
        PerNode::with_config(&Config::new(Design::PerNode)).expect("the host defaults are valid")
    }

    /// A zero counter as `config` says (an error budget is resolved first:
    /// see [`Config::max_error`]).
    pub fn with_config(config: &Config) -> Result<PerNode, ConfigError> {
        let config = &*config.resolved()?;
        let batch = config.validated_batch()? as i64;
        let topo = config.machine.topology();
        // Only nodes with CPUs get a slot (numbered densely, then folded
        // modulo MAX_NODE_SLOTS): a slot no CPU writes would widen the bound
        // by `batch − 1` for nothing.
        let mut dense_node = vec![usize::MAX; topo.nodes().max(1)];
        let mut with_cpus = 0;
        for c in 0..topo.cpus() {
            let n = topo.node_of(c);
            if dense_node[n] == usize::MAX {
                dense_node[n] = with_cpus;
                with_cpus += 1;
            }
        }
        let slots = with_cpus.clamp(1, MAX_NODE_SLOTS);
        debug_assert_eq!(slots, node_slots_for(topo));
        Ok(PerNode {
            nodes: (0..slots)
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect(),
            global: CachePadded::new(Total::default()),
            slot_of: (0..topo.cpus())
                .map(|c| (dense_node[topo.node_of(c)] % slots) as u8)
                .collect(),
            batch,
            machine: config.machine.clone(),
        })
    }

    /// The batch.
    pub fn batch(&self) -> u64 {
        self.batch as u64
    }

    /// Number of node slots.
    pub fn node_slots(&self) -> usize {
        self.nodes.len()
    }

    #[inline]
    fn add_unchecked(&self, cpu: usize, delta: i64) {
        let node = &self.nodes[self.slot_of[cpu] as usize];
        let new = node.fetch_add(delta, Relaxed).wrapping_add(delta);
        if new.unsigned_abs() >= self.batch as u64 {
            // Announced first, so `precise()` waits for it to land. The swap
            // takes whatever is there, racing adds included, so each unit
            // moves exactly once; Release pairs with `precise()`'s Acquire
            // loads (see `total.rs`).
            self.global.begin();
            let moved = node.swap(0, AcqRel);
            self.global.end(moved);
        }
    }
}

/// The node slots a [`PerNode`] on `topology` keeps: one per node with CPUs,
/// folded to at most [`MAX_NODE_SLOTS`].
pub(crate) fn node_slots_for(topology: &Topology) -> usize {
    let mut has_cpus = vec![false; topology.nodes().max(1)];
    for c in 0..topology.cpus() {
        has_cpus[topology.node_of(c)] = true;
    }
    has_cpus
        .iter()
        .filter(|&&h| h)
        .count()
        .clamp(1, MAX_NODE_SLOTS)
}

impl Default for PerNode {
    fn default() -> Self {
        PerNode::new()
    }
}

impl std::fmt::Debug for PerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerNode")
            .field("node_slots", &self.nodes.len())
            .field("batch", &self.batch)
            .field("approximate", &self.approximate())
            .finish()
    }
}

impl SplitCounter for PerNode {
    /// A padded line per node, the global total and a byte per CPU (which
    /// node slot it adds to); no per-CPU memory.
    fn footprint(&self) -> Footprint {
        Footprint {
            heap: std::mem::size_of::<PerNode>()
                + std::mem::size_of_val(&*self.nodes)
                + self.slot_of.len(),
            ..Footprint::default()
        }
    }

    fn design(&self) -> Design {
        Design::PerNode
    }

    #[inline]
    fn add(&self, delta: i64) {
        self.add_unchecked(self.machine.current_cpu(), delta);
    }

    fn add_on(&self, cpu: usize, delta: i64) -> Result<(), CounterError> {
        let cpus = self.slot_of.len();
        if cpu >= cpus {
            return Err(CounterError::NoSuchCpu { cpu, cpus });
        }
        self.add_unchecked(cpu, delta);
        Ok(())
    }

    fn approximate(&self) -> i64 {
        self.global.get()
    }

    /// The global and every node, read with no spill in flight.
    fn precise(&self) -> i64 {
        self.global.consistent_sum(|| {
            self.nodes
                .iter()
                .fold(0i64, |acc, n| acc.wrapping_add(n.load(Acquire)))
        })
    }

    /// `m·(batch − 1)` on each side, `m` node slots.
    fn accuracy(&self) -> Accuracy {
        let b = self.nodes.len() as u64 * (self.batch as u64 - 1);
        Accuracy { under: b, over: b }
    }

    fn set(&self, v: i64) {
        self.global.add(v.wrapping_sub(self.precise()));
    }
}

/// The test and lab tool [`Config::worst_case_schedule`] builds on.
impl PerNode {
    /// `batch − 1` (of the side's sign) on one CPU of every node slot.
    pub(crate) fn worst_case_schedule(&self, side: Side) -> Vec<Step> {
        let one_cpu_per_slot = (0..self.nodes.len())
            .filter_map(|slot| self.slot_of.iter().position(|&s| s as usize == slot));
        super::spill_worst_case(one_cpu_per_slot, self.batch, side)
    }
}
