//! How an arena's current-CPU adds are made, and which id picks "this
//! CPU's" copy.
//!
//! - **rseq** (x86_64 Linux): the add is a restartable sequence — a plain
//!   load, add and store that the kernel restarts if the thread is preempted,
//!   migrated or signalled inside it (`rseq_ops.rs`). No locked instruction.
//! - **atomic** (everywhere): a relaxed `fetch_add` on the copy of the CPU
//!   the thread last ran on — correct if it migrated meanwhile, at the price
//!   of a locked instruction.
//!
//! The choice is made per arena when it is created: rseq where the platform,
//! the kernel and the thread's registration allow it, unless forced either
//! way by [`ArenaOptions::add_path`] or, process-wide, by the environment
//! variable `SPLITCOUNT_PERCPU_ADD=atomic|rseq`. Simulated machines always
//! use the atomic path (their "current CPU" is the driver's choice).

use crate::cpu::{self, Machine, Topology};
use std::sync::OnceLock;

/// How current-CPU adds are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum AddPath {
    /// rseq where available, else atomic (also honours
    /// `SPLITCOUNT_PERCPU_ADD`).
    #[default]
    Auto,
    /// rseq critical sections; falls back to atomic where unavailable.
    Rseq,
    /// Relaxed atomic read-modify-writes.
    Atomic,
}

/// Which id selects the current CPU's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
#[non_exhaustive]
pub enum SlotIndex {
    /// The CPU the thread runs on: one region per possible CPU.
    #[default]
    CpuId,
    /// The rseq concurrency id (`mm_cid`, Linux ≥ 6.3): the kernel hands
    /// running threads ids below the number that run at once, so an arena
    /// needs only as many regions as the program's real concurrency. Without
    /// `mm_cid` the CPU id is used instead.
    MmCid,
}

/// Options of an [`super::Arena`].
///
/// ```
/// use splitcount::cpu::Machine;
/// use splitcount::raw::percpu::{AddPath, Arena, ArenaOptions, SlotIndex};
///
/// // One region, whatever the CPU count: enough for a program with one
/// // thread running at a time. Ids beyond go to the shared overflow copy
/// // (atomically).
/// let opts = ArenaOptions { index: SlotIndex::MmCid, regions: Some(1), ..Default::default() };
/// let arena = Arena::with_options(&Machine::host(), &opts).unwrap();
/// let p = arena.alloc(1).unwrap();
/// p.add(0, 5).unwrap();
/// assert_eq!(p.sum(0), Some(5));
///
/// let forced = ArenaOptions { add_path: AddPath::Atomic, ..Default::default() };
/// assert_eq!(Arena::with_options(&Machine::host(), &forced).unwrap().add_path(), AddPath::Atomic);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaOptions {
    /// How current-CPU adds are made.
    pub add_path: AddPath,
    /// Which id picks the current CPU's copy.
    pub index: SlotIndex,
    /// Regions of a [`SlotIndex::MmCid`] arena (`1..=cpus`; default `cpus`).
    /// Concurrency ids at or above it update the shared overflow copy with
    /// an atomic add: correct, but contended. Since untouched regions cost
    /// no physical memory, the default costs only address space.
    pub regions: Option<usize>,
}

/// Whether rseq adds can be used by this process: x86_64 Linux, an rseq
/// area for the calling thread, and CPU ids that equal their dense index
/// (possible CPUs `0..n`, the case on every machine without CPU holes).
pub fn rseq_available(index: SlotIndex) -> bool {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64", not(loom))) {
        return false;
    }
    #[cfg(target_os = "linux")]
    if cpu::rseq_area().is_none() {
        return false;
    }
    match index {
        SlotIndex::MmCid => cpu::mm_cid_available(),
        SlotIndex::CpuId => {
            let ids = Topology::host().possible_ids();
            ids.iter().enumerate().all(|(i, &id)| id as usize == i)
        }
    }
}

/// The process-wide default from `SPLITCOUNT_PERCPU_ADD` (`Auto` if unset
/// or unrecognized).
pub fn default_add_path() -> AddPath {
    static DEFAULT: OnceLock<AddPath> = OnceLock::new();
    // Trimmed, as `SPLITCOUNT_CPU_ID_SOURCE` is: the lab checks the value
    // trimmed, and a padded `" atomic"` it let through ran the rseq path.
    *DEFAULT.get_or_init(|| {
        match std::env::var("SPLITCOUNT_PERCPU_ADD")
            .as_deref()
            .map(str::trim)
        {
            Ok("atomic") => AddPath::Atomic,
            Ok("rseq") => AddPath::Rseq,
            _ => AddPath::Auto,
        }
    })
}

/// The path an arena for `machine` with `options` uses: true for rseq.
pub(crate) fn resolve(machine: &Machine, options: &ArenaOptions) -> bool {
    if machine.is_simulated() {
        return false;
    }
    let wanted = match options.add_path {
        AddPath::Auto => default_add_path(),
        forced => forced,
    };
    wanted != AddPath::Atomic && rseq_available(options.index)
}
