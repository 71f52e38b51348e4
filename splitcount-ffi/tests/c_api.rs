//! The C and C++ tests of the C API: `tests/c/api_test.c` (linked with the
//! static library) and `tests/c/api_test.cpp` (linked with the shared
//! one), compiled with the system's `cc` and `c++`, run, and their exit
//! code and last line checked.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where cargo put this package's libraries: beside this test's binary.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

fn compile(compiler: &str, source: &str, out: &Path, link: &[String]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(compiler)
        .args(["-O1", "-g", "-Wall", "-Wextra", "-Werror"])
        // The header's inline code must build where C++ projects forbid C
        // casts (its fast add had two, found by a user's -Werror build).
        .args(if compiler == "c++" {
            &["-Wold-style-cast"][..]
        } else {
            &[]
        })
        .arg("-o")
        .arg(out)
        .arg(dir.join("tests/c").join(source))
        .arg(format!("-I{}", dir.join("include").display()))
        .args(link)
        .args(["-lpthread", "-ldl", "-lm"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run {compiler} (install gcc and g++): {e}"));
    assert!(status.success(), "{compiler} {source} failed: {status}");
}

fn run(exe: &Path, expect: &str) {
    let out = Command::new(exe).output().expect("the test program runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} failed ({}):\n{stdout}\n{}",
        exe.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(expect) && last.ends_with("checks passed"),
        "{last}"
    );
}

#[test]
fn the_c_test_passes_against_the_static_library() {
    let deps = deps_dir();
    let exe = deps.join("splitcount_ffi_api_test_c");
    let lib = deps.join("libsplitcount_ffi.a");
    compile("cc", "api_test.c", &exe, &[lib.display().to_string()]);
    run(&exe, "api_test:");
}

#[test]
fn the_cpp_test_passes_against_the_shared_library() {
    let deps = deps_dir();
    // The program needs the library by its SONAME
    // (`libsplitcount_ffi.so.<soversion>`, a link the install makes).
    let soname = format!(
        "libsplitcount_ffi.so.{}",
        match env!("CARGO_PKG_VERSION_MAJOR") {
            "0" => format!("0.{}", env!("CARGO_PKG_VERSION_MINOR")),
            major => major.to_owned(),
        }
    );
    if std::fs::read_link(deps.join(&soname)).is_err() {
        let _ = std::fs::remove_file(deps.join(&soname));
        std::os::unix::fs::symlink("libsplitcount_ffi.so", deps.join(&soname))
            .expect("the SONAME link beside the library");
    }
    let exe = deps.join("splitcount_ffi_api_test_cpp");
    let link = [
        format!("-L{}", deps.display()),
        "-lsplitcount_ffi".to_owned(),
        format!("-Wl,-rpath,{}", deps.display()),
    ];
    compile("c++", "api_test.cpp", &exe, &link);
    run(&exe, "api_test_cpp:");
}

/// The counters' fast path (`tests/c/fast_add_test.c`): the inline add
/// under threads moved between CPUs and signalled, beside the checked
/// add; exact after the joins. Built as is and with every add a call.
#[test]
fn the_fast_add_is_exact_under_migrations_and_signals() {
    use splitcount::counter::{Config, Design, Tree};
    let deps = deps_dir();
    let lib = deps.join("libsplitcount_ffi.a").display().to_string();
    // Inline where a tree on this host offers the layout (rseq on glibc's
    // areas by CPU id), so that the inline build is not a call in disguise.
    let host = Tree::with_config(&Config::new(Design::Tree)).expect("a tree on the host");
    let inline = if host.inline_add().is_some() {
        "inline"
    } else {
        "call"
    };
    for (name, define, expect) in [
        ("inline", None, inline),
        ("call", Some("-DSPLITCOUNT_NO_INLINE_RSEQ"), "call"),
    ] {
        let exe = deps.join(format!("splitcount_ffi_fast_add_test_{name}"));
        let mut link = vec![lib.clone()];
        link.extend(define.map(str::to_owned));
        compile("cc", "fast_add_test.c", &exe, &link);
        run(&exe, &format!("fast_add_test: {expect},"));
    }
}

/// A program can load the shared library after start-up (`dlopen`, as
/// Python's `ctypes` or a JVM do). It has no initial-exec thread-locals
/// (`DF_STATIC_TLS`), which glibc could only place in its small static TLS
/// surplus — this library's 2 KB of thread-locals would not fit. Built in
/// the workspace, where the lab turns on `splitcount`'s `jemalloc` feature
/// for every member, no copy of jemalloc (whose thread state is
/// initial-exec) may be linked in either — nor of mimalloc (feature
/// `mimalloc`, also on in the workspace), whose constructor would run in
/// every process that loads the library. (The copy check means something
/// in a workspace build — `cargo test --workspace`, as CI runs it; built
/// alone the crate has neither feature, and nothing to find.)
#[test]
fn the_shared_library_loads_with_dlopen_after_start_up() {
    let lib = deps_dir().join("libsplitcount_ffi.so");
    let bytes = std::fs::read(&lib).unwrap();
    for (allocator, marker) in [
        ("jemalloc", &b"<jemalloc>"[..]),
        ("mimalloc", b"mimalloc: "),
    ] {
        assert!(
            !bytes.windows(marker.len()).any(|w| w == marker),
            "{} links a copy of {allocator}",
            lib.display()
        );
    }
    let path = std::ffi::CString::new(lib.display().to_string()).unwrap();
    // SAFETY: a NUL-terminated path; the handle is closed below.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror's message, valid until the next dl call.
        let why = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        panic!("dlopen {}: {}", lib.display(), why.to_string_lossy());
    }
    // SAFETY: a live handle and a NUL-terminated name.
    let create = unsafe { libc::dlsym(handle, c"splitcount_counter_create".as_ptr()) };
    assert!(!create.is_null(), "the C API is exported");
    // SAFETY: the handle from above, closed once.
    unsafe { libc::dlclose(handle) };
}
