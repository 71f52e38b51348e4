//! The exit report (`SPLITCOUNT_PRELOAD_REPORT`), the message that stops a
//! program with a bad configuration, and other messages on stderr.
//!
//! Every report line starts `splitcount-preload: pid=<pid> program=<name>`
//! (the process's id when it reports — a `fork` child's own — and glibc's
//! `program_invocation_short_name`, the base name of `argv[0]`), then
//! `key=value` pairs:
//!
//! ```text
//! splitcount-preload: pid=4242 program=sqlite3 group=/preload usage=13736 peak=… max=… enforcement=refuse events.max=0 …
//! splitcount-preload: pid=4242 program=sqlite3 group=/ usage=13736 …
//! splitcount-preload: pid=4242 program=sqlite3 glibc in_use=44080 arena_in_use=44080 mmapped=0
//! ```

use crate::settings::{Report, BAD_CONFIG_EXIT};
use splitcount::charge::{Enforcement, UNLIMITED};
use splitcount::group::Group;
use std::sync::OnceLock;

/// Where the exit report goes: set once, at load.
static REPORT_TO: OnceLock<Report> = OnceLock::new();

/// Write `text` to `fd` with one `write(2)` per attempt: no stdio, no lock.
fn write_all(fd: i32, text: &str) {
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: a valid buffer of that length; a closed fd fails,
        // harmlessly.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

/// Write `text` to stderr.
pub(crate) fn say(text: &str) {
    write_all(2, text);
}

/// The program's name, as on the report lines: the base name of
/// `argv[0]` (glibc's `program_invocation_short_name`, set before any
/// constructor runs), blanks and `=` replaced by `_` so that the line
/// stays `key=value` pairs.
fn program() -> String {
    extern "C" {
        static program_invocation_short_name: *const libc::c_char;
    }
    // SAFETY: glibc's pointer to a NUL-terminated string (or null).
    let name = unsafe { program_invocation_short_name };
    if name.is_null() {
        return "?".to_owned();
    }
    // SAFETY: see above.
    let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_whitespace() || c == '=' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if name.is_empty() {
        "?".to_owned()
    } else {
        name
    }
}

/// The start of every report line.
fn prefix() -> String {
    // SAFETY: no preconditions.
    let pid = unsafe { libc::getpid() };
    format!("splitcount-preload: pid={pid} program={}", program())
}

/// Stop the program at load: each error on stderr, then why, and
/// `_exit(BAD_CONFIG_EXIT)`.
///
/// `_exit`, not `exit` or `abort`: this runs in the preload's constructor
/// or inside the process's first `malloc`, before `main` and possibly
/// before other libraries' constructors. `exit` would run `atexit`
/// handlers and destructors of libraries that may not be initialized, and
/// flush stdio from inside `malloc`; `abort` raises `SIGABRT` (a core
/// dump, a crash report, "Aborted" from the shell) for what is a
/// configuration error. `_exit` is the system call alone: safe anywhere,
/// and the exit status says which error it is.
pub(crate) fn stop(errors: &[String]) -> ! {
    let mut text = String::new();
    for e in errors {
        text += &format!("splitcount-preload: {e}\n");
    }
    // SAFETY: no preconditions.
    let pid = unsafe { libc::getpid() };
    text += &format!(
        "splitcount-preload: not running {} (pid {pid}) with a configuration the preload cannot \
         read: exit status {BAD_CONFIG_EXIT}\n",
        program()
    );
    say(&text);
    // SAFETY: ends the process; nothing runs after.
    unsafe { libc::_exit(BAD_CONFIG_EXIT) }
}

/// Remember where the exit report goes; whether there is one.
pub(crate) fn report_to(to: Report) -> bool {
    let on = to != Report::Off;
    let _ = REPORT_TO.set(to);
    on
}

/// One line per group: `key=value` pairs a test or a script can read.
fn line(prefix: &str, g: &Group) -> String {
    let e = g.events();
    let max = match g.max() {
        UNLIMITED => "none".to_owned(),
        m => m.to_string(),
    };
    let enforcement = match g.enforcement() {
        Enforcement::Refuse => "refuse",
        _ => "cooperative",
    };
    format!(
        "{prefix} group={} usage={} peak={} max={max} enforcement={enforcement} \
         events.max={} events.high={} events.oom={} events.underflow={} events.breaches={} \
         events.refused={}\n",
        g.path(),
        g.usage(),
        g.peak(),
        e.max,
        e.high,
        e.oom,
        e.underflow,
        e.breaches,
        e.refused
    )
}

/// Write the report where it goes: stderr, or `<path>.<pid>` (created, or
/// truncated; stderr, with a message, if it cannot be opened).
fn deliver(text: &str) {
    let path = match REPORT_TO.get() {
        Some(Report::File(path)) => path,
        _ => return say(text),
    };
    // SAFETY: no preconditions.
    let pid = unsafe { libc::getpid() };
    let file = format!("{path}.{pid}");
    let fd = std::ffi::CString::new(file.as_str()).map_or(-1, |c| {
        // SAFETY: a NUL-terminated path; the mode is passed as open(2)'s
        // variadic argument.
        unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
                0o666 as libc::c_uint,
            )
        }
    });
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        say(&format!(
            "splitcount-preload: cannot write the report to {file}: {err}; here it is\n{text}"
        ));
        return;
    }
    write_all(fd, text);
    // SAFETY: ours.
    unsafe { libc::close(fd) };
}

/// Registered with `atexit`: drain the stocks (and this thread's reserve),
/// so that usage is the live bytes charged, then report `/preload`, the
/// root, and glibc's count of bytes in use (`mallinfo2`: the chunks of the
/// program's blocks with their headers, and this library's own memory).
/// Runs with accounting off: it allocates nothing through a limited path.
pub(crate) extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        crate::busy(|| {
            let Some((h, g)) = crate::PRELOAD.get() else {
                return;
            };
            h.drain_stocks();
            // SAFETY: glibc's statistics; no preconditions.
            let m = unsafe { libc::mallinfo2() };
            let prefix = prefix();
            deliver(&format!(
                "{}{}{prefix} glibc in_use={} arena_in_use={} mmapped={}\n",
                line(&prefix, g),
                line(&prefix, &h.root()),
                m.uordblks + m.hblkhd,
                m.uordblks,
                m.hblkhd
            ));
        })
    });
}
