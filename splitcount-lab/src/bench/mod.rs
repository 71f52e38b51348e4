//! Benchmark machinery shared by every suite: a timed multi-thread loop and
//! the record every measurement is reported as.

pub mod alloc;
pub mod charge;
pub mod counters;
pub mod cpu_id;
pub mod layout;
pub mod percpu;
pub mod stats;
pub mod striped;

use serde::Serialize;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// One measurement: a case of a suite at a thread count.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// The suite (`cpu-id`, `counters`, ...).
    pub suite: String,
    /// The case inside the suite.
    pub case: String,
    /// Threads running the case at once.
    pub threads: usize,
    /// Average time of one operation on one thread.
    pub ns_per_op: f64,
    /// Operations completed per second by all threads together.
    pub ops_per_sec: f64,
    /// `ns_per_op` divided by the baseline's at the same thread count, when
    /// the suite has a baseline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// The case `ratio` is relative to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
}

/// Operations between two looks at the stop flag: large enough that the
/// look costs nothing, small enough that threads stop promptly.
const BATCH: u64 = 1024;

/// Run `op` on `threads` threads for about `duration`. `make(t)` builds
/// thread `t`'s operation (its private state lives in the closure).
pub fn measure<M, F>(suite: &str, case: &str, threads: usize, duration: Duration, make: M) -> Record
where
    M: Fn(usize) -> F + Sync,
    F: FnMut(),
{
    let threads = threads.max(1);
    let (per_thread, wall) = run_threads(threads, duration, make);
    let ops: u64 = per_thread.iter().map(|r| r.0).sum();
    let busy: Duration = per_thread.iter().map(|r| r.1).sum();
    let record = record(suite, case, threads, ops, busy, wall);
    observe(&record);
    record
}

/// Run one thread per case at once, for about `duration`: thread `t` runs
/// `make(t)` and is reported as `cases[t]`, each record with the thread
/// count of the whole run. For workloads whose threads play different roles
/// (one writes, another reads), where an average over roles would hide what
/// each one pays.
pub fn measure_roles<M, F>(suite: &str, cases: &[&str], duration: Duration, make: M) -> Vec<Record>
where
    M: Fn(usize) -> F + Sync,
    F: FnMut(),
{
    let threads = cases.len().max(1);
    let (per_thread, wall) = run_threads(threads, duration, make);
    let records: Vec<Record> = cases
        .iter()
        .zip(per_thread)
        .map(|(case, (ops, busy))| record(suite, case, threads, ops, busy, wall))
        .collect();
    records.iter().for_each(observe);
    records
}

fn record(
    suite: &str,
    case: &str,
    threads: usize,
    ops: u64,
    busy: Duration,
    wall: Duration,
) -> Record {
    let ops = ops.max(1) as f64;
    Record {
        suite: suite.to_owned(),
        case: case.to_owned(),
        threads,
        ns_per_op: busy.as_nanos() as f64 / ops,
        ops_per_sec: ops / wall.as_secs_f64(),
        ratio: None,
        baseline: None,
    }
}

/// The timed loop: each thread's (operations, busy time), and the wall time
/// from the common start to the last join.
fn run_threads<M, F>(
    threads: usize,
    duration: Duration,
    make: M,
) -> (Vec<(u64, Duration)>, Duration)
where
    M: Fn(usize) -> F + Sync,
    F: FnMut(),
{
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, barrier, make) = (&stop, &barrier, &make);
                s.spawn(move || {
                    let mut op = make(t);
                    barrier.wait();
                    let start = Instant::now();
                    let mut ops = 0u64;
                    // Relaxed: the flag only ends the loop; no data rides on it.
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..BATCH {
                            op();
                        }
                        ops += BATCH;
                    }
                    (ops, start.elapsed())
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let results: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().expect("bench thread"))
            .collect();
        (results, start.elapsed())
    })
}

type Observer = Box<dyn Fn(&Record)>;

thread_local! {
    static OBSERVER: RefCell<Option<Observer>> = const { RefCell::new(None) };
}

/// Run `f`, calling `observer` with every record that [`measure`] and
/// [`measure_roles`] produce on this thread meanwhile (the report advances
/// its progress bars this way, without a parameter through every suite).
pub fn observed<R>(observer: impl Fn(&Record) + 'static, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Observer>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            OBSERVER.with(|o| *o.borrow_mut() = previous);
        }
    }
    let previous = OBSERVER.with(|o| o.borrow_mut().replace(Box::new(observer)));
    let _restore = Restore(previous);
    f()
}

fn observe(record: &Record) {
    OBSERVER.with(|o| {
        if let Some(observer) = o.borrow().as_ref() {
            observer(record);
        }
    });
}

/// Fill `ratio` and `baseline` of every record from the `baseline` case at
/// the same thread count.
pub fn set_ratios(records: &mut [Record], baseline: &str) {
    let base: Vec<(usize, f64)> = records
        .iter()
        .filter(|r| r.case == baseline)
        .map(|r| (r.threads, r.ns_per_op))
        .collect();
    for r in records.iter_mut() {
        if let Some(&(_, b)) = base.iter().find(|(t, _)| *t == r.threads) {
            r.ratio = Some(r.ns_per_op / b);
            r.baseline = Some(baseline.to_owned());
        }
    }
}

/// Print records as JSON lines.
pub fn print_json(records: &[Record]) {
    for r in records {
        println!("{}", serde_json::to_string(r).expect("records serialize"));
    }
}

/// Print records as a table.
pub fn print_table(records: &[Record]) {
    let Some(first) = records.first() else {
        return;
    };
    let baseline = records.iter().find_map(|r| r.baseline.clone());
    println!("suite {}", first.suite);
    println!(
        "  {:<22} {:>7} {:>12} {:>16} {:>10}",
        "case",
        "threads",
        "ns/op",
        "ops/s",
        match &baseline {
            Some(b) => format!("x {b}"),
            None => "ratio".to_owned(),
        }
    );
    for r in records {
        let ratio = r
            .ratio
            .map(|x| format!("{x:.3}"))
            .unwrap_or_else(|| "-".into());
        println!(
            "  {:<22} {:>7} {:>12.2} {:>16.0} {:>10}",
            r.case, r.threads, r.ns_per_op, r.ops_per_sec, ratio
        );
    }
}

/// Parse `1,2,4,8` into thread counts.
pub fn parse_threads(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|t| match t.trim().parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => Err(format!("thread count {t:?} is not a number from 1 to 1024")),
        })
        .collect()
}
