//! [`Accounted`]: the `GlobalAlloc` wrapper.

#![allow(unsafe_code)]

use super::charging::{Charging, Requested};
use super::reconcile::Reconciliation;
use super::reserve::{drain_thread, flush_headers};
use super::scope::{in_hook, without_accounting};
use super::thread::{arm_exit_guard, ThreadState, STATE};
use crate::charge::{Consumed, StockError, UsageCounter, MAX_REQUEST, MAX_STOCK_SLOTS};
use crate::cpu::{self, Machine};
use crate::group::{AccountKey, Bytes, Group, Hierarchy, Refusal};
use std::alloc::{GlobalAlloc, Layout};
use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{
    AtomicPtr,
    Ordering::{AcqRel, Acquire},
};
use std::sync::Arc;

/// Bytes a stock miss charges at once to a group's usage counter.
pub const BYTE_BATCH: u64 = 64 << 10;

/// The most bytes one CPU's byte stock holds, whatever the number of
/// accounts it serves (7 batches: 448 KiB). With more accounts on a CPU
/// than that has batches for, each gets a share of it.
pub const BYTE_BUDGET: u64 = crate::charge::DEFAULT_BUDGET_BATCHES * BYTE_BATCH;

/// What a thread may still allocate after a refusal, where it would be
/// refused again — in allocations of at most
/// [`REPORTING_GRACE_ALLOCATION`] bytes, charged past the limit — until a
/// charge succeeds or its scope ends: enough for the error to be formatted
/// and printed (the caller's report, a panic message), never enough for a
/// retried large allocation to get through a hard limit. It is also the
/// most a refusing limit is ever passed by this way, however often it
/// refuses and however many threads it refuses: a grace's allocation that
/// would take a limit more than this above its `max` is refused.
pub const REPORTING_GRACE: u64 = 1 << 20;

/// The largest allocation the reporting grace lets through.
pub const REPORTING_GRACE_ALLOCATION: u64 = 64 << 10;

/// The alignment up to which a block's tag is a header in front of it.
const MIN_HEADER: usize = std::mem::size_of::<*const u8>();

/// Bytes every block carries besides the caller's: its *tag*, the address
/// of the account its bytes were charged to (null: none). For an alignment
/// of at most 8 the tag is a header, the 8 bytes in front of the user
/// pointer; for a larger one it trails the caller's bytes (at the size
/// rounded up to 8), so that the block keeps the alignment without a whole
/// alignment unit in front — see [`front`] and [`tag_slot`].
pub(super) const TAG: usize = std::mem::size_of::<*const u8>();

thread_local! {
    static LAST_REFUSAL: RefCell<Option<Refusal>> = const { RefCell::new(None) };
}

/// The last allocation refused on this thread, if any (cleared by reading).
pub fn take_last_refusal() -> Option<Refusal> {
    LAST_REFUSAL
        .try_with(|r| r.borrow_mut().take())
        .ok()
        .flatten()
}

/// What `attach` sets up.
struct Attached {
    hierarchy: Hierarchy,
    root: AccountKey,
    machine: Machine,
}

impl Attached {
    fn bytes(&self) -> &Bytes {
        self.hierarchy
            .shared()
            .bytes
            .get()
            .expect("set by attach before publishing")
    }
}

/// Why `attach` failed.
///
/// ```
/// use splitcount::{Accounted, AttachError, Hierarchy};
/// use std::alloc::System;
///
/// static ALLOC: Accounted<System> = Accounted::new(System); // not the global one here
/// let (one, two) = (Hierarchy::default(), Hierarchy::default());
/// ALLOC.attach(&one).unwrap();
/// ALLOC.attach(&one).unwrap();                    // the same hierarchy again: fine
/// assert!(matches!(ALLOC.attach(&two), Err(AttachError::AlreadyAttached)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttachError {
    /// This allocator is attached to another hierarchy already, or the
    /// hierarchy to another allocator.
    AlreadyAttached,
    /// The byte stock could not be built for the hierarchy's machine.
    Stock(StockError),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::AlreadyAttached => f.write_str(
                "this allocator (or this hierarchy) is attached to another one already: one hierarchy per allocator per process",
            ),
            AttachError::Stock(e) => write!(f, "cannot build the allocator's byte stock: {e}"),
        }
    }
}

impl std::error::Error for AttachError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AttachError::Stock(e) => Some(e),
            AttachError::AlreadyAttached => None,
        }
    }
}

/// A `GlobalAlloc` that charges every allocation to the current thread's
/// group. See the module docs of [`crate::alloc`].
///
/// What an allocation charges is the second type parameter, `C`, fixed
/// with the type (so a block's free always uncharges what its allocation
/// charged):
///
/// - [`Requested`] (the default, `Accounted<A>`): the size the caller
///   asked for. `usage()` is the sum of the live blocks' requested sizes
///   (plus the stock and reserve slack); the header and the inner
///   allocator's rounding are not counted.
/// - [`Footprint`](super::Footprint) (`Accounted<A, Footprint>`, for an
///   inner allocator that implements [`InnerFootprint`](super::InnerFootprint)):
///   what the block really occupies, header and rounding included — on
///   glibc, `malloc_usable_size` of the block + 8 (its chunk). `usage()` is
///   the sum of the live blocks' footprints (plus the same slack).
///
/// ```
/// use splitcount::alloc::{Accounted, Footprint};
/// use std::alloc::System;
///
/// static REQUESTED: Accounted<System> = Accounted::new(System);
/// static FOOTPRINT: Accounted<System, Footprint> = Accounted::with_charging(System, Footprint);
/// ```
///
/// **After a refusal** a thread gets the [`REPORTING_GRACE`] by default
/// (its small allocations that would be refused again pass, charged past
/// the limit, up to 1 MiB — and never more than 1 MiB above any limit —,
/// so that a Rust program can format and print the refusal), and a
/// panicking thread's allocations that a limit would refuse pass,
/// unaccounted. (The others are charged as usual: with `RUST_BACKTRACE`
/// set, std's cache of symbols — tens of MB, kept for the life of the
/// process — is charged to the group whose code panicked first, and stays
/// with its ancestors once that group is removed; print backtraces outside
/// any group, or resolve them once at start-up, to keep it off a tenant.)
/// [`Accounted::without_reporting_grace`] turns both off, for callers that
/// are told of a refusal by a null and handle it — C programs
/// (`splitcount-preload` uses it).
pub struct Accounted<A, C = Requested> {
    pub(super) inner: A,
    state: AtomicPtr<Attached>,
    /// Whether a refusal grants the reporting grace (and a panicking
    /// thread passes): fixed at construction.
    pub(super) reporting_grace: bool,
    charging: PhantomData<fn() -> C>,
}

impl<A> Accounted<A> {
    /// Wrap `inner`, charging requested sizes ([`Requested`]). Until
    /// [`Accounted::attach`], allocations pass through unaccounted (they
    /// still carry the header, so they can be freed after).
    pub const fn new(inner: A) -> Accounted<A> {
        Accounted::with_charging(inner, Requested)
    }
}

impl<A, C: Charging> Accounted<A, C> {
    /// Wrap `inner`, charging what `charging` says: [`Requested`] (as
    /// [`Accounted::new`]) or [`Footprint`](super::Footprint). Until
    /// [`Accounted::attach`], allocations pass through unaccounted.
    pub const fn with_charging(inner: A, _charging: C) -> Accounted<A, C> {
        Accounted {
            inner,
            state: AtomicPtr::new(std::ptr::null_mut()),
            reporting_grace: true,
            charging: PhantomData,
        }
    }

    /// The same allocator with **strict limits**: past a refusing limit
    /// (or a ceiling) every allocation is refused — null — until usage
    /// falls, however the caller reacts. No [`REPORTING_GRACE`] after a
    /// refusal, and no pass for a panicking thread: nothing is ever handed
    /// out unaccounted because a limit was reached.
    ///
    /// For callers that are told of a refusal by a null and handle it: a C
    /// program under `splitcount-preload` (`malloc` returns NULL with
    /// `errno = ENOMEM`, which C code is written to check). A Rust program
    /// aborts on a null from an ordinary allocation, and without the grace
    /// it cannot even format the refusal (a `format!` or a panic message
    /// allocates, and is refused too): keep the default there.
    ///
    /// ```
    /// use splitcount::alloc::Accounted;
    /// use std::alloc::System;
    ///
    /// static STRICT: Accounted<System> = Accounted::new(System).without_reporting_grace();
    /// assert!(!STRICT.has_reporting_grace());
    /// assert!(Accounted::new(System).has_reporting_grace()); // the default
    /// ```
    pub const fn without_reporting_grace(mut self) -> Accounted<A, C> {
        self.reporting_grace = false;
        self
    }

    /// Whether a refusal grants the thread the [`REPORTING_GRACE`] (the
    /// default), or limits are strict
    /// ([`Accounted::without_reporting_grace`]).
    pub const fn has_reporting_grace(&self) -> bool {
        self.reporting_grace
    }

    /// Start accounting into `hierarchy` (threads outside any scope charge
    /// its root; usage counters then count bytes). An allocator accounts
    /// into one hierarchy for the life of the process, and a hierarchy has
    /// at most one allocator: attaching again to the *same* hierarchy is
    /// `Ok` and changes nothing; another hierarchy, or a hierarchy another
    /// allocator has, is refused with [`AttachError::AlreadyAttached`].
    ///
    /// Being idempotent, `attach` can run at the start of every test of a
    /// suite that shares one allocator, racing or not, with the hierarchy
    /// in a `static`:
    ///
    /// ```
    /// use splitcount::alloc::Accounted;
    /// use splitcount::group::Hierarchy;
    /// use std::alloc::System;
    /// use std::sync::OnceLock;
    ///
    /// // #[global_allocator] in a real suite.
    /// static ALLOC: Accounted<System> = Accounted::new(System);
    /// static MEMORY: OnceLock<Hierarchy> = OnceLock::new();
    ///
    /// fn memory() -> &'static Hierarchy {
    ///     let h = MEMORY.get_or_init(Hierarchy::default);
    ///     ALLOC.attach(h).expect("the suite's one hierarchy");
    ///     h
    /// }
    ///
    /// // Each test starts with `memory()` (two tests here):
    /// assert!(memory().counts_bytes());
    /// assert!(memory().counts_bytes());
    /// assert!(ALLOC.attach(&Hierarchy::default()).is_err()); // another one
    /// ```
    pub fn attach(&self, hierarchy: &Hierarchy) -> Result<(), AttachError> {
        // Attaches are rare: one lock for all of them makes "is it this
        // hierarchy?" a plain question, also for racing first attaches (no
        // allocation path takes it).
        static ATTACH: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _serial = ATTACH.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(st) = self.attached() {
            return if Arc::ptr_eq(st.hierarchy.shared(), hierarchy.shared()) {
                Ok(())
            } else {
                Err(AttachError::AlreadyAttached)
            };
        }
        // Everything the charge path touches that initializes lazily (and
        // could allocate) is initialized here, outside the allocator.
        let machine = hierarchy.config().machine.clone();
        let _ = (
            cpu::cpu_id_source(),
            cpu::current_cpu(),
            machine.current_cpu(),
            take_last_refusal(),
        );
        let make = if machine.is_simulated() {
            crate::charge::Stock::new
        } else {
            crate::charge::Stock::for_host
        };
        let stock = make(machine.cpus(), MAX_STOCK_SLOTS, BYTE_BATCH)
            .and_then(|s| s.with_budget(BYTE_BUDGET))
            .map_err(AttachError::Stock)?;
        hierarchy
            .shared()
            .bytes
            .set(Bytes {
                stock,
                drain_thread,
            })
            .map_err(|_| AttachError::AlreadyAttached)?;
        let attached = Box::into_raw(Box::new(Attached {
            root: hierarchy.root().account(),
            hierarchy: hierarchy.clone(),
            machine,
        }));
        // AcqRel: publishes the initialized state to every allocating thread.
        match self
            .state
            .compare_exchange(std::ptr::null_mut(), attached, AcqRel, Acquire)
        {
            Ok(_) => Ok(()),
            Err(_) => {
                // SAFETY: ours, never published.
                drop(unsafe { Box::from_raw(attached) });
                Err(AttachError::AlreadyAttached)
            }
        }
    }

    #[inline]
    fn attached(&self) -> Option<&Attached> {
        // SAFETY: once published, the state is never freed or changed.
        unsafe { self.state.load(Acquire).as_ref() }
    }

    /// Return every stocked byte (the per-CPU byte stock, the hierarchy's
    /// charge stock) and the calling thread's reserve to the groups' usage
    /// counters — the same as the attached hierarchy's
    /// [`Hierarchy::drain_stocks`]. Other threads' reserves (at most
    /// [`super::MAX_THREAD_RESERVE`] bytes each) come back when those threads
    /// call [`drain_thread`], allocate in another group, or exit; once they
    /// have, usage equals live bytes.
    pub fn drain(&self) -> u64 {
        self.attached().map_or(0, |st| st.hierarchy.drain_stocks())
    }

    /// Where the bytes the groups account and the memory the process holds
    /// part ways: the groups' usage, the slack in stocks and reserves, the
    /// headers, what the inner allocator has in use (glibc's `mallinfo2`)
    /// and the resident set (see [`Reconciliation`]). Drains this thread's
    /// reserve first. `None` before `attach`.
    pub fn reconcile(&self) -> Option<Reconciliation> {
        let st = self.attached()?;
        Some(without_accounting(|| {
            drain_thread();
            Reconciliation::measure(&st.hierarchy.root(), C::FOOTPRINT)
        }))
    }

    /// The most that usage can run ahead of live bytes (the allocator's
    /// slack), with `threads` threads allocating: every thread's reserve
    /// full ([`super::MAX_THREAD_RESERVE`]) and every CPU's byte stock at
    /// its budget ([`BYTE_BUDGET`]: `7 ·` [`BYTE_BATCH`], however many
    /// accounts a CPU serves). A refusal drains the stocks first, so a limit
    /// refuses at most `threads · MAX_THREAD_RESERVE` bytes early — the
    /// other threads' reserves of the refusing group's bytes.
    pub fn max_slack(&self, threads: usize) -> u64 {
        let cpus = self
            .attached()
            .map_or_else(|| cpu::Topology::host().cpus(), |st| st.machine.cpus());
        (threads as u64) * super::MAX_THREAD_RESERVE + cpus as u64 * BYTE_BUDGET
    }

    /// Charge `n` bytes to the current account; the account charged (`None`:
    /// nothing was — before `attach`, inside a hook, or in the reporting
    /// grace), or `Err` if refused. Never allocates.
    ///
    /// The fast path is one thread-local structure: this allocator owns the
    /// thread's state, and the reserve holds `n` bytes of the account the
    /// thread charges now (null while a hook runs, after the thread's exit,
    /// before the first slow path: never the reserve's account when it
    /// holds bytes). Then two loads, a compare and a store.
    #[inline(always)]
    pub(super) fn charge(&self, n: u64) -> Result<Option<AccountKey>, ()> {
        // SAFETY: the reserve held bytes for this account, which keep it
        // alive (a null account never holds bytes: null means a miss).
        match unsafe { AccountKey::from_ptr(self.take_reserved(n)) } {
            Some(acc) => Ok(Some(acc)),
            None => self.charge_miss(n),
        }
    }

    /// [`Accounted::charge`]'s hit: take `n` bytes from the thread's
    /// reserve when it holds them for the account the thread charges now.
    /// That account (kept alive by the bytes), or null having changed
    /// nothing.
    #[inline(always)]
    pub(super) fn take_reserved(&self, n: u64) -> *const u8 {
        self.take_reserved_if(n, |_| true)
    }

    /// [`Accounted::take_reserved`] only where `wanted` says yes of the
    /// account (alive while the reserve holds its bytes): otherwise nothing
    /// is taken and null returned, so no bytes are taken to be given back.
    #[inline(always)]
    pub(super) fn take_reserved_if(
        &self,
        n: u64,
        wanted: impl FnOnce(*const u8) -> bool,
    ) -> *const u8 {
        let me = self as *const Self as usize;
        STATE.with(|t| {
            let acc = t.charge.get();
            let bytes = t.reserve.bytes.get();
            if t.owner.get() == me && t.reserve.account.get() == acc && bytes >= n && wanted(acc) {
                t.reserve.bytes.set(bytes - n);
                acc
            } else {
                std::ptr::null()
            }
        })
    }

    /// [`Accounted::charge`] without a reserve hit: resolve what the thread
    /// charges (not attached, in a hook: nothing; this allocator's root or
    /// the scope's account), then the slow path.
    #[cold]
    #[inline(never)]
    pub(super) fn charge_miss(&self, n: u64) -> Result<Option<AccountKey>, ()> {
        let Some(st) = self.attached() else {
            return Ok(None);
        };
        let me = self as *const Self as usize;
        let (acc, hit) = STATE.with(|t| {
            if t.in_hook.get() {
                return (None, false);
            }
            if t.owner.get() != me {
                t.owner.set(me);
                t.root.set(st.root.as_ptr());
                t.refresh();
            }
            arm_exit_guard(t);
            let acc = t.scope_account().unwrap_or(st.root);
            (Some(acc), t.reserve.take(acc, n))
        });
        match acc {
            None => Ok(None),
            Some(acc) if hit => Ok(Some(acc)),
            Some(acc) => self.charge_slow(st, acc, n, true),
        }
    }

    /// The account an allocation on this thread would charge now, without
    /// charging anything: the scope's, else this allocator's root; none
    /// where nothing would be charged (not attached, inside a hook, past
    /// the thread's exit). The charge itself may still pass unaccounted
    /// (the reporting grace) or go to a removed group's nearest live
    /// ancestor. The account is held by the scope (or is the root).
    #[cfg(any(feature = "jemalloc", feature = "mimalloc"))]
    pub(super) fn charging_account(&self) -> Option<AccountKey> {
        let st = self.attached()?;
        STATE
            .try_with(|t| {
                if t.in_hook.get() || t.exiting.get() {
                    None
                } else {
                    Some(t.scope_account().unwrap_or(st.root))
                }
            })
            .ok()
            .flatten()
    }

    /// Charge the growth of a block by `realloc` (`n` bytes) to `key`, the
    /// account in its header — the one its free will uncharge. Inside a
    /// hook the growth is still charged (and may be refused), only without
    /// running hooks again. Whether it was charged.
    ///
    /// Where a new block would pass unaccounted — the reporting grace after
    /// a refusal, a panicking thread — the growth passes too, but charged:
    /// the block's free will uncharge its whole size from `key`, so the
    /// growth is forced onto the counters (past the limit, as the grace
    /// lets a new block past it). Refusing it failed every `Vec` that grew
    /// while a panic printed its message or backtrace: with
    /// `RUST_BACKTRACE=1` the failure hook then waited for the backtrace
    /// lock the panicking thread held, and the process hung.
    pub(super) fn charge_growth(&self, key: AccountKey, n: u64) -> bool {
        let Some(st) = self.attached() else {
            return false;
        };
        if in_hook() {
            return self.charge_bytes(st, key, n).is_ok();
        }
        match self.charge_slow(st, key, n, false) {
            Ok(Some(charged)) => charged == key,
            // Not a size no limit could refuse (a panicking thread's grace
            // has no size bound; forcing 2⁶⁰ bytes would saturate the
            // counters, and the failed growth's uncharge would then clamp
            // every level to zero). No hooks: the thread is reporting.
            Ok(None) if n <= MAX_REQUEST => {
                key.force_charge(n);
                true
            }
            Ok(None) | Err(()) => false,
        }
    }

    /// Charge `n` bytes to `key` that must not be refused: memory the inner
    /// allocator has already handed out (the rounding of a block `realloc`
    /// resized, in [`Footprint`](super::Footprint) charging). From the
    /// thread's reserve or this CPU's byte stock when they hold `key`'s
    /// bytes, else forced onto the usage counters (a limit may be passed by
    /// that much; the pressure hooks run if `high` was crossed).
    pub(super) fn charge_unrefused(&self, key: AccountKey, n: u64) {
        if n == 0 || STATE.try_with(|t| t.reserve.take(key, n)).unwrap_or(false) {
            return;
        }
        let Some(st) = self.attached() else {
            // Not reached: a block names an account only once attached.
            key.force_charge(n);
            return;
        };
        let stock = &st.bytes().stock;
        if stock.consume_with(|| st.machine.current_cpu(), &key, n) == Consumed::Hit {
            return;
        }
        // Inside a hook, as for the growth itself: no hooks again.
        if key.force_charge(n) && !in_hook() {
            self.pressure_from(st, key);
        }
    }

    /// Charge `n` bytes through `acc`: from this CPU's byte stock, or a batch
    /// from the usage counter (surplus stocked), or exactly `n`.
    fn charge_bytes(
        &self,
        st: &Attached,
        acc: AccountKey,
        n: u64,
    ) -> Result<bool, *const UsageCounter> {
        self.charge_bytes_as(st, acc, n, false)
    }

    /// [`Accounted::charge_bytes`] of bytes that are all surplus for now — a
    /// thread reserve's refill: charged from the counter only within `high`
    /// as well as `max` ([`AccountKey::try_charge_refill`]), so that a
    /// reserve nothing uses yet does not cross `high` (32 threads' 16 KiB
    /// reserves took a group to 606,216 bytes over a `high` of 400 KiB
    /// with 256 bytes in use: found in review).
    fn charge_reserve_bytes(
        &self,
        st: &Attached,
        acc: AccountKey,
        n: u64,
    ) -> Result<bool, *const UsageCounter> {
        self.charge_bytes_as(st, acc, n, true)
    }

    fn charge_bytes_as(
        &self,
        st: &Attached,
        acc: AccountKey,
        n: u64,
        surplus: bool,
    ) -> Result<bool, *const UsageCounter> {
        let stock = &st.bytes().stock;
        let cpu = || st.machine.current_cpu();
        let (taken, refill) = stock.take_with(cpu, &acc, n);
        if taken == Consumed::Hit {
            return Ok(false);
        }
        // A batch, or the account's share of this CPU's budget.
        if n < refill {
            if let Ok(crossed) = acc.try_charge_refill(refill) {
                let _ = stock
                    .stash_surplus(cpu, &acc, refill - n, refill)
                    .uncharge();
                return Ok(crossed);
            }
        }
        if surplus {
            return acc
                .try_charge_refill(n)
                .map_err(|r| r as *const UsageCounter);
        }
        acc.try_charge(n).map_err(|r| r as *const UsageCounter)
    }

    /// Return `n` bytes charged through the account `acc` (null: nothing
    /// was charged).
    ///
    /// The fast path is [`uncharge_hit`].
    #[inline(always)]
    pub(super) fn uncharge(&self, acc: *const u8, n: u64) {
        if !uncharge_hit(acc, n) {
            self.uncharge_miss(acc, n);
        }
    }

    /// Uncharge a block's `n` bytes (charged through `acc`), then free it
    /// (`block`, allocated by `inner` with `ext`) — in that order, so that
    /// the free is a tail call and, on a hit, nothing lives across a call:
    /// the hit path saves no registers. The bytes are uncharged a moment
    /// before they are freed; nothing reads the block or the account after.
    ///
    /// # Safety
    /// `block` was allocated by `inner` with `ext` and is not used again.
    #[inline(always)]
    pub(super) unsafe fn uncharge_and_free(
        &self,
        acc: *const u8,
        n: u64,
        block: *mut u8,
        ext: Layout,
        h: usize,
    ) where
        A: GlobalAlloc,
    {
        STATE.with(|t| t.headers.set(t.headers.get() - h as i64));
        if uncharge_hit(acc, n) {
            // SAFETY: forwarded contract.
            unsafe { self.inner.dealloc(block, ext) }
        } else {
            // SAFETY: forwarded contract.
            unsafe { self.uncharge_miss_and_free(acc, n, block, ext) }
        }
    }

    /// [`Accounted::uncharge_and_free`] when the reserve cannot keep the
    /// bytes.
    ///
    /// # Safety
    /// As for [`Accounted::uncharge_and_free`].
    #[cold]
    #[inline(never)]
    unsafe fn uncharge_miss_and_free(&self, acc: *const u8, n: u64, block: *mut u8, ext: Layout)
    where
        A: GlobalAlloc,
    {
        self.uncharge_miss(acc, n);
        // SAFETY: forwarded contract.
        unsafe { self.inner.dealloc(block, ext) }
    }

    /// [`Accounted::uncharge`] when the reserve cannot keep the bytes.
    #[cold]
    #[inline(never)]
    fn uncharge_miss(&self, acc: *const u8, n: u64) {
        // SAFETY: a header holds null or the address of the account its
        // block was charged to, which that block's bytes keep alive.
        let Some(acc) = (unsafe { AccountKey::from_ptr(acc) }) else {
            return;
        };
        let Some(st) = self.attached() else {
            acc.uncharge_bytes(n);
            return;
        };
        match STATE.try_with(|t| t.reserve.give(acc, n)) {
            Ok(Some(0)) => {}
            Ok(Some(excess)) => self.uncharge_shared(st, acc, excess),
            _ => self.uncharge_shared(st, acc, n),
        }
    }

    /// Return bytes through the per-CPU byte stock — or, for a removed
    /// group, straight to its counters, so that its account goes with its
    /// last bytes.
    fn uncharge_shared(&self, st: &Attached, acc: AccountKey, n: u64) {
        if n == 0 {
            return;
        }
        flush_headers();
        if acc.is_removed() {
            acc.uncharge_bytes(n);
            return;
        }
        let stock = &st.bytes().stock;
        if stock.stash_hit(&acc, n, stock.batch()) {
            return;
        }
        let _ = stock
            .stash_returned_after_miss(st.machine.current_cpu(), &acc, n)
            .uncharge();
    }
}

/// The fast path of an uncharge: the block's account `acc` is the
/// reserve's and the `n` bytes fit under
/// [`MAX_THREAD_RESERVE`](super::MAX_THREAD_RESERVE) — one compare and a
/// store in the thread-local state. Whether the reserve took them.
#[inline(always)]
pub(super) fn uncharge_hit(acc: *const u8, n: u64) -> bool {
    STATE.with(|t| uncharge_hit_in(t, acc, n))
}

/// [`uncharge_hit`] on the thread state `t`.
#[inline(always)]
pub(super) fn uncharge_hit_in(t: &ThreadState, acc: *const u8, n: u64) -> bool {
    let bytes = t.reserve.bytes.get() + n;
    let kept =
        !acc.is_null() && t.reserve.account.get() == acc && bytes <= super::MAX_THREAD_RESERVE;
    if kept {
        t.reserve.bytes.set(bytes);
    }
    kept
}

/// The bytes of a block in front of the user pointer, for an alignment:
/// the tag (a header) up to 8, nothing above (the tag trails).
///
/// ```text
///  align ≤ 8:   block ─▶ ┌─────────┬──────────────────────┐
///                        │ tag (8) │ size bytes …         │   user = block + 8
///                        └─────────┴──────────────────────┘
///  align > 8:   block ─▶ ┌──────────────────────┬─────┬─────────┐
///               = user   │ size bytes …         │ pad │ tag (8) │   at round_up(size, 8)
///                        └──────────────────────┴─────┴─────────┘
/// ```
///
/// A header in front of an over-aligned block would have to be a whole
/// alignment unit (so that the user pointer stays aligned): 4 KiB more for
/// a page-aligned block, and an over-aligned size class the block might not
/// need. The trailer costs 8 bytes and the rounding to 8, like the header.
#[inline(always)]
pub(super) fn front(align: usize) -> usize {
    if align <= MIN_HEADER {
        TAG
    } else {
        0
    }
}

/// Where the trailing tag of an over-aligned block of `size` bytes lies,
/// from its start: the size rounded up to the tag's alignment.
#[inline(always)]
fn trailer_offset(size: usize) -> usize {
    // No overflow: `extended` admits only sizes at least 2·align below
    // `isize::MAX`.
    (size + (TAG - 1)) & !(TAG - 1)
}

/// The layout actually requested from the inner allocator: the tag added
/// (in front, or trailing for an alignment above 8), the alignment at
/// least 8. `None` when the total would pass `isize::MAX` once rounded up
/// to the alignment.
#[inline(always)]
pub(super) fn extended(layout: Layout) -> Option<Layout> {
    let align = layout.align().max(MIN_HEADER);
    // The total is at most `size + 8` with a header (alignment 8) and
    // `size + 15` with a trailer (alignment 16 or more), so rounded up to
    // `align` it is at most `size + 2·align − 1`: one comparison rules out every
    // overflow — a sum past `isize::MAX` has its top bit set. (The sum
    // cannot wrap: a layout of non-zero size has `size ≤ isize::MAX −
    // align + 1` and `align ≤ 2^62`, so it is below 2^63 + 2^62. It is an
    // add and a sign test, where a saturating subtraction took five
    // instructions.)
    if layout.size().wrapping_add(2 * align) > isize::MAX as usize {
        return None;
    }
    let total = if layout.align() <= MIN_HEADER {
        layout.size() + TAG
    } else {
        trailer_offset(layout.size()) + TAG
    };
    // SAFETY: `align` is a power of two (a layout's alignment, or 8) and
    // the total rounded up to it is at most `isize::MAX` (checked above).
    Some(unsafe { Layout::from_size_align_unchecked(total, align) })
}

/// `layout` with its alignment raised to the header's, when it is at most
/// that (the common case: every type without an over-aligned field) and
/// the size leaves room for the header; `None` otherwise.
///
/// For such a layout the tag and the inner layout are those of the
/// layout itself — [`front`] and [`extended`] treat every alignment up to
/// `MIN_HEADER` alike — but with the alignment a constant the
/// compiler sees, so the branches on it fold away: ours, and the inner
/// allocator's own (jemalloc's and mimalloc's choice between their plain
/// and aligned entry points). `alloc` and `dealloc` each take this path
/// for the same layouts, so a block is freed with the layout it was
/// allocated with.
#[inline(always)]
pub(super) fn word_aligned(layout: Layout) -> Option<Layout> {
    if layout.align() <= MIN_HEADER && layout.size() <= isize::MAX as usize - 2 * MIN_HEADER {
        // SAFETY: `MIN_HEADER` is a power of two and the size rounded up
        // to it stays below `isize::MAX` (checked above).
        Some(unsafe { Layout::from_size_align_unchecked(layout.size(), MIN_HEADER) })
    } else {
        None
    }
}

/// The layout asked of the inner allocator when a block of `layout` is
/// resized to `new_size`: the tag added, at the same alignment.
/// `None` where [`extended`] refuses the new size: `dealloc` takes
/// `extended` of the block's layout as given, so no block may exist
/// without one (a bound 8 bytes looser passed sizes within 16 of
/// `isize::MAX` to the inner allocator, which no allocator serves).
#[inline]
pub(super) fn resized(layout: Layout, new_size: usize) -> Option<Layout> {
    Layout::from_size_align(new_size, layout.align())
        .ok()
        .and_then(extended)
}

/// The tag of the block at `user`, of `size` bytes at alignment `align`
/// (see [`front`]): the header in front, or the trailer.
///
/// # Safety
/// `user` is a pointer returned by `Accounted` for a block of this size
/// and alignment (for a trailer, the block's current size after a
/// `realloc`); the slot is 8-aligned.
#[inline(always)]
pub(super) unsafe fn tag_slot(user: *mut u8, align: usize, size: usize) -> *mut *const u8 {
    if align <= MIN_HEADER {
        // SAFETY: the header is the 8 bytes just before the user pointer.
        unsafe { (user as *mut *const u8).sub(1) }
    } else {
        // SAFETY: the trailer lies inside the block (`extended`), 8-aligned
        // (the user pointer is aligned to more than 8).
        unsafe { user.add(trailer_offset(size)).cast() }
    }
}

// SAFETY: every method forwards to `inner` with a layout that keeps the
// caller's alignment and adds the tag; the pointer returned is `base +
// front(align)`, which is aligned to `align` and lies inside the block.
//
// `alloc` and `dealloc` are never inlined into their callers (the
// `__rust_alloc` shim, and through it user code): the compiler treats those
// calls as removable allocations, and with this body inlined it elided part
// of an allocation in a release build (the rest of the function became an
// unreachable trap). Their own fast paths are inlined into them.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Accounted<A, Requested> {
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if let Some(word) = word_aligned(layout) {
            // SAFETY: forwarded contract (the same block as for `layout`).
            return unsafe { self.alloc_with(word, |l| self.inner.alloc(l)) };
        }
        // SAFETY: forwarded contract.
        unsafe { self.alloc_over_aligned(layout) }
    }

    #[inline(never)]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if let Some(word) = word_aligned(layout) {
            // SAFETY: forwarded contract (the same block as for `layout`).
            return unsafe { self.alloc_with(word, |l| self.inner.alloc_zeroed(l)) };
        }
        // SAFETY: forwarded contract.
        unsafe { self.alloc_with(layout, |l| self.inner.alloc_zeroed(l)) }
    }

    #[inline(never)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match word_aligned(layout) {
            // SAFETY (both): forwarded contract; `alloc` made the block
            // with the same choice of layout.
            Some(word) => unsafe { self.dealloc_with(ptr, word) },
            None => unsafe { self.dealloc_with(ptr, layout) },
        }
    }

    /// A growth is charged to the block's own account — the group that
    /// allocated it, named in its tag — not to the group whose scope the
    /// call runs in: the tag names one account, which the block's `free`
    /// uncharges whole. (Charging the growth to another group would need
    /// the whole block moved to it: its old size uncharged from the owner,
    /// its new size charged to the caller, the tag rewritten. Not done: a
    /// request growing a buffer made outside it charges the buffer's owner;
    /// see the README.)
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let f = front(layout.align());
        // The new block's layout must be valid before anything is charged.
        let Some(new_ext) = resized(layout, new_size) else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in `dealloc`.
        let acc = unsafe { *tag_slot(ptr, layout.align(), layout.size()) };
        let (old, new) = (layout.size() as u64, new_size as u64);
        // SAFETY: as in `uncharge`.
        if let (true, Some(key)) = (new > old, unsafe { AccountKey::from_ptr(acc) }) {
            if !self.charge_growth(key, new - old) {
                return std::ptr::null_mut();
            }
        }
        let new_total = new_ext.size();
        // SAFETY: as in `dealloc`.
        let ext = unsafe { extended(layout).unwrap_unchecked() };
        // SAFETY: the block was allocated by `inner` with `ext`; a header
        // is copied along with the contents (a trailer is written again).
        let base = unsafe { self.inner.realloc(ptr.wrapping_sub(f), ext, new_total) };
        if base.is_null() {
            if new > old {
                self.uncharge(acc, new - old);
            }
            return std::ptr::null_mut();
        }
        if new < old {
            self.uncharge(acc, old - new);
        }
        // SAFETY: `base` is a block of `new_total` bytes, made for the new
        // size at the same alignment.
        unsafe { moved_tag(base, layout.align(), new_size, acc) }
    }
}

impl<A: GlobalAlloc> Accounted<A> {
    /// `dealloc`'s body, for `layout` or its [`word_aligned`] form.
    ///
    /// # Safety
    /// As `GlobalAlloc::dealloc`.
    #[inline(always)]
    unsafe fn dealloc_with(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout: the tag is
        // there and the block starts `front` bytes earlier.
        let acc = unsafe { *tag_slot(ptr, layout.align(), layout.size()) };
        let block = ptr.wrapping_sub(front(layout.align()));
        // SAFETY: `layout` is the one the block was allocated with (the
        // `GlobalAlloc` contract), for which `extended` succeeded then.
        let ext = unsafe { extended(layout).unwrap_unchecked() };
        // SAFETY: the block was allocated by `inner` with `ext`.
        unsafe { self.uncharge_and_free(acc, layout.size() as u64, block, ext, TAG) }
    }

    /// `alloc` of a layout that is not [`word_aligned`], in a function of
    /// its own: inline, its registers would be saved on every `alloc`.
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc`.
    #[inline(never)]
    unsafe fn alloc_over_aligned(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.alloc_with(layout, |l| self.inner.alloc(l)) }
    }
}

impl<A> Accounted<A> {
    /// Charge, allocate with `inner`, write the header.
    ///
    /// The hit — the reserve holds the bytes — is the straight line; a
    /// miss and a failed inner allocation are functions of their own, so
    /// that across the inner call only the account, the size and `self`
    /// stay in registers.
    ///
    /// # Safety
    /// `layout` has a non-zero size (the `GlobalAlloc::alloc` contract).
    #[inline(always)]
    unsafe fn alloc_with(&self, layout: Layout, inner: impl FnOnce(Layout) -> *mut u8) -> *mut u8 {
        let Some(ext) = extended(layout) else {
            return std::ptr::null_mut();
        };
        let acc = self.take_reserved(layout.size() as u64);
        if acc.is_null() {
            // SAFETY: forwarded contract.
            return unsafe { self.alloc_missed(layout, ext, inner) };
        }
        // SAFETY: forwarded; `acc` holds the block's bytes.
        unsafe { self.alloc_charged(acc, layout, ext, inner) }
    }

    /// [`Accounted::alloc_with`] when the reserve missed: the charge's slow
    /// path, then the block.
    ///
    /// # Safety
    /// As [`Accounted::alloc_with`]; `ext` is `extended(layout)`.
    #[cold]
    #[inline(never)]
    unsafe fn alloc_missed(
        &self,
        layout: Layout,
        ext: Layout,
        inner: impl FnOnce(Layout) -> *mut u8,
    ) -> *mut u8 {
        let Ok(acc) = self.charge_miss(layout.size() as u64) else {
            return std::ptr::null_mut();
        };
        let acc = acc.map_or(std::ptr::null(), AccountKey::as_ptr);
        // SAFETY: forwarded; `acc` holds the block's bytes or is null.
        unsafe { self.alloc_charged(acc, layout, ext, inner) }
    }

    /// The block for `layout` once its bytes are charged to `acc` (null:
    /// unaccounted), with `acc` in its header; on failure, the charge
    /// taken back.
    ///
    /// # Safety
    /// As [`Accounted::alloc_with`]; `ext` is `extended(layout)`.
    #[inline(always)]
    unsafe fn alloc_charged(
        &self,
        acc: *const u8,
        layout: Layout,
        ext: Layout,
        inner: impl FnOnce(Layout) -> *mut u8,
    ) -> *mut u8 {
        // Counted before the inner call (taken back if it fails): after it,
        // the thread state is not touched again, so no register holds its
        // address across the call.
        STATE.with(|t| t.headers.set(t.headers.get() + TAG as i64));
        let base = inner(ext);
        if base.is_null() {
            self.alloc_failed(acc, layout.size() as u64, TAG);
            return base;
        }
        // SAFETY: the block was made for `ext`, which is `extended(layout)`.
        unsafe { tagged(base, layout, acc) }
    }

    /// The inner allocator failed: give back the `n` bytes charged to
    /// `acc` and the header counted.
    #[cold]
    #[inline(never)]
    fn alloc_failed(&self, acc: *const u8, n: u64, h: usize) {
        STATE.with(|t| t.headers.set(t.headers.get() - h as i64));
        self.uncharge(acc, n);
    }
}

impl<A, C: Charging> fmt::Debug for Accounted<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Accounted")
            .field("charging", &C::NAME)
            .field("reporting_grace", &self.reporting_grace)
            .field("attached", &self.attached().is_some())
            .finish()
    }
}

/// Whether a group is the allocator's concern: for `Group` docs.
#[allow(dead_code)]
fn _doc_links(_: &Group) {}

/// The user pointer of `block`, a block just made by the inner allocator
/// for `extended(layout)`, with `acc` written in its tag: the one step
/// every allocation path ends with (the tag's byte count is the caller's:
/// `Accounted::alloc_charged` counts it before the inner call, so that no
/// register holds the thread state across it).
///
/// # Safety
/// `block` is live, made for `extended(layout)`.
#[inline(always)]
pub(super) unsafe fn tagged(block: *mut u8, layout: Layout, acc: *const u8) -> *mut u8 {
    // SAFETY: the block has `extended(layout)` bytes: the user part starts
    // at `block + front`, aligned to `layout.align()`, the tag where
    // `tag_slot` says.
    unsafe {
        let user = block.add(front(layout.align()));
        tag_slot(user, layout.align(), layout.size()).write(acc);
        user
    }
}

/// The user pointer of `base`, a block just made (or moved) by the inner
/// allocator for `size` bytes at alignment `align` whose tag must hold
/// `acc`: a header came along with the contents; a trailer is written at
/// its place for the new size.
///
/// # Safety
/// `base` is a live block of `extended` of that size and alignment, its
/// header (for an alignment up to 8) holding `acc` already.
#[inline]
pub(super) unsafe fn moved_tag(
    base: *mut u8,
    align: usize,
    size: usize,
    acc: *const u8,
) -> *mut u8 {
    let user = base.wrapping_add(front(align));
    if align > MIN_HEADER {
        // SAFETY: the caller's contract: the trailer lies inside the block.
        unsafe { tag_slot(user, align, size).write(acc) };
    }
    user
}

mod limit;
mod raw;
#[doc(hidden)]
pub use raw::raw_account;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Footprint;
    use std::alloc::System;

    /// The largest alignments a `Layout` allows leave no room for a tag:
    /// refused (null), never a wrapped size handed to the inner allocator
    /// nor a panic inside `GlobalAlloc::alloc`.
    #[test]
    fn layouts_whose_header_passes_isize_max_are_refused() {
        let huge = 1usize << (usize::BITS - 2);
        for (size, align) in [(1, huge), (huge, huge), (isize::MAX as usize - 8, 8)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            assert_eq!(extended(layout), None, "{layout:?}");
            let requested: Accounted<System> = Accounted::new(System);
            let footprint: Accounted<System, Footprint> =
                Accounted::with_charging(System, Footprint);
            // SAFETY: a valid layout of non-zero size.
            unsafe {
                assert!(requested.alloc(layout).is_null());
                assert!(footprint.alloc(layout).is_null());
                assert!(requested.alloc_zeroed(layout).is_null());
            }
        }
        // An over-aligned block asks for its size rounded up to 8 and the
        // trailing tag, at its alignment — not an alignment unit more.
        let fits = Layout::from_size_align(100, 1 << 20).unwrap();
        assert_eq!(
            extended(fits).map(|l| (l.size(), l.align())),
            Some((104 + 8, 1 << 20))
        );
        let word = Layout::from_size_align(100, 8).unwrap();
        assert_eq!(
            extended(word).map(|l| (l.size(), l.align())),
            Some((108, 8))
        );
    }

    /// Fills a fresh group limited to 64 KiB (refusing) with 64-byte blocks
    /// through `alloc` until one is refused, then tries `after` more:
    /// (blocks held at the first refusal, how many of the `after` were
    /// handed out, whether one succeeds once a block is freed, the group's
    /// usage then with the stocks and reserve drained, the live blocks'
    /// bytes). In a thread of its own: the thread's state is `alloc`'s.
    fn refusals_with(alloc: &'static Accounted<System>, after: usize) -> [u64; 5] {
        let h = Hierarchy::default();
        alloc.attach(&h).unwrap();
        let g = h.root().child("limited").unwrap();
        g.set_max(64 << 10).unwrap();
        g.set_enforcement(crate::charge::Enforcement::Refuse);
        let layout = Layout::from_size_align(64, 8).unwrap();
        std::thread::spawn(move || {
            let _in_g = g.enter();
            let mut live = Vec::new();
            // SAFETY: a valid layout of non-zero size; every block handed
            // out is freed below with the same layout.
            unsafe {
                loop {
                    let p = alloc.alloc(layout);
                    if p.is_null() {
                        break;
                    }
                    live.push(p);
                }
                let held = live.len() as u64;
                let mut passed = 0;
                for _ in 0..after {
                    let p = alloc.alloc(layout);
                    if !p.is_null() {
                        passed += 1;
                        live.push(p);
                    }
                }
                alloc.dealloc(live.pop().unwrap(), layout);
                let again = alloc.alloc(layout);
                if !again.is_null() {
                    live.push(again);
                }
                drain_thread();
                alloc.drain();
                let usage = g.usage();
                let bytes = live.len() as u64 * 64;
                for p in live {
                    alloc.dealloc(p, layout);
                }
                [held, passed, (!again.is_null()) as u64, usage, bytes]
            }
        })
        .join()
        .unwrap()
    }

    /// Strict limits: past a refusing limit every allocation is refused
    /// until a free makes room, and usage counts every block handed out.
    /// (The default grants the reporting grace: the same allocations pass,
    /// charged past the limit — checked beside it, so that this test fails
    /// if `without_reporting_grace` stops taking the grace away.)
    #[test]
    fn without_the_reporting_grace_nothing_passes_a_refusing_limit() {
        static STRICT: Accounted<System> = Accounted::new(System).without_reporting_grace();
        static DEFAULT: Accounted<System> = Accounted::new(System);
        let [held, passed, again, usage, bytes] = refusals_with(&STRICT, 1000);
        assert!(
            held > 0 && held <= 1024,
            "{held} blocks of 64 B under 64 KiB"
        );
        assert_eq!(passed, 0, "allocations past the limit handed out");
        assert_eq!(again, 1, "a free makes room again");
        assert_eq!(usage, bytes, "usage misses blocks handed out");
        let [_, passed, _, usage, bytes] = refusals_with(&DEFAULT, 1000);
        assert!(passed > 0, "the default's reporting grace");
        assert_eq!(usage, bytes, "the grace's blocks are charged");
    }
}
