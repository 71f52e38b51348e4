//! Status codes, the thread's last error, and the wrapper every exported
//! function runs its body in: a panic is caught there and becomes
//! [`SPLITCOUNT_E_PANIC`], never an unwind into C.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Success.
pub const SPLITCOUNT_OK: c_int = 0;
/// A required pointer argument (an out-parameter, a name) is NULL.
pub const SPLITCOUNT_E_NULL: c_int = -1;
/// A handle that is not live: NULL, destroyed, released, removed through
/// `splitcount_group_remove`, of another kind, or never handed out.
pub const SPLITCOUNT_E_HANDLE: c_int = -2;
/// An argument out of its range: a bad group or stat name, bad UTF-8, an
/// unknown design, a batch the design refuses.
pub const SPLITCOUNT_E_INVALID: c_int = -3;
/// A charge refused by a hard limit; the message names the group, its
/// limit, its usage and the request.
pub const SPLITCOUNT_E_LIMIT: c_int = -4;
/// The state does not allow it: a limit below the usage, removing a group
/// with children or the root, or a new handle past the most that may be
/// live at once (2^24 − 1 of each kind; release some).
pub const SPLITCOUNT_E_BUSY: c_int = -5;
/// No group at that path, no stat item of that name.
pub const SPLITCOUNT_E_NOT_FOUND: c_int = -6;
/// A live sibling has that name already.
pub const SPLITCOUNT_E_EXISTS: c_int = -7;
/// The group was removed: what would add to it (a charge, a child, a
/// limit, entering it) is refused; uncharges and reads still work.
pub const SPLITCOUNT_E_REMOVED: c_int = -8;
/// Not in this state: `splitcount_leave` without `splitcount_enter`, the
/// preload's hierarchy asked for without the preload library.
pub const SPLITCOUNT_E_STATE: c_int = -9;
/// An internal error (a caught panic); the message says what.
pub const SPLITCOUNT_E_PANIC: c_int = -10;
/// A caller's buffer is too small; the size needed was stored.
pub const SPLITCOUNT_E_BUFFER: c_int = -11;
/// `splitcount_group_check`: an allocation went over a cooperative limit;
/// the message has the numbers.
pub const SPLITCOUNT_E_OVER_LIMIT: c_int = -12;

/// An error on its way to C: its code and the message for
/// `splitcount_last_error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Error {
    pub(crate) code: c_int,
    pub(crate) message: String,
}

/// Longest message kept for `splitcount_last_error`, in bytes: a longer
/// one is cut there, with its length said. Messages repeat what the caller
/// passed (a path, a name), and a 64 MiB path made a 64 MiB message.
pub(crate) const MAX_MESSAGE: usize = 8192;

impl Error {
    pub(crate) fn new(code: c_int, message: impl Into<String>) -> Error {
        let mut message = message.into();
        if message.len() > MAX_MESSAGE {
            message = splitcount::group::cut_for_message(&message, MAX_MESSAGE);
        }
        Error { code, message }
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

impl From<splitcount::group::GroupError> for Error {
    fn from(e: splitcount::group::GroupError) -> Error {
        use splitcount::group::GroupError as G;
        let code = match &e {
            G::InvalidName { .. } | G::Config(_) | G::Stock(_) | G::Stat(_) => SPLITCOUNT_E_INVALID,
            G::NameTaken { .. } => SPLITCOUNT_E_EXISTS,
            G::NotFound { .. } => SPLITCOUNT_E_NOT_FOUND,
            G::Busy { .. } | G::HasChildren { .. } | G::RootCannotBeRemoved => SPLITCOUNT_E_BUSY,
            G::Removed { .. } => SPLITCOUNT_E_REMOVED,
            // A thread that cannot start, and kinds a later version adds.
            _ => SPLITCOUNT_E_INVALID,
        };
        Error::new(code, e.to_string())
    }
}

thread_local! {
    /// The last error's message on this thread, NUL-terminated.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

fn set_last_error(function: &str, message: &str) {
    let text = format!("{function}: {message}").replace('\0', " ");
    let text = CString::new(text).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|l| *l.borrow_mut() = Some(text));
}

/// Run the body of the exported function `function`: its `Ok` is
/// [`SPLITCOUNT_OK`], its `Err` a code with the message kept for
/// `splitcount_last_error`, a panic [`SPLITCOUNT_E_PANIC`].
#[inline]
pub(crate) fn run(function: &str, body: impl FnOnce() -> Result<()>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SPLITCOUNT_OK,
        Ok(Err(e)) => {
            set_last_error(function, &e.message);
            e.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            set_last_error(function, &format!("internal error (caught): {what}"));
            SPLITCOUNT_E_PANIC
        }
    }
}

/// The hot-path form of [`run`] for a body that cannot fail but must not
/// unwind into C: `SPLITCOUNT_OK`, or `SPLITCOUNT_E_PANIC` (with the
/// message) if it panicked.
#[inline(always)]
pub(crate) fn run_infallible(function: &str, body: impl FnOnce()) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(()) => SPLITCOUNT_OK,
        Err(_) => run(function, || panic!("{function} panicked")),
    }
}

/// Store `value` through the out-pointer `out`.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
#[inline]
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::new(SPLITCOUNT_E_NULL, "the out-pointer is NULL"));
    }
    // SAFETY: non-null, and valid for a write by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Borrow the NUL-terminated UTF-8 string `s` (named `what` in errors).
///
/// # Safety
/// `s` is null or points to a NUL-terminated string that outlives the
/// borrow.
pub(crate) unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str> {
    if s.is_null() {
        return Err(Error::new(SPLITCOUNT_E_NULL, format!("{what} is NULL")));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let bytes = unsafe { std::ffi::CStr::from_ptr(s) };
    bytes
        .to_str()
        .map_err(|e| Error::new(SPLITCOUNT_E_INVALID, format!("{what} is not UTF-8: {e}")))
}

/// The message of the last error on the calling thread: the function that
/// failed and why, with the numbers ("splitcount_group_try_charge: charge
/// of 100 units to /a refused by the limit of /a: limit 64, usage 0,
/// request 100"). Empty if no call failed on this thread yet. The pointer
/// stays valid until the next failing call on the same thread.
///
/// Thread-safe (each thread has its own message).
#[no_mangle]
pub extern "C" fn splitcount_last_error() -> *const c_char {
    // The message lives in the thread-local until it is replaced.
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|l| l.borrow().as_ref().map(|m| m.as_ptr()))
            .ok()
            .flatten()
    })
    .ok()
    .flatten()
    .unwrap_or(c"".as_ptr())
}

/// The name of a status code ("SPLITCOUNT_E_HANDLE"), or "unknown" for a
/// value that is none. A static string.
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_status_name(status: c_int) -> *const c_char {
    let name = match status {
        SPLITCOUNT_OK => c"SPLITCOUNT_OK",
        SPLITCOUNT_E_NULL => c"SPLITCOUNT_E_NULL",
        SPLITCOUNT_E_HANDLE => c"SPLITCOUNT_E_HANDLE",
        SPLITCOUNT_E_INVALID => c"SPLITCOUNT_E_INVALID",
        SPLITCOUNT_E_LIMIT => c"SPLITCOUNT_E_LIMIT",
        SPLITCOUNT_E_BUSY => c"SPLITCOUNT_E_BUSY",
        SPLITCOUNT_E_NOT_FOUND => c"SPLITCOUNT_E_NOT_FOUND",
        SPLITCOUNT_E_EXISTS => c"SPLITCOUNT_E_EXISTS",
        SPLITCOUNT_E_REMOVED => c"SPLITCOUNT_E_REMOVED",
        SPLITCOUNT_E_STATE => c"SPLITCOUNT_E_STATE",
        SPLITCOUNT_E_PANIC => c"SPLITCOUNT_E_PANIC",
        SPLITCOUNT_E_BUFFER => c"SPLITCOUNT_E_BUFFER",
        SPLITCOUNT_E_OVER_LIMIT => c"SPLITCOUNT_E_OVER_LIMIT",
        _ => c"unknown",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: the pointer is valid until the next failing call here.
        unsafe { std::ffi::CStr::from_ptr(splitcount_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_a_code_and_a_message() {
        let code = run("f", || panic!("boom {}", 7));
        assert_eq!(code, SPLITCOUNT_E_PANIC);
        assert_eq!(last(), "f: internal error (caught): boom 7");
    }

    #[test]
    fn an_error_keeps_its_code_and_names_the_function() {
        let code = run("g", || Err(Error::new(SPLITCOUNT_E_BUSY, "busy\0here")));
        assert_eq!(code, SPLITCOUNT_E_BUSY);
        assert_eq!(last(), "g: busy here");
        assert_eq!(run("g", || Ok(())), SPLITCOUNT_OK);
        assert_eq!(last(), "g: busy here", "success leaves the message");
    }
}
