//! Layer 2: *memory that has one copy per CPU.*
//!
//! An [`Arena`] holds one region per CPU, all regions with the same layout.
//! An allocation ([`PerCpu`]) of `k` slots reserves the same offset in every
//! CPU's region, so "my copy" is plain arithmetic (`base + cpu · stride +
//! offset`) and one 8-byte counter costs 8 bytes per CPU — not a padded
//! 128-byte line per CPU. All slots of one CPU are contiguous: two CPUs never
//! write the same cache line, and thousands of counters stay affordable.
//!
//! ```text
//!            chunk 0 (mmap)                      chunk 1
//!   cpu 0 | a a b c c c . . . . |  4 KiB     | d d e . . . . . |
//!   cpu 1 | a a b c c c . . . . |  4 KiB     | d d e . . . . . |
//!   cpu 2 | a a b c c c . . . . |  4 KiB     | d d e . . . . . |
//!           allocation `a` = 2 slots at offset 0 in every region
//! ```
//!
//! The arena grows by whole chunks and never moves a live slot. Freed slots
//! are zeroed and reused. On a NUMA host, each CPU's region is bound
//! (`MPOL_PREFERRED`) to its CPU's node before it is first touched.
//!
//! **Races.** On x86_64 Linux, a current-CPU add is an rseq critical
//! section: plain instructions that the kernel restarts if the thread is
//! preempted, migrated or signalled inside them ([`AddPath`]). Elsewhere it
//! is a relaxed atomic read-modify-write on the slot of the CPU the thread
//! *believed* it ran on; if it migrated in between, it updates another CPU's
//! copy, which only costs a shared cache line for that one update. Updates
//! that cannot be made on the caller's own copy go to a shared overflow copy.
//! Sums read every copy; nothing is ever dropped, including the slots of CPUs
//! that went offline.

mod arena;
mod chunk;
mod path;
mod row;
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
mod rseq_ops;
mod stripe;

pub(crate) use arena::SpillTarget;
pub use arena::{Arena, ArenaError, PerCpu};
pub use chunk::{REGION_BYTES, REGION_SLOTS};
pub use path::{default_add_path, rseq_available, AddPath, ArenaOptions, SlotIndex};
pub(crate) use row::Row;
pub(crate) use stripe::{Stripe, StripeKind};
