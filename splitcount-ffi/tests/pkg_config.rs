//! The library as a C or C++ project gets it: `scripts/install-c` installs
//! the libraries this test run built into a temporary prefix, and a small
//! C program (`tests/c/pkg_config_demo.c`) and the C++ header's test
//! (`tests/c/hpp_test.cpp`, C++17) are built with nothing but
//! `pkg-config --cflags --libs splitcount` and run against the installed
//! shared library, found through its SONAME.
//!
//! Needs `pkg-config`, `cc`, `c++` and `readelf` (Debian: pkg-config, gcc,
//! g++, binutils; `.ci/run` installs them).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where cargo put this package's libraries: beside this test's binary.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().expect("target/<profile>/deps").to_path_buf()
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// The SONAME's version part: the major version, `0.<minor>` under 1.0.
fn soversion() -> String {
    let (major, minor) = (
        env!("CARGO_PKG_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MINOR"),
    );
    if major == "0" {
        format!("0.{minor}")
    } else {
        major.to_owned()
    }
}

fn ok(what: &str, out: std::io::Result<Output>) -> String {
    let out = out.unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A fresh prefix with the library installed from this run's build.
fn install() -> PathBuf {
    let prefix = std::env::temp_dir().join(format!("splitcount-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let out = ok(
        "scripts/install-c",
        Command::new(workspace().join("scripts/install-c"))
            .arg("--prefix")
            .arg(&prefix)
            .arg("--from")
            .arg(deps_dir())
            .output(),
    );
    assert!(out.contains("installed splitcount"), "{out}");
    prefix
}

fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = ok(
        "pkg-config (install pkg-config)",
        Command::new("pkg-config")
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .args(args)
            .arg("splitcount")
            .output(),
    );
    out.split_whitespace().map(str::to_owned).collect()
}

fn build_and_run(prefix: &Path, compiler: &str, std: &str, source: &str) -> String {
    let exe = prefix.join(source.replace('.', "_"));
    let mut cc = Command::new(compiler);
    cc.args([
        std,
        "-O1",
        "-Wall",
        "-Wextra",
        "-Wpedantic",
        "-Werror",
        "-o",
    ])
    .arg(&exe)
    .arg(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/c")
            .join(source),
    )
    .args(pkg_config(prefix, &["--cflags", "--libs"]))
    .arg("-lpthread");
    ok(&format!("{compiler} {source}"), cc.output());
    let needed = ok(
        "readelf -d",
        Command::new("readelf").arg("-d").arg(&exe).output(),
    );
    assert!(
        needed.contains(&format!("[libsplitcount_ffi.so.{}]", soversion())),
        "the program needs the library by its SONAME:\n{needed}"
    );
    ok(
        source,
        Command::new(&exe)
            .env("LD_LIBRARY_PATH", prefix.join("lib"))
            .output(),
    )
}

#[test]
fn a_c_and_a_cpp_program_build_with_pkg_config_against_the_installed_library() {
    let prefix = install();
    let lib = prefix.join("lib");
    let version = env!("CARGO_PKG_VERSION");

    // The layout: the real file, the SONAME link, the development link.
    let real = format!("libsplitcount_ffi.so.{version}");
    let soname = format!("libsplitcount_ffi.so.{}", soversion());
    assert!(lib.join(&real).is_file());
    assert_eq!(
        std::fs::read_link(lib.join(&soname)).unwrap(),
        Path::new(&real)
    );
    assert_eq!(
        std::fs::read_link(lib.join("libsplitcount_ffi.so")).unwrap(),
        Path::new(&soname)
    );
    assert!(lib.join("libsplitcount_ffi.a").is_file());
    assert!(prefix.join("include/splitcount.h").is_file());
    assert!(prefix.join("include/splitcount.hpp").is_file());
    let dynamic = ok(
        "readelf -d",
        Command::new("readelf")
            .arg("-d")
            .arg(lib.join(&real))
            .output(),
    );
    assert!(
        dynamic.contains(&format!("Library soname: [{soname}]")),
        "{dynamic}"
    );

    // pkg-config knows it.
    assert_eq!(pkg_config(&prefix, &["--modversion"]), [version]);
    let flags = pkg_config(&prefix, &["--cflags", "--libs"]);
    assert!(
        flags.contains(&format!("-I{}", prefix.join("include").display())),
        "{flags:?}"
    );
    assert!(flags.contains(&"-lsplitcount_ffi".to_owned()), "{flags:?}");

    let out = build_and_run(&prefix, "cc", "-std=c11", "pkg_config_demo.c");
    assert_eq!(out.trim(), format!("pkg_config_demo: {version} ok"));
    let out = build_and_run(&prefix, "c++", "-std=c++17", "hpp_test.cpp");
    let last = out.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("hpp_test:") && last.ends_with("checks passed"),
        "{out}"
    );

    let _ = std::fs::remove_dir_all(&prefix);
}

#[test]
fn the_install_script_refuses_bad_arguments_with_its_usage() {
    let script = workspace().join("scripts/install-c");
    for args in [&[][..], &["--prefix"][..], &["--frobnicate"][..]] {
        let out = Command::new(&script)
            .args(args)
            .output()
            .expect("the script runs");
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("install-c"), "{args:?}: {err}");
    }
    let missing = Command::new(&script)
        .args([
            "--prefix",
            "/nonexistent/never",
            "--from",
            "/nonexistent/empty",
        ])
        .output()
        .expect("the script runs");
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("is missing"));
}

/// A relative `--prefix` is installed where it points from the directory
/// the script runs in, and the `.pc` file names it as an absolute path:
/// written as given (`prefix=rel`), pkg-config users got `-Irel/include`,
/// relative to wherever they ran it.
#[test]
fn a_relative_prefix_is_written_absolute_into_the_pc_file() {
    let cwd = std::env::temp_dir().join(format!("splitcount-rel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cwd);
    std::fs::create_dir_all(&cwd).unwrap();
    ok(
        "scripts/install-c",
        Command::new(workspace().join("scripts/install-c"))
            .current_dir(&cwd)
            .args(["--prefix", "rel", "--from"])
            .arg(deps_dir())
            .output(),
    );
    let pc = std::fs::read_to_string(cwd.join("rel/lib/pkgconfig/splitcount.pc")).unwrap();
    let prefix = pc.lines().find_map(|l| l.strip_prefix("prefix=")).unwrap();
    assert_eq!(
        Path::new(prefix),
        cwd.join("rel").canonicalize().unwrap(),
        "{pc}"
    );
    let _ = std::fs::remove_dir_all(&cwd);
}
