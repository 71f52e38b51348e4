//! The lab's global allocator: an inner allocator — the system's (glibc),
//! jemalloc or mimalloc — alone or wrapped in [`Accounted`] (charging
//! requested sizes or footprints), or jemalloc or mimalloc under
//! [`HeapPerGroup`] (no tag on the blocks of groups given a heap), chosen
//! once per process.
//!
//! `bench alloc` compares the two *as a program uses them*: every
//! allocation of its workloads goes through `std::alloc` (a `Vec`, a
//! `String`, serde_json's tree) to the process's global allocator. A
//! process cannot switch its global allocator while blocks are live (a
//! block from `System` has no header for `Accounted` to read), so the
//! choice is made once, at the first allocation, from the environment
//! variable [`ENV`] (`system`, the default, or another [`Allocator::name`]),
//! and the allocator suite runs each in a worker process of its own
//! ([`crate::bench::alloc`]). Every side pays the same dispatch: a
//! predictable indirect jump on a static.

use crossbeam_utils::CachePadded;
use mimalloc::MiMalloc;
use serde::{Deserialize, Serialize};
use splitcount::alloc::{Accounted, Footprint, HeapPerGroup};
use splitcount::group::Hierarchy;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};
use tikv_jemallocator::Jemalloc;

/// The environment variable that picks a process's allocator.
pub const ENV: &str = "SPLITCOUNT_LAB_ALLOCATOR";

/// Which allocator a process runs on: an inner allocator alone, or wrapped
/// in `Accounted` charging requested sizes or footprints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Allocator {
    /// `std::alloc::System` (glibc's malloc).
    #[serde(rename = "system")]
    System,
    /// `Accounted<System>`: charges requested sizes.
    #[serde(rename = "accounted")]
    Accounted,
    /// `Accounted<System, Footprint>`: charges footprints
    /// (`malloc_usable_size` + 8 on glibc).
    #[serde(rename = "footprint")]
    Footprint,
    /// `tikv_jemallocator::Jemalloc`.
    #[serde(rename = "jemalloc")]
    Jemalloc,
    /// `Accounted<Jemalloc>`.
    #[serde(rename = "jemalloc-accounted")]
    JemallocAccounted,
    /// `Accounted<Jemalloc, Footprint>` (jemalloc's usable size).
    #[serde(rename = "jemalloc-footprint")]
    JemallocFootprint,
    /// `HeapPerGroup<Jemalloc>`: footprints; the worker's groups are given
    /// heaps (a jemalloc arena each, see [`give_heap`]), so their blocks
    /// carry no tag.
    #[serde(rename = "jemalloc-heaps")]
    JemallocHeaps,
    /// `mimalloc::MiMalloc`.
    #[serde(rename = "mimalloc")]
    Mimalloc,
    /// `Accounted<MiMalloc>`.
    #[serde(rename = "mimalloc-accounted")]
    MimallocAccounted,
    /// `Accounted<MiMalloc, Footprint>` (`mi_usable_size`).
    #[serde(rename = "mimalloc-footprint")]
    MimallocFootprint,
    /// `HeapPerGroup<MiMalloc>`: footprints; the worker's groups are given
    /// heaps (see [`give_heap`]), so their blocks carry no tag.
    #[serde(rename = "mimalloc-heaps")]
    MimallocHeaps,
}

impl Allocator {
    /// Every allocator, each inner one before its wrappers.
    pub const ALL: [Allocator; 11] = [
        Allocator::System,
        Allocator::Accounted,
        Allocator::Footprint,
        Allocator::Jemalloc,
        Allocator::JemallocAccounted,
        Allocator::JemallocFootprint,
        Allocator::JemallocHeaps,
        Allocator::Mimalloc,
        Allocator::MimallocAccounted,
        Allocator::MimallocFootprint,
        Allocator::MimallocHeaps,
    ];

    /// `system`, `accounted`, `footprint`, `jemalloc`,
    /// `jemalloc-accounted`, … (the value of [`ENV`]).
    pub fn name(self) -> &'static str {
        match self {
            Allocator::System => "system",
            Allocator::Accounted => "accounted",
            Allocator::Footprint => "footprint",
            Allocator::Jemalloc => "jemalloc",
            Allocator::JemallocAccounted => "jemalloc-accounted",
            Allocator::JemallocFootprint => "jemalloc-footprint",
            Allocator::JemallocHeaps => "jemalloc-heaps",
            Allocator::Mimalloc => "mimalloc",
            Allocator::MimallocAccounted => "mimalloc-accounted",
            Allocator::MimallocFootprint => "mimalloc-footprint",
            Allocator::MimallocHeaps => "mimalloc-heaps",
        }
    }

    /// The allocator with this [`Allocator::name`].
    pub fn named(name: &str) -> Option<Allocator> {
        Allocator::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether it charges groups (an `Accounted`).
    pub fn is_accounted(self) -> bool {
        self != self.inner()
    }

    /// The inner allocator alone: `System`, `Jemalloc` or `Mimalloc`.
    pub fn inner(self) -> Allocator {
        match self {
            Allocator::System | Allocator::Accounted | Allocator::Footprint => Allocator::System,
            Allocator::Jemalloc
            | Allocator::JemallocAccounted
            | Allocator::JemallocFootprint
            | Allocator::JemallocHeaps => Allocator::Jemalloc,
            Allocator::Mimalloc
            | Allocator::MimallocAccounted
            | Allocator::MimallocFootprint
            | Allocator::MimallocHeaps => Allocator::Mimalloc,
        }
    }

    /// What a case on this allocator is divided by: a footprint wrapper by
    /// the same wrapper charging requested sizes (what footprints add), a
    /// requested-size wrapper by its inner allocator alone (what
    /// accounting adds), and an inner allocator by glibc's.
    pub fn baseline(self) -> Allocator {
        match self {
            Allocator::Footprint => Allocator::Accounted,
            Allocator::JemallocFootprint => Allocator::JemallocAccounted,
            Allocator::MimallocFootprint => Allocator::MimallocAccounted,
            a if a.is_accounted() => a.inner(),
            _ => Allocator::System,
        }
    }

    fn mode(self) -> u8 {
        Allocator::ALL.iter().position(|&a| a == self).unwrap_or(0) as u8 + 1
    }
}

const UNDECIDED: u8 = 0;

/// The decided allocator's mode, read on every allocation: on a cache line
/// of its own, so that no static the linker puts beside it (a counter a
/// bench writes) makes every allocation of another thread miss.
static MODE: CachePadded<AtomicU8> = CachePadded::new(AtomicU8::new(UNDECIDED));
static ACCOUNTED: Accounted<System> = Accounted::new(System);
static FOOTPRINT: Accounted<System, Footprint> = Accounted::with_charging(System, Footprint);
static JE_ACCOUNTED: Accounted<Jemalloc> = Accounted::new(Jemalloc);
static JE_FOOTPRINT: Accounted<Jemalloc, Footprint> = Accounted::with_charging(Jemalloc, Footprint);
static MI_ACCOUNTED: Accounted<MiMalloc> = Accounted::new(MiMalloc);
static MI_FOOTPRINT: Accounted<MiMalloc, Footprint> = Accounted::with_charging(MiMalloc, Footprint);
static JE_HEAPS: HeapPerGroup<Jemalloc> = HeapPerGroup::new(Jemalloc);
static MI_HEAPS: HeapPerGroup<MiMalloc> = HeapPerGroup::new(MiMalloc);

/// The allocator this process runs on (decided at its first allocation).
pub fn current() -> Allocator {
    Allocator::ALL[(mode() - 1) as usize]
}

/// Apply `$call` to the allocator of mode `$mode`, as an expression.
macro_rules! dispatch {
    ($mode:expr, |$a:ident| $call:expr) => {
        match $mode {
            2 => {
                let $a = &ACCOUNTED;
                $call
            }
            3 => {
                let $a = &FOOTPRINT;
                $call
            }
            4 => {
                let $a = &Jemalloc;
                $call
            }
            5 => {
                let $a = &JE_ACCOUNTED;
                $call
            }
            6 => {
                let $a = &JE_FOOTPRINT;
                $call
            }
            7 => {
                let $a = &JE_HEAPS;
                $call
            }
            8 => {
                let $a = &MiMalloc;
                $call
            }
            9 => {
                let $a = &MI_ACCOUNTED;
                $call
            }
            10 => {
                let $a = &MI_FOOTPRINT;
                $call
            }
            11 => {
                let $a = &MI_HEAPS;
                $call
            }
            _ => {
                let $a = &System;
                $call
            }
        }
    };
}

/// Attach the process's accounted allocator to `hierarchy`: from now on
/// its allocations are charged to the current group (an error if this
/// process runs on an inner allocator alone).
pub fn attach(hierarchy: &Hierarchy) -> Result<(), String> {
    let attached = match current() {
        Allocator::Accounted => ACCOUNTED.attach(hierarchy),
        Allocator::Footprint => FOOTPRINT.attach(hierarchy),
        Allocator::JemallocAccounted => JE_ACCOUNTED.attach(hierarchy),
        Allocator::JemallocFootprint => JE_FOOTPRINT.attach(hierarchy),
        Allocator::JemallocHeaps => JE_HEAPS.attach(hierarchy),
        Allocator::MimallocAccounted => MI_ACCOUNTED.attach(hierarchy),
        Allocator::MimallocFootprint => MI_FOOTPRINT.attach(hierarchy),
        Allocator::MimallocHeaps => MI_HEAPS.attach(hierarchy),
        other => {
            return Err(format!(
                "this process runs on {} alone ({ENV} names no accounted allocator)",
                other.name()
            ))
        }
    };
    attached.map_err(|e| e.to_string())
}

/// Give `group` a heap of its own when this process runs on
/// `HeapPerGroup` (its blocks then carry no tag); nothing otherwise.
pub fn give_heap(group: &splitcount::group::Group) -> Result<(), String> {
    match current() {
        Allocator::JemallocHeaps => JE_HEAPS.give_heap(group).map_err(|e| e.to_string()),
        Allocator::MimallocHeaps => MI_HEAPS.give_heap(group).map_err(|e| e.to_string()),
        _ => Ok(()),
    }
}

/// The accounted allocator's reconciliation ([`Accounted::reconcile`]):
/// `None` unless this process runs on one, attached.
pub fn reconcile() -> Option<splitcount::alloc::Reconciliation> {
    match current() {
        Allocator::Accounted => ACCOUNTED.reconcile(),
        Allocator::Footprint => FOOTPRINT.reconcile(),
        Allocator::JemallocAccounted => JE_ACCOUNTED.reconcile(),
        Allocator::JemallocFootprint => JE_FOOTPRINT.reconcile(),
        Allocator::JemallocHeaps => JE_HEAPS.reconcile(),
        Allocator::MimallocAccounted => MI_ACCOUNTED.reconcile(),
        Allocator::MimallocFootprint => MI_FOOTPRINT.reconcile(),
        Allocator::MimallocHeaps => MI_HEAPS.reconcile(),
        _ => None,
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
    let m = std::str::from_utf8(name)
        .ok()
        .and_then(Allocator::named)
        .unwrap_or(Allocator::System)
        .mode();
    // Relaxed: every thread decides the same value.
    match MODE.compare_exchange(UNDECIDED, m, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => m,
        Err(decided) => decided,
    }
}

/// The global allocator of `splitcount-lab`: one of [`Allocator::ALL`], as
/// [`current`] says.
#[derive(Debug, Default)]
pub struct Switch;

// SAFETY: every call goes to one of the allocators of `Allocator::ALL`,
// which uphold the `GlobalAlloc` contract, and always the same one for the
// whole process (the mode never changes once decided), so a block is
// always freed or grown by the allocator that made it.
unsafe impl GlobalAlloc for Switch {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        dispatch!(mode(), |a| unsafe { a.alloc(layout) })
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract; `ptr` came from the same allocator.
        dispatch!(mode(), |a| unsafe { a.dealloc(ptr, layout) })
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        dispatch!(mode(), |a| unsafe { a.alloc_zeroed(layout) })
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract; `ptr` came from the same allocator.
        dispatch!(mode(), |a| unsafe { a.realloc(ptr, layout, new_size) })
    }
}
