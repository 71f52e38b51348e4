//! Helpers shared by the integration tests: pinning threads and a small
//! deterministic random number generator.

#![allow(dead_code, unsafe_code)]

/// Pin the calling thread to kernel CPU `cpu`. Returns false where the
/// system refuses (e.g. the CPU is not in our cpuset).
pub fn pin_to(cpu: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside
        // it; sched_setaffinity reads it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

/// Let the calling thread run on every CPU again.
pub fn unpin(online: &[u32]) {
    #[cfg(target_os = "linux")]
    // SAFETY: as in `pin_to`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in online {
            libc::CPU_SET(cpu as usize, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = online;
}

/// Kernel ids of the online CPUs.
pub fn online_cpu_ids() -> Vec<u32> {
    let t = splitcount::cpu::Topology::host();
    t.online().iter().filter_map(|&d| t.cpu_id(d)).collect()
}

/// xorshift64*: deterministic, fast, good enough to pick objects and deltas.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A delta in `-range..=range`.
    pub fn delta(&mut self, range: i64) -> i64 {
        (self.below(2 * range as u64 + 1) as i64) - range
    }
}
