//! The library's own code pages, let go after the set-up.
//!
//! The set-up (reading the environment, building the hierarchy, the
//! report's handlers) runs code that a program's `malloc` and `free` never
//! run again, scattered over the library's ~620 KiB of code; and the
//! kernel maps 64 KiB around every page fault of a file mapping
//! ("fault-around"), so after the set-up nearly all of it is mapped: 572
//! KiB of every process's resident set (VmRSS, VmHWM), before the program
//! allocated a byte.
//!
//! Once the accounting is ready, [`shed`] drops the mappings of the
//! library's executable segment (`madvise(MADV_DONTNEED)`). The pages stay
//! in the page cache, shared; what the program runs next (the `malloc` and
//! `free` paths, the exit report) faults back in, with its 64 KiB around.
//! Safe for code: the segment is never written (no text relocations: the
//! library is position-independent), so dropping a page only means reading
//! it again from the file; a thread running in it meanwhile faults and
//! goes on. Only whole pages inside the executable segment are dropped —
//! never one it shares with a neighbour (the relocated, read-only-after-
//! relocation data, `RELRO`, would go back to its unrelocated bytes).
//!
//! What the program runs next would still bring back whole 64 KiB windows:
//! a thread's first `malloc` runs the fast path, the thread's set-up
//! (`enter_held`, the exit guard, std's TLS destructor list) and the
//! stock's admission filter, spread over 7 or 8 of the 11 windows of this
//! build's code; a server's `realloc`, `calloc` and threads touch more
//! (Debian's `redis-server` under load: 536 of 724 KiB). Fault-around
//! never maps past the mapping (VMA) it faults in, so [`shed`] also cuts
//! the segment into one-page mappings: every other page gets
//! `MADV_NOHUGEPAGE`, a flag that only keeps the kernel from backing the
//! range with a huge page (which the library's code, far smaller than one,
//! never is), and mappings with different flags are not merged. A fault then maps
//! its own page, so what stays resident is the pages the program runs
//! (redis: 86 pages, 344 KiB). The cost: about 180 more mappings in
//! `/proc/<pid>/maps` (kernel memory, ~200 bytes each, not the
//! process's resident set), a minor fault per page run instead of per
//! window, and 90 `madvise` calls at start (a kernel without huge page
//! support refuses the flag: the segment then stays whole, as before).
//! `MADV_RANDOM` would split it as well, but the kernel ignores accesses
//! through such a mapping when it picks pages to reclaim (since 6.3), so
//! the `malloc` path's code could be evicted while in use. The build
//! script aligns the library to 64 KiB, so the windows of a kernel that
//! keeps the segment whole fall in the same places in every process.
//!
//! A traced process (a debugger attached from the start) keeps its code
//! as loaded: a breakpoint written into a page before the set-up ended
//! lives in a private copy that `MADV_DONTNEED` would throw away.

use std::ffi::c_void;

/// What [`shed`] looks for: this library's load address, and the range of
/// whole pages of its executable segment found.
struct Search {
    base: usize,
    pages: Option<(usize, usize)>,
}

/// The page size.
fn page() -> usize {
    // SAFETY: no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// Drop the mappings of this library's code pages (see the module docs);
/// the bytes dropped (`None`: not found, `madvise` refused, or the process
/// is traced).
pub(crate) fn shed() -> Option<usize> {
    if traced() {
        return None;
    }
    let mut info: libc::Dl_info = unsafe_zeroed();
    // SAFETY: the address of a function of this library, and an out-param.
    if unsafe { libc::dladdr(shed as *const c_void, &mut info) } == 0 {
        return None;
    }
    let mut search = Search {
        base: info.dli_fbase as usize,
        pages: None,
    };
    // SAFETY: the callback reads only what glibc hands it, for the call.
    unsafe { libc::dl_iterate_phdr(Some(each_object), (&mut search as *mut Search).cast()) };
    let (start, end) = search.pages?;
    // SAFETY: whole pages of this library's executable segment, which is
    // never written (see the module docs): dropping them loses nothing.
    let rc = unsafe { libc::madvise(start as *mut c_void, end - start, libc::MADV_DONTNEED) };
    split_into_pages(start, end);
    (rc == 0).then_some(end - start)
}

/// Cut `start..end` (whole pages of this library's code) into one-page
/// mappings, so that a fault maps only its own page (see the module docs):
/// every other page gets `MADV_NOHUGEPAGE`, and the kernel does not merge
/// mappings whose flags differ. Stops at the first refusal (a kernel
/// without huge page support): the rest stays as it was, correct, only
/// faulted around.
fn split_into_pages(start: usize, end: usize) {
    let page = page();
    let mut at = start + page;
    while at < end {
        // SAFETY: one whole page of this library's code; the flag only
        // rules out a huge page there and changes no byte of it.
        if unsafe { libc::madvise(at as *mut c_void, page, libc::MADV_NOHUGEPAGE) } != 0 {
            return;
        }
        at += 2 * page;
    }
}

/// Whether a tracer is attached (`TracerPid` in `/proc/self/status` is
/// not 0): a debugger that set a breakpoint in this library's code before
/// the set-up ended (`gdb` with a breakpoint on the preload's `malloc`, set
/// as the library loads) wrote it into a private copy of the page, which
/// `MADV_DONTNEED` throws away — the page comes back from the file without
/// it, and the breakpoint never fired again (found by a helper). A traced
/// process keeps its code mapped. Read into the stack with system calls,
/// not libc's `open` (another preloaded library may wrap it, and would run
/// inside our set-up): this runs inside the first `malloc`, and allocates
/// nothing. `false` when the file cannot be read.
fn traced() -> bool {
    let mut buf = [0u8; 4096];
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/proc/self/status".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: writes at most the rest of `buf`.
        let n =
            unsafe { libc::syscall(libc::SYS_read, fd, buf[len..].as_mut_ptr(), buf.len() - len) };
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: the descriptor opened above.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    tracer_in(&buf[..len])
}

/// Whether `/proc/<pid>/status` text names a tracer (a `TracerPid:` line
/// whose value is not 0).
fn tracer_in(status: &[u8]) -> bool {
    status
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"TracerPid:"))
        .is_some_and(|v| v.iter().any(|b| (b'1'..=b'9').contains(b)))
}

/// A `Dl_info` of zeroes (all of its fields are pointers).
fn unsafe_zeroed() -> libc::Dl_info {
    // SAFETY: a struct of raw pointers, for which all-zero is valid (null).
    unsafe { std::mem::zeroed() }
}

/// `dl_iterate_phdr`'s callback: for this library (its load address is
/// `base`), the whole pages of its executable `PT_LOAD` segment.
unsafe extern "C" fn each_object(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> libc::c_int {
    // SAFETY: `data` is the `Search` passed to `dl_iterate_phdr`, and
    // `info` glibc's description of one loaded object, both for this call.
    let (search, info) = unsafe { (&mut *data.cast::<Search>(), &*info) };
    if info.dlpi_addr as usize != search.base || info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: glibc gives `dlpi_phnum` program headers at `dlpi_phdr`.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let page = page();
    for h in headers {
        if h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_X != 0 {
            let from = search.base + h.p_vaddr as usize;
            let to = from + h.p_memsz as usize;
            // Inward: only pages wholly inside the segment.
            let (start, end) = (from.next_multiple_of(page), to / page * page);
            if start < end {
                search.pages = Some((start, end));
            }
        }
    }
    1
}

#[cfg(test)]
mod tests {
    use super::tracer_in;

    #[test]
    fn a_tracer_is_read_from_the_status_text() {
        let status = |pid: &str| format!("Name:\tm\nState:\tR\nTracerPid:\t{pid}\nUid:\t0\n");
        assert!(!tracer_in(status("0").as_bytes()));
        assert!(tracer_in(status("1234").as_bytes()));
        assert!(tracer_in(status("10").as_bytes()));
        assert!(!tracer_in(b"Name:\tm\n"), "no such line: not traced");
        // And this test process, untraced (unless run under a debugger).
        let own = std::fs::read("/proc/self/status").unwrap();
        assert_eq!(tracer_in(&own), super::traced());
    }
}
