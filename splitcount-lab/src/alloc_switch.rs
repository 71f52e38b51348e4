//! The lab's global allocator: the system allocator, or the same wrapped in
//! [`Accounted`], chosen once per process.
//!
//! `bench alloc` compares the two *as a program uses them*: every
//! allocation of its workloads goes through `std::alloc` (a `Vec`, a
//! `String`, serde_json's tree) to the process's global allocator. A
//! process cannot switch its global allocator while blocks are live (a
//! block from `System` has no header for `Accounted` to read), so the
//! choice is made once, at the first allocation, from the environment
//! variable [`ENV`] (`system`, the default, or `accounted`), and the
//! allocator suite runs each side in a worker process of its own
//! ([`crate::bench::alloc`]). Both sides pay the same dispatch: one
//! predictable branch on a static.

use serde::{Deserialize, Serialize};
use splitcount::alloc::Accounted;
use splitcount::group::Hierarchy;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that picks a process's allocator.
pub const ENV: &str = "SPLITCOUNT_LAB_ALLOCATOR";

/// Which allocator a process runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Allocator {
    /// `std::alloc::System`.
    System,
    /// `Accounted<System>`.
    Accounted,
}

impl Allocator {
    /// `system` or `accounted` (the value of [`ENV`]).
    pub fn name(self) -> &'static str {
        match self {
            Allocator::System => "system",
            Allocator::Accounted => "accounted",
        }
    }
}

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const ACCOUNTED_MODE: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(UNDECIDED);
static ACCOUNTED: Accounted<System> = Accounted::new(System);

/// The allocator this process runs on (decided at its first allocation).
pub fn current() -> Allocator {
    if mode() == ACCOUNTED_MODE {
        Allocator::Accounted
    } else {
        Allocator::System
    }
}

/// Attach the accounted allocator to `hierarchy`: from now on this
/// process's allocations are charged to the current group (an error
/// unless this process runs on [`Allocator::Accounted`]).
pub fn attach(hierarchy: &Hierarchy) -> Result<(), String> {
    if current() != Allocator::Accounted {
        return Err(format!(
            "this process runs on the system allocator ({ENV} is not \"accounted\")"
        ));
    }
    ACCOUNTED.attach(hierarchy).map_err(|e| e.to_string())
}

/// The accounted allocator's reconciliation ([`Accounted::reconcile`]):
/// `None` unless this process runs on it, attached.
pub fn reconcile() -> Option<splitcount::alloc::Reconciliation> {
    if current() != Allocator::Accounted {
        return None;
    }
    ACCOUNTED.reconcile()
}

#[inline(always)]
fn mode() -> u8 {
    // Relaxed: the mode is decided once from the environment, the same way
    // by every thread; no memory is published through it.
    match MODE.load(Ordering::Relaxed) {
        UNDECIDED => decide(),
        m => m,
    }
}

#[cold]
fn decide() -> u8 {
    // SAFETY: a NUL-terminated name; the lab never sets environment
    // variables, so no `setenv` races with this read. No allocation.
    let value = unsafe { libc::getenv(c"SPLITCOUNT_LAB_ALLOCATOR".as_ptr()) };
    // SAFETY: getenv returned a NUL-terminated string or null.
    let accounted =
        !value.is_null() && unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes() == b"accounted";
    let m = if accounted { ACCOUNTED_MODE } else { SYSTEM };
    // Relaxed: every thread decides the same value.
    match MODE.compare_exchange(UNDECIDED, m, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => m,
        Err(decided) => decided,
    }
}

/// The global allocator of `splitcount-lab`: [`System`] or
/// `Accounted<System>`, as [`current`] says.
#[derive(Debug, Default)]
pub struct Switch;

// SAFETY: every call goes to one of two allocators that uphold the
// `GlobalAlloc` contract, and always the same one for the whole process
// (the mode never changes once decided), so a block is always freed or
// grown by the allocator that made it.
unsafe impl GlobalAlloc for Switch {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if mode() == ACCOUNTED_MODE {
                ACCOUNTED.alloc(layout)
            } else {
                System.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract; `ptr` came from the same allocator.
        unsafe {
            if mode() == ACCOUNTED_MODE {
                ACCOUNTED.dealloc(ptr, layout)
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if mode() == ACCOUNTED_MODE {
                ACCOUNTED.alloc_zeroed(layout)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract; `ptr` came from the same allocator.
        unsafe {
            if mode() == ACCOUNTED_MODE {
                ACCOUNTED.realloc(ptr, layout, new_size)
            } else {
                System.realloc(ptr, layout, new_size)
            }
        }
    }
}
