//! glibc's `__cxa_thread_atexit_impl`, run with accounting off.
//!
//! A thread that first touches a `thread_local` object with a destructor —
//! C++'s, through libstdc++'s `__cxa_thread_atexit`, or another library's —
//! registers the destructor with glibc, which `calloc`s a small record for
//! it and ends the process if that fails (`Fatal glibc error: failed to
//! register TLS destructor: out of memory`), where no program can catch it.
//! At a refusing limit the record was refused: a C++ program that filled
//! its limit and then touched a `thread_local std::string` in another
//! thread died, in 8 of 12 configurations a helper tried (every one
//! without tags on jemalloc and mimalloc). The preload registers through
//! glibc's own function with accounting off, as it does for its own
//! thread-exit handler: the record (tens of bytes, once per object and
//! thread) is never refused. With tags it is charged to nothing; without
//! tags it is charged to `/preload` past the limit.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A thread-local object's destructor.
type Destructor = unsafe extern "C" fn(*mut c_void);

/// glibc's `__cxa_thread_atexit_impl(dtor, obj, dso_symbol)`.
type Register = unsafe extern "C" fn(Destructor, *mut c_void, *mut c_void) -> c_int;

/// glibc's function (0: not looked up yet). libc stays loaded.
static GLIBC: AtomicUsize = AtomicUsize::new(0);

/// glibc's `__cxa_thread_atexit_impl`: the next definition after the
/// preload's (libc.so.6's).
fn glibc_register() -> Option<Register> {
    // Relaxed: every thread finds the same address.
    let mut f = GLIBC.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: a NUL-terminated name; RTLD_NEXT searches the objects
        // after this one. dlsym allocates nothing for a name it finds.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"__cxa_thread_atexit_impl".as_ptr()) } as usize;
        if f == 0 {
            return None;
        }
        GLIBC.store(f, Ordering::Relaxed);
    }
    // SAFETY: glibc's function of that type, by its name.
    Some(unsafe { std::mem::transmute::<usize, Register>(f) })
}

/// `__cxa_thread_atexit_impl`: glibc's, with accounting off.
///
/// # Safety
/// glibc's contract: `dtor` is called with `obj` when the thread exits;
/// `dso` names the object that owns `dtor` (or is null).
#[no_mangle]
pub unsafe extern "C" fn __cxa_thread_atexit_impl(
    dtor: Destructor,
    obj: *mut c_void,
    dso: *mut c_void,
) -> c_int {
    let Some(register) = glibc_register() else {
        return -1; // no glibc to register with: the caller's failure
    };
    // SAFETY: the caller's contract, forwarded.
    crate::ACCOUNTED.unaccounted(|| unsafe { register(dtor, obj, dso) })
}
