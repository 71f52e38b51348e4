//! The `drift` suite: [`crate::drift`] — each allocator workload's live set
//! held under `Accounted<System>`, what the groups account beside the
//! headers, glibc's in-use bytes and the resident set.

use super::{with_case, Outcome, Settings};
use crate::drift::{self, Drift};
use crate::report::table::Table;
use indicatif::ProgressBar;
use serde_json::json;

/// Run the suite (the same worker and figures as `splitcount-lab drift`).
pub fn run(_: &Settings, progress: &ProgressBar) -> Result<Outcome, String> {
    progress.set_length(1);
    let exe = std::env::current_exe().map_err(|e| format!("the lab binary: {e}"))?;
    let rows = drift::run(&exe)?;
    progress.inc(1);
    Ok(Outcome {
        settings: json!({ "blocks": drift::BLOCKS, "command": "splitcount-lab drift --json" }),
        records: rows
            .iter()
            .map(|r| with_case(&r.workload, r))
            .collect::<Result<_, _>>()?,
        tables: vec![table(&rows)],
        plots: Vec::new(),
        verdicts: Vec::new(),
    })
}

fn table(rows: &[Drift]) -> Table {
    let [first, rest @ ..] = drift::COLUMNS;
    let mut t =
        Table::new("drift: growth while each live set is held (bytes; × what the groups account)")
            .text(first);
    for c in rest {
        t = t.number(c);
    }
    for r in rows {
        t.row(drift::cells(r).to_vec());
    }
    t.note(
        "accounted: the groups' usage less the stocks' slack (a range when thread reserves \
         may hold some); malloc in use: glibc's mallinfo2 (headers, size-class rounding and \
         chunk overhead included); resident: /proc/self/statm, with freed memory trimmed \
         between sets",
    );
    t
}
