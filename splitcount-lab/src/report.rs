//! `splitcount-lab report`: every available suite, in the terminal and as
//! `report.json` in the output directory.

use crate::bench::{self, Record};
use crate::machine::MachineInfo;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

#[derive(Serialize)]
struct Report {
    machine: MachineInfo,
    suites: Vec<Suite>,
}

#[derive(Serialize)]
struct Suite {
    name: String,
    records: Vec<Record>,
}

/// Run the suites and write `out/report.json`.
pub fn run(quick: bool, out: &Path) -> Result<(), String> {
    let machine = MachineInfo::detect();
    machine.print();
    println!();
    let per_case = Duration::from_millis(if quick { 50 } else { 300 });
    let threads: Vec<usize> = if quick { vec![1] } else { vec![1, 2] };

    let cpu_id = bench::cpu_id::run(&threads, per_case);
    bench::print_table(&cpu_id);

    let report = Report {
        machine,
        suites: vec![Suite {
            name: "cpu-id".into(),
            records: cpu_id,
        }],
    };
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let path = out.join("report.json");
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("\nwrote {}", path.display());
    Ok(())
}
