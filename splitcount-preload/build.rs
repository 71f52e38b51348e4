//! Gives the shared library its SONAME, `libsplitcount_preload.so`.
//!
//! A program that links the library (to read its group, as the tests' C
//! programs do) and runs with it in `LD_PRELOAD` must get one copy of it.
//! Without a SONAME the loader matches the program's `NEEDED` entry by
//! path: a preloaded `/opt/x/libsplitcount_preload.so` and a `NEEDED`
//! `libsplitcount_preload.so` found on the library path were two copies —
//! two allocators' states in one process, the second one's start-up
//! allocations charged by the first (with `SPLITCOUNT_PRELOAD_MAX=1`, glibc
//! aborted: "failed to register TLS destructor").

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libsplitcount_preload.so");
}
