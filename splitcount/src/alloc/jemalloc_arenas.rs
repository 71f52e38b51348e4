//! jemalloc arenas whose memory lies in regions of our own: what
//! [`HeapPerGroup<Jemalloc>`](super::HeapPerGroup) needs to tell from a
//! block's address alone which group's heap it is in.
//!
//! A heap here is a jemalloc arena (`arenas.create`) made with extent
//! hooks of ours: every page the arena gets — its blocks and its own
//! metadata — comes from one *region* of a reservation made once, at the
//! first heap, of [`REGIONS`] regions of [`REGION`] bytes each (address
//! space only: `PROT_NONE`, `MAP_NORESERVE`; a page becomes readable and
//! writable when the arena takes it). A block's heap is then an
//! address computation, with no call into jemalloc:
//!
//! ```text
//!  reservation:  | region 0 | region 1 | region 2 | …  | region 255 |
//!                ^ BASE       each REGION bytes; arena k's pages only in region k
//!
//!  heap_of(p) = BASE + ((p − BASE) & !(REGION − 1))   if p − BASE < REGIONS · REGION
//!             = null                                  otherwise (jemalloc's own arenas)
//! ```
//!
//! jemalloc's documented `mallctl("arenas.lookup")` answers the same
//! question, but takes jemalloc's global control mutex on every call: a
//! lock every free of every thread would share.
//!
//! **The hooks.** `alloc` hands out the region's next `size` bytes at the
//! alignment asked (a bump pointer per region, never reused: jemalloc keeps
//! what it is given — `dalloc` opts out, so extents it is done with stay
//! its own, *retained*, and come back to it first), made readable and
//! writable with `mprotect`; they are zero, never touched before. `purge`
//! (forced) gives pages back with `MADV_DONTNEED` (zero when touched
//! again), so the resident set follows jemalloc's decay as with its own
//! hooks; `split` and `merge` succeed (one mapping: nothing to do); the
//! lazy purge and `decommit` opt out (jemalloc then purges). A region
//! that is full fails `alloc`: jemalloc answers null, and the group's
//! block is made with a header in jemalloc's own arenas instead.
//!
//! **A thread cache per thread and heap.** jemalloc's thread cache hands a
//! freed block of any arena to the next allocation of its size class,
//! whatever arena that allocation names (`MALLOCX_ARENA` binds only the
//! cache's refills), so with the thread's own cache a group's block could
//! come back as another's. Each thread instead keeps an explicit jemalloc
//! cache (`tcache.create`) per heap it allocates or frees in, and passes it
//! with the heap's arena (`MALLOCX_TCACHE`): a block of region `r` is only
//! ever freed into a cache of region `r` (the free finds `r` from the
//! address), and a cache of region `r` only refills from arena `r`, so
//! what it hands out is always region `r`'s. The caches go with the thread
//! (`tcache.destroy`, which gives their blocks back to their arenas, from
//! a pthread key's destructor: see [`EXIT_KEY`]); jemalloc's cache GC does
//! not visit explicit caches, so until then a thread keeps up to a cache's
//! worth of free blocks of each heap it used. jemalloc allows about 4,000
//! explicit caches in a process: a thread and heap that find none left go
//! straight to the arena's bins (`MALLOCX_TCACHE_NONE`, under the bin's
//! lock), which is correct, only slower.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::cell::Cell;
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{
    AtomicBool, AtomicU16, AtomicU32, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use tikv_jemalloc_sys as je;

/// Bytes of address space in one arena's region (16 GiB): the most a
/// group given a heap holds in its arena at once (jemalloc reuses what it
/// retained first); past it, its blocks get headers.
pub const REGION: usize = 1 << 34;

/// Regions in the reservation: one per heap ([`super::MAX_HEAPS`]).
pub const REGIONS: usize = super::heap_per_group::MAX_HEAPS;

/// The reservation's bytes (4 TiB of address space, none of it memory
/// until an arena takes it).
const SPAN: usize = REGION * REGIONS;

/// jemalloc arena indices the hooks know (jemalloc's own limit is 4,095).
const ARENAS: usize = 4096;

/// The reservation's first byte; until it is made, `2⁶⁴ − SPAN`, so that no
/// user-space address is "in" it (`p − BASE` wraps to `SPAN` or more).
static BASE: AtomicUsize = AtomicUsize::new(0usize.wrapping_sub(SPAN));

/// Whether the reservation was made (under the bind lock).
static RESERVED: AtomicBool = AtomicBool::new(false);

/// Bytes of each region handed out so far.
static USED: [AtomicUsize; REGIONS] = [const { AtomicUsize::new(0) }; REGIONS];

/// Each region's arena index, plus one (0: none yet).
static ARENA_OF: [AtomicU32; REGIONS] = [const { AtomicU32::new(0) }; REGIONS];

/// Each arena index's region, plus one (0: not an arena of ours yet).
static REGION_OF: [AtomicU16; ARENAS] = [const { AtomicU16::new(0) }; ARENAS];

/// The region of the arena being created (set under the bind lock, while
/// `arenas.create` runs: jemalloc's first calls of the hooks for an arena
/// come before its index is known).
static CREATING: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Regions given to arenas so far.
static TAKEN: AtomicUsize = AtomicUsize::new(0);

/// The hooks every arena of ours is made with (jemalloc keeps the pointer
/// for the arena's life: a static).
static HOOKS: HookTable = HookTable(je::extent_hooks_t {
    alloc: Some(hook_alloc),
    dalloc: None,
    destroy: None,
    commit: Some(hook_commit),
    decommit: None,
    purge_lazy: None,
    purge_forced: Some(hook_purge_forced),
    split: Some(hook_split),
    merge: Some(hook_merge),
});

/// `extent_hooks_t` in a static: jemalloc reads it from any thread and
/// never writes it.
struct HookTable(je::extent_hooks_t);

// SAFETY: the table is never written after it is made; it holds function
// pointers only.
unsafe impl Sync for HookTable {}

/// The region arena `arena_ind`'s pages come from: known, or the one being
/// created (then recorded).
fn region_of(arena_ind: c_uint) -> Option<usize> {
    let slot = REGION_OF.get(arena_ind as usize)?;
    match slot.load(Acquire) {
        0 => {
            // Only `new_arena` (under the bind lock) creates arenas with
            // these hooks, and its thread is the one calling here before
            // the index is returned.
            let r = CREATING.load(Acquire);
            if r >= REGIONS {
                return None;
            }
            slot.store(r as u16 + 1, Release);
            Some(r)
        }
        r => Some(r as usize - 1),
    }
}

/// The first byte of region `r`.
#[inline(always)]
fn region_start(r: usize) -> usize {
    BASE.load(Relaxed) + r * REGION
}

/// jemalloc's `extent_alloc_t`: the region's next `size` bytes at
/// `alignment` (or exactly at `new_addr`, if that is the region's next
/// byte), readable and writable, zero.
unsafe extern "C" fn hook_alloc(
    _hooks: *mut je::extent_hooks_t,
    new_addr: *mut c_void,
    size: usize,
    alignment: usize,
    zero: *mut bool,
    commit: *mut bool,
    arena_ind: c_uint,
) -> *mut c_void {
    let Some(r) = region_of(arena_ind) else {
        return std::ptr::null_mut();
    };
    let start = region_start(r);
    let used = &USED[r];
    let mut seen = used.load(Relaxed);
    let addr = loop {
        let next = start + seen;
        let addr = if new_addr.is_null() {
            match next.checked_next_multiple_of(alignment.max(1)) {
                Some(a) => a,
                None => return std::ptr::null_mut(),
            }
        } else if new_addr as usize == next {
            next
        } else {
            return std::ptr::null_mut();
        };
        let end = match addr.checked_add(size) {
            Some(end) if end - start <= REGION => end,
            _ => return std::ptr::null_mut(),
        };
        // Relaxed: the bump only divides the region among callers; the
        // pages are made usable below, by the caller that won them.
        match used.compare_exchange_weak(seen, end - start, Relaxed, Relaxed) {
            Ok(_) => break addr,
            Err(now) => seen = now,
        }
    };
    // SAFETY: `addr..addr + size` lies in region `r` of the reservation,
    // handed to no one else (the bump above); never touched before.
    let made = unsafe {
        libc::mprotect(
            addr as *mut c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    if made != 0 {
        // The bytes stay taken (address space only) and the arena gets
        // none: jemalloc answers null, the block gets a header.
        return std::ptr::null_mut();
    }
    // SAFETY: jemalloc passes valid pointers to its flags.
    unsafe {
        *zero = true;
        *commit = true;
    }
    addr as *mut c_void
}

/// jemalloc's `extent_commit_t`: the pages are committed from the start
/// (never decommitted: `decommit` opts out).
unsafe extern "C" fn hook_commit(
    _hooks: *mut je::extent_hooks_t,
    _addr: *mut c_void,
    _size: usize,
    _offset: usize,
    _length: usize,
    _arena_ind: c_uint,
) -> bool {
    false
}

/// jemalloc's forced purge: the pages' memory given back, zero on their
/// next touch.
unsafe extern "C" fn hook_purge_forced(
    _hooks: *mut je::extent_hooks_t,
    addr: *mut c_void,
    _size: usize,
    offset: usize,
    length: usize,
    _arena_ind: c_uint,
) -> bool {
    // SAFETY: jemalloc purges pages of an extent it was given (readable,
    // writable, in the reservation) and holds no block in them.
    let r = unsafe {
        libc::madvise(
            addr.cast::<u8>().add(offset).cast(),
            length,
            libc::MADV_DONTNEED,
        )
    };
    r != 0
}

/// jemalloc's `extent_split_t`: one mapping, nothing to do.
unsafe extern "C" fn hook_split(
    _hooks: *mut je::extent_hooks_t,
    _addr: *mut c_void,
    _size: usize,
    _size_a: usize,
    _size_b: usize,
    _committed: bool,
    _arena_ind: c_uint,
) -> bool {
    false
}

/// jemalloc's `extent_merge_t`: one mapping, nothing to do.
unsafe extern "C" fn hook_merge(
    _hooks: *mut je::extent_hooks_t,
    _addr_a: *mut c_void,
    _size_a: usize,
    _addr_b: *mut c_void,
    _size_b: usize,
    _committed: bool,
    _arena_ind: c_uint,
) -> bool {
    false
}

/// Reserve the regions' address space, once; whether it is there.
fn reserve() -> bool {
    if RESERVED.load(Acquire) {
        return true;
    }
    // SAFETY: a fresh private anonymous mapping of address space only
    // (`PROT_NONE`, no swap reserved); no address asked for.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SPAN,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return false;
    }
    BASE.store(base as usize, Release);
    RESERVED.store(true, Release);
    true
}

/// A region's cache in [`CACHES`] not made yet.
const NO_CACHE_YET: u32 = 0;

/// A region's cache in [`CACHES`] that jemalloc could not make (every
/// explicit cache taken): the arena's bins, directly.
const NO_CACHE: u32 = u32::MAX;

/// The thread's explicit jemalloc caches, one per region: the cache's
/// index plus one, or [`NO_CACHE_YET`] / [`NO_CACHE`]; and whether the
/// thread's exit key is set (see [`EXIT_KEY`]).
struct ThreadCaches {
    ids: [Cell<u32>; REGIONS],
    armed: Cell<bool>,
}

thread_local! {
    /// This thread's caches. A `const` thread-local without a destructor:
    /// readable until the thread's end, in every destructor that frees a
    /// block; the caches are destroyed by [`EXIT_KEY`]'s destructor.
    static CACHES: ThreadCaches = const {
        ThreadCaches {
            ids: [const { Cell::new(NO_CACHE_YET) }; REGIONS],
            armed: Cell::new(false),
        }
    };
}

/// How a thread's cache is destroyed: [`destroy_cache`], stored by the
/// first cache made. Through a pointer so that nothing this crate compiles
/// on its own calls jemalloc (only code made in a crate that uses
/// `Jemalloc` does): a library built with the feature on that never uses
/// `Jemalloc` — the C ABI library and the preload — links no copy of it
/// (see `jemalloc_size_class_out_of_line`).
static DESTROY: AtomicUsize = AtomicUsize::new(0);

/// A pthread key (plus one; 0: not made yet) whose destructor destroys the
/// thread's caches. Not a thread-local destructor: glibc runs those before
/// the pthread keys' destructors, so a thread whose first heap block is
/// freed in a key's destructor (a C library's per-thread data) made its
/// first cache after the thread-local destructors had run, and the cache
/// was never destroyed — one of jemalloc's few thousand cache indices
/// lost for good per such thread. A key set during the keys' destructors
/// has its destructor run in glibc's next pass (up to four passes).
static EXIT_KEY: AtomicUsize = AtomicUsize::new(0);

/// The thread's exit: destroy its caches (their blocks go back to their
/// arenas). A free after this, in a later destructor, makes a cache again
/// and sets the key again.
unsafe extern "C" fn caches_exit(_: *mut c_void) {
    // Acquire: the pointer was stored before this thread's first cache
    // was made (release), so a thread with a cache sees it.
    let destroy = DESTROY.load(Acquire);
    let _ = CACHES.try_with(|c| {
        c.armed.set(false);
        for id in &c.ids {
            let made = id.replace(NO_CACHE_YET);
            if made != NO_CACHE_YET && made != NO_CACHE && destroy != 0 {
                // SAFETY: `destroy` is `destroy_cache::<_>`, stored by
                // `new_cache` (a function pointer as an integer).
                let destroy: fn(c_uint) = unsafe { std::mem::transmute(destroy) };
                destroy(made - 1);
            }
        }
    });
}

/// Set this thread's exit key (made once, process-wide); whether it is set
/// — if not, the thread makes no cache (it could not be destroyed).
fn arm_exit(c: &ThreadCaches) -> bool {
    if c.armed.get() {
        return true;
    }
    let mut key = EXIT_KEY.load(Acquire);
    if key == 0 {
        let mut made: libc::pthread_key_t = 0;
        // SAFETY: a new key with a destructor that takes any value.
        if unsafe { libc::pthread_key_create(&mut made, Some(caches_exit)) } != 0 {
            return false;
        }
        // Release/Acquire: two threads may race to make the key; the one
        // that loses deletes its own and uses the winner's.
        key = match EXIT_KEY.compare_exchange(0, made as usize + 1, AcqRel, Acquire) {
            Ok(_) => made as usize + 1,
            Err(theirs) => {
                // SAFETY: the key just made, never set.
                unsafe { libc::pthread_key_delete(made) };
                theirs
            }
        };
    }
    // SAFETY: a key made above; any non-null value marks the thread.
    let set =
        unsafe { libc::pthread_setspecific((key - 1) as libc::pthread_key_t, 1 as *const c_void) };
    c.armed.set(set == 0);
    set == 0
}

/// Destroy the explicit cache `index` (its blocks go back to their
/// arenas). Generic only so that it is made in the crate that uses
/// `Jemalloc` (see [`DESTROY`]).
#[allow(clippy::extra_unused_type_parameters)] // the point: made where used
fn destroy_cache<J>(index: c_uint) {
    let mut index = index;
    // SAFETY: `tcache.destroy` reads an `unsigned`, the index of a cache
    // the calling thread made and no other thread uses.
    unsafe {
        je::mallctl(
            c"tcache.destroy".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&mut index as *mut c_uint).cast(),
            std::mem::size_of::<c_uint>(),
        );
    }
}

/// `mallocx`'s cache flag for a block of region `r` on this thread: its
/// cache for the region (made on first use), or none.
#[inline(always)]
fn cache_flag(r: usize) -> std::os::raw::c_int {
    CACHES.with(|c| match c.ids[r].get() {
        NO_CACHE_YET => new_cache::<()>(c, r),
        NO_CACHE => je::MALLOCX_TCACHE_NONE,
        id => je::MALLOCX_TCACHE(id as usize - 1),
    })
}

/// Make this thread's cache for region `r`; its flag. Generic only so that
/// it is made in the crate that uses `Jemalloc` (see [`DESTROY`]).
#[cold]
#[inline(never)]
fn new_cache<J>(c: &ThreadCaches, r: usize) -> std::os::raw::c_int {
    let slot = &c.ids[r];
    // Release: before the cache exists (see `caches_exit`).
    DESTROY.store(destroy_cache::<J> as fn(c_uint) as usize, Release);
    if !arm_exit(c) {
        slot.set(NO_CACHE);
        return je::MALLOCX_TCACHE_NONE;
    }
    let mut index: c_uint = 0;
    let mut len = std::mem::size_of::<c_uint>();
    // SAFETY: `tcache.create` writes an `unsigned`.
    let failed = unsafe {
        je::mallctl(
            c"tcache.create".as_ptr(),
            (&mut index as *mut c_uint).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if failed != 0 {
        slot.set(NO_CACHE);
        return je::MALLOCX_TCACHE_NONE;
    }
    slot.set(index + 1);
    je::MALLOCX_TCACHE(index as usize)
}

/// A new arena in a region of its own, as a heap (the region's first
/// byte); null if the address space could not be reserved, every region
/// is taken, or jemalloc made no arena. Called under the bind lock (one at
/// a time). `#[inline]`: made only in a crate that uses jemalloc (see
/// `jemalloc_size_class_out_of_line`).
#[inline]
pub(super) fn new_arena() -> *mut u8 {
    let r = TAKEN.load(Relaxed);
    if r >= REGIONS || !reserve() {
        return std::ptr::null_mut();
    }
    CREATING.store(r, Release);
    let mut index: c_uint = 0;
    let mut len = std::mem::size_of::<c_uint>();
    let mut hooks: *const je::extent_hooks_t = &HOOKS.0;
    // SAFETY: `arenas.create` reads an `extent_hooks_t *` and writes the
    // new arena's index (an `unsigned`); the hooks live as long as the
    // process.
    let failed = unsafe {
        je::mallctl(
            c"arenas.create".as_ptr(),
            (&mut index as *mut c_uint).cast(),
            &mut len,
            (&mut hooks as *mut *const je::extent_hooks_t).cast(),
            std::mem::size_of::<*const je::extent_hooks_t>(),
        )
    };
    CREATING.store(usize::MAX, Release);
    if failed != 0 || index as usize >= ARENAS {
        return std::ptr::null_mut();
    }
    // The hooks recorded the region if jemalloc called them while creating
    // the arena; recorded here otherwise (no one allocates in the arena
    // before its index is known).
    let slot = &REGION_OF[index as usize];
    match slot.load(Acquire) {
        0 => slot.store(r as u16 + 1, Release),
        known if known as usize - 1 != r => return std::ptr::null_mut(),
        _ => {}
    }
    ARENA_OF[r].store(index + 1, Release);
    TAKEN.store(r + 1, Relaxed);
    region_start(r) as *mut u8
}

/// The heap (region) `block` lies in, or null: not in the reservation.
/// Relaxed: a block of a heap is freed by a thread that got its address
/// from the one that made it, after the reservation was made.
#[inline(always)]
pub(super) fn heap_of(block: *const u8) -> *mut u8 {
    let base = BASE.load(Relaxed);
    let offset = (block as usize).wrapping_sub(base);
    if offset < SPAN {
        (base + (offset & !(REGION - 1))) as *mut u8
    } else {
        std::ptr::null_mut()
    }
}

/// The region `p` (a heap, or a block of one) lies in.
#[inline(always)]
fn region(p: *const u8) -> usize {
    ((p as usize).wrapping_sub(BASE.load(Relaxed)) / REGION).min(REGIONS - 1)
}

/// `mallocx`'s flags for a block of `layout` in `heap`'s arena (with
/// `Jemalloc`'s alignment flags, so that its size class is `nallocx`'s for
/// the layout), through the thread's cache for the heap.
#[inline(always)]
fn flags(heap: *mut u8, layout: Layout, zeroed: bool) -> std::os::raw::c_int {
    let r = region(heap);
    // Relaxed: the heap was bound to its account after `new_arena`
    // stored this (release/acquire through the account's heap).
    let arena = ARENA_OF[r].load(Relaxed).wrapping_sub(1) as usize;
    let zero = if zeroed { je::MALLOCX_ZERO } else { 0 };
    je::MALLOCX_ARENA(arena) | cache_flag(r) | super::charging::jemalloc_flags(layout) | zero
}

/// A block of `layout` from `heap`'s arena; null on failure.
///
/// # Safety
/// `heap` came from [`new_arena`]; `layout` has a non-zero size.
#[inline]
pub(super) unsafe fn alloc_in(heap: *mut u8, layout: Layout, zeroed: bool) -> *mut u8 {
    // SAFETY: a non-zero size; an arena index jemalloc gave.
    unsafe { je::mallocx(layout.size(), flags(heap, layout, zeroed)).cast() }
}

/// Free a block from [`alloc_in`], into this thread's cache for its heap.
///
/// # Safety
/// `block` is live, made by `alloc_in` with `layout`.
#[inline]
pub(super) unsafe fn dealloc_in(block: *mut u8, layout: Layout) {
    let flags = cache_flag(region(block)) | super::charging::jemalloc_flags(layout);
    // SAFETY: a live block of jemalloc's, its size within its class.
    unsafe { je::sdallocx(block.cast(), layout.size(), flags) }
}
