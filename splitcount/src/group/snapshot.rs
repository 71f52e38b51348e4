//! A structured, serializable snapshot of a subtree, and the
//! `memory.stat`-like text dump.
//!
//! A snapshot is flat — the subtree's groups in pre-order, each naming its
//! parent's index — so that taking it, dropping it and serializing it never
//! recurse with the depth of the tree (a chain of 20,000 groups is as easy
//! as 20,000 siblings), and it reads back from JSON with any depth.

use crate::charge::{Events, UNLIMITED};
use std::collections::BTreeMap;

/// A subtree's groups, flushed first, in pre-order: the subtree's root
/// first, every group after its parent, siblings by name.
///
/// ```
/// use splitcount::group::Hierarchy;
/// let h = Hierarchy::default();
/// let a = h.root().child("a").unwrap();
/// a.child("b").unwrap().charge(10).unwrap();
/// let snap = h.root().snapshot();
/// assert_eq!(snap.root().path, "/");
/// let a_at = snap.position("/a").unwrap();
/// let kids: Vec<_> = snap.children(a_at).map(|g| g.path.as_str()).collect();
/// assert_eq!(kids, ["/a/b"]);
/// assert_eq!(snap.groups[a_at].usage, h.root().usage());
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Snapshot {
    /// The groups, in pre-order.
    pub groups: Vec<GroupSnapshot>,
}

/// One group of a [`Snapshot`]: usage, limits, events and statistics.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GroupSnapshot {
    /// The group's path.
    pub path: String,
    /// Index of its parent in [`Snapshot::groups`] (`None` for the
    /// snapshot's root).
    pub parent: Option<usize>,
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
}

impl Snapshot {
    /// The snapshot's root: the group it was taken of.
    pub fn root(&self) -> &GroupSnapshot {
        &self.groups[0]
    }

    /// The index of the group at `path`, if it is in the snapshot.
    pub fn position(&self, path: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.path == path)
    }

    /// The children of the group at index `parent`, by name.
    pub fn children(&self, parent: usize) -> impl Iterator<Item = &GroupSnapshot> {
        self.groups.iter().filter(move |g| g.parent == Some(parent))
    }
}

pub(crate) fn limit(v: u64) -> Option<u64> {
    (v != UNLIMITED).then_some(v)
}
