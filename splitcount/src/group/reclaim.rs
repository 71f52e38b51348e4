//! The slow half of a charge, shared by [`super::Group::charge`] and the
//! allocator integration: what happens when a charge does not fit.
//!
//! ```text
//!  reclaim:  loop ≤ MAX_RECLAIM_RETRIES:
//!                try the charge ── fits ──▶ done (then the pressure hooks of crossings of `high`)
//!                refused by R: R's reclaim hooks; drain R's subtree from the stocks
//!                              (once per R, and only if what they hold of it could
//!                              make up the shortfall)
//!                nothing freed ──▶ break                                    ──▶ over R's limit
//!  (the allocator decides here: a cooperative R takes an over-charge, no OOM stage)
//!  out of memory: R's OOM hooks (one more try if one says so) ──▶ refused by R:
//!                 R.max, R.oom and R.refused += 1
//! ```
//!
//! Hooks run through a [`HookRunner`]: directly for `Group::charge`, with
//! accounting off inside the allocator (a hook's own allocations must not be
//! charged to the group that is full).

use super::events::{self, EventKind};
use super::hierarchy::Shared;
use super::hooks;
use super::node::Node;
use super::Group;
use crate::charge::usage::EPISODE_OOM;
use crate::charge::UsageCounter;
use std::sync::Arc;
use std::time::Instant;

/// How many times the charge path retries after reclaim while it makes
/// progress (the kernel's `MAX_RECLAIM_RETRIES`).
pub const MAX_RECLAIM_RETRIES: usize = 16;

/// Runs a user hook (directly, or with allocator accounting off).
pub(crate) type HookRunner = fn(&mut dyn FnMut());

/// Run a hook directly.
pub(crate) fn direct(f: &mut dyn FnMut()) {
    f()
}

/// A charge that reclaim and draining could not fit, on its way to the
/// next stage: who refused it, and since when it stalls.
pub(crate) struct NoRoom {
    /// The node whose limit is in the way.
    pub(crate) refuser: Arc<Node>,
    stalled: Instant,
}

impl Shared {
    /// Charge `n` through `try_charge` (which charges the counters of
    /// `node` and its ancestors within their limits, or names the refusing
    /// counter), reclaiming and draining as in the module docs, then the
    /// out-of-memory stage. `Ok` with whether a level crossed `high`;
    /// `Err` with the refusing node, its `max`, `oom` and `refused` events
    /// counted.
    pub(crate) fn charge_with_reclaim(
        self: &Arc<Self>,
        node: &Arc<Node>,
        n: u64,
        try_charge: &mut dyn FnMut() -> Result<bool, *const UsageCounter>,
        run: HookRunner,
    ) -> Result<bool, Arc<Node>> {
        match self.reclaim(node, n, try_charge, run) {
            Ok(crossed) => Ok(crossed),
            Err(over) => self.out_of_memory(node, over, n, try_charge, run),
        }
    }

    /// The reclaim stage (see the module docs): `Ok` with whether a level
    /// crossed `high`, or the charge still over a limit. Counts nothing:
    /// what happens next decides which events the charge is.
    pub(crate) fn reclaim(
        self: &Arc<Self>,
        node: &Arc<Node>,
        n: u64,
        try_charge: &mut dyn FnMut() -> Result<bool, *const UsageCounter>,
        run: HookRunner,
    ) -> Result<bool, NoRoom> {
        // The refusers already drained (at most one per try): no heap, since
        // this may run inside the allocator.
        let mut drained = [std::ptr::null::<UsageCounter>(); MAX_RECLAIM_RETRIES];
        let mut refuser = node.clone();
        // From the first refusal on, the charge is stalled: its time is
        // added to the charged group and its ancestors (`stall()`).
        let mut stalled: Option<Instant> = None;
        let stall_ends = |since: Option<Instant>| {
            if let Some(t) = since {
                node.usage.add_stall(t.elapsed().as_nanos() as u64);
            }
        };
        for _ in 0..MAX_RECLAIM_RETRIES {
            let refused = match try_charge() {
                Ok(crossed) => {
                    stall_ends(stalled);
                    return Ok(crossed);
                }
                Err(r) => r,
            };
            stalled.get_or_insert_with(Instant::now);
            // SAFETY: the refuser is `node`'s counter or an ancestor's, all
            // kept alive by `node`.
            refuser = node.find(unsafe { &*refused });
            let short = short_by(&refuser.usage, n);
            let mut progress: u64 = 0;
            if let Some(h) = refuser.hooks() {
                let group = Group::new(self.clone(), refuser.clone());
                for hook in &h.reclaim {
                    run(&mut || {
                        progress = progress.saturating_add(hooks::run(0, || hook(&group, short)));
                    });
                }
            }
            if !drained.contains(&refused) {
                // SAFETY: as above.
                let r = unsafe { &*refused };
                // The shortfall left after the hooks: a drain that cannot
                // make it up is not made (and may be, later in this loop,
                // once the hooks have made it up in part).
                let (units, made) = self.drain_for_refusal(r, short_by(r, n));
                if made {
                    if let Some(free) = drained.iter_mut().find(|d| d.is_null()) {
                        *free = refused;
                    }
                }
                progress = progress.saturating_add(units);
            }
            if progress == 0 {
                break;
            }
        }
        Err(NoRoom {
            refuser,
            stalled: stalled.unwrap_or_else(Instant::now),
        })
    }

    /// The out-of-memory stage of a charge `over` a limit: the refuser's
    /// OOM hooks, one more try if one asks for it, else the refusal —
    /// counted as a `max`, an `oom` and a `refused` event of the refuser.
    pub(crate) fn out_of_memory(
        self: &Arc<Self>,
        node: &Arc<Node>,
        over: NoRoom,
        n: u64,
        try_charge: &mut dyn FnMut() -> Result<bool, *const UsageCounter>,
        run: HookRunner,
    ) -> Result<bool, Arc<Node>> {
        let NoRoom { refuser, stalled } = over;
        let stall_ends = || node.usage.add_stall(stalled.elapsed().as_nanos() as u64);
        if refuser.usage.begin_episode(EPISODE_OOM) {
            let (usage, max) = (refuser.usage.usage(), refuser.usage.refused_limit());
            events::emit(self, &refuser, EventKind::Oom, usage, max, None);
        }
        let short = short_by(&refuser.usage, n);
        if let Some(h) = refuser.hooks() {
            let group = Group::new(self.clone(), refuser.clone());
            let mut retry = false;
            for hook in &h.oom {
                if !retry {
                    run(&mut || retry = hooks::run(false, || hook(&group, short)));
                }
            }
            if retry {
                if let Ok(crossed) = try_charge() {
                    stall_ends();
                    return Ok(crossed);
                }
            }
        }
        stall_ends();
        refuser.usage.record_max();
        refuser.usage.record_oom();
        refuser.usage.record_refused();
        Err(refuser)
    }

    /// The end of a charge over a limit that was let through: add its
    /// stall time.
    pub(crate) fn stall_ends(&self, node: &Node, over: &NoRoom) {
        node.usage
            .add_stall(over.stalled.elapsed().as_nanos() as u64);
    }

    /// Run the pressure hooks of every group from `node` up whose usage
    /// just crossed its `high`: once per crossing (crossings made before
    /// the hooks of an earlier one ran — by other threads — run them once
    /// each, here).
    #[cold]
    pub(crate) fn pressure(self: &Arc<Self>, node: &Arc<Node>, run: HookRunner) {
        let mut n = Some(node.clone());
        while let Some(g) = n {
            let crossings = g.usage.take_pressure();
            if crossings > 0 {
                let over = g.usage.usage().saturating_sub(g.usage.high());
                if let Some(h) = g.hooks() {
                    let group = Group::new(self.clone(), g.clone());
                    for _ in 0..crossings {
                        for hook in &h.pressure {
                            run(&mut || hooks::run((), || hook(&group, over)));
                        }
                    }
                }
            }
            n = g.parent.clone();
        }
    }
}

/// How many units a charge of `n` is short of fitting under `c`'s limit.
fn short_by(c: &UsageCounter, n: u64) -> u64 {
    c.usage().saturating_add(n).saturating_sub(c.max())
}
