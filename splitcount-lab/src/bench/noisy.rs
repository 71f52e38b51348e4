//! `bench noisy`: what a group over its hard limit costs the allocations
//! charged to it, and what it costs a healthy group's allocations on the
//! next CPU — the noisy neighbour.
//!
//! An allocation charged to a group whose usage is above its `max` misses
//! the thread's reserve and the CPU's byte stock, is refused by the usage
//! counter and goes through reclaim: the stocks holding the group's bytes
//! are drained (with rseq stocks, a `membarrier` that interrupts every CPU
//! running a thread of the process), the charge is tried again, and then
//! it is let through as a counted over-charge ([`Enforcement::Cooperative`])
//! or refused ([`Enforcement::Refuse`]). A group that stays over its limit
//! pays that on every allocation, and so do the CPUs it interrupts.
//!
//! Every thread runs the same loop: allocate a 64-byte block with
//! `Vec::try_reserve_exact` (a refusal is an `Err`, counted, not an abort)
//! and hold it; once [`WAVE`] blocks (1 MiB) are held, free them all. The
//! blocks are held in waves, not freed one per allocation, because a free
//! returns its bytes to this thread's reserve or this CPU's stock, where
//! the group's next allocation finds them: a ring that frees a block for
//! each one it allocates times the stock, not the over-limit path (about
//! ×4 of `under-limit` instead of ×25 on a 2-CPU VM). A wave is a request
//! that keeps allocating past its limit, and frees what it made when it
//! gives up.
//!
//! Cases, all in the same interleaved rounds, in the `Accounted<System>`
//! worker process of the allocator suite ([`super::worker`]), each
//! slice in groups of its own created for it (untimed):
//!
//! - **one thread**: the loop in a group under its limit (`under-limit`,
//!   the baseline: a `max` of 1 GiB it never reaches) and in a group far
//!   over its `max` of 1 MiB, holding 2 MiB, cooperative
//!   (`breached-cooperative`) or refusing (`breached-refuse`). Ratio: ns
//!   per allocation (CPU time) ÷ `under-limit`'s in the same round.
//! - **two threads**, each role reported on its own: a `noisy` thread runs
//!   the loop in an unlimited group (`beside-unlimited`, the baseline) or
//!   in a breached one (`beside-cooperative`, `beside-refuse`) while a
//!   `healthy` thread runs it in a group with a limit it never reaches. The
//!   `*-healthy` rows' ratio is the healthy thread's allocations per second
//!   (wall time: interrupts and stalls included) ÷ the same beside an
//!   unlimited neighbour in the same round — higher is better, 1 is
//!   unharmed; the `*-noisy` rows' is ns per allocation as above.
//!
//! In a refusing group, a refusal grants the thread a reporting grace
//! (`splitcount::alloc::REPORTING_GRACE`): the allocations that follow pass
//! unaccounted (after the same slow path) until it is spent, so one in
//! about 16,000 of the loop's allocations is refused. Each slice checks
//! what its groups did: a breached group still over its limit at the end,
//! refusals in the refusing cases and none elsewhere, or the slice is an
//! error.

use super::{Bench, Entry};
use crate::alloc_switch::Allocator;
use crate::bench::worker::{Request, Worker};
use crate::timing::slice::{self, SliceRun, SliceSpec};
use crate::timing::{measure, Plan};
use serde::{Deserialize, Serialize};
use splitcount::group::Group;
use splitcount::Enforcement;
use std::cell::RefCell;
use std::hint::black_box;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The suite's name, in records and in a worker request
/// ([`crate::bench::worker::Request`]).
pub const SUITE: &str = "noisy";

/// The one-thread baseline: the loop in a group under its limit.
pub const UNDER_LIMIT: &str = "under-limit";

/// The two-thread baseline: the noisy thread in an unlimited group.
pub const BESIDE_UNLIMITED: &str = "beside-unlimited";

/// The roles of the two-thread cases: thread 0, thread 1.
pub const ROLES: [&str; 2] = ["noisy", "healthy"];

/// Bytes of one block of the loop.
pub const BLOCK: usize = 64;

/// Blocks held before the loop frees them all: 1 MiB of blocks, the
/// breached groups' `max` again, past what a reserve (32 KiB) and a CPU's
/// byte stock (64 KiB) hold, so most allocations of a wave are new
/// charges.
pub const WAVE: usize = (1 << 20) / BLOCK;

/// The `max` of a breached group.
pub const BREACHED_MAX: u64 = 1 << 20;

/// What a breached group holds (in one block, charged before the slice):
/// twice its `max`.
pub const HELD: usize = 2 << 20;

/// The `max` of a group that never reaches it.
pub const ROOMY_MAX: u64 = 1 << 30;

/// A case of the suite: which group the (noisy) thread allocates in, and
/// whether a healthy thread allocates beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    /// One thread, in a group under its limit (holding [`HELD`] like the
    /// breached ones).
    UnderLimit,
    /// One thread, in a breached cooperative group.
    BreachedCooperative,
    /// One thread, in a breached refusing group.
    BreachedRefuse,
    /// Two threads: the noisy one in an unlimited group.
    BesideUnlimited,
    /// Two threads: the noisy one in a breached cooperative group.
    BesideCooperative,
    /// Two threads: the noisy one in a breached refusing group.
    BesideRefuse,
}

/// The group a case's (noisy) thread allocates in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// A `max` of [`ROOMY_MAX`], never reached.
    Under,
    /// No `max`.
    Unlimited,
    /// [`HELD`] charged under a `max` of [`BREACHED_MAX`], then this
    /// enforcement.
    Breached(Enforcement),
}

impl Case {
    /// Every case, in table order.
    pub const ALL: [Case; 6] = [
        Case::UnderLimit,
        Case::BreachedCooperative,
        Case::BreachedRefuse,
        Case::BesideUnlimited,
        Case::BesideCooperative,
        Case::BesideRefuse,
    ];

    /// The case name (two-thread cases' records add the role).
    pub fn name(self) -> &'static str {
        match self {
            Case::UnderLimit => UNDER_LIMIT,
            Case::BreachedCooperative => "breached-cooperative",
            Case::BreachedRefuse => "breached-refuse",
            Case::BesideUnlimited => BESIDE_UNLIMITED,
            Case::BesideCooperative => "beside-cooperative",
            Case::BesideRefuse => "beside-refuse",
        }
    }

    /// Threads: the noisy one, and the healthy one beside it.
    pub fn threads(self) -> usize {
        if self.beside() {
            2
        } else {
            1
        }
    }

    fn beside(self) -> bool {
        matches!(
            self,
            Case::BesideUnlimited | Case::BesideCooperative | Case::BesideRefuse
        )
    }

    fn limit(self) -> Limit {
        match self {
            Case::UnderLimit => Limit::Under,
            Case::BesideUnlimited => Limit::Unlimited,
            Case::BreachedCooperative | Case::BesideCooperative => {
                Limit::Breached(Enforcement::Cooperative)
            }
            Case::BreachedRefuse | Case::BesideRefuse => Limit::Breached(Enforcement::Refuse),
        }
    }
}

/// The cases of the suite's records, in table order: the one-thread
/// cases, then each two-thread case's roles (`beside-refuse-healthy`).
pub fn record_cases() -> Vec<String> {
    Case::ALL
        .iter()
        .flat_map(|c| match c.threads() {
            1 => vec![c.name().to_owned()],
            _ => ROLES.iter().map(|r| format!("{}-{r}", c.name())).collect(),
        })
        .collect()
}

/// The baseline of a record's case: [`UNDER_LIMIT`] for the one-thread
/// cases, the same role beside an unlimited neighbour for the others.
pub fn baseline_of(case: &str) -> Option<String> {
    match ROLES.iter().find(|r| case.ends_with(&format!("-{r}"))) {
        Some(role) => Some(format!("{BESIDE_UNLIMITED}-{role}")),
        None => Some(UNDER_LIMIT.to_owned()),
    }
}

/// Measure every case in the accounted worker process. `exe` is the lab
/// binary (its `alloc-worker` command runs the worker).
pub fn run(exe: &Path, plan: &Plan) -> Result<Bench, String> {
    let worker = RefCell::new(Worker::start(exe, Allocator::Accounted)?);
    let worker = &worker;
    let entries = Case::ALL
        .iter()
        .map(|&case| {
            let threads = case.threads();
            let e = Entry::from_fn(case.name(), threads, move |spec| {
                worker
                    .borrow_mut()
                    .run(&Request::new(SUITE, &case, threads, spec)?)
            });
            if case.beside() {
                e.roles(&ROLES)
            } else {
                e
            }
        })
        .collect();
    let measured = measure(SUITE, plan, entries)?;
    let mut bench = Bench::new(measured, baseline_of);
    // The healthy thread's figure is its rate: what the neighbour takes
    // from it includes time it was interrupted, which its CPU clock may
    // not count.
    for r in &mut bench.records {
        let Some(baseline) = r.baseline.clone().filter(|_| r.case.ends_with("-healthy")) else {
            continue;
        };
        if let Some(f) = bench.measured.rate(&r.case, &baseline, r.threads) {
            r.set_figure(f, baseline);
        }
    }
    bench.legend = vec![format!(
        "× of the *-healthy rows: the healthy thread's allocations per second (wall time) ÷ \
         {BESIDE_UNLIMITED}-healthy's in the same round — higher is better, 1 is unharmed; \
         of the other rows: ns per allocation (CPU time) ÷ the baseline's"
    )];
    Ok(bench)
}

/// One thread's loop: allocate a block and hold it; free the wave once
/// [`WAVE`] are held. Refusals are counted in `refused`.
struct Wave<'a> {
    held: Vec<Vec<u8>>,
    refused: &'a AtomicU64,
}

impl Wave<'_> {
    /// Build it outside any group scope: its own vector is not the loop's.
    fn new(refused: &AtomicU64) -> Wave<'_> {
        Wave {
            held: Vec::with_capacity(WAVE),
            refused,
        }
    }

    #[inline]
    fn op(&mut self) {
        let mut block: Vec<u8> = Vec::new();
        match block.try_reserve_exact(BLOCK) {
            Ok(()) => {
                if self.held.len() == WAVE {
                    self.held.clear();
                }
                self.held.push(black_box(block));
            }
            Err(_) => {
                // Relaxed: a count, read after the slice's threads joined.
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Slices run so far in this process: names their groups.
static SLICES: AtomicU64 = AtomicU64::new(0);

/// A group made for one slice, and the block it holds; removed after it.
struct SliceGroup {
    group: Group,
    held: Option<Vec<u8>>,
}

impl SliceGroup {
    /// A child of `parent` in the state `limit` names.
    fn new(parent: &Group, name: &str, limit: Limit) -> Result<SliceGroup, String> {
        let group = parent.child(name).map_err(|e| e.to_string())?;
        let held = match limit {
            Limit::Unlimited => None,
            Limit::Under => {
                group.set_max(ROOMY_MAX).map_err(|e| e.to_string())?;
                Some(group.scope(|| Vec::<u8>::with_capacity(HELD)))
            }
            Limit::Breached(enforcement) => {
                // Over the limit by a cooperative over-charge (a refusing
                // group would refuse it), then the enforcement asked for.
                group.set_max(BREACHED_MAX).map_err(|e| e.to_string())?;
                let held = group.scope(|| Vec::<u8>::with_capacity(HELD));
                group.set_enforcement(enforcement);
                Some(held)
            }
        };
        Ok(SliceGroup { group, held })
    }

    fn remove(mut self) -> Result<(), String> {
        drop(self.held.take());
        self.group.remove().map_err(|e| e.to_string())
    }
}

/// Run one slice of `case` in groups made under `parent` (the worker's),
/// and check that they did what the case says.
pub fn run_slice(case: Case, spec: SliceSpec, parent: &Group) -> Result<SliceRun, String> {
    let n = SLICES.fetch_add(1, Ordering::Relaxed);
    let limit = case.limit();
    let noisy = SliceGroup::new(parent, &format!("noisy-{n}"), limit)?;
    let healthy = if case.beside() {
        Some(SliceGroup::new(
            parent,
            &format!("healthy-{n}"),
            Limit::Under,
        )?)
    } else {
        None
    };
    let refused = [AtomicU64::new(0), AtomicU64::new(0)];
    let run = slice::run(case.threads(), spec, &|t| {
        let mut wave = Wave::new(&refused[t]);
        let group = match (t, &healthy) {
            (1, Some(h)) => &h.group,
            _ => &noisy.group,
        };
        let scope = group.enter();
        move || {
            let _in_group = &scope;
            wave.op()
        }
    });
    // Relaxed: the slice's threads have joined.
    let refused = refused.map(|r| r.load(Ordering::Relaxed));
    let checked = check(case, &noisy.group, refused);
    noisy.remove()?;
    if let Some(h) = healthy {
        h.remove()?;
    }
    checked.map(|()| run)
}

/// What a slice of `case` must leave behind: its breached group still over
/// its limit, refusals by the noisy thread (`refused[0]`) exactly where
/// its group refuses, none by the healthy one.
fn check(case: Case, noisy: &Group, refused: [u64; 2]) -> Result<(), String> {
    let (breached, refuses) = match case.limit() {
        Limit::Breached(e) => (true, e == Enforcement::Refuse),
        Limit::Under | Limit::Unlimited => (false, false),
    };
    let name = case.name();
    if breached && noisy.usage() <= noisy.max() {
        return Err(format!(
            "{name}: the group is not over its limit (usage {} of {})",
            noisy.usage(),
            noisy.max()
        ));
    }
    if refuses && refused[0] == 0 {
        return Err(format!(
            "{name}: no allocation was refused in a group over its limit"
        ));
    }
    if (!refuses && refused[0] > 0) || refused[1] > 0 {
        return Err(format!(
            "{name}: allocations refused where none should be (noisy, healthy: {refused:?})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitcount::group::Hierarchy;
    use std::time::Duration;

    #[test]
    fn each_role_is_compared_with_the_same_role_beside_an_unlimited_neighbour() {
        assert_eq!(
            baseline_of("beside-cooperative-healthy").unwrap(),
            "beside-unlimited-healthy"
        );
        assert_eq!(
            baseline_of("beside-refuse-noisy").unwrap(),
            "beside-unlimited-noisy"
        );
        assert_eq!(baseline_of("breached-refuse").unwrap(), UNDER_LIMIT);
        assert_eq!(baseline_of(UNDER_LIMIT).unwrap(), UNDER_LIMIT);
    }

    #[test]
    fn a_wave_frees_its_blocks_once_it_holds_a_wave_of_them() {
        let refused = AtomicU64::new(0);
        let mut wave = Wave::new(&refused);
        for _ in 0..WAVE {
            wave.op();
        }
        assert_eq!(wave.held.len(), WAVE);
        wave.op();
        assert_eq!(wave.held.len(), 1);
        assert_eq!(refused.load(Ordering::Relaxed), 0);
    }

    /// Unit tests run on `System`, so nothing is charged and the breached
    /// cases' checks fail; the others run a slice in their groups and
    /// leave none behind.
    #[test]
    fn a_slice_runs_in_groups_of_its_own_and_removes_them() {
        let h = Hierarchy::default();
        let parent = h.root().child("bench").unwrap();
        let spec = SliceSpec {
            length: Duration::from_millis(5),
            batch: 16,
        };
        for case in [Case::UnderLimit, Case::BesideUnlimited] {
            let run = run_slice(case, spec, &parent).unwrap();
            assert_eq!(run.threads.len(), case.threads(), "{case:?}");
            assert!(run.threads.iter().all(|t| t.ops > 0), "{case:?}");
        }
        let e = run_slice(Case::BreachedCooperative, spec, &parent).unwrap_err();
        assert!(e.contains("not over its limit"), "{e}");
        assert!(parent.children().is_empty());
    }
}
