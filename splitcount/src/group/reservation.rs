//! [`Reservation`]: units held in a group by an RAII guard that knows
//! exactly how many it holds — a query operator's memory grant, a buffer
//! pool's quota.
//!
//! A reservation keeps its own count (`size`) beside the group's usage:
//!
//! - a grow charges the group first and then adds to `size`; a shrink
//!   subtracts from `size` first and then uncharges. So at every instant the
//!   units a reservation has charged are at least its `size`, and once no
//!   call on it is in progress they are equal: `size()` is exact, whatever
//!   the stock does.
//! - In [`ReservationMode::Exact`] (the default) the reservation charges the
//!   usage counters directly, never through the per-CPU stock: the group's
//!   [`Group::usage`] moves by exactly what the reservation grew or shrank,
//!   so a pool's "reserved" figure read from the group is exact too (as
//!   long as nothing else charges that group through the stock). A charge
//!   costs one atomic update per level of the hierarchy.
//! - In [`ReservationMode::Stocked`] it charges like [`Group::charge`]: most
//!   grows touch no shared cache line, but the group's usage runs ahead of
//!   the reservations by what the stocks hold (up to the stock batch per CPU,
//!   [`Group::stocked`]) until [`super::Hierarchy::drain_stocks`]. `size()`
//!   stays exact.
//!
//! A reservation on a group that is removed goes on working: its charges
//! act on the nearest live ancestor, which already counts what the removed
//! group held (reparenting), and its uncharges give back what they charged
//! there, then what the removed group still holds ([`Group::remove`]).

use super::{ChargeError, Group};
use crate::charge::MAX_REQUEST;
use crate::sync::{AtomicU64, Ordering::Relaxed};
use std::fmt;

/// How a [`Reservation`] charges its group (see the module docs of
/// `reservation`: exactness of the group's usage vs. the stock's speed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ReservationMode {
    /// Straight to the usage counters: the group's usage moves by exactly
    /// the reservation's changes. The default.
    #[default]
    Exact,
    /// Through the per-CPU stock, like [`Group::charge`]: faster for many
    /// small grows; the group's usage may run ahead by the stocked units.
    Stocked,
}

/// Units held in a group until shrunk, freed or dropped: the RAII form of
/// [`Group::charge`]/[`Group::uncharge`], with an exact [`Reservation::size`].
///
/// `Send + Sync`: a reservation may be shared (`&Reservation`,
/// `Arc<Reservation>`) by the threads of one operator; each call is atomic
/// on `size`, and concurrent calls sum.
///
/// ```
/// use splitcount::group::Hierarchy;
///
/// let h = Hierarchy::default();
/// let pool = h.root().child("pool").unwrap();
/// pool.set_max(100).unwrap();
///
/// let sort = pool.reserve(10).unwrap();       // try_grow(10) on a new reservation
/// assert_eq!(sort.size(), 10);
/// assert_eq!(pool.usage(), 10);               // exact: no stock batch shows through
///
/// let e = sort.try_grow(95).unwrap_err();     // 105 > 100: refused, nothing changes
/// assert_eq!((e.group(), e.limit(), e.usage(), e.request()), ("/pool", 100, 10, 95));
/// assert_eq!(sort.size(), 10);
///
/// sort.grow(95);                              // forced: memory already in use
/// assert_eq!(pool.usage(), 105);
/// assert_eq!(sort.shrink(200), 105);          // saturating: releases what it holds
/// sort.resize(40);
/// assert_eq!(pool.usage(), 40);
/// drop(sort);                                 // releases everything
/// assert_eq!(pool.usage(), 0);
/// ```
pub struct Reservation {
    group: Group,
    size: AtomicU64,
    mode: ReservationMode,
}

impl Reservation {
    /// An empty reservation on `group`, charging it directly
    /// ([`ReservationMode::Exact`]).
    pub fn new(group: &Group) -> Reservation {
        Reservation::with_mode(group, ReservationMode::Exact)
    }

    /// An empty reservation on `group` that charges it as `mode` says.
    pub fn with_mode(group: &Group, mode: ReservationMode) -> Reservation {
        Reservation {
            group: group.clone(),
            size: AtomicU64::new(0),
            mode,
        }
    }

    /// The group it charges (a removed group's reservation charges the
    /// nearest live ancestor).
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// How it charges.
    pub fn mode(&self) -> ReservationMode {
        self.mode
    }

    /// The units this reservation holds: exactly what its grows added and
    /// its shrinks took, once no call on it is in progress (never the
    /// stock's batch).
    pub fn size(&self) -> u64 {
        self.size.load(Relaxed)
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.size() == 0
    }

    /// Grow by `n` units if the group and every ancestor stay within their
    /// hard limits — after the group's reclaim hooks, stock drains and OOM
    /// hooks, as [`Group::charge`] does; otherwise `Err` with the refusing
    /// group, its limit, its usage, the request and its largest children
    /// ([`ChargeError::top`]), and the reservation is unchanged. `n == 0`
    /// always succeeds; `n` above [`MAX_REQUEST`] is refused (`TooLarge`).
    pub fn try_grow(&self, n: u64) -> Result<(), ChargeError> {
        if n == 0 {
            return Ok(());
        }
        self.charge(n)?;
        self.add(n);
        Ok(())
    }

    /// Grow by `n` units regardless of limits: the forced charge
    /// ([`Group::force_charge`]), for memory already in use. Never refused
    /// by a limit; it may take the group over its hard limit, where its
    /// usage is seen ([`Group::usage`] above [`Group::max`]) and every
    /// `try_grow` under it is refused until enough is released. It does not
    /// record a cooperative breach ([`Group::check`]): that is the
    /// allocator's. Returns the units it grew by: `n`, or fewer where the
    /// root's usage would pass [`crate::charge::MAX_USAGE`] (2^56 − 1, the
    /// most a counter holds: a caller's bug) — only what was charged is
    /// added to [`Reservation::size`], so a drop never gives back units
    /// other reservations hold.
    pub fn grow(&self, n: u64) -> u64 {
        let grown = match self.force(n) {
            Ok(()) => n,
            Err((charged, _)) => charged,
        };
        self.add(grown);
        grown
    }

    /// Release up to `n` units; returns how many were released:
    /// `min(n, size())`. Over-shrinking is *saturating*, never a panic and
    /// never an underflow of the group: a reservation can only give back
    /// what it holds.
    pub fn shrink(&self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Off `size` first, then uncharge: the group never holds less than
        // the reservations on it.
        let old = self
            .size
            .fetch_update(Relaxed, Relaxed, |s| Some(s - n.min(s)))
            .unwrap_or_else(|s| s);
        let taken = n.min(old);
        self.uncharge(taken);
        taken
    }

    /// Grow or shrink to exactly `target` units (a grow is forced, as
    /// [`Reservation::grow`]). Concurrent resizes of one reservation: the
    /// last to land wins, and the group is charged for it. A grow the
    /// counters cannot hold (the root's usage past
    /// [`crate::charge::MAX_USAGE`]) leaves the reservation unchanged.
    pub fn resize(&self, target: u64) {
        let _ = self.resize_with(target, &mut |r, n| {
            r.force(n).map_err(|(charged, e)| {
                r.uncharge(charged);
                e
            })
        });
    }

    /// Grow or shrink to exactly `target` units; a grow is tried as
    /// [`Reservation::try_grow`], and if refused the reservation is
    /// unchanged.
    pub fn try_resize(&self, target: u64) -> Result<(), ChargeError> {
        self.resize_with(target, &mut |r, n| r.charge(n))
    }

    /// Release everything; returns how many units were released. Dropping
    /// the reservation does the same.
    pub fn free(&self) -> u64 {
        let taken = self.size.swap(0, Relaxed);
        self.uncharge(taken);
        taken
    }

    fn resize_with(
        &self,
        target: u64,
        charge: &mut dyn FnMut(&Reservation, u64) -> Result<(), ChargeError>,
    ) -> Result<(), ChargeError> {
        let mut cur = self.size.load(Relaxed);
        loop {
            if target >= cur {
                let n = target - cur;
                if n == 0 {
                    return Ok(());
                }
                // Charge, then publish; if another call moved `size` in
                // between, give the charge back and start again from there.
                charge(self, n)?;
                match self.size.compare_exchange(cur, target, Relaxed, Relaxed) {
                    Ok(_) => return Ok(()),
                    Err(seen) => {
                        self.uncharge(n);
                        cur = seen;
                    }
                }
            } else {
                // Unpublish, then uncharge.
                match self.size.compare_exchange(cur, target, Relaxed, Relaxed) {
                    Ok(_) => {
                        self.uncharge(cur - target);
                        return Ok(());
                    }
                    Err(seen) => cur = seen,
                }
            }
        }
    }

    /// Add `n` to `size` (saturating: a size past `u64::MAX` is a caller's
    /// bug; the usage counters refuse long before, see `force`).
    fn add(&self, n: u64) {
        let _ = self
            .size
            .fetch_update(Relaxed, Relaxed, |s| Some(s.saturating_add(n)));
    }

    fn charge(&self, n: u64) -> Result<(), ChargeError> {
        match self.mode {
            ReservationMode::Exact => self.group.charge_unstocked(n),
            ReservationMode::Stocked => self.group.charge(n),
        }
    }

    /// The forced charge, never through the stock (the stock is only worth
    /// it for charges that could be refused and retried), in requests the
    /// group accepts. Refused only where the root's usage would pass
    /// [`crate::charge::MAX_USAGE`] (`Saturated`): then the units charged
    /// before that step, and the refusal.
    fn force(&self, n: u64) -> Result<(), (u64, ChargeError)> {
        let mut charged = 0;
        while charged < n {
            let step = (n - charged).min(MAX_REQUEST);
            self.group.force_charge(step).map_err(|e| (charged, e))?;
            charged += step;
        }
        Ok(())
    }

    fn uncharge(&self, n: u64) {
        match self.mode {
            ReservationMode::Exact => self.group.uncharge_unstocked(n),
            ReservationMode::Stocked => self.group.uncharge(n),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.free();
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("group", &self.group.path())
            .field("size", &self.size())
            .field("mode", &self.mode)
            .finish()
    }
}

impl Group {
    /// A new [`Reservation`] on this group holding `n` units (exact mode),
    /// or the refusal of [`Reservation::try_grow`].
    pub fn reserve(&self, n: u64) -> Result<Reservation, ChargeError> {
        let r = Reservation::new(self);
        r.try_grow(n)?;
        Ok(r)
    }
}
