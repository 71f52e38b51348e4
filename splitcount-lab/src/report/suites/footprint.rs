//! The `footprint` suite: [`crate::footprint`] — bytes per counter of every
//! design against the CPUs, with the padded tree of before for comparison.

use super::{with_case, Outcome, Settings};
use crate::footprint::{self, Row};
use crate::report::plots::{self, Axis, Chart, Series, Style};
use indicatif::ProgressBar;
use serde_json::json;

/// CPU counts the suite draws.
const CPUS: [usize; 7] = [2, 16, 64, 128, 256, 1024, 4096];

/// Run the suite (the figures of `splitcount-lab footprint --json`).
pub fn run(_: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    progress.set_length(1);
    let rows = footprint::run(&CPUS)?;
    progress.inc(1);
    Ok(Outcome {
        settings: json!({ "cpus": CPUS, "command": "splitcount-lab footprint --json" }),
        records: rows
            .iter()
            .map(|r| with_case(&r.design, r))
            .collect::<Result<_, _>>()?,
        tables: vec![footprint::table(&rows)],
        plots: vec![plot(&rows)?],
        verdicts: Vec::new(),
    })
}

fn plot(rows: &[Row]) -> Result<String, String> {
    let mut designs: Vec<&str> = Vec::new();
    for r in rows {
        if !designs.contains(&r.design.as_str()) {
            designs.push(&r.design);
        }
    }
    let series = designs
        .iter()
        .map(|d| Series {
            name: Some((*d).to_owned()),
            color_of: (*d).to_owned(),
            points: rows
                .iter()
                .filter(|r| r.design == *d)
                .map(|r| (r.cpus as f64, r.bytes_per_cpu))
                .collect(),
            style: if *d == "tree-padded" {
                Style::Dashed
            } else {
                Style::LinePoints
            },
        })
        .collect();
    plots::line_chart(&Chart {
        title: "bytes per CPU of one counter vs CPUs".into(),
        x_label: "simulated CPUs".into(),
        y_label: "bytes per CPU (everything the counter takes ÷ CPUs)".into(),
        x_axis: Axis::Log2,
        y_axis: Axis::Log,
        series,
        marks: Vec::new(),
        key: vec![
            "dashed: items on own lines (before)".into(),
            format!("target: tree ≤ {} B/CPU", footprint::TREE_TARGET),
        ],
    })
}
