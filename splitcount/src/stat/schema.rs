//! The stat items every group of a hierarchy carries.

use std::fmt;

/// Whether a stat item goes up and down or only up.
///
/// Values are `i64` and wrap past `i64::MAX` (two's complement, as the
/// split counters do): an update is one per-CPU add, which cannot check a
/// total it does not read. An event count that reaches 2⁶³ reads negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum StatKind {
    /// A level that goes up and down (bytes of anonymous memory in use).
    Gauge,
    /// A count of events; negative deltas are refused (page faults).
    Event,
}

/// One stat item of a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StatItem {
    /// Its name in dumps and snapshots (validated like a group name, plus
    /// no whitespace, so `memory.stat`-like dumps stay parseable, and none
    /// of the keys such a dump prints of its own: [`RESERVED_STAT_NAMES`]
    /// and names beginning with `local_`).
    pub name: String,
    /// Gauge or event count.
    pub kind: StatKind,
}

impl StatItem {
    /// A gauge named `name`.
    pub fn gauge(name: &str) -> StatItem {
        StatItem {
            name: name.to_owned(),
            kind: StatKind::Gauge,
        }
    }

    /// An event count named `name`: it only goes up (a negative delta is
    /// refused), and like every stat value it wraps past `i64::MAX`, as the
    /// kernel's `s64` counters and the split counters do (a count of events
    /// does not get near 2⁶³; checking each update would cost the hot path).
    pub fn event(name: &str) -> StatItem {
        StatItem {
            name: name.to_owned(),
            kind: StatKind::Event,
        }
    }
}

/// The index of an item in its hierarchy's schema, from
/// [`crate::group::Hierarchy::stat_id`], and which hierarchy's: a group of
/// another hierarchy refuses it ([`StatError::ForeignItem`]) — its item at
/// that index may be another one, of another kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StatId(pub(crate) usize, pub(crate) u64);

impl StatId {
    /// The item's position in the schema.
    pub fn index(self) -> usize {
        self.0
    }
}

/// Most items a schema may have (a group's per-CPU current and previous
/// values must fit one arena region).
pub const MAX_STAT_ITEMS: usize = crate::percpu::REGION_SLOTS / 2;

/// A stat operation refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatError {
    /// The schema is invalid.
    Schema(String),
    /// A [`StatId`] outside this hierarchy's schema.
    NoSuchItem(usize),
    /// A [`StatId`] of another hierarchy's schema (its index names another
    /// item here, or none).
    ForeignItem(usize),
    /// A negative delta for an event count.
    NegativeEvent {
        /// The item's name.
        item: String,
        /// The delta given.
        delta: i64,
    },
    /// A group used with the statistics of another hierarchy (another
    /// [`super::Stats`]): its per-CPU slots and update lists are not
    /// that one's.
    ForeignGroup,
}

impl fmt::Display for StatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatError::Schema(why) => write!(f, "invalid stat schema: {why}"),
            StatError::NoSuchItem(i) => {
                write!(f, "stat item {i} is not in this hierarchy's schema")
            }
            StatError::ForeignItem(i) => write!(
                f,
                "stat item {i} is of another hierarchy's schema: ask this hierarchy's \
                 stat_id for the item"
            ),
            StatError::NegativeEvent { item, delta } => {
                write!(f, "{item} counts events: it cannot change by {delta}")
            }
            StatError::ForeignGroup => write!(
                f,
                "this stat group belongs to another Stats (another hierarchy's statistics)"
            ),
        }
    }
}

impl std::error::Error for StatError {}

/// Names a stat item cannot take: `Group::memory_stat` (and the
/// `memory.stat` of `Group::cgroup_file`) prints them beside the items, and
/// prints each item `x` twice, as `x` and `local_x` — so a name beginning
/// with `local_` is refused too. An item named `usage` printed a second
/// `usage` line, and a reader of key–value pairs took one or the other.
pub const RESERVED_STAT_NAMES: [&str; 2] = ["usage", "stocked"];

/// Check a schema: at most [`MAX_STAT_ITEMS`] items, unique names of 1 to
/// 255 bytes without whitespace, `/` or NUL, and not `.` or `..` (the rules
/// of group names, and no whitespace), nor a key that `memory.stat` prints
/// of its own ([`RESERVED_STAT_NAMES`], or a name that begins with
/// `local_`).
pub(crate) fn validate(items: &[StatItem]) -> Result<(), StatError> {
    if items.len() > MAX_STAT_ITEMS {
        return Err(StatError::Schema(format!(
            "{} items, at most {MAX_STAT_ITEMS}",
            items.len()
        )));
    }
    for (i, item) in items.iter().enumerate() {
        let bad = item.name.is_empty()
            || item.name.len() > 255
            || item.name == "."
            || item.name == ".."
            || item
                .name
                .chars()
                .any(|c| c.is_whitespace() || c == '/' || c == '\0');
        if bad {
            return Err(StatError::Schema(format!(
                "item name {:?} is empty, longer than 255 bytes, '.' or '..', or has whitespace, '/' or NUL",
                item.name.chars().take(64).collect::<String>()
            )));
        }
        if RESERVED_STAT_NAMES.contains(&item.name.as_str()) || item.name.starts_with("local_") {
            return Err(StatError::Schema(format!(
                "item name {:?} is a key memory.stat prints of its own (usage, stocked, and local_<item> for each item)",
                item.name.chars().take(64).collect::<String>()
            )));
        }
        if items[..i].iter().any(|o| o.name == item.name) {
            return Err(StatError::Schema(format!(
                "item {:?} appears twice",
                item.name
            )));
        }
    }
    Ok(())
}
