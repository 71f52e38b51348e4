//! Where the program's blocks come from: glibc's heap, or the inner
//! allocator chosen with `SPLITCOUNT_PRELOAD_INNER` (the system's
//! `libjemalloc.so.2` or `libmimalloc.so.2`).
//!
//! An inner allocator is resolved **by name from its own library**:
//! `dlopen` of the library (which returns the copy already loaded when the
//! program links it, as Debian's `redis-server` links jemalloc: one heap)
//! and `dlsym` on that handle — never `RTLD_NEXT` or the global scope,
//! where the first `malloc` found depends on the link order. Its functions
//! are stored before the accounting is marked ready (the `Release` store
//! of the preload's state), so a thread that sees it ready sees them.
//!
//! With tags, every block records its heap (the tag's top byte, see
//! `header`): blocks made before the inner allocator was set up, or while
//! it is being set up, are glibc's and go back to glibc. Over-aligned
//! blocks are then always glibc's (their trailer is found through glibc's
//! usable size, which needs glibc's chunk header in front of the block; an
//! inner allocator's block may start a fresh mapping, with nothing readable
//! before it). Without tags (`untagged`), the blocks of the set-up are
//! remembered with their heap, every later block is the inner allocator's,
//! over-aligned ones included ([`Heap::aligned`]).

use crate::libc_heap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// A heap a block can come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heap {
    /// glibc's (`__libc_malloc` …).
    Glibc,
    /// The inner allocator chosen at load.
    Inner,
}

/// The inner allocators the preload can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inner {
    /// glibc's own allocator (the default): no second heap.
    Glibc,
    /// jemalloc, from the system's `libjemalloc.so.2` (Debian: `libjemalloc2`).
    Jemalloc,
    /// mimalloc, from the system's `libmimalloc.so.2` (Debian: `libmimalloc2.0`).
    Mimalloc,
}

impl Inner {
    /// Its name, as `SPLITCOUNT_PRELOAD_INNER` spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Inner::Glibc => "glibc",
            Inner::Jemalloc => "jemalloc",
            Inner::Mimalloc => "mimalloc",
        }
    }

    /// The library it is loaded from, and the Debian package that has it.
    fn library(self) -> (&'static std::ffi::CStr, &'static str) {
        match self {
            Inner::Glibc => (c"libc.so.6", "libc6"),
            Inner::Jemalloc => (c"libjemalloc.so.2", "libjemalloc2"),
            Inner::Mimalloc => (c"libmimalloc.so.2", "libmimalloc2.0"),
        }
    }
}

// The C allocation functions' types (glibc's entry points in `libc_heap`
// and the process's `malloc` in `lib.rs` too).
pub(crate) type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
pub(crate) type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
pub(crate) type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
pub(crate) type FreeFn = unsafe extern "C" fn(*mut c_void);
pub(crate) type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;
type GoodSizeFn = unsafe extern "C" fn(usize, i32) -> usize;
type MallctlFn =
    unsafe extern "C" fn(*const libc::c_char, *mut c_void, *mut usize, *mut c_void, usize) -> i32;
type MiGoodSizeFn = unsafe extern "C" fn(usize) -> usize;
/// `(alignment, size)`: `aligned_alloc`, `mi_malloc_aligned`, `memalign`.
pub(crate) type AlignedAllocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type MiProcessInfoFn = unsafe extern "C" fn(
    *mut usize,
    *mut usize,
    *mut usize,
    *mut usize,
    *mut usize,
    *mut usize,
    *mut usize,
    *mut usize,
);

/// Whether the inner allocator is set up (the program's new blocks come
/// from it).
static ON: AtomicBool = AtomicBool::new(false);

/// Which one (an `Inner` as its index), for the report.
static WHICH: AtomicUsize = AtomicUsize::new(0);

/// The inner allocator's functions (addresses; 0 before set-up): malloc,
/// calloc, realloc, free, usable size, good size (jemalloc's `nallocx` or
/// mimalloc's `mi_good_size`), and its statistics call (jemalloc's
/// `mallctl`, mimalloc's `mi_process_info`), and its aligned allocation
/// (jemalloc's `aligned_alloc(align, size)`, mimalloc's
/// `mi_malloc_aligned(size, align)`: the arguments the other way round).
static FNS: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];
/// The largest request [`CLASSES`] answers.
const CLASS_TABLE_MAX: usize = 1024;

/// The inner allocator's size class of every request up to
/// [`CLASS_TABLE_MAX`] bytes, by `(size + 7) / 8` (the classes are
/// multiples of 8, so a request has the class of the next multiple of 8),
/// from the allocator's own answer at set-up: jemalloc's `nallocx` — "the
/// real size of the allocation that would result from the equivalent
/// `mallocx()`", i.e. the usable size of the block `malloc(size)` returns
/// — or mimalloc's `mi_good_size`, which is the usable size of the block
/// `mi_malloc(size)` returns (for Debian's `libmimalloc.so.2`: 5 million
/// blocks of 1–1,024 bytes churned through a ring, none other; a build
/// with padding breaks it, so the set-up compares the table with the usable
/// size of its one block of 64 bytes and keeps no table if they differ). The fast
/// path's `malloc` reads it for the block it just made instead of asking
/// the usable size (jemalloc's walks its radix tree: 40 instructions a
/// call; mimalloc's finds the block's page: about 19). 0: not known (not
/// set up); `free` still asks, and gets the same size.
static CLASSES: [AtomicU32; CLASS_TABLE_MAX / 8 + 1] =
    [const { AtomicU32::new(0) }; CLASS_TABLE_MAX / 8 + 1];

/// Fill [`CLASSES`] from the inner allocator's good size (looked up):
/// jemalloc's `nallocx(size, 0)`, mimalloc's `mi_good_size(size)`.
/// Allocates nothing.
fn learn_classes(inner: Inner) {
    let good = f(GOOD_SIZE);
    for (i, class) in CLASSES.iter().enumerate().skip(1) {
        // SAFETY: the allocator's function of that signature, looked up by
        // `set_up`; neither allocates (size 0, undefined for `nallocx`, is
        // left out: its entry stays 0).
        let n = unsafe {
            match inner {
                Inner::Jemalloc => std::mem::transmute::<usize, GoodSizeFn>(good)(i * 8, 0),
                _ => std::mem::transmute::<usize, MiGoodSizeFn>(good)(i * 8),
            }
        };
        if let Ok(n) = u32::try_from(n) {
            class.store(n, Ordering::Relaxed);
        }
    }
}

const MALLOC: usize = 0;
const CALLOC: usize = 1;
const REALLOC: usize = 2;
const FREE: usize = 3;
const USABLE: usize = 4;
const GOOD_SIZE: usize = 5;
const STATS: usize = 6;
const ALIGNED: usize = 7;

#[inline]
fn f(i: usize) -> usize {
    // Relaxed: written before the preload's state is stored READY with
    // Release; every caller reached here after an Acquire load of it, or
    // holds a block of the inner heap (made after such a load: the block's
    // hand-over to this thread is the program's synchronization).
    FNS[i].load(Ordering::Relaxed)
}

/// Load `inner`'s library and look its functions up; then the program's
/// new blocks come from it. Called once, at load, before the accounting is
/// ready (allocations meanwhile — `dlopen`'s own — are glibc's). `Err`
/// says why it cannot be used.
pub(crate) fn set_up(inner: Inner) -> Result<(), String> {
    if inner == Inner::Glibc {
        return Ok(());
    }
    let (library, package) = inner.library();
    // SAFETY: a NUL-terminated name; the handle is kept for the life of
    // the process (never closed: its functions are used to the end).
    let handle = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        let why = dlerror();
        let hint = if why.contains("static TLS") {
            // jemalloc keeps its thread state in initial-exec TLS: a library
            // loaded after start-up gets it only from glibc's surplus.
            format!(
                "it needs static TLS, which a library loaded after start-up only gets with \
                 GLIBC_TUNABLES=glibc.rtld.optional_static_tls=65536 set for the program, or \
                 when it is preloaded too: LD_PRELOAD=\"<this library> {}\"",
                library.to_string_lossy()
            )
        } else {
            format!("Debian: apt-get install {package}")
        };
        return Err(format!(
            "SPLITCOUNT_PRELOAD_INNER={}: cannot load {}: {why}; {hint}",
            inner.name(),
            library.to_string_lossy(),
        ));
    }
    let names: [&std::ffi::CStr; 8] = match inner {
        Inner::Jemalloc => [
            c"malloc",
            c"calloc",
            c"realloc",
            c"free",
            c"malloc_usable_size",
            c"nallocx",
            c"mallctl",
            c"aligned_alloc",
        ],
        _ => [
            c"mi_malloc",
            c"mi_calloc",
            c"mi_realloc",
            c"mi_free",
            c"mi_usable_size",
            c"mi_good_size",
            c"mi_process_info",
            c"mi_malloc_aligned",
        ],
    };
    for (i, name) in names.iter().enumerate() {
        // SAFETY: a live handle and a NUL-terminated name.
        let sym = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
        if sym == 0 {
            return Err(format!(
                "SPLITCOUNT_PRELOAD_INNER={}: {} has no {}",
                inner.name(),
                library.to_string_lossy(),
                name.to_string_lossy()
            ));
        }
        FNS[i].store(sym, Ordering::Relaxed);
    }
    WHICH.store(inner as usize, Ordering::Relaxed);
    learn_classes(inner);
    // Let the allocator initialize itself now, while the program's
    // allocations (its own, if it makes any) still go to glibc.
    // SAFETY: the allocator's malloc and free, looked up above.
    unsafe {
        let p = std::mem::transmute::<usize, MallocFn>(f(MALLOC))(64);
        if p.is_null() {
            return Err(format!(
                "SPLITCOUNT_PRELOAD_INNER={}: its first malloc failed",
                inner.name()
            ));
        }
        // The table against a real block: a build whose good size is not
        // the usable size (mimalloc with padding: its debug and secure
        // builds) keeps no table, and every block is asked.
        let usable = std::mem::transmute::<usize, UsableFn>(f(USABLE))(p);
        if CLASSES[64 / 8].load(Ordering::Relaxed) as usize != usable {
            for class in &CLASSES {
                class.store(0, Ordering::Relaxed);
            }
        }
        std::mem::transmute::<usize, FreeFn>(f(FREE))(p);
    }
    // Release: a thread that sees the inner heap on (Acquire in
    // `Heap::current`) sees `WHICH` and the functions, whatever the
    // preload's state says (a block made while it is being set up).
    ON.store(true, Ordering::Release);
    Ok(())
}

fn dlerror() -> String {
    // SAFETY: dlerror's string is valid until the next dl call (or null).
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "not found".to_owned()
        } else {
            std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// The inner allocator in use.
pub(crate) fn inner() -> Inner {
    match WHICH.load(Ordering::Relaxed) {
        1 => Inner::Jemalloc,
        2 => Inner::Mimalloc,
        _ => Inner::Glibc,
    }
}

impl Heap {
    /// Where a new ordinary block comes from now. The first call in the
    /// process sets the accounting up first (`libc_heap::ensure_resolved`):
    /// every general path picks its heap here before it makes a block.
    #[inline]
    pub(crate) fn current() -> Heap {
        libc_heap::ensure_resolved();
        // Acquire: pairs with the Release store in `set_up`.
        if ON.load(Ordering::Acquire) {
            Heap::Inner
        } else {
            Heap::Glibc
        }
    }

    /// # Safety
    /// As `malloc(3)`.
    #[inline]
    pub(crate) unsafe fn malloc(self, size: usize) -> *mut u8 {
        match self {
            // SAFETY: the caller's contract.
            Heap::Glibc => unsafe { libc_heap::malloc(size) },
            // SAFETY: the inner allocator's malloc (set up: see `f`).
            Heap::Inner => {
                unsafe { std::mem::transmute::<usize, MallocFn>(f(MALLOC))(size) }.cast()
            }
        }
    }

    /// A block of `size` bytes aligned to `align` (a power of two above
    /// 8). Used without tags only: with tags, over-aligned blocks are
    /// glibc's (see the module docs).
    ///
    /// # Safety
    /// `align` is a power of two.
    #[inline]
    pub(crate) unsafe fn aligned(self, align: usize, size: usize) -> *mut u8 {
        match (self, inner()) {
            // SAFETY: the caller's contract.
            (Heap::Glibc, _) | (_, Inner::Glibc) => unsafe { libc_heap::memalign(align, size) },
            // SAFETY: jemalloc's aligned_alloc(align, size): any power of
            // two, any size.
            (Heap::Inner, Inner::Jemalloc) => {
                unsafe { std::mem::transmute::<usize, AlignedAllocFn>(f(ALIGNED))(align, size) }
                    .cast()
            }
            // SAFETY: mimalloc's mi_malloc_aligned(size, align).
            (Heap::Inner, Inner::Mimalloc) => {
                unsafe { std::mem::transmute::<usize, AlignedAllocFn>(f(ALIGNED))(size, align) }
                    .cast()
            }
        }
    }

    /// A zeroed block of `size` bytes.
    ///
    /// # Safety
    /// As `calloc(3)`.
    #[inline]
    pub(crate) unsafe fn calloc(self, size: usize) -> *mut u8 {
        match self {
            // SAFETY: the caller's contract.
            Heap::Glibc => unsafe { libc_heap::calloc(size) },
            // SAFETY: the inner allocator's calloc.
            Heap::Inner => {
                unsafe { std::mem::transmute::<usize, CallocFn>(f(CALLOC))(size, 1) }.cast()
            }
        }
    }

    /// # Safety
    /// As `realloc(3)`, on a block of this heap.
    #[inline]
    pub(crate) unsafe fn realloc(self, ptr: *mut u8, size: usize) -> *mut u8 {
        match self {
            // SAFETY: the caller's contract.
            Heap::Glibc => unsafe { libc_heap::realloc(ptr, size) },
            // SAFETY: the inner allocator's realloc, on its block.
            Heap::Inner => {
                unsafe { std::mem::transmute::<usize, ReallocFn>(f(REALLOC))(ptr.cast(), size) }
                    .cast()
            }
        }
    }

    /// # Safety
    /// As `free(3)`, on a block of this heap.
    #[inline]
    pub(crate) unsafe fn free(self, ptr: *mut u8) {
        match self {
            // SAFETY: the caller's contract.
            Heap::Glibc => unsafe { libc_heap::free(ptr) },
            // SAFETY: the inner allocator's free, on its block.
            Heap::Inner => unsafe { std::mem::transmute::<usize, FreeFn>(f(FREE))(ptr.cast()) },
        }
    }

    /// The usable size of `p`, a block this heap just made for a request
    /// of `size` bytes: the inner allocator's size class from [`CLASSES`] when known,
    /// else [`Heap::usable`] — the same number.
    ///
    /// # Safety
    /// As [`Heap::usable`]; `p` came from `malloc(size)` of this heap.
    #[inline(always)]
    pub(crate) unsafe fn usable_of_new(self, p: *mut u8, size: usize) -> usize {
        if self == Heap::Inner && size <= CLASS_TABLE_MAX {
            // Relaxed: filled before the inner heap was switched on
            // (`ON`'s Release), which the caller's heap came from.
            let class = CLASSES[(size + 7) >> 3].load(Ordering::Relaxed);
            if class != 0 {
                return class as usize;
            }
        }
        // SAFETY: the caller's contract.
        unsafe { self.usable(p) }
    }

    /// [`Heap::usable`] where it needs no call of glibc's (the fast
    /// path's `free`, which then saves no registers): glibc's from the
    /// size word once that is settled (`None` before, or where glibc's
    /// function is kept: ask [`Heap::usable`]); the inner allocator's
    /// function otherwise.
    ///
    /// # Safety
    /// As [`Heap::usable`].
    #[inline(always)]
    pub(crate) unsafe fn usable_without_call(self, ptr: *mut u8) -> Option<usize> {
        match self {
            // SAFETY: the caller's contract.
            Heap::Glibc => unsafe { libc_heap::usable_from_settled_size_word(ptr) },
            // SAFETY: the caller's contract.
            Heap::Inner => Some(unsafe { self.usable(ptr) }),
        }
    }

    /// The usable size of a live block of this heap.
    ///
    /// # Safety
    /// `ptr` is a live block of this heap.
    #[inline]
    pub(crate) unsafe fn usable(self, ptr: *mut u8) -> usize {
        match self {
            // SAFETY: the caller's contract.
            Heap::Glibc => unsafe { libc_heap::real_usable(ptr) },
            // SAFETY: the inner allocator's usable size, on its block.
            Heap::Inner => unsafe { std::mem::transmute::<usize, UsableFn>(f(USABLE))(ptr.cast()) },
        }
    }

    /// What a live block of this heap takes from it, whose usable size is
    /// `usable`: glibc's chunk (the usable bytes and its size word — two
    /// words for a mapped chunk —, read from the size word); jemalloc's and
    /// mimalloc's blocks have no per-block header (their size class is the
    /// footprint; slab metadata is shared).
    ///
    /// # Safety
    /// `ptr` is a live block of this heap.
    #[inline]
    pub(crate) unsafe fn footprint(self, ptr: *mut u8, usable: usize) -> usize {
        match self {
            // SAFETY: glibc's chunk has its size word just before the block;
            // the low three bits are flags.
            Heap::Glibc => unsafe { ptr.cast::<usize>().sub(1).read() & !7 },
            Heap::Inner => usable,
        }
    }

    /// Whether `realloc` may grow a block of this heap where it is — and
    /// then its growth is charged beforehand, up to [`Heap::most_usable`].
    /// mimalloc's `mi_realloc` never does (a block that outgrows its usable
    /// size moves), and its large blocks are rounded far beyond
    /// `mi_good_size` (142,286 bytes asked: 196,608 usable; 542,919:
    /// 1,048,576), so no cheap bound holds: its blocks grow by a move, whose
    /// new block is charged what it is.
    pub(crate) fn grows_in_place(self) -> bool {
        !(self == Heap::Inner && inner() == Inner::Mimalloc)
    }

    /// The most bytes [`Heap::footprint`] can say of a block asked for with
    /// `size` bytes (a bound; for glibc 64 bytes over, a page more at
    /// 128 KiB and above: see [`Heap::most_usable`]).
    ///
    /// # Safety
    /// As [`Heap::most_usable`].
    pub(crate) unsafe fn most_footprint(self, size: usize, old: *mut u8) -> usize {
        // SAFETY: forwarded.
        unsafe { self.most_usable(size, old) }.saturating_add(16)
    }

    /// The most usable bytes a block asked for with `size` bytes can get:
    /// what `realloc` charges before the block moves (only where
    /// [`Heap::grows_in_place`]: for mimalloc's large blocks this is no
    /// bound). glibc: a chunk of its arenas is the size with its size word,
    /// rounded to 16 bytes, plus at most a neighbour's remainder too small
    /// to split off (under 32 bytes): under 64 bytes over. A block it maps
    /// (at or above its mmap threshold, never below 128 KiB unless the
    /// program lowers it) is rounded to pages, and so is a mapped block
    /// `realloc` resizes (`mremap`, whatever the new size): a page more
    /// from 128 KiB on, or when `old`, the block being resized, is mapped.
    /// Below that a tight bound matters: growth near a limit is refused
    /// when the bound does not fit (a page of headroom refused a 1 KiB
    /// block's growth by 476 bytes with 3 KiB free). A block glibc maps
    /// below 128 KiB otherwise (a lowered threshold) goes past the bound;
    /// `realloc` then charges the excess unrefused.
    ///
    /// # Safety
    /// `old` is a live block of this heap.
    pub(crate) unsafe fn most_usable(self, size: usize, old: *mut u8) -> usize {
        let glibc_block = matches!((self, inner()), (Heap::Glibc, _) | (_, Inner::Glibc));
        // SAFETY: a glibc block has its size word just before it; bit 1
        // (IS_MMAPPED) says it is a mapping of its own.
        let mapped = glibc_block && unsafe { old.cast::<usize>().sub(1).read() } & 2 != 0;
        let rounding = if size < GLIBC_MMAP_THRESHOLD_MIN && !mapped {
            64
        } else {
            crate::page_size() + 64
        };
        let glibc = size.saturating_add(rounding);
        match (self, inner()) {
            (Heap::Glibc, _) | (_, Inner::Glibc) => glibc,
            // SAFETY: jemalloc's nallocx (no flags: the default alignment);
            // 0 when the size is too large: then at least glibc's bound.
            (Heap::Inner, Inner::Jemalloc) => {
                match unsafe { std::mem::transmute::<usize, GoodSizeFn>(f(GOOD_SIZE))(size, 0) } {
                    0 => glibc,
                    n => n,
                }
            }
            // SAFETY: mimalloc's mi_good_size.
            (Heap::Inner, Inner::Mimalloc) => {
                unsafe { std::mem::transmute::<usize, MiGoodSizeFn>(f(GOOD_SIZE))(size) }.max(size)
            }
        }
    }
}

/// glibc's smallest dynamic mmap threshold (`DEFAULT_MMAP_THRESHOLD_MIN`,
/// 128 KiB): below it glibc maps a block only if the program lowered the
/// threshold (`mallopt`, `GLIBC_TUNABLES=glibc.malloc.mmap_threshold`).
const GLIBC_MMAP_THRESHOLD_MIN: usize = 128 << 10;

/// The inner allocator's own figures for the exit report (`None` for
/// glibc, whose figures the report has anyway): `key=value` pairs.
/// Allocates; not for a signal handler.
pub(crate) fn figures() -> Option<String> {
    match inner() {
        Inner::Glibc => None,
        Inner::Jemalloc => {
            // SAFETY: jemalloc's mallctl; "epoch" refreshes the statistics,
            // the others are size_t reads.
            let mallctl = unsafe { std::mem::transmute::<usize, MallctlFn>(f(STATS)) };
            let read = |name: &std::ffi::CStr| -> Option<usize> {
                let (mut v, mut len) = (0usize, std::mem::size_of::<usize>());
                // SAFETY: a size_t out-parameter of the right length.
                let rc = unsafe {
                    mallctl(
                        name.as_ptr(),
                        (&mut v as *mut usize).cast(),
                        &mut len,
                        std::ptr::null_mut(),
                        0,
                    )
                };
                (rc == 0).then_some(v)
            };
            let mut epoch = 1u64;
            let mut len = std::mem::size_of::<u64>();
            // SAFETY: "epoch" takes and returns a uint64_t.
            unsafe {
                mallctl(
                    c"epoch".as_ptr(),
                    (&mut epoch as *mut u64).cast(),
                    &mut len,
                    (&mut epoch as *mut u64).cast(),
                    len,
                )
            };
            let show = |v: Option<usize>| v.map_or("unknown".to_owned(), |v| v.to_string());
            Some(format!(
                "jemalloc allocated={} active={} resident={}",
                show(read(c"stats.allocated")),
                show(read(c"stats.active")),
                show(read(c"stats.resident"))
            ))
        }
        Inner::Mimalloc => {
            let mut v = [0usize; 8];
            let [a, b, c, d, e, g, h, i] = &mut v;
            // SAFETY: mi_process_info's eight size_t out-parameters.
            unsafe {
                std::mem::transmute::<usize, MiProcessInfoFn>(f(STATS))(a, b, c, d, e, g, h, i)
            };
            // Its memory committed now and at most. Not its `current_rss`
            // and `peak_rss`: on Linux mimalloc reports its commit as the
            // current RSS, and the process's peak RSS (`getrusage`) as its
            // peak — a "current" above the peak, neither mimalloc's own.
            Some(format!(
                "mimalloc committed={} peak_committed={}",
                v[5], v[6]
            ))
        }
    }
}
