//! Compiles `csrc/ffi_loops.c` (the C side of `bench ffi`) against the C
//! ABI's header, with the system's C compiler (`cc`, as the C API's own
//! tests use).

fn main() {
    println!("cargo:rerun-if-changed=csrc/ffi_loops.c");
    println!("cargo:rerun-if-changed=../splitcount-ffi/include/splitcount.h");
    cc::Build::new()
        .file("csrc/ffi_loops.c")
        .include("../splitcount-ffi/include")
        .opt_level(2)
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("splitcount_lab_ffi_loops");
}
