//! This library's thread-local storage is static, and the allocator's
//! per-thread state is reached through the thread pointer.
//!
//! Rust builds a shared library's thread-locals *general-dynamic*: every
//! access of the allocator's per-thread state (one per `malloc` and per
//! `free`) called `__tls_get_addr` — about 11 instructions and a call,
//! a tenth of what the preload added to a `malloc`/`free` pair. A library
//! loaded at start-up (`LD_PRELOAD`) has its thread-local block in the
//! static TLS block, at the same offset from every thread's pointer, as
//! the initial-exec model assumes; stable Rust has no switch for the
//! model, so this module makes it so by hand:
//!
//! - an anchor: one byte of thread-local storage (`.tbss`) read once with
//!   an initial-exec access, whose relocation marks the library
//!   `DF_STATIC_TLS` — glibc then gives its block static storage in every
//!   thread, even if the library is loaded with `dlopen` (from glibc's
//!   surplus; if that is too small, `dlopen` fails with "cannot allocate
//!   memory in static TLS block" rather than the library running without);
//! - [`splitcount::alloc::use_static_tls`], told so at load: from then on
//!   the allocator's state is the thread pointer plus an offset.
//!
//! The C ABI library (`libsplitcount_ffi.so`), which programs may load
//! with `dlopen` (Python's `ctypes`, a JVM), is not marked: it never makes
//! the call, and has no initial-exec access.

std::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".globl splitcount_preload_tls_anchor",
    ".hidden splitcount_preload_tls_anchor",
    ".type splitcount_preload_tls_anchor,@object",
    ".size splitcount_preload_tls_anchor, 1",
    "splitcount_preload_tls_anchor:",
    ".zero 1",
    ".popsection",
);

/// Read the anchor with an initial-exec access (kept: the relocation it
/// needs is what marks the library), then let the allocator use the
/// thread pointer.
pub(crate) fn claim() {
    let anchor: *const u8;
    // SAFETY: reads the thread pointer and a GOT entry (the anchor's
    // offset, written by the dynamic linker), writes only `anchor`.
    unsafe {
        std::arch::asm!(
            "movq %fs:0, {a}",
            "addq splitcount_preload_tls_anchor@GOTTPOFF(%rip), {a}",
            a = out(reg) anchor,
            options(att_syntax, nostack),
        );
    }
    // SAFETY: this thread's copy of the anchor, one byte in its TLS block.
    let _ = unsafe { anchor.read_volatile() };
    // SAFETY: the library is marked `DF_STATIC_TLS` (the access above), so
    // its whole TLS block — the allocator's state in it — is static in
    // every thread.
    unsafe { splitcount::alloc::use_static_tls() };
}
