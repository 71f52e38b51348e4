//! Where the threads of a measurement run: one thread per CPU, pinned, on
//! distinct cores first.
//!
//! A two-thread ratio means something only if the two threads ran at the
//! same time, each on its own CPU: otherwise it measures how the scheduler
//! happened to interleave them on a shared host. So a measurement with no
//! more threads than the CPUs this process may use pins thread `t` to the
//! `t`-th CPU of [`preferred_order`] (one CPU per physical core before any
//! hyperthread sibling). With more threads than CPUs (8 threads on 2 CPUs,
//! on purpose, to see preempted adders) nothing is pinned, and the output
//! says so.

use std::sync::OnceLock;

/// The CPUs a measurement with some number of threads runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Kernel CPU id of each thread, thread 0 first.
    pub cpus: Vec<usize>,
    /// Whether two of these CPUs are hyperthread siblings (share a core);
    /// `None` where sysfs does not say.
    pub shares_core: Option<bool>,
}

impl Placement {
    /// "CPUs 0,1 (distinct cores)" and the like.
    pub fn describe(&self) -> String {
        let ids: Vec<String> = self.cpus.iter().map(usize::to_string).collect();
        let cores = match (self.cpus.len(), self.shares_core) {
            (1, _) => "",
            (_, Some(false)) => " (distinct cores)",
            (_, Some(true)) => " (hyperthread siblings share a core)",
            (_, None) => " (core sharing unknown)",
        };
        format!(
            "CPU{} {}{cores}",
            if self.cpus.len() == 1 { "" } else { "s" },
            ids.join(",")
        )
    }
}

/// The CPUs this process may run on, as the kernel ids of
/// `sched_getaffinity` when the lab first asked (before any pinning).
pub fn allowed_cpus() -> &'static [usize] {
    static ALLOWED: OnceLock<Vec<usize>> = OnceLock::new();
    ALLOWED.get_or_init(|| {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is writable and its size is passed; pid 0 is the
        // calling thread.
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
        let cpus: Vec<usize> = if rc == 0 {
            // SAFETY: `set` was filled by the kernel; `c` < its capacity.
            (0..max)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect()
        } else {
            Vec::new()
        };
        if cpus.is_empty() {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n).collect()
        } else {
            cpus
        }
    })
}

/// The hyperthread siblings of `cpu` (itself included), from
/// `/sys/devices/system/cpu/cpuN/topology/thread_siblings_list`.
pub fn siblings(cpu: usize) -> Option<Vec<usize>> {
    let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
    let text = std::fs::read_to_string(path).ok()?;
    let ids = splitcount::raw::cpu_id::parse_cpu_list(&text).ok()?;
    Some(ids.into_iter().map(|c| c as usize).collect())
}

/// `allowed` reordered so that the first CPU of every core comes before
/// any second sibling: `n` threads land on `n` distinct cores when there
/// are that many. `siblings_of` gives a CPU's core mates (itself included).
pub fn preferred_order(
    allowed: &[usize],
    siblings_of: impl Fn(usize) -> Option<Vec<usize>>,
) -> Vec<usize> {
    let mut first = Vec::new();
    let mut later = Vec::new();
    for &cpu in allowed {
        let core_taken = siblings_of(cpu).is_some_and(|s| s.iter().any(|c| first.contains(c)));
        if core_taken {
            later.push(cpu);
        } else {
            first.push(cpu);
        }
    }
    first.extend(later);
    first
}

/// Where `threads` threads are pinned, or `None` when there are more
/// threads than allowed CPUs (they are then left to the scheduler).
pub fn placement(threads: usize) -> Option<Placement> {
    let order = preferred_order(allowed_cpus(), siblings);
    if threads == 0 || threads > order.len() {
        return None;
    }
    let cpus: Vec<usize> = order[..threads].to_vec();
    Some(Placement {
        shares_core: shares_core(&cpus, siblings),
        cpus,
    })
}

/// Whether two of `cpus` are siblings of one core (`None`: unknown).
pub fn shares_core(
    cpus: &[usize],
    siblings_of: impl Fn(usize) -> Option<Vec<usize>>,
) -> Option<bool> {
    let mut any = false;
    for (i, &a) in cpus.iter().enumerate() {
        let mates = siblings_of(a)?;
        any |= cpus[i + 1..].iter().any(|b| mates.contains(b));
    }
    Some(any)
}

/// Pin the calling thread to kernel CPU `cpu`; false if the kernel refused
/// (the CPU went offline, or a cpuset shrank).
pub fn pin_current(cpu: usize) -> bool {
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return false;
    }
    // SAFETY: an all-zero cpu_set_t is a valid empty set; `cpu` is below
    // its capacity (checked above).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid set of the size passed; pid 0 is the calling
    // thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4-CPU machine with two cores of two siblings: {0, 2} and {1, 3}.
    fn two_cores(cpu: usize) -> Option<Vec<usize>> {
        Some(if cpu % 2 == 0 { vec![0, 2] } else { vec![1, 3] })
    }

    #[test]
    fn distinct_cores_come_before_second_siblings() {
        assert_eq!(preferred_order(&[0, 1, 2, 3], two_cores), [0, 1, 2, 3]);
        // Linux often numbers siblings next to each other: 0,1 share a core.
        let adjacent = |c: usize| Some(vec![c & !1, c | 1]);
        assert_eq!(preferred_order(&[0, 1, 2, 3], adjacent), [0, 2, 1, 3]);
        assert_eq!(preferred_order(&[5, 7], |_| None), [5, 7]);
    }

    #[test]
    fn siblings_are_detected_only_when_they_share_a_core() {
        assert_eq!(shares_core(&[0, 1], two_cores), Some(false));
        assert_eq!(shares_core(&[0, 2], two_cores), Some(true));
        assert_eq!(shares_core(&[0, 1], |_| None), None);
    }

    #[test]
    fn more_threads_than_cpus_are_not_pinned() {
        let n = allowed_cpus().len();
        assert!(n >= 1);
        assert_eq!(placement(n + 1), None);
        let one = placement(1).unwrap();
        assert_eq!(one.cpus.len(), 1);
        assert!(one.describe().starts_with("CPU "), "{}", one.describe());
    }

    #[test]
    fn a_pinned_thread_runs_on_its_cpu() {
        let cpu = allowed_cpus()[0];
        let ran_on = std::thread::spawn(move || {
            assert!(pin_current(cpu));
            // SAFETY: sched_getcpu has no preconditions.
            unsafe { libc::sched_getcpu() }
        })
        .join()
        .unwrap();
        assert_eq!(ran_on, cpu as i32);
    }
}
