//! `accuracy`: bound vs observed error of every design on simulated machines.
//!
//! For one (design, CPU count) this builds the counter on a simulated
//! machine and reports its bound, the deviation reached by the design's
//! worst-case schedule on each side, and the largest |approximate − precise|
//! seen over random walks (tracked against an exact oracle, so each step
//! costs O(1) even at 4096 CPUs).

use crate::rng::Rng;
use serde::Serialize;
use splitcount::counter::{Arity, Config, Design, Side, SplitCounter};
use splitcount::cpu::{Machine, MAX_NODES};

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
        }
    }

    fn nodes(&self) -> usize {
        self.nodes
            .unwrap_or_else(|| self.cpus.div_ceil(64))
            .clamp(1, self.cpus.clamp(1, MAX_NODES))
    }

    /// The counter this spec describes, on its own simulated machine.
    pub fn build(&self) -> Result<Box<dyn SplitCounter>, String> {
        let m = Machine::simulated(self.cpus, self.nodes()).map_err(|e| e.to_string())?;
        let mut cfg = Config::new(self.design)
            .machine(&m)
            .arity(self.arity.clone());
        if let Some(b) = self.batch {
            cfg = cfg.batch(b);
        }
        cfg.build().map_err(|e| e.to_string())
    }

    fn config_batch(&self) -> Result<u64, String> {
        let m = Machine::simulated(self.cpus, self.nodes()).map_err(|e| e.to_string())?;
        let mut cfg = Config::new(self.design).machine(&m);
        if let Some(b) = self.batch {
            cfg = cfg.batch(b);
        }
        Ok(cfg.effective_batch())
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
        let mut oracle = 0i128;
        let mut worst = 0i128;
        for s in c.worst_case_schedule(side) {
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
    println!(
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
        println!(
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn four_thousand_cpus_are_simulated_quickly() {
        let start = std::time::Instant::now();
        let r = measure(&Spec::new(Design::Tree, 4096)).unwrap();
        assert_eq!(r.worst_under, r.under);
        // Not a performance assertion: a guard against an O(steps·cpus) walk.
        assert!(start.elapsed().as_secs() < 60);
    }
}
