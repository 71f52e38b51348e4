//! The timing core every `bench` suite and the report use.
//!
//! On a small shared host, timing each case once, in sequence, measures the
//! host as much as the code: a ratio between two cases timed seconds apart
//! changes with whatever else ran meanwhile, and a two-thread figure
//! mostly says whether the two threads happened to run at the same time.
//! So:
//!
//! 1. **Interleaved rounds** ([`rounds`]): every entry (a case at a thread
//!    count) runs once per round for a short slice; rounds alternate their
//!    order. Figures are computed per round, between entries measured a
//!    few slices apart, and reported as the median of the per-round values
//!    with their range beside it.
//! 2. **Pinning and overlap** ([`pin`], [`mod@slice`]): with no more threads than
//!    CPUs, thread `t` is pinned to its own CPU (distinct cores first).
//!    Each thread records its CPU time (`CLOCK_THREAD_CPUTIME_ID`) and the
//!    wall-clock start and stop of its loop, from which a slice's
//!    *overlap* — the share of it in which all threads ran together — is
//!    computed. Multi-thread rounds below [`MIN_OVERLAP`] are left out of
//!    ratios and counted ([`measured`]).
//! 3. **Stability** ([`spread`]): a figure is stable when the medians of the
//!    first and second half of its rounds are within 10% of each other.
//!
//! Time per operation is CPU time, not wall time: a thread is not charged
//! for the time it was preempted. Wall time gives operations per second.

pub mod clock;
pub mod measured;
pub mod pin;
pub mod rounds;
pub mod slice;
pub mod spread;

pub use measured::{Figure, Measured, Sample, Series};
pub use rounds::{measure, observed, Entry, Plan, Progress};
pub use spread::Spread;

/// The overlap a multi-thread round needs to enter a ratio: its threads
/// ran together for at least 90% of it. Two pinned threads on an idle
/// 2-CPU machine reach 0.99; with one CPU busy with another process, about
/// 0.5 (one of the threads shares its CPU).
pub const MIN_OVERLAP: f64 = 0.9;
