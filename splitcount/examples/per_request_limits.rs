//! Per-request memory limits for a Rust server, with the allocator wrapper.
//!
//! Worker threads serve simulated requests, each inside its own group with a
//! 64 MiB limit, under a parent with a 256 MiB limit for all requests; each
//! request's group is removed when it is done.
//!
//! - **Cooperative** (the default): request 5 grows a buffer past its limit
//!   with an ordinary allocation. It succeeds — no abort — and the request
//!   sees the breach at its next checkpoint (`Group::check()`), gives up and
//!   reports the numbers, while every other request completes.
//! - **Refuse**: request 6 runs in a group that refuses over its limit, and
//!   asks with `try_reserve`, which reports the refusal.
//!
//! Run: `cargo run --release -p splitcount --example per_request_limits`

use splitcount::alloc::{take_last_refusal, Accounted};
use splitcount::charge::Enforcement;
use splitcount::group::{Group, Hierarchy};
use std::alloc::System;
use std::sync::mpsc;

#[global_allocator]
static ALLOC: Accounted<System> = Accounted::new(System);

const MIB: u64 = 1 << 20;

/// A simulated request: build `chunks` buffers of 4 MiB, checking the
/// group after each; the greedy one then grows a buffer to 96 MiB.
fn serve(group: &Group, id: usize, chunks: usize) -> Result<u64, String> {
    let mut buffers: Vec<Vec<u8>> = Vec::new();
    for i in 0..chunks {
        buffers.push(vec![(id + i) as u8; 4 * MIB as usize]);
        group.check().map_err(|e| e.to_string())?;
    }
    match id {
        // Cooperative: an ordinary allocation, over the limit.
        5 => {
            buffers.push(vec![1u8; 96 * MIB as usize]);
            group.check().map_err(|e| format!("gave up: {e}"))?;
        }
        // Refuse: the allocator says no, and try_reserve reports it.
        6 => {
            let mut big: Vec<u8> = Vec::new();
            if big.try_reserve_exact(96 * MIB as usize).is_err() {
                let why =
                    take_last_refusal().map_or_else(|| "refused".to_owned(), |r| r.to_string());
                return Err(why);
            }
            buffers.push(big);
        }
        _ => {}
    }
    Ok(buffers.iter().map(|b| b.len() as u64).sum())
}

fn main() {
    let memory = Hierarchy::default();
    ALLOC.attach(&memory).expect("attached once");
    let requests = memory.root().child("requests").expect("fresh hierarchy");
    requests.set_max(256 * MIB).expect("nothing charged yet");

    let (tx, rx) = mpsc::channel::<(usize, u64, Result<u64, String>)>();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (tx, requests) = (tx.clone(), requests.clone());
            std::thread::spawn(move || {
                for id in (w..8).step_by(4) {
                    let group = requests
                        .child(&format!("request-{id}"))
                        .expect("unique names");
                    group.set_max(64 * MIB).expect("fresh group");
                    if id == 6 {
                        group.set_enforcement(Enforcement::Refuse);
                    }
                    let result = group.scope(|| serve(&group, id, 2 + id % 4));
                    let peak = group.peak();
                    group.remove().expect("no children");
                    tx.send((id, peak, result)).expect("main is listening");
                }
                // An idle worker holds nothing charged.
                splitcount::alloc::drain_thread();
            })
        })
        .collect();
    drop(tx);
    let mut done: Vec<_> = rx.iter().collect();
    for w in workers {
        w.join().expect("worker");
    }
    done.sort_by_key(|(id, _, _)| *id);
    for (id, peak, result) in &done {
        let peak = *peak as f64 / MIB as f64;
        match result {
            Ok(bytes) => println!(
                "request-{id}: done, {:.0} MiB of buffers, peak {peak:.1} MiB",
                *bytes as f64 / MIB as f64
            ),
            Err(why) => println!("request-{id}: FAILED ({why}), peak {peak:.1} MiB"),
        }
    }
    memory.drain_stocks();
    println!(
        "all requests: peak {:.1} MiB of a {} MiB limit; now {} bytes in use, {} groups left",
        requests.peak() as f64 / MIB as f64,
        requests.max() / MIB,
        requests.usage(),
        requests.children().len()
    );
}
