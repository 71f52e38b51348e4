//! What the public API does not let a user reach: the internals named in
//! `tests/ui/*.rs` fail to compile, each with the error its comment names.
//! (The `.stderr` files are rustc's messages; `TRYBUILD=overwrite cargo
//! test -p splitcount-api-tests --test api_surface` refreshes them after a
//! compiler upgrade.)

#[test]
fn internals_are_not_reachable() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
