//! Errors of the group layer. Each names the group(s) and the numbers a user
//! needs to act on it.

use std::fmt;

/// How many of the largest consumers an error names ([`ChargeError::top`],
/// [`OverLimit::top`], [`Refusal::top`]).
pub const TOP_CONSUMERS: usize = 3;

/// A child group and its usage: one of the largest consumers under a limit
/// ([`crate::group::Group::top`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Consumer {
    /// The group's path.
    pub group: String,
    /// Its usage (its subtree's, stocked units included).
    pub usage: u64,
}

/// `; largest under /tenants: /tenants/a 300, /tenants/b 200` (nothing
/// without consumers).
fn write_top(f: &mut fmt::Formatter<'_>, under: &str, top: &[Consumer]) -> fmt::Result {
    if top.is_empty() {
        return Ok(());
    }
    write!(f, "; largest under {under}:")?;
    for (i, c) in top.iter().enumerate() {
        write!(
            f,
            "{} {} {}",
            if i == 0 { "" } else { "," },
            c.group,
            c.usage
        )?;
    }
    Ok(())
}

/// Why a group operation was refused.
///
/// ```
/// use splitcount::{GroupError, Hierarchy};
///
/// let h = Hierarchy::default();
/// h.root().child("a").unwrap();
/// match h.root().child("a") {
///     Err(GroupError::NameTaken { path }) => assert_eq!(path, "/a"),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupError {
    /// A group name that is empty, contains `/` or NUL, is `.` or `..`, or
    /// is longer than [`super::MAX_NAME_LEN`] bytes.
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A live sibling already has this name.
    NameTaken {
        /// The path the new group would have had.
        path: String,
    },
    /// No live group at this path.
    NotFound {
        /// The path looked up.
        path: String,
    },
    /// `set_max` below the current usage (stocks already drained).
    Busy {
        /// The group.
        path: String,
        /// Its usage.
        usage: u64,
        /// The limit asked for.
        max: u64,
    },
    /// Removing a group that still has live children.
    HasChildren {
        /// The group.
        path: String,
        /// How many live children it has.
        children: usize,
    },
    /// The group was removed already (operations that must act on this very
    /// group, such as creating a child, refuse; charges go to the nearest
    /// live ancestor instead).
    Removed {
        /// The group.
        path: String,
    },
    /// The root group cannot be removed.
    RootCannotBeRemoved,
    /// A configuration value that cannot be used; the reason says which
    /// and why.
    Config(String),
    /// The stock's configuration (slots, batch) was refused.
    Stock(crate::raw::StockError),
    /// The statistics schema was refused.
    Stat(crate::stat::StatError),
    /// The flusher thread could not be started.
    Thread(ThreadError),
}

/// A thread the library needed could not be started: the system's error.
#[derive(Debug, Clone)]
pub struct ThreadError(pub(crate) std::sync::Arc<std::io::Error>);

impl ThreadError {
    /// The system's error.
    pub fn io(&self) -> &std::io::Error {
        &self.0
    }
}

impl PartialEq for ThreadError {
    /// Equal when the kinds are.
    fn eq(&self, other: &Self) -> bool {
        self.0.kind() == other.0.kind()
    }
}

impl Eq for ThreadError {}

impl fmt::Display for GroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupError::InvalidName { name, reason } => {
                write!(f, "invalid group name {name:?}: {reason}")
            }
            GroupError::NameTaken { path } => write!(f, "a group {path} exists already"),
            GroupError::NotFound { path } => write!(f, "no group at {path}"),
            GroupError::Busy { path, usage, max } => write!(
                f,
                "cannot set the limit of {path} to {max}: its usage is {usage}"
            ),
            GroupError::HasChildren { path, children } => {
                write!(
                    f,
                    "cannot remove {path}: it has {children} live child group(s)"
                )
            }
            GroupError::Removed { path } => write!(f, "group {path} was removed"),
            GroupError::RootCannotBeRemoved => write!(f, "the root group cannot be removed"),
            GroupError::Config(why) => write!(f, "invalid configuration: {why}"),
            GroupError::Stock(e) => write!(f, "invalid stock configuration: {e}"),
            // Its own message says what (e.g. "invalid stat schema: …").
            GroupError::Stat(e) => write!(f, "{e}"),
            GroupError::Thread(e) => write!(f, "cannot start the flusher thread: {}", e.0),
        }
    }
}

impl std::error::Error for GroupError {
    /// The underlying error of `Stock`, `Stat` and `Thread`.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GroupError::Stock(e) => Some(e),
            GroupError::Stat(e) => Some(e),
            GroupError::Thread(e) => Some(&*e.0),
            _ => None,
        }
    }
}

/// What kind of refusal a [`ChargeError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChargeErrorKind {
    /// A hard limit refused, after reclaim, draining and the OOM hook.
    Limit,
    /// The request itself exceeds [`crate::charge::MAX_REQUEST`].
    TooLarge,
    /// The charge would take a usage past [`crate::charge::MAX_USAGE`]
    /// (2^56 − 1), the most a counter holds: refused rather than lost.
    /// [`ChargeError::group`] is the group whose usage it is (the root, for
    /// a forced charge), [`ChargeError::limit`] that most.
    Saturated,
}

/// A refused charge, with the numbers that explain it (read through its
/// accessors; `Display` says it all in one line).
///
/// ```
/// use splitcount::{ChargeError, Hierarchy};
///
/// let h = Hierarchy::default();
/// let g = h.root().child("g").unwrap();
/// g.set_max(100).unwrap();
/// let e: ChargeError = g.charge(150).unwrap_err();
/// assert_eq!((e.group(), e.limit(), e.usage(), e.request()), ("/g", 100, 0, 150));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeError {
    pub(crate) kind: ChargeErrorKind,
    pub(crate) charged: String,
    pub(crate) group: String,
    pub(crate) limit: u64,
    pub(crate) usage: u64,
    pub(crate) request: u64,
    pub(crate) top: Vec<Consumer>,
}

impl ChargeError {
    /// Why.
    pub fn kind(&self) -> ChargeErrorKind {
        self.kind
    }

    /// The group the charge was made to (its path).
    pub fn charged(&self) -> &str {
        &self.charged
    }

    /// The group whose limit refused it: the charged group or an ancestor.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// That group's hard limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// That group's usage when it refused.
    pub fn usage(&self) -> u64 {
        self.usage
    }

    /// The units requested.
    pub fn request(&self) -> u64 {
        self.request
    }

    /// The largest children of the refusing group, largest first (at most
    /// [`TOP_CONSUMERS`]; empty for a leaf).
    pub fn top(&self) -> &[Consumer] {
        &self.top
    }
}

impl fmt::Display for ChargeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ChargeErrorKind::Limit => {
                write!(
                    f,
                    "charge of {} units to {} refused by the limit of {}: limit {}, usage {}, request {}",
                    self.request, self.charged, self.group, self.limit, self.usage, self.request
                )?;
                write_top(f, &self.group, &self.top)
            }
            ChargeErrorKind::TooLarge => write!(
                f,
                "charge of {} units to {} refused: a single request may be at most {} units",
                self.request,
                self.charged,
                crate::charge::MAX_REQUEST
            ),
            ChargeErrorKind::Saturated => write!(
                f,
                "charge of {} units to {} refused: the usage of {} ({}) would pass the most a counter holds ({})",
                self.request,
                self.charged,
                self.group,
                self.usage,
                self.limit
            ),
        }
    }
}

impl std::error::Error for ChargeError {}

/// An allocation went over a hard limit and was let through as a
/// cooperative over-charge ([`crate::charge::Enforcement::Cooperative`]):
/// what [`crate::group::Group::check`] reports until the breach is cleared.
///
/// ```
/// use splitcount::group::OverLimit;
/// fn report(e: &OverLimit) -> String {
///     format!("{} must stop: {} is at {} of {}", e.charged, e.group, e.usage, e.max)
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OverLimit {
    /// The group the allocation was charged to (the checked group or one
    /// below it).
    pub charged: String,
    /// The group whose limit it went over (the charged group or an
    /// ancestor).
    pub group: String,
    /// That group's usage right after the over-charge.
    pub usage: u64,
    /// That group's hard limit.
    pub max: u64,
    /// The charge that went over: units of [`crate::group::Group::over_charge`],
    /// or bytes for the allocator (the block's, or the batch its thread
    /// charged for small blocks); 0 where no charge is named (a removed
    /// group's [`crate::group::Group::check`] reporting that the group its
    /// charges now go to is over a limit).
    pub request: u64,
    /// The largest children of the group over its limit, largest first (at
    /// most [`TOP_CONSUMERS`]; empty for a leaf).
    pub top: Vec<Consumer>,
}

impl fmt::Display for OverLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.request == 0 {
            write!(
                f,
                "{} is over the limit of {}: usage {} of {}",
                self.charged, self.group, self.usage, self.max
            )?;
        } else {
            write!(
                f,
                "{} went over the limit of {}: usage {} of {} after a charge of {}",
                self.charged, self.group, self.usage, self.max, self.request
            )?;
        }
        write_top(f, &self.group, &self.top)
    }
}

impl std::error::Error for OverLimit {}

/// An allocation the allocator refused (returned null for), with the
/// numbers of the group whose limit refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusal {
    /// Bytes requested.
    pub request: u64,
    /// The group whose limit refused (the charged group or an ancestor).
    pub group: String,
    /// Its limit: `max`, or for a cooperative group the ceiling it hit.
    pub limit: u64,
    /// Its usage when it refused.
    pub usage: u64,
    /// The largest children of the refusing group, largest first (at most
    /// [`TOP_CONSUMERS`]; empty for a leaf).
    pub top: Vec<Consumer>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "allocation of {} bytes refused by {}: limit {}, usage {}",
            self.request, self.group, self.limit, self.usage
        )?;
        write_top(f, &self.group, &self.top)
    }
}

impl std::error::Error for Refusal {}
