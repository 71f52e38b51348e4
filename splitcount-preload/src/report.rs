//! The exit report (`SPLITCOUNT_PRELOAD_REPORT=1`) and messages on stderr.

use splitcount::charge::{Enforcement, UNLIMITED};
use splitcount::group::Group;

/// Write `text` to stderr with one `write(2)`: no stdio, no lock.
pub(crate) fn say(text: &str) {
    // SAFETY: a valid buffer of that length; fd 2 may be closed (then the
    // write fails, harmlessly).
    let _ = unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

/// One line per group: `key=value` pairs a test or a script can read.
fn line(g: &Group) -> String {
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
        "splitcount-preload: group={} usage={} peak={} max={max} enforcement={enforcement} \
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

/// Registered with `atexit`: drain the stocks (and this thread's reserve),
/// so that usage is the live bytes charged, then print `/preload`, the
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
            say(&format!(
                "{}{}splitcount-preload: glibc in_use={} arena_in_use={} mmapped={}\n",
                line(g),
                line(&h.root()),
                m.uordblks + m.hblkhd,
                m.uordblks,
                m.hblkhd
            ));
        })
    });
}
