//! The synchronization facade: the one place that decides which atomics, locks
//! and threads the library uses.
//!
//! Every module imports its atomics, `Mutex`, `Arc` and `thread` from here,
//! never from `std` directly. Under `RUSTFLAGS="--cfg loom"` this module swaps
//! in [`loom`](https://docs.rs/loom)'s model-checked versions, so the loom tests
//! in `tests/loom_*.rs` explore every interleaving of the real code, not of a
//! copy of it (the habit of `sharded-slab`'s `src/sync.rs`).
//!
//! Code that must not be model-checked (system calls, `mmap`, the rseq area)
//! lives outside this facade and is written so that it never races by itself.

#[cfg(not(loom))]
#[allow(unused_imports)]
pub(crate) use std::sync::{
    atomic::{
        fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU16, AtomicU32, AtomicU64, AtomicU8,
        AtomicUsize, Ordering,
    },
    Arc, Mutex, MutexGuard,
};

#[cfg(loom)]
#[allow(unused_imports)]
pub(crate) use loom::sync::{
    atomic::{
        fence, AtomicBool, AtomicI64, AtomicPtr, AtomicU16, AtomicU32, AtomicU64, AtomicU8,
        AtomicUsize, Ordering,
    },
    Arc, Mutex, MutexGuard,
};

/// Threads, for code paths (background workers) that the models also run.
#[allow(unused_imports)]
pub(crate) mod thread {
    #[cfg(loom)]
    pub(crate) use loom::thread::{spawn, yield_now, JoinHandle};
    #[cfg(not(loom))]
    pub(crate) use std::thread::{spawn, yield_now, JoinHandle};
}

/// Lock a mutex, treating poisoning as harmless.
///
/// Every critical section in the library leaves its data consistent at each
/// step (no invariant is broken across a call that can panic), so a panic in
/// another thread while it held the lock does not make the data unusable.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
