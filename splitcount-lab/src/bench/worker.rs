//! Worker processes: a suite whose cases need a global allocator of their
//! own (`alloc`, `async`, `noisy`, `preload`) runs each allocator in a
//! process of its own — the lab binary itself (`splitcount-lab
//! alloc-worker`, hidden) started with [`crate::alloc_switch::ENV`] naming
//! its global allocator — driven over its standard input and output, one
//! JSON line each way per slice:
//!
//! ```text
//!  worker → lab   {"allocator":"accounted","document_bytes":2097201,…}    once, when ready
//!  lab → worker   {"suite":"alloc","job":"small","threads":2,"spec":{…}}  run one slice
//!  worker → lab   {"Ok":{"threads":[…],"pinned":[0,1]}}  or  {"Err":"…"}
//! ```
//!
//! The workers live for the whole suite, so the rounds interleave the
//! allocators slice by slice, as for any other cases.
//!
//! This module is the protocol and the lab's side; it knows no suite. A
//! suite names itself and sends its own case (`job`, any serializable
//! value); what runs it in the worker is [`super::jobs`], the one module
//! that knows every suite's slices. So the suites depend on this module
//! and `jobs` on them, and nothing back.

use super::alloc::workloads;
use crate::alloc_switch::{self, Allocator, ENV};
use crate::timing::slice::{SliceRun, SliceSpec};
use serde::{Deserialize, Serialize};
use splitcount::group::{Group, Hierarchy};
use std::alloc::Layout;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// What a worker says once it is ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The allocator its process runs on.
    pub allocator: Allocator,
    /// Size of its JSON document.
    pub document_bytes: usize,
    /// Resident bytes per 24-byte `Box` over [`BOXES`] held at once, in a
    /// group (`None`: no `/proc/self/statm`).
    pub box_bytes: Option<f64>,
    /// Resident bytes per block of the size [`BLOCK_RSS_ENV`] names (one
    /// of [`BLOCK_SIZES`], or of [`ALIGNED_BLOCKS`] with its alignment),
    /// [`blocks_at`] its alignment (of [`BLOCK_COUNT_ENV`]'s count) held at
    /// once in a group — measured
    /// first thing, only when the worker is started with it set (`bench
    /// alloc` starts one such worker per allocator and size just for
    /// this: its other figures then come after memory it freed); empty
    /// otherwise.
    #[serde(default)]
    pub block_bytes: Vec<f64>,
}

/// The block sizes whose resident bytes a worker measures when asked.
pub const BLOCK_SIZES: [usize; 16] = [
    8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128,
];

/// How many blocks [`Hello::block_bytes`] holds unless
/// [`BLOCK_COUNT_ENV`] says otherwise.
pub const BLOCKS: usize = 1_000_000;

/// The environment variable that sets how many blocks of a size
/// [`Hello::block_bytes`] holds (1,000 to 10,000,000; default [`BLOCKS`]):
/// a quick report holds fewer.
pub const BLOCK_COUNT_ENV: &str = "SPLITCOUNT_LAB_BLOCK_COUNT";

/// The over-aligned layouts, `(size, align)`, whose resident bytes a worker
/// measures when asked: a 16-aligned value (`u128`, SSE), a cache line
/// (`#[repr(align(64))]`), a small page-aligned buffer
/// (`posix_memalign(4096, 100)`'s shape) and a page-aligned page (a Rust
/// type's size is a multiple of its alignment: `#[repr(align(4096))]`).
pub const ALIGNED_BLOCKS: [(usize, usize); 4] = [(16, 16), (64, 64), (100, 4096), (4096, 4096)];

/// How many blocks of alignment `align` [`Hello::block_bytes`] holds when
/// asked for `blocks` of a size: that many, or a 50th of them of a page's
/// alignment (20,000 of 1,000,000: 80 MB alone).
pub fn blocks_at(align: usize, blocks: usize) -> usize {
    if align >= 4096 {
        (blocks / 50).max(1)
    } else {
        blocks
    }
}

/// The value of [`BLOCK_RSS_ENV`] that asks for blocks of `size` bytes at
/// alignment `align` (`"24"` at 8 and below, `"64@64"` above).
pub fn block_rss_request(size: usize, align: usize) -> String {
    if align <= 8 {
        size.to_string()
    } else {
        format!("{size}@{align}")
    }
}

/// The `(size, align)` a [`BLOCK_RSS_ENV`] value asks for, if it is one of
/// [`BLOCK_SIZES`] (at 8) or [`ALIGNED_BLOCKS`].
fn parse_block_rss(v: &str) -> Option<(usize, usize)> {
    let (size, align) = match v.split_once('@') {
        Some((s, a)) => (s.parse().ok()?, a.parse().ok()?),
        None => (v.parse().ok()?, 8),
    };
    (BLOCK_SIZES.contains(&size) && align == 8 || ALIGNED_BLOCKS.contains(&(size, align)))
        .then_some((size, align))
}

/// The environment variable that asks a worker for [`Hello::block_bytes`]
/// of a size (its value, e.g. `24`), or of an aligned layout (`64@64`: see
/// [`block_rss_request`]).
pub const BLOCK_RSS_ENV: &str = "SPLITCOUNT_LAB_BLOCK_RSS";

/// The environment variable that tells a worker to skip
/// [`Hello::box_bytes`] (a worker started again for a new round: the first
/// one measured it).
pub const NO_BOXES_ENV: &str = "SPLITCOUNT_LAB_NO_BOXES";

/// Whether a worker's memory may be backed by transparent huge pages.
///
/// mimalloc asks for them (`madvise(MADV_HUGEPAGE)` on its arenas, which a
/// kernel in `madvise` mode grants), and then the resident set grows 2 MiB
/// at a time: at [`BLOCKS`] blocks of 8 bytes (8 MB), where a run starts in
/// a huge page decides a whole page more or less, ±25% — noise as large as
/// what [`Hello::block_bytes`] is there to tell apart. With them off, a
/// block's resident bytes are what its allocator gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugePages {
    /// As the allocator asks for them (and the kernel's setting grants).
    AsAsked,
    /// None, whatever the allocator asks (`PR_SET_THP_DISABLE`, Linux).
    Off,
}

impl HugePages {
    /// Both settings, in the order `bench alloc` reports them.
    pub const ALL: [HugePages; 2] = [HugePages::Off, HugePages::AsAsked];
}

/// How many boxes [`Hello::box_bytes`] holds.
pub const BOXES: usize = 1_000_000;

/// Resident bytes per 24-byte box, [`BOXES`] of them held at once (the
/// vector of their addresses touched before the first reading, so only the
/// boxes count), then freed.
fn box_bytes() -> Option<f64> {
    // Non-zero: a zeroed vector may be untouched pages (calloc) until written.
    let mut boxes = vec![1usize; BOXES];
    let before = crate::bench::groups::rss_bytes()?;
    for b in boxes.iter_mut() {
        *b = Box::into_raw(Box::new([1u8; 24])) as usize;
    }
    let after = crate::bench::groups::rss_bytes()?;
    for b in boxes {
        // SAFETY: made by `Box::into_raw` above, freed once.
        drop(unsafe { Box::from_raw(b as *mut [u8; 24]) });
    }
    Some(after.saturating_sub(before) as f64 / BOXES as f64)
}

/// One slice to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The suite whose case it is (its `SUITE` constant).
    pub suite: String,
    /// The case, as the suite serializes it.
    pub job: serde_json::Value,
    /// On how many threads.
    pub threads: usize,
    /// For how long, in batches of how many.
    pub spec: SliceSpec,
}

impl Request {
    /// A slice of `suite`'s case `job` on `threads` threads.
    pub fn new(
        suite: &str,
        job: &impl Serialize,
        threads: usize,
        spec: SliceSpec,
    ) -> Result<Request, String> {
        Ok(Request {
            suite: suite.to_owned(),
            job: serde_json::to_value(job).map_err(|e| e.to_string())?,
            threads,
            spec,
        })
    }

    /// The case, as the suite's type.
    pub fn job<T: for<'de> Deserialize<'de>>(&self) -> Result<T, String> {
        serde_json::from_value(self.job.clone())
            .map_err(|e| format!("not a {} case: {}: {e}", self.suite, self.job))
    }
}

/// What a worker's slices run in: a group per thread (each under
/// `/bench`), and the allocator suite's JSON document.
#[derive(Debug)]
pub struct Context {
    /// One group per thread, `/bench/t0`, `/bench/t1`, … (up to
    /// [`MAX_THREADS`]).
    pub groups: Vec<Group>,
    /// The document of the allocator suite's `json` workload.
    pub doc: String,
}

/// Groups the worker's threads allocate in (one per thread).
const GROUPS: usize = MAX_THREADS;

/// The most threads a worker's allocator slice runs on, each in a group of
/// its own (`bench alloc` and `bench preload` refuse more up front).
pub const MAX_THREADS: usize = 16;

/// `threads` if a worker can run each count, else an error naming `suite`.
pub fn check_threads(suite: &str, threads: &[usize]) -> Result<(), String> {
    match threads.iter().find(|&&t| t > MAX_THREADS) {
        None => Ok(()),
        Some(t) => Err(format!(
            "`bench {suite}` runs at most {MAX_THREADS} threads (its worker process has a group \
             per thread), not {t}"
        )),
    }
}

/// Resident bytes per block of `size` at alignment `align`, as a `Box` of
/// that layout asks for them: the growth of the resident set while
/// [`blocks_at`] of them are made, then all are freed. One size per
/// process: in one process after another size, a size's blocks land in
/// pages the last size's bookkeeping had touched already, or not, by ±20%
/// on mimalloc. Empty without `/proc/self/statm`.
fn block_bytes(size: usize, align: usize, blocks: usize) -> Vec<f64> {
    let layout = Layout::from_size_align(size, align).expect("small sizes");
    let count = blocks_at(align, blocks);
    // Non-zero: a zeroed vector may be untouched pages until written.
    let mut blocks = vec![1usize; count];
    let Some(before) = crate::bench::groups::rss_bytes() else {
        return Vec::new();
    };
    for b in blocks.iter_mut() {
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: `p` has `size` bytes: touch the block as a program would.
        unsafe { p.write_bytes(1, size) };
        *b = p as usize;
    }
    let after = crate::bench::groups::rss_bytes();
    for b in blocks {
        // SAFETY: allocated above with `layout`, freed once.
        unsafe { std::alloc::dealloc(b as *mut u8, layout) };
    }
    after
        .map(|after| vec![after.saturating_sub(before) as f64 / count as f64])
        .unwrap_or_default()
}

/// What runs one slice of a request in the worker ([`super::jobs::run`]).
pub type Dispatch = fn(&Request, &Context) -> Result<SliceRun, String>;

/// Serve requests from `input` until it ends: the body of
/// `splitcount-lab alloc-worker`, each slice run by `dispatch`. On an
/// accounted allocator, attaches it to a hierarchy first, so every
/// thread's allocations are charged to its group.
pub fn serve(
    input: impl BufRead,
    mut output: impl Write,
    dispatch: Dispatch,
) -> Result<(), String> {
    let memory = Hierarchy::default();
    if alloc_switch::current().is_accounted() {
        alloc_switch::attach(&memory)?;
    }
    let bench = memory.root().child("bench").map_err(|e| e.to_string())?;
    let groups: Vec<Group> = (0..GROUPS)
        .map(|t| bench.child(&format!("t{t}")).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    for g in &groups {
        alloc_switch::give_heap(g)?;
    }
    // First, when asked: memory freed before (the document's, the boxes')
    // would be reused by the blocks and hide what they take.
    let asked = std::env::var(BLOCK_RSS_ENV).ok();
    let block_bytes = match asked.as_deref().and_then(parse_block_rss) {
        Some((size, align)) => {
            let blocks = std::env::var(BLOCK_COUNT_ENV)
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|n| (1_000..=10_000_000).contains(n))
                .unwrap_or(BLOCKS);
            let _scope = groups[0].enter();
            block_bytes(size, align, blocks)
        }
        None => Vec::new(),
    };
    let doc = workloads::json_document(workloads::JSON_BYTES);
    let io = |e: std::io::Error| format!("alloc worker: {e}");
    let box_bytes = match std::env::var_os(NO_BOXES_ENV) {
        Some(_) => None,
        None => {
            let _scope = groups[0].enter();
            box_bytes()
        }
    };
    let hello = Hello {
        allocator: alloc_switch::current(),
        document_bytes: doc.len(),
        box_bytes,
        block_bytes,
    };
    writeln!(output, "{}", json(&hello)?).map_err(io)?;
    output.flush().map_err(io)?;
    let context = Context { groups, doc };
    for line in input.lines() {
        let line = line.map_err(io)?;
        let reply: Result<SliceRun, String> = serde_json::from_str::<Request>(&line)
            .map_err(|e| format!("bad request {line:?}: {e}"))
            .and_then(|r| dispatch(&r, &context));
        writeln!(output, "{}", json(&reply)?).map_err(io)?;
        output.flush().map_err(io)?;
    }
    Ok(())
}

fn json(v: &impl Serialize) -> Result<String, String> {
    serde_json::to_string(v).map_err(|e| e.to_string())
}

/// The lab's handle on a worker process.
#[derive(Debug)]
pub struct Worker {
    allocator: Allocator,
    /// What it said when ready.
    pub hello: Option<Hello>,
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Worker {
    /// Start the lab binary `exe` as a worker on `allocator`, and wait until
    /// it is ready (and runs on the allocator asked for).
    pub fn start(exe: &std::path::Path, allocator: Allocator) -> Result<Worker, String> {
        Worker::start_with_env(exe, allocator, &[])
    }

    /// [`Worker::start`] with more environment variables (`bench ffi`
    /// starts one with `LD_PRELOAD`).
    pub fn start_with_env(
        exe: &std::path::Path,
        allocator: Allocator,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Worker, String> {
        Worker::start_with(exe, allocator, env, HugePages::AsAsked)
    }

    /// [`Worker::start_with_env`], with transparent huge pages as `pages`
    /// says.
    pub fn start_with(
        exe: &std::path::Path,
        allocator: Allocator,
        env: &[(&str, &std::ffi::OsStr)],
        pages: HugePages,
    ) -> Result<Worker, String> {
        let mut command = Command::new(exe);
        command
            .arg("alloc-worker")
            .env(ENV, allocator.name())
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if pages == HugePages::Off {
            #[cfg(target_os = "linux")]
            {
                use std::os::unix::process::CommandExt;
                // SAFETY: the closure runs in the child between `fork` and
                // `exec` and only makes a system call (async-signal-safe),
                // touching no memory of the parent's.
                unsafe {
                    command.pre_exec(|| {
                        // The flag is kept across `exec`: no huge page for
                        // any mapping of the worker, `madvise` or not.
                        if libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    })
                };
            }
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot start {} alloc-worker: {e}", exe.display()))?;
        let (Some(input), Some(output)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("alloc worker without pipes".into());
        };
        let mut w = Worker {
            allocator,
            hello: None,
            child,
            input: Some(input),
            output: BufReader::new(output),
        };
        let hello: Hello = w.read()?;
        if hello.allocator != allocator {
            return Err(format!(
                "the {} worker runs on the {} allocator",
                allocator.name(),
                hello.allocator.name()
            ));
        }
        w.hello = Some(hello);
        super::preloaded::check(w.child.id(), env)?;
        Ok(w)
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Run one slice in the worker.
    pub fn run(&mut self, request: &Request) -> Result<SliceRun, String> {
        let line = json(request)?;
        let input = self
            .input
            .as_mut()
            .ok_or("the alloc worker's input is closed")?;
        writeln!(input, "{line}")
            .and_then(|()| input.flush())
            .map_err(|e| format!("{} worker: {e}", self.allocator.name()))?;
        self.read::<Result<SliceRun, String>>()?
    }

    fn read<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T, String> {
        let mut line = String::new();
        let name = self.allocator.name();
        match self.output.read_line(&mut line) {
            Ok(0) => Err(format!("the {name} alloc worker exited")),
            Ok(_) => {
                serde_json::from_str(&line).map_err(|e| format!("{name} worker said {line:?}: {e}"))
            }
            Err(e) => Err(format!("{name} worker: {e}")),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing its input ends the worker's loop; the kill only matters
        // if it is stuck in a slice. Then reap it.
        drop(self.input.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::alloc::Workload;
    use std::time::Duration;

    #[test]
    fn a_worker_greets_then_answers_each_request_with_a_slice() {
        let spec = SliceSpec {
            length: Duration::from_millis(3),
            batch: 1,
        };
        let request = Request::new(workloads::SUITE, &Workload::Small, 1, spec).unwrap();
        let input = format!("{}\nnot json\n", json(&request).unwrap());
        let mut output = Vec::new();
        serve(input.as_bytes(), &mut output, crate::bench::jobs::run).unwrap();
        let lines: Vec<&str> = std::str::from_utf8(&output).unwrap().lines().collect();
        assert_eq!(lines.len(), 3);
        let hello: Hello = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(
            hello.allocator,
            Allocator::System,
            "unit tests run on System"
        );
        let slice: Result<SliceRun, String> = serde_json::from_str(lines[1]).unwrap();
        assert!(slice.unwrap().threads[0].ops > 0);
        let bad: Result<SliceRun, String> = serde_json::from_str(lines[2]).unwrap();
        assert!(bad.unwrap_err().contains("bad request"));
    }
}
