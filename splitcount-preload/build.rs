//! Gives the shared library its SONAME, `libsplitcount_preload.so`, and
//! aligns its segments to 64 KiB.
//!
//! A program that links the library (to read its group, as the tests' C
//! programs do) and runs with it in `LD_PRELOAD` must get one copy of it.
//! Without a SONAME the loader matches the program's `NEEDED` entry by
//! path: a preloaded `/opt/x/libsplitcount_preload.so` and a `NEEDED`
//! `libsplitcount_preload.so` found on the library path were two copies —
//! two allocators' states in one process, the second one's start-up
//! allocations charged by the first (with `SPLITCOUNT_PRELOAD_MAX=1`, glibc
//! aborted: "failed to register TLS destructor").
//!
//! The 64 KiB alignment (`-z max-page-size=65536`: each `PT_LOAD` segment's
//! `p_align`, which the loader honours) fixes where the kernel's
//! fault-around windows — 64 KiB, aligned in the address space — cut the
//! library's code. With 4 KiB alignment the library's load address moved
//! those cuts from one process to the next (address-space randomisation),
//! and how much of the code a program kept resident after the set-up let
//! its pages go (`src/code_pages.rs`) came in modes: 352 to 516 of 704 KiB
//! in five runs of one build. Aligned, one build always reads the same.
//! Only address space is spent (the gaps between segments); the file and
//! the resident set are unchanged.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsplitcount_preload.so");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,max-page-size=65536");
}
