//! "Which CPU am I on?" — the id sources and the hot-path read.
//!
//! The source is chosen once per process, best first:
//!
//! 1. [`CpuIdSource::GlibcRseq`]: the rseq area glibc registered for every
//!    thread (one load through the thread pointer);
//! 2. [`CpuIdSource::OwnRseq`]: where glibc did not register (old glibc, musl,
//!    `GLIBC_TUNABLES=glibc.pthread.rseq=0`), an area splitcount registers per
//!    thread on first use;
//! 3. [`CpuIdSource::SchedGetcpu`]: `sched_getcpu()` (vDSO or system call);
//! 4. [`CpuIdSource::ThreadIndex`]: on systems without any of these, a stable
//!    per-thread index (threads then spread over the "CPUs" round-robin).
//!
//! The environment variable `SPLITCOUNT_CPU_ID_SOURCE` (`glibc-rseq`,
//! `own-rseq`, `sched-getcpu`, `thread-index`) forces a source, for tests and
//! benchmarks; a forced source that is not available here falls further down
//! the list.
//!
//! **Signal handlers and [`CpuIdSource::OwnRseq`].** Where splitcount
//! registers the areas itself, a thread's first use registers its area and
//! arms a thread-exit destructor that unregisters it (needed: a library's
//! thread-local memory may be freed before the thread is gone). Arming the
//! destructor may allocate, which is not async-signal-safe, so the first
//! splitcount operation of a thread must not be in a signal handler: call
//! [`current_cpu`] once at thread start in programs whose handlers update
//! splitcount counters. Under glibc's registration (the common case) nothing
//! is registered and handlers may use splitcount from the first operation.

#![allow(unsafe_code)]

use super::topology::Topology;
use std::sync::atomic::{AtomicIsize, AtomicU8, AtomicUsize, Ordering::Relaxed};

#[cfg(target_os = "linux")]
use super::rseq;
pub use super::rseq::RseqOwner;

/// Where the current CPU id comes from. See the module docs for the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
#[non_exhaustive]
pub enum CpuIdSource {
    /// The rseq area glibc registered for the thread.
    GlibcRseq,
    /// An rseq area splitcount registered for the thread.
    OwnRseq,
    /// `sched_getcpu()`.
    SchedGetcpu,
    /// A stable per-thread index (no CPU id is available on this system).
    ThreadIndex,
}

impl CpuIdSource {
    /// The name used in JSON output and in `SPLITCOUNT_CPU_ID_SOURCE`.
    pub fn name(self) -> &'static str {
        match self {
            CpuIdSource::GlibcRseq => "glibc-rseq",
            CpuIdSource::OwnRseq => "own-rseq",
            CpuIdSource::SchedGetcpu => "sched-getcpu",
            CpuIdSource::ThreadIndex => "thread-index",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [
            CpuIdSource::GlibcRseq,
            CpuIdSource::OwnRseq,
            CpuIdSource::SchedGetcpu,
            CpuIdSource::ThreadIndex,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }

    fn from_mode(mode: u8) -> Self {
        match mode {
            GLIBC => CpuIdSource::GlibcRseq,
            OWN => CpuIdSource::OwnRseq,
            GETCPU => CpuIdSource::SchedGetcpu,
            _ => CpuIdSource::ThreadIndex,
        }
    }
}

const UNDECIDED: u8 = 0;
const GLIBC: u8 = 1;
const OWN: u8 = 2;
const GETCPU: u8 = 3;
const THREAD_INDEX: u8 = 4;

/// The chosen source. Written once by `decide` (racing deciders compute the
/// same answer), read with relaxed loads: it is a plain configuration value
/// that orders nothing else.
static MODE: AtomicU8 = AtomicU8::new(UNDECIDED);
/// glibc's `__rseq_offset` once the source is decided to be glibc's area;
/// [`NO_OFFSET`] otherwise. Checked first on the hot path: one load decides.
static GLIBC_OFFSET: AtomicIsize = AtomicIsize::new(NO_OFFSET);
const NO_OFFSET: isize = isize::MIN;

#[cold]
fn decide() -> u8 {
    let wanted = std::env::var("SPLITCOUNT_CPU_ID_SOURCE")
        .ok()
        .and_then(|s| CpuIdSource::from_name(s.trim()));
    let mode = pick(wanted);
    MODE.store(mode, Relaxed);
    mode
}

#[cfg(target_os = "linux")]
fn pick(wanted: Option<CpuIdSource>) -> u8 {
    let rank = |s: CpuIdSource| s as u8;
    let from = wanted.map(rank).unwrap_or(0);
    if from <= rank(CpuIdSource::GlibcRseq) {
        if let Some(off) = rseq::glibc_offset() {
            if let Some(area) = rseq::glibc_area(off) {
                // SAFETY: glibc registered an area of at least 8 bytes at
                // this offset from the thread pointer for every thread.
                let id = unsafe { rseq::read_field(area, rseq::CPU_ID_OFFSET) };
                if id < rseq::CPU_ID_REGISTRATION_FAILED {
                    GLIBC_OFFSET.store(off, Relaxed);
                    return GLIBC;
                }
            }
        }
    }
    // Registering our own area fails with EBUSY where glibc holds one: that
    // is why a forced `own-rseq` under glibc's registration falls through.
    if from <= rank(CpuIdSource::OwnRseq)
        && rseq::glibc_offset().is_none()
        && rseq::can_register_own()
    {
        return OWN;
    }
    if from <= rank(CpuIdSource::SchedGetcpu) && sched_getcpu().is_some() {
        return GETCPU;
    }
    THREAD_INDEX
}

#[cfg(not(target_os = "linux"))]
fn pick(_wanted: Option<CpuIdSource>) -> u8 {
    THREAD_INDEX
}

#[inline(always)]
fn mode() -> u8 {
    match MODE.load(Relaxed) {
        UNDECIDED => decide(),
        m => m,
    }
}

/// The source [`current_cpu_id`] reads from in this process.
pub fn cpu_id_source() -> CpuIdSource {
    CpuIdSource::from_mode(mode())
}

/// Who registered the rseq area this process reads, if any.
pub fn rseq_owner() -> RseqOwner {
    match mode() {
        GLIBC => RseqOwner::Glibc,
        OWN => RseqOwner::Splitcount,
        _ => RseqOwner::None,
    }
}

/// glibc's `__rseq_offset` when glibc's areas are the source: every
/// thread's area is then at this offset from its thread pointer (`fs`), so
/// a critical section can address it as `fs:[offset + field]` with the
/// offset kept beside the data (no global load on the hot path).
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
pub(crate) fn glibc_fs_offset() -> Option<isize> {
    if mode() != GLIBC {
        return None;
    }
    match GLIBC_OFFSET.load(Relaxed) {
        NO_OFFSET => None,
        offset => Some(offset),
    }
}

/// The calling thread's rseq area, whoever registered it.
#[cfg(target_os = "linux")]
#[inline(always)]
pub(crate) fn area() -> Option<*const u8> {
    match GLIBC_OFFSET.load(Relaxed) {
        NO_OFFSET => area_other(),
        offset => rseq::glibc_area(offset),
    }
}

/// [`area`] when glibc's area is not (or not yet known to be) the source.
#[cfg(target_os = "linux")]
#[inline(never)]
fn area_other() -> Option<*const u8> {
    match mode() {
        GLIBC => rseq::glibc_area(GLIBC_OFFSET.load(Relaxed)),
        OWN => rseq::own_area(),
        _ => None,
    }
}

/// The kernel id of the CPU the calling thread runs on (possibly sparse; see
/// [`current_cpu`] for the dense index). A hint: the thread may migrate
/// right after the read.
#[inline]
pub fn current_cpu_id() -> u32 {
    #[cfg(target_os = "linux")]
    if let Some(id) = rseq_cpu_id() {
        return id;
    }
    slow_cpu_id()
}

#[cold]
fn slow_cpu_id() -> u32 {
    if mode() != THREAD_INDEX {
        if let Some(id) = sched_getcpu() {
            return id;
        }
    }
    thread_index() as u32
}

/// The dense index (`0..Topology::host().cpus()`) of the CPU the calling
/// thread runs on. Never out of range: an id the topology does not know
/// (a CPU hot-added after start-up) folds modulo the CPU count.
///
/// ```
/// let cpu = splitcount::cpu::current_cpu();
/// assert!(cpu < splitcount::cpu::Topology::host().cpus());
/// ```
#[inline]
pub fn current_cpu() -> usize {
    let id = current_cpu_id();
    let topo = Topology::host();
    match topo.dense_index(id) {
        Some(d) => d,
        None => id as usize % topo.cpus(),
    }
}

/// The CPU id read from the calling thread's rseq area, or `None` where no
/// rseq area is in use.
#[inline]
pub fn rseq_cpu_id() -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        let area = area()?;
        // SAFETY: `area` is the calling thread's registered area.
        let id = unsafe { rseq::read_field(area, rseq::CPU_ID_OFFSET) };
        (id < rseq::CPU_ID_REGISTRATION_FAILED).then_some(id)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// Whether the kernel publishes the rseq concurrency id (`mm_cid`, Linux
/// ≥ 6.3) and this process reads an rseq area.
pub fn mm_cid_available() -> bool {
    #[cfg(target_os = "linux")]
    {
        static HAS: AtomicU8 = AtomicU8::new(0);
        match HAS.load(Relaxed) {
            0 => {
                let yes = rseq::kernel_has_mm_cid() && area().is_some();
                HAS.store(if yes { 2 } else { 1 }, Relaxed);
                yes
            }
            v => v == 2,
        }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// The calling thread's concurrency id: a small per-process number, below
/// the number of threads that run concurrently (and below the CPU count),
/// that the kernel (≥ 6.3) keeps stable while the thread runs. `None` where
/// [`mm_cid_available`] is false.
#[inline]
pub fn mm_cid() -> Option<u32> {
    #[cfg(target_os = "linux")]
    if mm_cid_available() {
        let area = area()?;
        // SAFETY: `area` is the calling thread's registered area and the
        // kernel's feature size covers `mm_cid`.
        return Some(unsafe { rseq::read_field(area, rseq::MM_CID_OFFSET) });
    }
    None
}

/// `sched_getcpu()`, or `None` where it fails or does not exist.
pub fn sched_getcpu() -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: no preconditions.
        let id = unsafe { libc::sched_getcpu() };
        (id >= 0).then_some(id as u32)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The raw `getcpu` system call (no vDSO), or `None` where it fails. Only
/// useful as the benchmark's baseline.
pub fn getcpu_syscall() -> Option<u32> {
    #[cfg(target_os = "linux")]
    {
        let mut cpu: u32 = 0;
        // SAFETY: getcpu writes one u32 through the first pointer and accepts
        // null for the node and cache arguments.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_getcpu,
                &mut cpu as *mut u32,
                std::ptr::null_mut::<u32>(),
                std::ptr::null_mut::<u8>(),
            )
        };
        (rc == 0).then_some(cpu)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// A stable index for the calling thread, assigned on first use
/// (0, 1, 2, ... in order of first call), folded into the CPU count.
pub fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static INDEX: usize = NEXT.fetch_add(1, Relaxed));
    let i = INDEX.try_with(|i| *i).unwrap_or(0);
    i % Topology::host().cpus()
}
