//! Error budgets: the cheapest counter shape whose bound fits a requested
//! maximum error ([`Config::max_error`]), and [`Shape`], the description of
//! what a [`Config`] builds.
//!
//! **Cost model.** Nothing here is timed; shapes are ranked by what an add
//! touches besides its own CPU's cache line.
//!
//! - A larger batch is cheaper, in every design: a CPU's adds leave its own
//!   line (a spill into the shared total or node atomic, a carry into a tree
//!   item) once per `batch` units, so the batch sets how often an add pays
//!   for a shared line. Each bound grows with the batch, so the cheapest
//!   shape that fits is the one with the largest batch that fits.
//! - For the tree, the fan-outs come first: the table's orders for the
//!   machine's CPU count ([`super::fanout_orders_for`]) at any batch rank
//!   above other orders at every batch. Only when batch 2 misses the budget
//!   with them are the top intermediate levels folded into the root, one at
//!   a time (`8·8·8` → `8·64` → `512`). The root holds nothing back, so
//!   each fold removes that level's `nₗ·(Bₗ − Bₗ₋₁)` from the bound, and it
//!   costs contention: more CPUs carry into each root line. The bottom
//!   levels stay as the table has them, so until the last fold the CPUs
//!   that share the first line a carry touches do not change. The last fold (slots carrying
//!   straight into the root) at batch 2 has bound `ncpu`, the least any
//!   tree can have (every slot may hold back `B₀ − 1 ≥ 1`).
//! - `Batched` and `PerNode` take the batch `⌊units / parts⌋ + 1` (`parts`
//!   = CPUs or node slots, capped at [`MAX_BATCH`]): batch 1, where every
//!   add spills and the bound is 0, meets a budget of 0.
//! - `Atomic` has bound 0 and meets every budget.
//!
//! What was set explicitly (a batch, an arity other than [`Arity::Auto`]) is
//! kept, not searched: the budget is then checked against it.
//!
//! **Search.** At most 5 fan-out lists × 32 powers of two, each bound a sum
//! over at most 5 levels ([`super::TreeShape`]'s formula, evaluated without
//! building the shape). The scan runs in cost order and stops at the first
//! fit, so it returns the cheapest shape by the model; see
//! `IMPLEMENTATION.md` for why that is minimal and why a refusal is exact.

use super::config::{Arity, Config, ConfigError, Design, MAX_BATCH};
use super::pernode::node_slots_for;
use super::tree_shape::{fanout_orders_for, orders_for, under_for, TreeShape};
use super::Accuracy;
use std::fmt;

/// What a [`Config`] builds: design, batch, the tree's fan-outs or the
/// node slots, and the accuracy bound that follows. [`Config::chosen`]
/// returns it; its `Display` is one line such as `tree batch 32, fan-outs
/// 2^3·2^3·2^3, bound 44,544 under`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    design: Design,
    cpus: usize,
    batch: u64,
    orders: Vec<u32>,
    node_slots: Option<usize>,
    accuracy: Accuracy,
}

impl Shape {
    /// The shape of a configuration without an error budget (or with its
    /// budget resolved): the checks [`Config::build`] makes, without
    /// allocating the counter.
    pub(crate) fn of(config: &Config) -> Result<Shape, ConfigError> {
        let batch = config.validated_batch()?;
        let topology = config.machine.topology();
        let cpus = topology.cpus();
        Ok(match config.design {
            Design::Atomic => Shape {
                design: Design::Atomic,
                cpus,
                batch,
                orders: Vec::new(),
                node_slots: None,
                accuracy: Accuracy::default(),
            },
            Design::Batched => Shape::spill(Design::Batched, cpus, cpus, batch),
            Design::PerNode => Shape::spill(Design::PerNode, cpus, node_slots_for(topology), batch),
            Design::Tree => {
                let t = TreeShape::new(topology, batch, &config.arity, config.sharing)?;
                Shape::tree(cpus, batch, t.orders().to_vec())
            }
        })
    }

    /// `Batched` or `PerNode` over `parts` slots: `parts·(batch − 1)` on
    /// each side.
    fn spill(design: Design, cpus: usize, parts: usize, batch: u64) -> Shape {
        let bound = parts as u64 * (batch - 1);
        Shape {
            design,
            cpus,
            batch,
            orders: Vec::new(),
            node_slots: (design == Design::PerNode).then_some(parts),
            accuracy: Accuracy {
                under: bound,
                over: bound,
            },
        }
    }

    fn tree(cpus: usize, batch: u64, orders: Vec<u32>) -> Shape {
        Shape {
            design: Design::Tree,
            cpus,
            batch,
            accuracy: Accuracy {
                under: under_for(cpus, batch, &orders),
                over: 0,
            },
            orders,
            node_slots: None,
        }
    }

    /// The design.
    pub fn design(&self) -> Design {
        self.design
    }

    /// The machine's CPU count.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// The batch (1 for [`Design::Atomic`], which has none).
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// The tree's fan-out orders (log2 of each fan-out), bottom first, as
    /// [`Arity::Orders`] takes them; empty for the other designs and for a
    /// tree on one CPU.
    pub fn fanout_orders(&self) -> &[u32] {
        &self.orders
    }

    /// The tree's fan-outs, bottom first.
    pub fn fanouts(&self) -> Vec<u64> {
        self.orders.iter().map(|&o| 1u64 << o).collect()
    }

    /// `PerNode`'s node slots (`None` for the other designs).
    pub fn node_slots(&self) -> Option<usize> {
        self.node_slots
    }

    /// The bound a counter of this shape has.
    pub fn accuracy(&self) -> Accuracy {
        self.accuracy
    }

    /// The largest error on either side: `max(under, over)`, what
    /// [`Config::max_error`] compares with its budget.
    pub fn bound(&self) -> u64 {
        self.accuracy.under.max(self.accuracy.over)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, under) = (grouped(self.batch), grouped(self.accuracy.under));
        match self.design {
            Design::Atomic => write!(f, "atomic, bound 0"),
            Design::Batched => write!(f, "batched batch {b}, bound {under} each side"),
            Design::PerNode => {
                let m = self.node_slots.unwrap_or(0);
                let s = if m == 1 { "" } else { "s" };
                write!(
                    f,
                    "pernode batch {b}, {m} node slot{s}, bound {under} each side"
                )
            }
            Design::Tree => {
                write!(f, "tree batch {b}")?;
                if !self.orders.is_empty() {
                    let fanouts: Vec<String> =
                        self.orders.iter().map(|o| format!("2^{o}")).collect();
                    write!(f, ", fan-outs {}", fanouts.join("·"))?;
                }
                write!(f, ", bound {under} under")
            }
        }
    }
}

/// `v` with a comma between groups of three digits: `9,856`.
pub(crate) fn grouped(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::with_capacity(digits.len() * 4 / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// `config` with its budget of `units` replaced by the cheapest batch (and,
/// for the tree, fan-out orders) that meets it, or the refusal naming the
/// smallest bound the configuration allows.
pub(crate) fn resolve(config: &Config, units: u64) -> Result<Config, ConfigError> {
    let mut fixed = config.clone();
    fixed.max_error = None;
    let batch = match config.design {
        // Bound 0: every budget is met, and there is nothing to choose.
        Design::Atomic => return Ok(fixed),
        Design::Batched | Design::PerNode => spill_batch_within(&fixed, units)?,
        Design::Tree => {
            let (batch, orders) = tree_within(&fixed, units)?;
            fixed.arity = Arity::Orders(orders);
            batch
        }
    };
    fixed.batch = Some(batch);
    Ok(fixed)
}

/// The largest batch with `parts·(batch − 1) ≤ units`, or the configured
/// batch if it meets the budget.
fn spill_batch_within(config: &Config, units: u64) -> Result<u64, ConfigError> {
    let topology = config.machine.topology();
    let parts = match config.design {
        Design::PerNode => node_slots_for(topology),
        _ => topology.cpus(),
    };
    let batch = match config.batch {
        None => (units / parts as u64).min(MAX_BATCH - 1) + 1,
        Some(_) => config.validated_batch()?,
    };
    let shape = Shape::spill(config.design, topology.cpus(), parts, batch);
    if shape.bound() <= units {
        Ok(batch)
    } else {
        Err(unreachable(units, shape))
    }
}

/// Fan-out lists in cost order, cheapest first, and batches from the
/// largest down; the first `(orders, batch)` within `units` is the cheapest.
fn tree_within(config: &Config, units: u64) -> Result<(u64, Vec<u32>), ConfigError> {
    let cpus = config.machine.cpus();
    let candidates = match &config.arity {
        Arity::Auto => folds(fanout_orders_for(cpus)),
        fixed => vec![orders_for(cpus, fixed)?],
    };
    let batches: Vec<u64> = match config.batch {
        None => (1..=MAX_BATCH.trailing_zeros())
            .rev()
            .map(|s| 1 << s)
            .collect(),
        Some(_) => vec![config.validated_batch()?],
    };
    for orders in &candidates {
        for &batch in &batches {
            if under_for(cpus, batch, orders) <= units {
                return Ok((batch, orders.clone()));
            }
        }
    }
    // Each list's bound is below the one before it, and each bound grows
    // with the batch: the last list at the smallest batch is the least.
    let least = candidates.last().expect("at least one list").clone();
    let batch = *batches.last().expect("at least one batch");
    Err(unreachable(units, Shape::tree(cpus, batch, least)))
}

/// `orders`, then with its top intermediate levels folded into the root one
/// at a time: `[3,3,3]`, `[3,6]`, `[9]`.
fn folds(orders: Vec<u32>) -> Vec<Vec<u32>> {
    if orders.len() <= 1 {
        return vec![orders];
    }
    (1..=orders.len())
        .rev()
        .map(|levels| {
            let mut o = orders[..levels - 1].to_vec();
            o.push(orders[levels - 1..].iter().sum());
            o
        })
        .collect()
}

fn unreachable(requested: u64, smallest: Shape) -> ConfigError {
    ConfigError::MaxErrorUnreachable {
        requested,
        smallest: Box::new(smallest),
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn folding_keeps_the_bottom_levels_and_widens_the_root() {
        assert_eq!(folds(vec![3, 3, 3]), [vec![3, 3, 3], vec![3, 6], vec![9]]);
        assert_eq!(folds(vec![2, 2]), [vec![2, 2], vec![4]]);
        assert_eq!(folds(vec![1]), [vec![1]]);
        assert_eq!(folds(vec![]), [Vec::<u32>::new()]);
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(9_856), "9,856");
        assert_eq!(grouped(33_550_336), "33,550,336");
        assert_eq!(grouped(u64::MAX), "18,446,744,073,709,551,615");
    }
}
