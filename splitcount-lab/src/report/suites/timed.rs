//! The timed suites (`counters`, `layout`, `charge`, `stats`, `alloc`,
//! `percpu`, `cpu-id`):
//! each runs its `bench` module and shows the records as one table — a row
//! per case, a column per thread count, each cell the absolute time per
//! operation beside its ratio to the suite's baseline at the same thread
//! count — plus plots of both against the thread count.

use super::{counted, with_case, Outcome, Settings};
use crate::bench::{self, Record};
use crate::report::plots::{self, Axis, Bar, Chart, Series, Style};
use crate::report::published;
use crate::report::table::Table;
use indicatif::ProgressBar;
use serde_json::json;
use std::time::Duration;

/// `counters`: every design, the floor, a shared atomic and two peers.
pub fn counters(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let threads = s.threads();
    progress.set_length((bench::counters::CASES.len() * threads.len()) as u64);
    let records = counted(progress, || bench::counters::run(&threads, s.per_case()));
    outcome(s, "counters", &threads, records, "add")
}

/// `charge`: the page-fault-like loop and the multi-tenant stock cases.
pub fn charge(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let threads = vec![1, 2];
    progress.set_length((3 * threads.len() + 5) as u64);
    let records = counted(progress, || bench::charge::run(&threads, s.per_case()));
    outcome(s, "charge", &threads, records, "op")
}

/// `percpu`: one add to a per-CPU slot, rseq vs atomic.
pub fn percpu(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let threads = s.threads();
    progress.set_length((4 * threads.len()) as u64);
    let records = counted(progress, || bench::percpu::run(&threads, s.per_case()));
    outcome(s, "percpu", &threads, records, "add")
}

/// `cpu-id`: each CPU-id source, on one thread.
pub fn cpu_id(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let threads = vec![1];
    progress.set_length(4);
    let records = counted(progress, || bench::cpu_id::run(&threads, s.per_case()));
    outcome(s, "cpu-id", &threads, records, "lookup")
}

/// `stats`: flush vs full walk in a 10,000-group tree (1,000 with
/// `--quick`), and the update cost.
pub fn stats(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    progress.set_length(1);
    let groups = if s.quick { 1_000 } else { 10_000 };
    let records = bench::stats::run(groups, s.per_case());
    progress.inc(1);
    let mut out = outcome_with("stats", &[1], s.per_case(), &records, "op")?;
    out.settings["groups"] = json!(groups);
    out.plots = vec![plots::bar_chart(
        "stats: ns per operation (one thread)",
        "ns per op",
        &bars(&records),
    )?];
    Ok(out)
}

/// `alloc`: a malloc-heavy loop through `System` and through `Accounted`.
pub fn alloc(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let threads = vec![1, 2];
    progress.set_length((2 * threads.len()) as u64);
    let records = counted(progress, || bench::alloc::run(&threads, s.per_case()));
    outcome(s, "alloc", &threads, records, "alloc+free")
}

/// One bar per record: its time, labelled with its ratio.
fn bars(records: &[Record]) -> Vec<Bar> {
    records
        .iter()
        .map(|r| Bar {
            label: r.case.clone(),
            value: r.ns_per_op,
            note: r
                .ratio
                .map_or_else(String::new, |x| format!("×{}", ratio(x))),
            color_of: r.case.clone(),
        })
        .collect()
}

/// `layout`: packed vs padded fields, two threads in two roles, each
/// layout for twice as long as one case of the other suites (in rounds).
pub fn layout(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    progress.set_length((bench::layout::CASES.len() as u32 * bench::layout::ROUNDS) as u64);
    let per_case = s.per_case() * 2;
    let records = counted(progress, || bench::layout::run(per_case));
    let mut out = outcome_with("layout", &[2], per_case, &records, "op")?;
    out.plots = vec![plots::bar_chart(
        "layout: ns per operation of each role (2 threads)",
        "ns per op",
        &bars(&records),
    )?];
    Ok(out)
}

fn outcome(
    s: &Settings,
    suite: &str,
    threads: &[usize],
    records: Vec<Record>,
    op: &str,
) -> Result<Outcome, String> {
    let mut out = outcome_with(suite, threads, s.per_case(), &records, op)?;
    out.plots = thread_plots(suite, &records, op)?;
    Ok(out)
}

fn outcome_with(
    suite: &str,
    threads: &[usize],
    per_case: Duration,
    records: &[Record],
    op: &str,
) -> Result<Outcome, String> {
    Ok(Outcome {
        settings: json!({
            "seconds_per_case": per_case.as_secs_f64(),
            "threads": threads,
            "baselines": baselines(records),
        }),
        records: records
            .iter()
            .map(|r| with_case(&r.case, r))
            .collect::<Result<_, _>>()?,
        tables: vec![table(suite, records, op)],
        plots: Vec::new(),
    })
}

/// A ratio with the digits that matter.
fn ratio(x: f64) -> String {
    if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 0.1 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// Nanoseconds with the digits that matter.
fn nanos(ns: f64) -> String {
    if ns >= 100.0 {
        format!("{ns:.0}")
    } else if ns >= 10.0 {
        format!("{ns:.1}")
    } else {
        format!("{ns:.2}")
    }
}

/// The distinct baselines of `records`, in first-appearance order.
fn baselines(records: &[Record]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for b in records.iter().filter_map(|r| r.baseline.as_deref()) {
        if !out.contains(&b) {
            out.push(b);
        }
    }
    out
}

/// Distinct thread counts of `records`, ascending.
fn thread_counts(records: &[Record]) -> Vec<usize> {
    let mut t: Vec<usize> = records.iter().map(|r| r.threads).collect();
    t.sort_unstable();
    t.dedup();
    t
}

/// Case names in first-appearance order.
fn cases(records: &[Record]) -> Vec<&str> {
    let mut c: Vec<&str> = Vec::new();
    for r in records {
        if !c.contains(&r.case.as_str()) {
            c.push(&r.case);
        }
    }
    c
}

/// One row per case, one column per thread count: `ns/op ×ratio`; a
/// column of published figures where the suite has any.
fn table(suite: &str, records: &[Record], op: &str) -> Table {
    let baselines = baselines(records);
    let counts = thread_counts(records);
    let mut t = Table::new(format!(
        "{suite}: ns per {op} per thread, × {} at the same thread count",
        match baselines.as_slice() {
            [] => "(no baseline)".to_owned(),
            [one] => (*one).to_owned(),
            more => format!("its baseline ({})", more.join(", ")),
        }
    ))
    .text("case");
    for &n in &counts {
        t = t.number(&format!("{n} thread{}", if n == 1 { "" } else { "s" }));
    }
    let published = !published::of(suite).is_empty();
    if published {
        t = t.published();
    }
    for case in cases(records) {
        let mut row = vec![case.to_owned()];
        for &n in &counts {
            row.push(
                records
                    .iter()
                    .find(|r| r.case == case && r.threads == n)
                    .map_or_else(String::new, |r| match r.ratio {
                        Some(x) => format!("{} ns ×{}", nanos(r.ns_per_op), ratio(x)),
                        None => format!("{} ns", nanos(r.ns_per_op)),
                    }),
            );
        }
        if published {
            row.push(published::cell(suite, case, None));
        }
        t.row(row);
    }
    if !baselines.is_empty() {
        t.note(format!(
            "×: time per {op} divided by the baseline's at the same thread count, both \
             measured in this run; ops/s of all threads together are in report.json"
        ));
    }
    for n in published::notes(suite) {
        t.note(n);
    }
    t
}

/// `× baseline` and `ns/op` against threads, for cases measured at two or
/// more thread counts (none when the suite ran at one).
fn thread_plots(suite: &str, records: &[Record], op: &str) -> Result<Vec<String>, String> {
    if thread_counts(records).len() < 2 {
        return Ok(Vec::new());
    }
    let series = |value: fn(&Record) -> Option<f64>| -> Vec<Series> {
        cases(records)
            .into_iter()
            .filter_map(|case| {
                let points: Vec<(f64, f64)> = records
                    .iter()
                    .filter(|r| r.case == case)
                    .filter_map(|r| Some((r.threads as f64, value(r)?)))
                    .collect();
                (points.len() >= 2).then(|| Series {
                    name: Some(case.to_owned()),
                    color_of: case.to_owned(),
                    points,
                    style: Style::LinePoints,
                })
            })
            .collect()
    };
    let baseline = records
        .iter()
        .find_map(|r| r.baseline.clone())
        .unwrap_or_default();
    let mut out = Vec::new();
    if !baseline.is_empty() {
        out.push(plots::line_chart(&Chart {
            title: format!("{suite}: time per {op} ÷ {baseline} (same run, same threads)"),
            x_label: "threads".into(),
            y_label: format!("× {baseline}"),
            x_axis: Axis::Log2,
            y_axis: Axis::Log,
            series: series(|r| r.ratio),
            marks: Vec::new(),
            key: Vec::new(),
        })?);
    }
    out.push(plots::line_chart(&Chart {
        title: format!("{suite}: ns per {op} per thread"),
        x_label: "threads".into(),
        y_label: format!("ns per {op}"),
        x_axis: Axis::Log2,
        y_axis: Axis::Log,
        series: series(|r| Some(r.ns_per_op)),
        marks: Vec::new(),
        key: Vec::new(),
    })?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(case: &str, threads: usize, ns: f64, base: f64) -> Record {
        Record {
            suite: "counters".into(),
            case: case.into(),
            threads,
            ns_per_op: ns,
            ops_per_sec: 1e9 / ns * threads as f64,
            ratio: Some(ns / base),
            baseline: Some("shared-atomic".into()),
        }
    }

    #[test]
    fn the_table_has_a_column_per_thread_count_and_the_published_figure() {
        let records = vec![
            rec("shared-atomic", 1, 5.0, 5.0),
            rec("tree", 1, 2.5, 5.0),
            rec("shared-atomic", 2, 40.0, 40.0),
            rec("tree", 2, 2.0, 40.0),
        ];
        let t = table("counters", &records, "add");
        let names: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "case",
                "1 thread",
                "2 threads",
                crate::report::table::PUBLISHED
            ]
        );
        assert_eq!(t.rows[1], ["tree", "2.50 ns ×0.50", "2.00 ns ×0.050", ""]);
        assert!(t.rows[0][3].contains("hundreds of ns"));
        assert!(t.notes.iter().any(|n| n.contains("measured elsewhere")));
    }

    #[test]
    fn plots_need_two_thread_counts() {
        let one = vec![rec("tree", 1, 2.5, 5.0)];
        assert!(thread_plots("counters", &one, "add").unwrap().is_empty());
        let two = vec![rec("tree", 1, 2.5, 5.0), rec("tree", 2, 2.0, 40.0)];
        assert_eq!(thread_plots("counters", &two, "add").unwrap().len(), 2);
    }
}
