//! `bench groups`: what a group per request costs a server — the cycle
//! `child` → `set_max` → an allocation in its scope → free → `remove` —
//! in time per cycle, and in memory left behind per removed group.
//!
//! The cycle runs on a hierarchy of its own, with an `Accounted<System>`
//! attached to it and called directly for the request's allocation (the
//! same `GlobalAlloc` path a global allocator takes; the lab's own global
//! allocator stays `System`, so the other suites are not charged). Each
//! thread serves requests under one shared parent, as a tenant's workers
//! would.
//!
//! - `request-cycle`: the whole cycle with one 1,000-byte allocation;
//! - `request-cycle-no-alloc`: the same without it (group bookkeeping only);
//! - `crowded-cycle`: the same again under a parent with [`SIBLINGS`] live
//!   children (10,000 in a quick report): creation and removal must not
//!   scan the siblings.
//!
//! Then `retained_bytes_per_group`: RSS growth over [`RSS_CYCLES`] cycles
//! (after a warm-up), divided by the cycles — 0 means removed groups leave
//! nothing behind (RSS moves in pages: the resolution is about 0.02 B).

use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use splitcount::alloc::Accounted;
use splitcount::group::{Group, Hierarchy};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The suite name in records.
pub const SUITE: &str = "groups";

/// The whole per-request cycle.
pub const CYCLE: &str = "request-cycle";

/// The cycle without its allocation.
pub const NO_ALLOC: &str = "request-cycle-no-alloc";

/// The cycle without its allocation, under a crowded parent.
pub const CROWDED: &str = "crowded-cycle";

/// Live siblings in [`CROWDED`].
pub const SIBLINGS: usize = 100_000;

/// The name of the retained-memory figure.
pub const RETAINED: &str = "retained_bytes_per_group";

/// Cycles the retained-memory figure is measured over.
pub const RSS_CYCLES: u64 = 200_000;

/// A request's allocation.
const REQUEST_BYTES: usize = 1_000;

/// The hierarchy the cycles run in, with its allocator.
struct Server {
    requests: Group,
    /// A parent with [`SIBLINGS`] live children.
    crowded: Group,
    alloc: &'static Accounted<System>,
    next: AtomicU64,
}

impl Server {
    fn new(siblings: usize) -> Result<Server, String> {
        let hierarchy = Hierarchy::default();
        // One allocator per suite run, attached to this hierarchy alone.
        let alloc: &'static Accounted<System> = Box::leak(Box::new(Accounted::new(System)));
        alloc.attach(&hierarchy).map_err(|e| e.to_string())?;
        let requests = hierarchy
            .root()
            .child("requests")
            .map_err(|e| e.to_string())?;
        requests.set_max(1 << 30).map_err(|e| e.to_string())?;
        let crowded = hierarchy
            .root()
            .child("crowded")
            .map_err(|e| e.to_string())?;
        for i in 0..siblings {
            crowded
                .child(&format!("resident-{i}"))
                .map_err(|e| e.to_string())?;
        }
        Ok(Server {
            requests,
            crowded,
            alloc,
            next: AtomicU64::new(0),
        })
    }

    /// One request: its group, a limit, the work, the removal.
    fn cycle(&self, parent: &Group, allocate: bool) {
        let id = self.next.fetch_add(1, Relaxed);
        let g = parent
            .child(&format!("request-{id}"))
            .expect("unique names");
        g.set_max(1 << 20).expect("a fresh group");
        if allocate {
            let layout = Layout::from_size_align(REQUEST_BYTES, 8).expect("valid");
            g.scope(|| {
                // SAFETY: a non-zero size; freed with the same layout.
                let p = unsafe { self.alloc.alloc(layout) };
                assert!(!p.is_null(), "the request's allocation");
                // SAFETY: `REQUEST_BYTES` bytes at `p`.
                unsafe { p.write_bytes(1, REQUEST_BYTES) };
                std::hint::black_box(p);
                // SAFETY: allocated above with `layout`.
                unsafe { self.alloc.dealloc(p, layout) };
            });
        }
        g.remove().expect("no children");
    }
}

/// The process's resident set, in bytes (`/proc/self/statm`).
pub(crate) fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    Some(pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64)
}

/// Bytes RSS grew per cycle over `cycles` cycles on `threads` threads
/// (after a warm-up of a tenth as many).
fn retained(server: &Server, threads: usize, cycles: u64) -> Option<f64> {
    let per_thread = cycles / threads as u64;
    let run = |n: u64| {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..n {
                        server.cycle(&server.requests, true);
                    }
                    splitcount::alloc::drain_thread();
                });
            }
        })
    };
    run(per_thread / 10);
    let before = rss_bytes()?;
    run(per_thread);
    let after = rss_bytes()?;
    Some(after.saturating_sub(before) as f64 / (per_thread * threads as u64) as f64)
}

/// Time the cycles at each thread count (the crowded one under `siblings`
/// live children), then the memory retained over `rss_cycles` cycles.
pub fn run(
    threads: &[usize],
    plan: &Plan,
    rss_cycles: u64,
    siblings: usize,
) -> Result<Bench, String> {
    let server = Server::new(siblings)?;
    let mut entries = Vec::new();
    for &t in threads {
        for (case, crowded, allocate) in [
            (CYCLE, false, true),
            (NO_ALLOC, false, false),
            (CROWDED, true, false),
        ] {
            let server = &server;
            let parent = if crowded {
                &server.crowded
            } else {
                &server.requests
            };
            entries.push(Entry::new(case, t, move |_| {
                move || server.cycle(parent, allocate)
            }));
        }
    }
    let mut measured = measure(SUITE, plan, entries)?;
    for &t in threads {
        if let Some(b) = retained(&server, t, rss_cycles) {
            measured.scalars.push((RETAINED.to_owned(), t, b));
        }
    }
    let mut bench = Bench::new(measured, |_| None);
    for r in &mut bench.records {
        r.retained_bytes_per_group = bench
            .measured
            .scalars
            .iter()
            .find(|(n, t, _)| n == RETAINED && *t == r.threads)
            .map(|(_, _, b)| *b);
    }
    Ok(bench)
}
