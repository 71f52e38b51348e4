//! The allocator's charge when the thread's reserve cannot pay for it: the
//! one place that decides what an allocation over a limit does, top to
//! bottom.
//!
//! ```text
//!  charge_slow(account, n)
//!   1. a removed group's scope charges its nearest live ancestor
//!  1b. over a refusing limit, in the reporting grace¹ a refusal began ──────────▶ charged past it²
//!   2. refill the reserve: charge n + RESERVE_BATCH (stock or counter)  ── fits ──▶ done
//!   3. already over a cooperative limit, in a breach episode           ──────────▶ over-charge, cheaply
//!      over a refusing limit: the thread panicking¹                    ──────────▶ unaccounted
//!                                 in the reporting grace¹                ──────────▶ charged past it²
//!   4. exact charge: reclaim hooks, a drain that could make room       ── fits ──▶ done
//!   5. over a cooperative limit, no ceiling in the way                  ──────────▶ over-charge, breach
//!      in the thread's reporting grace¹ (after a refusal, a panic)     ──────────▶ charged² / unaccounted
//!   6. the OOM stage (hooks, one retry)                                 ── fits ──▶ done
//!   7. refused: refusal hooks (one retry), null; the grace¹ begins
//!
//!  ¹ not with `without_reporting_grace` (strict limits, the C preload's):
//!    there every allocation past a refusing limit goes on to 6 and 7.
//!  ² charged level by level within `REPORTING_GRACE` above each `max`
//!    (and within each ceiling), compared and swapped as any charge is
//! ```
//!
//! **Why the grace is charged.** It lets a thread report its refusal (an
//! error formatted, a message printed): up to [`REPORTING_GRACE`] bytes
//! after each refusal, in allocations of at most
//! [`REPORTING_GRACE_ALLOCATION`]. Its blocks passed unaccounted, and every
//! refusal began a new grace: a loop of `try_reserve_exact(4096)` that
//! keeps what it gets was refused once per 256 blocks and held 40 MB under
//! a refusing limit of 1 MiB, with `usage()` reading 1 MiB (found by
//! trying the API as a user would). Charged, the grace's blocks show in the
//! usage and count against the headroom: however often the thread is
//! refused, and however many threads are, a refusing limit holds at most
//! `REPORTING_GRACE` above its `max`. (While the thread panics — a message,
//! a backtrace, unwinding — its allocations still pass unaccounted: the
//! panic must not fail, and it ends.)
//!
//! **Why step 3.** A tenant over its cooperative limit keeps allocating
//! (that is what cooperative means: the request runs on until its next
//! checkpoint). Each of those allocations used to go through reclaim, a
//! drain of every CPU's stock (an interrupt of every CPU, per
//! allocation) and the OOM hooks: 34.5 µs per 64-byte box, and its
//! neighbours' CPUs interrupted all the while. Nothing of that can change
//! the outcome once the episode over the limit has begun: the first
//! over-charge ran reclaim, drained what could make room and recorded the
//! breach. So the later ones, until an uncharge takes the usage back below
//! `max` (which ends the episode), are forced charges with their `max`
//! events counted — through the reserve, a batch at a time, like any other
//! charge — and touch nothing of other CPUs.
//!
//! **Drains (step 4)** reach other CPUs only when the units stocked for the
//! refusing subtree could make up the shortfall, and then interrupt only
//! the CPUs that hold such units (`Shared::drain_for_refusal`,
//! `Stock::drain_all`).

use super::{Accounted, Attached, LAST_REFUSAL, REPORTING_GRACE, REPORTING_GRACE_ALLOCATION};
use crate::alloc::charging::Charging;
use crate::alloc::reserve::{flush_headers, RESERVE_BATCH};
use crate::alloc::scope::{run_unaccounted, without_accounting};
use crate::alloc::thread::{arm_exit_guard, STATE};
use crate::charge::usage::EPISODE_REFUSED;
use crate::charge::{Enforcement, UsageCounter, MAX_REQUEST, UNLIMITED};
use crate::group::{
    emit_event, mark_breached, AccountKey, EventKind, Node, Refusal, Shared, TOP_CONSUMERS,
};
use std::sync::Arc;

impl<A, C: Charging> Accounted<A, C> {
    /// Everything but a reserve hit (see the module docs). `redirect`:
    /// whether a removed group's account may be replaced by its nearest
    /// live ancestor's (not for a block's growth, which stays with the
    /// block's account).
    #[cold]
    pub(super) fn charge_slow(
        &self,
        st: &Attached,
        acc: AccountKey,
        n: u64,
        redirect: bool,
    ) -> Result<Option<AccountKey>, ()> {
        flush_headers();
        // 1. A scope on a removed group charges the nearest live ancestor.
        let mut held: Option<Arc<Node>> = None;
        let acc = if redirect && acc.is_removed() {
            match acc.live_node() {
                Some(node) => {
                    let a = node.existing_account().unwrap_or(st.root);
                    held = Some(node);
                    a
                }
                None => st.root,
            }
        } else {
            acc
        };
        // 1b. In the reporting grace that a refusal began (the refusal ran
        // reclaim and the drain already): while a refusing limit (or a
        // ceiling) stays in the way, the allocation is charged past it
        // within the grace's headroom, without trying the charge under the
        // limit again — step 2's two failing charges up the hierarchy were
        // most of what each allocation of the grace cost.
        if in_grace() {
            if let Some(refuser) = refuser_in_the_way(acc.usage(), n) {
                if let Some(passed) = self.reporting_grace(st, acc, n) {
                    return Ok(passed);
                }
                // No headroom left in the grace: a small allocation is
                // refused at once, counted as the OOM stage counts it,
                // where this limit refused already in its episode at the
                // limit — nothing but an uncharge can change the answer
                // while it stays in the way, and that refusal ran reclaim,
                // the drain and the hooks. (A thread far over its limit
                // paid all of them again on every allocation otherwise.)
                // A large one, or a limit that has not refused yet (the
                // grace began at another group's), takes the whole path.
                if n <= REPORTING_GRACE_ALLOCATION && refuser.in_refused_episode() {
                    refuser.note_refused_now();
                    refuser.record_max();
                    refuser.record_oom();
                    refuser.record_refused();
                    return Err(());
                }
            }
        }
        // 2. A reserve refill, unless the thread is past its exit guard (no
        // one would return it).
        let exiting = STATE.try_with(|t| t.exiting.get()).unwrap_or(true);
        let refill = n < RESERVE_BATCH && !exiting;
        if refill {
            if let Ok(crossed) = self.charge_reserve_bytes(st, acc, n + RESERVE_BATCH) {
                self.keep_reserve(st, acc);
                if crossed {
                    self.pressure_from(st, acc);
                }
                return Ok(Some(acc));
            }
            // The reserve would cross a `high` (or a `max` refuses it):
            // just `n`, before the slow steps (in the band of a reserve
            // below `high`, every allocation that finds the reserve empty
            // comes here).
            if let Ok(crossed) = self.charge_bytes(st, acc, n) {
                if crossed {
                    self.pressure_from(st, acc);
                }
                return Ok(Some(acc));
            }
        }
        if n > MAX_REQUEST {
            // No limit refuses it: it can only be a bug. No event.
            return self.refuse(st, acc, n, None);
        }
        // 3. Over a cooperative limit in an episode already begun.
        if let Some(blocking) = breach_in_progress(acc.usage(), n) {
            return Ok(self.over_charge_cheaply(st, acc, blocking, n, refill));
        }
        // … or over a refusing limit (or a ceiling) while the thread panics
        // or is in its grace.
        if refusal_in_the_way(acc.usage(), n) {
            if let Some(passed) = self.reporting_grace(st, acc, n) {
                return Ok(passed);
            }
        }
        let node = match held.take().or_else(|| acc.node()) {
            Some(node) => node,
            None => acc.live_node().ok_or(())?,
        };
        let shared = st.hierarchy.shared();
        let mut try_charge = || self.charge_bytes(st, acc, n);
        // 4. Reclaim, with accounting off: nothing on this path may charge
        // the full group (its own bookkeeping, the hooks).
        let over =
            match without_accounting(|| shared.reclaim(&node, n, &mut try_charge, run_unaccounted))
            {
                Ok(crossed) => return Ok(self.charged(shared, &node, acc, crossed)),
                Err(over) => over,
            };
        let refuser = over.refuser.clone();
        let limit = &refuser.usage;
        // 5. A cooperative limit lets it through, unless a ceiling is in
        // the way.
        let ceiling = ceiling_in_the_way(acc.usage(), n);
        if limit.enforcement() == Enforcement::Cooperative && ceiling.is_none() {
            shared.stall_ends(&node, &over);
            let crossed = acc.force_charge(n);
            limit.record_over_charge();
            without_accounting(|| mark_breached(shared, &node, &refuser, n));
            return Ok(self.charged(shared, &node, acc, crossed));
        }
        // The reporting grace (`reporting_grace`): such an allocation
        // passes before the OOM stage, charged past the limit within the
        // grace's headroom (unaccounted while the thread panics).
        if let Some(passed) = self.reporting_grace(st, acc, n) {
            shared.stall_ends(&node, &over);
            return Ok(passed);
        }
        // 6. The OOM stage: its hooks may still make room.
        match without_accounting(|| {
            shared.out_of_memory(&node, over, n, &mut try_charge, run_unaccounted)
        }) {
            Ok(crossed) => Ok(self.charged(shared, &node, acc, crossed)),
            // 7. Refused: by the ceiling if one was in the way, else by the
            // limit (its events counted by the OOM stage).
            Err(_) => self.refuse(st, acc, n, Some(ceiling.unwrap_or(limit))),
        }
    }

    /// A charge through `acc` went through: the reporting grace ends, and
    /// the pressure hooks run if a level crossed `high`.
    fn charged(
        &self,
        shared: &Arc<Shared>,
        node: &Arc<Node>,
        acc: AccountKey,
        crossed: bool,
    ) -> Option<AccountKey> {
        STATE.with(|t| t.grace.set(0));
        if crossed {
            shared.pressure(node, run_unaccounted);
        }
        Some(acc)
    }

    /// A charge through `acc` crossed `high` at some level: run the pressure
    /// hooks from `acc`'s group up (each level whose crossing is pending).
    /// Every charge that may cross runs them or leaves the crossing pending
    /// for the next: a refill that crossed and ran none — the common case,
    /// since small allocations charge in reserve batches — left C and Rust
    /// subscribers never called for crossings made by allocations.
    #[cold]
    pub(super) fn pressure_from(&self, st: &Attached, acc: AccountKey) {
        if let Some(node) = acc.node().or_else(|| acc.live_node()) {
            st.hierarchy.shared().pressure(&node, run_unaccounted);
        }
    }

    /// `RESERVE_BATCH` bytes charged beyond the allocation go to the
    /// thread's reserve (whose previous bytes, another account's, go back).
    ///
    /// The exit guard, which returns the reserve when the thread exits, is
    /// armed here, where a reserve is filled, whatever path got here: an
    /// allocation's miss arms it first, but a growing `realloc`
    /// (`charge_growth`) comes without one — a thread whose only call was
    /// such a `realloc` kept its reserve charged for ever.
    fn keep_reserve(&self, st: &Attached, acc: AccountKey) {
        STATE.with(|t| t.grace.set(0));
        let refilled = STATE.try_with(|t| {
            arm_exit_guard(t);
            t.reserve.refill(acc, RESERVE_BATCH)
        });
        if let Ok(Some((old, bytes))) = refilled {
            self.uncharge_shared(st, old, bytes);
        }
    }

    /// Step 3: force the charge (and, for a small one, a reserve's worth
    /// more, so that the next allocations of the episode are reserve hits),
    /// count it as a `max` event of the limit in the way, and keep the
    /// breach recorded (a [`crate::group::BreachMode::Level`] check may have
    /// cleared it). Loads and one forced charge per reserve batch: no
    /// hooks, no drain, nothing of another CPU.
    #[cold]
    fn over_charge_cheaply(
        &self,
        st: &Attached,
        acc: AccountKey,
        blocking: &UsageCounter,
        n: u64,
        refill: bool,
    ) -> Option<AccountKey> {
        let shared = st.hierarchy.shared();
        let crossed = acc.force_charge(if refill { n + RESERVE_BATCH } else { n });
        // The breach's record reports the limit in force, which this
        // over-charge passed (no compare-and-swap refused it).
        blocking.note_refused_now();
        blocking.record_over_charge();
        if refill {
            self.keep_reserve(st, acc);
        }
        if let Some(node) = acc.node().or_else(|| acc.live_node()) {
            let refuser = node.find(blocking);
            without_accounting(|| mark_breached(shared, &node, &refuser, n));
            if crossed {
                shared.pressure(&node, run_unaccounted);
            }
        }
        STATE.with(|t| t.grace.set(0));
        Some(acc)
    }

    /// Refuse an allocation of `n` bytes charged through `acc` because of
    /// `by`'s limit (`None`: too large for any): remember it, run the
    /// refusal hooks (one more try if one freed memory), return the
    /// refusal, and grant the thread its reporting grace (unless this
    /// allocator has none: [`Accounted::without_reporting_grace`]).
    #[cold]
    fn refuse(
        &self,
        st: &Attached,
        acc: AccountKey,
        n: u64,
        by: Option<&UsageCounter>,
    ) -> Result<Option<AccountKey>, ()> {
        if by.is_none() {
            if let Some(passed) = self.reporting_grace(st, acc, n) {
                return Ok(passed);
            }
        }
        // The limit that refused: the one a refusal stored, or — a request
        // no limit could grant, refused by no limit — the one in force.
        let limit_of = |by: &UsageCounter, refused: bool| {
            if by.usage().saturating_add(n) > by.ceiling() {
                by.ceiling()
            } else if refused {
                by.refused_limit()
            } else {
                by.max()
            }
        };
        let refused = by.is_some();
        let by = by.unwrap_or(acc.usage());
        let node = acc.node().or_else(|| acc.live_node());
        let refuser = node.as_ref().map(|n| n.find(by));
        let retry = without_accounting(|| {
            let limit = limit_of(by, refused);
            let refusal = Refusal {
                request: n,
                group: refuser.as_ref().map(|r| r.path.clone()).unwrap_or_default(),
                limit,
                usage: by.usage(),
                top: refuser
                    .as_ref()
                    .map_or_else(Vec::new, |r| r.top(TOP_CONSUMERS)),
            };
            let _ = LAST_REFUSAL.try_with(|r| *r.borrow_mut() = Some(refusal.clone()));
            // The charged group's subscribers first, then its ancestors'.
            let mut n_ = node.clone();
            while let Some(g) = n_ {
                if let Some(h) = g.hooks() {
                    for hook in &h.alloc_refusal {
                        if crate::group::run_hook(false, || hook(&refusal)) {
                            return true;
                        }
                    }
                }
                n_ = g.parent.clone();
            }
            false
        });
        if retry {
            if let Ok(crossed) = self.charge_bytes(st, acc, n) {
                if crossed {
                    self.pressure_from(st, acc);
                }
                return Ok(Some(acc));
            }
        }
        if by.begin_episode(EPISODE_REFUSED) {
            if let Some(refuser) = &refuser {
                let shared = st.hierarchy.shared();
                emit_event(
                    shared,
                    refuser,
                    EventKind::MaxRefused,
                    by.usage(),
                    limit_of(by, refused),
                    None,
                );
            }
        }
        if self.has_reporting_grace() {
            STATE.with(|t| t.grace.set(REPORTING_GRACE));
        }
        Err(())
    }

    /// Whether an allocation of `n` bytes through `acc` that would be
    /// refused passes in the reporting grace, and how: `Some(None)`,
    /// unaccounted, while the thread panics (a panic message, a backtrace,
    /// unwinding); `Some(Some(acc))`, charged past the limit, for
    /// [`REPORTING_GRACE`] bytes after a refusal in allocations of at most
    /// [`REPORTING_GRACE_ALLOCATION`] — so that a refusal can be reported —
    /// where every level takes it within `REPORTING_GRACE` above its `max`
    /// and within its ceiling (compared and swapped level by level: the
    /// bound holds under any number of threads); `None` otherwise, and
    /// always for an allocator without the grace
    /// ([`Accounted::without_reporting_grace`]): its limits are strict. A
    /// level that crossed its `high` has its pressure hooks run, as after
    /// any charge.
    fn reporting_grace(
        &self,
        st: &Attached,
        acc: AccountKey,
        n: u64,
    ) -> Option<Option<AccountKey>> {
        if !self.has_reporting_grace() {
            return None;
        }
        if std::thread::panicking() {
            return Some(None);
        }
        // Loads first: a thread past the headroom (every allocation of its
        // grace once it is spent) fails here without charging and rolling
        // back every level above the refusing one, which another thread's
        // charge near an ancestor's `max` could meet and be refused by.
        if n > REPORTING_GRACE_ALLOCATION || !within_grace_headroom(acc.usage(), n) {
            return None;
        }
        let took = STATE.with(|t| {
            let left = t.grace.get();
            (left >= n).then(|| t.grace.set(left - n)).is_some()
        });
        if !took {
            return None;
        }
        // Each level compares and swaps against its own bound, so the bound
        // holds whatever other threads charge meanwhile.
        match acc.try_charge_within_grace(n, REPORTING_GRACE) {
            Ok(crossed) => {
                if crossed {
                    self.pressure_from(st, acc);
                }
                Some(Some(acc))
            }
            Err(()) => {
                STATE.with(|t| t.grace.set(t.grace.get() + n));
                None
            }
        }
    }
}

/// The counter whose cooperative limit a charge of `n` through `counter`
/// would pass, if every limit in the way is cooperative, in an episode
/// over it that an over-charge already began, and no ceiling is in the
/// way: then the charge is an over-charge of that episode (step 3). Loads
/// only.
fn breach_in_progress(counter: &UsageCounter, n: u64) -> Option<&UsageCounter> {
    let mut blocking = None;
    for c in counter.chain() {
        let after = c.usage().saturating_add(n);
        if after <= c.max() {
            continue;
        }
        if c.enforcement() != Enforcement::Cooperative || !c.in_breach_episode() {
            return None;
        }
        blocking.get_or_insert(c);
    }
    // A ceiling anywhere: step 5 decides (a reserve batch must not pass it).
    let ceilings = counter.chain().any(|c| c.ceiling() != UNLIMITED);
    blocking.filter(|_| !ceilings)
}

/// Whether the thread has bytes left of a reporting grace a refusal began
/// (one thread-local load; false past the thread's exit).
#[inline]
fn in_grace() -> bool {
    STATE.try_with(|t| t.grace.get() != 0).unwrap_or(false)
}

/// Whether a charge of `n` through `counter` looks to stay within the
/// reporting grace's headroom: no level past its ceiling, and every level
/// it takes over its `max` within [`REPORTING_GRACE`] above it. Loads only:
/// a filter before the charge that decides
/// ([`AccountKey::try_charge_within_grace`]).
fn within_grace_headroom(counter: &UsageCounter, n: u64) -> bool {
    counter.chain().all(|c| {
        let after = c.usage().saturating_add(n);
        after <= c.ceiling() && (after <= c.max() || after - c.max() <= REPORTING_GRACE)
    })
}

/// Whether a charge of `n` through `counter` would pass a refusing limit
/// or a ceiling (loads only; stocked slack not counted).
fn refusal_in_the_way(counter: &UsageCounter, n: u64) -> bool {
    refuser_in_the_way(counter, n).is_some()
}

impl<A, C: Charging> Accounted<A, C> {
    /// After an unrefused charge through `key` (the rounding of a block a
    /// `realloc` moved, in `Footprint` charging): where it took a refusing
    /// limit (or a ceiling) in the way past it, return what the stocks and
    /// this thread's reserve hold of its subtree, so that the next charge
    /// meets the limit
    /// rather than bytes stocked before it was passed. Without it a `Vec`
    /// grown a few bytes at a time was served from them without end — the
    /// growth taken from the reserve and given back while the block grew in
    /// place —, and every move to a larger class was charged unrefused: up
    /// to a reproducer's cap of 1 GiB (2.9 GB in another) over a 16.9 MB
    /// refusing limit on mimalloc, whose large classes are
    /// 64 KiB and more apart (found by a helper). Now a limit is passed by
    /// at most one such rounding.
    pub(crate) fn after_unrefused(&self, key: AccountKey) {
        let Some(st) = self.attached() else {
            return;
        };
        if let Some(refuser) = refuser_in_the_way(key.usage(), 0) {
            // The thread's reserve, and the stocks of the refusing limit's
            // subtree only (other groups and CPUs are not touched).
            // Accounting off: the drain's listeners (a level back under
            // `high`) may allocate, inside this `realloc`.
            without_accounting(|| st.hierarchy.shared().drain_for_refusal(refuser, 0));
        }
    }
}

/// The first counter of the chain whose refusing limit (or ceiling) a
/// charge of `n` through `counter` would pass (loads only).
fn refuser_in_the_way(counter: &UsageCounter, n: u64) -> Option<&UsageCounter> {
    counter.chain().find(|c| {
        let after = c.usage().saturating_add(n);
        (after > c.max() && c.enforcement() == Enforcement::Refuse) || after > c.ceiling()
    })
}

/// The nearest ceiling a charge of `n` through `counter` would pass.
fn ceiling_in_the_way(counter: &UsageCounter, n: u64) -> Option<&UsageCounter> {
    counter
        .chain()
        .find(|c| c.ceiling() != UNLIMITED && c.usage().saturating_add(n) > c.ceiling())
}
