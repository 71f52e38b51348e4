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
///
/// Read back with serde, a snapshot is checked: at least its root, the root
/// first and without a parent, every other group after its parent — input
/// that breaks this is an error (`{"groups":[]}` deserialized, then made
/// `root()` panic).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "SnapshotData"))]
pub struct Snapshot {
    /// The groups, in pre-order.
    pub groups: Vec<GroupSnapshot>,
}

/// One group of a [`Snapshot`]: usage, limits, events and statistics.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
    /// Units pre-charged to it or below it and held in the per-CPU stocks:
    /// the part of `usage` that nothing uses yet
    /// ([`crate::group::Group::stocked_subtree`]).
    pub stocked: u64,
    /// Its own event counts (`memory.events.local`).
    pub events: Events,
    /// Event counts of its subtree (`memory.events`).
    pub subtree_events: Events,
    /// Nanoseconds its charges (and its subtree's) spent stalled after a
    /// refusal ([`crate::group::Group::stall`]).
    pub stall_ns: u64,
    /// Hierarchical statistics (this group's subtree), by item name.
    pub stats: BTreeMap<String, i64>,
    /// This group's own statistics, by item name.
    pub local: BTreeMap<String, i64>,
}

/// Bounds on a snapshot's size ([`crate::group::Group::snapshot_with`]):
/// by default, every group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotOptions {
    /// Levels below the snapshot's root (0: the root alone).
    pub max_depth: usize,
    /// Groups in all (at least 1: the root).
    pub max_groups: usize,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            max_depth: usize::MAX,
            max_groups: usize::MAX,
        }
    }
}

impl SnapshotOptions {
    /// At most `depth` levels below the root.
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.max_depth = depth;
        self
    }

    /// At most `groups` groups (the root counts).
    pub fn max_groups(mut self, groups: usize) -> Self {
        self.max_groups = groups;
        self
    }
}

/// A [`Snapshot`] as serialized, checked on the way back in.
#[cfg(feature = "serde")]
#[derive(serde::Deserialize)]
struct SnapshotData {
    groups: Vec<GroupSnapshot>,
}

#[cfg(feature = "serde")]
impl TryFrom<SnapshotData> for Snapshot {
    type Error = String;

    fn try_from(d: SnapshotData) -> Result<Snapshot, String> {
        match d.groups.first() {
            None => return Err("a snapshot holds at least its root".into()),
            Some(root) if root.parent.is_some() => {
                return Err("the snapshot's first group (its root) has a parent".into())
            }
            Some(_) => {}
        }
        for (i, g) in d.groups.iter().enumerate().skip(1) {
            if !g.parent.is_some_and(|p| p < i) {
                return Err(format!(
                    "group {i} ({}) does not come after its parent",
                    g.path
                ));
            }
        }
        Ok(Snapshot { groups: d.groups })
    }
}

impl Snapshot {
    /// The snapshot's root: the group it was taken of.
    ///
    /// # Panics
    /// On a snapshot built by hand without groups (one taken or
    /// deserialized always has its root).
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
