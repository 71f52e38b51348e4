//! A query engine's memory pool, in the shape of DataFusion's `MemoryPool`
//! (DataFusion is not a dependency: the trait is written out here), built on
//! groups and `Reservation`s.
//!
//! The pool is one group with a hard limit; every consumer that registers
//! (a scan, a hash join, a sort) gets a child group of its own and an exact
//! reservation on it, so a refusal names the requester, the pool's limit
//! and usage, and the largest consumers — who is holding the memory — and
//! `reserved()` is exact (no per-CPU stock batch shows through).
//!
//! Four operators run on their own threads and ask for 116 MiB of a 64 MiB
//! pool: the sort spills (frees half its buffers) when refused and goes on;
//! the others cannot spill, so a refusal fails them, with the pool's
//! numbers in the error. Which one is refused depends on the interleaving.
//!
//! Run: `cargo run --release -p splitcount --example memory_pool`

use splitcount::group::{ChargeError, Consumer, Group, Hierarchy, Reservation};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

const MIB: usize = 1 << 20;

/// What DataFusion's pool trait asks of a pool.
trait MemoryPool: Send + Sync {
    /// A new, empty reservation for `consumer`.
    fn register(&self, consumer: &str) -> MemoryReservation;
    /// Grow regardless of the limit (memory already allocated).
    fn grow(&self, reservation: &MemoryReservation, additional: usize);
    /// Grow if the pool has room.
    fn try_grow(&self, reservation: &MemoryReservation, additional: usize)
        -> Result<(), PoolError>;
    /// Give back up to `n` bytes (saturating).
    fn shrink(&self, reservation: &MemoryReservation, n: usize);
    /// Give back everything; the bytes freed.
    fn free(&self, reservation: &MemoryReservation) -> usize;
    /// Bytes reserved by all consumers, exactly.
    fn reserved(&self) -> usize;
}

/// A consumer's hold on the pool; released when dropped (and the consumer's
/// group removed).
struct MemoryReservation {
    consumer: String,
    inner: Reservation,
}

impl MemoryReservation {
    fn size(&self) -> usize {
        self.inner.size() as usize
    }
}

impl Drop for MemoryReservation {
    fn drop(&mut self) {
        self.inner.free();
        // Consumers are named uniquely per query: the group goes with it.
        let _ = self.inner.group().remove();
    }
}

/// A refused `try_grow`, with the numbers a user needs.
#[derive(Debug)]
struct PoolError {
    consumer: String,
    requested: usize,
    held: usize,
    limit: u64,
    usage: u64,
    top: Vec<Consumer>,
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "resources exhausted: {} asked for {} MiB more (holds {} MiB); pool limit {} MiB, reserved {} MiB; largest consumers:",
            self.consumer,
            self.requested / MIB,
            self.held / MIB,
            self.limit / MIB as u64,
            self.usage / MIB as u64,
        )?;
        for c in &self.top {
            let name = c.group.rsplit('/').next().unwrap_or(&c.group);
            write!(f, " {name} {} MiB", c.usage / MIB as u64)?;
        }
        Ok(())
    }
}

impl std::error::Error for PoolError {}

/// The pool: a group with a limit, a child group per consumer.
struct GroupPool {
    group: Group,
}

impl GroupPool {
    fn new(hierarchy: &Hierarchy, name: &str, limit: usize) -> GroupPool {
        let group = hierarchy.root().child_or_create(name).unwrap();
        group.set_max(limit as u64).unwrap();
        GroupPool { group }
    }

    fn error(&self, r: &MemoryReservation, requested: usize, e: ChargeError) -> PoolError {
        PoolError {
            consumer: r.consumer.clone(),
            requested,
            held: r.size(),
            limit: e.limit(),
            usage: e.usage(),
            top: e.top().to_vec(),
        }
    }
}

impl MemoryPool for GroupPool {
    fn register(&self, consumer: &str) -> MemoryReservation {
        let group = self.group.child_or_create(consumer).unwrap();
        MemoryReservation {
            consumer: consumer.to_owned(),
            inner: Reservation::new(&group),
        }
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        reservation.inner.grow(additional as u64);
    }

    fn try_grow(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> Result<(), PoolError> {
        reservation
            .inner
            .try_grow(additional as u64)
            .map_err(|e| self.error(reservation, additional, e))
    }

    fn shrink(&self, reservation: &MemoryReservation, n: usize) {
        reservation.inner.shrink(n as u64);
    }

    fn free(&self, reservation: &MemoryReservation) -> usize {
        reservation.inner.free() as usize
    }

    fn reserved(&self) -> usize {
        self.group.usage() as usize
    }
}

/// An operator: build `target` MiB of buffers in 4 MiB batches.
fn operator(
    pool: Arc<dyn MemoryPool>,
    name: &'static str,
    target: usize,
    spillable: bool,
) -> Result<String, PoolError> {
    let r = pool.register(name);
    // A small hash table allocated up front: grown unconditionally.
    pool.grow(&r, MIB);
    let mut buffers: Vec<Vec<u8>> = Vec::new();
    let (mut batches, mut spills) = (0, 0);
    while batches * 4 < target {
        match pool.try_grow(&r, 4 * MIB) {
            Ok(()) => {
                buffers.push(vec![1u8; 4 * MIB]);
                batches += 1;
            }
            Err(e) if spillable && !buffers.is_empty() => {
                // Spill half the buffers to disk (here: drop them), then
                // try the batch again.
                let spilled = buffers.len().div_ceil(2);
                buffers.truncate(buffers.len() - spilled);
                pool.shrink(&r, spilled * 4 * MIB);
                spills += 1;
                if spills == 1 {
                    println!("  {name}: spills {} MiB after: {e}", spilled * 4);
                }
            }
            Err(e) => return Err(e),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let freed = pool.free(&r);
    Ok(format!(
        "{name}: done, {target} MiB processed, {spills} spill(s), freed {} MiB",
        freed / MIB
    ))
}

fn main() {
    let h = Hierarchy::default();
    let pool = GroupPool::new(&h, "query-pool", 64 * MIB);
    let group = pool.group.clone();
    let pool: Arc<dyn MemoryPool> = Arc::new(pool);
    println!("pool /query-pool: limit 64 MiB, four operators on four threads");

    let ops: [(&'static str, usize, bool); 4] = [
        ("scan", 8, false),
        ("aggregate", 16, false),
        ("sort", 48, true),
        ("hash-join", 40, false),
    ];
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ops
            .iter()
            .map(|&(name, target, spillable)| {
                let pool = pool.clone();
                s.spawn(move || operator(pool, name, target, spillable))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        match r {
            Ok(done) => println!("  {done}"),
            Err(e) => println!("  failed: {e}"),
        }
    }
    println!(
        "reserved after the query: {} bytes; peak {} MiB of the 64 MiB limit",
        pool.reserved(),
        group.peak() / MIB as u64
    );
    assert_eq!(pool.reserved(), 0);
}
