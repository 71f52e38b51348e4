//! `splitcount-lab drift`: where the bytes the groups account and the
//! memory the process holds part ways, on the allocator suite's workloads.
//!
//! A worker process on `Accounted<System>` (`splitcount-lab drift-worker`,
//! hidden) builds each workload's live set in a group and holds it —
//! `small`: 100,000 blocks of 17 to 24 bytes; `mixed`: 100,000 blocks of
//! 16 to 512 bytes; `json`: the 2 MB document parsed into a `serde_json`
//! tree — and reconciles ([`splitcount::alloc::Accounted::reconcile`])
//! before and while it holds it. Each row is the difference: what the
//! groups account, the allocator's headers, what glibc has in use, the
//! resident set; and what the program itself counts it holds, where it can.

use crate::alloc_switch::{self, Allocator, ENV};
use crate::bench::alloc::workloads::{json_document, JSON_BYTES};
use serde::{Deserialize, Serialize};
use splitcount::alloc::Reconciliation;
use splitcount::group::Hierarchy;
use std::io::Write;
use std::process::Command;

/// Live blocks of the `mixed` and `small` sets.
pub const BLOCKS: usize = 100_000;

/// One workload's drift, as differences while its set is held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// The workload.
    pub workload: String,
    /// Bytes the program counts it holds (block sizes and the vector of
    /// their pointers; `None` for `json`, whose tree serde_json sizes
    /// itself).
    pub held: Option<u64>,
    /// Growth of the bytes the groups account, less the stocks' slack: at
    /// least this …
    pub accounted_at_least: i64,
    /// … and at most this.
    pub accounted_at_most: i64,
    /// Growth of the allocator's header bytes.
    pub headers: i64,
    /// Growth of what glibc has in use (`mallinfo2`).
    pub malloc: Option<i64>,
    /// Growth of the resident set.
    pub resident: Option<i64>,
}

fn delta(a: Option<u64>, b: Option<u64>) -> Option<i64> {
    Some(b? as i64 - a? as i64)
}

/// Build each workload's set, hold it, reconcile: the body of
/// `drift-worker` (on the accounted allocator). One JSON line per workload.
pub fn serve(mut out: impl Write) -> Result<(), String> {
    let memory = Hierarchy::default();
    alloc_switch::attach(&memory)?;
    let doc = json_document(JSON_BYTES);
    let group = memory.root().child("drift").map_err(|e| e.to_string())?;
    group.scope(|| ());
    for workload in ["small", "mixed", "json"] {
        let before = reconcile()?;
        let (held, keep): (Option<u64>, Box<dyn std::any::Any>) = group.scope(|| match workload {
            "json" => {
                let v: serde_json::Value = serde_json::from_str(&doc).expect("generated JSON");
                (None, Box::new(v) as Box<dyn std::any::Any>)
            }
            _ => {
                let (min, max) = if workload == "mixed" {
                    (16, 512)
                } else {
                    (17, 24)
                };
                let mut seed = 0x9E37_79B9_7F4A_7C15u64;
                let mut blocks = Vec::with_capacity(BLOCKS);
                let mut bytes = 0u64;
                for _ in 0..BLOCKS {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let n = min + (seed % (max - min + 1) as u64) as usize;
                    bytes += n as u64;
                    blocks.push(vec![1u8; n].into_boxed_slice());
                }
                // The blocks, and the vector of their (fat) pointers.
                let bytes = bytes + (BLOCKS * std::mem::size_of::<Box<[u8]>>()) as u64;
                (Some(bytes), Box::new(blocks) as Box<dyn std::any::Any>)
            }
        });
        let during = reconcile()?;
        let row = Drift {
            workload: workload.to_owned(),
            held,
            accounted_at_least: during.requested_at_least as i64 - before.requested_at_most as i64,
            accounted_at_most: during.requested_at_most as i64 - before.requested_at_least as i64,
            headers: during.headers as i64 - before.headers as i64,
            malloc: delta(before.malloc_in_use, during.malloc_in_use),
            resident: delta(before.resident, during.resident),
        };
        drop(keep);
        // Give freed pages back, so that the next set's resident growth is
        // its own.
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
        let line = serde_json::to_string(&row).map_err(|e| e.to_string())?;
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn reconcile() -> Result<Reconciliation, String> {
    alloc_switch::reconcile().ok_or_else(|| "the accounted allocator is not attached".to_owned())
}

/// Run the worker (the lab binary `exe`) and read its rows.
pub fn run(exe: &std::path::Path) -> Result<Vec<Drift>, String> {
    let out = Command::new(exe)
        .arg("drift-worker")
        .env(ENV, Allocator::Accounted.name())
        .output()
        .map_err(|e| format!("cannot start {} drift-worker: {e}", exe.display()))?;
    if !out.status.success() {
        return Err(format!(
            "drift-worker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("drift-worker said {l:?}: {e}")))
        .collect()
}

/// The columns of a row: workload, held, accounted, headers, malloc in
/// use, resident — each growth in bytes, the last three also as × what the
/// groups account.
pub const COLUMNS: [&str; 6] = [
    "workload",
    "held by the program",
    "accounted",
    "headers",
    "malloc in use",
    "resident",
];

/// A row's cells, in [`COLUMNS`] order.
pub fn cells(r: &Drift) -> [String; 6] {
    let base = r.accounted_at_most.max(1) as f64;
    let x = |v: Option<i64>| {
        v.map_or_else(
            || "n/a".to_owned(),
            |v| format!("{v} (×{:.2})", v as f64 / base),
        )
    };
    [
        r.workload.clone(),
        r.held.map_or_else(|| "—".to_owned(), |h| h.to_string()),
        if r.accounted_at_least == r.accounted_at_most {
            r.accounted_at_most.to_string()
        } else {
            format!("{}…{}", r.accounted_at_least, r.accounted_at_most)
        },
        x(Some(r.headers)),
        x(r.malloc),
        x(r.resident),
    ]
}

/// The rows as a table.
pub fn print_table(rows: &[Drift]) {
    let line = |c: &[String]| {
        outln!(
            "  {:<8} {:>19} {:>19} {:>16} {:>19} {:>19}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5]
        )
    };
    line(&COLUMNS.map(str::to_owned));
    for r in rows {
        line(&cells(r));
    }
    outln!(
        "  growth while each set is held, in bytes; × is over what the groups account; held is \
         what the program counts (block sizes and the vector of their pointers)"
    );
}
