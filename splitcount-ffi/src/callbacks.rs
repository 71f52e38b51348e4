//! Callbacks from C: a group's events (limit crossings, refusals, OOM,
//! breaches) and its pressure hook, over the Rust subscriptions
//! (`Group::on_event`, `Group::on_pressure`) with the same rules.
//!
//! **Re-entrancy** (stated in the header at each function): a callback
//! runs synchronously on the thread whose charge, uncharge or allocation
//! made the transition, once per crossing; the group's subscriber list is
//! not locked while it runs, so it may call the C API — read or charge
//! this or any group, subscribe more callbacks — except destroy the
//! hierarchy or release or remove a handle that the interrupted call uses
//! (as for any call: a destruction must not race with calls on the same
//! handle). Under the preload, event callbacks run with accounting off:
//! their own `malloc`s are not charged and never refused (pressure
//! callbacks only when an allocation made the crossing). A callback must
//! return normally (no `longjmp`, no C++ exception out of it); it stays
//! subscribed as long as the group exists, and `user_data` must stay
//! valid and the callback thread-safe that long.

use crate::error::{run, Error, SPLITCOUNT_E_NULL};
use crate::group::live;
use crate::splitcount_group;
use splitcount::group::{EventKind, GroupEvent};
use std::ffi::{c_char, c_int, c_void, CString};

/// `splitcount_event.kind`: a charge took the usage above `high` (from at
/// or below it); `limit` is `high`.
pub const SPLITCOUNT_EVENT_HIGH_CROSSED: u32 = 0;
/// An uncharge took the usage back to or below `high`; `limit` is `high`.
pub const SPLITCOUNT_EVENT_BACK_UNDER_HIGH: u32 = 1;
/// A charge did not fit after reclaim and draining (the out-of-memory
/// stage ran); `limit` is `max`.
pub const SPLITCOUNT_EVENT_OOM: u32 = 2;
/// A charge was refused by `max` (a `splitcount_group_try_charge` error, or
/// a NULL from the preload's `malloc`), once per episode at the limit;
/// `limit` is `max`.
pub const SPLITCOUNT_EVENT_MAX_REFUSED: u32 = 3;
/// An allocation went over a cooperative limit and was let through (the
/// group is breached until `splitcount_group_clear_breach`); `limit` is
/// `max`.
pub const SPLITCOUNT_EVENT_BREACHED: u32 = 4;
/// An event of a kind this header does not know (a newer library).
pub const SPLITCOUNT_EVENT_OTHER: u32 = 255;

/// One event of a group, for a `splitcount_event_fn`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct splitcount_event {
    /// `SPLITCOUNT_EVENT_*`.
    pub kind: u32,
    /// The group's usage at the transition.
    pub usage: u64,
    /// The limit concerned (`high` or `max`, see the kind).
    pub limit: u64,
    /// The event's number among the group's events, in the order they
    /// were detected.
    pub seq: u64,
    /// The group's path ("/a/b"), NUL-terminated; valid during the call
    /// only.
    pub path: *const c_char,
}

/// A subscriber to a group's events: `event` is valid during the call
/// only; `user_data` is what was given at subscription.
#[allow(non_camel_case_types)]
pub type splitcount_event_fn =
    Option<unsafe extern "C" fn(event: *const splitcount_event, user_data: *mut c_void)>;

/// A subscriber to a group's pressure: called once each time a charge
/// takes the group above its `high`, with its path (valid during the call
/// only) and the units it is above by.
#[allow(non_camel_case_types)]
pub type splitcount_pressure_fn =
    Option<unsafe extern "C" fn(path: *const c_char, over: u64, user_data: *mut c_void)>;

/// A subscriber's `user_data`, carried to whichever thread runs it.
#[derive(Clone, Copy)]
struct UserData(*mut c_void);

// SAFETY: the subscriber's contract: the callback is thread-safe and its
// data stays valid while the group exists (see the module docs).
unsafe impl Send for UserData {}
// SAFETY: as above.
unsafe impl Sync for UserData {}

impl UserData {
    /// The pointer (a method, so that closures capture the whole `Send`
    /// wrapper, not its field).
    fn get(self) -> *mut c_void {
        self.0
    }
}

fn kind_code(kind: &EventKind) -> u32 {
    match kind {
        EventKind::HighCrossed => SPLITCOUNT_EVENT_HIGH_CROSSED,
        EventKind::BackUnderHigh => SPLITCOUNT_EVENT_BACK_UNDER_HIGH,
        EventKind::Oom => SPLITCOUNT_EVENT_OOM,
        EventKind::MaxRefused => SPLITCOUNT_EVENT_MAX_REFUSED,
        EventKind::Breached => SPLITCOUNT_EVENT_BREACHED,
        _ => SPLITCOUNT_EVENT_OTHER,
    }
}

/// A path for C (a group path has no NUL; an empty string if it had).
fn c_path(path: &str) -> CString {
    CString::new(path).unwrap_or_default()
}

/// Subscribe `callback` to the events of a live group (see
/// `SPLITCOUNT_EVENT_*`): called with `user_data` once per transition, on
/// the thread that made it, as Rust's `Group::on_event`. Subscribers stay
/// as long as the group exists (there is no unsubscribe).
///
/// **Re-entrancy.** The callback may call the C API — read or charge this
/// or another group, subscribe more callbacks — but not destroy the
/// hierarchy, nor release or remove a handle the interrupted call is
/// using. Under the preload it runs with accounting off (its `malloc`s are
/// neither charged nor refused). It must return normally (no `longjmp`, no
/// C++ exception), be thread-safe, and `user_data` must stay valid while
/// the group exists.
///
/// Thread-safe.
///
/// # Safety
/// `callback` and `user_data` as above.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_on_event(
    group: *mut splitcount_group,
    callback: splitcount_event_fn,
    user_data: *mut c_void,
) -> c_int {
    run("splitcount_group_on_event", || {
        let entry = live(group)?;
        let f = callback.ok_or_else(|| Error::new(SPLITCOUNT_E_NULL, "the callback is NULL"))?;
        let data = UserData(user_data);
        entry.group.on_event(move |e: &GroupEvent| {
            let path = c_path(e.group.path());
            let event = splitcount_event {
                kind: kind_code(&e.kind),
                usage: e.usage,
                limit: e.limit,
                seq: e.seq,
                path: path.as_ptr(),
            };
            // SAFETY: the subscriber's contract; `event` and `path` live
            // through the call.
            unsafe { f(&event, data.get()) }
        });
        Ok(())
    })
}

/// Subscribe `callback` to the pressure of a live group: called once each
/// time a charge takes its usage above `high` (from at or below it), with
/// the group's path and the units it is above by, as Rust's
/// `Group::on_pressure` — a place to shed load or shrink caches before
/// `max` refuses.
///
/// **Re-entrancy:** as `splitcount_group_on_event` (it may uncharge what
/// it frees, through any handle) — except that under the preload its own
/// `malloc`s run with accounting off only when an allocation made the
/// crossing; after a `splitcount_group_try_charge` they are charged to the
/// thread's current group as usual.
///
/// Thread-safe.
///
/// # Safety
/// As `splitcount_group_on_event`.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_on_pressure(
    group: *mut splitcount_group,
    callback: splitcount_pressure_fn,
    user_data: *mut c_void,
) -> c_int {
    run("splitcount_group_on_pressure", || {
        let entry = live(group)?;
        let f = callback.ok_or_else(|| Error::new(SPLITCOUNT_E_NULL, "the callback is NULL"))?;
        let data = UserData(user_data);
        entry.group.on_pressure(move |g, over| {
            let path = c_path(g.path());
            // SAFETY: the subscriber's contract; `path` lives through the
            // call.
            unsafe { f(path.as_ptr(), over, data.get()) }
        });
        Ok(())
    })
}
