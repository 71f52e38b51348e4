//! # splitcount
//!
//! Scalable, accurate resource accounting for many-core machines, after the
//! Linux kernel's per-CPU counter and memory-cgroup machinery.
//!
//! The crate is built in layers, each using only the ones before it:
//!
//! 1. [`cpu`] — where am I, and what machine is this;
//! 2. [`percpu`] — memory that has one copy per CPU;
//! 3. [`counter`] — split counters behind one trait ([`counter::Tree`] is
//!    the default), each with an exact, tight accuracy bound;
//! 4. [`charge`] — hierarchical usage with limits, and the per-CPU stock;
//! 5. [`stat`] — per-group statistics: per-CPU deltas, lock-free update
//!    lists, thresholds and subtree flushing;
//! 6. [`group`] — the facade: a tree of named groups with limits, events,
//!    hooks and removal;
//! 7. [`alloc`] — a `GlobalAlloc` wrapper that charges a Rust program's own
//!    heap to groups.
//!
//! ```
//! use splitcount::percpu::Arena;
//!
//! // A per-CPU counter slot on the host: adds touch only this CPU's copy.
//! let slot = Arena::host().alloc(1).unwrap();
//! slot.add(0, 5).unwrap();
//! slot.add(0, -2).unwrap();
//! assert_eq!(slot.sum(0), Some(3));
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod alloc;
pub mod charge;
pub mod counter;
pub mod cpu;
pub mod export;
pub mod group;
pub mod percpu;
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
mod rseq_section;
pub mod stat;
pub(crate) mod sync;
pub mod task;

/// The README's examples, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
