//! Layer 5: *per-group statistics, update lists and flushing* (the kernel's
//! rstat, as used by memory cgroups).
//!
//! A hierarchy's schema lists its stat items ([`StatItem`]: a gauge or an
//! event count); every group carries all of them.
//!
//! - **Update** ([`StatGroup::mod_stat`]): add the delta to this CPU's slot
//!   for the group, mark the group *updated on this CPU* (a speculative
//!   plain-load test, then a compare-and-swap that decides who pushes the
//!   group onto the CPU's lock-free update list), and count `|delta|`
//!   towards the flush threshold of the group and its ancestors.
//! - **Flush** ([`Stats::flush`]): skipped unless forced or the group's
//!   subtree counted more than `64 · ncpu` updates since its last flush. One
//!   flusher at a time; per CPU, an empty list is skipped without a locked
//!   instruction; otherwise the list is drained: each drained group within
//!   the subtree has its `(group, cpu)` delta since the last flush folded
//!   into its local value and into the hierarchical values of it and its
//!   ancestors up to the flushed group; groups outside are carried to a
//!   later flush (see `flush.rs`). The cost follows what changed, not the
//!   size of the tree.
//! - **Staleness.** A read that skips the flush misses at most the updates
//!   not yet counted: below `64` per CPU per group plus the `64 · ncpu`
//!   threshold, so at most `2 · 64 · ncpu` units of |delta| per group; a
//!   background flusher (see [`crate::group::Hierarchy::start_flusher`])
//!   bounds the age of what a read sees by its period.
//!
//! Diagrams and the ordering argument are in `IMPLEMENTATION.md`; the race
//! between a push and a drain is model-checked by `tests/loom_stat.rs`.

mod flush;
mod group;
mod schema;
mod stats;

pub use group::{StatGroup, STAT_BATCH};
pub use schema::{StatError, StatId, StatItem, StatKind, MAX_STAT_ITEMS, RESERVED_STAT_NAMES};
pub use stats::Stats;

/// Small enough for Miri (CI runs `stat::` under it): the raw pointers of
/// a flush — a row of per-CPU slots read as one slice, the references the
/// flusher keeps and gives back — used on every path once, then the whole
/// `Stats` dropped with references still kept.
#[cfg(test)]
mod tests {
    use super::{StatItem, Stats};
    use crate::cpu::Machine;

    /// One item (the folded values inside the group), five (the last the
    /// group holds) and six (an allocation of their own).
    #[test]
    fn a_flush_of_kept_and_plain_groups_then_a_drop_touches_only_what_it_owns() {
        for k in [1, 5, 6] {
            let m = Machine::simulated(2, 1).unwrap();
            let items = (0..k).map(|i| StatItem::gauge(&format!("g{i}"))).collect();
            let stats = Stats::new(&m, items).unwrap();
            // r ─ a ─ b (kept)   r ─ c (plain)
            let r = stats.kept_group(None).unwrap();
            let a = stats.kept_group(Some(&r)).unwrap();
            let b = stats.kept_group(Some(&a)).unwrap();
            let c = stats.group(Some(&r)).unwrap();
            // Own updates per group (r, a, b, c) and item.
            let mut own = vec![[0i64; 4]; k];
            for round in 0..2 {
                for cpu in 0..2 {
                    m.set_current_cpu(cpu).unwrap();
                    for (item, own) in own.iter_mut().enumerate() {
                        let d = 1 + item as i64;
                        b.mod_stat(&stats, item, d).unwrap();
                        c.mod_stat(&stats, item, -3).unwrap();
                        own[2] += d;
                        own[3] -= 3;
                    }
                    a.mod_stat(&stats, k - 1, 10).unwrap();
                    own[k - 1][1] += 10;
                }
                // A subtree first: its sums wait on `r` as pending (a
                // carried holder), then the root folds everything.
                assert!(stats.flush(&a, true));
                assert!(stats.flush(&r, true));
                for (item, [r_own, a_own, b_own, c_own]) in own.iter().copied().enumerate() {
                    let at = format!("k={k} round {round} item {item}");
                    assert_eq!(b.value(item), Some(b_own), "{at}");
                    assert_eq!(c.value(item), Some(c_own), "{at}");
                    assert_eq!(a.value(item), Some(a_own + b_own), "{at}");
                    assert_eq!(a.local_value(item), Some(a_own), "{at}");
                    assert_eq!(r.value(item), Some(r_own + a_own + b_own + c_own), "{at}");
                }
            }
            // `b` retired with an update waiting: the fold at the drop gives
            // its reference back; `a`'s and `r`'s are still kept then.
            b.mod_stat(&stats, 0, 7).unwrap();
            stats.retire(&b);
            drop((b, c));
            drop(stats);
            drop((r, a));
        }
    }
}
