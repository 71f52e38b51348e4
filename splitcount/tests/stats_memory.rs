//! A removed group's statistics are freed with its last handle, also when
//! the flusher kept references for its pushes (a hierarchy's groups keep
//! them from one flush to the next, and `Group::remove` gives them back).
//! Counts the heap's live bytes with a global allocator of its own: one
//! test in this binary.

use splitcount::cpu::Machine;
use splitcount::group::{Hierarchy, HierarchyConfig};
use splitcount::stat::StatItem;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// `System`, counting the bytes live.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to `System` with the caller's layout.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Relaxed);
        // SAFETY: the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Relaxed);
        // SAFETY: the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Groups updated on every CPU of a 4-CPU machine, flushed (so the
/// flusher keeps a reference per CPU for each), then removed: after a
/// warm-up, thousands of such cycles leave the live bytes where they were.
/// Without the references given back at removal, each cycle would keep
/// its group's statistics (hundreds of bytes).
#[test]
fn removed_groups_whose_statistics_were_folded_leave_nothing_behind() {
    let m = Machine::simulated(4, 1).unwrap();
    let h = Hierarchy::new(
        HierarchyConfig::default()
            .machine(&m)
            .stats(vec![StatItem::gauge("x")]),
    )
    .unwrap();
    let x = h.stat_id("x").unwrap();
    let tenants = h.root().child("tenants").unwrap();
    let cycle = |i: u64| {
        let g = tenants.child(&format!("g{i}")).unwrap();
        for cpu in 0..4 {
            m.set_current_cpu(cpu).unwrap();
            g.mod_stat(x, 1).unwrap();
        }
        assert!(h.root().flush(true));
        g.mod_stat(x, 1).unwrap(); // pushed again: no reference taken
        g.remove().unwrap();
    };
    for i in 0..2_000 {
        cycle(i);
    }
    let before = LIVE.load(Relaxed);
    for i in 2_000..12_000 {
        cycle(i);
    }
    let grown = LIVE.load(Relaxed) - before;
    assert!(
        grown < 10_000 * 8,
        "{grown} bytes live more after 10,000 removed groups"
    );
    assert!(h.root().flush(true));
    assert_eq!(h.root().stat(x).unwrap(), 12_000 * 5);
}
