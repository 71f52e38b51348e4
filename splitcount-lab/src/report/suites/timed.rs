//! The timed suites (`counters`, `layout`, `charge`, `fault`, `stats`, `alloc`,
//! `ffi`, `async`, `noisy`, `groups`, `percpu`, `cpu-id`): each runs its
//! `bench` module (interleaved rounds, [`crate::timing`]) and shows the
//! records as one table — a row per case, a column per thread count, each
//! cell the time per operation beside the median ratio to the suite's
//! baseline and its range over the rounds — plus plots, the notes that say
//! how far to trust the figures, and the verdicts on the targets the suite
//! measures.

use super::{counted, with_case, Outcome, Settings};
use crate::bench::worker::HugePages;
use crate::bench::{self, Bench, Record};
use crate::report::plots::{self, Axis, Bar, Chart, Series, Style};
use crate::report::published;
use crate::report::table::Table;
use crate::report::targets;
use crate::timing::MIN_OVERLAP;
use indicatif::ProgressBar;
use serde_json::json;

/// `counters`: every design, the floor, a shared atomic and the peers.
pub fn counters(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let threads = s.threads();
    let b = counted(progress, || bench::counters::run(&threads, &s.plan()))?;
    let mut out = outcome("counters", &b, "add")?;
    out.plots = thread_plots("counters", &b.records, "add")?;
    Ok(out)
}

/// `charge`: the page-fault-like loop, its miss path and the tenants.
pub fn charge(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let b = counted(progress, || bench::charge::run(&[1, 2], &s.plan()))?;
    let mut out = outcome("charge", &b, "op")?;
    out.plots = thread_plots("charge", &b.records, "op")?;
    Ok(out)
}

/// `fault`: real page faults, charged as the kernel charges them, at 1
/// and 2 threads; × is faults per second (higher is better).
pub fn fault(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let b = counted(progress, || bench::fault::run(&[1, 2], &s.plan()))?;
    let mut out = outcome(bench::fault::SUITE, &b, "fault")?;
    out.settings["pages_per_mmap"] = json!(bench::fault::PAGES);
    out.settings["cache_misses"] = json!(bench::fault::cache_misses());
    let bars: Vec<Bar> = b
        .records
        .iter()
        .filter(|r| r.baseline.as_deref() != Some(&r.case))
        .map(|r| ratio_bar(r, format!("{} ({}t)", r.case, r.threads)))
        .collect();
    out.plots = vec![plots::bar_chart(
        "fault: faults per second ÷ no accounting's (median of rounds; 1 is no cost)",
        "× faults/s",
        Axis::Linear,
        &bars,
    )?];
    Ok(out)
}

/// `percpu`: one add to a per-CPU slot, rseq vs atomic vs the bare add.
pub fn percpu(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let threads = s.threads();
    let b = counted(progress, || bench::percpu::run(&threads, &s.plan()))?;
    let mut out = outcome("percpu", &b, "add")?;
    out.plots = thread_plots("percpu", &b.records, "add")?;
    Ok(out)
}

/// `cpu-id`: each CPU-id source, on one thread.
pub fn cpu_id(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let b = counted(progress, || bench::cpu_id::run(&[1], &s.plan()))?;
    outcome("cpu-id", &b, "lookup")
}

/// `stats`: flush vs full walk in a 10,000-group tree (with `--quick` too:
/// the target's ratio is for that tree — a smaller one made a quick
/// report's verdict "not met" whatever the flush cost), and the update
/// cost; bars on a log scale.
pub fn stats(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let groups = 10_000;
    let b = counted(progress, || bench::stats::run(groups, &s.plan()))?;
    let mut out = outcome("stats", &b, "op")?;
    out.settings["groups"] = json!(groups);
    let bars = time_bars(&b.records);
    out.plots = vec![plots::bar_chart(
        "stats: ns per operation (one thread, log scale)",
        "ns per op",
        Axis::Log,
        &bars,
    )?];
    Ok(out)
}

/// `alloc`: each workload through `System` and through `Accounted`, in two
/// worker processes.
pub fn alloc(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the lab binary: {e}"))?;
    // The resident bytes per block take a fresh worker per allocator and
    // size: a quick report holds a quarter of the blocks, and only with huge
    // pages off (as the allocators ask for them would take as long again).
    let rss = if s.quick {
        bench::alloc::RssPlan {
            pages: &[HugePages::Off],
            blocks: bench::worker::BLOCKS / 4,
        }
    } else {
        bench::alloc::RssPlan::FULL
    };
    let b = counted(progress, || {
        bench::alloc::run(&exe, &[1, 2], &s.plan(), rss)
    })?;
    let mut out = outcome("alloc", &b, "op")?;
    let bars: Vec<Bar> = b
        .records
        .iter()
        .filter(|r| r.case.ends_with("-accounted"))
        .map(|r| {
            let label = format!("{} ({}t)", r.case.trim_end_matches("-accounted"), r.threads);
            ratio_bar(r, label)
        })
        .collect();
    out.plots = vec![plots::bar_chart(
        "alloc: Accounted<System> ÷ System, per workload (median of rounds)",
        "× System",
        Axis::Linear,
        &bars,
    )?];
    Ok(out)
}

/// `ffi`: the C ABI's counter add and group charge vs the same from Rust,
/// on one thread.
pub fn ffi(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let b = counted(progress, || bench::ffi::run(&[1], &s.plan()))?;
    let mut out = outcome("ffi", &b, "call")?;
    out.plots = vec![plots::bar_chart(
        "ffi: a C call ÷ the same from Rust",
        "× baseline",
        Axis::Linear,
        &ratio_bars(&b.records),
    )?];
    Ok(out)
}

/// `preload`: the preload's `malloc`+`free` over glibc, jemalloc and
/// mimalloc, each ÷ the same allocator alone, on one thread.
pub fn preload(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the lab binary: {e}"))?;
    let (b, setup) = counted(progress, || bench::preload::run(&exe, &[1], &s.plan()))?;
    let mut out = outcome("preload", &b, "free+malloc (redis: request)")?;
    out.settings["preload"] = json!(setup.preload);
    let left_out = setup.left_out();
    // A verdict without a figure says why, as the suite's section does.
    if !left_out.is_empty() {
        for v in &mut out.verdicts {
            if v.status == targets::Status::NotMeasured {
                v.note.clone_from(&left_out);
            }
        }
    }
    out.settings["left_out"] = json!(left_out);
    out.plots = vec![plots::bar_chart(
        "preload: malloc+free under the preload ÷ the same allocator alone",
        "× baseline",
        Axis::Linear,
        &ratio_bars(&b.records),
    )?];
    Ok(out)
}

/// A bar of each record's ratio to its baseline (but the baselines'),
/// labelled with its case.
fn ratio_bars(records: &[Record]) -> Vec<Bar> {
    records
        .iter()
        .filter(|r| r.baseline.as_deref() != Some(&r.case))
        .map(|r| ratio_bar(r, r.case.clone()))
        .collect()
}

/// A bar of a record's ratio to its baseline, labelled `label`.
fn ratio_bar(r: &Record, label: String) -> Bar {
    Bar {
        label,
        value: r.ratio.unwrap_or(f64::NAN),
        note: r
            .ratio
            .map_or_else(String::new, |x| format!("×{}", ratio(x))),
        color_of: r.case.clone(),
    }
}

/// `async`: a request loop on a tokio runtime, with and without
/// `instrument`, in the accounted worker process.
pub fn requests(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the lab binary: {e}"))?;
    let b = counted(progress, || bench::requests::run(&exe, &[1, 2], &s.plan()))?;
    let mut out = outcome("async", &b, "request")?;
    out.plots = vec![plots::bar_chart(
        "async: CPU per request ÷ the plain request loop (median of rounds)",
        "× plain",
        Axis::Linear,
        &time_bars(&b.records)
            .into_iter()
            .zip(&b.records)
            .map(|(mut bar, r)| {
                bar.label = format!("{} ({}w)", r.case, r.threads);
                bar.value = r.ratio.unwrap_or(f64::NAN);
                bar
            })
            .collect::<Vec<_>>(),
    )?];
    Ok(out)
}

/// `noisy`: allocations in a group over its limit, and a healthy group's
/// beside it, in the accounted worker process.
pub fn noisy(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the lab binary: {e}"))?;
    let b = counted(progress, || bench::noisy::run(&exe, &s.plan()))?;
    let mut out = outcome("noisy", &b, "allocation")?;
    // Short labels: the case names do not fit side by side under the bars.
    let short = |case: &str| {
        let mode = if case.contains("cooperative") {
            "coop"
        } else {
            "refuse"
        };
        let role = ["noisy", "healthy"]
            .into_iter()
            .find(|r| case.ends_with(r))
            .unwrap_or("alone");
        format!("{mode} {role}")
    };
    let bars: Vec<Bar> = b
        .records
        .iter()
        .filter(|r| r.baseline.as_deref() != Some(&r.case))
        .map(|r| ratio_bar(r, short(&r.case)))
        .collect();
    out.plots = vec![plots::bar_chart(
        "noisy: × its baseline (log): ns/alloc, healthy allocs/s",
        "× baseline",
        Axis::Log,
        &bars,
    )?];
    Ok(out)
}

/// `metrics`: splitcount's recorder vs the Prometheus exporter's, at 1 and
/// 2 threads.
pub fn recorders(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let b = counted(progress, || bench::recorders::run(&[1, 2], &s.plan()))?;
    let mut out = outcome("metrics", &b, "increment")?;
    out.plots = thread_plots("metrics", &b.records, "increment")?;
    Ok(out)
}

/// `groups`: the per-request cycle at 1 and 2 threads, and the memory a
/// removed group leaves behind.
pub fn groups(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let cycles = if s.quick {
        20_000
    } else {
        bench::groups::RSS_CYCLES
    };
    let siblings = if s.quick {
        10_000
    } else {
        bench::groups::SIBLINGS
    };
    let b = counted(progress, || {
        bench::groups::run(&[1, 2], &s.plan(), cycles, siblings)
    })?;
    let mut out = outcome("groups", &b, "cycle")?;
    out.settings["rss_cycles"] = json!(cycles);
    out.plots = vec![plots::bar_chart(
        "groups: ns per request cycle",
        "ns per cycle",
        Axis::Linear,
        &time_bars(&b.records)
            .into_iter()
            .zip(&b.records)
            .map(|(mut bar, r)| {
                bar.label = format!("{} ({}t)", r.case, r.threads);
                bar.note = r
                    .retained_bytes_per_group
                    .map_or_else(String::new, |x| format!("{x:.2} B retained"));
                bar
            })
            .collect::<Vec<_>>(),
    )?];
    Ok(out)
}

/// `layout`: packed vs padded fields, two threads in two roles.
pub fn layout(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let b = counted(progress, || bench::layout::run(&s.plan()))?;
    let mut out = outcome("layout", &b, "op")?;
    let bars = time_bars(&b.records);
    out.plots = vec![plots::bar_chart(
        "layout: ns per operation of each role (2 threads)",
        "ns per op",
        Axis::Linear,
        &bars,
    )?];
    Ok(out)
}

/// One bar per record: its time per operation, labelled with its ratio.
fn time_bars(records: &[Record]) -> Vec<Bar> {
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

/// The outcome of a timed suite: settings, records, its table and its
/// verdicts (plots are the caller's).
fn outcome(suite: &str, b: &Bench, op: &str) -> Result<Outcome, String> {
    let plan = b.measured.plan;
    let pinning: Vec<_> = b
        .measured
        .placements
        .iter()
        .map(|(threads, p)| {
            json!({
                "threads": threads,
                "cpus": p.as_ref().map(|p| p.cpus.clone()),
                "shares_core": p.as_ref().and_then(|p| p.shares_core),
            })
        })
        .collect();
    Ok(Outcome {
        settings: json!({
            "rounds": plan.rounds,
            "slice_seconds": plan.slice.as_secs_f64(),
            "seconds_per_case": plan.slice.as_secs_f64() * plan.rounds as f64,
            "threads": thread_counts(&b.records),
            "baselines": baselines(&b.records),
            "min_overlap": MIN_OVERLAP,
            "pinning": pinning,
            "stability": b.stability(),
        }),
        records: b
            .records
            .iter()
            .map(|r| with_case(&r.case, r))
            .collect::<Result<_, _>>()?,
        tables: vec![table(suite, b, op)],
        plots: Vec::new(),
        verdicts: targets::verdicts(suite, &b.measured),
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

/// A record's cell: `ns/op ×ratio [low–high]`, marked † when unstable.
fn cell(r: &Record) -> String {
    match (r.ratio, r.low, r.high) {
        _ if r.baseline.as_deref() == Some(&r.case) => format!("{} ns ×1", nanos(r.ns_per_op)),
        (Some(x), Some(lo), Some(hi)) => format!(
            "{} ns ×{} [{}–{}]{}",
            nanos(r.ns_per_op),
            ratio(x),
            ratio(lo),
            ratio(hi),
            if r.stable { "" } else { " †" }
        ),
        // A figure without a ratio (a suite of absolute figures: `groups`)
        // is marked as well: the notes say which are.
        _ => format!(
            "{} ns{}",
            nanos(r.ns_per_op),
            if r.stable { "" } else { " †" }
        ),
    }
}

/// One row per case, one column per thread count: `ns/op ×ratio [range]`;
/// a column of published figures where the suite has any; the notes that
/// say how the figures were taken and which are unstable.
fn table(suite: &str, b: &Bench, op: &str) -> Table {
    let records = &b.records;
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
        t = t.number(&bench::threads(n));
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
                    .map_or_else(String::new, cell),
            );
        }
        if published {
            row.push(published::cell(suite, case, None));
        }
        t.row(row);
    }
    if !baselines.is_empty() {
        t.note(format!(
            "×: time per {op} (CPU time) divided by the baseline's at the same thread count in \
             the same round, unless a note below says otherwise; ops/s of all threads \
             together are in report.json"
        ));
    }
    for n in b.notes() {
        t.note(n);
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
    // One baseline by name; several (the metrics suite divides each
    // recorder's cases by its own) by what they are.
    let mut baselines: Vec<&str> = Vec::new();
    for b in records.iter().filter_map(|r| r.baseline.as_deref()) {
        if !baselines.contains(&b) {
            baselines.push(b);
        }
    }
    let baseline = match baselines.as_slice() {
        [] => "",
        [one] => one,
        [..] => "its baseline",
    };
    let mut out = Vec::new();
    if !baseline.is_empty() {
        out.push(plots::line_chart(&Chart {
            title: format!("{suite}: time per {op} ÷ {baseline} (same round, same threads)"),
            x_label: "threads".into(),
            y_label: format!(
                "× {}",
                if baselines.len() == 1 {
                    baseline
                } else {
                    "baseline"
                }
            ),
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
            low: Some(ns / base * 0.9),
            high: Some(ns / base * 1.1),
            rounds: 11,
            left_out: 0,
            poor_overlap: false,
            stable: true,
            overlap: 1.0,
            pinned: true,
            round_ratios: Vec::new(),
            retained_bytes_per_group: None,
        }
    }

    #[test]
    fn a_cell_shows_time_median_ratio_and_range_and_marks_unstable_ones() {
        assert_eq!(cell(&rec("tree", 1, 2.5, 5.0)), "2.50 ns ×0.50 [0.45–0.55]");
        assert_eq!(cell(&rec("shared-atomic", 1, 5.0, 5.0)), "5.00 ns ×1");
        let mut shaky = rec("tree", 2, 2.0, 40.0);
        shaky.stable = false;
        assert_eq!(cell(&shaky), "2.00 ns ×0.050 [0.045–0.055] †");
    }

    #[test]
    fn plots_need_two_thread_counts() {
        let one = vec![rec("tree", 1, 2.5, 5.0)];
        assert!(thread_plots("counters", &one, "add").unwrap().is_empty());
        let two = vec![rec("tree", 1, 2.5, 5.0), rec("tree", 2, 2.0, 40.0)];
        assert_eq!(thread_plots("counters", &two, "add").unwrap().len(), 2);
    }
}
