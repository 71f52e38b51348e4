//! Handles: what C holds instead of pointers.
//!
//! A handle is a number that names a slot of a per-kind table and the
//! slot's generation when it was handed out, disguised as a pointer to an
//! opaque struct (so that C's type checker tells a group from a counter):
//!
//! ```text
//!  63      56 55                               24 23                 0
//!  ┌─────────┬───────────────────────────────────┬───────────────────┐
//!  │  kind   │ generation (32 bit, odd)          │ slot index        │
//!  └─────────┴───────────────────────────────────┴───────────────────┘
//! ```
//!
//! It is never dereferenced. A lookup checks the kind (never 0, so NULL is
//! no handle), and compares the generation with the slot's (odd: live):
//! NULL, a made-up value, a handle of another kind, and a destroyed or
//! released handle (whose slot's generation moved on) are all refused with
//! `SPLITCOUNT_E_HANDLE`.
//!
//! **A released handle is never accepted again.** A slot's generation goes
//! up by 2 per reuse (odd when filled, even when emptied), and the handle
//! carries all 32 bits of it, so a slot has 2^31 lives (generations 1, 3,
//! …, 2^32 − 1); a slot whose last life ends is retired — never handed out
//! again — instead of wrapping to generation 1, where its first handle
//! would name its next object. A retired slot costs 4096th of a chunk; with
//! one slot reused in a loop, the table runs out (`SPLITCOUNT_E_BUSY`) after
//! 2^24 · 2^31 = 2^55 handles of one kind: over a century at 100 ns per
//! handle. (With a 24-bit generation that went up by 2, a slot's handle
//! came back after 2^23 reuses.)
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
/// Bits of a handle that carry the slot index (the low ones).
const INDEX_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
/// Bits of a handle that carry the kind (the high ones).
const KIND_SHIFT: u32 = 56;
// Every slot index fits its field, and the generation's 32 bits fit
// between the index and the kind.
const _: () = assert!(CHUNK * CHUNKS == 1 << INDEX_BITS);
const _: () = assert!(KIND_SHIFT - INDEX_BITS == u32::BITS);

struct Slot<T> {
    /// Odd while the slot holds an object; bumped on every fill and empty.
    /// 0 again after the slot's last life: retired, never filled again.
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

// SAFETY: a slot's value is written only while its generation is even (no
// lookup succeeds): under `free`'s lock, or by the one reservation that took
// the slot off the free list under it (`Reserved::fill`); and published by
// the Release
// store that makes the generation odd; lookups read it after an Acquire
// load of that generation. Dropping it while a lookup uses it is the
// caller's documented misuse (a release racing a use).
unsafe impl<T: Send + Sync> Sync for Registry<T> {}

/// A free slot of a [`Registry`] taken for a value not made yet
/// ([`Registry::reserve`]); back on the free list if dropped unfilled.
pub(crate) struct Reserved<'a, T> {
    registry: &'a Registry<T>,
    index: Option<usize>,
}

impl<T> Reserved<'_, T> {
    /// Put `value` in the slot; its handle.
    pub(crate) fn fill(mut self, value: T) -> u64 {
        let index = self.index.take().expect("filled once");
        self.registry.fill(index, value)
    }

    /// [`Reserved::fill`], the handle disguised as a pointer to `P` and
    /// written through `out`.
    ///
    /// # Safety
    /// `out` is valid for a write.
    pub(crate) unsafe fn fill_out<P>(self, value: T, out: *mut *mut P) {
        let h = self.fill(value);
        // SAFETY: the caller's contract.
        unsafe { out.write(h as usize as *mut P) };
    }
}

impl<T> Drop for Reserved<'_, T> {
    fn drop(&mut self) {
        if let Some(index) = self.index {
            let mut free = self.registry.free.lock().unwrap_or_else(|e| e.into_inner());
            // Even, as it was taken: the next `fill` makes it odd.
            free.0.push(index as u32);
        }
    }
}

impl<T> Registry<T> {
    pub(crate) const fn new(kind: u8, what: &'static str) -> Registry<T> {
        assert!(kind != 0, "kind 0 would make the NULL pointer a handle");
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

    /// The handle of the object in slot `index` at generation `generation`.
    fn encode(&self, index: usize, generation: u32) -> u64 {
        ((self.kind as u64) << KIND_SHIFT) | ((generation as u64) << INDEX_BITS) | index as u64
    }

    /// The slot index and generation a handle of this kind names.
    #[inline(always)]
    fn decode(&self, handle: u64) -> Option<(usize, u32)> {
        if (handle >> KIND_SHIFT) as u8 != self.kind {
            return None;
        }
        Some((
            (handle & INDEX_MASK) as usize,
            (handle >> INDEX_BITS) as u32,
        ))
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
        if g & 1 == 0 || g != generation {
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
        Ok(self.reserve()?.fill(value))
    }

    /// Take a free slot for a value made after: a call that must not make
    /// an object it cannot hand out (a group, whose name it takes) reserves
    /// its handle first. The slot goes back if the reservation is dropped
    /// unfilled.
    pub(crate) fn reserve(&self) -> Result<Reserved<'_, T>> {
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
        Ok(Reserved {
            registry: self,
            index: Some(index),
        })
    }

    /// Fill the reserved slot `index` with `value`; its handle. No lock:
    /// the reservation is the slot's only writer (it is off the free list,
    /// and removals touch live slots only).
    fn fill(&self, index: usize, value: T) -> u64 {
        let slot = self.slot(index).expect("the chunk was published");
        // SAFETY: the generation is even (a free slot, reserved: no lookup
        // reads the value), and this reservation is its only writer.
        unsafe { *slot.value.get() = Some(value) };
        // A free slot is even and not retired (`vacate`), so this is odd
        // and never 1 twice.
        let g = slot.generation.load(Ordering::Relaxed) + 1;
        // Release: publishes the value to lookups.
        slot.generation.store(g, Ordering::Release);
        self.encode(index, g)
    }

    /// Empty the live slot `index` (the caller holds `free`): its
    /// generation moves on, so its handles are refused from now on, and it
    /// goes back on the free list — unless that was its last life (the
    /// generation wrapped to 0): then it is retired, so that no handle of
    /// it is ever accepted again.
    fn vacate(&self, free: &mut Vec<u32>, index: usize) -> T {
        let slot = self.slot(index).expect("a used slot has a chunk");
        // Relaxed: lookups that see the even generation fail without
        // reading the value; the lock orders writers.
        let was = slot.generation.fetch_add(1, Ordering::Relaxed);
        // SAFETY: no longer live; writers hold `free`.
        let value = unsafe { (*slot.value.get()).take() }.expect("a live slot holds a value");
        if was != u32::MAX {
            free.push(index as u32);
        }
        value
    }

    /// Release a handle: its object, or the stale-handle error (a second
    /// release of the same handle lands here).
    pub(crate) fn remove(&self, handle: u64) -> Result<T> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        self.get(handle)?;
        let (index, _) = self.decode(handle).expect("decoded by get");
        Ok(self.vacate(&mut free.0, index))
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
            let value = unsafe { &*slot.value.get() };
            if value.as_ref().is_some_and(&which) {
                taken.push(self.vacate(&mut free.0, index));
            }
        }
        taken
    }
}

#[cfg(test)]
impl<T> Registry<T> {
    /// Make the free slot `index` look as if it had been filled and
    /// emptied until now `reuses` times after its first life: its next
    /// object gets generation `2 · reuses + 1`, as `reuses` insert/remove
    /// cycles would give it (2^31 of them take minutes).
    fn set_reuses(&self, index: usize, reuses: u32) {
        let free = self.free.lock().unwrap();
        assert!(free.0.contains(&(index as u32)), "slot {index} is free");
        let slot = self.slot(index).expect("a used slot has a chunk");
        slot.generation.store(2 * reuses, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slot a handle names.
    fn slot_of(handle: u64) -> u64 {
        handle & INDEX_MASK
    }

    #[test]
    fn a_released_handle_is_refused_through_every_reuse_of_its_slot() {
        let r: Registry<u32> = Registry::new(7, "test");
        let first = r.insert(0).unwrap();
        r.remove(first).unwrap();
        // The edges of a 24-bit generation that goes up by 2 (2^23 reuses)
        // and of one that goes up by 1 (2^24), each side, and the last life
        // of the slot.
        let edges = [
            1,
            (1 << 23) - 1,
            1 << 23,
            (1 << 23) + 1,
            (1 << 24) - 1,
            1 << 24,
            (1 << 24) + 1,
            (1 << 31) - 2,
            (1 << 31) - 1,
        ];
        for reuses in edges {
            r.set_reuses(slot_of(first) as usize, reuses);
            let now = r.insert(reuses).unwrap();
            assert_eq!(slot_of(now), slot_of(first), "reuse {reuses}: same slot");
            assert_eq!(*r.get(now).unwrap(), reuses);
            if let Ok(v) = r.get(first) {
                panic!("reuse {reuses}: the first handle names the slot's new object ({v})");
            }
            r.remove(now).unwrap();
        }
    }

    /// A slot's first handle (released) and the handle of its last life
    /// (live, holding 1).
    fn first_and_last_life(r: &Registry<u32>) -> (u64, u64) {
        let first = r.insert(0).unwrap();
        r.remove(first).unwrap();
        r.set_reuses(slot_of(first) as usize, (1 << 31) - 1);
        let last = r.insert(1).unwrap();
        assert_eq!(slot_of(last), slot_of(first));
        assert_eq!(
            last >> INDEX_BITS & u64::from(u32::MAX),
            u64::from(u32::MAX)
        );
        (first, last)
    }

    /// A call that makes its object after taking the handle's slot
    /// (`splitcount_group_child`) changes nothing when no slot is left, and
    /// a reservation it drops (the object could not be made) gives its slot
    /// back: the next insert takes it, and no handle named it meanwhile.
    #[test]
    fn a_reserved_slot_is_invisible_until_filled_and_comes_back_if_dropped() {
        let r: Registry<u32> = Registry::new(7, "test");
        let reserved = r.reserve().unwrap();
        let index = reserved.index.unwrap();
        // Its first handle-to-be is not live.
        assert!(r.find(r.encode(index, 1)).is_none());
        drop(reserved);
        let h = r.insert(5).unwrap();
        assert_eq!(r.decode(h).unwrap().0, index, "the dropped slot is reused");
        assert_eq!(*r.get(h).unwrap(), 5);
        let other = r.reserve().unwrap().fill(6);
        assert_ne!(other, h);
        assert_eq!(*r.get(other).unwrap(), 6);
    }

    #[test]
    fn a_slot_is_retired_after_its_last_life_instead_of_wrapping() {
        let r: Registry<u32> = Registry::new(7, "test");
        let (first, last) = first_and_last_life(&r);
        r.remove(last).unwrap();
        // The next object goes elsewhere; neither handle of the old slot
        // comes back, however many objects follow.
        for i in 2..100 {
            let next = r.insert(i).unwrap();
            assert_ne!(slot_of(next), slot_of(first), "the retired slot was reused");
            assert!(r.get(first).is_err() && r.get(last).is_err());
            r.remove(next).unwrap();
        }
    }

    #[test]
    fn remove_where_retires_a_slot_after_its_last_life() {
        let r: Registry<u32> = Registry::new(7, "test");
        let (first, last) = first_and_last_life(&r);
        assert_eq!(r.remove_where(|_| true), vec![1]);
        let next = r.insert(2).unwrap();
        assert_ne!(slot_of(next), slot_of(first));
        assert!(r.get(first).is_err() && r.get(last).is_err());
    }

    #[test]
    fn a_released_handle_is_refused_and_its_slot_reused_with_a_new_generation() {
        let r: Registry<u32> = Registry::new(7, "test");
        let a = r.insert(1).unwrap();
        assert_eq!(*r.get(a).unwrap(), 1);
        assert_eq!(r.remove(a).unwrap(), 1);
        assert_eq!(r.get(a).unwrap_err().code, SPLITCOUNT_E_HANDLE);
        assert_eq!(r.remove(a).unwrap_err().code, SPLITCOUNT_E_HANDLE);
        let b = r.insert(2).unwrap();
        assert_eq!(a & INDEX_MASK, b & INDEX_MASK, "same slot");
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
