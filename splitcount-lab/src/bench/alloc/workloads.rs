//! The allocator suite's workloads, as one process runs them: every block
//! comes from `std::alloc` (the process's global allocator), and every
//! thread runs inside a group scope of its own (which charges nothing when
//! the process runs on the system allocator: both sides run the same code).
//!
//! - `mixed`: a ring of 64 live blocks; each op frees the oldest and
//!   allocates 16 to 512 bytes.
//! - `small`: the same with 17 to 24 bytes — where an 8-byte header moves a
//!   block into the next malloc size class (24 usable bytes in glibc's
//!   32-byte chunk; 25 need a 48-byte one).
//! - `cross-thread`: two threads, each allocating (16 to 512 bytes) in its
//!   own group and handing the block to the other through a ring, which
//!   frees it: every free is a cross-thread free of a block charged to the
//!   other thread's group. (A full ring makes the producer free the block
//!   itself; with the two threads running together it does not fill.)
//! - `json`: a real allocation-heavy workload whose shape nobody here
//!   wrote: `serde_json` parses a generated 2 MB document into a `Value`
//!   tree and serializes it back.
//! - `btree`: a `BTreeMap<u64, String>` of 1,000 entries built from random
//!   keys (std's nodes, 100 to 300 bytes each, and an 8–40-byte string per
//!   entry), then dropped.

use crate::timing::slice::{self, SliceRun, SliceSpec};
use crossbeam_utils::CachePadded;
use serde::{Deserialize, Serialize};
use splitcount::group::Group;
use std::alloc::Layout;
use std::hint::black_box;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// A workload of the allocator suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// 16–512-byte blocks, 64 live.
    Mixed,
    /// 17–24-byte blocks, 64 live.
    Small,
    /// Blocks freed by another thread.
    CrossThread,
    /// serde_json parse and serialize of a 2 MB document.
    Json,
    /// A `BTreeMap` of 1,000 entries built and dropped.
    Btree,
}

/// The suite's name in a worker request ([`crate::bench::worker::Request`]).
pub const SUITE: &str = "alloc";

impl Workload {
    /// Every workload, in table order.
    pub const ALL: [Workload; 5] = [
        Workload::Mixed,
        Workload::Small,
        Workload::CrossThread,
        Workload::Json,
        Workload::Btree,
    ];

    /// The name in case names (`mixed-system`, …).
    pub fn name(self) -> &'static str {
        match self {
            Workload::Mixed => "mixed",
            Workload::Small => "small",
            Workload::CrossThread => "cross-thread",
            Workload::Json => "json",
            Workload::Btree => "btree",
        }
    }

    /// The thread counts it runs at, given the suite's: `cross-thread`
    /// always at 2, `json` and `btree` at 1, the rings at each.
    pub fn thread_counts(self, threads: &[usize]) -> Vec<usize> {
        match self {
            Workload::Mixed | Workload::Small => threads.to_vec(),
            Workload::CrossThread => vec![2],
            Workload::Json | Workload::Btree => vec![1],
        }
    }
}

/// Live blocks of a ring.
const LIVE: usize = 64;

/// Blocks in flight between the two `cross-thread` threads, each way.
const EXCHANGE: usize = 1024;

/// Size of the generated JSON document.
pub const JSON_BYTES: usize = 2 << 20;

/// A block from the global allocator with its size in its first 8 bytes
/// (so whoever frees it knows its layout).
fn allocate(size: usize) -> *mut u8 {
    let layout = Layout::from_size_align(size, 8).expect("small sizes");
    // SAFETY: `size` ≥ 16, non-zero.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    // SAFETY: `p` has `size` ≥ 8 bytes, aligned to 8.
    unsafe { p.cast::<u64>().write(size as u64) };
    p
}

/// Free a block of [`allocate`].
///
/// # Safety
/// `p` came from [`allocate`] and is freed once.
unsafe fn free(p: *mut u8) {
    // SAFETY: the first 8 bytes hold the size `allocate` wrote.
    let size = unsafe { p.cast::<u64>().read() } as usize;
    let layout = Layout::from_size_align(size, 8).expect("as allocated");
    // SAFETY: allocated by the global allocator with `layout`.
    unsafe { std::alloc::dealloc(p, layout) };
}

/// A xorshift step: the next block size comes from it.
#[inline]
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// One thread's ring of live blocks of `min..=max` bytes.
struct Ring {
    blocks: Vec<*mut u8>,
    next: usize,
    seed: u64,
    sizes: (usize, usize),
}

impl Ring {
    fn new(seed: u64, sizes: (usize, usize)) -> Ring {
        Ring {
            blocks: Vec::with_capacity(LIVE),
            next: 0,
            seed: seed | 1,
            sizes,
        }
    }

    #[inline]
    fn op(&mut self) {
        let (min, max) = self.sizes;
        let size = min + (next(&mut self.seed) % (max - min + 1) as u64) as usize;
        let p = allocate(size);
        if self.blocks.len() < LIVE {
            self.blocks.push(p);
        } else {
            let old = std::mem::replace(&mut self.blocks[self.next], p);
            self.next = (self.next + 1) % LIVE;
            // SAFETY: allocated by `allocate`, in the ring once.
            unsafe { free(old) };
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        for &p in &self.blocks {
            // SAFETY: allocated by `allocate`, in the ring once.
            unsafe { free(p) };
        }
    }
}

/// A single-producer, single-consumer ring of blocks (Lamport's queue).
struct Exchange {
    slots: Box<[AtomicPtr<u8>]>,
    /// Next slot to fill; written by the producer only.
    tail: CachePadded<AtomicUsize>,
    /// Next slot to empty; written by the consumer only.
    head: CachePadded<AtomicUsize>,
}

impl Exchange {
    fn new() -> Exchange {
        Exchange {
            slots: (0..EXCHANGE)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            tail: CachePadded::new(AtomicUsize::new(0)),
            head: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Hand `p` over; false if the ring is full.
    #[inline]
    fn push(&self, p: *mut u8) -> bool {
        // Relaxed: only this producer writes `tail`.
        let tail = self.tail.load(Ordering::Relaxed);
        // Acquire: the consumer's read of a slot happens before we reuse it.
        if tail - self.head.load(Ordering::Acquire) == EXCHANGE {
            return false;
        }
        // Relaxed: published by the Release store of `tail` below.
        self.slots[tail % EXCHANGE].store(p, Ordering::Relaxed);
        // Release: the slot's pointer (and the block's bytes) are visible
        // to the consumer that sees the new tail.
        self.tail.store(tail + 1, Ordering::Release);
        true
    }

    /// Take the oldest block, if any.
    #[inline]
    fn pop(&self) -> Option<*mut u8> {
        // Relaxed: only this consumer writes `head`.
        let head = self.head.load(Ordering::Relaxed);
        // Acquire: pairs with the producer's Release of `tail`.
        if head == self.tail.load(Ordering::Acquire) {
            return None;
        }
        // Relaxed: ordered by the Acquire load of `tail` above.
        let p = self.slots[head % EXCHANGE].load(Ordering::Relaxed);
        // Release: our read of the slot happens before the producer reuses it.
        self.head.store(head + 1, Ordering::Release);
        Some(p)
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        while let Some(p) = self.pop() {
            // SAFETY: every block in the ring came from `allocate`.
            unsafe { free(p) };
        }
    }
}

/// A generated JSON document of about `bytes` bytes: records of users with
/// strings, numbers, flags, tags and a small history each.
pub fn json_document(bytes: usize) -> String {
    let mut doc = String::with_capacity(bytes + 4096);
    doc.push('[');
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut i = 0u64;
    while doc.len() < bytes {
        if i > 0 {
            doc.push(',');
        }
        let r = next(&mut seed);
        let tags: Vec<String> = (0..r % 5)
            .map(|k| format!("\"tag-{}\"", (r >> (8 * k)) % 1000))
            .collect();
        let history: Vec<String> = (0..1 + r % 4)
            .map(|k| {
                format!(
                    "{{\"t\":{},\"v\":{:.3}}}",
                    i * 10 + k,
                    (r % 10_000) as f64 / 7.0
                )
            })
            .collect();
        doc.push_str(&format!(
            "{{\"id\":{i},\"name\":\"user-{i:08}\",\"email\":\"user{i}@example.invalid\",\
             \"active\":{},\"score\":{:.2},\"tags\":[{}],\"history\":[{}],\
             \"address\":{{\"street\":\"{} Main Street\",\"city\":\"City {}\",\"zip\":\"{:05}\"}}}}",
            r % 3 != 0,
            (r % 100_000) as f64 / 100.0,
            tags.join(","),
            history.join(","),
            r % 997,
            r % 89,
            r % 100_000
        ));
        i += 1;
    }
    doc.push(']');
    doc
}

/// Parse `doc` into a `Value` tree and serialize it back.
fn json_round_trip(doc: &str) {
    let value: serde_json::Value = serde_json::from_str(doc).expect("a generated document");
    let text = serde_json::to_string(&value).expect("a Value serializes");
    black_box(text.len());
}

/// Entries of the `btree` workload's map.
pub const BTREE_ENTRIES: usize = 1_000;

/// Build a `BTreeMap` of [`BTREE_ENTRIES`] random keys, each with a string
/// of 8 to 40 bytes, and drop it; `seed` moves on.
fn btree_build(seed: &mut u64) {
    let mut map = std::collections::BTreeMap::new();
    for _ in 0..BTREE_ENTRIES {
        let key = next(seed);
        let len = 8 + (key % 33) as usize;
        map.insert(key, "x".repeat(len));
    }
    black_box(map.len());
}

/// Run one slice of `workload` on `threads` threads, thread `t` in
/// `groups[t]`'s scope. `doc` is the JSON workload's document.
pub fn run_slice(
    workload: Workload,
    threads: usize,
    spec: SliceSpec,
    groups: &[Group],
    doc: &str,
) -> Result<SliceRun, String> {
    if groups.len() < threads {
        return Err(format!("{} groups for {threads} threads", groups.len()));
    }
    Ok(match workload {
        Workload::Mixed | Workload::Small => {
            let sizes = if workload == Workload::Mixed {
                (16, 512)
            } else {
                (17, 24)
            };
            slice::run(threads, spec, &|t| {
                let scope = groups[t].enter();
                let mut ring = Ring::new(t as u64 + 1, sizes);
                move || {
                    let _in_group = &scope;
                    ring.op()
                }
            })
        }
        Workload::CrossThread => {
            if threads != 2 {
                return Err(format!("cross-thread runs on 2 threads, not {threads}"));
            }
            let rings = [Exchange::new(), Exchange::new()];
            slice::run(2, spec, &|t| {
                let scope = groups[t].enter();
                let (inbound, outbound) = (&rings[t], &rings[1 - t]);
                let mut seed = t as u64 + 7;
                move || {
                    let _in_group = &scope;
                    if let Some(p) = inbound.pop() {
                        // SAFETY: the other thread allocated it and gave
                        // it up by pushing it.
                        unsafe { free(p) };
                    }
                    let p = allocate(16 + (next(&mut seed) % 497) as usize);
                    if !outbound.push(p) {
                        // SAFETY: never handed over.
                        unsafe { free(p) };
                    }
                }
            })
        }
        Workload::Json => slice::run(threads, spec, &|t| {
            let scope = groups[t].enter();
            move || {
                let _in_group = &scope;
                json_round_trip(doc)
            }
        }),
        Workload::Btree => slice::run(threads, spec, &|t| {
            let scope = groups[t].enter();
            let mut seed = t as u64 + 11;
            move || {
                let _in_group = &scope;
                btree_build(&mut seed)
            }
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitcount::group::Hierarchy;
    use std::time::Duration;

    #[test]
    fn the_document_is_valid_json_of_the_asked_size() {
        let doc = json_document(100_000);
        assert!((100_000..110_000).contains(&doc.len()), "{}", doc.len());
        let v: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert!(v.as_array().unwrap().len() > 300);
    }

    #[test]
    fn a_block_crosses_the_exchange_once_in_order() {
        let x = Exchange::new();
        let (a, b) = (allocate(16), allocate(32));
        assert!(x.push(a) && x.push(b));
        assert_eq!(x.pop(), Some(a));
        // SAFETY: popped once.
        unsafe { free(a) };
        drop(x); // frees `b`
    }

    #[test]
    fn a_full_exchange_refuses() {
        let x = Exchange::new();
        for _ in 0..EXCHANGE {
            assert!(x.push(allocate(16)));
        }
        let p = allocate(16);
        assert!(!x.push(p));
        // SAFETY: never handed over.
        unsafe { free(p) };
    }

    #[test]
    fn every_workload_runs_a_slice_in_its_groups() {
        let h = Hierarchy::default();
        let groups: Vec<Group> = (0..2)
            .map(|i| h.root().child(&format!("t{i}")).unwrap())
            .collect();
        let doc = json_document(20_000);
        let spec = SliceSpec {
            length: Duration::from_millis(5),
            batch: 1,
        };
        for w in Workload::ALL {
            let threads = w.thread_counts(&[1])[0];
            let run = run_slice(w, threads, spec, &groups, &doc).unwrap();
            assert_eq!(run.threads.len(), threads, "{w:?}");
            assert!(run.threads.iter().all(|t| t.ops > 0), "{w:?}");
        }
        assert!(run_slice(Workload::CrossThread, 1, spec, &groups, &doc).is_err());
    }
}
