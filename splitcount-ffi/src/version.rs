//! The library's version, for C: `splitcount_version()` at run time and
//! the `SPLITCOUNT_VERSION_*` macros at compile time, so that a program can
//! tell the header it was built with from the library it runs with.
//!
//! cbindgen writes a `#define` for each constant from its literal, so the
//! numbers are written out here; the build fails when they differ from
//! the crate's version (`CARGO_PKG_VERSION_*`), and a version bump edits
//! them.

use std::ffi::c_char;

/// The major version of the library this header belongs to (semver: an
/// incompatible change of the API bumps it).
pub const SPLITCOUNT_VERSION_MAJOR: u32 = 0;
/// The minor version of the library this header belongs to.
pub const SPLITCOUNT_VERSION_MINOR: u32 = 1;
/// The patch version of the library this header belongs to.
pub const SPLITCOUNT_VERSION_PATCH: u32 = 0;

/// A decimal number in `const` context (a `CARGO_PKG_VERSION_*` value).
const fn number(digits: &str) -> u32 {
    let bytes = digits.as_bytes();
    assert!(!bytes.is_empty(), "a version number has digits");
    let mut value = 0;
    let mut i = 0;
    while i < bytes.len() {
        assert!(bytes[i].is_ascii_digit(), "a version number is decimal");
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}

const _: () = assert!(
    SPLITCOUNT_VERSION_MAJOR == number(env!("CARGO_PKG_VERSION_MAJOR"))
        && SPLITCOUNT_VERSION_MINOR == number(env!("CARGO_PKG_VERSION_MINOR"))
        && SPLITCOUNT_VERSION_PATCH == number(env!("CARGO_PKG_VERSION_PATCH")),
    "SPLITCOUNT_VERSION_* in splitcount-ffi/src/version.rs differ from the crate's version: \
     update them and regenerate the header"
);

/// The version of the library, "MAJOR.MINOR.PATCH" (with a pre-release
/// suffix such as "-rc.1" if it has one): a static string. A program built
/// with one header and run with another library can compare it with the
/// `SPLITCOUNT_VERSION_*` macros it was compiled with.
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_macros_and_string_are_the_crate_version() {
        // SAFETY: a static NUL-terminated string.
        let version = unsafe { std::ffi::CStr::from_ptr(splitcount_version()) };
        assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
        let numbers = format!(
            "{SPLITCOUNT_VERSION_MAJOR}.{SPLITCOUNT_VERSION_MINOR}.{SPLITCOUNT_VERSION_PATCH}"
        );
        let release = env!("CARGO_PKG_VERSION").split(['-', '+']).next().unwrap();
        assert_eq!(numbers, release);
    }

    #[test]
    fn a_version_number_is_read_in_decimal() {
        assert_eq!(number("0"), 0);
        assert_eq!(number("17"), 17);
        assert_eq!(number("4096"), 4096);
    }
}
