//! Compile-fail tests of `splitcount`'s public surface (`tests/api_surface.rs`
//! and `tests/ui/`): internals a user must not reach fail to compile, each
//! with the error its comment names. No code of its own.
