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
//!  returns the reserve, flushes the headers, sets `exiting`.
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

thread_local! {
    /// This thread's allocator state. `const`-initialized and without a
    /// destructor: readable before `main`, during thread-local destruction,
    /// and without allocating.
    pub(crate) static STATE: ThreadState = const {
        ThreadState {
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
        }
    };

    /// Armed by the first slow path: at thread exit, returns the reserve.
    static EXIT: ExitGuard = const { ExitGuard };
}

/// Returns the thread's reserve at its exit (see the module docs).
struct ExitGuard;

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let _ = STATE.try_with(|t| {
            t.exiting.set(true);
            t.refresh();
        });
        super::reserve::drain_thread();
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
    t.in_hook.set(was);
    t.refresh();
}
