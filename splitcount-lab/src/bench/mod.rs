//! The benchmark suites and what they report: every suite builds
//! [`Entry`]s (a case at a thread count), times them in interleaved rounds
//! with [`crate::timing`], and turns the rounds into one [`Record`] per
//! case and thread count.
//!
//! A record's `ratio` is the median of the per-round ratios to its
//! baseline measured in the same round, `low`–`high` their range, and
//! `stable` whether the two halves of the rounds agree within 10%; its
//! `ns_per_op` (the median round's) is there for scale, never compared
//! across runs.

pub mod alloc;
pub mod bare_rseq;
pub mod charge;
pub mod counters;
pub mod cpu_id;
pub mod fault;
pub mod ffi;
pub mod groups;
pub mod jobs;
pub mod layout;
pub mod noisy;
pub mod percpu;
pub mod preload;
pub mod preloaded;
pub mod recorders;
pub mod redis;
pub mod requests;
pub mod stats;
pub mod striped;
pub mod worker;

use crate::timing::{Figure, Measured, Spread};
use serde::Serialize;
use std::time::Duration;

pub use crate::timing::Entry;

/// The suites of `bench`, in the order the CLI lists them.
pub const SUITES: [&str; 14] = [
    "cpu-id", "percpu", "counters", "charge", "fault", "stats", "alloc", "async", "groups",
    "metrics", "layout", "ffi", "preload", "noisy",
];

/// One case of a suite at a thread count, over all rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// The suite (`cpu-id`, `counters`, ...).
    pub suite: String,
    /// The case inside the suite.
    pub case: String,
    /// Threads running the case at once.
    pub threads: usize,
    /// Time of one operation on one thread (CPU time), in the median round.
    pub ns_per_op: f64,
    /// Operations completed per second by all threads together (wall
    /// time), in the median round.
    pub ops_per_sec: f64,
    /// Median over rounds of `ns_per_op` ÷ the baseline's in the same round
    /// (in `noisy`, a `*-healthy` row's is its `ops_per_sec` ÷ the
    /// baseline's: see [`noisy`]; in `fault`, faults per second per thread
    /// ÷ the baseline's, the inverse: see [`fault`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// The case `ratio` is relative to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// The smallest per-round ratio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low: Option<f64>,
    /// The largest per-round ratio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high: Option<f64>,
    /// Rounds that entered the figures.
    pub rounds: usize,
    /// Rounds left out because the threads did not run together.
    pub left_out: usize,
    /// Too few rounds had the threads running together: every round was
    /// used, and the ratio is not stable.
    pub poor_overlap: bool,
    /// Whether the two halves of the rounds agree within 10% (on the
    /// ratio, or on `ns_per_op` without a baseline).
    pub stable: bool,
    /// Median share of a round in which all threads ran together (one
    /// thread: the share it was on a CPU).
    pub overlap: f64,
    /// Whether the threads were pinned, one per CPU.
    pub pinned: bool,
    /// The per-round ratios that entered `ratio`, in measured order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub round_ratios: Vec<f64>,
    /// `groups` only: bytes of RSS retained per removed group at this
    /// thread count (see `bench::groups`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retained_bytes_per_group: Option<f64>,
}

impl Record {
    /// Make `figure`, a per-round comparison with `baseline`, the record's
    /// ratio: its median, range, rounds and stability.
    pub fn set_figure(&mut self, figure: Figure, baseline: String) {
        self.ratio = Some(figure.spread.median);
        self.low = Some(figure.spread.low);
        self.high = Some(figure.spread.high);
        self.rounds = figure.spread.n;
        self.left_out = figure.left_out;
        self.poor_overlap = figure.poor_overlap;
        self.stable = figure.stable();
        self.round_ratios = figure.values;
        self.baseline = Some(baseline);
    }
}

/// A suite's rounds and the records made of them.
#[derive(Debug, Clone)]
pub struct Bench {
    /// Every round of every case, for figures beyond the records (the
    /// report's verdicts).
    pub measured: Measured,
    /// One record per case and thread count, in entry order.
    pub records: Vec<Record>,
    /// What the suite's figures mean where the common notes do not say
    /// (shown first among the notes).
    pub legend: Vec<String>,
}

impl Bench {
    /// Records of `measured`, each case's ratio taken to the case
    /// `baseline_of` names (at the same thread count).
    pub fn new(measured: Measured, baseline_of: impl Fn(&str) -> Option<String>) -> Bench {
        let records = measured
            .series
            .iter()
            .map(|s| {
                let (ns_per_op, ops_per_sec) = s.typical();
                let overlaps: Vec<f64> = s.samples.iter().map(|x| x.overlap).collect();
                let mut r = Record {
                    suite: measured.suite.clone(),
                    case: s.case.clone(),
                    threads: s.threads,
                    ns_per_op,
                    ops_per_sec,
                    ratio: None,
                    baseline: None,
                    low: None,
                    high: None,
                    rounds: s.samples.len() - s.poor_rounds(),
                    left_out: s.poor_rounds(),
                    poor_overlap: false,
                    stable: false,
                    overlap: crate::timing::spread::median(&overlaps),
                    pinned: s.samples.iter().all(|x| x.pinned),
                    round_ratios: Vec::new(),
                    retained_bytes_per_group: None,
                };
                let figure = baseline_of(&s.case)
                    .and_then(|b| Some((measured.ratio(&s.case, &b, s.threads)?, b)));
                match figure {
                    Some((f, b)) => r.set_figure(f, b),
                    None => {
                        // An absolute figure takes the ratios' rule: the
                        // usable rounds, or every round (and unstable) if
                        // fewer than `MIN_ROUNDS` are.
                        let usable: Vec<f64> = s
                            .samples
                            .iter()
                            .filter(|x| x.usable())
                            .map(|x| x.ns_per_op)
                            .collect();
                        let least = crate::timing::measured::MIN_ROUNDS.min(s.samples.len());
                        if usable.len() >= least {
                            r.stable = Spread::of(&usable).is_some_and(|sp| sp.stable());
                        } else {
                            r.rounds = s.samples.len();
                            r.left_out = 0;
                            r.poor_overlap = true;
                            r.stable = false;
                        }
                    }
                }
                r
            })
            .collect();
        Bench {
            measured,
            records,
            legend: Vec::new(),
        }
    }

    /// What a reader needs to judge the figures: rounds, pinning, rounds
    /// left out and which ratios are unstable.
    pub fn notes(&self) -> Vec<String> {
        let plan = self.measured.plan;
        let mut notes = self.legend.clone();
        notes.push(format!(
            "{} interleaved rounds of {} per case; × is the median of per-round ratios \
             to the baseline of the same round, [low–high] their range",
            plan.rounds,
            duration(plan.slice)
        ));
        let cpus = crate::timing::pin::allowed_cpus().len();
        for (threads, placement) in &self.measured.placements {
            notes.push(match placement {
                Some(p) => format!(
                    "{threads} thread{}: pinned to {}",
                    if *threads == 1 { "" } else { "s" },
                    p.describe()
                ),
                None => format!(
                    "{threads} threads: more than the {cpus} CPU{} this process may use — not \
                     pinned, overlap not checked",
                    if cpus == 1 { "" } else { "s" }
                ),
            });
        }
        let multi: Vec<&crate::timing::Series> = self
            .measured
            .series
            .iter()
            .filter(|s| s.samples.iter().any(|x| x.overlap_required))
            .collect();
        if !multi.is_empty() {
            let poor: usize = multi.iter().map(|s| s.poor_rounds()).sum();
            let total: usize = multi.iter().map(|s| s.samples.len()).sum();
            // Ratios only: a baseline's own record (× 1 by definition) is
            // not one, as in `stability`.
            let fallback = self
                .records
                .iter()
                .filter(|r| r.poor_overlap && r.baseline.as_deref() != Some(&r.case))
                .count();
            notes.push(format!(
                "pinned multi-thread slices whose threads ran together less than {:.0}% of \
                 the slice: {poor} of {total}, left out of ratios{}",
                crate::timing::MIN_OVERLAP * 100.0,
                if fallback > 0 {
                    format!(
                        "; {fallback} ratio(s) had fewer than {} good rounds left and use \
                         every round (marked †): the host was busy",
                        crate::timing::measured::MIN_ROUNDS
                    )
                } else {
                    String::new()
                }
            ));
        }
        notes.push(self.stability());
        notes
    }

    /// "stable: all 24 ratios …" or the list of unstable ones.
    pub fn stability(&self) -> String {
        // The ratios, or in a suite of absolute figures (`groups`: no
        // baseline) the figures themselves.
        let absolute = self.records.iter().all(|r| r.baseline.is_none());
        let with_ratio: Vec<&Record> = self
            .records
            .iter()
            .filter(|r| (absolute || r.ratio.is_some()) && r.baseline.as_deref() != Some(&r.case))
            .collect();
        let what = if absolute { "figures" } else { "ratios" };
        let unstable: Vec<String> = with_ratio
            .iter()
            .filter(|r| !r.stable)
            .map(|r| format!("{} at {}", r.case, threads(r.threads)))
            .collect();
        if unstable.is_empty() {
            format!(
                "stable: all {} {what}' two halves of rounds agree within 10%",
                with_ratio.len()
            )
        } else {
            format!(
                "UNSTABLE (halves of rounds differ by more than 10%, or too few rounds ran \
                 together), marked †: {} of {} {what} — {}",
                unstable.len(),
                with_ratio.len(),
                unstable.join(", ")
            )
        }
    }
}

/// "1 thread", "2 threads".
pub fn threads(n: usize) -> String {
    format!("{n} thread{}", if n == 1 { "" } else { "s" })
}

/// "80 ms", "1.5 s".
pub fn duration(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Print records as JSON lines.
pub fn print_json(records: &[Record]) {
    for r in records {
        outln!("{}", serde_json::to_string(r).expect("records serialize"));
    }
}

/// Print a suite's records as a table, with its notes under it.
pub fn print_table(bench: &Bench) {
    let records = &bench.records;
    let Some(first) = records.first() else {
        return;
    };
    outln!("suite {}", first.suite);
    outln!(
        "  {:<32} {:>7} {:>12} {:>16} {:>10} {:>17}",
        "case",
        "threads",
        "ns/op",
        "ops/s",
        "× baseline",
        "[low–high]"
    );
    for r in records {
        let (ratio, range) = match (r.ratio, r.low, r.high) {
            _ if r.baseline.as_deref() == Some(&r.case) => ("1".into(), "(baseline)".into()),
            (Some(x), Some(lo), Some(hi)) => (
                format!("{x:.3}{}", if r.stable { "" } else { "†" }),
                format!("[{lo:.3}–{hi:.3}]"),
            ),
            // No ratio (a suite of absolute figures): the figure itself
            // carries the mark.
            _ => ("-".into(), String::new()),
        };
        let ns = format!(
            "{:.2}{}",
            r.ns_per_op,
            if r.ratio.is_none() && !r.stable {
                "†"
            } else {
                ""
            }
        );
        outln!(
            "  {:<32} {:>7} {:>12} {:>16.0} {:>10} {:>17}  {}",
            r.case,
            r.threads,
            ns,
            r.ops_per_sec,
            ratio,
            range,
            r.baseline.as_deref().unwrap_or("")
        );
    }
    for n in bench.notes() {
        outln!("  {n}");
    }
}

/// Parse `1,2,4,8` into thread counts.
pub fn parse_threads(s: &str) -> Result<Vec<usize>, String> {
    // A count given twice is measured once (`parse_list` keeps the first).
    crate::parse_list(
        s,
        "thread count",
        "a number from 1 to 1024, e.g. 1,2,4,8",
        |t| t.parse().ok().filter(|n| (1..=1024).contains(n)),
    )
}
