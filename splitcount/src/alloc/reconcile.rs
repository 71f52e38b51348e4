//! Drift reconciliation: what the groups account, set beside what the
//! process really holds, so that a user sees where the two part ways.
//!
//! ```text
//!  accounted (root usage)                          what the groups count
//!   − stocked (per-CPU stocks, exact)              pre-charged, not in use
//!   − reserves (0 … holders × 32 KiB)              pre-charged, not in use
//!   = requested (a range)                          the bytes the program asked for
//!   + headers (8 B per block, more when aligned)   the wrapper's own
//!   + the inner allocator's rounding and chunks  ┐
//!   + blocks it gave before attach, unaccounted  ┘ = malloc in use (mallinfo2)
//!   + freed memory malloc keeps, code, stacks… ──── ≈ resident set (statm)
//! ```
//!
//! Under [`crate::alloc::Footprint`] charging the accounted bytes are the
//! blocks' footprints, headers and rounding included: `requested` is then
//! their footprints, and malloc's overhead only what no group accounts.

use crate::alloc::reserve::{HEADER_BYTES, RESERVE_HOLDERS};
use crate::alloc::MAX_THREAD_RESERVE;
use crate::group::Group;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;

/// One reconciliation of an [`crate::alloc::Accounted`] allocator's books
/// with the process ([`crate::alloc::Accounted::reconcile`]). Bytes
/// throughout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Reconciliation {
    /// The root group's usage: everything the groups account.
    pub accounted: u64,
    /// Of it, pre-charged bytes sitting in the per-CPU stocks (exact at the
    /// time of reading).
    pub stocked: u64,
    /// Threads whose reserve names a group: each holds at most
    /// [`MAX_THREAD_RESERVE`] pre-charged bytes (their exact sum is not
    /// kept: reserves change without atomics).
    pub reserve_holders: u64,
    /// Whether the allocator charges footprints
    /// ([`crate::alloc::Footprint`]): then `requested_*` are the live
    /// blocks' footprints (headers and the inner allocator's rounding
    /// included), not the sizes asked for.
    pub footprint: bool,
    /// The bytes the program holds through the wrapper, at least
    /// (`accounted − stocked − reserve_holders × MAX_THREAD_RESERVE`).
    pub requested_at_least: u64,
    /// … and at most (`accounted − stocked`).
    pub requested_at_most: u64,
    /// Header bytes of the live blocks (8 per block, the alignment when
    /// larger). Each thread adds its own count at its slow paths, so the
    /// figure may lag by a reserve's worth of allocations per thread.
    pub headers: u64,
    /// Bytes the inner allocator has handed out and not taken back (glibc:
    /// `mallinfo2`'s `uordblks + hblkhd`), `None` where it does not say.
    /// Includes its rounding and chunk overhead, the headers, and blocks
    /// that no group accounts (made before `attach`, or by code that
    /// bypasses the wrapper).
    pub malloc_in_use: Option<u64>,
    /// The process's resident set (`/proc/self/statm`), `None` where it
    /// cannot be read.
    pub resident: Option<u64>,
}

impl Reconciliation {
    /// Measure now, with `root` the attached hierarchy's root; `footprint`:
    /// the allocator charges footprints.
    pub(crate) fn measure(root: &Group, footprint: bool) -> Reconciliation {
        let accounted = root.usage();
        let stocked = root.stocked_subtree().min(accounted);
        // Relaxed: statistics.
        let holders = RESERVE_HOLDERS.load(Relaxed) as u64;
        let at_most = accounted - stocked;
        Reconciliation {
            accounted,
            stocked,
            reserve_holders: holders,
            footprint,
            requested_at_least: at_most.saturating_sub(holders * MAX_THREAD_RESERVE),
            requested_at_most: at_most,
            headers: HEADER_BYTES.load(Relaxed).max(0) as u64,
            malloc_in_use: malloc_in_use(),
            resident: resident(),
        }
    }

    /// What the inner allocator holds beyond the requested bytes and the
    /// headers — its rounding, chunk overhead and unaccounted blocks — as a
    /// range `(at least, at most)`, or `None` without `malloc_in_use`.
    /// Under footprint charging (headers and rounding accounted already):
    /// what it holds beyond the footprints.
    pub fn malloc_overhead(&self) -> Option<(i64, i64)> {
        let m = self.malloc_in_use? as i64;
        let h = if self.footprint {
            0
        } else {
            self.headers as i64
        };
        Some((
            m - h - self.requested_at_most as i64,
            m - h - self.requested_at_least as i64,
        ))
    }
}

/// glibc's in-use figure; `None` elsewhere.
fn malloc_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 has no preconditions; it returns a plain struct.
        let m = unsafe { libc::mallinfo2() };
        Some((m.uordblks + m.hblkhd) as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Resident pages × page size, from `/proc/self/statm`.
fn resident() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (page > 0).then(|| pages * page as u64)
}

impl fmt::Display for Reconciliation {
    /// A small table, one figure per line, for logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: Option<u64>| v.map_or_else(|| "n/a".to_owned(), |v| v.to_string());
        writeln!(f, "accounted          {:>14}", self.accounted)?;
        writeln!(f, "  stocked          {:>14}", self.stocked)?;
        writeln!(
            f,
            "  reserves         {:>14}  (at most: {} threads × {})",
            self.reserve_holders * MAX_THREAD_RESERVE,
            self.reserve_holders,
            MAX_THREAD_RESERVE
        )?;
        writeln!(
            f,
            "{:<19}{:>14}  … {}",
            if self.footprint {
                "footprints"
            } else {
                "requested"
            },
            self.requested_at_least,
            self.requested_at_most
        )?;
        writeln!(f, "headers            {:>14}", self.headers)?;
        writeln!(f, "malloc in use      {:>14}", opt(self.malloc_in_use))?;
        if let Some((lo, hi)) = self.malloc_overhead() {
            writeln!(f, "  malloc overhead  {lo:>14}  … {hi}")?;
        }
        write!(f, "resident           {:>14}", opt(self.resident))
    }
}
