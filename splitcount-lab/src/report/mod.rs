//! `splitcount-lab report`: every suite (or those `--suites` names), one
//! progress bar per suite, tables in the terminal, and in the output
//! directory `report.json` (the machine and every record) and `index.html`
//! (the same tables with inline SVG plots).
//!
//! Honest numbers: every timing is a ratio to a baseline measured in the
//! same run, with the absolute time beside it; the machine's shape is at the
//! top; figures the anchors published are in a column of their own, labelled
//! as measured elsewhere. The suites are listed in [`suites::SUITES`].

pub mod html;
pub mod plots;
pub mod published;
pub mod suites;
pub mod table;
pub mod targets;

use crate::machine::{self, MachineInfo};
use indicatif::{ProgressBar, ProgressStyle};
use published::Published;
use serde::Serialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use suites::{Settings, Suite};
use table::Table;
use targets::{Status, Verdict, TARGETS};

/// What `report` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Shorter runs, for smoke tests.
    pub quick: bool,
    /// Comma-separated suite names (`None`: all).
    pub suites: Option<String>,
    /// Where `report.json` and `index.html` go.
    pub out: PathBuf,
}

/// `report.json`.
#[derive(Serialize)]
struct Report {
    generator: String,
    quick: bool,
    seconds: f64,
    machine: MachineInfo,
    verdicts: Vec<Verdict>,
    suites: Vec<SuiteJson>,
}

/// One suite in `report.json`.
#[derive(Serialize)]
struct SuiteJson {
    name: &'static str,
    title: &'static str,
    seconds: f64,
    settings: Value,
    records: Vec<Value>,
    published: Vec<Published>,
}

/// A suite that ran, with what it produced.
struct Ran {
    suite: &'static Suite,
    seconds: f64,
    outcome: suites::Outcome,
}

/// Whether the report's files can be written in `out` (an existing
/// directory), asked of the kernel for this process's effective user
/// (`faccessat` with `AT_EACCESS`): each file that exists can be written
/// and is not a directory, and the directory takes a new file where one
/// does not. Checked before the measuring: a directory the user cannot
/// write failed only at the end, after minutes of it. Nothing is created:
/// the files are written at the end, as before (a probe file could follow a
/// symbolic link planted in a shared directory).
fn check_writable(out: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let writable = |path: &Path| -> std::io::Result<()> {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: a NUL-terminated path; no pointer is kept.
        let rc =
            unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let mut missing = false;
    for name in ["report.json", "index.html"] {
        let path = out.join(name);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => {
                return Err(format!(
                    "cannot write {}: it is a directory",
                    path.display()
                ));
            }
            Ok(_) => {
                writable(&path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
            // Missing (or a link to a file not made yet): made in `out`.
            Err(_) => missing = true,
        }
    }
    if missing {
        writable(out).map_err(|e| format!("cannot write in {}: {e}", out.display()))?;
    }
    Ok(())
}

/// Run the selected suites and write `out/report.json` and `out/index.html`.
pub fn run(options: &Options) -> Result<(), String> {
    let selected = suites::select(options.suites.as_deref())?;
    // Fail on an unwritable directory before minutes of measuring.
    let out = &options.out;
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    check_writable(out)?;
    let start = Instant::now();
    let machine = MachineInfo::detect();
    let settings = Settings {
        quick: options.quick,
    };
    // While suites run, only their progress shows; the report itself is
    // printed at the end, in reading order: the summary of verdicts first,
    // then the machine, then every suite's tables.
    let mut ran = Vec::new();
    for suite in selected {
        let progress = progress_bar(suite.name);
        let t0 = Instant::now();
        let outcome = (suite.run)(&settings, &progress);
        progress.finish_and_clear();
        let outcome = outcome.map_err(|e| format!("suite {}: {e}", suite.name))?;
        let seconds = t0.elapsed().as_secs_f64();
        eprintln!("measured {} ({seconds:.1} s)", suite.name);
        ran.push(Ran {
            suite,
            seconds,
            outcome,
        });
    }
    // Measured again at the end: a host that moved the vCPUs meanwhile
    // shows here, and explains contended figures that drifted.
    let round_trip_at_end = machine::host::line_round_trip_ns();
    let machine_table = machine_table(&machine, round_trip_at_end);
    let verdicts = gather_verdicts(&ran);
    let verdict_table = verdict_table(&verdicts);
    if !verdicts.is_empty() {
        outln!("== Summary: the targets, measured here\n");
        outln!("{}\n", verdict_table.to_text());
    }
    outln!("{}\n", machine_table.to_text());
    for r in &ran {
        outln!("== {} ({:.1} s)", r.suite.title, r.seconds);
        outln!("  {}", r.suite.about);
        for t in &r.outcome.tables {
            outln!("{}\n", t.to_text());
        }
    }
    if !verdicts.is_empty() {
        let count = |s: targets::Status| verdicts.iter().filter(|v| v.status == s).count();
        outln!(
            "verdicts (summary at the top): {} met, {} not met, {} unstable, {} not measured",
            count(targets::Status::Met),
            count(targets::Status::NotMet),
            count(targets::Status::Unstable),
            count(targets::Status::NotMeasured)
        );
    }
    let seconds = start.elapsed().as_secs_f64();
    let page = Page {
        quick: options.quick,
        seconds,
        machine_table: &machine_table,
        verdicts: &verdict_table,
    };
    write(out, &page, machine, verdicts, ran)?;
    outln!(
        "wrote {} and {} ({seconds:.1} s)",
        out.join("report.json").display(),
        out.join("index.html").display()
    );
    Ok(())
}

/// Every suite's verdicts, in the order of [`TARGETS`].
fn gather_verdicts(ran: &[Ran]) -> Vec<Verdict> {
    let mut all: Vec<Verdict> = ran
        .iter()
        .flat_map(|r| r.outcome.verdicts.iter().cloned())
        .collect();
    all.sort_by_key(|v| TARGETS.iter().position(|t| t.name == v.name));
    all
}

/// The summary: one row per target, its goal, the median with its range,
/// and the mark.
pub fn verdict_table(verdicts: &[Verdict]) -> Table {
    let mut t = Table::new(
        "verdicts: each target's figure, the median of per-round values with their range",
    )
    .text("target")
    .text("goal")
    .number("measured")
    .number("range")
    .number("rounds")
    .text("verdict");
    for v in verdicts {
        let mark = match v.status {
            Status::Met => "✓ met",
            Status::NotMet => "✗ not met",
            Status::Unstable => "? unstable",
            Status::NotMeasured => "— not measured",
        };
        t.row_with_class(
            vec![
                v.name.clone(),
                v.target.clone(),
                v.measured(),
                v.range(),
                v.rounds.to_string(),
                mark.to_owned(),
            ],
            v.status.name().replace(' ', "-"),
        );
    }
    t.note(
        "met / not met: the median against the goal, for a stable figure; unstable: the two \
         halves of the rounds differ by more than 10%, or too few rounds had the threads \
         running together — trust neither verdict, rerun on a quieter machine",
    );
    for v in verdicts.iter().filter(|v| !v.note.is_empty()) {
        t.note(format!("{}: {}", v.name, v.note));
    }
    t
}

fn progress_bar(name: &str) -> ProgressBar {
    let style =
        ProgressStyle::with_template("{prefix:>9} [{bar:32.cyan/blue}] {pos}/{len} {elapsed:>4}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    let bar = ProgressBar::new(0)
        .with_style(style)
        .with_prefix(name.to_owned());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// What the page shows above the suites.
struct Page<'a> {
    quick: bool,
    seconds: f64,
    machine_table: &'a Table,
    verdicts: &'a Table,
}

fn write(
    out: &Path,
    page: &Page,
    machine: MachineInfo,
    verdicts: Vec<Verdict>,
    ran: Vec<Ran>,
) -> Result<(), String> {
    let (quick, seconds) = (page.quick, page.seconds);
    let lead = vec![
        format!(
            "Measured on this machine by splitcount-lab {} ({} run, {seconds:.0} s).",
            env!("CARGO_PKG_VERSION"),
            if quick { "quick" } else { "full" }
        ),
        "Every timing is the median of per-round ratios to a baseline measured in the same \
         round (cases run in interleaved rounds, threads pinned one per CPU), with the range \
         over the rounds and the absolute time beside it; † marks a figure whose two halves \
         of rounds disagree. The published column holds figures the kernel and its anchors \
         reported: measured elsewhere, on other machines, for context only; their sources \
         are in IMPLEMENTATION.md, §9."
            .to_owned(),
    ];
    let sections: Vec<html::Section> = ran
        .iter()
        .map(|r| html::Section {
            id: r.suite.name,
            title: r.suite.title,
            about: r.suite.about,
            seconds: r.seconds,
            tables: &r.outcome.tables,
            plots: &r.outcome.plots,
        })
        .collect();
    let html = html::page(&lead, page.verdicts, page.machine_table, &sections);
    let report = Report {
        generator: format!("splitcount-lab {}", env!("CARGO_PKG_VERSION")),
        quick,
        seconds,
        machine,
        verdicts,
        suites: ran
            .into_iter()
            .map(|r| SuiteJson {
                name: r.suite.name,
                title: r.suite.title,
                seconds: r.seconds,
                settings: r.outcome.settings,
                records: r.outcome.records,
                published: published::of(r.suite.name),
            })
            .collect(),
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    let save = |name: &str, text: &str| {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    save("report.json", &json)?;
    save("index.html", &html)
}

/// The machine's shape as a two-column table; `round_trip_at_end`: the
/// cache-line round trip measured again when the suites have run.
fn machine_table(m: &MachineInfo, round_trip_at_end: Option<f64>) -> Table {
    let mut t = Table::new("machine").text("property").text("value");
    let mut add = |k: &str, v: String| t.row(vec![k.to_owned(), v]);
    add("CPU", format!("{} ({})", m.cpu_model, m.cpu_vendor));
    add("virtualisation", m.virtualization.clone());
    add("performance counters", m.perf_counters.clone());
    add("two threads pinned to", m.two_threads.clone());
    if let Some(start) = m.line_round_trip_ns {
        add(
            "cache-line round trip between them",
            match round_trip_at_end {
                Some(end) => format!(
                    "{start:.0} ns at the start, {end:.0} ns at the end (where the host runs \
                     the two CPUs; contended figures move with it)"
                ),
                None => format!("{start:.0} ns"),
            },
        );
    }
    add(
        "CPUs",
        format!(
            "{} possible ({}), {} online",
            m.possible_cpus, m.possible_cpu_list, m.online_cpus
        ),
    );
    add("NUMA nodes", m.numa_nodes.to_string());
    for c in &m.caches {
        add(
            &format!("L{} {}", c.level, c.kind),
            format!(
                "{} domain(s), up to {} CPU(s) each",
                c.domains, c.cpus_per_domain
            ),
        );
    }
    add("CPU id source", m.cpu_id_source.name().to_owned());
    add(
        "rseq",
        format!(
            "registered by {}; per-CPU adds use {}",
            m.rseq_owner_name(),
            m.percpu_add_name()
        ),
    );
    add(
        "mm_cid",
        if m.mm_cid_available {
            "available".to_owned()
        } else {
            "not available".to_owned()
        },
    );
    add("kernel", m.kernel.clone());
    add("topology from", m.topology_source_name());
    t
}
