//! The checked-in header is the one cbindgen generates from the source
//! (build.rs writes it to OUT_DIR on every build).

const GENERATED: &str = include_str!(concat!(env!("OUT_DIR"), "/splitcount.h"));

#[test]
fn the_checked_in_header_is_the_generated_one() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include/splitcount.h");
    if std::env::var_os("SPLITCOUNT_FFI_WRITE_HEADER").is_some() {
        std::fs::write(&path, GENERATED).expect("include/splitcount.h is writable");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == GENERATED,
        "{} is not the header cbindgen generates from splitcount-ffi/src: regenerate it with\n  \
         SPLITCOUNT_FFI_WRITE_HEADER=1 cargo test --release -p splitcount-ffi --test header\n\
         and commit it (it must never be edited by hand)",
        path.display()
    );
}
