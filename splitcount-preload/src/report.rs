//! The reports (`SPLITCOUNT_PRELOAD_REPORT`, `SPLITCOUNT_PRELOAD_SIGNAL`),
//! the message that stops a program with a bad configuration, and other
//! messages on stderr.
//!
//! Every report line starts `splitcount-preload: pid=<pid> program=<name>
//! at=<moment>` (the process's id when it reports — a `fork` child's own,
//! with `forked_from=<pid>` after the moment —, glibc's
//! `program_invocation_short_name`, the base name of `argv[0]`, and when:
//! [`Moment`]), then `key=value` pairs:
//!
//! ```text
//! splitcount-preload: pid=4242 program=sqlite3 at=exit group=/preload usage=13736 peak=… max=… enforcement=refuse events.max=0 … slack.stocks=… slack.per_thread=32768
//! splitcount-preload: pid=4242 program=sqlite3 at=exit group=/ usage=13736 …
//! splitcount-preload: pid=4242 program=sqlite3 at=exit glibc in_use=44080 arena_in_use=44080 mmapped=0
//! ```
//!
//! Without tags each group line ends `setup_blocks=<n> setup_returned=<m>`:
//! the blocks made while the accounting was set up, which are remembered
//! and charged nothing (see [`crate::untagged`]), and how many of them the
//! program has freed since.
//!
//! Only the exit report drains the stocks first. The others (`_exit`, a
//! live snapshot, a fatal signal) are written from places where a lock may
//! be held by the interrupted code, so they read atomics, format into a
//! stack buffer ([`Text`]) and `write(2)` it — nothing that allocates or
//! locks —, and their usage may run ahead of the bytes held by up to
//! `slack.stocks` plus `slack.per_thread` per thread.

use crate::settings::{Report, BAD_CONFIG_EXIT};
use splitcount::charge::{Enforcement, UNLIMITED};
use splitcount::group::Group;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
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

/// Write `text` to stderr: see [`stderr_fd`].
pub(crate) fn say(text: &str) {
    write_all(stderr_fd(), text);
}

/// A copy of the stderr the process started with, taken at load when a
/// report or a snapshot may go there (`-1`: none kept). A program may close
/// its stderr before it ends — coreutils' `close_stdout` does, in an
/// `atexit` handler that runs before the preload's — and the exit report
/// was lost (`write` failed with `EBADF`: `ls`, `cat` never reported); or
/// it may then open a file that takes descriptor 2, which the report would
/// have been written into.
static STDERR_COPY: AtomicI32 = AtomicI32::new(-1);

/// What the kept stderr is (its device and inode): descriptor 2 is used
/// while it is still that file.
static STDERR_DEV: AtomicU64 = AtomicU64::new(0);
static STDERR_INO: AtomicU64 = AtomicU64::new(0);

/// The lowest descriptor the copy may take: far from the lowest free ones,
/// which programs count on getting (a process allowed fewer descriptors
/// keeps no copy).
const STDERR_COPY_MIN: i32 = 1000;

/// The device and inode of the file open at `fd`, if any. `fstat` is
/// async-signal-safe.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: a plain-data struct, filled by `fstat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer; a closed descriptor fails.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Keep a copy of stderr (close-on-exec: a program it `exec`s keeps its
/// own). At load, before any report.
fn keep_stderr() {
    let Some((dev, ino)) = identity(2) else {
        return; // no stderr to keep
    };
    // SAFETY: duplicates descriptor 2 at or above the minimum.
    let copy = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, STDERR_COPY_MIN) };
    if copy < 0 {
        return;
    }
    // Relaxed: set at load, before any thread reports.
    STDERR_DEV.store(dev, Ordering::Relaxed);
    STDERR_INO.store(ino, Ordering::Relaxed);
    STDERR_COPY.store(copy, Ordering::Relaxed);
}

/// Where stderr's text goes: descriptor 2 while it is the stderr the
/// process started with (or none was kept); the kept copy once 2 is closed
/// or names another file (the program's own data, or a log it moved its
/// stderr to: the report goes where the program's stderr first went). If
/// the copy is gone too (a program that closed every descriptor), 2 as it
/// is.
fn stderr_fd() -> i32 {
    // Relaxed: see `keep_stderr`.
    let copy = STDERR_COPY.load(Ordering::Relaxed);
    if copy < 0 {
        return 2;
    }
    let kept = Some((
        STDERR_DEV.load(Ordering::Relaxed),
        STDERR_INO.load(Ordering::Relaxed),
    ));
    if identity(2) == kept || identity(copy) != kept {
        2
    } else {
        copy
    }
}

/// The program's name, as on the report lines: the base name of
/// `argv[0]` (glibc's `program_invocation_short_name`, set before any
/// constructor runs), blanks and `=` replaced by `_` so that the line
/// stays `key=value` pairs.
pub(crate) fn program() -> String {
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

/// The program's name, computed once at load (a report written from a
/// signal handler must not allocate).
static PROGRAM: OnceLock<String> = OnceLock::new();

/// The process whose figures this one's started from: the one that loaded
/// the preload, and in a `fork` child its parent (set by [`forked`]). A
/// process whose pid differs says `forked_from=` this, since its figures
/// start as a copy of the parent's.
static LOADED_BY: AtomicI32 = AtomicI32::new(0);

/// The pid of the process that is forking (set by [`forking`] in the
/// parent; the child reads its copy).
static FORKING: AtomicI32 = AtomicI32::new(0);

/// Remember the program's name and pid for the report lines (at load), and
/// what a `fork` changes.
pub(crate) fn remember_process() {
    let _ = PROGRAM.set(program());
    // SAFETY: no preconditions.
    LOADED_BY.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    // SAFETY: registers two functions without arguments that never unwind.
    unsafe { libc::pthread_atfork(Some(forking), None, Some(forked)) };
}

/// `pthread_atfork`'s prepare handler: the parent's pid, for the child.
extern "C" fn forking() {
    // SAFETY: no preconditions.
    FORKING.store(unsafe { libc::getpid() }, Ordering::Relaxed);
}

/// `pthread_atfork`'s child handler. The child's reports say the parent
/// it was forked from (not the process that loaded the preload: a
/// grandchild named its grandparent). And the child lets the kept copy of
/// stderr go: a daemon that forks, starts a session and points 0, 1 and 2
/// at `/dev/null` would otherwise keep its caller's stderr open at the
/// copy's descriptor — a pipe whose reader (`$(daemon 2>&1)`, a service
/// manager's log) then waited until the daemon ended. A child reports on
/// its descriptor 2 as it is.
extern "C" fn forked() {
    LOADED_BY.store(FORKING.load(Ordering::Relaxed), Ordering::Relaxed);
    let copy = STDERR_COPY.swap(-1, Ordering::Relaxed);
    if copy >= 0 {
        // SAFETY: the copy this library made; nothing else uses it.
        unsafe { libc::close(copy) };
    }
}

/// End the process now, without `atexit` handlers or the `_exit` report:
/// the `exit_group` system call, which is what glibc's `_exit` is.
pub(crate) fn exit_now(status: i32) -> ! {
    loop {
        // SAFETY: ends every thread of the process; never returns.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// Text built on the stack: formatting into it never allocates, so a
/// report can be written from a signal handler or from `_exit`. What does
/// not fit is cut (a report is a few hundred bytes).
pub(crate) struct Text {
    buf: [u8; 4096],
    len: usize,
}

impl Text {
    pub(crate) fn new() -> Text {
        Text {
            buf: [0; 4096],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        // Only whole `&str`s are copied in, cut at a char boundary.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl Write for Text {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len() - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// When a report is written, named by its `at=` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moment {
    /// At normal exit (`exit`, the end of `main`), after draining the
    /// stocks: usage is the bytes still charged.
    Exit,
    /// At `_exit` or `_Exit`: not drained (other threads may hold the
    /// stocks' locks), so usage may include the slack.
    UnderscoreExit,
    /// A live snapshot on `SPLITCOUNT_PRELOAD_SIGNAL`: not drained.
    Live,
    /// On a fatal signal, before the signal's default action: not drained.
    Fatal(i32),
}

impl Moment {
    fn name(self) -> &'static str {
        match self {
            Moment::Exit => "exit",
            Moment::UnderscoreExit => "_exit",
            Moment::Live => "live",
            Moment::Fatal(libc::SIGSEGV) => "SIGSEGV",
            Moment::Fatal(libc::SIGBUS) => "SIGBUS",
            Moment::Fatal(libc::SIGILL) => "SIGILL",
            Moment::Fatal(libc::SIGFPE) => "SIGFPE",
            Moment::Fatal(libc::SIGABRT) => "SIGABRT",
            Moment::Fatal(_) => "signal",
        }
    }
}

/// The start of every report line.
fn prefix(out: &mut Text, moment: Moment) {
    // SAFETY: no preconditions.
    let pid = unsafe { libc::getpid() };
    let program = PROGRAM.get().map_or("?", String::as_str);
    let _ = write!(
        out,
        "splitcount-preload: pid={pid} program={program} at={}",
        moment.name()
    );
    let loaded_by = LOADED_BY.load(Ordering::Relaxed);
    if loaded_by != 0 && loaded_by != pid {
        let _ = write!(out, " forked_from={loaded_by}");
    }
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
    exit_now(BAD_CONFIG_EXIT)
}

/// One line per group: `key=value` pairs a test or a script can read.
/// Reads atomics only: safe in a signal handler.
fn line(out: &mut Text, moment: Moment, g: &Group) {
    let e = g.events();
    prefix(out, moment);
    let _ = write!(
        out,
        " group={} usage={} peak={} max=",
        g.path(),
        g.usage(),
        g.peak()
    );
    let _ = match g.max() {
        UNLIMITED => write!(out, "none"),
        m => write!(out, "{m}"),
    };
    let enforcement = match g.enforcement() {
        Enforcement::Refuse => "refuse",
        _ => "cooperative",
    };
    let stocks = crate::ACCOUNTED.max_slack(0);
    let charged = if crate::charging_footprints() {
        "footprint"
    } else {
        "usable"
    };
    let tags = if crate::untagged::on() { "off" } else { "on" };
    let _ = write!(
        out,
        " enforcement={enforcement} events.max={} events.high={} events.oom={} \
         events.underflow={} events.breaches={} events.refused={} slack.stocks={stocks} \
         slack.per_thread={} charged={charged} tags={tags}",
        e.max,
        e.high,
        e.oom,
        e.underflow,
        e.breaches,
        e.refused,
        crate::ACCOUNTED.max_slack(1) - stocks,
    );
    if crate::untagged::on() {
        // The blocks made while the accounting was set up (charged
        // nothing): remembered, and returned to their heap since.
        let (made, returned) = crate::untagged::setup_blocks();
        let _ = write!(out, " setup_blocks={made} setup_returned={returned}");
    }
    let _ = writeln!(out);
}

/// The lines of `/preload` and the root (no glibc line: `mallinfo2`
/// takes glibc's locks, which a signal may have interrupted).
fn groups(out: &mut Text, moment: Moment) -> bool {
    let Some((h, g)) = crate::PRELOAD.get() else {
        return false;
    };
    line(out, moment, g);
    line(out, moment, &h.root());
    true
}

/// Write the report where it goes: stderr, or appended to `<path>.<pid>`
/// (created if need be; stderr, with a message, if it cannot be opened).
/// Allocates nothing and takes no lock: safe in a signal handler.
fn deliver(text: &Text) {
    let path = match REPORT_TO.get() {
        Some(Report::File(path)) => path,
        // Off: a live snapshot, asked for without a report, to stderr.
        _ => return say(text.as_str()),
    };
    // SAFETY: no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut file = Text::new();
    let _ = write!(file, "{path}.{pid}\0");
    let fd = match file.as_str().strip_suffix('\0') {
        // SAFETY: a NUL-terminated path (no NUL inside: it came from the
        // environment); the mode is open(2)'s variadic argument.
        Some(name) if !name.contains('\0') => unsafe {
            libc::open(
                file.buf.as_ptr().cast(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC,
                0o666 as libc::c_uint,
            )
        },
        _ => -1,
    };
    if fd < 0 {
        let mut why = Text::new();
        let _ = writeln!(
            why,
            "splitcount-preload: cannot write the report to {} (errno {}); here it is",
            file.as_str().trim_end_matches('\0'),
            crate::errno()
        );
        say(why.as_str());
        say(text.as_str());
        return;
    }
    write_all(fd, text.as_str());
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
        crate::ACCOUNTED.unaccounted(|| {
            let Some((h, _)) = crate::PRELOAD.get() else {
                return;
            };
            h.drain_stocks();
            let mut out = Text::new();
            groups(&mut out, Moment::Exit);
            // SAFETY: glibc's statistics; no preconditions.
            let m = unsafe { libc::mallinfo2() };
            if let Some(figures) = crate::heap::figures() {
                prefix(&mut out, Moment::Exit);
                let _ = writeln!(out, " {figures}");
            }
            prefix(&mut out, Moment::Exit);
            let _ = writeln!(
                out,
                " glibc in_use={} arena_in_use={} mmapped={}",
                m.uordblks + m.hblkhd,
                m.uordblks,
                m.hblkhd
            );
            deliver(&out);
        })
    });
}

/// A report without draining (`_exit`, a snapshot, a fatal signal):
/// atomics, a stack buffer and `write(2)`, nothing else.
pub(crate) fn undrained(moment: Moment) {
    if matches!(REPORT_TO.get(), None | Some(Report::Off)) && moment != Moment::Live {
        return;
    }
    let mut out = Text::new();
    if groups(&mut out, moment) {
        deliver(&out);
    }
}

/// The live snapshot's signal handler.
extern "C" fn on_snapshot_signal(_: libc::c_int) {
    let saved = crate::errno();
    undrained(Moment::Live);
    crate::set_errno(saved);
}

/// Whether a fatal signal's report was written (once per process).
static FATAL_REPORTED: AtomicBool = AtomicBool::new(false);

/// The fatal signals' handler: the report, then the signal's own action
/// (the default one put back and the signal raised again: it is delivered
/// when the handler returns, or the faulting instruction faults again).
extern "C" fn on_fatal_signal(sig: libc::c_int) {
    if !FATAL_REPORTED.swap(true, Ordering::Relaxed) {
        undrained(Moment::Fatal(sig));
    }
    // SAFETY: async-signal-safe calls; the default action ends the process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// The signals whose default action ends the process with a core dump and
/// that a report is written on.
const FATAL: [libc::c_int; 5] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
];

/// Install `handler` for `sig` where the disposition is still the default
/// (a handler the program or another library set first is left alone;
/// one the program sets later replaces ours).
fn install(sig: libc::c_int, handler: extern "C" fn(libc::c_int), flags: libc::c_int) -> bool {
    // SAFETY: sigaction with valid, zero-initialized structures.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_DFL
        {
            return false;
        }
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = handler as usize;
        new.sa_flags = flags;
        libc::sigemptyset(&mut new.sa_mask);
        libc::sigaction(sig, &new, std::ptr::null_mut()) == 0
    }
}

/// Bytes of the alternate signal stack the main thread gets (the report is
/// written from a fatal signal's handler with a fixed buffer on it).
const ALTERNATE_STACK: usize = 64 << 10;

/// Give the thread that loads the preload — the main thread — an
/// alternate signal stack if it has none, so that a fatal signal's report
/// is written when that thread overflows its stack (the kernel cannot
/// push the handler's frame onto a full stack: without it the process
/// died with no report). Mapped, not allocated, with a guard page below;
/// its pages cost memory only once a handler runs on them. Other threads
/// run the handler on an alternate stack of their own if the program gave
/// them one; without, an overflow of theirs ends the process unreported.
fn main_thread_alternate_stack() {
    // SAFETY: `sigaltstack` reads and writes `stack_t`s we own; the
    // mapping is ours, never unmapped (the thread may use it until it
    // ends).
    unsafe {
        // The set-up runs on the thread that first needed it: the main
        // thread (the constructor), unless another allocated first.
        if libc::gettid() != libc::getpid() {
            return;
        }
        let mut current: libc::stack_t = std::mem::zeroed();
        if libc::sigaltstack(std::ptr::null(), &mut current) != 0
            || current.ss_flags & libc::SS_DISABLE == 0
        {
            return; // the program (or a library) gave it one already
        }
        let guard = crate::page_size();
        let base = libc::mmap(
            std::ptr::null_mut(),
            ALTERNATE_STACK + guard,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if base == libc::MAP_FAILED {
            return;
        }
        libc::mprotect(base, guard, libc::PROT_NONE);
        let stack = libc::stack_t {
            ss_sp: base.cast::<u8>().add(guard).cast(),
            ss_flags: 0,
            ss_size: ALTERNATE_STACK,
        };
        libc::sigaltstack(&stack, std::ptr::null_mut());
    }
}

/// At load: the report's destination, the exit report, the fatal signals'
/// reports (when there is a report) and the live snapshot's signal (when
/// asked for).
pub(crate) fn set_up(to: Report, snapshot: Option<libc::c_int>) {
    remember_process();
    // A relative path names a file in the directory the program starts in,
    // not wherever it has gone when it ends (a `chdir` before exit put the
    // report in the new directory).
    let to = match to {
        Report::File(path) if !path.starts_with('/') => {
            // (A directory whose name is not UTF-8 keeps the path relative.)
            match std::env::current_dir()
                .ok()
                .and_then(|d| d.to_str().map(str::to_owned))
            {
                Some(dir) => Report::File(format!("{dir}/{path}")),
                None => Report::File(path),
            }
        }
        to => to,
    };
    let on = to != Report::Off;
    if !matches!(to, Report::File(_)) && (on || snapshot.is_some()) {
        keep_stderr();
    }
    let _ = REPORT_TO.set(to);
    if on {
        // SAFETY: registers a function without arguments that never unwinds.
        unsafe { libc::atexit(at_exit) };
        main_thread_alternate_stack();
        for sig in FATAL {
            // On the thread's alternate stack where it has one: a thread
            // whose stack overflowed has none left for the handler.
            install(sig, on_fatal_signal, libc::SA_ONSTACK);
        }
    }
    if let Some(sig) = snapshot {
        if !install(sig, on_snapshot_signal, libc::SA_RESTART) {
            say("splitcount-preload: SPLITCOUNT_PRELOAD_SIGNAL: the signal already has a handler or is ignored (inherited); no snapshots\n");
        }
    }
}
