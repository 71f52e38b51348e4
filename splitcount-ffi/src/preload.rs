//! What the preload library registers, so that a preloaded program reaches
//! its hierarchy and its default group through the C API.

use crate::error::{run, Error, SPLITCOUNT_E_STATE};
use crate::group::{GroupEntry, GROUPS};
use crate::hierarchy::{HierarchyEntry, HIERARCHIES};
use crate::{splitcount_group, splitcount_hierarchy};
use splitcount::group::{Group, Hierarchy};
use std::ffi::c_int;
use std::sync::OnceLock;

static PRELOAD: OnceLock<(Hierarchy, Group)> = OnceLock::new();

/// Why `splitcount_enter` (and removing the default group) is refused,
/// when the preload library says so.
static ENTER_REFUSED: OnceLock<&'static str> = OnceLock::new();

/// Called by the preload library when its `malloc` charges every block to
/// its default group whatever group a thread is in (its blocks carry no
/// account): `splitcount_enter` then fails with `SPLITCOUNT_E_STATE` and
/// `why`, rather than take a program's allocations where their `free`
/// would not find them; and so does `splitcount_group_remove` of the
/// default group (every `free` uncharges it: removed, it would fall to
/// the root's charges and never come back).
#[doc(hidden)]
pub fn refuse_enter(why: &'static str) {
    let _ = ENTER_REFUSED.set(why);
}

/// `Err` with the preload library's reason when it refuses scopes, or
/// when `group` is not of the preload's hierarchy.
///
/// Under the preload, `malloc` charges the group a thread entered, on its
/// own counters: a group of a hierarchy the program made itself
/// (`splitcount_hierarchy_create_with`) took every `malloc` of the scope
/// out of `/preload` — past `SPLITCOUNT_PRELOAD_MAX` (a helper's program
/// held 100 MiB under an 8 MiB limit) and out of the report.
pub(crate) fn enter_allowed(group: &Group) -> Result<(), Error> {
    if let Some(why) = ENTER_REFUSED.get() {
        return Err(Error::new(SPLITCOUNT_E_STATE, *why));
    }
    if let Some((h, _)) = PRELOAD.get() {
        let mut top = group.clone();
        while let Some(parent) = top.parent() {
            top = parent;
        }
        if top != h.root() {
            return Err(Error::new(
                SPLITCOUNT_E_STATE,
                format!(
                    "{} is a group of another hierarchy than the preload's: under the \
                     preload, malloc charges the groups of splitcount_preload_hierarchy \
                     (below /preload to stay within SPLITCOUNT_PRELOAD_MAX)",
                    group.path()
                ),
            ));
        }
    }
    Ok(())
}

/// `Err` when `group` is the preload's default group: every thread
/// outside a scope charges it for the life of the process, and its limit is
/// `SPLITCOUNT_PRELOAD_MAX` — removed, its charges went to the root and the
/// limit stopped holding, silently, while the report still showed it. With
/// tags off (see [`refuse_enter`]) every block is charged to it as well.
pub(crate) fn removal_allowed(group: &Group) -> Result<(), Error> {
    match PRELOAD.get() {
        Some((_, default)) if default == group => Err(Error::new(
            SPLITCOUNT_E_STATE,
            match ENTER_REFUSED.get() {
                Some(why) => format!("the preload's group cannot be removed: {why}"),
                None => "the preload's group cannot be removed: threads outside any \
                         group charge it, and SPLITCOUNT_PRELOAD_MAX is its limit"
                    .to_owned(),
            },
        )),
        _ => Ok(()),
    }
}

/// Called once by the preload library when its allocator is attached: the
/// hierarchy it charges and the group threads outside any scope charge.
#[doc(hidden)]
pub fn register_preload(hierarchy: Hierarchy, default_group: Group) {
    let _ = PRELOAD.set((hierarchy, default_group));
}

fn preload() -> Result<&'static (Hierarchy, Group), Error> {
    PRELOAD.get().ok_or_else(|| {
        Error::new(
            SPLITCOUNT_E_STATE,
            "the preload library is not loaded: run the program with \
             LD_PRELOAD=/path/to/libsplitcount_preload.so",
        )
    })
}

/// A new handle on the hierarchy the preload library charges `malloc` to
/// (usage in bytes); `SPLITCOUNT_E_STATE` without the preload. Groups
/// created in it and entered with `splitcount_enter` take the thread's
/// allocations. Its stock batch is `SPLITCOUNT_STOCK_BATCH_BYTES` (64 KiB),
/// so a program's own byte charges (`splitcount_group_try_charge`) hit the
/// stock as `malloc`'s do. Destroying the handle releases it (and the group handles
/// obtained through it), never the allocator's hierarchy.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_preload_hierarchy(
    out: *mut *mut splitcount_hierarchy,
) -> c_int {
    run("splitcount_preload_hierarchy", || {
        let (h, _) = preload()?;
        // SAFETY: the caller's contract.
        unsafe { HIERARCHIES.hand_out(HierarchyEntry::new(h.clone()), out) }
    })
}

/// A new handle on the preload's default group (`/preload`: what threads
/// outside any group charge, limited by `SPLITCOUNT_PRELOAD_MAX`);
/// `SPLITCOUNT_E_STATE` without the preload.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_preload_group(out: *mut *mut splitcount_group) -> c_int {
    run("splitcount_preload_group", || {
        let (h, g) = preload()?;
        let entry = GroupEntry::new(g.clone(), &HierarchyEntry::new(h.clone()), 0);
        // SAFETY: the caller's contract.
        unsafe { GROUPS.hand_out(entry, out) }
    })
}
