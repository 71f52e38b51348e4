//! `accuracy`: bound vs observed error of every design on simulated machines.
//!
//! For one (design, CPU count) this builds the counter on a simulated
//! machine and reports its bound, the deviation reached by the design's
//! worst-case schedule on each side, and the largest |approximate − precise|
//! seen over random walks (tracked against an exact oracle, so each step
//! costs O(1) even at 4096 CPUs).
//!
//! With an error budget (`accuracy --max-error N`) the batch and fan-outs
//! are not given but chosen by [`Config::max_error`]: [`choose`] reports
//! the chosen shape and measures it, or the refusal where no shape meets the
//! budget.

use crate::rng::Rng;
use serde::Serialize;
use splitcount::counter::{Arity, Config, ConfigError, Design, Side, SplitCounter};
use splitcount::cpu::{Machine, MAX_NODES};

/// Bytes a simulation of `cpus` CPUs holds at once for `design`: a
/// per-CPU design's counter has a per-CPU region of its arena on every
/// simulated CPU (`REGION_BYTES`, touched by the walks), and the tree its
/// nodes besides — about 4.1 KiB a CPU for `batched` and 4.7 KiB for
/// `tree` measured (maximum resident set at 262,144 CPUs); 5 KiB a CPU is
/// taken. `atomic` and `pernode` need little beyond the machine.
pub fn memory_needed(design: Design, cpus: usize) -> u64 {
    const PER_CPU: u64 = 5 * 1024;
    match design {
        Design::Batched | Design::Tree => (cpus as u64).saturating_mul(PER_CPU),
        _ => 0,
    }
}

/// Refuse a simulation that would not fit in `available` bytes of memory
/// ([`crate::machine::memory::available`]; `None`: unknown — nothing is
/// refused): at 1,048,576 CPUs `batched` and
/// `tree` hold about 5 GiB each, and a run on a smaller machine would
/// swap or be killed instead of saying so.
pub fn check_memory(design: Design, cpus: usize, available: Option<u64>) -> Result<(), String> {
    let needed = memory_needed(design, cpus);
    match available {
        Some(available) if needed > available => Err(format!(
            "--cpus {cpus}: simulating {cpus} CPUs with the {} design needs about {} MiB \
             (a {}-byte per-CPU region of its counter's arena for every simulated CPU), and {} \
             MiB is available here: ask for fewer CPUs",
            design.name(),
            needed >> 20,
            splitcount::raw::percpu::REGION_BYTES,
            available >> 20
        )),
        _ => Ok(()),
    }
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The design.
    pub design: Design,
    /// Simulated CPUs.
    pub cpus: usize,
    /// Simulated NUMA nodes (`None`: one node per 64 CPUs).
    pub nodes: Option<usize>,
    /// The batch (`None`: the design's default).
    pub batch: Option<u64>,
    /// The tree's fan-outs.
    pub arity: Arity,
    /// Seed of the random walks.
    pub seed: u64,
    /// Random-walk steps in total.
    pub steps: usize,
    /// An error budget: choose the batch (and fan-outs) with
    /// [`Config::max_error`], keeping `batch` and a non-`auto` `arity` if
    /// given.
    pub max_error: Option<u64>,
}

impl Spec {
    /// Defaults for `design` on `cpus` CPUs.
    pub fn new(design: Design, cpus: usize) -> Spec {
        Spec {
            design,
            cpus,
            nodes: None,
            batch: None,
            arity: Arity::Auto,
            seed: 1,
            steps: 100_000,
            max_error: None,
        }
    }

    fn nodes(&self) -> usize {
        self.nodes
            .unwrap_or_else(|| self.cpus.div_ceil(64))
            .clamp(1, self.cpus.clamp(1, MAX_NODES))
    }

    /// The configuration this spec describes, on its own simulated machine.
    pub fn config(&self) -> Result<Config, String> {
        let m = Machine::simulated(self.cpus, self.nodes()).map_err(|e| e.to_string())?;
        let mut cfg = Config::new(self.design)
            .machine(&m)
            .arity(self.arity.clone());
        if let Some(b) = self.batch {
            cfg = cfg.batch(b);
        }
        if let Some(units) = self.max_error {
            cfg = cfg.max_error(units);
        }
        Ok(cfg)
    }

    /// The counter this spec describes, on its own simulated machine.
    pub fn build(&self) -> Result<Box<dyn SplitCounter>, String> {
        self.config()?.build().map_err(|e| e.to_string())
    }

    fn config_batch(&self) -> Result<u64, String> {
        Ok(self.config()?.effective_batch())
    }
}

/// One line of `accuracy --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// Design name.
    pub design: Design,
    /// Simulated CPUs.
    pub cpus: usize,
    /// Simulated NUMA nodes.
    pub nodes: usize,
    /// The batch used.
    pub batch: u64,
    /// Bound: how far `approximate` may lag below `precise`.
    pub under: u64,
    /// Bound: how far `approximate` may run above `precise`.
    pub over: u64,
    /// Largest `precise − approximate` reached by the `under` schedule.
    pub worst_under: u64,
    /// Largest `approximate − precise` reached by the `over` schedule.
    pub worst_over: u64,
    /// Largest `|approximate − precise|` over the random walks.
    pub random_worst: u64,
    /// Random-walk steps taken.
    pub random_steps: usize,
}

/// Run the simulation described by `spec`.
pub fn measure(spec: &Spec) -> Result<Record, String> {
    let worst = |side: Side| -> Result<u64, String> {
        let c = spec.build()?;
        let schedule = spec
            .config()?
            .worst_case_schedule(side)
            .map_err(|e| e.to_string())?;
        let mut oracle = 0i128;
        let mut worst = 0i128;
        for s in schedule {
            c.add_on(s.cpu, s.delta).map_err(|e| e.to_string())?;
            oracle += s.delta as i128;
            let dev = match side {
                Side::Under => oracle - c.approximate() as i128,
                Side::Over => c.approximate() as i128 - oracle,
            };
            worst = worst.max(dev);
        }
        Ok(worst as u64)
    };
    let c = spec.build()?;
    let acc = c.accuracy();
    let batch = spec.config_batch()?;
    Ok(Record {
        design: spec.design,
        cpus: spec.cpus,
        nodes: spec.nodes(),
        batch,
        under: acc.under,
        over: acc.over,
        worst_under: worst(Side::Under)?,
        worst_over: worst(Side::Over)?,
        random_worst: random_walks(&*c, spec, batch)?,
        random_steps: spec.steps,
    })
}

/// One line of `accuracy --max-error N --json`: the shape chosen for the
/// budget and what it reaches, or why no shape meets the budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    /// Design name.
    pub design: Design,
    /// Simulated CPUs.
    pub cpus: usize,
    /// Simulated NUMA nodes.
    pub nodes: usize,
    /// The budget asked for.
    pub max_error: u64,
    /// The chosen shape in words, e.g. `tree batch 2, fan-outs 2^2·2^6,
    /// bound 640 under` (`None` if refused).
    pub chosen: Option<String>,
    /// The chosen batch.
    pub batch: Option<u64>,
    /// The tree's chosen fan-outs, bottom first (empty for other designs).
    pub fanouts: Option<Vec<u64>>,
    /// The chosen shape's bound below `precise`.
    pub under: Option<u64>,
    /// The chosen shape's bound above `precise`.
    pub over: Option<u64>,
    /// What the `under` worst-case schedule reaches.
    pub worst_under: Option<u64>,
    /// What the `over` worst-case schedule reaches.
    pub worst_over: Option<u64>,
    /// Largest `|approximate − precise|` over the random walks.
    pub random_worst: Option<u64>,
    /// Why no shape meets the budget: the library's error, with the
    /// smallest bound there is.
    pub refused: Option<String>,
}

/// Choose a shape for `spec.max_error` (which must be set) and measure it
/// as [`measure`] does; a budget no shape meets is a [`Choice`] with
/// `refused`, any other configuration error an `Err`.
pub fn choose(spec: &Spec) -> Result<Choice, String> {
    let max_error = spec.max_error.ok_or("choose needs an error budget")?;
    let mut choice = Choice {
        design: spec.design,
        cpus: spec.cpus,
        nodes: spec.nodes(),
        max_error,
        chosen: None,
        batch: None,
        fanouts: None,
        under: None,
        over: None,
        worst_under: None,
        worst_over: None,
        random_worst: None,
        refused: None,
    };
    let shape = match spec.config()?.chosen() {
        Ok(shape) => shape,
        Err(e @ ConfigError::MaxErrorUnreachable { .. }) => {
            choice.refused = Some(e.to_string());
            return Ok(choice);
        }
        Err(e) => return Err(e.to_string()),
    };
    let r = measure(spec)?;
    choice.chosen = Some(shape.to_string());
    choice.batch = Some(shape.batch());
    choice.fanouts = Some(shape.fanouts());
    choice.under = Some(r.under);
    choice.over = Some(r.over);
    choice.worst_under = Some(r.worst_under);
    choice.worst_over = Some(r.worst_over);
    choice.random_worst = Some(r.random_worst);
    Ok(choice)
}

/// Walks of random CPUs and deltas up to ±2·batch, each walk biased to one
/// sign for a while (a workload that grows or shrinks), against an oracle.
fn random_walks(c: &dyn SplitCounter, spec: &Spec, batch: u64) -> Result<u64, String> {
    let mut rng = Rng::new(spec.seed);
    let span = (2 * batch.min(1 << 20)) as i64;
    let mut oracle = 0i128;
    let mut worst = 0i128;
    for step in 0..spec.steps {
        if step % 5000 == 0 {
            c.set(0);
            oracle = 0;
        }
        let cpu = (rng.next() % spec.cpus as u64) as usize;
        // Two draws in three follow the walk's current direction.
        let trend = if (step / 1000) % 2 == 0 { 1 } else { -1 };
        let magnitude = (rng.next() % (span as u64 + 1)) as i64;
        let delta = if rng.next() % 3 == 0 {
            -trend * magnitude
        } else {
            trend * magnitude
        };
        c.add_on(cpu, delta).map_err(|e| e.to_string())?;
        oracle += delta as i128;
        worst = worst.max((c.approximate() as i128 - oracle).abs());
    }
    if c.precise() as i128 != oracle {
        return Err(format!(
            "{} on {} CPUs: precise {} differs from the oracle {oracle}",
            spec.design,
            spec.cpus,
            c.precise()
        ));
    }
    Ok(worst as u64)
}

/// Print records as a table.
pub fn print_table(records: &[Record]) {
    outln!(
        "  {:<8} {:>6} {:>6} {:>7} {:>14} {:>14} {:>14} {:>14} {:>14}",
        "design",
        "cpus",
        "nodes",
        "batch",
        "under",
        "over",
        "worst_under",
        "worst_over",
        "random_worst"
    );
    for r in records {
        outln!(
            "  {:<8} {:>6} {:>6} {:>7} {:>14} {:>14} {:>14} {:>14} {:>14}",
            r.design.name(),
            r.cpus,
            r.nodes,
            r.batch,
            r.under,
            r.over,
            r.worst_under,
            r.worst_over,
            r.random_worst
        );
    }
}

/// Print choices as a table: one line per (design, CPUs), the chosen shape
/// or the refusal last.
pub fn print_choices(choices: &[Choice]) {
    if let Some(c) = choices.first() {
        outln!("  max error {} units", c.max_error);
    }
    outln!(
        "  {:<8} {:>6} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12}  chosen",
        "design",
        "cpus",
        "nodes",
        "under",
        "over",
        "worst_under",
        "worst_over",
        "random_worst"
    );
    let cell = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for c in choices {
        let what = match (&c.chosen, &c.refused) {
            (Some(shape), _) => shape.clone(),
            (None, Some(why)) => format!("refused: {why}"),
            (None, None) => String::new(),
        };
        outln!(
            "  {:<8} {:>6} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12}  {what}",
            c.design.name(),
            c.cpus,
            c.nodes,
            cell(c.under),
            cell(c.over),
            cell(c.worst_under),
            cell(c.worst_over),
            cell(c.random_worst),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulation_larger_than_the_memory_available_is_refused_with_its_size() {
        let gib = Some(1 << 30);
        let e = check_memory(Design::Tree, 1 << 20, gib).unwrap_err();
        assert!(e.contains("--cpus 1048576"), "{e}");
        assert!(e.contains("5120 MiB") && e.contains("1024 MiB"), "{e}");
        assert!(e.contains("tree design"), "{e}");
        check_memory(Design::Tree, 4096, gib).unwrap();
        check_memory(Design::Batched, 200_000, gib).unwrap();
        check_memory(Design::Batched, 210_000, gib).unwrap_err();
        // Without per-CPU slots, or without a reading, nothing is refused.
        check_memory(Design::Atomic, 1 << 20, gib).unwrap();
        check_memory(Design::PerNode, 1 << 20, gib).unwrap();
        check_memory(Design::Tree, 1 << 20, None).unwrap();
    }

    #[test]
    fn every_design_reaches_its_bound_and_random_walks_stay_inside() {
        for design in Design::ALL {
            for cpus in [1, 5, 256] {
                let mut spec = Spec::new(design, cpus);
                spec.steps = 5_000;
                let r = measure(&spec).unwrap();
                assert_eq!((r.worst_under, r.worst_over), (r.under, r.over), "{r:?}");
                assert!(r.random_worst <= r.under.max(r.over), "{r:?}");
            }
        }
    }

    #[test]
    fn a_budget_is_met_where_a_shape_can_meet_it_and_refused_elsewhere() {
        for design in Design::ALL {
            for cpus in [1, 8, 4096] {
                let mut spec = Spec::new(design, cpus);
                spec.steps = 2_000;
                spec.max_error = Some(1000);
                let c = choose(&spec).unwrap();
                if design == Design::Tree && cpus > 1000 {
                    let why = c.refused.as_deref().unwrap();
                    assert!(
                        why.contains("smallest the configuration allows is 4,096"),
                        "{why}"
                    );
                    continue;
                }
                assert_eq!(c.refused, None);
                assert!(c.worst_under.unwrap() <= 1000, "{c:?}");
                assert_eq!(c.worst_under, c.under, "{c:?}");
                assert_eq!(c.worst_over, c.over, "{c:?}");
            }
        }
    }

    #[test]
    fn four_thousand_cpus_are_simulated_quickly() {
        let start = std::time::Instant::now();
        let r = measure(&Spec::new(Design::Tree, 4096)).unwrap();
        assert_eq!(r.worst_under, r.under);
        // Not a performance assertion: a guard against an O(steps·cpus) walk.
        assert!(start.elapsed().as_secs() < 60);
    }
}
