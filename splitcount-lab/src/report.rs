//! `splitcount-lab report`: every available suite, in the terminal and as
//! `report.json` in the output directory.

use crate::accuracy;
use crate::bench::{self, Record};
use crate::machine::MachineInfo;
use serde::Serialize;
use splitcount::counter::Design;
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    records: Vec<Record>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    accuracy: Vec<accuracy::Record>,
}

/// Run the suites and write `out/report.json`.
pub fn run(quick: bool, out: &Path) -> Result<(), String> {
    let machine = MachineInfo::detect();
    machine.print();
    println!();
    let per_case = Duration::from_millis(if quick { 50 } else { 300 });
    let threads: Vec<usize> = if quick { vec![1, 2] } else { vec![1, 2, 4, 8] };
    let mut suites = Vec::new();

    let cpu_id = bench::cpu_id::run(&threads[..1], per_case);
    bench::print_table(&cpu_id);
    suites.push(Suite {
        name: "cpu-id".into(),
        records: cpu_id,
        accuracy: Vec::new(),
    });
    println!();

    let percpu = bench::percpu::run(&threads, per_case);
    bench::print_table(&percpu);
    suites.push(Suite {
        name: "percpu".into(),
        records: percpu,
        accuracy: Vec::new(),
    });
    println!();

    let counters = bench::counters::run(&threads, per_case);
    bench::print_table(&counters);
    suites.push(Suite {
        name: "counters".into(),
        records: counters,
        accuracy: Vec::new(),
    });
    println!();

    let charge = bench::charge::run(&threads[..2], per_case);
    bench::print_table(&charge);
    suites.push(Suite {
        name: "charge".into(),
        records: charge,
        accuracy: Vec::new(),
    });
    println!();

    let cpus: &[usize] = if quick {
        &[2, 64, 4096]
    } else {
        &[2, 8, 64, 256, 1024, 4096]
    };
    let mut acc = Vec::new();
    for design in Design::ALL {
        for &n in cpus {
            let mut spec = accuracy::Spec::new(design, n);
            if quick {
                spec.steps = 10_000;
            }
            acc.push(accuracy::measure(&spec)?);
        }
    }
    println!("suite accuracy");
    accuracy::print_table(&acc);
    suites.push(Suite {
        name: "accuracy".into(),
        records: Vec::new(),
        accuracy: acc,
    });

    let report = Report { machine, suites };
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let path = out.join("report.json");
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("\nwrote {}", path.display());
    Ok(())
}
