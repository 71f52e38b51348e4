//! Simulated machines far larger than the host cost what they touch, not
//! what they could touch: building one is linear in its size, and per-CPU
//! memory that no CPU wrote is never backed — not when allocated, and not
//! when freed. (One test per binary: it measures this process's RSS.)

#![cfg(target_os = "linux")]

use splitcount::counter::{Config, Design};
use splitcount::cpu::Machine;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[test]
fn huge_simulated_machines_cost_only_what_they_touch() {
    // 2²⁰ CPUs on 2¹⁶ nodes: built in linear time (it was O(nodes × CPUs)).
    let huge = Machine::simulated(1 << 20, 1 << 16).unwrap();
    assert_eq!(huge.cpus(), 1 << 20);
    let c = Config::new(Design::Tree).machine(&huge).build().unwrap();
    c.add_on((1 << 20) - 1, 5).unwrap();
    assert_eq!(c.precise(), 5);
    drop(c);

    // Dropping a counter zeroes its slots for the next owner: only the
    // slots that are not zero already, so untouched CPUs' pages stay
    // unbacked (a tree on 65,536 CPUs cost 254 MiB to drop).
    // The arena stays (as when counters share one): what a drop backs,
    // stays backed.
    let m = Machine::simulated(1 << 16, 64).unwrap();
    let arena = splitcount::raw::percpu::Arena::new(&m);
    let before = rss_bytes();
    for round in 0..4 {
        let c = Config::new(Design::Tree)
            .machine(&m)
            .arena(&arena)
            .build()
            .unwrap();
        for cpu in [0, 1, 1 << 15, (1 << 16) - 1] {
            c.add_on(cpu, 1 + round).unwrap();
        }
        assert_eq!(c.precise(), 4 * (1 + round));
        drop(c);
    }
    let grown = rss_bytes().saturating_sub(before);
    println!("RSS grew by {} KiB", grown >> 10);
    assert!(grown < 32 << 20, "RSS grew by {} MiB", grown >> 20);
}
