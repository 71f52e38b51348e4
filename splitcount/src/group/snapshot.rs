//! A structured, serializable snapshot of a subtree, and the
//! `memory.stat`-like text dump.

use crate::charge::{Events, UNLIMITED};
use std::collections::BTreeMap;

/// One group and its subtree: usage, limits, events and statistics
/// (flushed first). Serializes with serde.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GroupSnapshot {
    /// The group's path.
    pub path: String,
    /// Usage (stocked units included).
    pub usage: u64,
    /// Hard limit, `None` when unlimited.
    pub max: Option<u64>,
    /// Soft limit, `None` when unlimited.
    pub high: Option<u64>,
    /// Peak usage.
    pub peak: u64,
    /// Event counts.
    pub events: Events,
    /// Hierarchical statistics (this group's subtree), by item name.
    pub stats: BTreeMap<String, i64>,
    /// This group's own statistics, by item name.
    pub local: BTreeMap<String, i64>,
    /// Live children, by name.
    pub children: Vec<GroupSnapshot>,
}

pub(crate) fn limit(v: u64) -> Option<u64> {
    (v != UNLIMITED).then_some(v)
}
