//! User callbacks of a group: reclaim, out-of-memory, pressure, and the
//! allocator's refusal. Each event has any number of subscribers, called in
//! the order they subscribed.
//!
//! Hooks run on the charge paths — also inside the global allocator, where
//! they run with accounting off (their own allocations are not charged, so
//! they cannot recurse into a full group) — and so:
//! - they are read from a snapshot cloned out of the group's read lock,
//!   which is never held while a hook runs (a subscription copies the set,
//!   with accounting off, and stores the new one under the write lock): a
//!   hook may charge its own group or subscribe more hooks;
//! - a hook that panics has declined (reclaimed nothing, allowed nothing):
//!   the unwind stops at the charge path, never leaving it (out of
//!   `GlobalAlloc::alloc` that would be undefined behaviour); the panic hook
//!   has reported it.

use super::error::Refusal;
use super::Group;
use std::sync::Arc;

/// Called when a charge is refused by this group's limit: free what you can
/// under this group (and uncharge it), return the units freed. The argument
/// is how many units the charge is short by.
pub type ReclaimHook = Arc<dyn Fn(&Group, u64) -> u64 + Send + Sync>;

/// Called when reclaim and draining did not make room: last resort (e.g.
/// cancel a query). Return `true` if it freed something worth one more try.
pub type OomHook = Arc<dyn Fn(&Group, u64) -> bool + Send + Sync>;

/// Called once each time a charge takes this group's usage above its `high`
/// soft limit (from at or below it), with the units it is above by.
pub type PressureHook = Arc<dyn Fn(&Group, u64) + Send + Sync>;

/// Called (with accounting off) when the allocator is about to refuse an
/// allocation charged to this group or below it: return `true` if it freed
/// memory worth one more try.
pub type AllocRefusalHook = Arc<dyn Fn(&Refusal) -> bool + Send + Sync>;

/// One group's subscribers.
#[derive(Default, Clone)]
pub(crate) struct Hooks {
    pub(crate) reclaim: Vec<ReclaimHook>,
    pub(crate) oom: Vec<OomHook>,
    pub(crate) pressure: Vec<PressureHook>,
    pub(crate) alloc_refusal: Vec<AllocRefusalHook>,
    pub(crate) events: Vec<super::events::EventHook>,
}

/// Run a user hook, returning `declined` if it panics (see the module docs).
pub(crate) fn run<R>(declined: R, hook: impl FnOnce() -> R) -> R {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook)).unwrap_or(declined)
}
