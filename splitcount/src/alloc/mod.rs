//! Layer 7: *account a Rust program's own heap by group.*
//!
//! Install [`Accounted`] as the global allocator, attach it to a
//! [`crate::group::Hierarchy`] (whose usage counters then count **bytes**),
//! and run work inside groups with [`crate::group::Group::enter`] or
//! [`crate::group::Group::scope`]:
//!
//! ```no_run
//! use splitcount::alloc::Accounted;
//! use splitcount::charge::Enforcement;
//! use splitcount::group::Hierarchy;
//! use std::alloc::System;
//!
//! #[global_allocator]
//! static ALLOC: Accounted<System> = Accounted::new(System);
//!
//! fn main() {
//!     let memory = Hierarchy::default();
//!     ALLOC.attach(&memory).unwrap();
//!     let request = memory.root().child("request-1").unwrap();
//!     request.set_max(64 << 20).unwrap();
//!     // Cooperative (the default): over the limit, allocations succeed and
//!     // the group reports the breach at its next check.
//!     let len = request.scope(|| "x".repeat(100 << 20).len());
//!     assert!(request.check().is_err());
//!     // Refuse: the allocator returns null; `try_reserve` reports it.
//!     request.clear_breach();
//!     request.set_enforcement(Enforcement::Refuse);
//!     let big: Result<Vec<u8>, _> = request.scope(|| {
//!         let mut v = Vec::new();
//!         v.try_reserve(128 << 20).map(|_| v)
//!     });
//!     assert!(big.is_err());
//!     request.remove().unwrap();
//! }
//! ```
//!
//! **How.** Every allocation carries an 8-byte header (more for larger
//! alignments) holding the *account* of the group that allocated it (the
//! kernel's `obj_cgroup`), so a free — on any thread, in any scope, after
//! the group's removal — uncharges that group's counters (and so every
//! ancestor). An account counts the bytes charged through it; it is freed,
//! with the removed group's counter, when its last byte is. Charges go
//! through a per-CPU byte stock (slots of pre-charged bytes per account,
//! charged to the usage counter [`BYTE_BATCH`] bytes at a time) and, in
//! front of it, a per-thread reserve of at most [`MAX_THREAD_RESERVE`]
//! bytes for the thread's current group, used with plain thread-local loads
//! and stores — so the common allocation and free touch no shared cache
//! line and execute no atomic instruction.
//!
//! **What a block charges** is fixed by the allocator's type, so that a
//! free always uncharges exactly what its allocation charged:
//!
//! | mode: `Accounted<A, C>` | a block charges | a group's `usage()` is (plus the slack below) |
//! |---|---|---|
//! | [`Requested`], the default: `Accounted<A>` | the size asked for, `Layout::size()` | the sum of its live blocks' requested sizes |
//! | [`Footprint`]: `Accounted<A, Footprint>` | its footprint, [`InnerFootprint::footprint`] | the sum of its live blocks' footprints: the memory they occupy in the inner allocator |
//!
//! With [`std::alloc::System`] on glibc (`linux-gnu`) a footprint is
//! `malloc_usable_size(block) + 8`: the block's whole chunk (the caller's
//! bytes, the header, glibc's rounding and its size field) — 48 bytes for a
//! 24-byte `Box`, which charges 24 under `Requested`. With `System`
//! elsewhere, and with inner allocators that cannot say, it is the
//! requested size plus the header. Charging footprints costs a
//! `malloc_usable_size` call per allocation and per free; the block is
//! allocated before it is charged (its footprint is known only then) and
//! freed again if the charge is refused. See [`Footprint`] for `realloc`
//! and the bounds.
//!
//! **Over a limit**, after reclaim hooks and draining the refusing group's
//! stocked bytes (only when they could make room), the refusing group's
//! [`crate::charge::Enforcement`] decides: a cooperative over-charge that the
//! next [`crate::group::Group::check`] reports (the default; bounded by an
//! optional ceiling), or — after the OOM hooks — a refusal: null, after the
//! allocation-refusal hooks ([`crate::group::Group::on_alloc_refusal`]).
//! Every hook runs with accounting off. Once a group is over a cooperative
//! limit, its further allocations until its usage falls below the limit are
//! plain forced charges through the thread's reserve: no hooks, no drains,
//! nothing of another CPU touched — a tenant over its limit costs its
//! neighbours nothing. After a refusal the thread's small allocations that
//! would be refused again pass unaccounted for a while
//! ([`REPORTING_GRACE`]), and so do a panicking thread's (those a limit
//! would refuse pass unaccounted; the others are charged as usual): error
//! messages always print. An allocator built with
//! [`Accounted::without_reporting_grace`] has strict limits instead (for C
//! callers, which are told by a null and handle it).
//!
//! **Slack.** Usage may run ahead of live bytes (requested sizes or
//! footprints, as charged) by the reserves (at most
//! `MAX_THREAD_RESERVE` per thread) plus the stocks (at most
//! [`BYTE_BUDGET`] = `7 · BYTE_BATCH` per CPU, however many groups
//! allocate there): [`Accounted::max_slack`], in the unit blocks charge
//! (requested sizes or footprints, on any inner allocator). A refusal drains the
//! stocks first, so it comes at most `threads · MAX_THREAD_RESERVE` early.
//! [`crate::group::Hierarchy::drain_stocks`] returns the stocks and the
//! calling thread's reserve; [`drain_thread`] an idle thread's.
//!
//! **What the resident set is made of.** [`Accounted::reconcile`] sets the
//! groups' books beside the process: the live bytes the groups track, the
//! headers, glibc's overhead and the free memory it keeps resident, stacks,
//! code and other mappings, each measured on its own, and what none of them
//! explains ([`Reconciliation::unexplained`]). glibc keeps freed memory for
//! reuse; [`Accounted::trim`] gives it back to the system now, and
//! [`Accounted::set_trim`] with a [`TrimPolicy`] after group removals, at
//! most once per interval, on a background thread.
//!
//! **Never allocates in the full group, works anywhere.** The charge path
//! uses preallocated state, `const` thread-locals (readable before `main`
//! and during thread teardown) and atomics; its slow path and the hooks run
//! with accounting off. Before `attach`, allocations pass through
//! unaccounted.

mod charging;
#[cfg(any(feature = "jemalloc", feature = "mimalloc"))]
mod heap_per_group;
#[cfg(feature = "jemalloc")]
mod jemalloc_arenas;
mod reconcile;
mod reserve;
mod resident;
mod scope;
#[cfg(any(feature = "jemalloc", feature = "mimalloc"))]
mod size_class;
mod thread;
mod trim;
mod wrapper;

pub use crate::group::{AllocRefusalHook, OverLimit, Refusal};
pub use charging::{Charging, Footprint, InnerFootprint, Requested};
#[cfg(any(feature = "jemalloc", feature = "mimalloc"))]
pub use heap_per_group::{HeapCount, HeapError, HeapPerGroup, InnerHeaps, MAX_HEAPS};
pub use reconcile::{Reconciliation, ResidentPart};
pub use reserve::{drain_thread, MAX_THREAD_RESERVE, RESERVE_BATCH};
pub use scope::AllocScope;
pub(crate) use scope::{current, enter_held, without_accounting};
#[doc(hidden)]
pub use thread::{use_static_tls, STATIC_TLS_CHECK};
pub(crate) use trim::group_removed;
pub use trim::{TrimPolicy, Trimmed, DEFAULT_TRIM_INTERVAL};
#[doc(hidden)]
pub use wrapper::raw_account;
pub use wrapper::{
    take_last_refusal, Accounted, AttachError, BYTE_BATCH, BYTE_BUDGET, REPORTING_GRACE,
    REPORTING_GRACE_ALLOCATION,
};
