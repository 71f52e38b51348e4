//! Layer 7: *account a Rust program's own heap by group.*
//!
//! Install [`Accounted`] as the global allocator, attach it to a
//! [`crate::group::Hierarchy`] (whose usage counters then count **bytes**),
//! and run work inside groups with [`crate::group::Group::enter`] or
//! [`crate::group::Group::scope`]:
//!
//! ```no_run
//! use splitcount::alloc::Accounted;
//! use splitcount::group::Hierarchy;
//! use std::alloc::System;
//!
//! #[global_allocator]
//! static ALLOC: Accounted<System> = Accounted::new(System);
//!
//! fn main() {
//!     let memory = Hierarchy::default();
//!     ALLOC.attach(&memory, None).unwrap();
//!     let request = memory.root().child("request-1").unwrap();
//!     request.set_max(64 << 20).unwrap();
//!     let big: Result<Vec<u8>, _> = request.scope(|| {
//!         let mut v = Vec::new();
//!         v.try_reserve(128 << 20).map(|_| v)   // refused: Err, not an abort
//!     });
//!     assert!(big.is_err());
//! }
//! ```
//!
//! **How.** Every allocation carries an 8-byte header (more for larger
//! alignments) holding the account of the group that allocated it, so a
//! free — on any thread, in any scope — uncharges that group. Charges go
//! through a byte stock (per-CPU slots of pre-charged bytes per group,
//! charged to the usage counter [`BYTE_BATCH`] bytes at a time), and in
//! front of it a per-thread reserve of up to `2 · `[`RESERVE_BATCH`] bytes
//! for the thread's current group, used with plain thread-local loads and
//! stores — so the common allocation and free touch no shared cache line
//! and execute no atomic instruction. Slack: usage may run ahead of live
//! bytes by the stocks (`BYTE_BATCH · 7 · ncpu`) plus the reserves
//! (`2 · RESERVE_BATCH` per thread); a limit may refuse while other
//! threads' reserves hold some of the group's bytes. A refused charge (after
//! draining the refusing group's stocked bytes, then the charged group's
//! hook ([`crate::group::Group::on_alloc_refusal`]) and the allocator's)
//! makes the allocation return null: `try_reserve` reports an error, plain
//! allocation reaches the standard out-of-memory path.
//!
//! **Never allocates, works anywhere.** The charge path uses only
//! preallocated state, `const` thread-locals without destructors (readable
//! before `main` and during thread teardown) and atomics. Before `attach`,
//! allocations pass through unaccounted; while a refusal hook runs,
//! allocations are unaccounted too (no recursion).
//!
//! **Costs and limits.** The header costs 8 bytes per allocation. Each
//! group that ever entered a scope keeps a small account (and its usage
//! counter, a few hundred bytes) alive until the process exits, because
//! allocations may point at it for as long as they live: reuse groups (a
//! pool per worker, say) rather than creating one per request without
//! bound. A scope entered for a group that is later removed keeps charging
//! that group's counter (and so its ancestors).

mod reserve;
mod scope;
mod wrapper;

pub use crate::charge::{Refusal, RefusalHook};
pub use reserve::RESERVE_BATCH;
pub use scope::AllocScope;
pub use wrapper::{take_last_refusal, Accounted, AttachError, BYTE_BATCH};
