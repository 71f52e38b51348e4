//! A thread's current group: `splitcount_enter` / `splitcount_leave`.
//!
//! Under the preload library the thread's allocations (`malloc` and
//! friends) are charged to its current group; without it, the current group
//! only matters to code that reads it. Scopes nest: each enter is undone by
//! one leave, innermost first; a thread that exits inside scopes leaves
//! them.

use crate::error::{run, Error, SPLITCOUNT_E_STATE};
use crate::group::live;
use crate::splitcount_group;
use splitcount::alloc::AllocScope;
use std::cell::RefCell;
use std::ffi::c_int;

thread_local! {
    /// The scopes this thread entered, innermost last.
    static SCOPES: RefCell<Vec<AllocScope>> = const { RefCell::new(Vec::new()) };
}

/// Make a live group the calling thread's current group until the matching
/// `splitcount_leave`. A group of the preload's hierarchy
/// (`splitcount_preload_hierarchy`) is what the preload's `malloc` charges.
/// `SPLITCOUNT_E_STATE` under the preload with `SPLITCOUNT_PRELOAD_TAGS=off`,
/// whose blocks carry no account: every one is charged to `/preload`; and
/// under the preload for a group of another hierarchy (one the program
/// made with `splitcount_hierarchy_create_with`), whose scope would take
/// the thread's `malloc`s out of `SPLITCOUNT_PRELOAD_MAX` and the report.
///
/// Thread-safe; acts on the calling thread only.
#[no_mangle]
pub extern "C" fn splitcount_enter(group: *mut splitcount_group) -> c_int {
    run("splitcount_enter", || {
        let group = &live(group)?.group;
        crate::preload::enter_allowed(group)?;
        // The thread-local first, then the scope: registering its
        // destructor may allocate, which is not the group's.
        SCOPES
            .try_with(|s| s.borrow_mut().push(group.enter()))
            .map_err(|_| Error::new(SPLITCOUNT_E_STATE, "the thread is exiting"))
    })
}

/// Leave the innermost group the calling thread entered: the previous one
/// (or none) is current again. `SPLITCOUNT_E_STATE` if the thread is in no
/// group.
///
/// Thread-safe; acts on the calling thread only.
#[no_mangle]
pub extern "C" fn splitcount_leave() -> c_int {
    run("splitcount_leave", || {
        let scope = SCOPES.try_with(|s| s.borrow_mut().pop()).ok().flatten();
        match scope {
            Some(scope) => {
                drop(scope);
                Ok(())
            }
            None => Err(Error::new(
                SPLITCOUNT_E_STATE,
                "this thread entered no group (more leaves than enters)",
            )),
        }
    })
}
