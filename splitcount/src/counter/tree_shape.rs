//! The shape of a [`super::Tree`]: fan-outs per level, level batches, which
//! CPU feeds which item, and the accuracy bound that follows.
//!
//! ```text
//!  level 3 (root)                    R
//!  level 2 (B₂ = b·a₁·a₂)      I₂,₀ ... I₂,₇          n₂ items
//!  level 1 (B₁ = b·a₁)     I₁,₀ ...         I₁,₆₃     n₁ items
//!  level 0 (B₀ = b)      s₀ s₁ ...              s₅₁₁  one slot per CPU
//! ```
//!
//! Fan-outs are powers of two given as *orders* (log2), bottom level first,
//! adding up to `k = ceil(log2 ncpu)`. Item `i` of level `l` covers the CPUs
//! at positions `[i·2^sₗ, (i+1)·2^sₗ)`, `sₗ = o₁+…+oₗ`; positions are CPU ids
//! (sharing by id) or an order that keeps cache domains together.
//!
//! **Bound** (derivation in `IMPLEMENTATION.md`): a level-`l` item only ever
//! receives multiples of `Bₗ₋₁`, so what it holds back (`v mod Bₗ`) is at most
//! `Bₗ − Bₗ₋₁`; a slot holds back at most `B₀ − 1`; the root holds nothing
//! back. Hence, settled, `0 ≤ precise − approximate ≤ under` with
//!
//! `under = ncpu·(B₀ − 1) + Σ_{l=1}^{L−1} nₗ·(Bₗ − Bₗ₋₁)`,  `over = 0`.

use super::config::{Arity, ConfigError, Sharing};
use crate::cpu::Topology;

/// Fan-out orders (log2 of each level's fan-out, bottom first) for `cpus`
/// CPUs: binary up to 8 CPUs, then fan-outs growing to 16, so that 2²⁰ CPUs
/// need 5 levels. The top level (the root's fan-out) is the largest, since a
/// root holds nothing back and so costs no accuracy.
///
/// ```
/// use splitcount::counter::fanout_orders_for;
/// assert_eq!(fanout_orders_for(1), Vec::<u32>::new());
/// assert_eq!(fanout_orders_for(8), vec![1, 1, 1]);
/// assert_eq!(fanout_orders_for(512), vec![3, 3, 3]);   // 8·8·8, as the kernel
/// assert_eq!(fanout_orders_for(1 << 20), vec![4; 5]);
/// ```
pub fn fanout_orders_for(cpus: usize) -> Vec<u32> {
    const TABLE: [&[u32]; 21] = [
        &[],              // 1 CPU: slots carry straight into the root
        &[1],             // 2
        &[1, 1],          // 4
        &[1, 1, 1],       // 8
        &[2, 2],          // 16
        &[2, 3],          // 32
        &[2, 2, 2],       // 64
        &[2, 2, 3],       // 128
        &[2, 3, 3],       // 256
        &[3, 3, 3],       // 512
        &[3, 3, 4],       // 1 Ki
        &[3, 4, 4],       // 2 Ki
        &[4, 4, 4],       // 4 Ki
        &[3, 3, 3, 4],    // 8 Ki
        &[3, 3, 4, 4],    // 16 Ki
        &[3, 4, 4, 4],    // 32 Ki
        &[4, 4, 4, 4],    // 64 Ki
        &[3, 3, 3, 4, 4], // 128 Ki
        &[3, 3, 4, 4, 4], // 256 Ki
        &[3, 4, 4, 4, 4], // 512 Ki
        &[4, 4, 4, 4, 4], // 1 Mi
    ];
    TABLE[order_of(cpus).min(20) as usize].to_vec()
}

/// `ceil(log2 cpus)` (0 for one CPU).
fn order_of(cpus: usize) -> u32 {
    cpus.max(1).next_power_of_two().trailing_zeros()
}

/// The validated shape of a tree counter. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeShape {
    cpus: usize,
    batch: u64,
    /// Fan-out orders, bottom first (`L` entries; the last is the root's).
    orders: Vec<u32>,
    /// `s_l` for `l = 0..=L` (`s_0 = 0`).
    shifts: Vec<u32>,
    /// The CPUs' order in the bottom row, when it is not their ids' (sharing
    /// by cache): shared by the shape's clones.
    order: Option<std::sync::Arc<Order>>,
}

/// A bottom row ordered other than by id.
#[derive(Debug, PartialEq, Eq)]
struct Order {
    /// Position of each CPU.
    position: Vec<u32>,
    /// CPU at each position.
    cpu_at: Vec<u32>,
}

impl TreeShape {
    /// Validate and build a shape. `batch` must be a power of two ≥ 2 (the
    /// caller checks); the orders must add up to `ceil(log2 cpus)`.
    pub fn new(
        topology: &Topology,
        batch: u64,
        arity: &Arity,
        sharing: Sharing,
    ) -> Result<TreeShape, ConfigError> {
        let cpus = topology.cpus();
        let orders = orders_for(cpus, arity)?;
        let shifts = std::iter::once(0)
            .chain(orders.iter().scan(0, |s, &o| {
                *s += o;
                Some(*s)
            }))
            .collect();
        // By id, a CPU's position is its id: no table (8 bytes per CPU per
        // counter otherwise).
        let order = match sharing {
            Sharing::ById => None,
            Sharing::ByCache => {
                let cpu_at = cache_order(topology)?;
                let mut position = vec![0u32; cpus];
                for (pos, &cpu) in cpu_at.iter().enumerate() {
                    position[cpu as usize] = pos as u32;
                }
                Some(std::sync::Arc::new(Order { position, cpu_at }))
            }
        };
        Ok(TreeShape {
            cpus,
            batch,
            orders,
            shifts,
            order,
        })
    }

    /// Number of CPUs (level-0 slots).
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// The level-0 batch `B₀`.
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// `L`: levels above the per-CPU one, the root included (0 for one CPU,
    /// whose slot carries straight into the root).
    pub fn levels(&self) -> usize {
        self.orders.len()
    }

    /// Fan-out of each level above the slots, bottom first.
    pub fn fanouts(&self) -> Vec<u64> {
        self.orders.iter().map(|&o| 1u64 << o).collect()
    }

    /// `Bₗ = batch · Π fan-outs below l`, for `l = 0..=L`.
    pub fn level_batch(&self, l: usize) -> u64 {
        self.batch << self.shifts[l]
    }

    /// `sₗ`: the position shift that maps a CPU to its level-`l` item.
    pub(crate) fn shift(&self, l: usize) -> u32 {
        self.shifts[l]
    }

    /// Items at level `l` covering at least one CPU (`ncpu` at level 0, 1 at
    /// the root).
    pub fn items_at(&self, l: usize) -> usize {
        self.cpus.div_ceil(1 << self.shifts[l])
    }

    /// CPU `cpu`'s position in the bottom row.
    #[inline]
    pub(crate) fn position(&self, cpu: usize) -> usize {
        match &self.order {
            None => cpu,
            Some(o) => o.position[cpu] as usize,
        }
    }

    /// The level-`l` item CPU `cpu` carries into.
    #[inline]
    pub fn item_of(&self, cpu: usize, l: usize) -> usize {
        self.position(cpu) >> self.shifts[l]
    }

    /// The CPU at position `pos` of the bottom row.
    pub(crate) fn cpu_at(&self, pos: usize) -> usize {
        match &self.order {
            None => pos,
            Some(o) => o.cpu_at[pos] as usize,
        }
    }

    /// The first CPU (by position) under item `item` of level `l`.
    pub(crate) fn first_cpu_under(&self, l: usize, item: usize) -> usize {
        self.cpu_at(item << self.shifts[l])
    }

    /// Which order of CPUs positions follow, for the kinds of stripes a
    /// tree's items take (`percpu/stripe.rs`): 0 by id, 1 by cache.
    pub(crate) fn order_kind(&self) -> u8 {
        u8::from(self.order.is_some())
    }

    /// Heap bytes the shape holds of its own (its order table is shared by
    /// its clones and counted by the first).
    pub(crate) fn heap_bytes(&self) -> usize {
        (self.orders.capacity() + self.shifts.capacity()) * std::mem::size_of::<u32>()
            + self.order.as_ref().map_or(0, |o| {
                (o.position.capacity() + o.cpu_at.capacity()) * std::mem::size_of::<u32>()
            })
    }

    /// The fan-out orders, bottom first (the last is the root's).
    pub fn orders(&self) -> &[u32] {
        &self.orders
    }

    /// The bound `under` (see the module docs); `over` is 0.
    pub fn under(&self) -> u64 {
        under_for(self.cpus, self.batch, &self.orders)
    }
}

/// The validated fan-out orders `arity` gives a tree on `cpus` CPUs: each
/// order from 1 to 20, adding up to `ceil(log2 cpus)`.
pub(crate) fn orders_for(cpus: usize, arity: &Arity) -> Result<Vec<u32>, ConfigError> {
    let k = order_of(cpus);
    let orders = match arity {
        Arity::Auto => fanout_orders_for(cpus),
        Arity::Binary => vec![1; k as usize],
        Arity::Orders(o) => o.clone(),
    };
    if let Some(bad) = orders.iter().find(|&&o| o == 0 || o > 20) {
        return Err(ConfigError::BadFanout(format!("2^{bad}")));
    }
    if orders.iter().sum::<u32>() != k {
        return Err(ConfigError::ArityMismatch {
            fanouts: orders.iter().map(|&o| 1u64 << o).collect(),
            expected_order: k,
            cpus,
        });
    }
    Ok(orders)
}

/// `under = ncpu·(B₀ − 1) + Σ_{l=1}^{L−1} nₗ·(Bₗ − Bₗ₋₁)` for validated
/// `orders` and a batch ≥ 1, without building the shape (the error-budget
/// search evaluates it for many batches). Saturates at `u64::MAX`, which no
/// shape within [`super::MAX_BATCH`] and [`crate::cpu::MAX_CPUS`] reaches.
pub(crate) fn under_for(cpus: usize, batch: u64, orders: &[u32]) -> u64 {
    let b = batch as u128;
    let mut sum = cpus as u128 * (b - 1);
    let mut shift = 0;
    // The intermediate levels 1..L−1; the root (the last order) holds nothing back.
    for &o in &orders[..orders.len().saturating_sub(1)] {
        let below = b << shift;
        shift += o;
        let items = cpus.div_ceil(1 << shift) as u128;
        sum += items * ((b << shift) - below);
    }
    sum.min(u64::MAX as u128) as u64
}

/// CPUs ordered so that those sharing a cache are adjacent: by NUMA node,
/// then by domain at each cache level from the largest cache down, then by id.
fn cache_order(topology: &Topology) -> Result<Vec<u32>, ConfigError> {
    let mut levels: Vec<_> = topology
        .caches()
        .iter()
        .filter(|c| c.kind != "Instruction")
        .collect();
    if levels.is_empty() {
        return Err(ConfigError::NoCacheTopology);
    }
    levels.sort_by_key(|l| std::cmp::Reverse(l.level));
    let domain_of = |cpu: usize, level: &crate::cpu::CacheLevel| {
        level
            .domains
            .iter()
            .position(|d| d.contains(&cpu))
            .unwrap_or(usize::MAX)
    };
    let mut cpus: Vec<u32> = (0..topology.cpus() as u32).collect();
    cpus.sort_by_cached_key(|&c| {
        let c = c as usize;
        let domains: Vec<usize> = levels.iter().map(|l| domain_of(c, l)).collect();
        (topology.node_of(c), domains, c)
    });
    Ok(cpus)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn shape(cpus: usize, batch: u64, arity: Arity) -> TreeShape {
        let t = Topology::simulated(cpus, 1).unwrap();
        TreeShape::new(&t, batch, &arity, Sharing::ById).unwrap()
    }

    #[test]
    fn the_table_covers_every_size_with_at_most_five_levels() {
        for k in 0..=20u32 {
            let o = fanout_orders_for(1 << k);
            assert_eq!(o.iter().sum::<u32>(), k, "orders for 2^{k}");
            assert!(o.len() <= 5);
            assert!(o.iter().all(|&x| (1..=4).contains(&x)));
            if k <= 3 {
                assert!(o.iter().all(|&x| x == 1), "binary up to 8 CPUs");
            }
        }
        assert_eq!(fanout_orders_for(3), vec![1, 1], "3 CPUs round up to 4");
    }

    #[test]
    fn level_batches_multiply_the_fanouts_below() {
        let s = shape(512, 32, Arity::Orders(vec![3, 3, 3]));
        assert_eq!(s.levels(), 3);
        assert_eq!(
            (0..=3).map(|l| s.level_batch(l)).collect::<Vec<_>>(),
            [32, 256, 2048, 16384]
        );
        assert_eq!(
            (0..=3).map(|l| s.items_at(l)).collect::<Vec<_>>(),
            [512, 64, 8, 1]
        );
        assert_eq!(s.item_of(511, 1), 63);
        assert_eq!(s.item_of(511, 2), 7);
        assert_eq!(s.item_of(511, 3), 0);
    }

    #[test]
    fn the_bound_at_512_cpus_batch_32_matches_the_derivation() {
        let s = shape(512, 32, Arity::Orders(vec![3, 3, 3]));
        // 512·31 + 64·(256−32) + 8·(2048−256)
        assert_eq!(s.under(), 15_872 + 14_336 + 14_336);
    }

    #[test]
    fn partial_items_count_only_when_they_cover_a_cpu() {
        // 3 CPUs in a binary tree of 4: level 1 has items {0,1} and {2}.
        let s = shape(3, 2, Arity::Binary);
        assert_eq!(s.items_at(1), 2);
        assert_eq!(
            s.under(),
            3 + 2 * (4 - 2),
            "3 slots hold 1, 2 items hold 4 − 2"
        );
    }

    #[test]
    fn one_cpu_has_no_levels_between_its_slot_and_the_root() {
        let s = shape(1, 32, Arity::Auto);
        assert_eq!(s.levels(), 0);
        assert_eq!(s.under(), 31);
    }

    #[test]
    fn cache_sharing_keeps_cache_domains_adjacent() {
        // Two nodes whose CPUs interleave by id: 0,2,4,6 on node 0.
        let root = std::env::temp_dir().join(format!("splitcount-shape-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let w = |rel: &str, text: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w("cpu/possible", "0-7");
        w("node/possible", "0-1");
        w("node/node0/cpulist", "0,2,4,6");
        w("node/node1/cpulist", "1,3,5,7");
        for c in 0..8 {
            w(&format!("cpu/cpu{c}/cache/index3/level"), "3");
            w(&format!("cpu/cpu{c}/cache/index3/type"), "Unified");
            let l3 = if c % 2 == 0 { "0,2,4,6" } else { "1,3,5,7" };
            w(&format!("cpu/cpu{c}/cache/index3/shared_cpu_list"), l3);
        }
        let t = Topology::from_sysfs(&root).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        let s = TreeShape::new(&t, 32, &Arity::Orders(vec![2, 1]), Sharing::ByCache).unwrap();
        for c in [0, 2, 4, 6] {
            assert_eq!(s.item_of(c, 1), 0, "node 0's CPUs share the first item");
        }
        for c in [1, 3, 5, 7] {
            assert_eq!(s.item_of(c, 1), 1);
        }
        let by_id = TreeShape::new(&t, 32, &Arity::Orders(vec![2, 1]), Sharing::ById).unwrap();
        assert_eq!(by_id.item_of(1, 1), 0);
        let no_caches = Topology::simulated(8, 1).unwrap();
        assert!(TreeShape::new(&no_caches, 32, &Arity::Auto, Sharing::ByCache).is_ok());
        let fallback = Topology::fallback();
        assert_eq!(
            TreeShape::new(&fallback, 32, &Arity::Auto, Sharing::ByCache).err(),
            Some(ConfigError::NoCacheTopology)
        );
    }
}
