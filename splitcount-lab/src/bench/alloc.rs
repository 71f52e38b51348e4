//! `bench alloc`: a malloc-heavy workload (many small allocations and
//! frees) through the system allocator, plain and wrapped in
//! [`Accounted`], in the same run.
//!
//! Each op frees the oldest of 64 live blocks and allocates a new one of 16
//! to 512 bytes, calling the allocator directly (`GlobalAlloc::alloc` /
//! `dealloc`), so both cases run in this one process. In the `accounted`
//! case each thread runs inside a group scope of its own.

use super::{measure, set_ratios, Record};
use splitcount::alloc::Accounted;
use splitcount::group::Hierarchy;
use std::alloc::{GlobalAlloc, Layout, System};
use std::time::Duration;

/// The baseline every case is divided by.
pub const BASELINE: &str = "system";

const LIVE: usize = 64;

/// One thread's ring of live blocks.
struct Ring<'a, A: GlobalAlloc> {
    alloc: &'a A,
    blocks: Vec<(*mut u8, Layout)>,
    next: usize,
    seed: u64,
}

impl<'a, A: GlobalAlloc> Ring<'a, A> {
    fn new(alloc: &'a A, seed: u64) -> Self {
        Ring {
            alloc,
            blocks: Vec::with_capacity(LIVE),
            next: 0,
            seed: seed | 1,
        }
    }

    #[inline]
    fn op(&mut self) {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let size = 16 + (self.seed % 497) as usize;
        let layout = Layout::from_size_align(size, 8).expect("small sizes");
        // SAFETY: non-zero size; the block is freed with its own layout.
        let p = unsafe { self.alloc.alloc(layout) };
        assert!(!p.is_null(), "unlimited");
        // SAFETY: `p` has `size` bytes.
        unsafe { p.write(size as u8) };
        if self.blocks.len() < LIVE {
            self.blocks.push((p, layout));
        } else {
            let (old, l) = std::mem::replace(&mut self.blocks[self.next], (p, layout));
            self.next = (self.next + 1) % LIVE;
            // SAFETY: allocated above by the same allocator with `l`.
            unsafe { self.alloc.dealloc(old, l) };
        }
    }
}

impl<A: GlobalAlloc> Drop for Ring<'_, A> {
    fn drop(&mut self) {
        for &(p, l) in &self.blocks {
            // SAFETY: each block was allocated by `alloc` with `l`.
            unsafe { self.alloc.dealloc(p, l) };
        }
    }
}

/// Measure both cases at each thread count.
pub fn run(threads: &[usize], duration: Duration) -> Vec<Record> {
    let accounted: &'static Accounted<System> = Box::leak(Box::new(Accounted::new(System)));
    let memory = Hierarchy::default();
    accounted.attach(&memory).expect("a fresh allocator");
    let bench = memory.root().child("bench").expect("fresh hierarchy");
    let groups: Vec<_> = (0..threads.iter().copied().max().unwrap_or(1))
        .map(|t| bench.child(&format!("t{t}")).expect("unique names"))
        .collect();
    let mut records = Vec::new();
    for &t in threads {
        records.push(measure("alloc", BASELINE, t, duration, |i| {
            let mut ring = Ring::new(&System, i as u64 + 1);
            move || ring.op()
        }));
        records.push(measure("alloc", "accounted", t, duration, |i| {
            let scope = groups[i].enter();
            let mut ring = Ring::new(accounted, i as u64 + 1);
            move || {
                let _ = &scope;
                ring.op()
            }
        }));
    }
    set_ratios(&mut records, BASELINE);
    records
}
