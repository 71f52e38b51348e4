//! The watchdog case: how wrong a cheap read is, over time, while a few
//! threads map and unmap memory and the scheduler moves them around.
//!
//! This is the case that made the kernel replace `percpu_counter` for a
//! process's RSS: a handful of threads hop across many CPUs, each leaving a
//! remainder below the batch in the slot of every CPU it ran on, and a
//! watchdog (the OOM killer, a memory limit check, a monitoring agent) reads
//! the cheap value and acts on it. The remainders add up to an error that
//! grows with the number of CPUs visited, not with the number of threads.
//!
//! The simulation is deterministic and single-threaded: five simulated
//! threads on a simulated machine of 256 CPUs (4 nodes), interleaved by a
//! seeded random scheduler. Each step one thread runs; now and then it
//! migrates to a random CPU; it maps or unmaps a random number of pages —
//! mostly maps in a growing phase, mostly unmaps in a shrinking one, never
//! more than it holds — through [`SplitCounter::add_on`](splitcount::counter::SplitCounter::add_on) on its current CPU.
//! Every `sample_every` steps the watchdog reads
//! [`SplitCounter::approximate`](splitcount::counter::SplitCounter::approximate) and records its distance from the true
//! value (tracked exactly beside the counter). Every design sees the same
//! sequence of (CPU, pages): the workload does not depend on the counter.

use crate::rng::Rng;
use serde::Serialize;
use splitcount::counter::{Config, Design};
use splitcount::cpu::Machine;

/// What to simulate.
#[derive(Debug, Clone, Serialize)]
pub struct Spec {
    /// Simulated CPUs.
    pub cpus: usize,
    /// Simulated NUMA nodes.
    pub nodes: usize,
    /// Simulated threads mapping and unmapping.
    pub threads: usize,
    /// Updates in total (all threads together).
    pub steps: u64,
    /// The watchdog reads once every this many steps.
    pub sample_every: u64,
    /// A thread migrates with probability 1 in this many steps it runs.
    pub hop_every: u64,
    /// Largest number of pages one map or unmap moves.
    pub max_pages: u64,
    /// Steps per growing or shrinking phase.
    pub phase: u64,
    /// Seed of the scheduler and the workload.
    pub seed: u64,
}

impl Spec {
    /// Five threads on 256 CPUs, `steps` updates, 200 watchdog reads.
    pub fn new(steps: u64) -> Spec {
        let steps = steps.max(1);
        Spec {
            cpus: 256,
            nodes: 4,
            threads: 5,
            steps,
            sample_every: (steps / 200).max(1),
            hop_every: 16,
            max_pages: 64,
            phase: (steps / 6).max(1),
            seed: 1,
        }
    }
}

/// One watchdog read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// Updates made before this read.
    pub step: u64,
    /// The true value (pages mapped).
    pub truth: i64,
    /// What `approximate()` returned.
    pub approximate: i64,
    /// `|approximate − truth|`.
    pub error: u64,
}

/// One design's run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// The design, at its default batch on the simulated machine.
    pub design: Design,
    /// The batch used.
    pub batch: u64,
    /// Bound: how far `approximate` may lag below the truth.
    pub under: u64,
    /// Bound: how far `approximate` may run above the truth.
    pub over: u64,
    /// Largest error the watchdog saw.
    pub max_error: u64,
    /// Mean error over the watchdog's reads.
    pub mean_error: f64,
    /// Largest true value during the run (pages).
    pub max_truth: i64,
    /// Every watchdog read, in order.
    pub samples: Vec<Sample>,
}

/// One simulated thread: where it runs and what it holds.
struct Thread {
    cpu: usize,
    held: u64,
}

/// Run the workload of `spec` against `design` at its default batch.
pub fn simulate(spec: &Spec, design: Design) -> Result<Record, String> {
    let machine = Machine::simulated(spec.cpus, spec.nodes).map_err(|e| e.to_string())?;
    let config = Config::new(design).machine(&machine);
    let counter = config.build().map_err(|e| e.to_string())?;
    let accuracy = counter.accuracy();
    let mut rng = Rng::new(spec.seed);
    let mut threads: Vec<Thread> = (0..spec.threads.max(1))
        .map(|_| Thread {
            cpu: rng.below(spec.cpus as u64) as usize,
            held: 0,
        })
        .collect();
    let mut truth = 0i64;
    let mut max_truth = 0i64;
    let mut samples = Vec::with_capacity((spec.steps / spec.sample_every.max(1)) as usize);
    for step in 1..=spec.steps {
        let t = rng.below(threads.len() as u64) as usize;
        let thread = &mut threads[t];
        if rng.below(spec.hop_every.max(1)) == 0 {
            thread.cpu = rng.below(spec.cpus as u64) as usize;
        }
        let growing = (step / spec.phase.max(1)) % 2 == 0;
        // Three draws in four follow the phase.
        let map = (rng.below(4) != 0) == growing;
        let pages = 1 + rng.below(spec.max_pages.max(1));
        let delta = if map {
            thread.held += pages;
            pages as i64
        } else {
            let freed = pages.min(thread.held);
            thread.held -= freed;
            -(freed as i64)
        };
        counter
            .add_on(thread.cpu, delta)
            .map_err(|e| e.to_string())?;
        truth += delta;
        max_truth = max_truth.max(truth);
        if step % spec.sample_every.max(1) == 0 {
            let approximate = counter.approximate();
            samples.push(Sample {
                step,
                truth,
                approximate,
                error: (approximate as i128 - truth as i128).unsigned_abs() as u64,
            });
        }
    }
    if counter.precise() != truth {
        return Err(format!(
            "watchdog: {design} lost updates: precise {} differs from the truth {truth}",
            counter.precise()
        ));
    }
    let max_error = samples.iter().map(|s| s.error).max().unwrap_or(0);
    let mean_error = if samples.is_empty() {
        0.0
    } else {
        samples.iter().map(|s| s.error as f64).sum::<f64>() / samples.len() as f64
    };
    Ok(Record {
        design,
        batch: config.effective_batch(),
        under: accuracy.under,
        over: accuracy.over,
        max_error,
        mean_error,
        max_truth,
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let spec = Spec::new(5_000);
        let a = simulate(&spec, Design::Batched).unwrap();
        let b = simulate(&spec, Design::Batched).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.samples.len(), 200);
    }

    #[test]
    fn every_design_sees_the_same_truth_and_stays_inside_its_bound() {
        let spec = Spec::new(20_000);
        let runs: Vec<Record> = Design::ALL
            .iter()
            .map(|&d| simulate(&spec, d).unwrap())
            .collect();
        for r in &runs {
            let truths: Vec<i64> = r.samples.iter().map(|s| s.truth).collect();
            let first: Vec<i64> = runs[0].samples.iter().map(|s| s.truth).collect();
            assert_eq!(truths, first, "{} saw another workload", r.design);
            assert!(r.max_error <= r.under.max(r.over), "{r:?}");
            assert!(r.max_truth > 0);
        }
        assert_eq!(runs[0].max_error, 0, "the atomic counter is exact");
    }

    #[test]
    fn batched_drifts_further_than_the_tree() {
        let spec = Spec::new(50_000);
        let batched = simulate(&spec, Design::Batched).unwrap();
        let tree = simulate(&spec, Design::Tree).unwrap();
        assert!(
            batched.max_error > tree.max_error,
            "{} vs {}",
            batched.max_error,
            tree.max_error
        );
    }
}
