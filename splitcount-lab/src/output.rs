//! The lab's standard output, written without panicking.
//!
//! `println!` panics when a write to stdout fails (a full disk, a file
//! system that refuses it): the lab died with a backtrace, and `report`
//! — which prints its tables as the suites finish and writes its files at
//! the end — wrote no file at all. [`outln!`](crate::outln) and
//! [`out!`](crate::out) write the same text; the first failure is kept
//! ([`failure`]) and later output dropped, so the run goes on to its files,
//! and `main` exits with the error. (A closed pipe still ends the lab
//! quietly: it restores the default `SIGPIPE`.)

use std::io::Write;
use std::sync::OnceLock;

/// The first write to stdout that failed.
static FAILED: OnceLock<String> = OnceLock::new();

/// Write `args` (and a newline if `newline`) to stdout, or remember why
/// it could not be written.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    if FAILED.get().is_some() {
        return;
    }
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    if let Err(e) = written {
        let _ = FAILED.set(e.to_string());
    }
}

/// Flush stdout; the first failure of any write, if one failed.
pub fn failure() -> Option<String> {
    if let Err(e) = std::io::stdout().lock().flush() {
        let _ = FAILED.set(e.to_string());
    }
    FAILED.get().cloned()
}

/// `println!` to the lab's standard output, without a panic on a failed
/// write (see [`crate::output`]).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::output::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*), true)
    };
}

/// `print!` to the lab's standard output, without a panic on a failed
/// write (see [`crate::output`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write(format_args!($($arg)*), false)
    };
}
