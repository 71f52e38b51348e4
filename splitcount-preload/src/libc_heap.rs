//! glibc's own allocator, reached without going through the interposed
//! symbols: its `__libc_*` entry points (exported for exactly this), and
//! the usable size of its blocks (see [`real_usable`]).

use crate::heap::{AlignedAllocFn, CallocFn, FreeFn, MallocFn, ReallocFn, UsableFn};
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(count: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// glibc's entry points, as the preload calls them. They start as the
/// dynamic linker binds the names — the first definition in the global
/// scope, glibc's in a plain process — and [`resolve`] replaces them with
/// libc.so.6's own before the preload serves the program: mimalloc also
/// exports `__libc_malloc` and its kin, and preloaded after the preload
/// (`LD_PRELOAD="<preload> libmimalloc.so.2"`) its copies were the ones
/// bound — "glibc's" blocks were mimalloc's, sized with glibc's
/// `malloc_usable_size`: every `malloc` crashed or failed.
static MALLOC: AtomicPtr<c_void> = AtomicPtr::new(__libc_malloc as *mut c_void);
static CALLOC: AtomicPtr<c_void> = AtomicPtr::new(__libc_calloc as *mut c_void);
static REALLOC: AtomicPtr<c_void> = AtomicPtr::new(__libc_realloc as *mut c_void);
static FREE: AtomicPtr<c_void> = AtomicPtr::new(__libc_free as *mut c_void);
static MEMALIGN: AtomicPtr<c_void> = AtomicPtr::new(__libc_memalign as *mut c_void);

/// libc.so.6's handle: the libc this process runs on, found by name
/// (`RTLD_NOLOAD`: never loaded). The loader may allocate a little while
/// it looks (through the preload's `malloc`, still INITIALIZING, with the
/// names as bound: glibc's in a plain process). Null if not found (a static or exotic libc: the bound
/// names are kept). The caller releases it (`dlclose`; libc stays).
fn libc_handle() -> *mut c_void {
    // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds a loaded
    // object.
    unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) }
}

/// Whether [`resolve`] has run (whatever it found).
static RESOLVED: AtomicBool = AtomicBool::new(false);

/// Make sure glibc's entry points are libc.so.6's before a block is made
/// through them: the first time, by setting the accounting up (whose first
/// step is [`resolve`]) — an allocation can come before the preload's
/// constructor. C++ programs make one: libstdc++'s constructor runs before
/// the preload's, and with mimalloc preloaded too its block came from
/// mimalloc's `__libc_malloc` (the name as bound) while the set-up, started
/// by the same call's charge, switched `free` to glibc's — glibc aborted
/// (`free(): invalid pointer`) before `main`. A call during the set-up
/// itself (the loader allocating while `resolve` looks) goes on with the
/// names as bound, as it did.
#[inline(always)]
pub(crate) fn ensure_resolved() {
    // Relaxed: set by the thread setting up, before READY's Release;
    // another thread that reads it false only calls `state`, which waits
    // for nothing and sets nothing up twice.
    if !RESOLVED.load(Ordering::Relaxed) {
        resolve_first();
    }
}

#[cold]
#[inline(never)]
fn resolve_first() {
    let _ = crate::state();
}

/// Replace glibc's entry points with libc.so.6's own definitions (see
/// [`MALLOC`]): all five, or none if one cannot be found. Call once,
/// first thing in the set-up, before any block is made through them.
pub(crate) fn resolve() {
    let handle = libc_handle();
    if handle.is_null() {
        RESOLVED.store(true, Ordering::Relaxed);
        return;
    }
    let names: [&CStr; 5] = [
        c"__libc_malloc",
        c"__libc_calloc",
        c"__libc_realloc",
        c"__libc_free",
        c"__libc_memalign",
    ];
    let mut found = [std::ptr::null_mut(); 5];
    for (name, f) in names.iter().zip(found.iter_mut()) {
        // SAFETY: a lookup in libc.so.6's own symbols (the handle is its
        // link map); a NUL-terminated name.
        *f = unsafe { libc::dlsym(handle, name.as_ptr()) };
    }
    // SAFETY: the handle from `libc_handle`, released once.
    unsafe { libc::dlclose(handle) };
    if found.iter().any(|f| f.is_null()) {
        RESOLVED.store(true, Ordering::Relaxed);
        return;
    }
    for (slot, f) in [&MALLOC, &CALLOC, &REALLOC, &FREE, &MEMALIGN]
        .into_iter()
        .zip(found)
    {
        // Relaxed: set before the preload is ready, which a Release store
        // publishes (see `lib.rs`'s `init`).
        slot.store(f, Ordering::Relaxed);
    }
    RESOLVED.store(true, Ordering::Relaxed);
}

/// glibc's alignment of every block.
const MALLOC_ALIGN: usize = 16;

/// # Safety
/// As `malloc(3)`.
#[inline(always)]
pub(crate) unsafe fn malloc(size: usize) -> *mut u8 {
    // SAFETY: glibc's `__libc_malloc` (see `MALLOC`); the caller's
    // contract.
    unsafe {
        std::mem::transmute::<*mut c_void, MallocFn>(MALLOC.load(Ordering::Relaxed))(size).cast()
    }
}

/// A zeroed block of `size` bytes.
///
/// # Safety
/// As `calloc(3)`.
#[inline(always)]
pub(crate) unsafe fn calloc(size: usize) -> *mut u8 {
    // SAFETY: glibc's `__libc_calloc`; the caller's contract.
    unsafe {
        std::mem::transmute::<*mut c_void, CallocFn>(CALLOC.load(Ordering::Relaxed))(size, 1).cast()
    }
}

/// # Safety
/// As `realloc(3)`, on a block of glibc's.
#[inline(always)]
pub(crate) unsafe fn realloc(ptr: *mut u8, size: usize) -> *mut u8 {
    // SAFETY: glibc's `__libc_realloc`; the caller's contract.
    unsafe {
        std::mem::transmute::<*mut c_void, ReallocFn>(REALLOC.load(Ordering::Relaxed))(
            ptr.cast(),
            size,
        )
        .cast()
    }
}

/// # Safety
/// As `free(3)`, on a block of glibc's.
#[inline(always)]
pub(crate) unsafe fn free(ptr: *mut u8) {
    // SAFETY: glibc's `__libc_free`; the caller's contract.
    unsafe { std::mem::transmute::<*mut c_void, FreeFn>(FREE.load(Ordering::Relaxed))(ptr.cast()) }
}

/// # Safety
/// As `memalign(3)`; `align` a power of two.
#[inline(always)]
pub(crate) unsafe fn memalign(align: usize, size: usize) -> *mut u8 {
    // SAFETY: glibc's `__libc_memalign`; the caller's contract.
    unsafe {
        std::mem::transmute::<*mut c_void, AlignedAllocFn>(MEMALIGN.load(Ordering::Relaxed))(
            align, size,
        )
        .cast()
    }
}

/// How [`real_usable`] asks glibc: not decided yet, from the chunk's size
/// word, or through glibc's `malloc_usable_size` (its address).
static USABLE_VIA: AtomicUsize = AtomicUsize::new(UNDECIDED);
const UNDECIDED: usize = 0;
const SIZE_WORD: usize = 1;

/// glibc's `malloc_usable_size` while [`USABLE_VIA`] is undecided (0: not
/// looked up yet), and how many of the program's blocks agreed so far.
static GLIBC_USABLE: AtomicUsize = AtomicUsize::new(0);
static AGREED: AtomicUsize = AtomicUsize::new(0);

/// Whether glibc's `malloc_usable_size` is being looked up.
static LOOKING_UP: AtomicBool = AtomicBool::new(false);

/// Blocks of the program's own whose size words must agree with glibc's
/// function before the size word is trusted.
const AGREEMENTS: usize = 64;

/// glibc's `malloc_usable_size`, looked up in libc.so.6 itself — never
/// `RTLD_NEXT`, which finds the copy of a program that links jemalloc or
/// mimalloc first (`redis-server`): calling that one on glibc's blocks
/// crashed at start-up. 0 if libc cannot be found by name (a static or
/// exotic libc: the size word is then all there is).
fn glibc_usable_size() -> usize {
    // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds the libc this
    // process already runs on (it never loads one). dlopen and dlsym may
    // allocate: through us, which is safe at any time.
    let libc = libc_handle();
    if libc.is_null() {
        return 0;
    }
    // SAFETY: a lookup in libc.so.6's own symbols; a NUL-terminated name.
    // The handle's reference is dropped (libc stays loaded regardless).
    unsafe {
        let f = libc::dlsym(libc, c"malloc_usable_size".as_ptr()) as usize;
        libc::dlclose(libc);
        f
    }
}

/// What glibc's `malloc_usable_size` computes, read straight from the
/// chunk's size word (the word before the block; low 3 bits are flags, an
/// mmapped chunk has two words of overhead, an arena chunk one): glibc's
/// function also checks for `mcheck` and memory tagging, which costs a
/// sixth of a `malloc`+`free` pair.
///
/// # Safety
/// `base` is a live block of glibc's.
#[inline]
unsafe fn from_size_word(base: *mut u8) -> usize {
    // SAFETY: a glibc block has its size word just before it.
    let size = unsafe { base.cast::<usize>().sub(1).read() };
    (size & !7).saturating_sub(if size & 2 != 0 { 16 } else { 8 })
}

/// What glibc says a block of its own can hold.
///
/// How it asks is learnt from the program's own blocks, without
/// allocating a probe of ours (a probe's freed large blocks raised glibc's
/// dynamic mmap and trim thresholds for the whole process): the first
/// [`AGREEMENTS`] blocks go through glibc's `malloc_usable_size`, and the
/// size word is compared with it; if all agree, the size word is read from
/// then on, else the function is kept.
///
/// # Safety
/// `base` is a live block of glibc's.
#[inline]
pub(crate) unsafe fn real_usable(base: *mut u8) -> usize {
    // Relaxed: every thread reaches the same decision; a thread that reads
    // a stale value only asks the function once more.
    match USABLE_VIA.load(Ordering::Relaxed) {
        // SAFETY: the caller's contract.
        SIZE_WORD => unsafe { from_size_word(base) },
        // SAFETY: the caller's contract.
        UNDECIDED => unsafe { learn(base) },
        // SAFETY: `via` is glibc's malloc_usable_size.
        via => unsafe { std::mem::transmute::<usize, UsableFn>(via)(base.cast()) },
    }
}

/// [`real_usable`] when the size word answers (settled: see there); `None`
/// otherwise, without a call.
///
/// # Safety
/// As [`real_usable`].
#[inline(always)]
pub(crate) unsafe fn usable_from_settled_size_word(base: *mut u8) -> Option<usize> {
    // Relaxed: as in `real_usable`.
    if USABLE_VIA.load(Ordering::Relaxed) == SIZE_WORD {
        // SAFETY: the caller's contract.
        Some(unsafe { from_size_word(base) })
    } else {
        None
    }
}

/// [`real_usable`] while undecided.
///
/// # Safety
/// As `real_usable`.
#[cold]
unsafe fn learn(base: *mut u8) -> usize {
    // SAFETY: the caller's contract.
    let word = unsafe { from_size_word(base) };
    // Relaxed (all three): a cache of values every thread computes alike.
    let mut f = GLIBC_USABLE.load(Ordering::Relaxed);
    if f == 0 {
        // The look-up allocates (`dlopen`), and an allocation may ask for a
        // usable size again (without tags, every one does): while it runs
        // the size word answers, undecided.
        if LOOKING_UP.swap(true, Ordering::Relaxed) {
            return word;
        }
        f = glibc_usable_size();
        LOOKING_UP.store(false, Ordering::Relaxed);
        if f == 0 {
            USABLE_VIA.store(SIZE_WORD, Ordering::Relaxed);
            return word;
        }
        GLIBC_USABLE.store(f, Ordering::Relaxed);
    }
    // SAFETY: glibc's function on glibc's live block.
    let usable = unsafe { std::mem::transmute::<usize, UsableFn>(f)(base.cast()) };
    if usable != word {
        USABLE_VIA.store(f, Ordering::Relaxed);
    } else if AGREED.fetch_add(1, Ordering::Relaxed) + 1 >= AGREEMENTS {
        let _ =
            USABLE_VIA.compare_exchange(UNDECIDED, SIZE_WORD, Ordering::Relaxed, Ordering::Relaxed);
    }
    usable
}

/// glibc's allocator as a Rust `GlobalAlloc`: this library's own memory,
/// and the inner allocator of its [`splitcount::alloc::Accounted`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LibcHeap;

// SAFETY: glibc's allocator returns blocks aligned to 16, or to the
// alignment asked of `__libc_memalign`; each block is freed by glibc.
unsafe impl GlobalAlloc for LibcHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded; the alignment is a power of two.
        unsafe {
            if layout.align() <= MALLOC_ALIGN {
                malloc(layout.size())
            } else {
                memalign(layout.align(), layout.size())
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: forwarded.
            return unsafe { calloc(layout.size()) };
        }
        // SAFETY: forwarded; zeroed by hand.
        unsafe {
            let p = self.alloc(layout);
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, layout.size());
            }
            p
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: a block of glibc's.
        unsafe { free(ptr) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN {
            // SAFETY: a block of glibc's.
            return unsafe { realloc(ptr, new_size) };
        }
        // SAFETY: the default: allocate, copy, free.
        unsafe {
            let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                free(ptr);
            }
            new
        }
    }
}

/// Whether the host's `aligned_alloc` is glibc 2.38's (ISO C17: `EINVAL`
/// for an alignment of 0 or not a power of two) rather than the alias of
/// `memalign` of earlier versions, which accepts them. From
/// `gnu_get_libc_version` (a constant string; nothing allocated), once.
pub(crate) fn aligned_alloc_is_c17() -> bool {
    const UNKNOWN: u8 = 0;
    const MEMALIGN: u8 = 1;
    const C17: u8 = 2;
    static KIND: AtomicU8 = AtomicU8::new(UNKNOWN);
    // Relaxed: every thread computes the same value.
    let kind = match KIND.load(Ordering::Relaxed) {
        UNKNOWN => {
            // SAFETY: glibc's version, a NUL-terminated static string.
            let v = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
            let k = if c17_version(v.to_bytes()) {
                C17
            } else {
                MEMALIGN
            };
            KIND.store(k, Ordering::Relaxed);
            k
        }
        k => k,
    };
    kind == C17
}

/// Whether a glibc version string (`"2.36"`, `"2.38.9000"`) is 2.38 or later.
fn c17_version(v: &[u8]) -> bool {
    let mut parts = v.split(|&b| b == b'.').map(|p| {
        std::str::from_utf8(p)
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .unwrap_or(0)
    });
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 38)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glibc_2_38_and_later_have_the_c17_aligned_alloc() {
        for (v, c17) in [
            ("2.36", false),
            ("2.37", false),
            ("2.38", true),
            ("2.38.9000", true),
            ("2.41", true),
            ("3.0", true),
            ("1.99", false),
            ("", false),
        ] {
            assert_eq!(c17_version(v.as_bytes()), c17, "{v}");
        }
    }
}
