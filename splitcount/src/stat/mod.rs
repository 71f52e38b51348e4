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
