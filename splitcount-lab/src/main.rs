//! `splitcount-lab`: the splitcount lab — machine shape, benchmarks,
//! accuracy simulation and the report.

mod bench;
mod machine;
mod report;

use clap::{Parser, Subcommand};
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
    /// Run a benchmark suite.
    Bench {
        /// The suite: `cpu-id`.
        suite: String,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
        /// Thread counts, e.g. `1,2,4,8`.
        #[arg(long, default_value = "1")]
        threads: String,
        /// Seconds per case.
        #[arg(long, default_value_t = 0.5)]
        seconds: f64,
    },
    /// Run every available suite and write the report.
    Report {
        /// Shorter runs, for smoke tests.
        #[arg(long)]
        quick: bool,
        /// Output directory.
        #[arg(long, default_value = "target/splitcount-report")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
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
        } => {
            let threads = bench::parse_threads(&threads)?;
            let duration = seconds(s)?;
            let records = match suite.as_str() {
                "cpu-id" => bench::cpu_id::run(&threads, duration),
                other => return Err(format!("unknown suite {other:?} (known: cpu-id)")),
            };
            if json {
                bench::print_json(&records);
            } else {
                bench::print_table(&records);
            }
        }
        Command::Report { quick, out } => report::run(quick, &out)?,
    }
    Ok(())
}
