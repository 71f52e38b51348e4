//! Real threads: 8 threads (more than the cores) re-pinned across CPUs while
//! they add 10⁶ mixed-sign deltas each; after join, `precise()` is the exact
//! sum and the settled `approximate()` is inside the bound, for every design.

mod common;

use common::{online_cpu_ids, pin_to, unpin, Rng};
use splitcount::counter::{Config, Design, SplitCounter};
use std::sync::Arc;

const THREADS: usize = 8;
const ADDS: usize = 1_000_000;

#[test]
fn no_update_is_lost_under_migration_for_any_design() {
    let online = Arc::new(online_cpu_ids());
    for design in Design::ALL {
        // A small batch so that carries and spills happen all the time.
        let batch = if design == Design::Atomic { 1 } else { 8 };
        let c: Arc<dyn SplitCounter> = Config::new(design).batch(batch).build().unwrap().into();
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (c, online) = (c.clone(), online.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng::new(7 + t as u64);
                    let mut sum = 0i64;
                    for i in 0..ADDS {
                        if i % 10_000 == 0 {
                            pin_to(online[rng.below(online.len() as u64) as usize]);
                        }
                        let d = rng.delta(100);
                        c.add(d);
                        sum += d;
                    }
                    unpin(&online);
                    sum
                })
            })
            .collect();
        let want: i64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(c.precise(), want, "{design}");
        assert!(c.accuracy().admits(c.approximate(), want), "{design}");
    }
}
