//! `splitcount-lab`: the splitcount lab — machine shape, benchmarks,
//! accuracy simulation, replay and the report.

use clap::{Parser, Subcommand};
use splitcount::counter::{Arity, Design};
use splitcount::cpu::MAX_CPUS;
use splitcount_lab::alloc_switch::Switch;
use splitcount_lab::{accuracy, bench, footprint, machine, outln, parse_list, replay, report};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The system allocator, or `Accounted<System>` in the allocator suite's
/// worker processes (see `alloc_switch`).
#[global_allocator]
static ALLOCATOR: Switch = Switch;

#[derive(Parser)]
#[command(
    name = "splitcount-lab",
    version,
    about = "The splitcount lab: measure every design on this machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the detected machine shape and the CPU-id source.
    Machine {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run a benchmark suite in interleaved rounds: `cpu-id`, `percpu`,
    /// `counters`, `charge`, `fault`, `stats`, `alloc`, `async`, `groups`,
    /// `metrics`, `layout`, `ffi`, `preload` or `noisy`.
    Bench {
        /// The suite: `cpu-id`, `percpu`, `counters`, `charge`, `fault`,
        /// `stats`, `alloc`, `async`, `groups`, `metrics`, `layout`, `ffi`, `preload` or
        /// `noisy`
        /// (`layout` always runs two threads, `stats` one and `noisy` one
        /// and two; they ignore `--threads`; for `async` a thread count is
        /// the runtime's worker threads).
        suite: String,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Thread counts, e.g. `1,2,4,8`.
        #[arg(long, default_value = "1,2")]
        threads: String,
        /// Seconds of measuring per case, split evenly into `--rounds`
        /// slices (> 0, at most 3600, and at least 1 ms a round).
        #[arg(long, default_value_t = 0.5)]
        seconds: f64,
        /// Interleaved rounds per case (1 to 1000): each case runs once per
        /// round, and ratios are the median of per-round ratios.
        #[arg(long, default_value_t = 9)]
        rounds: usize,
        /// Groups in the `stats` suite's tree.
        #[arg(long, default_value_t = 10_000)]
        groups: usize,
    },
    /// Bound vs observed error of each design on simulated machines.
    Accuracy {
        /// Designs (`atomic`, `batched`, `pernode`, `tree`, comma-separated, or `all`).
        #[arg(long, default_value = "all")]
        design: String,
        /// Simulated CPU counts, e.g. `2,64,4096`.
        #[arg(long, default_value = "2,8,64,256,1024,4096")]
        cpus: String,
        #[command(flatten)]
        shape: Shape,
        /// Seed of the random walks.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Random-walk steps per (design, CPUs): 1 to 100,000,000.
        #[arg(long, default_value_t = 100_000)]
        steps: usize,
        /// Choose the batch (and the tree's fan-outs) with the cheapest add
        /// whose error bound is at most N units, and report that shape, or
        /// why none meets N (`--batch` and a non-`auto` `--arity` are kept).
        #[arg(long, value_name = "N")]
        max_error: Option<u64>,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Bytes one counter of each design takes (per counter and per CPU)
    /// on simulated machines.
    Footprint {
        /// Simulated CPU counts, e.g. `2,64,4096`.
        #[arg(long, default_value = footprint::DEFAULT_CPUS)]
        cpus: String,
        /// JSON lines (`design`, `cpus`, `bytes_per_counter`,
        /// `bytes_per_cpu`, and the parts) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Replay `{"cpu":c,"delta":d}` lines from stdin into a simulated counter.
    ///
    /// Values are `i64` and wrap on overflow, as the library's counters do
    /// (like the kernel's `percpu_counter`): a replay that leaves the range
    /// prints the wrapped values.
    Replay {
        /// The design.
        #[arg(long)]
        design: String,
        /// Simulated CPUs.
        #[arg(long)]
        cpus: usize,
        #[command(flatten)]
        shape: Shape,
    },
    /// Run every suite (or those of `--suites`), print the tables and the
    /// verdicts against the targets, and write `report.json` and
    /// `index.html`.
    Report {
        /// Fewer, shorter rounds, for smoke tests (about 35 s on 2 cores,
        /// instead of about 6 minutes).
        #[arg(long)]
        quick: bool,
        #[arg(long, help = report::suites::suites_help())]
        suites: Option<String>,
        /// Output directory.
        #[arg(long, default_value = "target/splitcount-report")]
        out: PathBuf,
    },
    /// Where the bytes the groups account and the memory the process holds
    /// part ways: each allocator workload's live set held under
    /// `Accounted<System>`, reconciled with glibc's figures and the
    /// resident set.
    Drift {
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The worker process of `drift` (started by the lab itself).
    #[command(hide = true)]
    DriftWorker,
    /// A worker process of `bench alloc`, `bench async` and `bench noisy`
    /// (started by the lab itself).
    #[command(hide = true)]
    AllocWorker,
}

/// How a simulated counter is built (`accuracy` and `replay`).
#[derive(clap::Args)]
struct Shape {
    /// Batch (default: each design's own).
    #[arg(long)]
    batch: Option<u64>,
    /// Tree fan-outs: `auto`, `binary` or e.g. `8,8,8` (bottom first); a
    /// list fits the CPU counts whose power of two is its product (`8,8,8`:
    /// 257 to 512 CPUs).
    #[arg(long, default_value = "auto")]
    arity: String,
    /// Simulated NUMA nodes (default: one per 64 CPUs).
    #[arg(long)]
    nodes: Option<usize>,
}

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader goes away
    // (`splitcount-lab machine | head -c1`): restore the default SIGPIPE
    // action, which Rust's runtime sets to "ignore" (making every later
    // write fail: `outln!` would keep that error and go on).
    #[cfg(unix)]
    // SAFETY: resetting a signal's disposition before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    if matches!(cli.command, Command::Bench { .. } | Command::Report { .. })
        && splitcount::alloc::STATIC_TLS_CHECK
    {
        eprintln!(
            "splitcount-lab: note: this binary's splitcount has the feature `static-tls` (a \
             workspace build enables it for the preload), which adds a check to every access \
             of the allocator's thread state: the allocator suites read slower than a lab \
             built with `cargo run --release` or `cargo build --release -p splitcount-lab`"
        );
    }
    let result = check_environment().and_then(|()| run(cli));
    // A failed write to stdout did not stop the run (a report still wrote
    // its files), but the output is incomplete: say so, and fail.
    let result = result.and_then(|()| match splitcount_lab::output::failure() {
        Some(e) => Err(format!("cannot write output: {e}")),
        None => Ok(()),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("splitcount-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The library's environment switches, which it ignores when it does not
/// know a value (a program must run all the same); the lab measures with
/// them, so a mistyped one is an error here, not a silent default.
fn check_environment() -> Result<(), String> {
    let known: [(&str, &[&str]); 2] = [
        (
            "SPLITCOUNT_CPU_ID_SOURCE",
            &["glibc-rseq", "own-rseq", "sched-getcpu", "thread-index"],
        ),
        ("SPLITCOUNT_PERCPU_ADD", &["rseq", "atomic"]),
    ];
    for (var, values) in known {
        if let Ok(v) = std::env::var(var) {
            if !values.contains(&v.trim()) {
                return Err(format!(
                    "{var}={v:?} is not valid (valid: {}; unset: the library's choice)",
                    values.join(", ")
                ));
            }
        }
    }
    Ok(())
}

fn seconds(s: f64) -> Result<Duration, String> {
    if s.is_finite() && s > 0.0 && s <= 3600.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(format!("--seconds must be > 0 (and at most 3600), not {s}"))
    }
}

/// The shortest slice a round may get: below it a slice is mostly the cost
/// of starting and stopping it (and the overlap check reads noise).
const MIN_SLICE: Duration = Duration::from_millis(1);

/// `--seconds` split into `--rounds` slices, each at least [`MIN_SLICE`].
fn plan(s: f64, n: usize) -> Result<splitcount_lab::timing::Plan, String> {
    let (total, rounds) = (seconds(s)?, rounds(n)?);
    if total < MIN_SLICE * rounds as u32 {
        return Err(format!(
            "--seconds {s} over {rounds} rounds gives slices shorter than {} ms: give at least \
             {} seconds",
            MIN_SLICE.as_millis(),
            (MIN_SLICE * rounds as u32).as_secs_f64()
        ));
    }
    Ok(splitcount_lab::timing::Plan::split(total, rounds))
}

/// `--steps` of `accuracy`: at least one, at most [`MAX_STEPS`].
fn steps(n: usize) -> Result<usize, String> {
    if (1..=MAX_STEPS).contains(&n) {
        Ok(n)
    } else {
        Err(format!("--steps must be from 1 to {MAX_STEPS}, not {n}"))
    }
}

/// The most random-walk steps `accuracy` takes per (design, CPUs): about a
/// minute at 1,024 simulated CPUs.
const MAX_STEPS: usize = 100_000_000;

fn rounds(n: usize) -> Result<usize, String> {
    if (1..=1000).contains(&n) {
        Ok(n)
    } else {
        Err(format!("--rounds must be from 1 to 1000, not {n}"))
    }
}

fn stats_groups(n: usize) -> Result<usize, String> {
    if (1..=1_000_000).contains(&n) {
        Ok(n)
    } else {
        Err(format!("--groups must be from 1 to 1000000, not {n}"))
    }
}

fn design_names() -> String {
    let names: Vec<&str> = Design::ALL.iter().map(|d| d.name()).collect();
    format!("{}, or all", names.join(", "))
}

fn designs(s: &str) -> Result<Vec<Design>, String> {
    // `all` anywhere in the list means every design.
    if s.split(',').any(|d| d.trim() == "all") {
        return Ok(Design::ALL.to_vec());
    }
    parse_list(s, "design", &design_names(), |d| d.parse().ok())
}

fn cpu_counts(s: &str) -> Result<Vec<usize>, String> {
    parse_list(s, "CPU count", &format!("1 to {MAX_CPUS}"), |c| {
        c.parse().ok().filter(|n| (1..=MAX_CPUS).contains(n))
    })
}

fn spec(design: Design, cpus: usize, shape: &Shape) -> Result<accuracy::Spec, String> {
    let mut spec = accuracy::Spec::new(design, cpus);
    spec.batch = shape.batch;
    spec.arity = shape.arity.parse::<Arity>().map_err(|e| {
        format!(
            "--arity: {e} (valid: auto, binary, or fan-outs bottom first, each a power of two \
             ≥ 2, e.g. 8,8,4)"
        )
    })?;
    let max_nodes = cpus.min(splitcount::cpu::MAX_NODES);
    if let Some(n) = shape.nodes.filter(|n| !(1..=max_nodes).contains(n)) {
        return Err(format!(
            "--nodes must be from 1 to {max_nodes} for {cpus} CPUs, not {n}"
        ));
    }
    spec.nodes = shape.nodes;
    Ok(spec)
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Machine { json } => {
            let info = machine::MachineInfo::detect();
            if json {
                outln!(
                    "{}",
                    serde_json::to_string(&info).map_err(|e| e.to_string())?
                );
            } else {
                info.print();
            }
        }
        Command::Bench {
            suite,
            json,
            threads,
            seconds: s,
            rounds: n,
            groups,
        } => {
            let threads = bench::parse_threads(&threads)?;
            if matches!(suite.as_str(), "alloc" | "preload") {
                bench::worker::check_threads(&suite, &threads)?;
            }
            let plan = plan(s, n)?;
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let result = match suite.as_str() {
                "cpu-id" => bench::cpu_id::run(&threads, &plan),
                "counters" => bench::counters::run(&threads, &plan),
                "percpu" => bench::percpu::run(&threads, &plan),
                "charge" => bench::charge::run(&threads, &plan),
                "fault" => bench::fault::run(&threads, &plan),
                "stats" => bench::stats::run(stats_groups(groups)?, &plan),
                "alloc" => bench::alloc::run(&exe, &threads, &plan, bench::alloc::RssPlan::FULL),
                "async" => bench::requests::run(&exe, &threads, &plan),
                "metrics" => bench::recorders::run(&threads, &plan),
                "groups" => bench::groups::run(
                    &threads,
                    &plan,
                    bench::groups::RSS_CYCLES,
                    bench::groups::SIBLINGS,
                ),
                "layout" => bench::layout::run(&plan),
                "ffi" => bench::ffi::run(&threads, &plan),
                "preload" => bench::preload::run(&exe, &threads, &plan).map(|(b, setup)| {
                    let left_out = setup.left_out();
                    if !left_out.is_empty() {
                        eprintln!("{left_out}");
                    }
                    b
                }),
                "noisy" => bench::noisy::run(&exe, &plan),
                other => {
                    return Err(format!(
                        "unknown suite {other:?} (known: {})",
                        bench::SUITES.join(", ")
                    ))
                }
            };
            let result = result?;
            if json {
                bench::print_json(&result.records);
            } else {
                bench::print_table(&result);
            }
        }
        Command::Accuracy {
            design,
            cpus,
            shape,
            seed,
            steps: steps_asked,
            max_error,
            json,
        } => {
            let mut records = Vec::new();
            let mut choices = Vec::new();
            let (designs, counts) = (designs(&design)?, cpu_counts(&cpus)?);
            // Before anything runs: a CPU count that cannot fit is refused
            // up front, not after the smaller ones were measured.
            let available = machine::memory::available();
            for &d in &designs {
                for &n in &counts {
                    accuracy::check_memory(d, n, available)?;
                }
            }
            for d in designs {
                for &n in &counts {
                    let mut s = spec(d, n, &shape)?;
                    s.seed = seed;
                    s.steps = steps(steps_asked)?;
                    s.max_error = max_error;
                    if max_error.is_some() {
                        let c = accuracy::choose(&s)?;
                        if json {
                            outln!("{}", serde_json::to_string(&c).map_err(|e| e.to_string())?);
                        }
                        choices.push(c);
                        continue;
                    }
                    let r = accuracy::measure(&s)?;
                    if json {
                        outln!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
                    }
                    records.push(r);
                }
            }
            if !json && max_error.is_some() {
                accuracy::print_choices(&choices);
            } else if !json {
                accuracy::print_table(&records);
            }
        }
        Command::Replay {
            design,
            cpus,
            shape,
        } => {
            let design: Design = design
                .parse()
                .map_err(|e: splitcount::counter::ConfigError| e.to_string())?;
            let s = spec(design, cpus, &shape)?;
            accuracy::check_memory(design, cpus, machine::memory::available())?;
            replay::run(&s, std::io::stdin().lock(), std::io::stdout().lock())?;
        }
        Command::Report { quick, suites, out } => {
            report::run(&report::Options { quick, suites, out })?
        }
        Command::Drift { json } => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let rows = splitcount_lab::drift::run(&exe)?;
            if json {
                for r in &rows {
                    outln!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
                }
            } else {
                splitcount_lab::drift::print_table(&rows);
            }
        }
        Command::Footprint { cpus, json } => {
            let rows = footprint::run(&cpu_counts(&cpus)?)?;
            if json {
                for r in &rows {
                    outln!("{}", serde_json::to_string(r).map_err(|e| e.to_string())?);
                }
            } else {
                footprint::print_table(&rows);
            }
        }
        Command::DriftWorker => splitcount_lab::drift::serve(std::io::stdout().lock())?,
        Command::AllocWorker => bench::worker::serve(
            std::io::stdin().lock(),
            std::io::stdout().lock(),
            bench::jobs::run,
        )?,
    }
    Ok(())
}
