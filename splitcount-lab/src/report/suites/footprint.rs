//! The `footprint` suite: [`crate::footprint`] — bytes per counter of every
//! design against the CPUs, with the padded tree of before for comparison.

use super::{with_case, Outcome, Settings};
use crate::footprint::{self, Row};
use crate::report::plots::{self, Axis, Chart, Series, Style};
use crate::timing::{Measured, Plan};
use indicatif::ProgressBar;
use serde_json::json;
use std::time::Duration;

/// CPU counts the suite draws.
const CPUS: [usize; 7] = [2, 16, 64, 128, 256, 1024, 4096];

/// Run the suite (the figures of `splitcount-lab footprint --json`).
pub fn run(_: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    progress.set_length(1);
    let rows = footprint::run(&CPUS)?;
    progress.inc(1);
    Ok(Outcome {
        settings: json!({
            "cpus": CPUS,
            "command": format!(
                "splitcount-lab footprint --cpus {} --json",
                CPUS.map(|c| c.to_string()).join(",")
            ),
        }),
        records: rows
            .iter()
            .map(|r| with_case(&r.design, r))
            .collect::<Result<_, _>>()?,
        tables: vec![footprint::table(&rows)],
        plots: vec![plot(&rows)?],
        verdicts: verdicts(&rows),
    })
}

/// The tree's bytes per CPU against the target, at each CPU count it names.
fn verdicts(rows: &[Row]) -> Vec<crate::report::targets::Verdict> {
    let plan = Plan {
        rounds: 1,
        slice: Duration::ZERO,
    };
    let mut m = Measured::new("footprint", plan, Vec::new());
    m.scalars = footprint::tree_figures(rows)
        .into_iter()
        .map(|(name, v)| (name.to_owned(), 0, v))
        .collect();
    crate::report::targets::verdicts("footprint", &m)
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
            "dashed: tree-padded (before)".into(),
            format!("target: tree ≤ {} B/CPU", footprint::TREE_TARGET),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::targets::Status;

    #[test]
    fn the_tree_target_has_a_computed_verdict_at_each_cpu_count() {
        let rows = footprint::run(&CPUS).unwrap();
        let v = verdicts(&rows);
        assert_eq!(v.len(), 4);
        for v in &v {
            assert_eq!(v.status, Status::Met, "{v:?}");
            assert!(v.median.unwrap() <= footprint::TREE_TARGET, "{v:?}");
            assert!(v.note.contains("computed"), "{v:?}");
        }
    }

    #[test]
    fn the_settings_name_the_command_that_gives_the_same_figures() {
        let progress = ProgressBar::hidden();
        let out = run(&Settings { quick: true }, &progress).unwrap();
        assert_eq!(
            out.settings["command"],
            "splitcount-lab footprint --cpus 2,16,64,128,256,1024,4096 --json"
        );
    }
}
