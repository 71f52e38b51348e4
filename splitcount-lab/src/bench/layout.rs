//! `bench layout`: what it costs when a read-mostly field shares a cache line
//! with a write-hot one (false sharing), against the padded layout.
//!
//! A group's accounting state has fields written on every charge (the usage
//! counter) and fields read on every charge but written almost never (the
//! limit, flags, a parent pointer). The kernel lost 27% of will-it-scale
//! `page_fault3` throughput when one field move put such a pair on one line
//! of `struct mem_cgroup`: every write invalidates the readers' copies, so
//! each read becomes a cache miss served by the writer's core.
//!
//! Two threads run at once on the same struct:
//! - the **writer** adds to `usage` (`fetch_add`, the charge);
//! - the **reader** loads `limit` and does a little work with it (a few
//!   rounds of integer mixing, standing in for the decision a charge makes),
//!   so a miss is a share of the operation, not all of it.
//!
//! `packed` keeps both fields on one cache line; `padded` gives each its own
//! [`CachePadded`] line (128 bytes on x86_64: the adjacent-line prefetcher
//! pulls lines in pairs). Each layout is one two-thread entry of the timing
//! core (pinned to two CPUs where there are two, in interleaved rounds);
//! each role is reported on its own, as a ratio to the same role on the
//! padded layout in the same round.

use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use crossbeam_utils::CachePadded;
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};

/// The suite name in records.
const SUITE: &str = "layout";

/// The cases, in table order: each layout's reader, then each writer.
pub const CASES: [&str; 4] = [
    "padded-reader",
    "packed-reader",
    "padded-writer",
    "packed-writer",
];

/// Rounds of mixing the reader does with each value it loads.
const WORK_ROUNDS: u32 = 8;

/// The hot and the read-mostly field on one cache line (16 bytes, aligned
/// to a line, so they cannot straddle two).
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub struct Packed {
    /// Written on every charge.
    pub usage: AtomicI64,
    /// Read on every charge, written almost never.
    pub limit: AtomicI64,
}

/// The same fields, each on its own cache line (pair).
#[derive(Debug, Default)]
pub struct Padded {
    /// Written on every charge.
    pub usage: CachePadded<AtomicI64>,
    /// Read on every charge, written almost never.
    pub limit: CachePadded<AtomicI64>,
}

/// The two fields the workload touches, whatever the layout.
trait Fields: Sync {
    fn usage(&self) -> &AtomicI64;
    fn limit(&self) -> &AtomicI64;
}

impl Fields for Packed {
    fn usage(&self) -> &AtomicI64 {
        &self.usage
    }
    fn limit(&self) -> &AtomicI64 {
        &self.limit
    }
}

impl Fields for Padded {
    fn usage(&self) -> &AtomicI64 {
        &self.usage
    }
    fn limit(&self) -> &AtomicI64 {
        &self.limit
    }
}

/// Thread 0 writes `usage`, thread 1 reads `limit` and works with it.
fn two_roles<'a>(layout: &str, fields: &'a dyn Fields) -> Entry<'a> {
    fields.limit().store(1 << 40, Ordering::Relaxed);
    Entry::new(layout, 2, move |t| {
        let mut state = t as u64 + 1;
        move || {
            if t == 0 {
                // Relaxed: a counter; nothing is published through it.
                fields.usage().fetch_add(black_box(1), Ordering::Relaxed);
            } else {
                let limit = fields.limit().load(Ordering::Relaxed) as u64;
                let mut x = state ^ limit;
                for _ in 0..WORK_ROUNDS {
                    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
                }
                state = black_box(x);
            }
        }
    })
    .roles(&["writer", "reader"])
}

/// The baseline of a role's case: the same role on the padded layout.
pub fn baseline_of(case: &str) -> Option<String> {
    let role = case.rsplit('-').next()?;
    Some(format!("padded-{role}"))
}

/// Measure both layouts, two threads each, in interleaved rounds; each
/// role's ratio is to the same role on the padded layout.
pub fn run(plan: &Plan) -> Result<Bench, String> {
    let packed = Packed::default();
    let padded = Padded::default();
    let entries = vec![two_roles("padded", &padded), two_roles("packed", &packed)];
    let measured = measure(SUITE, plan, entries)?;
    let mut bench = Bench::new(measured, baseline_of);
    // Table order: readers first, as the published figure is about them.
    bench
        .records
        .sort_by_key(|r| CASES.iter().position(|c| *c == r.case));
    Ok(bench)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_fields_share_a_line_and_padded_fields_do_not() {
        let p = Packed::default();
        let line = |a: &AtomicI64| a as *const AtomicI64 as usize / 64;
        assert_eq!(line(&p.usage), line(&p.limit));
        let q = Padded::default();
        let distance = line(&q.limit).abs_diff(line(&q.usage));
        assert!(distance >= 2, "padded fields are {distance} lines apart");
    }

    #[test]
    fn every_role_of_both_layouts_is_reported_against_the_padded_one() {
        let plan = Plan {
            rounds: 2,
            slice: std::time::Duration::from_millis(10),
        };
        let records = run(&plan).unwrap().records;
        let cases: Vec<&str> = records.iter().map(|r| r.case.as_str()).collect();
        assert_eq!(cases, CASES);
        for r in &records {
            assert_eq!(r.threads, 2);
            let role = r.case.rsplit('-').next().unwrap();
            assert_eq!(
                r.baseline.as_deref(),
                Some(format!("padded-{role}").as_str())
            );
        }
        assert_eq!(records[0].ratio, Some(1.0));
    }
}
