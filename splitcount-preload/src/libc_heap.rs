//! glibc's own allocator, reached without going through the interposed
//! symbols: its `__libc_*` entry points (exported for exactly this), and
//! the usable size of its blocks (see [`real_usable`]).

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(count: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
}

/// glibc's alignment of every block.
const MALLOC_ALIGN: usize = 16;

/// # Safety
/// As `malloc(3)`.
pub(crate) unsafe fn malloc(size: usize) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { __libc_malloc(size) }.cast()
}

/// A zeroed block of `size` bytes.
///
/// # Safety
/// As `calloc(3)`.
pub(crate) unsafe fn calloc(size: usize) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { __libc_calloc(size, 1) }.cast()
}

/// # Safety
/// As `realloc(3)`, on a block of glibc's.
pub(crate) unsafe fn realloc(ptr: *mut u8, size: usize) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { __libc_realloc(ptr.cast(), size) }.cast()
}

/// # Safety
/// As `free(3)`, on a block of glibc's.
pub(crate) unsafe fn free(ptr: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe { __libc_free(ptr.cast()) }
}

/// # Safety
/// As `memalign(3)`; `align` a power of two.
pub(crate) unsafe fn memalign(align: usize, size: usize) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { __libc_memalign(align, size) }.cast()
}

/// How [`real_usable`] asks glibc: not decided yet, from the chunk's size
/// word, or through glibc's `malloc_usable_size`.
static USABLE_VIA: AtomicUsize = AtomicUsize::new(UNDECIDED);
const UNDECIDED: usize = 0;
const SIZE_WORD: usize = 1;

type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;

/// glibc's `malloc_usable_size` (the one after ours), or 0.
fn glibc_usable_size() -> usize {
    // SAFETY: a NUL-terminated name; RTLD_NEXT is the object after this
    // one in lookup order (glibc). dlsym may allocate: through us, which
    // is safe at any time.
    unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) as usize }
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

/// Decide how to ask glibc for usable sizes: from the size word if that
/// agrees with glibc's `malloc_usable_size` on blocks of every kind (small,
/// large, mmapped, aligned), else through the function.
pub(crate) fn resolve() -> usize {
    let f = glibc_usable_size();
    let agrees = f != 0 && {
        // SAFETY: glibc's function on glibc's live blocks, freed after.
        unsafe {
            let usable = std::mem::transmute::<usize, UsableFn>(f);
            [1usize, 24, 100, 1000, 70_000, 300_000, 4 << 20]
                .iter()
                .all(|&n| {
                    let blocks = [malloc(n), memalign(64, n), memalign(4096, n)];
                    let same = blocks
                        .iter()
                        .all(|&b| !b.is_null() && usable(b.cast()) == from_size_word(b));
                    blocks.iter().for_each(|&b| free(b));
                    same
                })
        }
    };
    let via = if agrees { SIZE_WORD } else { f };
    // Relaxed: the same value for every thread.
    USABLE_VIA.store(via, Ordering::Relaxed);
    via
}

/// What glibc says a block of its own can hold.
///
/// # Safety
/// `base` is a live block of glibc's.
#[inline]
pub(crate) unsafe fn real_usable(base: *mut u8) -> usize {
    // Relaxed: see `resolve`.
    let via = match USABLE_VIA.load(Ordering::Relaxed) {
        UNDECIDED => resolve(),
        v => v,
    };
    if via == SIZE_WORD || via == UNDECIDED {
        // SAFETY: the caller's contract (UNDECIDED: no dlsym; the size
        // word is all there is).
        return unsafe { from_size_word(base) };
    }
    // SAFETY: `via` is glibc's malloc_usable_size.
    unsafe { std::mem::transmute::<usize, UsableFn>(via)(base.cast()) }
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
