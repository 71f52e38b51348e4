//! # splitcount-ffi
//!
//! The C ABI of [`splitcount`]: hierarchies of groups with limits, charges
//! through the per-CPU stock, usage, peak and events, the split counters,
//! stat items, and a thread's current group — for the C and C++ engines
//! (databases, query engines, proxies) that need the accounting.
//!
//! The header, `include/splitcount.h`, is generated from this crate by
//! cbindgen at build time (`build.rs`); `tests/header.rs` fails when the
//! checked-in copy differs. The libraries are `libsplitcount_ffi.so` and
//! `libsplitcount_ffi.a` in `target/release/`:
//!
//! ```sh
//! cargo build --release -p splitcount-ffi
//! cc -O2 app.c -Isplitcount-ffi/include -Ltarget/release -lsplitcount_ffi \
//!    -Wl,-rpath,$PWD/target/release
//! ```
//!
//! **Conventions.** Every function returns `SPLITCOUNT_OK` (0) or a
//! negative `SPLITCOUNT_E_*` code and leaves a message with the numbers
//! for [`splitcount_last_error`] (per thread). Every body runs under
//! `catch_unwind`: no panic crosses into C. Handles are numbers (a slot and
//! a generation, see `handle.rs`) disguised as opaque pointers and never
//! dereferenced, so NULL, a destroyed handle, a released one or a made-up
//! one is `SPLITCOUNT_E_HANDLE`, never a crash; a destroy must not race
//! with other calls on the same handle. In the child of a multi-threaded
//! `fork` (before `exec`), charges, reads and counters work, but a call
//! that changes a tree or the handle tables may wait for ever on a lock
//! another thread held at the `fork` (no `pthread_atfork` handlers guard
//! those locks).
//!
//! **Heap accounting of C programs** is the preload library's
//! (`splitcount-preload`): it compiles this crate in and exports the same
//! functions, so a preloaded program calls `splitcount_enter` to charge
//! its thread's `malloc` to a group ([`splitcount_preload_hierarchy`]).

#![deny(unsafe_op_in_unsafe_fn)]

mod callbacks;
mod counter;
mod error;
mod fast;
mod group;
mod handle;
mod hierarchy;
mod preload;
mod scope;
mod version;

pub use callbacks::*;
pub use counter::*;
pub use error::*;
pub use fast::*;
pub use group::*;
pub use hierarchy::*;
pub use preload::*;
pub use scope::*;
pub use version::*;

/// A hierarchy of groups (opaque: a checked handle, never dereferenced).
#[allow(non_camel_case_types)]
pub struct splitcount_hierarchy {
    _opaque: [u8; 0],
}

/// A group of a hierarchy (opaque: a checked handle, never dereferenced).
#[allow(non_camel_case_types)]
pub struct splitcount_group {
    _opaque: [u8; 0],
}

/// A split counter (opaque: a checked handle, never dereferenced).
#[allow(non_camel_case_types)]
pub struct splitcount_counter {
    _opaque: [u8; 0],
}
