//! Blocks without tags: `SPLITCOUNT_PRELOAD_TAGS=off`.
//!
//! With tags (the default) every block carries 16 bytes of ours — its
//! tag and the account it was charged to — because a thread may be in any
//! group when it allocates and in any other when it frees. A program that
//! enters no group through the C API charges every block to `/preload`:
//! the account is known without reading anything, and the size is the
//! heap's usable size (or footprint), which the heap tells again at `free`.
//! Then a block is the inner allocator's block as it is: **no byte per
//! block**, the same size classes as without the preload.
//!
//! ```text
//!  p = the heap's block (no header, no trailer)
//!  │
//!  ▼
//!  ┌──────────────────────────────┐   malloc: charge usable(p) to /preload
//!  │ the program's bytes …        │   free:   uncharge usable(p) from /preload
//!  └──────────────────────────────┘
//! ```
//!
//! What it gives up, for that:
//!
//! - **Groups.** `splitcount_enter` fails (`SPLITCOUNT_E_STATE`, the reason
//!   in `splitcount_last_error`): a block charged to a group would be
//!   uncharged from `/preload`. A program's own byte charges
//!   (`splitcount_group_try_charge`) work as with tags.
//! - **Foreign blocks.** Nothing tells a block of ours from one the heap
//!   made without us; every block the program frees is taken as ours and
//!   uncharged. glibc's own internal calls go through `malloc` (ours), so
//!   the only foreign blocks are those of code that calls `__libc_malloc`
//!   directly and frees with `free`: then usage reads low by their size.
//!   With an inner allocator such a block would go to the wrong heap: do
//!   not turn tags off for a program that mixes `__libc_malloc` and
//!   `free`.
//!
//! **The first blocks.** While the accounting is being set up (at load:
//! `dlopen` of the inner allocator, glibc's own blocks) nothing can be
//! charged, and blocks made then come from glibc even where the inner
//! allocator is jemalloc or mimalloc. Each is remembered, with its heap, in
//! a fixed table of [`EARLY_SLOTS`] (a few dozen are used): its `free`
//! sends it to its own heap and uncharges nothing, its `realloc` moves it
//! to a charged block. A set-up that made more stops the program (exit
//! 78): a block the table missed would go to the wrong heap. The table
//! is read only for an address whose bit in a filter is set (one bit per
//! remembered address, at a hash of it, in 16,384: a load and a bit test
//! per `free`; another block shares a bit with a remembered one about
//! once in 16,384 / the number remembered, and then the table is read
//! for nothing).
//!
//! **The mode is settled at the first call**, from the environment, before
//! any block exists — not when the accounting is set up: a thread that
//! allocates during the set-up must make the same kind of block as the
//! blocks after it.

use crate::heap::Heap;
use crate::{State, STATE_READY};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Whether blocks carry no tag: 0 not settled yet, 1 tagged, 2 untagged.
static MODE: AtomicU8 = AtomicU8::new(0);

/// Whether blocks carry no tag (`SPLITCOUNT_PRELOAD_TAGS=off`).
#[inline]
pub(crate) fn on() -> bool {
    // Relaxed: every thread settles it to the same value, from the same
    // environment variable.
    match MODE.load(Ordering::Relaxed) {
        2 => true,
        1 => false,
        _ => settle(),
    }
}

/// Read the mode from the environment (no allocation: `getenv`). A value
/// other than `off` is tagged here; the settings reject one that is not
/// `on` either, and stop the program.
#[cold]
fn settle() -> bool {
    // SAFETY: a NUL-terminated name; the value is read at once.
    let value = unsafe { libc::getenv(c"SPLITCOUNT_PRELOAD_TAGS".as_ptr()) };
    // SAFETY: null or a NUL-terminated string.
    let off = !value.is_null()
        && unsafe { std::ffi::CStr::from_ptr(value) }
            .to_bytes()
            .eq_ignore_ascii_case(b"off");
    MODE.store(if off { 2 } else { 1 }, Ordering::Relaxed);
    off
}

/// How many blocks made during the set-up can be remembered.
pub(crate) const EARLY_SLOTS: usize = 1024;

/// Blocks made during the set-up, each as its address with bit 0 set for
/// the inner heap's (blocks are 16-aligned); 0: a free slot.
static EARLY: [AtomicUsize; EARLY_SLOTS] = [const { AtomicUsize::new(0) }; EARLY_SLOTS];

/// Slots handed out so far (never reused: the set-up happens once).
static EARLY_USED: AtomicUsize = AtomicUsize::new(0);

/// Remembered blocks the program has since freed or moved (each found
/// and forgotten once): with [`EARLY_USED`], what the report gives as
/// `setup_blocks`.
static EARLY_RETURNED: AtomicUsize = AtomicUsize::new(0);

/// The blocks made during the set-up: how many were remembered, and how
/// many of them have gone back to their own heap since.
pub(crate) fn setup_blocks() -> (usize, usize) {
    (
        EARLY_USED.load(Ordering::Relaxed).min(EARLY_SLOTS),
        EARLY_RETURNED.load(Ordering::Relaxed),
    )
}

/// The filter of remembered addresses: bit [`filter_bit`]`(p)` is set for
/// every remembered `p`, before it is handed out, and never cleared (a
/// stale bit only costs a look at the table). A `free` whose bit is clear
/// skips the table — nearly all of them, wherever the heaps lie (bounds on
/// the addresses did not: the remembered blocks are of both heaps, far
/// apart, and with mimalloc inside every block fell between them).
static EARLY_FILTER: [AtomicU64; FILTER_BITS / 64] =
    [const { AtomicU64::new(0) }; FILTER_BITS / 64];

/// Bits in [`EARLY_FILTER`] (2 KiB).
const FILTER_BITS: usize = 1 << 14;

/// The filter's bit for address `p`: the top bits of a multiplicative
/// hash (Fibonacci hashing) of the address without its alignment bits.
#[inline(always)]
fn filter_bit(p: usize) -> usize {
    (p >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FILTER_BITS.trailing_zeros())
}

/// Remember `p`, a block of `heap`'s made while nothing could be charged.
fn remember(p: *mut u8, heap: Heap) {
    // Relaxed throughout: the block is handed to the program after these
    // stores, and its `free` or `realloc` happens after that hand-over,
    // which carries them (see `early`).
    let i = EARLY_USED.fetch_add(1, Ordering::Relaxed);
    if i >= EARLY_SLOTS {
        crate::report::stop(&[format!(
            "SPLITCOUNT_PRELOAD_TAGS=off: more than {EARLY_SLOTS} blocks were allocated while \
             the accounting was being set up; run the program with tags (unset \
             SPLITCOUNT_PRELOAD_TAGS)"
        )]);
    }
    let bit = filter_bit(p as usize);
    EARLY_FILTER[bit / 64].fetch_or(1 << (bit % 64), Ordering::Relaxed);
    EARLY[i].store(
        p as usize | usize::from(heap == Heap::Inner),
        Ordering::Relaxed,
    );
}

/// The heap of `p` if it is a remembered block (`forget`: and forget it).
#[inline]
fn early(p: *mut u8, forget: bool) -> Option<Heap> {
    if !may_be_early(p) {
        return None;
    }
    early_slow(p, forget)
}

/// Whether `p` may be a block remembered during the set-up (then
/// [`free`] must look): false for nearly every block.
#[inline(always)]
pub(crate) fn may_be_early(p: *mut u8) -> bool {
    // Relaxed: a remembered `p`'s bit was set before `p` was handed out,
    // which happened before this call, and bits are never cleared.
    let bit = filter_bit(p as usize);
    EARLY_FILTER[bit / 64].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0
}

#[cold]
fn early_slow(p: *mut u8, forget: bool) -> Option<Heap> {
    let used = EARLY_USED.load(Ordering::Relaxed).min(EARLY_SLOTS);
    for slot in &EARLY[..used] {
        let v = slot.load(Ordering::Relaxed);
        if v & !1 != p as usize {
            continue;
        }
        if forget {
            // Relaxed: only the block's own free or realloc clears its slot
            // (its filter bit stays: a stale bit only ever costs a scan).
            slot.store(0, Ordering::Relaxed);
            EARLY_RETURNED.fetch_add(1, Ordering::Relaxed);
        }
        return Some(if v & 1 == 1 { Heap::Inner } else { Heap::Glibc });
    }
    None
}

/// Charge `n` bytes of a new block to `/preload`; false if a limit refused
/// them.
#[inline]
fn charge(n: usize) -> bool {
    match crate::charge(n) {
        None => false,
        // Charged nothing (this thread is inside one of the charge path's
        // own hooks): charged all the same, since its free uncharges it.
        Some(account) if account.is_null() => {
            crate::force(n);
            true
        }
        Some(_) => true,
    }
}

/// Uncharge `n` bytes of a block from `/preload`.
#[inline]
fn uncharge(n: usize) {
    crate::uncharge(crate::default_account(), n);
}

/// Hand out `p`, a new block of `heap`'s made in `state`: charged (NULL
/// and `ENOMEM`, the block freed, if a limit refuses it), remembered (made
/// during the set-up), or as it is (accounting off).
///
/// # Safety
/// `p` is null or a new block of `heap`'s.
#[inline]
pub(crate) unsafe fn finish(p: *mut u8, heap: Heap, state: State) -> *mut c_void {
    if p.is_null() {
        // glibc and jemalloc set it; mimalloc does not for every size.
        crate::set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    }
    if state == STATE_READY {
        // SAFETY: a live block of the heap.
        if !charge(unsafe { crate::charged_size(heap, p, 0) }) {
            // SAFETY: never handed out.
            unsafe { heap.free(p) };
            crate::set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
    } else if state == crate::STATE_INITIALIZING {
        remember(p, heap);
    }
    p.cast()
}

/// Whether a block of `size` bytes may be asked for: at most
/// `PTRDIFF_MAX`, as glibc and the tagged path answer (mimalloc returned
/// NULL beyond it without setting `errno`).
#[inline]
fn fits(size: usize) -> bool {
    crate::with_header(size, 0).is_some()
}

/// A new block from the current heap, made by `make` (NULL: none), for a
/// request of `size` bytes: refused past `PTRDIFF_MAX`, then charged,
/// remembered or left as it is by [`finish`].
///
/// # Safety
/// `make` returns null or a new block of the heap it is given.
#[inline]
unsafe fn allocate(size: usize, make: impl FnOnce(Heap) -> *mut u8) -> *mut c_void {
    if !fits(size) {
        return crate::enomem();
    }
    // The state first: setting up may switch the heap.
    let state = crate::state();
    let heap = Heap::current();
    // SAFETY: the caller's contract.
    unsafe { finish(make(heap), heap, state) }
}

/// `malloc` without a tag.
///
/// # Safety
/// As `malloc(3)`.
#[inline]
pub(crate) unsafe fn malloc(size: usize) -> *mut c_void {
    // SAFETY: the heap's allocator.
    unsafe { allocate(size, |heap| heap.malloc(size)) }
}

/// `calloc` of `size` zeroed bytes without a tag.
///
/// # Safety
/// As `calloc(3)`.
pub(crate) unsafe fn calloc(size: usize) -> *mut c_void {
    // SAFETY: the heap's allocator.
    unsafe { allocate(size, |heap| heap.calloc(size)) }
}

/// A block aligned to `align` (a power of two above 8) without a tag.
///
/// # Safety
/// `align` is a power of two above 8.
pub(crate) unsafe fn aligned(align: usize, size: usize) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { allocate(size, |heap| heap.aligned(align, size)) }
}

/// `free` of a block without a tag.
///
/// # Safety
/// `p` is a live block this library handed out (not null).
#[inline]
pub(crate) unsafe fn free(p: *mut u8) {
    if let Some(heap) = early(p, true) {
        // SAFETY: the remembered block's own heap; it was charged nothing.
        return unsafe { heap.free(p) };
    }
    let heap = Heap::current();
    if crate::state_now() == STATE_READY {
        // SAFETY: a live block of the heap's, made when the accounting was
        // ready (any earlier one is remembered), so charged this much.
        let n = unsafe { crate::charged_size(heap, p, 0) };
        // SAFETY: as above.
        unsafe { heap.free(p) };
        uncharge(n);
    } else {
        // SAFETY: as above; accounting off: nothing was charged.
        unsafe { heap.free(p) };
    }
}

/// `realloc` of a block without a tag to `size` bytes (not 0): growth is
/// charged before the heap may move the block, and refused (the old block
/// as it was, NULL and `ENOMEM`) when the limit says so.
///
/// # Safety
/// `p` is a live block this library handed out (not null).
pub(crate) unsafe fn realloc(p: *mut u8, size: usize) -> *mut c_void {
    if !fits(size) {
        return crate::enomem();
    }
    if let Some(heap) = early(p, false) {
        // SAFETY: the remembered block, moved to a block of its own.
        return unsafe { move_block(p, heap, size, true) };
    }
    let heap = Heap::current();
    if crate::state_now() != STATE_READY {
        // SAFETY: the heap's block; accounting off.
        return unsafe { heap.realloc(p, size) }.cast();
    }
    // SAFETY: a live block of the heap's.
    let usable = unsafe { heap.usable(p) };
    if size > usable && !heap.grows_in_place() {
        // SAFETY: a live block of the heap's, charged.
        return unsafe { move_block(p, heap, size, false) };
    }
    let old = if crate::charging_footprints() {
        // SAFETY: as above.
        unsafe { heap.footprint(p, usable) }
    } else {
        usable
    };
    let prepaid = if size > usable {
        // SAFETY: `p` is a live block of `heap`'s.
        let most = unsafe {
            if crate::charging_footprints() {
                heap.most_footprint(size, p)
            } else {
                heap.most_usable(size, p)
            }
        };
        most.saturating_sub(old)
    } else {
        0
    };
    if prepaid > 0 && !charge(prepaid) {
        crate::set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    }
    // SAFETY: the heap's block.
    let q = unsafe { heap.realloc(p, size) };
    if q.is_null() {
        // The old block is as it was.
        uncharge(prepaid);
        return std::ptr::null_mut();
    }
    // SAFETY: the heap's new block.
    let new = unsafe { crate::charged_size(heap, q, 0) };
    let charged = old + prepaid;
    if new <= charged {
        uncharge(charged - new);
    } else {
        // Beyond the heap's bound (`most_usable`): glibc mapped a block
        // below 128 KiB (the program lowered its mmap threshold). The block
        // is made: charged, past the limit if need be.
        crate::force(new - charged);
    }
    q.cast()
}

/// `realloc` by a move: a new, charged block of the current heap (NULL
/// and `ENOMEM`, `p` as it was, if a limit refuses it), the bytes copied,
/// `p` back to its heap and uncharged — nothing if it is a block made
/// during the set-up (`early`: charged nothing, and forgotten).
///
/// # Safety
/// `p` is a live block of `heap`'s: remembered if `early`, else charged.
unsafe fn move_block(p: *mut u8, heap: Heap, size: usize, early_block: bool) -> *mut c_void {
    // SAFETY: as malloc.
    let q = unsafe { malloc(size) };
    if q.is_null() {
        return q;
    }
    // SAFETY: `p` is live with `usable(p)` bytes, `q` new with `size`.
    let n = unsafe { heap.usable(p) };
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(p, q.cast(), n.min(size)) };
    if early_block {
        early(p, true);
        // SAFETY: its own heap; it was charged nothing.
        unsafe { heap.free(p) };
    } else {
        // SAFETY: live and charged this much.
        let charged = unsafe { crate::charged_size(heap, p, 0) };
        // SAFETY: its own heap.
        unsafe { heap.free(p) };
        uncharge(charged);
    }
    q
}

/// `malloc_usable_size` of a block without a tag.
///
/// # Safety
/// `p` is a live block this library handed out (not null).
pub(crate) unsafe fn usable(p: *mut u8) -> usize {
    let heap = early(p, false).unwrap_or_else(Heap::current);
    // SAFETY: a live block of that heap's.
    unsafe { heap.usable(p) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The set-up's table: a remembered block is found with its heap until
    /// its free forgets it; other addresses are not found.
    #[test]
    fn a_remembered_block_is_found_with_its_heap_until_it_is_forgotten() {
        // Addresses only: the table never touches the memory.
        let (a, b) = (0x1000 as *mut u8, 0x20_1000 as *mut u8);
        remember(a, Heap::Glibc);
        remember(b, Heap::Inner);
        assert_eq!(early(a, false), Some(Heap::Glibc));
        assert_eq!(early(b, false), Some(Heap::Inner));
        assert_eq!(early(0x3000 as *mut u8, false), None);
        // The fast path's test: a remembered block is never passed over;
        // nearly every other address is, without the scan. Here: the
        // 100,000 addresses 16 bytes apart after `a` (all between the two,
        // where bounds on the addresses passed none over) and after `b`.
        // Each shares one of the two bits set with about 1 in 16,384
        // others (24 of these, the hash being fixed).
        assert!(may_be_early(a) && may_be_early(b));
        let looked = (1..=100_000)
            .flat_map(|i| [a as usize + 16 * i, b as usize + 16 * i])
            .filter(|&q| may_be_early(q as *mut u8))
            .count();
        assert!(
            looked <= 40,
            "{looked} of 200,000 other addresses looked up"
        );
        assert_eq!(early(a, true), Some(Heap::Glibc));
        assert_eq!(early(a, false), None);
        assert_eq!(early(b, true), Some(Heap::Inner));
    }
}
