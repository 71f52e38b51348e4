//! One template for every rseq critical section: the descriptor, the arming,
//! the abort handler out of line (behind the signature glibc registered,
//! `0x53053053`), and the disarm. A sequence supplies its body (from the
//! start, label `22`, to its commit, the last instruction before label
//! `23`), what runs after the commit on the way out (optional), and its
//! operands. The area is reached through the thread pointer (`off = …`:
//! `{off}` is glibc's offset, the area `fs:[{off}]`) or through its address
//! (`area = …`: `{area}`, for areas splitcount registered and concurrency
//! ids). `{tmp}` is a scratch register (it holds the descriptor's address
//! on entry to the body). Leaving the body early is a jump to `25f`, the
//! disarm.
//!
//! ```text
//!  __rseq_cs: 20: { version 0, flags 0, start_ip 22, post_commit 23 − 22, abort_ip 24 }
//!  21: rseq_cs = &20                   (re-armed after every abort)
//!  22: body … commit
//!  23: after
//!  __rseq_failure: ud1 <signature>; 24: jmp 21
//!  25: rseq_cs = 0
//! ```

/// See the module docs.
macro_rules! rseq_section {
    (off = $off:expr; $($rest:tt)*) => {
        rseq_section!(@ off = $off,
            arm = "mov qword ptr fs:[{off} + 8], {tmp}",
            disarm = "mov qword ptr fs:[{off} + 8], 0";
            $($rest)*)
    };
    (area = $area:expr; $($rest:tt)*) => {
        rseq_section!(@ area = $area,
            arm = "mov qword ptr [{area} + 8], {tmp}",
            disarm = "mov qword ptr [{area} + 8], 0";
            $($rest)*)
    };
    (@ $base:ident = $value:expr, arm = $arm:literal, disarm = $disarm:literal;
     body = [$($line:literal),+ $(,)?]; after = [$($after:literal),* $(,)?]; $($operands:tt)*) => {
        std::arch::asm!(
            ".pushsection __rseq_cs, \"aw\"",
            ".balign 32",
            "20:",
            ".long 0, 0",
            ".quad 22f, (23f - 22f), 24f",
            ".popsection",
            "21:",
            "lea {tmp}, [rip + 20b]",
            $arm,
            "22:",
            $($line,)+
            "23:",
            $($after,)*
            ".pushsection __rseq_failure, \"ax\"",
            ".byte 0x0f, 0xb9, 0x3d",
            ".long 0x53053053",
            "24:",
            "jmp 21b",
            ".popsection",
            "25:",
            $disarm,
            $base = in(reg) $value,
            tmp = out(reg) _,
            $($operands)*
        )
    };
}

pub(crate) use rseq_section;
