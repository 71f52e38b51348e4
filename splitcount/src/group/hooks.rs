//! User callbacks of a group: reclaim, out-of-memory and pressure.

use super::Group;
use std::sync::Arc;

/// Called when a charge is refused by this group's limit: free what you can
/// under this group (and uncharge it), return the units freed. The argument
/// is how many units the charge is short by.
pub type ReclaimHook = Arc<dyn Fn(&Group, u64) -> u64 + Send + Sync>;

/// Called when reclaim and draining did not make room: last resort (e.g.
/// cancel a query). Return `true` if it freed something worth one more try.
pub type OomHook = Arc<dyn Fn(&Group, u64) -> bool + Send + Sync>;

/// Called after a charge left this group above its `high` soft limit, with
/// the units it is above by.
pub type PressureHook = Arc<dyn Fn(&Group, u64) + Send + Sync>;

/// Run a user hook, returning `declined` if it panics: the unwind stops
/// here, so a charge path (which may run inside the global allocator) is
/// never unwound through, and locks it holds stay consistent. The panic
/// hook has reported the panic by then. Callers clone the hook out of the
/// group's mutex first and drop the guard, so a hook may charge its own
/// group or install hooks without deadlocking.
pub(crate) fn run<R>(declined: R, hook: impl FnOnce() -> R) -> R {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook)).unwrap_or(declined)
}

#[derive(Default, Clone)]
pub(crate) struct Hooks {
    pub(crate) reclaim: Option<ReclaimHook>,
    pub(crate) oom: Option<OomHook>,
    pub(crate) pressure: Option<PressureHook>,
}
