//! `bench fault`: the kernel's 2009 memcg experiment in the lab — real
//! first-touch page faults, each charged one unit as the kernel charges a
//! page, against the same faults without accounting.
//!
//! One op, per thread:
//!
//! ```text
//!  mmap   64 pages of anonymous memory (256 KiB: no huge page fits)
//!  64 ×   write one byte of the next page   ; a first-touch page fault
//!         charge 1 unit                      ; mem_cgroup_charge
//!  munmap                                    ; the pages are freed
//!  64 ×   uncharge 1 unit                    ; mem_cgroup_uncharge
//! ```
//!
//! The records are per fault: `ns_per_op` is an op's CPU time ÷ [`PAGES`]
//! (the kernel's time in the faults and in `munmap` included: thread CPU
//! time counts both), `ops_per_sec` faults per second of all threads
//! (wall time), and `ratio` the thread's faults per second ÷ the
//! baseline's in the same round (the inverse of the time ratio): 1 is no
//! cost, 0.5 half the faults — as the seed's table reads.
//!
//! - `no-accounting` (the baseline): the faults alone;
//! - `root`: `Group::charge`/`uncharge` on the hierarchy's root;
//! - `usage-counter`: a child group two levels deep, `try_charge`/`uncharge`
//!   on its usage counters directly (the kernel before the stock);
//! - `stock`: the same child through `Group::charge`/`uncharge` (the
//!   per-CPU stock, the kernel's charge coalescing);
//! - `8-tenants`, `32-tenants`: each thread serves 8 or 32 groups in turn,
//!   fault by fault (each fault charged to the next tenant), through the
//!   default stock (63 slots and a budget of 7 batches per CPU).
//!
//! The root and the child share a hierarchy; the tenants of each case have
//! one of their own, so that no case starts from the keys another left in
//! the stock's slots.
//!
//! Every thread maps its own memory, but the threads share one address
//! space: their `mmap`/`munmap` take the same `mmap_lock` and `munmap`
//! flushes the other CPU's TLB — the same for every case, so in the ratios
//! too. Cache misses per fault, the seed's second column, need a hardware
//! counter: [`cache_misses`] says whether this machine has one; the suite
//! does not count them.

use super::charge::{groups, hierarchy, Held, BASELINE as CHARGE_BASELINE};
use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use splitcount::group::Group;
use std::hint::black_box;

/// The suite's name.
pub const SUITE: &str = "fault";

/// The baseline every case is compared with.
pub const BASELINE: &str = CHARGE_BASELINE;

/// Pages mapped, faulted in and unmapped per op: a batch of faults.
pub const PAGES: usize = 64;

const PAGE: usize = 4096;

/// The cases, in table order.
pub const CASES: [&str; 6] = [
    BASELINE,
    "root",
    "usage-counter",
    "stock",
    "8-tenants",
    "32-tenants",
];

/// One op: map [`PAGES`] pages, fault each in (calling `charge(cx, p)`
/// after page `p`'s fault), unmap them, then call `uncharge(cx, p)` for
/// each.
#[inline]
fn faults<C>(cx: &mut C, charge: impl Fn(&mut C, usize), uncharge: impl Fn(&mut C, usize)) {
    let len = PAGES * PAGE;
    // SAFETY: a fresh private anonymous mapping; no address requested.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED, "mmap of {len} bytes failed");
    let base = base.cast::<u8>();
    for p in 0..PAGES {
        // SAFETY: `p·PAGE` is inside the `len` bytes just mapped writable.
        unsafe { base.add(p * PAGE).write_volatile(p as u8) };
        charge(cx, p);
    }
    black_box(base);
    // SAFETY: unmaps exactly the mapping made above; nothing refers to it.
    let r = unsafe { libc::munmap(base.cast(), len) };
    assert_eq!(r, 0, "munmap failed");
    for p in 0..PAGES {
        uncharge(cx, p);
    }
}

/// The fault loop charging `groups` (one thread's `per_thread` of them,
/// each fault to the next in turn).
fn charged<'a>(
    case: &str,
    threads: usize,
    groups: &'a [Group],
    per_thread: usize,
    direct: bool,
) -> Entry<'a> {
    Entry::new(case, threads, move |t| {
        let mut held = Held::of_thread(groups, per_thread, t, direct);
        let mut turn = 0;
        move || {
            let first = turn;
            turn = (turn + PAGES) % per_thread;
            faults(
                &mut held,
                |h, p| h.charge((first + p) % per_thread, 1),
                |h, p| h.uncharge((first + p) % per_thread, 1),
            );
        }
    })
}

/// Measure every case at each thread count; records per fault.
pub fn run(threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    let most = threads.iter().copied().max().unwrap_or(1);
    let default = || hierarchy(splitcount::raw::MAX_STOCK_SLOTS);
    let (h, bench) = default()?;
    let root = vec![h.root(); most];
    let child = groups(&bench, "process", 1)?;
    let child: Vec<Group> = vec![child[0].clone(); most];
    let (_h8, eight) = default()?;
    let eight = groups(&eight, "t8-", most * 8)?;
    let (_h32, many) = default()?;
    let many = groups(&many, "t32-", most * 32)?;

    let mut entries = Vec::new();
    for &t in threads {
        entries.push(Entry::new(BASELINE, t, |_| {
            || faults(&mut (), |_, _| {}, |_, _| {})
        }));
        entries.push(charged("root", t, &root, 1, false));
        entries.push(charged("usage-counter", t, &child, 1, true));
        entries.push(charged("stock", t, &child, 1, false));
        entries.push(charged("8-tenants", t, &eight, 8, false));
        entries.push(charged("32-tenants", t, &many, 32, false));
    }
    let measured = measure(SUITE, plan, entries)?;
    let mut b = Bench::new(measured, |_| Some(BASELINE.to_owned()));
    for r in &mut b.records {
        r.ns_per_op /= PAGES as f64;
        r.ops_per_sec *= PAGES as f64;
        if let Some(f) = b.measured.speedup(&r.case, BASELINE, r.threads) {
            r.set_figure(f, BASELINE.to_owned());
        }
    }
    b.legend = vec![
        format!(
            "one op maps {PAGES} pages, faults each in with a one-byte write (charging a unit \
             per fault), unmaps them and uncharges: ns are per fault (CPU time, the kernel's \
             included), × is the thread's faults per second ÷ {BASELINE}'s in the same round \
             — higher is better, 1 is no cost"
        ),
        format!("cache misses per fault: {}", cache_misses()),
    ];
    Ok(b)
}

/// Whether this machine can count cache misses (a hardware counter,
/// `PERF_COUNT_HW_CACHE_MISSES`), in words; the suite does not count them
/// either way.
pub fn cache_misses() -> String {
    match crate::machine::host::hardware_counter(HW_CACHE_MISSES) {
        Ok(()) => "a hardware counter is available here, but the lab does not count them \
                   (not measured)"
            .to_owned(),
        Err(why) => format!("not measured: {why}"),
    }
}

/// `PERF_COUNT_HW_CACHE_MISSES`.
const HW_CACHE_MISSES: u64 = 3;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_case_is_measured_per_fault_against_no_accounting() {
        let bench = run(&[1], &Plan::split(Duration::from_millis(5), 1)).unwrap();
        let cases: Vec<&str> = bench.records.iter().map(|r| r.case.as_str()).collect();
        assert_eq!(cases, CASES);
        for r in &bench.records {
            assert_eq!(r.baseline.as_deref(), Some(BASELINE));
            assert!(r.ns_per_op > 0.0 && r.ratio.unwrap() > 0.0, "{r:?}");
        }
        assert!(bench.legend.iter().any(|l| l.starts_with("cache misses")));
    }

    #[test]
    fn an_op_charges_a_unit_per_fault_and_uncharges_them_all_after_munmap() {
        let (_h, bench) = hierarchy(7).unwrap();
        let g = groups(&bench, "g", 3).unwrap();
        // On the usage counters directly: no stock holds units back.
        let mut cx = (Held::new(&g, true), 0u64);
        faults(
            &mut cx,
            |(h, peak), p| {
                h.charge(p % 3, 1);
                *peak = (*peak).max(h.groups_usage());
            },
            |(h, _), p| h.uncharge(p % 3, 1),
        );
        assert_eq!(cx.1, PAGES as u64, "every fault charged before munmap");
        assert_eq!(cx.0.groups_usage(), 0, "every unit back after it");
    }
}
