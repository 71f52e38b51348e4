//! Per-CPU updates as rseq critical sections (x86_64 Linux).
//!
//! A *restartable sequence* is a range of instructions that the kernel
//! aborts — jumping to an abort handler — if the thread is preempted,
//! migrated or signalled while inside it. A per-CPU update written as one
//! therefore needs no locked instruction: it reads the CPU id, computes the
//! slot's address, and commits with a single plain store, knowing that
//! nothing else ran on this CPU in between.
//!
//! ```text
//!  21: rseq->rseq_cs = &descriptor          ; arm (re-armed on every retry)
//!  22: if rseq->cpu_id >= 0xfffffffe: goto 25  ── start_ip: not registered
//!      cpu = rseq->cpu_id  (or mm_cid)      ;    read inside the sequence
//!      if cpu >= regions: goto 25           ;    leave without committing
//!      p = slot0 + cpu·4096
//!      v = *p + delta
//!      *p = v                               ;    the commit: one plain store
//!  23:                                      ; ── post_commit_ip
//!      .long 0x53053053                     ; signature (inside `ud1`)
//!  24: goto 21                              ; ── abort_ip: retry from scratch
//!  25: rseq->rseq_cs = 0                    ; disarm
//! ```
//!
//! **Registration is checked inside the sequence.** An area that is not
//! registered (never, or no longer: a thread may unregister glibc's area,
//! and threads it creates then start unregistered) is never restarted by
//! the kernel, so a sequence run on it would be a plain, racy
//! read-modify-write. The kernel keeps `cpu_id` at `RSEQ_CPU_ID_UNINITIALIZED`
//! (−1) or `RSEQ_CPU_ID_REGISTRATION_FAILED` (−2) in such an area — but
//! leaves `mm_cid` at 0 after an unregistration — so every sequence reads
//! `cpu_id` first and leaves without committing when it is one of those;
//! the caller then takes the atomic path. The check is inside the sequence,
//! so a registration cannot change between it and the commit (only the
//! thread itself registers or unregisters).
//!
//! **Disarmed on the way out.** The kernel reads `rseq_cs` on every
//! preemption and signal until it finds the thread outside the sequence;
//! if the code holding the descriptor were unloaded meanwhile (a `dlclose`
//! of a library linking splitcount), the thread would be killed. Clearing
//! `rseq_cs` after the commit (one store to a line this thread owns) leaves
//! nothing pointing at our code between operations.
//!
//! The descriptor (`struct rseq_cs`: version, flags, start_ip,
//! post_commit_offset, abort_ip) lives in the `__rseq_cs` section, and the
//! four bytes before the abort handler hold the signature the thread's area
//! was registered with — `0x53053053`, glibc's and librseq's x86 value — so
//! the same code runs under glibc's registration or ours. The bytes
//! `0f b9 3d` before it make the signature part of a `ud1` instruction, as
//! librseq does, so the signature is never executed as something else.
//!
//! A critical section only excludes other threads *on the same CPU*: every
//! write to a CPU's slot must be such a sequence, run on that CPU. Remote
//! writes go elsewhere (the arena's shared overflow region); see `arena.rs`.

#![allow(unsafe_code)]

use super::chunk::REGION_BYTES;
use crate::rseq_section::rseq_section;

const _: () = assert!(REGION_BYTES == 4096, "the critical sections shift by 12");
const _: () = assert!(
    crate::cpu::CPU_ID_OFFSET == 4,
    "the sequences check registration at rseq->cpu_id (offset 4)"
);
const _: () = assert!(
    crate::cpu::MM_CID_OFFSET == 24,
    "add_return_fs reads mm_cid at offset 24"
);

/// Add `delta` to the calling CPU's copy of a slot and return
/// `(cpu, new value)`; `cpu ≥ regions` means the id was out of range and
/// nothing was written.
///
/// # Safety
/// `area` is the calling thread's rseq area (registered with
/// [`crate::cpu`]'s signature, or not registered at all: the sequence then
/// writes nothing and returns a `cpu ≥ regions`); `field` the byte offset
/// of `cpu_id` or `mm_cid` in it; `slot0` the slot's address in region 0 of
/// a chunk whose regions `0..regions` are 4096 bytes apart; and every write
/// to those regions' copies of this slot is made by such a critical
/// section.
#[inline(always)]
pub(crate) unsafe fn add_return(
    area: *const u8,
    field: usize,
    slot0: *mut i64,
    regions: usize,
    delta: i64,
) -> (usize, i64) {
    let cpu: usize;
    let new: i64;
    // SAFETY: see the function's contract; the sequence writes only
    // `slot0 + cpu·4096` for `cpu < regions`, and the area's `rseq_cs`.
    unsafe {
        rseq_section!(
            area = area;
            body = [
                "mov {cpu:e}, dword ptr [{area} + 4]",
                "cmp {cpu:e}, -2",
                "jae 25f",
                "mov {cpu:e}, dword ptr [{area} + {field}]",
                "cmp {cpu}, {regions}",
                "jae 25f",
                "mov {tmp}, {cpu}",
                "shl {tmp}, 12",
                "add {tmp}, {slot0}",
                "mov {new}, qword ptr [{tmp}]",
                "add {new}, {delta}",
                "mov qword ptr [{tmp}], {new}",
            ];
            after = [];
            field = in(reg) field,
            slot0 = in(reg) slot0,
            regions = in(reg) regions,
            delta = in(reg) delta,
            cpu = out(reg) cpu,
            new = out(reg) new,
            options(nostack),
        );
    }
    (cpu, new)
}

/// [`add_return`] for glibc's areas, addressed through the thread pointer:
/// the area is `fs:[offset]` in every thread, so nothing is loaded to find
/// it. With `MM_CID = false` the id is `cpu_id` itself, and one comparison
/// does for both checks — an unregistered area's `cpu_id` (`−1` or `−2` as
/// an unsigned 32-bit value) is never below `regions`. With `MM_CID` the
/// registration is checked first, as in [`add_return`].
///
/// # Safety
/// `offset` is glibc's `__rseq_offset` (every thread's area is at
/// `fs:[offset]`, registered with [`crate::cpu`]'s signature or not at
/// all); `slot0` and `regions` as for [`add_return`].
#[inline(always)]
pub(crate) unsafe fn add_return_fs<const MM_CID: bool>(
    offset: isize,
    slot0: *mut i64,
    regions: usize,
    delta: i64,
) -> (usize, i64) {
    let cpu: usize;
    let new: i64;
    // SAFETY: see the function's contract; the sequence writes only
    // `slot0 + cpu·4096` for `cpu < regions`, and the area's `rseq_cs`.
    unsafe {
        if MM_CID {
            rseq_section!(
                off = offset;
                body = [
                    "mov {cpu:e}, dword ptr fs:[{off} + 4]",
                    "cmp {cpu:e}, -2",
                    "jae 25f",
                    "mov {cpu:e}, dword ptr fs:[{off} + 24]",
                    "cmp {cpu}, {regions}",
                    "jae 25f",
                    "mov {tmp}, {cpu}",
                    "shl {tmp}, 12",
                    "mov {new}, qword ptr [{tmp} + {slot0}]",
                    "add {new}, {delta}",
                    "mov qword ptr [{tmp} + {slot0}], {new}",
                ];
                after = [];
                slot0 = in(reg) slot0,
                regions = in(reg) regions,
                delta = in(reg) delta,
                cpu = out(reg) cpu,
                new = out(reg) new,
                options(nostack),
            );
        } else {
            rseq_section!(
                off = offset;
                body = [
                    "mov {cpu:e}, dword ptr fs:[{off} + 4]",
                    "cmp {cpu}, {regions}",
                    "jae 25f",
                    "mov {tmp}, {cpu}",
                    "shl {tmp}, 12",
                    "mov {new}, qword ptr [{tmp} + {slot0}]",
                    "add {new}, {delta}",
                    "mov qword ptr [{tmp} + {slot0}], {new}",
                ];
                after = [];
                slot0 = in(reg) slot0,
                regions = in(reg) regions,
                delta = in(reg) delta,
                cpu = out(reg) cpu,
                new = out(reg) new,
                options(nostack),
            );
        }
    }
    (cpu, new)
}

/// What [`add_spill`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpillStep {
    /// Added; the copy of CPU `cpu` stays below the batch.
    Added,
    /// Added and the whole copy taken (left at 0): move it to the total.
    Taken(i64),
    /// Not armed, and the add would reach the batch: nothing was written.
    MustArm,
    /// The thread cannot update its CPU's copy (no registered area, or an
    /// id beyond the regions): nothing was written.
    Unavailable,
}

/// The kernel's `percpu_counter` step in one critical section: add `delta`
/// to the calling CPU's copy; if the new value reaches `|v| ≥ batch` and the
/// caller is `armed`, store 0 instead and return `v` to be moved to the
/// shared total; unarmed, leave without writing anything
/// ([`SpillStep::MustArm`]), so the caller can announce the spill to
/// readers first and call again armed (on whatever CPU it runs on then).
///
/// # Safety
/// As for [`add_return`].
#[inline(always)]
pub(crate) unsafe fn add_spill(
    area: *const u8,
    field: usize,
    slot0: *mut i64,
    regions: usize,
    delta: i64,
    batch: u64,
    armed: bool,
) -> SpillStep {
    let cpu: usize;
    let spilled: i64;
    // SAFETY: as in `add_return`; the commit is the single store of either
    // the new value or (armed) 0. An unarmed spill leaves the sequence
    // before the commit, like an id out of range.
    unsafe {
        rseq_section!(
            area = area;
            body = [
                "mov {cpu:e}, dword ptr [{area} + 4]",
                "cmp {cpu:e}, -2",
                "jae 25f",
                "mov {cpu:e}, dword ptr [{area} + {field}]",
                "cmp {cpu}, {regions}",
                "jae 25f",
                "mov {tmp}, {cpu}",
                "shl {tmp}, 12",
                "add {tmp}, {slot0}",
                "mov {new}, qword ptr [{tmp}]",
                "add {new}, {delta}",
                // spilled = |new| for the test (i64::MIN stays 2^63 as
                // unsigned: it spills), then 0 unless this add spills.
                "mov {spilled}, {new}",
                "neg {spilled}",
                "cmovl {spilled}, {new}",
                "cmp {spilled}, {batch}",
                "mov {spilled:e}, 0",
                "jb 26f",
                "test {armed}, {armed}",
                "jz 27f",
                "mov {spilled}, {new}",
                "xor {new:e}, {new:e}",
                "26:",
                "mov qword ptr [{tmp}], {new}",
            ];
            // An unarmed spill leaves with the id -1 (before the commit).
            after = ["jmp 25f", "27:", "mov {cpu}, -1"];
            field = in(reg) field,
            slot0 = in(reg) slot0,
            regions = in(reg) regions,
            delta = in(reg) delta,
            batch = in(reg) batch,
            armed = in(reg) armed as usize,
            cpu = out(reg) cpu,
            spilled = out(reg) spilled,
            new = out(reg) _,
            options(nostack),
        );
    }
    match cpu {
        usize::MAX => SpillStep::MustArm,
        c if c >= regions => SpillStep::Unavailable,
        _ if spilled != 0 => SpillStep::Taken(spilled),
        _ => SpillStep::Added,
    }
}
