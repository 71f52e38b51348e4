//! Generates the C header from the crate's source with cbindgen, into
//! `OUT_DIR/splitcount.h`. The checked-in `include/splitcount.h` must equal
//! it: `tests/header.rs` compares them (and rewrites the checked-in copy
//! when `SPLITCOUNT_FFI_WRITE_HEADER=1`).
//!
//! Also packages the shared library for C: its SONAME,
//! `libsplitcount_ffi.so.<soversion>` (the major version; `0.<minor>`
//! while the major is 0, as semver lets a 0.x minor break the API), and,
//! beside the libraries in `target/<profile>/`, the link named by the
//! SONAME and a `splitcount.pc` for `pkg-config` that points at the build
//! tree (`scripts/install-c` writes the installed one).

use std::path::{Path, PathBuf};

/// The SONAME's version part.
fn soversion() -> String {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("set by cargo");
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").expect("set by cargo");
    if major == "0" {
        format!("0.{minor}")
    } else {
        major
    }
}

/// `target/<profile>` (where cargo puts the libraries): three levels above
/// `OUT_DIR` (`target/<profile>/build/<package>-<hash>/out`), if the
/// layout is that one.
fn profile_dir(out: &Path) -> Option<PathBuf> {
    let dir = out.parent()?.parent()?.parent()?;
    (out.parent()?.parent()?.file_name()? == "build").then(|| dir.to_path_buf())
}

/// The SONAME link and the build tree's `splitcount.pc`, beside the
/// libraries. Best effort: a read-only or unusual target directory only
/// loses the convenience (the install script does not need them).
fn package_in_build_tree(crate_dir: &str, out: &Path) {
    let Some(dir) = profile_dir(out) else {
        return;
    };
    let soname = format!("libsplitcount_ffi.so.{}", soversion());
    let link = dir.join(&soname);
    if std::fs::read_link(&link).is_err() {
        let _ = std::fs::remove_file(&link);
        let _ = std::os::unix::fs::symlink("libsplitcount_ffi.so", &link);
    }
    let pc = format!(
        "# splitcount.pc of the build tree (scripts/install-c writes the installed one)\n\
         libdir={}\n\
         includedir={}/include\n\n\
         Name: splitcount\n\
         Description: splitcount's C ABI: split counters and hierarchical groups with limits\n\
         Version: {}\n\
         Libs: -L${{libdir}} -lsplitcount_ffi\n\
         Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc\n\
         Cflags: -I${{includedir}}\n",
        dir.display(),
        crate_dir,
        std::env::var("CARGO_PKG_VERSION").expect("set by cargo"),
    );
    let _ = std::fs::write(dir.join("splitcount.pc"), pc);
}

fn main() {
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(format!("{crate_dir}/cbindgen.toml"))
        .expect("cbindgen.toml parses");
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("the C header generates")
        .write_to_file(out.join("splitcount.h"));
    // `rustc-link-arg`, not `rustc-cdylib-link-arg`: cargo passes a
    // dependency's cdylib link arguments on to the cdylibs that depend on
    // it (rust-lang/cargo#9562), and the preload's library would take this
    // SONAME. This one applies to this package's own linked targets only
    // (its cdylib, and its test binaries, where a SONAME is harmless).
    println!(
        "cargo:rustc-link-arg=-Wl,-soname,libsplitcount_ffi.so.{}",
        soversion()
    );
    package_in_build_tree(&crate_dir, &out);
}
