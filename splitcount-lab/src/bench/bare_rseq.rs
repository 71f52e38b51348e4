//! The floor of a per-CPU add: the smallest rseq critical section that adds
//! to the current CPU's slot, written here in the lab so that the library's
//! own path ([`splitcount::raw::percpu::PerCpu::add`]) and its counters have
//! something to be measured against.
//!
//! ```text
//!  arm:    rseq->rseq_cs = &descriptor
//!  start:  cpu = rseq->cpu_id
//!          if cpu ≥ slots: leave (the caller adds atomically elsewhere)
//!          slots[cpu] += delta        ; the commit: one instruction
//!  post:   …
//!  abort:  goto arm                   ; preempted, migrated or signalled
//! ```
//!
//! One slot per kernel CPU id, each on its own 128-byte line; the area is
//! the one glibc (≥ 2.35) registered for the thread, found as the thread
//! pointer plus `__rseq_offset`. No arena, no id translation, no overflow
//! bookkeeping: exactly what the library's path adds to is the difference
//! between it and this. Unavailable (`None`) off x86_64 Linux, or where
//! glibc did not register rseq.

use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicI64, Ordering};

/// Per-CPU slots added to by a bare rseq critical section.
#[derive(Debug)]
pub struct BareRseq {
    slots: Box<[CachePadded<AtomicI64>]>,
    /// Where adds from an id beyond `slots` go (never on this path in
    /// practice: ids are below the configured CPU count).
    overflow: CachePadded<AtomicI64>,
    offset: isize,
}

impl BareRseq {
    /// Slots for every configured CPU, if glibc registered rseq here.
    pub fn new() -> Option<BareRseq> {
        let offset = imp::glibc_rseq_offset()?;
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
        Some(BareRseq {
            slots: (0..cpus)
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect(),
            overflow: CachePadded::new(AtomicI64::new(0)),
            offset,
        })
    }

    /// Add `delta` to the calling CPU's slot.
    #[inline(always)]
    pub fn add(&self, delta: i64) {
        // The slots are atomics: writing through a pointer taken from a
        // shared reference is allowed (their bytes are in `UnsafeCell`s).
        let base = self.slots.as_ptr().cast::<i64>().cast_mut();
        // SAFETY: `offset` is glibc's `__rseq_offset`, found by `new` with
        // a registered area (`__rseq_size` ≥ 16); `slots` has `len` lines of
        // 128 bytes, only ever written by this section (or read atomically),
        // and the section only writes the one of the CPU it read.
        let done = unsafe { imp::add(self.offset, base, self.slots.len(), delta) };
        if !done {
            // Relaxed: a counter; nothing is published through it.
            self.overflow.fetch_add(delta, Ordering::Relaxed);
        }
    }

    /// The sum of every slot (exact once no add is in flight).
    pub fn sum(&self) -> i64 {
        // Relaxed: each slot is read once; a sum racing with adds is
        // approximate anyway.
        self.slots
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .sum::<i64>()
            + self.overflow.load(Ordering::Relaxed)
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::sync::OnceLock;

    const _: () = assert!(std::mem::size_of::<crossbeam_utils::CachePadded<i64>>() == 128);

    /// glibc's `__rseq_offset`, if glibc registered an rseq area.
    pub fn glibc_rseq_offset() -> Option<isize> {
        static OFFSET: OnceLock<Option<isize>> = OnceLock::new();
        *OFFSET.get_or_init(|| {
            // SAFETY: dlsym with NUL-terminated names and RTLD_DEFAULT only
            // reads the loaded objects' symbol tables.
            let (offset, size) = unsafe {
                (
                    libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()),
                    libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()),
                )
            };
            if offset.is_null() || size.is_null() {
                return None;
            }
            // SAFETY: glibc defines `const ptrdiff_t __rseq_offset` and
            // `const unsigned int __rseq_size`, set before `main`.
            let (offset, size) = unsafe { (*(offset as *const isize), *(size as *const u32)) };
            // `cpu_id` ends at byte 8 of the area; `rseq_cs` at 16.
            (size >= 16).then_some(offset)
        })
    }

    /// The critical section; false if the CPU id was not below `slots`.
    ///
    /// # Safety
    /// `offset` is glibc's `__rseq_offset` with an area registered for the
    /// calling thread; `base` points to `slots` lines of 128 bytes, each an
    /// `i64` only ever written by such sections (or read atomically).
    #[inline(always)]
    pub unsafe fn add(offset: isize, base: *mut i64, slots: usize, delta: i64) -> bool {
        let done: u64;
        // SAFETY: see the contract; the section writes only
        // `base + cpu·128` for `cpu < slots`, and the area's `rseq_cs`.
        unsafe {
            std::arch::asm!(
                ".pushsection __rseq_cs, \"aw\"",
                ".balign 32",
                "20:",
                ".long 0, 0",
                ".quad 22f, (23f - 22f), 24f",
                ".popsection",
                "mov {area}, qword ptr fs:[0]",
                "add {area}, {offset}",
                "21:",
                "lea {tmp}, [rip + 20b]",
                "mov qword ptr [{area} + 8], {tmp}",
                "22:",
                "mov {cpu:e}, dword ptr [{area} + 4]",
                "xor {done:e}, {done:e}",
                "cmp {cpu}, {slots}",
                "jae 25f",
                "shl {cpu}, 7",
                "add qword ptr [{base} + {cpu}], {delta}",
                "23:",
                "mov {done:e}, 1",
                "jmp 25f",
                ".byte 0x0f, 0xb9, 0x3d",
                ".long 0x53053053",
                "24:",
                "jmp 21b",
                "25:",
                offset = in(reg) offset,
                base = in(reg) base,
                slots = in(reg) slots,
                delta = in(reg) delta,
                area = out(reg) _,
                cpu = out(reg) _,
                tmp = out(reg) _,
                done = out(reg) done,
                options(nostack),
            );
        }
        done == 1
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    pub fn glibc_rseq_offset() -> Option<isize> {
        None
    }

    pub unsafe fn add(_offset: isize, _base: *mut i64, _slots: usize, _delta: i64) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_from_several_threads_are_all_counted() {
        let Some(bare) = BareRseq::new() else {
            eprintln!("glibc did not register rseq here: nothing to test");
            return;
        };
        std::thread::scope(|s| {
            for t in 0..4 {
                let bare = &bare;
                s.spawn(move || {
                    for i in 0..100_000 {
                        bare.add(if i % 2 == 0 { t + 1 } else { -1 });
                        if i % 1000 == 0 {
                            std::thread::yield_now();
                        }
                    }
                });
            }
        });
        assert_eq!(bare.sum(), 50_000 * (1 + 2 + 3 + 4) - 4 * 50_000);
    }
}
