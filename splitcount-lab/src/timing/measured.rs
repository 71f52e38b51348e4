//! What a suite's rounds measured, and the figures computed from it: a
//! ratio between two cases, a speed-up, a scaling from one thread to more —
//! each one value **per round**, then their [`Spread`].
//!
//! Multi-thread rounds whose threads did not run together
//! ([`Sample::usable`]) are left out of a figure and counted. If fewer
//! than [`MIN_ROUNDS`] usable rounds remain, the figure uses every round and
//! is marked `poor_overlap`, which makes it unstable: what it shows is the
//! scheduler, not the code.

use super::pin::{self, Placement};
use super::rounds::Plan;
use super::spread::Spread;
use super::MIN_OVERLAP;
use serde::Serialize;

/// Rounds a figure needs after poor-overlap rounds are left out (or every
/// round, if there are fewer).
pub const MIN_ROUNDS: usize = 3;

/// What one case (or role) measured in one round.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// Time per operation per thread (CPU time, see [`super::slice`]).
    pub ns_per_op: f64,
    /// Operations per second of all threads, over the slice's wall time.
    pub ops_per_sec: f64,
    /// Share of the slice in which all threads ran together.
    pub overlap: f64,
    /// Whether the overlap decides if the round counts: two or more
    /// threads, pinned to distinct CPUs.
    pub overlap_required: bool,
    /// Whether the threads were pinned.
    pub pinned: bool,
}

impl Sample {
    /// Whether this round may enter a ratio: one thread, oversubscribed,
    /// or overlap at least [`MIN_OVERLAP`].
    pub fn usable(&self) -> bool {
        !self.overlap_required || self.overlap >= MIN_OVERLAP
    }
}

/// Every round's sample of one case at one thread count, in measured order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    /// The case (or `{case}-{role}`).
    pub case: String,
    /// Threads running at once.
    pub threads: usize,
    /// One sample per round.
    pub samples: Vec<Sample>,
}

impl Series {
    /// The median sample's time per operation and operations per second,
    /// over the usable rounds (all rounds if none is usable).
    pub fn typical(&self) -> (f64, f64) {
        let usable: Vec<&Sample> = self.samples.iter().filter(|s| s.usable()).collect();
        let pick: Vec<&Sample> = if usable.is_empty() {
            self.samples.iter().collect()
        } else {
            usable
        };
        let ns: Vec<f64> = pick.iter().map(|s| s.ns_per_op).collect();
        let ops: Vec<f64> = pick.iter().map(|s| s.ops_per_sec).collect();
        (super::spread::median(&ns), super::spread::median(&ops))
    }

    /// Rounds whose overlap was too poor to use.
    pub fn poor_rounds(&self) -> usize {
        self.samples.iter().filter(|s| !s.usable()).count()
    }
}

/// A figure: one value per usable round, and what they spread over.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figure {
    /// Median, range and halves of the per-round values.
    pub spread: Spread,
    /// The per-round values, in measured order.
    pub values: Vec<f64>,
    /// Rounds left out for poor overlap.
    pub left_out: usize,
    /// Too few rounds had good overlap: every round was used, and the
    /// figure is not to be trusted.
    pub poor_overlap: bool,
    /// Measured once, not per round (a suite's extra measurement): there
    /// are no halves to compare, and it counts as stable.
    pub once: bool,
}

impl Figure {
    /// Stable halves, and enough rounds where the threads ran together (or
    /// a figure measured once).
    pub fn stable(&self) -> bool {
        !self.poor_overlap && (self.once || self.spread.stable())
    }

    /// The figure with every per-round value `x` replaced by `1 / x`
    /// (a time ratio read as a speed-up): median and halves invert, the
    /// range swaps ends.
    pub fn inverted(&self) -> Figure {
        let s = self.spread;
        Figure {
            spread: Spread {
                median: 1.0 / s.median,
                low: 1.0 / s.high,
                high: 1.0 / s.low,
                n: s.n,
                halves: (1.0 / s.halves.0, 1.0 / s.halves.1),
            },
            values: self.values.iter().map(|v| 1.0 / v).collect(),
            ..*self
        }
    }
}

/// Everything a suite's rounds measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// The suite.
    pub suite: String,
    /// Rounds and slice length.
    #[serde(skip)]
    pub plan: Plan,
    /// One series per case (or role) and thread count, in entry order.
    pub series: Vec<Series>,
    /// Where each thread count ran (`None`: more threads than CPUs, not
    /// pinned), ascending thread counts.
    #[serde(skip)]
    pub placements: Vec<(usize, Option<Placement>)>,
    /// Figures measured once rather than per round (a suite's extra
    /// measurement: bytes retained per removed group), by name and threads.
    #[serde(skip)]
    pub scalars: Vec<(String, usize, f64)>,
}

impl Measured {
    /// Gather `series` measured under `plan`, noting where each thread
    /// count ran.
    pub fn new(suite: &str, plan: Plan, series: Vec<Series>) -> Measured {
        let mut counts: Vec<usize> = series.iter().map(|s| s.threads).collect();
        counts.sort_unstable();
        counts.dedup();
        Measured {
            suite: suite.to_owned(),
            plan,
            placements: counts.into_iter().map(|t| (t, pin::placement(t))).collect(),
            series,
            scalars: Vec::new(),
        }
    }

    /// `case`'s time per operation at `threads`, in ns, round by round (the
    /// rare absolute target: a budget per operation).
    pub fn time(&self, case: &str, threads: usize) -> Option<Figure> {
        let a = self.series(case, threads)?;
        Measured::paired(a, a, |x, _| x.ns_per_op)
    }

    /// A figure measured once (see [`Measured::scalars`]), as a one-value
    /// figure.
    pub fn scalar(&self, name: &str, threads: usize) -> Option<Figure> {
        let (_, _, v) = self
            .scalars
            .iter()
            .find(|(n, t, _)| n == name && *t == threads)?;
        Some(Figure {
            spread: Spread::of(&[*v])?,
            values: vec![*v],
            left_out: 0,
            poor_overlap: false,
            once: true,
        })
    }

    /// The series of `case` at `threads`.
    pub fn series(&self, case: &str, threads: usize) -> Option<&Series> {
        self.series
            .iter()
            .find(|s| s.case == case && s.threads == threads)
    }

    /// `value(a, b)` per round over the rounds where both `a` and `b` are
    /// usable (see the module docs for too few).
    pub fn paired(
        a: &Series,
        b: &Series,
        value: impl Fn(&Sample, &Sample) -> f64,
    ) -> Option<Figure> {
        let rounds = a.samples.len().min(b.samples.len());
        let pairs: Vec<(&Sample, &Sample)> = a.samples.iter().zip(&b.samples).collect();
        let usable: Vec<f64> = pairs
            .iter()
            .filter(|(x, y)| x.usable() && y.usable())
            .map(|(x, y)| value(x, y))
            .collect();
        let (values, left_out, poor_overlap) = if usable.len() >= MIN_ROUNDS.min(rounds) {
            let left_out = rounds - usable.len();
            (usable, left_out, false)
        } else {
            let all = pairs.iter().map(|(x, y)| value(x, y)).collect();
            (all, 0, true)
        };
        Some(Figure {
            spread: Spread::of(&values)?,
            values,
            left_out,
            poor_overlap,
            once: false,
        })
    }

    /// `case`'s time per operation over `baseline`'s, both at `threads`,
    /// round by round.
    pub fn ratio(&self, case: &str, baseline: &str, threads: usize) -> Option<Figure> {
        let (a, b) = (self.series(case, threads)?, self.series(baseline, threads)?);
        Measured::paired(a, b, |x, y| x.ns_per_op / y.ns_per_op)
    }

    /// How many times `case` does more operations per thread than
    /// `baseline` at `threads`: the inverse of [`Measured::ratio`].
    pub fn speedup(&self, case: &str, baseline: &str, threads: usize) -> Option<Figure> {
        self.ratio(case, baseline, threads).map(|f| f.inverted())
    }

    /// Operations per second of `case` (wall time) over `baseline`'s, both
    /// at `threads`, round by round: what one thread got done beside
    /// another, interruptions and stalls included, which its CPU time may
    /// not count. For a role's series, the role's thread alone.
    pub fn rate(&self, case: &str, baseline: &str, threads: usize) -> Option<Figure> {
        let (a, b) = (self.series(case, threads)?, self.series(baseline, threads)?);
        Measured::paired(a, b, |x, y| x.ops_per_sec / y.ops_per_sec)
    }

    /// Throughput of `case` at `threads` over its throughput at one thread,
    /// round by round, from the time per operation of threads that ran
    /// together: `threads × ns(1) / ns(threads)`. 2.0 at two threads is
    /// perfect scaling.
    pub fn scaling(&self, case: &str, threads: usize) -> Option<Figure> {
        let (many, one) = (self.series(case, threads)?, self.series(case, 1)?);
        Measured::paired(many, one, |m, o| threads as f64 * o.ns_per_op / m.ns_per_op)
    }

    /// Where `threads` threads ran.
    pub fn placement(&self, threads: usize) -> Option<&Placement> {
        self.placements
            .iter()
            .find(|(t, _)| *t == threads)
            .and_then(|(_, p)| p.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sample(ns: f64, overlap: f64, threads: usize) -> Sample {
        Sample {
            ns_per_op: ns,
            ops_per_sec: 1e9 / ns * threads as f64,
            overlap,
            overlap_required: threads > 1,
            pinned: true,
        }
    }

    fn series(case: &str, threads: usize, values: &[(f64, f64)]) -> Series {
        Series {
            case: case.into(),
            threads,
            samples: values
                .iter()
                .map(|&(ns, o)| sample(ns, o, threads))
                .collect(),
        }
    }

    fn measured(series: Vec<Series>) -> Measured {
        let plan = Plan {
            rounds: 4,
            slice: Duration::from_millis(10),
        };
        Measured::new("test", plan, series)
    }

    #[test]
    fn a_ratio_is_the_median_of_per_round_ratios() {
        // The whole host slowed down in round 2: both sides, ratio intact.
        let m = measured(vec![
            series(
                "base",
                1,
                &[(10.0, 1.0), (10.0, 1.0), (30.0, 1.0), (10.0, 1.0)],
            ),
            series(
                "case",
                1,
                &[(20.0, 1.0), (21.0, 1.0), (60.0, 1.0), (19.0, 1.0)],
            ),
        ]);
        let f = m.ratio("case", "base", 1).unwrap();
        assert!((f.spread.median - 2.0).abs() < 1e-9, "{f:?}");
        assert_eq!((f.spread.low, f.spread.high), (1.9, 2.1));
        assert!(f.stable());
    }

    #[test]
    fn poor_overlap_rounds_are_left_out_and_counted() {
        let m = measured(vec![
            series(
                "base",
                2,
                &[(10.0, 0.95), (10.0, 0.9), (10.0, 0.3), (10.0, 0.97)],
            ),
            series(
                "case",
                2,
                &[(5.0, 0.95), (5.0, 0.95), (50.0, 0.95), (5.0, 0.96)],
            ),
        ]);
        let f = m.ratio("case", "base", 2).unwrap();
        assert_eq!(f.left_out, 1);
        assert_eq!(f.spread.n, 3);
        assert_eq!(
            f.spread.high, 0.5,
            "the round where one side ran alone is out"
        );
        assert!(!f.poor_overlap);
    }

    #[test]
    fn too_few_good_rounds_use_all_and_are_not_stable() {
        let m = measured(vec![
            series(
                "base",
                2,
                &[(10.0, 0.5), (10.0, 0.4), (10.0, 0.5), (10.0, 0.95)],
            ),
            series("case", 2, &[(5.0, 0.9), (5.0, 0.9), (5.0, 0.9), (5.0, 0.9)]),
        ]);
        let f = m.ratio("case", "base", 2).unwrap();
        assert!(f.poor_overlap);
        assert_eq!(f.spread.n, 4);
        assert!(!f.stable());
    }

    #[test]
    fn a_rate_compares_operations_per_second_not_cpu_time() {
        // Same CPU time per operation, half the operations in the same
        // wall time: the thread was interrupted half of the time.
        let mut interrupted = series("beside-noisy", 2, &[(10.0, 1.0), (10.0, 1.0)]);
        for s in &mut interrupted.samples {
            s.ops_per_sec /= 2.0;
        }
        let m = measured(vec![
            series("beside-quiet", 2, &[(10.0, 1.0), (10.0, 1.0)]),
            interrupted,
        ]);
        let rate = m.rate("beside-noisy", "beside-quiet", 2).unwrap();
        assert!((rate.spread.median - 0.5).abs() < 1e-9, "{rate:?}");
        let cost = m.ratio("beside-noisy", "beside-quiet", 2).unwrap();
        assert!((cost.spread.median - 1.0).abs() < 1e-9, "{cost:?}");
    }

    #[test]
    fn speedups_invert_ratios_and_scaling_compares_thread_counts() {
        let m = measured(vec![
            series("atomic", 2, &[(40.0, 1.0), (40.0, 1.0)]),
            series("tree", 2, &[(2.0, 1.0), (2.0, 1.0)]),
            series("tree", 1, &[(1.9, 1.0), (1.9, 1.0)]),
        ]);
        let s = m.speedup("tree", "atomic", 2).unwrap();
        assert!((s.spread.median - 20.0).abs() < 1e-9);
        let scaling = m.scaling("tree", 2).unwrap();
        assert!((scaling.spread.median - 1.9).abs() < 1e-9, "{scaling:?}");
        assert_eq!(m.ratio("tree", "missing", 2), None);
    }
}
