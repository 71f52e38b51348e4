//! Handles: what C holds instead of pointers.
//!
//! A handle is a number that names a slot of a per-kind table and the
//! slot's generation when it was handed out, disguised as a pointer to an
//! opaque struct (so that C's type checker tells a group from a counter):
//!
//! ```text
//!  63      56 55                 32 31                         0
//!  ┌─────────┬─────────────────────┬────────────────────────────┐
//!  │  kind   │ generation (24 bit) │ slot index + 1             │
//!  └─────────┴─────────────────────┴────────────────────────────┘
//! ```
//!
//! It is never dereferenced. A lookup checks the kind, bounds-checks the
//! index, and compares the generation with the slot's (odd: live): NULL, a
//! made-up value, a handle of another kind, and a destroyed or released
//! handle (whose slot's generation moved on) are all refused with
//! `SPLITCOUNT_E_HANDLE`. A slot is reused only with a new generation, so a
//! stale handle does not name its slot's next object until the 24-bit
//! generation wraps (16,777,216 reuses of that one slot).
//!
//! **Lookups take no lock and write nothing shared** — a counter's add
//! through a handle costs a few loads more than in Rust. Slots live in
//! chunks that are allocated once and never freed, so a lookup never reads
//! freed memory; the object in a slot is dropped when the handle is
//! released. That is why a release must not race with other calls on the
//! same handle (the rule of `free`): a call that already found the object
//! may still be using it.

use crate::error::{Error, Result, SPLITCOUNT_E_HANDLE};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Mutex;

/// The number a handle disguised as a pointer carries.
#[inline]
pub(crate) fn id<P>(handle: *mut P) -> u64 {
    handle as usize as u64
}

#[cfg(not(target_pointer_width = "64"))]
compile_error!("handles carry 64 bits in a pointer: 64-bit targets only");

/// Slots per chunk.
const CHUNK: usize = 4096;
/// Chunks per table: up to 16,777,216 live handles of one kind.
const CHUNKS: usize = 4096;
const GENERATION_MASK: u32 = (1 << 24) - 1;

struct Slot<T> {
    /// Odd while the slot holds an object; bumped on every fill and empty.
    generation: AtomicU32,
    value: UnsafeCell<Option<T>>,
}

type Chunk<T> = [Slot<T>; CHUNK];

/// A table of live objects of one kind, named by handles.
pub(crate) struct Registry<T> {
    kind: u8,
    what: &'static str,
    chunks: [AtomicPtr<Chunk<T>>; CHUNKS],
    /// Free slots and the number of slots ever used; only `insert` and
    /// `remove` take it.
    free: Mutex<(Vec<u32>, u32)>,
}

// SAFETY: a slot's value is written only under `free`'s lock while its
// generation is even (no lookup succeeds), and published by the Release
// store that makes the generation odd; lookups read it after an Acquire
// load of that generation. Dropping it while a lookup uses it is the
// caller's documented misuse (a release racing a use).
unsafe impl<T: Send + Sync> Sync for Registry<T> {}

impl<T> Registry<T> {
    pub(crate) const fn new(kind: u8, what: &'static str) -> Registry<T> {
        Registry {
            kind,
            what,
            chunks: [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS],
            free: Mutex::new((Vec::new(), 0)),
        }
    }

    #[cold]
    #[inline(never)]
    fn stale(&self, handle: u64) -> Error {
        Error::new(
            SPLITCOUNT_E_HANDLE,
            if handle == 0 {
                format!("the {} handle is NULL", self.what)
            } else {
                format!(
                    "{handle:#x} is not a live {} handle (destroyed, released, removed, \
                     of another kind, or never handed out)",
                    self.what
                )
            },
        )
    }

    #[inline(always)]
    fn decode(&self, handle: u64) -> Option<(usize, u32)> {
        let kind = (handle >> 56) as u8;
        let index = (handle & 0xFFFF_FFFF) as usize;
        if kind != self.kind || index == 0 || index > CHUNK * CHUNKS {
            return None;
        }
        Some((index - 1, ((handle >> 32) as u32) & GENERATION_MASK))
    }

    #[inline(always)]
    fn slot(&self, index: usize) -> Option<&Slot<T>> {
        // Acquire: the chunk's slots were initialized before it was
        // published.
        let chunk = self.chunks[index / CHUNK].load(Ordering::Acquire);
        // SAFETY: a published chunk is never freed.
        unsafe { chunk.as_ref() }.map(|c| &c[index % CHUNK])
    }

    /// The object a handle names, if it is live.
    #[inline(always)]
    pub(crate) fn get(&self, handle: u64) -> Result<&T> {
        match self.find(handle) {
            Some(v) => Ok(v),
            None => Err(self.stale(handle)),
        }
    }

    /// [`Registry::get`] without the error: for hot paths that build it
    /// out of line.
    #[inline(always)]
    pub(crate) fn find(&self, handle: u64) -> Option<&T> {
        let (index, generation) = self.decode(handle)?;
        let slot = self.slot(index)?;
        // Acquire: pairs with the Release store that published the value.
        let g = slot.generation.load(Ordering::Acquire);
        if g & 1 == 0 || g & GENERATION_MASK != generation {
            return None;
        }
        // SAFETY: live (checked above); the value is not written until the
        // handle is released, which must not race with this call.
        unsafe { (*slot.value.get()).as_ref() }
    }

    /// Store `value` in a free slot and its handle, disguised as a pointer
    /// to `P`, through `out`.
    ///
    /// # Safety
    /// `out` is null or valid for a write.
    pub(crate) unsafe fn hand_out<P>(&self, value: T, out: *mut *mut P) -> Result<()> {
        if out.is_null() {
            return Err(Error::new(
                crate::error::SPLITCOUNT_E_NULL,
                "the out-pointer is NULL",
            ));
        }
        let h = self.insert(value)?;
        // SAFETY: non-null (checked above), valid by the caller's contract.
        unsafe { out.write(h as usize as *mut P) };
        Ok(())
    }

    /// Store `value` in a free slot; its handle.
    pub(crate) fn insert(&self, value: T) -> Result<u64> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let index = match free.0.pop() {
            Some(i) => i as usize,
            None => {
                let i = free.1 as usize;
                if i >= CHUNK * CHUNKS {
                    return Err(Error::new(
                        crate::error::SPLITCOUNT_E_BUSY,
                        format!("too many live {} handles ({i})", self.what),
                    ));
                }
                if i % CHUNK == 0 {
                    // Built on the heap: a chunk is too large for a small
                    // thread stack.
                    let slots: Box<[Slot<T>]> = (0..CHUNK)
                        .map(|_| Slot {
                            generation: AtomicU32::new(0),
                            value: UnsafeCell::new(None),
                        })
                        .collect();
                    let chunk: Box<Chunk<T>> = slots.try_into().ok().expect("CHUNK slots");
                    // Release: publishes the initialized slots.
                    self.chunks[i / CHUNK].store(Box::into_raw(chunk), Ordering::Release);
                }
                free.1 += 1;
                i
            }
        };
        let slot = self.slot(index).expect("the chunk was published");
        // SAFETY: the generation is even (free slot): no lookup reads the
        // value, and writers hold `free`.
        unsafe { *slot.value.get() = Some(value) };
        let g = slot.generation.load(Ordering::Relaxed).wrapping_add(1);
        // Release: publishes the value to lookups.
        slot.generation.store(g, Ordering::Release);
        Ok(
            ((self.kind as u64) << 56)
                | (((g & GENERATION_MASK) as u64) << 32)
                | (index as u64 + 1),
        )
    }

    /// Release a handle: its object, or the stale-handle error (a second
    /// release of the same handle lands here).
    pub(crate) fn remove(&self, handle: u64) -> Result<T> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        self.get(handle)?;
        let (index, _) = self.decode(handle).expect("decoded by get");
        let slot = self.slot(index).expect("found by get");
        // Relaxed: lookups that see the even generation fail without
        // reading the value; the lock orders writers.
        slot.generation.fetch_add(1, Ordering::Relaxed);
        // SAFETY: no longer live; writers hold `free`.
        let value = unsafe { (*slot.value.get()).take() }.expect("a live slot holds a value");
        free.0.push(index as u32);
        Ok(value)
    }

    /// Release every live handle whose object satisfies `which`; their
    /// objects.
    pub(crate) fn remove_where(&self, which: impl Fn(&T) -> bool) -> Vec<T> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let mut taken = Vec::new();
        for index in 0..free.1 as usize {
            let slot = self.slot(index).expect("used slots have chunks");
            if slot.generation.load(Ordering::Relaxed) & 1 == 0 {
                continue;
            }
            // SAFETY: live, and writers hold `free`.
            let value = unsafe { &mut *slot.value.get() };
            if value.as_ref().is_some_and(&which) {
                slot.generation.fetch_add(1, Ordering::Relaxed);
                taken.extend(value.take());
                free.0.push(index as u32);
            }
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_handle_is_refused_and_its_slot_reused_with_a_new_generation() {
        let r: Registry<u32> = Registry::new(7, "test");
        let a = r.insert(1).unwrap();
        assert_eq!(*r.get(a).unwrap(), 1);
        assert_eq!(r.remove(a).unwrap(), 1);
        assert_eq!(r.get(a).unwrap_err().code, SPLITCOUNT_E_HANDLE);
        assert_eq!(r.remove(a).unwrap_err().code, SPLITCOUNT_E_HANDLE);
        let b = r.insert(2).unwrap();
        assert_eq!(a & 0xFFFF_FFFF, b & 0xFFFF_FFFF, "same slot");
        assert_ne!(a, b);
        assert!(r.get(a).is_err());
        assert_eq!(*r.get(b).unwrap(), 2);
    }

    #[test]
    fn null_foreign_and_made_up_handles_are_refused() {
        let r: Registry<u32> = Registry::new(7, "test");
        let other: Registry<u32> = Registry::new(8, "other");
        let a = r.insert(1).unwrap();
        let b = other.insert(1).unwrap();
        for h in [0, b, a + 1, a ^ (1 << 40), u64::MAX, 7 << 56] {
            assert!(r.get(h).is_err(), "{h:#x}");
        }
    }

    #[test]
    fn remove_where_releases_only_the_matching_handles() {
        let r: Registry<u32> = Registry::new(7, "test");
        let hs: Vec<u64> = (0..10).map(|i| r.insert(i).unwrap()).collect();
        let mut gone = r.remove_where(|v| v % 2 == 0);
        gone.sort();
        assert_eq!(gone, vec![0, 2, 4, 6, 8]);
        for (i, h) in hs.iter().enumerate() {
            assert_eq!(r.get(*h).is_ok(), i % 2 == 1);
        }
    }
}
