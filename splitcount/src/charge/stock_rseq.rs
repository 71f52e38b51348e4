//! The stock's hit paths as rseq critical sections (x86_64 Linux, glibc's
//! areas), and the remote fence that makes a lock holder safe from them.
//!
//! ```text
//!  consume(key, n)                       stash(key, n, cap)
//!  21: arm                               21: arm
//!  22: cpu = rseq->cpu_id                22: cpu = rseq->cpu_id
//!      cpu ≥ blocks?     → unavailable       cpu ≥ blocks?     → unavailable
//!      b = base + cpu·1024                   b = base + cpu·1024
//!      b.lock ≠ 0?       → busy              b.lock ≠ 0?       → busy
//!      i = slot of key   → miss              i = slot of key   → slow
//!          in its window?                        in its window?
//!      u = b.units[i]                        u = b.units[i] + n
//!      u < n?            → short (4:)        u > cap?          → slow
//!      u − n < min_left? → slow              u > b.quota[i]?   → slow
//!      b.units[i] = u − n  ; commit          b.units[i] = u      ; commit
//!  23:                                   23:
//!      (4: read b.quota[i], b.granted,
//!       b.used: the miss's refill hint)
//!  25: disarm                            25: disarm
//! ```
//!
//! A key's *window* is the run of slots it may occupy: all of them when a
//! block has at most `stock::WINDOW` slots, else `WINDOW` slots from a
//! start that a hash of the key's word picks (computed by the caller, so
//! the sequences only scan). The quota check keeps every slot at or below
//! the units its CPU's budget granted it — which is what bounds a CPU's
//! stocked total by the budget whatever the number of keys (`stock.rs`).
//!
//! A sequence commits with one plain store and only if, on the CPU it runs
//! on, the block was unlocked when it looked — from its start to its commit
//! nothing else ran on that CPU (a preemption, migration or signal restarts
//! it from the top). Everything else is done under the block's lock:
//!
//! - **on the thread's own CPU** by [`lock_local`], a critical section whose
//!   commit is the locked `cmpxchg` that takes the lock: it ran on the
//!   block's CPU, so any other thread's sequence on that CPU was preempted
//!   and will restart — and then find the lock taken;
//! - **from anywhere else** (drains) by a compare-and-swap followed by
//!   [`fence_cpu`], `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ)` on
//!   the block's CPU: it returns once every thread of the process running
//!   there has been interrupted, which restarts any sequence in flight that
//!   saw the block unlocked. Only drains of other CPUs pay it (a few hundred
//!   nanoseconds to a few microseconds).
//!
//! Threads without a registered area never run the sequences; they bypass
//! the stock (a lock taken without the fence would not be safe from the
//! sequences of other threads).
//!
//! If a fence fails (`membarrier` refused after registration — a seccomp
//! sandbox entered later), the drain seals the block instead of trusting
//! it: the lock word keeps a non-zero bit for good, so every sequence on
//! that CPU sees it busy, and [`quiesce_cpu`] makes sure none still in
//! flight can commit (see `Stock::seal`).

#![allow(unsafe_code)]

use crate::rseq_section::rseq_section;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::OnceLock;

/// What a critical section did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Committed.
    Done,
    /// `consume`: the key has no slot, or too few units.
    Miss,
    /// The block's lock is held.
    Busy,
    /// No registered area, or a CPU beyond the blocks.
    Unavailable,
    /// Needs the lock (`consume`: it would empty a slot that must give up
    /// its key; `stash`: a new key, or past `cap`).
    Slow,
}

fn step(status: u32) -> Step {
    match status {
        0 => Step::Done,
        1 => Step::Miss,
        2 => Step::Busy,
        3 => Step::Unavailable,
        _ => Step::Slow,
    }
}

/// Byte offsets in a block (see `stock.rs`): a 16-byte header (the lock
/// word at 0, the units granted at 8), then 16-byte slots from [`SLOTS`],
/// each its key word, its units at 8 and its quota at 12; blocks are
/// [`BLOCK`] (`1 << 10`) bytes apart.
pub(crate) const SLOTS: usize = 16;
/// See [`SLOTS`].
pub(crate) const SLOT: usize = 16;
/// See [`SLOTS`].
pub(crate) const GRANTED: usize = 8;
/// See [`SLOTS`].
pub(crate) const UNITS: usize = 8;
/// See [`SLOTS`].
pub(crate) const QUOTA: usize = 12;
/// See [`SLOTS`].
pub(crate) const BLOCK: usize = 1 << 10;

/// Take `n` units for `key` from the calling CPU's block, leaving at least
/// `min_left` in the slot; the key is looked for in slots
/// `window.0..window.1`.
///
/// # Safety
/// `offset` is glibc's `__rseq_offset`; `base` points to `blocks` blocks of
/// [`BLOCK`] bytes laid out as `stock.rs` says, `window` lies within each
/// block's slots; every write to a block's units is such a sequence or
/// made under its lock as this module describes.
#[inline(always)]
pub(crate) unsafe fn consume(
    offset: isize,
    base: *mut u8,
    blocks: usize,
    window: (usize, usize),
    key: usize,
    n: u64,
    min_left: u64,
) -> Consumed {
    let status: u32;
    let quota: usize;
    let granted: usize;
    let header: usize;
    // SAFETY: see the contract; the sequence writes only a unit word of
    // the calling CPU's block, and the area's `rseq_cs`. The loads after
    // the section (`4:`) read the block it looked at, which stays
    // allocated whatever CPU the thread has moved to.
    unsafe {
        rseq_section!(
            off = offset;
            body = [
                "mov {cpu:e}, dword ptr fs:[{off} + 4]",
                "mov eax, 3",
                "cmp {cpu}, {blocks}",
                "jae 25f",
                "shl {cpu}, 10",
                "add {cpu}, {base}",
                "mov eax, 2",
                "cmp dword ptr [{cpu}], 0",
                "jne 25f",
                "mov eax, 1",
                "2:",
                "cmp qword ptr [{cpu} + {idx} + 16], {key}",
                "je 3f",
                "add {idx}, 16",
                "cmp {idx}, {end}",
                "jb 2b",
                "jmp 25f",
                "3:",
                "mov eax, 5",
                "mov {tmp:e}, dword ptr [{cpu} + {idx} + 24]",
                "cmp {tmp}, {n}",
                "jb 4f",
                "sub {tmp}, {n}",
                "mov eax, 4",
                "cmp {tmp}, {min}",
                "jb 25f",
                "xor eax, eax",
                "mov dword ptr [{cpu} + {idx} + 24], {tmp:e}",
            ];
            after = [
                "jmp 25f",
                "4:",
                "mov {key:e}, dword ptr [{cpu} + {idx} + 28]",
                "mov {idx}, qword ptr [{cpu} + 8]",
                "mov {cpu}, qword ptr [{cpu}]",
            ];
            base = in(reg) base,
            blocks = in(reg) blocks,
            idx = inout(reg) window.0 * SLOT => granted,
            end = in(reg) window.1 * SLOT,
            key = inout(reg) key => quota,
            n = in(reg) n,
            min = in(reg) min_left,
            cpu = out(reg) header,
            out("eax") status,
            options(nostack),
        );
    }
    match status {
        0 => Consumed::Step(Step::Done),
        5 => Consumed::Short {
            quota: quota as u64,
            granted: granted as u64,
            // The header's first word: the lock, the victim, then `used`
            // in the top 16 bits.
            used: (header >> 48) as u64,
        },
        s => Consumed::Step(step(s)),
    }
}

/// What [`consume`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Consumed {
    /// Any outcome but the one below (`Step::Miss`: the key has no slot).
    Step(Step),
    /// The key's slot holds too few units: its quota, the units granted to
    /// the block's slots in all and the slots in use (the block's header,
    /// read after the section: hints).
    Short { quota: u64, granted: u64, used: u64 },
}

/// Add `n` units to `key`'s slot in the calling CPU's block (looked for in
/// `window`, as in [`consume`]), if the key has one and the slot stays at
/// or below both `cap` and its quota.
///
/// # Safety
/// As for [`consume`].
#[inline(always)]
pub(crate) unsafe fn stash(
    offset: isize,
    base: *mut u8,
    blocks: usize,
    window: (usize, usize),
    key: usize,
    n: u64,
    cap: u64,
) -> Step {
    let status: u32;
    // SAFETY: as in `consume`.
    unsafe {
        rseq_section!(
            off = offset;
            body = [
                "mov {cpu:e}, dword ptr fs:[{off} + 4]",
                "mov eax, 3",
                "cmp {cpu}, {blocks}",
                "jae 25f",
                "shl {cpu}, 10",
                "add {cpu}, {base}",
                "mov eax, 2",
                "cmp dword ptr [{cpu}], 0",
                "jne 25f",
                "mov eax, 4",
                "2:",
                "cmp qword ptr [{cpu} + {idx} + 16], {key}",
                "je 3f",
                "add {idx}, 16",
                "cmp {idx}, {end}",
                "jb 2b",
                "jmp 25f",
                "3:",
                "mov {tmp:e}, dword ptr [{cpu} + {idx} + 24]",
                "add {tmp}, {n}",
                "jc 25f",
                "cmp {tmp}, {cap}",
                "ja 25f",
                "mov {key:e}, dword ptr [{cpu} + {idx} + 28]",
                "cmp {tmp}, {key}",
                "ja 25f",
                "xor eax, eax",
                "mov dword ptr [{cpu} + {idx} + 24], {tmp:e}",
            ];
            after = [];
            base = in(reg) base,
            blocks = in(reg) blocks,
            idx = inout(reg) window.0 * SLOT => _,
            end = in(reg) window.1 * SLOT,
            key = inout(reg) key => _,
            n = in(reg) n,
            cap = in(reg) cap,
            cpu = out(reg) _,
            out("eax") status,
            options(nostack),
        );
    }
    step(status)
}

/// Take the lock of the calling CPU's block, as a critical section whose
/// commit is the `cmpxchg` (see the module docs): `Ok(cpu)` with the lock
/// held, or why not.
///
/// # Safety
/// As for [`consume`].
#[inline]
pub(crate) unsafe fn lock_local(
    offset: isize,
    base: *mut u8,
    blocks: usize,
) -> Result<usize, Step> {
    let status: u32;
    let cpu: usize;
    // SAFETY: as in `consume`; the sequence writes only the calling CPU's
    // block's lock word (atomically) and the area's `rseq_cs`.
    unsafe {
        rseq_section!(
            off = offset;
            body = [
                "mov {cpu:e}, dword ptr fs:[{off} + 4]",
                "mov {st:e}, 3",
                "cmp {cpu}, {blocks}",
                "jae 25f",
                "mov {tmp}, {cpu}",
                "shl {tmp}, 10",
                "add {tmp}, {base}",
                "mov {one:e}, 1",
                "xor eax, eax",
                "lock cmpxchg dword ptr [{tmp}], {one:e}",
            ];
            after = [
                "mov {st:e}, 0",
                "jz 25f",
                "mov {st:e}, 2",
                "jmp 25f",
            ];
            base = in(reg) base,
            blocks = in(reg) blocks,
            cpu = out(reg) cpu,
            one = out(reg) _,
            st = out(reg) status,
            out("eax") _,
            options(nostack),
        );
    }
    match step(status) {
        Step::Done => Ok(cpu),
        other => Err(other),
    }
}

const MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 7;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ: libc::c_int = 1 << 8;
const MEMBARRIER_CMD_FLAG_CPU: libc::c_uint = 1;

/// Set when a fence failed (`membarrier` refused after registration): new
/// stocks start in lock mode, and the failing stock seals its blocks
/// (`Stock::seal`).
static FENCE_FAILED: AtomicBool = AtomicBool::new(false);

/// Whether this process may fence other CPUs' sequences: registered for
/// `MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ` (once, on first use), and no
/// fence has failed since.
pub(crate) fn fence_available() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: membarrier with a registration command and no pointers.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ,
                0,
                0,
            ) == 0
        }
    }) && !FENCE_FAILED.load(Relaxed)
}

/// Restart every rseq critical section of this process in flight on `cpu`
/// (returns once each thread running there was interrupted). Falls back to
/// every CPU where the kernel does not take a CPU. `false` if both calls
/// failed — the registration held, but the syscall is refused now (a
/// seccomp filter installed since, say): then nothing was fenced.
pub(crate) fn fence_cpu(cpu: usize) -> bool {
    // SAFETY: membarrier with a command, flags and a CPU number; no
    // pointers. The process registered (`fence_available`).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
            MEMBARRIER_CMD_FLAG_CPU,
            cpu as libc::c_int,
        )
    };
    if rc == 0 {
        return true;
    }
    // SAFETY: as above, without the CPU.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
            0,
            0,
        )
    };
    if rc != 0 {
        FENCE_FAILED.store(true, Relaxed);
    }
    rc == 0
}

/// Without `membarrier`: make sure no sequence that started on `cpu`
/// before this call can still commit, by running the calling thread on
/// `cpu` — every thread that was running there has then been switched out,
/// and a switched-out sequence restarts from the top (and re-reads the
/// lock word). The thread's CPU mask is restored after. Allocates nothing
/// (it may run inside the allocator).
///
/// Where the thread may not run on `cpu` (a cpuset without it), it sleeps
/// a millisecond instead: a sequence runs a few dozen instructions after
/// its look at the lock word, so only a CPU stalled for longer than that
/// at exactly that point (a hypervisor descheduling it) could still
/// commit. Returns whether the sound way was taken.
pub(crate) fn quiesce_cpu(cpu: usize) -> bool {
    // SAFETY: `cpu_set_t` is plain data (all zeroes: the empty set); the
    // calls read and write only the sets passed, for the calling thread.
    unsafe {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        let mut there: libc::cpu_set_t = std::mem::zeroed();
        let ok = cpu < libc::CPU_SETSIZE as usize
            && libc::sched_getaffinity(0, size, &mut old) == 0
            && {
                libc::CPU_SET(cpu, &mut there);
                libc::sched_setaffinity(0, size, &there) == 0
            };
        if ok {
            // The kernel migrates the calling thread before returning; make
            // sure (a CPU taken offline meanwhile would refuse the mask).
            for _ in 0..100 {
                if libc::sched_getcpu() == cpu as libc::c_int {
                    break;
                }
                libc::sched_yield();
            }
            let there_now = libc::sched_getcpu() == cpu as libc::c_int;
            libc::sched_setaffinity(0, size, &old);
            if there_now {
                return true;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        false
    }
}
