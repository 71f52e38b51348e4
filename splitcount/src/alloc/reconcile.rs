//! Drift reconciliation: what the groups account, set beside what the
//! process really holds, so that a user sees where the two part ways — and
//! the resident set explained part by part, each part measured on its own,
//! with what no part explains reported as its own figure.
//!
//! ```text
//!  the books                                        source
//!  accounted (root usage)                           the groups' counters
//!   − stocked (per-CPU stocks, exact)               the stocks
//!   − reserves (0 … holders × 32 KiB)               a count of holders
//!   = requested (a range)                           the bytes the program asked for
//!   + headers (8 B per block, more when aligned)    the wrapper's own
//!   + the inner allocator's rounding and chunks  ┐
//!   + blocks it gave before attach, unaccounted  ┘ = malloc in use (mallinfo2)
//!
//!  the resident set (Σ Rss of /proc/self/smaps), part by part
//!  ┌ tracked          live tracked bytes: requested, the reserves' midpoint   counters
//!  │ headers          the wrapper's header bytes (Requested charging)         a counter
//!  │ malloc chunk     glibc's size fields and rounding: 16 B a block,         block count
//!  │   overhead       half a page a mapped block (an estimate)
//!  │ malloc free      free chunks glibc keeps (bins, tops), less the pages   mallinfo2 fordblks,
//!  │   resident       of its arenas the kernel does not hold                  smaps of its heaps
//!  │ stacks           [stack], guarded thread and signal stacks               smaps
//!  │ files            file-backed mappings: code, data, mapped files          smaps
//!  │ other mappings   other anonymous mappings (not glibc's heaps)            smaps
//!  └ − untouched      in use, never written: pages of blocks glibc mapped    smaps, mincore,
//!                     alone; arena pages beyond its free bytes (subtracted)   mallinfo2
//!    unexplained      resident set − Σ the parts above (signed)
//! ```
//!
//! Under [`crate::alloc::Footprint`] charging the accounted bytes are the
//! blocks' footprints, headers and rounding included: `requested` is then
//! their footprints, and the headers and malloc chunk overhead parts are 0.
//!
//! **What the unexplained figure holds** (see `IMPLEMENTATION.md`, §7,
//! *Reconciliation*): blocks glibc holds that no group tracks (made before
//! `attach`, by C code, with accounting off), glibc's per-thread caches
//! (in use to glibc), the error of the overhead estimate and of the
//! reserves' midpoint, in-use arena pages never written while glibc also
//! holds free bytes (negative), a mapping the classes put in the wrong
//! place, and what moved while smaps was read (`reading_drift` bounds it).
//!
//! **Cost.** Reading smaps walks every mapping's page tables in the kernel:
//! 2–9 ms per reconciliation for the example server under load on this
//! 2-CPU machine (re-readings included), far less when idle. Nothing here
//! allocates (fixed buffers on the stack).

use super::resident;
use crate::alloc::reserve::{HEADER_BYTES, RESERVE_HOLDERS};
use crate::alloc::trim::{TRIMS, TRIM_NANOS};
use crate::alloc::MAX_THREAD_RESERVE;
use crate::group::Group;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;

/// One reconciliation of an [`crate::alloc::Accounted`] allocator's books
/// with the process ([`crate::alloc::Accounted::reconcile`]). Bytes
/// throughout.
///
/// The resident set is explained by the parts of [`ResidentPart`], each
/// measured on its own (how, on each field below); `unexplained` is what
/// they leave, `resident_mapped − Σ parts`.
///
/// ```no_run
/// use splitcount::alloc::{Accounted, ResidentPart};
/// use splitcount::group::Hierarchy;
/// use std::alloc::System;
///
/// #[global_allocator]
/// static ALLOC: Accounted<System> = Accounted::new(System);
///
/// let memory = Hierarchy::default();
/// ALLOC.attach(&memory).unwrap();
/// let r = ALLOC.reconcile().unwrap();
/// for part in ResidentPart::ALL {
///     println!("{:<22} {:>12?}", part.name(), r.part(part));
/// }
/// println!("unexplained {:?} of {:?}", r.unexplained, r.resident_mapped);
/// ```
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
    /// Tag bytes of the live blocks (8 per block: a header in front, or
    /// trailing an over-aligned block). Each thread adds its own count at its slow paths, so the
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

    /// **Part:** the live tracked bytes — the midpoint of
    /// `requested_at_least … requested_at_most` (the reserves' exact sum is
    /// not kept), so within `± reserve_holders × MAX_THREAD_RESERVE / 2` of
    /// the truth. The groups' usage less the stock and reserve slack.
    pub tracked: u64,
    /// **Part:** glibc's own overhead in the live blocks, estimated from
    /// their number (`headers / 8`, and `mallinfo2`'s count of mapped
    /// blocks): 16 bytes per block in an arena (its size field and the
    /// rounding to 16 bytes: 8 to 23, 15.5 on average) and half a page plus
    /// 16 bytes per block glibc mapped on its own. `Some(0)` under
    /// footprint charging (inside `tracked`); `None` but for glibc.
    pub malloc_chunk_overhead: Option<u64>,
    /// Every free byte glibc keeps (`mallinfo2`'s `fordblks`: its bins,
    /// fast bins, and each arena's top chunk), resident or not.
    pub malloc_free: Option<u64>,
    /// **Part:** the free bytes glibc keeps that are resident: `fordblks`
    /// less the pages of glibc's arenas that the kernel does not hold
    /// (smaps: `[heap]` and the arena heaps' read-write parts, their size
    /// less their `Rss`, less what glibc shrank those heaps by). glibc does
    /// not know which of its free bytes are resident; the kernel does not
    /// know which pages are free. A page in an arena is not resident when it
    /// was never touched (the tops grow ahead of use), when a trim released
    /// it (inside a free chunk, still counted free), or when it was handed
    /// out and never written: all but the last are free, and the last is
    /// rare (a `Vec::with_capacity` never filled, a fresh `calloc`), so it
    /// is taken as free too — an error of this part, not of the others.
    /// Blocks glibc mapped on their own (`hblkhd`) are never free: their
    /// free unmaps them. `None` without glibc or smaps.
    pub malloc_free_resident: Option<u64>,
    /// **Part:** resident bytes of the stacks: `[stack]`, and every
    /// anonymous mapping right above a `---p` guard mapping (glibc's thread
    /// stacks, Rust's signal stacks), from `/proc/self/smaps`.
    pub stacks: Option<u64>,
    /// **Part:** resident bytes of file-backed mappings: the program's and
    /// the shared libraries' code and data, mapped files, shared memory.
    pub files: Option<u64>,
    /// **Part:** resident bytes of the other mappings: anonymous ones that
    /// are neither glibc's heaps nor stacks (splitcount's per-CPU arenas,
    /// other libraries' `mmap`s), `[vdso]`, `[vvar]`.
    pub other_mappings: Option<u64>,
    /// **Part, subtracted:** memory in use that is not resident — pages
    /// never written since glibc handed them out: a `vec![0; n]` (`calloc`
    /// writes none of a fresh page), capacity reserved and not filled. They
    /// count in `tracked` and occupy nothing. Measured where it can be: the
    /// blocks glibc mapped on their own (found in smaps by their chunk
    /// header; `mincore` says which of their pages are resident), and, in
    /// its arenas, the non-resident pages beyond glibc's free bytes (free
    /// chunks cannot hold more: at least that much of the in-use memory was
    /// never written; see `malloc_free_resident`).
    pub untouched: Option<u64>,
    /// Beside the parts: resident bytes of glibc's own mappings — `[heap]`,
    /// its arena heaps and the blocks it mapped on their own — which
    /// `tracked`, `headers`, `malloc_chunk_overhead`, `malloc_free_resident` and
    /// untracked blocks explain.
    pub malloc_mappings: Option<u64>,
    /// The resident set as the parts see it: Σ `Rss` over
    /// `/proc/self/smaps` (statm's `resident` may differ by the kernel's
    /// per-CPU counter batches).
    pub resident_mapped: Option<u64>,
    /// `resident_mapped − Σ parts` ([`Reconciliation::explained`]): what no
    /// part explains; negative when the parts claim more than is resident.
    /// `None` when a part or the resident set is unknown.
    pub unexplained: Option<i64>,
    /// How far the books (the groups' usage, glibc's in-use, free and
    /// mapped bytes) moved while smaps was read: the uncertainty that the
    /// reading itself puts on `unexplained` (the books are the midpoint of
    /// their values before and after it). The reading is taken again, up
    /// to 4 times, while this is above 64 KiB and 0.5% of the resident
    /// set; the calmest one is kept.
    pub reading_drift: u64,
    /// Trims done so far ([`crate::alloc::Accounted::trim`] and the trim
    /// policy's), and their total time in nanoseconds.
    pub trims: u64,
    /// See `trims`.
    pub trim_nanos: u64,
}

/// One part of the resident set as [`Reconciliation`] explains it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResidentPart {
    /// [`Reconciliation::tracked`].
    Tracked,
    /// [`Reconciliation::headers`] (0 under footprint charging).
    Headers,
    /// [`Reconciliation::malloc_chunk_overhead`].
    MallocChunkOverhead,
    /// [`Reconciliation::malloc_free_resident`].
    MallocFreeResident,
    /// [`Reconciliation::stacks`].
    Stacks,
    /// [`Reconciliation::files`].
    Files,
    /// [`Reconciliation::other_mappings`].
    OtherMappings,
    /// [`Reconciliation::untouched`], subtracted
    /// ([`ResidentPart::subtracted`]).
    Untouched,
}

impl ResidentPart {
    /// Every part, in the order of the module docs' diagram.
    pub const ALL: [ResidentPart; 8] = [
        ResidentPart::Tracked,
        ResidentPart::Headers,
        ResidentPart::MallocChunkOverhead,
        ResidentPart::MallocFreeResident,
        ResidentPart::Stacks,
        ResidentPart::Files,
        ResidentPart::OtherMappings,
        ResidentPart::Untouched,
    ];

    /// Whether the part is subtracted from the others (it is counted in
    /// `tracked` but is not resident): only [`ResidentPart::Untouched`].
    pub fn subtracted(self) -> bool {
        self == ResidentPart::Untouched
    }

    /// A short `snake_case` name (`"malloc_free_resident"`), as exporters
    /// write it.
    pub fn name(self) -> &'static str {
        match self {
            ResidentPart::Tracked => "tracked",
            ResidentPart::Headers => "headers",
            ResidentPart::MallocChunkOverhead => "malloc_chunk_overhead",
            ResidentPart::MallocFreeResident => "malloc_free_resident",
            ResidentPart::Stacks => "stacks",
            ResidentPart::Files => "files",
            ResidentPart::OtherMappings => "other_mappings",
            ResidentPart::Untouched => "untouched",
        }
    }

    /// One line on what the part is and where it is measured.
    pub fn help(self) -> &'static str {
        match self {
            ResidentPart::Tracked => {
                "Live bytes the groups track: their usage less the stock and reserve slack (the reserves' midpoint)."
            }
            ResidentPart::Headers => {
                "Header bytes the accounting allocator puts in front of every live block (0 when it charges footprints)."
            }
            ResidentPart::MallocChunkOverhead => {
                "glibc's own overhead in the live blocks (size fields, rounding), estimated from their number."
            }
            ResidentPart::MallocFreeResident => {
                "Free bytes glibc keeps for reuse that are resident (mallinfo2 fordblks less the pages of its heaps the kernel does not hold)."
            }
            ResidentPart::Stacks => "Resident bytes of the thread and signal stacks (smaps).",
            ResidentPart::Files => {
                "Resident bytes of file-backed mappings: code, data, mapped files, shared memory (smaps)."
            }
            ResidentPart::OtherMappings => {
                "Resident bytes of anonymous mappings that are neither glibc's heaps nor stacks (smaps)."
            }
            ResidentPart::Untouched => {
                "Subtracted from the parts: memory in use but never written (calloc, unfilled capacity), counted in tracked and not resident (smaps, mincore)."
            }
        }
    }
}

impl Reconciliation {
    /// Measure now, with `root` the attached hierarchy's root; `footprint`:
    /// the allocator charges footprints. Runs with accounting off (the
    /// caller's `without_accounting`); allocates nothing itself.
    pub(crate) fn measure(root: &Group, footprint: bool) -> Reconciliation {
        // smaps takes milliseconds to read while other threads allocate
        // and free: the books are read before and after it, and the reading
        // is taken again while they moved more than the tolerance.
        let mut best: Option<(u64, Books, Books, Option<resident::Mappings>)> = None;
        for _ in 0..READ_ATTEMPTS {
            let before = Books::read(root);
            let maps = resident::read_mappings(before.malloc.map_or(0, |m| m.hblks));
            let after = Books::read(root);
            let drift = before.distance(&after);
            let tolerance = maps.map_or(0, |m| m.total / 200).max(READ_TOLERANCE);
            if best.as_ref().map_or(true, |b| drift < b.0) {
                best = Some((drift, before, after, maps));
            }
            if drift <= tolerance {
                break;
            }
        }
        let (drift, before, after, maps) = best.expect("at least one attempt");
        let books = before.midpoint(&after);
        let Books {
            accounted,
            stocked,
            holders,
            headers,
            malloc,
        } = books;
        let at_most = accounted - stocked;
        let at_least = at_most.saturating_sub(holders * MAX_THREAD_RESERVE);
        let mut r = Reconciliation {
            accounted,
            stocked,
            reserve_holders: holders,
            footprint,
            requested_at_least: at_least,
            requested_at_most: at_most,
            headers,
            malloc_in_use: malloc.map(|m| m.uordblks + m.hblkhd),
            resident: resident(),
            tracked: at_least + (at_most - at_least) / 2,
            malloc_chunk_overhead: malloc.map(|m| {
                if footprint {
                    0
                } else {
                    m.overhead_estimate(headers)
                }
            }),
            malloc_free: malloc.map(|m| m.fordblks),
            malloc_free_resident: malloc.zip(maps).map(|(m, maps)| m.free_resident(&maps).0),
            stacks: maps.map(|m| m.stacks),
            files: maps.map(|m| m.files),
            other_mappings: maps.map(|m| m.other),
            untouched: maps.map(|m| {
                let arenas = malloc.map_or(0, |malloc| malloc.free_resident(&m).1);
                m.mapped_block_bytes - m.mapped_block_resident + arenas
            }),
            malloc_mappings: maps.map(|m| m.malloc),
            resident_mapped: maps.map(|m| m.total),
            unexplained: None,
            reading_drift: drift,
            trims: TRIMS.load(Relaxed),
            trim_nanos: TRIM_NANOS.load(Relaxed),
        };
        r.unexplained = r.compute_unexplained();
        r
    }

    /// One part's bytes, `None` where its source cannot be read (glibc's
    /// figures elsewhere than glibc, smaps without `/proc`).
    pub fn part(&self, part: ResidentPart) -> Option<u64> {
        match part {
            ResidentPart::Tracked => Some(self.tracked),
            ResidentPart::Headers => Some(if self.footprint { 0 } else { self.headers }),
            ResidentPart::MallocChunkOverhead => self.malloc_chunk_overhead,
            ResidentPart::MallocFreeResident => self.malloc_free_resident,
            ResidentPart::Stacks => self.stacks,
            ResidentPart::Files => self.files,
            ResidentPart::OtherMappings => self.other_mappings,
            ResidentPart::Untouched => self.untouched,
        }
    }

    /// Σ of the parts ([`ResidentPart::ALL`], the subtracted one
    /// subtracted), `None` if one is unknown.
    pub fn explained(&self) -> Option<i64> {
        ResidentPart::ALL.iter().try_fold(0i64, |sum, &p| {
            let v = self.part(p)? as i64;
            Some(if p.subtracted() { sum - v } else { sum + v })
        })
    }

    /// `resident_mapped − explained()`, as stored in `unexplained`.
    fn compute_unexplained(&self) -> Option<i64> {
        Some(self.resident_mapped? as i64 - self.explained()?)
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

/// Readings of smaps per reconciliation, at most (see `measure`).
const READ_ATTEMPTS: usize = 4;
/// The books may move by this much (or 0.5% of the resident set) while
/// smaps is read.
const READ_TOLERANCE: u64 = 64 << 10;

/// What the groups and glibc say, read around one reading of smaps.
#[derive(Debug, Clone, Copy)]
struct Books {
    accounted: u64,
    stocked: u64,
    holders: u64,
    headers: u64,
    malloc: Option<Malloc>,
}

impl Books {
    fn read(root: &Group) -> Books {
        let accounted = root.usage();
        Books {
            accounted,
            stocked: root.stocked_subtree().min(accounted),
            // Relaxed: statistics.
            holders: RESERVE_HOLDERS.load(Relaxed) as u64,
            headers: HEADER_BYTES.load(Relaxed).max(0) as u64,
            malloc: Malloc::read(),
        }
    }

    /// How far apart two readings are, in bytes.
    fn distance(&self, o: &Books) -> u64 {
        let live = |b: &Books| (b.accounted - b.stocked) as i64;
        let mut d = (live(self) - live(o)).unsigned_abs();
        if let (Some(a), Some(b)) = (self.malloc, o.malloc) {
            d += a.uordblks.abs_diff(b.uordblks)
                + a.fordblks.abs_diff(b.fordblks)
                + a.hblkhd.abs_diff(b.hblkhd);
        }
        d
    }

    /// Field by field, halfway between two readings.
    fn midpoint(&self, o: &Books) -> Books {
        let mid = |a: u64, b: u64| a / 2 + b / 2 + (a % 2 + b % 2) / 2;
        let accounted = mid(self.accounted, o.accounted);
        Books {
            accounted,
            stocked: mid(self.stocked, o.stocked).min(accounted),
            holders: self.holders.max(o.holders),
            headers: mid(self.headers, o.headers),
            malloc: self.malloc.zip(o.malloc).map(|(a, b)| Malloc {
                arena: mid(a.arena, b.arena),
                uordblks: mid(a.uordblks, b.uordblks),
                fordblks: mid(a.fordblks, b.fordblks),
                hblks: mid(a.hblks, b.hblks),
                hblkhd: mid(a.hblkhd, b.hblkhd),
            }),
        }
    }
}

/// glibc's figures (`mallinfo2`).
#[derive(Debug, Clone, Copy)]
struct Malloc {
    /// Σ of every arena's size (`system_mem`).
    arena: u64,
    uordblks: u64,
    fordblks: u64,
    /// Blocks glibc mapped on their own, and their bytes.
    hblks: u64,
    hblkhd: u64,
}

impl Malloc {
    fn read() -> Option<Malloc> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // SAFETY: mallinfo2 has no preconditions; it returns a plain struct.
            let m = unsafe { libc::mallinfo2() };
            Some(Malloc {
                arena: m.arena as u64,
                uordblks: m.uordblks as u64,
                fordblks: m.fordblks as u64,
                hblks: m.hblks as u64,
                hblkhd: m.hblkhd as u64,
            })
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        {
            None
        }
    }

    /// See [`Reconciliation::malloc_chunk_overhead`].
    fn overhead_estimate(&self, headers: u64) -> u64 {
        let blocks = headers / 8;
        let mapped = self.hblks.min(blocks);
        (blocks - mapped) * 16 + mapped * (resident::page_size() / 2 + 16)
    }

    /// `fordblks` less the pages of glibc's arenas that are not resident
    /// (see [`Reconciliation::malloc_free_resident`]): `[heap]` and the
    /// arena heaps' read-write parts, less what glibc shrank those heaps by
    /// (released, still read-write, no longer counted in `arena`); and the
    /// non-resident pages beyond `fordblks`, which must be in use
    /// ([`Reconciliation::untouched`]).
    fn free_resident(&self, m: &resident::Mappings) -> (u64, u64) {
        let mapped = m.heap_len + m.arena_rw;
        let shrunk = mapped.saturating_sub(self.arena);
        let nonresident = (mapped - m.heap_rss - m.arena_rss).saturating_sub(shrunk);
        (
            self.fordblks.saturating_sub(nonresident),
            nonresident.saturating_sub(self.fordblks),
        )
    }
}

/// Resident pages × page size, from `/proc/self/statm`.
fn resident() -> Option<u64> {
    let mut pages = None;
    resident::read_lines(c"/proc/self/statm", |line| {
        pages = line
            .split(|&b| b == b' ')
            .nth(1)
            .and_then(|f| std::str::from_utf8(f).ok()?.parse::<u64>().ok());
    })?;
    Some(pages? * resident::page_size())
}

impl fmt::Display for Reconciliation {
    /// A small table, one figure per line, for logs: the books, then the
    /// resident set part by part.
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
        writeln!(f, "resident           {:>14}", opt(self.resident))?;
        writeln!(f, "resident (smaps)   {:>14}", opt(self.resident_mapped))?;
        for part in ResidentPart::ALL {
            let sign = if part.subtracted() { "−" } else { " " };
            writeln!(f, " {sign}{:<21}{:>11}", part.name(), opt(self.part(part)))?;
        }
        let share = match (self.unexplained, self.resident_mapped) {
            (Some(u), Some(r)) if r > 0 => format!("  ({:+.1}%)", u as f64 * 100.0 / r as f64),
            _ => String::new(),
        };
        let unexplained = self
            .unexplained
            .map_or_else(|| "n/a".to_owned(), |u| u.to_string());
        writeln!(
            f,
            "  unexplained          {unexplained:>11}{share}  (± {} moved while reading)",
            self.reading_drift
        )?;
        writeln!(f, "malloc free        {:>14}", opt(self.malloc_free))?;
        writeln!(f, "malloc mappings    {:>14}", opt(self.malloc_mappings))?;
        write!(
            f,
            "trims              {:>14}  ({:.3} ms in all)",
            self.trims,
            self.trim_nanos as f64 / 1e6
        )
    }
}
