//! The two clocks of a measurement: wall time ([`std::time::Instant`]) and
//! the calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`).
//!
//! CPU time counts only what the thread spent on a CPU (user and kernel),
//! so a thread that was preempted for part of a round is not charged for
//! the time it waited. Comparing it with the wall time of the same loop
//! tells how much of the loop the thread actually ran (see
//! [`super::slice::SliceRun::overlap`]).

use std::time::Duration;

/// CPU time the calling thread has used so far (`None` where the clock is
/// unavailable; the timing core then falls back to wall time).
pub fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a
    // constant the kernel knows (it fails with EINVAL otherwise, and `ts`
    // is then not read).
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_time_advances_while_the_thread_works() {
        let before = thread_cpu_time().expect("Linux has thread CPU clocks");
        let mut x = 1u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let after = thread_cpu_time().unwrap();
        assert!(after > before, "{before:?} → {after:?} (x = {x})");
    }

    #[test]
    fn thread_cpu_time_does_not_count_sleep() {
        let before = thread_cpu_time().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let slept = thread_cpu_time().unwrap() - before;
        assert!(slept < Duration::from_millis(15), "{slept:?}");
    }
}
