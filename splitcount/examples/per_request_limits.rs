//! Per-request memory limits for a Rust server, with the allocator wrapper.
//!
//! Worker threads serve simulated requests, each inside its own group with a
//! 64 MiB limit, under a parent with a 256 MiB limit for all requests. One
//! request tries to grow a buffer past its limit: `try_reserve` is refused
//! (the allocator returns null) while the other requests complete. Each
//! request's peak usage is printed, and the refusal with its numbers.
//!
//! Run: `cargo run --release --example per_request_limits`

use splitcount::alloc::{take_last_refusal, Accounted};
use splitcount::group::{Group, Hierarchy};
use std::alloc::System;
use std::sync::mpsc;

#[global_allocator]
static ALLOC: Accounted<System> = Accounted::new(System);

const MIB: u64 = 1 << 20;

/// A simulated request: build `chunks` buffers of 4 MiB, then (for the
/// greedy one) try to grow one buffer to 96 MiB.
fn serve(id: usize, chunks: usize, greedy: bool) -> Result<u64, String> {
    let mut buffers: Vec<Vec<u8>> = Vec::new();
    for i in 0..chunks {
        buffers.push(vec![(id + i) as u8; 4 * MIB as usize]);
    }
    if greedy {
        let mut big: Vec<u8> = Vec::new();
        if big.try_reserve_exact(96 * MIB as usize).is_err() {
            let why = take_last_refusal().map_or_else(|| "refused".to_owned(), |r| r.to_string());
            return Err(why);
        }
        buffers.push(big);
    }
    Ok(buffers.iter().map(|b| b.len() as u64).sum())
}

fn main() {
    let memory = Hierarchy::default();
    ALLOC.attach(&memory, None).expect("attached once");
    let requests = memory.root().child("requests").expect("fresh hierarchy");
    requests.set_max(256 * MIB).expect("nothing charged yet");

    let (tx, rx) = mpsc::channel::<(usize, Group, Result<u64, String>)>();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (tx, requests) = (tx.clone(), requests.clone());
            std::thread::spawn(move || {
                for id in (w..8).step_by(4) {
                    let group = requests
                        .child(&format!("request-{id}"))
                        .expect("unique names");
                    group.set_max(64 * MIB).expect("fresh group");
                    let result = group.scope(|| serve(id, 2 + id % 4, id == 5));
                    tx.send((id, group, result)).expect("main is listening");
                }
            })
        })
        .collect();
    drop(tx);
    let mut done: Vec<_> = rx.iter().collect();
    for w in workers {
        w.join().expect("worker");
    }
    done.sort_by_key(|(id, _, _)| *id);
    ALLOC.drain();
    for (id, group, result) in &done {
        let peak = group.peak() as f64 / MIB as f64;
        match result {
            Ok(bytes) => println!(
                "request-{id}: done, {:.0} MiB of buffers, peak {peak:.1} MiB",
                *bytes as f64 / MIB as f64
            ),
            Err(why) => println!("request-{id}: REFUSED ({why}), peak {peak:.1} MiB"),
        }
    }
    println!(
        "all requests: peak {:.1} MiB of a {} MiB limit; now {} bytes in use",
        requests.peak() as f64 / MIB as f64,
        requests.max() / MIB,
        requests.usage()
    );
}
