//! `bench charge`: what accounting costs in a page-fault-like loop — on the
//! stock's hit path, on its miss path, and with tenants sharing a CPU's
//! stock slots.
//!
//! Every op writes a 4 KiB page from the thread's private pool (the
//! "fault") and, except in the baseline, charges one unit; each thread
//! uncharges as it goes so that its usage stays bounded. Each case has a
//! hierarchy, and so a stock, of its own: the keys one case leaves in a
//! CPU's slots are not in the next case's way (a key found after scanning
//! past 62 others costs more than one found first).
//!
//! - `no-accounting` (the baseline): the page write alone.
//! - `usage-counter`: `try_charge`/`uncharge` on the usage counters of a
//!   group two levels deep, no stock; once 64 pages are outstanding, each op
//!   also uncharges one.
//! - `stock`: the same through `Group::charge`/`uncharge`: the stock's hit
//!   path (the thread's group always has units in this CPU's stock).
//! - `stock-misses`: a working set larger than the stock can hold: each op
//!   charges a unit to the thread's current group — one of 72 (more than
//!   the 63 slots), switching every 96 ops — and uncharges the unit charged
//!   256 ops before (more than the 64-unit batch outstanding, spread over
//!   groups whose slots have been evicted): the same two calls per op as
//!   `stock`, but refills, drains and evictions on most of them.
//! - `{4,8}-tenants-{1-slot,7-slots}`: each thread serves 4 or 8 tenants
//!   in turn, op by op (a server multiplexing requests), with a CPU stock of
//!   1 slot (the kernel before 6.16) or 7 (the kernel's since). With 4
//!   tenants, 7 slots keep every tenant's units; with more tenants than
//!   slots, the kernel's round-robin eviction would miss on every op — the
//!   stock's admission filter keeps the keys in the slots hitting and lets
//!   the tenants left out charge the usage counters directly (3 ops in 4
//!   with 1 slot and 4 tenants, 1 in 8 with 7 slots and 8 tenants).
//! - `8-tenants`, `32-tenants`: the same with the default stock — 63 slots
//!   and a budget of 7 batches per CPU: 8 tenants each keep a batch's worth
//!   (56 units: the budget's share), 32 keep 14 units each and refill once
//!   per 14 of their charges.
//! - `bare-rseq` (the floor): the page write and two bare per-CPU rseq adds
//!   ([`super::bare_rseq`]), +1 for the charge and −1 for the uncharge —
//!   the least any per-CPU stock can do per op; only where glibc
//!   registered rseq.

use super::bare_rseq::BareRseq;
use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use splitcount::group::{Group, Hierarchy, HierarchyConfig};
use std::hint::black_box;

/// The baseline every case is divided by.
pub const BASELINE: &str = "no-accounting";

/// The floor: two bare rseq adds per op.
pub const BARE_RSEQ: &str = "bare-rseq";

/// Pages in a thread's pool, and charges outstanding before uncharging.
const POOL: usize = 64;

/// Ops charging one group before switching, in `stock-misses`.
const BURST: usize = 96;

/// Groups each thread cycles through in `stock-misses` (more than a CPU's
/// 63 slots).
const MISS_GROUPS: usize = 72;

/// Units outstanding in `stock-misses`: each op uncharges the unit
/// charged this many ops before.
const MISS_WINDOW: usize = 256;

/// The cases, in table order (`bare-rseq` only where glibc registered
/// rseq).
pub const CASES: [&str; 11] = [
    BASELINE,
    BARE_RSEQ,
    "usage-counter",
    "stock",
    "stock-misses",
    "4-tenants-1-slot",
    "4-tenants-7-slots",
    "8-tenants-1-slot",
    "8-tenants-7-slots",
    "8-tenants",
    "32-tenants",
];

/// A thread's private pool of pages, written one by one.
struct Pages {
    pool: Vec<[u8; 4096]>,
    next: usize,
}

impl Pages {
    fn new() -> Pages {
        // Written once here, so no first-touch page fault lands in a
        // timed loop.
        Pages {
            pool: vec![[1u8; 4096]; POOL],
            next: 0,
        }
    }

    /// "Fault in" the next page: write all of it.
    #[inline]
    fn touch(&mut self) {
        let i = self.next % POOL;
        self.next = self.next.wrapping_add(1);
        self.pool[i].fill(self.next as u8);
        black_box(&self.pool[i]);
    }
}

/// Units a thread holds charged, per group, returned when the thread's
/// operation is dropped (after its timed loop), so usage stays bounded.
/// `direct`: on the usage counters (`usage-counter`), not through the
/// stock.
pub(super) struct Held<'g> {
    groups: &'g [Group],
    held: Vec<u64>,
    direct: bool,
}

impl<'g> Held<'g> {
    /// Thread `t`'s share of `groups`: the `per_thread` after the first
    /// `t · per_thread`.
    pub(super) fn of_thread(
        groups: &'g [Group],
        per_thread: usize,
        t: usize,
        direct: bool,
    ) -> Held<'g> {
        Held::new(&groups[t * per_thread..(t + 1) * per_thread], direct)
    }

    pub(super) fn new(groups: &'g [Group], direct: bool) -> Held<'g> {
        Held {
            groups,
            held: vec![0; groups.len()],
            direct,
        }
    }

    #[inline]
    pub(super) fn charge(&mut self, i: usize, n: u64) {
        let g = &self.groups[i];
        if self.direct {
            splitcount::raw::usage_counter(g)
                .try_charge(n)
                .expect("unlimited");
        } else {
            g.charge(n).expect("unlimited");
        }
        self.held[i] += n;
    }

    /// The usage of the groups together (their counters: stocked units
    /// included).
    #[cfg(test)]
    pub(super) fn groups_usage(&self) -> u64 {
        self.groups.iter().map(Group::usage).sum()
    }

    #[inline]
    pub(super) fn uncharge(&mut self, i: usize, n: u64) {
        let g = &self.groups[i];
        if self.direct {
            splitcount::raw::usage_counter(g).uncharge(n);
        } else {
            g.uncharge(n);
        }
        self.held[i] -= n;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for i in 0..self.groups.len() {
            let n = self.held[i];
            self.uncharge(i, n);
        }
    }
}

/// The page-fault loop on `groups` (one thread's), serving them in turn
/// op by op; once 64 units are outstanding each op also uncharges one.
fn tenants<'a>(
    case: &str,
    threads: usize,
    groups: &'a [Group],
    per_thread: usize,
    direct: bool,
) -> Entry<'a> {
    Entry::new(case, threads, move |t| {
        let mut pages = Pages::new();
        let mut held = Held::of_thread(groups, per_thread, t, direct);
        let mut turn = 0;
        let mut outstanding = 0;
        move || {
            pages.touch();
            let i = turn % per_thread;
            turn += 1;
            held.charge(i, 1);
            if outstanding == POOL {
                held.uncharge(i, 1);
            } else {
                outstanding += 1;
            }
        }
    })
}

/// `stock-misses`: a unit to the current group (switching every
/// [`BURST`] ops among [`MISS_GROUPS`]), and back the unit charged
/// [`MISS_WINDOW`] ops before.
fn misses<'a>(threads: usize, groups: &'a [Group]) -> Entry<'a> {
    Entry::new("stock-misses", threads, move |t| {
        let mut pages = Pages::new();
        let mut held = Held::of_thread(groups, MISS_GROUPS, t, false);
        // Which group each of the last MISS_WINDOW ops charged.
        let mut window = [usize::MAX; MISS_WINDOW];
        let mut op = 0usize;
        move || {
            pages.touch();
            let group = (op / BURST) % MISS_GROUPS;
            held.charge(group, 1);
            let slot = op % MISS_WINDOW;
            let old = std::mem::replace(&mut window[slot], group);
            if old != usize::MAX {
                held.uncharge(old, 1);
            }
            op = op.wrapping_add(1);
        }
    })
}

/// `count` children of `parent` (the hierarchy's `/bench`: two levels
/// deep), named `{prefix}{i}`.
pub(super) fn groups(parent: &Group, prefix: &str, count: usize) -> Result<Vec<Group>, String> {
    (0..count)
        .map(|i| {
            parent
                .child(&format!("{prefix}{i}"))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// A hierarchy with `slots` stock slots per CPU (and the default budget),
/// and its `/bench` group.
pub(super) fn hierarchy(slots: usize) -> Result<(Hierarchy, Group), String> {
    let h =
        Hierarchy::new(HierarchyConfig::default().stock_slots(slots)).map_err(|e| e.to_string())?;
    let bench = h.root().child("bench").map_err(|e| e.to_string())?;
    Ok((h, bench))
}

/// Measure every case at each thread count.
pub fn run(threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    let most = threads.iter().copied().max().unwrap_or(1);
    // Each case has a hierarchy (and so a stock) of its own: what one case
    // leaves in the slots — 72 groups of `stock-misses`, 32 tenants — is
    // not the next case's starting point.
    let default = || hierarchy(splitcount::raw::MAX_STOCK_SLOTS);
    let tenants_of = |(h, parent): (Hierarchy, Group), n: usize| {
        groups(&parent, &format!("t{n}-"), most * n).map(|g| (h, g))
    };
    let (_hs, shared) = default()?;
    // One group shared by all threads: the page-fault loop of a process.
    let shared = groups(&shared, "tenant", 1)?;
    let shared: Vec<Group> = vec![shared[0].clone(); most];
    let (_hm, missing) = default()?;
    let missing = groups(&missing, "miss", most * MISS_GROUPS)?;
    let (_h41, four_1) = tenants_of(hierarchy(1)?, 4)?;
    let (_h47, four_7) = tenants_of(hierarchy(7)?, 4)?;
    let (_h81, eight_1) = tenants_of(hierarchy(1)?, 8)?;
    let (_h87, eight_7) = tenants_of(hierarchy(7)?, 8)?;
    let (_h8, eight) = tenants_of(default()?, 8)?;
    let (_h32, many) = tenants_of(default()?, 32)?;
    let bare = BareRseq::new();

    let mut entries = Vec::new();
    for &t in threads {
        entries.push(Entry::new(BASELINE, t, |_| {
            let mut pages = Pages::new();
            move || pages.touch()
        }));
        if let Some(bare) = &bare {
            entries.push(Entry::new(BARE_RSEQ, t, move |_| {
                let mut pages = Pages::new();
                move || {
                    pages.touch();
                    bare.add(black_box(1));
                    bare.add(black_box(-1));
                }
            }));
        }
        entries.push(tenants("usage-counter", t, &shared, 1, true));
        entries.push(tenants("stock", t, &shared, 1, false));
        entries.push(misses(t, &missing));
        entries.push(tenants("4-tenants-1-slot", t, &four_1, 4, false));
        entries.push(tenants("4-tenants-7-slots", t, &four_7, 4, false));
        entries.push(tenants("8-tenants-1-slot", t, &eight_1, 8, false));
        entries.push(tenants("8-tenants-7-slots", t, &eight_7, 8, false));
        entries.push(tenants("8-tenants", t, &eight, 8, false));
        entries.push(tenants("32-tenants", t, &many, 32, false));
    }
    let measured = measure("charge", plan, entries)?;
    Ok(Bench::new(measured, |_| Some(BASELINE.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_case_is_measured_in_table_order() {
        let plan = Plan {
            rounds: 1,
            slice: Duration::from_millis(5),
        };
        let bench = run(&[1], &plan).unwrap();
        let cases: Vec<&str> = bench.records.iter().map(|r| r.case.as_str()).collect();
        let rseq = BareRseq::new().is_some();
        let expected: Vec<&str> = CASES
            .into_iter()
            .filter(|&c| rseq || c != BARE_RSEQ)
            .collect();
        assert_eq!(cases, expected);
    }
}
