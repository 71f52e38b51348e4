//! The lab's global allocator: the system allocator, or the same wrapped in
//! [`Accounted`] (charging requested sizes or footprints), chosen once per
//! process.
//!
//! `bench alloc` compares the two *as a program uses them*: every
//! allocation of its workloads goes through `std::alloc` (a `Vec`, a
//! `String`, serde_json's tree) to the process's global allocator. A
//! process cannot switch its global allocator while blocks are live (a
//! block from `System` has no header for `Accounted` to read), so the
//! choice is made once, at the first allocation, from the environment
//! variable [`ENV`] (`system`, the default, `accounted` or `footprint`),
//! and the allocator suite runs each in a worker process of its own
//! ([`crate::bench::alloc`]). Every side pays a dispatch of one or two
//! predictable branches on a static: `System` first, then the two
//! accounted allocators, which pay the same.

use serde::{Deserialize, Serialize};
use splitcount::alloc::{Accounted, Footprint};
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
    /// `Accounted<System>`: charges requested sizes.
    Accounted,
    /// `Accounted<System, Footprint>`: charges footprints
    /// (`malloc_usable_size` + 8 on glibc).
    Footprint,
}

impl Allocator {
    /// `system`, `accounted` or `footprint` (the value of [`ENV`]).
    pub fn name(self) -> &'static str {
        match self {
            Allocator::System => "system",
            Allocator::Accounted => "accounted",
            Allocator::Footprint => "footprint",
        }
    }

    /// Whether it charges groups (either `Accounted`).
    pub fn is_accounted(self) -> bool {
        self != Allocator::System
    }
}

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const ACCOUNTED_MODE: u8 = 2;
const FOOTPRINT_MODE: u8 = 3;

static MODE: AtomicU8 = AtomicU8::new(UNDECIDED);
static ACCOUNTED: Accounted<System> = Accounted::new(System);
static FOOTPRINT: Accounted<System, Footprint> = Accounted::with_charging(System, Footprint);

/// The allocator this process runs on (decided at its first allocation).
pub fn current() -> Allocator {
    match mode() {
        ACCOUNTED_MODE => Allocator::Accounted,
        FOOTPRINT_MODE => Allocator::Footprint,
        _ => Allocator::System,
    }
}

/// Attach the process's accounted allocator to `hierarchy`: from now on
/// its allocations are charged to the current group (an error if this
/// process runs on [`Allocator::System`]).
pub fn attach(hierarchy: &Hierarchy) -> Result<(), String> {
    let attached = match current() {
        Allocator::Accounted => ACCOUNTED.attach(hierarchy),
        Allocator::Footprint => FOOTPRINT.attach(hierarchy),
        Allocator::System => {
            return Err(format!(
                "this process runs on the system allocator \
                 ({ENV} is neither \"accounted\" nor \"footprint\")"
            ))
        }
    };
    attached.map_err(|e| e.to_string())
}

/// The accounted allocator's reconciliation ([`Accounted::reconcile`]):
/// `None` unless this process runs on one, attached.
pub fn reconcile() -> Option<splitcount::alloc::Reconciliation> {
    match current() {
        Allocator::Accounted => ACCOUNTED.reconcile(),
        Allocator::Footprint => FOOTPRINT.reconcile(),
        Allocator::System => None,
    }
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
    let name = if value.is_null() {
        &b""[..]
    } else {
        // SAFETY: getenv returned a NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes()
    };
    let m = match name {
        b"accounted" => ACCOUNTED_MODE,
        b"footprint" => FOOTPRINT_MODE,
        _ => SYSTEM,
    };
    // Relaxed: every thread decides the same value.
    match MODE.compare_exchange(UNDECIDED, m, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => m,
        Err(decided) => decided,
    }
}

/// The global allocator of `splitcount-lab`: [`System`],
/// `Accounted<System>` or `Accounted<System, Footprint>`, as [`current`]
/// says.
#[derive(Debug, Default)]
pub struct Switch;

// SAFETY: every call goes to one of three allocators that uphold the
// `GlobalAlloc` contract, and always the same one for the whole process
// (the mode never changes once decided), so a block is always freed or
// grown by the allocator that made it.
unsafe impl GlobalAlloc for Switch {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match mode() {
                SYSTEM => System.alloc(layout),
                ACCOUNTED_MODE => ACCOUNTED.alloc(layout),
                _ => FOOTPRINT.alloc(layout),
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract; `ptr` came from the same allocator.
        unsafe {
            match mode() {
                SYSTEM => System.dealloc(ptr, layout),
                ACCOUNTED_MODE => ACCOUNTED.dealloc(ptr, layout),
                _ => FOOTPRINT.dealloc(ptr, layout),
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match mode() {
                SYSTEM => System.alloc_zeroed(layout),
                ACCOUNTED_MODE => ACCOUNTED.alloc_zeroed(layout),
                _ => FOOTPRINT.alloc_zeroed(layout),
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract; `ptr` came from the same allocator.
        unsafe {
            match mode() {
                SYSTEM => System.realloc(ptr, layout, new_size),
                ACCOUNTED_MODE => ACCOUNTED.realloc(ptr, layout, new_size),
                _ => FOOTPRINT.realloc(ptr, layout, new_size),
            }
        }
    }
}
