//! [`Stock`]: the per-CPU pre-charged stock (the kernel's `memcg_stock_pcp`,
//! with several groups per CPU as since Linux 6.16).
//!
//! Each CPU keeps up to [`MAX_STOCK_SLOTS`] slots `(key, units, quota)`:
//! units already charged to the key's usage counter (and its ancestors) but
//! not yet used. A charge that finds enough units in its CPU's slot for its
//! key takes them and touches no shared cache line; a miss charges a batch
//! (or the key's share of the CPU's budget) to the usage counter and
//! stashes the surplus here.
//!
//! The key ([`StockKey`]) is what units are charged through: a group's
//! usage counter for [`crate::group::Group::charge`], the allocator's
//! account of a group for the byte stock (whose units keep that account
//! alive: see `alloc/account.rs`).
//!
//! ```text
//!  CPU n, one 1 KiB block:
//!  ┌──────┬────────┬────────┬──────┬─────────┬───────────────────────────────┬─────┬─────────┐
//!  │ lock │ victim │ misses │ used │ granted │ slot 0: key, units, quota     │  …  │ slot 62 │
//!  │ 4 B  │ 1 B    │ 1 B    │ 2 B  │ 8 B     │ 8 B + 4 B + 4 B               │     │         │
//!  └──────┴────────┴────────┴──────┴─────────┴───────────────────────────────┴─────┴─────────┘
//! ```
//!
//! **The budget.** A CPU stocks at most `budget` units in all (default
//! [`DEFAULT_BUDGET_BATCHES`] batches), however many keys it serves: each
//! slot holds at most its quota, and the quotas, granted under the lock,
//! add up to at most the budget. With few keys each is granted a batch;
//! with many, a fair share (`budget / keys`), and its misses charge that
//! share — so 32 tenants on a CPU keep hitting the stock (a miss per share
//! of charges) instead of evicting each other, and the hidden charge stays
//! `budget · CPUs` whatever the number of groups. With more than [`WINDOW`]
//! slots a key lives in a window of them that a hash of its word picks, so
//! a hit scans at most [`WINDOW`] keys.
//!
//! **Admission.** A key that misses and finds every slot of its window
//! taken evicts one (round-robin) only once per [`ADMIT_EVERY`] such
//! misses on that CPU; the other misses charge — or return — exactly their
//! units on the usage counter, stocking nothing. Round-robin eviction alone
//! turns a cyclic pattern one key longer than the slots (8 tenants served
//! in turn over 7 slots, 2 over 1) into a miss on every charge, each an
//! eviction's uncharge and a batch's refill on every level of two
//! hierarchies; with the filter the keys in the slots keep hitting, the
//! one left out pays one direct charge per op, and the slot it takes now
//! and then is handed on the same way. Each CPU remembers the keys its
//! last [`RECENT_VICTIMS`] evictions took out: an eviction that admits one
//! of them only hands the miss on, so the CPU doubles its period, up to
//! [`ADMIT_EVERY_MAX`]; one that admits a key not evicted lately halves it
//! again. A new working set still displaces an idle one: every miss
//! counts, so after at most `ADMIT_EVERY` misses per slot the old keys
//! are gone — or, on a CPU that had backed off, after 128 + 64 + … + 8
//! misses. The filter decides without the block's lock (a scan of the
//! window and a per-block count), so a key left out pays its direct
//! charge or return and no lock; only an admitted key locks the block to
//! take its slot.
//!
//! **Children share their parent's slot.** A key left out — no slot of
//! its own, its window full — whose parent holds a slot charges through
//! it ([`Stock::charge_through_parent`]): the parent's units are charged
//! at the parent and every level above, so only the child's own counter
//! moves (its limit checked as by any charge) — one update of a line the
//! child's CPU owns, where a direct charge updates every level up to the
//! root, lines every CPU shares. Its uncharge comes off its own counter
//! and goes into the parent's slot ([`Stock::return_left_out`]). A parent
//! without a slot takes over the slot of its nearest descendant there
//! (`Stock::promote`, under the block's lock): the descendant's units
//! come off its levels below the parent and stay charged above, now the
//! parent's, and the descendant charges through the parent's slot from
//! then on, like its siblings left out. So 4 children of one parent over
//! one slot, or 8 over 7, share the parent's slot instead of evicting each
//! other or charging up to the root. Children do not compete for a slot of
//! their own while their parent serves them (their misses are not
//! counted), and a parent gets a slot only by a promotion or by its own
//! charges — never through the filter on its children's behalf, where it
//! would compete with them. The budget holds (a promotion keeps the slot's
//! quota), limits stay exact at every level (the parent already counts
//! the units; the child's level is checked), and a parent is never below
//! its children (the descendant's levels give up the units before anyone
//! takes them). Keys whose units stand for more than a charge
//! ([`StockKey::MOVABLE`]: an allocator's account) never share; groups of
//! different parents do not either — the filter decides for them.
//!
//! **Locking.** Threads that share a CPU can preempt each other, so each
//! CPU's block has a try-lock. The hot path never waits: if the lock is
//! held, the caller bypasses the stock and charges the usage counter
//! directly. A stock of the host's CPUs that finds its CPU's block held
//! on a slow path (in lock mode, on any operation) yields the CPU once
//! before it bypasses: the holder is most often a thread of that CPU
//! preempted inside its locked section, and until it runs again every
//! other thread there would bypass the stock on every miss and return.
//! Drainers (which may empty other CPUs' blocks) wait for each block's
//! lock in turn; several drains may run at once, each holding one
//! block at a time. A drain never gives up because another one is running:
//! a charge that is refused after draining was refused with every stocked
//! unit of the refusing subtree returned (the kernel's `drain_all_stock`
//! skips when another drain runs, and its refusals are then inexact).
//!
//! **Slack.** Stocked units are charged, so usage never exceeds a limit
//! because of the stock; it may *over*-report real use by at most
//! `budget · ncpu` units across the machine.
//!
//! **`fork`.** A child process has only the thread that forked; a block
//! lock held by any other thread at that moment would never be released
//! there, and the child's next drain (a refused allocation, say) would wait
//! for ever. `pthread_atfork` handlers take every stock's block locks before
//! the fork — so no block is mid-update — and release them in the parent
//! and in the child (the `fork` module below).

#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
use super::stock_rseq;
use super::usage::UsageCounter;
use crate::sync::{
    Arc, AtomicU16, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

/// Most slots a CPU's stock can have (one 1 KiB block).
pub const MAX_STOCK_SLOTS: usize = 63;

/// The default budget, in batches: a CPU stocks at most this many batches
/// of units in all, however many keys it serves (the stock's capacity
/// before budgets: 7 slots of a batch).
pub const DEFAULT_BUDGET_BATCHES: u64 = 7;

/// The fewest slots a key may occupy in a block of more slots than this: a
/// window of consecutive slots whose start a hash of the key picks (among
/// a power of two of starts, so that the hash is one multiplication and a
/// shift: 32 slots from one of 32 starts in a block of 63). The hit
/// sequences scan the window only; in a block of at most this many slots
/// every key may use every slot.
pub const WINDOW: usize = 16;

/// When a key misses and every slot of its window is taken, one such miss
/// in this many (per CPU) evicts a slot for it; the others charge the
/// usage counter directly (see `Block::admits`). The least period: a CPU
/// whose evictions bring back keys it evicted shortly before backs off to
/// [`ADMIT_EVERY_MAX`] (see [`Stock`]'s admission docs).
pub const ADMIT_EVERY: u8 = 8;

/// The longest admission period a CPU backs off to: one eviction per this
/// many misses of keys left out, while the keys it admits are ones it
/// evicted among its last [`RECENT_VICTIMS`] evictions (a cyclic pattern
/// one or two keys longer than the slots).
pub const ADMIT_EVERY_MAX: u8 = ADMIT_EVERY << MAX_BACKOFF;

/// Doublings of the admission period at most.
const MAX_BACKOFF: u8 = 4;

/// Evicted keys a CPU remembers to tell an admission that brings one back
/// (thrashing) from one that brings in a new key.
pub const RECENT_VICTIMS: usize = 4;

/// The largest batch: units are kept as `u32`.
pub const MAX_STOCK_BATCH: u64 = u32::MAX as u64;

/// What units in a [`Stock`] are charged through: a pointer-sized handle
/// naming a usage counter.
pub trait StockKey: Clone {
    /// The usage counter the units are charged to.
    fn counter(&self) -> &UsageCounter;
    /// Give `units` back to the counter (called outside the stock's lock).
    fn return_units(self, units: u64);
    /// Let go of the key after the stock took `units` off its counter
    /// itself. The stock does that under its lock — so that a drain that
    /// finds a slot already emptied by another drain knows its units are
    /// off the counters — and calls this once the lock is released. A key
    /// whose `return_units` does more than uncharge the counter (an
    /// allocator account also drops the references its bytes held) does
    /// that here. The default drops the key.
    fn release_units(self, units: u64) {
        let _ = units;
        drop(self);
    }
    /// [`StockKey::return_units`] through a borrowed key: the default
    /// clones it; a key whose return needs no key of its own (a counter's
    /// `Arc`) returns the units without the clone.
    fn return_units_kept(&self, units: u64) {
        self.clone().return_units(units);
    }
    /// Whether a slot keeps its key when its units run out. A key whose
    /// validity depends on the units it stands for (an allocator account)
    /// must not stay behind with none.
    const KEEP_EMPTY: bool;
    /// Whether a slot's units may serve another key — a child charging
    /// through its parent's slot, a slot handed to the parent: true when
    /// the units stand for nothing but the charge on the counters (see
    /// [`Stock`]'s docs on children sharing their parent's slot). An
    /// allocator account's units also hold references to it: they stay
    /// put.
    const MOVABLE: bool = false;
    /// The key of the counter's parent, where the key type has one (a
    /// counter's `Arc`: its parent's).
    fn parent_key(&self) -> Option<&Self> {
        None
    }
    /// The key's identity as one non-zero word: two keys are the same when
    /// their words are (a slot stores this word).
    fn as_raw(&self) -> usize;
    /// Give the key up as its word ([`StockKey::as_raw`]'s value).
    fn into_raw(self) -> usize;
    /// Take a key back from its word.
    ///
    /// # Safety
    /// `raw` came from [`StockKey::into_raw`] and is taken back once.
    unsafe fn from_raw(raw: usize) -> Self;
}

impl StockKey for Arc<UsageCounter> {
    fn counter(&self) -> &UsageCounter {
        self
    }
    fn return_units(self, units: u64) {
        self.uncharge(units);
    }
    fn return_units_kept(&self, units: u64) {
        self.uncharge(units);
    }
    // Keeping the key saves an `Arc` drop and clone per refill.
    const KEEP_EMPTY: bool = true;
    const MOVABLE: bool = true;
    fn parent_key(&self) -> Option<&Self> {
        self.parent()
    }
    fn as_raw(&self) -> usize {
        Arc::as_ptr(self) as usize
    }
    fn into_raw(self) -> usize {
        Arc::into_raw(self) as usize
    }
    unsafe fn from_raw(raw: usize) -> Self {
        // SAFETY: forwarded: `raw` is an `into_raw` pointer, taken once.
        unsafe { Arc::from_raw(raw as *const UsageCounter) }
    }
}

/// The answer of [`Stock::consume`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Consumed {
    /// The units were taken from this CPU's stock.
    Hit,
    /// This CPU's stock has too few units for the counter.
    Miss,
    /// Another thread on this CPU holds the stock: charge directly.
    Busy,
}

/// Units a stock operation could not keep — an evicted slot, the excess
/// above the slot's quota, or everything when the lock was busy — already
/// taken off their counters (under the stock's lock: a drain that comes
/// after sees them gone). What is left to do once the lock is released —
/// the counters' listeners told of a level back under `high`, the keys let
/// go ([`StockKey::release_units`]) — is done by [`Leftovers::uncharge`],
/// or on drop.
#[derive(Debug)]
#[must_use = "leftovers finish their uncharge when dropped; `uncharge` says how many units"]
pub struct Leftovers<K: StockKey = Arc<UsageCounter>> {
    items: [Option<(K, u64)>; 3],
}

impl<K: StockKey> Default for Leftovers<K> {
    fn default() -> Self {
        Leftovers {
            items: [None, None, None],
        }
    }
}

impl<K: StockKey> Leftovers<K> {
    /// `units` of `key` come back: off its counter now.
    fn push(&mut self, key: K, units: u64) {
        if units == 0 {
            return;
        }
        key.counter().uncharge_untold(units);
        self.push_taken(key, units);
    }

    /// `units` of `key` already off its counter (`uncharge_untold`).
    fn push_taken(&mut self, key: K, units: u64) {
        if let Some(slot) = self.items.iter_mut().find(|i| i.is_none()) {
            *slot = Some((key, units));
        } else {
            // Every place is taken (never by the stock's own operations,
            // which leave at most three: a victim, a slot's units above
            // its share, the excess of a return): finish this one at once.
            finish_return(key, units);
        }
    }

    /// The units that came back (off their counters already); tells the
    /// counters' listeners and lets go of the keys.
    #[inline]
    pub fn uncharge(mut self) -> u64 {
        // Filled in order: an empty first place means none.
        if self.items[0].is_none() {
            return 0;
        }
        self.finish()
    }

    #[cold]
    fn finish(&mut self) -> u64 {
        self.items
            .iter_mut()
            .filter_map(Option::take)
            .map(|(k, units)| {
                finish_return(k, units);
                units
            })
            .sum()
    }
}

impl<K: StockKey> Drop for Leftovers<K> {
    #[inline]
    fn drop(&mut self) {
        if self.items[0].is_some() {
            self.finish();
        }
    }
}

/// The part of returning `units` of `key` that waits for the stock's lock
/// to be released: its counter's listeners told, the key let go (the units
/// are already off the counters: `UsageCounter::uncharge_untold`).
fn finish_return<K: StockKey>(key: K, units: u64) {
    key.counter().settle();
    key.release_units(units);
}

/// One slot: a key's word, the units it holds, and its quota — the most
/// units it may hold, granted out of its CPU's budget (see [`Block`]).
#[repr(C)]
#[derive(Default)]
struct Slot {
    /// The key as its word ([`StockKey::into_raw`]; 0: empty). Written
    /// under the lock only; read by the sequences and by drains looking
    /// for a key without the lock.
    key: AtomicUsize,
    /// Units held. Written by the hit sequences (on the block's CPU, lock
    /// free) and under the lock.
    units: AtomicU32,
    /// Units granted: `units ≤ quota` always. Written under the lock only;
    /// the stash sequence checks it.
    quota: AtomicU32,
}

/// One CPU's block: 1 KiB, a 16-byte header and [`MAX_STOCK_SLOTS`]
/// 16-byte slots. The lock word first (the fork handlers reach every
/// block's lock without knowing the key type) — the layout the rseq
/// sequences read (`stock_rseq.rs`).
///
/// **The budget.** `granted` is the sum of the slots' quotas and never
/// exceeds the stock's budget; a slot never holds more than its quota. So
/// a CPU never stocks more than the budget, however many keys it serves.
#[repr(C, align(128))]
struct Block {
    /// [`HELD`] while locked, plus [`SEALED`] once the block has left the
    /// rseq sequences for good (see [`Stock::seal`]): 0 free, 1 held,
    /// 2 free and sealed, 3 held and sealed. The sequences treat any value
    /// but 0 as busy.
    lock: AtomicU32,
    /// The next slot of a window to evict (under the lock).
    victim: AtomicU8,
    /// Misses of keys that found their window full, modulo
    /// [`ADMIT_EVERY`] (counted without the lock: see
    /// [`Block::count_miss`]).
    misses: AtomicU8,
    /// Slots with a key (under the lock; read without it as a hint).
    used: AtomicU16,
    /// The sum of the slots' quotas (under the lock; read without it by a
    /// miss, as a hint).
    granted: AtomicU64,
    slots: [Slot; MAX_STOCK_SLOTS],
}

// The layout the sequences read.
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
const _: () = {
    assert!(std::mem::offset_of!(Block, lock) == 0);
    assert!(std::mem::offset_of!(Block, granted) == stock_rseq::GRANTED);
    assert!(std::mem::offset_of!(Block, slots) == stock_rseq::SLOTS);
    assert!(std::mem::size_of::<Slot>() == stock_rseq::SLOT);
    assert!(std::mem::offset_of!(Slot, units) == stock_rseq::UNITS);
    assert!(std::mem::offset_of!(Slot, quota) == stock_rseq::QUOTA);
    assert!(std::mem::size_of::<Block>() == stock_rseq::BLOCK);
};

impl Block {
    fn new() -> Block {
        Block {
            lock: AtomicU32::new(0),
            victim: AtomicU8::new(0),
            misses: AtomicU8::new(0),
            used: AtomicU16::new(0),
            granted: AtomicU64::new(0),
            slots: std::array::from_fn(|_| Slot::default()),
        }
    }

    /// A compare-and-swap on the lock word: `Some(word to restore on
    /// unlock)` if it was free.
    fn try_lock(&self) -> Option<u32> {
        // Acquire: sees the previous holder's slot changes.
        match self.lock.compare_exchange(0, HELD, Acquire, Relaxed) {
            Ok(_) => Some(0),
            Err(SEALED) => self.try_lock_sealed(),
            Err(_) => None,
        }
    }

    /// Take the lock only if the block is sealed (safe from the sequences
    /// without a fence, from any CPU).
    fn try_lock_sealed(&self) -> Option<u32> {
        // Acquire: as in `try_lock`.
        self.lock
            .compare_exchange(SEALED, SEALED | HELD, Acquire, Relaxed)
            .ok()
            .map(|_| SEALED)
    }

    fn unlock(&self, restore: u32) {
        // Release: publishes this holder's slot changes to the next holder
        // (and to the sequences, which read the lock before the slots).
        self.lock.store(restore, Release);
    }

    /// Slot `i`'s key word.
    #[inline]
    fn key(&self, i: usize) -> usize {
        // Relaxed: keys change only under the lock, which the caller holds
        // (or, for a lookup without it, a stale answer is allowed).
        self.slots[i].key.load(Relaxed)
    }

    /// Store slot `i`'s key word; the old one.
    fn swap_key(&self, i: usize, raw: usize) -> usize {
        // Release: a drain that finds the old key gone without the lock
        // (`find_unlocked`) sees the units this holder took off its
        // counter before. (The unlock publishes it to lock holders; the
        // stash's fence orders it before the retired check.)
        self.slots[i].key.swap(raw, Release)
    }

    /// The slot holding the key whose word is `raw`, within `window`.
    #[inline]
    fn find(&self, window: (usize, usize), raw: usize) -> Option<usize> {
        (window.0..window.1).find(|&i| self.key(i) == raw)
    }

    /// Whether a key that is not in `window` may take a slot there: yes if
    /// one is empty; if all are taken, only one miss in `period` (the
    /// CPU's admission period, [`ADMIT_EVERY`] to [`ADMIT_EVERY_MAX`];
    /// counted per block, without the lock) evicts a victim — the others
    /// bypass the stock. Round-robin eviction of a cyclic pattern one key
    /// longer than the window (8 tenants in turn over 7 slots) would
    /// otherwise evict on every charge, each eviction an uncharge and a
    /// refill on every level of two hierarchies; with the filter the keys
    /// in the slots keep hitting and the one left out pays a direct
    /// charge, and a new working set still replaces an old one after at
    /// most `period` misses per slot (see [`Admission`] for how the
    /// period moves).
    fn admits(&self, (start, end): (usize, usize), period: u8) -> bool {
        (start..end).any(|i| self.key(i) == 0) || self.count_miss(period)
    }

    /// Count a miss of a key left out of a full window: whether it is the
    /// one in `period` that may evict.
    fn count_miss(&self, period: u8) -> bool {
        // Relaxed, and not one read-modify-write: a heuristic's count,
        // kept without the lock by the miss paths (two threads of a CPU
        // that interleave may count one miss where there were two).
        let m = self.misses.load(Relaxed).wrapping_add(1);
        let admit = m >= period;
        self.misses.store(if admit { 0 } else { m }, Relaxed);
        admit
    }

    /// [`Block::find`] without the lock.
    #[inline]
    fn find_unlocked(&self, window: (usize, usize), raw: usize) -> Option<usize> {
        // Acquire: pairs with `swap_key`: a key seen gone had its units
        // taken off its counter.
        (window.0..window.1).find(|&i| self.slots[i].key.load(Acquire) == raw)
    }

    fn units(&self, i: usize) -> u64 {
        // Relaxed: under the lock, the sequences do not write this block;
        // without it, a statistic.
        self.slots[i].units.load(Relaxed) as u64
    }

    fn set_units(&self, i: usize, units: u64) {
        // Relaxed: under the lock (published by the unlock).
        self.slots[i].units.store(units as u32, Relaxed);
    }

    fn quota(&self, i: usize) -> u64 {
        // Relaxed: under the lock.
        self.slots[i].quota.load(Relaxed) as u64
    }

    /// Set slot `i`'s quota, keeping `granted` the sum (under the lock).
    fn set_quota(&self, i: usize, quota: u64) {
        let old = self.quota(i);
        // Relaxed: under the lock.
        self.slots[i].quota.store(quota as u32, Relaxed);
        let granted = self.granted.load(Relaxed) + quota - old;
        self.granted.store(granted, Relaxed);
    }

    fn granted(&self) -> u64 {
        // Relaxed: under the lock, or a hint.
        self.granted.load(Relaxed)
    }

    #[inline]
    fn used(&self) -> usize {
        // Relaxed: under the lock, or a hint.
        self.used.load(Relaxed) as usize
    }

    /// [`Block::used`] without the lock, for a drain deciding to skip the
    /// block.
    fn used_unlocked(&self) -> usize {
        // Acquire: pairs with `add_used`: a block seen without keys had
        // the units of its last ones taken off their counters.
        self.used.load(Acquire) as usize
    }

    fn add_used(&self, delta: isize) {
        // Release: see `used_unlocked` (under the lock otherwise).
        let used = self.used() as isize + delta;
        self.used.store(used as u16, Release);
    }
}

/// What units a stash brings (see `Stock::stash_locked`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stashed {
    /// The surplus of a miss's refill: the slot keeps what fits its quota.
    Refill,
    /// Units a caller gives back (an uncharge, a free): if they overflow
    /// the slot, it drains to half its quota. A key without a slot takes an
    /// empty one, or evicts only if `admitted` (the filter's decision,
    /// made before the lock by `Stock::admit_returned`); otherwise its
    /// units bypass the stock.
    Returned { admitted: bool },
}

/// Lock word bit: the block's lock is held.
const HELD: u32 = 1;
/// Lock word bit: the block is sealed — rseq mode fell back to locks for it
/// after a fence failed, and no sequence will commit to it again.
const SEALED: u32 = 2;

/// How a stock's blocks are reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every operation takes the block's lock (a compare-and-swap).
    /// `on_host`: made for the host's CPUs ([`Stock::for_host`]), where a
    /// thread's CPU is the block it uses, so a block found held is yielded
    /// to once (see [`Stock::try_lock_here`]); a simulated machine's CPUs
    /// are not where threads run.
    Locks { on_host: bool },
    /// Hits are rseq critical sections on the calling CPU's block, through
    /// glibc's area at `fs:[offset]`; lock holders fence the sequences.
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    Rseq { offset: isize },
}

/// The per-CPU stocks of one hierarchy (or of the allocator's bytes). See
/// the module docs.
pub struct Stock<K: StockKey = Arc<UsageCounter>> {
    /// Boxed, so the blocks stay where the fork registry saw them while
    /// the `Stock` itself moves.
    cpus: Box<[Block]>,
    batch: u64,
    slots: usize,
    /// The most units a CPU's slots may hold in all (≥ 1).
    budget: u64,
    /// `64 − log2(starts)` for a block of more than [`WINDOW`] slots, where
    /// `starts` is the largest power of two ≤ `slots − WINDOW + 1`; 0 for
    /// one key window of every slot.
    start_shift: u32,
    /// Slots per window: `slots − starts + 1` (≥ [`WINDOW`]), or `slots`.
    window_len: usize,
    mode: Mode,
    /// Counts of the cold paths that reach other CPUs' blocks: on a line of
    /// their own, so that a drain's count never invalidates the line every
    /// hit reads `mode`, `cpus` and `slots` from.
    activity: crossbeam_utils::CachePadded<Activity>,
    /// Per CPU, beside its block (outside the 1 KiB the sequences read):
    /// the admission filter's memory of its evictions.
    admission: Box<[Admission]>,
    _keys: std::marker::PhantomData<K>,
}

/// What one CPU's admission filter learned from its evictions: the keys
/// it evicted last, and how far it backed off. Written under the CPU's
/// block lock (an eviction); `backoff` read without it (a miss's hint).
#[derive(Default)]
struct Admission {
    /// The words of the keys the last [`RECENT_VICTIMS`] evictions took
    /// out of their slots (0: none), `next` the place of the next.
    recent: [AtomicUsize; RECENT_VICTIMS],
    next: AtomicU8,
    /// The admission period is `ADMIT_EVERY << backoff`.
    backoff: AtomicU8,
}

impl Admission {
    /// The admission period: one miss of a key left out in this many may
    /// evict.
    fn period(&self) -> u8 {
        // Relaxed: a heuristic's setting (see `Admission`).
        ADMIT_EVERY << self.backoff.load(Relaxed).min(MAX_BACKOFF)
    }

    /// An eviction of `victim` to admit `admitted` (words of keys), under
    /// the block's lock: an admitted key that one of the last evictions
    /// took out means the CPU serves a cyclic pattern longer than its
    /// slots — every eviction only hands the miss on — so the period
    /// doubles (up to [`ADMIT_EVERY_MAX`]); a key not evicted lately is a
    /// new working set coming in, and the period halves again.
    fn evicted(&self, victim: usize, admitted: usize) {
        // Relaxed (all): under the block's lock, which orders them for
        // the next holder; the miss paths read `backoff` only as a hint.
        let thrash = self.recent.iter().any(|r| r.load(Relaxed) == admitted);
        let b = self.backoff.load(Relaxed);
        self.backoff.store(
            if thrash {
                (b + 1).min(MAX_BACKOFF)
            } else {
                b.saturating_sub(1)
            },
            Relaxed,
        );
        let at = self.next.load(Relaxed) as usize % RECENT_VICTIMS;
        self.recent[at].store(victim, Relaxed);
        self.next.store(((at + 1) % RECENT_VICTIMS) as u8, Relaxed);
    }
}

#[derive(Default)]
struct Activity {
    drains: AtomicU64,
    remote_locks: AtomicU64,
    fences: AtomicU64,
    sealed: AtomicU64,
    yields: AtomicU64,
}

/// What a stock's drains have cost the other CPUs, counted since the stock
/// was made ([`Stock::activity`]; for a hierarchy,
/// [`crate::group::Hierarchy::stock_activity`]). A tenant over its limit
/// must not interrupt the CPUs of other tenants: these counts show whether
/// it does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StockActivity {
    /// Drains of the stock by a predicate (refusals that drain the
    /// refusing subtree, `set_max`, `drain_stocks`).
    pub drains: u64,
    /// Blocks of other CPUs locked (a compare-and-swap on that CPU's
    /// line) by drains, removals and reads.
    pub remote_locks: u64,
    /// CPUs interrupted (`membarrier` on that CPU) so that a drain could
    /// take their units: rseq mode only, and only for blocks that held
    /// units of what was drained.
    pub fences: u64,
    /// Blocks switched from rseq to the lock mode because a fence failed
    /// (`membarrier` refused, e.g. by a seccomp sandbox entered after the
    /// stock was made; see [`Stock::uses_rseq`]). 0 on a healthy host.
    pub sealed: u64,
    /// Times a thread found its CPU's block held by another thread and
    /// yielded its CPU once to let the holder finish (stocks of the host's
    /// CPUs: the holder is most often a thread of the same CPU preempted
    /// inside its locked section, which would otherwise keep every thread
    /// of that CPU off the stock until it runs again).
    pub yields: u64,
}

impl StockActivity {
    /// What happened between `earlier` (a reading taken before) and this
    /// reading: each count's difference. A count that went down (readings
    /// of two different hierarchies, or in the wrong order) reads 0.
    ///
    /// ```
    /// use splitcount::group::{Hierarchy, HierarchyConfig};
    ///
    /// let h = Hierarchy::new(HierarchyConfig::default()).unwrap();
    /// let before = h.stock_activity();
    /// h.drain_stocks();
    /// let during = h.stock_activity().since(&before);
    /// assert_eq!(during.drains, 1);
    /// ```
    pub fn since(&self, earlier: &StockActivity) -> StockActivity {
        StockActivity {
            drains: self.drains.saturating_sub(earlier.drains),
            remote_locks: self.remote_locks.saturating_sub(earlier.remote_locks),
            fences: self.fences.saturating_sub(earlier.fences),
            sealed: self.sealed.saturating_sub(earlier.sealed),
            yields: self.yields.saturating_sub(earlier.yields),
        }
    }
}

/// A stock that cannot be built: each variant names the valid range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StockError {
    /// A stock for no CPU at all.
    NoCpus,
    /// Slots per CPU outside `1..=`[`MAX_STOCK_SLOTS`].
    Slots(usize),
    /// A batch outside `1..=`[`MAX_STOCK_BATCH`] (units are kept as `u32`).
    Batch(u64),
    /// A budget of 0 units per CPU.
    Budget(u64),
}

impl std::fmt::Display for StockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StockError::NoCpus => write!(f, "a stock needs at least one CPU"),
            StockError::Slots(s) => write!(
                f,
                "a CPU's stock holds 1 to {MAX_STOCK_SLOTS} groups, not {s}"
            ),
            StockError::Batch(b) => write!(
                f,
                "the stock batch must be between 1 and {MAX_STOCK_BATCH}, not {b}"
            ),
            StockError::Budget(b) => {
                write!(f, "a CPU's stock budget must be at least 1 unit, not {b}")
            }
        }
    }
}

impl std::error::Error for StockError {}

// SAFETY: a block's key words own keys (`into_raw`), changed only under the
// block's lock; everything else is atomic. So `Stock` may be shared and
// sent like a `Mutex` of its keys.
unsafe impl<K: StockKey + Send> Sync for Stock<K> {}
// SAFETY: as above.
unsafe impl<K: StockKey + Send> Send for Stock<K> {}

// A panic cannot leave a block half-updated: slots change only under their
// CPU's lock, in code that does not panic, and the lock is released by a
// guard. So code that catches an unwind may go on using a stock (and the
// groups and hierarchies that hold one).
impl<K: StockKey> std::panic::RefUnwindSafe for Stock<K> {}
impl<K: StockKey> std::panic::UnwindSafe for Stock<K> {}

/// A held block lock; released on drop.
struct Locked<'a> {
    block: &'a Block,
    /// The word the lock goes back to: 0, or [`SEALED`].
    restore: u32,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.block.unlock(self.restore);
    }
}

impl<K: StockKey> Stock<K> {
    /// Stocks for `cpus` CPUs (≥ 1) of `slots` slots each
    /// (`1..=`[`MAX_STOCK_SLOTS`]), batch `batch` (`1..=`[`MAX_STOCK_BATCH`]),
    /// whose every operation takes its block's lock. The CPU an operation
    /// names is the caller's choice (a simulated machine's, say).
    pub fn new(cpus: usize, slots: usize, batch: u64) -> Result<Stock<K>, StockError> {
        Stock::with_mode(cpus, slots, batch, Mode::Locks { on_host: false })
    }

    /// Stocks for this machine's CPUs (`cpus` must be its CPU count) whose
    /// hits are rseq critical sections on the CPU the thread runs on,
    /// where the platform allows (x86_64 Linux, glibc's rseq areas, CPU ids
    /// `0..cpus`, `membarrier` for rseq); elsewhere as [`Stock::new`]. The
    /// CPU an operation names is then ignored where a sequence runs: the
    /// thread's own CPU is used.
    pub fn for_host(cpus: usize, slots: usize, batch: u64) -> Result<Stock<K>, StockError> {
        Stock::with_mode(cpus, slots, batch, host_mode(cpus))
    }

    fn with_mode(
        cpus: usize,
        slots: usize,
        batch: u64,
        mode: Mode,
    ) -> Result<Stock<K>, StockError> {
        if cpus == 0 {
            return Err(StockError::NoCpus);
        }
        if !(1..=MAX_STOCK_SLOTS).contains(&slots) {
            return Err(StockError::Slots(slots));
        }
        if !(1..=MAX_STOCK_BATCH).contains(&batch) {
            return Err(StockError::Batch(batch));
        }
        // Windows: a power of two of starts, as many as fit with windows of
        // at least WINDOW slots.
        let (start_shift, window_len) = if slots <= WINDOW {
            (0, slots)
        } else {
            let starts = 1usize << (slots - WINDOW + 1).ilog2();
            (64 - starts.ilog2(), slots - starts + 1)
        };
        let stock = Stock {
            cpus: (0..cpus).map(|_| Block::new()).collect(),
            batch,
            slots,
            budget: batch.saturating_mul(DEFAULT_BUDGET_BATCHES),
            start_shift,
            window_len,
            mode,
            activity: Default::default(),
            admission: (0..cpus).map(|_| Admission::default()).collect(),
            _keys: std::marker::PhantomData,
        };
        #[cfg(all(unix, not(loom)))]
        fork::register(&stock.cpus);
        Ok(stock)
    }

    /// Cap what each CPU stocks in all at `budget` units (≥ 1; the default
    /// is [`DEFAULT_BUDGET_BATCHES`] batches): a slot holds at most its
    /// quota, and a CPU's quotas add up to at most the budget. With more
    /// keys on a CPU than the budget has batches for, each key is granted a
    /// share of it (and its misses charge that share) instead of a batch.
    /// Call before the stock is used.
    pub fn with_budget(mut self, budget: u64) -> Result<Stock<K>, StockError> {
        if budget == 0 {
            return Err(StockError::Budget(budget));
        }
        self.budget = budget;
        Ok(self)
    }

    /// The budget: the most units one CPU stocks at a time, whatever the
    /// number of keys. The stock over-reports real use by at most
    /// `budget · cpus` units across the machine.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The batch: a miss charges this many units at once (or a key's share
    /// of the budget when that is smaller; see [`Stock::with_budget`]).
    pub fn batch(&self) -> u64 {
        self.batch
    }

    /// The slots a key may occupy in a block: all of them, or a window of
    /// [`WINDOW`] picked by a hash of its word.
    #[inline(always)]
    fn window(&self, raw: usize) -> (usize, usize) {
        // Fibonacci hashing: the product's high half mixes every bit of
        // the word (an address whose low bits are zero).
        if self.start_shift == 0 {
            return (0, self.slots);
        }
        let start = ((raw as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.start_shift) as usize;
        (start, start + self.window_len)
    }

    /// The units a miss for `key` should charge at once, from hints read on
    /// the miss (its slot's quota, the block's granted units and slots in
    /// use; `None`: it has no slot): its quota plus what the block has not
    /// granted — and at least its fair share of the budget (`budget /
    /// keys`), so that a key that got less than its share while others held
    /// the budget asks for it (the stash then takes the share back from
    /// quotas above it, `Stock::grant`). At least 1, at most a batch.
    fn refill(&self, short: Option<(u64, u64, u64)>) -> u64 {
        let Some((quota, granted, used)) = short else {
            return self.batch.min(self.budget);
        };
        let room = quota.saturating_add(self.budget.saturating_sub(granted));
        if room >= self.batch {
            return self.batch;
        }
        let share = self.budget / used.max(1);
        room.max(share).clamp(1, self.batch)
    }

    /// Slots per CPU.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// CPUs (blocks).
    pub fn cpus(&self) -> usize {
        self.cpus.len()
    }

    /// Whether hits are rseq critical sections (see [`Stock::for_host`]).
    /// An rseq stock leaves that mode for good, one block at a time, if a
    /// fence fails (`membarrier` refused after the stock was made — a
    /// seccomp sandbox entered later, say): from the first failure on this
    /// returns `false`, and [`StockActivity::sealed`] counts the blocks that
    /// now take their lock on every operation.
    pub fn uses_rseq(&self) -> bool {
        !matches!(self.mode, Mode::Locks { .. }) && !self.fell_back()
    }

    /// Whether a fence failed and some block was sealed ([`Stock::seal`]):
    /// a `Busy` from a sequence may then mean a sealed block, used under
    /// its lock. Cold: read only off the hit paths.
    fn fell_back(&self) -> bool {
        self.activity.sealed.load(Relaxed) != 0
    }

    /// CPU `cpu`'s block; a CPU beyond the blocks (one the machine did
    /// not report when the stock was made) wraps around. The division only
    /// then: `cpu % len` on every call was a `div` on each left-out op's
    /// way (≈ 8% of the cycles of the return's path in a profile).
    #[inline]
    fn block(&self, cpu: usize) -> &Block {
        let len = self.cpus.len();
        &self.cpus[if cpu < len { cpu } else { cpu % len }]
    }

    /// The admission state of the CPU whose block is `b`.
    fn admission(&self, b: &Block) -> &Admission {
        let at = (b as *const Block as usize - self.cpus.as_ptr() as usize)
            / std::mem::size_of::<Block>();
        &self.admission[at]
    }

    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    fn base(&self) -> *mut u8 {
        self.cpus.as_ptr() as *mut u8
    }

    /// The lock of the block of the CPU this operation works on: `cpu`'s
    /// (lock mode), or the calling thread's own CPU's (rseq mode, taken as a
    /// critical section). Never waited for: a stock of the host's CPUs
    /// that finds the block held yields the CPU once and tries again.
    /// `None` when busy — or, in rseq mode, when the thread cannot run
    /// sequences.
    fn try_lock_here(&self, cpu: usize) -> Option<Locked<'_>> {
        match self.mode {
            Mode::Locks { on_host } => {
                let block = self.block(cpu);
                let restore = match block.try_lock() {
                    Some(restore) => restore,
                    // As in rseq mode (below): on the host's CPUs the holder
                    // of the caller's CPU's block is most likely a thread of
                    // this CPU preempted while holding it. (A simulated
                    // machine's CPUs are not where threads run: no yield.)
                    None if on_host => {
                        self.yield_to_holder();
                        block.try_lock()?
                    }
                    None => return None,
                };
                Some(Locked { block, restore })
            }
            #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
            Mode::Rseq { offset } => {
                // SAFETY: `offset` is glibc's `__rseq_offset`; the blocks
                // are laid out as the sequences expect (`Block`).
                let lock =
                    || unsafe { stock_rseq::lock_local(offset, self.base(), self.cpus.len()) };
                let mut locked = lock();
                if locked == Err(stock_rseq::Step::Busy) && !self.fell_back() {
                    // This CPU's block is held. Its holder is most often a
                    // thread of this CPU preempted inside its locked section
                    // (a slow path that runs with the lock and without
                    // rseq's restart): until it runs again, every thread of
                    // this CPU finds the block held — each of their misses,
                    // refills and returns bypasses the stock for the rest of
                    // the time slice (a consumer thread's frees, 20,000 in
                    // a row, each went to the counters). Yield the CPU once:
                    // the holder, runnable here, finishes and unlocks. Held
                    // still (a drain on another CPU, a holder that migrated,
                    // this very thread in a signal handler), the caller
                    // bypasses the stock as before.
                    self.yield_to_holder();
                    locked = lock();
                }
                match locked {
                    Ok(cpu) => Some(Locked {
                        block: &self.cpus[cpu],
                        restore: 0,
                    }),
                    // A sealed block is locked like in lock mode (from any
                    // CPU: no sequence commits to it). Cold: only after a
                    // fence failed.
                    Err(stock_rseq::Step::Busy) if self.fell_back() => {
                        let block = self.block(cpu);
                        let restore = block.try_lock_sealed()?;
                        Some(Locked { block, restore })
                    }
                    Err(_) => None,
                }
            }
        }
    }

    /// The lock of CPU `cpu`'s block, waiting for it; in rseq mode, also
    /// fencing the sequences in flight on that CPU (see `stock_rseq.rs`).
    fn lock_remote(&self, cpu: usize) -> Locked<'_> {
        let (mut locked, fenced) = self.lock_unfenced(cpu);
        if !fenced {
            self.fence(&mut locked, cpu);
        }
        locked
    }

    /// Give the CPU once to the thread holding this CPU's block (see
    /// [`Stock::try_lock_here`]), counted.
    #[cold]
    fn yield_to_holder(&self) {
        self.activity.yields.fetch_add(1, Relaxed);
        crate::sync::thread::yield_now();
    }

    /// The lock of CPU `cpu`'s block, waiting for it, and whether the
    /// block is safe from the sequences already (lock mode, or the block of
    /// the CPU this thread runs on, locked by a critical section). Without
    /// the fence ([`Stock::fence`]) the holder may read the block's keys
    /// (written only under the lock) but not rely on its units: a sequence
    /// on that CPU that saw the block unlocked may still commit to them.
    fn lock_unfenced(&self, cpu: usize) -> (Locked<'_>, bool) {
        // On the block's own CPU, a critical section takes the lock and no
        // fence is needed.
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        if let Mode::Rseq { offset } = self.mode {
            // SAFETY: as in `try_lock_here`.
            if let Ok(here) =
                unsafe { stock_rseq::lock_local(offset, self.base(), self.cpus.len()) }
            {
                if here == cpu % self.cpus.len() {
                    let block = &self.cpus[here];
                    return (Locked { block, restore: 0 }, true);
                }
                self.cpus[here].unlock(0);
            }
        }
        let block = self.block(cpu);
        let restore = loop {
            if let Some(restore) = block.try_lock() {
                break restore;
            }
            crate::sync::thread::yield_now();
        };
        self.activity.remote_locks.fetch_add(1, Relaxed);
        // A sealed block needs no fence: no sequence commits to it.
        let safe = matches!(self.mode, Mode::Locks { .. }) || restore & SEALED != 0;
        (Locked { block, restore }, safe)
    }

    /// Make a remote lock holder of CPU `cpu`'s block safe from the
    /// sequences in flight there (rseq mode: `membarrier` on that CPU, an
    /// interrupt; lock mode: nothing). If the fence fails, the block is
    /// sealed instead ([`Stock::seal`]).
    fn fence(&self, locked: &mut Locked<'_>, cpu: usize) {
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        if let Mode::Rseq { .. } = self.mode {
            self.activity.fences.fetch_add(1, Relaxed);
            if !stock_rseq::fence_cpu(cpu % self.cpus.len()) {
                self.seal(locked, cpu);
            }
        }
        let _ = (locked, cpu);
    }

    /// A fence failed: take CPU `cpu`'s block (locked by the caller, not
    /// fenced) out of rseq mode for good. The lock word keeps [`SEALED`]
    /// from now on, so every sequence that starts — or restarts — on that
    /// CPU sees the block busy, and the operation takes the lock instead
    /// (`try_lock_here`): lock mode for that block. What is left is a
    /// sequence already past its look at the lock word, which may still
    /// commit once; `stock_rseq::quiesce_cpu` runs this thread on `cpu`
    /// (so every thread that was there has been switched out, which
    /// restarts its sequence) before the caller touches the units.
    ///
    /// Blocks are sealed one by one, by the first drain that needs a fence
    /// for each: sealing another CPU's block would mean waiting for its
    /// lock while holding this one.
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    #[cold]
    fn seal(&self, locked: &mut Locked<'_>, cpu: usize) {
        // Relaxed: we hold the lock (the word is HELD); any non-zero value
        // keeps the sequences out, and the unlock (Release) publishes.
        locked.block.lock.store(SEALED | HELD, Relaxed);
        locked.restore = SEALED;
        self.activity.sealed.fetch_add(1, Relaxed);
        stock_rseq::quiesce_cpu(cpu % self.cpus.len());
    }

    /// What the stock's drains have cost so far (see [`StockActivity`]).
    pub fn activity(&self) -> StockActivity {
        StockActivity {
            drains: self.activity.drains.load(Relaxed),
            remote_locks: self.activity.remote_locks.load(Relaxed),
            fences: self.activity.fences.load(Relaxed),
            sealed: self.activity.sealed.load(Relaxed),
            yields: self.activity.yields.load(Relaxed),
        }
    }

    /// Take `n` units for `key` from CPU `cpu`'s stock.
    #[inline]
    pub fn consume(&self, cpu: usize, key: &K, n: u64) -> Consumed {
        self.consume_with(|| cpu, key, n)
    }

    /// [`Stock::consume`] with the CPU found only where it is needed (lock
    /// mode, or the slow path): an rseq hit reads its CPU inside the
    /// critical section.
    #[inline]
    pub(crate) fn consume_with(&self, cpu: impl FnOnce() -> usize, key: &K, n: u64) -> Consumed {
        self.take_with(cpu, key, n).0
    }

    /// [`Stock::consume_with`], and on a miss the units to charge at once
    /// ([`Stock::refill`]: the key's quota and what its block has left to
    /// grant; a batch when busy; 0 — charge only what is needed, stock
    /// nothing — for a key the block does not admit, [`Block::admits`]).
    ///
    /// Always inlined: its rseq hit is the charge's whole hot path, and
    /// the inliner's own choice varies with the caller's size (a change
    /// to the usage counter's slow paths once made it a call, ×1.05 →
    /// ×1.08 of no accounting in `bench charge`'s `stock` case).
    #[inline(always)]
    pub(crate) fn take_with(
        &self,
        cpu: impl FnOnce() -> usize,
        key: &K,
        n: u64,
    ) -> (Consumed, u64) {
        self.take::<false>(cpu, key, n)
    }

    /// [`Stock::take_with`] for a key that is used only where it already
    /// holds a slot (a parent whose slot its children left out share; a
    /// group, which goes to its parent's slot before the admission filter
    /// decides about it): a hit; a miss with the refill of its slot when
    /// that is short; and `(Miss, 0)` when it holds no slot here — no
    /// admission decided, no miss counted. Always inlined: it is
    /// `Group::charge`'s hit path.
    #[inline(always)]
    pub(crate) fn take_if_held(
        &self,
        cpu: impl FnOnce() -> usize,
        key: &K,
        n: u64,
    ) -> (Consumed, u64) {
        self.take::<true>(cpu, key, n)
    }

    /// [`Stock::take_with`] (`HELD_ONLY` false) and
    /// [`Stock::take_if_held`] (true): one rseq sequence, two answers to a
    /// key without a slot.
    #[inline(always)]
    fn take<const HELD_ONLY: bool>(
        &self,
        cpu: impl FnOnce() -> usize,
        key: &K,
        n: u64,
    ) -> (Consumed, u64) {
        let locked = |cpu: usize| {
            if HELD_ONLY {
                self.consume_held_locked(cpu, key, n)
            } else {
                self.consume_locked(cpu, key, n)
            }
        };
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        if let Mode::Rseq { offset } = self.mode {
            use stock_rseq::{Consumed as Found, Step};
            let min_left = u64::from(!K::KEEP_EMPTY);
            let raw = key.as_raw();
            // SAFETY: as in `try_lock_here`; the key's word is its
            // identity; its window lies within the slots.
            let found = unsafe {
                stock_rseq::consume(
                    offset,
                    self.base(),
                    self.cpus.len(),
                    self.window(raw),
                    raw,
                    n,
                    min_left,
                )
            };
            return match found {
                Found::Step(Step::Done) => (Consumed::Hit, 0),
                Found::Short {
                    quota,
                    granted,
                    used,
                } => (Consumed::Miss, self.refill(Some((quota, granted, used)))),
                Found::Step(Step::Miss) if HELD_ONLY => (Consumed::Miss, 0),
                Found::Step(Step::Miss) => (Consumed::Miss, self.admit_absent(cpu(), key)),
                Found::Step(Step::Slow) => locked(cpu()),
                // A sealed block (after a failed fence) is used under its
                // lock; a held one is bypassed.
                Found::Step(Step::Busy) if self.fell_back() => locked(cpu()),
                _ => (Consumed::Busy, self.batch),
            };
        }
        locked(cpu())
    }

    /// [`Stock::take_if_held`] under the block's lock.
    #[cold]
    fn consume_held_locked(&self, cpu: usize, key: &K, n: u64) -> (Consumed, u64) {
        let b = self.block(cpu);
        if b.find_unlocked(self.window(key.as_raw()), key.as_raw())
            .is_none()
        {
            return (Consumed::Miss, 0);
        }
        self.consume_locked_as(cpu, key, n, true)
    }

    /// The refill of a key that has no slot on CPU `cpu`: a batch if the
    /// block admits it ([`Block::admits`]: a slot is free, or this miss
    /// evicts one), else 0 — charge exactly what is needed, nothing to
    /// stock. Decided without the block's lock: the filter is a heuristic
    /// (a slot that changes hands meanwhile makes one answer stale, never
    /// a count wrong: the refill's stash takes the lock and re-checks), and
    /// a key left out — every miss of it, with more keys than slots — then
    /// costs its direct charge and a scan, not a lock. (`take_with` in lock
    /// mode decides under the lock it already holds, in `consume_locked`;
    /// `Group::charge` calls this after `take_if_held` in both modes.)
    #[cold]
    pub(crate) fn admit_absent(&self, cpu: usize, key: &K) -> u64 {
        self.refill_absent(self.block(cpu), key)
    }

    /// Whether units of `key` returned on a miss go to CPU `cpu`'s block,
    /// decided without its lock: `Some(false)` if the key holds a slot of
    /// its window there or one is empty; `Some(true)` if every slot is
    /// another key's and this is the miss in [`ADMIT_EVERY`] that may
    /// evict one; `None` if the filter leaves the key out — the units
    /// bypass the stock, and no lock is taken. Outside the lock the answer
    /// is a hint: the locked stash re-checks the slots (a key gone since
    /// takes an empty slot, or bypasses unless admitted).
    fn admit_returned(&self, cpu: usize, key: &K) -> Option<bool> {
        let b = self.block(cpu);
        let (raw, (start, end)) = (key.as_raw(), self.window(key.as_raw()));
        // One scan for the key or an empty slot (a hint: see above).
        if (start..end).any(|i| {
            let k = b.key(i);
            k == 0 || k == raw
        }) {
            return Some(false);
        }
        b.count_miss(self.admission(b).period()).then_some(true)
    }

    /// The refill of a key that has no slot in block `b`: a
    /// batch if `b` admits it ([`Block::admits`]), else 0 (the key is left
    /// out). The one admission decision of both modes' misses.
    fn refill_absent(&self, b: &Block, key: &K) -> u64 {
        if b.admits(self.window(key.as_raw()), self.admission(b).period()) {
            self.refill(None)
        } else {
            0
        }
    }

    #[cold]
    fn consume_locked(&self, cpu: usize, key: &K, n: u64) -> (Consumed, u64) {
        self.consume_locked_as(cpu, key, n, false)
    }

    /// [`Stock::consume_locked`]; `held_only`: a key without a slot gets
    /// `(Miss, 0)`, no admission decided (see [`Stock::take_if_held`]).
    fn consume_locked_as(&self, cpu: usize, key: &K, n: u64, held_only: bool) -> (Consumed, u64) {
        let Some(locked) = self.try_lock_here(cpu) else {
            return (Consumed::Busy, self.batch);
        };
        let b = locked.block;
        let (taken, emptied) = match b.find(self.window(key.as_raw()), key.as_raw()) {
            Some(i) if b.units(i) >= n => {
                let left = b.units(i) - n;
                b.set_units(i, left);
                let emptied = (!K::KEEP_EMPTY && left == 0).then(|| {
                    key.counter().note_stock_slot(false);
                    Self::forget_slot(b, i)
                });
                ((Consumed::Hit, 0), emptied)
            }
            Some(i) => (
                (
                    Consumed::Miss,
                    self.refill(Some((b.quota(i), b.granted(), b.used() as u64))),
                ),
                None,
            ),
            None if held_only => ((Consumed::Miss, 0), None),
            None => ((Consumed::Miss, self.refill_absent(b, key)), None),
        };
        drop(locked);
        if let Some(raw) = emptied {
            // SAFETY: the slot owned the key's word; it was taken out once.
            drop(unsafe { K::from_raw(raw) });
        }
        taken
    }

    /// Empty slot `i` of a locked block whose units are 0 or taken: its
    /// key's word (owned by the caller now), its quota back to the budget.
    fn forget_slot(b: &Block, i: usize) -> usize {
        b.set_units(i, 0);
        b.set_quota(i, 0);
        b.add_used(-1);
        b.swap_key(i, 0)
    }

    /// Keep `n` charged units for `key` in CPU `cpu`'s stock: added to its
    /// slot, or into an empty slot, or into a victim's (round-robin, the
    /// victim's units returned as leftovers; a refill's key was admitted by
    /// its miss, so this stash does not filter). A slot above the batch
    /// returns its excess. If the lock is busy, all `n` come back.
    pub fn stash(&self, cpu: usize, key: &K, n: u64) -> Leftovers<K> {
        self.stash_with(|| cpu, key, n)
    }

    /// The rseq hit of [`Stock::stash`] alone: `true` if the `n` units were
    /// added to `key`'s slot on the calling CPU (staying at or below `cap`);
    /// `false` (nothing done) in lock mode or on any other outcome — then
    /// call [`Stock::stash`] or [`Stock::give_back`]. For hot paths: nothing
    /// to drop or inspect on a hit.
    #[inline(always)]
    pub(crate) fn stash_hit(&self, key: &K, n: u64, cap: u64) -> bool {
        #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
        if let Mode::Rseq { offset } = self.mode {
            let raw = key.as_raw();
            // SAFETY: as in `take_with`.
            return unsafe {
                stock_rseq::stash(
                    offset,
                    self.base(),
                    self.cpus.len(),
                    self.window(raw),
                    raw,
                    n,
                    cap,
                )
            } == stock_rseq::Step::Done;
        }
        let _ = (key, n, cap);
        false
    }

    /// [`Stock::stash`] with the CPU found only where it is needed.
    #[inline]
    pub(crate) fn stash_with(&self, cpu: impl FnOnce() -> usize, key: &K, n: u64) -> Leftovers<K> {
        if n == 0 {
            return Leftovers::default();
        }
        self.stash_surplus(cpu, key, n, self.batch)
    }

    /// Keep the surplus `n` of a refill for `key`: the rseq hit, the slot
    /// staying at or below `cap` (the refill's size), else the locked stash
    /// on the CPU `cpu()` finds — which does not try the hit again (a second
    /// rseq section and scan of the window on every miss).
    #[inline]
    pub(crate) fn stash_surplus(
        &self,
        cpu: impl FnOnce() -> usize,
        key: &K,
        n: u64,
        cap: u64,
    ) -> Leftovers<K> {
        if self.stash_hit(key, n, cap) {
            return Leftovers::default();
        }
        self.stash_slow(cpu(), key, n, Stashed::Refill)
    }

    /// The locked stash of units a caller returns (the allocator's frees)
    /// after [`Stock::stash_hit`] failed: a slot they overflow drains to
    /// half its quota, and a key the block's filter leaves out is not
    /// stocked ([`Stashed::Returned`]).
    #[inline]
    pub(crate) fn stash_returned_after_miss(&self, cpu: usize, key: &K, n: u64) -> Leftovers<K> {
        let Some(admitted) = self.admit_returned(cpu, key) else {
            let mut left = Leftovers::default();
            left.push(key.clone(), n);
            return left;
        };
        self.stash_slow(cpu, key, n, Stashed::Returned { admitted })
    }

    #[cold]
    fn stash_slow(&self, cpu: usize, key: &K, n: u64, how: Stashed) -> Leftovers<K> {
        let mut left = Leftovers::default();
        let Some(locked) = self.try_lock_here(cpu) else {
            left.push(key.clone(), n);
            return left;
        };
        self.stash_locked(&locked, key, n, how, &mut left);
        left
    }

    fn stash_locked(
        &self,
        locked: &Locked<'_>,
        key: &K,
        n: u64,
        how: Stashed,
        left: &mut Leftovers<K>,
    ) {
        let b = locked.block;
        // Under the lock: a drain that followed `retire` has either passed
        // this CPU (and released the lock we now hold: we see the flag) or
        // has yet to come (and will take what we stock).
        if key.counter().is_retired() {
            left.push(key.clone(), n);
            return;
        }
        let raw = key.as_raw();
        let window = self.window(raw);
        let i = match b.find(window, raw) {
            Some(i) => i,
            None => {
                // Returned units of a key left out bypass the stock unless
                // the filter admits it; a refill's key was admitted by its
                // miss (`admit_absent`), which charged a batch for the slot.
                let (start, end) = window;
                let empty = (start..end).find(|&i| b.key(i) == 0);
                if how == (Stashed::Returned { admitted: false }) && empty.is_none() {
                    left.push(key.clone(), n);
                    return;
                }
                let i = empty.unwrap_or_else(|| {
                    // Relaxed: under the lock.
                    let v = b.victim.load(Relaxed) as usize % (end - start);
                    b.victim.store(((v + 1) % (end - start)) as u8, Relaxed);
                    start + v
                });
                key.counter().note_stock_slot(true);
                let units = b.units(i);
                let old = if b.key(i) == 0 {
                    b.add_used(1);
                    b.swap_key(i, key.clone().into_raw())
                } else {
                    // The victim's units leave its counter before its key
                    // leaves the slot (see `swap_key`).
                    Self::untell(b, i, units);
                    b.set_units(i, 0);
                    b.set_quota(i, 0);
                    b.swap_key(i, key.clone().into_raw())
                };
                if old != 0 {
                    self.admission(b).evicted(old, raw);
                    // SAFETY: the slot owned the victim's word.
                    let victim = unsafe { K::from_raw(old) };
                    victim.counter().note_stock_slot(false);
                    if units > 0 {
                        left.push_taken(victim, units);
                    }
                }
                // SeqCst: both drains read a block's key words without its
                // lock, after a fence (`drain_key` to find the key,
                // `drain_all` to skip a block with no key). A removal
                // stores `retired`, then its drain fences and reads the key
                // words; we store the key word, fence, then read `retired`:
                // one of the two sees the other — the drain sees our key
                // (and takes the slot once we unlock) or we see the flag.
                crate::sync::fence(SeqCst);
                if key.counter().is_retired() {
                    key.counter().note_stock_slot(false);
                    // SAFETY: the word we just stored.
                    drop(unsafe { K::from_raw(Self::forget_slot(b, i)) });
                    left.push(key.clone(), n);
                    return;
                }
                i
            }
        };
        let total = b.units(i).saturating_add(n);
        self.grant(b, i, total.min(self.batch), left);
        let quota = b.quota(i);
        // Returned units that overflow the slot drain it to half its quota
        // (the kernel's stock flushes a full stock whole rather than bypass
        // it): a stream of returns to one CPU — frees of blocks another
        // thread allocated, uncharges of what another CPU charged — reaches
        // the usage counters once per half quota of units, not once per
        // return. A refill keeps what fits.
        let keep = match how {
            Stashed::Returned { .. } if total > quota => quota / 2,
            _ => total.min(quota),
        };
        if keep == 0 && !K::KEEP_EMPTY {
            // A key that must not stay without units goes with them (off
            // the counter before the key leaves the slot).
            key.counter().note_stock_slot(false);
            key.counter().uncharge_untold(total);
            let raw = Self::forget_slot(b, i);
            // SAFETY: the slot owned the key's word; taken out once.
            left.push_taken(unsafe { K::from_raw(raw) }, total);
            return;
        }
        b.set_units(i, keep);
        if total > keep {
            left.push(key.clone(), total - keep);
        }
    }

    /// Raise slot `i`'s quota towards `want` (≤ the batch) out of the
    /// budget, under the block's lock. When the budget has less left than
    /// needed, every other slot's quota first comes down to its fair share
    /// (`budget / keys`, at most a batch) but not below the units it
    /// holds; if that is not enough, the units above the share come back
    /// from one slot that holds them (to `left`, off its counter now). A
    /// key that gives back what it takes — a request that charges and
    /// frees — never spends its units: when quotas only came down as units
    /// ran out, the first keys kept the budget from those that came later
    /// (25 of 32 tenants taking turns that way missed on every charge).
    /// One slot per grant keeps the leftovers bounded; a later miss takes
    /// from the next. The slot then gets what is left, up to `want`: maybe
    /// less than its share until the others come down too.
    fn grant(&self, b: &Block, i: usize, want: u64, left: &mut Leftovers<K>) {
        let quota = b.quota(i);
        if want <= quota {
            return;
        }
        let need = want - quota;
        if self.budget.saturating_sub(b.granted()) < need {
            let share = (self.budget / b.used().max(1) as u64).clamp(1, self.batch);
            let others = || (0..self.slots).filter(move |&j| j != i && b.key(j) != 0);
            for j in others() {
                if b.quota(j) > share {
                    b.set_quota(j, share.max(b.units(j)));
                }
            }
            let still_short = self.budget.saturating_sub(b.granted()) < need;
            if let Some(j) = others().find(|&j| still_short && b.units(j) > share) {
                let excess = b.units(j) - share;
                Self::untell(b, j, excess);
                b.set_units(j, share);
                b.set_quota(j, share);
                // SAFETY: under the lock the slot keeps its key alive;
                // borrowed (`ManuallyDrop`) to clone it, not owned.
                let k = std::mem::ManuallyDrop::new(unsafe { K::from_raw(b.key(j)) });
                left.push_taken((*k).clone(), excess);
            }
        }
        let free = self.budget.saturating_sub(b.granted());
        b.set_quota(i, quota + need.min(free));
    }

    /// Return `n` units the caller had charged through `key` (an uncharge)
    /// through CPU `cpu`'s stock, like [`Stock::stash`] — unless the
    /// counter's usage cannot account for them: units in a stock are
    /// charged, so a slot may never hold more than the counter's usage. An
    /// uncharge larger than the usage minus what this slot already holds is
    /// a caller's over-uncharge: stocking it would let later charges take
    /// units no one paid for (a limit of 100 let 164 units through), and
    /// taking it all from the counter would take units that back this slot.
    /// It is clamped instead — only what the usage can account for comes back
    /// (to be uncharged from the counter directly) — and the counter records
    /// an `underflow` event. The bound reads this CPU's slot only: units
    /// stocked for `key` on other CPUs are in the usage too and can cover an
    /// excess, which is then clamped when they drain (see
    /// [`crate::group::Group::uncharge`]).
    pub fn give_back(&self, cpu: usize, key: &K, n: u64) -> Leftovers<K> {
        self.give_back_with(|| cpu, key, n)
    }

    /// [`Stock::give_back`] with the CPU found only where it is needed.
    #[inline]
    pub(crate) fn give_back_with(
        &self,
        cpu: impl FnOnce() -> usize,
        key: &K,
        n: u64,
    ) -> Leftovers<K> {
        // The slot may grow to what the usage accounts for (and the batch):
        // the bound `give_back_after_miss` checks, with the usage read first.
        if n == 0 || self.stash_hit(key, n, key.counter().usage().min(self.batch)) {
            return Leftovers::default();
        }
        self.give_back_after_miss(cpu(), key, n)
    }

    /// [`Stock::give_back_with`] after [`Stock::stash_hit`] (with the
    /// usage as its cap) failed: the locked give-back on CPU `cpu`, without
    /// trying the hit again.
    #[cold]
    pub(crate) fn give_back_after_miss(&self, cpu: usize, key: &K, n: u64) -> Leftovers<K> {
        let Some(admitted) = self.admit_returned(cpu, key) else {
            // Left out: the units go to the counters, whose uncharge clamps
            // an over-uncharge itself (and counts it), as when the lock is
            // busy. Nothing is stocked, so no stocked unit needs backing.
            let mut left = Leftovers::default();
            left.push(key.clone(), n);
            return left;
        };
        self.give_back_admitted(cpu, key, n, admitted)
    }

    /// [`Stock::give_back_after_miss`] for a caller that needs neither the
    /// count nor the leftovers (`Group::uncharge`): a key this CPU's block
    /// leaves out — every op of a tenant beyond the slots — has its units
    /// returned through the borrowed key ([`StockKey::return_units_kept`]:
    /// for a counter's `Arc`, the counter's own uncharge), with no clone
    /// of the key to drop again and no second walk up the counters to tell
    /// their listeners.
    #[cold]
    pub(crate) fn return_after_miss(&self, cpu: usize, key: &K, n: u64) {
        // A child without a slot whose window is full and whose parent
        // holds one: through the parent's slot (no miss counted: it does
        // not compete for a slot of its own).
        if let Some(parent) = key.parent_key().filter(|_| K::MOVABLE) {
            if self.left_out_beside(cpu, key, parent) {
                return self.return_left_out(cpu, key, n);
            }
        }
        match self.admit_returned(cpu, key) {
            None => key.return_units_kept(n),
            Some(admitted) => {
                let _ = self.give_back_admitted(cpu, key, n, admitted).uncharge();
            }
        }
    }

    /// Whether `key`, which its rseq look on CPU `cpu` found no slot for,
    /// finds none of its window empty there: the admission filter would
    /// decide about it. A hint, read without the lock (the locked paths
    /// re-check). When a key's window is the whole block (at most
    /// [`WINDOW`] slots) one load says it: the block's count of slots in
    /// use.
    #[inline]
    fn window_full(&self, cpu: usize, key: &K) -> bool {
        let b = self.block(cpu);
        if self.start_shift == 0 {
            return b.used() >= self.slots;
        }
        self.window_full_scan(b, key.as_raw())
    }

    /// Whether no slot of the window of the key whose word is `raw` is
    /// empty or `raw`'s, in block `b` (read without the lock: a hint).
    #[inline]
    fn window_full_scan(&self, b: &Block, raw: usize) -> bool {
        let (start, end) = self.window(raw);
        (start..end).all(|i| {
            let k = b.key(i);
            k != 0 && k != raw
        })
    }

    /// Whether units of `key` returned on CPU `cpu` go through `parent`'s
    /// slot ([`Stock::return_left_out`]): `key` holds no slot of its
    /// window there, none is empty, and `parent` holds one. A hint, read
    /// without the lock. With one window for the whole block (at most
    /// [`WINDOW`] slots), the count of slots in use, then one scan for
    /// both keys.
    #[inline]
    fn left_out_beside(&self, cpu: usize, key: &K, parent: &K) -> bool {
        let b = self.block(cpu);
        let (raw, parent_raw) = (key.as_raw(), parent.as_raw());
        if self.start_shift != 0 {
            return self.window_full_scan(b, raw)
                && b.find_unlocked(self.window(parent_raw), parent_raw)
                    .is_some();
        }
        if b.used() < self.slots {
            return false;
        }
        let mut beside = false;
        for i in 0..self.slots {
            let k = b.key(i);
            if k == raw {
                return false;
            }
            beside |= k == parent_raw;
        }
        beside
    }

    /// The slot, in the locked block `b`, of the nearest strict descendant
    /// of `top` (a child at best), within `top`'s window and
    /// at most 16 levels below it, and not retired; with its levels below
    /// `top`.
    fn descendant_slot(&self, b: &Block, top: &K) -> Option<(usize, usize)> {
        let top_counter = top.counter();
        let raw = top.as_raw();
        let (start, end) = self.window(raw);
        let mut best: Option<(usize, usize)> = None;
        for j in start..end {
            let other = b.key(j);
            if other == 0 || other == raw {
                continue;
            }
            // SAFETY: under the lock the slot keeps its key alive; borrowed
            // (`ManuallyDrop`), not owned.
            let other = std::mem::ManuallyDrop::new(unsafe { K::from_raw(other) });
            let counter = other.counter();
            if counter.is_retired() {
                continue;
            }
            let below = counter
                .chain()
                .take(17)
                .position(|c| std::ptr::eq(c, top_counter));
            if let Some(d) = below.filter(|&d| d > 0) {
                if best.map_or(true, |(_, b)| d < b) {
                    best = Some((j, d));
                    if d == 1 {
                        break;
                    }
                }
            }
        }
        best
    }

    /// Hand the slot of a descendant of `parent` in the locked block `b`
    /// to `parent` (see [`Stock::charge_through_parent`]): the slot's
    /// units, charged from the descendant up, come off the descendant's
    /// levels below `parent` (untold) and stay charged at `parent` and
    /// above, now as `parent`'s; the descendant's key leaves the slot
    /// (returned, to be settled and let go once the lock is released).
    /// The slot and the descendant's key; the slot `parent` holds already
    /// and no key, if it does. `None` if no descendant holds a slot of
    /// `parent`'s window, or `parent` is retired; slot `usize::MAX` if
    /// `parent` was retired meanwhile (the slot emptied, its units off the
    /// counters untold: the caller settles `parent` too).
    fn promote(&self, b: &Block, parent: &K) -> Option<(usize, Option<K>)> {
        if parent.counter().is_retired() {
            return None;
        }
        // A slot of its own already (found by this thread's look without
        // the lock gone, or given since by another): that one, or the
        // parent would hold two slots of one block — and a removal's
        // drain, which takes the first slot of a key, would leave the
        // other behind.
        let raw = parent.as_raw();
        if let Some(i) = b.find(self.window(raw), raw) {
            return Some((i, None));
        }
        let (j, below) = self.descendant_slot(b, parent)?;
        // SAFETY: as in `descendant_slot`.
        let child = std::mem::ManuallyDrop::new(unsafe { K::from_raw(b.key(j)) });
        // Only what the descendant's levels below `parent` still hold
        // becomes `parent`'s: an over-uncharge covered by this slot (the
        // units of a key stocked on another CPU back an excess until they
        // drain) took the rest off every level above it already, so the
        // slot keeps what came off the level just below `parent` (each
        // level clamped in turn, the underflow counted) and no more — all
        // of it would later come off `parent` a second time, below its
        // other children.
        let removed = child.counter().sub_levels(below, b.units(j), false);
        b.set_units(j, removed);
        child.counter().note_stock_slot_levels(below, false);
        // The key word changes under the lock; the units stay, now
        // `parent`'s (see `stash_locked` for the fence and the retired
        // check of a key new to a block).
        let old = b.swap_key(j, parent.clone().into_raw());
        crate::sync::fence(SeqCst);
        // SAFETY: the slot owned the child's word; taken out once.
        let child = unsafe { K::from_raw(old) };
        if parent.counter().is_retired() {
            // Its drain may have passed: the units go back from `parent`
            // up (untold: the caller settles `parent` once the lock is
            // released), and the slot is emptied.
            parent.counter().uncharge_untold(b.units(j));
            // SAFETY: the word just stored.
            drop(unsafe { K::from_raw(Self::forget_slot(b, j)) });
            parent.counter().note_stock_slot(false);
            return Some((usize::MAX, Some(child)));
        }
        Some((j, Some(child)))
    }

    /// What [`Stock::promote`] leaves for after the lock: the descendant's
    /// levels told of their lower usage (then its key let go), and a
    /// parent found retired settled too.
    fn settle_promoted(parent: &K, (slot, child): (usize, Option<K>)) {
        if let Some(child) = child {
            child.counter().settle();
        }
        if slot == usize::MAX {
            parent.counter().settle();
        }
    }

    /// Charge `n` units to `key`, which holds no slot on CPU `cpu` and
    /// finds its window full (the admission filter would decide), through
    /// its parent's slot there: units charged at the parent and every
    /// level above it, so that only `key`'s own level needs the charge
    /// (its limit checked as by any charge). The parent's slot gives
    /// them — a hit, lock-free —, or refills (a batch charged from the
    /// parent up) when short; a parent without a slot takes over the slot
    /// of its nearest descendant there (`Stock::promote`, under the
    /// lock): siblings left out then share their parent's slot instead of
    /// evicting each other. `Some(crossed)` if charged (`crossed`: a level
    /// crossed its `high`); `None` if `key` has a free slot or no parent,
    /// the parent has no units here and no descendant's slot to take, the
    /// parent refuses a refill, or `key`'s own limit refuses (the units go
    /// back to the parent): the caller goes on as before.
    ///
    /// For a key its caller found no slot for (its own rseq look missed):
    /// with a window of the whole block, "full" is the block's count of
    /// slots in use, which does not look for `key` itself. A key given a
    /// slot since (by another thread of its CPU) is still charged right —
    /// its own level, limit-checked; the units charged above it already —
    /// only from its parent's slot rather than its own; a promotion, under
    /// the lock, first checks that `key` holds no slot, so a key never
    /// loses its own slot to its parent here.
    pub fn charge_through_parent(&self, cpu: usize, key: &K, n: u64) -> Option<bool> {
        let parent = key.parent_key().filter(|_| K::MOVABLE)?;
        if !self.window_full(cpu, key) {
            return None;
        }
        let mut crossed = false;
        match self.take_if_held(|| cpu, parent, n) {
            (Consumed::Hit, _) => {}
            // Held by another thread of this CPU: go on as before.
            (Consumed::Busy, _) => return None,
            (_, refill) if refill >= n => {
                crossed = parent.counter().try_charge_refill(refill).ok()?;
                let _ = self
                    .stash_surplus(|| cpu, parent, refill - n, refill)
                    .uncharge();
            }
            _ => {
                let locked = self.try_lock_here(cpu)?;
                let b = locked.block;
                // A key given a slot since its miss (by another thread of
                // this CPU) keeps it: never handed to its parent here.
                let raw = key.as_raw();
                if b.find(self.window(raw), raw).is_some() {
                    return None;
                }
                let (j, child) = self.promote(b, parent)?;
                let taken = j != usize::MAX && b.units(j) >= n;
                if taken {
                    b.set_units(j, b.units(j) - n);
                }
                drop(locked);
                Self::settle_promoted(parent, (j, child));
                if !taken {
                    return None;
                }
            }
        }
        match key.counter().try_charge_own(n) {
            Ok(own) => Some(crossed || own),
            Err(_) => {
                self.return_to_parent(cpu, parent, n);
                None
            }
        }
    }

    /// Return `n` units of `key`, which holds no slot on CPU `cpu` and
    /// finds its window full (the inverse of
    /// [`Stock::charge_through_parent`]): `key`'s own level loses them
    /// (clamped at its usage, an underflow counted, as by any uncharge),
    /// and they go on as units of its parent ([`Stock::return_to_parent`]).
    /// A key without a parent, or whose units do not move
    /// ([`StockKey::MOVABLE`]), is uncharged directly.
    pub fn return_left_out(&self, cpu: usize, key: &K, n: u64) {
        match key.parent_key() {
            Some(parent) if K::MOVABLE => {
                let removed = key.counter().sub_levels(1, n, true);
                if removed > 0 {
                    self.return_to_parent(cpu, parent, removed);
                }
            }
            _ => key.return_units_kept(n),
        }
    }

    /// Return `n` units charged at `parent` and every level above it and at
    /// none below (what a child gave back): into `parent`'s slot on this
    /// CPU (the rseq hit, lock-free), else under the lock — into its slot
    /// (one it overflows drains to half its quota, as any return), or the
    /// slot of its nearest descendant there, handed to it
    /// (`Stock::promote`); else to the counters from `parent` up (a
    /// parent gets no slot through the admission filter here: its children
    /// would then compete with it for their slots).
    pub fn return_to_parent(&self, cpu: usize, parent: &K, n: u64) {
        if self.stash_hit(parent, n, parent.counter().usage().min(self.batch)) {
            return;
        }
        let Some(locked) = self.try_lock_here(cpu) else {
            parent.return_units_kept(n);
            return;
        };
        // The parent's own slot, or a descendant's handed to it.
        let Some(promoted) = self.promote(locked.block, parent) else {
            drop(locked);
            parent.return_units_kept(n);
            return;
        };
        let mut left = Leftovers::default();
        let how = Stashed::Returned { admitted: false };
        self.stash_locked(&locked, parent, n, how, &mut left);
        drop(locked);
        Self::settle_promoted(parent, promoted);
        let _ = left.uncharge();
    }

    /// The locked half of [`Stock::give_back_after_miss`], once the block
    /// admitted the key (`admitted`: it has no slot yet and this miss
    /// earned it one) or has a slot for it.
    fn give_back_admitted(&self, cpu: usize, key: &K, n: u64, admitted: bool) -> Leftovers<K> {
        let mut left = Leftovers::default();
        let Some(locked) = self.try_lock_here(cpu) else {
            left.push(key.clone(), n);
            return left;
        };
        let b = locked.block;
        let held = b
            .find(self.window(key.as_raw()), key.as_raw())
            .map_or(0, |i| b.units(i));
        // Relaxed: a bound check. Correct callers always pass it (usage
        // ≥ their own units + every stocked unit); concurrent charges
        // only raise the usage, and concurrent uncharges and drains on
        // other CPUs lower it by units that were not this caller's.
        let free = key.counter().usage().saturating_sub(held);
        if free < n {
            key.counter().record_underflow();
            left.push(key.clone(), free);
        } else {
            self.stash_locked(&locked, key, n, Stashed::Returned { admitted }, &mut left);
        }
        left
    }

    /// Take every slot of CPU `cpu` that holds units and whose counter
    /// satisfies `which`. The block is locked without the fence first, to
    /// look at its keys; only when a slot is to be taken is the CPU fenced
    /// (rseq mode) — a CPU that stocks nothing of interest is never
    /// interrupted. The taken keys and units are returned (to be given
    /// back outside the lock).
    fn take_matching(
        &self,
        cpu: usize,
        which: &dyn Fn(&UsageCounter) -> bool,
    ) -> [Option<(K, u64)>; MAX_STOCK_SLOTS] {
        let mut taken: [Option<(K, u64)>; MAX_STOCK_SLOTS] = std::array::from_fn(|_| None);
        let (mut locked, mut fenced) = self.lock_unfenced(cpu);
        let b = locked.block;
        for (i, taken) in taken.iter_mut().enumerate().take(self.slots) {
            let raw = b.key(i);
            if raw == 0 {
                continue;
            }
            // SAFETY: under the lock the slot keeps its key alive; borrowed
            // (`ManuallyDrop`), not owned.
            let k = std::mem::ManuallyDrop::new(unsafe { K::from_raw(raw) });
            // Units may still move before the fence: a slot seen empty is
            // one that a sequence fills after this look (as if it came
            // after the drain) — unless its counter is retired, whose key
            // must go (a sequence would add to its slot without looking at
            // the flag).
            if !which(k.counter()) || (b.units(i) == 0 && !k.counter().is_retired()) {
                continue;
            }
            if !fenced {
                self.fence(&mut locked, cpu);
                fenced = true;
            }
            *taken = Some(Self::clear_slot(b, i));
        }
        drop(locked);
        taken
    }

    /// Take slot `i`'s units (of a locked block, `units` of them) off its
    /// key's counter, leaving the rest of the uncharge to `finish_return`
    /// after the lock: a drain that finds the slot emptied (by the key
    /// word or the block's count of keys, without the lock) sees its units
    /// gone from the counters.
    fn untell(b: &Block, i: usize, units: u64) {
        if units == 0 {
            return;
        }
        // SAFETY: under the lock the slot keeps its key alive; borrowed
        // (`ManuallyDrop`), not owned.
        let k = std::mem::ManuallyDrop::new(unsafe { K::from_raw(b.key(i)) });
        k.counter().uncharge_untold(units);
    }

    /// Empty slot `i` of a locked (and fenced) block: its key and units,
    /// the units already off the key's counter (to be finished with
    /// `finish_return` once the lock is released).
    fn clear_slot(b: &Block, i: usize) -> (K, u64) {
        let units = b.units(i);
        Self::untell(b, i, units);
        let raw = Self::forget_slot(b, i);
        // SAFETY: the slot owned the word; taken out once.
        let key = unsafe { K::from_raw(raw) };
        key.counter().note_stock_slot(false);
        (key, units)
    }

    /// Empty slot `i` of a locked block: its key and units (the key dropped
    /// by the caller, outside the lock).
    fn take_slot(&self, locked: Locked<'_>, i: usize) -> (K, u64) {
        let taken = Self::clear_slot(locked.block, i);
        drop(locked);
        taken
    }

    /// Drain (uncharge) every CPU's slots whose counter satisfies `which`;
    /// returns the units drained. Waits for each CPU's lock in turn (never
    /// for another drain; in rseq mode, fencing each CPU's sequences);
    /// uncharges, and drops each slot's key, outside the lock; allocates
    /// nothing — the allocator integration drains from inside
    /// `GlobalAlloc::alloc`.
    ///
    /// Every unit stocked for a matching counter when the call starts is
    /// off the counters by the time it ends, unless a thread re-stocked it
    /// since — also the units another drain, running at the same time,
    /// took out first (a drain takes units off the counters before it
    /// releases the block's lock).
    ///
    /// What it costs the other CPUs: a block without a key is skipped
    /// after a plain look at its key words; a block with keys is locked
    /// (a compare-and-swap on its line) and its keys looked at; only a
    /// block that holds units of a matching counter is fenced (rseq mode:
    /// an interrupt of that CPU) and emptied of them. [`Stock::activity`]
    /// counts all three.
    pub fn drain_all(&self, which: &dyn Fn(&UsageCounter) -> bool) -> u64 {
        self.activity.drains.fetch_add(1, Relaxed);
        // SeqCst: the look at each block's key words below is made without
        // its lock; for a counter retired before this call, it pairs with
        // the fence of `stash_locked` (as in `drain_key`): a stash either
        // stored its key before our look or sees the counter retired.
        crate::sync::fence(SeqCst);
        let mut drained = 0;
        for cpu in 0..self.cpus.len() {
            // Relaxed: a hint; a key stored after this look is one stocked
            // after the drain passed this CPU.
            let b = self.block(cpu);
            if b.used_unlocked() == 0 {
                continue;
            }
            for (k, units) in self.take_matching(cpu, which).into_iter().flatten() {
                finish_return(k, units);
                drained += units;
            }
        }
        drained
    }

    /// [`Stock::drain_all`] for one key, known by its word
    /// ([`StockKey::as_raw`]): each block's key words are compared without
    /// its lock, and only a block holding the key is locked (and fenced) —
    /// a group's removal pays for the CPUs that stock it, not for every CPU.
    ///
    /// For a retired counter (`UsageCounter::retire`, before this call) no
    /// unit escapes: a thread that stocks the key concurrently either
    /// stores its word before our look, or sees the counter retired after
    /// storing it and takes it back (`stash_locked`; both sides fence).
    pub fn drain_key(&self, raw: usize) -> u64 {
        // SeqCst: pairs with the fence of `stash_locked` (see above).
        crate::sync::fence(SeqCst);
        let mut drained = 0;
        for cpu in 0..self.cpus.len() {
            // Comparing words only; the lock re-checks.
            if self
                .block(cpu)
                .find_unlocked(self.window(raw), raw)
                .is_none()
            {
                continue;
            }
            let locked = self.lock_remote(cpu);
            if let Some(i) = locked.block.find(self.window(raw), raw) {
                let (k, units) = self.take_slot(locked, i);
                finish_return(k, units);
                drained += units;
            }
        }
        drained
    }

    /// Units stocked on CPU `cpu` for every key: at most the budget
    /// ([`Stock::budget`]). Waits for the CPU's lock; for tests and reports.
    pub fn stocked_on(&self, cpu: usize) -> u64 {
        let (locked, _) = self.lock_unfenced(cpu);
        let b = locked.block;
        (0..self.slots).map(|i| b.units(i)).sum()
    }

    /// Units stocked for `counter` on every CPU (waits for each lock; for
    /// tests and reports).
    pub fn stocked(&self, counter: &UsageCounter) -> u64 {
        self.stocked_where(&|c| std::ptr::eq(c, counter))
    }

    /// Units stocked for `counter` or any counter below it, on every CPU:
    /// the part of `counter`'s usage that sits in stocks.
    pub fn stocked_within(&self, counter: &UsageCounter) -> u64 {
        self.stocked_where(&|c| c.is_within(counter))
    }

    fn stocked_where(&self, which: &dyn Fn(&UsageCounter) -> bool) -> u64 {
        (0..self.cpus.len())
            .map(|cpu| {
                // Reading needs no fence: the keys are stable under the
                // lock, and a unit count a sequence changes meanwhile is as
                // good as the count just before or after it.
                let (locked, _) = self.lock_unfenced(cpu);
                let b = locked.block;
                (0..self.slots)
                    .filter(|&i| {
                        let raw = b.key(i);
                        // SAFETY: under the lock the slot keeps its key
                        // alive; borrowed, not owned.
                        raw != 0 && {
                            let k = std::mem::ManuallyDrop::new(unsafe { K::from_raw(raw) });
                            which(k.counter())
                        }
                    })
                    .map(|i| b.units(i))
                    .sum::<u64>()
            })
            .sum()
    }
}

/// The mode of a stock for this machine's `cpus` CPUs.
fn host_mode(cpus: usize) -> Mode {
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    {
        use crate::percpu::{default_add_path, rseq_available, AddPath, SlotIndex};
        let dense = crate::cpu::Topology::host().cpus() == cpus;
        // The arenas' reading of `SPLITCOUNT_PERCPU_ADD`, not one of its
        // own: a second reader (untrimmed) put the arenas on atomics and the
        // stock on rseq for a padded value.
        if dense && rseq_available(SlotIndex::CpuId) && default_add_path() != AddPath::Atomic {
            if let Some(offset) = crate::cpu::glibc_fs_offset() {
                if stock_rseq::fence_available() {
                    return Mode::Rseq { offset };
                }
            }
        }
    }
    let _ = cpus;
    Mode::Locks { on_host: true }
}

impl<K: StockKey> Drop for Stock<K> {
    fn drop(&mut self) {
        #[cfg(all(unix, not(loom)))]
        fork::unregister(&self.cpus);
        for b in self.cpus.iter() {
            for i in 0..MAX_STOCK_SLOTS {
                // No one else holds the stock any more.
                let raw = b.key(i);
                if raw != 0 {
                    // SAFETY: the slot owned the word; dropped once.
                    let key = unsafe { K::from_raw(raw) };
                    key.counter().note_stock_slot(false);
                }
            }
        }
    }
}

/// Every live stock's blocks, so that `fork` can quiesce them.
#[cfg(all(unix, not(loom)))]
mod fork {
    use super::Block;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Once;

    /// A registered run of blocks: address of the first, count, stride.
    /// Each block starts with its lock word (`Block` is `repr(C)`).
    type Run = (usize, usize, usize);

    /// The registry, guarded by a spin lock of our own: the prepare handler
    /// keeps it locked across the fork, and the handlers in parent and
    /// child release it (a `Mutex` guard cannot be carried from one
    /// handler to the other).
    struct Registry {
        locked: AtomicBool,
        runs: std::cell::UnsafeCell<Vec<Run>>,
    }

    // SAFETY: `runs` is only accessed while `locked` is held.
    unsafe impl Sync for Registry {}

    static REGISTRY: Registry = Registry {
        locked: AtomicBool::new(false),
        runs: std::cell::UnsafeCell::new(Vec::new()),
    };

    fn lock() {
        // Acquire/Release: the flag guards `runs`.
        while REGISTRY
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
    }

    fn unlock() {
        REGISTRY.locked.store(false, Ordering::Release);
    }

    /// Run `f` on the registered runs, with the registry locked.
    fn with_runs<R>(f: impl FnOnce(&mut Vec<Run>) -> R) -> R {
        lock();
        // SAFETY: the registry lock is held.
        let r = f(unsafe { &mut *REGISTRY.runs.get() });
        unlock();
        r
    }

    fn run_of(blocks: &[Block]) -> Run {
        (
            blocks.as_ptr() as usize,
            blocks.len(),
            std::mem::size_of::<Block>(),
        )
    }

    pub(super) fn register(blocks: &[Block]) {
        static HANDLERS: Once = Once::new();
        HANDLERS.call_once(|| {
            // SAFETY: the handlers are `extern "C"` functions without
            // arguments that never unwind.
            unsafe { libc::pthread_atfork(Some(prepare), Some(release), Some(release)) };
        });
        let run = run_of(blocks);
        with_runs(|r| r.push(run));
    }

    pub(super) fn unregister(blocks: &[Block]) {
        let run = run_of(blocks);
        with_runs(|r| r.retain(|&e| e != run));
    }

    fn each_lock(f: impl Fn(&AtomicU32)) {
        // SAFETY: called with the registry lock held (between `prepare`
        // and `release`); every registered run belongs to a live stock
        // (unregistered in `Drop` before it is freed, which needs this
        // lock); each block begins with its lock word.
        for &(base, len, stride) in unsafe { &*REGISTRY.runs.get() }.iter() {
            for i in 0..len {
                f(unsafe { &*((base + i * stride) as *const AtomicU32) });
            }
        }
    }

    /// Before `fork`: hold the registry (no stock comes or goes) and every
    /// block lock (no block is mid-update). Each critical section is a few
    /// instructions, so this waits very little.
    extern "C" fn prepare() {
        lock();
        each_lock(|l| {
            // Acquire: the holder's slot changes are complete. The word
            // is 0 or 2 when free (2: sealed, see `Stock::seal`), with
            // bit 0 set while held.
            loop {
                let free = l.load(Ordering::Relaxed) & !1;
                if l.compare_exchange_weak(free, free | 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    break;
                }
                std::thread::yield_now();
            }
        });
    }

    /// After `fork`, in the parent and in the child (whose only thread is
    /// this one): release what `prepare` took (keeping the sealed bit).
    extern "C" fn release() {
        each_lock(|l| {
            l.fetch_and(!1, Ordering::Release);
        });
        unlock();
    }
}

impl<K: StockKey> std::fmt::Debug for Stock<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stock")
            .field("cpus", &self.cpus.len())
            .field("slots", &self.slots)
            .field("batch", &self.batch)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bad_shapes_are_refused_with_the_valid_range() {
        assert_eq!(
            Stock::<Arc<UsageCounter>>::new(0, 7, 64).err(),
            Some(StockError::NoCpus)
        );
        assert_eq!(
            Stock::<Arc<UsageCounter>>::new(2, 0, 64).err(),
            Some(StockError::Slots(0))
        );
        assert_eq!(
            Stock::<Arc<UsageCounter>>::new(2, 64, 64).err(),
            Some(StockError::Slots(64))
        );
        let e = Stock::<Arc<UsageCounter>>::new(2, 7, 64)
            .and_then(|s| s.with_budget(0))
            .err()
            .unwrap();
        assert_eq!(e, StockError::Budget(0));
        assert!(e.to_string().contains("at least 1 unit"), "{e}");
        assert_eq!(
            Stock::<Arc<UsageCounter>>::new(2, 7, 0).err(),
            Some(StockError::Batch(0))
        );
        let e = Stock::<Arc<UsageCounter>>::new(2, 7, 1 << 33)
            .err()
            .unwrap();
        assert_eq!(e, StockError::Batch(1 << 33));
        assert!(e.to_string().contains("between 1 and 4294967295"), "{e}");
    }

    #[test]
    fn the_per_cpu_block_is_1_kib_of_16_byte_slots() {
        assert_eq!(std::mem::size_of::<Block>(), 1024);
        assert_eq!(std::mem::align_of::<Block>(), 128);
        assert_eq!(std::mem::size_of::<Slot>(), 16);
    }

    #[test]
    fn every_window_lies_within_the_slots_and_holds_at_least_window_of_them() {
        for slots in 1..=MAX_STOCK_SLOTS {
            let s = Stock::<Arc<UsageCounter>>::new(1, slots, 64).unwrap();
            let mut starts = std::collections::BTreeSet::new();
            for i in 0..4096usize {
                let (start, end) = s.window(i.wrapping_mul(0x1_0000_0080) | 0x80);
                assert!(end <= slots && end - start >= WINDOW.min(slots), "{slots}");
                starts.insert(start);
            }
            if slots > WINDOW {
                // Every start is used: the hash spreads the keys.
                assert_eq!(starts.len(), 1 << (slots - WINDOW + 1).ilog2(), "{slots}");
            }
        }
    }

    #[test]
    fn a_hit_takes_units_and_a_miss_leaves_them() {
        let s = Stock::<Arc<UsageCounter>>::new(2, 7, 64).unwrap();
        let c = UsageCounter::root();
        c.charge(64);
        assert!(s.stash(0, &c, 60).uncharge() == 0);
        assert_eq!(s.consume(0, &c, 50), Consumed::Hit);
        assert_eq!(s.consume(0, &c, 11), Consumed::Miss, "only 10 left");
        assert_eq!(s.consume(1, &c, 1), Consumed::Miss, "another CPU's stock");
        assert_eq!(s.stocked(&c), 10);
    }

    #[test]
    fn a_slot_above_the_batch_returns_its_excess() {
        let s = Stock::<Arc<UsageCounter>>::new(1, 7, 64).unwrap();
        let c = UsageCounter::root();
        c.charge(100);
        assert_eq!(s.stash(0, &c, 100).uncharge(), 36);
        assert_eq!(c.usage(), 64);
        assert_eq!(s.stocked(&c), 64);
    }

    #[test]
    fn a_full_stock_evicts_round_robin() {
        let s = Stock::<Arc<UsageCounter>>::new(1, 2, 64).unwrap();
        let (a, b, x) = (
            UsageCounter::root(),
            UsageCounter::root(),
            UsageCounter::root(),
        );
        for c in [&a, &b, &x] {
            c.charge(10);
        }
        assert_eq!(s.stash(0, &a, 10).uncharge(), 0);
        assert_eq!(s.stash(0, &b, 10).uncharge(), 0);
        assert_eq!(s.stash(0, &x, 10).uncharge(), 10, "a was evicted");
        assert_eq!((a.usage(), b.usage(), x.usage()), (0, 10, 10));
        assert_eq!(s.stocked(&a), 0);
    }

    #[test]
    fn a_grant_short_of_budget_takes_the_units_above_the_share_back() {
        // Budget 128: a and b hold a batch each; c's stash finds the budget
        // spent and the quotas at the units they hold, so 22 of a's units
        // (above the share of 128 / 3 = 42) come back for it.
        let s = Stock::<Arc<UsageCounter>>::new(1, 7, 64)
            .unwrap()
            .with_budget(128)
            .unwrap();
        let (a, b, c) = (
            UsageCounter::root(),
            UsageCounter::root(),
            UsageCounter::root(),
        );
        for k in [&a, &b] {
            k.charge(64);
            assert_eq!(s.stash(0, k, 64).uncharge(), 0);
        }
        c.charge(10);
        assert_eq!(
            s.stash(0, &c, 10).uncharge(),
            22,
            "a's units above the share"
        );
        assert_eq!((a.usage(), s.stocked(&a)), (42, 42));
        assert_eq!((b.usage(), s.stocked(&b)), (64, 64));
        assert_eq!((c.usage(), s.stocked(&c)), (10, 10));
        assert!(s.stocked_on(0) <= 128);
        // a spends its units; d's stash is short again, and lowering a's
        // quota (now above its units) to the share of 128 / 4 frees enough:
        // no units move.
        assert_eq!(s.consume(0, &a, 42), Consumed::Hit);
        let d = UsageCounter::root();
        d.charge(20);
        assert_eq!(s.stash(0, &d, 20).uncharge(), 0, "no units taken back");
        assert_eq!((s.stocked(&b), s.stocked(&d)), (64, 20));
    }

    #[test]
    fn a_busy_stock_is_bypassed_never_waited_for() {
        let s = Stock::<Arc<UsageCounter>>::new(1, 7, 64).unwrap();
        let c = UsageCounter::root();
        assert_eq!(s.block(0).try_lock(), Some(0));
        assert_eq!(s.consume(0, &c, 1), Consumed::Busy);
        c.charge(5);
        assert_eq!(s.stash(0, &c, 5).uncharge(), 5, "everything comes back");
        s.block(0).unlock(0);
        assert_eq!(c.usage(), 0);
    }

    #[test]
    fn drain_all_empties_only_the_chosen_counters() {
        let s = Stock::<Arc<UsageCounter>>::new(3, 7, 64).unwrap();
        let (a, b) = (UsageCounter::root(), UsageCounter::root());
        for cpu in 0..3 {
            a.charge(20);
            b.charge(20);
            let _ = s.stash(cpu, &a, 20).uncharge();
            let _ = s.stash(cpu, &b, 20).uncharge();
        }
        assert_eq!(s.drain_all(&|c| std::ptr::eq(c, &*a)), 60);
        assert_eq!((a.usage(), b.usage()), (0, 60));
        assert_eq!(s.stocked(&b), 60);
    }
}

#[cfg(all(test, not(loom), target_os = "linux", target_arch = "x86_64"))]
mod host_tests {
    use super::*;

    #[test]
    fn on_this_host_hits_are_critical_sections_where_the_platform_allows() {
        let cpus = crate::cpu::Topology::host().cpus();
        let s = Stock::<Arc<UsageCounter>>::for_host(cpus, 7, 64).unwrap();
        eprintln!("uses_rseq = {}", s.uses_rseq());
        let c = UsageCounter::root();
        c.charge(64);
        assert_eq!(s.stash(0, &c, 64).uncharge(), 0);
        assert_eq!(s.consume(0, &c, 10), Consumed::Hit);
        assert_eq!(s.stocked(&c), 54);
        assert_eq!(s.drain_all(&|_| true), 54);
        assert_eq!(c.usage(), 10);
    }
}
