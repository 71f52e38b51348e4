//! `bench charge`: what accounting costs in a page-fault-like loop, and what
//! several groups per CPU stock buy when tenants share CPUs.
//!
//! - **page-fault loop.** Each op writes a 4 KiB page from the thread's
//!   private pool, charges one unit to a group two levels deep and, once 64
//!   pages are outstanding, uncharges one. Cases: `no-accounting` (the page
//!   write alone), `usage-counter` (direct `try_charge`/`uncharge` on the
//!   usage counters, no stock), `stock` (`Group::charge`/`uncharge`).
//! - **multi-tenant.** The same loop with one group per thread and at least
//!   four threads per core, with a CPU stock of 1 slot (`stock-1-slot`, the
//!   kernel before 6.16: tenants sharing a CPU evict each other) or 7
//!   (`stock-7-slots`). Threads switch only every scheduler time slice, so
//!   the slots rarely matter there; the `interleaved-*` cases have each
//!   thread serve four tenants in turn, op by op (a server multiplexing
//!   requests), where one slot misses on every op.

use super::{measure, set_ratios, Record};
use splitcount::group::{Group, Hierarchy, HierarchyConfig};
use std::hint::black_box;
use std::time::Duration;

/// The baseline every case is divided by.
pub const BASELINE: &str = "no-accounting";

const POOL: usize = 64;

/// A thread's private pool of pages and its count of outstanding charges.
struct Pages {
    pool: Vec<[u8; 4096]>,
    next: usize,
    outstanding: usize,
}

impl Pages {
    fn new() -> Pages {
        Pages {
            pool: vec![[0u8; 4096]; POOL],
            next: 0,
            outstanding: 0,
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

    /// Whether the oldest page should be released now.
    #[inline]
    fn release_one(&mut self) -> bool {
        if self.outstanding == POOL {
            true
        } else {
            self.outstanding += 1;
            false
        }
    }
}

fn two_deep(h: &Hierarchy, name: &str) -> Group {
    let tenant = h.root().child("bench").and_then(|b| b.child(name));
    tenant.expect("fresh hierarchy, valid names")
}

fn page_fault_case(
    case: &str,
    threads: usize,
    duration: Duration,
    group: Option<&Group>,
    stock: bool,
) -> Record {
    measure("charge", case, threads, duration, |_| {
        let mut pages = Pages::new();
        move || {
            pages.touch();
            let Some(g) = group else { return };
            let release = pages.release_one();
            if stock {
                g.charge(1).expect("unlimited");
                if release {
                    g.uncharge(1);
                }
            } else {
                g.usage_counter().try_charge(1).expect("unlimited");
                if release {
                    g.usage_counter().uncharge(1);
                }
            }
        }
    })
}

fn multi_tenant_case(
    case: &str,
    threads: usize,
    duration: Duration,
    slots: usize,
    per_thread: usize,
) -> Record {
    let h = Hierarchy::new(HierarchyConfig::default().stock_slots(slots)).expect("valid slots");
    let bench = h.root().child("bench").expect("fresh hierarchy");
    let groups: Vec<Group> = (0..threads * per_thread)
        .map(|t| bench.child(&format!("tenant-{t}")).expect("unique names"))
        .collect();
    measure("charge", case, threads, duration, |t| {
        let mine: Vec<Group> = groups[t * per_thread..(t + 1) * per_thread].to_vec();
        let mut pages = Pages::new();
        let mut turn = 0;
        move || {
            pages.touch();
            let g = &mine[turn % per_thread];
            turn += 1;
            g.charge(1).expect("unlimited");
            if pages.release_one() {
                g.uncharge(1);
            }
        }
    })
}

/// Measure the page-fault loop at each thread count, and the multi-tenant
/// cases at four threads per core (at least 8).
pub fn run(threads: &[usize], duration: Duration) -> Vec<Record> {
    let mut records = Vec::new();
    for &t in threads {
        let h = Hierarchy::default();
        let g = two_deep(&h, "tenant");
        records.push(page_fault_case(BASELINE, t, duration, None, false));
        records.push(page_fault_case(
            "usage-counter",
            t,
            duration,
            Some(&g),
            false,
        ));
        records.push(page_fault_case("stock", t, duration, Some(&g), true));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let tenants = (4 * cores).max(8);
    if !threads.contains(&tenants) {
        records.push(page_fault_case(BASELINE, tenants, duration, None, false));
    }
    records.push(multi_tenant_case("stock-1-slot", tenants, duration, 1, 1));
    records.push(multi_tenant_case("stock-7-slots", tenants, duration, 7, 1));
    let t = threads.iter().copied().max().unwrap_or(1);
    records.push(multi_tenant_case("interleaved-1-slot", t, duration, 1, 4));
    records.push(multi_tenant_case("interleaved-7-slots", t, duration, 7, 4));
    set_ratios(&mut records, BASELINE);
    records
}
