//! The `accuracy` suite: [`crate::accuracy::measure`] for every design at its
//! default batch over simulated CPU counts — the same function, spec and
//! numbers as `splitcount-lab accuracy` — drawn log–log with the kernel's
//! published points.

use super::{with_case, Outcome, Settings};
use crate::accuracy::{self, Record, Spec};
use crate::report::plots::{self, Axis, Chart, Mark, Series, Style};
use crate::report::published::{self, KERNEL_TREE_384_512, PERCPU_COUNTER_384};
use crate::report::table::{bytes, thousands, Table};
use indicatif::ProgressBar;
use serde_json::json;
use splitcount::counter::Design;

/// Simulated CPU counts: 384 and 512 are where the kernel published.
fn cpus(s: &Settings) -> Vec<usize> {
    if s.quick {
        vec![2, 64, 384, 4096]
    } else {
        vec![2, 8, 64, 256, 384, 512, 1024, 4096]
    }
}

fn steps(s: &Settings) -> usize {
    if s.quick {
        10_000
    } else {
        100_000
    }
}

/// The seed of the random walks (the CLI's default).
const SEED: u64 = 1;

/// Run the suite.
pub fn run(s: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    let cpus = cpus(s);
    progress.set_length((Design::ALL.len() * cpus.len()) as u64);
    let mut records = Vec::new();
    for design in Design::ALL {
        for &n in &cpus {
            let mut spec = Spec::new(design, n);
            spec.steps = steps(s);
            spec.seed = SEED;
            records.push(accuracy::measure(&spec)?);
            progress.inc(1);
        }
    }
    Ok(Outcome {
        settings: json!({
            "designs": Design::ALL,
            "cpus": cpus,
            "batch": "default",
            "arity": "auto",
            "nodes": "one per 64 CPUs",
            "steps": steps(s),
            "seed": SEED,
            "command": format!(
                "splitcount-lab accuracy --cpus {} --steps {} --seed {SEED} --json",
                cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
                steps(s)
            ),
        }),
        records: records
            .iter()
            .map(|r| with_case(r.design.name(), r))
            .collect::<Result<_, _>>()?,
        tables: vec![table(&records)],
        plots: vec![plot(&records)?],
        verdicts: Vec::new(),
    })
}

fn table(records: &[Record]) -> Table {
    let mut t = Table::new(
        "accuracy: error of approximate() in counted units (bound, reached, random walks)",
    )
    .text("design")
    .number("CPUs")
    .number("batch")
    .number("bound under")
    .number("bound over")
    .number("reached under/over")
    .number("random-walk worst")
    .number("bound as 4 KiB pages")
    .published();
    for r in records {
        let bound = r.under.max(r.over);
        t.row(vec![
            r.design.name().to_owned(),
            r.cpus.to_string(),
            r.batch.to_string(),
            thousands(r.under),
            thousands(r.over),
            format!("{}/{}", thousands(r.worst_under), thousands(r.worst_over)),
            thousands(r.random_worst),
            if bound == 0 {
                "0".to_owned()
            } else {
                bytes(bound as f64 * 4096.0)
            },
            published::cell("accuracy", r.design.name(), Some(r.cpus)),
        ]);
    }
    t.note(
        "bound: settled precise − under ≤ approximate ≤ precise + over; reached: what the \
         design's worst-case schedule drives a fresh counter to (tight bounds reach them)",
    );
    t.note(format!(
        "random-walk worst: largest |approximate − precise| over {} steps of random CPUs \
         and deltas up to ±2·batch",
        records.first().map_or(0, |r| r.random_steps)
    ));
    for n in published::notes("accuracy") {
        t.note(n);
    }
    t
}

fn plot(records: &[Record]) -> Result<String, String> {
    let mut series = Vec::new();
    for design in Design::ALL {
        let of: Vec<&Record> = records.iter().filter(|r| r.design == design).collect();
        if of.iter().all(|r| r.under.max(r.over) == 0) {
            continue; // atomic: exact at every size, nothing to draw on a log axis
        }
        let points = |f: fn(&Record) -> u64| -> Vec<(f64, f64)> {
            of.iter().map(|r| (r.cpus as f64, f(r) as f64)).collect()
        };
        series.push(Series {
            name: Some(design.name().to_owned()),
            color_of: design.name().to_owned(),
            points: points(|r| r.under.max(r.over)),
            style: Style::Line,
        });
        series.push(Series {
            name: None,
            color_of: design.name().to_owned(),
            points: points(|r| r.worst_under.max(r.worst_over)),
            style: Style::Points,
        });
        series.push(Series {
            name: None,
            color_of: design.name().to_owned(),
            points: points(|r| r.random_worst),
            style: Style::Dashed,
        });
    }
    let (tree_lo, tree_hi) = (384.0, 512.0);
    plots::line_chart(&Chart {
        title: "error of approximate() vs CPUs, default batches".into(),
        x_label: "simulated CPUs".into(),
        y_label: "units, e.g. 4 KiB pages".into(),
        x_axis: Axis::Log2,
        y_axis: Axis::Log,
        series,
        marks: vec![
            Mark {
                label: "percpu_counter, 384 CPUs".into(),
                x: 384.0,
                y: PERCPU_COUNTER_384 as f64,
            },
            Mark {
                label: "kernel tree, 384–512 CPUs".into(),
                x: tree_lo,
                y: KERNEL_TREE_384_512 as f64,
            },
            Mark {
                label: "kernel tree, 384–512 CPUs".into(),
                x: tree_hi,
                y: KERNEL_TREE_384_512 as f64,
            },
        ],
        key: vec![
            "line: bound".into(),
            "circles: reached by the".into(),
            "  worst-case schedule".into(),
            "dashed: random-walk worst".into(),
            "atomic: 0, not drawn".into(),
        ],
    })
}
