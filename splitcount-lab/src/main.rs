//! `splitcount-lab`: the splitcount lab — machine shape, benchmarks,
//! accuracy simulation, replay and the report.

use clap::{Parser, Subcommand};
use splitcount::counter::{Arity, Design};
use splitcount::cpu::MAX_CPUS;
use splitcount_lab::{accuracy, bench, machine, parse_list, replay, report};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
    /// Run a benchmark suite: `cpu-id`, `percpu`, `counters`, `charge`,
    /// `stats`, `alloc` or `layout`.
    Bench {
        /// The suite: `cpu-id`, `percpu`, `counters`, `charge`, `stats`,
        /// `alloc` or `layout` (`layout` always runs two threads and ignores
        /// `--threads`).
        suite: String,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Thread counts, e.g. `1,2,4,8`.
        #[arg(long, default_value = "1,2")]
        threads: String,
        /// Seconds per case.
        #[arg(long, default_value_t = 0.5)]
        seconds: f64,
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
        /// Random-walk steps per (design, CPUs).
        #[arg(long, default_value_t = 100_000)]
        steps: usize,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Replay `{"cpu":c,"delta":d}` lines from stdin into a simulated counter.
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
    /// Run every suite (or those of `--suites`), print the tables and write
    /// `report.json` and `index.html`.
    Report {
        /// Shorter runs, for smoke tests (under a minute on 2 cores).
        #[arg(long)]
        quick: bool,
        /// Suites to run, comma-separated (default: all): counters, accuracy,
        /// watchdog, layout, charge, percpu, cpu-id.
        #[arg(long)]
        suites: Option<String>,
        /// Output directory.
        #[arg(long, default_value = "target/splitcount-report")]
        out: PathBuf,
    },
}

/// How a simulated counter is built (`accuracy` and `replay`).
#[derive(clap::Args)]
struct Shape {
    /// Batch (default: each design's own).
    #[arg(long)]
    batch: Option<u64>,
    /// Tree fan-outs: `auto`, `binary` or e.g. `8,8,8` (bottom first).
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
    // write fail, and `println!` panic).
    #[cfg(unix)]
    // SAFETY: resetting a signal's disposition before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("splitcount-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

fn seconds(s: f64) -> Result<Duration, String> {
    if s.is_finite() && s > 0.0 && s <= 3600.0 {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(format!("--seconds must be between 0 and 3600, not {s}"))
    }
}

fn designs(s: &str) -> Result<Vec<Design>, String> {
    if s.trim() == "all" {
        return Ok(Design::ALL.to_vec());
    }
    parse_list(s, "design", |d| d.parse().ok())
}

fn cpu_counts(s: &str) -> Result<Vec<usize>, String> {
    parse_list(s, "CPU count", |c| {
        c.parse().ok().filter(|n| (1..=MAX_CPUS).contains(n))
    })
}

fn spec(design: Design, cpus: usize, shape: &Shape) -> Result<accuracy::Spec, String> {
    let mut spec = accuracy::Spec::new(design, cpus);
    spec.batch = shape.batch;
    spec.arity = shape.arity.parse::<Arity>().map_err(|e| e.to_string())?;
    spec.nodes = shape.nodes;
    Ok(spec)
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Machine { json } => {
            let info = machine::MachineInfo::detect();
            if json {
                println!(
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
            groups,
        } => {
            let threads = bench::parse_threads(&threads)?;
            let duration = seconds(s)?;
            let records = match suite.as_str() {
                "cpu-id" => bench::cpu_id::run(&threads, duration),
                "counters" => bench::counters::run(&threads, duration),
                "percpu" => bench::percpu::run(&threads, duration),
                "charge" => bench::charge::run(&threads, duration),
                "stats" => bench::stats::run(groups.clamp(1, 1_000_000), duration),
                "alloc" => bench::alloc::run(&threads, duration),
                "layout" => bench::layout::run(duration),
                other => {
                    return Err(format!(
                        "unknown suite {other:?} (known: cpu-id, percpu, counters, charge, stats, alloc, layout)"
                    ))
                }
            };
            if json {
                bench::print_json(&records);
            } else {
                bench::print_table(&records);
            }
        }
        Command::Accuracy {
            design,
            cpus,
            shape,
            seed,
            steps,
            json,
        } => {
            let mut records = Vec::new();
            for d in designs(&design)? {
                for &n in &cpu_counts(&cpus)? {
                    let mut s = spec(d, n, &shape)?;
                    s.seed = seed;
                    s.steps = steps;
                    let r = accuracy::measure(&s)?;
                    if json {
                        println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
                    }
                    records.push(r);
                }
            }
            if !json {
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
            replay::run(&s, std::io::stdin().lock(), std::io::stdout().lock())?;
        }
        Command::Report { quick, suites, out } => {
            report::run(&report::Options { quick, suites, out })?
        }
    }
    Ok(())
}
