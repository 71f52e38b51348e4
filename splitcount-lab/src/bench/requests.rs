//! `bench async`: what [`Group::instrument`] costs an async server — a
//! request loop on a tokio multi-thread runtime whose handler allocates
//! across `.await` points, with and without the wrapper.
//!
//! Everything runs in an `Accounted<System>` worker process of the
//! allocator suite ([`super::worker`]), so the baseline already pays
//! the allocator's own overhead and the ratio is what the wrapper adds on
//! top of it. Each slice spawns [`CLIENTS`] client tasks on a runtime with
//! one worker thread per thread of the case (pinned, as every timed case is
//! where the machine allows, and draining its reserve when it parks, as
//! [`splitcount::task::drain_on_park`] advises); each client spawns one
//! handler task after another and awaits it. Three cases:
//!
//! - `plain` (the baseline): `tokio::spawn(handler)`; the handler's bytes
//!   are charged to the root (no group).
//! - `instrumented`: `tokio::spawn(group.instrument(handler))`, one group
//!   per client: the cost of the wrapper alone (a scope swap per poll and a
//!   breach check before and after).
//! - `per-request`: what a server does — a group per request
//!   (`child` → `set_max` → `instrument` → `remove`).
//!
//! The handler ([`handle`]) formats 16 fields, yields, indexes them in a
//! map, yields, and serializes the map to JSON: about 60 allocations and
//! three polls, on whichever worker the runtime picks each time.
//!
//! Time per operation is the CPU time of the runtime's worker threads
//! (their thread CPU clocks) divided by the requests they completed — CPU
//! per request, not latency.

use super::{Bench, Entry};
use crate::alloc_switch::Allocator;
use crate::bench::worker::{Request, Worker};
use crate::timing::pin::{self, Placement};
use crate::timing::slice::{SliceRun, SliceSpec, ThreadRun};
use crate::timing::{measure, Plan};
use crossbeam_utils::CachePadded;
use serde::{Deserialize, Serialize};
use splitcount::group::Group;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The case every other is divided by.
pub const BASELINE: &str = "plain";

/// Every case, in table order.
pub const CASES: [&str; 3] = ["plain", "instrumented", "per-request"];

/// Client tasks per slice: enough that every worker always has a handler
/// to run.
pub const CLIENTS: usize = 8;

/// The limit of a `per-request` group: far above what a handler holds.
const REQUEST_MAX: u64 = 1 << 20;

/// The suite's name in a worker request ([`crate::bench::worker::Request`]).
pub const SUITE: &str = "async";

/// How a client runs its handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// `tokio::spawn(handler)`.
    Plain,
    /// `tokio::spawn(group.instrument(handler))`, a group per client.
    Instrumented,
    /// A group per request, created, limited, instrumented and removed.
    PerRequest,
}

impl Mode {
    /// Every mode, in [`CASES`] order.
    pub const ALL: [Mode; 3] = [Mode::Plain, Mode::Instrumented, Mode::PerRequest];

    /// The case name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Instrumented => "instrumented",
            Mode::PerRequest => "per-request",
        }
    }
}

/// Measure every mode at each of `threads` runtime workers. `exe` is the
/// lab binary (its `alloc-worker` command runs the accounted worker).
pub fn run(exe: &Path, threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    let worker = RefCell::new(Worker::start(exe, Allocator::Accounted)?);
    let worker = &worker;
    let mut entries = Vec::new();
    for &t in threads {
        for mode in Mode::ALL {
            entries.push(Entry::from_fn(mode.name(), t, move |spec| {
                worker
                    .borrow_mut()
                    .run(&Request::new(SUITE, &mode, t, spec)?)
            }));
        }
    }
    let measured = measure("async", plan, entries)?;
    Ok(Bench::new(measured, |_| Some(BASELINE.to_owned())))
}

/// A request handler: allocations held across two `.await` points.
pub async fn handle(seed: u64) -> usize {
    let fields: Vec<String> = (0..16).map(|i| format!("field-{seed}-{i:04}")).collect();
    tokio::task::yield_now().await;
    let index: BTreeMap<String, usize> = fields
        .iter()
        .enumerate()
        .map(|(i, f)| (f.clone(), i * f.len()))
        .collect();
    tokio::task::yield_now().await;
    serde_json::to_string(&index).map_or(0, |s| s.len())
}

/// One runtime with `workers` pinned worker threads, and what the slices
/// read of them.
struct Server {
    runtime: tokio::runtime::Runtime,
    workers: Arc<Workers>,
}

/// The runtime's worker threads: their CPU clocks and the requests each
/// completed.
struct Workers {
    count: usize,
    clocks: Mutex<Vec<libc::clockid_t>>,
    served: Vec<CachePadded<AtomicU64>>,
}

thread_local! {
    /// This thread's index among its runtime's workers (0 elsewhere).
    static WORKER: Cell<usize> = const { Cell::new(0) };
}

impl Server {
    fn start(count: usize) -> Result<Server, String> {
        let workers = Arc::new(Workers {
            count,
            clocks: Mutex::new(Vec::new()),
            served: (0..count)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        });
        let placement: Option<Placement> = pin::placement(count);
        let started = workers.clone();
        let runtime =
            splitcount::task::drain_on_park(&mut tokio::runtime::Builder::new_multi_thread())
                .worker_threads(count)
                .on_thread_start(move || {
                    let mut clocks = started.clocks.lock().unwrap_or_else(|e| e.into_inner());
                    let i = clocks.len();
                    if i >= started.count {
                        return; // a blocking-pool thread: not a worker
                    }
                    if let Some(p) = &placement {
                        pin::pin_current(p.cpus[i]);
                    }
                    let mut clock: libc::clockid_t = 0;
                    // SAFETY: `pthread_self()` is this live thread; `clock` is
                    // writable.
                    if unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) } == 0
                    {
                        clocks.push(clock);
                        WORKER.with(|w| w.set(i));
                    }
                })
                .build()
                .map_err(|e| format!("a tokio runtime: {e}"))?;
        // Worker threads start in the background: wait for their clocks.
        let deadline = Instant::now() + Duration::from_secs(10);
        while workers.clocks.lock().map_or(0, |c| c.len()) < count {
            if Instant::now() > deadline {
                return Err(format!("{count} tokio workers did not start"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(Server { runtime, workers })
    }

    /// The CPU time each worker has used so far.
    fn cpu_times(&self) -> Vec<Option<u64>> {
        let clocks = self
            .workers
            .clocks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        clocks
            .iter()
            .map(|&clock| {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: `ts` is writable; `clock` is a worker's CPU clock,
                // and the runtime (so the thread) lives as long as `self`.
                let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
                (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
            })
            .collect()
    }

    fn served(&self) -> Vec<u64> {
        // Relaxed: read after the clients joined, which orders them.
        self.workers
            .served
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .collect()
    }
}

/// The runtime with `workers` workers, started on first use and kept for
/// the life of the process.
fn server(workers: usize) -> Result<&'static Server, String> {
    static SERVERS: OnceLock<Mutex<BTreeMap<usize, &'static Server>>> = OnceLock::new();
    let mut servers = SERVERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(s) = servers.get(&workers) {
        return Ok(s);
    }
    let s: &'static Server = Box::leak(Box::new(Server::start(workers)?));
    servers.insert(workers, s);
    Ok(s)
}

/// One client: handlers one after another until `stop`, each counted on
/// the worker that saw it complete.
async fn client(
    id: usize,
    mode: Mode,
    parent: Group,
    stop: Arc<AtomicBool>,
    workers: Arc<Workers>,
) -> Result<(), String> {
    let own = match mode {
        Mode::Instrumented => Some(
            parent
                .child_or_create("instrumented")
                .map_err(|e| e.to_string())?,
        ),
        _ => None,
    };
    let mut n = 0u64;
    // Relaxed: the flag only ends the loop.
    while !stop.load(Ordering::Relaxed) {
        let seed = (id as u64) << 32 | n;
        let bytes = match mode {
            Mode::Plain => tokio::spawn(handle(seed))
                .await
                .map_err(|e| e.to_string())?,
            Mode::Instrumented => {
                let g = own.as_ref().expect("made above");
                tokio::spawn(g.instrument(handle(seed)))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?
            }
            Mode::PerRequest => {
                let g = parent
                    .child(&format!("request-{id}-{n}"))
                    .map_err(|e| e.to_string())?;
                g.set_max(REQUEST_MAX).map_err(|e| e.to_string())?;
                let out = tokio::spawn(g.instrument(handle(seed)))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                g.remove().map_err(|e| e.to_string())?;
                out
            }
        };
        std::hint::black_box(bytes);
        n += 1;
        let w = WORKER.with(Cell::get).min(workers.count - 1);
        // Relaxed: a tally, read after the join.
        workers.served[w].fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Run one slice of `mode` on a runtime of `threads` workers, the groups
/// under `parent`: the body of the worker process's `requests` workload.
pub fn run_slice(
    mode: Mode,
    threads: usize,
    spec: SliceSpec,
    parent: &Group,
) -> Result<SliceRun, String> {
    let threads = threads.max(1);
    let server = server(threads)?;
    let stop = Arc::new(AtomicBool::new(false));
    let served0 = server.served();
    let cpu0 = server.cpu_times();
    let origin = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            server.runtime.spawn(client(
                c,
                mode,
                parent.clone(),
                stop.clone(),
                server.workers.clone(),
            ))
        })
        .collect();
    std::thread::sleep(spec.length);
    // Relaxed: the flag only ends the loops; the joins order the rest.
    stop.store(true, Ordering::Relaxed);
    let outcomes = server.runtime.block_on(async {
        let mut outcomes = Vec::with_capacity(clients.len());
        for c in clients {
            outcomes.push(c.await.map_err(|e| e.to_string()).and_then(|r| r));
        }
        outcomes
    });
    let stop_ns = origin.elapsed().as_nanos() as u64;
    let cpu1 = server.cpu_times();
    outcomes.into_iter().collect::<Result<Vec<()>, String>>()?;
    let served1 = server.served();
    Ok(SliceRun {
        threads: (0..threads)
            .map(|w| ThreadRun {
                ops: served1[w] - served0[w],
                start_ns: 0,
                stop_ns,
                cpu_ns: cpu0[w].zip(cpu1[w]).map(|(a, b)| b.saturating_sub(a)),
                timed_ns: None,
            })
            .collect(),
        pinned: pin::placement(threads).map(|p| p.cpus),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitcount::group::Hierarchy;

    #[test]
    fn every_mode_serves_requests_on_each_worker_and_leaves_no_group_behind() {
        let h = Hierarchy::default();
        let parent = h.root().child("async").unwrap();
        let spec = SliceSpec {
            length: Duration::from_millis(30),
            batch: 1,
        };
        for mode in Mode::ALL {
            for threads in [1, 2] {
                let run = run_slice(mode, threads, spec, &parent).unwrap();
                assert_eq!(run.threads.len(), threads, "{mode:?}");
                let served: u64 = run.threads.iter().map(|t| t.ops).sum();
                assert!(served > 0, "{mode:?} at {threads}: {run:?}");
                assert!(run.threads.iter().all(|t| t.cpu_ns.is_some()));
            }
        }
        let left: Vec<String> = parent
            .children()
            .iter()
            .map(|g| g.name().to_owned())
            .collect();
        assert!(
            left.iter().all(|n| n == "instrumented"),
            "per-request groups are removed: {left:?}"
        );
    }

    #[test]
    fn the_handler_holds_memory_across_its_awaits_and_answers() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(rt.block_on(handle(7)) > 16 * 10);
    }
}
