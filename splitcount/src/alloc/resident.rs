//! What the process's resident set is made of, mapping by mapping, read
//! from `/proc/self/smaps` — with the size and resident bytes of glibc's
//! heaps, from which the reconciliation tells how much of glibc's free
//! memory is resident.
//!
//! Each mapping's `Rss` goes to one class (see `IMPLEMENTATION.md`, §7,
//! *Reconciliation*):
//!
//! | class | mappings |
//! |---|---|
//! | files | file-backed: the program, shared libraries, mapped files, shared memory |
//! | stacks | `[stack]`, and anonymous mappings just above a `---p` guard mapping (threads' stacks and signal stacks) |
//! | malloc | `[heap]`, glibc's arena heaps (64 MiB-aligned, reserved `MAP_NORESERVE`), and blocks glibc mapped on their own (found by their chunk header) |
//! | other | every other anonymous mapping (splitcount's per-CPU arenas, other libraries' `mmap`s), `[vdso]`, `[vvar]` |
//!
//! Nothing here allocates: smaps is read through a fixed buffer on the
//! stack, and other memory is looked at only with `mincore` (which pages
//! are resident) and `process_vm_readv` (16 bytes of a mapping that may be
//! unmapped meanwhile: the call fails instead of faulting). Without `/proc`
//! the whole reading is `None`.

#![allow(unsafe_code)]

/// glibc's arena heaps are reserved at this size and alignment
/// (`HEAP_MAX_SIZE`: twice the largest mmap threshold, 32 MiB, on 64-bit).
const ARENA_HEAP: u64 = 64 << 20;

/// What one reading of `/proc/self/smaps` found: resident bytes per class,
/// and what the free-byte correction needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Mappings {
    /// Σ `Rss` of every mapping.
    pub(crate) total: u64,
    pub(crate) files: u64,
    pub(crate) stacks: u64,
    /// `[heap]`, arena heaps and glibc's own mapped blocks.
    pub(crate) malloc: u64,
    pub(crate) other: u64,
    /// Blocks glibc mapped on their own that the walk recognised, and
    /// their mapped bytes.
    pub(crate) mapped_blocks: u64,
    pub(crate) mapped_block_bytes: u64,
    pub(crate) mapped_block_resident: u64,
    /// The `[heap]` mapping (glibc's main arena, grown by `brk`): its
    /// bytes and resident bytes.
    pub(crate) heap_len: u64,
    pub(crate) heap_rss: u64,
    /// The arena heaps' read-write parts: their bytes and resident bytes.
    pub(crate) arena_rw: u64,
    pub(crate) arena_rss: u64,
}

/// One mapping, as its smaps entry describes it.
#[derive(Debug, Clone, Copy, Default)]
struct Vma {
    start: u64,
    end: u64,
    /// `rwxp`/`rw-s`… as written.
    perms: [u8; 4],
    kind: Kind,
    rss: u64,
    /// `nr` in `VmFlags`: mapped with `MAP_NORESERVE`.
    noreserve: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Kind {
    #[default]
    Anonymous,
    File,
    Heap,
    Stack,
    /// `[vdso]`, `[vvar]`, `[vsyscall]` and other bracketed names.
    Special,
}

impl Vma {
    fn len(&self) -> u64 {
        self.end - self.start
    }
    fn read_write_private(&self) -> bool {
        self.perms[0] == b'r' && self.perms[1] == b'w' && self.perms[3] == b'p'
    }
    fn inaccessible(&self) -> bool {
        self.perms[..3] == *b"---"
    }
}

/// Read `/proc/self/smaps`; `hblks`: how many blocks glibc says it mapped on
/// their own (the walk recognises at most that many). `None` without
/// `/proc`.
pub(crate) fn read_mappings(hblks: u64) -> Option<Mappings> {
    read_mappings_at(c"/proc/self/smaps", hblks)
}

/// [`read_mappings`] from `path` (tests feed it other files).
pub(crate) fn read_mappings_at(path: &std::ffi::CStr, hblks: u64) -> Option<Mappings> {
    let mut walk = Walk {
        out: Mappings::default(),
        cur: None,
        prev: None,
        blocks_left: hblks,
        page: page_size(),
    };
    read_lines(path, |line| walk.line(line))?;
    walk.finish();
    Some(walk.out)
}

/// Call `f` with every line of the file at `path`, without allocating.
/// `None` if it cannot be opened or read.
pub(crate) fn read_lines(path: &std::ffi::CStr, f: impl FnMut(&[u8])) -> Option<()> {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let ok = for_each_line(fd, f);
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };
    ok.then_some(())
}

/// Call `f` with every line of `fd` (without its newline), through a fixed
/// buffer. A line longer than the buffer is cut (smaps lines are at most a
/// path long). `false` on a read error.
fn for_each_line(fd: libc::c_int, mut f: impl FnMut(&[u8])) -> bool {
    let mut buf = [0u8; 8192];
    let (mut start, mut end) = (0usize, 0usize);
    loop {
        if let Some(nl) = buf[start..end].iter().position(|&b| b == b'\n') {
            f(&buf[start..start + nl]);
            start += nl + 1;
            continue;
        }
        if start == 0 && end == buf.len() {
            // A line as long as the buffer: take it as it is, skip its rest.
            f(&buf[..end]);
            end = 0;
            let mut skipping = true;
            while skipping {
                let n = read(fd, &mut buf);
                if n <= 0 {
                    return n == 0;
                }
                if let Some(nl) = buf[..n as usize].iter().position(|&b| b == b'\n') {
                    buf.copy_within(nl + 1..n as usize, 0);
                    end = n as usize - nl - 1;
                    skipping = false;
                }
            }
            continue;
        }
        buf.copy_within(start..end, 0);
        end -= start;
        start = 0;
        let n = read(fd, &mut buf[end..]);
        if n < 0 {
            return false;
        }
        if n == 0 {
            if end > 0 {
                f(&buf[..end]);
            }
            return true;
        }
        end += n as usize;
    }
}

/// `read(2)`, retried on `EINTR`.
fn read(fd: libc::c_int, buf: &mut [u8]) -> isize {
    loop {
        // SAFETY: writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return n;
        }
    }
}

/// The state of one pass over smaps: a mapping is classified when the next
/// one's header is read (the arena test looks at what follows it).
struct Walk {
    out: Mappings,
    cur: Option<Vma>,
    prev: Option<Vma>,
    blocks_left: u64,
    page: u64,
}

impl Walk {
    fn line(&mut self, line: &[u8]) {
        if let Some(v) = parse_header(line) {
            if let Some(done) = self.cur.take() {
                self.classify(done, Some(&v));
                self.prev = Some(done);
            }
            self.cur = Some(v);
        } else if let Some(cur) = self.cur.as_mut() {
            if let Some(rest) = line.strip_prefix(b"Rss:") {
                cur.rss = parse_kib(rest).unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix(b"VmFlags:") {
                cur.noreserve = rest.split(|&b| b == b' ').any(|f| f == b"nr");
            }
        }
    }

    fn finish(&mut self) {
        if let Some(done) = self.cur.take() {
            self.classify(done, None);
        }
    }

    fn classify(&mut self, v: Vma, next: Option<&Vma>) {
        let o = &mut self.out;
        o.total += v.rss;
        match v.kind {
            Kind::File => o.files += v.rss,
            Kind::Stack => o.stacks += v.rss,
            Kind::Special => o.other += v.rss,
            Kind::Heap => {
                o.malloc += v.rss;
                o.heap_len += v.len();
                o.heap_rss += v.rss;
            }
            Kind::Anonymous => self.classify_anonymous(v, next),
        }
    }

    fn classify_anonymous(&mut self, v: Vma, next: Option<&Vma>) {
        if !v.read_write_private() {
            self.out.other += v.rss;
            return;
        }
        // Arena heaps: glibc reserves 64 MiB at 64 MiB alignment with
        // MAP_NORESERVE and opens each read-write from the bottom; the rest
        // stays `---p` right above. Full heaps next to each other merge
        // into one mapping, and so may the per-CPU arenas' mappings (also
        // MAP_NORESERVE) below a heap: the heaps are what lies from the
        // first 64 MiB boundary on.
        let mut v = v;
        if v.noreserve {
            let first = v.start.div_ceil(ARENA_HEAP) * ARENA_HEAP;
            let closed_above = v.end % ARENA_HEAP == 0
                || next.is_some_and(|n| n.start == v.end && n.inaccessible());
            if first < v.end && closed_above {
                let rss = if first == v.start {
                    v.rss
                } else {
                    resident_bytes(first, v.end, self.page).min(v.rss)
                };
                self.out.malloc += rss;
                self.out.arena_rw += v.end - first;
                self.out.arena_rss += rss;
                if first == v.start {
                    return;
                }
                v.rss -= rss;
                v.end = first;
            }
        }
        if v.rss == 0 {
            return;
        }
        // Blocks glibc mapped on their own, from the mapping's start (the
        // kernel merges neighbouring anonymous mappings into one).
        let mut rest = (v.start, v.rss);
        if !v.noreserve {
            let (blocks, bytes, resident, at) =
                mapped_blocks(v.start, v.end, self.blocks_left, self.page);
            if blocks > 0 {
                self.blocks_left -= blocks;
                self.out.mapped_blocks += blocks;
                self.out.mapped_block_bytes += bytes;
                self.out.mapped_block_resident += resident;
                self.out.malloc += resident;
                rest = (at, v.rss.saturating_sub(resident));
            }
        }
        let (at, rss) = rest;
        if at >= v.end || rss == 0 {
            return;
        }
        // A stack: glibc and Rust put a `---p` guard right below each
        // thread's stack and signal stack.
        let guarded = self
            .prev
            .is_some_and(|p| p.end == v.start && p.inaccessible());
        if guarded && at == v.start {
            self.out.stacks += rss;
        } else {
            self.out.other += rss;
        }
    }
}

/// `start-end perms offset dev inode [path]`, or `None` for a field line.
fn parse_header(line: &[u8]) -> Option<Vma> {
    let mut fields = line.splitn(6, |&b| b == b' ');
    let range = fields.next()?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let start = parse_hex(&range[..dash])?;
    let end = parse_hex(&range[dash + 1..])?;
    let perms: [u8; 4] = fields.next()?.try_into().ok()?;
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().map_or(&b""[..], |p| p.trim_ascii_start());
    let kind = if path == b"[heap]" {
        Kind::Heap
    } else if path == b"[stack]" {
        Kind::Stack
    } else if path.starts_with(b"[anon") {
        Kind::Anonymous
    } else if path.starts_with(b"[") {
        Kind::Special
    } else if path.starts_with(b"/") || inode != b"0" {
        Kind::File
    } else {
        Kind::Anonymous
    };
    (start < end).then_some(Vma {
        start,
        end,
        perms,
        kind,
        rss: 0,
        noreserve: false,
    })
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        let d = (b as char).to_digit(16)?;
        Some(acc << 4 | d as u64)
    })
}

/// `   1234 kB` → bytes.
fn parse_kib(s: &[u8]) -> Option<u64> {
    let digits = s.trim_ascii_start();
    let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    if n == 0 {
        return None;
    }
    let kib = digits[..n]
        .iter()
        .fold(0u64, |acc, &b| acc * 10 + (b - b'0') as u64);
    Some(kib << 10)
}

/// The system's page size.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as u64
    } else {
        4096
    }
}

/// Pages `mincore` looks at per call (its vector lives on the stack).
const MINCORE_WINDOW: usize = 4096;

/// Call `f` with `mincore`'s answer for the pages of `[start, end)`
/// (page-aligned), a window at a time. `false` if a call failed (the range
/// was unmapped meanwhile).
fn mincore_windows(start: u64, end: u64, page: u64, mut f: impl FnMut(&[u8])) -> bool {
    let mut vec = [0u8; MINCORE_WINDOW];
    let pages = (end.saturating_sub(start) / page) as usize;
    for first in (0..pages).step_by(MINCORE_WINDOW) {
        let n = (pages - first).min(MINCORE_WINDOW);
        let at = start + first as u64 * page;
        #[cfg(target_os = "linux")]
        // SAFETY: mincore reads no memory of ours but `vec`, into which it
        // writes one byte per page of the range: `n` ≤ its length. A range
        // not (or no longer) mapped is an error, not a fault.
        let rc =
            unsafe { libc::mincore(at as *mut libc::c_void, n * page as usize, vec.as_mut_ptr()) };
        #[cfg(not(target_os = "linux"))]
        let rc = {
            let _ = at;
            -1
        };
        if rc != 0 {
            return false;
        }
        f(&vec[..n]);
    }
    true
}

/// Resident bytes among the whole pages of `[start, end)` (0 if the range
/// is not mapped).
fn resident_bytes(start: u64, end: u64, page: u64) -> u64 {
    let (s, e) = (start.div_ceil(page) * page, end / page * page);
    let mut resident = 0;
    let ok = mincore_windows(s, e, page, |v| {
        resident += v.iter().filter(|&&b| b & 1 != 0).count() as u64;
    });
    if ok {
        resident * page
    } else {
        0
    }
}

/// glibc's chunk flags: mapped on its own; `PREV_INUSE` and `NON_MAIN_ARENA`
/// are never set on such a chunk.
const IS_MMAPPED: u64 = 0x2;
const CHUNK_FLAGS: u64 = 0x7;

/// Walk the blocks glibc mapped on their own from `start`: each begins with
/// its chunk header (`prev_size` 0, `size` with only `IS_MMAPPED` among the
/// flags, a whole number of pages, inside the mapping). At most `limit`
/// blocks. Returns (blocks, their bytes, their resident bytes, where the
/// walk stopped).
fn mapped_blocks(start: u64, end: u64, limit: u64, page: u64) -> (u64, u64, u64, u64) {
    let (mut blocks, mut bytes, mut resident, mut at) = (0, 0, 0, start);
    while blocks < limit && at + page <= end {
        // A block's first page holds its header, written when it was
        // mapped: a page not resident is no block (and reading it would
        // fault it in).
        if resident_bytes(at, at + page, page) == 0 {
            break;
        }
        let Some([prev_size, size]) = peek(at) else {
            break;
        };
        let len = size & !CHUNK_FLAGS;
        if prev_size != 0
            || size & CHUNK_FLAGS != IS_MMAPPED
            || len == 0
            || len % page != 0
            || len > end - at
        {
            break;
        }
        blocks += 1;
        bytes += len;
        resident += resident_bytes(at, at + len, page);
        at += len;
    }
    (blocks, bytes, resident, at)
}

/// The two words at `at`, read with `process_vm_readv` on ourselves: memory
/// another thread may unmap meanwhile, which fails the call instead of
/// faulting.
#[cfg(target_os = "linux")]
fn peek(at: u64) -> Option<[u64; 2]> {
    let mut words = [0u64; 2];
    let local = libc::iovec {
        iov_base: words.as_mut_ptr().cast(),
        iov_len: std::mem::size_of_val(&words),
    };
    let remote = libc::iovec {
        iov_base: at as *mut libc::c_void,
        iov_len: std::mem::size_of_val(&words),
    };
    // SAFETY: the kernel writes at most `local.iov_len` bytes into `words`
    // and reads the remote range through the page tables, failing (not
    // faulting) where it is not mapped.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == local.iov_len as isize).then_some(words)
}

#[cfg(not(target_os = "linux"))]
fn peek(_at: u64) -> Option<[u64; 2]> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(text: &str) -> Mappings {
        let mut w = Walk {
            out: Mappings::default(),
            cur: None,
            prev: None,
            blocks_left: 0,
            page: 4096,
        };
        for line in text.lines() {
            w.line(line.as_bytes());
        }
        w.finish();
        w.out
    }

    /// Made-up addresses (nothing is mapped there: mincore and the peek
    /// fail, and count nothing).
    const SMAPS: &str = "\
5500000000-5500001000 r-xp 00000000 fe:00 123    /usr/bin/server
Rss:                   4 kB
VmFlags: rd ex mr mw me
5500100000-5500300000 rw-p 00000000 00:00 0      [heap]
Rss:                2048 kB
VmFlags: rd wr mr mw me ac
7f0000000000-7f0000800000 rw-p 00000000 00:00 0
Rss:                 100 kB
VmFlags: rd wr mr mw me nr
7f0000800000-7f0004000000 ---p 00000000 00:00 0
Rss:                   0 kB
VmFlags: mr mw me nr
7f1000000000-7f1000001000 ---p 00000000 00:00 0
Rss:                   0 kB
VmFlags: mr mw me
7f1000001000-7f1000201000 rw-p 00000000 00:00 0
Rss:                  16 kB
VmFlags: rd wr mr mw me ac nh
7f2000000000-7f2000100000 rw-p 00000000 00:00 0
Rss:                  12 kB
VmFlags: rd wr mr mw me ac nr
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                  20 kB
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0                          [vdso]
Rss:                   8 kB
";

    #[test]
    fn each_mapping_goes_to_its_class() {
        let m = walk(SMAPS);
        assert_eq!(m.files, 4 << 10);
        assert_eq!(m.malloc, (2048 + 100) << 10, "[heap] and the arena heap");
        assert_eq!((m.heap_len, m.heap_rss), (0x200000, 2048 << 10));
        assert_eq!((m.arena_rw, m.arena_rss), (0x800000, 100 << 10));
        assert_eq!(
            m.stacks,
            (16 + 20) << 10,
            "a guarded thread stack and [stack]"
        );
        assert_eq!(m.other, (12 + 8) << 10, "an unguarded mapping and [vdso]");
        assert_eq!(m.total, m.files + m.malloc + m.stacks + m.other);
    }

    #[test]
    fn a_missing_file_reads_as_none() {
        assert_eq!(read_mappings_at(c"/nonexistent/smaps", 0), None);
    }

    #[test]
    fn field_lines_are_not_headers() {
        for line in [
            "Anonymous:    0 kB",
            "FilePmdMapped: 0 kB",
            "VmFlags: rd",
            "",
        ] {
            assert!(parse_header(line.as_bytes()).is_none(), "{line}");
        }
        let v = parse_header(b"7f00-7f10 rw-s 00000000 00:01 42 /memfd:x (deleted)").unwrap();
        assert_eq!((v.start, v.end, v.kind), (0x7f00, 0x7f10, Kind::File));
    }

    #[test]
    fn this_process_reads_back_whole() {
        let m = read_mappings(u64::MAX).expect("/proc/self/smaps");
        assert!(m.files > 0 && m.stacks > 0, "{m:?}");
        assert_eq!(m.total, m.files + m.malloc + m.stacks + m.other);
    }
}
