//! The `watchdog` suite: [`crate::watchdog::simulate`] for every design at
//! its default batch, the error the watchdog saw over time drawn per design.

use super::{with_case, Outcome, Settings};
use crate::report::plots::{self, Axis, Chart, Series, Style};
use crate::report::published;
use crate::report::table::{bytes, thousands, Table};
use crate::watchdog::{self, Record, Spec};
use indicatif::ProgressBar;
use serde_json::json;
use splitcount::counter::Design;

/// Run the suite.
pub fn run(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let spec = Spec::new(if s.quick { 40_000 } else { 400_000 });
    progress.set_length(Design::ALL.len() as u64);
    let mut records = Vec::new();
    for design in Design::ALL {
        records.push(watchdog::simulate(&spec, design)?);
        progress.inc(1);
    }
    Ok(Outcome {
        settings: json!(spec),
        records: records
            .iter()
            .map(|r| with_case(r.design.name(), r))
            .collect::<Result<_, _>>()?,
        tables: vec![table(&spec, &records)],
        plots: plots(&spec, &records)?,
        verdicts: Vec::new(),
    })
}

fn table(spec: &Spec, records: &[Record]) -> Table {
    let mut t = Table::new(format!(
        "watchdog: |approximate − truth| over {} reads, {} threads on {} CPUs",
        records.first().map_or(0, |r| r.samples.len()),
        spec.threads,
        spec.cpus
    ))
    .text("design")
    .number("batch")
    .number("bound")
    .number("max error")
    .number("mean error")
    .number("max error as 4 KiB pages")
    .number("max ÷ bound")
    .published();
    for r in records {
        let bound = r.under.max(r.over);
        t.row(vec![
            r.design.name().to_owned(),
            r.batch.to_string(),
            thousands(bound),
            thousands(r.max_error),
            thousands(r.mean_error.round() as u64),
            bytes(r.max_error as f64 * 4096.0),
            if bound == 0 {
                "-".to_owned()
            } else {
                format!("{:.3}", r.max_error as f64 / bound as f64)
            },
            published::cell("watchdog", r.design.name(), None),
        ]);
    }
    t.note(format!(
        "largest true value: {} pages ({}); a thread migrates once per {} of its steps on average",
        thousands(records.first().map_or(0, |r| r.max_truth.max(0) as u64)),
        bytes(
            records
                .first()
                .map_or(0.0, |r| r.max_truth.max(0) as f64 * 4096.0)
        ),
        spec.hop_every
    ));
    for n in published::notes("watchdog") {
        t.note(n);
    }
    t
}

fn plots(spec: &Spec, records: &[Record]) -> Result<Vec<String>, String> {
    let error = Chart {
        title: "watchdog: |approximate − truth| over time".into(),
        x_label: "updates (all threads)".into(),
        y_label: "error, pages".into(),
        x_axis: Axis::Linear,
        y_axis: Axis::Linear,
        series: records
            .iter()
            .map(|r| Series {
                name: Some(r.design.name().to_owned()),
                color_of: r.design.name().to_owned(),
                points: r
                    .samples
                    .iter()
                    .map(|s| (s.step as f64, s.error as f64))
                    .collect(),
                style: Style::Line,
            })
            .collect(),
        marks: Vec::new(),
        key: Vec::new(),
    };
    let truth = Chart {
        title: format!(
            "the workload: pages mapped by {} threads hopping across {} CPUs",
            spec.threads, spec.cpus
        ),
        x_label: "updates (all threads)".into(),
        y_label: "pages mapped".into(),
        x_axis: Axis::Linear,
        y_axis: Axis::Linear,
        series: records
            .first()
            .map(|r| Series {
                name: Some("truth".into()),
                color_of: "truth".into(),
                points: r
                    .samples
                    .iter()
                    .map(|s| (s.step as f64, s.truth as f64))
                    .collect(),
                style: Style::Line,
            })
            .into_iter()
            .collect(),
        marks: Vec::new(),
        key: Vec::new(),
    };
    Ok(vec![plots::line_chart(&error)?, plots::line_chart(&truth)?])
}
