//! What per-request groups cost in memory: a removed group whose
//! allocations were freed leaves nothing behind, over 200,000 request
//! cycles (`child` → `set_max` → allocate in its scope → free → `remove`).
//! One test in this binary: it reads the process's RSS. Bounded, not timed.

#![cfg(target_os = "linux")]

use splitcount::alloc::Accounted;
use splitcount::group::Hierarchy;
use std::alloc::System;

#[global_allocator]
static ALLOC: Accounted<System> = Accounted::new(System);

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[test]
fn removed_request_groups_retain_nothing_and_live_ones_cost_little() {
    let h = Hierarchy::default();
    ALLOC.attach(&h).unwrap();
    let requests = h.root().child("requests").unwrap();
    requests.set_max(256 << 20).unwrap();
    let cycle = |i: u64| {
        let g = requests.child(&format!("request-{i}")).unwrap();
        g.set_max(1 << 20).unwrap();
        let body = g.scope(|| {
            let mut v = vec![i as u8; 1_000];
            v.extend_from_slice(b"response");
            String::from_utf8_lossy(&v).len()
        });
        assert!(body >= 1_000);
        g.remove().unwrap();
    };
    for i in 0..20_000 {
        cycle(i); // warm up: allocator arenas, the hierarchy's maps
    }
    let before = rss_bytes();
    let start = std::time::Instant::now();
    const CYCLES: u64 = 200_000;
    for i in 20_000..20_000 + CYCLES {
        cycle(i);
    }
    let ns = start.elapsed().as_nanos() as f64 / CYCLES as f64;
    let grown = rss_bytes().saturating_sub(before);
    println!(
        "{CYCLES} request cycles: RSS +{} KiB ({:.2} B per removed group), {ns:.0} ns per cycle",
        grown >> 10,
        grown as f64 / CYCLES as f64
    );
    // A page or two of noise at most: a leak of even 8 B per group would
    // be 1.6 MB here.
    assert!(grown < 512 << 10, "RSS grew by {} KiB", grown >> 10);
    assert!(requests.children().is_empty());
    h.drain_stocks();
    assert_eq!(requests.usage(), 0);

    // What a live group costs (no statistics in the schema).
    let before = rss_bytes();
    let live: Vec<_> = (0..20_000)
        .map(|i| {
            let g = requests.child(&format!("live-{i}")).unwrap();
            let _ = g.scope(|| Box::new(i));
            g
        })
        .collect();
    let per_group = rss_bytes().saturating_sub(before) as f64 / live.len() as f64;
    println!("a live group with an allocator account: about {per_group:.0} B");
    for g in &live {
        g.remove().unwrap();
    }
}
