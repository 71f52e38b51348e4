//! The report's suites: each is one entry in [`SUITES`] — a name, a title,
//! what it measures, and a function that runs it and returns its records,
//! tables and plots. Adding a suite is a function and an entry here.
//!
//! A suite reuses the lab's machinery (`bench`, `accuracy`, `watchdog`):
//! the report formats and draws, it never measures a second way.

mod accuracy;
mod drift;
mod footprint;
mod timed;
mod watchdog;

use super::table::Table;
use super::targets::Verdict;
use crate::timing::{self, Plan, Progress};
use indicatif::ProgressBar;
use serde_json::{json, Value};
use std::time::Duration;

/// What every suite is run with.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Shorter runs for smoke tests (`--quick`).
    pub quick: bool,
}

/// Rounds per case in a full report (at least 9, so that a median and two
/// halves of rounds mean something).
pub const ROUNDS: usize = 15;

/// Rounds per case with `--quick`.
pub const QUICK_ROUNDS: usize = 3;

impl Settings {
    /// How the timed suites run: [`ROUNDS`] interleaved rounds of 60 ms
    /// per case ([`QUICK_ROUNDS`] of 10 ms with `--quick`).
    pub fn plan(&self) -> Plan {
        if self.quick {
            Plan {
                rounds: QUICK_ROUNDS,
                slice: Duration::from_millis(10),
            }
        } else {
            Plan {
                rounds: ROUNDS,
                slice: Duration::from_millis(60),
            }
        }
    }

    /// Thread counts of the timed suites; 8 oversubscribes small machines
    /// on purpose (a real case for a counter: preempted adders).
    pub fn threads(&self) -> Vec<usize> {
        vec![1, 2, 4, 8]
    }
}

/// What a suite hands back.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The configuration it ran with, for `report.json`.
    pub settings: Value,
    /// Its records, each with a `case`.
    pub records: Vec<Value>,
    /// Tables, printed in the terminal and shown on the page.
    pub tables: Vec<Table>,
    /// Plots, as SVG documents.
    pub plots: Vec<String>,
    /// Verdicts on the targets whose figures this suite measured.
    pub verdicts: Vec<Verdict>,
}

/// The signature of a suite's runner: it may advance `progress` (whose
/// length it sets) and reports a failure as a message.
pub type Runner = fn(&Settings, &ProgressBar) -> Result<Outcome, String>;

/// One suite of the report.
#[derive(Debug)]
pub struct Suite {
    /// The name (`--suites`, `report.json`, the page's anchors).
    pub name: &'static str,
    /// The heading.
    pub title: &'static str,
    /// What it measures and how to read it.
    pub about: &'static str,
    /// Runs it.
    pub run: Runner,
}

/// Every suite, in report order.
pub const SUITES: &[Suite] = &[
    Suite {
        name: "counters",
        title: "Counters: cost of an add vs threads",
        about: "Every design adding 1 on the current CPU in a loop, beside the floor (a \
                thread-local add), a single shared atomic (the baseline), a bare rseq per-CPU \
                add written in the lab, a LongAdder-style striped counter and the crates.io \
                crate fast-counter. 8 threads oversubscribe small machines on purpose. Cells: \
                ns per add per thread (CPU time), and × the shared atomic at the same thread \
                count: the median of per-round ratios, with their range.",
        run: timed::counters,
    },
    Suite {
        name: "accuracy",
        title: "Accuracy: error bound and observed worst vs CPUs",
        about: "Each design at its default batch on simulated machines of 2…4096 CPUs: the \
                bound of approximate() (under: how far it may lag below precise(); over: how \
                far above), what the design's worst-case schedule reaches, and the largest \
                error over random walks. Units are whatever is counted; the pages column \
                reads them as 4 KiB pages, the kernel's RSS case. The same numbers as \
                `splitcount-lab accuracy`.",
        run: accuracy::run,
    },
    Suite {
        name: "watchdog",
        title: "Watchdog: error of the cheap read over time",
        about: "Five threads hop across 256 simulated CPUs (4 nodes), mapping and unmapping \
                pages in growing and shrinking phases; a watchdog reads approximate() every \
                so often and compares it with the truth. Each CPU a thread ran on keeps a \
                remainder below the batch, so the error grows with the CPUs visited — the case \
                that made the kernel replace percpu_counter for RSS. A deterministic, seeded \
                simulation: every design sees the same workload.",
        run: watchdog::run,
    },
    Suite {
        name: "layout",
        title: "Layout: a read-mostly field beside a write-hot one",
        about: "Two threads on one group-like struct: one adds to the usage field, the other \
                reads the limit field and works with it. Packed: both fields on one cache \
                line (false sharing); padded: each on its own CachePadded line. Each role is \
                shown as × the same role on the padded layout in the same round.",
        run: timed::layout,
    },
    Suite {
        name: "charge",
        title: "Charge: accounting in a page-fault-like loop",
        about: "Each op writes a 4 KiB page and charges one unit two levels deep (uncharging \
                once 64 are outstanding): without accounting (the baseline), on the usage \
                counters directly, and through the per-CPU stock — on its hit path (stock), \
                and with a working set larger than the stock (stock-misses: bursts of 96 \
                units to 72 groups in turn, more than the 63 slots, so refills, drains and \
                evictions are timed); then each thread serving 4 or 8 tenants in turn with 1 or \
                7 stock slots per CPU (the kernel before and since 6.16), and 8 or 32 tenants \
                with the default stock (63 slots, at most 7 batches stocked per CPU: 32 tenants \
                get 14 units each).",
        run: timed::charge,
    },
    Suite {
        name: "fault",
        title: "Faults: the kernel's 2009 memcg experiment, real page faults charged",
        about: "Each op maps 64 anonymous pages, writes a byte to each (a first-touch page \
                fault, charged one unit as the kernel charges a page), unmaps them and \
                uncharges: without accounting (the baseline), on the root group, on a child \
                group's usage counters directly (no stock, the kernel before 2009) and through \
                the per-CPU stock; then each thread charging 8 or 32 tenants in turn, fault by \
                fault. Cells: ns per fault (CPU time, the kernel's included) and × the \
                baseline's faults per second in the same round, beside the seed's table \
                (faults in 60 s on 8 CPUs, cache misses per fault). Cache misses are not \
                measured here: the note says whether this machine has the counter.",
        run: timed::fault,
    },
    Suite {
        name: "stats",
        title: "Statistics: a read after few changes in a large tree",
        about: "A tree of 10,000 groups (1,000 in a quick run) four levels deep where 10 \
                groups change between two reads, all cases in the same rounds. \
                flush-updated: our flush, which visits only what changed; full-walk (the \
                baseline): the naive reader at its fastest, summing every group's per-CPU \
                values laid out contiguously, with no bounds check per value; flush-idle: a \
                flush with nothing changed. Then the update itself: mod-stat against a plain \
                per-CPU add. The naive reader's cost grows with the CPUs, the flush's does \
                not: on a 2-CPU machine the ratio is at its least flattering. The bars are on \
                a log scale.",
        run: timed::stats,
    },
    Suite {
        name: "alloc",
        title: "Allocator: the heap accounted by group",
        about: "Each workload runs eleven times, in eleven worker processes whose global \
                allocator is System (the baseline), Accounted<System> or Accounted<System, \
                Footprint> (charging malloc_usable_size + 8 per block; its baseline is \
                Accounted<System>) — and the same over jemalloc and mimalloc (each alone, \
                divided by System; accounted, divided by the allocator alone; footprint, \
                charging its usable size, divided by accounted), plus HeapPerGroup<Jemalloc> \
                and HeapPerGroup<MiMalloc> (jemalloc-heaps, mimalloc-heaps: each worker group \
                given a jemalloc arena or a mimalloc heap of its own, its blocks without a \
                tag; divided by the allocator alone) — interleaved round by round, each \
                thread in a group scope: mixed (free the oldest of 64 blocks, allocate 16 to \
                512 bytes), small (17 to 24 bytes, where the 8-byte header moves a block to \
                the next malloc size class), cross-thread (two threads each freeing the \
                other's blocks), json (serde_json parsing and re-serializing a 2 MB \
                document) and btree (a BTreeMap<u64, String> of 1,000 random keys built \
                and dropped); and the resident bytes per block of 8 to 128 bytes on each \
                allocator (notes: with transparent huge pages off in the worker, what a \
                block takes, and — not in a quick report — as the allocators ask for \
                them). The cost of the header, the thread reserve and the per-CPU byte \
                stock.",
        run: timed::alloc,
    },
    Suite {
        name: "ffi",
        title: "C ABI: a call from C",
        about: "The C API (splitcount-ffi) from loops written in C, against the same \
                operation from Rust: a tree counter's add — the header's static inline rseq \
                add (counter-add-c-inline), the checked handle call (counter-add-c), and as \
                floors a shared atomic and a thread-local add in C — and a group's \
                charge+uncharge of 100, 1,000 and 4,096 bytes through the stock of a \
                byte hierarchy, through the unchecked fast path (charge-N-c) and the \
                checked handles (charge-N-c-checked), each ÷ the Rust case.",
        run: timed::ffi,
    },
    Suite {
        name: "preload",
        title: "C programs' heap: the LD_PRELOAD library over glibc, jemalloc and mimalloc",
        about: "The allocator suite's mixed (free the oldest of 64 blocks, allocate 16 to \
                512 bytes) and small (17 to 24 bytes) workloads in worker processes whose \
                malloc is glibc's, the system's jemalloc or mimalloc (LD_PRELOAD of the \
                library), each alone and under libsplitcount_preload.so with it as the inner \
                allocator (SPLITCOUNT_PRELOAD_INNER): {w}-preload ÷ {w}-glibc, \
                {w}-preload-untagged ÷ {w}-glibc (SPLITCOUNT_PRELOAD_TAGS=off: no header), \
                {w}-preload-jemalloc ÷ {w}-jemalloc, {w}-preload-mimalloc ÷ {w}-mimalloc; the \
                allocators alone ÷ glibc. Then redis-server under the preload loaded by \
                redis-benchmark (SETs and GETs of 200 bytes from 8 connections; the time per \
                request redis-benchmark measured) ÷ the same server without it. Everything a \
                C program's malloc+free pays: the \
                16-byte header, the charge path, the usable-size call, thread-local \
                lookups. Measured when libsplitcount_preload.so lies beside the lab binary \
                (cargo build --release --workspace).",
        run: timed::preload,
    },
    Suite {
        name: "async",
        title: "Async: a request loop on tokio, with and without instrument",
        about: "In the Accounted<System> worker process, 8 client tasks on a tokio \
                multi-thread runtime (1 or 2 pinned workers, draining their reserve when they \
                park) each spawn one handler task after another and await it; the handler \
                formats 16 fields, yields, indexes them in a map, yields and serializes the \
                map (about 60 allocations held across two awaits). plain (the baseline): \
                tokio::spawn(handler); instrumented: tokio::spawn(group.instrument(handler)), \
                a group per client — the wrapper's own cost on top of the allocator's; \
                per-request: a group per request (child, set_max, instrument, remove). Cells: \
                CPU time of the workers per request, and × plain in the same round.",
        run: timed::requests,
    },
    Suite {
        name: "noisy",
        title: "Noisy neighbour: a group over its limit, and a healthy one beside it",
        about: "In the Accounted<System> worker process, each thread allocates 64-byte blocks \
                (try_reserve_exact: a refusal is counted, not an abort) and holds them, \
                freeing them all once it holds 1 MiB — a request that keeps allocating. One \
                thread: in a group far over its max (2 MiB held under a 1 MiB max), \
                cooperative (breached-cooperative) or refusing (breached-refuse), as × the \
                same loop in a group under its limit (under-limit): ns per allocation, CPU \
                time. Two threads: a noisy thread in such a group and a healthy thread in a \
                group under its limit, each role on its own; the healthy row's × is its \
                allocations per second (wall time: the interrupts it takes count) over the \
                same beside a noisy thread in an unlimited group (beside-unlimited): 1 is \
                unharmed.",
        run: timed::noisy,
    },
    Suite {
        name: "metrics",
        title: "metrics: splitcount's recorder vs the Prometheus exporter's",
        about: "One counter incremented by every thread, through the metrics facade's \
                Recorder: splitcount's SplitRecorder (a split counter per counter, a \
                per-thread handle cache) against metrics-exporter-prometheus's recorder (the \
                baseline: an atomic per counter). handle: a Counter kept by each thread, \
                increment(1) per op; register: register_counter then increment(1) per op, \
                what metrics::counter!(..).increment(1) does at every call. Cells: ns per \
                increment per thread, × the Prometheus recorder's same case.",
        run: timed::recorders,
    },
    Suite {
        name: "drift",
        title: "Drift: what the groups account vs what the process holds",
        about: "Each allocator workload's live set (100,000 blocks of 17-24 bytes, 100,000 of \
                16-512, a 2 MB JSON document parsed into a serde_json tree) held under \
                Accounted<System> in a worker process, reconciled with \
                Accounted::reconcile: what the groups account, the headers, glibc's in-use \
                bytes (mallinfo2) and the resident set, as growth while the set is held.",
        run: drift::run,
    },
    Suite {
        name: "footprint",
        title: "Footprint: bytes per counter vs CPUs",
        about: "What one counter of each design takes on simulated machines of 2 to 4096 \
                CPUs, default batches and fan-outs, computed from its layout: per-CPU slots \
                (and the arena's overflow copy), shared items in the arena, handle and heap. \
                tree-padded is the tree with each shared item on a 128-byte line of its own, \
                as it was laid out before stripes.",
        run: footprint::run,
    },
    Suite {
        name: "groups",
        title: "Groups: a group per request",
        about: "What a group per request costs a server: the cycle child → set_max → a \
                1,000-byte allocation in its scope (through an Accounted<System> attached to \
                the suite's own hierarchy) → free → remove, at 1 and 2 threads sharing one \
                parent; the same without the allocation; and the bytes of RSS a removed \
                group leaves behind, measured over 200,000 cycles (20,000 with --quick). \
                ns per cycle is absolute (a budget per request), not a ratio.",
        run: timed::groups,
    },
    Suite {
        name: "percpu",
        title: "Per-CPU add: rseq critical section vs atomic",
        about: "One add to this CPU's copy of a per-CPU slot, as an rseq critical section and \
                as a relaxed fetch_add (the baseline), beside a shared atomic and the \
                thread-local floor.",
        run: timed::percpu,
    },
    Suite {
        name: "cpu-id",
        title: "CPU id: which CPU am I on?",
        about: "The cost of each CPU-id source available here, as × the raw getcpu system \
                call (the baseline).",
        run: timed::cpu_id,
    },
];

/// The help of `report --suites`: every suite's name, from [`SUITES`].
pub fn suites_help() -> String {
    let names: Vec<&str> = SUITES.iter().map(|s| s.name).collect();
    format!(
        "Suites to run, comma-separated (default: all): {}",
        names.join(", ")
    )
}

/// The suites named in `spec` (comma-separated, or `all`), in report order.
/// An unknown or empty name is an error that lists the known ones.
pub fn select(spec: Option<&str>) -> Result<Vec<&'static Suite>, String> {
    let known = || SUITES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ");
    let Some(spec) = spec.filter(|s| s.trim() != "all") else {
        return Ok(SUITES.iter().collect());
    };
    let mut wanted = Vec::new();
    let mut all = false;
    for name in spec.split(',').map(str::trim) {
        match SUITES.iter().find(|s| s.name == name) {
            Some(s) => wanted.push(s.name),
            // `all` in a list: every suite, once the others are checked.
            None if name == "all" => all = true,
            None if name.is_empty() => {
                return Err(format!("--suites has an empty name (known: {})", known()))
            }
            None => return Err(format!("unknown suite {name:?} (known: {})", known())),
        }
    }
    Ok(SUITES
        .iter()
        .filter(|s| all || wanted.contains(&s.name))
        .collect())
}

/// Run `f`, growing `progress` by the slices the timing core plans
/// meanwhile and advancing it by one for each slice it runs.
fn counted<R>(progress: &ProgressBar, f: impl FnOnce() -> R) -> R {
    let p = progress.clone();
    timing::observed(
        move |event| match event {
            Progress::Planned(n) => p.inc_length(n as u64),
            Progress::SliceDone => p.inc(1),
        },
        f,
    )
}

/// A record as JSON with its `case` named.
fn with_case(case: &str, record: &impl serde::Serialize) -> Result<Value, String> {
    let mut v = serde_json::to_value(record).map_err(|e| e.to_string())?;
    match v.as_object_mut() {
        Some(map) => {
            map.insert("case".to_owned(), json!(case));
            Ok(v)
        }
        None => Err(format!("record of {case} is not a JSON object")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_select_suites_in_report_order() {
        let s = select(Some("watchdog, counters")).unwrap();
        let names: Vec<&str> = s.iter().map(|s| s.name).collect();
        assert_eq!(names, ["counters", "watchdog"]);
        assert_eq!(select(None).unwrap().len(), SUITES.len());
        assert_eq!(select(Some("all")).unwrap().len(), SUITES.len());
        assert_eq!(select(Some("stats,all")).unwrap().len(), SUITES.len());
        assert!(select(Some("all,nosuch")).is_err());
    }

    #[test]
    fn an_unknown_suite_is_named_with_the_known_ones() {
        let e = select(Some("counters,nope")).unwrap_err();
        assert!(e.contains("\"nope\""), "{e}");
        assert!(e.contains("counters, accuracy, watchdog"), "{e}");
        assert!(select(Some("counters,,layout")).is_err());
    }

    #[test]
    fn suite_names_are_unique() {
        for (i, a) in SUITES.iter().enumerate() {
            assert!(
                SUITES[i + 1..].iter().all(|b| b.name != a.name),
                "{}",
                a.name
            );
        }
    }
}
