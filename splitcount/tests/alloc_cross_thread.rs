//! Frees on a thread outside the allocating group — a consumer of what a
//! producer built, the common case of channels, pools and tasks — in a test
//! binary of its own: the usage moves this test counts would also move
//! with every drain and budget take-back that other tests' groups cause on
//! the same CPUs.

#![cfg(not(loom))]

#[macro_use]
mod common;

use splitcount::group::Group;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

accounted_heap!();

/// Make `blocks` boxes of 48 bytes in `g`, then free them on a new thread
/// outside it (pinned to `cpu` if given), reading the group's usage after
/// each free: how many times it moved.
fn consume(g: &Group, blocks: usize, cpu: Option<u32>) -> usize {
    let made: Vec<usize> = g.scope(|| {
        (0..blocks)
            .map(|_| Box::into_raw(Box::new([7u8; 48])) as usize)
            .collect()
    });
    assert!(live_bytes(g) >= (blocks * 48) as u64);
    let consumer = g.clone();
    std::thread::spawn(move || {
        if let Some(cpu) = cpu {
            common::pin_to(cpu);
        }
        let (mut moves, mut last) = (0, consumer.usage());
        for &p in &made {
            // SAFETY: made by `Box::into_raw` above, freed once.
            drop(unsafe { Box::from_raw(p as *mut [u8; 48]) });
            let now = consumer.usage();
            if now != last {
                (moves, last) = (moves + 1, now);
            }
        }
        moves
    })
    .join()
    .unwrap()
}

/// A consumer thread outside the group frees what a producer built: the
/// frees go to the consumer CPU's byte stock, whose slot for the producer's
/// account they overflow — and a slot overflowed by returned bytes drains
/// to half its quota, so the group's usage moves once per half quota of
/// bytes (about 32 KiB), not on every free once the slot is full.
#[test]
fn frees_on_another_thread_reach_the_counters_in_batches() {
    const BLOCKS: usize = 20_000;
    let g = fresh("producer");
    let moves = consume(&g, BLOCKS, None);
    // About 1.1 MB freed: some 35 half-quota drains; one move per free
    // would be 20,000.
    assert!(
        moves <= BLOCKS / 20,
        "{moves} moves of the usage for {BLOCKS} frees"
    );
    assert_eq!(live_bytes(&g), 0);
    assert_eq!(g.events().underflow, 0);
}

/// The same frees while two threads allocate and free in 20 other groups,
/// one of them sharing the consumer's CPU. Those threads spend much of
/// their time in the stock's locked slow paths (20 groups share the CPU's
/// budget), so the scheduler often preempts one holding its CPU's block;
/// the consumer, then running on that CPU, must not find the block held on
/// every free for the rest of its time slice: it yields once and the
/// holder finishes. (Without the yield, some round moved the usage on all
/// 20,000 frees in 5 runs of 5; with it, about 90 moves a round.)
#[test]
fn frees_on_another_thread_stay_batched_beside_busy_tenants() {
    const BLOCKS: usize = 20_000;
    let cpu = common::online_cpu_ids()[0];
    let stop = Arc::new(AtomicBool::new(false));
    let others: Vec<Group> = (0..20).map(|i| fresh(&format!("busy{i}"))).collect();
    let busy: Vec<_> = (0..2)
        .map(|t| {
            let (others, stop) = (others.clone(), stop.clone());
            std::thread::spawn(move || {
                if t == 0 {
                    common::pin_to(cpu);
                }
                let mut kept = VecDeque::new();
                let mut i = t;
                while !stop.load(Relaxed) {
                    i += 1;
                    let g = &others[i % others.len()];
                    kept.push_back(g.scope(|| vec![1u8; 200 + i % 3000]));
                    if kept.len() > 50 {
                        kept.pop_front();
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(20));
    // Three rounds: a preemption inside a locked section is likely in each,
    // not certain.
    for round in 0..3 {
        let g = fresh(&format!("producer-beside-busy-{round}"));
        let moves = consume(&g, BLOCKS, Some(cpu));
        assert!(
            moves <= BLOCKS / 20,
            "round {round}: {moves} moves of the usage for {BLOCKS} frees"
        );
        assert_eq!(live_bytes(&g), 0);
        assert_eq!(g.events().underflow, 0);
    }
    stop.store(true, Relaxed);
    for t in busy {
        t.join().unwrap();
    }
}
