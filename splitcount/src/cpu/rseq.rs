//! The rseq ("restartable sequences") area: where the kernel writes the
//! current CPU id, NUMA node and concurrency id of each thread on every return
//! to user space.
//!
//! glibc ≥ 2.35 registers one area per thread and exports its position as
//! `__rseq_offset` from the thread pointer (`__rseq_size` is 0 when glibc did
//! not register, e.g. under `GLIBC_TUNABLES=glibc.pthread.rseq=0`). A thread
//! can register only one area, so when glibc registered we *use* its area, and
//! only where it did not do we register our own, per thread, and unregister it
//! when the thread exits.
//!
//! Reading the CPU id then costs one load through the thread pointer. The value
//! is a hint: the thread can migrate right after reading it (callers must stay
//! correct if it does; see the `percpu` module).

#![allow(unsafe_code)]

/// The kernel's `struct rseq` (include/uapi/linux/rseq.h), 32-byte aligned.
/// Fields after `flags` exist since Linux 6.3; `AT_RSEQ_FEATURE_SIZE` tells
/// how many bytes the kernel fills.
#[repr(C, align(32))]
pub(crate) struct RseqAbi {
    pub(crate) cpu_id_start: u32,
    pub(crate) cpu_id: u32,
    pub(crate) rseq_cs: u64,
    pub(crate) flags: u32,
    pub(crate) node_id: u32,
    pub(crate) mm_cid: u32,
    _end: [u32; 1],
}

/// Byte offsets inside [`RseqAbi`] (used when the area is glibc's and we only
/// have its address).
pub(crate) const CPU_ID_OFFSET: usize = 4;
pub(crate) const MM_CID_OFFSET: usize = 24;
/// `offsetofend(struct rseq, mm_cid)`: the feature size that includes mm_cid.
const MM_CID_END: usize = 28;

/// `cpu_id` before registration (`RSEQ_CPU_ID_UNINITIALIZED`) or after a
/// failed one (`RSEQ_CPU_ID_REGISTRATION_FAILED`).
pub(crate) const CPU_ID_UNINITIALIZED: u32 = u32::MAX;
pub(crate) const CPU_ID_REGISTRATION_FAILED: u32 = u32::MAX - 1;

/// The signature word that must precede every abort handler; the same value
/// glibc and librseq use on x86, so our critical sections are valid under
/// glibc's registration.
pub(crate) const RSEQ_SIG: u32 = 0x5305_3053;

/// `AT_RSEQ_FEATURE_SIZE` auxiliary-vector entry (Linux ≥ 6.3).
const AT_RSEQ_FEATURE_SIZE: libc::c_ulong = 27;

/// Who registered the rseq area this process reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum RseqOwner {
    /// glibc registered it for every thread; we read its area.
    Glibc,
    /// glibc did not; splitcount registers an area per thread.
    Splitcount,
    /// No rseq area is usable (old kernel, non-Linux, or registration failed).
    None,
}

#[cfg(target_os = "linux")]
mod imp {
    use super::*;
    use std::cell::{Cell, UnsafeCell};

    /// Read the thread pointer (the TCB address glibc's `__rseq_offset` is
    /// relative to).
    #[inline(always)]
    pub(crate) fn thread_pointer() -> Option<usize> {
        #[cfg(target_arch = "x86_64")]
        {
            let tp: usize;
            // SAFETY: on x86_64 Linux `fs:0` holds the TCB's self-pointer (the
            // thread pointer); reading it has no side effects.
            unsafe {
                std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
            };
            Some(tp)
        }
        #[cfg(target_arch = "aarch64")]
        {
            let tp: usize;
            // SAFETY: reading TPIDR_EL0 is always allowed at EL0 and has no
            // side effects.
            unsafe {
                std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nostack, nomem, preserves_flags))
            };
            Some(tp)
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            None
        }
    }

    /// glibc's `__rseq_offset`, if glibc registered an area big enough to
    /// hold `cpu_id`. Looked up with `dlsym` so that binaries still load with
    /// a libc that lacks the symbols.
    pub(crate) fn glibc_offset() -> Option<isize> {
        // SAFETY: dlsym with a NUL-terminated name and RTLD_DEFAULT only reads
        // the dynamic symbol tables.
        let (off, size) = unsafe {
            (
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
                libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
            )
        };
        if off.is_null() || size.is_null() {
            return None;
        }
        // SAFETY: glibc defines `const ptrdiff_t __rseq_offset` and
        // `const unsigned int __rseq_size`, set before `main` and never
        // changed afterwards.
        let (off, size) = unsafe { (*(off as *const isize), *(size as *const u32)) };
        (size as usize >= CPU_ID_OFFSET + 4).then_some(off)
    }

    /// Address of glibc's area for the calling thread.
    #[inline(always)]
    pub(crate) fn glibc_area(offset: isize) -> Option<*const u8> {
        thread_pointer().map(|tp| tp.wrapping_add_signed(offset) as *const u8)
    }

    /// Load a `u32` field of an area the kernel may write at any moment.
    ///
    /// # Safety
    /// `area` must point to a live, registered (or registrable) rseq area of
    /// the calling thread and `offset` be a field offset inside it.
    #[inline(always)]
    pub(crate) unsafe fn read_field(area: *const u8, offset: usize) -> u32 {
        // SAFETY: the caller guarantees the address; the kernel writes the
        // field only on the way back to this very thread, so a volatile load
        // cannot tear.
        unsafe { std::ptr::read_volatile(area.add(offset) as *const u32) }
    }

    /// The kernel's rseq feature size (0 before Linux 6.3, where it is not
    /// reported; the original 20-byte ABI is then all there is).
    pub(crate) fn feature_size() -> usize {
        // SAFETY: getauxval has no preconditions.
        unsafe { libc::getauxval(AT_RSEQ_FEATURE_SIZE) as usize }
    }

    pub(crate) fn kernel_has_mm_cid() -> bool {
        feature_size() >= MM_CID_END
    }

    /// An area of our own, used only where glibc did not register one. It
    /// lives in static TLS (no destructor), so its memory outlives every TLS
    /// destructor of the thread.
    struct OwnArea(UnsafeCell<RseqAbi>);
    // SAFETY: each thread only touches its own instance.
    unsafe impl Sync for OwnArea {}

    const UNREGISTERED: u8 = 0;
    const REGISTERED: u8 = 1;
    const FAILED: u8 = 2;
    const EXITING: u8 = 3;

    thread_local! {
        static OWN_AREA: OwnArea = const {
            OwnArea(UnsafeCell::new(RseqAbi {
                cpu_id_start: 0,
                cpu_id: CPU_ID_UNINITIALIZED,
                rseq_cs: 0,
                flags: 0,
                node_id: 0,
                mm_cid: 0,
                _end: [0],
            }))
        };
        static OWN_STATE: Cell<u8> = const { Cell::new(UNREGISTERED) };
        static OWN_GUARD: Unregister = const { Unregister };
    }

    /// Unregisters the thread's own area when the thread exits.
    struct Unregister;
    impl Drop for Unregister {
        fn drop(&mut self) {
            if OWN_STATE.with(|s| s.replace(EXITING)) == REGISTERED {
                OWN_AREA.with(|a| {
                    // SAFETY: unregistering the area this thread registered,
                    // with the same length and signature.
                    unsafe { rseq_syscall(a.0.get(), 1) };
                });
            }
        }
    }

    /// # Safety
    /// `area` must be the calling thread's area and stay valid until it is
    /// unregistered.
    unsafe fn rseq_syscall(area: *mut RseqAbi, flags: i32) -> libc::c_long {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            // SAFETY: forwarded from the caller.
            unsafe {
                libc::syscall(
                    libc::SYS_rseq,
                    area,
                    std::mem::size_of::<RseqAbi>() as u32,
                    flags,
                    RSEQ_SIG,
                )
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let _ = (area, flags);
            -1
        }
    }

    /// The calling thread's own area, registering it on first use. `None`
    /// when registration failed or the thread is exiting.
    #[inline]
    pub(crate) fn own_area() -> Option<*const u8> {
        match OWN_STATE.with(|s| s.get()) {
            REGISTERED => Some(OWN_AREA.with(|a| a.0.get() as *const u8)),
            UNREGISTERED => register_own(),
            _ => None,
        }
    }

    /// Not async-signal-safe: arming the thread-local guard registers a
    /// TLS destructor, for which glibc allocates. A thread's first per-CPU
    /// operation (where glibc did not register rseq) must not be in a
    /// signal handler that may interrupt `malloc`; once registered, the
    /// sequences are signal-safe.
    #[cold]
    fn register_own() -> Option<*const u8> {
        // Arm the destructor first: if the thread is already tearing down its
        // TLS, do not register an area nobody would unregister.
        if OWN_GUARD.try_with(|_| ()).is_err() {
            OWN_STATE.with(|s| s.set(EXITING));
            return None;
        }
        let area = OWN_AREA.with(|a| a.0.get());
        // SAFETY: `area` is this thread's static-TLS area; it stays valid
        // until the guard above unregisters it at thread exit.
        let rc = unsafe { rseq_syscall(area, 0) };
        let ok = rc == 0;
        OWN_STATE.with(|s| s.set(if ok { REGISTERED } else { FAILED }));
        ok.then_some(area as *const u8)
    }

    /// Try registering an area for the calling thread; used once at start-up
    /// to learn whether the kernel supports rseq when glibc did not register.
    pub(crate) fn can_register_own() -> bool {
        own_area().is_some()
    }
}

#[cfg(target_os = "linux")]
pub(crate) use imp::*;
