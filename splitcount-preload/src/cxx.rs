//! C++'s `operator new` and `operator delete`, on this library's `malloc`
//! and `free`.
//!
//! libstdc++'s own `operator new` calls `malloc`, which this library
//! interposes: a C++ program's heap is charged without these — unless
//! another allocator in the process exports the C++ operators itself.
//! jemalloc and mimalloc do, and they are in the global scope when
//! preloaded (as `SPLITCOUNT_PRELOAD_INNER=jemalloc` needs) or linked by
//! the program. Then `new` took that allocator's own path, never charged
//! (under a 4 MiB limit a program built 100,000 strings of 100 bytes), and jemalloc's
//! `delete` called this library's `free` on a block the library had not
//! made — a block without a tag, which `free` sends to glibc: glibc
//! aborted (`free(): invalid pointer`) at the first `delete`, `perf
//! --version` in a library's constructor. Defined here, the operators come
//! before any such library's in the lookup (a preloaded library comes
//! before the program's dependencies); a program's own replacement of
//! them, in the executable, still comes first.
//!
//! What they do is the C++ standard's, on this library's allocation:
//!
//! - `new` and `new[]` (aligned or not) allocate; on failure — a refusal
//!   at a limit included — they call the program's new-handler and try
//!   again, and without one throw `std::bad_alloc`, through the C++
//!   runtime's own `__throw_bad_alloc` (libstdc++'s or libc++'s, found by
//!   name when needed — in the global scope, or in a runtime a plugin
//!   loaded with `RTLD_LOCAL`: see [`runtime_function`]; a program calling
//!   `operator new` has one loaded; without one, the program aborts as
//!   `std::terminate` would);
//! - the `nothrow` forms return NULL on failure, without calling the
//!   new-handler (the standard's call it, and return NULL if it throws:
//!   this library cannot catch a C++ exception);
//! - every `delete` is `free` (the sized forms ignore the size: `free`
//!   needs none).
//!
//! The exceptions unwind through this module's frames, which are
//! `extern "C-unwind"` for it; nothing of the library's state is held
//! across them (the allocation that failed changed nothing).

// The operators' symbols are their C++ (Itanium ABI) mangled names.
#![allow(non_snake_case)]

use std::ffi::{c_void, CStr};

/// The C++ runtime's `std::new_handler`.
type NewHandler = unsafe extern "C-unwind" fn();

/// `std::get_new_handler()`.
type GetNewHandler = unsafe extern "C" fn() -> Option<NewHandler>;

/// The runtime's function that throws `std::bad_alloc`.
type ThrowBadAlloc = unsafe extern "C-unwind" fn() -> !;

/// `std::get_new_handler` of libstdc++, then of libc++.
const GET_NEW_HANDLER_NAMES: [&CStr; 2] =
    [c"_ZSt15get_new_handlerv", c"_ZNSt3__115get_new_handlerEv"];

/// `std::__throw_bad_alloc` of libstdc++, then of libc++.
const THROW_BAD_ALLOC_NAMES: [&CStr; 2] = [
    c"_ZSt17__throw_bad_allocv",
    c"_ZNSt3__117__throw_bad_allocEv",
];

/// The C++ runtimes, by the names they are loaded under.
const RUNTIMES: [&CStr; 2] = [c"libstdc++.so.6", c"libc++.so.1"];

/// The first of `names` the process defines: in the global scope, or else
/// in a C++ runtime loaded out of it — a C program's plugin written in C++,
/// `dlopen`ed with `RTLD_LOCAL`, brings libstdc++ in for itself only (its
/// `new` aborted instead of throwing: `dlsym(RTLD_DEFAULT)` did not see
/// it). Looked up on every failed `new`, never remembered: a runtime found
/// that way goes when its plugin is closed. The look-up runs unaccounted,
/// so that the loader's own small allocations are not refused at the limit
/// that made `new` fail.
#[cold]
fn runtime_function(names: &[&CStr]) -> Option<usize> {
    crate::ACCOUNTED.unaccounted(|| {
        let in_scope = |handle: *mut c_void| {
            names.iter().find_map(|name| {
                // SAFETY: a NUL-terminated name, looked up from a handle
                // (or `RTLD_DEFAULT`) that is valid here.
                let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
                (!f.is_null()).then_some(f as usize)
            })
        };
        in_scope(libc::RTLD_DEFAULT).or_else(|| {
            RUNTIMES.iter().find_map(|runtime| {
                // SAFETY: a NUL-terminated name; `RTLD_NOLOAD` only finds
                // a loaded object.
                let handle =
                    unsafe { libc::dlopen(runtime.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
                if handle.is_null() {
                    return None;
                }
                let f = in_scope(handle);
                // SAFETY: the handle just opened, released once; the
                // runtime stays loaded (its plugin holds it), and `f` is
                // used at once, by the thread whose `new` it serves.
                unsafe { libc::dlclose(handle) };
                f
            })
        })
    })
}

/// The program's new-handler, if it installed one.
#[cold]
fn new_handler() -> Option<NewHandler> {
    let get = runtime_function(&GET_NEW_HANDLER_NAMES)?;
    // SAFETY: the runtime's `std::get_new_handler`, by its mangled name.
    let get = unsafe { std::mem::transmute::<usize, GetNewHandler>(get) };
    // SAFETY: takes nothing, returns the handler or null.
    unsafe { get() }
}

/// Throw `std::bad_alloc` to the caller of `operator new`.
#[cold]
fn throw_bad_alloc() -> ! {
    if let Some(throw) = runtime_function(&THROW_BAD_ALLOC_NAMES) {
        // SAFETY: the runtime's `__throw_bad_alloc`, by its mangled name;
        // it unwinds to the caller through `extern "C-unwind"` frames.
        let throw = unsafe { std::mem::transmute::<usize, ThrowBadAlloc>(throw) };
        // SAFETY: takes nothing.
        unsafe { throw() }
    }
    const MESSAGE: &[u8] =
        b"splitcount-preload: operator new failed and no C++ runtime throws std::bad_alloc\n";
    // SAFETY: a buffer and its length; then the process ends as
    // `std::terminate` would end it.
    unsafe {
        libc::write(2, MESSAGE.as_ptr().cast(), MESSAGE.len());
        libc::abort()
    }
}

/// One try at a block of `size` bytes aligned to `align` (0: `malloc`'s
/// alignment); null on failure. An alignment that is not a power of two
/// (a precondition `std::align_val_t` has) fails.
#[inline(always)]
fn allocate(size: usize, align: usize) -> *mut c_void {
    if align == 0 {
        // SAFETY: `malloc`'s contract: any size.
        return unsafe { crate::malloc(size) };
    }
    if !align.is_power_of_two() {
        return std::ptr::null_mut();
    }
    // SAFETY: a power of two.
    unsafe { crate::aligned(align, size) }
}

/// `operator new`: a block, or the new-handler and another try, or
/// `std::bad_alloc`.
#[inline(always)]
fn new_or_throw(size: usize, align: usize) -> *mut c_void {
    loop {
        let p = allocate(size, align);
        if !p.is_null() {
            return p;
        }
        match new_handler() {
            // SAFETY: the program's handler, called as `operator new`
            // calls it; it may throw (through this frame) or end the
            // program.
            Some(handler) => unsafe { handler() },
            None => throw_bad_alloc(),
        }
    }
}

/// `operator new(size_t)`.
#[no_mangle]
pub extern "C-unwind" fn _Znwm(size: usize) -> *mut c_void {
    new_or_throw(size, 0)
}

/// `operator new[](size_t)`.
#[no_mangle]
pub extern "C-unwind" fn _Znam(size: usize) -> *mut c_void {
    new_or_throw(size, 0)
}

/// `operator new(size_t, std::align_val_t)`.
#[no_mangle]
pub extern "C-unwind" fn _ZnwmSt11align_val_t(size: usize, align: usize) -> *mut c_void {
    new_or_throw(size, align.max(1))
}

/// `operator new[](size_t, std::align_val_t)`.
#[no_mangle]
pub extern "C-unwind" fn _ZnamSt11align_val_t(size: usize, align: usize) -> *mut c_void {
    new_or_throw(size, align.max(1))
}

/// `operator new(size_t, const std::nothrow_t&)`: null on failure.
#[no_mangle]
pub extern "C" fn _ZnwmRKSt9nothrow_t(size: usize, _: *const c_void) -> *mut c_void {
    allocate(size, 0)
}

/// `operator new[](size_t, const std::nothrow_t&)`: null on failure.
#[no_mangle]
pub extern "C" fn _ZnamRKSt9nothrow_t(size: usize, _: *const c_void) -> *mut c_void {
    allocate(size, 0)
}

/// `operator new(size_t, std::align_val_t, const std::nothrow_t&)`.
#[no_mangle]
pub extern "C" fn _ZnwmSt11align_val_tRKSt9nothrow_t(
    size: usize,
    align: usize,
    _: *const c_void,
) -> *mut c_void {
    allocate(size, align.max(1))
}

/// `operator new[](size_t, std::align_val_t, const std::nothrow_t&)`.
#[no_mangle]
pub extern "C" fn _ZnamSt11align_val_tRKSt9nothrow_t(
    size: usize,
    align: usize,
    _: *const c_void,
) -> *mut c_void {
    allocate(size, align.max(1))
}

/// Every `operator delete`: `free`.
///
/// # Safety
/// The C++ contract: `p` is null or a block of the matching `operator new`
/// (this library's `malloc` or aligned allocation), not used again.
#[inline(always)]
unsafe fn delete(p: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { crate::free(p) }
}

/// Export each form of `operator delete` as `free`: its extra arguments
/// (the size, the alignment, `nothrow`) change nothing — `free` needs none.
macro_rules! deletes {
    ($($(#[doc = $doc:literal])* $name:ident($($arg:ty),*);)*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// As [`delete`].
        #[no_mangle]
        pub unsafe extern "C" fn $name(p: *mut c_void $(, _: $arg)*) {
            // SAFETY: forwarded.
            unsafe { delete(p) }
        }
    )*};
}

deletes! {
    /// `operator delete(void*)`.
    _ZdlPv();
    /// `operator delete[](void*)`.
    _ZdaPv();
    /// `operator delete(void*, size_t)`.
    _ZdlPvm(usize);
    /// `operator delete[](void*, size_t)`.
    _ZdaPvm(usize);
    /// `operator delete(void*, std::align_val_t)`.
    _ZdlPvSt11align_val_t(usize);
    /// `operator delete[](void*, std::align_val_t)`.
    _ZdaPvSt11align_val_t(usize);
    /// `operator delete(void*, size_t, std::align_val_t)`.
    _ZdlPvmSt11align_val_t(usize, usize);
    /// `operator delete[](void*, size_t, std::align_val_t)`.
    _ZdaPvmSt11align_val_t(usize, usize);
    /// `operator delete(void*, const std::nothrow_t&)`.
    _ZdlPvRKSt9nothrow_t(*const c_void);
    /// `operator delete[](void*, const std::nothrow_t&)`.
    _ZdaPvRKSt9nothrow_t(*const c_void);
    /// `operator delete(void*, std::align_val_t, const std::nothrow_t&)`.
    _ZdlPvSt11align_val_tRKSt9nothrow_t(usize, *const c_void);
    /// `operator delete[](void*, std::align_val_t, const std::nothrow_t&)`.
    _ZdaPvSt11align_val_tRKSt9nothrow_t(usize, *const c_void);
}
