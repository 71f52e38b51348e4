//! Generates the C header from the crate's source with cbindgen, into
//! `OUT_DIR/splitcount.h`. The checked-in `include/splitcount.h` must equal
//! it: `tests/header.rs` compares them (and rewrites the checked-in copy
//! when `SPLITCOUNT_FFI_WRITE_HEADER=1`).

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
}
