//! One slice: an operation run on some threads at once for a short, fixed
//! wall time — the unit the rounds of [`super::rounds`] are made of.
//!
//! Each thread builds its operation (untimed), waits at the start line
//! (`StartLine`), then runs the operation in batches (at least one) until the controller raises
//! the stop flag, recording for its loop: the operations done, when the loop started
//! and stopped (wall clock) and the CPU time it used
//! ([`super::clock::thread_cpu_time`]). A *prepared* operation has an
//! untimed preparation before each call (the 10 updates before a flush):
//! its calls are then timed one by one with the wall clock and only they
//! count, less what reading the clock costs: each batch also times as many
//! empty regions (two clock reads and nothing between: tens of nanoseconds
//! in a virtual machine) and takes the least of them out per call, so the
//! figure is the calls' own, as the batch loops' CPU time is.
//!
//! What a slice reports:
//!
//! - **time per operation**: CPU time ÷ operations, summed over the
//!   threads (wall time of the calls for prepared operations). A thread
//!   that was preempted is not charged for the time it waited.
//! - **overlap**: the share of the slice in which *all* threads were
//!   running together, estimated as
//!   `(min stop − max start) / (max stop − min start)`, the part of the
//!   slice every loop covered, times the smallest `CPU time / loop time` of
//!   a thread, the share of its loop it was on a CPU. 1.0 when every
//!   thread ran alone on its own CPU for the whole slice; about 0.5 when two
//!   threads time-shared one CPU. A multi-thread ratio is only meaningful
//!   for rounds where this is high ([`super::MIN_OVERLAP`]).

use super::clock::thread_cpu_time;
use super::pin;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a slice runs and how many operations a thread runs between two
/// looks at the stop flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceSpec {
    /// Wall time from the common start to the stop flag.
    pub length: Duration,
    /// Operations per batch (≥ 1).
    pub batch: u64,
}

/// What one thread measured in one slice. Times are nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadRun {
    /// Operations completed.
    pub ops: u64,
    /// When its loop started, after the slice's origin.
    pub start_ns: u64,
    /// When its loop stopped, after the slice's origin.
    pub stop_ns: u64,
    /// CPU time the loop used (`None`: no thread CPU clock here).
    pub cpu_ns: Option<u64>,
    /// For prepared operations: wall time of the calls alone, less the
    /// clock's own cost (the least of as many empty timed regions, per
    /// call).
    pub timed_ns: Option<u64>,
}

impl ThreadRun {
    /// Wall time of the loop.
    pub fn wall_ns(&self) -> u64 {
        self.stop_ns.saturating_sub(self.start_ns)
    }

    /// The time its operations cost: the calls' own time for prepared
    /// operations, else CPU time, else (no CPU clock) wall time.
    pub fn busy_ns(&self) -> u64 {
        self.timed_ns
            .or(self.cpu_ns)
            .unwrap_or_else(|| self.wall_ns())
    }

    /// Share of its loop the thread spent on a CPU (1.0 without a CPU
    /// clock: nothing tells otherwise).
    pub fn on_cpu(&self) -> f64 {
        match self.cpu_ns {
            Some(cpu) if self.wall_ns() > 0 => (cpu as f64 / self.wall_ns() as f64).min(1.0),
            _ => 1.0,
        }
    }
}

/// What one slice measured: one [`ThreadRun`] per thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SliceRun {
    /// Thread `t`'s run at index `t`.
    pub threads: Vec<ThreadRun>,
    /// The kernel CPU of each thread, when they were pinned.
    pub pinned: Option<Vec<usize>>,
}

impl SliceRun {
    /// Time per operation per thread: the threads' busy time over their
    /// operations.
    pub fn ns_per_op(&self) -> f64 {
        let busy: u64 = self.threads.iter().map(ThreadRun::busy_ns).sum();
        let ops: u64 = self.threads.iter().map(|t| t.ops).sum();
        busy as f64 / ops.max(1) as f64
    }

    /// Time per operation of thread `t` alone (its role's cost).
    pub fn thread_ns_per_op(&self, t: usize) -> f64 {
        self.threads
            .get(t)
            .map_or(f64::NAN, |r| r.busy_ns() as f64 / r.ops.max(1) as f64)
    }

    /// Operations per second of thread `t` alone, over the slice's wall
    /// time.
    pub fn thread_ops_per_sec(&self, t: usize) -> f64 {
        self.threads.get(t).map_or(f64::NAN, |r| {
            r.ops as f64 / (self.span_ns().max(1) as f64 / 1e9)
        })
    }

    /// Operations per second of all threads together, over the slice's wall
    /// time.
    pub fn ops_per_sec(&self) -> f64 {
        let ops: u64 = self.threads.iter().map(|t| t.ops).sum();
        ops as f64 / (self.span_ns().max(1) as f64 / 1e9)
    }

    /// Wall time from the first loop's start to the last one's stop.
    pub fn span_ns(&self) -> u64 {
        let start = self.threads.iter().map(|t| t.start_ns).min().unwrap_or(0);
        let stop = self.threads.iter().map(|t| t.stop_ns).max().unwrap_or(0);
        stop.saturating_sub(start)
    }

    /// The share of the slice in which every thread ran at once (see the
    /// module docs): 0.0 to 1.0.
    pub fn overlap(&self) -> f64 {
        let latest_start = self.threads.iter().map(|t| t.start_ns).max().unwrap_or(0);
        let earliest_stop = self.threads.iter().map(|t| t.stop_ns).min().unwrap_or(0);
        let common = earliest_stop.saturating_sub(latest_start) as f64;
        let span = self.span_ns().max(1) as f64;
        let on_cpu = self
            .threads
            .iter()
            .map(ThreadRun::on_cpu)
            .fold(1.0, f64::min);
        (common / span * on_cpu).clamp(0.0, 1.0)
    }
}

/// A thread's timed loop: run `batch` operations; when the operation is
/// prepared, add the time of the calls alone to `timed.calls` and that of
/// as many empty timed regions to `timed.clock`.
trait Body {
    fn run_batch(&mut self, batch: u64, timed: &mut Timed);
}

/// What the timed regions of a prepared operation measured.
#[derive(Default)]
struct Timed {
    /// The regions around the calls.
    calls: Duration,
    /// The least of as many regions with nothing in them, once per call:
    /// what reading the clock around a call costs by itself.
    clock: Duration,
}

impl Timed {
    /// The calls' own time: the regions around them less the clock's cost.
    fn net(&self) -> Duration {
        self.calls.saturating_sub(self.clock)
    }
}

struct Plain<F>(F);

impl<F: FnMut()> Body for Plain<F> {
    #[inline(always)]
    fn run_batch(&mut self, batch: u64, _timed: &mut Timed) {
        for _ in 0..batch {
            (self.0)();
        }
    }
}

struct Prepared<P, F> {
    prepare: P,
    op: F,
}

impl<P: FnMut(), F: FnMut()> Body for Prepared<P, F> {
    #[inline(always)]
    fn run_batch(&mut self, batch: u64, timed: &mut Timed) {
        for _ in 0..batch {
            (self.prepare)();
            let t = Instant::now();
            (self.op)();
            timed.calls += t.elapsed();
        }
        // The same regions with nothing in them, after the calls (not
        // between a preparation and its call, which would change what the
        // call finds in the caches). The least of them stands for each: a
        // region the thread was preempted in would take milliseconds out
        // of the calls' time; the least leaves in only the clock's jitter
        // above it (a few nanoseconds), never takes out more than it cost.
        let mut least = Duration::MAX;
        for _ in 0..batch {
            let t = std::hint::black_box(Instant::now());
            least = least.min(t.elapsed());
        }
        timed.clock += least.saturating_mul(u32::try_from(batch).unwrap_or(u32::MAX));
    }
}

/// An operation that runs a whole batch itself: `f(n)` does `n`
/// operations (a loop in C, for `bench ffi`).
struct Looped<F>(F);

impl<F: FnMut(u64)> Body for Looped<F> {
    #[inline(always)]
    fn run_batch(&mut self, batch: u64, _timed: &mut Timed) {
        (self.0)(batch);
    }
}

/// Run `make(t)`'s looped operation (`f(n)` runs `n` operations) on
/// `threads` threads for one slice.
pub fn run_looped<M, F>(threads: usize, spec: SliceSpec, make: &M) -> SliceRun
where
    M: Fn(usize) -> F + Sync,
    F: FnMut(u64),
{
    run_bodies(threads, spec, &|t| Looped(make(t)), false)
}

/// Run `make(t)`'s operation on `threads` threads for one slice.
pub fn run<M, F>(threads: usize, spec: SliceSpec, make: &M) -> SliceRun
where
    M: Fn(usize) -> F + Sync,
    F: FnMut(),
{
    run_bodies(threads, spec, &|t| Plain(make(t)), false)
}

/// Run a prepared operation: `make(t)` returns `(prepare, op)`; `prepare`
/// runs untimed before every `op`, and only the calls of `op` are timed.
pub fn run_prepared<M, P, F>(threads: usize, spec: SliceSpec, make: &M) -> SliceRun
where
    M: Fn(usize) -> (P, F) + Sync,
    P: FnMut(),
    F: FnMut(),
{
    run_bodies(
        threads,
        spec,
        &|t| {
            let (prepare, op) = make(t);
            Prepared { prepare, op }
        },
        true,
    )
}

/// Where a slice's threads wait for each other before their loops: each
/// arrives and yields its CPU until the controller, once all have arrived,
/// says go.
///
/// Not `std::sync::Barrier` (a mutex and a condition variable): with more
/// threads than CPUs, every thread it woke had to take its mutex in turn,
/// each hand-over waiting for a time slice while the threads already
/// started spun in their loops on every CPU — `bench counters --threads
/// 64` took 22 s on 2 CPUs for 0.4 s of measuring, and 1,024 threads did
/// not finish in a minute. Here nobody sleeps: a waiting thread gives its
/// CPU back with `sched_yield` (at once when it has no one to give it to),
/// so the last to arrive and the controller get a CPU within a few turns
/// of the others, and the threads leave the line within one look at the
/// flag of each other.
#[derive(Default)]
struct StartLine {
    arrived: AtomicUsize,
    go: AtomicBool,
}

impl StartLine {
    /// A thread's arrival; returns when the controller says go.
    fn arrive_and_wait(&self) {
        // Release/Acquire: nothing rides on these flags but the start
        // itself; the orderings keep the arrival after the thread's set-up
        // and the loop after the go, as a barrier would.
        self.arrived.fetch_add(1, Ordering::Release);
        while !self.go.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }

    /// The controller: wait for `threads` arrivals, then say go.
    fn start_when_all(&self, threads: usize) {
        while self.arrived.load(Ordering::Acquire) < threads {
            std::thread::yield_now();
        }
        self.go.store(true, Ordering::Release);
    }
}

fn run_bodies<M, B>(threads: usize, spec: SliceSpec, make: &M, prepared: bool) -> SliceRun
where
    M: Fn(usize) -> B + Sync,
    B: Body,
{
    let threads = threads.max(1);
    let batch = spec.batch.max(1);
    let placement = pin::placement(threads);
    let all_pinned = AtomicBool::new(placement.is_some());
    let stop = AtomicBool::new(false);
    let start_line = StartLine::default();
    let origin = Instant::now();
    let since = |t: Instant| t.saturating_duration_since(origin).as_nanos() as u64;
    let runs = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, start_line, placement, all_pinned) =
                    (&stop, &start_line, &placement, &all_pinned);
                s.spawn(move || {
                    if let Some(p) = placement {
                        if !pin::pin_current(p.cpus[t]) {
                            // Relaxed: read after the join, which orders it.
                            all_pinned.store(false, Ordering::Relaxed);
                        }
                    }
                    let mut body = make(t);
                    let mut timed = Timed::default();
                    start_line.arrive_and_wait();
                    let cpu0 = thread_cpu_time();
                    let start = Instant::now();
                    let mut ops = 0u64;
                    // At least one batch, even if the thread started late
                    // on a busy host: a slice never has zero operations.
                    loop {
                        body.run_batch(batch, &mut timed);
                        ops += batch;
                        // Relaxed: the flag only ends the loop; no data
                        // rides on it.
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                    let end = Instant::now();
                    let cpu1 = thread_cpu_time();
                    drop(body);
                    ThreadRun {
                        ops,
                        start_ns: since(start),
                        stop_ns: since(end),
                        cpu_ns: cpu0.zip(cpu1).map(|(a, b)| (b - a).as_nanos() as u64),
                        timed_ns: prepared.then_some(timed.net().as_nanos() as u64),
                    }
                })
            })
            .collect();
        start_line.start_when_all(threads);
        std::thread::sleep(spec.length);
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| w.join().expect("a bench thread panicked"))
            .collect::<Vec<_>>()
    });
    SliceRun {
        threads: runs,
        pinned: placement
            .filter(|_| all_pinned.load(Ordering::Relaxed))
            .map(|p| p.cpus),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(start_ns: u64, stop_ns: u64, cpu_ns: u64) -> ThreadRun {
        ThreadRun {
            ops: 100,
            start_ns,
            stop_ns,
            cpu_ns: Some(cpu_ns),
            timed_ns: None,
        }
    }

    #[test]
    fn two_threads_running_together_the_whole_slice_overlap_fully() {
        let s = SliceRun {
            threads: vec![run_of(0, 1000, 1000), run_of(0, 1000, 1000)],
            pinned: None,
        };
        assert_eq!(s.overlap(), 1.0);
        assert_eq!(s.ns_per_op(), 10.0);
    }

    #[test]
    fn threads_sharing_one_cpu_overlap_about_half() {
        // Both loops cover the slice, but each ran only half of it.
        let s = SliceRun {
            threads: vec![run_of(0, 1000, 500), run_of(0, 1000, 500)],
            pinned: None,
        };
        assert!((s.overlap() - 0.5).abs() < 1e-9, "{}", s.overlap());
        // Time per op counts CPU time only: what the operations cost.
        assert_eq!(s.ns_per_op(), 5.0);
    }

    #[test]
    fn a_thread_that_started_late_shortens_the_overlap() {
        let s = SliceRun {
            threads: vec![run_of(0, 1000, 1000), run_of(600, 1000, 400)],
            pinned: None,
        };
        assert!((s.overlap() - 0.4).abs() < 1e-9, "{}", s.overlap());
    }

    #[test]
    fn a_slice_runs_every_thread_and_counts_its_operations() {
        let spec = SliceSpec {
            length: Duration::from_millis(20),
            batch: 64,
        };
        let s = run(2, spec, &|t| {
            let mut x = t as u64;
            move || x = std::hint::black_box(x.wrapping_add(1))
        });
        assert_eq!(s.threads.len(), 2);
        for t in &s.threads {
            assert!(t.ops >= 64 && t.ops % 64 == 0, "{t:?}");
            assert!(t.wall_ns() >= 10_000_000, "{t:?}");
        }
        assert!(s.ns_per_op() > 0.0);
    }

    #[test]
    fn prepared_operations_count_only_the_timed_calls() {
        let spec = SliceSpec {
            length: Duration::from_millis(20),
            batch: 1,
        };
        let s = run_prepared(1, spec, &|_| {
            (
                || std::thread::sleep(Duration::from_micros(200)),
                || {
                    std::hint::black_box(1);
                },
            )
        });
        let t = s.threads[0];
        let timed = t.timed_ns.unwrap();
        assert!(t.ops > 0);
        // The sleeps are most of the loop; the timed calls a tiny part.
        assert!(timed * 10 < t.wall_ns(), "{t:?}");
    }

    #[test]
    fn the_clocks_own_cost_is_taken_out_of_prepared_calls() {
        let spec = SliceSpec {
            length: Duration::from_millis(5),
            batch: 256,
        };
        // An empty call: all its timed region measures is the clock. What
        // is left once the clock's cost is taken out is about nothing; the
        // least of nine short slices, so that preemptions (tests run side
        // by side on a busy machine) in some of them do not decide.
        let per_call = (0..9)
            .map(|_| {
                let s = run_prepared(1, spec, &|_| (|| {}, || {}));
                let t = s.threads[0];
                t.timed_ns.unwrap() as f64 / t.ops as f64
            })
            .fold(f64::INFINITY, f64::min);
        // A clock read pair alone, timed the same way.
        let n = 100_000u32;
        let start = Instant::now();
        for _ in 0..n {
            std::hint::black_box(std::hint::black_box(Instant::now()).elapsed());
        }
        let clock = start.elapsed().as_nanos() as f64 / f64::from(n);
        assert!(
            per_call < clock / 4.0,
            "{per_call} ns per empty call, the clock {clock} ns"
        );
    }

    #[test]
    fn the_net_time_never_goes_below_zero() {
        let t = Timed {
            calls: Duration::from_nanos(100),
            clock: Duration::from_nanos(130),
        };
        assert_eq!(t.net(), Duration::ZERO);
        let t = Timed {
            calls: Duration::from_nanos(700),
            clock: Duration::from_nanos(130),
        };
        assert_eq!(t.net(), Duration::from_nanos(570));
    }
}
