//! With the trim policy on, a spike freed gives the resident set back.
//!
//! Its own process, on the main thread (`harness = false`): glibc serves
//! the main thread from its main arena, whose top `malloc_trim` returns.
//! In another thread's arena glibc leaves the top chunk (`mtrim` trims only
//! the main arena's top), so how much a trim returns there depends on where
//! the spike's last blocks lay: that case is measured in `IMPLEMENTATION.md`
//! (§7, *Reconciliation*), not asserted here.

fn main() {
    #[cfg(not(loom))]
    spike::main();
}

#[cfg(not(loom))]
#[macro_use]
mod common;

#[cfg(not(loom))]
mod spike {
    use splitcount::alloc::{drain_thread, Reconciliation, TrimPolicy};
    use std::time::{Duration, Instant};

    accounted_heap!();

    /// 2,000,000 blocks of 100 bytes (~250 MB of chunks), held in vectors of
    /// 1,000 so that no block is large enough for glibc to map on its own
    /// (freeing one would raise its trim threshold).
    const BLOCKS: usize = 2_000_000;
    const PER_VEC: usize = 1_000;

    fn reconcile() -> Reconciliation {
        drain_thread();
        ALLOC.reconcile().expect("attached")
    }

    fn mib(r: &Reconciliation) -> f64 {
        r.resident_mapped.expect("smaps") as f64 / 1048576.0
    }

    /// Allocate the spike in a group, free it, remove the group; the resident
    /// set at the peak and after (once a trim ran, if `trim`).
    fn spike(trim: bool) -> (Reconciliation, Reconciliation) {
        ALLOC.set_trim(if trim {
            TrimPolicy::on_remove()
        } else {
            TrimPolicy::OFF
        });
        let trims = reconcile().trims;
        let g = memory().root().child("spike").unwrap();
        let blocks: Vec<Vec<Box<[u8]>>> = g.scope(|| {
            (0..BLOCKS / PER_VEC)
                .map(|_| {
                    (0..PER_VEC)
                        .map(|_| vec![9u8; 100].into_boxed_slice())
                        .collect()
                })
                .collect()
        });
        let peak = reconcile();
        drop(blocks);
        g.remove().unwrap();
        if trim {
            // The policy's trim runs on its background thread.
            let until = Instant::now() + Duration::from_secs(5);
            while reconcile().trims == trims && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            assert!(reconcile().trims > trims, "the removal trimmed");
        }
        (peak, reconcile())
    }

    pub fn main() {
        memory();
        ALLOC.trim();
        let pre = reconcile();
        let (peak_kept, kept) = spike(false);
        ALLOC.trim();
        let (peak, trimmed) = spike(true);
        ALLOC.set_trim(TrimPolicy::OFF);
        println!(
            "resident MiB: before {:.1}; without trim: peak {:.1}, after {:.1}; with trim: peak {:.1}, after {:.1}",
            mib(&pre),
            mib(&peak_kept),
            mib(&kept),
            mib(&peak),
            mib(&trimmed)
        );
        println!("{trimmed}");
        let (before, after) = (
            pre.resident_mapped.unwrap(),
            trimmed.resident_mapped.unwrap(),
        );
        // Within 10% of the resident set before the spike (the check the
        // documentation makes); glibc alone kept most of the spike.
        let ok = after <= before + before / 10 && kept.resident_mapped.unwrap() > before * 2;
        if ok {
            println!("1 passed, 0 failed");
        } else {
            println!("resident {after} after the spike, {before} before\n0 passed, 1 failed");
            std::process::exit(1);
        }
    }
}
