//! Choosing and validating a counter: design, batch, tree arity, sharing.

use super::budget::{self, grouped, Shape};
use super::{Accuracy, Atomic, Batched, PerNode, Side, SplitCounter, Step, Tree};
use crate::cpu::Machine;
use crate::percpu::{Arena, ArenaError};
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// Largest batch any design accepts: keeps every bound (at most
/// `2²⁰ CPUs · 2³² · levels`) far inside `i64`.
pub const MAX_BATCH: u64 = 1 << 32;

/// The counter designs. See [`crate::counter`] for what each one is.
///
/// ```
/// use splitcount::counter::Design;
///
/// let d: Design = "tree".parse().unwrap();
/// assert_eq!(d, Design::Tree);
/// assert_eq!(d.name(), "tree");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum Design {
    /// One shared atomic.
    Atomic,
    /// Per-CPU slots and a total (the kernel's `percpu_counter`).
    Batched,
    /// One atomic per NUMA node and a global.
    PerNode,
    /// The hierarchical split counter (the default).
    Tree,
}

impl Design {
    /// Every design, in the order the lab shows them.
    pub const ALL: [Design; 4] = [
        Design::Atomic,
        Design::Batched,
        Design::PerNode,
        Design::Tree,
    ];

    /// The lower-case name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Design::Atomic => "atomic",
            Design::Batched => "batched",
            Design::PerNode => "pernode",
            Design::Tree => "tree",
        }
    }
}

impl fmt::Display for Design {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Design {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Design::ALL
            .into_iter()
            .find(|d| d.name() == s.trim())
            .ok_or_else(|| ConfigError::UnknownDesign(s.to_owned()))
    }
}

/// The fan-outs of a [`Tree`]'s levels above the per-CPU level.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Arity {
    /// From the table indexed by `ceil(log2 ncpu)` ([`super::fanout_orders_for`]).
    #[default]
    Auto,
    /// Fan-out 2 at every level (the classic design note).
    Binary,
    /// Explicit fan-out *orders* (log2 of each fan-out), bottom level first;
    /// they must add up to `ceil(log2 ncpu)`.
    Orders(Vec<u32>),
}

impl FromStr for Arity {
    type Err = ConfigError;
    /// `auto`, `binary`, or fan-outs bottom first such as `8,8,8` (each a
    /// power of two ≥ 2).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Arity::Auto),
            "binary" => Ok(Arity::Binary),
            list => list
                .split(',')
                .map(|f| match f.trim().parse::<u64>() {
                    Ok(n) if n >= 2 && n.is_power_of_two() => Ok(n.trailing_zeros()),
                    _ => Err(ConfigError::BadFanout(f.trim().to_owned())),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Arity::Orders),
        }
    }
}

/// Which CPUs share a [`Tree`] item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Sharing {
    /// CPUs with neighbouring ids share items (the kernel's choice).
    #[default]
    ById,
    /// CPUs that share a cache share items: CPUs are ordered by NUMA node,
    /// then by their largest shared cache, then by smaller caches, so carries
    /// stay inside a cache domain as far as the fan-outs allow.
    ByCache,
}

/// A counter configuration that cannot be built.
///
/// ```
/// use splitcount::counter::{Config, ConfigError, Design};
///
/// let e = Config::new(Design::Batched).batch(0).build().unwrap_err();
/// assert_eq!(e, ConfigError::ZeroBatch);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A batch of zero.
    ZeroBatch,
    /// The tree's batch must be a power of two ≥ 2.
    BatchNotPowerOfTwo(u64),
    /// A batch above [`MAX_BATCH`].
    BatchTooLarge(u64),
    /// The fan-out orders do not multiply to the CPU count rounded up to a
    /// power of two.
    ArityMismatch {
        /// The fan-outs given, bottom first.
        fanouts: Vec<u64>,
        /// `ceil(log2 ncpu)`: what their orders must add up to.
        expected_order: u32,
        /// The machine's CPU count.
        cpus: usize,
    },
    /// A fan-out that is not a power of two ≥ 2.
    BadFanout(String),
    /// Cache sharing was asked for, but the machine reports no caches.
    NoCacheTopology,
    /// An arena for another machine than the counter's.
    ArenaMachineMismatch {
        /// CPUs of the arena's machine.
        arena_cpus: usize,
        /// CPUs of the counter's machine.
        cpus: usize,
    },
    /// A design name the library does not know.
    UnknownDesign(String),
    /// The per-CPU memory could not be allocated.
    Arena(ArenaError),
    /// No shape the configuration allows has an error bound within the
    /// budget given to [`Config::max_error`].
    MaxErrorUnreachable {
        /// The budget asked for, in counter units.
        requested: u64,
        /// The shape with the smallest bound the configuration allows (its
        /// configured batch and fan-outs kept): its
        /// [`bound`](Shape::bound) is above `requested`.
        smallest: Box<Shape>,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ZeroBatch => write!(f, "a counter's batch must be at least 1"),
            ConfigError::BatchNotPowerOfTwo(b) => {
                write!(f, "the tree counter's batch must be a power of two ≥ 2, not {b}")
            }
            ConfigError::BatchTooLarge(b) => {
                write!(f, "batch {b} exceeds the largest supported batch {MAX_BATCH}")
            }
            ConfigError::ArityMismatch {
                fanouts,
                expected_order,
                cpus,
            } => write!(
                f,
                "fan-outs {fanouts:?} multiply to {}, but {cpus} CPUs need {} (the CPU count rounded up to a power of two)",
                fanouts.iter().map(|&x| x as u128).product::<u128>(),
                1u128 << expected_order
            ),
            ConfigError::BadFanout(s) => {
                write!(f, "fan-out {s:?} is not a power of two ≥ 2")
            }
            ConfigError::NoCacheTopology => write!(
                f,
                "sharing by cache needs cache information, and this machine reports none"
            ),
            ConfigError::ArenaMachineMismatch { arena_cpus, cpus } => write!(
                f,
                "the arena covers {arena_cpus} CPUs but the counter's machine has {cpus}"
            ),
            ConfigError::UnknownDesign(s) => write!(
                f,
                "unknown design {s:?} (known: atomic, batched, pernode, tree)"
            ),
            ConfigError::Arena(e) => write!(f, "{e}"),
            ConfigError::MaxErrorUnreachable {
                requested,
                smallest,
            } => write!(
                f,
                "no {} shape on {} CPUs has an error bound within {} units: the smallest the \
                 configuration allows is {} ({smallest})",
                smallest.design(),
                grouped(smallest.cpus() as u64),
                grouped(*requested),
                grouped(smallest.bound()),
            ),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Arena(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ArenaError> for ConfigError {
    fn from(e: ArenaError) -> Self {
        ConfigError::Arena(e)
    }
}

/// How to build a counter: design, machine, batch and (for the tree) arity
/// and sharing — or, instead of a batch and arity, an error budget
/// ([`Config::max_error`]). Every field has a default; [`Config::build`]
/// validates, and [`Config::chosen`] says what it would build.
///
/// ```
/// use splitcount::counter::{Arity, Config, Design};
/// use splitcount::cpu::Machine;
///
/// let m = Machine::simulated(512, 4).unwrap();
/// let c = Config::new(Design::Tree)
///     .machine(&m)
///     .batch(32)
///     .arity(Arity::Orders(vec![3, 3, 3]))
///     .build()
///     .unwrap();
/// assert_eq!(c.accuracy().under, 44_544);
///
/// let err = Config::new(Design::Tree).batch(24).build().unwrap_err();
/// assert_eq!(err.to_string(), "the tree counter's batch must be a power of two ≥ 2, not 24");
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    pub(crate) design: Design,
    pub(crate) batch: Option<u64>,
    pub(crate) arity: Arity,
    pub(crate) sharing: Sharing,
    pub(crate) machine: Machine,
    pub(crate) arena: Option<Arena>,
    pub(crate) max_error: Option<u64>,
}

impl Config {
    /// Defaults for `design` on the host machine.
    pub fn new(design: Design) -> Config {
        Config {
            design,
            batch: None,
            arity: Arity::Auto,
            sharing: Sharing::ById,
            machine: Machine::host(),
            arena: None,
            max_error: None,
        }
    }

    /// Run on `machine` (the host by default, or a simulated one).
    pub fn machine(mut self, machine: &Machine) -> Config {
        self.machine = machine.clone();
        self
    }

    /// The batch (each design's default otherwise: see [`Config::effective_batch`]).
    pub fn batch(mut self, batch: u64) -> Config {
        self.batch = Some(batch);
        self
    }

    /// The tree's fan-outs.
    pub fn arity(mut self, arity: Arity) -> Config {
        self.arity = arity;
        self
    }

    /// Which CPUs share a tree item.
    pub fn sharing(mut self, sharing: Sharing) -> Config {
        self.sharing = sharing;
        self
    }

    /// Take per-CPU memory from `arena` (by default the host's shared arena,
    /// or a new arena for a simulated machine).
    pub fn arena(mut self, arena: &Arena) -> Config {
        self.arena = Some(arena.clone());
        self
    }

    /// Build the cheapest counter whose error bound, `max(under, over)`, is
    /// at most `units`: the batch (and, for the tree, the fan-outs) are
    /// chosen for this configuration's machine when the counter is built.
    /// [`Config::chosen`] says what was chosen; [`Config::build`] refuses
    /// with [`ConfigError::MaxErrorUnreachable`], naming the smallest
    /// bound there is, when no shape meets the budget.
    ///
    /// **Cost model** (a model of what an add touches, not a timing of this
    /// machine; the machine enters through its CPU and node counts):
    ///
    /// - A larger batch is cheaper: a CPU's adds leave its own cache line
    ///   (a spill, a carry) once per `batch` units. Every bound grows with
    ///   the batch, so the largest batch that fits is taken.
    /// - [`Tree`]: the fan-outs from the table ([`super::fanout_orders_for`])
    ///   rank above any other fan-outs, whatever the batch; only when batch
    ///   2 misses the budget with them are the top intermediate levels folded
    ///   into the root, one at a time (`8·8·8` → `8·64` → `512`), each fold
    ///   removing that level's share of the bound at the price of more CPUs
    ///   per root line. The batch is a power of two from 2 to [`MAX_BATCH`].
    ///   No tree has a bound below one unit per CPU (batch 2, every slot
    ///   holding back 1), so smaller budgets are refused.
    /// - [`Batched`], [`PerNode`]: batch `⌊units / parts⌋ + 1` (`parts` =
    ///   CPUs or node slots), at most [`MAX_BATCH`]; batch 1 (every add
    ///   spills, bound 0) meets a budget of 0.
    /// - [`Atomic`]: bound 0, every budget is met.
    ///
    /// A batch or a (non-[`Arity::Auto`]) arity set on the configuration is
    /// kept, not searched: the budget is checked against it.
    ///
    /// ```
    /// use splitcount::counter::{Config, ConfigError, Design};
    /// use splitcount::cpu::Machine;
    ///
    /// let m = Machine::simulated(512, 4).unwrap();
    /// let tree = Config::new(Design::Tree).machine(&m);
    ///
    /// // The table's 8·8·8 at the largest batch that fits (batch 64: 89,088).
    /// let cfg = tree.clone().max_error(50_000);
    /// let shape = cfg.chosen().unwrap();
    /// assert_eq!(shape.to_string(), "tree batch 32, fan-outs 2^3·2^3·2^3, bound 44,544 under");
    /// assert_eq!(cfg.effective_batch(), 32);
    /// assert_eq!(cfg.build().unwrap().accuracy().under, 44_544);
    ///
    /// // 8·8·8 at batch 2 holds back 2,304 and 8·64 1,408: only 512 fits.
    /// let shape = tree.clone().max_error(1_000).chosen().unwrap();
    /// assert_eq!(shape.to_string(), "tree batch 2, fan-outs 2^9, bound 512 under");
    ///
    /// let err = tree.clone().max_error(511).build().unwrap_err();
    /// assert!(matches!(err, ConfigError::MaxErrorUnreachable { requested: 511, .. }));
    /// assert_eq!(
    ///     err.to_string(),
    ///     "no tree shape on 512 CPUs has an error bound within 511 units: the smallest the \
    ///      configuration allows is 512 (tree batch 2, fan-outs 2^9, bound 512 under)"
    /// );
    ///
    /// // The kernel's counter spills more often instead: ⌊10,000 / 512⌋ + 1.
    /// let shape = Config::new(Design::Batched).machine(&m).max_error(10_000).chosen().unwrap();
    /// assert_eq!(shape.to_string(), "batched batch 20, bound 9,728 each side");
    /// ```
    pub fn max_error(mut self, units: u64) -> Config {
        self.max_error = Some(units);
        self
    }

    /// The design this configuration builds.
    pub fn design(&self) -> Design {
        self.design
    }

    /// What [`Config::build`] would build — design, batch, fan-outs, bound —
    /// or the error it would return, without allocating the counter. With
    /// an error budget ([`Config::max_error`]) this is the shape the search
    /// chose.
    pub fn chosen(&self) -> Result<Shape, ConfigError> {
        Shape::of(&*self.resolved()?)
    }

    /// The accuracy bound of the counter [`Config::build`] would build: the
    /// one [`Config::chosen`] reports.
    pub fn accuracy(&self) -> Result<Accuracy, ConfigError> {
        self.chosen().map(|s| s.accuracy())
    }

    /// The batch the design will use: with an error budget, the chosen one
    /// (where no shape meets the budget, the batch without it, and `build()`
    /// refuses); otherwise the configured one, or the default — `max(32, 2·ncpu)` for
    /// [`Batched`] (the kernel's), `max(32, 2·cpus_per_node)` for
    /// [`PerNode`], 32 for [`Tree`], 1 for [`Atomic`] (which has no batch).
    pub fn effective_batch(&self) -> u64 {
        match self.resolved() {
            Ok(c) => c.configured_batch(),
            Err(_) => self.configured_batch(),
        }
    }

    /// The configured batch or the design's default, ignoring any budget.
    fn configured_batch(&self) -> u64 {
        let cpus = self.machine.cpus() as u64;
        let nodes = self.machine.topology().nodes() as u64;
        self.batch.unwrap_or(match self.design {
            Design::Atomic => 1,
            Design::Batched => (2 * cpus).max(32),
            Design::PerNode => (2 * cpus.div_ceil(nodes)).max(32),
            Design::Tree => 32,
        })
    }

    /// This configuration with its error budget, if any, replaced by the
    /// batch and arity it chose. Every design's `with_config` starts here.
    pub(crate) fn resolved(&self) -> Result<Cow<'_, Config>, ConfigError> {
        match self.max_error {
            None => Ok(Cow::Borrowed(self)),
            Some(units) => budget::resolve(self, units).map(Cow::Owned),
        }
    }

    /// Check the configured batch (a budget must be resolved first) for
    /// this design.
    pub(crate) fn validated_batch(&self) -> Result<u64, ConfigError> {
        debug_assert!(self.max_error.is_none(), "resolve the budget first");
        let b = self.configured_batch();
        if b == 0 {
            return Err(ConfigError::ZeroBatch);
        }
        if b > MAX_BATCH {
            return Err(ConfigError::BatchTooLarge(b));
        }
        if self.design == Design::Tree && (b < 2 || !b.is_power_of_two()) {
            return Err(ConfigError::BatchNotPowerOfTwo(b));
        }
        Ok(b)
    }

    /// The arena per-CPU parts come from.
    pub(crate) fn arena_for(&self) -> Result<Arena, ConfigError> {
        let arena = match &self.arena {
            Some(a) => a.clone(),
            #[cfg(not(loom))]
            None if !self.machine.is_simulated() => Arena::host().clone(),
            None => Arena::new(&self.machine),
        };
        if arena.regions() != self.machine.cpus() {
            return Err(ConfigError::ArenaMachineMismatch {
                arena_cpus: arena.regions(),
                cpus: self.machine.cpus(),
            });
        }
        Ok(arena)
    }

    /// Build the configured design behind the trait.
    pub fn build(&self) -> Result<Box<dyn SplitCounter>, ConfigError> {
        Ok(match self.design {
            Design::Atomic => Box::new(Atomic::with_config(self)?),
            Design::Batched => Box::new(Batched::with_config(self)?),
            Design::PerNode => Box::new(PerNode::with_config(self)?),
            Design::Tree => Box::new(Tree::with_config(self)?),
        })
    }

    /// A test and lab tool, not for production code: a sequence of updates
    /// that drives a fresh (zero) counter of this configuration to the edge
    /// of its accuracy band on `side` — afterwards `precise − approximate`
    /// equals `under` (or `approximate − precise` equals `over`). Empty for
    /// a side whose bound is 0. It shows that a bound is reached, not merely
    /// respected.
    ///
    /// ```
    /// use splitcount::counter::{Config, Design, Side, SplitCounter};
    /// use splitcount::cpu::Machine;
    ///
    /// let cfg = Config::new(Design::Tree).machine(&Machine::simulated(8, 1).unwrap());
    /// let c = cfg.build().unwrap();
    /// for step in cfg.worst_case_schedule(Side::Under).unwrap() {
    ///     c.add_on(step.cpu, step.delta).unwrap();
    /// }
    /// assert_eq!(c.precise() - c.approximate(), c.accuracy().under as i64);
    /// ```
    pub fn worst_case_schedule(&self, side: Side) -> Result<Vec<Step>, ConfigError> {
        Ok(match self.design {
            Design::Atomic => Atomic::with_config(self)?.worst_case_schedule(side),
            Design::Batched => Batched::with_config(self)?.worst_case_schedule(side),
            Design::PerNode => PerNode::with_config(self)?.worst_case_schedule(side),
            Design::Tree => Tree::with_config(self)?.worst_case_schedule(side),
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn default_batches_follow_the_kernel() {
        let m = Machine::simulated(256, 4).unwrap();
        let b = |d| Config::new(d).machine(&m).effective_batch();
        assert_eq!(b(Design::Batched), 512);
        assert_eq!(b(Design::PerNode), 128);
        assert_eq!(b(Design::Tree), 32);
        let small = Machine::simulated(8, 1).unwrap();
        assert_eq!(
            Config::new(Design::Batched)
                .machine(&small)
                .effective_batch(),
            32
        );
    }

    #[test]
    fn invalid_configs_are_errors_not_panics() {
        let m = Machine::simulated(8, 2).unwrap();
        let c = |d| Config::new(d).machine(&m);
        assert_eq!(
            c(Design::Batched).batch(0).build().err(),
            Some(ConfigError::ZeroBatch)
        );
        assert_eq!(
            c(Design::Tree).batch(0).build().err(),
            Some(ConfigError::ZeroBatch)
        );
        assert_eq!(
            c(Design::Tree).batch(1).build().err(),
            Some(ConfigError::BatchNotPowerOfTwo(1))
        );
        assert_eq!(
            c(Design::Tree).batch(48).build().err(),
            Some(ConfigError::BatchNotPowerOfTwo(48))
        );
        assert_eq!(
            c(Design::PerNode).batch(MAX_BATCH + 1).build().err(),
            Some(ConfigError::BatchTooLarge(MAX_BATCH + 1))
        );
        assert!(matches!(
            c(Design::Tree)
                .arity(Arity::Orders(vec![1, 1]))
                .build()
                .err(),
            Some(ConfigError::ArityMismatch {
                expected_order: 3,
                cpus: 8,
                ..
            })
        ));
        assert!(matches!(
            c(Design::Tree)
                .arity(Arity::Orders(vec![3, 0]))
                .build()
                .err(),
            Some(ConfigError::BadFanout(_))
        ));
        let other = Arena::new(&Machine::simulated(4, 1).unwrap());
        assert_eq!(
            c(Design::Batched).arena(&other).build().err(),
            Some(ConfigError::ArenaMachineMismatch {
                arena_cpus: 4,
                cpus: 8
            })
        );
        assert!("tree2".parse::<Design>().is_err());
        assert!("3,4".parse::<Arity>().is_err());
        assert!("0".parse::<Arity>().is_err());
    }

    #[test]
    fn batch_one_is_valid_where_no_power_of_two_is_needed() {
        let m = Machine::simulated(4, 1).unwrap();
        let c = Config::new(Design::Batched)
            .machine(&m)
            .batch(1)
            .build()
            .unwrap();
        c.add_on(3, 5).unwrap();
        assert_eq!(c.approximate(), 5, "batch 1 moves every add to the total");
        assert_eq!(c.accuracy().under, 0);
    }

    #[test]
    fn arity_parses_fanouts_bottom_first() {
        assert_eq!(
            "8,8,8".parse::<Arity>().unwrap(),
            Arity::Orders(vec![3, 3, 3])
        );
        assert_eq!("binary".parse::<Arity>().unwrap(), Arity::Binary);
        assert_eq!("auto".parse::<Arity>().unwrap(), Arity::Auto);
    }
}
