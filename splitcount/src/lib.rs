//! # splitcount
//!
//! Memory cgroups inside your process: a tree of named groups with limits,
//! charged by a global allocator or by hand, with per-CPU counters that
//! scale to thousands of CPUs and say exactly how far off they can be —
//! after the Linux kernel's memory-cgroup and per-CPU counter machinery.
//!
//! **A server** makes a group per tenant or request, runs the work inside
//! it, and removes it afterwards; the allocator charges every allocation to
//! the current group, and a limit is reported (or an allocation refused)
//! without killing the process:
//!
//! ```no_run
//! use splitcount::{Accounted, Enforcement, Hierarchy};
//! use std::alloc::System;
//!
//! #[global_allocator]
//! static ALLOC: Accounted<System> = Accounted::new(System);
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let memory = Hierarchy::default();
//!     ALLOC.attach(&memory)?;
//!     let tenant = memory.root().child_or_create("tenant-a")?;
//!     tenant.set_max(64 << 20)?;
//!     let request = tenant.child("request-1")?;
//!     let body = request.scope(|| "x".repeat(1 << 20));
//!     assert!(request.usage() >= body.len() as u64);
//!     request.check()?; // within every limit up to the root
//!     drop(body);
//!     request.remove()?; // its account is freed with its last byte
//!     tenant.set_enforcement(Enforcement::Refuse); // over the limit: null
//!     Ok(())
//! }
//! ```
//!
//! **Charging by hand** (a query engine's operators, a connection pool)
//! uses the same groups without the allocator:
//!
//! ```
//! use splitcount::{GroupError, Hierarchy};
//!
//! let h = Hierarchy::default();
//! let pool = h.root().child("pool").unwrap();
//! pool.set_max(1000).unwrap();
//! pool.charge(600).unwrap();
//! let err = pool.charge(600).unwrap_err();
//! assert_eq!(err.limit(), 1000);            // who refused, at what limit
//! pool.uncharge(600);
//! assert!(matches!(pool.remove(), Ok(())));
//! # let _: Option<GroupError> = None;
//! ```
//!
//! **A counter** that many threads add to, read cheaply within a bound:
//!
//! ```
//! use splitcount::{SplitCounter, Tree};
//!
//! let requests = Tree::new();
//! requests.add(1);
//! assert_eq!(requests.precise(), 1);
//! let bound = requests.accuracy();          // approximate() is within this
//! assert!(requests.approximate() + bound.under as i64 >= 1);
//! ```
//!
//! The root re-exports what those need. Below it, the modules go down the
//! layers, each using only the ones after it in this list:
//!
//! - [`group`] — the tree of named groups: limits, events, hooks, snapshots,
//!   removal; [`alloc`] — the `GlobalAlloc` wrapper that charges a Rust
//!   program's heap to them; [`task`] — attribution across `.await` (tokio,
//!   tower); [`export`] — Prometheus and `metrics` exporters;
//! - [`stat`] — per-group statistics flushed lazily, only where they
//!   changed;
//! - [`charge`] — what limits mean: enforcement, events, bounds;
//! - [`counter`] — split counters behind one trait ([`Tree`] is the
//!   default), each with an exact, tight accuracy bound;
//! - [`cpu`] — the machine: topology, the current CPU, simulated machines;
//! - [`raw`] — the building blocks under all of it (per-CPU arena, stock,
//!   usage counter, CPU-id sources), for benchmarks and custom accounting.
//!
//! Cargo features: `tokio` and `tower` ([`task`]), `prometheus` and
//! `metrics` ([`export`]), `serde` (snapshots and figures serialize).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![warn(missing_debug_implementations)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod alloc;
pub mod charge;
pub mod counter;
pub mod cpu;
pub mod export;
pub mod group;
pub(crate) mod percpu;
pub mod raw;
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
mod rseq_section;
pub mod stat;
pub(crate) mod sync;
pub mod task;

pub use alloc::{Accounted, AttachError};
pub use charge::Enforcement;
pub use counter::{Config, ConfigError, CounterError, Design, SplitCounter, Tree};
pub use group::{BreachMode, ChargeError, Group, GroupError, Hierarchy, Reservation};

/// The README's examples, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
