//! Group names and paths.

use super::GroupError;

/// Longest group name, in bytes (a file name's limit on Linux).
pub const MAX_NAME_LEN: usize = 255;

/// Check a group name: non-empty, at most [`MAX_NAME_LEN`] bytes, no `/`,
/// NUL or other control character, not `.` or `..` (so that paths stay
/// unambiguous, and one line each in the line-based reports — the kernel
/// refuses a newline in a cgroup's name for `/proc/<pid>/cgroup`'s sake).
/// Spaces are allowed.
pub fn validate_name(name: &str) -> Result<(), GroupError> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("it is longer than 255 bytes")
    } else if name.contains('/') {
        Some("it contains '/'")
    } else if name.contains('\0') {
        Some("it contains a NUL byte")
    } else if name
        .chars()
        .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
    {
        Some("it contains a control character or a line separator (a newline, a tab, U+2028, …)")
    } else if name == "." || name == ".." {
        Some("'.' and '..' are reserved")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(GroupError::InvalidName {
            name: name.chars().take(64).collect(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Longest path an error message repeats, in bytes; a longer one is cut
/// there (a 64 MiB path asked of `lookup` made a 64 MiB message).
pub(crate) const MAX_SHOWN_PATH: usize = 4096;

/// `path` for an error message: cut after [`MAX_SHOWN_PATH`] bytes.
pub(crate) fn shown_path(path: &str) -> String {
    cut_for_message(path, MAX_SHOWN_PATH)
}

/// `text` as an error message repeats it: whole if at most `max` bytes,
/// else its first `max` bytes or fewer (at a character boundary) and how
/// long it was. Shared by the library's messages and the C ABI's (whose
/// messages repeat the caller's input).
#[doc(hidden)]
pub fn cut_for_message(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

/// The path of a child named `name` under `parent` ("/" is the root).
pub fn child_path(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// The components of a path: `"a/b"`, `"/a/b"` and `"/a/b/"` are the same;
/// `""` and `"/"` are the root.
pub fn components(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_and_invalid_names() {
        for ok in ["a", "tenant-17", "q.1", &"x".repeat(255), "ünïcode"] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "a/b", "/", ".", "..", "nul\0", &"x".repeat(256)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn paths_join_and_split() {
        assert_eq!(child_path("/", "a"), "/a");
        assert_eq!(child_path("/a", "b"), "/a/b");
        assert_eq!(components("/a/b/").collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(components("").count(), 0);
    }
}
