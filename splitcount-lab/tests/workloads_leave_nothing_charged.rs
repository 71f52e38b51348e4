//! The allocator suite's workloads under `Accounted<System, Footprint>`:
//! each slice charges its threads' groups while it runs, and once its
//! blocks are freed, its threads gone and the stocks drained, **0 bytes
//! stay charged** — every workload, `btree` and `json` included.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use splitcount::alloc::{Accounted, Footprint};
use splitcount::group::{Group, Hierarchy};
use splitcount_lab::bench::alloc::workloads::{json_document, run_slice, Workload};
use splitcount_lab::timing::slice::SliceSpec;
use std::alloc::System;
use std::time::Duration;

#[global_allocator]
static ALLOC: Accounted<System, Footprint> = Accounted::with_charging(System, Footprint);

#[test]
fn every_workload_leaves_nothing_charged_once_its_blocks_are_freed() {
    let memory = Hierarchy::default();
    ALLOC.attach(&memory).unwrap();
    let groups: Vec<Group> = (0..2)
        .map(|t| memory.root().child(&format!("t{t}")).unwrap())
        .collect();
    let doc = json_document(50_000);
    let spec = SliceSpec {
        length: Duration::from_millis(20),
        batch: 1,
    };
    for workload in Workload::ALL {
        let threads = workload.thread_counts(&[1])[0];
        let run = run_slice(workload, threads, spec, &groups, &doc).unwrap();
        assert!(run.threads.iter().all(|t| t.ops > 0), "{workload:?}");
        assert!(
            groups[0].peak() > 0,
            "{workload:?}: nothing was charged to the first thread's group"
        );
        memory.drain_stocks();
        for g in &groups {
            assert_eq!(g.usage(), 0, "{workload:?}: {} still charged", g.path());
        }
    }
}
