//! Everything the allocator keeps per thread, in one `const` thread-local
//! without a destructor: the allocation fast path reads one structure
//! through the thread pointer, with no lifetime-state check and no lazy
//! initialization.
//!
//! ```text
//!  STATE (const, no destructor)                          read by
//!  ┌ owner   the Accounted whose root `charge` may be    fast path
//!  │ charge  the account to charge now, or null → slow   fast path
//!  │ reserve { account, bytes }                          fast path (alloc and free)
//!  │ headers header bytes allocated − freed, unflushed   fast path
//!  │ scope, root, in_hook, exiting, grace, armed         slow path; `charge` is derived from them
//!  └
//!  EXIT (with a destructor, armed by the first slow path): at thread exit,
//!  returns the reserve, flushes the headers, sets `exiting`; a pthread key
//!  armed with it does the same for a main thread that ends with
//!  `pthread_exit` (which runs no thread-local destructor).
//! ```
//!
//! `charge` is a cache: the scope's account when one is entered, else the
//! owner's root, and **null** while a hook runs (accounting off), after the
//! thread's exit guard ran, and before the first slow path found the
//! allocator's root. A null `charge` never matches the reserve's account
//! when the reserve holds bytes, so every one of those states takes the
//! slow path without a test of its own.

use super::reserve::Reserve;
use crate::group::AccountKey;
use std::cell::Cell;

/// The per-thread state (see the module docs).
pub(crate) struct ThreadState {
    /// Address of the `Accounted` whose root `root` is (0: none yet).
    pub(crate) owner: Cell<usize>,
    /// The account allocations charge now; null sends them to the slow
    /// path. Derived: see [`ThreadState::refresh`].
    pub(crate) charge: Cell<*const u8>,
    /// The entered scope's account (null: none).
    pub(crate) scope: Cell<*const u8>,
    /// The owner's root account (null: not known yet).
    pub(crate) root: Cell<*const u8>,
    /// Set while the allocator runs user code (a hook): allocations pass
    /// through unaccounted instead of recursing.
    pub(crate) in_hook: Cell<bool>,
    /// Set once the thread's exit guard ran: no more reserve.
    pub(crate) exiting: Cell<bool>,
    /// Whether the exit guard is armed (its destructor registered).
    pub(crate) armed: Cell<bool>,
    /// After a refusal, what this thread may still allocate unaccounted
    /// where it would be refused again (the reporting grace).
    pub(crate) grace: Cell<u64>,
    /// Pre-charged bytes for one account.
    pub(crate) reserve: Reserve,
    /// Header bytes allocated minus freed since the last flush.
    pub(crate) headers: Cell<i64>,
}

impl ThreadState {
    /// Recompute `charge` after a change of scope, hook, exit or owner.
    #[inline]
    pub(crate) fn refresh(&self) {
        let charge = if self.in_hook.get() || self.exiting.get() {
            std::ptr::null()
        } else if !self.scope.get().is_null() {
            self.scope.get()
        } else {
            self.root.get()
        };
        self.charge.set(charge);
    }

    /// The scope's account, if one is entered.
    pub(crate) fn scope_account(&self) -> Option<AccountKey> {
        // SAFETY: a scope's account is held by the scope that set it.
        unsafe { AccountKey::from_ptr(self.scope.get()) }
    }
}

impl ThreadState {
    /// A new thread's state.
    #[allow(clippy::declare_interior_mutable_const)]
    const INITIAL: ThreadState = ThreadState {
        owner: Cell::new(0),
        charge: Cell::new(std::ptr::null()),
        scope: Cell::new(std::ptr::null()),
        root: Cell::new(std::ptr::null()),
        in_hook: Cell::new(false),
        exiting: Cell::new(false),
        armed: Cell::new(false),
        grace: Cell::new(0),
        reserve: Reserve::EMPTY,
        headers: Cell::new(0),
    };
}

/// This thread's allocator state: [`StateKey::with`] as a `thread_local!`'s.
pub(crate) static STATE: StateKey = StateKey;

/// The handle on this thread's [`ThreadState`]: a `const`-initialized
/// `thread_local!` without a destructor — readable before `main`, during
/// thread-local destruction, and without allocating.
///
/// **In a shared library loaded at start-up** (the `LD_PRELOAD` library),
/// Rust builds thread-locals general-dynamic: every access calls
/// `__tls_get_addr`, and stable Rust has no switch for the TLS model.
/// Built with the feature `static-tls`, the state can be reached the way
/// the initial-exec model does instead — the thread pointer plus an offset
/// that is the same in every thread — once the library says its TLS block
/// is static ([`use_static_tls`]). Until then, and in every build without
/// the feature, the `thread_local!` answers; both name the same memory.
pub(crate) struct StateKey;

/// What [`StateKey::try_with`] answers when the state cannot be read (never,
/// for a state without a destructor; kept for the callers' fallbacks).
#[derive(Debug)]
pub(crate) struct NoState;

impl StateKey {
    /// Run `f` on this thread's state.
    #[inline(always)]
    pub(crate) fn with<R>(&'static self, f: impl FnOnce(&ThreadState) -> R) -> R {
        f(this_thread())
    }

    /// Run `f` on this thread's state, reached through the thread pointer
    /// with no `thread_local!` fallback: no call, so a caller's fast path
    /// that makes none saves no registers.
    ///
    /// # Safety
    /// A call of [`use_static_tls`] (in any thread) happens before this
    /// one, when the crate is built with the feature `static-tls` on Linux
    /// x86-64 with glibc (elsewhere this is [`StateKey::with`]): the
    /// offset is read relaxed and not tested (a debug assertion only), so
    /// the caller's own synchronisation must make it visible — the
    /// preload's Acquire of its fast-path switch, set after the call.
    #[inline(always)]
    pub(crate) unsafe fn with_learned<R>(&'static self, f: impl FnOnce(&ThreadState) -> R) -> R {
        // SAFETY: forwarded.
        f(unsafe { static_tls::this_thread_learned() })
    }

    /// Run `f` on this thread's state; `Err` if it cannot be read.
    #[inline(always)]
    pub(crate) fn try_with<R>(
        &'static self,
        f: impl FnOnce(&ThreadState) -> R,
    ) -> Result<R, NoState> {
        Ok(f(this_thread()))
    }
}

thread_local! {
    static THREAD_STATE: ThreadState = const { ThreadState::INITIAL };
}

/// This thread's state, from the `thread_local!`.
#[inline(always)]
fn from_thread_local() -> &'static ThreadState {
    // SAFETY: a `const` thread-local without a destructor is valid for as
    // long as its thread runs, and the reference never leaves the thread
    // (`ThreadState` is not `Sync`; callers use it inside `with`).
    THREAD_STATE.with(|t| unsafe { &*(t as *const ThreadState) })
}

/// Without the feature (or off Linux x86-64 with glibc): the
/// `thread_local!` always.
#[cfg(not(all(
    feature = "static-tls",
    target_os = "linux",
    target_arch = "x86_64",
    target_env = "gnu",
    not(loom),
    not(miri)
)))]
mod static_tls {
    use super::{from_thread_local, ThreadState};

    /// No check: the `thread_local!` always.
    pub(super) const CHECK: bool = false;

    #[inline(always)]
    pub(super) fn this_thread() -> &'static ThreadState {
        from_thread_local()
    }

    #[inline(always)]
    pub(super) unsafe fn this_thread_learned() -> &'static ThreadState {
        from_thread_local()
    }

    /// Nothing to learn.
    pub(super) unsafe fn learn() {}
}

#[cfg(all(
    feature = "static-tls",
    target_os = "linux",
    target_arch = "x86_64",
    target_env = "gnu",
    not(loom),
    not(miri)
))]
mod static_tls {
    use super::{from_thread_local, ThreadState};
    use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

    /// Every access checks whether the offset was learned.
    pub(super) const CHECK: bool = true;

    /// The state's offset from the thread pointer, the same in every
    /// thread; 0: not known (the `thread_local!` answers).
    static TP_OFFSET: AtomicIsize = AtomicIsize::new(0);

    /// The thread pointer (`fs:0` holds it on x86-64 Linux).
    #[inline(always)]
    fn thread_pointer() -> isize {
        let tp: isize;
        // SAFETY: reads this thread's TCB self-pointer; writes only `tp`.
        unsafe {
            std::arch::asm!(
                "mov {tp}, qword ptr fs:[0]",
                tp = out(reg) tp,
                options(pure, readonly, nostack, preserves_flags),
            );
        }
        tp
    }

    #[inline(always)]
    pub(super) fn this_thread() -> &'static ThreadState {
        // Relaxed: set once, to the address the `thread_local!` gives as
        // well; a thread that reads 0 asks the `thread_local!` instead.
        let offset = TP_OFFSET.load(Relaxed);
        if offset != 0 {
            // SAFETY: the offset was learned.
            return unsafe { at(offset) };
        }
        from_thread_local()
    }

    /// The state at `offset` from this thread's pointer.
    ///
    /// # Safety
    /// `offset` is the one [`learn`] stored.
    #[inline(always)]
    unsafe fn at(offset: isize) -> &'static ThreadState {
        // SAFETY: `use_static_tls`'s contract: the state is at this offset
        // from every thread's pointer, in memory that lives as long as the
        // thread (a `const` thread-local without a destructor); the
        // reference never leaves the thread.
        unsafe { &*(thread_pointer().wrapping_add(offset) as *const ThreadState) }
    }

    /// [`this_thread`] once the offset is known, without the test.
    ///
    /// # Safety
    /// A [`learn`] (in any thread) happens before this call.
    #[inline(always)]
    pub(super) unsafe fn this_thread_learned() -> &'static ThreadState {
        // Relaxed: as in `this_thread`; the caller's contract says the
        // offset was learned before (and it never changes after).
        let offset = TP_OFFSET.load(Relaxed);
        debug_assert_ne!(offset, 0, "use_static_tls was not called");
        // SAFETY: the caller's contract.
        unsafe { at(offset) }
    }

    /// See [`super::use_static_tls`].
    pub(super) unsafe fn learn() {
        let at = from_thread_local() as *const ThreadState as isize;
        TP_OFFSET.store(at.wrapping_sub(thread_pointer()), Relaxed);
    }
}

use static_tls::this_thread;

/// Whether this build reaches the allocator's per-thread state through a
/// check of the thread pointer (feature `static-tls` on Linux x86-64 with
/// glibc): a load and a branch on every access, where the `thread_local!`
/// of an executable is one `fs:`-relative load. For the lab, which warns
/// when a workspace build gave it the preload's feature.
#[doc(hidden)]
pub const STATIC_TLS_CHECK: bool = static_tls::CHECK;

/// Reach the allocator's per-thread state through the thread pointer from
/// now on (feature `static-tls`; without it, or off Linux x86-64 with
/// glibc, nothing happens): the offset is learned on the calling thread.
///
/// # Safety
/// The thread-local storage of the module this crate is linked into (the
/// executable, or the shared library) is in the static TLS block — the
/// module was loaded at start-up, or is marked `DF_STATIC_TLS` (an
/// initial-exec access of its own): then every thread, present and future,
/// has it at the same offset from its thread pointer.
#[doc(hidden)]
pub unsafe fn use_static_tls() {
    // SAFETY: forwarded.
    unsafe { static_tls::learn() };
}

thread_local! {
    /// Armed by the first slow path: at thread exit, returns the reserve.
    static EXIT: ExitGuard = const { ExitGuard };
}

/// Returns the thread's reserve at its exit (see the module docs).
struct ExitGuard;

impl Drop for ExitGuard {
    fn drop(&mut self) {
        leave_thread();
    }
}

/// What a thread's exit does for the allocator: no more reserve (the
/// thread charges without one from here on), the reserve and the header
/// count returned. Idempotent: it may run twice, from the guard and from
/// the pthread key.
fn leave_thread() {
    let _ = STATE.try_with(|t| {
        t.exiting.set(true);
        t.refresh();
    });
    super::reserve::drain_thread();
}

/// The second way out: a pthread key whose destructor runs
/// [`leave_thread`].
///
/// A main thread that ends with `pthread_exit` (a C idiom: the process
/// lives on while other threads run, and ends with the last) runs no
/// thread-local destructor — glibc runs those for the main thread only in
/// `exit` — but it does run the destructors of pthread keys. Without the
/// key its reserve stayed charged to the end: 16 KiB more in a C
/// program's exit report under the preload. Only the main thread sets
/// the key. (A thread that `fork`ed becomes its child's main thread with
/// its own thread-local destructors still to run: if the key is set there
/// too, the guard runs first — glibc calls the thread-local destructors
/// before the keys' — and the key's finds nothing left.)
#[cfg(target_os = "linux")]
mod exit_key {
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

    /// The key, plus one (0: none: not made yet, or `pthread_key_create`
    /// failed — every key of the process taken).
    static KEY: AtomicU32 = AtomicU32::new(0);

    extern "C" fn on_exit(_: *mut libc::c_void) {
        // No unwind can leave an `extern "C"` function: `leave_thread`
        // panics on no path (it only reads and writes cells and uncharges),
        // and a panic would abort.
        super::leave_thread();
    }

    /// On the main thread, set the key's value, so that its destructor
    /// runs if the thread ends with `pthread_exit`. Other threads need no
    /// key (their thread-local destructors run), and setting one could
    /// cost each of them a block: a key numbered 32 or more takes a block
    /// of glibc's `calloc` (528 bytes) on a thread's first use. May
    /// allocate that block on the main thread: the caller runs it as a
    /// hook, unaccounted.
    pub(super) fn arm() {
        // SAFETY: system calls without arguments that cannot fail. (The
        // raw `gettid`: glibc's wrapper came in 2.30, Rust's std runs on
        // 2.17.)
        if unsafe { libc::syscall(libc::SYS_gettid) != libc::getpid() as libc::c_long } {
            return;
        }
        // Made by the first main thread to get here — one thread of a
        // process does (a `fork` child's main thread finds its parent's) —
        // without a `Once`, whose slow path is code of std's far from the
        // allocator's, which this library's code-page release keeps
        // unmapped (`splitcount-preload`'s `code_pages.rs`).
        if KEY.load(Relaxed) == 0 {
            let mut key: libc::pthread_key_t = 0;
            // SAFETY: a valid out-pointer and a destructor that never
            // unwinds. The key is never deleted: its destructor must run
            // whenever the main thread ends.
            if unsafe { libc::pthread_key_create(&mut key, Some(on_exit)) } == 0 {
                // Relaxed: only this thread reads it.
                KEY.store(key + 1, Relaxed);
            }
        }
        if let Some(key) = KEY.load(Relaxed).checked_sub(1) {
            // Any non-null value: only a non-null value's destructor runs.
            // SAFETY: a key this process made; the value is never read.
            // A failure (ENOMEM) leaves the thread-local guard alone.
            unsafe { libc::pthread_setspecific(key, 1 as *const libc::c_void) };
        }
    }
}

/// Register the exit guard's destructor, once per thread. Registering may
/// allocate (glibc's `__cxa_thread_atexit_impl` calls `calloc`): `armed`
/// is set first, so the allocation takes the paths of an armed thread, and
/// the registration runs as a hook does, unaccounted. In a Rust program
/// glibc's `calloc` is not the global allocator; under the C heap's
/// preload it is, and a limit that refused that block made glibc abort
/// ("failed to register TLS destructor: out of memory").
#[cold]
pub(crate) fn arm_exit_guard(t: &ThreadState) {
    if t.armed.replace(true) {
        return;
    }
    let was = t.in_hook.replace(true);
    t.refresh();
    let _ = EXIT.try_with(|_| ());
    #[cfg(target_os = "linux")]
    exit_key::arm();
    t.in_hook.set(was);
    t.refresh();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `t` is as a new thread's state is.
    fn is_initial(t: &ThreadState) -> bool {
        t.owner.get() == 0
            && t.charge.get().is_null()
            && t.scope.get().is_null()
            && t.root.get().is_null()
            && !t.in_hook.get()
            && !t.exiting.get()
            && !t.armed.get()
            && t.grace.get() == 0
            && t.reserve.account.get().is_null()
            && t.reserve.bytes.get() == 0
            && t.headers.get() == 0
    }

    /// An executable's TLS is static: once told, every thread — this one,
    /// and one started after — finds its own state through the thread
    /// pointer, at the address the `thread_local!` gives. (Telling it here
    /// moves every test of this binary onto that path, which is valid for
    /// an executable. Elsewhere than Linux x86-64 with glibc the call does
    /// nothing, and the same holds.)
    #[cfg(feature = "static-tls")]
    #[test]
    fn through_the_thread_pointer_each_thread_finds_its_own_state() {
        // SAFETY: a test executable's TLS is in the static block.
        unsafe { use_static_tls() };
        let same = || std::ptr::eq(this_thread(), from_thread_local());
        assert!(same());
        let (other, its_own) = std::thread::spawn(move || {
            STATE.with(|t| t.grace.set(5));
            (same(), this_thread() as *const ThreadState as usize)
        })
        .join()
        .unwrap();
        assert!(
            other,
            "a thread started after the call finds the same memory"
        );
        assert_ne!(its_own, this_thread() as *const ThreadState as usize);
        assert_eq!(
            STATE.with(|t| t.grace.get()),
            0,
            "the other thread's write is its own"
        );
    }

    #[test]
    fn each_thread_has_its_own_state_from_its_start() {
        STATE.with(|t| t.grace.set(7));
        let other = std::thread::spawn(|| STATE.with(is_initial))
            .join()
            .unwrap();
        assert!(other, "a new thread starts from the initial state");
        assert_eq!(
            STATE.with(|t| t.grace.replace(0)),
            7,
            "this thread's is its own"
        );
    }
}
