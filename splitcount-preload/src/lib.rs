//! # splitcount-preload
//!
//! An `LD_PRELOAD` library that charges an unmodified C or C++ program's
//! heap to splitcount groups:
//!
//! ```sh
//! cargo build --release --workspace
//! SPLITCOUNT_PRELOAD_MAX=512M SPLITCOUNT_PRELOAD_REPORT=1 \
//!   LD_PRELOAD=$PWD/target/release/libsplitcount_preload.so sqlite3 db.sqlite < work.sql
//! ```
//!
//! It interposes `malloc`, `free`, `calloc`, `realloc`, `reallocarray`,
//! `posix_memalign`, `aligned_alloc`, `memalign`, `valloc`, `pvalloc`,
//! `malloc_usable_size` and C++'s `operator new` and `operator delete`
//! (see `src/cxx.rs`), and runs glibc's `__cxa_thread_atexit_impl` with
//! accounting off (see `src/tls_dtors.rs`); the blocks come from glibc (`__libc_malloc`,
//! `__libc_memalign`, …) or from the inner allocator chosen by name, with
//! a 16-byte header in front (a 16-byte trailer for alignments above 16)
//! that names the block's **account**, exactly as the Rust wrapper [`splitcount::alloc::Accounted`] does — this library *is* that
//! wrapper's charge path, with a header that a size-less `free` can read.
//! Each block is charged its usable size (what `malloc_usable_size`
//! reports), or its footprint, to the calling thread's current group: the one it entered
//! through the C API (`splitcount_enter`, exported by this library), or
//! the group `/preload`.
//!
//! Environment (read once, at load; a value the preload cannot read stops
//! the program with exit status 78 and a message naming it: see
//! `settings.rs`):
//!
//! | variable | meaning |
//! |---|---|
//! | `SPLITCOUNT_PRELOAD_MAX` | the hard limit of `/preload`: whole bytes, optionally with a unit (`K`, `M`, `G`, `T`, `KiB`…, `KB`…; all powers of 1024; any case): `512M`, `512MB`, `2GiB`, `1048576`; or `max` / `unlimited`. |
//! | `SPLITCOUNT_PRELOAD_ENFORCE` | `refuse` (the default): an allocation that does not fit under the limit returns NULL with `errno = ENOMEM`, however often the program asks, until frees bring usage down (strict: no grace); `cooperative`: it succeeds, counted as an over-charge (`events.max`), and `splitcount_group_check` reports the breach. |
//! | `SPLITCOUNT_PRELOAD_REPORT` | `1`: report the usage, peak, limit, events and slack of `/preload` and of the root to stderr at exit (drained, with glibc's own count of bytes in use), at `_exit` and on a fatal signal (not drained), each line with the process's `pid=`, `program=` and `at=`; a path with a `/`: append the reports to `<path>.<pid>` instead. |
//! | `SPLITCOUNT_PRELOAD_CHARGE` | `usable` (the default) or `footprint`: what a block is charged — its usable size, or what it takes from the heap (the chunk, our 16 bytes and glibc's size word included). |
//! | `SPLITCOUNT_PRELOAD_INNER` | `glibc` (the default), `jemalloc` or `mimalloc`: the inner allocator, loaded by name from the system's `libjemalloc.so.2` / `libmimalloc.so.2` (see `src/heap.rs`). |
//! | `SPLITCOUNT_PRELOAD_TAGS` | `on` (the default) or `off`: no tag at all — every block is the heap's own, charged to `/preload`, and `splitcount_enter` is refused (see `src/untagged.rs`). |
//! | `SPLITCOUNT_PRELOAD_SIGNAL` | `USR1` or `USR2`: that signal writes a live snapshot (`at=live`, not drained) and the program goes on. |
//!
//! How a block is recognized as ours (and one glibc made without us as
//! not), why the first allocations of a process and of a thread are safe,
//! and what `fork` does: see `IMPLEMENTATION.md`, §10, and `src/header.rs`.

#![deny(unsafe_op_in_unsafe_fn)]

mod code_pages;
mod cxx;
mod fast;
mod header;
mod heap;
mod libc_heap;
mod report;
mod settings;
mod static_tls;
mod tls_dtors;
mod untagged;

/// The C API, exported by this library too: a preloaded program reaches
/// `splitcount_enter` and the rest through the dynamic linker (link
/// `-lsplitcount_preload`, or `dlsym(RTLD_DEFAULT, "splitcount_enter")`).
pub use splitcount_ffi::*;

use header::{Block, HEADER};
use heap::Heap;
use libc_heap::{real_usable, LibcHeap};
use splitcount::alloc::Accounted;
use splitcount::group::{Group, Hierarchy, HierarchyConfig};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};
use std::sync::OnceLock;

/// This library's own Rust allocations (its groups, the C API's tables) go
/// straight to glibc, unaccounted and without a header: they are the
/// accounting's memory, not the program's.
#[global_allocator]
static INTERNAL: LibcHeap = LibcHeap;

/// The charge path: the Rust wrapper's, attached to the preload's
/// hierarchy at load, with strict limits: a C program is told of a refusal
/// by NULL and `ENOMEM`, so no allocation after a refusal is let through
/// unaccounted (the Rust wrapper's reporting grace, there so that a Rust
/// program can format its refusal, is off).
static ACCOUNTED: Accounted<LibcHeap> = Accounted::new(LibcHeap).without_reporting_grace();

/// The account of `/preload`: what threads outside any group charge.
static DEFAULT_ACCOUNT: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

/// The hierarchy and `/preload`, for the exit report.
static PRELOAD: OnceLock<(Hierarchy, Group)> = OnceLock::new();

/// Where the accounting stands: one of the four constants below.
pub(crate) type State = u8;
const UNINIT: State = 0;
const INITIALIZING: State = 1;
const READY: State = 2;
const OFF: State = 3;
pub(crate) const STATE_INITIALIZING: State = INITIALIZING;
pub(crate) const STATE_READY: State = READY;
static STATE: AtomicU8 = AtomicU8::new(UNINIT);

/// The state, set up first if nothing has started it yet: `READY`,
/// `OFF`, or `INITIALIZING` (on the thread setting it up, or while another
/// does).
#[inline]
pub(crate) fn state() -> State {
    // Acquire: pairs with the Release store at the end of `init`; a thread
    // that sees READY sees the attached allocator and the default account.
    match STATE.load(Ordering::Acquire) {
        UNINIT => {
            init();
            STATE.load(Ordering::Acquire)
        }
        s => s,
    }
}

/// The state as it is, without setting anything up.
#[inline]
pub(crate) fn state_now() -> State {
    // Acquire: as in `state`.
    STATE.load(Ordering::Acquire)
}

/// Whether allocations are accounted: initializes on first use (from the
/// load-time constructor, or the first allocation if that comes earlier).
#[inline]
fn ready() -> bool {
    state() == READY
}

/// Build the hierarchy, attach the allocator, create `/preload` with the
/// environment's limit. One thread does it; allocations meanwhile (its own
/// included) pass unaccounted.
///
/// Fails closed: a bad `SPLITCOUNT_PRELOAD_*` value stops the program
/// ([`report::stop`]), and so does a failure to set the accounting up
/// while a limit is asked for — the program never runs unlimited where a
/// limit was meant. Without a limit, such a failure only turns the
/// accounting off (with a message).
#[cold]
fn init() -> bool {
    // Relaxed on failure: the winner's Release store publishes the result.
    if STATE
        .compare_exchange(UNINIT, INITIALIZING, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return STATE.load(Ordering::Acquire) == READY;
    }
    // The set-up's failed calls (a `/proc` file that is not there, a
    // refused `madvise`) leave the program's `errno` as they found it: it
    // runs inside the program's first `malloc`, which succeeds.
    // SAFETY: the thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    let ready = init_once();
    set_errno(errno);
    ready
}

/// [`init`]'s work, by the thread that won the right to do it.
fn init_once() -> bool {
    // Allocations meanwhile (this thread's too) see INITIALIZING: they
    // pass unaccounted.
    static_tls::claim();
    // glibc's heap from libc.so.6 itself, before any block is made
    // through it (an allocator preloaded after the preload may bind the
    // names first: see `libc_heap::MALLOC`).
    libc_heap::resolve();
    let state = (|| {
        let why = match std::panic::catch_unwind(setup) {
            Ok(Ok(())) => return READY,
            Ok(Err(why)) => why,
            Err(_) => "the set-up panicked".to_owned(),
        };
        let limit_asked = settings::var(c"SPLITCOUNT_PRELOAD_MAX")
            .is_some_and(|v| settings::parse_limit(&v) != Ok(None));
        if limit_asked {
            report::stop(&[format!(
                "SPLITCOUNT_PRELOAD_MAX is set, and the accounting cannot be set up: {why}"
            )]);
        }
        report::say(&format!("splitcount-preload: accounting off: {why}\n"));
        OFF
    })();
    // Release: publishes everything `setup` wrote.
    STATE.store(state, Ordering::Release);
    if state == READY {
        check_malloc_reaches_us();
    }
    if state == READY && !charging_footprints() {
        fast::enable(Heap::current(), untagged::on());
    }
    // The set-up's code is not run again: let its pages go.
    code_pages::shed();
    state == READY
}

fn setup() -> Result<(), String> {
    let settings = settings::Settings::from_env().unwrap_or_else(|errors| report::stop(&errors));
    // The inner allocator first: if the one asked for cannot be loaded,
    // the program stops (it was asked for by name; running on glibc
    // instead would not be what the operator measured).
    if let Err(why) = heap::set_up(settings.inner) {
        report::stop(&[why]);
    }
    if let Some((found, owner)) = malloc_is_not_ours() {
        // Decided once the accounting is ready (`check_malloc_reaches_us`):
        // a malloc that forwards to the next one reaches the preload.
        let _ = MALLOC_CHECK.set(MallocCheck {
            found,
            owner,
            limited: settings.max.is_some(),
        });
    }
    FOOTPRINT.store(settings.footprint, Ordering::Relaxed);
    if !settings.tags {
        splitcount_ffi::refuse_enter(
            "SPLITCOUNT_PRELOAD_TAGS=off: the preload charges every block to /preload (its \
             blocks carry no account), so a thread cannot enter a group; unset \
             SPLITCOUNT_PRELOAD_TAGS to charge groups",
        );
    }
    // Charged in bytes: `malloc` through the allocator's byte stock, and a
    // C program's `splitcount_group_try_charge` of bytes through the
    // hierarchy's stock, whose batch is therefore the byte batch too (with
    // the default 64 units every charge of 64 bytes or more missed it).
    let hierarchy = Hierarchy::new(HierarchyConfig {
        stock_batch: splitcount::alloc::BYTE_BATCH,
        ..HierarchyConfig::default()
    })
    .map_err(|e| e.to_string())?;
    ACCOUNTED.attach(&hierarchy).map_err(|e| e.to_string())?;
    let group = hierarchy
        .root()
        .child("preload")
        .map_err(|e| e.to_string())?;
    if let Some(max) = settings.max {
        group.set_max(max).map_err(|e| e.to_string())?;
    }
    group.set_enforcement(settings.enforcement);
    // The C API's one default for the groups it can limit (see
    // `SPLITCOUNT_ENFORCE_REFUSE`): the root a C program reaches through
    // `splitcount_preload_hierarchy` too.
    hierarchy
        .root()
        .set_enforcement(splitcount::Enforcement::Refuse);
    DEFAULT_ACCOUNT.store(
        splitcount::alloc::raw_account(&group) as *mut u8,
        Ordering::Relaxed,
    );
    splitcount_ffi::register_preload(hierarchy.clone(), group.clone());
    let _ = PRELOAD.set((hierarchy, group));
    report::set_up(settings.report, settings.snapshot_signal);
    Ok(())
}

/// Who defines the `malloc` the process calls, when it is not this
/// library's.
enum MallocOwner {
    /// The executable (an allocator linked into it, or a PLT entry of its
    /// own: see [`check_malloc_reaches_us`]), by its path.
    Program(String),
    /// A library searched before the preload, by its path.
    Library(String),
}

/// A `malloc` of another object's, to be tried once the accounting is
/// ready.
struct MallocCheck {
    /// Its address.
    found: usize,
    owner: MallocOwner,
    /// `SPLITCOUNT_PRELOAD_MAX` is set: stop the program if the calls do
    /// not reach the preload.
    limited: bool,
}

static MALLOC_CHECK: std::sync::OnceLock<MallocCheck> = std::sync::OnceLock::new();

/// The size `check_malloc_reaches_us` asks for: no allocator serves it
/// (above `PTRDIFF_MAX`: NULL from each), and a wrapper that adds a header
/// of its own before forwarding (memusage adds 16 bytes) keeps it above.
const PROBE_SIZE: usize = (isize::MAX as usize) + (1 << 61);

/// Set when a `malloc` of more than `PTRDIFF_MAX` bytes (the probe's, or a
/// program's own that fails anyway) reached this library.
static PROBE_REACHED: AtomicBool = AtomicBool::new(false);

/// `Some((address, owner))` if the process's `malloc` — the first
/// definition in the global lookup order, what every library and the
/// program call — is not this library's: a library loaded ahead of the
/// preload (`LD_PRELOAD="libjemalloc.so.2 <preload>"`), an executable
/// with an allocator linked in (it exports its `malloc` for the libraries
/// it uses), a wrapper that forwards to the next `malloc` (memusage,
/// heaptrack), or an executable's PLT entry (a non-PIE program that takes
/// `malloc`'s address exports it as the address every lookup answers).
/// Which of these it is, only a call tells: [`check_malloc_reaches_us`].
fn malloc_is_not_ours() -> Option<(usize, MallocOwner)> {
    // SAFETY: a lookup by name in the global scope; `dladdr` fills `info`
    // for an address of a loaded object, its strings owned by the loader.
    unsafe {
        let found = libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr());
        if found.is_null() {
            return None;
        }
        // Compared by the object that holds it, not with `malloc as usize`:
        // this library's own reference to its exported `malloc` may itself
        // be resolved through the global scope (to the same answer).
        let mut ours: libc::Dl_info = std::mem::zeroed();
        let mut info: libc::Dl_info = std::mem::zeroed();
        let here = std::ptr::addr_of!(STATE).cast::<c_void>();
        if libc::dladdr(here, &mut ours) == 0 || libc::dladdr(found, &mut info) == 0 {
            return None;
        }
        if info.dli_fbase == ours.dli_fbase {
            return None;
        }
        let name = if info.dli_fname.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned()
        };
        // The executable: the object its program headers (`AT_PHDR`) lie in.
        let mut main: libc::Dl_info = std::mem::zeroed();
        let phdr = libc::getauxval(libc::AT_PHDR) as *const c_void;
        let owner = if !phdr.is_null()
            && libc::dladdr(phdr, &mut main) != 0
            && main.dli_fbase == info.dli_fbase
        {
            MallocOwner::Program(if name.is_empty() {
                report::program()
            } else {
                name
            })
        } else {
            MallocOwner::Library(if name.is_empty() {
                "another library".to_owned()
            } else {
                name
            })
        };
        Some((found as usize, owner))
    }
}

/// Call the process's `malloc` (another object's, found at the set-up)
/// with [`PROBE_SIZE`] and see whether the call reaches this library: a
/// wrapper that forwards, or a PLT entry, does; a library ahead of the
/// preload or an allocator linked into the program does not — the
/// program's allocations would never be counted. Then, with a limit asked
/// for, the program stops (status 78) rather than run unlimited; without,
/// a message. Runs once, when the accounting is ready and before the fast
/// path is on (the probe's size goes to the general path, which marks it).
fn check_malloc_reaches_us() {
    let Some(check) = MALLOC_CHECK.get() else {
        return;
    };
    PROBE_REACHED.store(false, Ordering::Relaxed);
    // SAFETY: `found` is the address of the process's `malloc` (a C
    // function of `malloc`'s type); the size is one no allocator serves,
    // so nothing is allocated (a non-null answer is leaked, not freed
    // through a `free` that may not be its).
    let block = unsafe { std::mem::transmute::<usize, heap::MallocFn>(check.found)(PROBE_SIZE) };
    let _ = block;
    if PROBE_REACHED.load(Ordering::Relaxed) {
        return;
    }
    let (who, remedy) = match &check.owner {
        MallocOwner::Program(name) => (
            format!("the program's own ({name} defines malloc: an allocator linked into it)"),
            "run it with its allocator as a shared library, after the preload",
        ),
        MallocOwner::Library(name) => (
            format!("{name}'s, found before the preload's"),
            "put libsplitcount_preload.so first in LD_PRELOAD",
        ),
    };
    let why = format!(
        "malloc in this process is {who}, and its calls do not reach the preload: nothing \
         would be counted"
    );
    if check.limited {
        report::stop(&[format!(
            "{why}, so SPLITCOUNT_PRELOAD_MAX would not hold: {remedy}"
        )]);
    }
    report::say(&format!("splitcount-preload: {why}\n"));
}

/// Charge a new block of `usable` bytes to the thread's group; the
/// account for its header (null: unaccounted), `None` if a limit refused
/// it. Call only when [`ready`].
///
/// No re-entrancy flag of the preload's own: the charge path is the Rust
/// wrapper's, which is built to be re-entered by its own allocations (it
/// is a Rust program's global allocator): what it runs that may allocate —
/// refusal and event hooks, a thread's first registration of its exit
/// guard (glibc's `calloc`) — runs with the wrapper's hook flag set, and a
/// charge meanwhile answers null (unaccounted). The library's own Rust
/// memory never comes here (`INTERNAL`).
#[inline]
pub(crate) fn charge(usable: usize) -> Option<*const u8> {
    let fallback = DEFAULT_ACCOUNT.load(Ordering::Relaxed);
    // SAFETY: the fallback is `/preload`'s account, whose group `PRELOAD`
    // holds for the life of the process.
    unsafe { ACCOUNTED.charge_raw(usable as u64, fallback) }
}

/// `/preload`'s account (null before the set-up).
#[inline]
pub(crate) fn default_account() -> *const u8 {
    DEFAULT_ACCOUNT.load(Ordering::Relaxed)
}

/// Charge `n` bytes to `/preload` that must not be refused (a block
/// without a tag already made). Call only when ready.
pub(crate) fn force(n: usize) {
    // `/preload`'s account, held by `PRELOAD` for good.
    grow_unrefused(default_account(), n);
}

/// Charge `n` more bytes to a live block's `account` (or `/preload`'s)
/// that must not be refused: the block is made already (a limit may be
/// passed by that much).
pub(crate) fn grow_unrefused(account: *const u8, n: usize) {
    if account.is_null() || n == 0 {
        return;
    }
    // SAFETY: `account` is a live block's header's (its bytes keep it
    // alive), or `/preload`'s (held for good).
    unsafe { ACCOUNTED.force_raw(account, n as u64) }
}

/// Uncharge `n` bytes of a block charged to `account`.
#[inline]
pub(crate) fn uncharge(account: *const u8, n: usize) {
    if account.is_null() {
        return;
    }
    // SAFETY: `account` is a header's, whose block held `n` charged bytes.
    unsafe { ACCOUNTED.uncharge_raw(account, n as u64) }
}

/// Charge `n` more bytes to a block's `account` (growth in place).
#[inline]
fn grow(account: *const u8, n: usize) -> bool {
    if account.is_null() || n == 0 {
        return true;
    }
    // SAFETY: `account` is a live block's header's.
    unsafe { ACCOUNTED.grow_raw(account, n as u64) }
}

pub(crate) fn set_errno(e: i32) {
    // SAFETY: the thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Where a block's tag and account go.
#[derive(Clone, Copy)]
pub(crate) enum Place {
    /// In front: [`HEADER`] bytes.
    Header,
    /// In the block's last 16 usable bytes (over-aligned blocks).
    Trailer,
}

/// Finish a block of `heap`'s at `base`: charge its usable size and write
/// the header or trailer; NULL (the block freed, `errno = ENOMEM`) if a
/// limit refused it.
///
/// # Safety
/// `base` is null or a live block of `heap` with room for `place`: at
/// least [`HEADER`] bytes, or a trailer, 32-aligned and glibc's.
pub(crate) unsafe fn finish(base: *mut u8, place: Place, heap: Heap) -> *mut c_void {
    if base.is_null() {
        return std::ptr::null_mut();
    }
    let overhead = match place {
        Place::Header => HEADER,
        Place::Trailer => header::TRAILER,
    };
    let account = if ready() {
        // SAFETY: a live block of the heap.
        match charge(unsafe { charged_size(heap, base, overhead) }) {
            Some(a) => a,
            None => {
                // SAFETY: ours, never handed out.
                unsafe { heap.free(base) };
                set_errno(libc::ENOMEM);
                return std::ptr::null_mut();
            }
        }
    } else {
        std::ptr::null()
    };
    // SAFETY: the caller's contract.
    unsafe {
        match place {
            Place::Header => Block::write(base, account, heap),
            Place::Trailer => Block::write_trailer(base, account),
        }
    }
    .cast()
}

/// Whether blocks are charged their footprint (`SPLITCOUNT_PRELOAD_CHARGE
/// =footprint`) rather than their usable size. Set at load, before the
/// accounting is marked ready.
static FOOTPRINT: AtomicBool = AtomicBool::new(false);

#[inline]
pub(crate) fn charging_footprints() -> bool {
    // Relaxed: set before READY's Release store (see `heap::f`).
    FOOTPRINT.load(Ordering::Relaxed)
}

/// What a live block of `heap` at `base`, with `overhead` bytes of ours
/// (header or trailer), is charged: its usable size less ours, or its
/// footprint (ours and the heap's own included).
///
/// # Safety
/// `base` is a live block of `heap`.
#[inline]
pub(crate) unsafe fn charged_size(heap: Heap, base: *mut u8, overhead: usize) -> usize {
    // SAFETY: the caller's contract.
    let usable = unsafe { heap.usable(base) };
    if charging_footprints() {
        // SAFETY: as above.
        unsafe { heap.footprint(base, usable) }
    } else {
        usable - overhead
    }
}

/// The total of `n` and a header, if it is a size glibc can serve.
pub(crate) fn with_header(n: usize, header: usize) -> Option<usize> {
    n.checked_add(header).filter(|&t| t <= isize::MAX as usize)
}

/// `malloc(3)`, charged to the calling thread's group.
///
/// # Safety
/// The C contract of `malloc`.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    // SAFETY: the caller's contract; `malloc_general` or the fast path's
    // function once the set-up has ended.
    unsafe { fast::malloc_fn()(size) }
}

/// `malloc` when the fast path does not apply (before the set-up ended,
/// footprint charging). `extern "C"`: it cannot unwind, so `malloc`
/// reaches it by a jump.
///
/// # Safety
/// As `malloc(3)`.
#[inline(never)]
pub(crate) unsafe extern "C" fn malloc_general(size: usize) -> *mut c_void {
    if size > isize::MAX as usize {
        // `check_malloc_reaches_us`'s call, perhaps through a wrapper (or
        // a program's own request of a size no allocator serves): it
        // reached this library.
        PROBE_REACHED.store(true, Ordering::Relaxed);
        return enomem();
    }
    if untagged::on() {
        // SAFETY: the caller's contract.
        return unsafe { untagged::malloc(size) };
    }
    let Some(total) = with_header(size, HEADER) else {
        return enomem();
    };
    let heap = Heap::current();
    // SAFETY: the heap's allocator; a block of `total` bytes, 16-aligned.
    unsafe { finish(heap.malloc(total), Place::Header, heap) }
}

/// NULL with `errno = ENOMEM`.
#[cold]
pub(crate) fn enomem() -> *mut c_void {
    set_errno(libc::ENOMEM);
    std::ptr::null_mut()
}

/// `calloc(3)`, charged to the calling thread's group.
///
/// # Safety
/// The C contract of `calloc`.
#[no_mangle]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    if untagged::on() {
        let Some(total) = count.checked_mul(size) else {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        };
        // SAFETY: the caller's contract.
        return unsafe { untagged::calloc(total) };
    }
    let Some(total) = count.checked_mul(size).and_then(|n| with_header(n, HEADER)) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    let heap = Heap::current();
    // SAFETY: the heap's allocator; zeroed, header included.
    unsafe { finish(heap.calloc(total), Place::Header, heap) }
}

/// `free(3)`: uncharges the block's account. A block this library did not
/// make (glibc's own, from before it took over) goes to glibc as it is.
///
/// # Safety
/// The C contract of `free`.
#[no_mangle]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: the caller's contract, not null; `free_general` or the fast
    // path's function once the set-up has ended.
    unsafe { fast::free_fn()(ptr) }
}

/// `free` of a block (not null) outside the fast path. `extern "C"`: it
/// cannot unwind, so the fast path's miss reaches it by a jump.
///
/// # Safety
/// As `free(3)`, `ptr` not null.
#[inline(never)]
pub(crate) unsafe extern "C" fn free_general(ptr: *mut c_void) {
    if untagged::on() {
        // SAFETY: a pointer the program got from an allocation function.
        return unsafe { untagged::free(ptr.cast()) };
    }
    // SAFETY: a pointer the program got from an allocation function.
    match unsafe { Block::find(ptr.cast()) } {
        // SAFETY: ours and live.
        Some(block) => unsafe { free_block(block) },
        // SAFETY: not ours: glibc's.
        None => unsafe { libc_heap::free(ptr.cast()) },
    }
}

/// Free one of our blocks and uncharge its account.
///
/// # Safety
/// The block is ours and live; not used again.
#[inline]
unsafe fn free_block(block: Block) {
    // SAFETY: ours and live.
    let charged = unsafe { block.charged() };
    let account = block.account;
    // SAFETY: ours; the header is cleared so that the memory never looks
    // like one of our blocks again (see `header`).
    unsafe { block.free() };
    uncharge(account, charged);
}

/// `realloc(3)`: growth is charged to the block's own account (the group
/// that allocated it), and refused — the old block left as it was, NULL
/// and `errno = ENOMEM` — when its limit says so.
///
/// # Safety
/// The C contract of `realloc`.
#[no_mangle]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    if ptr.is_null() {
        // SAFETY: as malloc.
        return unsafe { malloc(size) };
    }
    if size == 0 {
        // glibc's realloc(p, 0) frees and returns NULL.
        // SAFETY: as free.
        unsafe { free(ptr) };
        return std::ptr::null_mut();
    }
    if untagged::on() {
        // SAFETY: a pointer the program got from an allocation function.
        return unsafe { untagged::realloc(ptr.cast(), size) };
    }
    // SAFETY: a pointer the program got from an allocation function.
    match unsafe { Block::find(ptr.cast()) } {
        // SAFETY: ours and live.
        Some(block) => unsafe { block.realloc(size) },
        None => {
            libc_heap::ensure_resolved();
            // SAFETY: not ours: glibc's, and it stays glibc's (unaccounted).
            unsafe { libc_heap::realloc(ptr.cast(), size) }.cast()
        }
    }
}

/// `reallocarray(3)`.
///
/// # Safety
/// The C contract of `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, count: usize, size: usize) -> *mut c_void {
    match count.checked_mul(size) {
        // SAFETY: as realloc.
        Some(n) => unsafe { realloc(ptr, n) },
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// An aligned block; `Err(errno)` for an alignment the caller may not ask
/// for.
///
/// # Safety
/// `align` is a power of two.
pub(crate) unsafe fn aligned(align: usize, size: usize) -> *mut c_void {
    if untagged::on() {
        if align <= 8 {
            // SAFETY: every heap's blocks are 8-aligned.
            return unsafe { malloc(size) };
        }
        // Above 8, the heap's aligned entry point: jemalloc's and
        // mimalloc's classes of 8 bytes are 8-aligned only (a block of 4
        // bytes asked for at 16 came back at …8 half the time).
        // SAFETY: a power of two above 8.
        return unsafe { untagged::aligned(align, size) };
    }
    if align <= HEADER {
        // SAFETY: with the 16-byte header in front, every block is
        // 16-aligned (glibc's chunks are; the inner heaps' classes of 16
        // bytes and more are).
        return unsafe { malloc(size) };
    }
    // The tag and account go at the block's end (a header in front would
    // take a whole alignment unit: see `header`).
    libc_heap::ensure_resolved();
    let Some(total) = with_header(size, header::TRAILER) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // SAFETY: glibc's allocator, `align` a power of two above 16.
    unsafe {
        finish(
            libc_heap::memalign(align, total),
            Place::Trailer,
            Heap::Glibc,
        )
    }
}

/// `posix_memalign(3)`.
///
/// # Safety
/// The C contract of `posix_memalign`.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || align % std::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    // posix_memalign reports through its result, and leaves errno alone.
    let saved = errno();
    // SAFETY: a power of two.
    let p = unsafe { aligned(align, size) };
    if p.is_null() {
        set_errno(saved);
        return libc::ENOMEM;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { out.write(p) };
    0
}

fn errno() -> i32 {
    // SAFETY: the thread's errno.
    unsafe { *libc::__errno_location() }
}

/// `aligned_alloc(3)` as the host's glibc has it. Up to glibc 2.37 it is
/// `memalign` (an alias): any alignment, 0 and those that are not a power
/// of two included (rounded up to one; 16 or less is `malloc`'s), and any
/// size, a multiple of the alignment or not. From 2.38 (ISO C17) an
/// alignment of 0 or not a power of two is `EINVAL`; the rest is
/// `memalign`'s still.
///
/// # Safety
/// The C contract of `aligned_alloc`.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() && libc_heap::aligned_alloc_is_c17() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: memalign's contract is aligned_alloc's.
    unsafe { memalign(align, size) }
}

/// `memalign(3)`: an alignment that is not a power of two is rounded up to
/// one, as glibc does (0 and 1 as well: 16 or less is `malloc`'s); above
/// 2^63 (no power of two to round to) `EINVAL`.
///
/// # Safety
/// The C contract of `memalign`.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    let Some(align) = align.max(1).checked_next_power_of_two() else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    // SAFETY: a power of two.
    unsafe { aligned(align, size) }
}

fn page_size() -> usize {
    // SAFETY: no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// `valloc(3)`: page-aligned.
///
/// # Safety
/// The C contract of `valloc`.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    // SAFETY: the page size is a power of two.
    unsafe { aligned(page_size(), size) }
}

/// `pvalloc(3)`: page-aligned, the size rounded up to whole pages.
///
/// # Safety
/// The C contract of `pvalloc`.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let page = page_size();
    let Some(rounded) = size.max(1).checked_next_multiple_of(page) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // SAFETY: the page size is a power of two.
    unsafe { aligned(page, rounded) }
}

/// `malloc_usable_size(3)`: the bytes the program may use in the block —
/// what it is charged.
///
/// # Safety
/// The C contract of `malloc_usable_size`.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> usize {
    if ptr.is_null() {
        return 0;
    }
    if untagged::on() {
        // SAFETY: a pointer the program got from an allocation function.
        return unsafe { untagged::usable(ptr.cast()) };
    }
    // SAFETY: a pointer the program got from an allocation function.
    match unsafe { Block::find(ptr.cast()) } {
        // SAFETY: ours and live.
        Some(block) => unsafe { block.usable() },
        // SAFETY: glibc's.
        None => unsafe { real_usable(ptr.cast()) },
    }
}

/// `_exit(2)`: the report (when `SPLITCOUNT_PRELOAD_REPORT` asks for
/// one; not drained, see `report`), then the process ends as glibc's
/// `_exit` ends it. Programs that leave this way (dash, `fork` children
/// that do not `exec`) reported nothing before.
///
/// # Safety
/// None beyond `_exit`'s: the process ends.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: i32) -> ! {
    report::undrained(report::Moment::UnderscoreExit);
    report::exit_now(status)
}

/// `_Exit(3)`: as [`_exit`].
///
/// # Safety
/// As `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: i32) -> ! {
    report::undrained(report::Moment::UnderscoreExit);
    report::exit_now(status)
}

/// Initialize at load, before `main`: the environment is read and the exit
/// report registered even in a program that allocates nothing before.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = {
    extern "C" fn at_load() {
        ready();
    }
    at_load
};
