//! [`UsageCounter`]: hierarchical usage with a hard limit (`max`), a soft
//! limit (`high`), a peak watermark and events — the kernel's
//! `page_counter` (mm/page_counter.c).
//!
//! A counter has a parent; a charge at a counter is a charge at every
//! ancestor. Three kinds of update:
//!
//! - [`UsageCounter::charge`] — forced: adds everywhere, ignoring limits.
//! - [`UsageCounter::try_charge`] — level by level from the root down to
//!   the counter; a level whose usage would exceed its `max` refuses, every
//!   level above it is rolled back, the refusing level's `max` event count
//!   is bumped, and the refusing counter is reported.
//! - [`UsageCounter::uncharge`] — subtracts up the chain; a level with less
//!   usage than the request is clamped at zero and records an `underflow`
//!   event (a caller's accounting bug must not wrap the counter around or
//!   panic), and only what was really there is subtracted further up.
//!
//! **A parent is never below its children.** Charges go from the root
//! down, uncharges from the counter up, so at every instant each level
//! holds at least what the levels below it hold: a charge is in a parent
//! before it is in a child, and leaves a child before it leaves the parent.
//! (The kernel charges from the counter up; then an over-uncharge of a
//! child racing its own charge could take units the parent had not yet
//! received, and a parent read 9,930 while a sibling held 10,000.)
//!
//! **Never above `max`.** The kernel adds speculatively and rolls back, so
//! its usage can briefly exceed the limit by a failing request. We add with
//! a compare-and-swap that only succeeds when the new usage fits, so no
//! reader ever sees `usage > max` (outside the [`UsageCounter::set_max`]
//! race below). The price — a retry when two charges hit one level at once
//! — is paid rarely, since the per-CPU stock batches charges.
//!
//! **`set_max` vs `try_charge`: a charge fails only against a limit in
//! force.** The usage word holds the usage in its low 56 bits and a
//! *generation* in its top 8, which every `set_max` bumps:
//!
//! ```text
//!  setter (one at a time)                 charger (add_within_max)
//!  setting += 1            (odd)          s    = setting            (even, or wait)
//!  max     = new                          word = usage word
//!  word    = fetch_add(usage, 1 gen)      m    = max
//!  usage(word) > new → max = old, Busy    usage(word) + n > m → refuse, unless
//!  setting += 1            (even)                  `setting` moved since s: retry
//!                                         CAS(word → word + n)  (fails if bumped)
//! ```
//!
//! A charge commits only if no bump came between its read of the word and
//! its compare-and-swap, so the limit it checked is the one in force when
//! it commits (a word of the new generation comes with the new limit: the
//! setter stores the limit before it bumps). A bump after the commit reads
//! a usage that includes the charge, and a setter whose limit is below it
//! puts the old one back (`Busy`). Nothing is added and taken back (but in
//! the one case below), so no other charge sees a usage that was never
//! real. A refusal is final
//! only if no setter ran while it looked (`setting` even and unchanged):
//! else the limit it saw may be one the setter is about to put back, and
//! the charge tries again. (An earlier design re-read the limit after the
//! add and rolled back: a charge over a limit being set was visible for a
//! moment, and a charge that fit both the old and the new limit could be
//! refused on it.) The generation wraps after 256 setters, and a charger
//! preempted between its read and its CAS can sleep through 256 of them
//! (microseconds of `set_max` calls): its CAS would then match a wrapped
//! generation, against a stale limit. So a charge whose CAS succeeded
//! reads `setting` again: a move of less than `2 · 255` (two per setter,
//! one setter at each end perhaps half counted) rules out 256 bumps, and
//! the charge commits; a larger move — only ever after a preemption
//! through hundreds of setters — takes the units back and reads again,
//! the one case where a charge is added and taken back: for that moment
//! other threads see them (a charge or a `set_max` may be refused on
//! them, the peak may keep them, as with the kernel's speculative adds).
//! Setters are serialized by a per-counter mutex (a cold path), so a
//! refused setter restores exactly the limit it replaced.
//!
//! **Rollbacks never wrap.** A charge rolled back (a refusal above it)
//! subtracts with the same clamp at zero as
//! [`UsageCounter::uncharge`]: a caller's over-uncharge that lands between
//! the add and the rollback leaves the usage at 0 with an `underflow`
//! event, never near 2⁶⁴.

use crate::sync::{
    lock, Arc, AtomicBool, AtomicU64, AtomicU8, Mutex,
    Ordering::{Relaxed, SeqCst},
};
use crossbeam_utils::CachePadded;
use std::fmt;

/// Event counts of one counter, as a snapshot.
///
/// | count | one per | the kernel's |
/// |---|---|---|
/// | `max` | charge that hit this counter's `max`: refused, or let through over it ([`Enforcement::Cooperative`]) | `memory.events` `max` |
/// | `high` | crossing of `high` upwards | `high` |
/// | `oom` | charge **refused** here after reclaim hooks, draining and OOM hooks failed to make room; never a cooperative over-charge | `oom` |
/// | `breaches` | crossing of `max` by cooperative over-charges: the first over-charge of each episode over the limit (an episode ends when an uncharge takes the usage back below `max`) | — |
/// | `refused` | charge refused because of this counter's limit (or ceiling): a null from the allocator, an `Err` from [`crate::group::Group::charge`] | — |
/// | `underflow` | uncharge of more than the counter held (clamped at zero) | — |
///
/// `max ≥ refused`, and `max ≥ breaches`: a group hammered over a
/// cooperative limit counts every over-charge in `max` and one in
/// `breaches`. A server that removes its per-request groups reads a
/// tenant's refusals and breaches in the tenant's
/// [`crate::group::Group::subtree_events`] (the request groups' own counts go
/// with them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct Events {
    /// Charges that hit this counter's `max`: refused, or let through over
    /// it by a cooperative limit (the kernel's meaning). A count of charges,
    /// not of allocations: the allocator charges a thread's small blocks
    /// in batches (up to [`crate::alloc::RESERVE_BATCH`] bytes), so one
    /// event may stand for many blocks let through. A refusal at the
    /// ceiling of what a counter holds ([`MAX_USAGE`]) where no `max` at or
    /// below it is set is not one (a group's charge then fails with
    /// [`crate::group::ChargeErrorKind::Saturated`]).
    pub max: u64,
    /// Times a charge took this counter's usage above its `high` soft limit
    /// (from at or below it): one per crossing, not one per charge above.
    pub high: u64,
    /// Charges refused at this counter after reclaim, draining and the
    /// out-of-memory hooks failed to make room. A cooperative over-charge
    /// is never counted here.
    pub oom: u64,
    /// Uncharges of more than the counter held (clamped at zero).
    pub underflow: u64,
    /// Crossings of `max` by cooperative over-charges: one per episode
    /// over the limit, however many charges it let through.
    #[cfg_attr(feature = "serde", serde(default))]
    pub breaches: u64,
    /// Charges refused because of this counter's `max` (or ceiling): nulls
    /// from the allocator, errors from `Group::charge`.
    #[cfg_attr(feature = "serde", serde(default))]
    pub refused: u64,
}

impl Events {
    fn of(slots: &[AtomicU64; KINDS]) -> Events {
        let at = |k: Kind| slots[k as usize].load(Relaxed);
        Events {
            max: at(Kind::Max),
            high: at(Kind::High),
            oom: at(Kind::Oom),
            underflow: at(Kind::Underflow),
            breaches: at(Kind::Breach),
            refused: at(Kind::Refused),
        }
    }
}

/// Write-hot: changed by every charge that reaches the counter.
struct Hot {
    usage: AtomicU64,
    watermark: AtomicU64,
    /// Stock slots, over every CPU and every stock, whose key's counter is
    /// this one or one below it (see [`UsageCounter::stock_slots`]).
    /// Changed when a slot takes or gives up a key — on the stock's miss
    /// paths, right after the batch charge that wrote `usage` — so it shares
    /// that line.
    stock_slots: AtomicU64,
}

/// Read-mostly: read by every charge, written by configuration.
struct Limits {
    max: AtomicU64,
    high: AtomicU64,
    /// Odd while a `set_max` runs (bumped at its start and its end): a
    /// refusal seen meanwhile may be against a limit about to be put back.
    setting: AtomicU64,
    /// Set once by [`UsageCounter::retire`]: stocks no longer hold units
    /// for this counter.
    retired: AtomicBool,
}

/// Slow-path counts and settings, on their own line so they never disturb
/// the others: read on refusals and crossings of `high`, not per charge.
struct EventCounts {
    /// This counter's own events, by [`Kind`].
    local: [AtomicU64; KINDS],
    /// Events of this counter and every counter below it (the kernel's
    /// `memory.events` vs `memory.events.local`).
    subtree: [AtomicU64; KINDS],
    /// One `set_max` at a time.
    setting: Mutex<()>,
    /// Bit 0: usage is above `high` (since the last crossing upwards, until
    /// it comes back to or below it). Bits 1…: the number of the next
    /// event — one word, so that each crossing takes its number in the same
    /// compare-and-swap that makes it, and the numbers of crossings
    /// alternate up and down.
    high_state: AtomicU64,
    /// Crossings of `high` whose pressure hooks have not run yet (a count:
    /// a crossing made while another still waits is not merged into it).
    pressure_pending: AtomicU64,
    /// Refills may cross `high` (see [`UsageCounter::try_charge_refill`]):
    /// set when the usage comes back to or below `high`, cleared by a
    /// refill that fits under it.
    refills_cross: AtomicBool,
    /// What an allocation over this counter's `max` does ([`Enforcement`]).
    enforcement: AtomicU8,
    /// Past this usage even a cooperative over-charge is refused.
    ceiling: AtomicU64,
    /// Which kinds of limit event ([`EPISODE_OOM`], [`EPISODE_REFUSED`])
    /// were reported since the usage was last below `max`: each is
    /// reported once per episode at the limit, not once per refused charge.
    episode: AtomicU8,
    /// Nanoseconds charges spent stalled at this counter or below it
    /// (reclaim hooks, drains, retries, OOM hooks).
    stall_ns: AtomicU64,
    /// The `max` that refused this counter's latest refused charge
    /// ([`UNLIMITED`] before any): what refusals report and count, not the
    /// limit read again afterwards, which a `set_max` or a reclaim hook
    /// may have raised meanwhile.
    refused_at: AtomicU64,
    /// Told of crossings of `high` (both ways), once the group layer asks.
    listener: std::sync::OnceLock<Listener>,
}

/// What a counter tells its listener (see [`UsageCounter::set_listener`]).
pub(crate) type Listener =
    Box<dyn Fn(CounterEvent) + Send + Sync + std::panic::RefUnwindSafe + std::panic::UnwindSafe>;

/// A crossing of `high` seen by a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CounterEvent {
    /// Upwards (`true`: usage went above `high`) or back to or below it.
    pub(crate) above: bool,
    /// The usage that made the crossing.
    pub(crate) usage: u64,
    /// `high` when it was crossed.
    pub(crate) high: u64,
    /// Its number among the counter's events.
    pub(crate) seq: u64,
}

/// Which event an [`EventCounts`] slot counts.
#[derive(Clone, Copy)]
enum Kind {
    Max = 0,
    High = 1,
    Oom = 2,
    Underflow = 3,
    Breach = 4,
    Refused = 5,
}

/// How many kinds of event a counter counts.
const KINDS: usize = 6;

/// Episode bit: the charge path reached the OOM stage at this counter.
pub(crate) const EPISODE_OOM: u8 = 1;
/// Episode bit: a charge was refused by this counter's `max`.
pub(crate) const EPISODE_REFUSED: u8 = 2;
/// Episode bit: a cooperative over-charge went past this counter's `max`
/// (a breach: counted once per episode, in [`Events::breaches`]).
pub(crate) const EPISODE_BREACHED: u8 = 4;

impl Default for EventCounts {
    fn default() -> Self {
        EventCounts {
            local: Default::default(),
            subtree: Default::default(),
            setting: Mutex::new(()),
            high_state: AtomicU64::new(0),
            pressure_pending: AtomicU64::new(0),
            refills_cross: AtomicBool::new(false),
            enforcement: AtomicU8::new(Enforcement::Cooperative as u8),
            ceiling: AtomicU64::new(UNLIMITED),
            episode: AtomicU8::new(0),
            stall_ns: AtomicU64::new(0),
            refused_at: AtomicU64::new(UNLIMITED),
            listener: std::sync::OnceLock::new(),
        }
    }
}

/// What an allocation charged through the allocator integration does when
/// a group's hard limit (`max`) refuses it, after reclaim and draining. (A
/// [`crate::group::Group::charge`] is refused either way: its caller gets
/// the error.)
///
/// ```
/// use splitcount::{Enforcement, Hierarchy};
///
/// let h = Hierarchy::default();
/// let g = h.root().child("g").unwrap();
/// assert_eq!(g.enforcement(), Enforcement::Cooperative);
/// g.set_enforcement(Enforcement::Refuse);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Enforcement {
    /// The allocator returns null. Rust aborts the process on a null from
    /// an ordinary allocation; only `try_reserve`-style calls observe it.
    /// For hard limits where the code is written for it.
    Refuse,
    /// The allocation succeeds as a forced over-charge: counted (a `max`
    /// event), and the group is marked *breached* until
    /// [`crate::group::Group::clear_breach`]; the next checkpoint
    /// ([`crate::group::Group::check`], an instrumented future's poll)
    /// reports it. The default: an over-limit request fails alone instead
    /// of aborting every other request's process. A ceiling
    /// ([`crate::group::Group::set_ceiling`]) past which even this refuses
    /// keeps a runaway from taking the machine.
    #[default]
    Cooperative,
}

impl Enforcement {
    fn from_u8(v: u8) -> Enforcement {
        if v == Enforcement::Refuse as u8 {
            Enforcement::Refuse
        } else {
            Enforcement::Cooperative
        }
    }
}

/// The limit of a counter without one.
pub const UNLIMITED: u64 = u64::MAX;

/// Largest single request: keeps `usage + request` far from overflow.
pub const MAX_REQUEST: u64 = 1 << 55;

/// The most a counter's usage can be (forced charges saturate here): the
/// usage word keeps the usage in its low 56 bits and `set_max`'s generation
/// in the rest (see the module docs).
pub const MAX_USAGE: u64 = VALUE;

/// The usage bits of the usage word.
const VALUE: u64 = (1 << 56) - 1;
/// One generation of the usage word (its top 8 bits), bumped by `set_max`.
const GENERATION: u64 = 1 << 56;

/// How far `setting` may move during a charge before its CAS is not
/// trusted: each setter adds 2, one may have started before the charge read
/// `setting` and one may end after its check, so a move below `2 · 255`
/// means fewer than 256 bumps of the 8-bit generation came between the
/// charge's read of the word and its CAS — too few to wrap it.
const WRAP_SETTINGS: u64 = 2 * 255;

/// Levels of a chain [`UsageCounter::top_down`] keeps on the stack (and
/// marks a deeper chain by).
const KEPT: usize = 16;

/// A hierarchical usage counter with limits. See the module docs.
///
/// ```
/// use splitcount::raw::UsageCounter;
///
/// let parent = UsageCounter::root();
/// let child = UsageCounter::child_of(&parent);
/// parent.set_max(100).unwrap();
/// child.try_charge(60).unwrap();
/// let refused = child.try_charge(60).unwrap_err();
/// assert!(std::ptr::eq(refused, &*parent), "the parent's limit refused");
/// assert_eq!((child.usage(), parent.usage()), (60, 60), "nothing stays charged");
/// assert_eq!(parent.events().max, 1);
/// ```
pub struct UsageCounter {
    hot: CachePadded<Hot>,
    limits: CachePadded<Limits>,
    parent: Option<Arc<UsageCounter>>,
    events: CachePadded<EventCounts>,
}

/// `set_max` refused: the usage is already above the new limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy {
    /// The usage found.
    pub usage: u64,
    /// The limit asked for.
    pub max: u64,
}

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "usage {} is above the requested limit {}",
            self.usage, self.max
        )
    }
}

impl std::error::Error for Busy {}

impl UsageCounter {
    fn new(parent: Option<Arc<UsageCounter>>) -> Arc<UsageCounter> {
        Arc::new(UsageCounter {
            hot: CachePadded::new(Hot {
                usage: AtomicU64::new(0),
                watermark: AtomicU64::new(0),
                stock_slots: AtomicU64::new(0),
            }),
            limits: CachePadded::new(Limits {
                max: AtomicU64::new(UNLIMITED),
                high: AtomicU64::new(UNLIMITED),
                setting: AtomicU64::new(0),
                retired: AtomicBool::new(false),
            }),
            parent,
            events: CachePadded::new(EventCounts::default()),
        })
    }

    /// A counter without a parent and without limits.
    pub fn root() -> Arc<UsageCounter> {
        UsageCounter::new(None)
    }

    /// A counter under `parent`, without limits of its own.
    pub fn child_of(parent: &Arc<UsageCounter>) -> Arc<UsageCounter> {
        UsageCounter::new(Some(parent.clone()))
    }

    /// The parent, if any.
    pub fn parent(&self) -> Option<&Arc<UsageCounter>> {
        self.parent.as_ref()
    }

    /// This counter and its ancestors, nearest first.
    pub fn chain(&self) -> impl Iterator<Item = &UsageCounter> {
        std::iter::successors(Some(self), |c| c.parent.as_deref())
    }

    /// Whether `ancestor` is this counter or one of its ancestors.
    pub fn is_within(&self, ancestor: &UsageCounter) -> bool {
        self.chain().any(|c| std::ptr::eq(c, ancestor))
    }

    /// Current usage (stocked units included).
    #[inline]
    pub fn usage(&self) -> u64 {
        self.hot.usage.load(Relaxed) & VALUE
    }

    /// Mark the counter as going away (its group was removed): from now on
    /// a [`Stock`](super::Stock) refuses to hold units for it and hands
    /// them back to be uncharged at once. Call it *before* draining the
    /// stocks of the counter: a stash racing the drain then either lands
    /// before the drain reaches its CPU (and is drained) or sees the flag
    /// under the CPU's lock (and is not stocked) — no unit stays behind,
    /// charged, until some other counter happens to evict it.
    pub fn retire(&self) {
        // Relaxed: the caller's drain that follows takes and releases each
        // CPU's stock lock after this store; a stash that takes the lock
        // after that release sees the flag (lock ordering, not this one).
        self.limits.retired.store(true, Relaxed);
    }

    /// Whether [`UsageCounter::retire`] was called.
    pub fn is_retired(&self) -> bool {
        // Relaxed: read under a stock's lock, which orders it after the
        // drain that followed the store (see `retire`).
        self.limits.retired.load(Relaxed)
    }

    /// The hard limit ([`UNLIMITED`] when none).
    pub fn max(&self) -> u64 {
        self.limits.max.load(Relaxed)
    }

    /// The soft limit ([`UNLIMITED`] when none).
    pub fn high(&self) -> u64 {
        self.limits.high.load(Relaxed)
    }

    /// The highest usage seen since creation or the last reset.
    pub fn peak(&self) -> u64 {
        self.hot.watermark.load(Relaxed)
    }

    /// Restart the peak watermark from the current usage.
    pub fn reset_peak(&self) {
        self.hot.watermark.store(self.usage(), Relaxed);
    }

    /// This counter's own event counts (`memory.events.local`).
    pub fn events(&self) -> Events {
        Events::of(&self.events.local)
    }

    /// Event counts of this counter and every counter below it
    /// (`memory.events`).
    pub fn subtree_events(&self) -> Events {
        Events::of(&self.events.subtree)
    }

    /// Count an event here (local) and here and at every ancestor
    /// (subtree). Slow paths only.
    #[cold]
    fn count(&self, kind: Kind) {
        self.events.local[kind as usize].fetch_add(1, Relaxed);
        for c in self.chain() {
            c.events.subtree[kind as usize].fetch_add(1, Relaxed);
        }
    }

    /// What an allocation over this counter's limit does.
    pub fn enforcement(&self) -> Enforcement {
        Enforcement::from_u8(self.events.enforcement.load(Relaxed))
    }

    /// Choose what an allocation over this counter's limit does.
    pub fn set_enforcement(&self, e: Enforcement) {
        self.events.enforcement.store(e as u8, Relaxed);
    }

    /// The usage past which even a cooperative over-charge is refused
    /// ([`UNLIMITED`] when none).
    pub fn ceiling(&self) -> u64 {
        self.events.ceiling.load(Relaxed)
    }

    /// Set the ceiling for cooperative over-charges.
    pub fn set_ceiling(&self, ceiling: u64) {
        self.events.ceiling.store(ceiling, Relaxed);
    }

    /// Time charges spent stalled here or below: in reclaim hooks, drains,
    /// retries and OOM hooks after a refusal (the kernel's PSI "some" time,
    /// summed over charges rather than wall time).
    pub fn stall(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.events.stall_ns.load(Relaxed))
    }

    /// Add a stall of `ns` nanoseconds here and at every ancestor.
    pub(crate) fn add_stall(&self, ns: u64) {
        for c in self.chain() {
            c.events.stall_ns.fetch_add(ns, Relaxed);
        }
    }

    /// Start reporting an episode at the limit: true the first time `kind`
    /// ([`EPISODE_OOM`] or [`EPISODE_REFUSED`]) is asked for since the
    /// usage was last below `max` (an uncharge below it re-arms both).
    pub(crate) fn begin_episode(&self, kind: u8) -> bool {
        // Relaxed: a once-per-episode flag that orders nothing.
        self.events.episode.load(Relaxed) & kind == 0
            && self.events.episode.fetch_or(kind, Relaxed) & kind == 0
    }

    /// The next number in this counter's sequence of events.
    pub(crate) fn next_seq(&self) -> u64 {
        // Relaxed: a number, ordered by this read-modify-write alone.
        self.events.high_state.fetch_add(2, Relaxed) >> 1
    }

    /// Flip the above-`high` bit to `above` if it is not set so; the
    /// crossing's number, or `None` if another thread made it.
    fn flip_high(&self, above: bool) -> Option<u64> {
        let mut s = self.events.high_state.load(Relaxed);
        loop {
            if (s & 1 == 1) == above {
                return None;
            }
            let next = ((s >> 1) + 1) << 1 | above as u64;
            // SeqCst: ordered against the usage's changes (see
            // `settle_high`); the CAS elects one reporter per crossing and
            // numbers it.
            match self
                .events
                .high_state
                .compare_exchange_weak(s, next, SeqCst, Relaxed)
            {
                Ok(_) => return Some(s >> 1),
                Err(seen) => s = seen,
            }
        }
    }

    fn above_high(&self) -> bool {
        // SeqCst: after the usage's change (see `settle_high`); a plain
        // load on x86.
        self.events.high_state.load(SeqCst) & 1 == 1
    }

    /// Install the listener told of crossings of `high` (once; later calls
    /// keep the first).
    pub(crate) fn set_listener(&self, listener: Listener) {
        let _ = self.events.listener.set(listener);
    }

    #[cold]
    fn tell(&self, above: bool, usage: u64, high: u64, seq: u64) {
        if let Some(l) = self.events.listener.get() {
            l(CounterEvent {
                above,
                usage,
                high,
                seq,
            });
        }
    }

    /// How many crossings of `high` are waiting for their pressure hooks;
    /// takes them (each crossing is delivered once). One load when none
    /// waits.
    pub(crate) fn take_pressure(&self) -> u64 {
        match self.events.pressure_pending.load(Relaxed) {
            0 => 0,
            _ => self.events.pressure_pending.swap(0, Relaxed),
        }
    }

    /// Count an out-of-memory event (the charge path gave up here).
    pub fn record_oom(&self) {
        self.count(Kind::Oom);
    }

    /// Count a charge refused because of this counter's limit.
    pub(crate) fn record_refused(&self) {
        self.count(Kind::Refused);
    }

    /// A cooperative over-charge went past this counter's `max`: counted
    /// as a `max` event, and — the first of its episode over the limit — as
    /// a breach. Returns whether this one began the episode.
    pub(crate) fn record_over_charge(&self) -> bool {
        self.count(Kind::Max);
        let first = self.begin_episode(EPISODE_BREACHED);
        if first {
            self.count(Kind::Breach);
        }
        first
    }

    /// Whether this counter is in an episode over its limit that a
    /// cooperative over-charge already began (the breach was recorded,
    /// with its hooks and drains): further over-charges of the episode take
    /// the cheap path. Ends when an uncharge takes the usage below `max`.
    #[inline]
    pub(crate) fn in_breach_episode(&self) -> bool {
        self.events.episode.load(Relaxed) & EPISODE_BREACHED != 0
    }

    /// Whether a charge was refused at this counter's limit since its
    /// usage was last below `max` (the refusal ran the reclaim and refusal
    /// hooks then).
    #[inline]
    pub(crate) fn in_refused_episode(&self) -> bool {
        self.events.episode.load(Relaxed) & EPISODE_REFUSED != 0
    }

    /// How many stock slots, over every CPU of every stock, hold a key
    /// whose counter is this one or one below it. Zero means no stock holds
    /// units of this subtree; at most `stock_slots · batch` units of it
    /// are stocked. A drain for a refusal reads it to skip what cannot
    /// make room. Exact whenever no slot changes key concurrently.
    pub fn stock_slots(&self) -> u64 {
        self.hot.stock_slots.load(Relaxed)
    }

    /// A stock slot took a key of this counter (`taken`) or gave one up:
    /// count it here and at every ancestor. Called under the slot's block
    /// lock, after storing the key and before giving the lock up (taken),
    /// or after clearing it (given up).
    pub(crate) fn note_stock_slot(&self, taken: bool) {
        for c in self.chain() {
            // Relaxed: a count read as a hint by drains (see
            // `stock_slots`); the slot's key word is published by the block
            // lock.
            if taken {
                c.hot.stock_slots.fetch_add(1, Relaxed);
            } else {
                c.hot.stock_slots.fetch_sub(1, Relaxed);
            }
        }
    }

    /// [`UsageCounter::note_stock_slot`] at the `levels` nearest levels
    /// only: a slot handed from this counter to its ancestor `levels`
    /// levels up (or back) still counts at that ancestor and above.
    pub(crate) fn note_stock_slot_levels(&self, levels: usize, taken: bool) {
        for c in self.chain().take(levels) {
            // Relaxed: as in `note_stock_slot`.
            if taken {
                c.hot.stock_slots.fetch_add(1, Relaxed);
            } else {
                c.hot.stock_slots.fetch_sub(1, Relaxed);
            }
        }
    }

    /// Set the soft limit. Crossing it records `high` events; it never
    /// refuses a charge.
    pub fn set_high(&self, high: u64) {
        self.limits.high.store(high, Relaxed);
    }

    /// Set the hard limit, unless the usage is already above it.
    ///
    /// Concurrent setters are serialized: a refused call leaves in force the
    /// limit it found, never a value another setter was trying.
    pub fn set_max(&self, max: u64) -> Result<(), Busy> {
        let _one_setter = lock(&self.events.setting);
        // SeqCst throughout (see the module docs): `setting` odd before the
        // limit changes, the limit stored before the bump of the usage
        // word's generation (a charger that reads the new generation then
        // reads the new limit), and `setting` even after the last change.
        self.limits.setting.fetch_add(1, SeqCst);
        let old = self.limits.max.swap(max, SeqCst);
        // Wraps within the generation bits; the usage bits are untouched.
        let usage = self.hot.usage.fetch_add(GENERATION, SeqCst) & VALUE;
        let result = if usage > max {
            // No other setter runs: `old` is what this call replaced.
            self.limits.max.store(old, SeqCst);
            Err(Busy { usage, max })
        } else {
            Ok(())
        };
        self.limits.setting.fetch_add(1, SeqCst);
        result
    }

    /// A charge left this counter at `new`: raise the peak, and if `new`
    /// crossed `high` (from at or below it), count a `high` event, mark
    /// the crossing for the pressure hooks and tell the listener. Returns
    /// whether it crossed.
    #[inline]
    fn note_usage(&self, new: u64) -> bool {
        if new > self.hot.watermark.load(Relaxed) {
            self.hot.watermark.fetch_max(new, Relaxed);
        }
        let high = self.limits.high.load(Relaxed);
        if new > high {
            if !self.above_high() {
                return self.cross_high(new, high);
            }
            // A crossing an uncharge's `settle_high` reported (it runs no
            // hooks): this charge, above `high`, has its pressure hooks
            // run (once: `take_pressure` takes the count).
            return self.events.pressure_pending.load(Relaxed) != 0;
        }
        false
    }

    #[cold]
    fn cross_high(&self, new: u64, high: u64) -> bool {
        let crossed = self.report_high(true, new, high);
        if crossed {
            self.settle_high();
        }
        crossed
    }

    /// Flip the `high` state to `above` and report it: a crossing counts a
    /// `high` event and marks the pressure hooks; either way the listener
    /// hears. Two threads flipping at once agree through the CAS on who
    /// reports. Whether this call flipped it.
    fn report_high(&self, above: bool, usage: u64, high: u64) -> bool {
        let Some(seq) = self.flip_high(above) else {
            return false;
        };
        if above {
            self.count(Kind::High);
            self.events.pressure_pending.fetch_add(1, Relaxed);
        } else {
            // Back at or below `high`: refills cross again until one fits
            // a batch under it (`try_charge_refill`'s hysteresis).
            self.events.refills_cross.store(true, Relaxed);
        }
        self.tell(above, usage, high, seq);
        true
    }

    /// After a flip of the `high` state: make it agree with the usage now.
    /// A charge that crossed `high` while an uncharge was between its
    /// subtraction and its flip back found the state still above, and
    /// reported nothing; the uncharge's flip then said "below" with the
    /// usage above — no crossing counted, no pressure hook run (and the
    /// same the other way round). The flipper reads the usage again after
    /// its flip and reports what the other one could not. Ordering: each
    /// side's change of the usage and of the state is a `SeqCst`
    /// read-modify-write and its read of the other a `SeqCst` load, so in
    /// the single order of those operations, of a charge that read the
    /// state before the flip and the flipper's read after it, the flipper's
    /// comes last and sees the charge (a Dekker pattern; the model checker
    /// does not cover `SeqCst` loads, a stress test does: see
    /// `tests/high_races.rs`).
    fn settle_high(&self) {
        // Each further turn follows a flip that raced with another
        // thread's change of the usage (lock-free: a turn only repeats
        // because another thread crossed); a thread whose flip loses the
        // CAS leaves the settling to the winner, which reads again.
        loop {
            let now = self.hot.usage.load(SeqCst) & VALUE;
            let high = self.limits.high.load(Relaxed);
            let above = self.above_high();
            let flipped = if now > high && !above {
                self.report_high(true, now, high)
            } else if now <= high && above {
                self.report_high(false, now, high)
            } else {
                return;
            };
            if !flipped {
                return;
            }
        }
    }

    /// An uncharge left this counter at `new`: back at or below `high`, the
    /// next crossing counts again (and the listener hears of the way back);
    /// below `max`, the next episode at the limit is reported again. (A
    /// charge and an uncharge racing around `high` may count one crossing
    /// twice. Once the racing threads are done the state agrees with the
    /// usage — see `settle_high` — but a crossing that was over before the
    /// thread settling the state looked, among three or more threads, may
    /// go uncounted.)
    #[inline]
    fn note_lower(&self, new: u64) {
        if self.above_high() {
            self.lower_high(new);
        }
        if self.events.episode.load(Relaxed) != 0 && new < self.limits.max.load(Relaxed) {
            self.events.episode.store(0, Relaxed);
        }
    }

    #[cold]
    fn lower_high(&self, new: u64) {
        let high = self.limits.high.load(Relaxed);
        if new <= high && self.report_high(false, new, high) {
            self.settle_high();
        }
    }

    /// Charge `n` here and at every ancestor, ignoring limits. Returns
    /// whether some level crossed its `high` soft limit.
    ///
    /// The usage saturates at `u64::MAX` instead of wrapping around (a
    /// forced charge that large is a caller's bug; wrapping would make the
    /// group look empty).
    pub fn charge(&self, n: u64) -> bool {
        let mut over_high = false;
        self.top_down(|_, c| {
            let added = |word: u64| (word & !VALUE) | (word & VALUE).saturating_add(n).min(VALUE);
            // SeqCst: before the read of the `high` state (see
            // `settle_high`).
            let old = c
                .hot
                .usage
                .fetch_update(SeqCst, Relaxed, |w| Some(added(w)))
                .unwrap_or_else(|w| w);
            over_high |= c.note_usage(added(old) & VALUE);
            true
        });
        over_high
    }

    /// Run `f` on every level of the chain (with its distance from this
    /// counter), the root first and this counter last (see the module docs:
    /// a parent is never below its children), until it returns `false`;
    /// that level, if any. Allocates nothing (it runs inside the
    /// allocator): up to 16 levels are kept on the stack. A deeper chain
    /// keeps 16 marks, one every `stride` levels, and walks each stretch
    /// between two marks into a second array of 16 — linear up to 256
    /// levels (finding each level again from this counter made a charge
    /// quadratic in the depth: 3.4 µs at 64 levels, 121 µs at 256); past
    /// 256 each stretch is walked again per level, `depth² / 16` steps.
    #[inline]
    fn top_down<'a>(
        &'a self,
        mut f: impl FnMut(usize, &'a UsageCounter) -> bool,
    ) -> Option<&'a UsageCounter> {
        let mut kept: [&UsageCounter; KEPT] = [self; KEPT];
        let mut depth = 0;
        for c in self.chain() {
            if let Some(slot) = kept.get_mut(depth) {
                *slot = c;
            }
            depth += 1;
        }
        if depth <= KEPT {
            for d in (0..depth).rev() {
                if !f(d, kept[d]) {
                    return Some(kept[d]);
                }
            }
            return None;
        }
        self.top_down_deep(depth, f)
    }

    /// [`UsageCounter::top_down`] of a chain deeper than its array.
    #[cold]
    fn top_down_deep<'a>(
        &'a self,
        depth: usize,
        mut f: impl FnMut(usize, &'a UsageCounter) -> bool,
    ) -> Option<&'a UsageCounter> {
        let stride = depth.div_ceil(KEPT);
        // marks[b]: the level at distance b · stride (b < KEPT).
        let mut marks: [&UsageCounter; KEPT] = [self; KEPT];
        for (d, c) in self.chain().enumerate() {
            if d % stride == 0 {
                marks[d / stride] = c;
            }
        }
        let mut stretch: [&UsageCounter; KEPT] = [self; KEPT];
        for b in (0..depth.div_ceil(stride)).rev() {
            let (start, end) = (b * stride, ((b + 1) * stride).min(depth));
            let kept = end - start <= KEPT;
            if kept {
                for (j, c) in marks[b].chain().take(end - start).enumerate() {
                    stretch[j] = c;
                }
            }
            for d in (start..end).rev() {
                let c = if kept {
                    stretch[d - start]
                } else {
                    marks[b].chain().nth(d - start).expect("within the chain")
                };
                if !f(d, c) {
                    return Some(c);
                }
            }
        }
        None
    }

    /// Charge `n` level by level, refusing at the first level whose new
    /// usage would exceed its `max`. On refusal, the levels below are rolled
    /// back, the refusing level's `max` event is counted, and it is returned
    /// (no level's peak moves: a refused charge was never held). On
    /// success, returns whether some level crossed its `high`.
    pub fn try_charge(&self, n: u64) -> Result<bool, &UsageCounter> {
        self.try_charge_quiet(n)
            .inspect_err(|refuser| refuser.record_max())
    }

    /// Count an uncharge of more than this counter held (clamped elsewhere).
    pub(crate) fn record_underflow(&self) {
        self.count(Kind::Underflow);
    }

    /// Count a refusal at this counter (a `max` event) — unless the limit
    /// that refused it was none: then the refusal was at the ceiling of
    /// what a counter holds ([`MAX_USAGE`]), which the error reports as
    /// such; no limit was hit. Decided by the limit in force at the
    /// refusal ([`UsageCounter::refused_limit`]), not by the one in force
    /// now.
    pub(crate) fn record_max(&self) {
        if self.refused_limit() <= VALUE {
            self.count(Kind::Max);
        }
    }

    /// The `max` in force when this counter last refused a charge (above
    /// [`MAX_USAGE`]: the refusal was at the ceiling, no limit set;
    /// `u64::MAX` if it never refused one). A refusal's error and events
    /// report this one: the limit may have been raised since — by a
    /// `set_max` of another thread, or by a reclaim hook during the
    /// refusal itself. It is the counter's *latest* refusal: two refusals
    /// at once by different limits (a `set_max` between them) may both
    /// report the later limit.
    pub fn refused_limit(&self) -> u64 {
        self.events.refused_at.load(Relaxed)
    }

    /// Note a refusal decided against the `max` in force now rather than
    /// by a compare-and-swap that refused (the allocator's shortcuts: a
    /// limit still in the way of a thread in its reporting grace, an
    /// over-charge of a breach already begun): what
    /// [`UsageCounter::refused_limit`] reports from then on.
    pub(crate) fn note_refused_now(&self) {
        self.events.refused_at.store(self.max(), Relaxed);
    }

    /// [`UsageCounter::try_charge`] without counting the refusal: for the
    /// charge path, which retries and counts a refusal once, when it gives up.
    pub(crate) fn try_charge_quiet(&self, n: u64) -> Result<bool, &UsageCounter> {
        self.try_charge_by(n, |c| c.add_within(n, |max| max))
    }

    /// [`UsageCounter::try_charge_quiet`] of a *refill*: `n` units of
    /// which only part is wanted now, the rest to be stocked. Besides its
    /// `max`, a level at or below its `high` takes the refill only if its
    /// new usage stays at or below `high` too: the stocked surplus is
    /// charged, and would otherwise cross `high` — counting a `high` event
    /// and running the pressure hooks, over by units nothing uses — for a
    /// group whose use is a batch or more below it (two CPUs' refills of
    /// 64 KiB crossed a `high` of 100 KiB with 8 KiB in use). Refused, the
    /// caller charges what it wants now, exactly, as a refill refused by
    /// `max`; a level already above `high` takes refills up to its `max`,
    /// so a group that lives above `high` keeps its stock.
    ///
    /// With hysteresis: once a level has been above `high` and come back,
    /// its refills may cross again (as every refill did before the bound)
    /// until one fits under `high` — the usage a refill below it. A group
    /// that sits at `high` with frees on other CPUs (their stashed units
    /// count in the usage) crossed back and forth over twice as often with
    /// the bound alone: each stock miss charged exactly and met the stashed
    /// units (30,303 `high` events per 2 million charges, against about
    /// 13,000 without the bound: the review's producer/consumer program).
    /// The bound keeps what it is for: a group's first refills, far from
    /// any crossing, do not take it over `high`. Read without ordering:
    /// `high`, its state and the flag are hints here (a stale one only lets
    /// one refill cross, or charges one exactly).
    pub(crate) fn try_charge_refill(&self, n: u64) -> Result<bool, &UsageCounter> {
        self.try_charge_by(n, |c| {
            let high = c.limits.high.load(Relaxed);
            let cross = c.events.refills_cross.load(Relaxed);
            let bounded = !cross && c.events.high_state.load(Relaxed) & 1 == 0;
            let new = c.add_within(n, |max| if bounded { max.min(high) } else { max });
            if cross && new.is_some_and(|v| v <= high) {
                c.events.refills_cross.store(false, Relaxed);
            }
            new
        })
    }

    /// [`UsageCounter::try_charge_quiet`] against raised limits: each level
    /// takes the charge only if its new usage stays within `grace` above
    /// its `max` and within its ceiling — the allocator's reporting grace,
    /// whose bound then holds however many threads charge at once (a check
    /// of the usage before a forced charge let each racing thread pass it
    /// by one allocation).
    pub(crate) fn try_charge_within_grace(
        &self,
        n: u64,
        grace: u64,
    ) -> Result<bool, &UsageCounter> {
        self.try_charge_by(n, |c| {
            let ceiling = c.ceiling();
            c.add_within(n, |max| max.saturating_add(grace).min(ceiling))
        })
    }

    /// Charge `n` level by level, the root first, with `add` (a level's new
    /// usage, or `None`: refused); on a refusal the levels above are rolled
    /// back and the refusing level returned, else whether some level
    /// crossed its `high`.
    #[inline]
    fn try_charge_by(
        &self,
        n: u64,
        add: impl Fn(&UsageCounter) -> Option<u64>,
    ) -> Result<bool, &UsageCounter> {
        // The new usage of the first levels (by distance from this counter),
        // noted (peak, high) only once every level took the charge; deeper
        // levels read their usage then.
        let mut news = [0u64; 16];
        let refuser = self.top_down(|depth, c| match add(c) {
            Some(new) => {
                if let Some(slot) = news.get_mut(depth) {
                    *slot = new;
                }
                true
            }
            None => false,
        });
        if let Some(refuser) = refuser {
            // The levels above the refuser took the charge: roll them back.
            for above in refuser.chain().skip(1) {
                above.sub_clamped(n, true);
            }
            return Err(refuser);
        }
        let mut crossed = false;
        for (depth, c) in self.chain().enumerate() {
            let new = news.get(depth).copied().unwrap_or_else(|| c.usage());
            crossed |= c.note_usage(new);
        }
        Ok(crossed)
    }

    /// Add `n` if the result stays within the `max` in force; the new
    /// usage, or `None` (see the module docs, `set_max` vs `try_charge`).
    #[inline]
    fn add_within_max(&self, n: u64) -> Option<u64> {
        self.add_within(n, |max| max)
    }

    /// Add `n` if the result stays within `limit(max)` for the `max` in
    /// force; the new usage, or `None`. A refusal is noted against `max`
    /// itself ([`UsageCounter::refused_limit`]).
    #[inline]
    fn add_within(&self, n: u64, limit: impl Fn(u64) -> u64) -> Option<u64> {
        'read: loop {
            // SeqCst: `setting` before the word and the limit (a refusal is
            // final only if it is even and unchanged after); the word
            // before the limit (a new generation comes with its limit).
            let setting = self.limits.setting.load(SeqCst);
            let mut word = self.hot.usage.load(SeqCst);
            let max = self.limits.max.load(SeqCst);
            let within = limit(max);
            let fits = |word: u64| {
                (word & VALUE)
                    .checked_add(n)
                    .filter(|&v| v <= within && v <= VALUE)
            };
            while let Some(new) = fits(word) {
                // SeqCst: fails if a setter bumped the generation since
                // `word` was read — then the limit is read again.
                match self
                    .hot
                    .usage
                    .compare_exchange_weak(word, word + n, SeqCst, SeqCst)
                {
                    Ok(_) => {
                        // SeqCst: after the CAS. Fewer than 255 setters
                        // started since `setting` was read: no wrap of
                        // the generation can have fooled the CAS.
                        let after = self.limits.setting.load(SeqCst);
                        if after.wrapping_sub(setting) < WRAP_SETTINGS {
                            return Some(new);
                        }
                        // Perhaps 256 bumps: the limit read may be stale.
                        // Taken back, and read again. Noted on the way
                        // down: a racing charge may have seen these units
                        // and flipped the `high` state up.
                        self.sub_clamped(n, true);
                        continue 'read;
                    }
                    Err(seen) if (seen ^ word) & !VALUE == 0 => word = seen,
                    Err(_) => continue 'read,
                }
            }
            // Refused by `max` as read: final unless a setter ran meanwhile.
            if setting % 2 == 0 && self.limits.setting.load(SeqCst) == setting {
                // Relaxed: a report of the refusal, read by the refusing
                // thread (program order) and, as a hint, by others. Only a
                // refusal `max` itself makes: a refill's bound of `high`
                // below it refuses without one (`refused_limit` read
                // `max` for a group no `max` had refused).
                let by_max = !matches!((word & VALUE).checked_add(n), Some(v) if v <= max);
                if by_max {
                    self.events.refused_at.store(max, Relaxed);
                }
                return None;
            }
            while self.limits.setting.load(SeqCst) % 2 == 1 {
                crate::sync::thread::yield_now();
            }
        }
    }

    /// Subtract `n` here and up the chain, clamping at zero. Returns what was
    /// subtracted here (less than `n` after an underflow, which is counted as
    /// an event); ancestors lose exactly that much.
    pub fn uncharge(&self, n: u64) -> u64 {
        self.sub_up_the_chain(n, true)
    }

    /// The first half of [`UsageCounter::uncharge`], for a caller that
    /// must have the units off the counters before it lets go of a lock
    /// but may not run the listener under it (a stock's drain): subtracts
    /// here and up the chain (an underflow is counted) and leaves the rest
    /// — a level back under `high` telling its listener, a level under
    /// `max` ending its episode — to [`UsageCounter::settle`], which the
    /// caller runs once the lock is released.
    pub(crate) fn uncharge_untold(&self, n: u64) -> u64 {
        self.sub_up_the_chain(n, false)
    }

    /// Subtract `n` here (clamped) and what that was at every ancestor.
    fn sub_up_the_chain(&self, n: u64, note: bool) -> u64 {
        let removed = self.sub_clamped(n, note);
        for p in self.chain().skip(1) {
            p.sub_clamped(removed, note);
        }
        removed
    }

    /// The second half of [`UsageCounter::uncharge_untold`]: what an
    /// uncharge does at each level once its usage is lower, with the usage
    /// read now.
    pub(crate) fn settle(&self) {
        for c in self.chain() {
            c.note_lower(c.usage());
        }
    }

    /// Charge `n` at this counter only (its ancestors hold the units
    /// already: a child charging through its parent's stock slot, see
    /// `Stock::charge_through_parent`), refused if it would pass this
    /// counter's `max` — the same limit-checked `add_within_max` as every
    /// level of [`UsageCounter::try_charge_quiet`]. On success, whether it
    /// crossed its `high`.
    pub(crate) fn try_charge_own(&self, n: u64) -> Result<bool, &UsageCounter> {
        let new = self.add_within_max(n).ok_or(self)?;
        Ok(self.note_usage(new))
    }

    /// Subtract `n` here (clamped: an underflow is counted) and, level by
    /// level up the `levels` nearest levels, what the level below gave
    /// (each clamped in turn); untold when `!note` (see
    /// [`UsageCounter::uncharge_untold`]). What the topmost of them gave:
    /// no more than any level below it. (A level in between that was
    /// over-uncharged gives less than the one below; the levels above it
    /// must then lose only that — they lost the rest with it already.)
    pub(crate) fn sub_levels(&self, levels: usize, n: u64, note: bool) -> u64 {
        if levels == 0 {
            return 0;
        }
        let mut removed = self.sub_clamped(n, note);
        for p in self.chain().skip(1).take(levels - 1) {
            removed = p.sub_clamped(removed, note);
        }
        removed
    }

    /// Subtract up to `n` (what the usage holds); `note`: whether to run
    /// [`UsageCounter::note_lower`] at once.
    fn sub_clamped(&self, n: u64, note: bool) -> u64 {
        let mut word = self.hot.usage.load(Relaxed);
        loop {
            let cur = word & VALUE;
            let take = n.min(cur);
            // The generation bits are kept: `take ≤ cur` borrows nothing.
            // SeqCst: before the read of the `high` state (see
            // `settle_high`).
            match self
                .hot
                .usage
                .compare_exchange_weak(word, word - take, SeqCst, Relaxed)
            {
                Ok(_) => {
                    if take < n {
                        self.count(Kind::Underflow);
                    }
                    if note {
                        self.note_lower(cur - take);
                    }
                    return take;
                }
                Err(seen) => word = seen,
            }
        }
    }
}

impl Drop for UsageCounter {
    /// Drop the chain of parents this counter held the last reference to
    /// one by one, not recursively (deep chains must not overflow the
    /// stack).
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(parent) = next {
            match Arc::try_unwrap(parent) {
                Ok(mut counter) => next = counter.parent.take(),
                Err(_) => break,
            }
        }
    }
}

impl fmt::Debug for UsageCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UsageCounter")
            .field("usage", &self.usage())
            .field("max", &self.max())
            .field("high", &self.high())
            .field("peak", &self.peak())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn chain3() -> (Arc<UsageCounter>, Arc<UsageCounter>, Arc<UsageCounter>) {
        let a = UsageCounter::root();
        let b = UsageCounter::child_of(&a);
        let c = UsageCounter::child_of(&b);
        (a, b, c)
    }

    #[test]
    fn forced_charges_ignore_limits_and_reach_every_ancestor() {
        let (a, b, c) = chain3();
        b.set_max(10).unwrap();
        c.charge(25);
        assert_eq!((a.usage(), b.usage(), c.usage()), (25, 25, 25));
        assert_eq!(b.events().max, 0);
    }

    #[test]
    fn a_refusal_rolls_back_the_levels_below_and_names_the_refuser() {
        let (a, b, c) = chain3();
        a.set_max(100).unwrap();
        c.try_charge(90).unwrap();
        let refuser = c.try_charge(20).unwrap_err();
        assert!(std::ptr::eq(refuser, &*a));
        assert_eq!((a.usage(), b.usage(), c.usage()), (90, 90, 90));
        assert_eq!(a.events().max, 1);
        assert_eq!(b.events().max, 0);
        c.try_charge(10).unwrap();
        assert_eq!(a.usage(), 100, "exactly at the limit is allowed");
    }

    #[test]
    fn a_crossing_reported_by_an_uncharge_has_its_hooks_run_by_the_next_charge_above_high() {
        let c = UsageCounter::root();
        c.set_high(10);
        assert!(c.charge(20), "a crossing: the charger runs the hooks");
        assert_eq!(c.take_pressure(), 1);
        assert!(!c.charge(1), "above high, nothing pending");
        // What an uncharge's `settle_high` leaves when it reports a
        // crossing: the state above and the mark set, no hook run.
        c.events.pressure_pending.store(1, Relaxed);
        assert!(c.charge(1), "the next charge above high runs them");
        assert_eq!(c.take_pressure(), 1);
        assert!(!c.charge(1), "once");
    }

    /// Two crossings made before the hooks of the first ran (another
    /// thread's, say) are two deliveries, not one: the count was a flag
    /// that merged them.
    #[test]
    fn crossings_waiting_for_their_hooks_are_not_merged() {
        let c = UsageCounter::root();
        c.set_high(10);
        assert!(c.charge(20));
        c.uncharge(15);
        assert!(c.charge(10), "back above high: a second crossing");
        assert_eq!(c.events().high, 2);
        assert_eq!(c.take_pressure(), 2);
        assert_eq!(c.take_pressure(), 0);
    }

    #[test]
    fn chains_of_any_depth_are_charged_root_first_at_every_level_once() {
        for depth in [1, 15, 16, 17, 40, 256, 257, 300] {
            let root = UsageCounter::root();
            let mut chain = vec![root.clone()];
            for _ in 1..depth {
                let c = UsageCounter::child_of(chain.last().unwrap());
                chain.push(c);
            }
            let leaf = chain.last().unwrap();
            // Root first: the order `f` sees, by distance from the leaf.
            let mut seen = Vec::new();
            leaf.top_down(|d, c| {
                assert!(
                    std::ptr::eq(c, &*chain[depth - 1 - d]),
                    "depth {depth}: level {d}"
                );
                seen.push(d);
                true
            });
            assert_eq!(seen, (0..depth).rev().collect::<Vec<_>>(), "depth {depth}");
            // A refusal halfway up rolls back the levels above it.
            chain[depth / 2].set_max(5).unwrap();
            leaf.try_charge(3).unwrap();
            assert!(leaf.try_charge(3).is_err());
            assert!(chain.iter().all(|c| c.usage() == 3), "depth {depth}");
        }
    }

    #[test]
    fn uncharging_more_than_charged_clamps_and_counts_an_underflow() {
        let (a, b, c) = chain3();
        b.charge(50); // b's own usage, not c's
        c.charge(5);
        assert_eq!(c.uncharge(8), 5, "only what c held is removed");
        assert_eq!(c.usage(), 0);
        assert_eq!(c.events().underflow, 1);
        assert_eq!((b.usage(), a.usage()), (50, 50), "b keeps its own 50");
        assert_eq!(b.events().underflow, 0);
    }

    #[test]
    fn set_max_below_usage_is_busy_and_keeps_the_old_limit() {
        let (_a, b, c) = chain3();
        b.set_max(100).unwrap();
        c.charge(60);
        assert_eq!(b.set_max(50), Err(Busy { usage: 60, max: 50 }));
        assert_eq!(b.max(), 100);
        b.set_max(60).unwrap();
        assert_eq!(b.max(), 60);
    }

    #[test]
    fn a_refill_stays_within_high_until_above_it_and_is_no_max_refusal() {
        let (_a, b, c) = chain3();
        b.set_max(1000).unwrap();
        b.set_high(10);
        assert_eq!(c.try_charge_refill(64).map_err(|r| r.max()), Err(1000));
        assert_eq!(b.refused_limit(), u64::MAX, "max refused nothing");
        assert_eq!(
            (b.usage(), c.usage()),
            (0, 0),
            "the level below rolled back"
        );
        c.try_charge_refill(10).unwrap();
        assert!(c.try_charge(1).unwrap(), "above high");
        assert!(c.try_charge_refill(64).is_ok(), "above high: within max");
        assert_eq!(b.usage(), 75);
        // And max refuses as it does for any charge.
        assert!(c.try_charge_refill(1000).is_err());
        assert_eq!(b.refused_limit(), 1000);
    }

    #[test]
    fn after_a_crossing_refills_cross_again_until_one_fits_under_high() {
        let (_a, b, c) = chain3();
        b.set_high(100);
        c.try_charge_refill(64).unwrap();
        assert!(
            c.try_charge_refill(64).is_err(),
            "first refills stay under high"
        );
        assert!(c.try_charge(40).unwrap(), "a crossing by what is charged");
        c.uncharge(40);
        assert_eq!(b.usage(), 64);
        // Back below: a refill may cross (as before the bound), and the
        // level goes above again.
        c.try_charge_refill(64).unwrap();
        assert_eq!((b.usage(), b.events().high), (128, 2));
        c.uncharge(128);
        // A refill that fits under high ends it: the bound again.
        c.try_charge_refill(64).unwrap();
        assert!(c.try_charge_refill(64).is_err(), "bounded again");
        assert_eq!(b.usage(), 64);
    }

    #[test]
    fn high_records_events_but_never_refuses() {
        let (_a, b, c) = chain3();
        b.set_high(10);
        assert!(!c.try_charge(10).unwrap());
        assert!(c.try_charge(1).unwrap(), "above high");
        assert_eq!(b.events().high, 1);
        assert_eq!(b.usage(), 11);
    }

    #[test]
    fn the_peak_follows_the_highest_usage_and_resets() {
        let c = UsageCounter::root();
        c.charge(30);
        c.uncharge(20);
        assert_eq!(c.peak(), 30);
        c.reset_peak();
        assert_eq!(c.peak(), 10);
    }

    #[test]
    fn forced_charges_saturate_instead_of_wrapping() {
        let c = UsageCounter::root();
        c.charge(u64::MAX - 1);
        c.charge(10);
        assert_eq!(c.usage(), MAX_USAGE);
        c.set_max(UNLIMITED).unwrap();
        assert_eq!(
            c.usage(),
            MAX_USAGE,
            "the generation stays out of the usage"
        );
    }

    #[test]
    fn requests_that_would_overflow_are_refused_not_wrapped() {
        let c = UsageCounter::root();
        c.charge(MAX_USAGE - 5);
        assert!(c.try_charge(10).is_err());
        assert!(c.try_charge(u64::MAX).is_err());
        assert_eq!(c.usage(), MAX_USAGE - 5);
    }

    #[test]
    fn the_generation_wraps_without_touching_the_usage() {
        let c = UsageCounter::root();
        c.charge(42);
        for i in 0..600u64 {
            c.set_max(100 + i % 2).unwrap();
        }
        assert_eq!(c.usage(), 42);
        assert!(c.try_charge(59).is_ok());
        assert!(c.try_charge(1).is_err(), "at the limit of 101");
        assert_eq!(c.uncharge(200), 101, "clamped at what it held");
        assert_eq!(c.usage(), 0);
    }
}
